"""Per-engine threshold load policy (Dynamo 1.x; targets `throughput`, `latency`, `load`): every engine rank's
value from its latest forward-pass metrics against the target's up/down thresholds, one replica at a time
(`calculate_threshold_replicas`; the table is in `planner_core.policy.thresholds`). Pure.
"""

from __future__ import annotations

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
    WorkerCounts,
)
from planner_core.policy.fleet import (
    BOTH_POOLS,
    Fleet,
    finalize_load_proposal,
    observe_fleet,
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
