"""The closed loop (ours): each pool's engine speed learned from what its engines report and the latency it served,
so the sizing follows the engines the planner drives rather than the profile it was given.

Real engines never run exactly as profiled (another driver, a prefix-cache hit rate, a router that is not least
loaded, a noisy neighbour). On every throughput tick (`throughput_capacity_feedback: true`) the window just observed
is compared with what the perf model predicts for it, per pool, and the pool's learned speed (a multiple of the
model's speed in the pool's phase, `PoolFeedback.speed`) moves; the sizing then times that pool's iterations with
the model at the learned speed (`planner_core.perf.scaled`), in the mean-rate capacity and the burst rate alike.

- **From the engines' own iterations, where they report them** (forward-pass metrics: each iteration's scheduled
  work and wall time): the model's time for that work over the reported one is the speed, exactly; the median over
  the pool's working iterations is the window's measure (`fpm_speed`); a tick whose reports are all idle measures
  nothing. The sources without them (no engine reports at all) read the window's latency instead:
- **Decode, from the mean ITL.** Little's law gives the batch each engine carried: `b = rate per engine x OSL x
  ITL`; the model times an iteration of that batch at the window's context; the ratio of the model's ITL to the
  observed one is the window's speed.
- **Prefill, from TTFT.** A TTFT mixes compute and queueing, so the prefill speed has two one-sided signals. A miss
  (the window's tail TTFT over the target) lowers the speed by `sqrt(target / tail)`, between 3 % and 15 % a window;
  the tail is the p99 where under 0.5 % of the window's prompts cannot meet the target even alone on an engine at
  the learned speed, the p95 under 3 %, and none beyond (the misses of prompts too long for the target say nothing
  of the pool's size). Queueing only adds to a TTFT, so `mean compute time / mean TTFT` bounds the speed from below:
  a window where it exceeds the learned speed raises the speed towards it. A window that meets its tail comfortably
  (under `COMFORT` of the target) at load raises a speed below the model's 2 % back towards it.
- **Prefill where the engines report: the TTFT still bounds it.** Iterations measure compute, not queueing (a
  router that is not least loaded, requests bunched at one engine): a window whose p95 TTFT misses the target lowers
  the iterations' speed as a missed tail does above, and the iterations raise it only in a window whose p95 met the
  target comfortably. The p99 is not read there: with the p95 met, a p99 miss is a burst the forecast did not see.
- **A miss is the engines' as far as the load does not explain it.** Where the window's own prompt bursts needed no
  more engines than the pool had at the learned speed (`FeedbackWindow.prompt_need_engines`, the burst rule on the
  window's own curve), a missed TTFT lowers the prefill speed (either path). Where they needed more, the burst rule
  also says what tail that load alone makes at the pool's size: the longest wait its p99 arrival curve builds on
  the ready engines, `max over L of (A(L) / (n mu) - L)`, plus the p95 compute of a prompt (`_load_tail_ms`). A
  tail within `LOAD_EXCESS` of that is the load's (the burst sizing answers it: speed kept); a tail beyond it is
  the engines' or the router's (a router that spreads a burst worse than the least-loaded one the rule assumes),
  and lowers the speed by `sqrt(load tail / tail)`, bounded as a miss.
- **Only a mean TTFT** (Dynamo's replay, a source without the histogram): a p95 is estimated from it for the prompts
  that can meet the target alone, their p95 compute plus ln 20 times the mean wait (`_p95_from_mean`).
- **Slower at once, faster on evidence at load.** A measure under the learned speed moves it half way at once; one
  over it moves it 30 % of the way, and only from iterations (or a window) at load (a quarter of the engine's batch
  budget; `AT_LOAD_DECODE` of its capacity for the ITL measure): a light window's speed is not extrapolated to the
  load the pool is sized for.
- **Safe learning.** A window counts only when the pool held the same ready engines from its start to its end
  (engines starting or draining skew both signals); a window without a latency, or with under
  `MIN_WINDOW_REQUESTS` requests, keeps the last speed with a reason code, never resets it. The speed stays within
  the configured bounds, and the sizing reads it only outside a dead band of `SPEED_DEAD_BAND` around the model's
  (the window estimates wander by about that much on an engine that runs as profiled).

Each pool gets a `capacity_feedback` step with the window's figures, the old and the new speed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from planner_core.config import PlannerConfig, RouterKind
from planner_core.domain import (
    CapacityFeedback,
    Component,
    EngineLimits,
    ForwardPassMetrics,
    PoolFeedback,
    ReasonCode,
    StepName,
    StepRecord,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.perf.capacity import (
    chunked_prefill_s,
    decode_capacity,
    decode_context,
    effective_accept_length,
    effective_kv_hit_rate,
)
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.scaled import speed_scaled

__all__ = [
    "AT_LOAD_DECODE",
    "AT_LOAD_PREFILL",
    "COMFORT",
    "MIN_WINDOW_REQUESTS",
    "SPEED_DEAD_BAND",
    "FeedbackWindow",
    "fpm_speed",
    "learn_decode_speed",
    "learn_pool_speed",
    "learn_prefill_speed",
    "learned_model",
    "sizing_speed",
]

MIN_WINDOW_REQUESTS = 20  # fewer requests than this make a window's mean latency noise
SPEED_DEAD_BAND = 0.05  # learned speeds within 5 % of the model's size as the model
AT_LOAD_DECODE = 0.4  # a decode window counts as at load from 40 % of one engine's capacity per engine
AT_LOAD_PREFILL = 0.3  # a prefill window counts as at load from 30 % compute utilisation
COMFORT = 0.8  # a tail under 80 % of the target is met comfortably
_DECREASE_FLOOR, _DECREASE_CEILING = 0.85, 0.97  # one missed window lowers the prefill speed by 3-15 %
_RECOVERY_STEP = 1.02  # a comfortable window at load raises a prefill speed below the model's by 2 %
_SLOWER_WEIGHT, _FASTER_WEIGHT = 0.5, 0.3  # how far one window moves the speed towards its measurement
_AGREES = 0.03  # a decode measurement within 3 % of the learned speed agrees with it
_P99_UNATTAINABLE, _P95_UNATTAINABLE = 0.005, 0.03
# A tail up to 1.25x what the window's own load makes at the pool's size is the load's: the rule's curve is a p99
# over the window, the judged tail a p95 (or a p95 estimated from the mean), so they agree only roughly.
LOAD_EXCESS = 1.25


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FeedbackWindow:
    """What one pool's learning reads of the tick: the window and the pool's engines, and its limits."""

    traffic: TrafficObservation
    window_s: float
    workers: WorkerCounts
    limits: EngineLimits
    kv_hit_rate: float | None = None
    accept_length: float | None = None
    fpm: tuple[ForwardPassMetrics, ...] = ()  # the pool's serving engines' latest iterations, where reported
    # the engines the window's own prompt bursts needed at the learned speed (the burst rule), where known
    prompt_need_engines: float | None = None
    # the prompt tokens/s one engine drains in the burst rule, at the learned speed (for `_load_tail_ms`)
    engine_prompt_tokens_per_s: float | None = None


def sizing_speed(feedback: PoolFeedback) -> float:
    """The speed the sizing reads: the learned one, or the model's (1.0) within the dead band."""
    return 1.0 if abs(feedback.speed - 1.0) < SPEED_DEAD_BAND else feedback.speed


