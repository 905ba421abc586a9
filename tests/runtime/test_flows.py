"""The Prefect layer against a real Prefect server (the test harness, started once per session): the demo flow, the
report and replay flows, and the example gRPC plugin in the demo. `serve`'s deployments, schedules and stopping are
in tests/runtime/test_flows_serve.py (apart so that pytest's workers share the two files' minutes)."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from planner_core.runtime.localhost import free_port
from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.demo_runs import decisions, kept_oracle_answers, prefect_artifacts, rows, run_demo

pytestmark = pytest.mark.prefect


def test_the_demo_records_the_budget_warning_it_printed(
    prefect_api_url, database_url, tmp_path, azure_conv_trace, profile_dir
) -> None:
    """A GPU budget that leaves no room above the minimums is a warning, not an error: `planner demo` prints it at
    start, and the run records it in the audit log as `serve` does (`config_warning`)."""
    from planner_core.config import load_config
    from planner_core.planner import budget_warnings

    config = write_config(tmp_path, max_gpu_budget=2)
    expected = budget_warnings(load_config(config).policy, config)
    assert expected  # the budget above does leave no room
    run_demo(database_url, config, azure_conv_trace, "budget-warned", max_windows=1)
    recorded = rows(
        database_url,
        "SELECT detail->>'warning' FROM audit_log WHERE event = 'config_warning' AND detail->>'deployment' = %s",
        "budget-warned",
    )
    assert [warning for (warning,) in recorded] == list(expected)


@dataclass(frozen=True, slots=True)
class DemoRun:
    """A demo run to 6 windows ("flow-demo", reports under `folder`/planner_reports) on a database of its own."""

    database_url: str
    folder: Path
    summary: dict


@pytest.fixture(scope="module")
def flow_demo(
    prefect_api_url, postgres_server_url, template_database, tmp_path_factory, azure_conv_trace
) -> Iterator[DemoRun]:
    """The one 6-window demo run the tick, report and GPU-hours checks below read (two tests each made the same
    run before)."""
    from tests.runtime.databases import create_database, drop_database

    url = create_database(postgres_server_url, template_database)
    folder = tmp_path_factory.mktemp("flow-demo")
    config = write_config(folder, report_output_dir="planner_reports")
    yield DemoRun(url, folder, run_demo(url, config, azure_conv_trace, "flow-demo", max_windows=6))
    drop_database(postgres_server_url, url)


def test_demo_flow_records_ticks_as_prefect_task_runs(flow_demo: DemoRun) -> None:
    """Each demo tick is a Prefect task run; the tick rows carry the flow and task run ids."""
    database_url, summary = flow_demo.database_url, flow_demo.summary
    assert summary["num_ticks"] == 6 and summary["num_windows"] == 6
    ticks = rows(database_url, "SELECT flow_run_id, task_run_id FROM ticks ORDER BY id")
    assert len(ticks) == 6
    assert len({flow_run for flow_run, _ in ticks}) == 1 and all(task_run for _, task_run in ticks)

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    async def task_run_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="throughput-tick"))
            )
            return [run.name for run in runs]

    names = asyncio.run(task_run_names())
    assert len([n for n in names if n.startswith("throughput-tick 2023-11-16")]) >= 6
    # every decision was executed and acknowledged by the simulated orchestrator
    assert summary["num_decisions"] >= 1
    assert {status for *_, status in decisions(database_url, "flow-demo")} == {"acknowledged"}
    # the demo ends with its report (config-relative report_output_dir) and an artifact linking it
    report = Path(summary["report_path"])
    assert report.parent == flow_demo.folder / "planner_reports"
    assert report.name.startswith("planner_report_flow-demo_20231116_")  # the deployment, then the run's end
    assert report.read_text().count('data-chart="') == 17
    [artifact] = prefect_artifacts("planner-report-flow-demo")
    assert report.resolve().as_uri() in artifact.data and artifact.flow_run_id is not None


def test_report_flow_writes_the_report_and_links_it(
    prefect_api_url, database_url, tmp_path, profile_dir, monkeypatch
) -> None:
    """`planner-report` writes the page under report_output_dir and creates a markdown artifact linking it."""
    from flows.report import planner_report
    from tests.runtime.recorded import record_scenario

    monkeypatch.setenv("PLANNER_DATABASE_URL", database_url)  # as the served flows get it

    record_scenario(database_url, tmp_path, deployment="report-flow")
    config = write_config(tmp_path, report_interval_hours=None, report_output_dir="reports")
    result = planner_report(deployment="report-flow", config_path=str(config), until="2026-03-02T00:00:00Z")
    path = Path(result["path"])
    # no interval: every tick before `until`; the name carries the deployment and the window's end
    assert path == tmp_path / "reports" / "planner_report_report-flow_20260302_000000_000.html"
    assert result["num_charts"] == 17 and path.read_text().count('data-chart="') == 17
    assert (tmp_path / "reports" / "planner_report_report-flow_20260302_000000_000.log.jsonl.gz").exists()
    [artifact] = prefect_artifacts("planner-report-report-flow")
    assert artifact.type == "markdown" and path.resolve().as_uri() in artifact.data
    # a second report of the same period gets the next number, never overwriting the first
    again = planner_report(deployment="report-flow", config_path=str(config), until="2026-03-02T00:00:00Z")
    assert Path(again["path"]).name == "planner_report_report-flow_20260302_000000_001.html"


def test_demo_report_and_metrics_count_the_same_gpu_hours(flow_demo: DemoRun) -> None:
    """One GPU-hours accounting: the demo summary's figure is exactly the report's and the metrics exporter's
    (`planner_core.domain.gpu_hours` over the recorded ticks); the simulator's own figure is reported beside it
    as `simulated_gpu_hours`, equal to the comparison row of this run."""
    from planner_core.runtime.metrics import load_metrics_snapshot
    from planner_core.runtime.report import load_report_data, summarise
    from planner_core.runtime.store.db import session_factory

    summary = flow_demo.summary
    with session_factory(flow_demo.database_url).begin() as session:
        report = summarise(load_report_data(session, "flow-demo"))
        metrics = load_metrics_snapshot(session, "flow-demo")
    assert summary["gpu_hours"] > 0
    assert summary["gpu_hours"] == report.gpu_hours == metrics.gpu_hours
    assert summary["simulated_gpu_hours"] == summary["comparison"][0]["gpu_hours"]
    assert f"{summary['gpu_hours']:.2f}" in Path(summary["report_path"]).read_text()


def test_tick_summary_line_says_targets_why_and_forecast() -> None:
    """The run log's line: the targets, the deciding stage with its numbers (as `decision_history` records them),
    the forecast; a tick without a decision gives its headline reason."""
    from flows.ticks import tick_summary_line
    from planner_core.domain import (
        Component,
        Loop,
        PlannerState,
        Prediction,
        ReasonCode,
        ReplicaProposal,
        ScalingDecision,
        StepName,
        StepRecord,
        TickOutcome,
    )

    steps = (
        StepRecord(step=StepName.DEMAND, component=Component.PREFILL, value=2, reason=ReasonCode.DEMAND_SIZED),
        StepRecord(step=StepName.BURST, component=Component.PREFILL, value=3, reason=ReasonCode.BURST_SIZED),
    )
    proposals = (
        ReplicaProposal(component=Component.PREFILL, current=2, desired=3, reason=ReasonCode.SCALE),
        ReplicaProposal(component=Component.DECODE, current=2, desired=2, reason=ReasonCode.NO_CHANGE),
    )
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=3, num_decode=2),
        next_state=PlannerState(),
        steps=steps,
        proposals=proposals,
        prediction=Prediction(num_req=3512.4, isl=1023.2, osl=231.9),
        reason=ReasonCode.SCALE,
    )
    at = dt.datetime(2023, 11, 16, 18, 16, tzinfo=dt.UTC)
    assert tick_summary_line("prod", Loop.THROUGHPUT, at, outcome) == (
        "prod throughput tick 2023-11-16T18:16:00+00:00: 3P/2D, burst: prefill 2->3: p99 prompt burst needs 3 "
        "(forecast 2); forecast 3512 requests, ISL 1023, OSL 232"
    )
    held = TickOutcome(decision=ScalingDecision(), next_state=PlannerState(), steps=(), reason=ReasonCode.NO_CHANGE)
    assert tick_summary_line("prod", Loop.THROUGHPUT, at, held) == (
        "prod throughput tick 2023-11-16T18:16:00+00:00: no change, no_change"
    )


def test_replay_flow_reproduces_a_recorded_run(
    prefect_api_url, database_url, tmp_path, azure_conv_trace, profile_dir, monkeypatch
):
    """The `replay-ticks` flow replays a recorded run exactly and leaves its result and a progress artifact."""
    from flows.replay import replay_ticks
    from tests.runtime.recording import record_simulated_run

    config = write_config(tmp_path, load_predictor="kalman")
    times = record_simulated_run(database_url, config, azure_conv_trace, "flow-replay", num_windows=8)
    monkeypatch.setenv("PLANNER_DATABASE_URL", database_url)  # the served flow finds its database this way
    result = replay_ticks(
        deployment="flow-replay",
        start=(times[0] - dt.timedelta(hours=1)).isoformat(),
        end=(times[-1] + dt.timedelta(seconds=1)).isoformat(),
    )
    assert (result["ticks"], result["identical"], result["differing"]) == (24, 24, 0)  # 8 throughput + 16 load
    assert rows(database_url, "SELECT num_identical FROM replay_runs WHERE id = %s", result["run_id"]) == [(24,)]

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType

    async def artifact_types() -> set[str]:
        async with get_client() as client:
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress", "table"]))
            )
            return {a.type for a in artifacts if a.description and "replay" in a.description}

    assert asyncio.run(artifact_types()) == {"progress", "table"}


def test_demo_of_the_recommended_policy_replays_exactly_and_equals_the_bench(
    prefect_api_url, database_url, tmp_path, azure_conv_trace
) -> None:
    """`planner demo`'s default, the recommended policy, on 8 windows: its ticks size prefill for the observed bursts
    (every burst step `burst_sized` or `burst_covered`, never `burst_unavailable`), `planner replay` reproduces every
    tick exactly, and the run's figures equal the bench's for the same policy on the same requests (one path)."""
    from planner_core.data import DEFAULT_CONFIG
    from planner_core.lab.demo import starting_size
    from planner_core.lab.sim.bench import PlannerPolicy, run_policy
    from planner_core.lab.sim.des import spec_for_config
    from planner_core.runtime.replay import replay
    from planner_core.runtime.service import load_context
    from planner_core.traces import load_trace

    summary = run_demo(
        database_url, DEFAULT_CONFIG, azure_conv_trace, "recommended", max_windows=8, report_dir=str(tmp_path)
    )
    bursts = rows(
        database_url,
        "SELECT s.reason, count(*) FROM tick_steps s JOIN ticks t ON t.id = s.tick_id "
        "JOIN deployments d ON d.id = t.deployment_id WHERE d.name = 'recommended' AND s.step = 'burst' GROUP BY 1",
    )
    assert sum(n for _, n in bursts) == 8 and {reason for reason, _ in bursts} <= {"burst_sized", "burst_covered"}
    [(num_curves,)] = rows(
        database_url,
        "SELECT count(*) FROM traffic_observations o JOIN ticks t ON t.id = o.tick_id "
        "JOIN deployments d ON d.id = t.deployment_id WHERE d.name = 'recommended' AND o.prompt_tokens_p99_1s > 0",
    )
    assert num_curves == 8  # the curve is stored with every tick
    far = dt.timedelta(days=1)
    start, end = dt.datetime(2023, 11, 16, tzinfo=dt.UTC) - far, dt.datetime(2023, 11, 17, tzinfo=dt.UTC) + far
    replayed = replay(database_url, "recommended", start, end, recorded_config_dir=DEFAULT_CONFIG.parent)
    assert (replayed.num_ticks, replayed.num_identical, replayed.num_differing) == (8, 8, 0)

    ctx = load_context(database_url, "recommended", DEFAULT_CONFIG)
    trace = load_trace(azure_conv_trace).scaled(12.0).head(8 * 60.0)
    assert ctx.perf is not None and ctx.perf.forward_pass_model() is not None
    spec = spec_for_config(ctx.config, profiled_max_kv_tokens=ctx.perf.profiled_max_kv_tokens(), startup_s=120.0)
    with kept_oracle_answers():  # the size the demo above started at, found by the same search
        start = starting_size(ctx, trace, 120.0)
    policy = PlannerPolicy(name="bench", planner=ctx.planner, initial_size=start)
    bench = run_policy(policy, trace, ctx.perf.forward_pass_model(), spec, ttft_ms=500.0, itl_ms=50.0).row
    ours = summary["comparison"][0]
    assert (ours["requests"], ours["sla_attainment"], ours["scaling_events"]) == (
        bench.requests, bench.sla_attainment, bench.scaling_events
    )  # fmt: skip
    # the demo re-applies its decisions at their recorded (epoch) times: equal up to that round trip
    assert ours["gpu_hours"] == pytest.approx(bench.gpu_hours, rel=1e-12)
    assert [row["policy"] for row in summary["comparison"][1:]][1] == "Dynamo's defaults"


# --- the example out-of-process plugin in the demo ---------------------------------------------------------

GRPC_EXAMPLE = REPO_ROOT / "examples" / "grpc-plugin"
GRPC_DEMO_WINDOWS = 5


def _policy_with_plugins(directory: Path, name: str, external_plugins: list[dict]) -> Path:
    """The recommended policy (the demo's default), with these external plugins."""
    import yaml

    from planner_core.data import DEFAULT_CONFIG

    body = yaml.safe_load(DEFAULT_CONFIG.read_text())
    body["profile_results_dir"] = str((DEFAULT_CONFIG.parent / body["profile_results_dir"]).resolve())
    if external_plugins:
        body["scheduling"] = {"external_plugins": external_plugins}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _tick_targets(url: str, deployment: str) -> list[tuple]:
    """Every throughput tick's decision: (scheduled_at, reason, prefill target, decode target)."""
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(
            """SELECT t.scheduled_at, t.reason, d.target_prefill, d.target_decode
                 FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
                 LEFT JOIN decisions d ON d.tick_id = t.id
                WHERE dep.name = %s ORDER BY t.scheduled_at""",
            (deployment,),
        ).fetchall()


def test_the_example_plugin_changes_demo_decisions_and_the_run_replays_without_it(
    prefect_api_url,
    database_url: str,
    azure_conv_trace: Path,
    tmp_path: Path,
) -> None:
    """The example out-of-process plugin (`examples/grpc-plugin/`, a GPU price feed and a price cap) changes the
    demo's decisions through gRPC, and the run replays identically with the plugin process stopped."""
    from planner_core.runtime.replay import replay

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(GRPC_EXAMPLE / "llm_planner_spot_price.py"), "--listen", f"127.0.0.1:{port}",
         "--price", "3.2", "--max-price", "2.5", "--max-prefill", "3"],
        stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None and "serving on" in process.stdout.readline()
        endpoint = f"grpc://127.0.0.1:{port}"
        with_plugin = _policy_with_plugins(
            tmp_path,
            "spot-price",
            [
                {"plugin_id": "spot_price_feed", "plugin_type": "observe", "endpoint": endpoint},
                {"plugin_id": "spot_price_cap", "plugin_type": "constrain", "endpoint": endpoint},
            ],
        )
        run_demo(database_url, with_plugin, azure_conv_trace, "with-plugin", max_windows=GRPC_DEMO_WINDOWS)
    finally:
        process.kill()
        process.wait(timeout=10)
    plain_config = _policy_with_plugins(tmp_path, "plain", [])
    run_demo(database_url, plain_config, azure_conv_trace, "plain", max_windows=GRPC_DEMO_WINDOWS)

    plain, capped = _tick_targets(database_url, "plain"), _tick_targets(database_url, "with-plugin")
    assert len(plain) == len(capped) == GRPC_DEMO_WINDOWS
    # the demo starts at the oracle's 4 prefill engines; the plugin's ceiling (price 3.2 > 2.5) takes it to 3
    assert all(prefill is None or prefill > 3 for _, _, prefill, _ in plain)
    assert capped[0][1:3] == ("scale", 3)
    assert [row for row in capped if row[2] is not None and row[2] > 3] == []
    assert capped != plain

    # every tick saw the price through OBSERVE and the cap through CONSTRAIN, recorded with the tick
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        steps = conn.execute(
            """SELECT ts.step, ts.reason, ts.value FROM tick_steps ts JOIN ticks t ON t.id = ts.tick_id
                 JOIN deployments d ON d.id = t.deployment_id
                WHERE d.name = 'with-plugin' AND ts.step IN ('observation:spot_price_usd_per_gpu_hour',
                                                            'constrain:spot_price_cap')
                  AND ts.reason IN ('observed', 'plugin_overrides')""",
        ).fetchall()
    assert sorted(set(steps)) == [
        ("constrain:spot_price_cap", "plugin_overrides", None),
        ("observation:spot_price_usd_per_gpu_hour", "observed", 3.2),
    ]
    assert len(steps) == 2 * GRPC_DEMO_WINDOWS

    # the plugin process is gone: replay reads its recorded answers
    start = capped[0][0] - dt.timedelta(seconds=1)
    summary = replay(database_url, "with-plugin", start, capped[-1][0] + dt.timedelta(seconds=1))
    expected = (GRPC_DEMO_WINDOWS, GRPC_DEMO_WINDOWS)
    assert (summary.num_ticks, summary.num_identical) == expected, summary.differences
