"""Diagnostics reports: figures from recorded ticks (pure), the page from Postgres, rendering in real Chromium."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner_core.domain import Loop
from planner_core.runtime.report import (
    EngineLoadRow,
    ReportData,
    StepRow,
    TickRow,
    UnknownDeployment,
    build_charts,
    cumulative_gpu_hours,
    forecast_pairs,
    generate_report,
    load_report_data,
    mape,
    reason_runs,
    render_html,
    summarise,
)
from planner_core.runtime.store.db import session_factory
from tests.conftest import REPO_ROOT
from tests.runtime.recorded import BUSY, CALM, SCENARIO_GPU_HOURS, T0, record_scenario

CHART_KEYS = [
    # Dynamo's 13, in its order
    "replicas",
    "request_rate",
    "observed_ttft",
    "observed_itl",
    "estimated_ttft",
    "estimated_itl",
    "prefill_load",
    "decode_load",
    "engine_capacity",
    "sequence_lengths",
    "load_decisions",
    "throughput_decisions",
    "gpu_hours",
    # ours
    "forecast_vs_actual",
    "learned_speed",
    "error_budget",
    "reason_timeline",
]
GENERATED_AT = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # Chromium refuses to run as root with its sandbox on
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of a headless-capable Chromium; installed with apt-get when missing (CI starts from a clean machine)."""
    found = shutil.which("chromium")
    if found:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip("chromium is not installed and apt-get is not available to install it")
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it with apt-get needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-q"],
        # wait for a dpkg lock held by another installer instead of failing at once
        ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends", "chromium"],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-2000:]}")
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("apt-get installed chromium but no `chromium` is on PATH")
    return found


def rendered_dom(chromium: str, page: Path, tmp_path: Path) -> str:
    """The page's DOM after Chromium loaded it and its scripts ran (plotly draws on load)."""
    result = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--virtual-time-budget=15000",  # let plotly's deferred drawing finish before the DOM is dumped
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# --- pure: derived series ---------------------------------------------------------------------------------------


def _tick(tick_id: int, at_s: float, loop: Loop = Loop.THROUGHPUT, **fields) -> TickRow:
    return TickRow(tick_id=tick_id, loop=loop, at_s=at_s, lag_s=0.0, reason="no_change", decide_ms=0.1, **fields)


@pytest.mark.parametrize(
    ("ticks", "expected"),
    [
        ([], []),
        # one tick: nothing has run for any time yet
        ([_tick(1, 0, ready_prefill=1, ready_decode=1)], [(0, 0.0)]),
        # 2 GPUs for 1800 s = 1 GPU-h; then 4 GPUs for 900 s = 1 GPU-h more
        (
            [
                _tick(1, 0, ready_prefill=1, ready_decode=1),
                _tick(2, 1800, ready_prefill=2, ready_decode=2),
                _tick(3, 2700, ready_prefill=9, ready_decode=9),
            ],
            [(0, 0.0), (1800, 1.0), (2700, 2.0)],
        ),
        # GPUs per engine weigh the counts: 1*4 + 2*2 = 8 GPUs for 450 s = 1 GPU-h
        (
            [
                _tick(1, 0, ready_prefill=1, ready_decode=2, prefill_gpus_per_engine=4, decode_gpus_per_engine=2),
                _tick(2, 450, ready_prefill=1, ready_decode=1),
            ],
            [(0, 0.0), (450, 1.0)],
        ),
        # a tick without a worker observation is skipped: 2 GPUs from 0 to 3600 = 2 GPU-h
        (
            [
                _tick(1, 0, ready_prefill=1, ready_decode=1),
                _tick(2, 1800),
                _tick(3, 3600, ready_prefill=1, ready_decode=1),
            ],
            [(0, 0.0), (3600, 2.0)],
        ),
    ],
    ids=["none", "one-tick", "piecewise", "gpus-per-engine", "tick-without-workers"],
)
def test_cumulative_gpu_hours(ticks, expected) -> None:
    """Ready GPUs seen at a tick run until the next tick; the sum is in GPU-hours."""
    points = cumulative_gpu_hours(ticks)
    assert [at_s for at_s, _ in points] == [at_s for at_s, _ in expected]
    assert [hours for _, hours in points] == pytest.approx([hours for _, hours in expected])