def learned_model(model: ForwardPassModel, feedback: CapacityFeedback, component: Component) -> ForwardPassModel:
    """`model` at the pool's learned speed in its own phase (prefill iterations for the prefill pool, decode
    iterations for the decode pool); the model itself while the speed is within the dead band."""
    if component is Component.PREFILL:
        return speed_scaled(model, prefill_speed=sizing_speed(feedback.prefill))
    return speed_scaled(model, decode_speed=sizing_speed(feedback.decode))


def _held(
    feedback: PoolFeedback, component: Component, ready: int, reason: ReasonCode, detail: str
) -> tuple[PoolFeedback, StepRecord]:
    step = StepRecord(
        step=StepName.CAPACITY_FEEDBACK, component=component, value=feedback.speed, reason=reason, detail=detail
    )
    return dataclasses.replace(feedback, last_ready=ready), step


def _unusable(feedback: PoolFeedback, component: Component, window: FeedbackWindow, latency_ms: float | None) -> str:
    """Why the window cannot be measured ("" when it can), as the held step's detail; reason via `_unusable_reason`."""
    ready = window.workers.ready(component)
    if ready <= 0 or ready != window.workers.expected(component) or feedback.last_ready != ready:
        return f"pool changing: {ready} ready of {window.workers.expected(component)}, {feedback.last_ready} before"
    if latency_ms is None:
        return "no latency observed in the window"
    if window.traffic.num_req < MIN_WINDOW_REQUESTS:
        return f"{window.traffic.num_req:g} requests in the window (< {MIN_WINDOW_REQUESTS})"
    return ""


