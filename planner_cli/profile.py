"""`planner profile`: pre-deployment profiling.

- `--endpoint URL --model NAME --out DIR`: measure a running OpenAI-compatible engine (prefill TTFT by prompt
  length, decode ITL by batch and context), write Dynamo's profile layout and its plots; resumable.
- `--round-trip --out DIR`: bring up Dynamo's frontend and one aggregated mocker engine timed by the shipped H200
  profile (slowed `--slowdown` times, as `planner live` runs it), profile it over HTTP as above, compare the
  measured profile with its source at the measured points and run `planner capacity` on both; writes
  `DIR/roundtrip.json`.
- `--aic --gpu H200 --ttft-ms X --itl-ms Y --out DIR`: aiconfigurator estimates over a grid of parallel
  configurations; the best per role under the SLA, the runners-up, and the chosen configuration's profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _sweep(args: argparse.Namespace):
    from planner_core.perf.profiling import SweepSpec, parse_sweep_values

    values = {}
    for name, option in (
        ("prefill_isls", "--isls"),
        ("decode_batches", "--batches"),
        ("decode_contexts", "--contexts"),
    ):
        text = getattr(args, option[2:])
        if text is not None:
            values[name] = parse_sweep_values(option, text)
    return SweepSpec(
        prefill_repeats=args.prefill_repeats, decode_osl=args.decode_osl, decode_repeats=args.decode_repeats, **values
    )


def measure(args: argparse.Namespace, endpoint: str, out: Path, *, reference=None):
    """The sweep of `args` against `endpoint` (`planner_core.lab.profile.sweep.measure`); the measured EngineProfile."""
    from planner_core.lab.profile import measure as measure_engine

    return measure_engine(
        endpoint, args.model, out, sweep=_sweep(args), max_kv_tokens=args.max_kv_tokens,
        gpus_per_engine=args.gpus_per_engine, reference=reference,
    )  # fmt: skip


def cmd_profile(args: argparse.Namespace) -> int:
    from planner_cli.common import data_subfolder
    from planner_core.lab.profiler import ProfilerError

    args.out = data_subfolder(args.out, "profile")
    try:
        if args.aic:
            return _aic(args)
        if args.round_trip:
            return _round_trip(args)
        if args.endpoint is None or args.model is None:
            raise ValueError("profile: give --endpoint URL and --model NAME (or --round-trip, or --aic)")
        reference = None
        if args.reference is not None:
            from planner_core.perf.profile import load_profile

            reference = load_profile(args.reference)
        measure(args, args.endpoint, args.out, reference=reference)
    except ProfilerError as exc:
        print(f"planner profile: {exc}", file=sys.stderr)
        return 2
    return 0


def _round_trip(args: argparse.Namespace) -> int:
    from planner_core.lab.live import LiveError
    from planner_core.lab.profile import round_trip, round_trip_summary, round_trip_tools

    try:
        tools = round_trip_tools()
    except LiveError as exc:
        print(f"planner profile: {exc}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    report = round_trip(
        tools, out, slowdown=args.slowdown, nice=args.nice, sweep=_sweep(args), max_kv_tokens=args.max_kv_tokens,
        gpus_per_engine=args.gpus_per_engine, command="planner " + " ".join(args.argv),
    )  # fmt: skip
    for line in round_trip_summary(report, out):
        print(line)
    return 0


# --------------------------------------------------------------------------------------------------------
# aiconfigurator: the best parallel configuration per role
# --------------------------------------------------------------------------------------------------------


def _aic(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.lab.aic import parse_grid, resolve_aic_python
    from planner_core.lab.profile_aic import AicProfileSpec, profile_from_aic
    from planner_core.lab.profiler import write_plots, write_profile
    from planner_core.perf.profile import load_profile

    spec = AicProfileSpec(
        model=args.model or "nvidia/Llama-3.1-8B-Instruct-FP8",
        aic_model=args.aic_model,
        gemm_quant=args.gemm_quant,
        gpu=args.gpu,
        backend=args.backend,
        isl=args.isl,
        osl=args.osl,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tp_grid=parse_grid("--tp-grid", args.tp_grid),
    )
    _ = spec.system  # an unknown GPU fails before aiconfigurator starts
    aic_python = resolve_aic_python(args.aic_python)
    console = Console(stderr=True)
    columns = (TextColumn("aiconfigurator"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("estimates", total=len(spec.calls()))
        result = profile_from_aic(spec, aic_python=aic_python, on_estimate=lambda _e: bar.advance(task))
    print(
        f"{spec.model} on {spec.system} ({spec.backend}), ISL {spec.isl}, OSL {spec.osl}, TTFT <= {spec.ttft_ms:g} ms, "
        f"ITL <= {spec.itl_ms:g} ms; aiconfigurator {result.aiconfigurator_version}, {result.num_estimates} "
        f"estimates ({result.num_failed} failed)"
    )
    for role, ranking, what in (
        ("prefill", result.prefill_ranking, f"TTFT at ISL {spec.isl}"),
        ("decode", result.decode_ranking, f"ITL at context {spec.target_context}"),
    ):
        for rank, choice in enumerate(ranking):
            tag = "chosen  " if rank == 0 else "runner-up"
            batch = f", batch {choice.batch}" if role == "decode" else ""
            sla = "meets the target" if choice.meets_sla else choice.reason
            print(
                f"  {role:7} {tag} {choice.config} ({choice.num_gpus} GPU): {what} {choice.latency_ms:.2f} ms{batch}, "
                f"{choice.thpt_per_gpu:,.0f} tokens/s/GPU ({sla})"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    write_profile(args.out, result.prefill, result.decode)
    label = f"{result.prefill_ranking[0].config} prefill, {result.decode_ranking[0].config} decode"
    try:
        write_plots(
            args.out,
            result.prefill,
            result.decode,
            title=f"{spec.model} on {spec.system}: {label} (aiconfigurator)",
            label="aiconfigurator",
        )
    except RuntimeError as exc:
        print(f"planner profile: {exc}", file=sys.stderr)
    load_profile(args.out)  # what the planner will read, checked now
    print(f"{args.out}: the profile of {label}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the profile command's parser."""
    from planner_core.perf.profiling import SweepSpec

    defaults = SweepSpec()
    p = sub.add_parser("profile", help="measure an engine (or ask aiconfigurator) and write its profile and plots")
    p.add_argument("--endpoint", default=None, help="OpenAI-compatible engine or frontend, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name")
    p.add_argument(
        "--out", type=Path, default=None,
        help="profile folder, resumed if it holds one (default: PLANNER_DATA_DIR/profile, .planner/profile)",
    )  # fmt: skip
    p.add_argument(
        "--isls", default=None, help=f"prefill prompt lengths (default {','.join(map(str, defaults.prefill_isls))})"
    )
    p.add_argument("--prefill-repeats", type=int, default=defaults.prefill_repeats, help="requests per prompt length")
    p.add_argument(
        "--batches", default=None, help=f"decode concurrency (default {','.join(map(str, defaults.decode_batches))})"
    )
    p.add_argument(
        "--contexts",
        default=None,
        help=f"decode context lengths (default {','.join(map(str, defaults.decode_contexts))})",
    )
    p.add_argument("--decode-osl", type=int, default=defaults.decode_osl, help="tokens generated per decode request")
    p.add_argument("--decode-repeats", type=int, default=defaults.decode_repeats, help="bursts per decode point")
    p.add_argument(
        "--max-kv-tokens",
        type=int,
        default=None,
        help="engine KV capacity (default: from a Dynamo frontend's /metrics)",
    )
    p.add_argument("--gpus-per-engine", type=int, default=1, help="GPUs of the measured engine (throughput is per GPU)")
    p.add_argument("--reference", type=Path, default=None, help="a profile to draw beside the measured one")
    p.add_argument(
        "--round-trip", action="store_true", help="profile the live stack's mocker and compare with its source"
    )
    p.add_argument(
        "--slowdown",
        type=float,
        default=10.0,
        help="round trip: the mocker runs the H200 profile this many times slower",
    )
    p.add_argument("--nice", type=int, default=10, help="round trip: niceness of the frontend and mocker")
    p.add_argument(
        "--aic", action="store_true", help="from aiconfigurator estimates: pick the best configuration per role"
    )
    p.add_argument("--gpu", default="H200", help="--aic: GPU (H200, H100, B200, ...)")
    p.add_argument("--backend", default="vllm", help="--aic: vllm, sglang or trtllm")
    p.add_argument("--tp-grid", default="1,2,4,8", help="--aic: tensor-parallel sizes to compare")
    p.add_argument("--isl", type=int, default=3000, help="--aic: target ISL (tokens) the choice is made at")
    p.add_argument("--osl", type=int, default=300, help="--aic: target OSL (tokens); decode context ISL + OSL/2")
    p.add_argument(
        "--aic-model", default="meta-llama/Meta-Llama-3.1-8B", help="--aic: the model aiconfigurator is asked about"
    )
    p.add_argument("--gemm-quant", default="fp8", help="--aic: aiconfigurator GEMM quant mode")
    p.add_argument("--aic-python", default=None, help="--aic: interpreter with aiconfigurator (default: this one)")
    p.add_argument("--ttft-ms", type=float, default=200.0, help="--aic: TTFT target (ms)")
    p.add_argument("--itl-ms", type=float, default=10.0, help="--aic: ITL target (ms)")
    p.set_defaults(func=cmd_profile)
