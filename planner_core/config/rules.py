"""The policy's cross-field rules: the checks of `PlannerConfig` that involve more than one field.

Each rule group is a function of a validated `PlannerConfig` returning its violations; `CROSS_FIELD_RULES` lists the
groups in the order their violations are reported (the first one is the error, the others are counted).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner_core.config.enums import (
    EnvironmentKind,
    LoadPolicy,
    OptimizationTarget,
    PlannerMode,
    ThroughputAlgorithm,
    managed_components,
)
from planner_core.config.errors import Violation, _rule, _show
from planner_core.domain import Component

if TYPE_CHECKING:
    from collections.abc import Callable

    from planner_core.config.policy import PlannerConfig


def mode_floor_rules(config: PlannerConfig) -> list[Violation]:
    """Role-specific endpoint floors only make sense for a role this planner manages."""
    found: list[Violation] = []
    mode = config.mode
    if mode is PlannerMode.AGG:
        for name in ("prefill_min_endpoint", "decode_min_endpoint"):
            if getattr(config, name) is not None:
                found.append(_rule(name, getattr(config, name), "not allowed when mode='agg'; use min_endpoint"))
    elif mode is PlannerMode.PREFILL and config.decode_min_endpoint is not None:
        found.append(
            _rule(
                "decode_min_endpoint",
                config.decode_min_endpoint,
                "not allowed when mode='prefill' (no decode pool)",
            )
        )
    elif mode is PlannerMode.DECODE and config.prefill_min_endpoint is not None:
        found.append(
            _rule(
                "prefill_min_endpoint",
                config.prefill_min_endpoint,
                "not allowed when mode='decode' (no prefill pool)",
            )
        )
    return found


def gpu_budget_rules(config: PlannerConfig) -> list[Violation]:
    """The GPU budget band, and the minimum endpoints inside its ceiling."""
    found: list[Violation] = []
    mode = config.mode
    # GPU budget band (our rule; Dynamo does not check it): the floor cannot exceed the ceiling.
    if config.min_gpu_budget >= 0 and config.max_gpu_budget >= 0 and config.min_gpu_budget > config.max_gpu_budget:
        found.append(
            _rule(
                "min_gpu_budget",
                config.min_gpu_budget,
                f"must be <= max_gpu_budget ({config.max_gpu_budget}) or -1",
            )
        )

    # The minimum endpoints must fit the ceiling: otherwise every tick is clamped to a size the budget forbids
    # (and a floor of millions makes the demo's simulated cluster, and the database's integers, overflow).
    if config.max_gpu_budget >= 0:
        floors = {
            Component.PREFILL: (config.prefill_min_endpoint_effective, config.prefill_gpus_per_engine),
            Component.DECODE: (config.decode_min_endpoint_effective, config.decode_gpus_per_engine),
        }
        floor_gpus = sum(num * gpus for c, (num, gpus) in floors.items() if c in managed_components(mode))
        if floor_gpus > config.max_gpu_budget:
            name = "min_endpoint"
            for role, field in (
                (Component.PREFILL, "prefill_min_endpoint"),
                (Component.DECODE, "decode_min_endpoint"),
            ):
                if getattr(config, field) is not None and role in managed_components(mode):
                    name = field
            found.append(
                _rule(
                    name,
                    getattr(config, name),
                    f"the minimum endpoints need {floor_gpus} GPUs > max_gpu_budget ({config.max_gpu_budget})",
                )
            )
    return found


def sample_grid_rules(config: PlannerConfig) -> list[Violation]:
    """The online perf model's sample grid is square."""
    root = math.isqrt(config.fpm_sample_bucket_size)
    if root * root != config.fpm_sample_bucket_size:
        return [
            _rule(
                "fpm_sample_bucket_size",
                config.fpm_sample_bucket_size,
                "must be a perfect square (e.g. 4, 9, 16, 25)",
            )
        ]
    return []


def environment_rules(config: PlannerConfig) -> list[Violation]:
    """What the environment needs: the global planner's namespace, and power awareness's limit and connector."""
    found: list[Violation] = []
    if config.environment is EnvironmentKind.GLOBAL_PLANNER and not config.global_planner_namespace:
        found.append(
            _rule(
                "global_planner_namespace",
                config.global_planner_namespace,
                "required when environment='global-planner'",
            )
        )

    if config.enable_power_awareness:
        if config.total_gpu_power_limit is None:
            found.append(_rule("total_gpu_power_limit", None, "required (watts) when enable_power_awareness is true"))
        if config.environment is not EnvironmentKind.KUBERNETES:
            found.append(
                _rule(
                    "environment",
                    config.environment,
                    "must be 'kubernetes' when enable_power_awareness is true",
                )
            )
        if config.mode is PlannerMode.AGG:
            found.append(_rule("mode", config.mode, "power awareness is not supported with mode='agg'"))
    return found


