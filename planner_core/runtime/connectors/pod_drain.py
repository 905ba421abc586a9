"""Drain before removal on Kubernetes: before a component's replicas are lowered, its pods get a deletion cost from
their load, so that the ReplicaSet controller removes the least-loaded ones.

Kubernetes picks which pods a lowered replica count removes: pods not yet ready first, then the lowest
`controller.kubernetes.io/pod-deletion-cost` annotation (an int32; absent = 0). Each pod of the component
(found by the Dynamo operator's labels `nvidia.com/dynamo-graph-deployment-name` and `nvidia.com/dynamo-component`)
gets as its cost the requests it has in flight, from its engine's newest forward-pass sample (the engine is found by
the instance id Dynamo's Kubernetes discovery derives from the pod name, `engine_load.dynamo_pod_instance_id`); a
pod whose load is unknown gets one more than the busiest known pod (it may be busy). With no load known for any pod
nothing is written (Kubernetes' own order holds). The drain itself is the pod's: the kubelet sends SIGTERM (Dynamo's
runtime deregisters the engine and finishes its requests) and SIGKILL after the pod's
`terminationGracePeriodSeconds`, which each drain record carries as its grace.

The planner then follows each pod it expected to go, by name, until it is gone (`judge_drain`, at every execution
run): once the pod has left the API server, its drain cut what its engine's last forward-pass sample still held
in flight (none: `completed`; some: `cut`; no sample since the drain began: `unobserved`); a pod still listed past
its deletion deadline (`metadata.deletionTimestamp`, when the kubelet SIGKILLs) cut what its last sample before
the deadline held (`grace_expired`); a pod never deleted is, after `NOT_DELETED_AFTER_S`, `not_removed`. When
Kubernetes removes another pod of the component than the one expected (`substitutes`), the drain follows that one.

`planned_removals` and `judge_drain` are pure; `PodDrainer` makes the API calls (list pods of the component or of the
DGD, merge-patch the annotation of each pod whose cost changes).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client

from planner_core.runtime.engine_load import LastLoad, dynamo_pod_instance_id, engine_in_flight
from planner_core.runtime.store.models import DrainEndReason, DrainOutcome

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DGD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
COMPONENT_LABEL = "nvidia.com/dynamo-component"
DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
# Following a drain to its end:
KILL_MARGIN_S = 5.0  # past its deletion deadline the kubelet has SIGKILLed the pod; its object may linger seconds
SETTLE_S = 2.0  # the ingest writes samples every 0.5 s: one younger than this may not be the engine's last stored
NOT_DELETED_AFTER_S = 300.0  # the DGD operator and the ReplicaSet controller delete a pod within seconds, not minutes


@dataclass(frozen=True, slots=True, kw_only=True)
class PodLoad:
    """One pod of a component: its name, whether it is ready, its requests in flight (None: unknown), its grace."""

    name: str
    ready: bool
    num_in_flight: int | None
    grace_s: float
    instance_id: str
    cost: int | None = None  # the deletion cost it carries now


def pod_engine(namespace: str, name: str) -> str:
    """A pod's name in `drains.engine`."""
    return f"pod {namespace}/{name}"