def _unusable_reason(detail: str) -> ReasonCode:
    if detail.startswith("pool changing"):
        return ReasonCode.FEEDBACK_POOL_CHANGING
    if detail.startswith("no latency"):
        return ReasonCode.FEEDBACK_NO_LATENCY
    return ReasonCode.FEEDBACK_TOO_FEW_REQUESTS


def _bounded(config: PlannerConfig, speed: float) -> float:
    return min(config.throughput_feedback_speed_max, max(config.throughput_feedback_speed_min, speed))


def _learned(
    config: PlannerConfig,
    feedback: PoolFeedback,
    component: Component,
    ready: int,
    new_speed: float,
    detail: str,
    *,
    measured: float | None,
) -> tuple[PoolFeedback, StepRecord]:
    new_speed = _bounded(config, new_speed)
    moved = new_speed != feedback.speed
    reason = ReasonCode.FEEDBACK_LEARNED if moved else ReasonCode.FEEDBACK_CONFIRMED
    updated = PoolFeedback(
        speed=new_speed,
        num_updates=feedback.num_updates + int(moved),
        last_ready=ready,
        last_measured=measured,
    )
    text = f"{detail}: speed {feedback.speed:.3f} -> {new_speed:.3f}" if moved else f"{detail}: speed {new_speed:.3f}"
    step = StepRecord(step=StepName.CAPACITY_FEEDBACK, component=component, value=new_speed, reason=reason, detail=text)
    return updated, step


# --- forward-pass metrics -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FpmSpeed:
    """The pool's speed measured on its engines' iterations: the median ratio of the model's time to the reported
    one over every working iteration (`speed`), and over those at load only (`at_load_speed`, None without one)."""

    speed: float
    at_load_speed: float | None
    num_iterations: int


