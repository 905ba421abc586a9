"""Load policies without an SLA model: per-engine thresholds (Dynamo 1.x) and the 2025 threshold load planner.

**Per-engine thresholds** (`calculate_threshold_replicas`; targets `throughput`, `latency`, `load`). Every load tick,
each engine rank of the pool gives one value from its latest forward-pass metrics:

| pool | target | value per engine | up when any | down when all |
|---|---|---|---|---|
| prefill | throughput | queued prompt tokens / context_length | >= 1.0 | < 0.1 |
| prefill | latency | queued prompt tokens / context_length | >= 0.1 | = 0 |
| prefill | load | queued prompt tokens | >= prefill_scale_up_queue_tokens | <= ..._down_... |
| decode | throughput | (scheduled + queued KV) / max_kv_tokens | > 1.0 | < 0.6 |
| decode | latency | (scheduled + queued KV) / max_kv_tokens | > 0.4 | < 0.1 |
| decode | load | (scheduled + queued KV) / max_kv_tokens | >= decode_scale_up_kv_rate / 100 | <= ..._down_... |

The aggregated pool uses the decode rows with queued prompt tokens added to the KV. One replica up if *any* engine is
over its up threshold; one down if *all* are under the down threshold, unless the survivors would cross the up
threshold at once: `N -> N-1` is refused when `max(value) * N/(N-1) >= up` (anti-oscillation).

**The 2025 threshold planner** (`calculate_threshold_2025`; `load_policy: threshold_2025`), Dynamo's deprecated load
planner on forward-pass metrics. Every load tick is one sample of the prefill queue (queued prefill requests summed
over the prefill engines) and of the decode KV utilisation (mean over the decode engines, queued KV included).
Once per `threshold_2025_adjustment_interval_seconds` the interval averages are compared with the thresholds
(strictly: down below the down threshold, up above the up threshold) and each pool moves by at most one:

- scale-downs first (never below the minimum endpoint), then scale-ups, each within `max_gpu_budget`;
- no decode scale-down for `DECODE_GRACE_INTERVALS` (3) adjustments after a decode worker was added (its KV cache
  fills slowly, so the pool looks idle);
- no prefill scale-up when the interval's trend, `last + (last - first) * PREFILL_TREND_INTERVALS`, predicts the
  queue at or below the up threshold by the time a new worker would be ready;
- sampling stops while a scale is in flight and a new interval opens once it is over; an adjustment is skipped if the
  ready counts changed during the interval.

Both end with the throughput floor and the minimum endpoint (`fleet.finalize_load_proposal`). Pure: no clock (time
is the tick's `now_s`), no I/O; the 2025 planner's samples and counters are `ThresholdPlannerState`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from planner_core.config import OptimizationTarget, PlannerConfig, PlannerMode
from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    ReasonCode,
    StepName,
    StepRecord,
    ThresholdPlannerState,
    WorkerCounts,
)
from planner_core.policy.fleet import (
    BOTH_POOLS,
    Fleet,
    combine_headlines,
    finalize_load_proposal,
    observe_fleet,
    scale_in_flight,
)

# Dynamo's static thresholds of the `throughput` and `latency` targets.
PREFILL_THROUGHPUT_UP, PREFILL_THROUGHPUT_DOWN = 1.0, 0.1  # queued prompt tokens / context_length
PREFILL_LATENCY_UP, PREFILL_LATENCY_DOWN = 0.1, 0.0
DECODE_THROUGHPUT_UP, DECODE_THROUGHPUT_DOWN = 1.0, 0.6  # KV utilisation
DECODE_LATENCY_UP, DECODE_LATENCY_DOWN = 0.4, 0.1

# The 2025 planner's fixed periods, in adjustment intervals.
DECODE_GRACE_INTERVALS = 3  # no decode scale-down after adding a decode worker (its KV cache is still filling)
PREFILL_TREND_INTERVALS = 3  # how far ahead the prefill queue trend is extrapolated (a new worker's start-up time)


class ThresholdMeasure(enum.StrEnum):
    """What one engine's threshold value measures."""

    QUEUE_RATIO = "queue_ratio"  # queued prompt tokens / context_length
    QUEUED_TOKENS = "queued_tokens"  # queued prompt tokens
    KV_UTILISATION = "kv_utilisation"  # (scheduled + queued decode KV) / max_kv_tokens
    AGG_KV_UTILISATION = "agg_kv_utilisation"  # as KV_UTILISATION, queued prompt tokens counted as future KV


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdRule:
    """When one pool scales under a threshold target.

    Attributes:
        measure: the per-engine value compared.
        up, down: thresholds (up > down).
        up_inclusive: up when a value is >= `up` (else only when > `up`).
        down_inclusive: down when every value is <= `down` (else only when < `down`).
    """

    measure: ThresholdMeasure
    up: float
    down: float
    up_inclusive: bool
    down_inclusive: bool

    def is_over(self, value: float) -> bool:
        return value >= self.up if self.up_inclusive else value > self.up

    def is_under(self, value: float) -> bool:
        return value <= self.down if self.down_inclusive else value < self.down

    def describe(self) -> str:
        return (
            f"{self.measure.value} up {'>=' if self.up_inclusive else '>'} {self.up:g}, "
            f"down {'<=' if self.down_inclusive else '<'} {self.down:g}"
        )


