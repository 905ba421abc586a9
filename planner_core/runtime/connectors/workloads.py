"""The workload connector: scale a plain Kubernetes Deployment or StatefulSet per role, through its scale subresource.

Role: the connector of `environment: kubernetes-workloads`, for serving stacks that are not a Dynamo
DynamoGraphDeployment. The config's `kubernetes_workloads` names, per role the mode manages (`prefill`,
`decode`, or the one `aggregated` pool, the planner's decode role), an apps/v1 workload by name or by label
selector. Decisions are written to the workload's `scale` subresource; ready and expected worker counts come
from the workload's status and spec.

It keeps the guarantees of the DGD connector (`kubernetes.py`, whose errors, retry policy and settings it
reuses):

- start-up (`WorkloadConnector.connect`) finds every workload; a selector matching none or several, a missing
  workload or an unresolvable model name is one line naming the workload, the field and the value;
- a target is written only when it differs from the replicas in force (the scale's `spec.replicas`);
- nothing is written while any managed workload is rolling out (`rollout_problem`: being deleted, newest
  generation not observed, replicas not yet updated or available, a StatefulSet's revisions differing): the
  attempt is `blocked_not_ready` with the workload, a reason code and the numbers, and the decision stays pending;
- every write is a PUT of the scale carrying the resourceVersion read just before it, so a concurrent writer
  makes it fail with 409 Conflict instead of being overwritten; 409, 429, 5xx and connection errors re-read and
  retry with bounded exponential backoff, each retry listed in the attempt's detail.

Nothing here touches the database: `store.execution.execute_pending` records each attempt in the caller's
transaction. The API calls are exactly those `infra/k8s/workloads/planner-workloads-rbac.yaml` grants (get and list
on the workloads, get and update on their scale: `REQUIRED_ACCESS`).
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from sqlalchemy.orm import Session

from planner_core.config import KubernetesWorkloadsConfig, PlannerConfig, WorkloadKind, WorkloadRef
from planner_core.domain import Component, WorkerCounts
from planner_core.runtime.connectors.dgd import _gpu_quantity, _main_container
from planner_core.runtime.connectors.k8s_api import ApiAccess
from planner_core.runtime.connectors.kubernetes import (
    GPU_RESOURCE_KEYS,
    SERVICE_ACCOUNT_NAMESPACE_FILE,
    ApplyResult,
    KubernetesApiError,
    KubernetesConnectorError,
    KubernetesSettings,
    RetryPolicy,
    api_client_from_environment,
    fill_config,
    load_settings,
    model_name_of,
    resolve_namespace,
    with_retries,
    write_pool_targets,
)
from planner_core.runtime.store.models import DecisionRow, ExecutionOutcome

RBAC_FILE = "infra/k8s/workloads/planner-workloads-rbac.yaml"


# --------------------------------------------------------------------------------------------------------
# The API calls per kind (the only ones the connector makes; the RBAC manifest grants exactly these)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _KindApi:
    plural: str
    read: str
    list: str
    read_scale: str
    replace_scale: str


_APIS: dict[WorkloadKind, _KindApi] = {
    WorkloadKind.DEPLOYMENT: _KindApi(
        plural="deployments",
        read="read_namespaced_deployment",
        list="list_namespaced_deployment",
        read_scale="read_namespaced_deployment_scale",
        replace_scale="replace_namespaced_deployment_scale",
    ),
    WorkloadKind.STATEFUL_SET: _KindApi(
        plural="statefulsets",
        read="read_namespaced_stateful_set",
        list="list_namespaced_stateful_set",
        read_scale="read_namespaced_stateful_set_scale",
        replace_scale="replace_namespaced_stateful_set_scale",
    ),
}


def required_access(kind: WorkloadKind, *, by_selector: bool = True) -> tuple[ApiAccess, ...]:
    """The requests the connector makes on workloads of `kind`: get (found by name), list (found by a label
    selector: only when `by_selector`), and get and update of the scale subresource."""
    plural = _APIS[kind].plural
    return (
        ApiAccess(group="apps", resource=plural, verb="get"),
        *((ApiAccess(group="apps", resource=plural, verb="list"),) if by_selector else ()),
        ApiAccess(group="apps", resource=plural, subresource="scale", verb="get"),
        ApiAccess(group="apps", resource=plural, subresource="scale", verb="update"),
    )


REQUIRED_ACCESS = tuple(access for kind in WorkloadKind for access in required_access(kind))
"""Every request the connector can make, for both kinds: what RBAC_FILE's Role grants."""


