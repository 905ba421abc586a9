"""The learned decode margin (ours): the decode target utilization moved by what the window just served, so the
decode pool runs as lean as the SLA it keeps allows, between the configured utilization and a ceiling.

Why a decode pool needs a margin at all: its capacity is the batch an engine carries under the ITL target (within
`max_num_seqs` and the KV cache, `planner_core.perf.capacity.decode_capacity`), and requests bunch up, so the batch
rises above its mean. Where the batch is full, a request waits for a slot, and since the first token comes from the
decode engine the wait lands in its TTFT, not its ITL: measured on conversation x12 500/50, a decode pool sized at
0.9 of its capacity served every request within the ITL target and lost 1.2 points of requests to TTFT. How much
margin the pool needs is the traffic's and the engines', so it is read from the window, every throughput tick
(`throughput_decode_learned_margin: true`):

- **A miss sends it back at once.** A window whose ITL missed the target (its p95 from the frontend's histogram,
  else its mean), whose TTFT met the target for under `error_budget_target` of its requests (the histogram's share,
  else its p99 over the target), or whose decode engines queued requests behind a full batch puts the utilization
  back at the floor, `throughput_decode_target_utilization`, at once. A TTFT miss is not always the decode pool's
  (a prompt burst, a slow prefill engine): the margin is given back anyway, because a lean decode pool is never
  worth a missed window.
- **Leaner one step at a time, on windows met with room.** A window whose ITL is under `COMFORT` of the target,
  whose TTFT met the target for the SLA's share of its requests and whose decode engines queued nothing behind a
  full batch raises the utilization by `RISE_STEP`, up to `throughput_decode_utilization_max`. Each step is one
  beyond the evidence (the pool was sized at the previous utilization), and the next window judges it: four
  windows met with room take the shipped 0.7 to 0.9, one miss takes it back.
- **Nothing from what cannot be read.** A window counts only when the decode pool held the same ready engines from
  its start to its end (starting or draining engines never count); a window without an ITL
  (`decode_margin_no_latency`), with too few requests, met without room, or without a TTFT reading for the rise
  (`decode_margin_no_evidence`) keeps the last utilization, never resets it.

The state is `PlannerState.decode_margin` (replay stays exact); each tick leaves a `decode_margin` step whose value
is the utilization the sizing reads and whose detail gives the window's figures.
"""

from __future__ import annotations

import dataclasses

