"""The 2025 threshold load planner (`calculate_threshold_2025`; `load_policy: threshold_2025`): Dynamo's deprecated
load planner on forward-pass metrics, sampling every load tick and deciding once per adjustment interval (the rules
are in `planner_core.policy.thresholds`). Pure; its samples and counters are `ThresholdPlannerState`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner_core.config import PlannerConfig, PlannerMode
from planner_core.domain import (
    Component,
    ForwardPassMetrics,
    ReasonCode,
    StepName,
    StepRecord,
    ThresholdPlannerState,
    WorkerCounts,
)
from planner_core.policy.fleet import (
    Fleet,
    combine_headlines,
    finalize_load_proposal,
    observe_fleet,
    scale_in_flight,
)
from planner_core.policy.thresholds.per_engine import (
    DECODE_GRACE_INTERVALS,
    PREFILL_TREND_INTERVALS,
    kv_utilisation,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Threshold2025Settings:
    """The 2025 threshold planner's parameters.

    Attributes:
        adjustment_interval_s: seconds between two decisions; every load tick in between is one sample.
        prefill_queue_up, prefill_queue_down: interval-average queued prefill requests (all prefill engines).
        decode_kv_up, decode_kv_down: interval-average KV utilisation of the decode engines (0..1).
        components: the pools this planner manages (aggregated mode: DECODE only).
        aggregated: whether the DECODE pool is an aggregated pool (queued prompt tokens count as KV).
        decode_max_kv_tokens: KV capacity of one decode engine.
        prefill_min_endpoint, decode_min_endpoint: minimum replicas.
        prefill_gpus_per_engine, decode_gpus_per_engine, max_gpu_budget: a scale-up must fit the budget (-1 = none).
        grace_intervals: adjustments without decode scale-down after adding a decode worker.
        trend_intervals: adjustment intervals the prefill queue trend is extrapolated over.
    """

    adjustment_interval_s: float
    prefill_queue_up: float = 5.0
    prefill_queue_down: float = 0.2
    decode_kv_up: float = 0.9
    decode_kv_down: float = 0.5
    components: tuple[Component, ...] = (Component.PREFILL, Component.DECODE)
    aggregated: bool = False
    decode_max_kv_tokens: int = 2_000_000
    prefill_min_endpoint: int = 1
    decode_min_endpoint: int = 1
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1
    max_gpu_budget: int = -1
    grace_intervals: int = DECODE_GRACE_INTERVALS
    trend_intervals: int = PREFILL_TREND_INTERVALS

    @classmethod
    def from_config(cls, config: PlannerConfig, components: tuple[Component, ...]) -> Threshold2025Settings:
        """Settings from the config, for the pools the caller manages (`config.managed_components(config.mode)`)."""
        return cls(
            adjustment_interval_s=float(config.threshold_2025_adjustment_interval_seconds),
            prefill_queue_up=config.prefill_queue_scale_up_threshold,
            prefill_queue_down=config.prefill_queue_scale_down_threshold,
            decode_kv_up=config.decode_kv_scale_up_threshold,
            decode_kv_down=config.decode_kv_scale_down_threshold,
            components=components,
            aggregated=config.mode is PlannerMode.AGG,
            decode_max_kv_tokens=config.engine_limits(Component.DECODE).max_kv_tokens,
            prefill_min_endpoint=config.prefill_min_endpoint_effective,
            decode_min_endpoint=config.decode_min_endpoint_effective,
            prefill_gpus_per_engine=config.prefill_gpus_per_engine,
            decode_gpus_per_engine=config.decode_gpus_per_engine,
            max_gpu_budget=config.max_gpu_budget,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Threshold2025Outcome:
    """One tick of the 2025 threshold planner.

    Attributes:
        num_prefill, num_decode: desired replicas of each managed pool on an adjustment tick; None = no opinion
            (a sampling tick, a hold, or a pool not managed).
        next_state: the planner's state to carry forward.
        steps: the explanation.
        reason: the headline reason.
    """

    num_prefill: int | None
    num_decode: int | None
    next_state: ThresholdPlannerState
    steps: tuple[StepRecord, ...]
    reason: ReasonCode


def _mean(values: tuple[float, ...]) -> float | None:
    return sum(values) / len(values) if values else None


def _sample(
    component: Component,
    fleet: Fleet,
    settings: Threshold2025Settings,
) -> tuple[float, StepRecord]:
    """One tick's sample of a pool: total queued prefill requests, or the mean KV utilisation of the engines."""
    ranks = fleet.all_ranks
    if component is Component.PREFILL:
        value = float(sum(fpm.queued.num_prefill_requests for fpm in ranks))
        detail = f"{value:g} queued prefill requests over {len(ranks)} engine ranks"
    else:
        max_kv = settings.decode_max_kv_tokens
        utilisations = [kv_utilisation(fpm, max_kv, aggregated=settings.aggregated) for fpm in ranks]
        value = sum(utilisations) / len(utilisations)
        detail = f"KV utilisation {value:.4f} (mean of {len(ranks)} engine ranks, capacity {max_kv})"
    return value, StepRecord(
        step=StepName.SAMPLE, component=component, value=value, reason=ReasonCode.OBSERVED, detail=detail
    )


