"""The fleet scale benchmark (`planner fleet bench`): N simulated deployments ticked by one control plane.

Every deployment runs the same config (load loop and throughput loop) on the virtual connector. At every fleet
slot the benchmark plays each deployment's engines and orchestrator: it stores one forward-pass report per engine
(a load that rises and falls on a per-deployment phase, so deployments scale up and down at different times) and,
after the round, reports every written target as ready at once (the simulated orchestrator never lags). The round
itself is the fleet's work: the due ticks on a thread pool (`run_tick`, one transaction each), one arbitration of
the GPU budget, and the execution of pending decisions.

The round runs in this process without Prefect (`run_round`), or, given a `round_runner`, as whatever that runs:
`planner fleet bench --prefect` passes one that runs the real `fleet-tick` flow against a Prefect server it
started, and `extra_cpu_s` then reads that server's CPU seconds, counted with the rest.

With `realtime` each round starts at its wall-clock slot (a round that overruns makes the next slots late, and the
members count the slots they missed); without it the rounds run back to back on simulated time from a fixed epoch,
which measures capacity rather than keeping time.

Measured: CPU seconds of this process, of the Postgres server's processes (psutil) and of the Prefect server's
(with a round runner that uses one) per deployment-tick,
p50/p99 latency of a member's tick (its `run_tick`), p99 of a round, missed ticks, and the bytes stored per load
and per throughput tick (`stored_bytes_per_tick`) plus the database's growth per tick.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
from sqlalchemy import text

from planner_core.domain import Component, ForwardPassMetrics, Loop, QueuedRequests, ScheduledRequests
from planner_core.runtime.fleet import (
    ContextCache,
    FleetMember,
    RoundResult,
    add_member,
    run_round,
    set_budget,
    stored_bytes_per_tick,
)
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import session_factory
from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples

BENCH_EPOCH = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # simulated time starts here (a multiple of every interval)
LOAD_PERIOD_S = 600.0  # one rise and fall of each deployment's load


@dataclass(frozen=True)
class FleetBenchShape:
    """The benchmark's fleet and timing (`planner fleet bench`'s options), the same with and without Prefect."""

    num_deployments: int
    duration_s: float
    interval_s: float = 5.0
    realtime: bool = False
    max_concurrent: int = 4
    budget_gpus: int | None = None

    def as_kwargs(self) -> dict:
        """The shape as `run_fleet_bench`'s keyword arguments."""
        return dataclasses.asdict(self)


def bench_config(directory: Path, load_interval_s: float) -> Path:
    """The recommended policy with the load loop on at `load_interval_s` (its profile path made absolute)."""
    import yaml

    from planner_core.data import DEFAULT_CONFIG

    body = yaml.safe_load(DEFAULT_CONFIG.read_text())
    body["profile_results_dir"] = str((DEFAULT_CONFIG.parent / body["profile_results_dir"]).resolve())
    body["enable_load_scaling"] = True
    body["load_adjustment_interval_seconds"] = load_interval_s
    path = directory / "fleet-bench.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBenchResult:
    num_deployments: int
    duration_s: float
    interval_s: float
    realtime: bool
    num_rounds: int
    num_load_ticks: int
    num_throughput_ticks: int
    num_decisions: int
    num_failed_ticks: int
    missed_ticks: int
    wall_s: float
    cpu_s_planner: float
    cpu_s_postgres: float
    cpu_ms_per_deployment_tick: float  # planner + Postgres (+ the Prefect server with `prefect`)
    cores_used: float  # (planner + Postgres + Prefect server CPU) / wall time
    tick_ms_p50: float
    tick_ms_p99: float
    round_ms_p99: float
    bytes_per_load_tick: float
    bytes_per_throughput_tick: float
    db_growth_bytes_per_tick: float
    prefect: bool = False  # the rounds ran as `fleet-tick` flow runs on a Prefect server
    task_per_member: bool | None = None  # with `prefect`: a task run per member tick (else one per round)
    cpu_s_prefect: float = 0.0  # the Prefect server's process tree (0 without `prefect`)
    cpu_ms_per_deployment_tick_prefect: float = 0.0  # its share of `cpu_ms_per_deployment_tick`


