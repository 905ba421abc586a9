"""The local connector: its pure plan and parsers, and real worker processes (a stand-in engine that registers
in a file discovery store like Dynamo's) started, drained, killed, adopted and replaced through the outbox."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from planner_core.config import ConfigError, PlannerMode, load_config
from planner_core.domain import Component
from planner_core.runtime.connectors.local import (
    RESTART_BACKOFF_MAX_S,
    LocalConnectorError,
    PoolPlan,
    WorkerView,
    disaggregation_mode,
    failed_start_streak,
    plan_pool,
    render_command,
    restart_delay_s,
)
from planner_core.runtime.connectors.local_procs import (
    parse_listening_inodes,
    parse_proc_stat,
    process_start_ticks,
    registered_instances,
    registered_ports,
)
from planner_core.runtime.service import default_workers, load_context, run_execution
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import (
    AuditLogRow,
    DecisionRow,
    DrainRow,
    ExecutionRow,
    LocalWorkerRow,
    LocalWorkerStatus,
)
from tests.conftest import write_config
from tests.runtime.databases import record_decision

STANDIN = str(Path(__file__).with_name("local_worker_standin.py"))
NAME = "local-test"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
S, R, D = LocalWorkerStatus.STARTING, LocalWorkerStatus.READY, LocalWorkerStatus.DRAINING


# --- pure parts ---------------------------------------------------------------------------------------------


def views(*statuses: LocalWorkerStatus) -> list[WorkerView]:
    return [WorkerView(worker_id=i + 1, status=s) for i, s in enumerate(statuses)]


def test_plan_starts_the_missing_workers_and_ignores_draining_ones() -> None:
    assert plan_pool(Component.DECODE, views(R, D, D), 3) == PoolPlan(
        role=Component.DECODE, target=3, num_live=1, num_start=2
    )
    assert not plan_pool(Component.DECODE, views(R, S), 2).changes


def test_plan_drains_not_ready_workers_first_then_the_newest() -> None:
    # ids 1..5: ready, starting, ready, starting, ready -> drain the starting ones (newest first), then ready 5
    plan = plan_pool(Component.PREFILL, views(R, S, R, S, R), 2)
    assert plan.drain == (4, 2, 5) and plan.num_start == 0
    assert plan_pool(Component.PREFILL, views(R, R), 0).drain == (2, 1)
    with pytest.raises(ValueError, match="target of prefill = -1"):
        plan_pool(Component.PREFILL, views(), -1)


def test_plan_drains_the_least_loaded_ready_workers_and_unknown_loads_last() -> None:
    # ids 1..5 ready with 7, 0, unknown, 3, 0 requests in flight; id 6 starting (serves nothing: first)
    loads = (7, 0, None, 3, 0)
    workers = [WorkerView(worker_id=i + 1, status=R, num_in_flight=n) for i, n in enumerate(loads)]
    workers.append(WorkerView(worker_id=6, status=S))
    plan = plan_pool(Component.DECODE, workers, 2)
    assert plan.drain == (6, 5, 2, 4)  # starting, then 0 (newest first), 0, 3; the busiest (7) and the unknown stay
    assert plan_pool(Component.DECODE, workers, 0).drain == (6, 5, 2, 4, 1, 3)


def test_render_command_substitutes_and_names_a_missing_variable() -> None:
    argv = render_command(
        ["${PY}", "-m", "x", "--mode", "${ROLE}", "$$literal"], {"PY": "/p", "ROLE": "decode"}, field="f"
    )
    assert argv == ["/p", "-m", "x", "--mode", "decode", "$literal"]
    with pytest.raises(LocalConnectorError, match=r"^local_workers.decode_command\[1\] = '\$\{NOPE\}': variable NOPE"):
        render_command(["a", "${NOPE}"], {}, field="local_workers.decode_command")
    assert disaggregation_mode(PlannerMode.AGG, Component.DECODE) == "agg"
    assert disaggregation_mode(PlannerMode.DISAGG, Component.PREFILL) == "prefill"


def test_proc_parsers() -> None:
    stat = "4242 (python -c (x)) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 987654 rest"
    assert parse_proc_stat(stat) == ("S", 987654)
    tcp = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:A5AD 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1\n"
        "   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 5552 1\n"
    )
    assert parse_listening_inodes(tcp) == {5551: 0xA5AD}  # the established socket is not listening
    assert process_start_ticks(os.getpid()) is not None


def test_registered_ports_reads_generate_endpoints_of_the_namespace() -> None:
    def entry(namespace: str, endpoint: str, port: int) -> str:
        return (
            f'{{"namespace":"{namespace}","endpoint":"{endpoint}",'
            f'"transport":{{"tcp":"192.0.2.2:{port}/80eb/{namespace}/backend/{endpoint}"}}}}'
        )

    texts = [entry("dynamo", "generate", 42829), entry("other", "generate", 1), entry("dynamo", "kv_query", 2), "{half"]
    assert registered_ports(texts, namespace="dynamo") == {42829}
    # Dynamo's entries carry the instance id the engine's forward-pass samples are named by (beyond 2**53 here)
    with_id = (
        '{"namespace":"dynamo","endpoint":"generate","instance_id":15934747437336907462,"transport":{"tcp":"h:7/x"}}'
    )
    assert registered_instances([with_id, *texts], namespace="dynamo") == {7: {"15934747437336907462"}, 42829: set()}


def test_local_workers_requires_environment_local(tmp_path) -> None:
    path = write_config(tmp_path, local_workers={"drain_grace_seconds": 1})
    with pytest.raises(ConfigError, match="environment"):
        load_config(path)


# --- real processes ------------------------------------------------------------------------------------------


@pytest.fixture
def make_ctx(database_url, tmp_path, monkeypatch, profile_dir):
    monkeypatch.setenv("PLANNER_DATA_DIR", str(tmp_path / "data"))
    kv = tmp_path / "kv"
    created = []

    def make(
        *extra: str,
        grace_s: float = 5.0,
        command: list[str] | None = None,
        discovery_dir: Path | None = None,
        default_command: bool = False,
        initial_decode: int | None = None,
        metrics_targets_file: Path | None = None,
    ):
        local_workers: dict = {
            "env": {"NS": "dynamo"},
            "discovery_dir": str(discovery_dir or kv),
            "drain_grace_seconds": grace_s,
        }
        if initial_decode is not None:
            local_workers["initial_decode"] = initial_decode
        if metrics_targets_file is not None:
            local_workers["metrics_targets_file"] = str(metrics_targets_file)
        if not default_command:  # else the mocker, the default command
            local_workers["decode_command"] = command or [sys.executable, STANDIN, "--namespace", "${NS}", *extra]
        path = write_config(tmp_path, mode="agg", environment="local", local_workers=local_workers)
        ctx = load_context(database_url, NAME, path)
        with ctx.sessions.begin() as session:
            repo.ensure_deployment(session, NAME, ctx.config)
        created.append(ctx)
        return ctx

    yield make
    for ctx in created[:1]:  # every process any context started, by pid (they lead their own process group)
        with ctx.sessions.begin() as session:
            for row in session.scalars(select(LocalWorkerRow)):
                if process_start_ticks(row.pid) == row.proc_start_ticks:
                    os.killpg(row.pid, signal.SIGKILL)


def workers(ctx, *statuses: LocalWorkerStatus) -> list[LocalWorkerRow]:
    with ctx.sessions.begin() as session:
        rows = session.scalars(select(LocalWorkerRow).order_by(LocalWorkerRow.id)).all()
        session.expunge_all()
    return [r for r in rows if not statuses or LocalWorkerStatus(r.status) in statuses]


def settle(ctx, done, timeout_s: float = 15.0) -> None:
    """Run the execution flow's work (reconcile + outbox) until `done()` or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run_execution(ctx, dt.datetime.now(dt.UTC))
        if done():
            return
        time.sleep(0.1)
    raise AssertionError(f"not settled in {timeout_s} s: {[(w.id, w.status, w.pid) for w in workers(ctx)]}")


