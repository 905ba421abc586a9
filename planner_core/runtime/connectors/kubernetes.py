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
  and retry with bounded exponential backoff (`sleep` is injectable: tests do not wait).

Nothing here touches the database: `store.execution.execute_pending` records each attempt (its outcome and
the detail string built here, which lists retried HTTP errors) in the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.orm import Session

from planner_core.config import PlannerConfig, PlannerMode
from planner_core.domain import Component, WorkerCounts
from planner_core.runtime.store.models import DecisionRow, ExecutionOutcome

GROUP = "nvidia.com"
DGD_PLURAL = "dynamographdeployments"
DGDSA_PLURAL = "dynamographdeploymentscalingadapters"
SUPPORTED_API_VERSIONS = ("v1beta1", "v1alpha1")  # v1beta1: spec.components[]; v1alpha1: spec.services{}
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JSON_PATCH = "application/json-patch+json"
GPU_RESOURCE_KEYS = ("nvidia.com/gpu", "gpu")  # v1beta1 container resources; v1alpha1 `resources.limits.gpu`
MODEL_FLAGS = ("--served-model-name", "--model", "--model-path", "--model-name")  # first match wins
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
RBAC_FILE = "infra/k8s/planner-rbac.yaml"
ROLLOUT_BLOCKING_PHASES = frozenset({"Pending", "InProgress"})

T = TypeVar("T")


class KubernetesConnectorError(ValueError):
    """A start-up or configuration problem; the message is one line naming the object, field and value."""


class KubernetesApiError(RuntimeError):
    """The API server refused a request or kept failing after the retries (one line, with every try)."""


# --------------------------------------------------------------------------------------------------------
# Settings (environment)
# --------------------------------------------------------------------------------------------------------


class KubernetesSettings(BaseSettings):
    """Where the connector finds the DGD and how hard it retries, from the environment."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    parent_dgd_name: str | None = Field(default=None, validation_alias="DYN_PARENT_DGD_K8S_NAME")
    namespace: str | None = Field(
        default=None, validation_alias=AliasChoices("PLANNER_K8S_NAMESPACE", "POD_NAMESPACE")
    )  # unset: the pod's service-account namespace, else "default"
    api_version: str = Field(default="v1beta1", validation_alias="PLANNER_K8S_API_VERSION")
    prefill_component: str | None = Field(default=None, validation_alias="PLANNER_K8S_PREFILL_COMPONENT")
    decode_component: str | None = Field(default=None, validation_alias="PLANNER_K8S_DECODE_COMPONENT")
    max_tries: int = Field(default=4, ge=1, le=20, validation_alias="PLANNER_K8S_MAX_TRIES")
    backoff_s: float = Field(default=0.5, ge=0, le=60, validation_alias="PLANNER_K8S_BACKOFF_S")
    max_backoff_s: float = Field(default=4.0, ge=0, le=300, validation_alias="PLANNER_K8S_MAX_BACKOFF_S")
    request_timeout_s: float = Field(default=10.0, gt=0, le=300, validation_alias="PLANNER_K8S_REQUEST_TIMEOUT_S")


def load_settings() -> KubernetesSettings:
    """Read `KubernetesSettings` from the environment; a bad value is one line naming the variable."""
    try:
        return KubernetesSettings()
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        alias = (
            KubernetesSettings.model_fields[field].validation_alias
            if field in KubernetesSettings.model_fields
            else None
        )
        names = alias.choices if isinstance(alias, AliasChoices) else [alias or field]
        raise KubernetesConnectorError(
            f"environment variable {'/'.join(str(n) for n in names)} = {error.get('input')!r}: {error['msg']}"
        ) from None


def resolve_namespace(settings: KubernetesSettings, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str:
    """The DGD's namespace: the setting, else the pod's own namespace (in a cluster), else "default"."""
    if settings.namespace:
        return settings.namespace
    if service_account_file.is_file():
        return service_account_file.read_text().strip() or "default"
    return "default"


def api_client_from_environment() -> k8s_client.ApiClient:
    """An API client from the in-cluster service account, else from the kubeconfig (`KUBECONFIG`)."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException as in_cluster_error:
        try:
            # KUBECONFIG is read now, not at import time (the client's default is frozen when it is imported)
            k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
        except (ConfigException, OSError) as kubeconfig_error:
            raise KubernetesConnectorError(
                f"no Kubernetes credentials: not in a cluster ({in_cluster_error}) and no usable kubeconfig "
                f"({kubeconfig_error})"
            ) from None
    # Our own loop retries with backoff and records each try; urllib3's silent retries would hide them.
    configuration.retries = 0
    return k8s_client.ApiClient(configuration)


