"""The workload connector (`environment: kubernetes-workloads`): rollout rules (pure), then the real `kubernetes`
client against the emulated API server (tests/runtime/kube_api.py: apps/v1 Deployments and StatefulSets with their scale
subresource, resourceVersion/409 and faults), the execution outbox on real Postgres, and the RBAC manifest checked
against the requests the connector actually made.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from sqlalchemy import select

from planner_core.config import ConfigError, PlannerMode, WorkloadKind, parse_config
from planner_core.domain import (
    WorkerCounts,
)
from planner_core.planner import Planner
from planner_core.runtime.connectors import workloads as workloads_connector
from planner_core.runtime.connectors.kubernetes import KubernetesConnectorError, RetryPolicy
from planner_core.runtime.connectors.workloads import (
    RolloutReason,
    WorkloadConnector,
    rollout_problem,
    workload_targets,
)
from planner_core.runtime.service import PlannerContext, load_context, run_execution
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import ExecutionRow
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.databases import record_decision
from tests.runtime.kube_api import DEPLOYMENTS, STATEFULSETS, KubeApiServer, access_by_resource
from tests.runtime.kustomize import planner_role

NAME = "workloads-test"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
NO_WORKERS = WorkerCounts(ready_prefill=0, ready_decode=0, expected_prefill=0, expected_decode=0)
BY_NAME = {
    "prefill": {"kind": "Deployment", "name": "llm-prefill"},
    "decode": {"kind": "Deployment", "name": "llm-decode"},
}


# --------------------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------------------


def workload(kind: str, name: str, role: str, *, replicas: int = 1, gpus: str = "1", app: str = "llm") -> dict:
    """A complete apps/v1 workload (the typed client checks required fields) serving Qwen/Qwen3-0.6B."""
    labels = {"app": app, "role": role}
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "vllm/vllm-openai:v0.11.0",
                        "args": ["--model", "Qwen/Qwen3-0.6B", "--port", "8000"],
                        "resources": {"limits": {"nvidia.com/gpu": gpus}},
                    }
                ]
            },
        },
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "labels": labels}, "spec": spec}


class RecordedSleep:
    def __init__(self) -> None:
        self.waits_s: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits_s.append(seconds)


class Decision:
    def __init__(self, target_prefill: int | None, target_decode: int | None) -> None:
        self.target_prefill, self.target_decode = target_prefill, target_decode


def make_connector(kube: KubeApiServer, workloads: dict | None = None, mode: str = "disagg") -> WorkloadConnector:
    loaded = parse_config(
        {"environment": "kubernetes-workloads", "mode": mode, "kubernetes_workloads": workloads or BY_NAME}
    )
    assert loaded.service.kubernetes_workloads is not None
    connector = WorkloadConnector(
        api_client=k8s_client.ApiClient(k8s_client.Configuration(host=kube.url)),
        targets=workload_targets(loaded.service.kubernetes_workloads, kube.namespace),
        retry=RetryPolicy(max_tries=4, backoff_s=0.5, max_backoff_s=4.0),
        sleep=RecordedSleep(),
    )
    connector.validate(loaded.policy)
    return connector


@pytest.fixture
def kube():
    with KubeApiServer(namespace="ns") as server:
        yield server


@pytest.fixture
def two(kube: KubeApiServer) -> KubeApiServer:
    """Two settled Deployments: llm-prefill (1 GPU) and llm-decode (2 GPUs), one replica each."""
    kube.put(DEPLOYMENTS, workload("Deployment", "llm-prefill", "prefill"))
    kube.put(DEPLOYMENTS, workload("Deployment", "llm-decode", "decode", gpus="2"))
    kube.settle_workload(DEPLOYMENTS, "llm-prefill")
    kube.settle_workload(DEPLOYMENTS, "llm-decode")
    return kube


def scale_puts(kube: KubeApiServer, name: str) -> list[int]:
    return [w.status for w in kube.writes() if w.path.endswith(f"/{name}/scale")]


# --------------------------------------------------------------------------------------------------------
# Config and rollout rules (pure)
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"environment": "kubernetes-workloads"}, "field 'kubernetes_workloads' = null: required when "),
        (
            {"environment": "kubernetes-workloads", "kubernetes_workloads": {"prefill": BY_NAME["prefill"]}},
            "field 'kubernetes_workloads.decode' = null: required when mode='disagg'",
        ),
        (
            {"environment": "kubernetes-workloads", "kubernetes_workloads": {**BY_NAME, "prefill": {"kind": "Job"}}},
            "field 'kubernetes_workloads.prefill.kind' = 'Job': allowed values are Deployment, StatefulSet",
        ),
        (
            {
                "environment": "kubernetes-workloads",
                "kubernetes_workloads": {**BY_NAME, "decode": {"kind": "Deployment"}},
            },
            "field 'kubernetes_workloads.decode.name' = null: set name or selector",
        ),
        (
            {
                "environment": "kubernetes-workloads",
                "mode": "agg",
                "kubernetes_workloads": {"decode": BY_NAME["decode"]},
            },
            "field 'kubernetes_workloads.decode' = 'llm-decode': not used when mode='agg' (set aggregated)",
        ),
        (
            {"environment": "virtual", "kubernetes_workloads": BY_NAME},
            "field 'environment' = 'virtual': must be 'kubernetes-workloads' when kubernetes_workloads is set",
        ),
    ],
    ids=["missing", "missing-role", "bad-kind", "no-name-or-selector", "wrong-role-for-mode", "wrong-environment"],
)
def test_config_errors_name_the_field_and_value(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, source="c.yaml")
    assert str(err.value).startswith(f"c.yaml: {message}") and "\n" not in str(err.value)


def test_workload_namespaces_and_selector_query() -> None:
    """A workload's namespace is its own, else the section's, else the default; selectors become `k=v,...`."""
    loaded = parse_config(
        {
            "environment": "kubernetes-workloads",
            "kubernetes_workloads": {
                "namespace": "serving",
                "prefill": {"kind": "Deployment", "name": "p", "namespace": "other"},
                "decode": {"kind": "StatefulSet", "selector": {"role": "decode", "app": "llm"}},
            },
        }
    )
    prefill, decode = workload_targets(loaded.service.kubernetes_workloads, "default")
    assert (prefill.namespace, prefill.label) == ("other", "Deployment other/p")
    assert (decode.namespace, decode.kind, decode.label_selector) == (
        "serving",
        WorkloadKind.STATEFUL_SET,
        "app=llm,role=decode",
    )
    assert decode.label == "StatefulSet serving/[app=llm,role=decode]"


SETTLED = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}


@pytest.mark.parametrize(
    ("kind", "metadata", "status", "expected"),
    [
        (WorkloadKind.DEPLOYMENT, {}, {}, None),
        (
            WorkloadKind.DEPLOYMENT,
            {"generation": 4},
            {},
            (RolloutReason.GENERATION_NOT_OBSERVED, "status.observedGeneration 3 < metadata.generation 4"),
        ),
        (
            WorkloadKind.DEPLOYMENT,
            {},
            {"updatedReplicas": 1},
            (RolloutReason.REPLICAS_NOT_UPDATED, "status.updatedReplicas 1 < spec.replicas 2"),
        ),
        (
            WorkloadKind.DEPLOYMENT,
            {},
            {"replicas": 3},
            (
                RolloutReason.OLD_REPLICAS_PENDING,
                "status.replicas 3 > status.updatedReplicas 2 (old replicas pending termination)",
            ),
        ),
        (
            WorkloadKind.DEPLOYMENT,
            {},
            {"availableReplicas": 1},
            (RolloutReason.REPLICAS_NOT_AVAILABLE, "status.availableReplicas 1 < spec.replicas 2"),
        ),
        (
            WorkloadKind.DEPLOYMENT,
            {"deletionTimestamp": "2026-03-01T12:00:00Z"},
            {},
            (RolloutReason.DELETING, "metadata.deletionTimestamp 2026-03-01T12:00:00Z"),
        ),
        (WorkloadKind.STATEFUL_SET, {}, {"currentRevision": "s-1", "updateRevision": "s-1"}, None),
        (
            WorkloadKind.STATEFUL_SET,
            {},
            {"currentRevision": "s-1", "updateRevision": "s-2"},
            (RolloutReason.REVISION_ROLLING, "status.currentRevision s-1 != status.updateRevision s-2"),
        ),
        (WorkloadKind.STATEFUL_SET, {}, {"replicas": 3}, None),  # a StatefulSet has no old ReplicaSet
    ],
    ids=[
        "settled",
        "generation",
        "not-updated",
        "old-pending",
        "not-available",
        "deleting",
        "sts-settled",
        "sts-revision",
        "sts-replicas",
    ],
)
def test_rollout_problem(kind: WorkloadKind, metadata: dict, status: dict, expected: tuple | None) -> None:
    """A workload is scaled only when its controller caught up and every replica is updated and available."""
    body = {"metadata": {"generation": 3, **metadata}, "spec": {"replicas": 2}, "status": {**SETTLED, **status}}
    problem = rollout_problem(kind, body)
    assert (None if problem is None else (problem.reason, problem.detail)) == expected


# --------------------------------------------------------------------------------------------------------
# Against the emulated API server
# --------------------------------------------------------------------------------------------------------


def test_validate_by_name_reads_gpus_and_model(two: KubeApiServer) -> None:
    connector = make_connector(two)
    assert [(w.name, w.gpus_per_replica) for w in connector.workloads] == [("llm-prefill", 1), ("llm-decode", 2)]
    config = connector.effective_config(
        parse_config({"environment": "kubernetes-workloads", "kubernetes_workloads": BY_NAME}).policy
    )
    assert (config.model_name, config.prefill_engine_num_gpu, config.decode_engine_num_gpu) == ("Qwen/Qwen3-0.6B", 1, 2)


def test_selector_finds_the_one_workload(two: KubeApiServer) -> None:
    connector = make_connector(
        two,
        {
            "prefill": {"kind": "Deployment", "selector": {"app": "llm", "role": "prefill"}},
            "decode": {"kind": "Deployment", "selector": {"app": "llm", "role": "decode"}},
        },
    )
    assert [w.name for w in connector.workloads] == ["llm-prefill", "llm-decode"]
    assert connector.apply(None, Decision(2, 1), T0).detail == (
        "prefill 1->2 via Deployment ns/llm-prefill/scale; unchanged: decode at 1"
    )


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (
            {"app": "nothing"},
            "Deployment ns/[app=nothing]: kubernetes_workloads.decode.selector matches 0 deployments; "
            "it must match exactly one",
        ),
        (
            {"app": "llm"},
            "Deployment ns/[app=llm]: kubernetes_workloads.decode.selector matches 2 deployments "
            "(llm-prefill, llm-decode); it must match exactly one",
        ),
    ],
    ids=["zero", "several"],
)
def test_selector_matching_zero_or_several_is_refused_in_one_line(
    two: KubeApiServer, selector: dict, message: str
) -> None:
    with pytest.raises(KubernetesConnectorError) as err:
        make_connector(two, {**BY_NAME, "decode": {"kind": "Deployment", "selector": selector}})
    assert str(err.value) == message


def test_missing_workload_is_a_clear_error(two: KubeApiServer) -> None:
    with pytest.raises(KubernetesConnectorError) as err:
        make_connector(two, {**BY_NAME, "decode": {"kind": "StatefulSet", "name": "llm-decode"}})
    assert str(err.value).startswith(
        "StatefulSet ns/llm-decode cannot be read at start-up: get StatefulSet ns/llm-decode: 404"
    )
    assert "\n" not in str(err.value)


def test_scale_up_and_down_through_the_scale_subresource_only_on_change(two: KubeApiServer) -> None:
    """Each change is one PUT of the scale with the resourceVersion read; equal targets write nothing."""
    connector = make_connector(two)
    up = connector.apply(None, Decision(3, 1), T0)
    assert (up.outcome.value, up.detail) == (
        "applied",
        "prefill 1->3 via Deployment ns/llm-prefill/scale; unchanged: decode at 1",
    )
    [put] = two.successful_writes()
    assert put.method == "PUT" and put.path == "/apis/apps/v1/namespaces/ns/deployments/llm-prefill/scale"
    assert put.body["spec"] == {"replicas": 3} and put.body["metadata"]["resourceVersion"]
    assert two.get(DEPLOYMENTS, "llm-prefill")["spec"]["replicas"] == 3
    two.settle_workload(DEPLOYMENTS, "llm-prefill")
    writes = len(two.writes())
    assert connector.apply(None, Decision(3, 1), T0).outcome.value == "noop" and len(two.writes()) == writes
    down = connector.apply(None, Decision(1, None), T0)
    assert down.detail == "prefill 3->1 via Deployment ns/llm-prefill/scale"
    assert two.get(DEPLOYMENTS, "llm-prefill")["spec"]["replicas"] == 1


def test_worker_counts_ready_from_status_expected_from_spec(two: KubeApiServer) -> None:
    connector = make_connector(two)
    assert connector.worker_counts(None, 0, default=NO_WORKERS) == WorkerCounts(
        ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1
    )
    connector.apply(None, Decision(3, 2), T0)  # the scale changes at once; the pods come later
    assert connector.worker_counts(None, 0, default=NO_WORKERS) == WorkerCounts(
        ready_prefill=1, ready_decode=1, expected_prefill=3, expected_decode=2
    )
    two.settle_workload(DEPLOYMENTS, "llm-prefill")
    two.settle_workload(DEPLOYMENTS, "llm-decode", ready=False)
    assert connector.worker_counts(None, 0, default=NO_WORKERS) == WorkerCounts(
        ready_prefill=3, ready_decode=0, expected_prefill=3, expected_decode=2
    )


def test_a_rollout_in_progress_blocks_every_write(two: KubeApiServer) -> None:
    """One pool rolling out holds back both: nothing is written and the reason code is in the detail."""
    connector = make_connector(two)
    two.update(DEPLOYMENTS, "llm-decode", lambda d: d["spec"].update(replicas=2))  # generation 2, not observed
    two.settle_workload(DEPLOYMENTS, "llm-decode", rolling=True)
    result = connector.apply(None, Decision(3, 4), T0)
    assert (result.outcome.value, result.detail) == (
        "blocked_not_ready",
        "Deployment ns/llm-decode rolling out (replicas_not_updated: status.updatedReplicas 1 < spec.replicas 2); "
        "nothing written",
    )
    assert two.writes() == []
    two.settle_workload(DEPLOYMENTS, "llm-decode")
    assert connector.apply(None, Decision(3, 4), T0).outcome.value == "applied"
    result = connector.apply(None, Decision(2, 4), T0)  # our own write bumped the generations: wait for them
    assert result.detail.startswith("Deployment ns/llm-prefill rolling out (generation_not_observed: ")


def test_statefulset_variant(kube: KubeApiServer) -> None:
    """StatefulSets scale the same way; a revision rollout blocks them."""
    kube.put(STATEFULSETS, workload("StatefulSet", "llm-decode", "decode", replicas=2))
    kube.settle_workload(STATEFULSETS, "llm-decode", rolling=True)
    connector = make_connector(kube, {"decode": {"kind": "StatefulSet", "name": "llm-decode"}}, mode="decode")
    blocked = connector.apply(None, Decision(None, 4), T0)
    assert (
        blocked.outcome.value == "blocked_not_ready" and "(revision_rolling: status.currentRevision " in blocked.detail
    )
    kube.settle_workload(STATEFULSETS, "llm-decode")
    applied = connector.apply(None, Decision(None, 4), T0)
    assert applied.detail == "decode 2->4 via StatefulSet ns/llm-decode/scale"
    assert scale_puts(kube, "llm-decode") == [200]
    assert kube.get(STATEFULSETS, "llm-decode")["spec"]["replicas"] == 4
    assert connector.worker_counts(None, 0, default=NO_WORKERS).expected_decode == 4


def test_aggregated_mode_scales_one_workload(kube: KubeApiServer) -> None:
    """mode agg: the one `aggregated` workload is the decode role; prefill keeps the default counts."""
    kube.put(DEPLOYMENTS, workload("Deployment", "llm", "worker", replicas=2))
    kube.settle_workload(DEPLOYMENTS, "llm")
    connector = make_connector(kube, {"aggregated": {"kind": "Deployment", "name": "llm"}}, mode="agg")
    default = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
    assert connector.worker_counts(None, 0, default=default) == WorkerCounts(
        ready_prefill=1, ready_decode=2, expected_prefill=1, expected_decode=2
    )
    assert connector.apply(None, Decision(None, 5), T0).detail == "decode 2->5 via Deployment ns/llm/scale"


# --------------------------------------------------------------------------------------------------------
# Through the execution outbox (real Postgres) and load_context
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def ctx(database_url: str, tmp_path: Path, profile_dir: Path, two: KubeApiServer) -> PlannerContext:
    config_path = write_config(tmp_path, environment="kubernetes-workloads", kubernetes_workloads=BY_NAME)
    from planner_core.config import load_config

    context = PlannerContext(
        database_url=database_url,
        deployment=NAME,
        planner=Planner(config=load_config(config_path).policy, perf=None),
        kubernetes=make_connector(two),
    )
    with context.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, context.config)
    return context


def decide(ctx: PlannerContext, minute: int, num_prefill: int | None, num_decode: int | None) -> int:
    return record_decision(ctx, NAME, T0 + dt.timedelta(minutes=minute), num_prefill, num_decode)


def executions(ctx: PlannerContext, decision_id: int) -> list[tuple[int, str, str, str]]:
    with ctx.sessions.begin() as session:
        rows = session.scalars(
            select(ExecutionRow).where(ExecutionRow.decision_id == decision_id).order_by(ExecutionRow.attempt)
        )
        return [(r.attempt, r.connector, r.outcome, r.detail) for r in rows]


def test_conflict_is_retried_recorded_and_written_once(ctx: PlannerContext, two: KubeApiServer) -> None:
    """A concurrent writer makes the first PUT stale (409): re-read, one write, both tries in the record."""
    decision_id = decide(ctx, 0, 3, 1)
    two.interfere(
        "PUT",
        r"/llm-prefill/scale$",
        DEPLOYMENTS,
        "llm-prefill",
        lambda obj: obj["metadata"].setdefault("annotations", {}).update({"touched-by": "someone-else"}),
    )
    [summary] = run_execution(ctx, T0)
    assert summary.status.value == "applied"
    assert executions(ctx, decision_id) == [
        (
            1,
            "kubernetes-workloads",
            "applied",
            "prefill 1->3 via Deployment ns/llm-prefill/scale; unchanged: decode at 1; "
            "retried: scale Deployment ns/llm-prefill: 409 Conflict",
        )
    ]
    assert scale_puts(two, "llm-prefill") == [409, 200]
    assert ctx.kubernetes._sleep.waits_s == [0.5]


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_and_server_errors_are_retried_and_recorded(
    ctx: PlannerContext, two: KubeApiServer, status: int
) -> None:
    """429/5xx: retried with backoff and listed; after 4 tries the attempt fails with every try, nothing written."""
    decision_id = decide(ctx, 0, 2, 1)
    two.fail("PUT", r"/llm-prefill/scale$", status, times=1)
    two.fail("GET", r"/deployments/llm-decode$", status, times=1)
    [applied] = run_execution(ctx, T0)
    reason = {429: "429 Too Many Requests", 503: "503 Service Unavailable"}[status]
    assert applied.detail == (
        "prefill 1->2 via Deployment ns/llm-prefill/scale; unchanged: decode at 1; "
        f"retried: get Deployment ns/llm-decode: {reason}; scale Deployment ns/llm-prefill: {reason}"
    )
    failing = decide(ctx, 1, 4, None)
    two.settle_workload(DEPLOYMENTS, "llm-prefill")
    two.fail("PUT", r"/llm-prefill/scale$", status, times=4)
    [failed] = run_execution(ctx, T0 + dt.timedelta(minutes=1))
    assert (failed.outcome.value, failed.status.value) == ("failed", "pending")
    assert executions(ctx, failing)[0][3] == (
        "KubernetesApiError: prefill: scale Deployment ns/llm-prefill: gave up after 4 tries ("
        + "; ".join([f"scale Deployment ns/llm-prefill: {reason}"] * 4)
        + ")"
    )
    assert two.get(DEPLOYMENTS, "llm-prefill")["spec"]["replicas"] == 2
    assert executions(ctx, decision_id)[0][2] == "applied"


def test_a_rollout_is_recorded_as_blocked_and_the_decision_waits(ctx: PlannerContext, two: KubeApiServer) -> None:
    decision_id = decide(ctx, 0, 2, 2)
    two.settle_workload(DEPLOYMENTS, "llm-prefill", ready=False)
    [blocked] = run_execution(ctx, T0)
    assert (blocked.outcome.value, blocked.status.value) == ("blocked_not_ready", "pending")
    assert "(replicas_not_available: status.availableReplicas 0 < spec.replicas 1)" in blocked.detail
    assert two.writes() == []
    two.settle_workload(DEPLOYMENTS, "llm-prefill")
    [applied] = run_execution(ctx, T0 + dt.timedelta(seconds=10))
    assert applied.outcome.value == "applied"
    assert [o for _, _, o, _ in executions(ctx, decision_id)] == ["blocked_not_ready", "applied"]


def test_load_context_builds_the_workload_connector(
    database_url: str, tmp_path: Path, profile_dir: Path, two: KubeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """environment: kubernetes-workloads -> load_context finds the workloads and fills model and GPUs."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": two.url}}],
                "users": [{"name": "planner", "user": {"token": "test-token"}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "planner"}}],
                "current-context": "emulated",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("PLANNER_K8S_NAMESPACE", two.namespace)
    config = write_config(tmp_path, environment="kubernetes-workloads", model_name=None, kubernetes_workloads=BY_NAME)
    context = load_context(database_url, NAME, config)
    assert isinstance(context.connector, WorkloadConnector)
    assert (context.config.model_name, context.config.decode_engine_num_gpu) == ("Qwen/Qwen3-0.6B", 2)
    decide_ctx = context
    with decide_ctx.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, decide_ctx.config)
    decision_id = decide(decide_ctx, 0, 2, 3)
    [summary] = run_execution(decide_ctx, T0)
    assert summary.outcome.value == "applied" and executions(decide_ctx, decision_id)[0][1] == "kubernetes-workloads"
    broken = write_config(
        tmp_path,
        environment="kubernetes-workloads",
        kubernetes_workloads={**BY_NAME, "decode": {"kind": "Deployment", "selector": {"app": "llm"}}},
    )
    with pytest.raises(KubernetesConnectorError, match=r"selector matches 2 deployments"):
        load_context(database_url, NAME, broken)


