"""Start-up-aware sizing (ours): measured start-up times and the learned headroom over the start-up horizon.

A worker asked for now serves only after its start-up time, so the throughput loop must size for the demand over
`[now, now + start-up + interval]`, not for the next window alone: by the time the next decision's workers are
ready, the traffic has moved on by a start-up time. Two pieces of planner state carry what this needs, so the
decision stays a pure function of the inputs and the state (replay is exact):

- **Measured start-up per pool** (`StartupState`): when a tick raises a pool's target, the scale-up is pending
  from that tick; the first later tick whose inputs show the target's engines ready closes it as one sample (an
  upper bound, to within one tick interval). In between, the ticks' `TickInputs.applied` show when the execution
  flow applied a decision with at least that target through the connector (its acknowledgement), which splits the
  sample into the time to apply and the engines' own start. A target lowered below the pending one cancels it (no
  sample). A pool's start-up is the median of its last `STARTUP_SAMPLES_KEPT` samples, or the configured
  `throughput_startup_seconds` while it has none. It is counted from the decision, not from the acknowledgement:
  engines asked for by a tick serve only after both, so both belong to the horizon that tick must look over.
- **Learned horizon headroom** (`horizon_windows`): every throughput tick keeps, per pool and in engines before
  rounding up, the need it planned (the forecast's mean-rate need and prompt-burst need) and the need the window
  just observed had (the same sizing on the observed rate and arrival curve). Once the `k = ceil((start-up +
  interval) / interval)` windows after a tick have been observed, that tick's horizon is closed and gives one
  residual `max(observed need over the k windows) - planned need`. Each pool's planned need is raised by the
  split-conformal `q` quantile of its residuals (the `ceil((n + 1) q)`-th smallest of `n`) before it is rounded up
  and before the scale-down hold (so the hold keeps what the headroom adds), `q` =
  `throughput_horizon_quantile`: the one knob that trades GPU-hours for SLA attainment (higher `q`, more engines,
  fewer bursts missed). With fewer residuals than that order statistic needs, the largest is used; with none, the
  planned need alone. The headroom is never negative: a plan above its horizon's needs is not cut by this rule.
  Residuals are in engines, not ratios of request rates: on a bursty trace the forecast after an idle minute is
  near 0 and a ratio to it explodes (30x on the Azure code trace), and the prompt bursts that miss the TTFT target
  (a million prompt tokens in 2 s there) are not in the rate at all.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from planner_core.domain import (
    AppliedTargets,
    Component,
    HorizonWindow,
    PendingScaleUp,
    ReasonCode,
    StartupSample,
    StartupState,
    StepName,
    StepRecord,
    WorkerCounts,
)

STARTUP_SAMPLES_KEPT = 5  # per pool: the median of the last five completed scale-ups
HORIZON_WINDOWS_KEPT = 360  # six hours of 60 s windows: the history the headroom quantile is taken over


def track_startups(
    startup: StartupState,
    now_s: float,
    workers: WorkerCounts,
    targets: dict[Component, int],
    components: Sequence[Component],
    applied: Sequence[AppliedTargets] = (),
) -> StartupState:
    """The start-up state after one tick: pending scale-ups learn when their target was applied (`applied`), those
    the inputs show ready become samples, ones whose target was lowered below them are dropped, and each pool whose
    new target (`targets`, this tick's decision) rises above its current expected count becomes pending from
    `now_s`.

    Args:
        startup: the state before the tick.
        now_s: the tick's time.
        workers: ready and expected workers the tick observed.
        targets: the pools' targets this tick decided (a pool absent: no target set).
        components: the pools this planner manages.
        applied: the decisions the connector applied, as the tick's inputs list them (`TickInputs.applied`).
    """
    pending: list[PendingScaleUp] = []
    samples = list(startup.samples)
    for scale_up in (acknowledged(s, applied) for s in startup.pending):
        if workers.ready(scale_up.component) >= scale_up.target:
            apply_s = None if scale_up.applied_at_s is None else max(0.0, scale_up.applied_at_s - scale_up.at_s)
            samples.append(
                StartupSample(
                    component=scale_up.component,
                    at_s=now_s,
                    startup_s=max(0.0, now_s - scale_up.at_s),
                    apply_s=apply_s,
                )
            )
        elif workers.expected(scale_up.component) >= scale_up.target:
            pending.append(scale_up)  # still starting
        # else: the target was lowered (or the workers were lost) before they started: no sample
    for component in components:
        target = targets.get(component)
        if target is None or target <= workers.expected(component):
            continue
        if target <= workers.ready(component):
            continue
        # a raise over a raise still in flight is one more scale-up, timed from this tick
        if all(p.target < target for p in pending if p.component is component):
            pending.append(PendingScaleUp(component=component, at_s=now_s, target=target))
    kept: list[StartupSample] = []
    for component in Component:
        kept.extend([s for s in samples if s.component is component][-STARTUP_SAMPLES_KEPT:])
    kept.sort(key=lambda s: (s.at_s, s.component.value))
    return StartupState(pending=tuple(pending), samples=tuple(kept))


def acknowledged(scale_up: PendingScaleUp, applied: Sequence[AppliedTargets]) -> PendingScaleUp:
    """The scale-up with `applied_at_s` set from the first decision applied at or after the raising tick whose
    target for the pool is at least the scale-up's (an earlier decision, or a smaller target, does not start these
    engines); unchanged when it already has one or no such decision is listed."""
    if scale_up.applied_at_s is not None:
        return scale_up

    def starts_these_engines(decision: AppliedTargets) -> bool:
        target = decision.target(scale_up.component)
        return decision.at_s >= scale_up.at_s and target is not None and target >= scale_up.target

    applied_at_s = min((d.at_s for d in applied if starts_these_engines(d)), default=None)
    return scale_up if applied_at_s is None else dataclasses.replace(scale_up, applied_at_s=applied_at_s)


def pool_startup_s(startup: StartupState, component: Component, configured_s: float) -> tuple[float, StepRecord]:
    """The pool's start-up time (s): the median of its measured samples, else the configured one; with its step."""
    own = [s for s in startup.samples if s.component is component]
    if own:
        measured = [s.startup_s for s in own]
        value = float(statistics.median(measured))
        detail = f"median of the last {len(measured)} scale-ups: {', '.join(f'{s:g}' for s in measured)} s"
        applying = [s.apply_s for s in own if s.apply_s is not None]
        if applying:
            apply_s = float(statistics.median(applying))
            detail += (
                f" from the decision to ready; of which to the connector's acknowledgement: median {apply_s:g} s of"
                f" {len(applying)}, the engines' own start the rest"
            )
        return value, StepRecord(
            step=StepName.STARTUP,
            component=component,
            value=value,
            reason=ReasonCode.STARTUP_MEASURED,
            detail=detail,
        )
    return configured_s, StepRecord(
        step=StepName.STARTUP,
        component=component,
        value=configured_s,
        reason=ReasonCode.STARTUP_CONFIGURED,
        detail=f"no scale-up completed yet: configured {configured_s:g} s",
    )


