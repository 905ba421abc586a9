"""`planner fleet bench --prefect` end to end on a real Postgres and a real Prefect server: every round is a
`fleet-tick` flow run, each member's tick a task run the Prefect API lists under its deployment's tag, and the
Prefect server's CPU is counted with the planner's and Postgres'."""

from __future__ import annotations

import argparse
import asyncio
import time

import psycopg

from flows.lab.fleet_bench import bench_with_prefect
from planner_cli.fleet import bench_shape
from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import write_config


def _bench_args(**overrides: object) -> argparse.Namespace:
    values = {
        "deployments": 2, "duration": 10.0, "interval": 5.0, "realtime": False, "max_concurrent": 2,
        "budget": None, "task_per_member": True,
    }  # fmt: skip
    return argparse.Namespace(**(values | overrides))


def _task_runs(ids: list[str]) -> dict[str, list[str]]:
    """Task run id -> sorted tags, of the given task runs the Prefect server has recorded."""
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    async def read() -> dict[str, list[str]]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=[uuid.UUID(i) for i in ids]))
            )
            return {str(run.id): sorted(run.tags) for run in runs}

    return asyncio.run(read())


def test_bench_with_prefect_runs_rounds_as_flow_runs_and_counts_the_servers_cpu(
    prefect_api_url, database_url, tmp_path, profile_dir
) -> None:
    """2 members, 2 rounds of 5 s on simulated time: 4 load ticks and the first round's 2 throughput ticks, each
    recorded with the id of the task run that ticked it; the Prefect API lists every one of those task runs,
    tagged with its deployment; the Prefect server's CPU is measured and counted in the totals."""
    config = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)

    args = _bench_args()
    result = bench_with_prefect(database_url, config, bench_shape(args), task_per_member=args.task_per_member)

    assert (result.prefect, result.task_per_member) == (True, True)
    assert (result.num_rounds, result.num_load_ticks, result.num_throughput_ticks) == (2, 4, 2)
    assert (result.missed_ticks, result.num_failed_ticks) == (0, 0)
    assert result.tick_ms_p50 > 0 and result.tick_ms_p99 >= result.tick_ms_p50
    assert result.cpu_s_planner > 0 and result.cpu_s_postgres > 0 and result.cpu_s_prefect > 0
    total_s = result.cpu_s_planner + result.cpu_s_postgres + result.cpu_s_prefect
    assert abs(result.cpu_ms_per_deployment_tick - 1000 * total_s / 6) < 1e-6
    assert 0 < result.cpu_ms_per_deployment_tick_prefect < result.cpu_ms_per_deployment_tick

    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ticks = conn.execute(
            "SELECT d.name, t.loop, t.task_run_id FROM ticks t JOIN deployments d ON d.id = t.deployment_id "
            "WHERE d.name LIKE 'bench-%%'"
        ).fetchall()
    assert len(ticks) == 6 and all(task_run_id for _, _, task_run_id in ticks)
    # The server records task runs from their events, a moment after they ran.
    deadline, seen = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        seen = _task_runs([task_run_id for _, _, task_run_id in ticks])
        if len(seen) == len(ticks):
            break
        time.sleep(1)
    assert {(name, tuple(seen.get(run_id, ()))) for name, _, run_id in ticks} == {
        ("bench-0000", ("deployment:bench-0000", "fleet")),
        ("bench-0001", ("deployment:bench-0001", "fleet")),
    }


def test_bench_with_prefect_one_task_per_round(prefect_api_url, database_url, tmp_path, profile_dir, monkeypatch):
    """The default: each round as `fleet-round` task runs tagged with the deployments they tick, whose id each
    tick records; with at most one deployment's tags per task run (a Prefect event relates at most 100 resources,
    so 100 deployments take two task runs a round), each round is two task runs, one per deployment; the arbitration
    still runs once a round, after every tick; the server's CPU is counted."""
    import flows.fleet

    monkeypatch.setattr(flows.fleet, "ROUND_TAGS_MAX", 1)
    config = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)

    result = bench_with_prefect(database_url, config, bench_shape(_bench_args()), task_per_member=False)

    assert (result.prefect, result.task_per_member) == (True, False)
    assert (result.num_load_ticks, result.num_throughput_ticks, result.missed_ticks) == (4, 2, 0)
    assert result.tick_ms_p50 > 0 and result.cpu_s_prefect > 0
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ticks = conn.execute(
            "SELECT d.name, t.task_run_id FROM ticks t JOIN deployments d ON d.id = t.deployment_id "
            "WHERE d.name LIKE 'bench-%%'"
        ).fetchall()
        [(num_rounds,)] = conn.execute("SELECT count(*) FROM arbitration_rounds").fetchall()
    assert num_rounds == 2
    run_ids = sorted({run_id for _, run_id in ticks})
    assert len(ticks) == 6 and len(run_ids) == 4 and all(run_ids)  # two rounds of two task runs
    deadline, seen = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        seen = _task_runs(run_ids)
        if len(seen) == len(run_ids):
            break
        time.sleep(1)
    assert {(name, tuple(seen.get(run_id, ()))) for name, run_id in ticks} == {
        ("bench-0000", ("deployment:bench-0000", "fleet")),
        ("bench-0001", ("deployment:bench-0001", "fleet")),
    }