def decision_status(ctx, decision_id: int) -> str:
    with ctx.sessions.begin() as session:
        return session.get(DecisionRow, decision_id).status


def alive(row: LocalWorkerRow) -> bool:
    return process_start_ticks(row.pid) == row.proc_start_ticks


def counts(ctx) -> tuple[int, int]:
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, NAME)
        got = ctx.connector.worker_counts(session, deployment.id, default=default_workers(ctx.config))
    return got.ready_decode, got.expected_decode


def test_scale_up_and_down_reach_real_processes_and_are_acknowledged(make_ctx) -> None:
    ctx = make_ctx("--register-after-s", "0.3")
    settle(ctx, lambda: len(workers(ctx, R)) == 1)  # the minimum endpoint, before any decision
    assert counts(ctx) == (1, 1)

    up = record_decision(ctx, NAME, T0, None, 3)
    settle(ctx, lambda: decision_status(ctx, up) == "acknowledged")
    ready = workers(ctx, R)
    assert len(ready) == 3 and all(alive(w) for w in ready)
    assert counts(ctx) == (3, 3)

    # a planner restarted now (a new context, a new connector) adopts the three running workers
    restarted = make_ctx("--register-after-s", "0.3")
    run_execution(restarted, dt.datetime.now(dt.UTC))
    assert counts(restarted) == (3, 3)
    assert [w.id for w in workers(restarted, R)] == [w.id for w in ready]

    down = record_decision(restarted, NAME, T0 + dt.timedelta(minutes=1), None, 1)
    settle(restarted, lambda: decision_status(restarted, down) == "acknowledged")
    stopped = workers(restarted, LocalWorkerStatus.STOPPED)
    assert len(stopped) == 2 and not any(alive(w) for w in stopped)
    assert [w.id for w in workers(restarted, R)] == [ready[0].id]  # the oldest stays
    with restarted.sessions.begin() as session:
        outcomes = session.execute(
            select(ExecutionRow.decision_id, ExecutionRow.outcome, ExecutionRow.connector).order_by(ExecutionRow.id)
        ).all()
        started = session.scalars(select(AuditLogRow.detail).where(AuditLogRow.event == "local_worker_started")).all()
    assert (up, "applied", "local") in outcomes and (down, "applied", "local") in outcomes
    assert (up, "reconciled", "local") in outcomes and (down, "reconciled", "local") in outcomes
    assert len(started) == 3


