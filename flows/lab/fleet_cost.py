# ruff: noqa: T201  (a benchmark script reports on stdout)
"""The fleet-tick flow's cost on a real Prefect server, by hand: `python -m flows.lab.fleet_cost N ROUNDS
[one]` (with `one`: `--one-task`, the whole round as one task run).

Creates a fresh database on the planner's Postgres server (dropped at the end), registers N members running the
recommended policy with the load loop on, starts a local Prefect server with its own home, runs one warm-up round
and then ROUNDS rounds back to back on simulated 5 s slots, and prints the rounds' wall times and the CPU per
member tick of this process and of the Prefect server's processes. No forward-pass data is stored, so the load
ticks hold on `no_fpm_data`: the figures measure the orchestration, not the decisions.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil


def _cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def main(num_members: int, num_rounds: int, one_task: bool) -> dict:
    home = tempfile.mkdtemp(prefix="prefect-home-")
    os.environ["PREFECT_HOME"] = home
    os.environ.pop("PREFECT_API_URL", None)
    from planner_core.lab.fleet_bench import BENCH_EPOCH, bench_config
    from planner_core.runtime.fleet import add_member, set_budget
    from planner_core.runtime.store.db import session_factory
    from planner_core.runtime.store.migrate import scratch_database

    with scratch_database("fleet_prefect") as url:
        config = bench_config(Path(tempfile.mkdtemp()), 5.0)
        with session_factory(url).begin() as session:
            for index in range(num_members):
                add_member(session, f"bench-{index:04d}", config, min_gpus=2, priority=index % 3)
            set_budget(session, 3 * num_members)
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from flows.prefect_server import prefect_api

        with prefect_api(log_file=Path(home) / "server.log") as api, temporary_settings({PREFECT_API_URL: api}):
            from flows.fleet import run_fleet_tick

            per_member = not one_task
            run_fleet_tick(BENCH_EPOCH - dt.timedelta(seconds=5), url, 4, task_per_member=per_member)  # warm-up
            me = psutil.Process()
            server = me.children(recursive=True)
            cpu_before, server_before, wall_before = sum(me.cpu_times()[:2]), _cpu_s(server), time.perf_counter()
            walls, num_ticks = [], 0
            for index in range(num_rounds):
                began = time.perf_counter()
                at = BENCH_EPOCH + dt.timedelta(seconds=5 * index)
                out = run_fleet_tick(at, url, 4, task_per_member=per_member)
                walls.append(round(time.perf_counter() - began, 3))
                num_ticks += out["num_ticked"] if one_task else len(out["ticks"])
                if out["failed"]:
                    raise RuntimeError(f"round {index}: {out['failed']}")
            cpu_s, server_s = sum(me.cpu_times()[:2]) - cpu_before, _cpu_s(server) - server_before
        return {
            "members": num_members,
            "one_task": one_task,
            "rounds": num_rounds,
            "member_ticks": num_ticks,
            "wall_s": time.perf_counter() - wall_before,
            "round_wall_s": walls,
            "cpu_ms_per_member_tick_flow_process": 1000 * cpu_s / max(1, num_ticks),
            "cpu_ms_per_member_tick_prefect_server": 1000 * server_s / max(1, num_ticks),
        }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "one"), indent=1))
