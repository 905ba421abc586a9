"""The Kubernetes connector: scale the prefill and decode components of a DynamoGraphDeployment.

Role: the connector of `environment: kubernetes`. It reads the parent DynamoGraphDeployment (DGD) named by
`DYN_PARENT_DGD_K8S_NAME`, finds the components of the roles the planner's mode manages by their type, and
writes replica targets through each component's DynamoGraphDeploymentScalingAdapter (DGDSA) scale
subresource, falling back to a JSON Patch of the DGD when a component has no adapter. Ready and expected
worker counts for the ticks come from the DGD status and the adapters' scale.

Rules:

- start-up (`KubernetesConnector.connect`) checks that the DGD exists, that the roles the mode needs are
  present exactly once, that a model name is resolvable and that GPU counts parse; every failure is one
  line naming the DGD, the field and the value;
- a target is written only when it differs from the desired replicas in force;
- nothing is written while the DGD is not ready (Ready condition not True, newest generation not observed,
  being deleted, rolling update in progress): the attempt is `blocked_not_ready` and the decision stays
  pending for the next execution run;
- every write is conditional on the resourceVersion read just before it, so a concurrent writer makes it
  fail with 409 Conflict instead of being overwritten; conflicts, 429, 5xx and connection errors re-read
  and retry with bounded exponential backoff (`sleep` is injectable: tests do not wait);
- before a component's replicas go down, its pods get a deletion cost from their load (`pod_drain`): the
  ReplicaSet controller removes the least loaded, and the pods expected to go are recorded as drains;
- each execution run follows those pods until they are gone (`follow_drains`) and completes their drain records
  from their engines' last forward-pass samples: the requests waited for and those cut.

Reading the DGD's JSON is `planner_core.runtime.connectors.dgd` (pure); settings, the API client, errors and retries,
shared with the workloads connector, are `planner_core.runtime.connectors.k8s_api`; this module re-exports their
public names.

The database is read for the engines' loads (`fpm_samples`) and written for the drain records (`drains`), in the
caller's transaction; `store.execution.execute_pending` records each attempt (its outcome and the detail string
built here, which lists retried HTTP errors) in it too.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from sqlalchemy.orm import Session

from planner_core.config import PlannerConfig
from planner_core.domain import Component, TickEvent, WorkerCounts
from planner_core.runtime.connectors.autoscalers import ScaledTarget, competing_autoscalers, post_event
from planner_core.runtime.connectors.dgd import (
    GPU_RESOURCE_KEYS,
    MODEL_FLAGS,
    ROLLOUT_BLOCKING_PHASES,
    DeploymentInfo,
    DgdComponent,
    effective_config,
    fill_config,
    gpus_per_replica,
    list_components,
    model_name_of,
    readiness_problem,
    ready_replicas,
    required_roles,
    resolve_model_name,
    resolve_roles,
    scaling_adapter_name,
)
from planner_core.runtime.connectors.drain_follow import follow_pod_drains
from planner_core.runtime.connectors.k8s_api import (
    SERVICE_ACCOUNT_NAMESPACE_FILE,
    TRANSIENT_STATUSES,
    ApiAccess,
    KubernetesApiError,
    KubernetesConnectorError,
    KubernetesSettings,
    RetryPolicy,
    T,
    api_client_from_environment,
    api_error_hint,
    load_settings,
    resolve_namespace,
    transient_reason,
    with_retries,
)
from planner_core.runtime.connectors.pod_drain import PodDrainer, deletion_costs, planned_removals, pod_engine
from planner_core.runtime.engine_load import in_flight_by_worker
from planner_core.runtime.store.drains import DrainStart, followed_drains, open_drain
from planner_core.runtime.store.models import DecisionRow, DrainOutcome, ExecutionOutcome

GROUP = "nvidia.com"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
SUPPORTED_API_VERSIONS = ("v1beta1", "v1alpha1")  # v1beta1: spec.components[]; v1alpha1: spec.services{}


JSON_PATCH = "application/json-patch+json"


RBAC_FILE = "infra/k8s/dgd/planner-rbac.yaml"

# The requests the connector makes, and all of them: the DGD read by name and patched (the replicas of a component
# without a scaling adapter), the adapters' scale read and replaced. RBAC_FILE's Role grants exactly these.
REQUIRED_ACCESS = (
    ApiAccess(group=GROUP, resource=DGD_PLURAL, verb="get"),
    ApiAccess(group=GROUP, resource=DGD_PLURAL, verb="patch"),
    ApiAccess(group=GROUP, resource=DGDSA_PLURAL, subresource="scale", verb="get"),
    ApiAccess(group=GROUP, resource=DGDSA_PLURAL, subresource="scale", verb="update"),
    ApiAccess(group="", resource="events", verb="create"),  # the tick's one Event on the DGD
    # drain before removal: the managed components' pods listed and given a deletion cost from their load
    ApiAccess(group="", resource="pods", verb="list"),
    ApiAccess(group="", resource="pods", verb="patch"),
)


class _NoAdapter(Exception):
    """The component has no scaling adapter (its scale subresource answers 404)."""


# --------------------------------------------------------------------------------------------------------
# The connector
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    outcome: ExecutionOutcome
    detail: str


def write_pool_targets(
    writes: Sequence[tuple[Component, int, Callable[[], str | None]]], trail: list[str], *, where: str
) -> ApplyResult:
    """Run each pool's write in order (each returns a description of its change, or None when the pool was already
    at its target) and say what happened: applied, or a no-op when nothing changed. Shared by the connectors.

    Raises:
        KubernetesApiError: a write failed; the message names the pool and the pools already written.
    """
    written: list[str] = []
    unchanged: list[str] = []
    for role, target, write in writes:
        try:
            change = write()
        except KubernetesApiError as exc:
            done = f" (already written: {'; '.join(written)})" if written else ""
            raise KubernetesApiError(f"{role.value}: {exc}{done}") from None
        if change is None:
            unchanged.append(f"{role.value} at {target}")
        else:
            written.append(f"{role.value} {change}")
    retried = f"; retried: {'; '.join(trail)}" if trail else ""
    if not written:
        return ApplyResult(
            outcome=ExecutionOutcome.NOOP,
            detail=f"{where} already at the targets ({', '.join(unchanged) or 'none'}){retried}",
        )
    kept = f"; unchanged: {', '.join(unchanged)}" if unchanged else ""
    return ApplyResult(outcome=ExecutionOutcome.APPLIED, detail=f"{'; '.join(written)}{kept}{retried}")


class KubernetesConnector:
    """Scale a DGD's managed components; report their ready and expected replicas.

    Build it with `connect()` (reads the environment and validates the DGD), or construct it with an API
    client and call `validate()` before use.
    """

    name = "kubernetes"

    def __init__(
        self,
        *,
        api_client: k8s_client.ApiClient,
        namespace: str,
        dgd_name: str,
        api_version: str = "v1beta1",
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        request_timeout_s: float = 10.0,
        engine_loads: Callable[[Session | None, int, dt.datetime], Mapping[str, int]] | None = None,
    ) -> None:
        self.api = k8s_client.CustomObjectsApi(api_client)
        self.pod_drainer = PodDrainer(api_client, namespace, timeout_s=request_timeout_s)
        # worker id -> requests in flight: the stored forward-pass samples (none known without a session)
        self._engine_loads = engine_loads or (
            lambda session, deployment_id, now: (
                in_flight_by_worker(session, deployment_id, now) if session is not None else {}
            )
        )
        self.api_client = api_client
        self.namespace = namespace
        self.dgd_name = dgd_name
        self.api_version = api_version
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._timeout_s = request_timeout_s
        self._info: DeploymentInfo | None = None

    @property
    def label(self) -> str:
        return f"DynamoGraphDeployment {self.namespace}/{self.dgd_name}"

    @property
    def info(self) -> DeploymentInfo:
        """What `validate()` found; using the connector before it is a programming error."""
        if self._info is None:
            raise RuntimeError("KubernetesConnector.validate() has not run")
        return self._info

    # --- start-up ---------------------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        config: PlannerConfig,
        settings: KubernetesSettings | None = None,
        *,
        api_client: k8s_client.ApiClient | None = None,
        sleep: Callable[[float], None] = time.sleep,
        service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE,
    ) -> KubernetesConnector:
        """The connector for the DGD the environment names, validated against `config`.

        Raises:
            KubernetesConnectorError: missing `DYN_PARENT_DGD_K8S_NAME`, a bad setting, no credentials, and
                everything `validate()` refuses.
        """
        settings = settings or load_settings()
        if not settings.parent_dgd_name:
            raise KubernetesConnectorError(
                "DYN_PARENT_DGD_K8S_NAME is not set: the Kubernetes connector needs the name of the parent "
                "DynamoGraphDeployment"
            )
        if settings.api_version not in SUPPORTED_API_VERSIONS:
            raise KubernetesConnectorError(
                f"PLANNER_K8S_API_VERSION = {settings.api_version!r}: must be one of "
                f"{', '.join(SUPPORTED_API_VERSIONS)}"
            )
        connector = cls(
            api_client=api_client or api_client_from_environment(),
            namespace=resolve_namespace(settings, service_account_file),
            dgd_name=settings.parent_dgd_name,
            api_version=settings.api_version,
            retry=RetryPolicy(
                max_tries=settings.max_tries, backoff_s=settings.backoff_s, max_backoff_s=settings.max_backoff_s
            ),
            sleep=sleep,
            request_timeout_s=settings.request_timeout_s,
        )
        connector.validate(
            config,
            overrides={Component.PREFILL: settings.prefill_component, Component.DECODE: settings.decode_component},
        )
        return connector

    def validate(
        self, config: PlannerConfig, *, overrides: Mapping[Component, str | None] | None = None
    ) -> DeploymentInfo:
        """Read the DGD and check it can be scaled in `config.mode`; remember and return what was found.

        Raises:
            KubernetesConnectorError: the DGD is missing or unreadable, a role the mode needs is missing or
                duplicated, no model name is resolvable, or GPU resources do not parse (one line each).
        """
        try:
            dgd = self.read_dgd([])
        except KubernetesApiError as exc:
            raise KubernetesConnectorError(f"{self.label} cannot be read at start-up: {exc}") from None
        components = list_components(dgd, self.label)
        roles = resolve_roles(components, config.mode, self.label, overrides=overrides)
        self._info = DeploymentInfo(
            namespace=self.namespace,
            dgd_name=self.dgd_name,
            api_version=self.api_version,
            model_name=resolve_model_name(config.model_name, roles, self.label),
            roles=roles,
        )
        return self._info

    # --- HTTP with retries --------------------------------------------------------------------------------

    def _with_retries(
        self,
        what: str,
        attempt: Callable[[], T],
        trail: list[str],
        *,
        conflict_statuses: frozenset[int] = frozenset({409}),
    ) -> T:
        """Run `attempt` with `with_retries` under this connector's policy (a 403 names planner-rbac.yaml)."""
        return with_retries(
            what,
            attempt,
            trail,
            retry=self.retry,
            sleep=self._sleep,
            conflict_statuses=conflict_statuses,
            passthrough=(_NoAdapter,),
            rbac_file=RBAC_FILE,
        )

    def read_dgd(self, trail: list[str]) -> dict[str, Any]:
        """GET the parent DGD (retrying transient errors)."""
        return self._with_retries(
            f"get {self.label}",
            lambda: self.api.get_namespaced_custom_object(
                GROUP,
                self.api_version,
                self.namespace,
                DGD_PLURAL,
                self.dgd_name,
                _request_timeout=self._timeout_s,
            ),
            trail,
        )

    def _read_scale(self, adapter: str) -> dict[str, Any]:
        try:
            return self.api.get_namespaced_custom_object_scale(
                GROUP,
                self.api_version,
                self.namespace,
                DGDSA_PLURAL,
                adapter,
                _request_timeout=self._timeout_s,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise _NoAdapter(adapter) from None
            raise

    def _component_in(self, dgd: Mapping[str, Any], name: str) -> DgdComponent:
        for component in list_components(dgd, self.label):
            if component.name == name:
                return component
        raise KubernetesApiError(f"{self.label}: component {name} is gone from the spec")

    # --- worker counts --------------------------------------------------------------------------------

    def worker_counts(self, session: Session, deployment_id: int, *, default: WorkerCounts) -> WorkerCounts:
        """Ready replicas from the DGD status; expected = the desired replicas in force (DGDSA, else DGD spec).

        Pools the mode does not manage keep `default`.
        """
        del session, deployment_id  # the API server holds this state, not the database
        trail: list[str] = []
        dgd = self.read_dgd(trail)
        counts = {
            "ready_prefill": default.ready_prefill,
            "ready_decode": default.ready_decode,
            "expected_prefill": default.expected_prefill,
            "expected_decode": default.expected_decode,
        }
        for role, managed in self.info.roles:
            component = self._component_in(dgd, managed.name)
            counts[f"ready_{role.value}"] = ready_replicas(dgd, component.name)
            counts[f"expected_{role.value}"] = self._desired_replicas(component, trail)
        return WorkerCounts(**counts)

    def _desired_replicas(self, component: DgdComponent, trail: list[str]) -> int:
        adapter = scaling_adapter_name(self.dgd_name, component.name)
        try:
            scale = self._with_retries(f"get scale of DGDSA {adapter}", lambda: self._read_scale(adapter), trail)
        except _NoAdapter:
            return component.replicas
        return int((scale.get("spec") or {}).get("replicas", 0))

    # --- other owners of the count, and Events --------------------------------------------------------

    def scaled_targets(self) -> list[ScaledTarget]:
        """What an HPA or a ScaledObject would name to scale what this planner scales: the DGD and the scaling
        adapters of the managed components."""
        adapters = [
            ScaledTarget(kind="DynamoGraphDeploymentScalingAdapter", name=scaling_adapter_name(self.dgd_name, c.name))
            for _, c in self.info.roles
        ]
        return [ScaledTarget(kind="DynamoGraphDeployment", name=self.dgd_name), *adapters]

    def competing_autoscalers(self) -> list[str]:
        """The HPAs and ScaledObjects of the namespace that scale the DGD or its adapters (one line each)."""
        return competing_autoscalers(self.api_client, self.namespace, self.scaled_targets(), timeout_s=self._timeout_s)

    def post_event(self, event: TickEvent, at: dt.datetime, *, loop: str) -> None:
        """Post the Event of the `loop` tick at `at` on the DGD (raises ApiException; the caller logs it)."""
        target = ScaledTarget(kind="DynamoGraphDeployment", name=self.dgd_name)
        post_event(
            self.api_client,
            self.namespace,
            target,
            f"{GROUP}/{self.api_version}",
            event,
            at,
            loop=loop,
            timeout_s=self._timeout_s,
        )

    # --- applying a decision --------------------------------------------------------------------------

    def apply(self, session: Session, decision: DecisionRow, now: dt.datetime) -> ApplyResult:
        """Write the decision's targets to the DGD's components, unless they are in force or the DGD is not ready.

        Raises:
            KubernetesApiError: a write was refused, or kept failing after the retries (the caller records
                the attempt as failed; components already written keep their new replicas, and the next
                attempt finds them at the target and does not write them again).
        """
        trail: list[str] = []
        dgd = self.read_dgd(trail)
        problem = readiness_problem(dgd)
        if problem is not None:
            return ApplyResult(
                outcome=ExecutionOutcome.BLOCKED_NOT_READY,
                detail=f"{self.label} not ready: {problem}; nothing written",
            )
        targets = {Component.PREFILL: decision.target_prefill, Component.DECODE: decision.target_decode}
        drains = [
            note
            for role, managed in self.info.roles
            if (target := targets[role]) is not None
            and (note := self._prepare_removal(session, decision, dgd, role, managed, target, now, trail))
        ]
        writes = [
            (role, target, functools.partial(self._scale_component, managed, target, trail))
            for role, managed in self.info.roles
            if (target := targets[role]) is not None
        ]
        result = write_pool_targets(writes, trail, where=self.label)
        if not drains:
            return result
        return ApplyResult(outcome=result.outcome, detail=f"{result.detail}; drain: {'; '.join(drains)}")

    def _prepare_removal(
        self,
        session: Session,
        decision: DecisionRow,
        dgd: Mapping[str, Any],
        role: Component,
        managed: DgdComponent,
        target: int,
        now: dt.datetime,
        trail: list[str],
    ) -> str | None:
        """Before a component's replicas go down: its pods' deletion costs from their load (the least loaded go
        first), and a `drains` row per pod expected to go (handed over: the kubelet drains it within its grace);
        what was done, None without a scale-down. Without a session (a dry check) no load is known."""
        component = self._component_in(dgd, managed.name)
        num_remove = self._desired_replicas(component, trail) - target
        if num_remove <= 0:
            return None
        loads = self._engine_loads(session, decision.deployment_id, now)
        pods = self._with_retries(
            f"list pods of {managed.name}", lambda: self.pod_drainer.pods(self.dgd_name, managed.name, loads), trail
        )
        costs = deletion_costs(pods)
        written = self.pod_drainer.set_costs(
            pods, costs, lambda what, attempt: self._with_retries(what, attempt, trail)
        )
        removed = planned_removals(pods, costs, num_remove)
        for pod in removed if session is not None else ():
            start = DrainStart(
                deployment_id=decision.deployment_id,
                decision_id=decision.id,
                connector=self.name,
                role=role.value,
                engine=pod_engine(self.namespace, pod.name),
                worker_ids=(pod.instance_id,),
                grace_s=pod.grace_s,
                num_in_flight=pod.num_in_flight,
                outcome=DrainOutcome.HANDED_OVER,
                detail=f"deletion cost {costs.get(pod.name, pod.cost)}; replicas {num_remove + target}->{target}",
            )
            open_drain(session, start, now)
        going = ", ".join(
            f"{p.name} ({'?' if p.num_in_flight is None else p.num_in_flight} in flight)" for p in removed
        )
        return f"{managed.name}: deletion cost set on {written} pod(s); expected to go: {going or 'none listed'}"

    def follow_drains(self, session: Session, deployment_id: int, now: dt.datetime) -> list[str]:
        """Follow the pods the scale-downs handed over until each is gone (`drain_follow.follow_pod_drains`): one
        list of the DGD's pods, then each open drain judged from its engine's last samples and closed once ended.
        One line per drain followed.

        Raises:
            KubernetesApiError: the pods cannot be listed (nothing is changed; the next run follows again).
        """
        drains = followed_drains(session, deployment_id, self.name)
        if not drains:
            return []
        pods = self._with_retries(f"list pods of {self.label}", lambda: self.pod_drainer.pod_states(self.dgd_name), [])
        components = {role.value: managed.name for role, managed in self.info.roles}
        return follow_pod_drains(session, drains, pods, now, namespace=self.namespace, components=components)

    def _scale_component(self, managed: DgdComponent, target: int, trail: list[str]) -> str | None:
        """Set one component's replicas; a description of the write, or None if it was already at `target`."""
        adapter = scaling_adapter_name(self.dgd_name, managed.name)
        try:
            return self._with_retries(
                f"scale DGDSA {adapter}", functools.partial(self._scale_via_adapter, adapter, target), trail
            )
        except _NoAdapter:
            if managed.declares_scaling_adapter:
                # The component hands its replicas to an adapter; writing the DGD would fight its controller.
                raise KubernetesApiError(
                    f"DGDSA {adapter} not found although component {managed.name} declares scalingAdapter"
                ) from None
        # A failed `test` (422) means the DGD changed under us: re-read and retry, like a 409.
        return self._with_retries(
            f"patch DGD {self.dgd_name}",
            functools.partial(self._scale_via_dgd_patch, managed.name, target),
            trail,
            conflict_statuses=frozenset({409, 422}),
        )

    def _scale_via_adapter(self, adapter: str, target: int) -> str | None:
        """One try at writing `target` to the component's DGDSA scale subresource (raises `_NoAdapter` without one)."""
        scale = self._read_scale(adapter)
        current = int((scale.get("spec") or {}).get("replicas", 0))
        if current == target:
            return None
        metadata = scale.get("metadata") or {}
        body = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            # the resourceVersion read above makes the write conditional: a concurrent change answers 409
            "metadata": {
                "name": adapter,
                "namespace": self.namespace,
                "resourceVersion": metadata.get("resourceVersion"),
            },
            "spec": {"replicas": target},
        }
        self.api.replace_namespaced_custom_object_scale(
            GROUP,
            self.api_version,
            self.namespace,
            DGDSA_PLURAL,
            adapter,
            body,
            _request_timeout=self._timeout_s,
        )
        return f"{current}->{target} via DGDSA {adapter}/scale"

    def _scale_via_dgd_patch(self, component_name: str, target: int) -> str | None:
        """One try at a conditional JSON Patch of the component's replicas in the DGD (no adapter to write)."""
        dgd = self.api.get_namespaced_custom_object(
            GROUP,
            self.api_version,
            self.namespace,
            DGD_PLURAL,
            self.dgd_name,
            _request_timeout=self._timeout_s,
        )
        component = self._component_in(dgd, component_name)
        if component.replicas == target:
            return None
        patch: list[dict[str, Any]] = []
        if component.patch_path.startswith("/spec/components/"):
            # the index was read from this very version; the test guards servers that ignore the precondition
            patch.append({"op": "test", "path": f"{component.patch_path}/name", "value": component.name})
        patch += [
            # setting the resourceVersion read above makes the patch conditional (409 on a concurrent write)
            {
                "op": "replace",
                "path": "/metadata/resourceVersion",
                "value": (dgd.get("metadata") or {}).get("resourceVersion"),
            },
            {"op": "add", "path": f"{component.patch_path}/replicas", "value": target},
        ]
        self.api.patch_namespaced_custom_object(
            GROUP,
            self.api_version,
            self.namespace,
            DGD_PLURAL,
            self.dgd_name,
            patch,
            _content_type=JSON_PATCH,
            _request_timeout=self._timeout_s,
        )
        return f"{component.replicas}->{target} via JSON Patch of DGD {self.dgd_name} (no DGDSA)"


__all__ = [
    "ApplyResult",
    "DGDSA_PLURAL",
    "DGD_PLURAL",
    "DeploymentInfo",
    "DgdComponent",
    "GPU_RESOURCE_KEYS",
    "GROUP",
    "JSON_PATCH",
    "KubernetesApiError",
    "KubernetesConnector",
    "KubernetesConnectorError",
    "KubernetesSettings",
    "MODEL_FLAGS",
    "RBAC_FILE",
    "REQUIRED_ACCESS",
    "ROLLOUT_BLOCKING_PHASES",
    "RetryPolicy",
    "SERVICE_ACCOUNT_NAMESPACE_FILE",
    "SUPPORTED_API_VERSIONS",
    "TRANSIENT_STATUSES",
    "api_client_from_environment",
    "api_error_hint",
    "effective_config",
    "fill_config",
    "gpus_per_replica",
    "list_components",
    "load_settings",
    "model_name_of",
    "readiness_problem",
    "ready_replicas",
    "required_roles",
    "resolve_model_name",
    "resolve_namespace",
    "resolve_roles",
    "scaling_adapter_name",
    "transient_reason",
    "with_retries",
    "write_pool_targets",
]
