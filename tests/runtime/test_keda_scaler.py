"""The KEDA external scaler, called through the generated gRPC stub exactly as KEDA calls it, on real Postgres.

Decisions are recorded with the project's repository and written by the execution flow through the virtual
connector, as in tests/runtime/test_virtual_connector.py.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import time

import grpc
import pytest
from sqlalchemy import select

from planner_core.runtime.keda import externalscaler_pb2 as pb
from planner_core.runtime.keda import externalscaler_pb2_grpc as pb_grpc
from planner_core.runtime.keda.scaler import KedaScaler, start_server
from planner_core.runtime.service import load_context, run_execution
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import AuditLogRow, DecisionRow
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.databases import record_decision
from tests.runtime.lifecycle import STOP_SIGNAL_IDS, STOP_SIGNALS, start_command, stop_with

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
NAME = "keda-test"


@pytest.fixture
def ctx(database_url, tmp_path, profile_dir):
    context = load_context(database_url, NAME, write_config(tmp_path))
    with context.sessions.begin() as session:
        repo.ensure_deployment(session, NAME, context.config)
    return context


class Clock:
    """The scaler's clock, moved by the test (tick times are the ticks' scheduled times)."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


def decide(ctx, minute: int, num_prefill: int | None, num_decode: int | None) -> int:
    """Record a throughput tick deciding these targets and run the execution flow; returns the decision id."""
    at = T0 + dt.timedelta(minutes=minute)
    decision_id = record_decision(ctx, NAME, at, num_prefill, num_decode)
    run_execution(ctx, at)
    return decision_id


def status(ctx, decision_id: int) -> str:
    with ctx.sessions.begin() as session:
        return session.get(DecisionRow, decision_id).status


class Keda:
    """What KEDA does: a channel to scalerAddress and calls with the ScaledObject's reference and metadata."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ExternalScalerStub(self.channel)

    @staticmethod
    def ref(role: str, deployment: str | None = NAME) -> pb.ScaledObjectRef:
        metadata = {"role": role} | ({"deployment": deployment} if deployment is not None else {})
        return pb.ScaledObjectRef(name=f"llm-{role}", namespace="inference", scalerMetadata=metadata)

    def metric(self, role: str, deployment: str | None = NAME) -> float:
        ref = self.ref(role, deployment)
        [spec] = self.stub.GetMetricSpec(ref, timeout=10).metricSpecs
        [value] = self.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName=spec.metricName), timeout=10
        ).metricValues
        assert value.metricName == spec.metricName and value.metricValue == value.metricValueFloat
        return value.metricValueFloat

    def active(self, role: str) -> bool:
        return self.stub.IsActive(self.ref(role), timeout=10).result

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def serve(ctx, clock):
    """Start a scaler server object on the test database; every one started is stopped at the end."""
    started: list[tuple[grpc.Server, Keda, KedaScaler]] = []

    def _serve(**kwargs) -> tuple[grpc.Server, Keda, KedaScaler]:
        scaler = KedaScaler(ctx.database_url, clock=clock, **kwargs)
        server, port = start_server(scaler, port=0, host="127.0.0.1", stream_interval_s=0.2)
        started.append((server, Keda(port), scaler))
        return started[-1]

    yield _serve
    for server, keda, _ in started:
        keda.close()
        server.stop(0)


def test_metric_spec_and_metrics_are_the_targets_and_serving_both_acknowledges(ctx, serve) -> None:
    """Target size 1 and value = target (HPA desired = value / 1); the decision is acknowledged once both roles
    were served, after which the planner's next decision is written and served."""
    first = decide(ctx, 0, 2, 3)
    _, keda, _ = serve()
    [spec] = keda.stub.GetMetricSpec(keda.ref("prefill"), timeout=10).metricSpecs
    assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == ("planner-keda-test-prefill", 1, 1.0)
    assert keda.metric("prefill") == 2.0
    assert status(ctx, first) == "applied"  # decode not served yet
    assert keda.metric("decode") == 3.0
    assert status(ctx, first) == "acknowledged"
    with ctx.sessions.begin() as session:
        [detail] = session.scalars(select(AuditLogRow.detail).where(AuditLogRow.event == "virtual_acknowledged"))
    assert detail["virtual_decision_id"] == 0 and detail["by"].startswith("keda-scaler: targets served")
    assert keda.active("prefill") and keda.active("decode")

    second = decide(ctx, 1, 0, 4)  # written at once: the first was acknowledged
    assert status(ctx, second) == "applied"
    assert (keda.metric("prefill"), keda.metric("decode")) == (0.0, 4.0)
    assert not keda.active("prefill") and keda.active("decode")
    assert status(ctx, second) == "acknowledged"


