"""The fleet bench room: N simulated deployments ticked by one control plane, measured (`planner fleet bench`).
The benchmark is `bench` (its docstring tells what it plays and measures); with Prefect in the loop, the rounds
run as `fleet-tick` flow runs from `flows.lab.fleet_bench` (the lab never imports the flows)."""

from planner_core.lab.fleet_bench.bench import (
    BENCH_EPOCH,
    LOAD_PERIOD_S,
    FleetBenchResult,
    FleetBenchShape,
    bench_config,
    process_tree_cpu_s,
    run_fleet_bench,
)

__all__ = [
    "BENCH_EPOCH",
    "LOAD_PERIOD_S",
    "FleetBenchResult",
    "FleetBenchShape",
    "bench_config",
    "process_tree_cpu_s",
    "run_fleet_bench",
]
