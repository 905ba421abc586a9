"""`planner capacity`: what one GPU and one engine of a profile serve under SLA targets.

An SLA the profile cannot meet has no capacity: the command then prints no sizes but one line naming each target
that cannot be met and the best latency the profile reaches, and exits 1 (2 stays for bad input). With `--json`
it exits 0 so scripts can read the answer: `"feasible": false`, the reasons in `"unreachable"`, and the sizing
fields (requests/s per GPU; replicas) null; the latency fields then hold the best the profile reaches.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the bench module loads the simulator; only the name is needed here
    from planner_core.lab.sim.bench import TraceSizingRow

# Exit status when the SLA cannot be met (without --json): not an input error (2), but not an answer either.
EXIT_SLA_UNREACHABLE = 1


def _unreachable(name: str, target_ms: float, best_ms: float, where: str) -> str:
    """One target that no operating point meets, with the best latency reached (NaN: no capacity at all)."""
    if math.isnan(best_ms):
        return f"{name} <= {target_ms:g} ms is unreachable (no operating point {where})"
    return f"{name} <= {target_ms:g} ms is unreachable (the best is {best_ms:.3g} ms {where})"


def cmd_capacity(args: argparse.Namespace) -> int:
    import json

    from planner_core.perf.profile import estimate_engine_capacity, load_profile

    if args.trace is not None:
        return _trace_capacity(args)
    if args.isl is None or args.osl is None:
        raise ValueError("capacity: give --isl and --osl, or --trace FILE")

    capacity = estimate_engine_capacity(
        load_profile(args.profile),
        isl=args.isl,
        osl=args.osl,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        prefill_gpus_per_engine=args.prefill_gpus,
        decode_gpus_per_engine=args.decode_gpus,
    )
    figures = capacity.to_json_dict()
    unreachable = []
    if not capacity.prefill_sla_met:
        where = f"at ISL {args.isl:g}, batch 1 without queueing"
        unreachable.append(_unreachable("TTFT", args.ttft_ms, capacity.prefill_ttft_ms, where))
    if not capacity.decode_sla_met:
        where = f"at context {args.isl + args.osl / 2:g} tokens"
        unreachable.append(_unreachable("ITL", args.itl_ms, capacity.decode_itl_ms, where))
    if args.json:
        if unreachable:
            figures["requests_per_s_per_gpu"] = None  # no rate serves the SLA
        print(json.dumps({**figures, "feasible": not unreachable, "unreachable": unreachable}))
        return 0
    if unreachable:
        print(f"planner: error: no capacity meets the SLA: {'; '.join(unreachable)}", file=sys.stderr)
        return EXIT_SLA_UNREACHABLE
    print(
        f"Profile {args.profile}: ISL {args.isl:g}, OSL {args.osl:g}, "
        f"TTFT <= {args.ttft_ms:g} ms, ITL <= {args.itl_ms:g} ms"
    )
    sla = {True: "meets", False: "MISSES"}
    print(
        f"  prefill: {figures['prefill_tokens_per_s_per_gpu']:,.0f} tokens/s/GPU at TTFT "
        f"{figures['prefill_ttft_ms']:.1f} ms ({sla[capacity.prefill_sla_met]} the target); "
        f"{capacity.prefill_engine_rps:.2f} requests/s per engine"
    )
    print(
        f"  decode:  {figures['decode_tokens_per_s_per_gpu']:,.0f} tokens/s/GPU "
        f"at ITL {figures['decode_itl_ms']:.2f} ms "
        f"({sla[capacity.decode_sla_met]} the target), KV usage {100 * capacity.decode_kv_usage:.1f}%; "
        f"{capacity.decode_engine_rps:.2f} requests/s per engine"
    )
    print(f"  one prefill GPU + one decode GPU serve {figures['requests_per_s_per_gpu']:.2f} requests/s")
    return 0


def _trace_capacity(args: argparse.Namespace) -> int:
    """`planner capacity --trace`: what a trace needs at its mean lengths and at a length percentile."""
    import dataclasses
    import json

    from planner_core.config import parse_config
    from planner_core.lab.sim.bench import trace_sizing
    from planner_core.perf.model import ProfilePerfModel
    from planner_core.traces import load_trace

    trace = load_trace(args.trace)
    if args.rate_scale != 1.0:
        trace = trace.scaled(args.rate_scale)
    config = parse_config(
        {
            "optimization_target": "sla",
            "ttft_ms": args.ttft_ms,
            "itl_ms": args.itl_ms,
            "prefill_engine_num_gpu": args.prefill_gpus,
            "decode_engine_num_gpu": args.decode_gpus,
        },
        "--ttft-ms/--itl-ms/--prefill-gpus/--decode-gpus",
    ).policy
    rows = trace_sizing(
        trace, config, ProfilePerfModel.load(args.profile), window_s=args.window_s, quantile=args.quantile
    )
    problems = {id(row): _row_problems(row, args) for row in rows}
    if args.json:
        print(json.dumps([_row_json(dataclasses.asdict(row), problems[id(row)]) for row in rows]))
        return 0
    print(
        f"{trace.source}: {trace.num_requests} requests over {trace.duration_s / 3600:.2f} h; "
        f"TTFT <= {args.ttft_ms:g} ms, ITL <= {args.itl_ms:g} ms; rate mean {rows[0].mean_rps:.2f} req/s, "
        f"busiest {args.window_s:g} s window {rows[0].peak_rps:.2f} req/s"
    )
    print(
        f"  {'sizing':<7}{'algorithm':<17}{'ISL':>7}{'OSL':>6}{'P req/s/eng':>13}{'D req/s/eng':>13}"
        f"{'mean P+D':>10}{'peak P+D':>10}"
    )
    for row in rows:
        shape = f"  {row.sizing:<7}{row.algorithm:<17}{row.isl:>7.0f}{row.osl:>6.0f}"
        if problems[id(row)]:  # no sizes: the closest operating point's would read as an answer
            print(f"{shape}  {'; '.join(problems[id(row)])}")
            continue
        print(
            f"{shape}{row.prefill_rps_per_engine:>13.2f}"
            f"{row.decode_rps_per_engine:>13.2f}{f'{row.prefill_replicas_mean}+{row.decode_replicas_mean}':>10}"
            f"{f'{row.prefill_replicas_peak}+{row.decode_replicas_peak}':>10}"
        )
    missed = [row for row in rows if problems[id(row)]]
    if missed:
        first = missed[0]
        print(
            f"planner: error: the SLA is unreachable for {len(missed)} of {len(rows)} sizings "
            f"(e.g. {first.sizing} {first.algorithm}: {'; '.join(problems[id(first)])})",
            file=sys.stderr,
        )
        return EXIT_SLA_UNREACHABLE
    return 0


def _row_problems(row: TraceSizingRow, args: argparse.Namespace) -> list[str]:
    """The targets a trace-sizing row misses, one phrase each (empty when it meets both)."""
    problems = []
    if not row.prefill_sla_met:
        problems.append(_unreachable("TTFT", args.ttft_ms, row.prefill_latency_ms, f"at ISL {row.isl:.0f}"))
    if not row.decode_sla_met:
        where = f"at ISL {row.isl:.0f} / OSL {row.osl:.0f}"
        problems.append(_unreachable("ITL", args.itl_ms, row.decode_latency_ms, where))
    return problems


def _row_json(row: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """A trace-sizing row for --json: its fields, `feasible`, `unreachable`, and null replicas when infeasible."""
    if problems:
        for key in ("prefill_replicas_mean", "decode_replicas_mean", "prefill_replicas_peak", "decode_replicas_peak"):
            row[key] = None
    for key in ("prefill_latency_ms", "decode_latency_ms"):
        if math.isnan(row[key]):
            row[key] = None  # JSON has no NaN
    return {**row, "feasible": not problems, "unreachable": problems}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the capacity command group's parsers."""
    capacity = sub.add_parser("capacity", help="what one GPU and one engine of a profile serve under SLA targets")
    capacity.add_argument("--profile", type=Path, required=True, help="Dynamo profile folder (NPZ or JSON)")
    capacity.add_argument("--isl", type=float, help="input sequence length (tokens)")
    capacity.add_argument("--osl", type=float, help="output sequence length (tokens)")
    capacity.add_argument(
        "--trace", type=Path, default=None, help="instead of --isl/--osl: size a trace at its mean and a percentile"
    )
    capacity.add_argument("--window-s", type=float, default=180.0, help="with --trace: window for the peak rate")
    capacity.add_argument("--rate-scale", type=float, default=1.0, help="with --trace: multiply the request rate")
    capacity.add_argument("--quantile", type=float, default=90.0, help="with --trace: length percentile (default 90)")
    capacity.add_argument("--ttft-ms", type=float, required=True, help="TTFT target (ms)")
    capacity.add_argument("--itl-ms", type=float, required=True, help="ITL target (ms)")
    capacity.add_argument("--prefill-gpus", type=int, default=1, help="GPUs per prefill engine")
    capacity.add_argument("--decode-gpus", type=int, default=1, help="GPUs per decode engine")
    capacity.add_argument(
        "--json",
        action="store_true",
        help='print the figures as JSON, with "feasible": false (and exit 0) when the SLA cannot be met',
    )
    capacity.set_defaults(func=cmd_capacity)
