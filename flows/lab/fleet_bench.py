"""The fleet benchmark with Prefect in the loop (`planner fleet bench --prefect`): every round of
`planner_core.lab.fleet_bench.run_fleet_bench` runs as a `fleet-tick` flow run on a Prefect server this process
started, whose CPU is counted too."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from flows.fleet import bench_round_runner, context_cache, run_fleet_tick
from flows.prefect_server import prefect_api, started_server_pid
from planner_core.lab.fleet_bench import (
    BENCH_EPOCH,
    FleetBenchResult,
    FleetBenchShape,
    process_tree_cpu_s,
    run_fleet_bench,
)


def bench_with_prefect(
    url: str, config: Path, shape: FleetBenchShape, *, task_per_member: bool = False
) -> FleetBenchResult:
    """The benchmark with every round a `fleet-tick` flow run on the Prefect server `prefect_api` gives (started
    here unless `PREFECT_API_URL` names one this process started), that server's process tree counted too."""
    import psutil
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = Path(os.environ.get("PREFECT_HOME", "."))
    with prefect_api(log_file=home / "server.log") as api, temporary_settings(updates={PREFECT_API_URL: api}):
        pid = started_server_pid()
        if pid is None:
            raise RuntimeError(f"the Prefect server at {api} is not this process's: its CPU cannot be counted")
        server = psutil.Process(pid)
        # One flow run before the members exist: Prefect's first run (imports, the flow's registration, the
        # server's first requests) is not part of what a round costs.
        run_fleet_tick(BENCH_EPOCH, url, shape.max_concurrent, task_per_member=task_per_member)
        try:
            return run_fleet_bench(
                url,
                config,
                **shape.as_kwargs(),
                cache=context_cache(url),
                round_runner=bench_round_runner(url, shape.max_concurrent, task_per_member=task_per_member),
                extra_cpu_s=lambda: process_tree_cpu_s(server),
                prefect=True,
                task_per_member=task_per_member,
            )
        finally:
            _drain_prefect_clients()


def _drain_prefect_clients(timeout_s: float = 30.0) -> None:
    """Send the run events and logs still queued in this process while the bench's Prefect server is up: left for
    the interpreter's exit, they are sent to a stopped server and the exit waits on them without end (seen after a
    100-deployment run)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (EventsWorker, APILogWorker):
        with contextlib.suppress(Exception):
            service.drain_all(timeout=timeout_s)
