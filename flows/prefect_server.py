"""A local Prefect server for `planner serve` and `planner demo` when no `PREFECT_API_URL` is given.

The server runs as a subprocess with its home (SQLite database, logs) under the planner's data directory, so
the flow and task runs stay visible in the UI after the command ends (`prefect server start` shows them).

With `exit_when_lost` (`planner demo`, `planner serve`) a watchdog thread ends the command when the server is
lost: at once when the server this module started exits, or when `/health` has not answered for
`PLANNER_PREFECT_LOST_S` (30 s). Prefect's client would otherwise retry its calls and its queued events for many
minutes. It prints one line and exits with status 3 without unwinding: every tick is one Postgres transaction, so
a run stopped anywhere resumes where it stopped (as after a kill -9).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from planner_core.runtime.localhost import answers, check_port_free, free_port, wait_for


def wait_healthy(api_url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Poll `<api_url>/health` until it answers 200; raise after `timeout_s`, or as soon as `process` (the server
    started for it) has exited."""
    what = f"Prefect server at {api_url}"
    wait_for(what, lambda: answers(f"{api_url}/health"), timeout_s, process=process, poll_s=0.3)


def _flush_run_logs() -> None:
    """Ship run logs still queued for the API before the server goes away (no-op if Prefect was never used)."""
    if "prefect" in sys.modules:
        from prefect.logging.handlers import APILogHandler

        with contextlib.suppress(Exception):
            APILogHandler.flush()
        from prefect.logging.handlers import APILogWorker

        # Every Prefect service's queue (logs, events) sent while the server is up, within 5 s: a service still
        # holding items when the server is gone drains them at exit and waits for ever (`fleet serve` hung so
        # after a SIGTERM). `serve` drains the same way before it returns.
        with contextlib.suppress(Exception):
            APILogWorker.drain_all(timeout=5)


LOST_EXIT_STATUS = 3

_STARTED: list[subprocess.Popen] = []  # the servers `prefect_api` started and has not stopped yet


def started_server_pid() -> int | None:
    """The pid of the Prefect server `prefect_api` started and is running (None when it uses `PREFECT_API_URL`):
    the root of the server's process tree, whose CPU `planner fleet bench --prefect` counts."""
    return _STARTED[-1].pid if _STARTED else None


class _ServerWatchdog:
    """Ends the process, in one line, when the Prefect server is lost (module docstring)."""

    def __init__(self, api_url: str, server: subprocess.Popen | None, lost_after_s: float, poll_s: float = 1.0):
        self.api_url, self.server, self.lost_after_s, self.poll_s = api_url, server, lost_after_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="prefect-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # never started when the server did not come up
            self._thread.join(timeout=5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=min(5.0, self.lost_after_s)) as response:
                return response.status == 200
        except OSError:
            return False

    def _watch(self) -> None:
        last_healthy = time.monotonic()
        while not self._stop.wait(self.poll_s):
            if self.server is not None and self.server.poll() is not None:
                self._lost(f"the Prefect server (pid {self.server.pid}) exited with status {self.server.returncode}")
            if self._healthy():
                last_healthy = time.monotonic()
            elif time.monotonic() - last_healthy > self.lost_after_s:
                self._lost(f"the Prefect server at {self.api_url} has not answered for {self.lost_after_s:g} s")

    def _lost(self, what: str) -> None:
        if self._stop.is_set():  # the command is ending: the server is being stopped on purpose
            return
        sys.stderr.write(
            f"planner: error: {what}; stopping (every recorded tick is complete: run the command again to resume)\n"
        )
        sys.stderr.flush()
        os._exit(LOST_EXIT_STATUS)  # not sys.exit: Prefect's exit hooks would retry the dead server for minutes


def _unwind_on_sigterm() -> tuple[bool, Any]:
    """From here on SIGTERM unwinds like Ctrl-C (KeyboardInterrupt), so `prefect_api`'s `finally` stops the server
    it started: Python's default SIGTERM ends the process at once and left the server running (issue 43). Returns
    whether a handler was set (not off the main thread, where none can be) and the one to restore."""
    if threading.current_thread() is not threading.main_thread():
        return False, None

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    return True, signal.signal(signal.SIGTERM, interrupt)


@contextlib.contextmanager
def prefect_api(
    port: int | None = None, log_file: Path | None = None, *, exit_when_lost: bool = False
) -> Iterator[str]:
    """Yield the Prefect API URL: `PREFECT_API_URL` if set, else a server started here (stopped on exit).

    `exit_when_lost`: watch the server and end the process when it is lost (module docstring).
    """
    from planner_core.runtime.settings import RuntimeSettings

    lost_after_s = RuntimeSettings().prefect_lost_s
    existing = os.environ.get("PREFECT_API_URL")
    if existing:
        watchdog = _ServerWatchdog(existing, None, lost_after_s) if exit_when_lost else None
        if watchdog is not None:
            watchdog.start()
        try:
            yield existing
        finally:
            if watchdog is not None:
                watchdog.stop()
        return
    if port:
        check_port_free(port)  # a taken port is one line now, not a failed health check two minutes later
    port = port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    prefect_bin = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
    log_path = log_file or Path(os.environ.get("PREFECT_HOME", ".")) / "server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        server = subprocess.Popen(
            [prefect_bin, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=dict(os.environ, PREFECT_UI_API_URL=api_url),
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session: Ctrl-C in a terminal signals the whole foreground process group, and a server that
            # got it too stopped before the command had paused its schedules (exit 3, schedules left active). The
            # command stops it itself, below, once it has finished with it.
            start_new_session=True,
        )
    watchdog = _ServerWatchdog(api_url, server, lost_after_s) if exit_when_lost else None
    _STARTED.append(server)
    previous_sigterm = _unwind_on_sigterm()
    try:
        wait_healthy(api_url, timeout_s=120, process=server)
        os.environ["PREFECT_API_URL"] = api_url
        if watchdog is not None:
            watchdog.start()
        yield api_url
    finally:
        if watchdog is not None:
            watchdog.stop()
        _flush_run_logs()
        os.environ.pop("PREFECT_API_URL", None)
        _STARTED.remove(server)
        server.terminate()  # SIGTERM: the server shuts down cleanly
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        # The server is gone: a run log still queued (a crash's last lines, shipped at exit) can only fail, and
        # Prefect's log worker would print two lines of that ("--- Error logging to API ---", "All connection
        # attempts failed") after the command's one-line error. It prints only while `logging.raiseExceptions`.
        logging.raiseExceptions = False
        installed, previous = previous_sigterm
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