def fpm_speed(
    component: Component, fpms: Sequence[ForwardPassMetrics], model: ForwardPassModel, limits: EngineLimits
) -> FpmSpeed | None:
    """The pool's speed from its engines' latest iterations (`ForwardPassMetrics`): each working iteration's
    modelled time over its reported wall time, the median; None without a working iteration of the pool. A prefill
    iteration is at load from a quarter of the batched-token budget; a decode iteration from a quarter of
    `max_num_seqs`. Mixed iterations (a prompt chunk on a decode batch) are left out: their split between the phases
    is the model's guess, not a measurement."""
    ratios: list[float] = []
    at_load: list[float] = []
    for fpm in fpms:
        scheduled = fpm.scheduled
        if fpm.component is not component or fpm.is_idle_heartbeat:
            continue
        if component is Component.PREFILL:
            if scheduled.sum_prefill_tokens <= 0 or scheduled.num_decode_requests > 0:
                continue
            modelled_s = model.prefill_wall_s(float(scheduled.sum_prefill_tokens))
            loaded = scheduled.sum_prefill_tokens >= limits.max_num_batched_tokens / 4
        else:
            if scheduled.num_decode_requests <= 0 or scheduled.sum_prefill_tokens > 0:
                continue
            modelled_s = model.decode_wall_s(
                float(scheduled.num_decode_requests), float(scheduled.sum_decode_kv_tokens)
            )
            loaded = scheduled.num_decode_requests >= limits.max_num_seqs / 4
        if not modelled_s > 0:
            continue
        ratio = modelled_s / fpm.wall_time_s
        ratios.append(ratio)
        if loaded:
            at_load.append(ratio)
    if not ratios:
        return None
    return FpmSpeed(
        speed=_median(ratios), at_load_speed=_median(at_load) if at_load else None, num_iterations=len(ratios)
    )


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def _learn_from_fpm(
    config: PlannerConfig, feedback: PoolFeedback, component: Component, ready: int, measured: FpmSpeed
) -> tuple[PoolFeedback, StepRecord]:
    """Slower than learned: half way at once; faster: only on iterations at load, 30 % of the way."""
    speed = feedback.speed
    detail = f"{measured.num_iterations} engine iterations: measured speed {measured.speed:.3f}" + (
        "" if measured.at_load_speed is None else f", {measured.at_load_speed:.3f} at load"
    )
    if measured.speed < speed * (1.0 - _AGREES):
        new = speed + _SLOWER_WEIGHT * (measured.speed - speed)
        return _learned(config, feedback, component, ready, new, detail, measured=measured.speed)
    if measured.speed <= speed * (1.0 + _AGREES):
        return _learned(config, feedback, component, ready, speed, detail, measured=measured.speed)
    if measured.at_load_speed is None or measured.at_load_speed <= speed:
        return _held(
            feedback,
            component,
            ready,
            ReasonCode.FEEDBACK_NOT_AT_LOAD,
            f"{detail}; no iteration at load faster than learned: speed {speed:.3f} kept",
        )
    new = speed + _FASTER_WEIGHT * (measured.at_load_speed - speed)
    return _learned(config, feedback, component, ready, new, detail, measured=measured.at_load_speed)


# --- decode ------------------------------------------------------------------------------------------------------


def learn_pool_speed(
    component: Component,
    config: PlannerConfig,
    feedback: PoolFeedback,
    window: FeedbackWindow,
    model: ForwardPassModel,
) -> tuple[PoolFeedback, StepRecord]:
    """`component`'s pool speed after the window (module docstring), `model` being the pool's model at speed 1:
    from its engines' iterations where they report them (a tick whose reports are all idle measures nothing),
    else, for sources without them, from the window's latency (TTFT for prefill, ITL for decode). Where
    iterations are reported, the prefill speed they give is bounded by the window's p95 TTFT (`_bounded_by_ttft`):
    iterations measure compute, not the queueing a router adds; the p99 is not read there (a burst the forecast
    missed, which the burst sizing answers)."""
    traffic = window.traffic
    ready = window.workers.ready(component)
    reports = any(fpm.component is component for fpm in window.fpm)
    latency_ms = traffic.ttft_ms if component is Component.PREFILL else traffic.itl_ms
    why = _unusable(feedback, component, window, 1.0 if reports else latency_ms)
    if why:
        return _held(feedback, component, ready, _unusable_reason(why), why)
    if reports:
        measured_fpm = fpm_speed(component, window.fpm, model, window.limits)
        if measured_fpm is None:
            detail = f"the pool's engines report no working iteration this tick: speed {feedback.speed:.3f} kept"
            learned = _held(feedback, component, ready, ReasonCode.FEEDBACK_TOO_FEW_REQUESTS, detail)
        else:
            learned = _learn_from_fpm(config, feedback, component, ready, measured_fpm)
        if component is Component.PREFILL:
            return _bounded_by_ttft(config, feedback, window, model, ready, learned)
        return learned
    from_latency = _prefill_from_ttft if component is Component.PREFILL else _decode_from_itl
    return from_latency(config, feedback, window, model, ready)


def learn_decode_speed(
    config: PlannerConfig, feedback: PoolFeedback, window: FeedbackWindow, model: ForwardPassModel
) -> tuple[PoolFeedback, StepRecord]:
    """The decode pool's speed after the window (`learn_pool_speed`)."""
    return learn_pool_speed(Component.DECODE, config, feedback, window, model)


