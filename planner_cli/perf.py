"""The perf models: `planner perf-accuracy` and `planner perf-table`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from planner_cli.common import DEFAULT_PROFILE


def cmd_perf_accuracy(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from planner_core.lab.perf_accuracy import accuracy_report, format_report
    from planner_core.perf.profile import load_profile

    report = accuracy_report(
        load_profile(args.profile), isl=args.isl, osl=args.osl, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms
    )
    if args.json:
        print(json.dumps(dataclasses.asdict(report)))
        return 0
    print("\n".join(format_report(report)))
    return 0


def cmd_perf_table(args: argparse.Namespace) -> int:
    """Precompute a perf table with aiconfigurator (one estimate per grid point) and write it atomically."""
    import shlex

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.lab.aic import PerfTableSpec, build_perf_table, parse_grid, resolve_aic_python, write_perf_table

    if args.tp < 1:
        raise ValueError(f"--tp {args.tp}: must be >= 1")
    grids = {
        "isl_grid": ("--isl-grid", args.isl_grid),
        "prefill_batch_grid": ("--prefill-batch-grid", args.prefill_batch_grid),
        "decode_batch_grid": ("--batch-grid", args.batch_grid),
        "ctx_grid": ("--ctx-grid", args.ctx_grid),
    }
    spec = PerfTableSpec(
        model=args.model,
        system=args.system,
        backend=args.backend,
        tp=args.tp,
        backend_version=args.backend_version,
        aic_model=args.aic_model,
        gemm_quant=args.gemm_quant,
        kvcache_quant=args.kvcache_quant,
        fmha_quant=args.fmha_quant,
        **{name: parse_grid(option, text) for name, (option, text) in grids.items() if text is not None},
    )
    aic_python = resolve_aic_python(args.aic_python)
    num_calls = len(spec.calls())
    command = shlex.join(["planner", "perf-table", *sys.argv[2:]]) if len(sys.argv) > 1 else None
    console = Console(stderr=True)
    columns = (TextColumn("aiconfigurator"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    started = time.perf_counter()
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("estimates", total=num_calls)
        table = build_perf_table(
            spec, aic_python=aic_python, command=command, on_estimate=lambda _estimate: bar.advance(task)
        )
    write_perf_table(table, args.out)
    elapsed_s = time.perf_counter() - started
    header = table.header
    precision = ", ".join(f"{part} {mode}" for part, mode in header.precision)
    print(
        f"{args.out}: {header.model} on {header.system} {header.backend} {header.backend_version} TP{header.tp} "
        f"({precision}); {table.num_points} points from aiconfigurator {header.aiconfigurator_version} "
        f"in {elapsed_s:.1f} s"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the perf command group's parsers."""
    accuracy = sub.add_parser(
        "perf-accuracy", help="how well the perf models reproduce and predict a profile, and their engine capacity"
    )
    accuracy.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="Dynamo profile folder (NPZ or JSON)")
    accuracy.add_argument("--isl", type=float, default=3000, help="capacity comparison: ISL (tokens)")
    accuracy.add_argument("--osl", type=float, default=300, help="capacity comparison: OSL (tokens)")
    accuracy.add_argument("--ttft-ms", type=float, default=200, help="capacity comparison: TTFT target (ms)")
    accuracy.add_argument("--itl-ms", type=float, default=10, help="capacity comparison: ITL target (ms)")
    accuracy.add_argument("--json", action="store_true", help="print the report as one JSON object")
    accuracy.set_defaults(func=cmd_perf_accuracy)

    perf_table = sub.add_parser(
        "perf-table", help="precompute a perf table (forward-pass times) with aiconfigurator, offline"
    )
    perf_table.add_argument("--model", required=True, help="Hugging Face id of the served model (table header)")
    perf_table.add_argument("--system", required=True, help="aiconfigurator system, e.g. h200_sxm, h100_sxm")
    perf_table.add_argument("--backend", default="vllm", help="vllm, sglang or trtllm (default vllm)")
    perf_table.add_argument(
        "--backend-version", default=None, help="aiconfigurator database version (default: its current)"
    )
    perf_table.add_argument("--tp", type=int, default=1, help="tensor-parallel size of one engine")
    perf_table.add_argument(
        "--aic-model", default=None, help="model aiconfigurator is asked about, if not --model (same architecture)"
    )
    perf_table.add_argument(
        "--gemm-quant", default=None, help="aiconfigurator GEMM quant mode, e.g. fp8 (default: inferred)"
    )
    perf_table.add_argument("--kvcache-quant", default=None, help="KV-cache quant mode, e.g. fp8 (default: inferred)")
    perf_table.add_argument("--fmha-quant", default=None, help="attention quant mode (default: inferred)")
    perf_table.add_argument(
        "--isl-grid", default=None, help="prefill prompt lengths, comma-separated (default 128..32768)"
    )
    perf_table.add_argument(
        "--prefill-batch-grid", default=None, help="prefill batch sizes starting at 1 (default 1,2,4,8)"
    )
    perf_table.add_argument("--batch-grid", default=None, help="decode batch sizes (default 1..2048, powers of two)")
    perf_table.add_argument("--ctx-grid", default=None, help="decode context lengths per sequence (default 128..32768)")
    perf_table.add_argument("--out", type=Path, required=True, help="table file to write (JSON)")
    perf_table.add_argument(
        "--aic-python", default=None, help="interpreter with aiconfigurator (default: this one, if it has it)"
    )
    perf_table.set_defaults(func=cmd_perf_table)
