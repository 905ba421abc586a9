"""Which policy fields may change while the planner runs (`LIVE_FIELDS`), and the changes between two policies
(`live_changes`), refusing in one line a change to any other field.

A live retune (`planner config set`, a `config_revisions` row) is picked up by the next tick without a restart.
That is only safe for fields the tick reads afresh each time and nothing outside the tick has already acted on:
the SLA targets, the GPU budgets, the replica floors and ceiling, and the policy's knobs. The rest shape what was
built or scheduled when the planner started (the connector and its environment, the pools it manages, the loops'
schedules, the engine profile, the forecaster whose state the ticks carry, the plugins), or what a flow reads
before its tick (the tail-latency and closed-loop switches, which decide what is collected): they change with a new
file and a restart.
"""

from __future__ import annotations

from typing import Any

from planner_core.config.errors import ConfigError
from planner_core.config.policy import PlannerConfig

LIVE_FIELDS: frozenset[str] = frozenset(
    {
        # SLA targets
        "ttft_ms",
        "itl_ms",
        # budgets
        "max_gpu_budget",
        "min_gpu_budget",
        "total_gpu_power_limit",
        # floors and ceilings
        "min_endpoint",
        "prefill_min_endpoint",
        "decode_min_endpoint",
        "max_throughput_scaling_replicas",
        # the throughput loop's knobs (headroom, bursts, scale-down hold and margin, the learned margins)
        "throughput_prefill_target_utilization",
        "throughput_decode_target_utilization",
        "throughput_prefill_burst_sizing",
        "throughput_scale_down_hold_seconds",
        "throughput_scale_down_margin",
        "throughput_horizon_quantile",
        "throughput_startup_seconds",
        "throughput_feedback_speed_min",
        "throughput_feedback_speed_max",
        "error_budget_target",
        "error_budget_period_seconds",
        "error_budget_fast_burn_seconds",
        "error_budget_lean_decode_utilization",
        "error_budget_lean_burst_quantile",
        "throughput_decode_utilization_max",
        # the load loop's knobs
        "load_scaling_down_sensitivity",
        "prefill_scale_up_queue_tokens",
        "prefill_scale_down_queue_tokens",
        "decode_scale_up_kv_rate",
        "decode_scale_down_kv_rate",
        "decode_kv_scale_up_threshold",
        "decode_kv_scale_down_threshold",
        "prefill_queue_scale_up_threshold",
        "prefill_queue_scale_down_threshold",
    }
)


def live_changes(before: PlannerConfig, after: PlannerConfig, source: str) -> dict[str, list[Any]]:
    """The fields `after` changes from `before`, each as [before, after] (JSON values), by field name.

    Raises:
        ConfigError: a field outside `LIVE_FIELDS` changes (one line starting with `source`, naming the field, its
            current and its asked value).
    """
    old, new = before.model_dump(mode="json"), after.model_dump(mode="json")
    changes = {name: [old[name], new[name]] for name in new if old.get(name) != new[name]}
    for name, (was, asked) in changes.items():
        if name not in LIVE_FIELDS:
            raise ConfigError(
                f"{source}: field '{name}' = {asked!r}: cannot change live (it is {was!r}; change it in the config "
                "file and restart; the live fields: docs/operations.md, Live retune)",
                source=source,
                field=name,
            )
    return changes