# --------------------------------------------------------------------------------------------------------
# RBAC: the manifest grants exactly the requests the connector makes
# --------------------------------------------------------------------------------------------------------


def _rbac_verb(method: str, path: str) -> tuple[str, str]:
    """(resource as RBAC names it, verb) of one logged request to /apis/apps/v1/namespaces/<ns>/<plural>[/...]."""
    parts = path.strip("/").split("/")[5:]  # after apis/apps/v1/namespaces/<ns>
    plural, rest = parts[0], parts[1:]
    if rest[1:] == ["scale"]:
        return f"{plural}/scale", {"GET": "get", "PUT": "update", "PATCH": "patch"}[method]
    if not rest:
        return plural, {"GET": "list", "POST": "create"}[method]
    return plural, {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]


def test_rbac_grants_exactly_what_the_connector_calls(kube: KubeApiServer) -> None:
    """Every code path (by name, by selector, both kinds, counts, a write, a conflict) against the Role's rules, the
    connector's REQUIRED_ACCESS and the Role the Kustomize "workloads" overlay binds to the planner."""
    for kind, plural in (("Deployment", DEPLOYMENTS), ("StatefulSet", STATEFULSETS)):
        kube.put(plural, workload(kind, "llm-prefill", "prefill"))
        kube.put(plural, workload(kind, "llm-decode", "decode"))
        kube.settle_workload(plural, "llm-prefill")
        kube.settle_workload(plural, "llm-decode")
        connector = make_connector(
            kube,
            {
                "prefill": {"kind": kind, "name": "llm-prefill"},
                "decode": {"kind": kind, "selector": {"app": "llm", "role": "decode"}},
            },
        )
        connector.worker_counts(None, 0, default=NO_WORKERS)
        kube.interfere(
            "PUT",
            r"/scale$",
            plural,
            "llm-decode",
            lambda obj: obj["metadata"].update(labels=obj["metadata"]["labels"]),
        )
        connector.apply(None, Decision(2, 2), T0)
    used: dict[tuple[str, str], set[str]] = {}
    for request in kube.requests:
        resource, verb = _rbac_verb(request.method, request.path)
        used.setdefault(("apps", resource), set()).add(verb)

    documents = list(yaml.safe_load_all((REPO_ROOT / workloads_connector.RBAC_FILE).read_text()))
    by_kind = {d["kind"]: d for d in documents}
    assert sorted(by_kind) == ["Role", "RoleBinding", "ServiceAccount"]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in by_kind["Role"]["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no wildcards
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert "*" not in str(granted)
    assert (
        granted
        == used
        == {
            ("apps", "deployments"): {"get", "list"},
            ("apps", "statefulsets"): {"get", "list"},
            ("apps", "deployments/scale"): {"get", "update"},
            ("apps", "statefulsets/scale"): {"get", "update"},
        }
        == access_by_resource(workloads_connector.REQUIRED_ACCESS)  # what `planner doctor` asks the cluster for
        == planner_role("overlays/workloads")  # what the Kustomize install binds to the planner's account
    )
    binding = by_kind["RoleBinding"]
    assert binding["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": by_kind["ServiceAccount"]["metadata"]["name"]}]


