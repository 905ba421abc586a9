"""Tests of `planner_core.config`: Dynamo-compatible defaults and aliases, file loading, one-line errors,
immutability, hashing and derived properties. Pure: no database, no Prefect."""

from __future__ import annotations

import hashlib
import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from planner_core.config import (
    Backend,
    ConfigError,
    EngineLimitsConfig,
    EnvironmentKind,
    LengthQuantile,
    LoadPolicy,
    LoadPredictorName,
    OptimizationTarget,
    PlannerConfig,
    PlannerMode,
    PluginOverrideConfig,
    PluginsConfig,
    SchedulingConfig,
    ServiceConfig,
    SweepingMode,
    ThroughputMetricsSource,
    config_hash,
    load_config,
    parse_config,
)
from planner_core.domain import HoldPolicy

SLA = {"optimization_target": "sla"}
LOAD_THRESHOLDS = {
    "prefill_scale_up_queue_tokens": 4096,
    "prefill_scale_down_queue_tokens": 512,
    "decode_scale_up_kv_rate": 90.0,
    "decode_scale_down_kv_rate": 50.0,
}


def write_yaml(tmp_path: Path, data: Any, name: str = "planner.yaml") -> Path:
    """Write `data` as YAML under `tmp_path` and return the path."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def attr(config: PlannerConfig, dotted: str) -> Any:
    """Follow a dotted attribute path such as `scheduling.tick_max_duration_seconds`."""
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


# ---------------------------------------------------------------------------------------------------------
# Defaults and aliases
# ---------------------------------------------------------------------------------------------------------

DYNAMO_DEFAULTS = [
    ("optimization_target", OptimizationTarget.THROUGHPUT),
    ("mode", PlannerMode.DISAGG),
    ("environment", EnvironmentKind.KUBERNETES),
    ("backend", Backend.VLLM),
    ("namespace", "dynamo"),
    ("ttft_ms", 500.0),
    ("itl_ms", 50.0),
    ("enable_throughput_scaling", True),
    ("enable_load_scaling", False),
    ("throughput_adjustment_interval_seconds", 180),
    ("load_adjustment_interval_seconds", 5),
    ("scheduling.scale_interval_seconds", None),
    ("scheduling.tick_max_duration_seconds", 30.0),
    ("max_throughput_scaling_replicas", 8),
    ("max_gpu_budget", 8),
    ("min_gpu_budget", -1),
    ("min_endpoint", 1),
    ("prefill_min_endpoint", None),
    ("decode_min_endpoint", None),
    ("prefill_engine_num_gpu", None),
    ("decode_engine_num_gpu", None),
    ("load_predictor", LoadPredictorName.ARIMA),
    ("load_predictor_log1p", False),
    ("prophet_window_size", 50),
    ("kalman_q_level", 1.0),
    ("kalman_q_trend", 0.1),
    ("kalman_r", 10.0),
    ("kalman_min_points", 5),
    ("load_predictor_warmup_trace", None),
    ("max_num_fpm_samples", 64),
    ("fpm_sample_bucket_size", 16),
    ("load_min_observations", 5),
    ("load_scaling_down_sensitivity", 80),
    ("prefill_scale_up_queue_tokens", None),
    ("prefill_scale_down_queue_tokens", None),
    ("decode_scale_up_kv_rate", None),
    ("decode_scale_down_kv_rate", None),
    ("speculative_nextn", 0),
    ("pre_deployment_sweeping_mode", SweepingMode.RAPID),
    ("profile_results_dir", "profiling_results"),
    ("throughput_metrics_source", ThroughputMetricsSource.FRONTEND),
    ("metric_pulling_prometheus_endpoint", None),
    ("metric_reporting_prometheus_port", 0),
    ("model_name", None),
    ("advisory", False),
    ("control_api_port", 9086),
    ("enable_power_awareness", False),
    ("total_gpu_power_limit", None),
    ("report_interval_hours", 24.0),
    ("report_output_dir", "./planner_reports"),
    ("report_filename", None),
    ("report_write_gzip_log", True),
    ("live_dashboard_port", 8080),
    ("global_planner_namespace", None),
    ("aic_interpolation", None),
    ("ais_perf_model", None),
    ("plugin_registration", None),
    # our extensions
    ("load_predictor_length_quantile", LengthQuantile.P90),
    ("execution_interval_seconds", 10.0),
    ("execution_fallback_poll_seconds", 60.0),
    ("virtual_connector_timeout_seconds", 1800.0),
    ("prometheus_arrival_resolution_seconds", 1.0),
    ("load_policy", LoadPolicy.PER_ENGINE),
    ("threshold_2025_adjustment_interval_seconds", 30),
    ("decode_kv_scale_up_threshold", 0.9),
    ("decode_kv_scale_down_threshold", 0.5),
    ("prefill_queue_scale_up_threshold", 5.0),
    ("prefill_queue_scale_down_threshold", 0.2),
]


@pytest.mark.parametrize(("field", "expected"), DYNAMO_DEFAULTS, ids=[f for f, _ in DYNAMO_DEFAULTS])
def test_default_matches_dynamo(field: str, expected: Any) -> None:
    """An empty configuration yields Dynamo 1.6.1's default for every field."""
    loaded = parse_config({})
    assert attr(loaded.service if field in ServiceConfig.model_fields else loaded.policy, field) == expected