def test_forecasts_are_paired_with_the_window_they_forecast() -> None:
    """A forecast made at t is scored against the tick at t + window; after a missed tick there is no pair."""
    ticks = [
        _tick(1, 0, window_s=60, observed_num_req=100, predicted_num_req=110, predicted_isl=1, predicted_osl=1),
        _tick(2, 60, window_s=60, observed_num_req=120, predicted_num_req=130, predicted_isl=1, predicted_osl=1),
        # 180: the tick at 120 is missing, so this window (120, 180] is not what tick 2 forecast
        _tick(3, 180, window_s=60, observed_num_req=90, predicted_num_req=95, predicted_isl=1, predicted_osl=1),
        _tick(4, 210, loop=Loop.LOAD),  # load ticks are ignored
        _tick(5, 240, window_s=60, observed_num_req=100),
    ]
    pairs = forecast_pairs(ticks)
    assert [(p.at_s, p.predicted_num_req, p.actual_num_req) for p in pairs] == [(60, 110, 120), (240, 95, 100)]
    # |110 - 120| / 120 = 8.33%, |95 - 100| / 100 = 5%: mean 6.67%
    assert mape((p.predicted_num_req, p.actual_num_req) for p in pairs) == pytest.approx(100 * (10 / 120 + 0.05) / 2)
    assert mape([(5.0, 0.0)]) is None  # an actual of 0 is not scored


def test_reason_runs_merge_consecutive_ticks_only() -> None:
    """Ticks 0-2 say a, tick 3 says b, tick 4 says a again: three runs; a label on two steps of one tick is one."""
    points = [(0, 0.0, "a", "x"), (1, 1.0, "a", ""), (2, 2.0, "a", ""), (3, 3.0, "b", ""), (4, 4.0, "a", "")]
    runs = reason_runs(points)
    assert [(r.label, r.start_s, r.end_s, r.num_ticks) for r in runs] == [
        ("a", 0.0, 2.0, 3),
        ("b", 3.0, 3.0, 1),
        ("a", 4.0, 4.0, 1),
    ]
    assert runs[0].detail == "x"


# --- pure: figures and page -------------------------------------------------------------------------------------


def _synthetic(engine_loads=()) -> ReportData:
    ticks = tuple(
        _tick(
            i + 1,
            60.0 * i,
            window_s=60,
            observed_num_req=100 + i,
            observed_isl=1000,
            observed_osl=100,
            observed_ttft_ms=50,
            predicted_num_req=100,
            predicted_isl=1000,
            predicted_osl=100,
            ready_prefill=1,
            ready_decode=1,
            expected_prefill=1,
            expected_decode=1,
            ttft_target_ms=200,
            itl_target_ms=10,
            throughput_interval_s=60,
        )
        for i in range(5)
    )
    return ReportData(deployment="synthetic", since_s=None, until_s=None, ticks=ticks, engine_loads=engine_loads)


def test_charts_are_dynamos_thirteen_then_ours() -> None:
    """16 charts in order; what was not recorded is marked, the rest is not."""
    charts = build_charts(_synthetic())
    assert [c.key for c in charts] == CHART_KEYS
    missing = {c.key for c in charts if c.missing}
    # no ITL observed, no per-engine estimates or queues, no capacity steps, no load ticks, no steps at all
    assert missing == {
        "observed_itl",
        "estimated_ttft",
        "estimated_itl",
        "prefill_load",
        "decode_load",
        "load_decisions",
        "engine_capacity",
        "learned_speed",
        "error_budget",
        "reason_timeline",
    }
    for chart in charts:
        notes = [a.text for a in chart.figure.layout.annotations]
        assert any("no data recorded" in n for n in notes) == (chart.key in missing), chart.key


def test_learned_speed_chart_draws_each_pools_closed_loop_steps() -> None:
    steps = tuple(
        StepRow(
            tick_id=i,
            loop=Loop.THROUGHPUT,
            at_s=T0.timestamp() + 60.0 * i,
            seq=1,
            step="capacity_feedback",
            component=pool,
            reason="feedback_learned",
            value=speed,
            detail=f"measured speed {speed}",
        )  # fmt: skip
        for i, (pool, speed) in enumerate([("prefill", 0.9), ("decode", 1.0), ("prefill", 0.85)])
    )
    data = dataclasses.replace(_synthetic(), steps=steps)
    chart = next(c for c in build_charts(data) if c.key == "learned_speed")
    assert chart.missing is None
    traces = {t.name: list(t.y) for t in chart.figure.data}
    assert traces == {"prefill speed": [0.9, 0.85], "decode speed": [1.0]}


