"""Detect a replica count changed outside the planner (the runtime side of `planner_core.policy.ownership`).

The cluster connectors (`kubernetes`, `kubernetes-workloads`) read the count in force (the DGDSA or workload
`scale`, `WorkerCounts.expected`); the decisions table says what the planner applied. A pool whose count in force
is neither the target of the planner's newest applied decision for it (status applied, noop or acknowledged) nor
the target of a newer decision still in flight (pending, or failed after a partial write) was changed by someone
else: an HPA, `kubectl scale`, an operator. The difference is handed to the tick as an `OutsideChange`; the rule
is the core's. A pool the planner never applied anything to has no count of the planner's to compare with.

The local connector owns its processes (a worker that died is replaced, nobody else starts one) and the virtual
connector's count is the orchestrator's acknowledgement of the planner's own target, so neither reports outside
changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from planner_core.domain import Component, OutsideChange, WorkerCounts
from planner_core.runtime.store.models import DecisionRow, DecisionStatus

# Decisions whose targets were written to (or found on) the cluster.
_APPLIED = (DecisionStatus.APPLIED.value, DecisionStatus.NOOP.value, DecisionStatus.ACKNOWLEDGED.value)
# Decisions newer than the applied one whose targets may be in force already (a write in flight or a partial one).
_IN_FLIGHT = (DecisionStatus.PENDING.value, DecisionStatus.FAILED.value)
# How far back to look for the newest applied decision: a pool not decided for this many decisions is not compared.
_MAX_DECISIONS = 200


def outside_changes(
    session: Session, deployment_id: int, workers: WorkerCounts, components: Sequence[Component]
) -> tuple[OutsideChange, ...]:
    """The managed pools whose count in force (`workers.expected`) the planner did not set, in pool order."""
    rows = session.execute(
        select(DecisionRow.status, DecisionRow.target_prefill, DecisionRow.target_decode)
        .where(DecisionRow.deployment_id == deployment_id)
        .order_by(DecisionRow.id.desc())
        .limit(_MAX_DECISIONS)
    ).all()
    changes: list[OutsideChange] = []
    for component in components:
        in_flight: set[int] = set()
        for status, prefill, decode in rows:
            target = prefill if component is Component.PREFILL else decode
            if target is None:
                continue
            if status in _IN_FLIGHT:
                in_flight.add(target)
            elif status in _APPLIED:
                observed = workers.expected(component)
                if observed != target and observed not in in_flight:
                    changes.append(
                        OutsideChange(component=component, planner_replicas=target, observed_replicas=observed)
                    )
                break
    return tuple(changes)
