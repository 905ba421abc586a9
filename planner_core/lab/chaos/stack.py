"""The fault suite's run: its folder, its own Prefect server (started, killed, restarted on one port) and its
embedded Postgres (killed, stopped), and the kills it injected."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner_core.runtime.localhost import answers, wait_for


@dataclass
class Kill:
    """One injected fault, as the report lists it."""

    round: int
    fault: str
    after_s: float  # since the attempt's demo started
    demo_exit: int | None  # the demo's exit status after the fault (None: it was the one killed)
    note: str = ""


@dataclass
class ChaosRun:
    """Where the run lives and the processes it owns (the Prefect server; Postgres is pgserver's)."""

    folder: Path
    port: int
    env: dict[str, str]
    prefect: subprocess.Popen | None = None
    demo: subprocess.Popen | None = None  # the demo attempt running now
    kills: list[Kill] = field(default_factory=list)
    commit: str | None = None  # the code's commit when the run began (the checkout may move while it runs)

    @property
    def pg_dir(self) -> Path:
        return self.folder / "data" / "pg"

    def owner_url(self) -> str:
        """The embedded server's superuser URL, starting the server if it is down (after a Postgres kill)."""
        from planner_core.runtime.store.db import embedded_database_url

        return embedded_database_url(self.pg_dir)

    # --- Prefect ------------------------------------------------------------------------------------------

    def start_prefect(self) -> None:
        prefect_bin = str(Path(sys.executable).parent / "prefect")
        log = (self.folder / "prefect-server.log").open("ab")
        self.prefect = subprocess.Popen(
            [prefect_bin, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        api_url = self.env["PREFECT_API_URL"]
        wait_for(f"Prefect server at {api_url}", lambda: answers(f"{api_url}/health"), 180, poll_s=0.3)

    def kill_prefect(self) -> None:
        """SIGKILL the server's process group (the server and any worker it started), then wait for it."""
        if self.prefect is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.prefect.pid, signal.SIGKILL)
        self.prefect.wait(timeout=30)
        self.prefect = None

    def stop_prefect(self) -> None:
        if self.prefect is not None:
            os.killpg(self.prefect.pid, signal.SIGTERM)
            try:
                self.prefect.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill_prefect()
            self.prefect = None

    # --- Postgres -----------------------------------------------------------------------------------------

    def stop_postgres(self) -> None:
        """Stop the run's embedded Postgres (fast shutdown; SIGKILL if it is still there after 60 s), whoever
        started it last (this process, or a demo after a Postgres kill): the run leaves no server behind."""
        from planner_core.runtime.store.db import postmaster_pid, process_alive, stop_embedded_database

        pid = postmaster_pid(self.pg_dir)
        if pid is None or not stop_embedded_database(self.pg_dir):
            return
        deadline = time.monotonic() + 60
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process_alive(pid):
            self.kill_postgres()

    def kill_postgres(self) -> bool:
        """SIGKILL the postmaster (its backends exit when they notice). False if it was not running."""
        from planner_core.runtime.store.db import postmaster_pid

        pid = postmaster_pid(self.pg_dir)
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the postmaster to be gone before anyone restarts it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        return True