def test_restart_serves_the_newest_target_from_postgres(ctx, serve) -> None:
    """A new scaler on the same database serves what the planner wrote while it was down; what the old one had
    served is forgotten, so both roles are served again before the acknowledgement."""
    decide(ctx, 0, 2, 2)
    server, keda, _ = serve()
    assert keda.metric("prefill") == 2.0 and keda.metric("decode") == 2.0
    server.stop(0)
    pending = decide(ctx, 1, 5, 6)
    _, keda, _ = serve()
    assert keda.metric("decode") == 6.0
    assert status(ctx, pending) == "applied"
    assert keda.metric("prefill") == 5.0
    assert status(ctx, pending) == "acknowledged"


def test_stale_target_is_still_served_and_flagged(ctx, serve, clock, caplog) -> None:
    """Past max age the last target is still served; a warning is logged once, and an info when fresh again."""
    decide(ctx, 0, 2, 3)
    _, keda, scaler = serve(max_age_s=300)
    caplog.set_level(logging.INFO, logger="planner_core.runtime.keda.scaler")
    clock.now = T0 + dt.timedelta(seconds=299)
    assert not scaler.target({"deployment": NAME, "role": "decode"}).stale
    clock.now = T0 + dt.timedelta(seconds=301)
    target = scaler.target({"deployment": NAME, "role": "decode"})
    assert target.stale and target.age_s == 301 and target.replicas == 3
    assert keda.metric("decode") == 3.0 and keda.metric("prefill") == 2.0  # served regardless
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "deployment 'keda-test': target is stale (newest tick 301 s old, max age 300 s); serving the last target "
        "until the planner records a tick"
    ]
    decide(ctx, 5, 2, 3)  # a tick with unchanged targets: nothing written, but the planner is alive
    clock.now = T0 + dt.timedelta(minutes=5, seconds=10)
    assert keda.metric("decode") == 3.0
    assert "target fresh again (newest tick 10 s old)" in caplog.records[-1].getMessage()


@pytest.mark.parametrize(
    ("metadata", "scaler_deployment", "message"),
    [
        ({"deployment": "nope", "role": "decode"}, None, "scalerMetadata deployment = 'nope': no such deployment "
         "(known: keda-test)"),
        ({"deployment": NAME, "role": "worker"}, None, "scalerMetadata role = 'worker': must be one of prefill, "
         "decode"),
        ({"role": "decode"}, None, "scalerMetadata needs 'deployment' (the managed deployment): this scaler was "
         "started without --deployment"),
        ({"deployment": "other", "role": "decode"}, NAME, "scalerMetadata deployment = 'other': this scaler serves "
         "only 'keda-test'"),
    ],
)  # fmt: skip
def test_bad_metadata_is_invalid_argument_in_one_line(ctx, serve, metadata, scaler_deployment, message) -> None:
    decide(ctx, 0, 1, 1)
    _, keda, _ = serve(deployment=scaler_deployment)
    ref = pb.ScaledObjectRef(name="so", namespace="ns", scalerMetadata=metadata)
    for call in (
        lambda: keda.stub.IsActive(ref, timeout=10),
        lambda: keda.stub.GetMetricSpec(ref, timeout=10),
        lambda: keda.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName="s0-x"), timeout=10),
        lambda: next(keda.stub.StreamIsActive(ref, timeout=10)),
    ):
        with pytest.raises(grpc.RpcError) as error:
            call()
        assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == message


def test_scaler_deployment_lets_metadata_omit_it(ctx, serve) -> None:
    decide(ctx, 0, 1, 4)
    _, keda, _ = serve(deployment=NAME)
    assert keda.metric("decode", deployment=None) == 4.0


def test_no_decision_yet_is_failed_precondition(ctx, serve) -> None:
    """Before the planner has written a target there is nothing to serve: an error (HPA keeps the replicas),
    never IsActive false (which would let KEDA scale to zero)."""
    _, keda, _ = serve()
    with pytest.raises(grpc.RpcError) as error:
        keda.active("decode")
    assert error.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error.value.details().startswith("deployment 'keda-test' has no decode target yet")


def test_stream_is_active_sends_now_and_on_change(ctx, serve) -> None:
    decide(ctx, 0, 1, 1)
    _, keda, _ = serve()
    keda.metric("prefill"), keda.metric("decode")  # acknowledge, so the next decision is written at once
    stream = keda.stub.StreamIsActive(keda.ref("prefill"), timeout=30)
    assert next(stream).result is True
    decide(ctx, 1, 0, 1)
    assert next(stream).result is False
    stream.cancel()


