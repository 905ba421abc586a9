"""`planner serve` against a real Prefect server: the deployments it builds from the config, their schedules run
by the serving process (ticks, executions on NOTIFY, metrics), a bad config refused before Prefect starts, and a
signal pausing the schedules and stopping the server it started. Apart from tests/runtime/test_flows.py (the demo,
report and replay flows) so that pytest's workers share the two files' minutes."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner_core.runtime.localhost import free_port
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.demo_runs import has_ticks, prefect_artifacts, rows
from tests.runtime.lifecycle import STOP_SIGNAL_IDS, STOP_SIGNALS, start_command, stop_with

pytestmark = pytest.mark.prefect


def test_deployments_take_schedules_from_the_config(tmp_path, profile_dir) -> None:
    """The tick deployments have the config's intervals, no overlap, load-tick paused when off; replay on demand."""
    from flows.serve import build_deployments
    from planner_core.config import load_config

    path = write_config(tmp_path, throughput_adjustment_interval_seconds=120, execution_interval_seconds=7)
    built = build_deployments(load_config(path), str(path), "prod")
    assert {d.name for d in built} == {"prod"}  # named after the managed deployment, one per flow
    deployments = {d.flow_name: d for d in built}
    assert set(deployments) == {"throughput-tick", "load-tick", "execute-decisions", "planner-report", "replay-ticks"}
    replay = deployments.pop("replay-ticks")
    assert replay.schedules in (None, [])  # run on demand from the UI
    assert replay.parameters == {"deployment": "prod", "config_dir": str(path.parent)}
    # no 10 s poll: the serving process runs it on each decision's NOTIFY (tests/runtime/test_execution_listener.py)
    assert deployments["execute-decisions"].schedules in (None, [])
    intervals = {name: d.schedules[0].schedule.interval for name, d in deployments.items() if d.schedules}
    assert intervals == {
        "throughput-tick": dt.timedelta(seconds=120),
        "load-tick": dt.timedelta(seconds=5),
        "planner-report": dt.timedelta(hours=24),  # report_interval_hours' default
    }
    for deployment in deployments.values():
        assert deployment.concurrency_limit == 1
        assert deployment.concurrency_options.collision_strategy.value == "CANCEL_NEW"
        assert deployment.parameters == {"deployment": "prod", "config_path": str(path)}
    assert deployments["load-tick"].paused is True
    assert deployments["throughput-tick"].paused is False


def test_report_deployment_without_an_interval_runs_on_demand_only(tmp_path, profile_dir) -> None:
    """With report_interval_hours unset the report deployment exists without a schedule."""
    from flows.serve import build_deployments
    from planner_core.config import load_config

    path = write_config(tmp_path, report_interval_hours=None)
    [report] = [d for d in build_deployments(load_config(path), str(path), "prod") if d.flow_name == "planner-report"]
    assert report.schedules in (None, [])


