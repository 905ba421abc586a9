"""Other owners of a replica count, and the Events the planner posts on the object it scales.

- `competing_autoscalers`: the HorizontalPodAutoscalers (autoscaling/v2) and KEDA ScaledObjects (keda.sh/v1alpha1)
  of a namespace whose `scaleTargetRef` names an object the planner scales (the DGD or one of its scaling
  adapters, or a Deployment/StatefulSet): each would fight the planner over the count (`planner k8s-check`
  reports them). Listing needs `list` on both; a refusal is said, not hidden (a 404, no such API or CRD, means
  nothing of that kind exists).
- `post_event`: one core/v1 Event on the scaled object (`TickEvent`, at most one per tick), named
  `<object>.<loop>.<tick time in ms, hex>` so a retried post of the same tick answers 409 instead of adding a second
  (the two loops may tick at the same time: each has its own name).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from planner_core.domain import TickEvent

KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
REPORTING_COMPONENT = "llm-planner"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaledTarget:
    """An object the planner scales, as a `scaleTargetRef` names it."""

    kind: str
    name: str


def _refs(items: Sequence[dict[str, Any]], default_kind: str) -> list[tuple[str, str, str]]:
    """(autoscaler name, target kind, target name) of each item's spec.scaleTargetRef."""
    found = []
    for item in items:
        ref = (item.get("spec") or {}).get("scaleTargetRef") or {}
        name = str((item.get("metadata") or {}).get("name", "?"))
        found.append((name, str(ref.get("kind") or default_kind), str(ref.get("name", ""))))
    return found


def competing_autoscalers(
    api_client: k8s_client.ApiClient, namespace: str, targets: Sequence[ScaledTarget], *, timeout_s: float = 10.0
) -> list[str]:
    """One line per HPA or ScaledObject of `namespace` targeting one of `targets`, and one per kind that could not
    be listed (the reason); empty when nothing competes."""
    wanted = {(target.kind, target.name) for target in targets}
    lines: list[str] = []
    try:
        # read as JSON, not the typed model: an HPA the model refuses (a field it requires left out) still competes
        response = k8s_client.AutoscalingV2Api(api_client).list_namespaced_horizontal_pod_autoscaler(
            namespace, _request_timeout=timeout_s, _preload_content=False
        )
        items = json.loads(response.data).get("items") or []
        for name, kind, target in _refs(items, "Deployment"):
            if (kind, target) in wanted:
                lines.append(f"HorizontalPodAutoscaler {namespace}/{name} scales {kind} {target}")
    except ApiException as exc:
        if exc.status != 404:  # 404: the server serves no autoscaling/v2 (or holds no HPA), so none competes
            lines.append(f"HorizontalPodAutoscalers of {namespace} not checked: {exc.status} {exc.reason}")
    try:
        scaled = k8s_client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            KEDA_GROUP, KEDA_VERSION, namespace, KEDA_PLURAL, _request_timeout=timeout_s
        )
        # KEDA's scaleTargetRef.kind defaults to Deployment
        for name, kind, target in _refs(scaled.get("items") or [], "Deployment"):
            if (kind, target) in wanted:
                lines.append(f"ScaledObject {namespace}/{name} scales {kind} {target}")
    except ApiException as exc:
        if exc.status != 404:  # 404: KEDA is not installed, so nothing of it competes
            lines.append(f"ScaledObjects of {namespace} not checked: {exc.status} {exc.reason}")
    return lines


def post_event(
    api_client: k8s_client.ApiClient,
    namespace: str,
    target: ScaledTarget,
    api_version: str,
    event: TickEvent,
    at: dt.datetime,
    *,
    loop: str,
    timeout_s: float = 10.0,
) -> None:
    """Post `event` of the `loop` tick at `at` on `target` (raises ApiException; the caller logs it: an Event is
    never worth a failed tick)."""
    stamp = at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{target.name}.{loop}.{int(at.timestamp() * 1000):x}", "namespace": namespace},
        "involvedObject": {"apiVersion": api_version, "kind": target.kind, "name": target.name, "namespace": namespace},
        "reason": event.reason.value,
        "message": event.message[:1024],
        "type": "Warning" if event.warning else "Normal",
        "source": {"component": REPORTING_COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    k8s_client.CoreV1Api(api_client).create_namespaced_event(namespace, body, _request_timeout=timeout_s)
