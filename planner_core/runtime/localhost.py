"""What starting servers on this machine needs, in one place: a free TCP port, waiting until a server answers,
and the code's commit name (`git describe`) that a record or a report keeps beside its figures.

The runtime's own Prefect server (flows/prefect_server.py) and replay's code version use it; the lab's harnesses
(the live stack, the fault suite, the profile round trip, the benchmarks) too.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout's root (or the installed packages' folder)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it; free until someone binds it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_port_free(port: int, host: str = "127.0.0.1", *, flag: str = "--port") -> None:
    """Refuse, in one line and at once, a port this process could not listen on (taken, privileged, an address
    that is not this machine's). A server started on it would fail only later: Prefect's after ~2 minutes of
    health checks. Port 0 (the OS picks one) always passes. The probe binds as servers do (SO_REUSEADDR), so a
    port whose last connection is still in TIME_WAIT is not refused; one another socket listens on is.

    Raises:
        ValueError: `<flag> <port>: cannot listen on <host>:<port> (<reason>)`.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host.strip("[]"), port))
    except OSError as exc:
        raise ValueError(f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None


def code_commit() -> str | None:
    """`git describe --always --dirty` of the code's checkout (None outside one: an installed package)."""
    try:
        described = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return described.stdout.strip() or None if described.returncode == 0 else None


def wait_for(
    what: str,
    probe: Callable[[], object],
    timeout_s: float,
    *,
    process: subprocess.Popen | None = None,
    poll_s: float = 0.5,
    error: type[Exception] = RuntimeError,
) -> None:
    """Poll `probe` every `poll_s` until it returns something true (an exception counts as not yet); raise `error`
    naming `what` after `timeout_s`, or as soon as `process` (the server's, when given) has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise error(f"{what}: the process exited with {process.returncode}")
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(poll_s)
    raise error(f"{what} not up after {timeout_s:.0f} s")


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a GET of `url` answers 200 (an error is an exception: `wait_for` counts it as not yet)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.status == 200