def _reports(member_index: int, at: dt.datetime, num_prefill: int, num_decode: int) -> list[ForwardPassMetrics]:
    """One iteration of every engine of a deployment at `at`: the deployment's demand split over its workers."""
    phase = 2 * math.pi * ((at.timestamp() / LOAD_PERIOD_S) + member_index / 7.0)
    demand = 0.5 + 0.45 * math.sin(phase)  # 0.05 .. 0.95 of one 4-engine deployment's capacity
    reports = []
    counter = int(at.timestamp())
    for worker in range(max(1, num_prefill)):
        queued = int(40_000 * demand * 2 / max(1, num_prefill))
        reports.append(
            ForwardPassMetrics(
                component=Component.PREFILL,
                worker_id=f"p{worker}",
                counter_id=counter,
                wall_time_s=0.02 + 0.08 * demand,
                scheduled=ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=int(4000 * demand) + 1),
                queued=QueuedRequests(sum_prefill_tokens=queued),
            )
        )
    for worker in range(max(1, num_decode)):
        kv = int(200_000 * demand * 2 / max(1, num_decode))
        reports.append(
            ForwardPassMetrics(
                component=Component.DECODE,
                worker_id=f"d{worker}",
                counter_id=counter,
                wall_time_s=0.01 + 0.03 * demand,
                scheduled=ScheduledRequests(num_decode_requests=max(1, kv // 2000), sum_decode_kv_tokens=kv),
                queued=QueuedRequests(),
            )
        )
    return reports


def _postgres_cpu_s(session) -> float:
    """CPU seconds used so far by the Postgres server (`process_tree_cpu_s` of the postmaster)."""
    pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return process_tree_cpu_s(psutil.Process(pid).parent())


def process_tree_cpu_s(server: psutil.Process) -> float:
    """CPU seconds used so far by a server process and its descendants: its own, its exited children's (the
    children times it has reaped) and its live descendants'. Children that exit between two readings count in
    the reaped times, so backends or workers started and ended during the run are not lost."""
    times = server.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for process in server.children(recursive=True):
        try:
            child = process.cpu_times()
            total += child.user + child.system
        except psutil.NoSuchProcess:
            continue
    return total


def _database_bytes(session) -> int:
    return int(session.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def _register_members(sessions, config_path: Path, num_deployments: int, budget_gpus: int | None) -> list[FleetMember]:
    """The benchmark's members (`bench-0000`, ...: mixed priorities and weights) and the fleet's GPU budget."""
    with sessions.begin() as session:
        members: list[FleetMember] = [
            add_member(session, f"bench-{i:04d}", config_path, min_gpus=2, priority=i % 3, weight=1.0 + i % 2)
            for i in range(num_deployments)
        ]
        set_budget(session, budget_gpus if budget_gpus is not None else 3 * num_deployments)
    return members


def _store_engine_reports(sessions, members: list[FleetMember], now: dt.datetime) -> None:
    """The simulated engines: one forward-pass report per running engine of every member, stored a second ago."""
    with sessions.begin() as session:
        rows = session.execute(
            text("SELECT deployment_id, num_prefill_workers, num_decode_workers FROM virtual_connector_state")
        ).all()
        counts = {row[0]: (row[1], row[2]) for row in rows}
        for i, member in enumerate(members):
            prefill, decode = counts.get(member.deployment_id, (1, 1))
            samples = [
                FpmSample(fpm=fpm, received_at=now - dt.timedelta(seconds=1))
                for fpm in _reports(i, now, prefill, decode)
            ]
            insert_fpm_samples(session, member.deployment_id, samples)


def _orchestrator_ready(sessions) -> None:
    """The simulated orchestrator: every written target is ready at once."""
    with sessions.begin() as session:
        session.execute(
            text(
                "UPDATE virtual_connector_state SET ready_prefill_workers = num_prefill_workers, "
                "ready_decode_workers = num_decode_workers, scaled_decision_id = decision_id "
                "WHERE decision_id >= 0 AND scaled_decision_id < decision_id"
            )
        )


@dataclass(frozen=True)
class _Rounds:
    """What the rounds measured: each member tick's and each round's latency, missed and failed ticks."""

    tick_ms: list[float]
    round_ms: list[float]
    missed: int
    failed: int


def _run_rounds(
    sessions,
    start: dt.datetime,
    num_rounds: int,
    interval_s: float,
    realtime: bool,
    members: list[FleetMember],
    run_one: Callable[[dt.datetime], RoundResult],
) -> _Rounds:
    """The rounds, each at its slot: the engines report, the round runs, the orchestrator follows."""
    tick_ms, round_ms = [], []
    missed = failed = 0
    for index in range(num_rounds):
        at = start + dt.timedelta(seconds=index * interval_s)
        if realtime:
            time.sleep(max(0.0, at.timestamp() - time.time()))
        round_began = time.perf_counter()
        now = dt.datetime.fromtimestamp(max(at.timestamp(), time.time()), tz=dt.UTC) if realtime else at
        _store_engine_reports(sessions, members, now)
        result = run_one(now)
        missed += result.num_missed
        tick_ms.extend(result.tick_ms)
        failed += len(result.failed)
        _orchestrator_ready(sessions)
        round_ms.append((time.perf_counter() - round_began) * 1000.0)
    return _Rounds(tick_ms=tick_ms, round_ms=round_ms, missed=missed, failed=failed)


def _first_slot(interval_s: float) -> dt.datetime:
    """The next wall-clock slot (a multiple of `interval_s`): where a realtime run's first round starts."""
    return dt.datetime.fromtimestamp(math.floor(time.time() / interval_s) * interval_s + interval_s, tz=dt.UTC)


def _stored_figures(sessions, ids: list[int]) -> dict:
    """After the rounds: Postgres' CPU seconds and the database's size so far, the bytes stored per load and per
    throughput tick, and the members' decisions."""
    with sessions.begin() as session:
        return {
            "pg_cpu_s": _postgres_cpu_s(session),
            "db_bytes": _database_bytes(session),
            "load_bytes": stored_bytes_per_tick(session, Loop.LOAD, ids),
            "throughput_bytes": stored_bytes_per_tick(session, Loop.THROUGHPUT, ids),
            "num_decisions": repo.query_rows(
                session, "SELECT count(*) AS n FROM decisions WHERE deployment_id = ANY(:ids)", ids=ids
            )[0]["n"],
        }


def run_fleet_bench(
    database_url: str,
    config_path: Path,
    *,
    num_deployments: int,
    duration_s: float,
    interval_s: float = 5.0,
    realtime: bool = False,
    max_concurrent: int = 4,
    budget_gpus: int | None = None,
    cache: ContextCache | None = None,
    round_runner: Callable[[dt.datetime], RoundResult] | None = None,
    extra_cpu_s: Callable[[], float] | None = None,
    prefect: bool = False,
    task_per_member: bool | None = None,
) -> FleetBenchResult:
    """Register `num_deployments` members running `config_path`, run the fleet for `duration_s`, measure.

    `round_runner`: runs one round at a time (default: `run_round` here, without Prefect); `extra_cpu_s`: the CPU
    seconds so far of the server it uses (the Prefect server), counted with the rest and reported apart; `cache`:
    the contexts that runner ticks with (loaded here, before the clock starts); `prefect`, `task_per_member`:
    how the runner runs the rounds, recorded in the result."""
    sessions = session_factory(database_url)
    members = _register_members(sessions, config_path, num_deployments, budget_gpus)
    cache = cache or ContextCache(database_url)
    contexts = {member.name: cache.get(member) for member in members}
    num_rounds = int(duration_s // interval_s)
    start = _first_slot(interval_s) if realtime else BENCH_EPOCH
    with sessions.begin() as session:
        pg_cpu_before, db_bytes_before = _postgres_cpu_s(session), _database_bytes(session)
    process = psutil.Process()
    cpu_before = sum(process.cpu_times()[:2])
    extra_before = extra_cpu_s() if extra_cpu_s is not None else 0.0
    wall_before = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max_concurrent) as pool:

        def run_one(now: dt.datetime) -> RoundResult:
            if round_runner is not None:
                return round_runner(now)
            return run_round(database_url, members, contexts, now, pool)

        rounds = _run_rounds(sessions, start, num_rounds, interval_s, realtime, members, run_one)
    wall_s = time.perf_counter() - wall_before
    cpu_s = sum(process.cpu_times()[:2]) - cpu_before
    extra_s = extra_cpu_s() - extra_before if extra_cpu_s is not None else 0.0
    stored = _stored_figures(sessions, [member.deployment_id for member in members])
    pg_cpu_s, db_growth = stored["pg_cpu_s"] - pg_cpu_before, stored["db_bytes"] - db_bytes_before
    load_bytes, throughput_bytes = stored["load_bytes"], stored["throughput_bytes"]
    tick_ms, round_ms = rounds.tick_ms, rounds.round_ms
    num_ticks = len(tick_ms)
    quantiles = statistics.quantiles(tick_ms, n=100, method="inclusive") if num_ticks >= 2 else [0.0] * 99
    round_q = statistics.quantiles(round_ms, n=100, method="inclusive") if len(round_ms) >= 2 else [0.0] * 99
    return FleetBenchResult(
        num_deployments=num_deployments,
        duration_s=duration_s,
        interval_s=interval_s,
        realtime=realtime,
        num_rounds=num_rounds,
        num_load_ticks=int(load_bytes["num_ticks"]),
        num_throughput_ticks=int(throughput_bytes["num_ticks"]),
        num_decisions=int(stored["num_decisions"]),
        num_failed_ticks=rounds.failed,
        missed_ticks=rounds.missed,
        wall_s=wall_s,
        cpu_s_planner=cpu_s,
        cpu_s_postgres=pg_cpu_s,
        cpu_ms_per_deployment_tick=1000.0 * (cpu_s + pg_cpu_s + extra_s) / max(1, num_ticks),
        cores_used=(cpu_s + pg_cpu_s + extra_s) / wall_s if wall_s > 0 else 0.0,
        tick_ms_p50=quantiles[49],
        tick_ms_p99=quantiles[98],
        round_ms_p99=round_q[98],
        bytes_per_load_tick=load_bytes.get("total", 0.0),
        bytes_per_throughput_tick=throughput_bytes.get("total", 0.0),
        db_growth_bytes_per_tick=db_growth / max(1, num_ticks),
        prefect=prefect,
        task_per_member=task_per_member,
        cpu_s_prefect=extra_s,
        cpu_ms_per_deployment_tick_prefect=1000.0 * extra_s / max(1, num_ticks),
    )
