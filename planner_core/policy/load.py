"""SLA load proposer: per-engine TTFT/ITL estimates from the latest forward-pass metrics -> one step up or down.

The load loop runs every `load_adjustment_interval_seconds` on the latest forward-pass metrics (FPM) of each
engine of a pool, and moves the pool by at most one replica per tick (Dynamo's load scaling for target `sla`):

- **Prefill**: each engine's TTFT estimate is the time to compute its queued prompt tokens plus one next request of
  the average ISL, discounted by the KV hit rate, in chunks of `max_num_batched_tokens`. Scale up if *every*
  engine's estimate exceeds the TTFT target. Scale down (N > 1) only if *every* engine could absorb its share of
  one removed engine: with `t_own` = the estimate with an empty queue, `budget = (TTFT - t_own) * sensitivity` and
  `post` = the estimate with the queue times N/(N-1), it needs `budget > 0` and `post - t_own < budget`
  (the new request's own compute does not shrink with more engines, so only the queue's share is budgeted).
- **Decode**: each engine's ITL estimate is one decode iteration of its scheduled and queued requests plus one next
  request (context ISL + OSL/2), divided by the speculative accept length. Up if every estimate exceeds the ITL
  target; down if for every engine the KV after consolidation, `(scheduled + queued KV) * N/(N-1)`, fits in
  `max_kv_tokens` and the ITL re-estimated with the decode load times N/(N-1) stays below `ITL * sensitivity`.
- **Aggregated** (one pool doing both): the prefill signal computes prefill chunks piggybacked on the scheduled
  decode batch (consolidation scales both the queue and the decode load, queued decode included); the decode
  signal adds the scheduled prefill chunk to each iteration and, for consolidation, counts queued prompt tokens as
  future KV. Up if either signal wants up; down only if both do (to the larger of the two); decode alone may scale
  down when the prefill signal is missing (no `max_num_batched_tokens`).

- **Unplaced requests** (an SLO-aware router, `planner_core.routing`): when the pool's router found no engine predicted
  within the SLO for some requests since the last tick, or requests wait at the frontend for the pool, the pool is
  short of capacity whatever the engines' own estimates say (the router keeps them below the SLO by refusing work):
  a signal that would hold or scale down becomes one replica up (`unplaced_signal` step, `unplaced_requests`).
With `load_tail_latency_scaling` (ours), the pool that computes prompts (prefill, or the aggregated pool) also reads
the frontend's measured tail where the traffic source provides it (`tail_latency_signal`): the per-engine estimates
see only what is queued at the engines, not requests waiting at the frontend or a tail the model does not predict.
It adds an engine when the p99 (else p95) TTFT or the mean wait for a first token is above the TTFT target, and
refuses a scale-down while the tail is above `down_sensitivity` times the target.

Then the throughput floor and the minimum endpoint (`fleet.finalize_load_proposal`). The per-engine estimates are in
`planner_core.policy.load_estimates` (re-exported here). Pure: the forward-pass model answers every timing
question; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    ReasonCode,
    StepName,
    StepRecord,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.perf.capacity import effective_accept_length
from planner_core.policy.fleet import BOTH_POOLS, Fleet, finalize_load_proposal, observe_fleet
from planner_core.policy.load_estimates import (
    _next_decode_context,
    estimate_agg_itl_s,
    estimate_agg_ttft_s,
    estimate_decode_itl_s,
    estimate_prefill_ttft_s,
    prefill_compute_fraction,
)

if TYPE_CHECKING:  # the protocol only types the argument; importing planner_core.perf would load numpy/scipy
    from planner_core.perf.forward import ForwardPassModel


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSlaTargets:
    """The SLA the load proposer holds each engine to.

    Attributes:
        ttft_ms, itl_ms: latency targets.
        down_sensitivity: fraction (0..1) of the remaining SLA budget a scale-down may use up; the config's
            `load_scaling_down_sensitivity` / 100. 0 never scales down, 1 is the most aggressive.
    """

    ttft_ms: float
    itl_ms: float
    down_sensitivity: float = 0.8


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadRuntime:
    """What the load proposer knows of the traffic (last observed values).

    Attributes:
        kv_hit_rate: fraction of prompt tokens served from the KV cache (router metric); None = no discount.
        accept_length: speculative-decoding mean accepted tokens per step; None = 1.
        avg_isl, avg_osl: mean input/output lengths (tokens) of recent requests; the "next request" every estimate
            adds. 0 = unknown: no next request is added.
        next_decode_context: KV tokens the next decode request holds, when the request lengths are unknown (no
            traffic window observed) but the engines' moving average of KV tokens per decode request is; None =
            `avg_isl + avg_osl / 2`.
    """

    kv_hit_rate: float | None = None
    accept_length: float | None = None
    avg_isl: float = 0.0
    avg_osl: float = 0.0
    next_decode_context: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SlaLoadInputs:
    """Everything one pool's SLA load proposal depends on, except the forward-pass model.

    Attributes:
        component: the pool (DECODE for aggregated mode's single pool).
        aggregated: whether the pool serves prefill and decode together (mode `agg`).
        fpm: the latest forward-pass metrics per (worker, DP rank); other pools' reports are ignored.
        workers: ready and expected workers of every pool.
        limits: the pool's engine limits (batch token budget, KV capacity, speculative depth).
        targets: the SLA and the scale-down sensitivity.
        runtime: KV hit rate, accept length and average request lengths.
        throughput_lower_bound: the throughput loop's floor for the pool; None when that loop is off.
        min_endpoint: the pool's minimum replicas.
        managed: the pools the planner scales; a scale in flight in any of them holds this one.
        unplaced: what the router could not place for this pool since the last tick (None: not reported).
        frontend: the frontend's latency over the last load interval (p95/p99 TTFT, queue time), where the source
            measures it; read only with `tail_latency_scaling`.
        tail_latency_scaling: whether the prompt pool also scales on the frontend's tail (`tail_latency_signal`).
    """

    component: Component
    aggregated: bool = False
    fpm: tuple[ForwardPassMetrics, ...]
    workers: WorkerCounts
    limits: EngineLimits
    targets: LoadSlaTargets
    runtime: LoadRuntime = field(default_factory=LoadRuntime)
    throughput_lower_bound: int | None = None
    min_endpoint: int = 1
    managed: tuple[Component, ...] = BOTH_POOLS
    unplaced: UnplacedRequests | None = None
    frontend: TrafficObservation | None = None
    tail_latency_scaling: bool = False


# --- signals ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Signal:
    """One latency signal's proposal: N+1, N-1 or N, and why."""

    desired: int
    reason: ReasonCode
    refused: bool  # a consolidation check vetoed the scale-down


def _consolidation_factor(num_workers: int) -> float:
    """Load each survivor carries after removing one of N engines, relative to now: N/(N-1) (1 when N = 1)."""
    return num_workers / (num_workers - 1) if num_workers > 1 else 1.0


def _scale_signal(
    component: Component,
    label: str,
    estimates_ms: list[float],
    sla_ms: float,
    *,
    num_workers: int,
    can_scale_down: bool,
    refused: bool,
    min_endpoint: int,
    steps: list[StepRecord],
) -> _Signal:
    """Up if every engine's estimate exceeds the SLA; down if every consolidation check passed; else hold."""
    worst = max(estimates_ms)
    if all(estimate > sla_ms for estimate in estimates_ms):
        signal = _Signal(desired=num_workers + 1, reason=ReasonCode.SCALE_UP, refused=refused)
        detail = f"every engine's {label} is above {sla_ms:g} ms (lowest {min(estimates_ms):.2f} ms)"
    elif num_workers > 1 and can_scale_down and max(num_workers - 1, min_endpoint) < num_workers:
        signal = _Signal(desired=num_workers - 1, reason=ReasonCode.SCALE_DOWN, refused=False)
        detail = f"every engine can absorb one removed engine within {label} {sla_ms:g} ms"
    elif refused:
        signal = _Signal(desired=num_workers, reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION, refused=True)
        detail = f"{label} {worst:.2f} ms at worst; one fewer engine would leave too little SLA margin"
    else:
        signal = _Signal(desired=num_workers, reason=ReasonCode.NO_CHANGE, refused=False)
        at_min = " (at the minimum endpoint)" if num_workers > 1 and can_scale_down else ""
        detail = f"{label} {worst:.2f} ms at worst against {sla_ms:g} ms{at_min}"
    steps.append(
        StepRecord(
            step=StepName(f"{label.lower()}_signal"),
            component=component,
            value=signal.desired,
            reason=signal.reason,
            detail=f"{num_workers} -> {signal.desired}: {detail}",
        )
    )
    return signal


def _estimate_step(component: Component, label: str, worker_id: str, estimate_ms: float, detail: str) -> StepRecord:
    return StepRecord(
        step=StepName(f"{label.lower()}_estimate"),
        component=component,
        value=estimate_ms,
        reason=ReasonCode.LATENCY_ESTIMATED,
        detail=f"{worker_id}: {label} {estimate_ms:.2f} ms ({detail})",
    )


def _consolidation_step(component: Component, worker_id: str, value: float, *, safe: bool, detail: str) -> StepRecord:
    return StepRecord(
        step=StepName.CONSOLIDATION,
        component=component,
        value=value,
        reason=ReasonCode.CONSOLIDATION_SAFE if safe else ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
        detail=f"{worker_id}: {detail}",
    )


def _ttft_estimator(
    inputs: SlaLoadInputs, model: ForwardPassModel, factor: float, *, aggregated: bool
) -> Callable[..., float]:
    """`ttft_ms(fpm, *, queue_scale, consolidated)`: one rank's TTFT estimate (ms) for `_prefill_signal`, the
    aggregated pool's after a consolidation (by `factor`) also carrying the removed engine's decode load."""
    runtime = inputs.runtime
    mbt = inputs.limits.max_num_batched_tokens

    def ttft_ms(fpm: ForwardPassMetrics, *, queue_scale: float, consolidated: bool) -> float:
        if aggregated:
            # Before consolidation only the scheduled decode batch slows the chunks; after it, the survivor also
            # inherits the removed engine's decode load, queued decode included (it will be scheduled).
            return 1000.0 * estimate_agg_ttft_s(
                model,
                fpm,
                max_num_batched_tokens=mbt,
                avg_isl=runtime.avg_isl,
                kv_hit_rate=runtime.kv_hit_rate,
                queue_scale=queue_scale,
                decode_scale=factor if consolidated else 1.0,
                include_queued_decode=consolidated,
            )
        return 1000.0 * estimate_prefill_ttft_s(
            model,
            fpm,
            max_num_batched_tokens=mbt,
            avg_isl=runtime.avg_isl,
            kv_hit_rate=runtime.kv_hit_rate,
            queue_scale=queue_scale,
        )

    return ttft_ms


def _prefill_signal(
    inputs: SlaLoadInputs, fleet: Fleet, model: ForwardPassModel, steps: list[StepRecord], *, aggregated: bool
) -> _Signal:
    """TTFT signal of a prefill pool (or the prefill side of an aggregated pool)."""
    runtime, targets = inputs.runtime, inputs.targets
    n = fleet.num_workers
    factor = _consolidation_factor(n)
    ttft_ms = _ttft_estimator(inputs, model, factor, aggregated=aggregated)

    estimates: list[float] = []
    can_scale_down, refused = n > 1, False
    for engine in fleet.engines:
        # Attention-DP ranks of one worker run in lockstep: the slowest rank is the worker's latency.
        estimate = max(ttft_ms(fpm, queue_scale=1.0, consolidated=False) for fpm in engine.ranks)
        estimates.append(estimate)
        queued = max(fpm.queued.sum_prefill_tokens for fpm in engine.ranks)
        steps.append(
            _estimate_step(
                inputs.component,
                "TTFT",
                engine.worker_id,
                estimate,
                f"{queued} queued tokens + next {runtime.avg_isl:.0f}, compute fraction "
                f"{prefill_compute_fraction(runtime.kv_hit_rate):.2f}",
            )
        )
        if not can_scale_down:
            continue
        own = max(ttft_ms(fpm, queue_scale=0.0, consolidated=True) for fpm in engine.ranks)
        post = max(ttft_ms(fpm, queue_scale=factor, consolidated=True) for fpm in engine.ranks)
        budget = (targets.ttft_ms - own) * targets.down_sensitivity
        # `budget > 0` follows from `post - own < budget` whenever more queued work never computes faster; it is
        # checked on its own so that no model can let a scale-down through on a used-up budget.
        safe = budget > 0 and post - own < budget
        steps.append(
            _consolidation_step(
                inputs.component,
                engine.worker_id,
                post,
                safe=safe,
                detail=(
                    f"TTFT with the queue x {factor:.3g} {post:.2f} ms, own {own:.2f} ms: queue share "
                    f"{post - own:.2f} ms {'<' if safe else '>='} budget ({targets.ttft_ms:g} - {own:.2f}) x "
                    f"{targets.down_sensitivity:g} = {budget:.2f} ms"
                ),
            )
        )
        if not safe:
            can_scale_down, refused = False, True
    return _scale_signal(
        inputs.component,
        "TTFT",
        estimates,
        targets.ttft_ms,
        num_workers=n,
        can_scale_down=can_scale_down,
        refused=refused,
        min_endpoint=inputs.min_endpoint,
        steps=steps,
    )


def _itl_estimator(
    inputs: SlaLoadInputs, model: ForwardPassModel, factor: float, accept: float, *, aggregated: bool
) -> Callable[..., float]:
    """`itl_ms(fpm, *, consolidated)`: one rank's ITL estimate (ms) for `_decode_signal`, the decode load scaled
    by `factor` after a consolidation; `accept` is the effective speculative accept length."""
    runtime = inputs.runtime

    def itl_ms(fpm: ForwardPassMetrics, *, consolidated: bool) -> float:
        scale = factor if consolidated else 1.0
        if aggregated:
            return 1000.0 * estimate_agg_itl_s(
                model,
                fpm,
                avg_isl=runtime.avg_isl,
                avg_osl=runtime.avg_osl,
                accept_length=accept,
                decode_scale=scale,
                include_queued_prefill=consolidated,  # queued prompts become decode KV once served
                next_context=runtime.next_decode_context,
            )
        return 1000.0 * estimate_decode_itl_s(
            model,
            fpm,
            avg_isl=runtime.avg_isl,
            avg_osl=runtime.avg_osl,
            accept_length=accept,
            decode_scale=scale,
            next_context=runtime.next_decode_context,
        )

    return itl_ms


def _decode_signal(
    inputs: SlaLoadInputs, fleet: Fleet, model: ForwardPassModel, steps: list[StepRecord], *, aggregated: bool
) -> _Signal:
    """ITL signal of a decode pool (or the decode side of an aggregated pool)."""
    runtime, targets, limits = inputs.runtime, inputs.targets, inputs.limits
    n = fleet.num_workers
    factor = _consolidation_factor(n)
    accept, _ = effective_accept_length(runtime.accept_length, limits.speculative_nextn)
    itl_ms = _itl_estimator(inputs, model, factor, accept, aggregated=aggregated)

    def kv_tokens(fpm: ForwardPassMetrics) -> int:
        kv = fpm.scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens
        return kv + fpm.queued.sum_prefill_tokens if aggregated else kv

    estimates: list[float] = []
    can_scale_down, refused = n > 1, False
    itl_budget_ms = targets.itl_ms * targets.down_sensitivity
    next_context = _next_decode_context(runtime.avg_isl, runtime.avg_osl, runtime.next_decode_context)
    for engine in fleet.engines:
        estimate = max(itl_ms(fpm, consolidated=False) for fpm in engine.ranks)
        estimates.append(estimate)
        kv_now = max(kv_tokens(fpm) for fpm in engine.ranks)
        steps.append(
            _estimate_step(
                inputs.component,
                "ITL",
                engine.worker_id,
                estimate,
                f"{kv_now} KV tokens + next {next_context:.0f}, accept length {accept:g}",
            )
        )
        if not can_scale_down:
            continue
        # Hard limit first: past the KV capacity the engine preempts or queues, which no forward-pass model covers.
        post_kv = kv_now * factor
        if limits.max_kv_tokens > 0 and post_kv >= limits.max_kv_tokens:
            steps.append(
                _consolidation_step(
                    inputs.component,
                    engine.worker_id,
                    post_kv,
                    safe=False,
                    detail=f"KV {kv_now} x {factor:.3g} = {post_kv:.0f} >= capacity {limits.max_kv_tokens}",
                )
            )
            can_scale_down, refused = False, True
            continue
        post = max(itl_ms(fpm, consolidated=True) for fpm in engine.ranks)
        safe = post < itl_budget_ms
        steps.append(
            _consolidation_step(
                inputs.component,
                engine.worker_id,
                post,
                safe=safe,
                detail=(
                    f"ITL with the decode load x {factor:.3g} {post:.2f} ms {'<' if safe else '>='} "
                    f"{targets.itl_ms:g} x {targets.down_sensitivity:g} = {itl_budget_ms:.2f} ms "
                    f"(KV {post_kv:.0f} of {limits.max_kv_tokens})"
                ),
            )
        )
        if not safe:
            can_scale_down, refused = False, True
    return _scale_signal(
        inputs.component,
        "ITL",
        estimates,
        targets.itl_ms,
        num_workers=n,
        can_scale_down=can_scale_down,
        refused=refused,
        min_endpoint=inputs.min_endpoint,
        steps=steps,
    )


def _combine_agg(
    component: Component, num_workers: int, prefill: _Signal | None, decode: _Signal, steps: list[StepRecord]
) -> _Signal:
    """Aggregated pool: up if either side wants up; down only if both do (to the larger); decode alone may scale
    down when the prefill signal is missing."""
    n = num_workers
    if prefill is not None and prefill.desired > n:
        combined, why = prefill, "the TTFT signal wants one more"
    elif decode.desired > n:
        combined, why = decode, "the ITL signal wants one more"
    elif prefill is None and decode.desired < n:
        combined, why = decode, "no TTFT signal; the ITL signal alone allows one fewer"
    elif prefill is not None and prefill.desired < n and decode.desired < n:
        combined = _Signal(desired=max(prefill.desired, decode.desired), reason=ReasonCode.SCALE_DOWN, refused=False)
        why = "both signals allow one fewer"
    else:
        refused = decode.refused or (prefill is not None and prefill.refused)
        reason = ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION if refused else ReasonCode.NO_CHANGE
        combined = _Signal(desired=n, reason=reason, refused=refused)
        why = "a consolidation check refused one fewer" if refused else "the signals do not agree on a change"
    shown_prefill = "missing" if prefill is None else str(prefill.desired)
    steps.append(
        StepRecord(
            step=StepName.AGG_SIGNAL,
            component=component,
            value=combined.desired,
            reason=combined.reason,
            detail=f"TTFT signal {shown_prefill}, ITL signal {decode.desired}: {n} -> {combined.desired} ({why})",
        )
    )
    return combined


def unplaced_signal(
    component: Component, num_workers: int, desired: int, unplaced: UnplacedRequests | None
) -> tuple[int, StepRecord | None]:
    """The pool's proposal after the requests the router could not place (see the module docstring), and its step.

    Args:
        component: the pool.
        num_workers: its workers now.
        desired: what the signals before this one propose.
        unplaced: the router's report since the last tick; None: no report (no step, `desired` stands).

    Returns:
        N + 1 (`unplaced_requests`) when a request found no engine within the SLO or waits at the frontend and
        `desired` adds no replica; else `desired` (`no_change` when everything was placed).
    """
    if unplaced is None:
        return desired, None
    counts = (
        f"{unplaced.num_unplaced} requests found no engine predicted within the SLO since the last tick "
        f"({unplaced.num_rejected} rejected), {unplaced.num_waiting} wait at the frontend"
    )
    if unplaced.num_unplaced == 0 and unplaced.num_waiting == 0:
        return desired, StepRecord(
            step=StepName.UNPLACED_SIGNAL,
            component=component,
            value=0,
            reason=ReasonCode.NO_CHANGE,
            detail=f"the router placed every request ({counts})",
        )
    raised = max(desired, num_workers + 1)
    return raised, StepRecord(
        step=StepName.UNPLACED_SIGNAL,
        component=component,
        value=unplaced.num_unplaced + unplaced.num_waiting,
        reason=ReasonCode.UNPLACED_REQUESTS,
        detail=f"{counts}: "
        + (
            f"{num_workers} -> {raised}"
            if desired <= num_workers
            else f"the signal already adds a replica ({num_workers} -> {desired})"
        ),
    )


def tail_latency_signal(
    component: Component,
    num_workers: int,
    desired: int,
    frontend: TrafficObservation | None,
    targets: LoadSlaTargets,
) -> tuple[int, StepRecord]:
    """The prompt pool's proposal after the frontend's measured tail (ours; module docstring), and its step.

    Args:
        component: the pool (prefill, or the aggregated pool).
        num_workers: its workers now.
        desired: what the per-engine signal proposes (N - 1, N or N + 1).
        frontend: the frontend's p95/p99 TTFT and queue time over the load interval; None or without them: no
            change (`tail_latency_ok`, saying nothing was measured).
        targets: the TTFT target and the scale-down sensitivity.

    Returns:
        N + 1 (`tail_latency_high`) when the p99 (else p95) TTFT or the queue time is above the target; N
        (`tail_latency_refused_down`) when the signal wanted N - 1 and the tail is above `down_sensitivity` x the
        target; else `desired` (`tail_latency_ok`).
    """
    tail_ms, label = None, "TTFT tail"
    if frontend is not None and frontend.ttft_ms_p99 is not None:
        tail_ms, label = frontend.ttft_ms_p99, "p99 TTFT"
    elif frontend is not None:
        tail_ms, label = frontend.ttft_ms_p95, "p95 TTFT"
    queue_ms = frontend.queue_ms if frontend is not None else None
    shown = ", ".join(
        f"{name} {value:.0f} ms" for name, value in ((label, tail_ms), ("queue", queue_ms)) if value is not None
    )
    if not shown:
        return desired, StepRecord(
            step=StepName.TTFT_SIGNAL,
            component=component,
            reason=ReasonCode.TAIL_LATENCY_OK,
            detail="the source measures no frontend TTFT tail or queue time",
        )
    target_ms = targets.ttft_ms
    if (tail_ms is not None and tail_ms > target_ms) or (queue_ms is not None and queue_ms > target_ms):
        raised = max(desired, num_workers + 1)
        return raised, StepRecord(
            step=StepName.TTFT_SIGNAL,
            component=component,
            value=raised,
            reason=ReasonCode.TAIL_LATENCY_HIGH,
            detail=f"{shown} above the {target_ms:g} ms TTFT target: {num_workers} -> {raised}",
        )
    down_limit_ms = target_ms * targets.down_sensitivity
    if desired < num_workers and tail_ms is not None and tail_ms > down_limit_ms:
        return num_workers, StepRecord(
            step=StepName.TTFT_SIGNAL,
            component=component,
            value=num_workers,
            reason=ReasonCode.TAIL_LATENCY_REFUSED_DOWN,
            detail=f"{shown}: above {down_limit_ms:g} ms ({targets.down_sensitivity:g} x target), no scale-down",
        )
    return desired, StepRecord(
        step=StepName.TTFT_SIGNAL,
        component=component,
        value=desired,
        reason=ReasonCode.TAIL_LATENCY_OK,
        detail=f"{shown} within the {target_ms:g} ms TTFT target",
    )


def _hold_at(inputs: SlaLoadInputs) -> int:
    """What a held pool "proposes": its expected count, the target already in force, so applying it is a no-op."""
    return inputs.workers.expected(inputs.component)


def _latency_signal(inputs: SlaLoadInputs, fleet: Fleet, model: ForwardPassModel, steps: list[StepRecord]) -> _Signal:
    """The engines' own latency signal for the pool's kind: TTFT (prefill), ITL (decode) or both combined
    (aggregated); a hold (`insufficient_data`) when the model is not ready or a TTFT signal has no batch budget."""
    component = inputs.component
    n = fleet.num_workers
    if not model.is_ready():
        steps.append(
            StepRecord(
                step=StepName.MODEL,
                component=component,
                reason=ReasonCode.INSUFFICIENT_DATA,
                detail="the forward-pass model is not ready",
            )
        )
        return _Signal(desired=n, reason=ReasonCode.INSUFFICIENT_DATA, refused=False)
    if inputs.aggregated:
        prefill: _Signal | None = None
        if inputs.limits.max_num_batched_tokens > 0:
            prefill = _prefill_signal(inputs, fleet, model, steps, aggregated=True)
        else:
            steps.append(
                StepRecord(
                    step=StepName.TTFT_SIGNAL,
                    component=component,
                    reason=ReasonCode.INSUFFICIENT_DATA,
                    detail=f"max_num_batched_tokens = {inputs.limits.max_num_batched_tokens}: no TTFT signal",
                )
            )
        decode = _decode_signal(inputs, fleet, model, steps, aggregated=True)
        return _combine_agg(component, n, prefill, decode, steps)
    if component is Component.PREFILL:
        if inputs.limits.max_num_batched_tokens <= 0:
            steps.append(
                StepRecord(
                    step=StepName.TTFT_SIGNAL,
                    component=component,
                    reason=ReasonCode.INSUFFICIENT_DATA,
                    detail=f"max_num_batched_tokens = {inputs.limits.max_num_batched_tokens}: no TTFT estimate",
                )
            )
            return _Signal(desired=n, reason=ReasonCode.INSUFFICIENT_DATA, refused=False)
        return _prefill_signal(inputs, fleet, model, steps, aggregated=False)
    return _decode_signal(inputs, fleet, model, steps, aggregated=False)


def calculate_load_replicas(inputs: SlaLoadInputs, model: ForwardPassModel) -> tuple[int, tuple[StepRecord, ...]]:
    """One pool's replicas from the latest per-engine forward-pass metrics under the SLA (one load tick).

    Preconditions, in order (each holds the pool and says why): a scale in flight in a managed pool ->
    `scaling_in_progress`; no
    metrics -> `no_fpm_data`; reporting workers != ready workers -> `worker_count_mismatch` (these three return the
    pool's expected count); the model not ready or no batch token budget -> `insufficient_data` (the current count,
    still raised to the throughput floor and the minimum endpoint).

    Args:
        inputs: the pool, its metrics and workers, engine limits, SLA, runtime figures and floors.
        model: the pool's forward-pass model (the aggregated pool's answers `mixed_wall_s`).

    Returns:
        The desired replicas and the explanation steps. The signal moves by exactly one replica or none; only the
        throughput floor or the minimum endpoint may lift it further. The last step, `load_decision`, carries the
        headline reason (`scale_up`, `scale_down`, `scale_down_capped_by_throughput`,
        `scale_down_refused_consolidation`, `insufficient_data`, `no_change`); a hold ends with the `fleet` step.
    """
    component = inputs.component
    fleet, fleet_step = observe_fleet(component, inputs.fpm, inputs.workers, managed=inputs.managed)
    steps: list[StepRecord] = [fleet_step]
    if fleet is None:
        return _hold_at(inputs), tuple(steps)
    n = fleet.num_workers
    signal = _latency_signal(inputs, fleet, model, steps)
    if inputs.tail_latency_scaling and (inputs.aggregated or component is Component.PREFILL):
        desired_by_tail, tail_step = tail_latency_signal(component, n, signal.desired, inputs.frontend, inputs.targets)
        steps.append(tail_step)
        if tail_step.reason is not ReasonCode.TAIL_LATENCY_OK:
            signal = _Signal(desired=desired_by_tail, reason=tail_step.reason, refused=signal.refused)

    if signal.reason is not ReasonCode.INSUFFICIENT_DATA:
        desired_by_router, unplaced_step = unplaced_signal(component, n, signal.desired, inputs.unplaced)
        if unplaced_step is not None:
            steps.append(unplaced_step)
        if desired_by_router != signal.desired:
            signal = _Signal(desired=desired_by_router, reason=ReasonCode.SCALE_UP, refused=False)
    desired, final_steps = finalize_load_proposal(
        component,
        current=n,
        signal=signal.desired,
        signal_reason=signal.reason,
        lower_bound=inputs.throughput_lower_bound,
        min_endpoint=inputs.min_endpoint,
    )
    steps.extend(final_steps)
    return desired, tuple(steps)
