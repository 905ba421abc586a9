"""Repository of the drain records (`drains`, migration 0025): one row per engine a scale-down removed.

A connector opens a row when it stops routing to an engine (`open_drain`: its requests in flight then) and closes it
when the drain ends (`close_drain`: how it ended and why, the duration, the requests waited for and cut) with an
`engine_drain_ended` audit row. The local connector finds its open row by worker (`open_local_drain`); the
Kubernetes connector follows its handed-over pods (`followed_drains`, `mark_terminating`) until each is gone. Like
every repository here, these functions never commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import DrainEndReason, DrainOutcome, DrainRow


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainStart:
    """One engine whose drain starts: who removes it, which engine, its load and its grace."""

    deployment_id: int
    decision_id: int | None
    connector: str
    role: str
    engine: str  # "local worker 12 (pid 4711)", "pod ns/name"
    worker_ids: Sequence[str]  # its Dynamo instance ids (fpm_samples.worker_id)
    grace_s: float
    num_in_flight: int | None  # None: unknown (no fresh forward-pass sample)
    local_worker_id: int | None = None
    outcome: DrainOutcome = DrainOutcome.DRAINING
    detail: str | None = None


def open_drain(session: Session, start: DrainStart, now: dt.datetime) -> DrainRow:
    """Record the start of a drain (in the caller's transaction)."""
    row = DrainRow(
        deployment_id=start.deployment_id,
        decision_id=start.decision_id,
        connector=start.connector,
        role=start.role,
        engine=start.engine,
        local_worker_id=start.local_worker_id,
        worker_ids=",".join(start.worker_ids) or None,
        started_at=now,
        grace_s=start.grace_s,
        num_in_flight_at_start=start.num_in_flight,
        outcome=start.outcome.value,
        detail=start.detail,
    )
    session.add(row)
    return row


def open_local_drain(session: Session, local_worker_id: int) -> DrainRow | None:
    """The open (`draining`) drain of a local worker; None for a worker drained before drains were recorded."""
    return session.scalar(
        select(DrainRow).where(
            DrainRow.local_worker_id == local_worker_id, DrainRow.outcome == DrainOutcome.DRAINING.value
        )
    )


def followed_drains(session: Session, deployment_id: int, connector: str, *, lock: bool = True) -> list[DrainRow]:
    """The drains a connector handed over and still follows (`handed_over`, not ended), oldest first; `lock`ed for
    the run that may close them (two execution runs never close the same drain twice)."""
    query = (
        select(DrainRow)
        .where(
            DrainRow.deployment_id == deployment_id,
            DrainRow.connector == connector,
            DrainRow.outcome == DrainOutcome.HANDED_OVER.value,
            DrainRow.ended_at.is_(None),
        )
        .order_by(DrainRow.started_at, DrainRow.id)
    )
    return list(session.scalars(query.with_for_update() if lock else query))


def recorded_engines(session: Session, deployment_id: int, engines: Sequence[str]) -> set[str]:
    """Which of `engines` a drain of the deployment names (open or ended)."""
    if not engines:
        return set()
    query = select(DrainRow.engine).where(DrainRow.deployment_id == deployment_id, DrainRow.engine.in_(engines))
    return set(session.scalars(query))


def retarget_drain(
    session: Session, drain: DrainRow, *, engine: str, worker_ids: Sequence[str], num_in_flight: int | None
) -> None:
    """The engine removed is not the one the drain expected: the drain follows `engine` instead, with its load when
    the drain began. Audited as `engine_drain_retargeted`; the detail keeps the expected one."""
    expected = drain.engine
    drain.engine = engine
    drain.worker_ids = ",".join(worker_ids) or None
    drain.num_in_flight_at_start = num_in_flight
    drain.detail = f"{drain.detail + '; ' if drain.detail else ''}removed in place of {expected}"
    repo.audit(
        session,
        "engine_drain_retargeted",
        {"expected": expected, "engine": engine, "role": drain.role, "num_in_flight_at_start": num_in_flight},
        deployment_id=drain.deployment_id,
        decision_id=drain.decision_id,
    )


def mark_terminating(drain: DrainRow, terminating_at: dt.datetime, grace_s: float) -> None:
    """A followed pod was seen terminating: when the kubelet began, and the grace its deletion was given (the one
    honoured, which a `kubectl delete --grace-period` may have changed from the pod spec's)."""
    drain.terminating_at = terminating_at
    drain.grace_s = grace_s


def close_drain(
    session: Session,
    drain: DrainRow,
    outcome: DrainOutcome,
    now: dt.datetime,
    *,
    num_cut: int | None,
    reason: DrainEndReason,
    last_sample_at: dt.datetime | None = None,
) -> None:
    """Complete a drain: its outcome and why, its end and duration; waited for = its requests in flight at the start
    (none for a pod that was not removed); `num_cut` those still in flight when it ended (None: unknown);
    `last_sample_at` when the sample they were counted from arrived. Audited as `engine_drain_ended`."""
    drain.outcome = outcome.value
    drain.end_reason = reason.value
    drain.ended_at = now
    drain.duration_s = (now - drain.started_at).total_seconds()
    drain.num_waited_for = None if outcome is DrainOutcome.NOT_REMOVED else drain.num_in_flight_at_start
    drain.num_cut = num_cut
    drain.last_sample_at = last_sample_at
    repo.audit(
        session,
        "engine_drain_ended",
        {
            "engine": drain.engine,
            "role": drain.role,
            "outcome": outcome.value,
            "reason": reason.value,
            "num_in_flight_at_start": drain.num_in_flight_at_start,
            "num_cut": num_cut,
            "grace_s": drain.grace_s,
            "duration_s": round(drain.duration_s, 3),
        },
        deployment_id=drain.deployment_id,
        decision_id=drain.decision_id,
    )