def learn_prefill_speed(
    config: PlannerConfig, feedback: PoolFeedback, window: FeedbackWindow, model: ForwardPassModel
) -> tuple[PoolFeedback, StepRecord]:
    """The prefill pool's speed after the window (`learn_pool_speed`)."""
    return learn_pool_speed(Component.PREFILL, config, feedback, window, model)


def _decode_from_itl(
    config: PlannerConfig, feedback: PoolFeedback, window: FeedbackWindow, model: ForwardPassModel, ready: int
) -> tuple[PoolFeedback, StepRecord]:
    """Decode from the mean ITL at the batch Little's law gives (module docstring)."""
    component, traffic = Component.DECODE, window.traffic
    assert traffic.itl_ms is not None  # learn_pool_speed checked it
    itl_s = traffic.itl_ms / 1000.0
    osl = max(1.0, traffic.osl)
    isl = max(1.0, traffic.isl)
    accept, _ = effective_accept_length(window.accept_length, window.limits.speculative_nextn, component)
    context = decode_context(isl, osl)
    rate_per_engine = traffic.num_req / window.window_s / ready
    batch = max(1.0, rate_per_engine * osl * itl_s)  # Little's law: requests decoding on one engine at a time
    model_itl_s = model.decode_wall_s(batch, batch * context) / accept
    if not (model_itl_s > 0 and itl_s > 0):
        return _held(feedback, component, ready, ReasonCode.FEEDBACK_NO_LATENCY, "no usable ITL in the window")
    measured = model_itl_s / itl_s
    detail = (
        f"ITL {traffic.itl_ms:.1f} ms observed, {model_itl_s * 1000.0:.1f} ms modelled at batch {batch:.1f} "
        f"(context {context}): measured speed {measured:.3f}"
    )
    speed = feedback.speed
    if measured < speed * (1.0 - _AGREES):
        return _learned(
            config, feedback, component, ready, speed + _SLOWER_WEIGHT * (measured - speed), detail, measured=measured
        )
    if measured <= speed * (1.0 + _AGREES):
        return _learned(config, feedback, component, ready, speed, detail, measured=measured)
    capacity = decode_capacity(
        speed_scaled(model, decode_speed=speed),
        window.limits,
        isl=isl,
        osl=osl,
        itl_ms=config.capacity_itl_ms,
        accept_length=window.accept_length,
    )
    load = rate_per_engine / capacity.requests_per_s if capacity.requests_per_s > 0 else 0.0
    if load < AT_LOAD_DECODE:
        return _held(
            feedback,
            component,
            ready,
            ReasonCode.FEEDBACK_NOT_AT_LOAD,
            f"{detail}; at {load:.2f} of an engine's capacity (< {AT_LOAD_DECODE:g}): speed {speed:.3f} kept",
        )
    return _learned(
        config, feedback, component, ready, speed + _FASTER_WEIGHT * (measured - speed), detail, measured=measured
    )


# --- prefill -----------------------------------------------------------------------------------------------------


def _prompt_lengths(traffic: TrafficObservation) -> Sequence[float]:
    """Each request's prompt tokens where the source recorded them one by one, else the window's mean."""
    arrivals = traffic.prompt_arrivals
    if arrivals is not None and arrivals.resolution_s == 0 and arrivals.isl:
        return arrivals.isl
    return (traffic.isl,)


@dataclasses.dataclass(frozen=True, slots=True)
class _TtftReading:
    """A window's TTFT against the target and the compute its prompts needed (`_read_ttft`)."""

    lower_bound: float  # mean compute / mean TTFT: queueing only adds to a TTFT, so the speed is at least this
    tail_ms: float | None  # the tail that judges the pool, None where unusable
    compute_p95_ms: float  # the p95 compute of the prompts that can meet the target alone (all, where none can)
    utilization: float  # the pool's compute utilisation at the learned speed
    detail: str

    def missed(self, target_ms: float) -> bool:
        return self.tail_ms is not None and self.tail_ms > target_ms

    def comfortable(self, target_ms: float) -> bool:
        return self.tail_ms is not None and self.tail_ms <= COMFORT * target_ms


