"""The Kubernetes connector: DGD parsing (pure), then the real `kubernetes` client against an emulated API server
(kmock, extended with resourceVersion/409, JSON Patch, the scale subresource and faults: tests/runtime/kube_api.py), and
the execution outbox on real Postgres.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import socket
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s_client
from sqlalchemy import select

from planner_core.config import PlannerMode, load_config, parse_config
from planner_core.domain import (
    Component,
    EventReason,
    Loop,
    OutsideChange,
    TickEvent,
    TickOutcome,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.planner import Planner, build_planner
from planner_core.runtime.connectors.kubernetes import (
    RBAC_FILE,
    REQUIRED_ACCESS,
    DgdComponent,
    KubernetesApiError,
    KubernetesConnector,
    KubernetesConnectorError,
    KubernetesSettings,
    RetryPolicy,
    effective_config,
    gpus_per_replica,
    list_components,
    load_settings,
    model_name_of,
    readiness_problem,
    resolve_model_name,
    resolve_namespace,
    resolve_roles,
)
from planner_core.runtime.engine_load import dynamo_pod_instance_id
from planner_core.runtime.replay import replay
from planner_core.runtime.service import PlannerContext, default_workers, load_context, run_execution, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.execution import MAX_ATTEMPTS
from planner_core.runtime.store.models import DecisionRow, ExecutionRow, WorkerObservationRow
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.databases import record_decision
from tests.runtime.kube_api import DGD, DGDSA, EVENTS, HPAS, PODS, SCALEDOBJECTS, KubeApiServer, access_by_resource
from tests.runtime.kustomize import planner_role

NAME = "k8s-test"
DGD_NAME = "llm"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
LABEL = "DynamoGraphDeployment ns/llm"
PREFILL_ADAPTER = "llm-vllmprefillworker"
DECODE_ADAPTER = "llm-vllmdecodeworker"


# --------------------------------------------------------------------------------------------------------
# DGD builders
# --------------------------------------------------------------------------------------------------------


def worker(name: str, kind: str | None, *, replicas: int | None = 1, gpus: str | int | None = "1", **extra) -> dict:
    """A v1beta1 component with a main container (GPU limit `gpus`) serving Qwen/Qwen3-0.6B."""
    container: dict = {
        "name": "main",
        "image": "dynamo:1.6.1",
        "args": ["python3 -m dynamo.vllm --model Qwen/Qwen3-0.6B"],
    }
    if gpus is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    entry: dict = {"name": name, "podTemplate": {"spec": {"containers": [container]}}, **extra}
    if kind is not None:
        entry["type"] = kind
    if replicas is not None:
        entry["replicas"] = replicas
    return entry


def disagg_dgd(*, prefill_adapter: bool = True, decode_adapter: bool = True) -> dict:
    return {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": DGD_NAME},
        "spec": {
            "backendFramework": "vllm",
            "components": [
                {"name": "Frontend", "type": "frontend", "replicas": 1},
                worker("VllmPrefillWorker", "prefill", **({"scalingAdapter": {}} if prefill_adapter else {})),
                worker("VllmDecodeWorker", "decode", gpus="2", **({"scalingAdapter": {}} if decode_adapter else {})),
            ],
        },
    }


def adapter(name: str, component: str, replicas: int = 1) -> dict:
    return {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeploymentScalingAdapter",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "dgdRef": {"name": DGD_NAME, "componentName": component}},
        "status": {"replicas": replicas, "selector": f"component={component}"},
    }


def components_of(*entries: dict) -> list[DgdComponent]:
    return list_components({"spec": {"components": list(entries)}}, LABEL)


# --------------------------------------------------------------------------------------------------------
# Pure parsing and rules
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"resources": {"limits": {"gpu": "1"}}}, 1),  # v1alpha1 limits
        ({"resources": {"requests": {"gpu": 4}}}, 4),  # v1alpha1, request only
        ({"resources": {"limits": {"gpu": "2"}}, "multinode": {"nodeCount": 2}}, 4),  # 2 GPUs x 2 nodes
        (worker("w", "decode", gpus="8"), 8),  # v1beta1 main container
        (worker("w", "decode", gpus=None), None),  # no GPU resources declared
        (
            {
                "podTemplate": {
                    "spec": {
                        "containers": [
                            {"name": "sidecar"},
                            {"name": "main", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
                        ]
                    }
                }
            },
            2,
        ),  # the main container, not the first one
    ],
    ids=["v1alpha1-limits", "v1alpha1-requests", "multinode", "v1beta1", "none", "main-not-first"],
)
def test_gpus_per_replica(spec: dict, expected: int | None) -> None:
    """GPUs per replica come from the main container's (or service's) GPU resources, times the node count."""
    assert gpus_per_replica(spec, "c") == expected


def test_gpus_per_replica_refuses_fractions() -> None:
    """A fractional GPU quantity is one line naming the field and the value."""
    with pytest.raises(KubernetesConnectorError) as err:
        gpus_per_replica(worker("w", "decode", gpus="0.5"), f"{LABEL}: spec.components[1]")
    assert str(err.value) == (
        f"{LABEL}: spec.components[1].podTemplate.spec.containers[main].resources.limits.nvidia.com/gpu = '0.5': "
        "GPU count must be a whole number"
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"modelRef": {"name": "meta/llama"}}, "meta/llama"),
        (worker("w", "decode"), "Qwen/Qwen3-0.6B"),  # from `--model` inside one command-line string
        ({"extraPodSpec": {"mainContainer": {"args": ["--model", "a", "--served-model-name", "b"]}}}, "b"),
        (
            {"extraPodSpec": {"mainContainer": {"command": ["python3"], "args": ["--model-path=/models/x"]}}},
            "/models/x",
        ),
        ({"extraPodSpec": {"mainContainer": {"args": ["--port", "8000"]}}}, None),
    ],
    ids=["modelRef", "v1beta1-args", "served-name-wins", "flag-equals", "none"],
)
def test_model_name_of(spec: dict, expected: str | None) -> None:
    """The model comes from modelRef, else the served-model-name, else the model flag in the args."""
    assert model_name_of(spec) == expected


def test_list_components_v1alpha1_services() -> None:
    """v1alpha1 services are typed by subComponentType (else componentType); names are escaped in pointers."""
    dgd = {
        "spec": {
            "services": {
                "Frontend": {"componentType": "frontend"},
                "Prefill/W": {"componentType": "worker", "subComponentType": "prefill", "replicas": 2},
                "Worker": {"componentType": "worker"},
            }
        }
    }
    found = {c.name: c for c in list_components(dgd, LABEL)}
    assert found["Prefill/W"].component_type == "prefill"
    assert found["Prefill/W"].patch_path == "/spec/services/Prefill~1W"
    assert found["Prefill/W"].replicas == 2
    assert found["Worker"].component_type == "worker" and found["Worker"].replicas == 1  # unset -> operator's 1


def test_list_components_refuses_a_dgd_without_components() -> None:
    with pytest.raises(KubernetesConnectorError, match=r"spec.components \(v1beta1\) or spec.services"):
        list_components({"spec": {}}, LABEL)


@pytest.mark.parametrize(
    ("mode", "entries", "expected"),
    [
        (PlannerMode.DISAGG, [("P", "prefill"), ("D", "decode"), ("F", "frontend")], {"prefill": "P", "decode": "D"}),
        (PlannerMode.PREFILL, [("P", "prefill"), ("F", "frontend")], {"prefill": "P"}),
        (PlannerMode.DECODE, [("D", "decode")], {"decode": "D"}),
        (PlannerMode.AGG, [("W", "worker"), ("F", "frontend")], {"decode": "W"}),  # generic worker serves
        (PlannerMode.AGG, [("D", "decode")], {"decode": "D"}),
    ],
    ids=["disagg", "prefill-only", "decode-only", "agg-worker", "agg-decode"],
)
def test_resolve_roles(mode: PlannerMode, entries: list[tuple[str, str]], expected: dict[str, str]) -> None:
    """Each role the mode needs is the one component of that type (aggregated: the generic worker)."""
    roles = resolve_roles(components_of(*(worker(n, t) for n, t in entries)), mode, LABEL)
    assert {role.value: component.name for role, component in roles} == expected


@pytest.mark.parametrize(
    ("mode", "entries", "overrides", "message"),
    [
        (
            PlannerMode.DISAGG,
            [("D", "decode"), ("F", "frontend")],
            None,
            f"{LABEL}: mode 'disagg' needs a component of type 'prefill' for the prefill role; "
            "components: D (decode), F (frontend)",
        ),
        (
            PlannerMode.DISAGG,
            [("W", "worker")],  # a generic worker does not stand in for a disaggregated pool
            None,
            f"{LABEL}: mode 'disagg' needs a component of type 'prefill' for the prefill role; components: W (worker)",
        ),
        (
            PlannerMode.DECODE,
            [("D1", "decode"), ("D2", "decode")],
            None,
            f"{LABEL}: 2 components of type 'decode' (D1, D2); set PLANNER_K8S_DECODE_COMPONENT to pick one",
        ),
        (
            PlannerMode.DECODE,
            [("D1", "decode")],
            {Component.DECODE: "D9"},
            f"{LABEL}: PLANNER_K8S_DECODE_COMPONENT = 'D9': no such component; components: D1 (decode)",
        ),
    ],
    ids=["missing-prefill", "worker-in-disagg", "duplicate-decode", "unknown-override"],
)
def test_resolve_roles_errors(mode, entries, overrides, message) -> None:
    """A missing or duplicated role is one line naming the DGD, the type and the components found."""
    with pytest.raises(KubernetesConnectorError) as err:
        resolve_roles(components_of(*(worker(n, t) for n, t in entries)), mode, LABEL, overrides=overrides)
    assert str(err.value) == message


def test_resolve_roles_override_picks_one_of_duplicates() -> None:
    """PLANNER_K8S_<ROLE>_COMPONENT names the component explicitly (Dynamo's name fallback)."""
    roles = resolve_roles(
        components_of(worker("D1", "decode"), worker("D2", "decode")),
        PlannerMode.DECODE,
        LABEL,
        overrides={Component.DECODE: "D2"},
    )
    assert roles[0][1].name == "D2"


def test_resolve_model_name() -> None:
    """The config's model_name wins; else the components must agree on one name."""
    same = resolve_roles(components_of(worker("P", "prefill"), worker("D", "decode")), PlannerMode.DISAGG, LABEL)
    assert resolve_model_name(None, same, LABEL) == "Qwen/Qwen3-0.6B"
    assert resolve_model_name("mine", same, LABEL) == "mine"
    unnamed = resolve_roles(components_of({"name": "D", "type": "decode"}), PlannerMode.DECODE, LABEL)
    with pytest.raises(KubernetesConnectorError, match=r"model name not resolvable: .* in D; set model_name"):
        resolve_model_name(None, unnamed, LABEL)
    two = resolve_roles(
        components_of(worker("P", "prefill", modelRef={"name": "a"}), worker("D", "decode", modelRef={"name": "b"})),
        PlannerMode.DISAGG,
        LABEL,
    )
    with pytest.raises(KubernetesConnectorError, match="model name ambiguous: components serve a, b"):
        resolve_model_name(None, two, LABEL)


READY = {"type": "Ready", "status": "True", "reason": "all_resources_are_ready"}


@pytest.mark.parametrize(
    ("metadata", "status", "expected"),
    [
        ({"generation": 2}, {"observedGeneration": 2, "conditions": [READY]}, None),
        (
            {"generation": 2},
            {
                "observedGeneration": 2,
                "conditions": [{"type": "Ready", "status": "False", "reason": "pods_not_ready", "message": "1/2"}],
            },
            "Ready=False (pods_not_ready: 1/2)",
        ),
        ({"generation": 2}, {"observedGeneration": 2}, "no Ready condition in status"),
        (
            {"generation": 3},
            {"observedGeneration": 2, "conditions": [READY]},
            "status.observedGeneration 2 < metadata.generation 3",
        ),
        (
            {"generation": 1, "deletionTimestamp": "2026-03-01T12:00:00Z"},
            {"observedGeneration": 1, "conditions": [READY]},
            "being deleted since 2026-03-01T12:00:00Z",
        ),
        (
            {"generation": 1},
            {"observedGeneration": 1, "conditions": [READY], "rollingUpdate": {"phase": "InProgress"}},
            "rolling update InProgress",
        ),
        (
            {"generation": 1},
            {"observedGeneration": 1, "conditions": [READY], "rollingUpdate": {"phase": "Completed"}},
            None,
        ),
    ],
    ids=["ready", "not-ready", "no-condition", "generation-not-observed", "deleting", "rolling", "rolled-out"],
)
def test_readiness_problem(metadata: dict, status: dict, expected: str | None) -> None:
    """A DGD is scaled only when Ready, caught up with its generation, not deleted and not rolling out."""
    assert readiness_problem({"metadata": metadata, "status": status}) == expected


@pytest.mark.parametrize(("num_failures", "delay_s"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0)])
def test_retry_backoff_is_exponential_and_capped(num_failures: int, delay_s: float) -> None:
    """delay = 0.5 s x 2^(n-1), at most 4 s: 0.5, 1, 2, 4, 4."""
    assert RetryPolicy(max_tries=6, backoff_s=0.5, max_backoff_s=4.0).delay_s(num_failures) == delay_s