def test_error_budget_chart_draws_the_posture_of_each_budget_step() -> None:
    steps = tuple(
        StepRow(
            tick_id=i,
            loop=Loop.THROUGHPUT,
            at_s=T0.timestamp() + 60.0 * i,
            seq=1,
            step="error_budget",
            component=None,
            reason=reason,
            value=posture,
            detail="period: 99.60% within",
        )  # fmt: skip
        for i, (reason, posture) in enumerate(
            [("budget_healthy", 0.25), ("budget_healthy", 0.5), ("budget_burning", 0.0)]
        )
    )
    data = dataclasses.replace(_synthetic(), steps=steps)
    chart = next(c for c in build_charts(data) if c.key == "error_budget")
    assert chart.missing is None
    assert [list(t.y) for t in chart.figure.data] == [[0.25, 0.5, 0.0]]
    assert "budget_burning" in chart.figure.data[0].hovertext[-1]


def test_engine_load_charts_draw_recorded_forward_pass_metrics() -> None:
    """With per-engine queues recorded, the engine-load charts draw one series per engine and queue."""
    loads = (
        EngineLoadRow(
            at_s=0,
            component="prefill",
            worker_id="p0",
            dp_rank=0,
            queued_prefill_tokens=512,
            queued_decode_kv_tokens=None,
            inflight_decode_kv_tokens=None,
        ),
        EngineLoadRow(
            at_s=0,
            component="decode",
            worker_id="d0",
            dp_rank=1,
            queued_prefill_tokens=None,
            queued_decode_kv_tokens=64,
            inflight_decode_kv_tokens=4096,
        ),
    )
    charts = {c.key: c for c in build_charts(_synthetic(engine_loads=loads))}
    assert charts["prefill_load"].missing is None
    assert [t.name for t in charts["prefill_load"].figure.data] == ["p0/0 queued prefill"]
    assert [list(t.y) for t in charts["decode_load"].figure.data] == [[64], [4096]]


def test_page_is_deterministic_and_carries_plotly_once() -> None:
    """Same data, same page; one inlined copy of plotly.js for all 16 charts."""
    data = _synthetic()
    page = render_html(data, generated_at=GENERATED_AT)
    assert page == render_html(data, generated_at=GENERATED_AT)
    assert page.count('data-chart="') == len(CHART_KEYS)
    assert page.count("Plotly.newPlot(") == len(CHART_KEYS)
    # plotly.js declares its version banner once per copy
    assert len(re.findall(r"plotly\.js v\d", page)) == 1
    assert "<script src=" not in page  # nothing loaded from the network: renders offline


def test_gpu_hours_depend_only_on_where_the_count_changed() -> None:
    """`planner_core.domain.gpu_hours` over every observation equals it over the changes and the last one (what
    the metrics exporter reads), exactly; nothing counts before the first or after the last observation."""
    from planner_core.domain import cumulative_gpu_hours, gpu_hours

    every = [(0.0, 2), (60.0, 2), (120.0, 2), (180.0, 5), (240.0, 5), (300.0, 3), (310.0, 3), (360.0, 3)]
    changes = [(0.0, 2), (180.0, 5), (300.0, 3), (360.0, 3)]
    assert gpu_hours(every) == gpu_hours(changes) == pytest.approx((2 * 180 + 5 * 120 + 3 * 60) / 3600)
    assert [t for t, _ in cumulative_gpu_hours(every)] == [t for t, _ in every]
    assert gpu_hours([]) == gpu_hours([(5.0, 8)]) == 0.0


def test_summary_of_synthetic_ticks() -> None:
    """Header figures: 5 ticks, 4 forecasts scored, 2 GPUs for 4 minutes."""
    summary = summarise(_synthetic())
    assert summary.num_ticks == {"throughput": 5, "load": 0}
    # forecast 100 vs actual 101..104: errors 1/101, 2/102, 3/103, 4/104
    assert summary.request_mape_pct == pytest.approx(100 * (1 / 101 + 2 / 102 + 3 / 103 + 4 / 104) / 4)
    assert summary.gpu_hours == pytest.approx(2 * 240 / 3600)
    assert summary.ttft_windows_within_target == (5, 5) and summary.itl_windows_within_target == (0, 0)