def test_the_example_config_and_manifests_fit_together() -> None:
    """examples/kubernetes-workloads: the planner config loads and names the two Deployments of the manifest."""
    from planner_core.config import load_config

    folder = REPO_ROOT / "examples" / "kubernetes-workloads"
    loaded = load_config(folder / "planner.yaml")
    manifests = {d["metadata"]["name"]: d for d in yaml.safe_load_all((folder / "workloads.yaml").read_text()) if d}
    workloads = loaded.service.kubernetes_workloads
    assert loaded.policy.environment.value == "kubernetes-workloads" and loaded.policy.mode is PlannerMode.DISAGG
    for ref in (workloads.prefill, workloads.decode):
        [match] = [
            m
            for m in manifests.values()
            if m["kind"] == ref.kind.value
            and (
                ref.name == m["metadata"]["name"]
                if ref.name
                else (ref.selector or {}).items() <= m["metadata"]["labels"].items()
            )
        ]
        assert (
            match["spec"]["selector"]["matchLabels"].items() <= match["spec"]["template"]["metadata"]["labels"].items()
        )


def test_an_outside_scale_of_a_workload_is_adopted_at_the_next_tick(ctx: PlannerContext, two: KubeApiServer) -> None:
    """The planner applies decode 2; `kubectl scale deployment llm-decode --replicas=4`; the next tick records
    `outside_change_adopted` for decode (held at 4: no decision) in `tick_steps`."""
    from planner_core.domain import Component, Loop, OutsideChange
    from planner_core.runtime.service import run_tick

    decide(ctx, 0, 1, 2)
    [applied] = run_execution(ctx, T0)
    assert applied.status.value == "applied"
    two.settle_workload(DEPLOYMENTS, "llm-decode")
    two.update(DEPLOYMENTS, "llm-decode", lambda obj: obj["spec"].update(replicas=4))
    two.settle_workload(DEPLOYMENTS, "llm-decode")
    result = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=1), None)
    assert result.inputs.outside_changes == (
        OutsideChange(component=Component.DECODE, planner_replicas=2, observed_replicas=4),
    )
    assert result.outcome.decision.is_empty
    with ctx.sessions.begin() as session:
        rows = repo.query_rows(session, "SELECT reason, component, value FROM tick_steps WHERE step = 'ownership'")
    assert [(r["reason"], r["component"], r["value"]) for r in rows] == [("outside_change_adopted", "decode", 4.0)]