def test_effective_config_fills_gpus_and_model_and_refuses_a_mismatch(tmp_path: Path) -> None:
    """Unset engine GPU widths and model name come from the DGD; a width that disagrees is an error."""
    from planner_core.runtime.connectors.kubernetes import DeploymentInfo

    roles = resolve_roles(
        components_of(worker("P", "prefill", gpus="1"), worker("D", "decode", gpus="2")), PlannerMode.DISAGG, LABEL
    )
    info = DeploymentInfo(
        namespace="ns", dgd_name="llm", api_version="v1beta1", model_name="Qwen/Qwen3-0.6B", roles=roles
    )
    config = effective_config(parse_config({"environment": "kubernetes"}).policy, info)
    assert (config.prefill_engine_num_gpu, config.decode_engine_num_gpu, config.model_name) == (1, 2, "Qwen/Qwen3-0.6B")
    with pytest.raises(KubernetesConnectorError) as err:
        effective_config(parse_config({"environment": "kubernetes", "decode_engine_num_gpu": 4}).policy, info)
    assert str(err.value) == (
        "DynamoGraphDeployment ns/llm: config decode_engine_num_gpu = 4 but component D has 2 GPU(s) per replica"
    )


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Variables are read by their documented names; a bad one is one line naming the variable."""
    monkeypatch.setenv("DYN_PARENT_DGD_K8S_NAME", "llm")
    monkeypatch.setenv("PLANNER_K8S_MAX_TRIES", "7")
    settings = load_settings()
    assert (settings.parent_dgd_name, settings.max_tries) == ("llm", 7)
    monkeypatch.setenv("PLANNER_K8S_MAX_TRIES", "many")
    with pytest.raises(KubernetesConnectorError) as err:
        load_settings()
    assert str(err.value).startswith("environment variable PLANNER_K8S_MAX_TRIES = 'many': ")
    assert "\n" not in str(err.value)


def test_namespace_resolution(tmp_path: Path) -> None:
    """The namespace: the setting, else the pod's service-account namespace, else "default"."""
    sa_file = tmp_path / "namespace"
    assert resolve_namespace(KubernetesSettings(namespace="explicit"), sa_file) == "explicit"
    unset = KubernetesSettings(namespace=None)  # explicit: the test runner's environment must not leak in
    assert resolve_namespace(unset, sa_file) == "default"
    sa_file.write_text("from-pod\n")
    assert resolve_namespace(unset, sa_file) == "from-pod"