# --- from Postgres ----------------------------------------------------------------------------------------------


@pytest.fixture
def scenario(database_url, tmp_path, profile_dir):
    return record_scenario(database_url, tmp_path)


def test_report_data_is_what_the_ticks_recorded(database_url, scenario) -> None:
    """Every tick, its observation, forecast, proposals, capacity and decision, and the decision's lifecycle."""
    with session_factory(database_url).begin() as session:
        data = load_report_data(session, scenario.deployment)
    assert [(t.loop, t.at_s) for t in data.ticks] == [
        (Loop.THROUGHPUT, T0.timestamp()),
        (Loop.LOAD, T0.timestamp() + 60),
        (Loop.THROUGHPUT, T0.timestamp() + 60),
        (Loop.THROUGHPUT, T0.timestamp() + 120),
    ]
    first, load, second, _ = data.ticks
    outcome = scenario.first.outcome
    assert (first.observed_num_req, first.observed_isl, first.observed_ttft_ms) == (BUSY.num_req, BUSY.isl, 150.0)
    assert (first.predicted_num_req, first.predicted_isl) == (outcome.prediction.num_req, outcome.prediction.isl)
    assert (first.target_prefill, first.target_decode) == (outcome.decision.num_prefill, outcome.decision.num_decode)
    assert first.decision_status == "acknowledged" and first.reason == "scale"
    capacity = {s.component.value: s.value for s in outcome.steps if s.step == "capacity"}
    assert (first.prefill_engine_tokens_per_s, first.decode_engine_tokens_per_s) == (
        capacity["prefill"],
        capacity["decode"],
    )
    assert (first.ready_prefill, first.ready_decode, load.ready_prefill, load.ready_decode) == (1, 1, 3, 2)
    assert (first.prefill_gpus_per_engine, first.decode_gpus_per_engine) == (2, 1)
    assert (first.ttft_target_ms, first.itl_target_ms, first.throughput_interval_s) == (200, 10, 60)
    assert load.reason == "disabled" and second.observed_num_req == CALM.num_req
    # the decision was applied at T0 and acknowledged 30 s later, in that order
    assert [(e.event, e.at_s - T0.timestamp()) for e in data.decision_events] == [("applied", 0), ("acknowledged", 30)]
    # routine steps are left out; the headline of every tick is there
    assert {s.reason for s in data.steps} >= {"scale", "disabled"}
    assert not {s.reason for s in data.steps} & {"observed", "within_range", "demand_sized"}
    assert summarise(data).gpu_hours == pytest.approx(SCENARIO_GPU_HOURS)


def test_decisions_table_shows_the_numbers_behind_each_decision(database_url, scenario) -> None:
    """A decided tick carries `decision_history.why` (the decision in one line, the deciding stage's numbers first),
    and the decisions table shows it."""
    import psycopg

    from planner_core.runtime.store.db import to_libpq_uri

    with session_factory(database_url).begin() as session:
        data = load_report_data(session, scenario.deployment)
    first = data.ticks[0]
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        [(why,)] = conn.execute("SELECT why FROM decision_history WHERE tick_id = %s", (first.tick_id,)).fetchall()
    assert first.why == why and why.startswith("prefill 1->4: forecast needs 4")
    assert all(t.why is None for t in data.ticks if t.decision_id is None)
    page = render_html(data, generated_at=GENERATED_AT, charts=[])
    assert f"<td>{why.replace('>', '&gt;')}</td>" in page


@pytest.mark.parametrize(
    ("since_s", "until_s", "expected_offsets_s"),
    [
        (None, None, [0, 60, 60, 120]),
        (60, None, [60, 60, 120]),  # since is included
        (None, 60, [0]),  # until is excluded: consecutive periods never share a tick
        (1, 120, [60, 60]),
    ],
    ids=["all", "since", "until", "both"],
)
def test_report_window_is_half_open(database_url, scenario, since_s, until_s, expected_offsets_s) -> None:
    """[since, until) on the ticks' scheduled times."""

    def at(offset_s):
        return None if offset_s is None else T0 + dt.timedelta(seconds=offset_s)

    with session_factory(database_url).begin() as session:
        data = load_report_data(session, scenario.deployment, at(since_s), at(until_s))
    assert [t.at_s - T0.timestamp() for t in data.ticks] == expected_offsets_s


