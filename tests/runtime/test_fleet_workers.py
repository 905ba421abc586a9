"""The fleet on Prefect's own scale-out: `prefect.yaml`'s `fleet` deployment on a process work pool, run by two real
Prefect workers at once. Flow runs of the same slots are queued twice over; whichever worker takes a run, each
member's slot is ticked exactly once (the slot is the tick's identity, and each tick holds its deployment's row
lock), every run completes, and both workers take runs.

About a minute and a half on a 2-core machine (each flow run is a fresh Python process of the worker's), so it
runs only with PLANNER_WORKER_TESTS=1: `make test-workers`.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from planner_core.runtime.fleet import add_member
from planner_core.runtime.store.db import session_factory, to_libpq_uri
from tests.conftest import REPO_ROOT, write_config

pytestmark = [
    pytest.mark.prefect,
    pytest.mark.skipif(
        not os.environ.get("PLANNER_WORKER_TESTS"),
        reason="a minute or two with two Prefect process workers: run `make test-workers` (PLANNER_WORKER_TESTS=1)",
    ),
]

SLOTS = [dt.datetime(2026, 3, 1, 12, minute, tzinfo=dt.UTC) for minute in (0, 1)]  # throughput slots (60 s)
RUNS_PER_SLOT = 2
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _prefect(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    prefect_bin = str(Path(sys.executable).parent / "prefect")
    result = subprocess.run(
        [prefect_bin, "--no-prompt", *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


def test_two_process_workers_share_the_fleet_without_ticking_a_slot_twice(
    prefect_api_url, database_url, tmp_path, profile_dir
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    pool = f"planner-fleet-test-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ, "PREFECT_API_URL": prefect_api_url, "PLANNER_DATABASE_URL": database_url,
        "PLANNER_CODE_DIR": str(REPO_ROOT), "PYTHONPATH": str(REPO_ROOT),
    }  # fmt: skip
    config = write_config(tmp_path)
    with session_factory(database_url).begin() as session:
        for name in ("alpha", "beta", "gamma"):
            add_member(session, name, config)
    _prefect(env, "work-pool", "create", pool, "--type", "process")
    # no limit on runs in flight here (prefect.yaml's 2, CANCEL_NEW, would cancel some of the duplicates this test
    # wants running side by side)
    _prefect(env, "deploy", "--prefect-file", "prefect.yaml", "--name", "fleet", "--pool", pool, "--concurrency-limit",
             "10")  # fmt: skip
    workers, logs = [], []
    try:
        import asyncio

        async def queue_runs() -> tuple[str, list[str]]:
            async with get_client() as client:
                deployment = await client.read_deployment_by_name("fleet-tick/fleet")
                await client.pause_deployment(deployment.id)  # only the runs queued here (fixed slots)
                ids = []
                for slot in SLOTS:
                    for _ in range(RUNS_PER_SLOT):
                        run = await client.create_flow_run_from_deployment(
                            deployment.id, parameters={"scheduled_at": slot.isoformat(), "task_per_member": False}
                        )
                        ids.append(str(run.id))
                return str(deployment.id), ids

        deployment_id, run_ids = asyncio.run(queue_runs())
        for number in (1, 2):
            log_path = tmp_path / f"worker{number}.log"
            logs.append(log_path)
            workers.append(
                subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "prefect"),
                        "worker",
                        "start",
                        "--pool",
                        pool,
                        "--name",
                        f"worker-{number}",
                        "--limit",
                        "1",
                    ],
                    env=env,
                    cwd=REPO_ROOT,
                    stdout=log_path.open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            )

        async def states() -> dict[str, str]:
            async with get_client() as client:
                runs = await client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[uuid.UUID(deployment_id)]))
                )
                return {str(r.id): r.state.type.value for r in runs if str(r.id) in run_ids}

        deadline = time.monotonic() + 600
        while True:
            found = asyncio.run(states())
            if len(found) == len(run_ids) and set(found.values()) <= TERMINAL:
                break
            assert time.monotonic() < deadline, f"flow runs not finished in 600 s: {found}"
            assert all(w.poll() is None for w in workers), [p.read_text()[-2000:] for p in logs]
            time.sleep(2)
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
    assert set(found.values()) == {"COMPLETED"}, found
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ticks = conn.execute(
            """SELECT d.name, t.loop, t.scheduled_at, count(*) FROM ticks t JOIN deployments d ON d.id = t.deployment_id
                GROUP BY 1, 2, 3 ORDER BY 1, 3"""
        ).fetchall()
    assert [(name, loop, at) for name, loop, at, _ in ticks] == [
        (name, "throughput", slot) for name in ("alpha", "beta", "gamma") for slot in SLOTS
    ]
    assert all(count == 1 for *_, count in ticks), ticks  # two runs per slot: each member's slot ticked once
    submitted = [log.read_text().count("submitting flow run") for log in logs]
    assert sum(submitted) == len(run_ids) and all(n >= 1 for n in submitted), submitted