# --------------------------------------------------------------------------------------------------------
# Against the emulated API server
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def kube():
    with KubeApiServer(namespace="ns") as server:
        yield server


@pytest.fixture
def disagg(kube: KubeApiServer) -> KubeApiServer:
    """A settled disaggregated DGD (1 prefill, 1 decode) with a scaling adapter per worker component."""
    kube.put(DGD, disagg_dgd())
    kube.put(DGDSA, adapter(PREFILL_ADAPTER, "VllmPrefillWorker"))
    kube.put(DGDSA, adapter(DECODE_ADAPTER, "VllmDecodeWorker"))
    kube.settle(DGD_NAME)
    return kube


class RecordedSleep:
    """An injectable sleep that records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits_s: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits_s.append(seconds)


def make_connector(
    kube: KubeApiServer, mode: PlannerMode = PlannerMode.DISAGG, *, engine_loads=None, **config
) -> KubernetesConnector:
    connector = KubernetesConnector(
        api_client=k8s_client.ApiClient(k8s_client.Configuration(host=kube.url)),
        namespace=kube.namespace,
        dgd_name=DGD_NAME,
        retry=RetryPolicy(max_tries=4, backoff_s=0.5, max_backoff_s=4.0),
        sleep=RecordedSleep(),
        engine_loads=engine_loads,
    )
    connector.validate(parse_config({"environment": "kubernetes", "mode": mode.value, **config}).policy)
    return connector


class Decision:
    """The two fields of a decision row the connector reads."""

    def __init__(self, target_prefill: int | None, target_decode: int | None) -> None:
        self.target_prefill, self.target_decode = target_prefill, target_decode
        self.deployment_id, self.id = 0, None  # read for the drain records (written only with a session)


NO_WORKERS = WorkerCounts(ready_prefill=0, ready_decode=0, expected_prefill=0, expected_decode=0)


def test_validate_reads_roles_model_and_gpus(disagg: KubeApiServer) -> None:
    """Start-up finds both roles by type, the model from the args and the GPUs from the main container."""
    info = make_connector(disagg).info
    assert info.component(Component.PREFILL).name == "VllmPrefillWorker"
    assert info.component(Component.DECODE).gpus_per_replica == 2
    assert info.model_name == "Qwen/Qwen3-0.6B"


def test_validate_missing_role_is_a_clear_error(kube: KubeApiServer) -> None:
    """A DGD without the prefill component the mode needs fails at start-up in one line."""
    dgd = disagg_dgd()
    dgd["spec"]["components"] = [c for c in dgd["spec"]["components"] if c.get("type") != "prefill"]
    kube.put(DGD, dgd)
    with pytest.raises(KubernetesConnectorError) as err:
        make_connector(kube)
    assert str(err.value) == (
        "DynamoGraphDeployment ns/llm: mode 'disagg' needs a component of type 'prefill' for the prefill role; "
        "components: Frontend (frontend), VllmDecodeWorker (decode)"
    )


def test_validate_missing_dgd_is_a_clear_error(kube: KubeApiServer) -> None:
    """A DGD that does not exist is named, with the 404, in one line."""
    with pytest.raises(KubernetesConnectorError) as err:
        make_connector(kube)
    assert str(err.value).startswith("DynamoGraphDeployment ns/llm cannot be read at start-up: get ")
    assert "404" in str(err.value) and "\n" not in str(err.value)


def test_connect_needs_the_dgd_name() -> None:
    """Without DYN_PARENT_DGD_K8S_NAME the connector says what is missing."""
    with pytest.raises(KubernetesConnectorError, match="^DYN_PARENT_DGD_K8S_NAME is not set"):
        KubernetesConnector.connect(parse_config({}).policy, KubernetesSettings(parent_dgd_name=None))


def test_worker_counts_ready_from_status_expected_from_adapters(disagg: KubeApiServer) -> None:
    """Ready = available replicas in the DGD status; expected = the adapters' desired replicas."""
    connector = make_connector(disagg)
    assert connector.worker_counts(None, 0, default=NO_WORKERS) == WorkerCounts(
        ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1
    )
    connector.apply(None, Decision(3, 2), T0)  # the adapters change at once; the DGD status lags
    assert connector.worker_counts(None, 0, default=NO_WORKERS) == WorkerCounts(
        ready_prefill=1, ready_decode=1, expected_prefill=3, expected_decode=2
    )
    disagg.settle(DGD_NAME)  # the operator rolls out
    assert connector.worker_counts(None, 0, default=NO_WORKERS) == WorkerCounts(
        ready_prefill=3, ready_decode=2, expected_prefill=3, expected_decode=2
    )


def test_apply_writes_only_on_change(disagg: KubeApiServer) -> None:
    """A target equal to the adapter's replicas is not written; a second identical decision writes nothing."""
    connector = make_connector(disagg)
    result = connector.apply(None, Decision(1, 3), T0)
    assert result.outcome.value == "applied"
    assert result.detail == "decode 1->3 via DGDSA llm-vllmdecodeworker/scale; unchanged: prefill at 1"
    assert [w.path.rsplit("/", 2)[-2] for w in disagg.successful_writes()] == [DECODE_ADAPTER]
    disagg.settle(DGD_NAME)
    writes_before = len(disagg.writes())
    again = connector.apply(None, Decision(1, 3), T0)
    assert again.outcome.value == "noop" and len(disagg.writes()) == writes_before
    assert disagg.get(DGD, DGD_NAME)["spec"]["components"][2]["replicas"] == 3  # the operator propagated it


def test_apply_falls_back_to_a_json_patch_without_adapters(kube: KubeApiServer) -> None:
    """Components without a DGDSA are scaled by a conditional JSON Patch of the DGD's component replicas."""
    kube.put(DGD, disagg_dgd(prefill_adapter=False, decode_adapter=False))
    kube.settle(DGD_NAME)
    connector = make_connector(kube)
    result = connector.apply(None, Decision(2, 4), T0)
    assert result.detail == (
        "prefill 1->2 via JSON Patch of DGD llm (no DGDSA); decode 1->4 via JSON Patch of DGD llm (no DGDSA)"
    )
    components = kube.get(DGD, DGD_NAME)["spec"]["components"]
    assert [c.get("replicas") for c in components] == [1, 2, 4]
    patches = [w for w in kube.successful_writes() if w.method == "PATCH"]
    assert patches[0].body == [
        {"op": "test", "path": "/spec/components/1/name", "value": "VllmPrefillWorker"},
        {"op": "replace", "path": "/metadata/resourceVersion", "value": patches[0].body[1]["value"]},
        {"op": "add", "path": "/spec/components/1/replicas", "value": 2},
    ]


def _annotate(dgd: dict) -> None:
    dgd["metadata"].setdefault("annotations", {})["touched-by"] = "someone-else"


def _swap_workers(dgd: dict) -> None:
    components = dgd["spec"]["components"]
    components[1], components[2] = components[2], components[1]