def load_loop_rules(config: PlannerConfig) -> list[Violation]:
    """The load loop's thresholds (the `load` target's and `threshold_2025`'s), and `threshold_2025` needing it."""
    found: list[Violation] = []
    if config.optimization_target is OptimizationTarget.LOAD:
        found.extend(load_threshold_rules(config))

    for up_name, down_name in (
        ("decode_kv_scale_up_threshold", "decode_kv_scale_down_threshold"),
        ("prefill_queue_scale_up_threshold", "prefill_queue_scale_down_threshold"),
    ):
        up, down = getattr(config, up_name), getattr(config, down_name)
        if up <= down:
            found.append(_rule(up_name, up, f"must be > {down_name} ({_show(down)})"))
    if config.load_policy is LoadPolicy.THRESHOLD_2025 and not config.load_scaling_active:
        found.append(
            _rule(
                "load_policy",
                config.load_policy,
                "needs the load loop: set enable_load_scaling: true (or a target other than 'sla')",
            )
        )
    return found


def load_threshold_rules(config: PlannerConfig) -> list[Violation]:
    """Threshold rules of the `load` target, for the roles this planner manages."""
    found: list[Violation] = []
    pairs = []
    if config.mode in (PlannerMode.DISAGG, PlannerMode.PREFILL):
        pairs.append(("prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"))
    if config.mode in (PlannerMode.DISAGG, PlannerMode.DECODE, PlannerMode.AGG):
        pairs.append(("decode_scale_up_kv_rate", "decode_scale_down_kv_rate"))
    for up_name, down_name in pairs:
        up, down = getattr(config, up_name), getattr(config, down_name)
        for name, value in ((up_name, up), (down_name, down)):
            if value is None:
                found.append(_rule(name, None, f"required when optimization_target='load' and mode='{config.mode}'"))
        if up is not None and down is not None and up <= down:
            found.append(_rule(up_name, up, f"must be > {down_name} ({_show(down)})"))
    return found


def loop_cadence_rules(config: PlannerConfig) -> list[Violation]:
    """At least one loop runs, the load loop ticks faster than the throughput loop, the base period divides both."""
    found: list[Violation] = []
    if not (config.throughput_scaling_active or config.load_scaling_active):
        found.append(
            _rule(
                "enable_throughput_scaling",
                config.enable_throughput_scaling,
                "at least one of enable_throughput_scaling / enable_load_scaling must be true",
            )
        )

    load_s = config.load_adjustment_interval_seconds
    throughput_s = config.throughput_adjustment_interval_seconds
    if config.throughput_scaling_active and config.load_scaling_active and load_s >= throughput_s:
        found.append(
            _rule(
                "load_adjustment_interval_seconds",
                load_s,
                f"must be < throughput_adjustment_interval_seconds ({throughput_s}) when both loops are active",
            )
        )

    base = config.scheduling.scale_interval_seconds
    if base is not None:
        named = {"load_adjustment_interval_seconds": load_s}
        if config.throughput_scaling_active:
            named["throughput_adjustment_interval_seconds"] = throughput_s
        if not all(_divides(base, interval) for interval in named.values()):
            listed = " and ".join(f"{name} ({value})" for name, value in named.items())
            found.append(_rule("scheduling.scale_interval_seconds", base, f"must evenly divide {listed}"))
    return found


def feedback_rules(config: PlannerConfig) -> list[Violation]:
    """The closed loop learns the speed of separate prefill and decode pools sized on engine capacity."""
    if not config.throughput_capacity_feedback:
        return []
    if config.mode is not PlannerMode.DISAGG:
        return [_rule("throughput_capacity_feedback", True, f"needs mode: disagg (mode is {config.mode.value})")]
    if config.throughput_algorithm is not ThroughputAlgorithm.ENGINE_CAPACITY:
        return [
            _rule(
                "throughput_capacity_feedback",
                True,
                f"needs throughput_algorithm: engine_capacity (it is {config.throughput_algorithm.value})",
            )
        ]
    return []


def scale_to_zero_rules(config: PlannerConfig) -> list[Violation]:
    """The idle hold of scale to zero only acts on a managed pool whose minimum endpoints is 0."""
    hold_s = config.scale_to_zero_idle_seconds
    if hold_s is None:
        return []
    floors = {
        Component.PREFILL: config.prefill_min_endpoint_effective,
        Component.DECODE: config.decode_min_endpoint_effective,
    }
    if any(floors[c] == 0 for c in managed_components(config.mode)):
        return []
    return [
        _rule("scale_to_zero_idle_seconds", hold_s, "needs a managed pool with minimum endpoints 0 (min_endpoint: 0)")
    ]


CROSS_FIELD_RULES: tuple[Callable[[PlannerConfig], list[Violation]], ...] = (
    mode_floor_rules,
    gpu_budget_rules,
    sample_grid_rules,
    environment_rules,
    load_loop_rules,
    loop_cadence_rules,
    feedback_rules,
    scale_to_zero_rules,
)
"""The rule groups in the order their violations are reported."""


def _gcd_seconds(values: list[float]) -> float:
    """Greatest common divisor of durations in seconds, computed on whole milliseconds."""
    result = 0
    for value in values:
        result = math.gcd(result, round(value * 1000.0))
    return result / 1000.0


def _divides(base: float, value: float) -> bool:
    """Whether `value` is a whole (>= 1) multiple of `base`, tolerating float rounding."""
    ratio = value / base
    nearest = round(ratio)
    return nearest >= 1 and math.isclose(ratio, nearest, rel_tol=1e-9, abs_tol=1e-9)