def threshold_rule(config: PlannerConfig, component: Component) -> ThresholdRule | None:
    """The rule of a threshold target for one pool; None for target `sla` or missing `load` thresholds.

    Args:
        config: the planner config (its target, mode and `load` thresholds).
        component: the pool (DECODE for aggregated mode's single pool).
    """
    target = config.optimization_target
    if target is OptimizationTarget.SLA:
        return None
    if component is Component.PREFILL and config.mode is not PlannerMode.AGG:
        if target is OptimizationTarget.LOAD:
            up_tokens, down_tokens = config.prefill_scale_up_queue_tokens, config.prefill_scale_down_queue_tokens
            if up_tokens is None or down_tokens is None:
                return None
            return ThresholdRule(
                measure=ThresholdMeasure.QUEUED_TOKENS,
                up=float(up_tokens),
                down=float(down_tokens),
                up_inclusive=True,
                down_inclusive=True,
            )
        latency = target is OptimizationTarget.LATENCY
        return ThresholdRule(
            measure=ThresholdMeasure.QUEUE_RATIO,
            up=PREFILL_LATENCY_UP if latency else PREFILL_THROUGHPUT_UP,
            down=PREFILL_LATENCY_DOWN if latency else PREFILL_THROUGHPUT_DOWN,
            up_inclusive=True,
            # `latency` scales down only on empty queues (ratio <= 0); `throughput` below a tenth of a context
            down_inclusive=latency,
        )
    measure = ThresholdMeasure.AGG_KV_UTILISATION if config.mode is PlannerMode.AGG else ThresholdMeasure.KV_UTILISATION
    if target is OptimizationTarget.LOAD:
        up_pct, down_pct = config.decode_scale_up_kv_rate, config.decode_scale_down_kv_rate
        if up_pct is None or down_pct is None:
            return None
        return ThresholdRule(
            measure=measure, up=up_pct / 100.0, down=down_pct / 100.0, up_inclusive=True, down_inclusive=True
        )
    latency = target is OptimizationTarget.LATENCY
    return ThresholdRule(
        measure=measure,
        up=DECODE_LATENCY_UP if latency else DECODE_THROUGHPUT_UP,
        down=DECODE_LATENCY_DOWN if latency else DECODE_THROUGHPUT_DOWN,
        up_inclusive=False,
        down_inclusive=False,
    )


def kv_utilisation(fpm: ForwardPassMetrics, max_kv_tokens: int, *, aggregated: bool) -> float:
    """`(scheduled + queued decode KV [+ queued prompt tokens when aggregated]) / max_kv_tokens`."""
    kv = fpm.scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens
    if aggregated:
        kv += fpm.queued.sum_prefill_tokens  # queued prompts become KV as soon as they are served
    return kv / max_kv_tokens


def _missing_limit(rule: ThresholdRule, limits: EngineLimits) -> str | None:
    """Which engine limit the rule's measure needs and lacks, if any."""
    if rule.measure is ThresholdMeasure.QUEUE_RATIO and not (limits.context_length and limits.context_length > 0):
        return f"context_length = {limits.context_length}"
    needs_kv = rule.measure in (ThresholdMeasure.KV_UTILISATION, ThresholdMeasure.AGG_KV_UTILISATION)
    if needs_kv and limits.max_kv_tokens <= 0:
        return f"max_kv_tokens = {limits.max_kv_tokens}"
    return None