@pytest.mark.parametrize(
    ("mutate", "status"),
    [(_annotate, "409 Conflict"), (_swap_workers, "422 Unprocessable Entity")],
    ids=["concurrent-write-409", "components-reordered-422"],
)
def test_dgd_patch_conflicts_are_re_read_and_retried(kube: KubeApiServer, mutate, status: str) -> None:
    """A DGD changed between read and patch (stale resourceVersion: 409; moved component: failed test, 422)
    is re-read and patched at the component's new place; the other component is left alone."""
    kube.put(DGD, disagg_dgd(prefill_adapter=False, decode_adapter=False))
    kube.settle(DGD_NAME)
    connector = make_connector(kube)
    kube.interfere("PATCH", rf"/{DGD}/{DGD_NAME}$", DGD, DGD_NAME, mutate)
    result = connector.apply(None, Decision(3, None), T0)
    assert result.detail.endswith(f"retried: patch DGD llm: {status}")
    replicas = {c["name"]: c.get("replicas") for c in kube.get(DGD, DGD_NAME)["spec"]["components"]}
    assert replicas == {"Frontend": 1, "VllmPrefillWorker": 3, "VllmDecodeWorker": 1}
    assert [w.status for w in kube.writes()] == [int(status[:3]), 200]
    assert connector._sleep.waits_s == [0.5]


def test_apply_refuses_to_patch_a_dgd_whose_component_declares_an_adapter(kube: KubeApiServer) -> None:
    """A component with `scalingAdapter` but no DGDSA is an error, never a DGD write (the adapter owns replicas)."""
    kube.put(DGD, disagg_dgd())  # both declare scalingAdapter, no DGDSA objects exist
    kube.settle(DGD_NAME)
    connector = make_connector(kube)
    with pytest.raises(KubernetesApiError, match="DGDSA llm-vllmprefillworker not found although component"):
        connector.apply(None, Decision(2, 1), T0)
    assert kube.writes() == []


def test_apply_v1alpha1_services() -> None:
    """A v1alpha1 DGD (spec.services, subComponentType) is patched at /spec/services/<name>/replicas."""
    v1alpha1 = KubeApiServer(namespace="ns", version="v1alpha1")
    with v1alpha1:
        v1alpha1.put(
            DGD,
            {
                "metadata": {"name": DGD_NAME},
                "spec": {
                    "services": {
                        "Frontend": {"componentType": "frontend"},
                        "decode": {
                            "componentType": "worker",
                            "subComponentType": "decode",
                            "replicas": 2,
                            "resources": {"limits": {"gpu": "1"}},
                            "extraPodSpec": {"mainContainer": {"args": ["--model", "m"]}},
                        },
                    }
                },
            },
        )
        v1alpha1.settle(DGD_NAME)
        connector = KubernetesConnector(
            api_client=k8s_client.ApiClient(k8s_client.Configuration(host=v1alpha1.url)),
            namespace="ns",
            dgd_name=DGD_NAME,
            api_version="v1alpha1",
            sleep=RecordedSleep(),
        )
        connector.validate(parse_config({"mode": "decode"}).policy)
        assert connector.apply(None, Decision(None, 5), T0).outcome.value == "applied"
        assert v1alpha1.get(DGD, DGD_NAME)["spec"]["services"]["decode"]["replicas"] == 5


def test_connection_errors_are_retried_then_reported(kube: KubeApiServer) -> None:
    """An unreachable API server: 4 tries with 0.5, 1, 2 s waits, then one line listing every try."""
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = k8s_client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    sleep = RecordedSleep()
    connector = KubernetesConnector(
        api_client=k8s_client.ApiClient(configuration), namespace="ns", dgd_name=DGD_NAME, sleep=sleep
    )
    with pytest.raises(KubernetesConnectorError) as err:
        connector.validate(parse_config({}).policy)
    assert sleep.waits_s == [0.5, 1.0, 2.0]
    assert "gave up after 4 tries" in str(err.value) and str(err.value).count("connection error") == 4


def test_forbidden_is_not_retried_and_points_at_the_rbac(disagg: KubeApiServer) -> None:
    """403 (missing RBAC) fails at once with a hint, without retries."""
    connector = make_connector(disagg)
    disagg.fail("PUT", r"/scale$", 403)
    with pytest.raises(KubernetesApiError, match=r"403 .*infra/k8s/dgd/planner-rbac.yaml"):
        connector.apply(None, Decision(2, 1), T0)
    assert connector._sleep.waits_s == []


# --------------------------------------------------------------------------------------------------------
# The outbox (execute_pending) through the Kubernetes connector, on real Postgres
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def k8s_ctx(database_url: str, tmp_path: Path, profile_dir: Path, disagg: KubeApiServer) -> PlannerContext:
    config = load_config(write_config(tmp_path, environment="kubernetes")).policy
    ctx = PlannerContext(
        database_url=database_url,
        deployment=NAME,
        planner=Planner(config=config, perf=None),
        kubernetes=make_connector(disagg),
    )
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, ctx.config)
    return ctx


def decide(ctx: PlannerContext, minute: int, num_prefill: int | None, num_decode: int | None) -> int:
    """Record a tick whose decision is the given targets; returns the decision id."""
    return record_decision(ctx, NAME, T0 + dt.timedelta(minutes=minute), num_prefill, num_decode)


def executions(ctx: PlannerContext, decision_id: int) -> list[tuple[int, str, str]]:
    with ctx.sessions.begin() as session:
        rows = session.scalars(
            select(ExecutionRow).where(ExecutionRow.decision_id == decision_id).order_by(ExecutionRow.attempt)
        )
        return [(r.attempt, r.outcome, r.detail) for r in rows]


def decision_status(ctx: PlannerContext, decision_id: int) -> str:
    with ctx.sessions.begin() as session:
        return session.get(DecisionRow, decision_id).status


def scale_puts(kube: KubeApiServer, adapter_name: str) -> list[int]:
    """Statuses of the PUTs to one adapter's scale subresource, in order."""
    return [w.status for w in kube.writes() if w.path.endswith(f"/{adapter_name}/scale")]


def test_conflict_then_success_is_retried_recorded_and_applied_once(
    k8s_ctx: PlannerContext, disagg: KubeApiServer
) -> None:
    """A concurrent writer makes the first PUT stale (409): the connector re-reads, writes once, records both."""
    decision_id = decide(k8s_ctx, 0, 3, None)
    disagg.interfere(
        "PUT",
        rf"/{PREFILL_ADAPTER}/scale$",
        DGDSA,
        PREFILL_ADAPTER,
        lambda obj: obj["metadata"].setdefault("annotations", {}).update({"touched-by": "someone-else"}),
    )
    [summary] = run_execution(k8s_ctx, T0)
    assert summary.outcome.value == "applied" and summary.status.value == "applied"
    assert executions(k8s_ctx, decision_id) == [
        (
            1,
            "applied",
            "prefill 1->3 via DGDSA llm-vllmprefillworker/scale; "
            "retried: scale DGDSA llm-vllmprefillworker: 409 Conflict",
        )
    ]
    assert scale_puts(disagg, PREFILL_ADAPTER) == [409, 200]  # exactly one write took effect
    assert disagg.get(DGDSA, PREFILL_ADAPTER)["spec"]["replicas"] == 3
    assert k8s_ctx.kubernetes._sleep.waits_s == [0.5]
    assert run_execution(k8s_ctx, T0) == []  # nothing pending: the decision is never applied twice


def test_a_concurrent_scale_to_the_target_makes_the_retry_a_noop(
    k8s_ctx: PlannerContext, disagg: KubeApiServer
) -> None:
    """If the concurrent writer already set our target, the re-read finds it and writes nothing more."""
    decision_id = decide(k8s_ctx, 0, 3, None)
    disagg.interfere("PUT", r"/scale$", DGDSA, PREFILL_ADAPTER, lambda obj: obj["spec"].update(replicas=3))
    [summary] = run_execution(k8s_ctx, T0)
    assert summary.outcome.value == "noop"
    assert scale_puts(disagg, PREFILL_ADAPTER) == [409]
    assert executions(k8s_ctx, decision_id)[0][2].endswith("retried: scale DGDSA llm-vllmprefillworker: 409 Conflict")