def _paused(state: ThresholdPlannerState, in_flight: str, steps: list[StepRecord]) -> Threshold2025Outcome:
    """No sample and no decision while a pool scales (`scaling_in_progress`); the next interval starts afresh."""
    # The 2025 planner blocked sampling while workers were being added or removed and started a fresh interval
    # afterwards: samples of a fleet in transition describe neither size. The grace counter carries over.
    next_state = dataclasses.replace(
        ThresholdPlannerState(), decode_grace_intervals_left=state.decode_grace_intervals_left
    )
    steps.append(
        StepRecord(step=StepName.FLEET, reason=ReasonCode.SCALING_IN_PROGRESS, detail=f"{in_flight}; sampling paused")
    )
    return Threshold2025Outcome(
        num_prefill=None,
        num_decode=None,
        next_state=next_state,
        steps=tuple(steps),
        reason=ReasonCode.SCALING_IN_PROGRESS,
    )


def _sample_interval(
    now_s: float,
    fpm: tuple[ForwardPassMetrics, ...],
    workers: WorkerCounts,
    state: ThresholdPlannerState,
    settings: Threshold2025Settings,
    steps: list[StepRecord],
) -> ThresholdPlannerState:
    """The state with this tick's sample of every reporting managed pool added, opening an interval first when
    none is open (it remembers the ready workers it started with)."""
    if state.interval_start_s is None:
        state = dataclasses.replace(
            ThresholdPlannerState(),
            interval_start_s=now_s,
            interval_num_prefill=workers.ready_prefill,
            interval_num_decode=workers.ready_decode,
            decode_grace_intervals_left=state.decode_grace_intervals_left,
        )
    for component in settings.components:
        fleet, fleet_step = observe_fleet(component, fpm, workers, managed=settings.components)
        if fleet is None:
            steps.append(fleet_step)  # no sample from this pool this tick
            continue
        value, sample_step = _sample(component, fleet, settings)
        steps.append(sample_step)
        if component is Component.PREFILL:
            state = dataclasses.replace(state, prefill_queue_samples=(*state.prefill_queue_samples, value))
        else:
            state = dataclasses.replace(state, decode_kv_samples=(*state.decode_kv_samples, value))
    return state


