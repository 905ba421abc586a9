"""A planner command started as its own process and stopped by a signal, as the lifecycle tests do it.

`start_command` runs `python -m planner_cli.main ARGS` in a session of its own (so that a terminal's Ctrl-C can be
imitated without signalling pytest), its stdout and stderr into one log file, and waits until the log shows the
command is serving; `stop_with` sends the signal the way it comes in real life: SIGINT to the whole process group
(a terminal's Ctrl-C reaches every process in the foreground group, child servers included), SIGTERM to the command
alone (a supervisor, `kill PID`, Kubernetes stopping a pod's main process). Whatever is left running after the test
is killed with its group, so a failing test leaves no server behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO_ROOT

# Both ways a command is asked to stop, as ids for `pytest.mark.parametrize`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_SIGNAL_IDS = ("sigint", "sigterm")


@dataclass(frozen=True, slots=True)
class Command:
    """A command started by `start_command`: its process and the log of its stdout and stderr."""

    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def start_command(
    args: Sequence[str],
    *,
    env: dict[str, str],
    log_path: Path,
    ready: Callable[[str], bool],
    timeout_s: float = 240.0,
    executable: Sequence[str] = (sys.executable, "-m", "planner_cli.main"),
) -> Iterator[Command]:
    """Start the command, wait until `ready(log)` holds (failing if the command exits or `timeout_s` passes first),
    and yield it; on leaving, a process still running is killed with its group."""
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*executable, *args], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_as_in_a_terminal,
        )  # fmt: skip
    command = Command(process, log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready(command.log()):
            assert process.poll() is None, f"exited {process.returncode} before it was ready:\n{command.log()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready within {timeout_s:g} s:\n{command.log()[-3000:]}"
            time.sleep(0.2)
        yield command
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _as_in_a_terminal() -> None:
    """In the child before it runs the command: SIGINT handled by default, as in a terminal. A job a shell starts in
    the background (CI runners, `make test &`) inherits SIGINT ignored, and Python then never turns it into
    KeyboardInterrupt: a Ctrl-C test would pass or fail by how pytest was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_with(command: Command, sig: signal.Signals, *, timeout_s: float = 90.0) -> int:
    """Send `sig` as it comes in real life (SIGINT to the process group, SIGTERM to the command) and return the
    command's exit code (a test fails with the log if it does not end within `timeout_s`)."""
    if sig == signal.SIGINT:
        os.killpg(command.process.pid, sig)
    else:
        command.process.send_signal(sig)
    try:
        return command.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {timeout_s:g} s after {sig.name}:\n{command.log()[-3000:]}") from None


def group_alive(pid: int) -> bool:
    """Whether any process of the process group `pid` (a command started by `start_command`, with its children
    that did not start a session of their own) is still running."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True