def test_server_errors_fail_after_retries_and_lose_nothing(k8s_ctx: PlannerContext, disagg: KubeApiServer) -> None:
    """500 on every write: each run tries 4 times and records a failure; after 5 failed runs the decision fails.

    Nothing is written meanwhile, and a newer decision is applied exactly once when the server recovers.
    """
    failing = decide(k8s_ctx, 0, 2, None)
    disagg.fail("PUT", r"/scale$", 500, times=4 * MAX_ATTEMPTS)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        [summary] = run_execution(k8s_ctx, T0 + dt.timedelta(seconds=10 * attempt))
        assert summary.outcome.value == "failed" and summary.attempt == attempt
        assert summary.status.value == ("failed" if attempt == MAX_ATTEMPTS else "pending")
    rows = executions(k8s_ctx, failing)
    assert [(a, o) for a, o, _ in rows] == [(a, "failed") for a in range(1, MAX_ATTEMPTS + 1)]
    assert rows[0][2] == (
        "KubernetesApiError: prefill: scale DGDSA llm-vllmprefillworker: gave up after 4 tries ("
        + "; ".join(["scale DGDSA llm-vllmprefillworker: 500 Internal Server Error"] * 4)
        + ")"
    )
    assert scale_puts(disagg, PREFILL_ADAPTER) == [500] * 4 * MAX_ATTEMPTS
    assert disagg.get(DGDSA, PREFILL_ADAPTER)["spec"]["replicas"] == 1  # nothing half-written
    assert k8s_ctx.kubernetes._sleep.waits_s == [0.5, 1.0, 2.0] * MAX_ATTEMPTS

    newer = decide(k8s_ctx, 1, 2, 2)
    [summary] = run_execution(k8s_ctx, T0 + dt.timedelta(minutes=2))
    assert summary.decision_id == newer and summary.outcome.value == "applied"
    assert scale_puts(disagg, PREFILL_ADAPTER)[-1:] == [200] and scale_puts(disagg, DECODE_ADAPTER) == [200]
    assert decision_status(k8s_ctx, failing) == "failed"


def test_a_partial_write_is_finished_by_the_next_attempt_without_rewriting(
    k8s_ctx: PlannerContext, disagg: KubeApiServer
) -> None:
    """Prefill written, decode failing: the attempt fails saying so; the next attempt writes only decode."""
    decision_id = decide(k8s_ctx, 0, 2, 3)
    disagg.fail("PUT", rf"/{DECODE_ADAPTER}/scale$", 503, times=4)
    [first] = run_execution(k8s_ctx, T0)
    assert first.outcome.value == "failed" and "(already written: prefill 1->2" in first.detail
    [second] = run_execution(k8s_ctx, T0 + dt.timedelta(seconds=10))
    assert second.outcome.value == "applied"
    assert second.detail == "decode 1->3 via DGDSA llm-vllmdecodeworker/scale; unchanged: prefill at 2"
    assert scale_puts(disagg, PREFILL_ADAPTER) == [200]  # written once, never again
    assert scale_puts(disagg, DECODE_ADAPTER) == [503] * 4 + [200]
    assert decision_status(k8s_ctx, decision_id) == "applied"


def test_a_dgd_that_is_not_ready_is_refused_and_recorded(k8s_ctx: PlannerContext, disagg: KubeApiServer) -> None:
    """Not ready: the attempt is `blocked_not_ready` with the reason, nothing is written, the decision waits."""
    decision_id = decide(k8s_ctx, 0, 2, 2)
    disagg.settle(DGD_NAME, ready=False)
    [blocked] = run_execution(k8s_ctx, T0)
    assert (blocked.outcome.value, blocked.status.value) == ("blocked_not_ready", "pending")
    assert blocked.detail == (
        "DynamoGraphDeployment ns/llm not ready: Ready=False (pods_not_ready: some pods are not ready); nothing written"
    )
    assert disagg.writes() == []
    disagg.settle(DGD_NAME)
    [applied] = run_execution(k8s_ctx, T0 + dt.timedelta(seconds=10))
    assert applied.outcome.value == "applied" and applied.attempt == 2
    assert [o for _, o, _ in executions(k8s_ctx, decision_id)] == ["blocked_not_ready", "applied"]


def test_waiting_attempts_do_not_count_towards_giving_up(k8s_ctx: PlannerContext, disagg: KubeApiServer) -> None:
    """MAX_ATTEMPTS blocked attempts then one failure: the decision is still pending (only failures count)."""
    decision_id = decide(k8s_ctx, 0, 2, None)
    disagg.settle(DGD_NAME, ready=False)
    for i in range(MAX_ATTEMPTS):
        run_execution(k8s_ctx, T0 + dt.timedelta(seconds=i))
    disagg.settle(DGD_NAME)
    disagg.fail("PUT", r"/scale$", 500, times=4)
    [failed] = run_execution(k8s_ctx, T0 + dt.timedelta(minutes=1))
    assert failed.outcome.value == "failed" and failed.attempt == MAX_ATTEMPTS + 1
    assert decision_status(k8s_ctx, decision_id) == "pending"