def calculate_threshold_2025(
    *,
    now_s: float,
    fpm: tuple[ForwardPassMetrics, ...],
    workers: WorkerCounts,
    state: ThresholdPlannerState,
    settings: Threshold2025Settings,
    lower_bound_prefill: int | None = None,
    lower_bound_decode: int | None = None,
) -> Threshold2025Outcome:
    """One load tick of the 2025 threshold planner: sample, and decide when the adjustment interval is over.

    Args:
        now_s: the tick's scheduled time (s).
        fpm: the latest forward-pass metrics per (worker, DP rank) of every pool.
        workers: ready and expected workers.
        state: the planner's state after the previous load tick.
        settings: thresholds, interval, managed pools, minimums and GPU budget.
        lower_bound_prefill, lower_bound_decode: the throughput loop's floors; None when that loop is off.

    Returns:
        Desired replicas (on adjustment ticks), the next state, the steps and the headline reason
        (`scaling_in_progress`, `interval_collecting`, `workers_changed_in_interval`, or the decision's).
    """
    steps: list[StepRecord] = []
    in_flight = scale_in_flight(workers, settings.components)
    if in_flight is not None:
        return _paused(state, in_flight, steps)
    state = _sample_interval(now_s, fpm, workers, state, settings, steps)

    start_s = now_s if state.interval_start_s is None else state.interval_start_s
    elapsed_s = now_s - start_s
    if elapsed_s < settings.adjustment_interval_s:
        steps.append(
            StepRecord(
                step=StepName.INTERVAL,
                value=elapsed_s,
                reason=ReasonCode.INTERVAL_COLLECTING,
                detail=f"{elapsed_s:g} of {settings.adjustment_interval_s:g} s sampled",
            )
        )
        return Threshold2025Outcome(
            num_prefill=None,
            num_decode=None,
            next_state=state,
            steps=tuple(steps),
            reason=ReasonCode.INTERVAL_COLLECTING,
        )

    # The interval is over: a new one opens at this tick whatever happens next.
    fresh = ThresholdPlannerState(
        interval_start_s=now_s,
        interval_num_prefill=workers.ready_prefill,
        interval_num_decode=workers.ready_decode,
        decode_grace_intervals_left=state.decode_grace_intervals_left,
    )
    at_start = {Component.PREFILL: state.interval_num_prefill, Component.DECODE: state.interval_num_decode}
    if any(workers.ready(c) != at_start[c] for c in settings.components):  # another planner's pool may move
        steps.append(
            StepRecord(
                step=StepName.INTERVAL,
                reason=ReasonCode.WORKERS_CHANGED_IN_INTERVAL,
                detail=(
                    f"ready workers changed during the interval: prefill {state.interval_num_prefill} -> "
                    f"{workers.ready_prefill}, decode {state.interval_num_decode} -> {workers.ready_decode}"
                ),
            )
        )
        return Threshold2025Outcome(
            num_prefill=None,
            num_decode=None,
            next_state=fresh,
            steps=tuple(steps),
            reason=ReasonCode.WORKERS_CHANGED_IN_INTERVAL,
        )
    return _adjust(workers, state, fresh, settings, lower_bound_prefill, lower_bound_decode, steps)


_Signals = dict[Component, tuple[int, ReasonCode]]  # per managed pool: (proposed replicas, why)


def _interval_averages(
    workers: WorkerCounts,
    state: ThresholdPlannerState,
    managed: tuple[Component, ...],
    avg_queue: float | None,
    avg_kv: float | None,
    steps: list[StepRecord],
) -> _Signals:
    """Every managed pool's starting signal (hold: `no_change`, or `no_fpm_data` without samples) and the step
    reporting its interval average."""
    signals: _Signals = {}
    for component, avg in ((Component.PREFILL, avg_queue), (Component.DECODE, avg_kv)):
        if component not in managed:
            continue
        n = workers.ready(component)
        if avg is None:
            signals[component] = (n, ReasonCode.NO_FPM_DATA)
            steps.append(
                StepRecord(
                    step=StepName.INTERVAL_AVERAGE,
                    component=component,
                    reason=ReasonCode.NO_FPM_DATA,
                    detail="no samples",
                )
            )
            continue
        samples = state.prefill_queue_samples if component is Component.PREFILL else state.decode_kv_samples
        signals[component] = (n, ReasonCode.NO_CHANGE)
        steps.append(
            StepRecord(
                step=StepName.INTERVAL_AVERAGE,
                component=component,
                value=avg,
                reason=ReasonCode.OBSERVED,
                detail=f"mean of {len(samples)} samples",
            )
        )
    return signals


def _budget_allows(settings: Threshold2025Settings, gpu_usage: int, gpus: int) -> bool:
    """Whether `gpus` more GPUs fit the budget on top of `gpu_usage` (a negative budget: no limit)."""
    return settings.max_gpu_budget < 0 or gpu_usage + gpus <= settings.max_gpu_budget


