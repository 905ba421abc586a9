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

`planned_removals` is pure; `PodDrainer` makes the API calls (list pods of the component, merge-patch the annotation
of each pod whose cost changes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client

from planner_core.runtime.engine_load import dynamo_pod_instance_id, engine_in_flight

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DGD_LABEL = "nvidia.com/dynamo-graph-deployment-name"
COMPONENT_LABEL = "nvidia.com/dynamo-component"
DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds


@dataclass(frozen=True, slots=True, kw_only=True)
class PodLoad:
    """One pod of a component: its name, whether it is ready, its requests in flight (None: unknown), its grace."""

    name: str
    ready: bool
    num_in_flight: int | None
    grace_s: float
    instance_id: str
    cost: int | None = None  # the deletion cost it carries now


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