def pod_of_engine(engine: str) -> tuple[str, str] | None:
    """(namespace, name) of a pod's `drains.engine`; None for another connector's engine."""
    kind, _, path = engine.partition(" ")
    namespace, sep, name = path.partition("/")
    return (namespace, name) if kind == "pod" and sep and name else None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodState:
    """A listed pod, and its deletion if one is under way: the kubelet SIGKILLs it at `deletion_deadline`
    (`metadata.deletionTimestamp`), `deletion_grace_s` after its termination began."""

    name: str
    component: str = ""  # its `nvidia.com/dynamo-component` label
    deletion_deadline: dt.datetime | None = None
    deletion_grace_s: float | None = None

    @property
    def terminating_at(self) -> dt.datetime | None:
        """When the kubelet began terminating it (SIGTERM): its deadline less its deletion grace."""
        if self.deletion_deadline is None:
            return None
        return self.deletion_deadline - dt.timedelta(seconds=self.deletion_grace_s or 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowedDrain:
    """What judging a handed-over drain needs of its record: when it began, its grace, and when the kubelet began
    terminating its pod (None: not seen terminating)."""

    started_at: dt.datetime
    grace_s: float
    terminating_at: dt.datetime | None = None

    def ended_by(self, pod: PodState | None, now: dt.datetime) -> dt.datetime:
        """The latest the drain can have ended: its pod's deletion deadline (the kubelet SIGKILLs the engine then)
        once known, else now. Samples after it do not count, and a drain that ended is recorded as ended then."""
        if pod is not None and pod.deletion_deadline is not None:
            return min(now, pod.deletion_deadline)
        if self.terminating_at is not None:
            return min(now, self.terminating_at + dt.timedelta(seconds=self.grace_s))
        return now


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainVerdict:
    """What one follow found: the drain's end (`outcome` set) or that it goes on (`outcome` None), and a line."""

    note: str
    outcome: DrainOutcome | None = None
    reason: DrainEndReason | None = None
    ended_at: dt.datetime | None = None
    num_cut: int | None = None
    last_sample_at: dt.datetime | None = None


def _ended(reason: DrainEndReason, last: LastLoad | None, ended_at: dt.datetime, note: str) -> DrainVerdict:
    """A drain that ended: cut = what the engine's last sample held in flight; unknown without a sample."""
    if last is None:
        return DrainVerdict(
            note=f"{note}; no forward-pass sample of its engine since the drain began",
            outcome=DrainOutcome.UNOBSERVED,
            reason=reason,
            ended_at=ended_at,
        )
    return DrainVerdict(
        note=f"{note}; {last.num_in_flight} in flight at its last sample ({last.received_at:%H:%M:%S.%f})",
        outcome=DrainOutcome.COMPLETED if last.num_in_flight == 0 else DrainOutcome.CUT,
        reason=reason,
        ended_at=ended_at,
        num_cut=last.num_in_flight,
        last_sample_at=last.received_at,
    )


def judge_drain(drain: FollowedDrain, pod: PodState | None, last: LastLoad | None, now: dt.datetime) -> DrainVerdict:
    """Whether a handed-over pod's drain has ended and what it cut, from the pod as listed now (None: gone) and its
    engine's newest sample since the drain began up to `drain.ended_by(pod, now)` (`last`)."""
    ended_at = drain.ended_by(pod, now)
    if pod is None:
        if last is not None and (now - last.received_at).total_seconds() < SETTLE_S:
            return DrainVerdict(note=f"gone; waiting {SETTLE_S:g} s for the ingest to store its engine's last samples")
        return _ended(DrainEndReason.POD_GONE, last, ended_at, "gone")
    if pod.deletion_deadline is not None:
        if now < pod.deletion_deadline + dt.timedelta(seconds=KILL_MARGIN_S):
            return DrainVerdict(note=f"terminating, grace ends {pod.deletion_deadline:%H:%M:%S}")
        return _ended(DrainEndReason.GRACE_EXPIRED, last, ended_at, f"still there {KILL_MARGIN_S:g} s past its grace")
    waited_s = (now - drain.started_at).total_seconds()
    if waited_s < NOT_DELETED_AFTER_S:
        return DrainVerdict(note=f"not deleted yet ({waited_s:.0f} s after the scale-down)")
    return DrainVerdict(
        note=f"not deleted {waited_s:.0f} s after the scale-down, and no pod seen deleted in its place",
        outcome=DrainOutcome.NOT_REMOVED,
        reason=DrainEndReason.POD_NOT_DELETED,
        ended_at=now,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitedPod:
    """A followed drain whose pod is listed but not being deleted: the drain, its pod's component, its start."""

    drain_id: int
    component: str
    started_at: dt.datetime


def substitutes(
    awaited: Sequence[AwaitedPod], pods: Mapping[str, PodState], recorded: Collection[str]
) -> dict[int, PodState]:
    """Drain id -> the pod Kubernetes is removing in place of the one the drain expected (equal costs leave its
    choice open): a pod of the same component being deleted, whose termination began after the drain started, that
    no drain names (`recorded`: pod names); the oldest drain takes the earliest such pod."""
    free = sorted(
        (p for p in pods.values() if p.terminating_at is not None and p.name not in recorded),
        key=lambda p: (p.terminating_at, p.name),
    )
    found: dict[int, PodState] = {}
    for drain in sorted(awaited, key=lambda a: (a.started_at, a.drain_id)):
        for pod in free:
            began = pod.terminating_at
            if pod.component == drain.component and began is not None and began >= drain.started_at:
                found[drain.drain_id] = pod
                free.remove(pod)
                break
    return found


def deletion_costs(pods: Sequence[PodLoad]) -> dict[str, int]:
    """Pod name -> deletion cost: its in-flight requests; unknown = the busiest known + 1; {} when none is known."""
    known = [p.num_in_flight for p in pods if p.num_in_flight is not None]
    if not known:
        return {}
    unknown_cost = max(known) + 1
    return {p.name: unknown_cost if p.num_in_flight is None else p.num_in_flight for p in pods}


def planned_removals(pods: Sequence[PodLoad], costs: Mapping[str, int], num_remove: int) -> list[PodLoad]:
    """The pods Kubernetes removes first given `costs`: not ready first, then the lowest cost (name as tie-break:
    the controller's own further criteria are not modelled, so which of equal-cost pods goes is not certain)."""
    order = sorted(pods, key=lambda p: (p.ready, costs.get(p.name, p.cost or 0), p.name))
    return order[: max(0, num_remove)]


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _pod_state(pod: Mapping[str, Any]) -> PodState:
    metadata = pod.get("metadata") or {}
    deadline = metadata.get("deletionTimestamp")
    grace = metadata.get("deletionGracePeriodSeconds")
    return PodState(
        name=metadata["name"],
        component=(metadata.get("labels") or {}).get(COMPONENT_LABEL, ""),
        deletion_deadline=None if deadline is None else dt.datetime.fromisoformat(deadline),
        deletion_grace_s=None if grace is None else float(grace),
    )


def _cost(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(DELETION_COST)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class PodDrainer:
    """Lists a component's pods and writes their deletion costs (the API calls of the drain on Kubernetes)."""

    def __init__(self, api_client: k8s_client.ApiClient, namespace: str, *, timeout_s: float) -> None:
        self.api = k8s_client.CoreV1Api(api_client)
        self.namespace = namespace
        self._timeout_s = timeout_s

    def pods(self, dgd_name: str, component: str, loads: Mapping[str, int]) -> list[PodLoad]:
        """The component's pods that are not being deleted, each with its load from `loads` (worker id -> in
        flight)."""
        selector = f"{DGD_LABEL}={dgd_name},{COMPONENT_LABEL}={component}"
        listed = self.api.api_client.sanitize_for_serialization(
            self.api.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=self._timeout_s)
        )
        found = []
        for pod in listed.get("items") or []:
            metadata = pod.get("metadata") or {}
            if metadata.get("deletionTimestamp"):
                continue  # already going
            instance_id = dynamo_pod_instance_id(metadata["name"])
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
            found.append(
                PodLoad(
                    name=metadata["name"],
                    ready=_ready(pod),
                    num_in_flight=engine_in_flight(loads, [instance_id]),
                    grace_s=float(DEFAULT_GRACE_S if grace is None else grace),
                    instance_id=instance_id,
                    cost=_cost(pod),
                )
            )
        return sorted(found, key=lambda p: p.name)

    def pod_states(self, dgd_name: str) -> dict[str, PodState]:
        """Every pod of the DGD (terminating ones too), by name."""
        listed = self.api.api_client.sanitize_for_serialization(
            self.api.list_namespaced_pod(
                self.namespace, label_selector=f"{DGD_LABEL}={dgd_name}", _request_timeout=self._timeout_s
            )
        )
        states = (_pod_state(pod) for pod in listed.get("items") or [])
        return {state.name: state for state in states}

    def set_costs(self, pods: Sequence[PodLoad], costs: Mapping[str, int], call: Callable[[str, Callable], Any]) -> int:
        """Merge-patch the deletion cost of every pod whose cost changes (through `call`, the connector's retrying
        wrapper); how many were written."""
        written = 0
        for pod in pods:
            cost = costs.get(pod.name)
            if cost is None or cost == pod.cost:
                continue
            body = {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
            call(
                f"annotate pod {pod.name}",
                lambda name=pod.name, body=body: self.api.patch_namespaced_pod(
                    name, self.namespace, body, _request_timeout=self._timeout_s
                ),
            )
            written += 1
        return written
