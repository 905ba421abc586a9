"""The stored vocabulary: step names and reason codes are written to Postgres (`tick_steps.step`, `ticks.reason`,
`tick_steps.reason`, ...) and read back by replay, reports and the history views, so their string values are pinned
here: renaming a member's value is caught, adding one means adding it here on purpose."""

from __future__ import annotations

import pytest

from planner_core.domain import ReasonCode, ReasonFamily, StepName, StepRecord

STORED_REASON_CODES = frozenset(
    {
        "outside_change_adopted",
        "outside_change_held",
        "outside_change_restored",
        "signal_missed",
        "signal_recovered",
        "stale_signal_no_shrink",
        "worker_counts_unavailable",
        "scaled_to_zero",
        "woken",
        "idle_hold",
        "at_zero",
        "accept_length_clamped",
        "advisory",
        "apply",
        "burst_covered",
        "burst_sized",
        "burst_unavailable",
        "capacity_from_profile",
        "capacity_searched",
        "consolidation_safe",
        "constrain_final_ignored",
        "constrain_set_dropped",
        "correction_applied",
        "correction_unavailable",
        "decode_grace_period",
        "delta_capped",
        "demand_sized",
        "disabled",
        "gpu_budget_capped",
        "fleet_ceiling_capped",
        "gpu_budget_floored",
        "gpu_budget_guard_hold",
        "gpu_budget_reconcile",
        "headroom_applied",
        "idle_window",
        "insufficient_data",
        "interval_collecting",
        "kv_hit_rate_clamped",
        "latency_estimated",
        "load_measured",
        "merge_ceiling",
        "merge_final",
        "merge_floor",
        "merge_floor_over_ceiling",
        "min_endpoint_floor",
        "model_not_ready",
        "negative_coefficient",
        "next_request_engine_average",
        "next_request_traffic_window",
        "next_request_unknown",
        "no_change",
        "no_fpm_data",
        "no_traffic_data",
        "observed",
        "override_at_least",
        "override_at_most",
        "override_invalid",
        "override_reject",
        "override_set",
        "partner_not_ready",
        "perf_model_bootstrap",
        "perf_model_ready",
        "plugin_answer_missing",
        "plugin_circuit_closed",
        "plugin_circuit_half_open",
        "plugin_circuit_open",
        "plugin_circuit_opened",
        "plugin_held_over",
        "plugin_invalid_result",
        "plugin_load_failed",
        "plugin_no_opinion",
        "plugin_not_due",
        "plugin_observed",
        "plugin_overrides",
        "plugin_raised",
        "plugin_timeout",
        "plugin_unavailable",
        "predict_chain_final",
        "predict_failed",
        "predicted",
        "predictor_fallback",
        "prefill_queue_trend",
        "quantile_unavailable",
        "raised_to_throughput_floor",
        "request_exceeds_engine",
        "required_fields_missing",
        "runtime_metadata_missing",
        "scale",
        "scale_down",
        "scale_down_capped_by_throughput",
        "scale_down_held",
        "tail_latency_high",
        "tail_latency_refused_down",
        "tail_latency_ok",
        "samples_excluded",
        "horizon_headroom",
        "horizon_no_history",
        "horizon_short_history",
        "startup_measured",
        "feedback_learned",
        "feedback_confirmed",
        "feedback_not_at_load",
        "feedback_pool_changing",
        "feedback_no_latency",
        "feedback_too_few_requests",
        "feedback_miss_was_load",
        "feedback_miss_beyond_load",
        "burst_by_count_sized",
        "burst_by_count_covered",
        "burst_by_count_unavailable",
        "budget_warming_up",
        "budget_healthy",
        "budget_holding",
        "budget_burning",
        "budget_unavailable",
        "decode_margin_learned",
        "decode_margin_missed",
        "decode_margin_no_latency",
        "decode_margin_no_evidence",
        "startup_configured",
        "scale_down_refused_consolidation",
        "scale_up",
        "unplaced_requests",
        "scaling_in_progress",
        "set_lower_bound",
        "sized_on_mean",
        "sized_on_quantile",
        "skip_no_targets",
        "skip_short_circuit",
        "skip_tick_timeout",
        "sla_unreachable",
        "speculative_decoding_off",
        "unmanaged_component",
        "unset",
        "within_range",
        "worker_count_mismatch",
        "workers_changed_in_interval",
    }
)
STORED_STEP_NAMES = frozenset(
    {
        "accept_length",
        "agg_signal",
        "burst",
        "capacity",
        "capacity_feedback",
        "change_rate",
        "consolidation",
        "correction",
        "decide",
        "decode_grace",
        "decode_margin",
        "demand",
        "engine_capacity",
        "engine_load",
        "error_budget",
        "execute",
        "fleet",
        "fleet_ceiling",
        "forward_pass_model",
        "gpu_budget",
        "headroom",
        "interval",
        "interval_average",
        "itl_estimate",
        "itl_signal",
        "unplaced_signal",
        "ownership",
        "signal",
        "signal_guard",
        "scale_to_zero",
        "kv_hit_rate",
        "length_sizing",
        "load",
        "load_decision",
        "min_endpoint",
        "model",
        "next_request",
        "observe",
        "perf_model_agg",
        "perf_model_decode",
        "perf_model_prefill",
        "plugin",
        "predict",
        "sample",
        "scale_down_hold",
        "horizon",
        "startup",
        "threshold_signal",
        "throughput",
        "throughput_floor",
        "ttft_estimate",
        "ttft_signal",
    }
)