@pytest.mark.parametrize("predictor", list(LoadPredictorName), ids=[p.value for p in LoadPredictorName])
@pytest.mark.parametrize("quantile", list(LengthQuantile), ids=[q.value for q in LengthQuantile])
def test_every_predictor_and_length_quantile_is_accepted(
    predictor: LoadPredictorName, quantile: LengthQuantile
) -> None:
    """Dynamo's four predictors, our `ensemble`, and each of p50/p90/p99 parse to their enum members."""
    config = parse_config({"load_predictor": predictor.value, "load_predictor_length_quantile": quantile.value}).policy
    assert config.load_predictor is predictor
    assert config.load_predictor_length_quantile is quantile


def test_defaults_ignore_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults Dynamo reads from the environment are static here."""
    monkeypatch.setenv("DYN_NAMESPACE", "from-env")
    monkeypatch.setenv("PROMETHEUS_ENDPOINT", "http://from-env:9090")
    monkeypatch.setenv("PLANNER_PROMETHEUS_PORT", "9999")
    config, service = PlannerConfig(), ServiceConfig()
    assert (config.namespace, service.metric_pulling_prometheus_endpoint) == ("dynamo", None)
    assert service.metric_reporting_prometheus_port == 0


ALIASES = [
    ("ttft", "ttft_ms", 250.0),
    ("itl", "itl_ms", 20.0),
    ("throughput_adjustment_interval", "throughput_adjustment_interval_seconds", 120),
    ("load_adjustment_interval", "load_adjustment_interval_seconds", 10),
]


@pytest.mark.parametrize(("alias", "field", "value"), ALIASES, ids=[a for a, _, _ in ALIASES])
def test_alias_sets_field(alias: str, field: str, value: Any) -> None:
    """Each Dynamo alias sets its canonical field."""
    assert getattr(parse_config({alias: value}).policy, field) == value


@pytest.mark.parametrize(("alias", "field", "value"), ALIASES, ids=[a for a, _, _ in ALIASES])
def test_alias_and_name_together_rejected(alias: str, field: str, value: Any) -> None:
    """Giving a field under both spellings is an error naming the alias."""
    with pytest.raises(ConfigError, match=rf"field '{alias}' = .*'{field}' is also given"):
        parse_config({alias: value, field: value})


def test_dump_uses_canonical_names() -> None:
    """Dumps use field names, never aliases, with enums as plain strings."""
    dumped = parse_config({"ttft": 100}).policy.model_dump(mode="json")
    assert dumped["ttft_ms"] == 100.0 and "ttft" not in dumped
    assert dumped["mode"] == "disagg"


# ---------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------

FILE_DATA = {
    "optimization_target": "sla",
    "mode": "agg",
    "ttft": 300,
    "load_adjustment_interval": 10,
    "enable_load_scaling": True,
    "scheduling": {"tick_max_duration_seconds": 12.5},
}


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".YAML"])
def test_yaml_file_loads(tmp_path: Path, suffix: str) -> None:
    """YAML files load by suffix, aliases and nested sections included."""
    config = load_config(write_yaml(tmp_path, FILE_DATA, name=f"planner{suffix}")).policy
    assert (config.mode, config.ttft_ms, config.load_adjustment_interval_seconds) == (
        PlannerMode.AGG,
        300.0,
        10,
    )
    assert config.scheduling.tick_max_duration_seconds == 12.5


def test_json_file_loads(tmp_path: Path) -> None:
    """JSON files load and equal the same data loaded from YAML."""
    path = tmp_path / "planner.json"
    path.write_text(json.dumps(FILE_DATA), encoding="utf-8")
    assert load_config(path).policy == load_config(write_yaml(tmp_path, FILE_DATA)).policy


def test_load_config_accepts_str_path(tmp_path: Path) -> None:
    """`load_config` takes a plain string as well as a Path."""
    assert load_config(str(write_yaml(tmp_path, {"mode": "decode"}))).policy.mode is PlannerMode.DECODE


def test_dynamo_file_with_unsupported_sections_loads(tmp_path: Path) -> None:
    """Dynamo's AIC and gateway sections are accepted as opaque data so its files load; its external plugin
    entries (Dynamo's field names and upper-case spellings) are read as out-of-process plugins."""
    data = {
        "aic_interpolation": {"hf_id": "Qwen/Qwen3-32B", "system": "h200_sxm"},
        "ais_perf_model": {"roles": {"decode": {"backend": "vllm"}}},
        "plugin_registration": {"auth": {"trusted_sources": ["static_secret"]}},
        "scheduling": {
            "gateway": {"enabled": False},
            "external_plugins": [
                {
                    "plugin_id": "p",
                    "plugin_type": "PROPOSE",
                    "priority": 5,
                    "endpoint": "grpc://127.0.0.1:50051",
                    "hold_policy": "HOLD_LAST",
                    "auth_token": "t",
                    "protocol_version": "1.0",
                }
            ],
        },
    }
    config = load_config(write_yaml(tmp_path, data)).policy
    assert config.ais_perf_model == data["ais_perf_model"]
    entry = config.scheduling.external_plugins[0]
    assert (entry.plugin_id, entry.plugin_type, entry.priority) == ("p", "propose", 5)
    assert entry.hold_policy is HoldPolicy.HOLD_LAST and entry.timeout_seconds == 5.0


FILE_FAILURES = [
    ("missing", None, "planner.yaml", "file not found"),
    ("bad-yaml", "mode: [disagg\n", "planner.yaml", "not valid YAML (line"),
    ("bad-json", '{"mode": "agg",}', "planner.json", "not valid JSON (line 1"),
    ("duplicate-yaml-key", "ttft_ms: 1\nttft_ms: 2\n", "planner.yaml", "duplicate key 'ttft_ms'"),
    ("duplicate-json-key", '{"itl_ms": 1, "itl_ms": 2}', "planner.json", "duplicate key 'itl_ms'"),
    ("top-level-list", "- 1\n- 2\n", "planner.yaml", "top level is a list"),
    ("empty-file", "", "planner.yaml", "top level is empty"),
    ("unknown-suffix", "mode: agg\n", "planner.toml", "unsupported file type '.toml'"),
    ("no-suffix", "mode: agg\n", "planner", "unsupported file type (no suffix)"),
]


@pytest.mark.parametrize(
    ("text", "name", "expected"), [c[1:] for c in FILE_FAILURES], ids=[c[0] for c in FILE_FAILURES]
)
def test_file_failure_is_one_line_config_error(tmp_path: Path, text: str | None, name: str, expected: str) -> None:
    """Unreadable, unparsable or mis-shaped files raise a one-line ConfigError naming the file."""
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected in message


# ---------------------------------------------------------------------------------------------------------
# Validation rules
# ---------------------------------------------------------------------------------------------------------

# (id, config data, field named in the message, value shown in the message, fragment of the requirement)
RULE_CASES = [
    ("ttft-negative", {"ttft_ms": -5}, "ttft_ms", "-5", "must be > 0"),
    ("ttft-alias-zero", {"ttft": 0}, "ttft_ms", "0", "must be > 0"),
    ("itl-negative", {"itl_ms": -1.5}, "itl_ms", "-1.5", "must be > 0"),
    ("ttft-not-number", {"ttft_ms": "fast"}, "ttft_ms", "'fast'", "must be a number"),
    ("ttft-infinite", {"ttft_ms": float("inf")}, "ttft_ms", "Infinity", "finite"),
    (
        "throughput-interval-zero",
        {"throughput_adjustment_interval_seconds": 0},
        "throughput_adjustment_interval_seconds",
        "0",
        "> 0",
    ),
    (
        "load-interval-alias-negative",
        {"load_adjustment_interval": -5},
        "load_adjustment_interval_seconds",
        "-5",
        "> 0",
    ),
    (
        "interval-fractional",
        {"load_adjustment_interval_seconds": 2.5},
        "load_adjustment_interval_seconds",
        "2.5",
        "whole number",
    ),
    (
        "tick-deadline-zero",
        {"scheduling": {"tick_max_duration_seconds": 0}},
        "scheduling.tick_max_duration_seconds",
        "0",
        "> 0",
    ),
    (
        "load-not-faster",
        {**SLA, "enable_load_scaling": True, "load_adjustment_interval_seconds": 180},
        "load_adjustment_interval_seconds",
        "180",
        "must be < throughput_adjustment_interval_seconds (180)",
    ),
    (
        "no-loop",
        {**SLA, "enable_throughput_scaling": False, "enable_load_scaling": False},
        "enable_throughput_scaling",
        "false",
        "at least one",
    ),
    (
        "agg-prefill-floor",
        {"mode": "agg", "prefill_min_endpoint": 2},
        "prefill_min_endpoint",
        "2",
        "mode='agg'",
    ),
    ("agg-decode-floor", {"mode": "agg", "decode_min_endpoint": 3}, "decode_min_endpoint", "3", "mode='agg'"),
    (
        "prefill-mode-decode-floor",
        {"mode": "prefill", "decode_min_endpoint": 2},
        "decode_min_endpoint",
        "2",
        "mode='prefill'",
    ),
    (
        "decode-mode-prefill-floor",
        {"mode": "decode", "prefill_min_endpoint": 2},
        "prefill_min_endpoint",
        "2",
        "mode='decode'",
    ),
    ("role-floor-zero", {"prefill_min_endpoint": 0}, "prefill_min_endpoint", "0", ">= 1"),
    ("min-endpoint-negative", {"min_endpoint": -1}, "min_endpoint", "-1", ">= 0"),
    (
        "load-target-missing",
        {"optimization_target": "load"},
        "prefill_scale_up_queue_tokens",
        "null",
        "required when optimization_target='load'",
    ),
    (
        "load-target-decode-missing",
        {"optimization_target": "load", "mode": "decode"},
        "decode_scale_up_kv_rate",
        "null",
        "required",
    ),
    (
        "load-prefill-up-not-above-down",
        {"optimization_target": "load", **LOAD_THRESHOLDS, "prefill_scale_up_queue_tokens": 512},
        "prefill_scale_up_queue_tokens",
        "512",
        "must be > prefill_scale_down_queue_tokens (512)",
    ),
    (
        "load-decode-up-below-down",
        {"optimization_target": "load", **LOAD_THRESHOLDS, "decode_scale_up_kv_rate": 40},
        "decode_scale_up_kv_rate",
        "40",
        "must be > decode_scale_down_kv_rate (50.0)",
    ),
    ("kv-rate-over-100", {"decode_scale_up_kv_rate": 120}, "decode_scale_up_kv_rate", "120", "<= 100"),
    ("bucket-not-square", {"fpm_sample_bucket_size": 15}, "fpm_sample_bucket_size", "15", "perfect square"),
    (
        "sensitivity-over-100",
        {"load_scaling_down_sensitivity": 101},
        "load_scaling_down_sensitivity",
        "101",
        "<= 100",
    ),
    (
        "sensitivity-negative",
        {"load_scaling_down_sensitivity": -1},
        "load_scaling_down_sensitivity",
        "-1",
        ">= 0",
    ),
    (
        "global-planner-namespace",
        {"environment": "global-planner"},
        "global_planner_namespace",
        "null",
        "required when environment='global-planner'",
    ),
    (
        "scale-interval-not-divisor",
        {"scheduling": {"scale_interval_seconds": 3}},
        "scheduling.scale_interval_seconds",
        "3",
        "must evenly divide load_adjustment_interval_seconds (5)",
    ),
    (
        "scale-interval-not-dividing-throughput",
        {
            **SLA,
            "enable_load_scaling": True,
            "load_adjustment_interval_seconds": 10,
            "scheduling": {"scale_interval_seconds": 10},
            "throughput_adjustment_interval_seconds": 25,
        },
        "scheduling.scale_interval_seconds",
        "10",
        "throughput_adjustment_interval_seconds (25)",
    ),
    (
        "scale-interval-larger",
        {"scheduling": {"scale_interval_seconds": 10}},
        "scheduling.scale_interval_seconds",
        "10",
        "evenly divide",
    ),
    ("mode-unknown", {"mode": "foo"}, "mode", "'foo'", "allowed values are disagg, prefill, decode, agg"),
    (
        "target-unknown",
        {"optimization_target": "cost"},
        "optimization_target",
        "'cost'",
        "allowed values are throughput, latency, load, sla",
    ),
    (
        "environment-unknown",
        {"environment": "circus"},  # Dynamo 0.x's process manager; `local` is an environment of its own now
        "environment",
        "'circus'",
        "kubernetes, kubernetes-workloads, virtual, global-planner, local",
    ),
    ("backend-unknown", {"backend": "llamacpp"}, "backend", "'llamacpp'", "vllm, sglang, trtllm, mocker"),
    (
        "predictor-unknown",
        {"load_predictor": "lstm"},
        "load_predictor",
        "'lstm'",
        "allowed values are constant, arima, prophet, kalman, ensemble",
    ),
    (
        "length-quantile-unknown",
        {"load_predictor_length_quantile": "p95"},
        "load_predictor_length_quantile",
        "'p95'",
        "allowed values are p50, p90, p99",
    ),
    (
        "sweep-unknown",
        {"pre_deployment_sweeping_mode": "fast"},
        "pre_deployment_sweeping_mode",
        "'fast'",
        "none, rapid, thorough",
    ),
    (
        "metrics-source-unknown",
        {"throughput_metrics_source": "engine"},
        "throughput_metrics_source",
        "'engine'",
        "frontend, router",
    ),
    ("unknown-field", {"ttftt": 300}, "ttftt", "300", "unknown field; did you mean"),
    (
        "unknown-nested-field",
        {"scheduling": {"use_orchestrator": True}},
        "scheduling.use_orchestrator",
        "true",
        "unknown field",
    ),
    ("scheduling-not-mapping", {"scheduling": 5}, "scheduling", "5", "must be a mapping"),
    ("power-without-limit", {"enable_power_awareness": True}, "total_gpu_power_limit", "null", "required"),
    (
        "power-outside-kubernetes",
        {"enable_power_awareness": True, "total_gpu_power_limit": 5000, "environment": "virtual"},
        "environment",
        "'virtual'",
        "must be 'kubernetes'",
    ),
    (
        "power-agg",
        {"enable_power_awareness": True, "total_gpu_power_limit": 5000, "mode": "agg"},
        "mode",
        "'agg'",
        "not supported",
    ),
    (
        "gpu-budget-inverted",
        {"min_gpu_budget": 16, "max_gpu_budget": 8},
        "min_gpu_budget",
        "16",
        "<= max_gpu_budget (8)",
    ),
    ("port-out-of-range", {"control_api_port": 70000}, "control_api_port", "70000", "<= 65535"),
    ("report-interval-zero", {"report_interval_hours": 0}, "report_interval_hours", "0", "> 0"),
    ("engine-gpus-zero", {"decode_engine_num_gpu": 0}, "decode_engine_num_gpu", "0", ">= 1"),
    (
        "load-policy-unknown",
        {"load_policy": "pid"},
        "load_policy",
        "'pid'",
        "allowed values are per_engine, threshold_2025",
    ),
    (
        "threshold-2025-without-load-loop",
        {**SLA, "load_policy": "threshold_2025"},
        "load_policy",
        "'threshold_2025'",
        "needs the load loop",
    ),
    (
        "threshold-2025-kv-inverted",
        {"decode_kv_scale_up_threshold": 0.5},
        "decode_kv_scale_up_threshold",
        "0.5",
        "must be > decode_kv_scale_down_threshold (0.5)",
    ),
    (
        "threshold-2025-queue-inverted",
        {"prefill_queue_scale_down_threshold": 6},
        "prefill_queue_scale_up_threshold",
        "5.0",
        "must be > prefill_queue_scale_down_threshold (6.0)",
    ),
    (
        "threshold-2025-interval-zero",
        {"threshold_2025_adjustment_interval_seconds": 0},
        "threshold_2025_adjustment_interval_seconds",
        "0",
        "> 0",
    ),
]


@pytest.mark.parametrize(
    ("data", "field", "shown", "requirement"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_rule_violation_is_one_line(
    tmp_path: Path, data: dict[str, Any], field: str, shown: str, requirement: str
) -> None:
    """Each rule fails with one line naming the file, the field, the value and the requirement."""
    path = tmp_path / "planner.json"  # JSON keeps float('inf') and exact types
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: field '{field}'")
    assert f"= {shown}" in message
    assert requirement in message
    assert info.value.field == field and info.value.source == str(path)


@pytest.mark.parametrize("data", [c[1] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_direct_construction_rejects_same_cases(data: dict[str, Any]) -> None:
    """Building the model directly enforces the same rules (as a pydantic ValidationError)."""
    with pytest.raises(ValidationError):
        PlannerConfig.model_validate(data)


def test_error_counts_further_errors() -> None:
    """When several things are wrong the message reports the first and counts the rest."""
    with pytest.raises(ConfigError) as info:
        parse_config({"mode": "x", "ttft_ms": -1, "itl_ms": -1}, source="cfg.yaml")
    message = str(info.value)
    assert message.startswith("cfg.yaml: field 'mode' = 'x'")
    assert message.endswith("(and 2 more errors)")


def test_rule_errors_are_counted_too() -> None:
    """Several cross-field violations are reported as the first plus a count."""
    with pytest.raises(ConfigError, match=r"\(and 3 more errors\)$"):
        parse_config({"optimization_target": "load"})


def test_parse_config_default_source_and_non_mapping() -> None:
    """In-memory errors use the `<config>` label; a non-mapping is refused."""
    with pytest.raises(ConfigError, match=r"^<config>: field 'itl_ms' = 0: must be > 0$"):
        parse_config({"itl_ms": 0})
    with pytest.raises(ConfigError, match=r"^mem: top level is a str"):
        parse_config("mode: agg", source="mem")  # type: ignore[arg-type]


def test_config_error_is_value_error_and_pickles() -> None:
    """ConfigError is a ValueError that survives pickling with its attributes."""
    with pytest.raises(ValueError) as info:
        parse_config({"mode": "x"}, source="a.yaml")
    copy = pickle.loads(pickle.dumps(info.value))
    assert isinstance(copy, ConfigError)
    assert (str(copy), copy.source, copy.field) == (str(info.value), "a.yaml", "mode")


VALID_CASES = [
    ("load-target-disagg", {"optimization_target": "load", **LOAD_THRESHOLDS}),
    (
        "load-target-decode-only-needs-decode",
        {
            "optimization_target": "load",
            "mode": "decode",
            "decode_scale_up_kv_rate": 80,
            "decode_scale_down_kv_rate": 20,
        },
    ),
    (
        "load-target-prefill-only-needs-prefill",
        {
            "optimization_target": "load",
            "mode": "prefill",
            "prefill_scale_up_queue_tokens": 10,
            "prefill_scale_down_queue_tokens": 0,
        },
    ),
    ("easy-target-ignores-interval-order", {"load_adjustment_interval_seconds": 300}),
    (
        "easy-target-ignores-disabled-flags",
        {"enable_throughput_scaling": False, "enable_load_scaling": False},
    ),
    ("role-floors-in-disagg", {"prefill_min_endpoint": 2, "decode_min_endpoint": 3}),
    ("scale-to-zero", {"min_endpoint": 0}),
    (
        "explicit-scale-interval",
        {**SLA, "enable_load_scaling": True, "scheduling": {"scale_interval_seconds": 2.5}},
    ),
    ("global-planner-with-namespace", {"environment": "global-planner", "global_planner_namespace": "gp"}),
    ("power-aware", {"enable_power_awareness": True, "total_gpu_power_limit": 12000}),
    ("report-off", {"report_interval_hours": None}),
    ("sweeping-null", {"pre_deployment_sweeping_mode": None}),
]


@pytest.mark.parametrize("data", [c[1] for c in VALID_CASES], ids=[c[0] for c in VALID_CASES])
def test_valid_configuration_accepted(data: dict[str, Any]) -> None:
    """Configurations that satisfy every rule validate."""
    assert isinstance(parse_config(data).policy, PlannerConfig)


# ---------------------------------------------------------------------------------------------------------
# Immutability and no mutation by validators
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "name"), [("config", "ttft_ms"), ("scheduling", "tick_max_duration_seconds")])
def test_frozen(target: str, name: str) -> None:
    """Assigning to a field of the config or its scheduling section raises."""
    config = PlannerConfig()
    obj = config if target == "config" else config.scheduling
    with pytest.raises(ValidationError):
        setattr(obj, name, 1.0)


def test_validation_does_not_rewrite_flags() -> None:
    """Easy targets change the derived activity, never the stored flags."""
    config = parse_config({"enable_throughput_scaling": True, "enable_load_scaling": False}).policy
    assert (config.enable_throughput_scaling, config.enable_load_scaling) == (True, False)
    assert config.scheduling.scale_interval_seconds is None


# ---------------------------------------------------------------------------------------------------------
# Hash
# ---------------------------------------------------------------------------------------------------------


def test_hash_is_sha256_of_canonical_json() -> None:
    """The hash is sha256 over sorted-key, whitespace-free JSON of the dump."""
    config = PlannerConfig()
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    assert config_hash(config) == hashlib.sha256(canonical.encode()).hexdigest()


def test_hash_ignores_alias_spelling() -> None:
    """Two configs differing only in alias spelling hash the same."""
    by_alias = parse_config(
        {"ttft": 200, "itl": 20, "load_adjustment_interval": 10, "throughput_adjustment_interval": 60}
    ).policy
    by_name = parse_config(
        {
            "ttft_ms": 200.0,
            "itl_ms": 20.0,
            "load_adjustment_interval_seconds": 10,
            "throughput_adjustment_interval_seconds": 60,
        }
    ).policy
    assert config_hash(by_alias) == config_hash(by_name)


def test_hash_stable_across_files(tmp_path: Path) -> None:
    """Loading equal content from YAML and JSON gives the same hash as an explicit default dump."""
    json_path = tmp_path / "p.json"
    json_path.write_text(json.dumps(FILE_DATA), encoding="utf-8")
    assert config_hash(load_config(json_path).policy) == config_hash(
        load_config(write_yaml(tmp_path, FILE_DATA)).policy
    )
    assert config_hash(PlannerConfig()) == config_hash(parse_config({}).policy)


HASH_CHANGES = [
    ("ttft_ms", 501.0),
    ("mode", "agg"),
    ("namespace", "other"),
    ("advisory", True),
    ("scheduling", {"tick_max_duration_seconds": 31}),
    ("load_predictor_warmup_trace", "trace.jsonl"),
]


@pytest.mark.parametrize(("field", "value"), HASH_CHANGES, ids=[f for f, _ in HASH_CHANGES])
def test_hash_changes_with_value(field: str, value: Any) -> None:
    """Changing any value changes the hash."""
    assert config_hash(parse_config({field: value}).policy) != config_hash(PlannerConfig())


SERVICE_CHANGES = [
    ("report_output_dir", "/elsewhere"),
    ("report_interval_hours", 1.0),
    ("report_filename", "r.html"),
    ("report_write_gzip_log", False),
    ("live_dashboard_port", 0),
    ("control_api_port", 1234),
    ("metric_reporting_prometheus_port", 9100),
    ("metric_pulling_prometheus_endpoint", "http://prom:9090"),
    ("log_dir", "/var/log/planner"),
    ("execution_interval_seconds", 11.0),
    ("execution_fallback_poll_seconds", 120.0),
    ("virtual_connector_timeout_seconds", 60.0),
    ("prometheus_arrival_resolution_seconds", 0.5),
    ("plugin_registration", {"a": 1}),
]


@pytest.mark.parametrize(("field", "value"), SERVICE_CHANGES, ids=[f for f, _ in SERVICE_CHANGES])
def test_service_fields_load_flat_and_leave_the_hash_alone(field: str, value: Any) -> None:
    """A service setting is read from the same flat file, lands in `.service`, and never changes the policy hash."""
    loaded = parse_config({"ttft_ms": 300, field: value})
    assert getattr(loaded.service, field) == value
    assert field not in PlannerConfig.model_fields
    assert config_hash(loaded.policy) == config_hash(parse_config({"ttft_ms": 300}).policy)


def test_service_field_errors_name_the_field_as_written() -> None:
    """The split is invisible in messages: a bad service value names the flat field, a typo gets a suggestion."""
    with pytest.raises(ConfigError, match=r"^c.yaml: field 'live_dashboard_port' = 70000: must be <= 65535$"):
        parse_config({"live_dashboard_port": 70000}, source="c.yaml")
    with pytest.raises(ConfigError, match=r"did you mean 'report_output_dir'\?$") as info:
        parse_config({"report_output_dirr": "x"}, source="c.yaml")
    assert info.value.field == "report_output_dirr"


def test_policy_and_service_fields_do_not_overlap() -> None:
    """Every field of the file belongs to exactly one of the two models."""
    assert not set(PlannerConfig.model_fields) & set(ServiceConfig.model_fields)


@pytest.mark.parametrize(
    "model",
    [PlannerConfig, ServiceConfig, SchedulingConfig, EngineLimitsConfig, PluginOverrideConfig, PluginsConfig],
    ids=lambda model: model.__name__,
)
def test_every_field_is_described(model: type[Any]) -> None:
    """The configuration reference is generated from the field descriptions: one line each."""
    missing = [name for name, info in model.model_fields.items() if not info.description or "\n" in info.description]
    assert not missing


# ---------------------------------------------------------------------------------------------------------
# Derived properties
# ---------------------------------------------------------------------------------------------------------

SCALE_INTERVAL_CASES = [
    ("sla-default-5-and-180", {**SLA, "enable_load_scaling": True}, 5.0),
    ("sla-throughput-only-5-and-180", SLA, 5.0),
    (
        "sla-4-and-6",
        {
            **SLA,
            "enable_load_scaling": True,
            "load_adjustment_interval_seconds": 4,
            "throughput_adjustment_interval_seconds": 6,
        },
        2.0,
    ),
    (
        "sla-load-only-ignores-throughput",
        {
            **SLA,
            "enable_throughput_scaling": False,
            "enable_load_scaling": True,
            "load_adjustment_interval_seconds": 4,
            "throughput_adjustment_interval_seconds": 6,
        },
        4.0,
    ),
    (
        "easy-target-load-only",
        {"load_adjustment_interval_seconds": 4, "throughput_adjustment_interval_seconds": 6},
        4.0,
    ),
    ("explicit-wins", {"scheduling": {"scale_interval_seconds": 2.5}}, 2.5),
]


@pytest.mark.parametrize(
    ("data", "expected"), [c[1:] for c in SCALE_INTERVAL_CASES], ids=[c[0] for c in SCALE_INTERVAL_CASES]
)
def test_scale_interval_effective(data: dict[str, Any], expected: float) -> None:
    """The base cadence is the explicit value or the GCD of the active intervals."""
    assert parse_config(data).policy.scale_interval_seconds_effective == expected


@given(load=st.integers(1, 600), extra=st.integers(1, 3600))
def test_derived_scale_interval_divides_active_intervals(load: int, extra: int) -> None:
    """The derived cadence always divides both loop intervals under the sla target."""
    throughput = load + extra
    config = parse_config(
        {
            **SLA,
            "enable_load_scaling": True,
            "load_adjustment_interval_seconds": load,
            "throughput_adjustment_interval_seconds": throughput,
        }
    ).policy
    base = config.scale_interval_seconds_effective
    assert base == math.gcd(load, throughput)
    assert load % base == 0 and throughput % base == 0


LOOP_CASES = [
    ("throughput-forces-load", {"optimization_target": "throughput"}, False, True),
    (
        "latency-forces-load",
        {"optimization_target": "latency", "enable_throughput_scaling": True},
        False,
        True,
    ),
    ("load-target-forces-load", {"optimization_target": "load", **LOAD_THRESHOLDS}, False, True),
    ("sla-default-flags", SLA, True, False),
    ("sla-both", {**SLA, "enable_load_scaling": True}, True, True),
    ("sla-load-only", {**SLA, "enable_throughput_scaling": False, "enable_load_scaling": True}, False, True),
]


@pytest.mark.parametrize(("data", "throughput", "load"), [c[1:] for c in LOOP_CASES], ids=[c[0] for c in LOOP_CASES])
def test_loop_activity(data: dict[str, Any], throughput: bool, load: bool) -> None:
    """Non-sla targets run only the load loop; sla follows the flags."""
    config = parse_config(data).policy
    assert (config.throughput_scaling_active, config.load_scaling_active) == (throughput, load)


def test_min_endpoint_effective() -> None:
    """Role floors override min_endpoint; unset roles fall back to it."""
    config = parse_config({"min_endpoint": 2, "prefill_min_endpoint": 3}).policy
    assert (config.prefill_min_endpoint_effective, config.decode_min_endpoint_effective) == (3, 2)
    zero = parse_config({"min_endpoint": 0, "mode": "agg"}).policy
    assert (zero.prefill_min_endpoint_effective, zero.decode_min_endpoint_effective) == (0, 0)


def test_gpus_per_engine() -> None:
    """Engine GPU width is the configured value or 1."""
    assert (PlannerConfig().prefill_gpus_per_engine, PlannerConfig().decode_gpus_per_engine) == (1, 1)
    config = parse_config({"prefill_engine_num_gpu": 2, "decode_engine_num_gpu": 4}).policy
    assert (config.prefill_gpus_per_engine, config.decode_gpus_per_engine) == (2, 4)


def test_scheduling_config_standalone() -> None:
    """The scheduling section validates on its own with Dynamo's deadline default."""
    assert SchedulingConfig().tick_max_duration_seconds == 30.0
    with pytest.raises(ValidationError):
        SchedulingConfig(scale_interval_seconds=0)