def test_served_deployments_run_on_schedule(prefect_api_url, database_url, tmp_path, azure_conv_trace, profile_dir):
    """`serve` runs throughput ticks on their interval; each records once, and decisions get executed.

    With `metric_reporting_prometheus_port` set, the serving process exports what the flow runs recorded.
    """

    metrics_port = free_port()
    config = write_config(
        tmp_path,
        throughput_adjustment_interval_seconds=5,
        load_adjustment_interval_seconds=1,
        execution_interval_seconds=5,
        metric_reporting_prometheus_port=metrics_port,
        throughput_prefill_burst_sizing=True,
    )
    env = dict(
        os.environ,
        PREFECT_API_URL=prefect_api_url,
        PLANNER_DATABASE_URL=database_url,
        PLANNER_TRACE=str(azure_conv_trace),
    )
    code = (
        "from pathlib import Path; from flows.serve import serve_deployments; "
        f"serve_deployments(Path({str(config)!r}), 'served')"
    )
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 150
        ticks = []
        while time.monotonic() < deadline and len(ticks) < 3:
            time.sleep(1)
            if has_ticks(database_url):
                ticks = rows(
                    database_url,
                    "SELECT scheduled_at, reason, flow_run_id FROM ticks "
                    "WHERE loop = 'throughput' ORDER BY scheduled_at",
                )
        # a pending decision committed now is executed by the serving process's listener on its NOTIFY, well before
        # the 60 s fallback poll (the replayed windows above may decide no change, so one is recorded here)
        decision_id = _record_pending_decision(database_url, "served")
        executed_by = time.monotonic() + 30
        while rows(database_url, f"SELECT status FROM decisions WHERE id = {decision_id}")[0][0] == "pending":
            assert time.monotonic() < executed_by, "the served deployment's decision was not executed"
            time.sleep(0.2)
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).text
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            returncode = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = None
    log_text = log_path.read_text()
    assert len(ticks) >= 3, log_text[-5000:]
    # SIGTERM stops it cleanly: exit 0, no traceback, no flow run left running, every schedule paused
    assert returncode == 0 and "Traceback" not in log_text, log_text[-5000:]
    deployments, unfinished = _served_state("served")
    assert len(deployments) == 5 and all(paused for _, paused in deployments), deployments
    assert unfinished == [], unfinished
    # every tick logs its decision in one line and leaves a markdown artifact with its numbers
    assert "served throughput tick 20" in log_text
    artifacts = prefect_artifacts("tick-served-throughput")
    assert len(artifacts) >= 3 and all("| step | pool | value | reason | detail |" in a.data for a in artifacts)
    assert all("**Why** " in a.data for a in artifacts)
    times = [t[0] for t in ticks]
    assert len(set(times)) == len(times)
    gaps_s = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    # on the 5 s grid: a run still busy when the next is due makes Prefect cancel the new one (no overlap)
    assert all(gap % 5 == pytest.approx(0, abs=1e-3) for gap in gaps_s), gaps_s
    assert all(flow_run for *_, flow_run in ticks)
    assert {reason for _, reason, _ in ticks} <= {"scale", "no_change"}
    # the flow passed the context's planner to the collect-traffic task: the replayed windows have their
    # prompt-arrival curve, so prefill is sized on the bursts (a window without requests would have none)
    bursts = rows(
        database_url,
        "SELECT s.reason FROM tick_steps s JOIN ticks t ON t.id = s.tick_id "
        "WHERE t.loop = 'throughput' AND s.step = 'burst'",
    )
    assert {"burst_sized", "burst_covered"} & {reason for (reason,) in bursts}, bursts
    # the flow runs (subprocesses) recorded the ticks; the serving process exported them
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    [count] = [s.value for s in families["dynamo_planner_tick_duration_seconds"].samples if s.name.endswith("_count")]
    assert count >= 3
    decision = "dynamo_planner_throughput_scaling_decision"
    [state] = [s.labels[decision] for s in families[decision].samples if s.value == 1]
    assert state in {"scale", "no_change"}


def _record_pending_decision(database_url: str, deployment: str) -> int:
    """Record a tick (of the throughput loop, in 2020: apart from the served ones) whose decision is 3P/3D."""
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import session_factory
    from tests.runtime.databases import record_decision

    class _Sessions:  # what record_decision needs of a context
        sessions = session_factory(database_url)

    with _Sessions.sessions.begin() as session:
        assert repo.find_deployment(session, deployment) is not None
    return record_decision(_Sessions, deployment, dt.datetime(2020, 1, 1, tzinfo=dt.UTC), 3, 3)