# --------------------------------------------------------------------------------------------------------
# Reading a DGD (pure functions over its JSON)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DgdComponent:
    """One component of a DGD as the connector sees it.

    `patch_path` is the JSON Pointer of the component in the DGD (`/spec/components/2` in v1beta1,
    `/spec/services/VllmDecodeWorker` in v1alpha1); it is only valid for the DGD version it was read from.
    """

    name: str
    component_type: str | None  # v1beta1 `type`; v1alpha1 `subComponentType`, else `componentType`
    replicas: int  # spec replicas (1 when unset, the operator's default)
    gpus_per_replica: int | None  # None: the component declares no GPU resources
    model_name: str | None
    declares_scaling_adapter: bool  # v1beta1 `scalingAdapter: {}`: the DGDSA owns replicas
    patch_path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentInfo:
    """What start-up learned about the parent DGD: the component of each managed role, model and GPUs."""

    namespace: str
    dgd_name: str
    api_version: str
    model_name: str
    roles: tuple[tuple[Component, DgdComponent], ...]

    def component(self, role: Component) -> DgdComponent | None:
        return dict(self.roles).get(role)

    @property
    def label(self) -> str:
        return f"DynamoGraphDeployment {self.namespace}/{self.dgd_name}"


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _main_container(pod_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = pod_spec.get("containers") or []
    for container in containers:
        if isinstance(container, Mapping) and container.get("name") == "main":
            return container
    return containers[0] if containers and isinstance(containers[0], Mapping) else {}


def _gpu_quantity(value: object, where: str) -> int:
    """A GPU quantity ("1", 2) as an integer; fractional or malformed values are refused."""
    text = str(value).strip()
    if not text.isdigit():
        raise KubernetesConnectorError(f"{where} = {value!r}: GPU count must be a whole number")
    return int(text)


def gpus_per_replica(spec: Mapping[str, Any], where: str) -> int | None:
    """GPUs one replica of a component holds: the main container's GPU limit (else request) x nodes.

    v1beta1 components carry a pod template (`podTemplate.spec.containers[main].resources`, key
    `nvidia.com/gpu`); v1alpha1 services carry `resources.limits.gpu`. A multinode component spans
    `multinode.nodeCount` pods, each with that many GPUs.
    """
    if "podTemplate" in spec:
        resources = _main_container((spec.get("podTemplate") or {}).get("spec") or {}).get("resources") or {}
        where_resources = f"{where}.podTemplate.spec.containers[main].resources"
    else:
        resources = spec.get("resources") or {}
        where_resources = f"{where}.resources"
    per_pod: int | None = None
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        for key in GPU_RESOURCE_KEYS:
            if key in values:
                per_pod = _gpu_quantity(values[key], f"{where_resources}.{section}.{key}")
                break
        if per_pod is not None:
            break
    if per_pod is None:
        return None
    node_count = (spec.get("multinode") or {}).get("nodeCount", 1)
    if not isinstance(node_count, int) or isinstance(node_count, bool) or node_count < 1:
        raise KubernetesConnectorError(f"{where}.multinode.nodeCount = {node_count!r}: must be an integer >= 1")
    return per_pod * node_count


def model_name_of(spec: Mapping[str, Any]) -> str | None:
    """The model a component serves: `modelRef.name`, else `--served-model-name`/`--model`... in its args."""
    model_ref = spec.get("modelRef") or {}
    if isinstance(model_ref, Mapping) and model_ref.get("name"):
        return str(model_ref["name"])
    if "podTemplate" in spec:
        container = _main_container((spec.get("podTemplate") or {}).get("spec") or {})
    else:
        container = ((spec.get("extraPodSpec") or {}).get("mainContainer")) or {}
    tokens: list[str] = []
    for part in [*(container.get("command") or []), *(container.get("args") or [])]:
        try:
            tokens.extend(shlex.split(str(part)))  # an element may hold a whole shell command line
        except ValueError:
            tokens.append(str(part))
    for flag in MODEL_FLAGS:
        for i, token in enumerate(tokens):
            if token == flag and i + 1 < len(tokens):
                return tokens[i + 1]
            if token.startswith(flag + "="):
                return token.split("=", 1)[1]
    return None


def _replicas(spec: Mapping[str, Any], where: str) -> int:
    value = spec.get("replicas", 1)  # the operator's default when unset
    if value is None:
        return 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise KubernetesConnectorError(f"{where}.replicas = {value!r}: must be a non-negative integer")
    return value


def list_components(dgd: Mapping[str, Any], label: str) -> list[DgdComponent]:
    """The components of a DGD, from `spec.components[]` (v1beta1) or `spec.services{}` (v1alpha1)."""
    spec = dgd.get("spec") or {}
    found: list[DgdComponent] = []
    if "components" in spec:
        entries = spec["components"]
        if not isinstance(entries, list):
            raise KubernetesConnectorError(f"{label}: spec.components = {type(entries).__name__}: must be a list")
        for index, entry in enumerate(entries):
            where = f"{label}: spec.components[{index}]"
            if not isinstance(entry, Mapping) or not entry.get("name"):
                raise KubernetesConnectorError(
                    f"{where}.name = {None if not isinstance(entry, Mapping) else entry.get('name')!r}: required"
                )
            found.append(
                DgdComponent(
                    name=str(entry["name"]),
                    component_type=entry.get("type"),
                    replicas=_replicas(entry, where),
                    gpus_per_replica=gpus_per_replica(entry, where),
                    model_name=model_name_of(entry),
                    declares_scaling_adapter="scalingAdapter" in entry,
                    patch_path=f"/spec/components/{index}",
                )
            )
    elif "services" in spec:
        entries = spec["services"]
        if not isinstance(entries, Mapping):
            raise KubernetesConnectorError(f"{label}: spec.services = {type(entries).__name__}: must be a mapping")
        for name, entry in entries.items():
            where = f"{label}: spec.services.{name}"
            entry = entry or {}
            found.append(
                DgdComponent(
                    name=str(name),
                    component_type=entry.get("subComponentType") or entry.get("componentType"),
                    replicas=_replicas(entry, where),
                    gpus_per_replica=gpus_per_replica(entry, where),
                    model_name=model_name_of(entry),
                    declares_scaling_adapter=False,
                    patch_path=f"/spec/services/{_escape_pointer(str(name))}",
                )
            )
    else:
        raise KubernetesConnectorError(f"{label}: spec.components (v1beta1) or spec.services (v1alpha1) is missing")
    return found


def required_roles(mode: PlannerMode) -> tuple[Component, ...]:
    """Roles a planner mode scales; aggregated mode scales its single pool as the decode role."""
    if mode is PlannerMode.DISAGG:
        return (Component.PREFILL, Component.DECODE)
    if mode is PlannerMode.PREFILL:
        return (Component.PREFILL,)
    return (Component.DECODE,)


def _describe(components: Sequence[DgdComponent]) -> str:
    return ", ".join(f"{c.name} ({c.component_type or 'no type'})" for c in components) or "none"


def resolve_roles(
    components: Sequence[DgdComponent],
    mode: PlannerMode,
    label: str,
    *,
    overrides: Mapping[Component, str | None] | None = None,
) -> tuple[tuple[Component, DgdComponent], ...]:
    """The component of each role the mode needs, found by type (or by the name an override gives).

    A role is served by the one component whose type is the role (`prefill`, `decode`); in aggregated mode
    the one generic `worker` (else the one `decode`) serves. None, or more than one, is an error.
    """
    overrides = overrides or {}
    by_name = {c.name: c for c in components}
    resolved: list[tuple[Component, DgdComponent]] = []
    for role in required_roles(mode):
        override = overrides.get(role)
        if override:
            if override not in by_name:
                variable = f"PLANNER_K8S_{role.value.upper()}_COMPONENT"
                raise KubernetesConnectorError(
                    f"{label}: {variable} = {override!r}: no such component; components: {_describe(components)}"
                )
            resolved.append((role, by_name[override]))
            continue
        wanted = ("worker", "decode") if mode is PlannerMode.AGG else (role.value,)
        for component_type in wanted:
            matches = [c for c in components if c.component_type == component_type]
            if len(matches) > 1:
                variable = f"PLANNER_K8S_{role.value.upper()}_COMPONENT"
                raise KubernetesConnectorError(
                    f"{label}: {len(matches)} components of type '{component_type}' "
                    f"({', '.join(c.name for c in matches)}); set {variable} to pick one"
                )
            if matches:
                resolved.append((role, matches[0]))
                break
        else:
            types = " or ".join(f"'{t}'" for t in wanted)
            raise KubernetesConnectorError(
                f"{label}: mode '{mode.value}' needs a component of type {types} for the {role.value} role; "
                f"components: {_describe(components)}"
            )
    return tuple(resolved)


def resolve_model_name(configured: str | None, roles: Sequence[tuple[Component, DgdComponent]], label: str) -> str:
    """The model name: the config's `model_name`, else the one name the managed components agree on."""
    if configured:
        return configured
    names = sorted({c.model_name for _, c in roles if c.model_name})
    if len(names) == 1:
        return names[0]
    if not names:
        raise KubernetesConnectorError(
            f"{label}: model name not resolvable: no modelRef.name or --served-model-name/--model argument in "
            f"{', '.join(c.name for _, c in roles)}; set model_name in the config"
        )
    raise KubernetesConnectorError(
        f"{label}: model name ambiguous: components serve {', '.join(names)}; set model_name in the config"
    )


def readiness_problem(dgd: Mapping[str, Any]) -> str | None:
    """Why the DGD must not be scaled now, or None when it is ready.

    Not ready: being deleted; Ready condition absent or not True; status not caught up with the newest
    generation (the operator has not acted on the last spec change yet); a rolling update pending or running.
    """
    metadata = dgd.get("metadata") or {}
    status = dgd.get("status") or {}
    if metadata.get("deletionTimestamp"):
        return f"being deleted since {metadata['deletionTimestamp']}"
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        return "no Ready condition in status"
    if ready.get("status") != "True":
        why = ": ".join(str(p) for p in (ready.get("reason"), ready.get("message")) if p)
        return f"Ready={ready.get('status')}" + (f" ({why})" if why else "")
    generation = metadata.get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or int(observed) < int(generation)):
        return f"status.observedGeneration {observed} < metadata.generation {generation}"
    phase = (status.get("rollingUpdate") or {}).get("phase")
    if phase in ROLLOUT_BLOCKING_PHASES:
        return f"rolling update {phase}"
    return None


