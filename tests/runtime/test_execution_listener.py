"""Execution driven by the decision being recorded: the tick's NOTIFY, the LISTEN loop and its fallback poll, against
the real Postgres of the test session (and, for `planner serve`'s wiring, a real Prefect server)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest
from sqlalchemy import func, select

from planner_core.domain import Loop, PlannerState, ReasonCode, ScalingDecision, TickInputs, TickOutcome, WorkerCounts
from planner_core.runtime.execution_listener import ExecutionListener, ListenerSettings, Trigger
from planner_core.runtime.service import load_context, run_execution
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.models import DecisionRow, DecisionStatus, ExecutionRow
from tests.conftest import write_config
from tests.runtime.databases import record_decision, record_outcome

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
NAME = "listened"
BOUND_S = 3.0  # notification -> execution start, generous for a loaded 2-core machine (measured ~10 ms idle)


@pytest.fixture
def config_file(tmp_path, profile_dir):
    return write_config(tmp_path)


@pytest.fixture
def ctx(database_url, config_file):
    context = load_context(database_url, NAME, config_file)
    with context.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, context.config)
    return context


class Recorder:
    """An execute function for the listener: `run_execution` with the time and trigger of each run."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.runs: list[tuple[Trigger, float, list]] = []
        self.ran = threading.Condition()

    def __call__(self, trigger: Trigger) -> bool:
        started = time.monotonic()
        summaries = run_execution(self.ctx, dt.datetime.now(dt.UTC))
        with self.ran:
            self.runs.append((trigger, started, summaries))
            self.ran.notify_all()
        return any(s.status is DecisionStatus.PENDING for s in summaries)

    def wait_for(self, predicate, timeout_s: float) -> bool:
        with self.ran:
            return self.ran.wait_for(lambda: predicate(self.runs), timeout=timeout_s)


def applied_by(runs, decision_id: int) -> list[Trigger]:
    return [trigger for trigger, _, summaries in runs for s in summaries if s.decision_id == decision_id]


def status(ctx, decision_id: int) -> str:
    with ctx.sessions.begin() as session:
        return session.get(DecisionRow, decision_id).status


def num_executions(ctx) -> int:
    with ctx.sessions.begin() as session:
        return session.scalar(select(func.count()).select_from(ExecutionRow))


def roll_back_a_tick(ctx, at: dt.datetime) -> None:
    """A tick that records a pending decision and then fails before its commit."""
    workers = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
    inputs = TickInputs(now_s=at.timestamp(), loop=Loop.THROUGHPUT, workers=workers)
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=3, num_decode=3),
        next_state=PlannerState(),
        steps=(),
        reason=ReasonCode.SCALE,
    )
    with pytest.raises(RuntimeError, match="tick failed"), ctx.sessions.begin() as session:
        assert record_outcome(session, NAME, inputs, outcome) is not None
        raise RuntimeError("tick failed after recording")


@pytest.fixture
def listen(ctx):
    """A raw LISTEN connection on the decisions channel."""
    with psycopg.connect(to_libpq_uri(ctx.database_url), autocommit=True) as conn:
        conn.execute(f"LISTEN {repo.DECISIONS_CHANNEL}")
        yield conn


def payloads(conn, timeout_s: float) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=timeout_s)]


def test_a_committed_decision_notifies_once_a_rolled_back_tick_never(ctx, listen) -> None:
    """The NOTIFY is part of the tick's transaction: delivered on commit, with the deployment's name; a tick that
    rolls back, an empty decision and an advisory one send nothing."""
    roll_back_a_tick(ctx, T0)
    assert payloads(listen, 0.5) == []
    with ctx.sessions.begin() as session:
        assert session.scalar(select(func.count()).select_from(DecisionRow)) == 0  # nothing half-written
    record_decision(ctx, NAME, T0, None, None)  # empty decision: no decision row, nothing to execute
    assert payloads(listen, 0.5) == []
    record_decision(ctx, NAME, T0 + dt.timedelta(minutes=1), 2, 2)
    assert payloads(listen, 2.0) == [NAME]


def test_an_advisory_decision_notifies_nothing(ctx, listen) -> None:
    """Advisory decisions are never executed, so they wake no listener."""
    workers = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=2, num_decode=2, advisory=True),
        next_state=PlannerState(),
        steps=(),
        reason=ReasonCode.SCALE,
    )
    with ctx.sessions.begin() as session:
        inputs = TickInputs(now_s=T0.timestamp(), loop=Loop.THROUGHPUT, workers=workers)
        record_outcome(session, NAME, inputs, outcome)
    assert payloads(listen, 0.5) == []