# --------------------------------------------------------------------------------------------------------
# Rules over a workload's JSON (pure)
# --------------------------------------------------------------------------------------------------------


class RolloutReason(enum.StrEnum):
    """Why a workload must not be scaled now (the reason code in a `blocked_not_ready` attempt)."""

    DELETING = "deleting"  # metadata.deletionTimestamp set
    GENERATION_NOT_OBSERVED = "generation_not_observed"  # the controller has not acted on the newest spec
    REPLICAS_NOT_UPDATED = "replicas_not_updated"  # fewer pods on the newest template than spec.replicas
    OLD_REPLICAS_PENDING = "old_replicas_pending"  # Deployment: old pods still running beside the new ones
    REPLICAS_NOT_AVAILABLE = "replicas_not_available"  # fewer available (ready) pods than spec.replicas
    REVISION_ROLLING = "revision_rolling"  # StatefulSet: currentRevision != updateRevision


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutProblem:
    reason: RolloutReason
    detail: str  # the fields and numbers behind the reason, e.g. "status.updatedReplicas 1 < spec.replicas 2"

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}"


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | str) and str(value).lstrip("-").isdigit() else 0


def spec_replicas(workload: Mapping[str, Any]) -> int:
    """The replicas in force: `spec.replicas` (1 when unset, the API server's default)."""
    value = (workload.get("spec") or {}).get("replicas")
    return 1 if value is None else _int(value)


def ready_replicas(workload: Mapping[str, Any]) -> int:
    """Replicas serving traffic: `status.availableReplicas` when reported, else `status.readyReplicas`."""
    status = workload.get("status") or {}
    available = status.get("availableReplicas")
    return _int(available if available is not None else status.get("readyReplicas"))


def rollout_problem(kind: WorkloadKind, workload: Mapping[str, Any]) -> RolloutProblem | None:
    """Why `workload` is rolling out (and must not be scaled), or None when it is settled.

    Deployment (as `kubectl rollout status`): newest generation observed, every replica updated, no old replica
    left, every replica available. StatefulSet: newest generation observed, `currentRevision` equal to
    `updateRevision`, every replica updated and available (ready when the status has no availableReplicas).
    """
    metadata = workload.get("metadata") or {}
    status = workload.get("status") or {}
    if metadata.get("deletionTimestamp"):
        return RolloutProblem(
            reason=RolloutReason.DELETING, detail=f"metadata.deletionTimestamp {metadata['deletionTimestamp']}"
        )
    generation, observed = metadata.get("generation"), status.get("observedGeneration")
    if generation is not None and (observed is None or _int(observed) < _int(generation)):
        return RolloutProblem(
            reason=RolloutReason.GENERATION_NOT_OBSERVED,
            detail=f"status.observedGeneration {observed} < metadata.generation {generation}",
        )
    desired = spec_replicas(workload)
    if kind is WorkloadKind.STATEFUL_SET:
        current, update = status.get("currentRevision"), status.get("updateRevision")
        if update and current != update:
            return RolloutProblem(
                reason=RolloutReason.REVISION_ROLLING,
                detail=f"status.currentRevision {current} != status.updateRevision {update}",
            )
    updated = _int(status.get("updatedReplicas"))
    if updated < desired:
        return RolloutProblem(
            reason=RolloutReason.REPLICAS_NOT_UPDATED,
            detail=f"status.updatedReplicas {updated} < spec.replicas {desired}",
        )
    total = _int(status.get("replicas"))
    if kind is WorkloadKind.DEPLOYMENT and total > updated:
        return RolloutProblem(
            reason=RolloutReason.OLD_REPLICAS_PENDING,
            detail=f"status.replicas {total} > status.updatedReplicas {updated} (old replicas pending termination)",
        )
    ready = ready_replicas(workload)
    if ready < desired:
        field = "availableReplicas" if "availableReplicas" in status else "readyReplicas"
        return RolloutProblem(
            reason=RolloutReason.REPLICAS_NOT_AVAILABLE, detail=f"status.{field} {ready} < spec.replicas {desired}"
        )
    return None


