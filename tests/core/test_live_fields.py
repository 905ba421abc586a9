"""`LIVE_FIELDS` and `live_changes` (planner_core/config/live.py): what a live retune may change, pure."""

from __future__ import annotations

import pytest

from planner_core.config import LIVE_FIELDS, ConfigError, PlannerConfig, live_changes, parse_config

BASE = {"optimization_target": "sla", "environment": "virtual", "model_name": "m", "ttft_ms": 200, "itl_ms": 10}


def _policy(**overrides: object) -> PlannerConfig:
    return parse_config({**BASE, **overrides}).policy


def test_every_live_field_is_a_policy_field() -> None:
    """A misspelt name would make a field silently not live."""
    assert LIVE_FIELDS <= set(PlannerConfig.model_fields)
    assert {"ttft_ms", "itl_ms", "max_gpu_budget", "min_endpoint", "throughput_horizon_quantile"} <= LIVE_FIELDS
    assert not {"mode", "environment", "backend", "profile_results_dir", "load_predictor"} & LIVE_FIELDS


def test_live_changes_lists_each_changed_field_before_and_after() -> None:
    before = _policy()
    after = _policy(ttft_ms=100, max_gpu_budget=12, prefill_min_endpoint=2)
    assert live_changes(before, after, "src") == {
        "ttft_ms": [200.0, 100.0],
        "max_gpu_budget": [8, 12],
        "prefill_min_endpoint": [None, 2],
    }
    assert live_changes(before, _policy(ttft_ms=200.0), "src") == {}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"mode": "agg"}, "mode"),
        ({"environment": "local"}, "environment"),
        ({"throughput_adjustment_interval_seconds": 30}, "throughput_adjustment_interval_seconds"),
        ({"load_predictor": "kalman"}, "load_predictor"),
        ({"advisory": True}, "advisory"),
    ],
)
def test_a_field_that_cannot_change_live_is_refused_in_one_line(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        live_changes(_policy(), _policy(ttft_ms=100, **overrides), "planner config set")
    message = str(raised.value)
    assert message.startswith(f"planner config set: field '{field}' = ") and "cannot change live" in message
    assert "\n" not in message and raised.value.field == field
