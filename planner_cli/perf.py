"""The perf models: `planner perf-accuracy`, `planner perf-table`, and `planner profile-json` (the SLO-aware
router's profiling files)."""

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

    from planner_cli.common import check_output_path

    check_output_path(args.out, "--out")  # before the estimates, not after them

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


TTFT_FILE = "ttft_profiling.json"
TPOT_FILE = "tpot_profiling.json"


def cmd_profile_json(args: argparse.Namespace) -> int:
    """Write the SLO-aware router's TTFT and TPOT profiling files (`planner_core.routing.profiling`), both or
    neither (each to a temporary file first, then renamed)."""
    import datetime as dt
    import json
    import os
    import tempfile

    from planner_core.routing.profiling import tpot_profile_to_json, ttft_profile_to_json
    from planner_core.routing.tables import tables_from_dynamo_profile, tables_from_forward_model

    metadata = {
        "model": args.model or "unknown",
        "timestamp": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
    }
    if args.source == "dynamo":
        from planner_core.perf.profile import load_profile

        profile = load_profile(args.profile)
        metadata["description"] = (
            f"from the Dynamo profile {profile.source_dir} (TPOT read off its decode interpolation)"
        )
        ttft, tpot = tables_from_dynamo_profile(profile, metadata=metadata)
    else:
        from planner_core.perf.model import ProfilePerfModel

        fwd = ProfilePerfModel.load(args.profile, perf_table=args.perf_table).forward_pass_model()
        if fwd is None:
            raise ValueError(f"--profile {args.profile}: no forward-pass model to time the simulated engines with")
        source = args.perf_table if args.perf_table is not None else args.profile
        metadata["description"] = (
            f"the simulated engines' timing (forward-pass model of {source}), prefill chunked at "
            f"{args.max_num_batched_tokens} tokens; deterministic, so mean = p50 = p95 = p99"
        )
        ttft, tpot = tables_from_forward_model(fwd, chunk_tokens=args.max_num_batched_tokens, metadata=metadata)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for name, content in ((TTFT_FILE, ttft_profile_to_json(ttft)), (TPOT_FILE, tpot_profile_to_json(tpot))):
            fd, tmp = tempfile.mkstemp(dir=args.out_dir, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(content, handle, indent=1)
                handle.write("\n")
            written.append((tmp, args.out_dir / name))
        for tmp, final in written:
            os.replace(tmp, final)
    finally:
        for tmp, _ in written:
            if os.path.exists(tmp):
                os.unlink(tmp)
    print(
        f"{args.out_dir / TTFT_FILE}: {len(ttft.points)} prompt lengths; {args.out_dir / TPOT_FILE}: "
        f"{len(tpot.points)} batch-size x tokens-per-request points"
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

    profile_json = sub.add_parser(
        "profile-json", help="write the SLO-aware router's TTFT and TPOT profiling files (p50 tables)"
    )
    profile_json.add_argument(
        "--from", dest="source", choices=("dynamo", "sim"), default="sim",
        help="dynamo: the Dynamo profile's measurements; sim: the simulated engines' timing (their forward-pass "
        "model, as `planner bench` runs them)",
    )  # fmt: skip
    profile_json.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="Dynamo profile folder")
    profile_json.add_argument(
        "--perf-table", type=Path, default=None, help="with --from sim: time the engines with this perf table"
    )
    profile_json.add_argument(
        "--max-num-batched-tokens", type=int, default=8192, help="with --from sim: the engines' prefill chunk"
    )
    profile_json.add_argument("--model", default=None, help="model name for the files' metadata")
    profile_json.add_argument(
        "--out-dir", type=Path, required=True, help=f"folder to write {TTFT_FILE} and {TPOT_FILE} into"
    )
    profile_json.set_defaults(func=cmd_profile_json)