def template_gpus(workload: Mapping[str, Any], where: str) -> int | None:
    """GPUs one replica holds: the main container's `nvidia.com/gpu` limit (else request); None when undeclared."""
    pod_spec = ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
    resources = _main_container(pod_spec).get("resources") or {}
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        for key in GPU_RESOURCE_KEYS:
            if key in values:
                return _gpu_quantity(
                    values[key], f"{where}: spec.template.spec.containers[main].resources.{section}.{key}"
                )
    return None


def template_model_name(workload: Mapping[str, Any]) -> str | None:
    """The model the workload serves: `--served-model-name`/`--model`... in the main container's command line."""
    return model_name_of({"podTemplate": (workload.get("spec") or {}).get("template") or {}})


# --------------------------------------------------------------------------------------------------------
# The connector
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadTarget:
    """Where one role's workload is: the config's reference with its namespace resolved."""

    role: Component
    key: str  # the config key: prefill, decode or aggregated
    kind: WorkloadKind
    namespace: str
    name: str | None
    label_selector: str | None  # `k=v,...`; exactly one of name and label_selector is set

    @property
    def label(self) -> str:
        """`Deployment ns/name`, or `Deployment ns/[app=llm,role=decode]` for a selector."""
        return f"{self.kind.value} {self.namespace}/{self.name or '[' + str(self.label_selector) + ']'}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagedWorkload:
    """What start-up learned about one role's workload."""

    target: WorkloadTarget
    name: str  # the workload's name (found by selector: the one that matched)
    gpus_per_replica: int | None
    model_name: str | None

    @property
    def label(self) -> str:
        return f"{self.target.kind.value} {self.target.namespace}/{self.name}"


def workload_targets(workloads: KubernetesWorkloadsConfig, default_namespace: str) -> tuple[WorkloadTarget, ...]:
    """The configured workloads with their namespaces: their own, else the section's, else `default_namespace`."""
    targets = []
    for role, key, ref in workloads.roles():
        targets.append(_target(role, key, ref, ref.namespace or workloads.namespace or default_namespace))
    return tuple(targets)


def _target(role: Component, key: str, ref: WorkloadRef, namespace: str) -> WorkloadTarget:
    return WorkloadTarget(
        role=role, key=key, kind=ref.kind, namespace=namespace, name=ref.name, label_selector=ref.label_selector
    )