def ready_replicas(dgd: Mapping[str, Any], component_name: str) -> int:
    """Replicas serving traffic: `availableReplicas` when the status has it, else `readyReplicas`."""
    entry = ((dgd.get("status") or {}).get("components") or {}).get(component_name) or {}
    available = entry.get("availableReplicas")
    if available is not None:
        return int(available)
    return int(entry.get("readyReplicas") or 0)


def scaling_adapter_name(dgd_name: str, component_name: str) -> str:
    """The DGDSA the operator creates for a component: `<dgd>-<component, lower case>`."""
    return f"{dgd_name}-{component_name.lower()}"


def effective_config(config: PlannerConfig, info: DeploymentInfo) -> PlannerConfig:
    """The config with what it leaves unset filled from the DGD (model name, GPUs per engine).

    A GPU width the config sets that disagrees with the DGD is an error: sizing on the wrong width would
    mis-scale every pool.
    """
    return fill_config(
        config,
        info.label,
        info.model_name,
        [(role, f"component {c.name}", c.gpus_per_replica) for role, c in info.roles],
    )


def fill_config(
    config: PlannerConfig,
    label: str,
    model_name: str,
    roles: Sequence[tuple[Component, str, int | None]],
) -> PlannerConfig:
    """`config` with `model_name` and the GPUs per engine of each (role, what, GPUs per replica) filled when unset.

    Raises:
        KubernetesConnectorError: the config sets a GPU width that disagrees with the cluster's.
    """
    update: dict[str, object] = {}
    if config.model_name is None:
        update["model_name"] = model_name
    fields = {Component.PREFILL: "prefill_engine_num_gpu", Component.DECODE: "decode_engine_num_gpu"}
    for role, what, gpus in roles:
        field = fields[role]
        configured = getattr(config, field)
        if gpus is None or gpus == 0:
            continue
        if configured is None:
            update[field] = gpus
        elif configured != gpus:
            raise KubernetesConnectorError(
                f"{label}: config {field} = {configured} but {what} has {gpus} GPU(s) per replica"
            )
    return config.model_copy(update=update) if update else config