def test_unknown_deployment_is_named(database_url, scenario) -> None:
    """A deployment that never recorded anything is a one-line error listing the known ones."""
    with session_factory(database_url).begin() as session, pytest.raises(UnknownDeployment) as error:
        load_report_data(session, "nope")
    assert str(error.value) == "deployment 'nope': not found in the database (known: scenario)"


def test_report_renders_in_headless_chromium(database_url, scenario, chromium, tmp_path) -> None:
    """The written page renders all 16 charts in a real browser, "no data recorded" notes included."""
    out = tmp_path / "reports" / "report.html"
    with session_factory(database_url).begin() as session:
        written = generate_report(session, scenario.deployment, out, generated_at=GENERATED_AT, write_log=True)
    assert written.num_charts == len(CHART_KEYS) and out.stat().st_mode & 0o777 == 0o644
    dom = rendered_dom(chromium, out, tmp_path)
    # each chart container holds a plotly div that plotly.js drew into (an SVG of class main-svg)
    sections = re.split(r'<div class="chart[^"]*" data-chart="', dom)[1:]
    assert [s.split('"', 1)[0] for s in sections] == CHART_KEYS
    for key, section in zip(CHART_KEYS, sections, strict=True):
        assert 'class="main-svg"' in section, f"chart {key} was not drawn"
    assert dom.count('class="main-svg"') >= 15
    # notes are drawn as SVG text: one per chart whose data was not recorded (estimates and queues at least)
    with session_factory(database_url).begin() as session:
        missing = [c.key for c in build_charts(load_report_data(session, scenario.deployment)) if c.missing]
    assert {"estimated_ttft", "estimated_itl", "prefill_load", "decode_load"} <= set(missing)
    drawn = re.findall(r'class="annotation-text"[^>]*data-unformatted="&lt;b&gt;no data recorded', dom)
    assert len(drawn) == len(missing)
    rows = [json.loads(line) for line in gzip.decompress(written.log_path.read_bytes()).decode().splitlines()]
    assert [row["tick_id"] for row in rows] == [
        t.tick_id for t in (scenario.first, scenario.load, scenario.second, scenario.third)
    ]


def test_report_is_small_and_loads_plotly_from_one_copy_beside_it(database_url, scenario, tmp_path) -> None:
    """A written page references plotly.js beside it (written once per folder) instead of carrying 4.8 MB itself;
    `self_contained` inlines it. (The Chromium test above renders such a page offline from its file.)"""
    from planner_core.runtime.report import plotly_js_name

    folder = tmp_path / "reports"
    with session_factory(database_url).begin() as session:
        first = generate_report(session, scenario.deployment, folder / "a.html", generated_at=GENERATED_AT)
        bundled = folder / plotly_js_name()
        written_ns = bundled.stat().st_mtime_ns
        generate_report(session, scenario.deployment, folder / "b.html", generated_at=GENERATED_AT)
        whole = generate_report(
            session, scenario.deployment, tmp_path / "whole" / "c.html", generated_at=GENERATED_AT, self_contained=True
        )
    page = first.path.read_text()
    assert first.path.stat().st_size < 300_000 and bundled.stat().st_size > 3_000_000
    assert f'<script src="{plotly_js_name()}"' in page and not re.findall(r"plotly\.js v\d", page)
    assert bundled.stat().st_mtime_ns == written_ns  # the second report reuses the copy
    assert sorted(p.name for p in folder.iterdir()) == ["a.html", "b.html", plotly_js_name()]
    assert whole.path.stat().st_size > 3_000_000 and not (tmp_path / "whole" / plotly_js_name()).exists()