# --------------------------------------------------------------------------------------------------------
# Selected by `environment: kubernetes` through load_context (kubeconfig, environment variables)
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def kube_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, disagg: KubeApiServer) -> KubeApiServer:
    """KUBECONFIG pointing at the emulated server, and the connector's variables."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": disagg.url}}],
                "users": [{"name": "planner", "user": {"token": "test-token"}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "planner"}}],
                "current-context": "emulated",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("DYN_PARENT_DGD_K8S_NAME", DGD_NAME)
    monkeypatch.setenv("PLANNER_K8S_NAMESPACE", disagg.namespace)
    monkeypatch.setenv("PLANNER_K8S_BACKOFF_S", "0")
    return disagg


def test_load_context_selects_and_validates_the_kubernetes_connector(
    database_url: str, tmp_path: Path, profile_dir: Path, kube_env: KubeApiServer
) -> None:
    """environment: kubernetes -> the DGD is validated at load; ticks see its workers; executions scale it."""
    ctx = load_context(database_url, NAME, write_config(tmp_path, environment="kubernetes", model_name=None))
    assert isinstance(ctx.connector, KubernetesConnector)
    assert (ctx.config.model_name, ctx.config.prefill_engine_num_gpu, ctx.config.decode_engine_num_gpu) == (
        "Qwen/Qwen3-0.6B",
        1,
        2,
    )
    kube_env.update(
        DGD, DGD_NAME, lambda dgd: dgd["status"]["components"]["VllmDecodeWorker"].update(availableReplicas=0)
    )
    traffic = TrafficObservation(duration_s=60, num_req=3000, isl=3000, osl=300)
    result = run_tick(ctx, Loop.THROUGHPUT, T0, traffic)
    assert result.inputs.workers == WorkerCounts(ready_prefill=1, ready_decode=0, expected_prefill=1, expected_decode=1)
    with ctx.sessions.begin() as session:
        observed = session.get(WorkerObservationRow, result.tick_id)
        assert (observed.ready_prefill, observed.ready_decode, observed.expected_decode) == (1, 0, 1)
    decision = result.outcome.decision
    assert (decision.num_prefill, decision.num_decode) == (4, 2)  # 3000 req/min at 3000/300 on the H200 profile
    kube_env.settle(DGD_NAME)
    [summary] = run_execution(ctx, T0)
    assert summary.outcome.value == "applied"
    assert kube_env.get(DGDSA, PREFILL_ADAPTER)["spec"]["replicas"] == 4
    assert kube_env.get(DGDSA, DECODE_ADAPTER)["spec"]["replicas"] == 2
    with ctx.sessions.begin() as session:
        assert session.scalar(select(ExecutionRow.connector)) == "kubernetes"


def test_load_context_reports_a_missing_role(
    database_url: str, tmp_path: Path, profile_dir: Path, kube_env: KubeApiServer
) -> None:
    """A DGD the mode cannot scale stops load_context with one line (nothing is recorded)."""
    config = write_config(tmp_path, environment="kubernetes", mode="prefill")
    dgd = copy.deepcopy(kube_env.get(DGD, DGD_NAME))
    dgd["spec"]["components"][1]["type"] = "worker"
    kube_env.put(DGD, dgd)
    with pytest.raises(KubernetesConnectorError, match="mode 'prefill' needs a component of type 'prefill'"):
        load_context(database_url, NAME, config)


def test_default_workers_fill_pools_the_mode_does_not_manage(disagg: KubeApiServer, tmp_path: Path) -> None:
    """In aggregated mode only the decode pool comes from the DGD; prefill keeps the defaults."""
    dgd = disagg_dgd()
    dgd["spec"]["components"] = [worker("Worker", "worker", replicas=2)]
    disagg.put(DGD, dgd)
    disagg.settle(DGD_NAME)
    connector = make_connector(disagg, PlannerMode.AGG)
    config = parse_config({"mode": "agg", "environment": "kubernetes", "min_endpoint": 1}).policy
    counts = connector.worker_counts(None, 0, default=default_workers(config))
    assert counts == WorkerCounts(ready_prefill=1, ready_decode=2, expected_prefill=1, expected_decode=2)


# --------------------------------------------------------------------------------------------------------
# RBAC
# --------------------------------------------------------------------------------------------------------


def _rbac_request(method: str, path: str) -> tuple[str, str, str]:
    """(resource as RBAC names it, verb, object name) of one logged request to
    /apis/nvidia.com/<version>/namespaces/<ns>/<plural>[/<name>[/scale]]."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["api", "v1"]:  # the core group: /api/v1/namespaces/<ns>/events (the tick's Event), pods
        parts = ["apis", "", *parts[1:]]
    assert parts[0] == "apis" and parts[1] in ("nvidia.com", "") and parts[3] == "namespaces", path
    plural, rest = parts[5], parts[6:]
    if not rest:  # a collection: list (GET), create (POST); a watch is a list with ?watch=1
        return plural, {"GET": "list", "POST": "create"}[method], ""
    verbs = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    resource = f"{plural}/{rest[1]}" if len(rest) > 1 else plural
    return resource, verbs[method], rest[0]