# --------------------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Bounded exponential backoff: wait `backoff_s * 2**(n-1)` (at most `max_backoff_s`) after failure n.

    With the defaults (4 tries, 0.5 s, 4 s) a request that keeps failing waits 0.5 + 1 + 2 = 3.5 s in total.
    """

    max_tries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 4.0

    def delay_s(self, num_failures: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (num_failures - 1))


def _reason(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason or ''}".strip()


def transient_reason(exc: BaseException, *, conflict_statuses: frozenset[int] = frozenset({409})) -> str | None:
    """A short description if retrying may succeed (conflict, throttling, 5xx, connection), else None."""
    if isinstance(exc, ApiException):
        if exc.status in conflict_statuses or exc.status in TRANSIENT_STATUSES:
            return _reason(exc)
        if exc.status == 0:  # the client reports some transport failures with status 0
            return f"connection error ({exc.reason})"
        return None
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return f"connection error ({type(exc).__name__})"
    return None


class _NoAdapter(Exception):
    """The component has no scaling adapter (its scale subresource answers 404)."""


def api_error_hint(exc: ApiException, rbac_file: str) -> str:
    """What a refused request most likely means, for the one-line error (403: the Role in `rbac_file`)."""
    if exc.status == 403:
        return f" (the planner's ServiceAccount lacks this permission: see {rbac_file})"
    if exc.status == 404:
        return " (not found)"
    return ""


def with_retries(
    what: str,
    attempt: Callable[[], T],
    trail: list[str],
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None],
    conflict_statuses: frozenset[int] = frozenset({409}),
    passthrough: tuple[type[BaseException], ...] = (),
    rbac_file: str = "infra/k8s/planner-rbac.yaml",
) -> T:
    """Run `attempt` (a read, or a read-compare-write) until it succeeds or the tries run out.

    Each failed try is appended to `trail` ("what: 409 Conflict"); the waits follow `retry`. Exceptions of a
    `passthrough` type are the caller's own signals and are re-raised at once.

    Raises:
        KubernetesApiError: a non-transient API error, or the tries ran out (one line listing every try).
    """
    num_failures = 0
    while True:
        try:
            return attempt()
        except passthrough:
            raise
        except Exception as exc:  # classified below; anything else is re-raised as is
            reason = transient_reason(exc, conflict_statuses=conflict_statuses)
            if reason is None:
                if isinstance(exc, ApiException):
                    raise KubernetesApiError(f"{what}: {_reason(exc)}{api_error_hint(exc, rbac_file)}") from None
                raise
            num_failures += 1
            trail.append(f"{what}: {reason}")
            if num_failures >= retry.max_tries:
                raise KubernetesApiError(
                    f"{what}: gave up after {num_failures} tries ({'; '.join(trail[-num_failures:])})"
                ) from None
            sleep(retry.delay_s(num_failures))


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
    ) -> None:
        self.api = k8s_client.CustomObjectsApi(api_client)
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

    # --- applying a decision --------------------------------------------------------------------------

    def apply(self, session: Session, decision: DecisionRow, now: dt.datetime) -> ApplyResult:
        """Write the decision's targets to the DGD's components, unless they are in force or the DGD is not ready.

        Raises:
            KubernetesApiError: a write was refused, or kept failing after the retries (the caller records
                the attempt as failed; components already written keep their new replicas, and the next
                attempt finds them at the target and does not write them again).
        """
        del session, now  # the API server holds this state; the caller records the attempt
        trail: list[str] = []
        dgd = self.read_dgd(trail)
        problem = readiness_problem(dgd)
        if problem is not None:
            return ApplyResult(
                outcome=ExecutionOutcome.BLOCKED_NOT_READY,
                detail=f"{self.label} not ready: {problem}; nothing written",
            )
        targets = {Component.PREFILL: decision.target_prefill, Component.DECODE: decision.target_decode}
        writes = [
            (role, target, functools.partial(self._scale_component, managed, target, trail))
            for role, managed in self.info.roles
            if (target := targets[role]) is not None
        ]
        return write_pool_targets(writes, trail, where=self.label)

    def _scale_component(self, managed: DgdComponent, target: int, trail: list[str]) -> str | None:
        """Set one component's replicas; a description of the write, or None if it was already at `target`."""
        adapter = scaling_adapter_name(self.dgd_name, managed.name)

        def through_adapter() -> str | None:
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

        try:
            return self._with_retries(f"scale DGDSA {adapter}", through_adapter, trail)
        except _NoAdapter:
            if managed.declares_scaling_adapter:
                # The component hands its replicas to an adapter; writing the DGD would fight its controller.
                raise KubernetesApiError(
                    f"DGDSA {adapter} not found although component {managed.name} declares scalingAdapter"
                ) from None

        def through_dgd_patch() -> str | None:
            dgd = self.api.get_namespaced_custom_object(
                GROUP,
                self.api_version,
                self.namespace,
                DGD_PLURAL,
                self.dgd_name,
                _request_timeout=self._timeout_s,
            )
            component = self._component_in(dgd, managed.name)
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

        # A failed `test` (422) means the DGD changed under us: re-read and retry, like a 409.
        return self._with_retries(
            f"patch DGD {self.dgd_name}", through_dgd_patch, trail, conflict_statuses=frozenset({409, 422})
        )
