# ruff: noqa: T201  (a profiling script reports on stdout)
"""Where a fleet round's CPU goes, by hand: `python -m flows.lab.fleet_profile MODE N DURATION_S OUT`.

cProfile with the thread's CPU clock (`time.thread_time`, so waits on Postgres or the Prefect server do not count)
around each round of `run_fleet_bench` (N members, DURATION_S of simulated time, rounds back to back):

- `direct`: `run_round` with the member ticks inline in the profiled thread (the whole round);
- `prefect` / `permember`: the `fleet-tick` flow (one task run per round / a task run per member tick) on a local
  Prefect server; the member ticks run on the flow's threads, so what the profile shows is Prefect's engines and
  the round's own work (due ticks, arbitration, executions).

Writes OUT.prof (pstats) and OUT.txt (the top functions by cumulative and own time) and prints one JSON line.
"""

from __future__ import annotations

import concurrent.futures
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path


class _Inline(concurrent.futures.Executor):
    """An executor that runs `map` in the calling thread (the profiled one)."""

    def map(self, fn, *iterables, **_):
        return [fn(*args) for args in zip(*iterables, strict=True)]


def main(mode: str, num_members: int, duration_s: float, out: Path) -> dict:
    if mode != "direct":
        os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="fleet-profile-prefect-")
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from planner_core.lab.fleet_bench import BENCH_EPOCH, bench_config, run_fleet_bench
    from planner_core.runtime.fleet import ContextCache, list_members, run_round
    from planner_core.runtime.store.db import session_factory
    from planner_core.runtime.store.migrate import scratch_database

    profile = cProfile.Profile(time.thread_time)

    def profiled(run):
        def round_runner(at):
            profile.enable()
            try:
                return run(at)
            finally:
                profile.disable()

        return round_runner

    with scratch_database("fleet_profile") as url:
        config = bench_config(Path(tempfile.mkdtemp()), 5.0)
        if mode == "direct":
            cache, loaded = ContextCache(url), {}

            def direct(at):
                if not loaded:
                    with session_factory(url).begin() as session:
                        loaded["members"] = list_members(session)
                    loaded["contexts"] = {m.name: cache.get(m) for m in loaded["members"]}
                return run_round(url, loaded["members"], loaded["contexts"], at, _Inline())

            result = run_fleet_bench(
                url, config, num_deployments=num_members, duration_s=duration_s, cache=cache,
                round_runner=profiled(direct),
            )  # fmt: skip
        else:
            from prefect.settings import PREFECT_API_URL, temporary_settings

            from flows.fleet import bench_round_runner, context_cache, run_fleet_tick
            from flows.prefect_server import prefect_api

            per_member = mode == "permember"
            with prefect_api() as api, temporary_settings(updates={PREFECT_API_URL: api}):
                run_fleet_tick(BENCH_EPOCH, url, 4, task_per_member=per_member)  # Prefect's start-up, not measured
                result = run_fleet_bench(
                    url, config, num_deployments=num_members, duration_s=duration_s, cache=context_cache(url),
                    round_runner=profiled(bench_round_runner(url, 4, task_per_member=per_member)),
                    task_per_member=per_member,
                )  # fmt: skip
    num_ticks = result.num_load_ticks + result.num_throughput_ticks
    profile.dump_stats(f"{out}.prof")
    with open(f"{out}.txt", "w") as report:
        stats = pstats.Stats(profile, stream=report)
        profiled_s = sum(entry[2] for entry in stats.stats.values())  # own times add up to the total
        stats.sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(40)
    return {
        "mode": mode,
        "ticks": num_ticks,
        "profiled_thread_cpu_s": profiled_s,
        "profiled_ms_per_tick": 1000 * profiled_s / max(1, num_ticks),
        "cpu_ms_per_deployment_tick": result.cpu_ms_per_deployment_tick,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]))))