def _granted_rules(path: Path) -> tuple[dict[tuple[str, str], set[str]], dict]:
    """The Role of an RBAC manifest as {(api group, resource): verbs}, and the manifest's documents by kind."""
    by_kind = {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in by_kind["Role"]["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert "*" not in str(granted)
    return granted, by_kind


def test_rbac_grants_exactly_what_the_connector_calls(kube: KubeApiServer) -> None:
    """Every path of the DGD connector against the emulated API server (start-up, counts, a write through the
    adapters, the JSON Patch fallback with a 409 retry, the agg mode), then the Role's rules compared with the
    requests the server logged: the same (resource, verb) pairs, and every object touched is the DGD or one of
    its adapters (so `resourceNames` can pin the Role to them)."""
    kube.put(DGD, disagg_dgd())
    kube.put(DGDSA, adapter(PREFILL_ADAPTER, "VllmPrefillWorker"))
    kube.put(DGDSA, adapter(DECODE_ADAPTER, "VllmDecodeWorker"))
    kube.settle(DGD_NAME)
    connector = make_connector(kube)
    connector.worker_counts(None, 0, default=NO_WORKERS)
    connector.apply(None, Decision(2, 3), T0)
    kube.settle(DGD_NAME)
    connector.apply(None, Decision(2, 3), T0)  # the no-op path reads only
    kube.delete(DGDSA, PREFILL_ADAPTER)
    kube.delete(DGDSA, DECODE_ADAPTER)
    dgd = disagg_dgd(prefill_adapter=False, decode_adapter=False)
    next(c for c in dgd["spec"]["components"] if c["name"] == "VllmDecodeWorker")["replicas"] = 3
    kube.put(DGD, dgd)
    kube.settle(DGD_NAME)
    for name in ("llm-decode-a", "llm-decode-b", "llm-decode-c"):  # the scale-down below annotates them
        kube.put(PODS, pod(name, "VllmDecodeWorker"))
    loads = {dynamo_pod_instance_id("llm-decode-a"): 3, dynamo_pod_instance_id("llm-decode-b"): 1}
    fallback = make_connector(kube, engine_loads=lambda *_: loads)
    kube.interfere("PATCH", rf"/{DGD}/{DGD_NAME}$", DGD, DGD_NAME, _annotate)
    fallback.apply(None, Decision(4, 1), T0)
    fallback.worker_counts(None, 0, default=NO_WORKERS)
    fallback.post_event(TickEvent(reason=EventReason.SCALED_UP, message="prefill 1 -> 4"), T0, loop="throughput")
    used: dict[tuple[str, str], set[str]] = {}
    names: set[str] = set()
    for request in kube.requests:
        resource, verb, name = _rbac_request(request.method, request.path)
        used.setdefault(("" if resource in ("events", "pods") else "nvidia.com", resource), set()).add(verb)
        names.add(name)

    granted, by_kind = _granted_rules(REPO_ROOT / RBAC_FILE)
    assert sorted(by_kind) == ["Role", "RoleBinding", "ServiceAccount"]
    assert (
        granted
        == used
        == {
            ("nvidia.com", "dynamographdeployments"): {"get", "patch"},
            ("nvidia.com", "dynamographdeploymentscalingadapters/scale"): {"get", "update"},
            ("", "events"): {"create"},
            ("", "pods"): {"list", "patch"},
        }
        == access_by_resource(REQUIRED_ACCESS)  # what `planner doctor` asks the cluster for
        == planner_role("overlays/dgd")  # what the Kustomize install binds to the planner's account
    )
    # no collection read but the pods' (by label): the DGD, its adapters and the managed pods (the create of an
    # Event and the list of pods name no object)
    assert names == {DGD_NAME, PREFILL_ADAPTER, DECODE_ADAPTER, "llm-decode-a", "llm-decode-b", "llm-decode-c", ""}
    binding = by_kind["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "dynamo-planner"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": by_kind["ServiceAccount"]["metadata"]["name"]}]


def test_the_docs_state_the_rbac_the_manifests_grant() -> None:
    """docs/operations.md's RBAC sentences list the verbs each manifest grants, and no verb the Role lacks."""
    text = " ".join((REPO_ROOT / "docs" / "operations.md").read_text().split())
    assert (
        "`infra/k8s/dgd/planner-rbac.yaml` (ServiceAccount, Role, RoleBinding `dynamo-planner`) grants get and "
        "patch on `dynamographdeployments`, get and update on `dynamographdeploymentscalingadapters/scale`, "
        "create on `events` (the tick's one Event on the DGD) and list and patch on `pods`"
    ) in text
    assert (
        "`infra/k8s/workloads/planner-workloads-rbac.yaml` (ServiceAccount, Role, RoleBinding `planner-workloads`) "
        "grants get "
        "and list on `deployments` and `statefulsets` and get and update on `deployments/scale` and "
        "`statefulsets/scale`"
    ) in text
    readme = " ".join((REPO_ROOT / "README.md").read_text().split()).lower()
    for claim in ("list/watch", "get/list/watch"):
        assert claim not in text.lower() and claim not in readme


def test_k8s_check_command(tmp_path: Path, kube_env: KubeApiServer, capsys: pytest.CaptureFixture[str]) -> None:
    """`planner k8s-check` prints the roles, GPUs and counts, or the start-up error in one line (exit 2)."""
    from planner_cli.main import main

    config = write_config(tmp_path, environment="kubernetes")
    assert main(["k8s-check", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "DynamoGraphDeployment ns/llm (v1beta1): ready",
        "  model: test-model",
        "  prefill: VllmPrefillWorker (type prefill), 1 GPU(s)/replica, 1 ready of 1 expected",
        "  decode: VllmDecodeWorker (type decode), 2 GPU(s)/replica, 1 ready of 1 expected",
        "  other autoscalers: none (no HorizontalPodAutoscaler or ScaledObject scales the DGD or its adapters)",
    ]
    # an HPA on the decode adapter and a ScaledObject on the DGD fight the planner; one on another object does not
    kube_env.put(
        HPAS,
        {
            "metadata": {"name": "decode-hpa"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "nvidia.com/v1beta1",
                    "kind": "DynamoGraphDeploymentScalingAdapter",
                    "name": DECODE_ADAPTER,
                }
            },
        },
    )
    kube_env.put(
        SCALEDOBJECTS,
        {
            "metadata": {"name": "llm-so"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "nvidia.com/v1beta1",
                    "kind": "DynamoGraphDeployment",
                    "name": DGD_NAME,
                }
            },
        },
    )
    kube_env.put(HPAS, {"metadata": {"name": "web"}, "spec": {"scaleTargetRef": {"kind": "Deployment",
                                                                                 "name": DGD_NAME}}})  # fmt: skip
    assert main(["k8s-check", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"  WARNING: HorizontalPodAutoscaler ns/decode-hpa scales DynamoGraphDeploymentScalingAdapter {DECODE_ADAPTER}",
        f"  WARNING: ScaledObject ns/llm-so scales DynamoGraphDeployment {DGD_NAME}",
    ]
    kube_env.delete(DGD, DGD_NAME)
    assert main(["k8s-check", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith("planner: error: DynamoGraphDeployment ns/llm cannot be read at start-up")
        and error.count("\n") == 1
    )


# --------------------------------------------------------------------------------------------------------
# One owner of the replica count: an outside change is detected at the next tick and handled by the rule
# --------------------------------------------------------------------------------------------------------


def _kubectl_scale(kube: KubeApiServer, adapter_name: str, replicas: int) -> None:
    """What `kubectl scale` (or an HPA) does to a DGDSA: its spec.replicas changes behind the planner's back."""
    scaled = copy.deepcopy(kube.get(DGDSA, adapter_name))
    scaled["spec"]["replicas"] = replicas
    kube.put(DGDSA, scaled)


def _events(kube: KubeApiServer) -> list[dict]:
    """The Events the server holds, oldest first."""
    found = kube._call(lambda: [o for (r, _, _), o in kube.emulator.objects.items() if r.plural == EVENTS])
    return sorted((dict(o) for o in found), key=lambda e: e["metadata"]["name"])


def _steps(ctx: PlannerContext, step: str) -> list[tuple[str, str, float]]:
    with ctx.sessions.begin() as session:
        rows = repo.query_rows(
            session,
            "SELECT s.reason, s.component, s.value FROM tick_steps s JOIN ticks t ON t.id = s.tick_id "
            "WHERE s.step = :step ORDER BY t.scheduled_at",
            step=step,
        )
    return [(row["reason"], row["component"], row["value"]) for row in rows]


@pytest.mark.parametrize(
    ("rule", "want_reason", "want_value"),
    [("adopt_and_hold", "outside_change_adopted", 5.0), ("restore", "outside_change_restored", 3.0)],
)
def test_an_outside_scale_is_detected_at_the_next_tick_and_handled_by_the_rule(
    k8s_ctx: PlannerContext, disagg: KubeApiServer, tmp_path: Path, rule: str, want_reason: str, want_value: float
) -> None:
    """The planner applies prefill 3; someone scales the DGDSA to 5; the next tick records the change with the
    rule's reason in `tick_steps`: adopted (no decision: 5 is held) or restored (a decision for 3, which the next
    execution writes back). A tick before the outside change records nothing of the kind."""
    # the planner as `planner serve` builds it (profile included), so that replay decides with the same models
    path = write_config(tmp_path, environment="kubernetes", outside_change_rule=rule)
    ctx = dataclasses.replace(k8s_ctx, planner=build_planner(load_config(path).policy, path))
    decide(ctx, 0, 3, None)
    [applied] = run_execution(ctx, T0)
    assert applied.outcome.value == "applied"
    disagg.settle(DGD_NAME)
    run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=1), None)
    assert _steps(ctx, "ownership") == []  # the count in force is the planner's

    _kubectl_scale(disagg, PREFILL_ADAPTER, 5)
    # with a traffic window: a missing one would keep the pool from shrinking back (the signal guard)
    window = TrafficObservation(duration_s=60.0, num_req=60.0, isl=100.0, osl=10.0)
    result = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=2), window)
    assert result.inputs.outside_changes == (
        OutsideChange(component=Component.PREFILL, planner_replicas=3, observed_replicas=5),
    )
    assert _steps(ctx, "ownership") == [(want_reason, "prefill", want_value)]
    # the tick's one Event on the DGD says so (the first tick, with no traffic window, said MetricsUnavailable)
    second = T0 + dt.timedelta(minutes=2)
    events = [
        e
        for e in _events(disagg)
        if e["metadata"]["name"] == f"{DGD_NAME}.throughput.{int(second.timestamp() * 1000):x}"
    ]
    assert [(e["reason"], e["type"], e["involvedObject"]["name"]) for e in events] == [
        ("ReplicasChangedOutside", "Warning", DGD_NAME)
    ]
    assert "prefill count changed outside the planner: 3 -> 5" in events[0]["message"]
    if rule == "restore":
        assert result.outcome.decision.num_prefill == 3
        run_execution(ctx, T0 + dt.timedelta(minutes=2))
        assert disagg.get(DGDSA, PREFILL_ADAPTER)["spec"]["replicas"] == 3  # written back
    else:
        assert result.outcome.decision.is_empty
        assert disagg.get(DGDSA, PREFILL_ADAPTER)["spec"]["replicas"] == 5  # left as the operator set it
    # the outside change is an input recorded with the tick: replay decides the same without a cluster
    # (from the first tick of the planner's own: the decision at T0 is hand-made)
    summary = replay(ctx.database_url, NAME, T0 + dt.timedelta(seconds=30), T0 + dt.timedelta(hours=1))
    assert (summary.num_ticks, summary.num_identical) == (2, 2), summary.differences


def test_an_unreadable_cluster_is_a_missing_signal_not_a_failed_tick(
    k8s_ctx: PlannerContext, disagg: KubeApiServer
) -> None:
    """The API server answers 500 to every read of the DGD: the tick is recorded with the minimum endpoints as a
    stand-in, `signal_missed` for the worker counts, no decision, and the problem in the audit log."""
    disagg.fail("GET", rf"/{DGD}/{DGD_NAME}$", 500, times=10)
    result = run_tick(k8s_ctx, Loop.THROUGHPUT, T0, None)
    assert result.tick_id is not None and result.outcome.decision.is_empty
    assert not result.inputs.workers_observed
    with k8s_ctx.sessions.begin() as session:
        missed = repo.query_rows(session, "SELECT reason, value, detail FROM tick_steps WHERE step = 'signal'")
    assert [(row["reason"], row["value"]) for row in missed] == [("signal_missed", 1.0)] * 2
    assert sorted(row["detail"].split()[0] for row in missed) == ["traffic", "workers"]
    with k8s_ctx.sessions.begin() as session:
        [row] = repo.query_rows(session, "SELECT detail FROM audit_log WHERE event = 'worker_counts_unavailable'")
    assert "500" in row["detail"]["problem"]


