"""The virtual connector: scale targets handed to any orchestrator through Postgres.

Dynamo keeps four keys per namespace in etcd (`num_prefill_workers`, `num_decode_workers`, `decision_id`,
`scaled_decision_id`); here they are one row of `virtual_connector_state` per deployment, with the same
semantics:

- the planner writes only when a count changes; `decision_id` starts at -1 (unset) and increments per write;
- while the previous decision is unacknowledged (`scaled_decision_id < decision_id`) newer decisions wait, until
  `timeout_s` (1800 s by default) has passed since the first one was held back, then they are written anyway;
- every write sends a Postgres NOTIFY on `planner_virtual_decisions`, which wakes `VirtualConnectorClient.wait()`;
  acknowledgements (`complete()`) send nothing, so they never wake a waiter.

The planner side (`VirtualConnector`) works inside the caller's transaction; the client owns its connections.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass

import psycopg
from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from planner_core.domain import WorkerCounts
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.models import (
    DecisionRow,
    DecisionStatus,
    ExecutionOutcome,
    VirtualConnectorStateRow,
    VirtualDecisionRow,
)

NOTIFY_CHANNEL = "planner_virtual_decisions"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerDecision:
    """What the orchestrator reads: target worker counts and the decision's id (-1 = nothing decided yet)."""

    num_prefill_workers: int
    num_decode_workers: int
    decision_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    outcome: ExecutionOutcome
    detail: str
    virtual_decision_id: int | None = None


def _state_row(session: Session, deployment_id: int, *, lock: bool) -> VirtualConnectorStateRow:
    """The deployment's row, made on first use. Read first: every tick reads it, and only a deployment's first
    read needs the insert (a statement a tick would otherwise send every time)."""
    query = select(VirtualConnectorStateRow).where(VirtualConnectorStateRow.deployment_id == deployment_id)
    if lock:
        query = query.with_for_update()
    query = query.execution_options(populate_existing=True)
    row = session.scalar(query)
    if row is None:
        session.execute(
            pg_insert(VirtualConnectorStateRow)
            .values(deployment_id=deployment_id)
            .on_conflict_do_nothing(index_elements=["deployment_id"])
        )
        row = session.scalar(query)
    assert row is not None
    return row


class VirtualConnector:
    """Planner side of the virtual connector."""

    name = "virtual"

    def __init__(self, timeout_s: float = 1800.0) -> None:
        self.timeout_s = timeout_s

    def worker_counts(self, session: Session, deployment_id: int, *, default: WorkerCounts) -> WorkerCounts:
        """Ready counts as the orchestrator reported them; expected = the last written decision.

        Pools the orchestrator never reported fall back to `default` (e.g. the minimum endpoints).
        """
        row = _state_row(session, deployment_id, lock=False)
        ready_prefill = row.ready_prefill_workers if row.ready_prefill_workers >= 0 else default.ready_prefill
        ready_decode = row.ready_decode_workers if row.ready_decode_workers >= 0 else default.ready_decode
        if row.decision_id >= 0:
            expected_prefill, expected_decode = row.num_prefill_workers, row.num_decode_workers
        else:
            expected_prefill, expected_decode = ready_prefill, ready_decode
        return WorkerCounts(
            ready_prefill=ready_prefill,
            ready_decode=ready_decode,
            expected_prefill=expected_prefill,
            expected_decode=expected_decode,
        )

    def apply(self, session: Session, decision: DecisionRow, now: dt.datetime) -> ApplyResult:
        """Write a decision's targets if they change the counts and the previous one was acknowledged."""
        row = _state_row(session, decision.deployment_id, lock=True)
        target_prefill = decision.target_prefill if decision.target_prefill is not None else row.num_prefill_workers
        target_decode = decision.target_decode if decision.target_decode is not None else row.num_decode_workers
        if (target_prefill, target_decode) == (row.num_prefill_workers, row.num_decode_workers):
            return ApplyResult(outcome=ExecutionOutcome.NOOP, detail="targets equal the current virtual counts")
        overdue = ""
        if row.scaled_decision_id < row.decision_id:
            if row.first_skip_at is None:
                row.first_skip_at = now
            waited_s = (now - row.first_skip_at).total_seconds()
            if waited_s < self.timeout_s:
                return ApplyResult(
                    outcome=ExecutionOutcome.BLOCKED_UNACKNOWLEDGED,
                    detail=(
                        f"virtual decision {row.decision_id} not acknowledged "
                        f"(held {waited_s:.0f} s of {self.timeout_s:.0f} s)"
                    ),
                )
            overdue = f"; decision {row.decision_id} unacknowledged for {waited_s:.0f} s, written anyway"
        row.decision_id += 1
        row.num_prefill_workers = target_prefill
        row.num_decode_workers = target_decode
        row.first_skip_at = None
        row.updated_at = now
        session.add(
            VirtualDecisionRow(
                deployment_id=decision.deployment_id,
                decision_id=row.decision_id,
                planner_decision_id=decision.id,
                num_prefill_workers=target_prefill,
                num_decode_workers=target_decode,
                written_at=now,
            )
        )
        payload = json.dumps({"deployment_id": decision.deployment_id, "decision_id": row.decision_id})
        session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": NOTIFY_CHANNEL, "payload": payload})
        return ApplyResult(
            outcome=ExecutionOutcome.APPLIED,
            detail=f"virtual decision {row.decision_id}: {target_prefill} prefill, {target_decode} decode{overdue}",
            virtual_decision_id=row.decision_id,
        )


