"""`planner capacity`: what one GPU and one engine of a profile serve under SLA targets."""

from __future__ import annotations

import argparse
from pathlib import Path


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
    if args.json:
        print(json.dumps(figures))
        return 0
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
    if args.json:
        print(json.dumps([dataclasses.asdict(row) for row in rows]))
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
        print(
            f"  {row.sizing:<7}{row.algorithm:<17}{row.isl:>7.0f}{row.osl:>6.0f}{row.prefill_rps_per_engine:>13.2f}"
            f"{row.decode_rps_per_engine:>13.2f}{f'{row.prefill_replicas_mean}+{row.decode_replicas_mean}':>10}"
            f"{f'{row.prefill_replicas_peak}+{row.decode_replicas_peak}':>10}"
        )
    return 0


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
    capacity.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    capacity.set_defaults(func=cmd_capacity)