def test_stream_metric_spec_is_unimplemented(ctx, serve) -> None:
    """KEDA falls back to polling GetMetricSpec on UNIMPLEMENTED."""
    _, keda, _ = serve()
    with pytest.raises(grpc.RpcError) as error:
        next(keda.stub.StreamMetricSpec(keda.ref("decode"), timeout=10))
    assert error.value.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_cli_process_serves_and_stops_on_a_signal(ctx, tmp_path, sig) -> None:
    """`planner keda-scaler` as its own process (a scaler restart = a new process on the same database): Ctrl-C and
    SIGTERM end it alike, with KEDA's stream in flight: the call is ended within the stop's grace (5 s), the command
    says it stopped and exits 0."""
    decide(ctx, 0, 3, 7)
    env = os.environ | {"PLANNER_DATABASE_URL": ctx.database_url, "PYTHONPATH": str(REPO_ROOT)}
    args = ["keda-scaler", "--port", "0", "--host", "127.0.0.1", "--deployment", NAME]
    with start_command(
        args, env=env, log_path=tmp_path / "keda.log", ready=lambda log: "KEDA external scaler on" in log
    ) as command:
        port = int(re.search(r"KEDA external scaler on 127\.0\.0\.1:(\d+)", command.log()).group(1))
        keda = Keda(port)
        assert (keda.metric("prefill"), keda.metric("decode", deployment=None)) == (3.0, 7.0)
        stream = keda.stub.StreamIsActive(keda.ref("prefill"), timeout=60)
        assert next(stream).result is True  # a call in flight when the signal comes
        stopped_at = time.monotonic()
        assert stop_with(command, sig) == 0, command.log()[-3000:]
        with pytest.raises(grpc.RpcError):  # ended by the server's stop, not left hanging
            next(stream)
        assert time.monotonic() - stopped_at < 30
        keda.close()
    log = command.log()
    assert "planner keda-scaler: stopped" in log and "Traceback" not in log, log[-3000:]


def test_watching_workloads_acknowledges_when_they_reach_the_targets(ctx, serve) -> None:
    """`--watch-workloads`: the trigger names its workload; serving both targets is not enough, the decision is
    acknowledged at the first poll after both Deployments have as many available replicas as their targets (HPA
    scaled them; the emulated API server's controller settled them). A trigger without its workload is refused."""
    from kubernetes import client as k8s_client

    from planner_core.runtime.connectors.workloads import WorkloadConnector
    from tests.runtime.kube_api import DEPLOYMENTS, KubeApiServer
    from tests.runtime.test_workload_connector import workload

    with KubeApiServer(namespace="inference") as kube:
        for role in ("prefill", "decode"):
            kube.put(DEPLOYMENTS, workload("Deployment", f"llm-{role}", role))
            kube.settle_workload(DEPLOYMENTS, f"llm-{role}")
        reader = WorkloadConnector(
            api_client=k8s_client.ApiClient(k8s_client.Configuration(host=kube.url)), targets=()
        ).available_replicas
        first = decide(ctx, 0, 2, 3)
        _, keda, _ = serve(ready_replicas=reader)

        def poll(role: str) -> float:
            ref = pb.ScaledObjectRef(
                name=f"llm-{role}", namespace="inference",
                scalerMetadata={"deployment": NAME, "role": role, "workloadKind": "Deployment",
                                "workloadName": f"llm-{role}"},
            )  # fmt: skip
            [value] = keda.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref), timeout=10).metricValues
            return value.metricValueFloat

        assert (poll("prefill"), poll("decode")) == (2.0, 3.0)
        assert status(ctx, first) == "applied"  # served, but the workloads still run one replica each
        for role, replicas in (("prefill", 2), ("decode", 3)):
            kube.put(DEPLOYMENTS, workload("Deployment", f"llm-{role}", role, replicas=replicas))
        kube.settle_workload(DEPLOYMENTS, "llm-prefill")
        assert poll("decode") == 3.0
        assert status(ctx, first) == "applied"  # decode's pods not there yet
        kube.settle_workload(DEPLOYMENTS, "llm-decode")
        assert poll("prefill") == 2.0
        assert status(ctx, first) == "acknowledged"
        with ctx.sessions.begin() as session:
            [detail] = session.scalars(select(AuditLogRow.detail).where(AuditLogRow.event == "virtual_acknowledged"))
        assert detail["by"] == "keda-scaler: every role's workload reached its target (available replicas)"

        with pytest.raises(grpc.RpcError) as refused:
            keda.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=keda.ref("decode")), timeout=10)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "scalerMetadata workloadKind = ''" in refused.value.details()
