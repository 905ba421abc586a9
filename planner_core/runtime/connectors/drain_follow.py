"""Following the drains a Kubernetes scale-down handed over, until each pod is gone (the I/O around `pod_drain`'s
pure `judge_drain` and `substitutes`).

Role: `KubernetesConnector.follow_drains` at every execution run. Given the DGD's pods as listed now, for each open
`handed_over` drain of the deployment: a drain whose pod is still listed and not being deleted while another pod of
its component is being deleted that no drain names takes that pod instead (Kubernetes' choice among equal costs);
a pod seen terminating gets `terminating_at`; then its engine's last forward-pass sample since the drain began (up
to the pod's deadline) and `judge_drain` say whether the drain ended and what it cut, and an ended one is closed
(`store.drains.close_drain`: outcome, reason, cut, audit row). Reads and writes the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from sqlalchemy.orm import Session

from planner_core.runtime.connectors.pod_drain import (
    AwaitedPod,
    FollowedDrain,
    PodState,
    judge_drain,
    pod_engine,
    pod_of_engine,
    substitutes,
)
from planner_core.runtime.engine_load import (
    dynamo_pod_instance_id,
    engine_in_flight,
    in_flight_by_worker,
    last_in_flight,
)
from planner_core.runtime.store.drains import close_drain, mark_terminating, recorded_engines, retarget_drain
from planner_core.runtime.store.models import DrainRow


def follow_pod_drains(
    session: Session,
    drains: Sequence[DrainRow],
    pods: Mapping[str, PodState],
    now: dt.datetime,
    *,
    namespace: str,
    components: Mapping[str, str],
) -> list[str]:
    """Follow `drains` (open, `handed_over`, locked) against `pods` (the DGD's pods by name, listed now);
    `components`: role value -> the DGD component it scales. One line per drain followed."""
    notes = _take_substitutes(session, drains, pods, namespace=namespace, components=components)
    for drain in drains:
        pod = _pod_of(drain, pods, namespace)
        if pod is not None and pod.terminating_at is not None and drain.terminating_at is None:
            grace_s = drain.grace_s if pod.deletion_grace_s is None else pod.deletion_grace_s
            mark_terminating(drain, pod.terminating_at, grace_s)
        view = FollowedDrain(started_at=drain.started_at, grace_s=drain.grace_s, terminating_at=drain.terminating_at)
        worker_ids = drain.worker_ids.split(",") if drain.worker_ids else []
        last = last_in_flight(session, drain.deployment_id, worker_ids, drain.started_at, view.ended_by(pod, now))
        verdict = judge_drain(view, pod, last, now)
        if verdict.outcome is not None and verdict.reason is not None and verdict.ended_at is not None:
            close_drain(
                session,
                drain,
                verdict.outcome,
                verdict.ended_at,
                num_cut=verdict.num_cut,
                reason=verdict.reason,
                last_sample_at=verdict.last_sample_at,
            )
        notes.append(f"{drain.engine}: {verdict.outcome or 'following'}: {verdict.note}")
    return notes


def _pod_of(drain: DrainRow, pods: Mapping[str, PodState], namespace: str) -> PodState | None:
    """The drain's pod as listed now; None when it is gone (or names another namespace's pod)."""
    where = pod_of_engine(drain.engine)
    return pods.get(where[1]) if where is not None and where[0] == namespace else None


def _take_substitutes(
    session: Session,
    drains: Sequence[DrainRow],
    pods: Mapping[str, PodState],
    *,
    namespace: str,
    components: Mapping[str, str],
) -> list[str]:
    """Point each drain whose pod Kubernetes kept at the pod it is removing instead (`pod_drain.substitutes`), with
    that pod's load when the drain began; one line per drain moved."""
    awaited = [
        AwaitedPod(drain_id=drain.id, component=components[drain.role], started_at=drain.started_at)
        for drain in drains
        if drain.role in components
        and (kept := _pod_of(drain, pods, namespace)) is not None
        and kept.deletion_deadline is None
    ]
    if not awaited:
        return []
    terminating = [pod_engine(namespace, p.name) for p in pods.values() if p.terminating_at is not None]
    recorded = {
        where[1]
        for engine in recorded_engines(session, drains[0].deployment_id, terminating)
        if (where := pod_of_engine(engine)) is not None
    }
    by_id = {drain.id: drain for drain in drains}
    notes = []
    for drain_id, pod in substitutes(awaited, pods, recorded).items():
        drain = by_id[drain_id]
        instance_id = dynamo_pod_instance_id(pod.name)
        loads = in_flight_by_worker(session, drain.deployment_id, drain.started_at)
        expected = drain.engine
        retarget_drain(
            session,
            drain,
            engine=pod_engine(namespace, pod.name),
            worker_ids=(instance_id,),
            num_in_flight=engine_in_flight(loads, [instance_id]),
        )
        notes.append(f"{expected}: not deleted; Kubernetes is removing {pod.name} instead: its drain followed")
    return notes