def test_periodic_report_names_carry_the_deployment() -> None:
    """Two deployments' reports of one period in one folder get different names (the name sanitised)."""
    from planner_core.runtime.report import periodic_report_path

    until = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
    folder = Path("/reports")
    assert periodic_report_path(folder, until, deployment="llama-70b") == Path(
        "/reports/planner_report_llama-70b_20260302_000000_000.html"
    )
    assert periodic_report_path(folder, until, deployment="team a/llama 70b").name == (
        "planner_report_team-a-llama-70b_20260302_000000_000.html"
    )
    assert periodic_report_path(folder, until, deployment="../..").name.startswith("planner_report_deployment_")
    assert periodic_report_path(folder, until, "{deployment}.html", deployment="a/b") == Path("/reports/a-b.html")


def test_reports_default_under_the_data_folder(tmp_path) -> None:
    """Without `report_output_dir` in the config, reports go to <PLANNER_DATA_DIR>/reports; with it, to that folder
    relative to the config file."""
    from planner_core.config import load_config
    from planner_core.runtime.service import resolve_report_dir
    from tests.conftest import write_config

    data_dir = tmp_path / "data"
    unset = write_config(tmp_path)
    assert resolve_report_dir(load_config(unset).service, unset, data_dir) == data_dir / "reports"
    given = write_config(tmp_path, report_output_dir="out/reports")
    assert resolve_report_dir(load_config(given).service, given, data_dir) == tmp_path / "out" / "reports"


def planner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_command(database_url, scenario, tmp_path) -> None:
    """`planner report` writes the page for a window and says what it holds; bad input writes nothing."""
    out = tmp_path / "cli" / "r.html"
    env = {"PLANNER_DATABASE_URL": database_url}
    since = (T0 + dt.timedelta(seconds=60)).isoformat()
    result = planner("report", "--deployment", "scenario", "--since", since, "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    num_decisions = sum(not r.outcome.decision.is_empty for r in (scenario.load, scenario.second, scenario.third))
    # from T0 + 60 s: 8 ready GPUs for 60 s = 0.13 GPU-hours
    expected = f"{out}: {len(CHART_KEYS)} charts, 3 ticks, {num_decisions} decisions, 0.13 GPU-hours"
    assert result.stdout.splitlines() == [expected]
    assert out.read_text().count('data-chart="') == len(CHART_KEYS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "planner: error: --since = 'yesterday': expected an ISO 8601 time"),
        (["--deployment", "nope"], "planner: error: --deployment = 'nope': no such deployment (known: scenario)"),
        (["--since", "2026-03-02", "--until", "2026-03-01"], "planner: error: --since '2026-03-02' is not before"),
    ],
    ids=["bad-time", "unknown-deployment", "empty-window"],
)
def test_report_command_bad_input(database_url, scenario, tmp_path, monkeypatch, capsys, args, message) -> None:
    """Bad input: exit 2 with one line naming the option or deployment, and no file written."""
    from planner_cli.main import main

    monkeypatch.setenv("PLANNER_DATABASE_URL", database_url)
    bad = tmp_path / "bad.html"
    assert main(["report", *args, "--out", str(bad)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("planner: error:")]
    assert len(errors) == 1 and errors[0].startswith(message)
    assert not bad.exists() and not list(tmp_path.glob(".bad.html*"))


@pytest.mark.parametrize(
    ("since", "until", "interval_hours", "expected"),
    [
        # scheduled run: the period before the scheduled time
        (None, None, 24.0, ("2026-03-01T00:00:00+00:00", "2026-03-02T00:00:00+00:00")),
        (None, "2026-03-01T12:00:00Z", 6.0, ("2026-03-01T06:00:00+00:00", "2026-03-01T12:00:00+00:00")),
        ("2026-02-01", None, 24.0, ("2026-02-01T00:00:00+00:00", "2026-03-02T00:00:00+00:00")),
        (None, None, None, (None, "2026-03-02T00:00:00+00:00")),  # no interval: everything before
        ("7d", "12h", 24.0, ("2026-02-23T00:00:00+00:00", "2026-03-01T12:00:00+00:00")),  # spans: back from the run
    ],
    ids=["scheduled", "until", "since", "no-interval", "spans"],
)
def test_report_flow_window(since, until, interval_hours, expected) -> None:
    """[since, until) of a report run: given bounds win, else the period of report_interval_hours before the run."""
    from flows.report import report_window

    start, end = report_window(since, until, interval_hours, dt.datetime(2026, 3, 2, tzinfo=dt.UTC))
    assert (start.isoformat() if start else None, end.isoformat()) == expected