class WorkloadConnector:
    """Scale one Deployment/StatefulSet per managed role; report their ready and expected replicas.

    Build it with `connect()` (reads the environment, finds and checks the workloads), or construct it with an
    API client and call `validate()` before use.
    """

    name = "kubernetes-workloads"

    def __init__(
        self,
        *,
        api_client: k8s_client.ApiClient,
        targets: Sequence[WorkloadTarget],
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.api = k8s_client.AppsV1Api(api_client)
        self._serialize = api_client.sanitize_for_serialization  # typed models -> the API's JSON (camelCase)
        self.targets = tuple(targets)
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._timeout_s = request_timeout_s
        self._workloads: tuple[ManagedWorkload, ...] | None = None
        self._model_name: str | None = None

    @property
    def workloads(self) -> tuple[ManagedWorkload, ...]:
        """What `validate()` found; using the connector before it is a programming error."""
        if self._workloads is None:
            raise RuntimeError("WorkloadConnector.validate() has not run")
        return self._workloads

    @property
    def model_name(self) -> str:
        if self._model_name is None:
            raise RuntimeError("WorkloadConnector.validate() has not run")
        return self._model_name

    @property
    def label(self) -> str:
        return "workloads " + ", ".join(t.label for t in self.targets)

    # --- start-up ---------------------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        config: PlannerConfig,
        workloads: KubernetesWorkloadsConfig,
        settings: KubernetesSettings | None = None,
        *,
        api_client: k8s_client.ApiClient | None = None,
        sleep: Callable[[float], None] = time.sleep,
        service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE,
    ) -> WorkloadConnector:
        """The connector for the configured workloads, validated against `config`.

        Settings shared with the DGD connector: `PLANNER_K8S_NAMESPACE` (the default namespace), the retries and
        the request timeout (`PLANNER_K8S_*`).

        Raises:
            KubernetesConnectorError: a bad setting, no credentials, and everything `validate()` refuses.
        """
        settings = settings or load_settings()
        connector = cls(
            api_client=api_client or api_client_from_environment(),
            targets=workload_targets(workloads, resolve_namespace(settings, service_account_file)),
            retry=RetryPolicy(
                max_tries=settings.max_tries, backoff_s=settings.backoff_s, max_backoff_s=settings.max_backoff_s
            ),
            sleep=sleep,
            request_timeout_s=settings.request_timeout_s,
        )
        connector.validate(config)
        return connector

    def validate(self, config: PlannerConfig) -> tuple[ManagedWorkload, ...]:
        """Find every workload and read its GPUs and model; remember and return what was found.

        Raises:
            KubernetesConnectorError: a workload is missing or unreadable, a selector matches none or several,
                the model name is not resolvable, or a GPU quantity does not parse (one line each).
        """
        found = []
        for target in self.targets:
            try:
                workload = self.find(target, [])
            except KubernetesApiError as exc:
                raise KubernetesConnectorError(f"{target.label} cannot be read at start-up: {exc}") from None
            name = str((workload.get("metadata") or {}).get("name"))
            label = f"{target.kind.value} {target.namespace}/{name}"
            found.append(
                ManagedWorkload(
                    target=target,
                    name=name,
                    gpus_per_replica=template_gpus(workload, label),
                    model_name=template_model_name(workload),
                )
            )
        self._workloads = tuple(found)
        self._model_name = self._resolve_model_name(config.model_name)
        return self._workloads

    def _resolve_model_name(self, configured: str | None) -> str:
        if configured:
            return configured
        names = sorted({w.model_name for w in self.workloads if w.model_name})
        if len(names) == 1:
            return names[0]
        which = ", ".join(w.label for w in self.workloads)
        if not names:
            raise KubernetesConnectorError(
                f"{which}: model name not resolvable: no --served-model-name/--model argument in the main "
                "container; set model_name in the config"
            )
        raise KubernetesConnectorError(f"{which}: model name ambiguous: they serve {', '.join(names)}; set model_name")

    def effective_config(self, config: PlannerConfig) -> PlannerConfig:
        """`config` with `model_name` and GPUs per engine filled from the workloads when it leaves them unset.

        Raises:
            KubernetesConnectorError: the config's GPU width disagrees with a workload's.
        """
        return fill_config(
            config,
            self.label,
            self.model_name,
            [(w.target.role, w.label, w.gpus_per_replica) for w in self.workloads],
        )

    # --- reads --------------------------------------------------------------------------------------------

    def _call(self, what: str, attempt: Callable[[], Any], trail: list[str]) -> Any:
        return with_retries(what, attempt, trail, retry=self.retry, sleep=self._sleep, rbac_file=RBAC_FILE)

    def find(self, target: WorkloadTarget, trail: list[str]) -> dict[str, Any]:
        """The workload as JSON: GET by name, or LIST by selector (exactly one match).

        Raises:
            KubernetesApiError: the request failed (after retries for transient errors).
            KubernetesConnectorError: the selector matches no workload, or several.
        """
        api = _APIS[target.kind]
        if target.name is not None:
            name = target.name
            return self._serialize(
                self._call(
                    f"get {target.label}",
                    lambda: getattr(self.api, api.read)(name, target.namespace, _request_timeout=self._timeout_s),
                    trail,
                )
            )
        listed = self._serialize(
            self._call(
                f"list {target.label}",
                lambda: getattr(self.api, api.list)(
                    target.namespace, label_selector=target.label_selector, _request_timeout=self._timeout_s
                ),
                trail,
            )
        )
        items = [item for item in listed.get("items") or [] if isinstance(item, Mapping)]
        if len(items) != 1:
            names = ", ".join(str((i.get("metadata") or {}).get("name")) for i in items)
            raise KubernetesConnectorError(
                f"{target.label}: kubernetes_workloads.{target.key}.selector matches {len(items)} "
                f"{api.plural}{' (' + names + ')' if names else ''}; it must match exactly one"
            )
        return dict(items[0])

    def available_replicas(self, location: tuple[WorkloadKind, str, str]) -> int:
        """Available replicas of the workload (kind, namespace, name): what the KEDA scaler waits for before it
        acknowledges a decision (`planner keda-scaler --watch-workloads`).

        Raises:
            KubernetesApiError: the request failed (after retries for transient errors).
        """
        kind, namespace, name = location
        target = WorkloadTarget(
            role=Component.DECODE, key="keda", kind=kind, namespace=namespace, name=name, label_selector=None
        )
        return ready_replicas(self.find(target, []))

    def worker_counts(self, session: Session, deployment_id: int, *, default: WorkerCounts) -> WorkerCounts:
        """Ready = each workload's available replicas; expected = its `spec.replicas` (what the scale holds).

        Pools the mode does not manage keep `default`.
        """
        del session, deployment_id  # the API server holds this state, not the database
        counts = {
            "ready_prefill": default.ready_prefill,
            "ready_decode": default.ready_decode,
            "expected_prefill": default.expected_prefill,
            "expected_decode": default.expected_decode,
        }
        trail: list[str] = []
        for target in self.targets:
            workload = self.find(target, trail)
            counts[f"ready_{target.role.value}"] = ready_replicas(workload)
            counts[f"expected_{target.role.value}"] = spec_replicas(workload)
        return WorkerCounts(**counts)

    # --- applying a decision --------------------------------------------------------------------------

    def apply(self, session: Session, decision: DecisionRow, now: dt.datetime) -> ApplyResult:
        """Write the decision's targets to the workloads' scale, unless in force or a workload is rolling out.

        Every managed workload is checked before anything is written, so a rollout of one pool holds back both.

        Raises:
            KubernetesApiError: a write was refused, or kept failing after the retries (workloads already
                written keep their new replicas; the next attempt finds them at the target and skips them).
            KubernetesConnectorError: a selector no longer matches exactly one workload.
        """
        del session, now  # the API server holds this state; the caller records the attempt
        trail: list[str] = []
        targets = {Component.PREFILL: decision.target_prefill, Component.DECODE: decision.target_decode}
        found: list[tuple[WorkloadTarget, str, int]] = []
        for target in self.targets:
            replicas = targets[target.role]
            if replicas is None:
                continue
            workload = self.find(target, trail)
            name = str((workload.get("metadata") or {}).get("name"))
            problem = rollout_problem(target.kind, workload)
            if problem is not None:
                retried = f"; retried: {'; '.join(trail)}" if trail else ""
                return ApplyResult(
                    outcome=ExecutionOutcome.BLOCKED_NOT_READY,
                    detail=(
                        f"{target.kind.value} {target.namespace}/{name} rolling out ({problem}); "
                        f"nothing written{retried}"
                    ),
                )
            found.append((target, name, replicas))
        writes = [
            (target.role, replicas, functools.partial(self._scale, target, name, replicas, trail))
            for target, name, replicas in found
        ]
        return write_pool_targets(writes, trail, where="workloads")

    def _scale(self, target: WorkloadTarget, name: str, replicas: int, trail: list[str]) -> str | None:
        """Set one workload's replicas; a description of the write, or None if it was already at `replicas`."""
        api = _APIS[target.kind]
        label = f"{target.kind.value} {target.namespace}/{name}"

        def read_compare_write() -> str | None:
            scale = self._serialize(
                getattr(self.api, api.read_scale)(name, target.namespace, _request_timeout=self._timeout_s)
            )
            current = _int((scale.get("spec") or {}).get("replicas"))
            if current == replicas:
                return None
            body = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                # the resourceVersion read above makes the write conditional: a concurrent change answers 409
                "metadata": {
                    "name": name,
                    "namespace": target.namespace,
                    "resourceVersion": (scale.get("metadata") or {}).get("resourceVersion"),
                },
                "spec": {"replicas": replicas},
            }
            getattr(self.api, api.replace_scale)(name, target.namespace, body, _request_timeout=self._timeout_s)
            return f"{current}->{replicas} via {label}/scale"

        return self._call(f"scale {label}", read_compare_write, trail)
