"""The planner's Prometheus exporter (Dynamo's names) scraped over HTTP, and the Grafana dashboard built on it."""

from __future__ import annotations

import datetime as dt
import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner_core.domain import Loop, TrafficObservation
from planner_core.runtime.localhost import free_port
from planner_core.runtime.metrics import (
    LOAD_DECISION_REASONS,
    PREFIX,
    THROUGHPUT_DECISION_REASONS,
    EngineQueues,
    MetricsSnapshot,
    exported_metric_names,
    load_metrics_snapshot,
    metric_families,
    start_metrics_server,
)
from planner_core.runtime.report import load_report_data, summarise
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store.db import get_engine, session_factory
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.recorded import BUSY, SCENARIO_GPU_HOURS, T0, record_scenario

DASHBOARD = REPO_ROOT / "infra" / "grafana" / "planner-dashboard.json"


@pytest.fixture
def exporter(database_url):
    """A running exporter for deployment `scenario` on a free port; yields a function that scrapes it."""
    port = free_port()
    server, thread = start_metrics_server(port, database_url, "scenario", addr="127.0.0.1", cache_s=0.0)

    def scrape() -> dict[str, object]:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        assert response.status_code == 200
        return {family.name: family for family in text_string_to_metric_families(response.text)}

    yield scrape
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def _value(families, name: str, **labels: str) -> float:
    """The one sample called PREFIX + name (a histogram's `_count` too) with these labels."""
    [sample] = [
        s
        for family in families.values()
        for s in family.samples
        if s.name == PREFIX + name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sample.value


def _state(families, name: str) -> str:
    [current] = [s.labels[PREFIX + name] for s in families[PREFIX + name].samples if s.value == 1]
    return current


# --- pure ---------------------------------------------------------------------------------------------------------


def test_families_of_an_empty_snapshot_declare_everything_and_invent_nothing() -> None:
    """Before any tick every metric is declared; gauges have no sample, the decisions are `unset`, GPU-hours 0."""
    families = {f.name: f for f in metric_families(MetricsSnapshot())}
    assert set(families) == exported_metric_names()
    assert PREFIX + "num_prefill_replicas" in families and PREFIX + "tick_duration_seconds" in families
    assert families[PREFIX + "observed_ttft_ms"].samples == []
    assert families[PREFIX + "engine_queued_prefill_tokens"].samples == []
    assert [s.value for s in families[PREFIX + "gpu_hours"].samples] == [0.0]
    for name, states in (
        ("load_scaling_decision", LOAD_DECISION_REASONS),
        ("throughput_scaling_decision", THROUGHPUT_DECISION_REASONS),
    ):
        samples = families[PREFIX + name].samples
        assert sorted(s.labels[PREFIX + name] for s in samples) == sorted(states)  # exposed in name order
        assert [s.labels[PREFIX + name] for s in samples if s.value == 1] == ["unset"]


def test_a_reason_outside_dynamos_enum_is_shown_not_dropped() -> None:
    """A reason Dynamo's enum lacks becomes one more state, set."""
    families = {f.name: f for f in metric_families(MetricsSnapshot(throughput_scaling_decision="brand_new"))}
    samples = families[PREFIX + "throughput_scaling_decision"].samples
    assert [s.labels[PREFIX + "throughput_scaling_decision"] for s in samples if s.value == 1] == ["brand_new"]
    assert len(samples) == len(THROUGHPUT_DECISION_REASONS) + 1


def test_engine_queues_are_labelled_per_engine() -> None:
    """Per-engine gauges carry worker_id and dp_rank; an engine without a value has no sample."""
    snapshot = MetricsSnapshot(
        engine_queues=(
            EngineQueues(component="prefill", worker_id="p-0", dp_rank=0, queued_prefill_tokens=1024),
            EngineQueues(component="decode", worker_id="d-0", dp_rank=1, inflight_decode_kv_tokens=5e4),
        )
    )
    families = {f.name: f for f in metric_families(snapshot)}
    queued = families[PREFIX + "engine_queued_prefill_tokens"].samples
    assert [(s.labels, s.value) for s in queued] == [({"worker_id": "p-0", "dp_rank": "0"}, 1024.0)]
    inflight = families[PREFIX + "engine_inflight_decode_kv_tokens"].samples
    assert [(s.labels, s.value) for s in inflight] == [({"worker_id": "d-0", "dp_rank": "1"}, 5e4)]


# --- scraped over HTTP from recorded ticks -----------------------------------------------------------------------


def test_scrape_before_and_after_ticks_are_recorded(database_url, tmp_path, profile_dir, exporter) -> None:
    """The exporter shows nothing invented before the first tick, then the newest recorded outcomes."""
    before = exporter()
    assert before[PREFIX + "num_prefill_replicas"].samples == []
    assert _state(before, "throughput_scaling_decision") == "unset"

    scenario = record_scenario(database_url, tmp_path)
    families = exporter()
    newest = scenario.third  # throughput at T0 + 120 s, saw 3P/2D after BUSY traffic
    # workers the newest tick saw (reported by the orchestrator)
    assert (_value(families, "num_prefill_replicas"), _value(families, "num_decode_replicas")) == (3, 2)
    # 6000 requests over 60 s = 100 req/s; ISL 3000, OSL 300; TTFT 150 ms and ITL 12 ms as observed
    assert _value(families, "observed_requests_per_second") == pytest.approx(100.0)
    assert _value(families, "observed_input_sequence_tokens") == BUSY.isl
    assert _value(families, "observed_output_sequence_tokens") == BUSY.osl
    assert (_value(families, "observed_ttft_ms"), _value(families, "observed_itl_ms")) == (150.0, 12.0)
    prediction = newest.outcome.prediction
    assert _value(families, "predicted_requests_per_second") == pytest.approx(prediction.num_req / 60)
    assert _value(families, "predicted_input_sequence_tokens") == pytest.approx(prediction.isl)
    proposals = {p.component.value: p.desired for p in newest.outcome.proposals}
    assert _value(families, "predicted_num_prefill_replicas") == proposals["prefill"]
    assert _value(families, "predicted_num_decode_replicas") == proposals["decode"]
    # engine capacity: one engine's tokens/s under the SLA over the forecast length
    capacity = {s.component.value: s.value for s in newest.outcome.steps if s.step == "capacity"}
    assert _value(families, "engine_prefill_capacity_requests_per_second") == pytest.approx(
        capacity["prefill"] / prediction.isl
    )
    assert _value(families, "engine_decode_capacity_requests_per_second") == pytest.approx(
        capacity["decode"] / prediction.osl
    )
    assert (_value(families, "sla_target_ttft_ms"), _value(families, "sla_target_itl_ms")) == (200, 10)
    assert _state(families, "throughput_scaling_decision") == newest.outcome.reason.value
    assert _state(families, "load_scaling_decision") == "disabled"  # the load loop is off in the scenario config
    # the same GPU-hours as the report, and as worked out by hand in tests/runtime/recorded.py
    assert _value(families, "gpu_hours") == pytest.approx(SCENARIO_GPU_HOURS)
    with session_factory(database_url).begin() as session:
        assert summarise(load_report_data(session, "scenario")).gpu_hours == pytest.approx(SCENARIO_GPU_HOURS)
    # four ticks recorded, each decided in well under 2.5 s
    assert _value(families, "tick_duration_seconds_count") == 4
    assert _value(families, "tick_duration_seconds_bucket", le="2.5") == 4
    assert families[PREFIX + "engine_queued_prefill_tokens"].samples == []  # no forward-pass metrics recorded
    assert _value(families, "tick_lag_seconds") > 0  # recorded (wall clock, now) long after T0 (2026-03-01)


def test_signal_health_is_exported_from_the_newest_tick(database_url, tmp_path, profile_dir, exporter) -> None:
    """After the scenario every signal is fresh; a throughput tick 60 s later without a traffic window shows the
    traffic's age (60 s) and a miss streak of 1, the worker counts still fresh."""
    record_scenario(database_url, tmp_path)
    families = exporter()
    assert _value(families, "signal_miss_streak", signal="traffic") == 0
    assert _value(families, "signal_age_seconds", signal="traffic") == 0
    config = write_config(tmp_path, prefill_engine_num_gpu=2, max_gpu_budget=32, ttft_ms=200, itl_ms=10)
    ctx = load_context(database_url, "scenario", config)
    run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(seconds=180), None)
    families = exporter()
    assert _value(families, "signal_miss_streak", signal="traffic") == 1
    assert _value(families, "signal_age_seconds", signal="traffic") == 60
    assert (_value(families, "signal_miss_streak", signal="workers"), _value(families, "signal_age_seconds",
                                                                             signal="workers")) == (0, 0)  # fmt: skip


