"""The decision outbox and the virtual connector, against real Postgres (NOTIFY included)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from sqlalchemy import select

from planner_core.domain import WorkerCounts
from planner_core.runtime.connectors.virtual import VirtualConnector, VirtualConnectorClient
from planner_core.runtime.service import default_workers, load_context, run_execution
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import DecisionRow, ExecutionRow, VirtualConnectorStateRow
from tests.conftest import write_config
from tests.runtime.databases import record_decision

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
NAME = "virtual-test"


@pytest.fixture
def ctx(database_url, tmp_path, profile_dir):
    context = load_context(database_url, NAME, write_config(tmp_path))
    with context.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, context.config)
    return context


@pytest.fixture
def client(ctx):
    with VirtualConnectorClient(ctx.database_url, NAME) as c:
        yield c


def decide(ctx, minute: int, num_prefill: int | None, num_decode: int | None) -> int:
    """Record a tick whose decision is the given targets; returns the decision id."""
    return record_decision(ctx, NAME, T0 + dt.timedelta(minutes=minute), num_prefill, num_decode)


def status(ctx, decision_id: int) -> str:
    with ctx.sessions.begin() as session:
        return session.get(DecisionRow, decision_id).status


def test_dynamo_sequence_decide_ack_decide(ctx, client) -> None:
    """Decision (1, 2) gets virtual id 0; after the ack, (0, 3) gets id 1 (Dynamo's integration example)."""
    assert client.get().decision_id == -1
    first = decide(ctx, 0, 1, 2)
    [summary] = run_execution(ctx, T0)
    assert (summary.outcome.value, summary.status.value) == ("applied", "applied")
    got = client.wait(timeout_s=5)
    assert (got.num_prefill_workers, got.num_decode_workers, got.decision_id) == (1, 2, 0)
    client.complete(got)
    assert status(ctx, first) == "acknowledged"
    second = decide(ctx, 1, 0, 3)
    run_execution(ctx, T0 + dt.timedelta(minutes=1))
    got = client.wait(timeout_s=5)
    assert (got.num_prefill_workers, got.num_decode_workers, got.decision_id) == (0, 3, 1)
    assert status(ctx, second) == "applied"


def test_wait_wakes_on_notify_from_another_connection(ctx, client) -> None:
    """A waiter blocked in wait() returns as soon as the execution flow writes a decision."""
    result: dict = {}

    def waiter() -> None:
        started = time.monotonic()
        result["decision"] = client.wait(timeout_s=20)
        result["waited_s"] = time.monotonic() - started

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.5)
    decide(ctx, 0, 2, 2)
    run_execution(ctx, T0)
    thread.join(timeout=25)
    assert result["decision"].decision_id == 0
    assert 0.4 < result["waited_s"] < 10  # woken by NOTIFY, not by the 20 s timeout


def test_acknowledgement_does_not_wake_wait(ctx, client) -> None:
    """complete() sends no notification: a waiter keeps waiting until its timeout."""
    decide(ctx, 0, 2, 2)
    run_execution(ctx, T0)
    decision = client.wait(timeout_s=5)
    result: dict = {}
    with VirtualConnectorClient(ctx.database_url, NAME) as other:
        other.wait(timeout_s=1)  # consume decision 0 in the second client too

        def waiter() -> None:
            result["decision"] = other.wait(timeout_s=1.5)

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.3)
        client.complete(decision)
        thread.join(timeout=10)
    assert result["decision"] is None


def test_unacknowledged_decision_blocks_newer_ones_until_timeout(ctx, client) -> None:
    """While decision 0 is unacknowledged, decision 1 stays pending; after 1800 s it is written anyway."""
    decide(ctx, 0, 2, 2)
    run_execution(ctx, T0)
    blocked = decide(ctx, 1, 3, 3)
    [first_try] = run_execution(ctx, T0 + dt.timedelta(minutes=1))
    assert first_try.outcome.value == "blocked_unacknowledged" and first_try.status.value == "pending"
    [second_try] = run_execution(ctx, T0 + dt.timedelta(minutes=1, seconds=1799))
    assert second_try.outcome.value == "blocked_unacknowledged" and second_try.attempt == 2
    [third_try] = run_execution(ctx, T0 + dt.timedelta(minutes=1, seconds=1800))
    assert third_try.outcome.value == "applied" and "written anyway" in third_try.detail
    assert status(ctx, blocked) == "applied"
    assert client.get().decision_id == 1
    with ctx.sessions.begin() as session:
        attempts = list(session.scalars(select(ExecutionRow.outcome).where(ExecutionRow.decision_id == blocked)))
    assert attempts == ["blocked_unacknowledged", "blocked_unacknowledged", "applied"]


