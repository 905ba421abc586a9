"""The end of a Kubernetes drain: the planner follows each pod a scale-down handed over until it is gone, and records
what its drain waited for and cut from its engine's forward-pass samples (`KubernetesConnector.follow_drains`).

On the emulated API server (`kube_api`, the real `kubernetes` client) and real Postgres; the kubelet's part
(deletion timestamp, pod gone) is played by the test, at times it chooses, with `run_execution` at given times.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from flows.ticks import FOLLOWING, apply_decisions
from planner_core.runtime.connectors.pod_drain import (
    KILL_MARGIN_S,
    NOT_DELETED_AFTER_S,
    SETTLE_S,
    AwaitedPod,
    FollowedDrain,
    PodState,
    judge_drain,
    pod_engine,
    pod_of_engine,
    substitutes,
)
from planner_core.runtime.engine_load import LastLoad, dynamo_pod_instance_id
from planner_core.runtime.service import PlannerContext, drains_followed, run_execution
from planner_core.runtime.store.models import AuditLogRow, DrainOutcome, DrainRow
from tests.runtime.kube_api import DGDSA, PODS, KubeApiServer
from tests.runtime.test_kubernetes_connector import (  # noqa: F401 - kube, disagg and k8s_ctx are fixtures
    DECODE_ADAPTER,
    DGD_NAME,
    T0,
    _store_loads,
    decide,
    disagg,
    k8s_ctx,
    kube,
    pod,
)

DECODE = "VllmDecodeWorker"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def drains(ctx: PlannerContext) -> dict[str, DrainRow]:
    """The drain records by pod name."""
    with ctx.sessions.begin() as session:
        rows = session.scalars(select(DrainRow).order_by(DrainRow.id)).all()
        session.expunge_all()
    return {row.engine.rsplit("/", 1)[1]: row for row in rows}


def scale_decode_to(
    ctx: PlannerContext, server: KubeApiServer, loads: dict[str, int], grace_s: dict[str, int], to: int
) -> int:
    """Decode pods with these loads at T0 (a pod absent from `loads` has no sample) and graces; a decision to `to`
    replicas applied at T0 + 1 s; returns its id."""
    server.update(DGDSA, DECODE_ADAPTER, lambda obj: obj["spec"].update(replicas=len(grace_s)))
    server.settle(DGD_NAME)
    for name, grace in grace_s.items():
        server.put(PODS, pod(name, DECODE, grace_s=grace))
    _store_loads(ctx, loads, T0)
    decision_id = decide(ctx, 0, None, to)
    [summary] = run_execution(ctx, at(1))
    assert summary.outcome.value == "applied"
    return decision_id


def terminate(server: KubeApiServer, name: str, since_s: float, grace_s: int) -> None:
    """The kubelet's start: the pod's deletion asked for at T0 + `since_s`, SIGKILL `grace_s` later."""
    deadline = at(since_s + grace_s).isoformat().replace("+00:00", "Z")
    server.update(
        PODS, name, lambda obj: obj["metadata"].update(deletionTimestamp=deadline, deletionGracePeriodSeconds=grace_s)
    )


def test_each_handed_over_pod_is_followed_until_it_is_gone_and_its_drain_completed(
    k8s_ctx: PlannerContext,  # noqa: F811 - the fixture
    disagg: KubeApiServer,  # noqa: F811
) -> None:
    """Decode from 4 pods to 1: the three least loaded (b: 1, d: 2, a: 3 in flight) are handed over, and followed.
    b's engine finishes its request (last sample 0) and the pod goes: `completed`, 1 waited for, 0 cut, but only
    once its last sample is `SETTLE_S` old. d's pod vanishes while its last sample held 2: `cut`, 2. a stays listed
    past its grace: pending while it drains, then `cut` with the 1 its last sample before the deadline held (a
    sample after the deadline does not count). A run that cannot list the pods changes nothing and still applies
    its decision; the execution flow reports each drain still followed, so the listener runs again soon."""
    decision_id = scale_decode_to(
        k8s_ctx,
        disagg,
        {"llm-decode-a": 3, "llm-decode-b": 1, "llm-decode-d": 2},
        {"llm-decode-a": 45, "llm-decode-b": 45, "llm-decode-c": 45, "llm-decode-d": 30},
        1,
    )
    before = drains(k8s_ctx)
    assert sorted(before) == ["llm-decode-a", "llm-decode-b", "llm-decode-d"]
    assert {(d.outcome, d.ended_at, d.num_cut, d.end_reason) for d in before.values()} == {
        ("handed_over", None, None, None)
    }
    assert sorted(drains_followed(k8s_ctx)) == [f"pod ns/llm-decode-{x}" for x in "abd"]

    for name, grace in (("llm-decode-a", 45), ("llm-decode-b", 45), ("llm-decode-d", 30)):
        terminate(disagg, name, 2, grace)
    _store_loads(k8s_ctx, {"llm-decode-a": 3, "llm-decode-b": 1, "llm-decode-d": 2}, at(3))
    run_execution(k8s_ctx, at(3.5))  # all three seen terminating: when the kubelet began is recorded
    assert {d.terminating_at for d in drains(k8s_ctx).values()} == {at(2)}
    assert {d.outcome for d in drains(k8s_ctx).values()} == {"handed_over"}
    _store_loads(k8s_ctx, {"llm-decode-b": 0}, at(4))
    disagg.delete(PODS, "llm-decode-b")
    disagg.delete(PODS, "llm-decode-d")

    assert run_execution(k8s_ctx, at(5.5)) == []  # nothing pending; the drains are followed all the same
    now = drains(k8s_ctx)
    d = now["llm-decode-d"]
    assert (d.outcome, d.end_reason, d.num_in_flight_at_start, d.num_waited_for, d.num_cut) == (
        "cut",
        "pod_gone",
        2,
        2,
        2,
    )
    assert (d.terminating_at, d.last_sample_at, d.ended_at, d.duration_s, d.grace_s) == (
        at(2),
        at(3),
        at(5.5),
        4.5,
        30,
    )
    # b's last sample is 1.5 s old: the ingest may still hold a newer one, so b waits for the next run
    assert [(now[n].outcome, now[n].terminating_at) for n in ("llm-decode-a", "llm-decode-b")] == [
        ("handed_over", at(2)),
        ("handed_over", at(2)),
    ]

    assert apply_decisions.fn(k8s_ctx, at(10)) == [{"drain_of": "pod ns/llm-decode-a", "status": FOLLOWING}]
    b = drains(k8s_ctx)["llm-decode-b"]
    assert (b.outcome, b.end_reason, b.num_waited_for, b.num_cut, b.last_sample_at, b.ended_at) == (
        "completed",
        "pod_gone",
        1,
        0,
        at(4),
        at(10),
    )

    # a keeps draining; the pods cannot be listed at one run (503 through the retries): nothing changes, and the
    # decision of that run is applied all the same
    _store_loads(k8s_ctx, {"llm-decode-a": 1}, at(20))
    _store_loads(k8s_ctx, {"llm-decode-a": 4}, at(48))  # after its deadline (T0 + 47 s): not counted
    disagg.fail("GET", r"/namespaces/ns/pods$", 503, times=4)
    up = decide(k8s_ctx, 1, 2, None)
    [summary] = run_execution(k8s_ctx, at(30))
    assert (summary.decision_id, summary.outcome.value) == (up, "applied")
    assert [r.status for r in disagg.requests if r.path.endswith("/pods")][-4:] == [503] * 4
    assert drains(k8s_ctx)["llm-decode-a"].outcome == "handed_over"
    run_execution(k8s_ctx, at(47 + KILL_MARGIN_S - 0.1))  # the kubelet's SIGKILL may still be removing it
    assert drains(k8s_ctx)["llm-decode-a"].outcome == "handed_over"

    run_execution(k8s_ctx, at(60))
    a = drains(k8s_ctx)["llm-decode-a"]
    assert (a.outcome, a.end_reason, a.num_waited_for, a.num_cut, a.last_sample_at) == (
        "cut",
        "grace_expired",
        3,
        1,
        at(20),
    )
    assert (a.ended_at, a.duration_s) == (at(47), 46.0)  # seen at 60 s; the kubelet killed it at its deadline
    assert drains_followed(k8s_ctx) == []
    assert {d.decision_id for d in drains(k8s_ctx).values()} == {decision_id}
    with k8s_ctx.sessions.begin() as session:
        ended = session.scalars(
            select(AuditLogRow.detail).where(AuditLogRow.event == "engine_drain_ended").order_by(AuditLogRow.id)
        ).all()
    assert [(e["engine"], e["outcome"], e["reason"], e["num_cut"]) for e in ended] == [
        ("pod ns/llm-decode-d", "cut", "pod_gone", 2),
        ("pod ns/llm-decode-b", "completed", "pod_gone", 0),
        ("pod ns/llm-decode-a", "cut", "grace_expired", 1),
    ]


def test_a_pod_gone_unseen_another_removed_in_its_place_and_one_never_deleted(
    k8s_ctx: PlannerContext,  # noqa: F811 - the fixture
    disagg: KubeApiServer,  # noqa: F811
) -> None:
    """Decode from 4 pods to 1: e (0 in flight), g (1) and h (2) are handed over; f (5) should stay. e goes, but its
    engine reported nothing after the drain began: `unobserved`, cut unknown. Kubernetes deletes f instead of g
    (its own choice): g's drain follows f from then on, with f's load at the drain's start, and completes when f is
    gone. h is never deleted and nothing replaces it: pending, then after `NOT_DELETED_AFTER_S` `not_removed`,
    having waited for nothing."""
    scale_decode_to(
        k8s_ctx,
        disagg,
        {"llm-decode-e": 0, "llm-decode-f": 5, "llm-decode-g": 1, "llm-decode-h": 2},
        {"llm-decode-e": 45, "llm-decode-f": 45, "llm-decode-g": 45, "llm-decode-h": 45},
        1,
    )
    assert sorted(drains(k8s_ctx)) == ["llm-decode-e", "llm-decode-g", "llm-decode-h"]
    disagg.delete(PODS, "llm-decode-e")
    terminate(disagg, "llm-decode-f", 2, 45)
    run_execution(k8s_ctx, at(3))
    recorded = drains(k8s_ctx)
    assert sorted(recorded) == ["llm-decode-e", "llm-decode-f", "llm-decode-h"]
    e, f = recorded["llm-decode-e"], recorded["llm-decode-f"]
    assert (e.outcome, e.end_reason, e.num_waited_for, e.num_cut, e.last_sample_at) == (
        "unobserved",
        "pod_gone",
        0,
        None,
        None,
    )
    assert (f.outcome, f.num_in_flight_at_start, f.terminating_at, f.worker_ids) == (
        "handed_over",
        5,
        at(2),
        dynamo_pod_instance_id("llm-decode-f"),
    )
    assert f.detail.endswith("removed in place of pod ns/llm-decode-g")

    _store_loads(k8s_ctx, {"llm-decode-f": 0}, at(4))
    disagg.delete(PODS, "llm-decode-f")
    run_execution(k8s_ctx, at(10))
    f, h = drains(k8s_ctx)["llm-decode-f"], drains(k8s_ctx)["llm-decode-h"]
    assert (f.outcome, f.num_waited_for, f.num_cut) == ("completed", 5, 0)
    assert (h.outcome, h.terminating_at) == ("handed_over", None)
    run_execution(k8s_ctx, at(1 + NOT_DELETED_AFTER_S - 1))
    assert drains(k8s_ctx)["llm-decode-h"].outcome == "handed_over"
    run_execution(k8s_ctx, at(1 + NOT_DELETED_AFTER_S))
    h = drains(k8s_ctx)["llm-decode-h"]
    assert (h.outcome, h.end_reason, h.num_in_flight_at_start, h.num_waited_for, h.num_cut) == (
        "not_removed",
        "pod_not_deleted",
        2,
        None,
        None,
    )
    assert drains_followed(k8s_ctx) == []
    with k8s_ctx.sessions.begin() as session:
        [moved] = session.scalars(
            select(AuditLogRow.detail).where(AuditLogRow.event == "engine_drain_retargeted")
        ).all()
    assert (moved["expected"], moved["engine"], moved["num_in_flight_at_start"]) == (
        "pod ns/llm-decode-g",
        "pod ns/llm-decode-f",
        5,
    )


@pytest.mark.parametrize(
    ("pod_state", "last", "now_s", "expected"),
    [
        # gone: the newest sample decides, once it is SETTLE_S old
        (None, LastLoad(num_in_flight=0, received_at=at(9)), 9 + SETTLE_S - 0.01, None),
        (None, LastLoad(num_in_flight=0, received_at=at(9)), 9 + SETTLE_S, (DrainOutcome.COMPLETED, 0)),
        (None, LastLoad(num_in_flight=3, received_at=at(9)), 20, (DrainOutcome.CUT, 3)),
        (None, None, 20, (DrainOutcome.UNOBSERVED, None)),
        # terminating: pending until KILL_MARGIN_S past the deadline, whatever the samples
        (PodState(name="p", deletion_deadline=at(32), deletion_grace_s=30), None, 32 + KILL_MARGIN_S - 0.01, None),
        (
            PodState(name="p", deletion_deadline=at(32), deletion_grace_s=30),
            LastLoad(num_in_flight=0, received_at=at(31)),
            32 + KILL_MARGIN_S,
            (DrainOutcome.COMPLETED, 0),
        ),
        # listed, not deleted: pending until NOT_DELETED_AFTER_S after the drain began (T0)
        (PodState(name="p"), None, NOT_DELETED_AFTER_S - 0.01, None),
        (PodState(name="p"), None, NOT_DELETED_AFTER_S, (DrainOutcome.NOT_REMOVED, None)),
    ],
)
def test_judge_drain_boundaries(pod_state, last, now_s, expected) -> None:
    verdict = judge_drain(FollowedDrain(started_at=T0, grace_s=30.0), pod_state, last, at(now_s))
    assert (None if verdict.outcome is None else (verdict.outcome, verdict.num_cut)) == expected
    assert verdict.note  # every follow says what it saw


def test_a_drain_ends_by_its_deadline_and_engines_name_their_pod() -> None:
    """A drain ends at the latest at its pod's deletion deadline (the samples count until then); once the pod is
    gone, at the recorded termination plus its grace; never seen terminating, now."""
    followed = FollowedDrain(started_at=T0, grace_s=30.0, terminating_at=at(2))
    terminating = PodState(name="p", deletion_deadline=at(40), deletion_grace_s=38)
    assert terminating.terminating_at == at(2)
    assert followed.ended_by(terminating, at(100)) == at(40)
    assert followed.ended_by(terminating, at(10)) == at(10)
    assert followed.ended_by(None, at(100)) == at(32)
    assert FollowedDrain(started_at=T0, grace_s=30.0).ended_by(None, at(100)) == at(100)
    assert pod_of_engine(pod_engine("ns", "llm-decode-a")) == ("ns", "llm-decode-a")
    assert pod_of_engine("local worker 12 (pid 4711)") is None


def test_substitutes_take_a_terminating_pod_of_the_same_component_that_no_drain_names() -> None:
    """The oldest drain takes the earliest pod being deleted since it began; a pod of another component, one
    whose termination began before the drain, and one a drain already names are never taken."""

    def deleting(name: str, component: str, since_s: float) -> PodState:
        return PodState(name=name, component=component, deletion_deadline=at(since_s + 30), deletion_grace_s=30)

    pods = {
        p.name: p
        for p in (
            deleting("early", "Decode", -5),  # began before both drains
            deleting("prefill", "Prefill", 3),
            deleting("named", "Decode", 2),  # a drain already follows it
            deleting("second", "Decode", 4),
            deleting("first", "Decode", 3),
            PodState(name="alive", component="Decode"),
        )
    }
    awaited = [
        AwaitedPod(drain_id=8, component="Decode", started_at=at(1)),
        AwaitedPod(drain_id=7, component="Decode", started_at=at(0)),
        AwaitedPod(drain_id=9, component="Decode", started_at=at(1)),
    ]
    found = substitutes(awaited, pods, {"named"})
    assert {drain_id: pod.name for drain_id, pod in found.items()} == {7: "first", 8: "second"}


def test_serve_runs_the_execution_again_soon_while_a_drain_is_followed(tmp_path, monkeypatch) -> None:
    """`planner serve`'s execution: a run whose result has a drain still followed counts as work pending, so the
    listener runs again at the retry cadence rather than the fallback poll; without one (nothing pending) it does
    not."""
    import flows.serve
    from planner_core.config import load_config
    from planner_core.runtime.execution_listener import Trigger
    from tests.conftest import write_config

    path = str(write_config(tmp_path, environment="kubernetes"))
    listener = flows.serve.execution_listener("postgresql://unused/db", "k8s", path, load_config(path))
    applied = {"decision_id": 1, "outcome": "applied", "status": "applied", "detail": ""}
    for results, pending in (([applied, {"drain_of": "pod ns/a", "status": FOLLOWING}], True), ([applied], False)):
        monkeypatch.setattr(flows.serve, "execute_decisions", lambda r=results, **_flow_args: r)
        assert listener._execute(Trigger.FALLBACK) is pending