def _read_ttft(
    config: PlannerConfig,
    speed: float,
    window: FeedbackWindow,
    model: ForwardPassModel,
    ready: int,
    *,
    with_p99: bool = True,
) -> _TtftReading | None:
    """The window's TTFT reading at the learned `speed`, None when the window has no usable TTFT; `with_p99`
    False judges on the p95 alone."""
    traffic = window.traffic
    if traffic.ttft_ms is None:
        return None
    hit, _ = effective_kv_hit_rate(window.kv_hit_rate, Component.PREFILL)
    budget = window.limits.max_num_batched_tokens
    compute_s = [
        chunked_prefill_s(max(1.0, math.ceil(isl * (1.0 - hit))), budget, model.prefill_wall_s)
        for isl in _prompt_lengths(traffic)
    ]
    mean_compute_s = sum(compute_s) / len(compute_s)
    if not (mean_compute_s > 0 and traffic.ttft_ms > 0):
        return None
    target_ms = config.ttft_ms
    too_long = sum(1 for s in compute_s if s / speed * 1000.0 > target_ms) / len(compute_s)
    tail_name, tail_ms = _usable_tail(
        traffic, too_long, [s / speed for s in compute_s], target_ms=target_ms, with_p99=with_p99
    )
    utilization = traffic.num_req / window.window_s / ready * mean_compute_s / speed
    lower_bound = mean_compute_s * 1000.0 / traffic.ttft_ms
    at_speed_ms = [s / speed * 1000.0 for s in compute_s]
    compute_p95_ms = _p95([ms for ms in at_speed_ms if ms <= target_ms] or at_speed_ms)
    detail = (
        f"TTFT mean {traffic.ttft_ms:.0f} ms, {tail_name} {_ms(tail_ms)} (target {target_ms:g} ms; "
        f"{too_long:.1%} of prompts beyond it alone); compute {mean_compute_s * 1000.0:.0f} ms a prompt: speed >= "
        f"{lower_bound:.3f}; utilisation {utilization:.2f}"
    )
    return _TtftReading(
        lower_bound=lower_bound, tail_ms=tail_ms, compute_p95_ms=compute_p95_ms, utilization=utilization, detail=detail
    )


def _short_for_its_load(window: FeedbackWindow, ready: int) -> str:
    """Why a missed TTFT says nothing of the engines' speed ("" when it does): the window's own prompt bursts needed
    more engines than the pool had, at the speed learned so far (a burst the forecast missed, not a slow engine)."""
    need = window.prompt_need_engines
    if need is None or need <= ready:
        return ""
    return f"its own prompt bursts needed {need:.1f} engines of the {ready} ready"


def _load_tail_ms(window: FeedbackWindow, ready: int, compute_p95_ms: float) -> float | None:
    """The TTFT tail the window's own load makes on `ready` engines by the burst rule (module docstring): the
    longest wait its p99 prompt-arrival curve builds there plus a prompt's p95 compute; None without a curve or a
    rate."""
    rate = window.engine_prompt_tokens_per_s
    curve = window.traffic.prompt_arrival_curve()
    if rate is None or rate <= 0 or ready <= 0 or not curve:
        return None
    wait_s = max(0.0, max(tokens / (rate * ready) - interval_s for interval_s, tokens in curve))
    return wait_s * 1000.0 + compute_p95_ms