def record_window(
    windows: tuple[HorizonWindow, ...],
    at_s: float,
    planned: dict[Component, float],
    observed: dict[Component, float],
) -> tuple[HorizonWindow, ...]:
    """The windows with this tick's planned and observed needs (engines) appended (the last `HORIZON_WINDOWS_KEPT`)."""
    window = HorizonWindow(
        at_s=at_s,
        planned_prefill=planned.get(Component.PREFILL, 0.0),
        observed_prefill=observed.get(Component.PREFILL, 0.0),
        planned_decode=planned.get(Component.DECODE, 0.0),
        observed_decode=observed.get(Component.DECODE, 0.0),
    )
    return (*windows, window)[-HORIZON_WINDOWS_KEPT:]


def horizon_residuals(windows: Sequence[HorizonWindow], component: Component, num_windows: int) -> list[float]:
    """One residual per closed horizon: `max(need observed in the num_windows windows after a tick) - the need that
    tick planned` (engines; negative when the plan covered every window of its horizon)."""
    residuals = []
    for i in range(len(windows) - num_windows):
        peak = max(w.observed(component) for w in windows[i + 1 : i + 1 + num_windows])
        residuals.append(peak - windows[i].planned(component))
    return residuals


def horizon_headroom(
    windows: Sequence[HorizonWindow], *, startup_s: float, interval_s: float, quantile: float, component: Component
) -> tuple[float, StepRecord]:
    """Engines added to the pool's planned need for its start-up horizon, and its step (module docstring).

    Args:
        windows: the recorded windows, oldest first.
        startup_s: the pool's start-up time (s).
        interval_s: the throughput interval (s).
        quantile: the headroom quantile `q` in (0, 1).
        component: the pool.
    """
    horizon_s = startup_s + interval_s
    num_windows = max(1, math.ceil(horizon_s / interval_s - 1e-9))
    residuals = sorted(horizon_residuals(windows, component, num_windows))
    where = f"horizon {horizon_s:g} s ({num_windows} windows)"
    if not residuals:
        return 0.0, StepRecord(
            step=StepName.HORIZON,
            component=component,
            value=0.0,
            reason=ReasonCode.HORIZON_NO_HISTORY,
            detail=f"{where}: no horizon closed yet; the planned need alone",
        )
    rank = math.ceil((len(residuals) + 1) * quantile - 1e-9)
    if rank > len(residuals):
        residual = residuals[-1]
        reason = ReasonCode.HORIZON_SHORT_HISTORY
        how = f"largest of {len(residuals)} residuals (the q{quantile:g} order statistic needs {rank})"
    else:
        residual = residuals[max(rank, 1) - 1]
        reason = ReasonCode.HORIZON_HEADROOM
        how = f"q{quantile:g} of {len(residuals)} residuals (the {rank}th smallest)"
    headroom = max(0.0, residual)
    return headroom, StepRecord(
        step=StepName.HORIZON,
        component=component,
        value=headroom,
        reason=reason,
        detail=f"{where}: horizon's peak need - planned need, {how} = {residual:.3f}; +{headroom:.3f} engines",
    )