def _scale_downs(
    signals: _Signals,
    workers: WorkerCounts,
    state: ThresholdPlannerState,
    settings: Threshold2025Settings,
    avg_queue: float | None,
    avg_kv: float | None,
    steps: list[StepRecord],
) -> int:
    """One engine fewer for a pool whose average is below its down threshold (decode not within its grace
    period); updates `signals` and returns the GPUs freed."""
    num_prefill, num_decode = workers.ready_prefill, workers.ready_decode
    freed = 0
    if Component.PREFILL in signals and avg_queue is not None:
        if avg_queue < settings.prefill_queue_down and num_prefill > settings.prefill_min_endpoint:
            signals[Component.PREFILL] = (num_prefill - 1, ReasonCode.SCALE_DOWN)
            freed += settings.prefill_gpus_per_engine
            steps.append(
                StepRecord(
                    step=StepName.THRESHOLD_SIGNAL,
                    component=Component.PREFILL,
                    value=num_prefill - 1,
                    reason=ReasonCode.SCALE_DOWN,
                    detail=f"average queue {avg_queue:.4g} < {settings.prefill_queue_down:g}",
                )
            )
    grace_left = state.decode_grace_intervals_left
    if Component.DECODE in signals and avg_kv is not None:
        if avg_kv < settings.decode_kv_down and num_decode > settings.decode_min_endpoint:
            if grace_left > 0:
                signals[Component.DECODE] = (num_decode, ReasonCode.DECODE_GRACE_PERIOD)
                steps.append(
                    StepRecord(
                        step=StepName.DECODE_GRACE,
                        component=Component.DECODE,
                        value=grace_left,
                        reason=ReasonCode.DECODE_GRACE_PERIOD,
                        detail=(
                            f"average KV {avg_kv:.4f} < {settings.decode_kv_down:g}, but a decode worker was added "
                            f"recently: {grace_left} more adjustment(s) without decode scale-down"
                        ),
                    )
                )
            else:
                signals[Component.DECODE] = (num_decode - 1, ReasonCode.SCALE_DOWN)
                freed += settings.decode_gpus_per_engine
                steps.append(
                    StepRecord(
                        step=StepName.THRESHOLD_SIGNAL,
                        component=Component.DECODE,
                        value=num_decode - 1,
                        reason=ReasonCode.SCALE_DOWN,
                        detail=f"average KV {avg_kv:.4f} < {settings.decode_kv_down:g}",
                    )
                )
    return freed


def _scale_up_prefill(
    signals: _Signals,
    num_prefill: int,
    state: ThresholdPlannerState,
    settings: Threshold2025Settings,
    avg_queue: float | None,
    gpu_usage: int,
    steps: list[StepRecord],
) -> int:
    """One prefill engine more when the average queue is above its up threshold and its trend predicts it stays
    there, within the GPU budget; updates `signals` and returns the GPU usage after it."""
    if Component.PREFILL not in signals or avg_queue is None or not avg_queue > settings.prefill_queue_up:
        return gpu_usage
    gpus_p = settings.prefill_gpus_per_engine
    first, last = state.prefill_queue_samples[0], state.prefill_queue_samples[-1]
    predicted = last + (last - first) * settings.trend_intervals
    if not _budget_allows(settings, gpu_usage, gpus_p):
        signals[Component.PREFILL] = (num_prefill, ReasonCode.GPU_BUDGET_GUARD_HOLD)
        detail = f"{gpu_usage} + {gpus_p} GPUs would exceed the budget {settings.max_gpu_budget}"
    elif predicted > settings.prefill_queue_up:
        signals[Component.PREFILL] = (num_prefill + 1, ReasonCode.SCALE_UP)
        gpu_usage += gpus_p
        detail = f"trend {first:g} -> {last:g} predicts {predicted:.4g} > {settings.prefill_queue_up:g}"
    else:
        signals[Component.PREFILL] = (num_prefill, ReasonCode.PREFILL_QUEUE_TREND)
        detail = (
            f"trend {first:g} -> {last:g} predicts {predicted:.4g} <= {settings.prefill_queue_up:g} within "
            f"{settings.trend_intervals} intervals: no scale-up"
        )
    value, reason = signals[Component.PREFILL]
    steps.append(
        StepRecord(
            step=StepName.THRESHOLD_SIGNAL,
            component=Component.PREFILL,
            value=value,
            reason=reason,
            detail=f"average queue {avg_queue:.4g} > {settings.prefill_queue_up:g}; {detail}",
        )
    )
    return gpu_usage


