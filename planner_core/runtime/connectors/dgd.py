"""Reading a DynamoGraphDeployment (pure functions over its JSON): its components and their roles, GPUs per
replica, model name, readiness and replicas, and the planner config the deployment fills in."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner_core.config import PlannerConfig, PlannerMode
from planner_core.domain import Component
from planner_core.runtime.connectors.k8s_api import KubernetesConnectorError

GPU_RESOURCE_KEYS = ("nvidia.com/gpu", "gpu")  # v1beta1 container resources; v1alpha1 `resources.limits.gpu`
MODEL_FLAGS = ("--served-model-name", "--model", "--model-path", "--model-name")  # first match wins


ROLLOUT_BLOCKING_PHASES = frozenset({"Pending", "InProgress"})


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