def _engine_value(rule: ThresholdRule, fpm: ForwardPassMetrics, limits: EngineLimits) -> float:
    queued = fpm.queued.sum_prefill_tokens
    if rule.measure is ThresholdMeasure.QUEUED_TOKENS:
        return float(queued)
    if rule.measure is ThresholdMeasure.QUEUE_RATIO:
        return queued / (limits.context_length or 1)
    return kv_utilisation(fpm, limits.max_kv_tokens, aggregated=rule.measure is ThresholdMeasure.AGG_KV_UTILISATION)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdInputs:
    """Everything one pool's per-engine threshold proposal depends on.

    Attributes:
        component: the pool (DECODE for aggregated mode's single pool).
        fpm: the latest forward-pass metrics per (worker, DP rank); other pools' reports are ignored.
        workers: ready and expected workers of every pool.
        limits: the pool's engine limits (context length, KV capacity).
        rule: the target's thresholds for the pool (`threshold_rule`); None = thresholds missing.
        throughput_lower_bound: the throughput loop's floor for the pool; None when that loop is off.
        min_endpoint: the pool's minimum replicas.
        managed: the pools the planner scales; a scale in flight in any of them holds this one.
    """

    component: Component
    fpm: tuple[ForwardPassMetrics, ...]
    workers: WorkerCounts
    limits: EngineLimits
    rule: ThresholdRule | None
    throughput_lower_bound: int | None = None
    min_endpoint: int = 1
    managed: tuple[Component, ...] = BOTH_POOLS


def _threshold_signal(
    inputs: ThresholdInputs, rule: ThresholdRule, fleet: Fleet, steps: list[StepRecord]
) -> tuple[int, ReasonCode]:
    """Up if any engine is over `up`; down if all are under `down` and the survivors stay under `up`."""
    component, n = inputs.component, fleet.num_workers
    values: list[float] = []
    for engine in fleet.engines:
        for fpm in engine.ranks:
            value = _engine_value(rule, fpm, inputs.limits)
            values.append(value)
            steps.append(
                StepRecord(
                    step=StepName.ENGINE_LOAD,
                    component=component,
                    value=value,
                    reason=ReasonCode.LOAD_MEASURED,
                    detail=f"{engine.worker_id}/dp{fpm.dp_rank}: {rule.measure.value} {value:.4g}",
                )
            )
    highest = max(values)
    if any(rule.is_over(value) for value in values):
        desired, reason = n + 1, ReasonCode.SCALE_UP
        detail = f"an engine is over the up threshold (highest {highest:.4g}; {rule.describe()})"
    elif n > 1 and all(rule.is_under(value) for value in values):
        consolidated = highest * n / (n - 1)
        if consolidated >= rule.up:
            # Removing one engine would push the busiest survivor straight over the up threshold: the next tick
            # would add it back.
            desired, reason = n, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION
            detail = (
                f"all under the down threshold, but {highest:.4g} x {n}/{n - 1} = {consolidated:.4g} >= {rule.up:g}"
            )
        elif max(n - 1, inputs.min_endpoint) < n:
            desired, reason = n - 1, ReasonCode.SCALE_DOWN
            detail = f"all under the down threshold; {highest:.4g} x {n}/{n - 1} = {consolidated:.4g} < {rule.up:g}"
        else:
            desired, reason = n, ReasonCode.NO_CHANGE
            detail = f"all under the down threshold, at the minimum endpoint {inputs.min_endpoint}"
    else:
        desired, reason = n, ReasonCode.NO_CHANGE
        detail = f"highest {highest:.4g} within the band ({rule.describe()})"
    steps.append(
        StepRecord(
            step=StepName.THRESHOLD_SIGNAL,
            component=component,
            value=desired,
            reason=reason,
            detail=f"{n} -> {desired}: {detail}",
        )
    )
    return desired, reason


