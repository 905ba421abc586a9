"""The demo stopped, crashed and killed mid-run resumes to the history of an uninterrupted run (against a real
Prefect server, started once per session). Apart from tests/runtime/test_flows.py so that two pytest workers share
the slowest demo runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import REPO_ROOT, write_config
from tests.runtime.demo_runs import decisions, has_ticks, kept_oracle_answers, rows, run_demo

pytestmark = pytest.mark.prefect


@dataclass(frozen=True, slots=True)
class UninterruptedRun:
    """A demo run straight to 6 windows: its decisions (`decisions`) and its summary."""

    decisions: list[tuple]
    summary: dict


@pytest.fixture(scope="module")
def straight_6(
    prefect_api_url, postgres_server_url, template_database, tmp_path_factory, azure_conv_trace
) -> Iterator[UninterruptedRun]:
    """The uninterrupted 6-window run the stopped and the crashed runs are compared with, made once for the module
    on a database of its own (each of the two tests made the same run before)."""
    from tests.runtime.databases import create_database, drop_database

    url = create_database(postgres_server_url, template_database)
    config = write_config(tmp_path_factory.mktemp("straight"))
    summary = run_demo(url, config, azure_conv_trace, "straight", max_windows=6)
    yield UninterruptedRun(decisions=decisions(url, "straight"), summary=summary)
    drop_database(postgres_server_url, url)


def test_resumed_demo_equals_an_uninterrupted_one(
    database_url, tmp_path, azure_conv_trace, profile_dir, straight_6
) -> None:
    """Stopping after 3 windows and resuming to 6 records the same ticks and decisions as one run to 6."""
    config = write_config(tmp_path)
    run_demo(database_url, config, azure_conv_trace, "resumed", max_windows=3)
    resumed = run_demo(database_url, config, azure_conv_trace, "resumed", max_windows=6)
    straight = straight_6.summary
    assert decisions(database_url, "resumed") == straight_6.decisions
    assert resumed["num_ticks"] == straight["num_ticks"] == 6
    assert resumed["gpu_hours"] == pytest.approx(straight["gpu_hours"])
    assert resumed["sla_attainment"] == pytest.approx(straight["sla_attainment"])
    duplicates = rows(
        database_url, "SELECT deployment_id, loop, scheduled_at FROM ticks GROUP BY 1, 2, 3 HAVING count(*) > 1"
    )
    assert duplicates == []


def test_demo_finishes_a_tick_recorded_but_not_executed(
    database_url, tmp_path, azure_conv_trace, profile_dir, straight_6
) -> None:
    """A stop between recording a tick and executing its decision: the resumed run executes it at its own time."""
    from flows.ticks import decide_and_record
    from planner_core.domain import Loop
    from planner_core.lab.demo import epoch as _epoch
    from planner_core.lab.demo import recorded_scale_events, simulate_timeline, starting_size
    from planner_core.runtime.connectors.virtual import VirtualConnectorClient
    from planner_core.runtime.service import load_context
    from planner_core.traces import load_trace

    config = write_config(tmp_path)
    run_demo(database_url, config, azure_conv_trace, "crashed", max_windows=3)
    # Window 4, exactly as the demo loop records it, then a "crash" before the execution task runs.
    ctx = load_context(database_url, "crashed", config)
    trace = load_trace(azure_conv_trace).scaled(12.0)
    with kept_oracle_answers():  # the size the run above found
        start = starting_size(ctx, trace, 120.0)
    cluster = simulate_timeline(ctx, trace, recorded_scale_events(ctx, trace), 240.0, 120.0, start)
    with VirtualConnectorClient(database_url, "crashed") as client:
        counts = cluster.worker_counts()
        client.report_workers(ready_prefill=counts.ready_prefill, ready_decode=counts.ready_decode)
    decide_and_record.fn(ctx, Loop.THROUGHPUT, _epoch(trace, 240.0), cluster.observe(180.0, 240.0, planner=ctx.planner))
    assert [status for *_, status in decisions(database_url, "crashed")][-1] == "pending"

    run_demo(database_url, config, azure_conv_trace, "crashed", max_windows=6)
    assert decisions(database_url, "crashed") == straight_6.decisions


def test_killed_demo_process_resumes_without_loss_or_duplicates(
    prefect_api_url, database_url, tmp_path, azure_conv_trace, profile_dir, straight_6
) -> None:
    """SIGKILL a `planner demo` process mid-run, start it again: same history as an uninterrupted run (the
    module's 6-window one, made in process with the same config and trace)."""
    config = write_config(tmp_path)
    env = dict(os.environ, PREFECT_API_URL=prefect_api_url, PLANNER_DATABASE_URL=database_url)
    command = [
        sys.executable, "-m", "planner_cli.main", "demo", "--trace", str(azure_conv_trace), "--config", str(config),
        "--deployment", "killed", "--max-windows", "6",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        count = rows(database_url, "SELECT count(*) FROM ticks")[0][0] if has_ticks(database_url) else 0
        if count >= 3:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = rows(database_url, "SELECT count(*) FROM ticks")[0][0]
    assert 3 <= killed_at < 6, "the process must be killed mid-run"
    finished = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "ticks recorded 6" in finished.stdout
    assert decisions(database_url, "killed") == straight_6.decisions
