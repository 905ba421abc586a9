"""`planner live`: the planner scales Dynamo's own serving runtime (frontend + mocker engines, no GPU) under
aiperf's traffic, then the same traffic on a fixed-size pool; prints both runs side by side. The harness is the
lab's live room (`planner_core.lab.live`); this module parses the command and prints."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def cmd_live(args: argparse.Namespace) -> int:
    from planner_cli.common import data_subfolder
    from planner_core.lab.live import (
        LiveCancelled,
        LiveError,
        LiveOptions,
        binding_sla,
        fitting_speedup,
        parse_size_list,
        parse_sizes,
        run_live,
        summarize_runs,
    )

    args.out = data_subfolder(args.out, "live")
    if args.summarize:
        try:
            print(summarize_runs(args.out, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, record=args.record))
        except LiveError as exc:
            print(f"planner live: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.router == "slo" and args.mode == "disagg":
        # the proxy places each request on one engine of the namespace's generate endpoint: it knows no prefill pool
        print("planner live: --router slo: needs --mode agg (the SLO-aware proxy does not route to disaggregated "
              "prefill and decode pools yet)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        if args.speedup is None:
            args.speedup = fitting_speedup(args.traffic, start_s=args.trace_start_s, duration_s=args.duration_s)
    except LiveError as exc:
        print(f"planner live: {exc}", file=sys.stderr)
        return 2
    default_ttft_ms, default_itl_ms = binding_sla(args.slowdown)
    args.ttft_ms = default_ttft_ms if args.ttft_ms is None else args.ttft_ms
    args.itl_ms = default_itl_ms if args.itl_ms is None else args.itl_ms
    from planner_cli.common import stop_like_ctrl_c

    stop_like_ctrl_c()  # a stopped run stops its stack (each component is in a session of its own)
    try:
        fixed = DEFAULT_FIXED[args.mode] if args.fixed_size is None else args.fixed_size
        args.fixed_sizes = parse_size_list(fixed, args.mode, "--fixed-size")
        args.initial_prefill, args.initial_size = (
            (None, None) if args.initial_size is None else parse_sizes(args.initial_size, args.mode, "--initial-size")
        )
    except LiveError as exc:
        print(f"planner live: {exc}", file=sys.stderr)
        return 2
    fields = {f.name for f in dataclasses.fields(LiveOptions)} - {"argv"}
    options = LiveOptions(**{name: getattr(args, name) for name in fields}, argv=tuple(getattr(args, "argv", [])))
    try:
        table = run_live(options)
    except LiveError as exc:
        print(f"planner live: {exc}", file=sys.stderr)
        return 2
    except LiveCancelled as exc:  # asked to stop: not a failure, and nothing of the run left running
        print(
            f"planner live: stopped; {exc}, its components stopped (runs finished before it: planner live "
            f"--summarize --out {args.out})",
            file=sys.stderr,
        )
        return 0
    except KeyboardInterrupt:  # stopped before or between the runs: nothing of a run is running
        print("planner live: stopped", file=sys.stderr)
        return 0
    print(table, end="")
    return 0


# The fixed-size runs' engines by default: the default day's smallest aggregated size meeting 99 %; disaggregated,
# the frontier of the default traffic (the conversation hour in 900 s, every 6th request, engines slowed 16 times):
# 2p1d, the cheapest pair meeting 99 %, and 1p1d one prefill engine fewer (docs/results/live/, 2026-12-07)
DEFAULT_FIXED = {"agg": "2", "disagg": "2:1,1:1"}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the live command's parser."""
    live = sub.add_parser("live", help="scale Dynamo's frontend + mocker engines under aiperf traffic; compare")
    live.add_argument(
        "--out", type=Path, default=None, help="folder of the runs (default: PLANNER_DATA_DIR/live, .planner/live)"
    )
    live.add_argument("--duration-s", type=float, default=900.0, help="traffic per run (s)")
    live.add_argument(
        "--traffic",
        choices=("conv", "code", "mooncake", "day"),
        default="conv",
        help="a recorded trace as recorded, --speedup times faster, every --keep-every-th request (conv: the Azure "
        "conversation hour; code: the Azure code hour; mooncake: Mooncake's trace, with its prefix blocks), or day: "
        "the conversation hour's requests under one synthetic day's load cycle (--peak-rps, --trough-ratio)",
    )
    live.add_argument("--peak-rps", type=float, default=2.0, help="day: the cycle's peak request rate (req/s)")
    live.add_argument(
        "--trough-ratio", type=float, default=0.125, help="day: the night's rate as a fraction of the peak"
    )
    live.add_argument(
        "--speedup",
        type=float,
        default=None,
        help="the policy's time constants are divided by this (recorded traces: their time compression too); "
        "default: the recorded trace from --trace-start-s to its end in --duration-s (the conversation hour in "
        "900 s: 3.89), day: 6",
    )
    live.add_argument("--keep-every", type=int, default=6, help="recorded traces: keep every N-th request")
    live.add_argument("--trace-start-s", type=float, default=0.0, help="recorded traces: offset into the trace (s)")
    live.add_argument("--max-isl", type=int, default=2048, help="cap on prompt tokens")
    live.add_argument("--max-osl", type=int, default=256, help="cap on output tokens")
    live.add_argument(
        "--slowdown",
        type=float,
        default=16.0,
        help="engines (mocker and the planner's model) this many times slower than the H200 profile (16: the "
        "default traffic needs two prefill engines)",
    )
    live.add_argument(
        "--ttft-ms",
        type=float,
        default=None,
        help="TTFT SLA (ms); default: Dynamo's 500 ms times --slowdown (with --summarize: the runs' own)",
    )
    live.add_argument(
        "--itl-ms",
        type=float,
        default=None,
        help="ITL SLA (ms); default: Dynamo's 50 ms times --slowdown (with --summarize: the runs' own)",
    )
    live.add_argument(
        "--interval-s",
        type=float,
        default=None,
        help="throughput adjustment interval (default: the recommended policy's, divided by --speedup)",
    )
    live.add_argument("--max-workers", type=int, default=4, help="GPU budget (one GPU per engine)")
    live.add_argument(
        "--mode",
        choices=("disagg", "agg"),
        default="disagg",
        help="disagg: prefill and decode mocker engines, each pool scaled by the planner; agg: one aggregated pool",
    )
    live.add_argument(
        "--fixed-size",
        default=None,
        metavar="P:D|N",
        help="engines of the fixed-size run: P:D prefill:decode with --mode disagg (default "
        f"{DEFAULT_FIXED['disagg']}), N aggregated with --mode agg (default {DEFAULT_FIXED['agg']}: the default day's "
        "smallest size meeting 99 %%); several, comma-separated, run one after the other (1:1,1:2,2:2: the frontier "
        "for the binding check); 0 or 0:0 = no such run",
    )
    live.add_argument(
        "--initial-size",
        default=None,
        metavar="P:D|N",
        help="engines running when the planner's run starts, as --fixed-size (default: --fixed-size, else 1)",
    )
    live.add_argument(
        "--cooldown-s", type=float, default=60.0, help="the planner keeps running this long after the traffic"
    )
    live.add_argument("--fixed-only", action="store_true", help="only the fixed-size run")
    live.add_argument(
        "--fixed-search",
        type=int,
        default=0,
        metavar="N",
        help="after the --fixed-size runs, up to N more fixed sizes, each chosen from the runs so far, until the "
        "record says which is the cheapest fixed size meeting 99 %% and whether one engine fewer in each pool misses "
        "(the SLA binds); a size that met nothing grows by an engine in the pool that missed more (default 0)",
    )
    live.add_argument("--summarize", action="store_true", help="only print the table of the runs already in --out")
    live.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the runs' figures with their command, commit and date to FILE (docs/results/live/)",
    )
    live.add_argument("--nice", type=int, default=10, help="niceness of the engines and aiperf")
    live.add_argument(
        "--router",
        choices=("round-robin", "slo"),
        default="round-robin",
        help="round-robin: the frontend's own router; slo: the frontend in direct mode behind `planner route-proxy`",
    )
    live.set_defaults(func=cmd_live)