from planner_core.config import PlannerConfig
from planner_core.domain import (
    Component,
    DecodeMarginState,
    EngineLimits,
    ForwardPassMetrics,
    LatencyHistogram,
    ReasonCode,
    StepName,
    StepRecord,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.policy.feedback import COMFORT, MIN_WINDOW_REQUESTS

__all__ = [
    "RISE_STEP",
    "DecodeMarginWindow",
    "histogram_quantile_ms",
    "learn_decode_margin",
    "margin_bounds",
    "sizing_utilization",
]

RISE_STEP = 0.05  # utilization gained per window met with room (four windows from 0.7 to 0.9)
_ITL_TAIL = 0.95  # the ITL tail judged where the source has the histogram


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DecodeMarginWindow:
    """What the learned decode margin reads of the tick: the window, the decode pool's engines and limits."""

    traffic: TrafficObservation
    workers: WorkerCounts
    limits: EngineLimits
    fpm: tuple[ForwardPassMetrics, ...] = ()  # the serving engines' latest iterations, where reported


def margin_bounds(config: PlannerConfig) -> tuple[float, float]:
    """The floor (the configured decode target utilization) and the ceiling (never below the floor)."""
    floor = float(config.throughput_decode_target_utilization)
    return floor, max(floor, float(config.throughput_decode_utilization_max))


def sizing_utilization(config: PlannerConfig, state: DecodeMarginState) -> float:
    """The decode target utilization the sizing reads: the learned one within the bounds; the floor until learned."""
    floor, ceiling = margin_bounds(config)
    if state.utilization is None:
        return floor
    return min(ceiling, max(floor, state.utilization))


def histogram_quantile_ms(histogram: LatencyHistogram, quantile: float) -> float | None:
    """The `quantile` (0-1) of a window's latency histogram, interpolated linearly inside its bucket (as
    Prometheus' `histogram_quantile`); the last finite bound when the quantile lies beyond it; None when empty."""
    if histogram.count <= 0:
        return None
    rank = quantile * histogram.count
    lower_ms, below = 0.0, 0.0
    for bound_ms, at_most in zip(histogram.bounds_ms, histogram.cumulative, strict=True):
        if at_most >= rank:
            inside = (rank - below) / (at_most - below) if at_most > below else 1.0
            return lower_ms + (bound_ms - lower_ms) * inside
        lower_ms, below = bound_ms, at_most
    return histogram.bounds_ms[-1] if histogram.bounds_ms else None


def _step(
    config: PlannerConfig, before: DecodeMarginState, after: DecodeMarginState, reason: ReasonCode, why: str
) -> StepRecord:
    old, new = sizing_utilization(config, before), sizing_utilization(config, after)
    moved = f"utilization {old:.2f} -> {new:.2f}" if new != old else f"utilization {new:.2f} kept"
    return StepRecord(
        step=StepName.DECODE_MARGIN, component=Component.DECODE, value=new, reason=reason, detail=f"{why}: {moved}"
    )


def _queued_at_full_batch(window: DecodeMarginWindow) -> int:
    """Requests the decode engines queue behind a full batch (at `max_num_seqs`, or with the KV cache full)."""
    limits, queued = window.limits, 0
    for fpm in window.fpm:
        if fpm.component is not Component.DECODE or fpm.queued.num_decode_requests <= 0:
            continue
        scheduled = fpm.scheduled
        kv_full = scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens > limits.max_kv_tokens
        if scheduled.num_decode_requests >= limits.max_num_seqs or kv_full:
            queued += fpm.queued.num_decode_requests
    return queued


def _itl_tail(traffic: TrafficObservation) -> tuple[str, float | None]:
    """The ITL the window is judged on: the p95 from the histogram where the source has one, else the mean."""
    if traffic.itl_histogram is not None:
        p95 = histogram_quantile_ms(traffic.itl_histogram, _ITL_TAIL)
        if p95 is not None:
            return "p95", p95
    return "mean", traffic.itl_ms


def _ttft_met(config: PlannerConfig, traffic: TrafficObservation) -> tuple[bool | None, str]:
    """Whether the window's TTFT met the SLA: its histogram's share within the target at least the SLA's share,
    else its p99 within the target; None without either."""
    histogram = traffic.ttft_histogram
    share = histogram.share_within(config.ttft_ms) if histogram is not None else None
    if share is not None:
        return share >= config.error_budget_target, f"TTFT within target {share:.2%}"
    if traffic.ttft_ms_p99 is not None:
        return traffic.ttft_ms_p99 <= config.ttft_ms, f"TTFT p99 {traffic.ttft_ms_p99:.0f} ms"
    return None, "no TTFT tail"


def learn_decode_margin(
    config: PlannerConfig, state: DecodeMarginState, window: DecodeMarginWindow
) -> tuple[DecodeMarginState, StepRecord]:
    """The learned decode margin after the window (module docstring), and its `decode_margin` step."""
    traffic, component = window.traffic, Component.DECODE
    ready = window.workers.ready(component)
    floor, ceiling = margin_bounds(config)
    kept = dataclasses.replace(state, last_ready=ready)
    if ready <= 0 or ready != window.workers.expected(component) or state.last_ready != ready:
        why = f"decode pool changing: {ready} ready of {window.workers.expected(component)}, {state.last_ready} before"
        return kept, _step(config, state, kept, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    if traffic.itl_ms is None:
        return kept, _step(config, state, kept, ReasonCode.DECODE_MARGIN_NO_LATENCY, "no ITL observed in the window")
    if traffic.num_req < MIN_WINDOW_REQUESTS:
        why = f"{traffic.num_req:g} requests in the window (< {MIN_WINDOW_REQUESTS})"
        return kept, _step(config, state, kept, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    tail_name, tail_ms = _itl_tail(traffic)
    assert tail_ms is not None  # the mean is there
    ttft_met, ttft_seen = _ttft_met(config, traffic)
    queued = _queued_at_full_batch(window)
    target_ms = float(config.itl_ms)
    seen = (
        f"ITL {tail_name} {tail_ms:.1f} ms (target {target_ms:g} ms), {ttft_seen} "
        f"(SLA {config.error_budget_target:.0%}), {queued} requests queued at a full decode batch"
    )
    if tail_ms > target_ms or ttft_met is False or queued:
        missed = DecodeMarginState(utilization=floor, last_ready=ready)
        return missed, _step(config, state, missed, ReasonCode.DECODE_MARGIN_MISSED, f"{seen}: missed, the floor")
    if tail_ms > COMFORT * target_ms or ttft_met is None:
        why = f"{seen}: " + ("no TTFT to judge a leaner step on" if ttft_met is None else "met without room")
        return kept, _step(config, state, kept, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    leaner = DecodeMarginState(
        utilization=min(ceiling, sizing_utilization(config, state) + RISE_STEP), last_ready=ready
    )
    return leaner, _step(config, state, leaner, ReasonCode.DECODE_MARGIN_LEARNED, f"{seen}: met with room")