def test_a_tick_sized_by_engine_capacity_shows_its_capacity(database_url, tmp_path, profile_dir) -> None:
    """`throughput_algorithm: engine_capacity` records `engine_capacity` steps (requests/s per engine), not
    `capacity` (tokens/s); the exporter and the report both read it through `tick_summary`."""
    config = write_config(tmp_path, throughput_algorithm="engine_capacity")
    ctx = load_context(database_url, "ecap", config)
    traffic = TrafficObservation(duration_s=60, num_req=3000, isl=3000, osl=300)
    result = run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), traffic)
    assert result.outcome is not None and result.outcome.prediction is not None
    steps = result.outcome.steps
    engine_rps = {s.component.value: s.value for s in steps if s.step == "engine_capacity"}
    assert set(engine_rps) == {"prefill", "decode"} and min(engine_rps.values()) > 0
    assert not [s for s in steps if s.step == "capacity" and s.value is not None]  # the old query found nothing
    prediction = result.outcome.prediction
    with ctx.sessions.begin() as session:
        snapshot = load_metrics_snapshot(session, "ecap")
        [row] = load_report_data(session, "ecap").ticks
    # the exporter shows the searched requests/s per engine as recorded
    assert snapshot.engine_prefill_capacity_requests_per_second == engine_rps["prefill"]
    assert snapshot.engine_decode_capacity_requests_per_second == engine_rps["decode"]
    # the report's tokens/s per engine: requests/s times the forecast ISL (prefill) or OSL (decode)
    assert row.prefill_engine_tokens_per_s == pytest.approx(engine_rps["prefill"] * prediction.isl, rel=1e-12)
    assert row.decode_engine_tokens_per_s == pytest.approx(engine_rps["decode"] * prediction.osl, rel=1e-12)
    get_engine(database_url).dispose()


