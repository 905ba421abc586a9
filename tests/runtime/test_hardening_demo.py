"""`planner demo` losing what it runs on (issue 21, issue 43): its Prefect server killed, SIGTERM, its database
stopped; each ends in one line, with no traceback and nothing left running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import REPO_ROOT

# ---------------------------------------------------------------------------------------------------------
# Prefect lost mid-run: `planner demo` ends in one line with a non-zero status, within the configured time
# ---------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def start_demo(deployment: str, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """`planner demo` as its own process, yielded once it has printed its Prefect server's address (so the run is
    starting), with the stderr lines read so far; a thread keeps reading them. On the way out the demo is killed if
    it still runs, and `seen` holds all of its stderr."""
    import queue
    import threading
    import time

    demo = subprocess.Popen(
        [sys.executable, "-m", "planner_cli.main", "demo", "--deployment", deployment],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in demo.stderr], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("Prefect API:") for line in seen):
            assert time.monotonic() < deadline and demo.poll() is None, "".join(seen)[-3000:]
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        yield demo, seen
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        reader.join(timeout=10)
        while not lines.empty():
            seen.append(lines.get())


def _prefect_server_of(demo: subprocess.Popen):
    """The Prefect server the demo started (a child process running `prefect server start`)."""
    import psutil

    [server] = [
        child for child in psutil.Process(demo.pid).children(recursive=True)
        if "server" in child.cmdline() and "start" in child.cmdline()
    ]  # fmt: skip
    return server


def test_demo_ends_in_one_line_when_its_prefect_server_dies(database_url: str, tmp_path: Path) -> None:
    """kill -9 of the Prefect server the demo started, once the run is under way: the demo exits non-zero with one
    error line within PLANNER_PREFECT_LOST_S plus a margin, instead of retrying the dead server for minutes."""
    import time

    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env |= {
        "PLANNER_DATABASE_URL": database_url,
        "PLANNER_DATA_DIR": str(tmp_path / "data"),
        "PLANNER_PREFECT_LOST_S": "10",
    }
    with start_demo("prefect-lost", env) as (demo, seen):
        time.sleep(5)  # the flow run is under way
        assert demo.poll() is None, "the demo ended before its Prefect server could be killed"
        _prefect_server_of(demo).kill()
        killed_at = time.monotonic()
        try:
            status = demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo still runs 60 s after its Prefect server was killed")
        waited_s = time.monotonic() - killed_at
    errors = [line for line in seen if line.startswith("planner: error:")]
    assert status == 3
    assert len(errors) == 1 and "Prefect server" in errors[0], "".join(seen)[-3000:]
    assert not any(line.startswith("Traceback") for line in seen)
    assert waited_s < 10 + 20


def test_sigterm_to_the_demo_stops_its_prefect_server(database_url: str, tmp_path: Path) -> None:
    """SIGTERM to `planner demo` alone (not its process group), once the run is under way: the demo ends with one
    line and the Prefect server it started is stopped too (issue 43: the server kept running)."""
    import time

    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env |= {"PLANNER_DATABASE_URL": database_url, "PLANNER_DATA_DIR": str(tmp_path / "data")}
    server = None
    try:
        with start_demo("sigterm", env) as (demo, seen):
            time.sleep(3)  # the flow run is under way
            server = _prefect_server_of(demo)
            demo.send_signal(signal.SIGTERM)
            status = demo.wait(timeout=60)
            server.wait(timeout=30)  # psutil.TimeoutExpired if the server outlives the demo
    finally:
        if server is not None and server.is_running():
            server.kill()
    assert status == 130, "".join(seen)[-3000:]
    assert seen[-1].strip() == "planner: interrupted", "".join(seen)[-3000:]
    assert not any(line.startswith("Traceback") for line in seen)


# ---------------------------------------------------------------------------------------------------------
# Postgres lost mid-run: one line, non-zero status, no traceback
# ---------------------------------------------------------------------------------------------------------


def _demo_ticks(url: str) -> int:
    """The ticks the demo's database holds (0 before its schema exists)."""
    with psycopg.connect(to_libpq_uri(url)) as conn:
        if conn.execute("SELECT to_regclass('ticks')").fetchone()[0] is None:
            return 0
        return int(conn.execute("SELECT count(*) FROM ticks").fetchone()[0])


def test_demo_ends_in_one_line_when_its_database_is_lost(tmp_path: Path) -> None:
    """The demo's embedded Postgres is stopped once the run is under way: the demo exits 1 with one error line
    naming the database, and prints no traceback (Prefect's console copy of the failure included)."""
    import time

    from planner_core.runtime.store.db import embedded_database_url, stop_embedded_database

    data_dir = tmp_path / "data"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PLANNER_"))}
    env |= {"PLANNER_DATA_DIR": str(data_dir)}
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        demo = subprocess.Popen(
            [sys.executable, "-m", "planner_cli.main", "demo", "--deployment", "db-lost"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while "Prefect API:" not in err_path.read_text():
                assert time.monotonic() < deadline and demo.poll() is None, err_path.read_text()[-3000:]
                time.sleep(0.5)
            # The run is under way once it has recorded a tick. Stopped earlier, before the flow resolved its
            # database URL, the embedded server is started again and the demo runs to its end (seen under load).
            owner_url = embedded_database_url((data_dir / "pg").resolve())
            while not _demo_ticks(owner_url):
                assert time.monotonic() < deadline and demo.poll() is None, err_path.read_text()[-3000:]
                time.sleep(0.5)
            assert demo.poll() is None, "the demo ended before its database could be stopped"
            assert stop_embedded_database((data_dir / "pg").resolve())
            status = demo.wait(timeout=120)
        finally:
            if demo.poll() is None:  # its whole process group: the Prefect server it started too
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
            stop_embedded_database((data_dir / "pg").resolve())
    text = err_path.read_text()
    errors = [line for line in text.splitlines() if line.startswith("planner: error:")]
    assert status == 1, text[-3000:]
    assert len(errors) == 1 and "database unavailable" in errors[0], text[-3000:]
    assert "Traceback" not in text