def test_timeout_is_configurable(database_url, tmp_path, profile_dir) -> None:
    """virtual_connector_timeout_seconds shortens the hold on unacknowledged decisions."""
    ctx = load_context(database_url, NAME, write_config(tmp_path, virtual_connector_timeout_seconds=60))
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, ctx.config)
    decide(ctx, 0, 2, 2)
    run_execution(ctx, T0)
    decide(ctx, 1, 3, 3)
    assert run_execution(ctx, T0 + dt.timedelta(seconds=61))[0].outcome.value == "blocked_unacknowledged"
    assert run_execution(ctx, T0 + dt.timedelta(seconds=121))[0].outcome.value == "applied"


def test_unchanged_targets_are_a_noop(ctx, client) -> None:
    """A decision equal to the current virtual counts writes nothing (Dynamo writes only on change)."""
    decide(ctx, 0, 2, 2)
    run_execution(ctx, T0)
    client.complete(client.wait(timeout_s=5))
    same = decide(ctx, 1, 2, 2)
    [summary] = run_execution(ctx, T0 + dt.timedelta(minutes=1))
    assert summary.outcome.value == "noop" and status(ctx, same) == "noop"
    assert client.get().decision_id == 0


def test_only_the_newest_pending_decision_is_applied(ctx, client) -> None:
    """Older pending decisions are superseded; one execution run applies only the newest."""
    old = decide(ctx, 0, 2, 2)
    new = decide(ctx, 1, 4, 5)
    [summary] = run_execution(ctx, T0 + dt.timedelta(minutes=1))
    assert summary.decision_id == new
    assert status(ctx, old) == "superseded" and status(ctx, new) == "applied"
    got = client.wait(timeout_s=5)
    assert (got.num_prefill_workers, got.num_decode_workers) == (4, 5)
    assert run_execution(ctx, T0 + dt.timedelta(minutes=2)) == []  # nothing pending: nothing done


def test_partial_targets_keep_the_other_pool(ctx, client) -> None:
    """A decision with no opinion on a pool keeps that pool's current count."""
    decide(ctx, 0, 2, 3)
    run_execution(ctx, T0)
    client.complete(client.wait(timeout_s=5))
    decide(ctx, 1, None, 5)
    run_execution(ctx, T0 + dt.timedelta(minutes=1))
    got = client.wait(timeout_s=5)
    assert (got.num_prefill_workers, got.num_decode_workers) == (2, 5)


def test_worker_counts_come_from_reports_and_decisions(ctx, client) -> None:
    """Ready counts are what the orchestrator reported; expected counts are the last written decision."""
    connector = VirtualConnector()
    default = default_workers(ctx.config)
    with ctx.sessions.begin() as session:
        deployment_id = repo.find_deployment(session, NAME).id
        assert connector.worker_counts(session, deployment_id, default=default) == default
    client.report_workers(ready_prefill=2, ready_decode=3)
    decide(ctx, 0, 4, 3)
    run_execution(ctx, T0)
    with ctx.sessions.begin() as session:
        counts = connector.worker_counts(session, deployment_id, default=default)
        row = session.get(VirtualConnectorStateRow, deployment_id)
    assert counts == WorkerCounts(ready_prefill=2, ready_decode=3, expected_prefill=4, expected_decode=3)
    assert counts.scaling_in_progress
    assert (row.decision_id, row.scaled_decision_id) == (0, -1)


def test_client_for_unknown_deployment_fails_clearly(ctx) -> None:
    """A client for a deployment the planner does not manage says so in one line."""
    with pytest.raises(LookupError, match="'nope' is not managed"):
        VirtualConnectorClient(ctx.database_url, "nope")


def test_execution_failure_is_recorded_and_retried(ctx, client) -> None:
    """A connector that raises is recorded as a failed attempt; the decision stays pending until it gives up."""

    class BrokenConnector:
        name = "broken"

        def apply(self, session, decision, now):  # noqa: ARG002 - same signature as a real connector
            raise ConnectionError("orchestrator unreachable")

    from planner_core.runtime.store.execution import MAX_ATTEMPTS, execute_pending

    decision_id = decide(ctx, 0, 2, 2)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        with ctx.sessions.begin() as session:
            deployment_id = repo.find_deployment(session, NAME).id
            [summary] = execute_pending(session, deployment_id, BrokenConnector(), T0)
        assert summary.outcome.value == "failed" and summary.attempt == attempt
        assert "ConnectionError: orchestrator unreachable" in summary.detail
    assert status(ctx, decision_id) == "failed"
    assert client.get().decision_id == -1
