"""The live stack's processes: where its tools are, the constants every run shares, a child process in its own
session stopped by SIGTERM (SIGKILL after a grace), waiting for a server, and the machine's CPU idle share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from planner_core.runtime.localhost import wait_for as _wait_until

REPO = Path(__file__).resolve().parents[3]
PROFILE_DIR = REPO / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D"
STUBS_DIR = REPO / "planner_core" / "lab" / "dynamo" / "stubs"
MODEL_NAME = "tiny"
# aiperf's synthetic prompts (its Shakespeare corpus) hold 1.68 characters per token of the tiny model's tokenizer
# (measured with `tokenizers` on that corpus); the routing proxy estimates prompt tokens with it
CHARS_PER_TOKEN = 1.68
DEPLOYMENT = "live"
DRAIN_GRACE_S = 20  # a drained engine's SIGTERM-to-SIGKILL grace
PREFECT_LOST_S = 180  # serve's patience with an unanswering Prefect server in a live run (see run_once)


class LiveError(RuntimeError):
    """The live stack cannot run (a missing tool, a component that did not come up): one line."""


class LiveCancelled(Exception):
    """A run stopped by Ctrl-C or SIGTERM: its components are stopped, its database server too, and its folder holds
    `cancelled.json` instead of `figures.json` (so `--summarize` leaves it out)."""

    def __init__(self, run: str, marker: Path) -> None:
        super().__init__(f"run {run} cancelled ({marker})")
        self.run = run
        self.marker = marker


def tool(env_name: str, default: Path, make_target: str) -> str:
    """The path of a tool the stack needs: `env_name` if set, else `default`; says which make target makes it."""
    value = os.environ.get(env_name)
    path = Path(value) if value else default
    if not path.exists():
        raise LiveError(f"{path} not found: run `make {make_target}` (or set {env_name})")
    return str(path)


def find_tools() -> dict[str, str]:
    """The live stack's tools: Dynamo's interpreter, aiperf, the tiny model folder and Prometheus (Debian's)."""
    import shutil

    tools = {
        "dynamo": tool("DYNAMO_PYTHON", REPO / ".dynamo-venv" / "bin" / "python", "dynamo-env"),
        "aiperf": tool("AIPERF", REPO / ".aiperf-venv" / "bin" / "aiperf", "live-env"),
        "model": tool("PLANNER_LIVE_MODEL_DIR", REPO / ".planner" / "live-model", "live-env"),
        "prometheus": shutil.which("prometheus") or "",
    }
    if not tools["prometheus"]:
        raise LiveError("prometheus not found: apt-get install -y prometheus (Debian's package)")
    return tools


def get(url: str, timeout_s: float = 2.0) -> bytes:
    """The body of a GET on one of our own local servers."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


def wait_for(what: str, probe: Callable[[], object], timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """`planner_core.runtime.localhost.wait_for` raising `LiveError` (the run's one-line failure)."""
    _wait_until(what, probe, timeout_s, process=process, error=LiveError)


@contextlib.contextmanager
def process(argv: list[str], log: Path, env: dict[str, str] | None = None, *, nice: int = 0) -> Iterator:
    """A child process for the run, in its own process group, stopped by SIGTERM (SIGKILL after 20 s)."""
    with log.open("ab") as out:
        child = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
    try:
        yield child
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


@dataclass
class CpuSampler:
    """The machine's CPU idle share over a run (from /proc/stat, every few seconds)."""

    interval_s: float = 5.0
    samples: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    def run(self) -> None:
        idle0, total0 = self._read()
        while not self._stop.wait(self.interval_s):
            idle1, total1 = self._read()
            if total1 > total0:
                self.samples.append((idle1 - idle0) / (total1 - total0))
            idle0, total0 = idle1, total1

    def start(self) -> None:
        threading.Thread(target=self.run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