class VirtualConnectorClient:
    """Orchestrator side: follow the planner's decisions for one deployment and acknowledge them.

    `wait()` blocks until a decision newer than the last one this client returned is written (it wakes on
    Postgres NOTIFY; acknowledgements do not wake it), `get()` reads the current decision, and
    `complete(decision)` acknowledges it once the orchestrator has reached the targets.
    """

    def __init__(self, database_url: str, deployment_name: str) -> None:
        self._uri = to_libpq_uri(database_url)
        self._deployment_name = deployment_name
        self._listen_conn = psycopg.connect(self._uri, autocommit=True)
        self._listen_conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        self._deployment_id = self._lookup_deployment_id()
        self._last_seen_decision_id = -1

    def close(self) -> None:
        self._listen_conn.close()

    def __enter__(self) -> VirtualConnectorClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _lookup_deployment_id(self) -> int:
        with psycopg.connect(self._uri) as conn:
            row = conn.execute("SELECT id FROM deployments WHERE name = %s", (self._deployment_name,)).fetchone()
        if row is None:
            raise LookupError(f"deployment '{self._deployment_name}' is not managed by the planner")
        return int(row[0])

    def get(self) -> PlannerDecision:
        """The current decision (`decision_id` -1 when the planner has written none)."""
        with psycopg.connect(self._uri) as conn:
            row = conn.execute(
                "SELECT num_prefill_workers, num_decode_workers, decision_id FROM virtual_connector_state "
                "WHERE deployment_id = %s",
                (self._deployment_id,),
            ).fetchone()
        if row is None:
            return PlannerDecision(num_prefill_workers=-1, num_decode_workers=-1, decision_id=-1)
        return PlannerDecision(num_prefill_workers=row[0], num_decode_workers=row[1], decision_id=row[2])

    def wait(self, timeout_s: float | None = None) -> PlannerDecision | None:
        """Block until a decision newer than the last one returned exists; None on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            decision = self.get()
            if decision.decision_id > self._last_seen_decision_id:
                self._last_seen_decision_id = decision.decision_id
                return decision
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining == 0.0:
                return None
            if not self._wait_for_notify(remaining):
                return None

    def _wait_for_notify(self, timeout_s: float | None) -> bool:
        """Wait for a NOTIFY about this deployment; False on timeout."""
        for notify in self._listen_conn.notifies(timeout=timeout_s):
            if json.loads(notify.payload).get("deployment_id") == self._deployment_id:
                return True
        return False

    def report_workers(self, *, ready_prefill: int, ready_decode: int) -> None:
        """Tell the planner how many workers serve now (Dynamo learns this from endpoint discovery)."""
        with psycopg.connect(self._uri) as conn:
            conn.execute(
                "INSERT INTO virtual_connector_state (deployment_id) VALUES (%s) ON CONFLICT DO NOTHING",
                (self._deployment_id,),
            )
            conn.execute(
                "UPDATE virtual_connector_state SET ready_prefill_workers = %s, ready_decode_workers = %s "
                "WHERE deployment_id = %s",
                (ready_prefill, ready_decode, self._deployment_id),
            )

    def complete(self, decision: PlannerDecision, *, at: dt.datetime | None = None) -> None:
        """Acknowledge `decision`: the orchestrator reached its targets (`at` defaults to the database clock)."""
        acknowledge(self._uri, self._deployment_id, decision.decision_id, at=at)


def acknowledge(
    libpq_uri: str,
    deployment_id: int,
    virtual_decision_id: int,
    *,
    at: dt.datetime | None = None,
    by: str | None = None,
) -> bool:
    """Acknowledge virtual decision `virtual_decision_id` of a deployment; False if it was already acknowledged.

    Marks the planner's decision `acknowledged` and appends a `virtual_acknowledged` audit row; `by` names who
    acknowledged and on what grounds when that is not "the orchestrator reached the targets" (the KEDA scaler
    acknowledges when it has served the targets). `at` defaults to the database clock.
    """
    with psycopg.connect(libpq_uri) as conn:
        acknowledged_at = at or conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        conn.execute(
            "UPDATE virtual_connector_state SET scaled_decision_id = GREATEST(scaled_decision_id, %s) "
            "WHERE deployment_id = %s",
            (virtual_decision_id, deployment_id),
        )
        row = conn.execute(
            "UPDATE virtual_decisions SET acknowledged_at = %s "
            "WHERE deployment_id = %s AND decision_id = %s AND acknowledged_at IS NULL "
            "RETURNING planner_decision_id",
            (acknowledged_at, deployment_id, virtual_decision_id),
        ).fetchone()
        if row is None:
            return False  # already acknowledged: completing twice is harmless
        planner_decision_id = row[0]
        conn.execute(
            "UPDATE decisions SET status = %s, status_changed_at = %s WHERE id = %s AND status = %s",
            (
                DecisionStatus.ACKNOWLEDGED.value,
                acknowledged_at,
                planner_decision_id,
                DecisionStatus.APPLIED.value,
            ),
        )
        detail = {"virtual_decision_id": virtual_decision_id, "at": acknowledged_at.isoformat()}
        if by is not None:
            detail["by"] = by
        conn.execute(
            "INSERT INTO audit_log (deployment_id, decision_id, event, detail) VALUES (%s, %s, %s, %s)",
            (deployment_id, planner_decision_id, "virtual_acknowledged", json.dumps(detail)),
        )
    return True