def _beyond_load(
    config: PlannerConfig, window: FeedbackWindow, ready: int, reading: _TtftReading, short: str
) -> tuple[float | None, str]:
    """For a missed tail where the load outgrew the pool (`short`): the speed factor for the part of the tail the
    load does not explain (None: the load explains it) and the step's text. Under a declared round-robin router the
    sizing already spreads the window's prompts by count (`planner_core.policy.dispatch`), which is what the
    least-loaded burst rule's tail leaves out: the miss is the load's there."""
    assert reading.tail_ms is not None
    if config.router is RouterKind.ROUND_ROBIN:
        return None, f"missed, but {short} (round-robin router: sized by count)"
    load_ms = _load_tail_ms(window, ready, reading.compute_p95_ms)
    if load_ms is None or reading.tail_ms <= LOAD_EXCESS * load_ms:
        explained = "" if load_ms is None else f" (the load alone makes {load_ms:.0f} ms)"
        return None, f"missed, but {short}{explained}"
    factor = _missed_factor(load_ms, reading.tail_ms)
    text = f"missed; {short}, whose load alone makes {load_ms:.0f} ms: the rest is the engines' or the router's"
    return factor, text


def _beyond_load_learned(learned: tuple[PoolFeedback, StepRecord]) -> tuple[PoolFeedback, StepRecord]:
    """`_learned`'s step for a miss beyond the load: its own reason where the speed moved."""
    pool, step = learned
    if step.reason is ReasonCode.FEEDBACK_LEARNED:
        step = dataclasses.replace(step, reason=ReasonCode.FEEDBACK_MISS_BEYOND_LOAD)
    return pool, step


def _missed_factor(target_ms: float, tail_ms: float) -> float:
    """What one window whose tail missed the target multiplies the speed by (3-15 %)."""
    return min(_DECREASE_CEILING, max(_DECREASE_FLOOR, math.sqrt(target_ms / tail_ms)))


def _bounded_by_ttft(
    config: PlannerConfig,
    feedback: PoolFeedback,
    window: FeedbackWindow,
    model: ForwardPassModel,
    ready: int,
    learned: tuple[PoolFeedback, StepRecord],
) -> tuple[PoolFeedback, StepRecord]:
    """The iterations' speed bounded by the TTFT the pool served (module docstring): a missed tail lowers it as on
    the latency path, and a speed the iterations raise is kept unless the window met its tail comfortably."""
    pool, step = learned
    reading = _read_ttft(config, feedback.speed, window, model, ready, with_p99=False)
    if reading is None:
        return learned
    target_ms = config.ttft_ms
    short = _short_for_its_load(window, ready)
    if reading.missed(target_ms) and short:
        factor, text = _beyond_load(config, window, ready, reading, short)
        if factor is None:
            detail = f"{step.detail}; {reading.detail}: {text}: the miss is the load's"
            return pool, dataclasses.replace(step, reason=ReasonCode.FEEDBACK_MISS_WAS_LOAD, detail=detail)
        bound = feedback.speed * factor
        if bound < pool.speed:
            detail = f"{step.detail}; {reading.detail}: {text}"
            return _beyond_load_learned(
                _learned(config, feedback, Component.PREFILL, ready, bound, detail, measured=pool.last_measured)
            )
        return learned
    if reading.missed(target_ms):
        assert reading.tail_ms is not None
        bound = feedback.speed * _missed_factor(target_ms, reading.tail_ms)
        if bound < pool.speed:
            detail = f"{step.detail}; {reading.detail}: the missed tail bounds it"
            return _learned(config, feedback, Component.PREFILL, ready, bound, detail, measured=pool.last_measured)
    if pool.speed > feedback.speed and not reading.comfortable(target_ms):
        return _held(
            feedback,
            Component.PREFILL,
            ready,
            ReasonCode.FEEDBACK_NOT_AT_LOAD,
            f"{step.detail}; {reading.detail}: not met comfortably, speed {feedback.speed:.3f} kept",
        )
    return learned