def _served_state(name: str) -> tuple[list[tuple[str, bool]], list[tuple[str, str]]]:
    """The served deployments named `name` as (flow/deployment, paused), and their flow runs not in a final state."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    async def read():
        async with get_client() as client:
            found = await client.read_deployments(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name]))
            )
            runs = await client.read_flow_runs(deployment_filter=DeploymentFilter(id={"any_": [d.id for d in found]}))
            return (
                [(f"{d.flow_id}/{d.name}", d.paused) for d in found],
                [(run.name, run.state_type.value) for run in runs if run.state_type.value in ("RUNNING", "PENDING")],
            )

    return asyncio.run(read())


def test_a_bad_config_fails_before_prefect_starts(tmp_path) -> None:
    """`planner serve` checks the config first: one line naming the file and field, exit 2, no Prefect server."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("ttft_ms: -5\n")
    env = dict(os.environ, PLANNER_DATA_DIR=str(tmp_path / "data"))
    env.pop("PREFECT_API_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "serve", "--config", str(bad)],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "bad.yaml: field 'ttft_ms' = -5" in result.stderr and "Prefect UI" not in result.stderr
    assert not (tmp_path / "data" / "prefect").exists()


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_a_signal_to_serve_pauses_the_schedules_stops_its_server_and_exits_0(
    database_url, tmp_path, profile_dir, sig
) -> None:
    """Ctrl-C in a terminal signals the whole foreground process group: `serve` and the Prefect server it started
    (which has a session of its own); SIGTERM comes to `serve` alone. Either way the command pauses every schedule,
    stops its server and exits 0 (Ctrl-C used to exit 3, the server gone before the schedules were paused)."""
    import shutil
    import sqlite3
    import tempfile

    data_dir = Path(tempfile.mkdtemp(prefix="pci", dir="/tmp"))  # short: unix socket paths are limited
    env = dict(os.environ, PLANNER_DATA_DIR=str(data_dir), PLANNER_DATABASE_URL=database_url)
    for name in ("PREFECT_API_URL", "PREFECT_HOME"):  # its own Prefect server and home, as in a user's terminal
        env.pop(name, None)
    # a budget that leaves no GPU above the minimums (1P + 1D): valid, but no pool can ever grow, which serve says
    # at start (before the Prefect server) and records
    config = write_config(tmp_path, profile_results_dir=str(profile_dir), max_gpu_budget=2)
    prefect_db = data_dir / "prefect" / "prefect.db"
    name = f"stop-{sig.name.lower()}"

    def paused() -> list[bool]:
        if not prefect_db.exists():
            return []
        with contextlib.closing(sqlite3.connect(f"file:{prefect_db}?mode=ro", uri=True)) as db:  # never creates it
            return [bool(p) for (p,) in db.execute("SELECT paused FROM deployment WHERE name = ?", (name,))]

    def serving(_log: str) -> bool:
        with contextlib.suppress(sqlite3.Error):
            return len(paused()) == 5  # every deployment served
        return False

    args = ["serve", "--config", str(config), "--port", "0", "--deployment", name]
    try:
        with start_command(args, env=env, log_path=tmp_path / "serve.log", ready=serving) as command:
            time.sleep(3)  # the runner polls its schedules: serving, not starting
            returncode = stop_with(command, sig)
        text = command.log()
        assert returncode == 0, text[-3000:]
        assert "planner serve: stopped; the schedules are paused" in text and "Traceback" not in text
        assert paused() == [True] * 5
        warned = [line for line in text.splitlines() if line.startswith("planner serve: warning: ")]
        assert [("prefill pool cannot scale up" in w, "decode pool cannot scale up" in w) for w in warned] == [
            (True, False),
            (False, True),
        ], text[-3000:]
        assert text.index(warned[-1]) < text.index("Prefect UI: "), text[-3000:]  # at start
        recorded = rows(
            database_url,
            "SELECT detail->>'deployment', detail->>'warning' FROM audit_log "
            "WHERE event = 'config_warning' AND detail->>'deployment' = %s ORDER BY id",
            name,
        )
        assert recorded == [(name, w.removeprefix("planner serve: warning: ")) for w in warned], recorded
        [ui] = re.findall(r"Prefect UI: (http://127\.0\.0\.1:\d+)", text)
        with pytest.raises(httpx.TransportError):  # the command stopped the Prefect server it started
            httpx.get(f"{ui}/api/health", timeout=5)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