def test_workers_get_a_metrics_port_and_the_targets_file_lists_those_running(make_ctx, tmp_path) -> None:
    """With `metrics_targets_file`, each worker starts with its own free port as DYN_SYSTEM_PORT (Dynamo's metrics
    server), kept in its row, and the Prometheus targets file lists the workers whose process runs, labelled with
    their pool and row id: two after a scale-up, the remaining one once the scale-down's drain has ended."""
    targets_file = tmp_path / "prometheus" / "workers.json"
    ctx = make_ctx("--register-after-s", "0.3", metrics_targets_file=targets_file)
    up = record_decision(ctx, NAME, T0, None, 2)
    settle(ctx, lambda: decision_status(ctx, up) == "acknowledged")
    ready = workers(ctx, R)
    ports = [w.metrics_port for w in ready]
    assert len(ready) == 2 and None not in ports and len(set(ports)) == 2
    assert all(20000 <= port <= 32767 for port in ports)  # Dynamo 1.6.1 refuses a DYN_SYSTEM_PORT past 32767
    for worker in ready:
        environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
        assert f"DYN_SYSTEM_PORT={worker.metrics_port}".encode() in environ

    def listed() -> list:
        return json.loads(targets_file.read_text())

    assert listed() == [
        {"targets": [f"127.0.0.1:{w.metrics_port}"], "labels": {"role": "decode", "local_worker": str(w.id)}}
        for w in ready
    ]
    down = record_decision(ctx, NAME, T0 + dt.timedelta(minutes=1), None, 1)
    settle(ctx, lambda: decision_status(ctx, down) == "acknowledged")
    [kept] = workers(ctx, R)
    assert [group["labels"]["local_worker"] for group in listed()] == [str(kept.id)]


def test_the_initial_workers_start_before_any_decision_and_the_first_decision_resizes_them(make_ctx) -> None:
    """A deployment taken over at 3 engines (`initial_decode`), above its minimum of 1: all three start before the
    first decision, and that decision (to 2) drains one."""
    ctx = make_ctx("--register-after-s", "0.3", initial_decode=3)
    settle(ctx, lambda: len(workers(ctx, R)) == 3)
    assert counts(ctx) == (3, 3)
    down = record_decision(ctx, NAME, T0, None, 2)
    settle(ctx, lambda: decision_status(ctx, down) == "acknowledged")
    assert len(workers(ctx, R)) == 2 and counts(ctx) == (2, 2)