def _scale_up_decode(
    signals: _Signals,
    num_decode: int,
    settings: Threshold2025Settings,
    avg_kv: float | None,
    gpu_usage: int,
    steps: list[StepRecord],
) -> bool:
    """One decode engine more when the average KV is above its up threshold, within the GPU budget; updates
    `signals` and says whether a decode engine was added."""
    if Component.DECODE not in signals or avg_kv is None or not avg_kv > settings.decode_kv_up:
        return False
    gpus_d = settings.decode_gpus_per_engine
    added = _budget_allows(settings, gpu_usage, gpus_d)
    if added:
        signals[Component.DECODE] = (num_decode + 1, ReasonCode.SCALE_UP)
        detail = "one more decode worker"
    else:
        signals[Component.DECODE] = (num_decode, ReasonCode.GPU_BUDGET_GUARD_HOLD)
        detail = f"{gpu_usage} + {gpus_d} GPUs would exceed the budget {settings.max_gpu_budget}"
    value, reason = signals[Component.DECODE]
    steps.append(
        StepRecord(
            step=StepName.THRESHOLD_SIGNAL,
            component=Component.DECODE,
            value=value,
            reason=reason,
            detail=f"average KV {avg_kv:.4f} > {settings.decode_kv_up:g}; {detail}",
        )
    )
    return added


def _finalize_2025(
    signals: _Signals,
    workers: WorkerCounts,
    next_state: ThresholdPlannerState,
    settings: Threshold2025Settings,
    lower_bound_prefill: int | None,
    lower_bound_decode: int | None,
    steps: list[StepRecord],
) -> Threshold2025Outcome:
    """Every pool's signal raised to the throughput floor and its minimum endpoint, and the headline reason."""
    desired: dict[Component, int] = {}
    headlines: list[ReasonCode] = []
    floors = {
        Component.PREFILL: (lower_bound_prefill, settings.prefill_min_endpoint),
        Component.DECODE: (lower_bound_decode, settings.decode_min_endpoint),
    }
    for component, (signal, reason) in signals.items():
        lower_bound, min_endpoint = floors[component]
        value, final_steps = finalize_load_proposal(
            component,
            current=workers.ready(component),
            signal=signal,
            signal_reason=reason,
            lower_bound=lower_bound,
            min_endpoint=min_endpoint,
        )
        steps.extend(final_steps)
        desired[component] = value
        headlines.append(final_steps[-1].reason)
    return Threshold2025Outcome(
        num_prefill=desired.get(Component.PREFILL),
        num_decode=desired.get(Component.DECODE),
        next_state=next_state,
        steps=tuple(steps),
        reason=combine_headlines(tuple(headlines)),
    )


def _adjust(
    workers: WorkerCounts,
    state: ThresholdPlannerState,
    fresh: ThresholdPlannerState,
    settings: Threshold2025Settings,
    lower_bound_prefill: int | None,
    lower_bound_decode: int | None,
    steps: list[StepRecord],
) -> Threshold2025Outcome:
    """The 2025 planner's adjustment on the interval averages: scale-downs, then scale-ups, one step each."""
    managed = settings.components
    num_prefill, num_decode = workers.ready_prefill, workers.ready_decode
    gpus_p, gpus_d = settings.prefill_gpus_per_engine, settings.decode_gpus_per_engine
    gpu_usage = (num_prefill * gpus_p if Component.PREFILL in managed else 0) + (
        num_decode * gpus_d if Component.DECODE in managed else 0
    )
    avg_queue = _mean(state.prefill_queue_samples)
    avg_kv = _mean(state.decode_kv_samples)
    signals = _interval_averages(workers, state, managed, avg_queue, avg_kv, steps)
    # Scale-downs first: the GPUs they free count for the scale-ups below (the 2025 planner's order).
    gpu_usage -= _scale_downs(signals, workers, state, settings, avg_queue, avg_kv, steps)
    # Prefill first among scale-ups: a long prefill queue also inflates the decode KV (queued transfers).
    gpu_usage = _scale_up_prefill(signals, num_prefill, state, settings, avg_queue, gpu_usage, steps)
    added_decode = _scale_up_decode(signals, num_decode, settings, avg_kv, gpu_usage, steps)

    # A completed adjustment uses up one interval of the grace period; adding a decode worker starts a new one.
    next_grace = settings.grace_intervals if added_decode else max(0, state.decode_grace_intervals_left - 1)
    next_state = dataclasses.replace(fresh, decode_grace_intervals_left=next_grace)
    return _finalize_2025(signals, workers, next_state, settings, lower_bound_prefill, lower_bound_decode, steps)