class _FailingPlanner(Planner):
    """A planner whose decision raises (a broken model or plugin chain, as far as the tick can tell)."""

    def decide(self, *_args: object, **_kwargs: object) -> TickOutcome:
        raise RuntimeError("the perf model could not be evaluated")


def test_a_tick_that_raises_posts_decision_failed_and_still_raises(
    k8s_ctx: PlannerContext, disagg: KubeApiServer
) -> None:
    ctx = dataclasses.replace(k8s_ctx, planner=_FailingPlanner(config=k8s_ctx.config, perf=None))
    with pytest.raises(RuntimeError, match="could not be evaluated"):
        run_tick(ctx, Loop.THROUGHPUT, T0, None)
    [event] = _events(disagg)
    assert (event["reason"], event["type"]) == ("DecisionFailed", "Warning")
    assert event["message"] == "throughput tick: the perf model could not be evaluated"


# --------------------------------------------------------------------------------------------------------
# Drain before removal: the pods' deletion cost from their load
# --------------------------------------------------------------------------------------------------------


def pod(name: str, component: str, *, ready: bool = True, grace_s: int | None = 45) -> dict:
    """A pod of a DGD component as the Dynamo operator labels it."""
    spec: dict = {"containers": [{"name": "main", "image": "dynamo:1.6.1"}]}
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/dynamo-graph-deployment-name": DGD_NAME, "nvidia.com/dynamo-component": component},
        },
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _store_loads(ctx: PlannerContext, loads: dict[str, int], at: dt.datetime) -> None:
    """A forward-pass sample per pod's engine (named by the instance id Dynamo derives from the pod name)."""
    from planner_core.domain import ForwardPassMetrics, ScheduledRequests
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples

    samples = [
        FpmSample(
            fpm=ForwardPassMetrics(
                component=Component.DECODE,
                worker_id=dynamo_pod_instance_id(name),
                wall_time_s=0.02,
                scheduled=ScheduledRequests(num_decode_requests=n),
            ),
            received_at=at,
        )
        for name, n in loads.items()
    ]
    with ctx.sessions.begin() as session:
        insert_fpm_samples(session, repo.find_deployment(session, NAME).id, samples)


def test_a_scale_down_gives_the_least_loaded_pods_the_lowest_deletion_cost(
    k8s_ctx: PlannerContext, disagg: KubeApiServer
) -> None:
    """Four decode pods with 6, 0, unknown and 2 requests in flight (their engines' forward-pass samples; the third
    has none): a decision from 4 to 2 decode replicas sets each pod's deletion cost to its load (the unknown one to
    the busiest + 1) before the replicas go down, so Kubernetes removes the two least loaded; each is recorded as a
    drain handed over with its load and its pod's grace. A prefill pod is left alone."""
    from planner_core.runtime.connectors.pod_drain import DELETION_COST
    from planner_core.runtime.store.models import DrainRow

    disagg.update(DGDSA, DECODE_ADAPTER, lambda obj: obj["spec"].update(replicas=4))
    disagg.settle(DGD_NAME)
    names = ["llm-decode-a", "llm-decode-b", "llm-decode-c", "llm-decode-d"]
    for name in names:
        disagg.put(PODS, pod(name, "VllmDecodeWorker", grace_s=45 if name != "llm-decode-d" else None))
    disagg.put(PODS, pod("llm-prefill-a", "VllmPrefillWorker"))
    _store_loads(k8s_ctx, {"llm-decode-a": 6, "llm-decode-b": 0, "llm-decode-d": 2, "llm-prefill-a": 0}, T0)
    decision_id = decide(k8s_ctx, 0, None, 2)
    # the first attempt's write of the replicas fails (after its retries): its drain records go with its savepoint,
    # the second attempt writes the replicas, and each pod expected to go is recorded once
    disagg.fail("PUT", rf"/{DECODE_ADAPTER}/scale$", 503, times=4)
    [failed] = run_execution(k8s_ctx, T0 + dt.timedelta(seconds=1))
    assert failed.outcome.value == "failed"
    [summary] = run_execution(k8s_ctx, T0 + dt.timedelta(seconds=2))
    assert summary.outcome.value == "applied"

    costs = {n: disagg.get(PODS, n)["metadata"].get("annotations", {}).get(DELETION_COST) for n in names}
    assert costs == {"llm-decode-a": "6", "llm-decode-b": "0", "llm-decode-c": "7", "llm-decode-d": "2"}
    assert "annotations" not in disagg.get(PODS, "llm-prefill-a")["metadata"]
    assert disagg.get(DGDSA, DECODE_ADAPTER)["spec"]["replicas"] == 2
    # the costs were written before the replicas went down
    paths = [w.path for w in disagg.writes()]
    assert max(i for i, p in enumerate(paths) if "/pods/" in p) < paths.index(
        next(p for p in paths if p.endswith(f"/{DECODE_ADAPTER}/scale"))
    )
    with k8s_ctx.sessions.begin() as session:
        drains = session.execute(
            select(
                DrainRow.engine,
                DrainRow.num_in_flight_at_start,
                DrainRow.grace_s,
                DrainRow.outcome,
                DrainRow.decision_id,
            ).order_by(DrainRow.num_in_flight_at_start)
        ).all()
    assert [tuple(d) for d in drains] == [
        ("pod ns/llm-decode-b", 0, 45.0, "handed_over", decision_id),
        ("pod ns/llm-decode-d", 2, 30.0, "handed_over", decision_id),  # no grace in its spec: Kubernetes' 30 s
    ]
    assert (
        "expected to go: llm-decode-b (0 in flight), llm-decode-d (2 in flight)"
        in executions(k8s_ctx, decision_id)[-1][2]
    )


def test_dynamo_pod_instance_id_is_rusts_hash_of_the_pod_name() -> None:
    """The values Rust 1.95 printed for `DefaultHasher` of these names masked to 53 bits (Dynamo's `hash_pod_name`),
    with `rustc` on a 12-line program: `name.hash(&mut h); h.finish() & 0x001F_FFFF_FFFF_FFFF`."""

    assert dynamo_pod_instance_id("vllm-agg-decode-7d9f8c6b5-x2k4p") == "883491428390499"
    assert dynamo_pod_instance_id("a") == "7688582637611507"
    assert dynamo_pod_instance_id("") == "121655548788207"
    assert dynamo_pod_instance_id("disagg-0123456789abcdef-worker-pod") == "2281199563725771"


def test_deletion_costs_without_any_known_load_write_nothing() -> None:
    """No pod's load known (no forward-pass samples): no cost is written and Kubernetes' own order holds; with some
    known, an unknown pod costs the busiest + 1 and a pod not ready goes first whatever its cost."""
    from planner_core.runtime.connectors.pod_drain import PodLoad, deletion_costs, planned_removals

    def load(name: str, n: int | None, *, ready: bool = True) -> PodLoad:
        return PodLoad(name=name, ready=ready, num_in_flight=n, grace_s=30.0, instance_id="1")

    assert deletion_costs([load("a", None), load("b", None)]) == {}
    pods = [load("a", 4), load("b", None), load("c", 9, ready=False), load("d", 1)]
    costs = deletion_costs(pods)
    assert costs == {"a": 4, "b": 10, "c": 9, "d": 1}
    assert [p.name for p in planned_removals(pods, costs, 2)] == ["c", "d"]