def test_the_listener_executes_a_committed_decision_at_once(ctx) -> None:
    """Decision committed -> executed by its NOTIFY well within `BOUND_S` (the fallback poll is 60 s); another
    deployment's notification runs nothing; a rolled-back tick runs nothing."""
    recorder = Recorder(ctx)
    listener = ExecutionListener(ctx.database_url, NAME, recorder, ListenerSettings(fallback_poll_s=60, retry_s=60))
    listener.start()
    try:
        assert listener.listening.wait(10)
        assert recorder.wait_for(lambda runs: len(runs) == 1, 10)  # the catch-up run on connecting
        assert recorder.runs[0][0] is Trigger.CONNECTED and recorder.runs[0][2] == []
        with psycopg.connect(to_libpq_uri(ctx.database_url), autocommit=True) as conn:
            conn.execute(f"NOTIFY {repo.DECISIONS_CHANNEL}, 'someone-else'")
        roll_back_a_tick(ctx, T0)
        time.sleep(0.5)
        assert len(recorder.runs) == 1
        decision_id = record_decision(ctx, NAME, T0, 2, 3)
        committed = time.monotonic()
        assert recorder.wait_for(lambda runs: applied_by(runs, decision_id), BOUND_S)
        [(trigger, started, _)] = [run for run in recorder.runs if applied_by([run], decision_id)]
        latency_s = started - committed
        assert trigger is Trigger.NOTIFY and latency_s < BOUND_S, latency_s
        assert status(ctx, decision_id) == DecisionStatus.APPLIED.value
        assert listener.stats.runs[Trigger.FALLBACK] == 0
    finally:
        began = time.monotonic()
        listener.close()
        assert time.monotonic() - began < 3.0  # bounded waits: stop is seen within a wait slice


def test_a_repeated_notification_executes_nothing_twice(ctx) -> None:
    """A notification for a decision already applied runs the execution, which finds nothing pending."""
    recorder = Recorder(ctx)
    listener = ExecutionListener(ctx.database_url, NAME, recorder, ListenerSettings(fallback_poll_s=60, retry_s=60))
    listener.start()
    try:
        assert listener.listening.wait(10)
        decision_id = record_decision(ctx, NAME, T0, 1, 2)
        assert recorder.wait_for(lambda runs: applied_by(runs, decision_id), BOUND_S + 5)
        executions_before = num_executions(ctx)
        num_runs = len(recorder.runs)
        with psycopg.connect(to_libpq_uri(ctx.database_url), autocommit=True) as conn:
            conn.execute(f"NOTIFY {repo.DECISIONS_CHANNEL}, '{NAME}'")
            conn.execute(f"NOTIFY {repo.DECISIONS_CHANNEL}, '{NAME} '")  # another payload: not ours
        assert recorder.wait_for(lambda runs: len(runs) > num_runs, BOUND_S)
        time.sleep(0.3)
        assert [t for t, _, s in recorder.runs[num_runs:]] == [Trigger.NOTIFY]
        assert recorder.runs[-1][2] == []  # nothing pending: nothing applied again
        assert num_executions(ctx) == executions_before == 1
        assert status(ctx, decision_id) == DecisionStatus.APPLIED.value
    finally:
        listener.close()


def test_a_decision_committed_while_the_listener_was_down_is_executed_on_start(ctx) -> None:
    """No listener when the tick commits (its NOTIFY is lost): the listener's run on connecting executes it."""
    decision_id = record_decision(ctx, NAME, T0, 2, 2)
    recorder = Recorder(ctx)
    listener = ExecutionListener(ctx.database_url, NAME, recorder, ListenerSettings(fallback_poll_s=60, retry_s=60))
    listener.start()
    try:
        assert recorder.wait_for(lambda runs: applied_by(runs, decision_id), 10)
        assert applied_by(recorder.runs, decision_id) == [Trigger.CONNECTED]
    finally:
        listener.close()


def test_without_a_listen_connection_the_fallback_poll_executes(ctx) -> None:
    """LISTEN cannot connect (a database that does not exist): reconnections back off, bounded, and the fallback
    poll still executes the decision within its interval."""
    recorder = Recorder(ctx)
    base, _, query = ctx.database_url.partition("?")
    unreachable = base.rsplit("/", 1)[0] + "/no_such_database" + (f"?{query}" if query else "")
    settings = ListenerSettings(fallback_poll_s=1.0, retry_s=1.0, reconnect_min_s=0.1, reconnect_max_s=0.4)
    listener = ExecutionListener(unreachable, NAME, recorder, settings)
    listener.start()
    try:
        assert recorder.wait_for(lambda runs: len(runs) >= 1, 10)  # the first poll: nothing pending yet
        decision_id = record_decision(ctx, NAME, T0, 2, 2)
        committed = time.monotonic()
        assert recorder.wait_for(lambda runs: applied_by(runs, decision_id), 10)
        assert applied_by(recorder.runs, decision_id) == [Trigger.FALLBACK]
        [started] = [s for _, s, summaries in recorder.runs if applied_by([(None, s, summaries)], decision_id)]
        assert started - committed <= settings.fallback_poll_s + 1.0
        time.sleep(1.0)
        assert not listener.listening.is_set() and listener.stats.num_connects == 0
        # backoff 0.1, 0.2, 0.4, 0.4 ...: over ~2 s a handful of attempts, neither one nor a busy loop
        assert 3 <= listener.stats.num_connect_failures <= 20, listener.stats
    finally:
        began = time.monotonic()
        listener.close()
        assert time.monotonic() - began < 3.0