def test_a_killed_worker_is_detected_and_replaced(make_ctx) -> None:
    ctx = make_ctx()
    up = record_decision(ctx, NAME, T0, None, 2)
    settle(ctx, lambda: decision_status(ctx, up) == "acknowledged")
    victim = workers(ctx, R)[0]
    os.kill(victim.pid, signal.SIGKILL)
    settle(ctx, lambda: len(workers(ctx, R)) == 2 and victim.id not in [w.id for w in workers(ctx, R)])
    [died] = workers(ctx, LocalWorkerStatus.DIED)
    assert died.id == victim.id and "exited while ready" in died.end_detail
    with ctx.sessions.begin() as session:
        details = session.scalars(
            select(ExecutionRow.detail).where(ExecutionRow.decision_id == up, ExecutionRow.outcome == "reconciled")
        ).all()
    assert any(
        f"worker {victim.id} (pid {victim.pid}) died" in d and "replace: start decode worker" in d for d in details
    )


def test_a_role_dying_at_start_is_restarted_with_a_backoff_not_on_every_run(make_ctx) -> None:
    """A worker command that exits at once (a crash loop): over ~4 s of execution runs every 0.1 s, starts come
    after 1 and 2 s of backoff (about 3 in all), not one per run (~40), and each hold says why."""
    ctx = make_ctx(command=[sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        run_execution(ctx, dt.datetime.now(dt.UTC))
        time.sleep(0.1)
    rows = workers(ctx)
    assert 2 <= len(rows) <= 5, [(w.id, w.status) for w in rows]
    assert all(w.status == LocalWorkerStatus.DIED.value for w in rows[:-1])
    with ctx.sessions.begin() as session:
        details = session.scalars(select(AuditLogRow.detail).where(AuditLogRow.event == "local_reconciled")).all()
    assert any("in a row died before getting ready; next start" in json.dumps(d) for d in details)


def test_restart_delay_doubles_up_to_its_cap_and_a_ready_worker_ends_the_streak() -> None:
    assert [restart_delay_s(n) for n in range(5)] == [0.0, 1.0, 2.0, 4.0, 8.0]
    assert restart_delay_s(7) == RESTART_BACKOFF_MAX_S == restart_delay_s(10_000)
    died, ready_died, stopped = ("died", None), ("died", T0), ("stopped", T0)
    assert failed_start_streak([died, died, ready_died, died]) == 2
    assert failed_start_streak([stopped, died]) == 0
    assert failed_start_streak([]) == 0


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(make_ctx) -> None:
    ctx = make_ctx("--ignore-sigterm", grace_s=0.5)
    up = record_decision(ctx, NAME, T0, None, 2)
    settle(ctx, lambda: decision_status(ctx, up) == "acknowledged")
    down = record_decision(ctx, NAME, T0 + dt.timedelta(minutes=1), None, 1)
    settle(ctx, lambda: decision_status(ctx, down) == "acknowledged")
    [killed] = workers(ctx, LocalWorkerStatus.KILLED)
    assert "SIGKILL after 0.5 s" in killed.end_detail and not alive(killed)


def test_a_bad_command_fails_the_decision_attempt_in_one_line(make_ctx) -> None:
    ctx = make_ctx(command=[sys.executable, "${MISSING_VARIABLE}"])
    with pytest.raises(LocalConnectorError, match=r"decode_command\[1\] = '\$\{MISSING_VARIABLE\}'"):
        run_execution(ctx, dt.datetime.now(dt.UTC))  # the minimum endpoint cannot start: said at once
    assert workers(ctx) == []


def test_a_start_failing_midway_stops_the_workers_it_had_started(make_ctx, monkeypatch) -> None:
    """A decision from 1 to 4 workers whose third new process cannot start: the attempt is recorded as failed in
    one line, its savepoint rolls back the rows of the two workers it had started, and their processes are killed
    with them instead of running on unrecorded (nothing would ever count, drain or stop them); the worker from
    before the decision runs on."""
    import errno

    from planner_core.runtime.connectors import local as local_module

    ctx = make_ctx()
    real_popen = subprocess.Popen
    spawned: list[subprocess.Popen] = []

    def popen_failing_the_fourth(*args, **kwargs):
        if len(spawned) == 3:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        spawned.append(real_popen(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(local_module.subprocess, "Popen", popen_failing_the_fourth)
    run_execution(ctx, dt.datetime.now(dt.UTC))  # the minimum endpoint: one worker
    [first] = workers(ctx)
    up = record_decision(ctx, NAME, T0, None, 4)
    [summary] = run_execution(ctx, dt.datetime.now(dt.UTC))
    assert summary.decision_id == up and summary.outcome.value == "failed"
    assert summary.detail.startswith("LocalConnectorError: ") and "cannot start: Resource temporarily" in summary.detail
    assert [(w.id, alive(w)) for w in workers(ctx)] == [(first.id, True)]  # the two new rows rolled back
    assert len(spawned) == 3
    for process in spawned[1:]:
        assert process.wait(timeout=10) == -signal.SIGKILL  # killed with their rows, not left running


def _report_load(ctx, loads: dict[int, int]) -> None:
    """Store a forward-pass sample per worker (by its process, whose instance id the stand-in registers as its pid)
    with `loads[worker id]` requests decoding, as the ingest would."""
    from planner_core.domain import ForwardPassMetrics, ScheduledRequests
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples

    now = dt.datetime.now(dt.UTC)
    by_id = {w.id: w for w in workers(ctx)}
    samples = [
        FpmSample(
            fpm=ForwardPassMetrics(
                component=Component.DECODE,
                worker_id=str(by_id[worker_id].pid),
                wall_time_s=0.01,
                scheduled=ScheduledRequests(num_decode_requests=n),
            ),
            received_at=now,
        )
        for worker_id, n in loads.items()
    ]
    with ctx.sessions.begin() as session:
        insert_fpm_samples(session, repo.find_deployment(session, NAME).id, samples)


def drains(ctx) -> list[DrainRow]:
    with ctx.sessions.begin() as session:
        rows = session.scalars(select(DrainRow).order_by(DrainRow.id)).all()
        session.expunge_all()
    return list(rows)


def test_a_scale_down_drains_the_least_loaded_workers_and_records_what_it_waited_for(make_ctx) -> None:
    """Four ready workers with 5, 0, 9 and 2 requests in flight (their forward-pass samples): a decision to 2 drains
    the two least loaded (0 and 2), not the newest; each drain is recorded with its load, and ends `stopped` with
    nothing cut once the process exits after SIGTERM."""
    ctx = make_ctx("--drain-s", "0.3", initial_decode=4)
    settle(ctx, lambda: len(workers(ctx, R)) == 4)
    ids = [w.id for w in workers(ctx, R)]
    _report_load(ctx, dict(zip(ids, (5, 0, 9, 2), strict=True)))
    down = record_decision(ctx, NAME, T0, None, 2)
    settle(ctx, lambda: decision_status(ctx, down) == "acknowledged")
    assert [w.id for w in workers(ctx, R)] == [ids[0], ids[2]]  # the busiest two stay
    recorded = {d.local_worker_id: d for d in drains(ctx)}
    assert set(recorded) == {ids[1], ids[3]}
    assert [(recorded[i].num_in_flight_at_start, recorded[i].num_waited_for) for i in (ids[1], ids[3])] == [
        (0, 0),
        (2, 2),
    ]
    for drain in recorded.values():
        assert (drain.outcome, drain.end_reason, drain.num_cut, drain.decision_id, drain.grace_s) == (
            "stopped",
            "exited",
            0,
            down,
            5.0,
        )
        assert drain.duration_s is not None and 0.2 <= drain.duration_s < 5.0  # the stand-in's 0.3 s drain
        assert drain.worker_ids == str(next(w.pid for w in workers(ctx) if w.id == drain.local_worker_id))


def test_a_drain_past_the_grace_records_the_requests_it_cut(make_ctx) -> None:
    """A worker that ignores SIGTERM is killed after the grace; the requests its newest sample still showed in
    flight are recorded as cut."""
    ctx = make_ctx("--ignore-sigterm", grace_s=0.5, initial_decode=2)
    settle(ctx, lambda: len(workers(ctx, R)) == 2)
    first, second = (w.id for w in workers(ctx, R))
    _report_load(ctx, {first: 1, second: 4})
    down = record_decision(ctx, NAME, T0, None, 1)
    settle(ctx, lambda: decision_status(ctx, down) == "acknowledged")
    [drain] = drains(ctx)
    assert (drain.local_worker_id, drain.outcome, drain.end_reason) == (first, "killed", "grace_expired")
    assert (drain.num_in_flight_at_start, drain.num_cut) == (1, 1)
    with ctx.sessions.begin() as session:
        [ended] = session.scalars(select(AuditLogRow.detail).where(AuditLogRow.event == "engine_drain_ended")).all()
    assert (ended["num_cut"], ended["outcome"], ended["reason"]) == (1, "killed", "grace_expired")
