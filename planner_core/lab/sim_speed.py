"""How fast the cluster simulator replays a trace, alone and with the planner's decision core in the loop.

    python -m planner_core.lab.sim_speed [--trace FILE] [--rate-scale 10]
        [--config planner_core/configs/policies/planner.yaml] [--prefill 4 --decode 4] [--agg N]
        [--kv-allocation reserve|on_demand]

Alone: the trace (rate-scaled) on a fixed cluster of `--prefill` + `--decode` workers. With the planner: the
benchmark's planner policy (throughput ticks every minute, start-up delays on) from the config's minimum size.
`--agg N` adds a run of N aggregated engines. `--kv-allocation` is the engines'
`SimSpec.kv_allocation`. Prints the wall time of each run, the requests served, the peak
number of ready workers and mean TTFT / ITL.
"""

# ruff: noqa: T201 - a command-line script: printing is its output

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from planner_core.config import load_config, resolve_profile_dir
from planner_core.data import AZURE_CONV_TRACE, DEFAULT_CONFIG
from planner_core.domain import EngineLimits
from planner_core.lab.sim.bench import FixedPolicy, PlannerPolicy, run_policy
from planner_core.lab.sim.des import KvAllocation, SimSpec
from planner_core.perf.profile import load_profile
from planner_core.perf.profile_forward import ProfileForwardPassModel
from planner_core.planner import build_planner
from planner_core.traces import load_trace

DEFAULT_TRACE = AZURE_CONV_TRACE


def main(argv: list[str] | None = None) -> int:
    """Time each run and print one line per policy; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--rate-scale", type=float, default=10.0)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--prefill", type=int, default=4)
    parser.add_argument("--decode", type=int, default=4)
    parser.add_argument("--agg", type=int, default=0, help="also run this many aggregated engines")
    parser.add_argument("--kv-allocation", type=KvAllocation, choices=list(KvAllocation), default=KvAllocation.RESERVE)
    args = parser.parse_args(argv)

    config = load_config(args.config).policy
    profile_dir = resolve_profile_dir(config, args.config)
    fwd = ProfileForwardPassModel.from_engine_profile(load_profile(profile_dir))
    trace = load_trace(args.trace).scaled(args.rate_scale)
    limits = EngineLimits(max_kv_tokens=fwd.max_kv_tokens)
    spec = SimSpec(prefill_limits=limits, decode_limits=limits, kv_allocation=args.kv_allocation)
    print(f"{trace.source}: {trace.num_requests} requests over {trace.duration_s / 60:.0f} min")
    policies = [
        FixedPolicy(name=f"fixed {args.prefill}P{args.decode}D", num_prefill=args.prefill, num_decode=args.decode),
        PlannerPolicy(name="planner", planner=build_planner(config, args.config)),
    ]
    runs = [(policy, spec) for policy in policies]
    if args.agg:
        agg = FixedPolicy(name=f"fixed {args.agg} agg", num_prefill=0, num_decode=args.agg)
        runs.append((agg, SimSpec(decode_limits=limits, aggregated=True, kv_allocation=args.kv_allocation)))
    for policy, run_spec in runs:
        started = time.perf_counter()
        run = run_policy(policy, trace, fwd, run_spec, ttft_ms=config.ttft_ms, itl_ms=config.itl_ms)
        wall_s = time.perf_counter() - started
        peak = max(p + d for _, p, d in run.result.worker_timeline)
        served = int(np.isfinite(run.result.finish_s).sum())
        print(
            f"{policy.name:>14}: {wall_s:6.1f} s wall, {served} served, peak {peak} ready workers, "
            f"mean TTFT {run.row.ttft_ms_mean:.0f} ms, mean ITL {run.row.itl_ms_mean:.1f} ms, "
            f"{run.row.gpu_hours:.1f} GPU-h"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
