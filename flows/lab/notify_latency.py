# ruff: noqa: T201  (a benchmark script reports on stdout)
"""Latency from a decision's commit to the start of its execution, by hand:
`python -m flows.lab.notify_latency MODE N`, MODE one of

- `notify`: the execution listener (LISTEN on the tick's NOTIFY) calling `run_execution` directly;
- `notify-flow`: `planner serve`'s listener, each execution the `execute-decisions` Prefect flow run in-process;
- `poll`: the execution before NOTIFY, a Prefect runner serving `execute-decisions` on a 10 s interval schedule
  (each run a subprocess of the runner, as `planner serve` did).

Creates a fresh database on the planner's Postgres server (dropped at the end) and, for the two Prefect modes, a
local Prefect server with its own home. Then N times (after one decision that warms up and is not counted): wait
a random delay (0-0.5 s; 0-10 s for `poll`, so that commits fall anywhere in the poll's period), commit a decision
(virtual connector), stamping the time the COMMIT is sent, wait until its first `executions` row exists, and
acknowledge it. The latency is that row's `executed_at` (the execution run's start, taken in the executing
process) minus the stamp. Prints the median, p90, min and max, and the median time the commit call took (the
stamp's uncertainty).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner_core.runtime.execution_listener import ExecutionListener

NAME = "latency"
T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
POLL_INTERVAL_S = 10.0  # the old default `execution_interval_seconds`

RUNNER_CODE = """
import asyncio, datetime as dt, sys
from prefect.runner import Runner
from flows.ticks import execute_decisions
runner = Runner()
runner.add_deployment(execute_decisions.to_deployment(
    name=sys.argv[1], interval=dt.timedelta(seconds=float(sys.argv[3])),
    parameters={"deployment": sys.argv[1], "config_path": sys.argv[2]},
))
asyncio.run(runner.start())
"""


def _first_execution_at(url: str, decision_id: int) -> dt.datetime | None:
    from sqlalchemy import select

    from planner_core.runtime.store.db import session_factory
    from planner_core.runtime.store.models import ExecutionRow

    with session_factory(url).begin() as session:
        return session.scalar(
            select(ExecutionRow.executed_at).where(ExecutionRow.decision_id == decision_id).order_by(ExecutionRow.id)
        )


def _commit_decision(ctx, at: dt.datetime, targets: int) -> tuple[int, dt.datetime, float]:
    """Record a pending decision (a tick at `at`) and commit it. Returns its id, the time the COMMIT was sent (the
    latency's origin: the listener may start before the commit call has returned, so stamping after it would
    give latencies below zero) and how long the commit call took."""
    from sqlalchemy import select

    from planner_core.runtime.store.models import DecisionRow
    from tests.runtime.databases import decision_outcome, record_outcome

    inputs, outcome = decision_outcome(at, targets, targets)
    with ctx.sessions() as session:
        tick_id = record_outcome(session, NAME, inputs, outcome)
        decision_id = session.scalar(select(DecisionRow.id).where(DecisionRow.tick_id == tick_id))
        sent, began = dt.datetime.now(dt.UTC), time.perf_counter()
        session.commit()
        return decision_id, sent, time.perf_counter() - began


def _wait_executed(url: str, decision_id: int) -> dt.datetime:
    """The decision's first execution's start, polled every 2 ms (at most three poll periods and a minute)."""
    deadline = time.monotonic() + 3 * POLL_INTERVAL_S + 60
    executed_at = None
    while executed_at is None and time.monotonic() < deadline:
        time.sleep(0.002)
        executed_at = _first_execution_at(url, decision_id)
    if executed_at is None:
        raise RuntimeError(f"decision {decision_id} was not executed")
    return executed_at


def _start_listener(stack: ExitStack, listener: ExecutionListener) -> None:
    """Start the execution listener (closed with the stack) and wait for its catch-up run."""
    listener.start()
    stack.callback(listener.close, 60.0)
    if not listener.listening.wait(60):
        raise RuntimeError("the listener did not connect")
    while listener.stats.num_finished == 0:  # its catch-up run (in notify-flow: the first flow run)
        time.sleep(0.05)


def main(mode: str, num_decisions: int) -> dict:
    home = tempfile.mkdtemp(prefix="prefect-home-")
    os.environ["PREFECT_HOME"] = home
    os.environ.pop("PREFECT_API_URL", None)
    from planner_core.config import load_config
    from planner_core.runtime.connectors.virtual import VirtualConnectorClient
    from planner_core.runtime.execution_listener import ExecutionListener, ListenerSettings
    from planner_core.runtime.service import load_context, run_execution
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.migrate import scratch_database
    from planner_core.runtime.store.models import DecisionStatus
    from tests.conftest import write_config

    rng = random.Random(20)
    config_path = str(write_config(Path(tempfile.mkdtemp())).resolve())
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database("notify_latency"))
        os.environ["PLANNER_DATABASE_URL"] = url
        ctx = load_context(url, NAME, config_path)
        with ctx.sessions.begin() as session:
            repo.ensure_deployment(session, NAME, ctx.config)
        if mode != "notify":
            from flows.prefect_server import prefect_api

            os.environ["PREFECT_API_URL"] = stack.enter_context(prefect_api(log_file=Path(home) / "server.log"))
        if mode == "notify":

            def execute(_trigger: object) -> bool:
                summaries = run_execution(ctx, dt.datetime.now(dt.UTC))
                return any(s.status is DecisionStatus.PENDING for s in summaries)

            listener = ExecutionListener(url, NAME, execute, ListenerSettings())
        elif mode == "notify-flow":
            from flows.serve import execution_listener

            listener = execution_listener(url, NAME, config_path, load_config(config_path))
        elif mode == "poll":
            listener = None
            log = stack.enter_context((Path(home) / "runner.log").open("wb"))
            runner = subprocess.Popen(
                [sys.executable, "-c", RUNNER_CODE, NAME, config_path, str(POLL_INTERVAL_S)],
                env=dict(os.environ),
                stdout=log,
                stderr=log,
            )
            stack.callback(lambda: (runner.terminate(), runner.wait(timeout=60)))
        else:
            raise SystemExit(f"unknown mode {mode!r}: notify, notify-flow or poll")
        if listener is not None:
            _start_listener(stack, listener)
        client = stack.enter_context(VirtualConnectorClient(url, NAME))
        latencies_s, commits_s = [], []
        for index in range(-1, num_decisions):  # decision -1 warms up (the runner's first run) and is not counted
            time.sleep(rng.uniform(0, POLL_INTERVAL_S if mode == "poll" else 0.5))
            targets = 2 + index % 2
            decision_id, committed, commit_s = _commit_decision(ctx, T0 + dt.timedelta(minutes=index + 1), targets)
            executed_at = _wait_executed(url, decision_id)
            if index >= 0:
                latencies_s.append((executed_at - committed).total_seconds())
                commits_s.append(commit_s)
            client.complete(client.get())
    ordered = sorted(latencies_s)
    return {
        "mode": mode,
        "decisions": num_decisions,
        "median_s": round(statistics.median(ordered), 4),
        "p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 4),
        "min_s": round(ordered[0], 4),
        "max_s": round(ordered[-1], 4),
        "median_commit_call_s": round(statistics.median(commits_s), 4),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
