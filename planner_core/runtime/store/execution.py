"""The decision outbox: apply pending decisions through a connector and record every attempt.

Runs inside the caller's transaction, under the deployment's row lock, so two execution runs can never apply
the same decision twice. Only the newest pending decision of a deployment is applied; older ones are marked
superseded (their targets are stale).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from planner_core.runtime.store.models import DecisionRow, DecisionStatus, ExecutionOutcome, ExecutionRow
from planner_core.runtime.store.repository import lock_deployment, pending_decisions, set_decision_status

MAX_ATTEMPTS = 5  # a decision the connector keeps failing on is given up after this many failed attempts


class ApplyResultLike(Protocol):
    outcome: ExecutionOutcome
    detail: str


class Connector(Protocol):
    """What the execution flow needs of a connector."""

    name: str

    def apply(self, session: Session, decision: DecisionRow, now: dt.datetime) -> ApplyResultLike: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionSummary:
    decision_id: int
    attempt: int
    outcome: ExecutionOutcome
    status: DecisionStatus
    detail: str


_STATUS_AFTER = {
    ExecutionOutcome.APPLIED: DecisionStatus.APPLIED,
    ExecutionOutcome.NOOP: DecisionStatus.NOOP,
}


def execute_pending(
    session: Session, deployment_id: int, connector: Connector, now: dt.datetime
) -> list[ExecutionSummary]:
    """Apply the newest pending decision of a deployment; supersede older ones. Returns what was done."""
    lock_deployment(session, deployment_id)
    pending = pending_decisions(session, deployment_id)
    if not pending:
        return []
    *stale, newest = pending
    for decision in stale:
        set_decision_status(session, decision, DecisionStatus.SUPERSEDED, now, f"newer decision {newest.id}")
    attempt = 1 + (
        session.scalar(select(func.count()).select_from(ExecutionRow).where(ExecutionRow.decision_id == newest.id)) or 0
    )
    try:
        with session.begin_nested():  # a failing connector rolls back only its own writes
            result = connector.apply(session, newest, now)
        outcome, detail = result.outcome, result.detail
    except Exception as exc:  # any connector error is recorded, never lost
        outcome, detail = ExecutionOutcome.FAILED, f"{type(exc).__name__}: {exc}"
    # Only failures count towards giving up: attempts held back (unacknowledged, not ready) are waits, and a
    # long wait followed by one transient error must not fail the decision.
    num_failures = (outcome is ExecutionOutcome.FAILED) + (
        session.scalar(
            select(func.count())
            .select_from(ExecutionRow)
            .where(ExecutionRow.decision_id == newest.id, ExecutionRow.outcome == ExecutionOutcome.FAILED.value)
        )
        or 0
    )
    session.add(
        ExecutionRow(
            decision_id=newest.id,
            attempt=attempt,
            connector=connector.name,
            executed_at=now,
            outcome=outcome.value,
            detail=detail,
        )
    )
    status = _STATUS_AFTER.get(outcome)
    if outcome is ExecutionOutcome.FAILED and num_failures >= MAX_ATTEMPTS:
        status = DecisionStatus.FAILED
    if status is not None:
        set_decision_status(session, newest, status, now, f"attempt {attempt}: {detail}")
    return [
        ExecutionSummary(
            decision_id=newest.id,
            attempt=attempt,
            outcome=outcome,
            status=DecisionStatus(newest.status),
            detail=detail,
        )
    ]
