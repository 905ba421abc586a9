"""Signal health (ours): each source signal's freshness and miss streak, and the guard that a missing signal never
lets a pool shrink.

A tick expects the signals its loop reads (`expected_signals`): every tick the worker counts; a throughput tick the
frontend's traffic window, and its latency where the config reads latency (`throughput_capacity_feedback`); a load
tick the engines' forward-pass metrics of every pool with ready engines, and the frontend's latency with
`load_tail_latency_scaling`, once the source has shown latency at all (a source without latency series never
goes quiet). An idle window (no request) neither shows nor misses latency. `observe_signals`
updates each expected signal's `SignalStatus` (last seen, miss streak) and records a `signal` step when one is
missed (`signal_missed`, value: the streak) or back after misses (`signal_recovered`).

The guard (`guard_decision`, applied by the pipeline after every other bound, so no plugin escapes it): with any
expected signal missing, no pool goes below its expected count (`stale_signal_no_shrink`); with the worker counts
missing, no pool changes at all (`worker_counts_unavailable`: the counts the change would be measured from are a
stand-in). A missing signal is how a quiet metric source turns scaling into a one-way ratchet down; growing stays
allowed, because a pool too small costs the SLA and a pool too large costs only GPUs until the signal is back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner_core.config import PlannerConfig, managed_components
from planner_core.domain import (
    Component,
    Loop,
    ReasonCode,
    Signal,
    SignalStatus,
    StepName,
    StepRecord,
    TickInputs,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalHealth:
    """One tick's signal health: the status after it of every signal ever expected (in `Signal` order), the
    expected signals it missed, and its `signal` steps."""

    statuses: tuple[SignalStatus, ...]
    missing: tuple[Signal, ...]
    steps: tuple[StepRecord, ...]


def _reads_latency(config: PlannerConfig, loop: Loop) -> bool:
    if loop is Loop.THROUGHPUT:
        return config.throughput_capacity_feedback
    return config.load_tail_latency_scaling


def signal_seen(signal: Signal, config: PlannerConfig, inputs: TickInputs) -> bool | None:
    """Whether this tick has `signal` (True), expected it and misses it (False), or does not expect it (None)."""
    traffic = inputs.traffic
    usable = traffic is not None and traffic.invalid_field() is None
    if signal is Signal.WORKERS:
        return inputs.workers_observed
    if signal is Signal.TRAFFIC:
        return usable if inputs.loop is Loop.THROUGHPUT and config.throughput_scaling_active else None
    if signal is Signal.LATENCY:
        if not _reads_latency(config, inputs.loop):
            return None
        if not usable:
            return False
        assert traffic is not None
        if traffic.num_req <= 0:
            return None  # an idle window has no latency to show: neither seen nor missed
        return traffic.ttft_ms is not None or traffic.ttft_ms_p99 is not None
    # FPM: the load loop reads every managed pool's engines; a pool without ready engines has nothing to report
    if inputs.loop is not Loop.LOAD or not config.load_scaling_active:
        return None
    pools = [c for c in managed_components(config.mode) if inputs.workers.ready(c) > 0]
    if not pools:
        return None
    reporting = {sample.component for sample in inputs.fpm}
    return all(c in reporting for c in pools)


def observe_signals(config: PlannerConfig, inputs: TickInputs, previous: Sequence[SignalStatus]) -> SignalHealth:
    """Each signal's status after this tick, the expected ones it misses, and a step per miss or recovery."""
    known = {status.signal: status for status in previous}
    statuses: list[SignalStatus] = []
    missing: list[Signal] = []
    steps: list[StepRecord] = []
    for signal in Signal:
        status = known.get(signal, SignalStatus(signal=signal))
        seen = signal_seen(signal, config, inputs)
        if seen is False and signal is Signal.LATENCY and status.last_seen_s is None:
            # a source that has never shown latency (a trace, a router without latency series) does not go quiet:
            # its latency is optional to the loops (the closed loop keeps its last speed), so it is not expected
            seen = None
        if seen is True:
            if status.num_misses > 0:
                steps.append(
                    StepRecord(
                        step=StepName.SIGNAL,
                        reason=ReasonCode.SIGNAL_RECOVERED,
                        value=float(status.num_misses),
                        detail=f"{signal.value} back after {status.num_misses} missed tick(s)",
                    )
                )
            status = SignalStatus(signal=signal, last_seen_s=inputs.now_s, num_misses=0)
        elif seen is False:
            status = SignalStatus(signal=signal, last_seen_s=status.last_seen_s, num_misses=status.num_misses + 1)
            missing.append(signal)
            age = (
                "never seen" if status.last_seen_s is None else f"last seen {inputs.now_s - status.last_seen_s:g} s ago"
            )
            steps.append(
                StepRecord(
                    step=StepName.SIGNAL,
                    reason=ReasonCode.SIGNAL_MISSED,
                    value=float(status.num_misses),
                    detail=f"{signal.value} missing ({status.num_misses} tick(s) in a row, {age}): no pool shrinks",
                )
            )
        if status != SignalStatus(signal=signal):  # a signal never expected is left out of the state
            statuses.append(status)
    return SignalHealth(statuses=tuple(statuses), missing=tuple(missing), steps=tuple(steps))


def guard_decision(
    missing: Sequence[Signal], expected: Mapping[Component, int], final: Mapping[Component, int]
) -> tuple[dict[Component, int], tuple[StepRecord, ...]]:
    """The targets with the guard applied: with the worker counts missing every pool stays at its expected count;
    with another signal missing, no pool goes below it. A `signal_guard` step for each pool it changed."""
    guarded = dict(final)
    steps: list[StepRecord] = []
    if not missing:
        return guarded, ()
    names = ", ".join(signal.value for signal in missing)
    for c, target in final.items():
        if Signal.WORKERS in missing and target != expected[c]:
            guarded[c] = expected[c]
            reason, why = ReasonCode.WORKER_COUNTS_UNAVAILABLE, "the worker counts could not be read: no change"
        elif target < expected[c]:
            guarded[c] = expected[c]
            reason, why = ReasonCode.STALE_SIGNAL_NO_SHRINK, f"{names} missing: no scale-down"
        else:
            continue
        steps.append(
            StepRecord(
                step=StepName.SIGNAL_GUARD,
                reason=reason,
                component=c,
                value=float(guarded[c]),
                detail=f"{c.value} {target} -> {guarded[c]}: {why}",
            )
        )
    return guarded, tuple(steps)
