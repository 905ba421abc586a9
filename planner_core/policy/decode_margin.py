"""The learned decode margin (ours): the decode target utilization read from the window the pool just served, so
the decode pool is sized as lean as its own traffic allows, between the configured utilization and a ceiling.

A decode engine carries at most its capacity batch (the largest batch whose ITL meets the target, within
`max_num_seqs` and the KV cache: `planner_core.perf.capacity.decode_capacity`). A pool sized on the mean rate
alone carries that batch on average; the margin is there because requests bunch up and the batch rises above
its mean. How far above is the traffic's, and it can be read from the window itself: every throughput tick
(`throughput_decode_learned_margin: true`), with the decode pool at the learned engine speed,

- **the window's concurrency peaks.** A request decodes for about `T = OSL x ITL` (the window's mean output
  length and mean ITL); the requests in flight at an arrival are about those that arrived in the `T` before it.
  The peak factor `f` is the p99 of those counts over the window's arrivals (each counted from `T` into the
  window) over their mean `rate x T` (at least 1);
- **the utilization that fits them.** A pool run at a mean batch `b_cap / f` per engine has its p99 concurrency at
  the capacity batch `b_cap`. Its request rate is `(b_cap / f) / (OSL x ITL(b_cap / f))` (the model's ITL at that
  batch, lower than at `b_cap`): that over the capacity's rate is the window's utilization `u`, bounded between
  the configured `throughput_decode_target_utilization` (the floor) and `throughput_decode_utilization_max`.

**Only on evidence, never on extrapolation.** A window's `u` is recorded only when its ITL met the target with
room (the p95 from the frontend's histogram, else the mean ITL, under `COMFORT` of the target) and no decode engine
queued requests behind a full batch; the pool is sized at the lowest `u` of the newest `RECENT_WINDOWS` recorded.
A window whose ITL missed the target, or whose decode engines queued at a full batch, records the floor: the margin
is back at the configured one at once and stays until `RECENT_WINDOWS` windows have supported a leaner one. A
window counts only when the decode pool held the same ready engines from its start to its end (starting or
draining engines never count); a window without an ITL (`decode_margin_no_latency`), with too few requests, with
an ITL met without room, or without per-request arrivals (`decode_margin_no_evidence`) keeps the last figures.

The state is `PlannerState.decode_margin` (replay stays exact); each tick leaves a `decode_margin` step whose value
is the utilization the sizing reads and whose detail gives the window's figures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

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
from planner_core.perf.capacity import decode_capacity, decode_context, effective_accept_length
from planner_core.perf.forward import ForwardPassModel
from planner_core.policy.feedback import COMFORT, MIN_WINDOW_REQUESTS

__all__ = [
    "PEAK_QUANTILE",
    "RECENT_WINDOWS",
    "DecodeMarginWindow",
    "concurrency_peak_factor",
    "histogram_quantile_ms",
    "learn_decode_margin",
    "margin_bounds",
    "sizing_utilization",
]

RECENT_WINDOWS = 5  # the sizing reads the lowest utilization of this many newest recorded windows
PEAK_QUANTILE = 99.0  # the concurrency peak the capacity batch must hold: the p99 over the window's arrivals
_ITL_TAIL = 0.95  # the ITL tail judged where the source has the histogram


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DecodeMarginWindow:
    """What the learned decode margin reads of the tick: the window, the decode pool's engines and limits, and
    the decode model at the learned engine speed."""

    traffic: TrafficObservation
    window_s: float
    workers: WorkerCounts
    limits: EngineLimits
    model: ForwardPassModel
    itl_target_ms: float  # the ITL target the window is judged on (the capacity is searched at the config's)
    accept_length: float | None = None
    fpm: tuple[ForwardPassMetrics, ...] = ()  # the serving engines' latest iterations, where reported


def margin_bounds(config: PlannerConfig) -> tuple[float, float]:
    """The floor (the configured decode target utilization) and the ceiling (never below the floor)."""
    floor = float(config.throughput_decode_target_utilization)
    return floor, max(floor, float(config.throughput_decode_utilization_max))


def sizing_utilization(config: PlannerConfig, state: DecodeMarginState) -> float:
    """The decode target utilization the sizing reads: the lowest of the recent windows', within the bounds; the
    floor until a window has been recorded."""
    floor, ceiling = margin_bounds(config)
    if not state.recent:
        return floor
    return min(ceiling, max(floor, min(state.recent)))


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


def concurrency_peak_factor(arrivals_s: Sequence[float], start_s: float, rate_per_s: float, lifetime_s: float) -> float:
    """The p99 over the arrivals (each counted from `lifetime_s` after `start_s`) of the requests that arrived in
    the `lifetime_s` up to it, its own included, over their mean `rate_per_s x lifetime_s`; at least 1, and 1 when
    no arrival can be counted."""
    at_s = np.sort(np.asarray(arrivals_s, dtype=float))
    mean = rate_per_s * lifetime_s
    if not len(at_s) or not mean > 0:
        return 1.0
    counts = np.searchsorted(at_s, at_s, side="right") - np.searchsorted(at_s, at_s - lifetime_s, side="left")
    counted = counts[at_s >= start_s + lifetime_s]
    if not len(counted):
        return 1.0
    return max(1.0, float(np.percentile(counted, PEAK_QUANTILE)) / mean)


def _held(
    state: DecodeMarginState, config: PlannerConfig, ready: int, reason: ReasonCode, why: str
) -> tuple[DecodeMarginState, StepRecord]:
    updated = dataclasses.replace(state, last_ready=ready)
    value = sizing_utilization(config, updated)
    detail = f"{why}: utilization {value:.3f} kept"
    return updated, StepRecord(step=StepName.DECODE_MARGIN, component=Component.DECODE, value=value, reason=reason,
                               detail=detail)  # fmt: skip


def _recorded(
    state: DecodeMarginState, config: PlannerConfig, ready: int, utilization: float, reason: ReasonCode, why: str
) -> tuple[DecodeMarginState, StepRecord]:
    before = sizing_utilization(config, state)
    updated = DecodeMarginState(recent=(*state.recent, utilization)[-RECENT_WINDOWS:], last_ready=ready)
    value = sizing_utilization(config, updated)
    detail = f"{why}: utilization {before:.3f} -> {value:.3f} (lowest of {len(updated.recent)} windows)"
    return updated, StepRecord(step=StepName.DECODE_MARGIN, component=Component.DECODE, value=value, reason=reason,
                               detail=detail)  # fmt: skip


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


def learn_decode_margin(
    config: PlannerConfig, state: DecodeMarginState, window: DecodeMarginWindow
) -> tuple[DecodeMarginState, StepRecord]:
    """The learned decode margin after the window (module docstring), and its `decode_margin` step."""
    traffic, component = window.traffic, Component.DECODE
    ready = window.workers.ready(component)
    floor, ceiling = margin_bounds(config)
    if ready <= 0 or ready != window.workers.expected(component) or state.last_ready != ready:
        why = f"decode pool changing: {ready} ready of {window.workers.expected(component)}, {state.last_ready} before"
        return _held(state, config, ready, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    if traffic.itl_ms is None:
        return _held(state, config, ready, ReasonCode.DECODE_MARGIN_NO_LATENCY, "no ITL observed in the window")
    if traffic.num_req < MIN_WINDOW_REQUESTS:
        why = f"{traffic.num_req:g} requests in the window (< {MIN_WINDOW_REQUESTS})"
        return _held(state, config, ready, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    tail_name, tail_ms = _itl_tail(traffic)
    assert tail_ms is not None  # the mean is there
    target_ms = window.itl_target_ms
    seen = f"ITL {tail_name} {tail_ms:.1f} ms (target {target_ms:g} ms)"
    queued = _queued_at_full_batch(window)
    if tail_ms > target_ms or queued:
        why = f"{seen}, {queued} requests queued at a full decode batch: missed, back to the floor {floor:g}"
        return _recorded(state, config, ready, floor, ReasonCode.DECODE_MARGIN_MISSED, why)
    if tail_ms > COMFORT * target_ms:
        why = f"{seen}: met without room (> {COMFORT:g} of the target)"
        return _held(state, config, ready, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    arrivals = traffic.prompt_arrivals
    if arrivals is None or arrivals.resolution_s != 0 or not arrivals.at_s:
        why = f"{seen}: no per-request arrivals to read the concurrency from"
        return _held(state, config, ready, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, why)
    utilization, figures = _concurrency_fit(config, window)
    if utilization is None:
        return _held(state, config, ready, ReasonCode.DECODE_MARGIN_NO_EVIDENCE, f"{seen}; {figures}")
    bounded = min(ceiling, max(floor, utilization))
    why = f"{seen}, met with room; {figures}: utilization {utilization:.3f}, bounded {bounded:.3f}"
    return _recorded(state, config, ready, bounded, ReasonCode.DECODE_MARGIN_LEARNED, why)


def _concurrency_fit(config: PlannerConfig, window: DecodeMarginWindow) -> tuple[float | None, str]:
    """The utilization at which the window's p99 concurrency fills the capacity batch (module docstring), and its
    figures for the step; None (with why) where the capacity or the window's lifetime is not positive."""
    traffic, limits, model = window.traffic, window.limits, window.model
    assert traffic.itl_ms is not None and traffic.prompt_arrivals is not None  # learn_decode_margin checked them
    isl, osl = max(1.0, traffic.isl), max(1.0, traffic.osl)
    capacity = decode_capacity(
        model, limits, isl=isl, osl=osl, itl_ms=config.capacity_itl_ms, accept_length=window.accept_length
    )
    lifetime_s = osl * traffic.itl_ms / 1000.0
    if not (capacity.requests_per_s > 0 and capacity.batch_size >= 1 and lifetime_s > 0 and window.window_s > 0):
        return None, "no decode capacity or request lifetime to fit"
    arrivals = traffic.prompt_arrivals
    peak = concurrency_peak_factor(arrivals.at_s, arrivals.start_s, traffic.num_req / window.window_s, lifetime_s)
    accept, _ = effective_accept_length(window.accept_length, limits.speculative_nextn, Component.DECODE)
    batch = capacity.batch_size / peak
    itl_s = model.decode_wall_s(batch, batch * decode_context(isl, osl)) / accept
    if not (itl_s > 0 and math.isfinite(itl_s)):
        return None, "no modelled ITL at the peak-fitting batch"
    rate = batch / (osl * itl_s)
    figures = (
        f"requests decode for {lifetime_s:.1f} s, concurrency p99 {peak:.2f}x its mean; capacity batch "
        f"{capacity.batch_size} at {capacity.requests_per_s:.1f} req/s, batch {batch:.0f} at {rate:.1f} req/s"
    )
    return rate / capacity.requests_per_s, figures
