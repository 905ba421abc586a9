"""The fault suite's demo leg: `planner demo` attempts in the run's folder, the baseline, and one fault injected
into a running attempt (a kill of the demo at random or right after a tick, of Postgres, of the Prefect server),
with the demo seen to its end (a hung one killed after asking for its stacks)."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import time

from planner_core.lab.chaos.options import ChaosOptions
from planner_core.lab.chaos.queries import tick_count
from planner_core.lab.chaos.stack import ChaosRun, Kill
from planner_core.runtime.settings import RuntimeSettings

HUNG_FACTOR = 3.0  # a demo still running this many baseline durations after a Postgres/Prefect fault is hung ...
POLL_S = 0.02
# The demos' runtime settings: the defaults (their environment drops every PLANNER_ variable but the data dir).
DEMO_SETTINGS = RuntimeSettings.model_construct()


def _demo_command(options: ChaosOptions, deployment: str) -> list[str]:
    """The `planner demo` command line of one attempt."""
    return [
        # resolved: the demo runs in the run's folder, so a path relative to the caller's folder would not be found
        sys.executable, "-m", "planner_cli.main", "demo", "--trace", str(options.trace.resolve()),
        "--config", str(options.config.resolve()),
        "--deployment", deployment, "--max-windows", str(options.windows), "--rate-scale", str(options.rate_scale),
    ]  # fmt: skip


def start_demo(run: ChaosRun, options: ChaosOptions, deployment: str, attempt: int) -> subprocess.Popen:
    """One demo attempt, started (its log in the run's logs/ folder)."""
    log = (run.folder / "logs" / f"{deployment}-{attempt:03d}.log").open("wb")
    run.demo = subprocess.Popen(
        _demo_command(options, deployment), env=run.env, stdout=log, stderr=subprocess.STDOUT, cwd=run.folder
    )
    return run.demo


def wait_exit(process: subprocess.Popen, timeout_s: float) -> int | None:
    """The process's exit status, or None if it is still running after `timeout_s`."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def kill(process: subprocess.Popen) -> None:
    """SIGKILL the process and reap it."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def hung_after_s(baseline_s: float, settings: RuntimeSettings) -> float:
    """... plus the waits a demo riding a fault out may spend within its configured bounds: restarting the embedded
    Postgres (or waiting for another process starting one), releasing its handle at exit, and the Prefect server's
    silence before giving up. Beyond that the demo has broken a bound: it is hung. (The baseline's duration alone
    misjudged a demo that restarted Postgres on a loaded machine and was finishing its exit: seed-26 round 33.)"""
    from planner_core.runtime.store.db import EXIT_LOCK_TIMEOUT_S

    return baseline_s * HUNG_FACTOR + settings.embedded_start_timeout_s + EXIT_LOCK_TIMEOUT_S + settings.prefect_lost_s


def kill_hung(process: subprocess.Popen) -> None:
    """Kill a demo that neither finished nor failed, after asking it for every thread's stack (SIGUSR1: the CLI
    prints them to its log), so the log says where it was waiting."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGUSR1)
        time.sleep(2.0)
    kill(process)


def run_baseline(run: ChaosRun, options: ChaosOptions) -> float:
    """The uninterrupted demo; returns its wall time (s)."""
    started = time.monotonic()
    process = start_demo(run, options, "baseline", 0)
    code = wait_exit(process, options.attempt_timeout_s)
    if code != 0:
        if code is None:
            kill(process)
        raise RuntimeError(f"the uninterrupted demo failed (exit {code}): see {run.folder / 'logs'}")
    return time.monotonic() - started


def inject(
    run: ChaosRun,
    rng: random.Random,
    process: subprocess.Popen,
    deployment: str,
    round_no: int,
    baseline_s: float,
    fault: str,
) -> Kill | None:
    """Inject `fault` during the running demo at a random moment, and see the demo to its end. None: the demo
    finished before the fault's moment came (no kill)."""
    started = time.monotonic()
    at_s = rng.uniform(0.0, baseline_s)
    if fault == "demo-after-tick":
        url = run.owner_url()
        before = tick_count(url, deployment)
        while process.poll() is None and time.monotonic() - started < baseline_s * HUNG_FACTOR:
            now = tick_count(url, deployment)
            if now is not None and before is not None and now > before:
                kill(process)
                return Kill(round_no, fault, time.monotonic() - started, None, f"after tick {now}")
            if before is None:
                before = now
            time.sleep(POLL_S)
        if process.poll() is not None:
            return None
        fault = "demo-random"  # no new tick within the time: fall back to a plain kill now
    if wait_exit(process, at_s) is not None:
        return None  # finished first
    after_s = time.monotonic() - started
    if fault == "demo-random":
        kill(process)
        return Kill(round_no, fault, after_s, None)
    if fault == "postgres":
        killed = run.kill_postgres()
        code = wait_exit(process, hung_after_s(baseline_s, DEMO_SETTINGS))
        note = "" if killed else "postmaster not running"
        if code is None:
            kill_hung(process)
            note = (note + "; " if note else "") + "demo hung after the Postgres kill: killed (stacks in its log)"
        run.owner_url()  # restart Postgres (crash recovery) before the next attempt
        return Kill(round_no, fault, after_s, code, note)
    run.kill_prefect()
    run.start_prefect()
    code = wait_exit(process, hung_after_s(baseline_s, DEMO_SETTINGS))
    note = ""
    if code is None:
        kill_hung(process)
        note = "demo hung after the Prefect restart: killed (stacks in its log)"
    return Kill(round_no, fault, after_s, code, note)