def _prefill_from_ttft(
    config: PlannerConfig, feedback: PoolFeedback, window: FeedbackWindow, model: ForwardPassModel, ready: int
) -> tuple[PoolFeedback, StepRecord]:
    """Prefill from the window's TTFT: its tail over the target, its mean below the compute (module docstring)."""
    component = Component.PREFILL
    assert window.traffic.ttft_ms is not None  # learn_pool_speed checked it
    speed = feedback.speed
    target_ms = config.ttft_ms
    reading = _read_ttft(config, speed, window, model, ready)
    if reading is None:
        return _held(feedback, component, ready, ReasonCode.FEEDBACK_NO_LATENCY, "no usable TTFT in the window")
    lower_bound, tail_ms, utilization, detail = (
        reading.lower_bound, reading.tail_ms, reading.utilization, reading.detail
    )  # fmt: skip
    short = _short_for_its_load(window, ready)
    if tail_ms is not None and tail_ms > target_ms and short:
        factor, text = _beyond_load(config, window, ready, reading, short)
        if factor is None:
            return _held(feedback, component, ready, ReasonCode.FEEDBACK_MISS_WAS_LOAD, f"{detail}: {text}: speed kept")
        return _beyond_load_learned(
            _learned(config, feedback, component, ready, speed * factor, f"{detail}: {text}", measured=lower_bound)
        )
    if tail_ms is not None and tail_ms > target_ms:
        factor = _missed_factor(target_ms, tail_ms)
        return _learned(config, feedback, component, ready, speed * factor, detail, measured=lower_bound)
    if lower_bound > speed:
        return _learned(
            config,
            feedback,
            component,
            ready,
            speed + _FASTER_WEIGHT * (lower_bound - speed),
            detail,
            measured=lower_bound,
        )
    if tail_ms is not None and tail_ms <= COMFORT * target_ms and speed < 1.0:
        if utilization < AT_LOAD_PREFILL:
            return _held(
                feedback,
                component,
                ready,
                ReasonCode.FEEDBACK_NOT_AT_LOAD,
                f"{detail} (< {AT_LOAD_PREFILL:g}): speed {speed:.3f} kept",
            )
        return _learned(
            config, feedback, component, ready, min(1.0, speed * _RECOVERY_STEP), detail, measured=lower_bound
        )
    return _learned(config, feedback, component, ready, speed, detail, measured=lower_bound)


def _usable_tail(
    traffic: TrafficObservation,
    too_long: float,
    compute_s: Sequence[float],
    *,
    target_ms: float,
    with_p99: bool = True,
) -> tuple[str, float | None]:
    """The TTFT tail that judges the pool: the p99 (if `with_p99`) when at most 0.5 % of the prompts cannot meet
    the target alone, the p95 up to 3 %, none beyond. A source with only the mean TTFT gets a p95 estimated from it
    (`_p95_from_mean`), of the prompts that can meet the target alone: `compute_s` holds each prompt's compute."""
    if with_p99 and too_long <= _P99_UNATTAINABLE and traffic.ttft_ms_p99 is not None:
        return "p99", traffic.ttft_ms_p99
    if too_long <= _P95_UNATTAINABLE and traffic.ttft_ms_p95 is not None:
        return "p95", traffic.ttft_ms_p95
    if traffic.ttft_ms_p95 is None and traffic.ttft_ms_p99 is None and traffic.ttft_ms is not None:
        attainable_s = [s for s in compute_s if s * 1000.0 <= target_ms]
        if attainable_s:
            return "p95 from the mean", _p95_from_mean(traffic.ttft_ms, compute_s, attainable_s)
    return "tail", None


def _p95_from_mean(mean_ttft_ms: float, compute_s: Sequence[float], attainable_s: Sequence[float]) -> float:
    """A p95 TTFT of the prompts that can meet the target alone (`attainable_s`, their compute times), from the
    window's mean TTFT alone: their p95 compute time plus ln 20 times the mean wait (the mean TTFT over the mean
    compute of all the window's prompts, `compute_s`): the p95 of an exponentially distributed wait of that mean."""
    p95_compute_ms = _p95(attainable_s) * 1000.0
    mean_wait_ms = max(0.0, mean_ttft_ms - sum(compute_s) / len(compute_s) * 1000.0)
    return p95_compute_ms + math.log(20.0) * mean_wait_ms


def _p95(values: Sequence[float]) -> float:
    """The nearest-rank p95 of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _ms(value: float | None) -> str:
    return "unusable" if value is None else f"{value:.0f} ms"
