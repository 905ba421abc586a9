"""A local Prefect server for `planner serve` and `planner demo` when no `PREFECT_API_URL` is given.

The server runs as a subprocess with its home (SQLite database, logs) under the planner's data directory, so
the flow and task runs stay visible in the UI after the command ends (`prefect server start` shows them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(api_url: str, timeout_s: float) -> None:
    """Poll `<api_url>/health` until it answers 200; raise after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"Prefect server at {api_url} not healthy after {timeout_s:.0f} s")


def _flush_run_logs() -> None:
    """Ship run logs still queued for the API before the server goes away (no-op if Prefect was never used)."""
    if "prefect" in sys.modules:
        from prefect.logging.handlers import APILogHandler

        with contextlib.suppress(Exception):
            APILogHandler.flush()


@contextlib.contextmanager
def prefect_api(port: int | None = None, log_file: Path | None = None) -> Iterator[str]:
    """Yield the Prefect API URL: `PREFECT_API_URL` if set, else a server started here (stopped on exit)."""
    existing = os.environ.get("PREFECT_API_URL")
    if existing:
        yield existing
        return
    port = port or _free_port()
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
        )
    try:
        wait_healthy(api_url, timeout_s=120)
        os.environ["PREFECT_API_URL"] = api_url
        yield api_url
    finally:
        _flush_run_logs()
        os.environ.pop("PREFECT_API_URL", None)
        server.terminate()  # SIGTERM: the server shuts down cleanly
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
