"""`planner live` stopped by Ctrl-C or SIGTERM while its traffic runs: the run in flight is marked cancelled, every
component it started (Dynamo's frontend and mocker engines, Prometheus, `planner serve` and its Prefect server, the
ingest, aiperf, the run's Postgres) is stopped, and the command exits 0.

A live run brings up Dynamo's runtime and aiperf: a minute or two per signal on a 2-core machine, so it runs only
with PLANNER_LIVE_TESTS=1 (`make test-live`), which builds the Dynamo and aiperf environments and the model folder
first; without them it says which is missing instead of passing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner_core.lab.live import find_tools
from planner_core.lab.live.stack import LiveError
from tests.conftest import REPO_ROOT
from tests.runtime.lifecycle import STOP_SIGNAL_IDS, STOP_SIGNALS, start_command, stop_with

pytestmark = pytest.mark.skipif(
    not os.environ.get("PLANNER_LIVE_TESTS"),
    reason="minutes with Dynamo's frontend, mocker engines and aiperf: run `make test-live` (PLANNER_LIVE_TESTS=1)",
)


def _processes_naming(folder: Path, *, besides: int) -> list[str]:
    """The command lines of the running processes other than `besides` that name `folder` (every component of a run
    does: its logs, discovery store, config or database are under it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == besides:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if str(folder) in argv:
            found.append(f"{entry.name}: {argv[:200]}")
    return found


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_a_signal_cancels_the_run_in_flight_stops_its_stack_and_exits_0(tmp_path, sig) -> None:
    try:
        find_tools()
    except LiveError as exc:
        pytest.fail(f"this test needs the live environment: {exc}")
    out = tmp_path / "live"
    args = [
        "live", "--out", str(out), "--fixed-only", "--fixed-size", "1:1", "--duration-s", "120", "--cooldown-s", "5",
        "--nice", "0", "--speedup", "6", "--keep-every", "9", "--slowdown", "8",  # a light load: the stop is tested
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}

    def traffic_running(_log: str) -> bool:  # aiperf started: the whole stack is up and serving
        return any(out.glob("*/logs/aiperf.log"))

    with start_command(args, env=env, log_path=tmp_path / "live.log", ready=traffic_running, timeout_s=400) as command:
        assert _processes_naming(out, besides=command.process.pid), "the run's components are not found by folder"
        returncode = stop_with(command, sig, timeout_s=180)
    log = command.log()
    assert returncode == 0, log[-3000:]
    [run_dir] = [path.parent for path in out.glob("*/cancelled.json")]
    assert f"planner live: stopped; run {run_dir.name} cancelled ({run_dir / 'cancelled.json'})" in log, log[-3000:]
    assert json.loads((run_dir / "cancelled.json").read_text())["run"] == run_dir.name
    assert not (run_dir / "figures.json").exists()  # `--summarize` leaves the run out
    # the engines, the servers, aiperf and the run's Postgres: all stopped
    assert _processes_naming(out, besides=command.process.pid) == [], log[-3000:]
    assert "Traceback" not in log, log[-3000:]
