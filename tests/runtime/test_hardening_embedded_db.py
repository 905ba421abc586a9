"""The embedded database under kills and held locks (issue 21): a kill during its first initialisation, a killed
server started again, pgserver's lock held by another process, a zombie postmaster."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

# ---------------------------------------------------------------------------------------------------------
# The embedded database: a kill during the very first initialisation does not break it for good
# ---------------------------------------------------------------------------------------------------------

_START_EMBEDDED = """
import sys
from pathlib import Path
import psycopg
from planner_core.runtime.store.db import embedded_database_url, to_libpq_uri
url = embedded_database_url(Path(sys.argv[1]))
with psycopg.connect(to_libpq_uri(url)) as conn:
    print(conn.execute("SELECT 41 + 1").fetchone()[0])
"""


def _stop_test_servers(folder: Path) -> None:
    """Stop the postgres processes this test started (their command line names its folder)."""
    import psutil

    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(folder) in " ".join(proc.info["cmdline"] or ()):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


def _first(pattern: str, folder: Path) -> Path | None:
    return next(iter(folder.glob(pattern)), None)


@pytest.mark.parametrize(
    ("kill_point", "pattern", "delay_s"),
    [
        ("initdb-started", "*/PG_VERSION", 0.0),  # initdb writes PG_VERSION first, then the rest of the cluster
        ("initdb-running", "*/PG_VERSION", 0.3),
        ("first-start", "*/postmaster.pid", 0.0),
    ],
    ids=lambda value: value if isinstance(value, str) and "/" not in value else "",
)
def test_kill_during_first_initialisation_does_not_break_the_embedded_database(
    tmp_path: Path, kill_point: str, pattern: str, delay_s: float
) -> None:
    """kill -9 of the first command to start the embedded database and of its children (initdb, pg_ctl: the
    whole process group, as a container stop does), at a point of its first initialisation;
    the next start works and answers a query instead of failing for good."""
    import time

    data_dir = tmp_path / "data"
    pg_dir = data_dir / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        first = subprocess.Popen(
            [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while data_dir.exists() is False or _first(pattern, data_dir) is None:
            assert time.monotonic() < deadline and first.poll() is None, f"{kill_point} never reached"
            time.sleep(0.005)
        time.sleep(delay_s)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        second = subprocess.run(
            [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        assert second.stdout.strip() == "42"
    finally:
        _stop_test_servers(tmp_path)


_RESTART_EMBEDDED = """
import os, signal, sys, time
from pathlib import Path
import psycopg
from planner_core.runtime.store.db import embedded_database_url, to_libpq_uri
pg_dir = Path(sys.argv[1])
embedded_database_url(pg_dir)
pid = int((pg_dir / "postmaster.pid").read_text().split()[0])
os.kill(pid, signal.SIGKILL)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
        time.sleep(0.05)
    except OSError:
        break
url = embedded_database_url(pg_dir)  # the same process asks again, as a long-running command does
with psycopg.connect(to_libpq_uri(url)) as conn:
    print(conn.execute("SELECT 41 + 1").fetchone()[0])
"""


def test_a_killed_embedded_server_is_started_again_by_the_same_process(tmp_path: Path) -> None:
    """kill -9 of the embedded Postgres under a process that started it: that process's next request for the
    database starts the server again (crash recovery) instead of handing out the dead server's address (found by a
    chaos run whose demo finished before it noticed the kill: the comparison then failed with "connection refused")."""
    pg_dir = tmp_path / "data" / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        run = subprocess.run(
            [sys.executable, "-c", _RESTART_EMBEDDED, str(pg_dir)], env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.strip() == "42"
    finally:
        _stop_test_servers(tmp_path)


# pgserver's machine-wide lock: a process holding it does not stall another command's exit or start for good.
# Every wait on it is bounded (found by a chaos run: a demo that had printed its summary did not exit while another
# process on the machine held that lock, and was counted hung).

_HOLD_PGSERVER_LOCK = """
import sys, time
from pgserver.postgres_server import PostgresServer
assert PostgresServer._lock.acquire(timeout=30)
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
"""

_ATTACH_THEN_EXIT_ON_INPUT = """
import sys
from pathlib import Path
from planner_core.runtime.store.db import embedded_database_url
embedded_database_url(Path(sys.argv[1]))
print("attached", flush=True)
sys.stdin.readline()
"""


def _hold_pgserver_lock(env: dict[str, str], seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_PGSERVER_LOCK, str(seconds)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


def test_exit_is_not_held_by_another_process_holding_pgservers_lock(tmp_path: Path) -> None:
    """A command attached to the embedded database exits within the exit bound while another process holds
    pgserver's lock (pgserver's own exit hook waits for that lock without limit)."""
    import time

    from planner_core.runtime.store.db import EXIT_LOCK_TIMEOUT_S

    pg_dir = tmp_path / "data" / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = subprocess.Popen(
        [sys.executable, "-c", _ATTACH_THEN_EXIT_ON_INPUT, str(pg_dir)], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    holder = None
    try:
        assert command.stdout is not None and command.stdout.readline().strip() == "attached"
        holder = _hold_pgserver_lock(env, 120)
        asked_at = time.monotonic()
        command.communicate("exit\n", timeout=EXIT_LOCK_TIMEOUT_S + 60)
        assert command.returncode == 0
        # the bound plus the interpreter's own exit; pgserver's hook would wait the holder's 120 s
        assert time.monotonic() - asked_at < EXIT_LOCK_TIMEOUT_S + 30
    finally:
        for process in (command, holder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        _stop_test_servers(tmp_path)


def test_start_fails_in_one_line_when_pgservers_lock_stays_held(tmp_path: Path) -> None:
    """Starting a stopped embedded database while another process holds pgserver's lock past
    PLANNER_EMBEDDED_START_TIMEOUT_S ends in one line naming the lock, instead of waiting for as long as it is held."""
    pg_dir = tmp_path / "data" / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.run(
        [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env, capture_output=True, text=True, timeout=180
    )
    assert first.returncode == 0, first.stderr[-3000:]
    _stop_test_servers(tmp_path)
    holder = _hold_pgserver_lock(env, 120)
    try:
        second = subprocess.run(
            [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env | {"PLANNER_EMBEDDED_START_TIMEOUT_S": "2"},
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert second.returncode != 0
        last = second.stderr.strip().splitlines()[-1]
        assert "EmbeddedDatabaseError" in last and "within 2 s; another process holds pgserver's lock" in last, last
    finally:
        holder.kill()
        holder.wait(timeout=30)
        _stop_test_servers(tmp_path)


def test_a_zombie_postmaster_counts_as_gone(tmp_path: Path) -> None:
    """A killed postmaster its parent has not reaped yet answers kill(pid, 0) but is dead: the process drops its
    handle and waits for it to go before starting a new one (Postgres refuses to start while that pid exists)."""
    from planner_core.runtime.store.db import _postmaster_state

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        import time

        import psutil

        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not waited for: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (tmp_path / "postmaster.pid").write_text(f"{child.pid}\n{tmp_path}\n")
        assert _postmaster_state(tmp_path) == "zombie"
        (tmp_path / "postmaster.pid").write_text(f"{os.getpid()}\n{tmp_path}\n")
        assert _postmaster_state(tmp_path) == "running"
    finally:
        child.wait(timeout=30)
    (tmp_path / "postmaster.pid").write_text(f"{child.pid}\n{tmp_path}\n")
    assert _postmaster_state(tmp_path) == "gone"  # reaped: no such process
    (tmp_path / "postmaster.pid").unlink()
    assert _postmaster_state(tmp_path) == "gone"