def test_every_stored_reason_code_value_is_pinned() -> None:
    assert {code.value for code in ReasonCode} == STORED_REASON_CODES


def test_every_stored_step_name_value_is_pinned() -> None:
    assert {name.value for name in StepName} == STORED_STEP_NAMES


def test_every_reason_code_has_a_family_and_families_are_contiguous_in_the_source() -> None:
    """Members are grouped by family in the source: walking them in order, a family never comes back."""
    families = [code.family for code in ReasonCode]
    assert all(isinstance(family, ReasonFamily) for family in families)
    runs = [family for i, family in enumerate(families) if i == 0 or families[i - 1] is not family]
    assert len(runs) == len(set(runs)) == len(ReasonFamily)


@pytest.mark.parametrize(
    ("code", "family"),
    [
        (ReasonCode.SCALE, ReasonFamily.HEADLINE),
        (ReasonCode.PREDICTED, ReasonFamily.PIPELINE),
        (ReasonCode.PERF_MODEL_READY, ReasonFamily.PERF),
        (ReasonCode.PLUGIN_TIMEOUT, ReasonFamily.PLUGIN),
        (ReasonCode.MERGE_FINAL, ReasonFamily.MERGE),
        (ReasonCode.SKIP_TICK_TIMEOUT, ReasonFamily.EXECUTE),
        (ReasonCode.PREFILL_QUEUE_TREND, ReasonFamily.LOAD),
        (ReasonCode.SCALE_DOWN_HELD, ReasonFamily.SIZING),
        (ReasonCode.NEXT_REQUEST_UNKNOWN, ReasonFamily.NEXT_REQUEST),
        (ReasonCode.STALE_SIGNAL_NO_SHRINK, ReasonFamily.ACTUATION),
        (ReasonCode.WOKEN, ReasonFamily.SCALE_TO_ZERO),
    ],
)
def test_family_of_a_member(code: ReasonCode, family: ReasonFamily) -> None:
    assert code.family is family


def test_a_step_named_by_its_stored_string_is_the_member() -> None:
    """A row read back (or a plugin naming a planner step) compares and serialises exactly as the member."""
    step = StepRecord(step="observe", reason=ReasonCode.OBSERVED)
    assert step.step is StepName.OBSERVE
    assert step == StepRecord(step=StepName.OBSERVE, reason=ReasonCode.OBSERVED)


def test_plugin_scoped_step_names_stay_free_form() -> None:
    """Plugin ids and a user plugin's own step names are chosen by user code: kept as given."""
    for name in ("throughput:my_plugin", "my_plugin_check"):
        step = StepRecord(step=name, reason=ReasonCode.PLUGIN_NO_OPINION)
        assert step.step == name and not isinstance(step.step, StepName)


# `decisions.stage` (migration 0023), shown as `decision_history.reason`: queries group and filter on these values.
STORED_DECISION_STAGES = frozenset(
    {
        "budget",
        "burst",
        "fleet",
        "forecast",
        "hold",
        "horizon",
        "load",
        "minimum",
        "other",
        "ownership",
        "plugin",
        "rate_limit",
        "scale_to_zero",
        "tail_latency",
        "throughput_floor",
        "unplaced",
    }
)


def test_decision_stage_values_are_pinned() -> None:
    from planner_core.domain import DecisionStage

    assert {stage.value for stage in DecisionStage} == STORED_DECISION_STAGES
    assert max(len(stage.value) for stage in DecisionStage) <= 20  # decisions.stage is varchar(20)