def calculate_threshold_replicas(inputs: ThresholdInputs) -> tuple[int, tuple[StepRecord, ...]]:
    """One pool's replicas under a threshold target (`throughput`, `latency`, `load`), one load tick.

    Preconditions as `load.calculate_load_replicas` (a hold returns the pool's expected count and ends with the
    `fleet` step); a missing rule or engine limit gives `insufficient_data` (the current count, still raised to the
    floors).

    Returns:
        The desired replicas (the signal moves by one or none; the throughput floor and the minimum endpoint may
        lift it) and the steps; the last, `load_decision`, carries the headline reason.
    """
    component = inputs.component
    fleet, fleet_step = observe_fleet(component, inputs.fpm, inputs.workers, managed=inputs.managed)
    steps: list[StepRecord] = [fleet_step]
    if fleet is None:
        return inputs.workers.expected(component), tuple(steps)
    rule = inputs.rule
    missing = "no thresholds for this target" if rule is None else _missing_limit(rule, inputs.limits)
    if rule is None or missing is not None:
        steps.append(
            StepRecord(
                step=StepName.THRESHOLD_SIGNAL,
                component=component,
                reason=ReasonCode.INSUFFICIENT_DATA,
                detail=missing or "",
            )
        )
        signal, reason = fleet.num_workers, ReasonCode.INSUFFICIENT_DATA
    else:
        signal, reason = _threshold_signal(inputs, rule, fleet, steps)
    desired, final_steps = finalize_load_proposal(
        component,
        current=fleet.num_workers,
        signal=signal,
        signal_reason=reason,
        lower_bound=inputs.throughput_lower_bound,
        min_endpoint=inputs.min_endpoint,
    )
    steps.extend(final_steps)
    return desired, tuple(steps)


# --- the 2025 threshold planner ----------------------------------------------------------------------------------


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
        # The 2025 planner blocked sampling while workers were being added or removed and started a fresh interval
        # afterwards: samples of a fleet in transition describe neither size. The grace counter carries over.
        next_state = dataclasses.replace(
            ThresholdPlannerState(), decode_grace_intervals_left=state.decode_grace_intervals_left
        )
        steps.append(
            StepRecord(
                step=StepName.FLEET, reason=ReasonCode.SCALING_IN_PROGRESS, detail=f"{in_flight}; sampling paused"
            )
        )
        return Threshold2025Outcome(
            num_prefill=None,
            num_decode=None,
            next_state=next_state,
            steps=tuple(steps),
            reason=ReasonCode.SCALING_IN_PROGRESS,
        )

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
    signals: dict[Component, tuple[int, ReasonCode]] = {}
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

    def budget_allows(gpus: int) -> bool:
        return settings.max_gpu_budget < 0 or gpu_usage + gpus <= settings.max_gpu_budget

    # Scale-downs first: the GPUs they free count for the scale-ups below (the 2025 planner's order).
    if Component.PREFILL in signals and avg_queue is not None:
        if avg_queue < settings.prefill_queue_down and num_prefill > settings.prefill_min_endpoint:
            signals[Component.PREFILL] = (num_prefill - 1, ReasonCode.SCALE_DOWN)
            gpu_usage -= gpus_p
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
                gpu_usage -= gpus_d
                steps.append(
                    StepRecord(
                        step=StepName.THRESHOLD_SIGNAL,
                        component=Component.DECODE,
                        value=num_decode - 1,
                        reason=ReasonCode.SCALE_DOWN,
                        detail=f"average KV {avg_kv:.4f} < {settings.decode_kv_down:g}",
                    )
                )

    # Prefill first among scale-ups: a long prefill queue also inflates the decode KV (queued transfers).
    if Component.PREFILL in signals and avg_queue is not None and avg_queue > settings.prefill_queue_up:
        first, last = state.prefill_queue_samples[0], state.prefill_queue_samples[-1]
        predicted = last + (last - first) * settings.trend_intervals
        if not budget_allows(gpus_p):
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
    added_decode = False
    if Component.DECODE in signals and avg_kv is not None and avg_kv > settings.decode_kv_up:
        if budget_allows(gpus_d):
            signals[Component.DECODE] = (num_decode + 1, ReasonCode.SCALE_UP)
            gpu_usage += gpus_d
            added_decode = True
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

    # A completed adjustment uses up one interval of the grace period; adding a decode worker starts a new one.
    next_grace = settings.grace_intervals if added_decode else max(0, grace_left - 1)
    next_state = dataclasses.replace(fresh, decode_grace_intervals_left=next_grace)

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