def test_a_lost_listen_connection_reconnects_and_catches_up(ctx) -> None:
    """The LISTEN backend is terminated; a decision committed before the listener is back is executed by the
    catch-up run on reconnecting (or by its NOTIFY once back), never left to the 60 s fallback."""
    recorder = Recorder(ctx)
    settings = ListenerSettings(fallback_poll_s=60, retry_s=60, reconnect_min_s=0.5)
    listener = ExecutionListener(ctx.database_url, NAME, recorder, settings)
    listener.start()
    try:
        assert listener.listening.wait(10)
        with psycopg.connect(to_libpq_uri(ctx.database_url), autocommit=True) as conn:
            killed = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            ).fetchall()
        assert killed == [(True,)]
        decision_id = record_decision(ctx, NAME, T0, 3, 1)
        assert recorder.wait_for(lambda runs: applied_by(runs, decision_id), 10)
        assert applied_by(recorder.runs, decision_id)[0] in (Trigger.CONNECTED, Trigger.NOTIFY)
        assert listener.stats.num_connects == 2
        assert listener.stats.runs[Trigger.FALLBACK] == 0
    finally:
        listener.close()


def test_a_blocked_decision_is_retried_at_the_retry_cadence(ctx) -> None:
    """The virtual connector holds a decision back while the previous one is unacknowledged: the run that left it
    pending makes the listener retry every `retry_s`, not every `fallback_poll_s`."""
    recorder = Recorder(ctx)
    listener = ExecutionListener(ctx.database_url, NAME, recorder, ListenerSettings(fallback_poll_s=60, retry_s=0.5))
    listener.start()
    try:
        assert listener.listening.wait(10)
        first = record_decision(ctx, NAME, T0, 2, 2)
        assert recorder.wait_for(lambda runs: applied_by(runs, first), BOUND_S + 5)
        second = record_decision(ctx, NAME, T0 + dt.timedelta(minutes=1), 3, 3)  # blocked: first not acknowledged
        assert recorder.wait_for(lambda runs: len(applied_by(runs, second)) >= 3, 10)
        assert applied_by(recorder.runs, second)[0] is Trigger.NOTIFY
        assert set(applied_by(recorder.runs, second)[1:]) == {Trigger.RETRY}
        assert status(ctx, second) == DecisionStatus.PENDING.value
    finally:
        listener.close()


def test_serve_runs_each_execution_as_a_tagged_flow_run(prefect_api_url, ctx, config_file, monkeypatch) -> None:
    """`planner serve`'s listener runs the `execute-decisions` flow in-process on the NOTIFY: a flow run with the
    served deployments' tags and the trigger, and the decision applied."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    from flows.serve import execution_listener
    from planner_core.config import load_config

    monkeypatch.setenv("PLANNER_DATABASE_URL", ctx.database_url)
    path = str(config_file)
    listener = execution_listener(ctx.database_url, NAME, path, load_config(path))
    listener.start()
    try:
        assert listener.listening.wait(30)
        deadline = time.monotonic() + 60
        while listener.stats.num_finished == 0 and time.monotonic() < deadline:  # the catch-up run is done
            time.sleep(0.1)
        decision_id = record_decision(ctx, NAME, T0, 2, 1)
        deadline = time.monotonic() + 30
        while status(ctx, decision_id) != DecisionStatus.APPLIED.value and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status(ctx, decision_id) == DecisionStatus.APPLIED.value
        assert listener.stats.runs[Trigger.NOTIFY] >= 1 and listener.stats.num_run_failures == 0
    finally:
        listener.close(timeout_s=30)

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"deployment:{NAME}", "trigger:notify"]))
            )

    runs = asyncio.run(read())
    assert runs and all({"planner", f"deployment:{NAME}"} <= set(run.tags) for run in runs)
    assert all(run.state_type.value == "COMPLETED" for run in runs)