# --- the Grafana dashboard -----------------------------------------------------------------------------------------

_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are not functions, keywords, labels or variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', "", expr)  # string literals
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)  # Grafana variables ($__rate_interval, ${datasource})
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", expr):
        word, call = match.group(1), match.group(2)
        if call is None and word not in _PROMQL_WORDS:
            names.add(word)
    return names


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("dynamo_planner_gpu_hours", {"dynamo_planner_gpu_hours"}),
        (
            'histogram_quantile(0.99, sum by (le) (rate(x_bucket{job="p", le!="1"}[$__rate_interval])))',
            {"x_bucket"},
        ),
        ("a == 1", {"a"}),
        ("rate(a_sum[5m]) / on (job) rate(a_count[5m]) * 3600", {"a_sum", "a_count"}),
        ("deriv(g[15m]) * 3.6e3 offset 1h", {"g"}),
    ],
    ids=["bare", "histogram", "comparison", "binary-on", "offset"],
)
def test_promql_metric_names(expr, expected) -> None:
    """The dashboard check finds exactly the metrics an expression selects."""
    assert promql_metric_names(expr) == expected


def test_dashboard_uses_only_exported_metrics_and_shows_them_all(database_url, tmp_path, profile_dir, exporter) -> None:
    """Every PromQL expression of the dashboard names only metrics the exporter serves, and each metric is shown."""
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert expressions and all(expr.strip() for expr in expressions)
    record_scenario(database_url, tmp_path)
    families = exporter()
    served = set(families) | {sample.name for family in families.values() for sample in family.samples}
    # a counter's samples are `<name>_total`, served once it has one (the plugin counters need external plugins)
    served |= {name + "_total" for name, family in families.items() if family.type == "counter"}
    used = set().union(*(promql_metric_names(expr) for expr in expressions))
    assert used - served == set(), "dashboard expressions name metrics the exporter does not serve"
    suffix = "(_bucket|_sum|_count|_total)?"
    shown = {name for name in families if any(re.search(rf"\b{name}{suffix}\b", e) for e in expressions)}
    assert shown == exported_metric_names()
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {"${datasource}"}
