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
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CAPACITY_CHECK = {"isl": 3000, "osl": 300, "ttft_ms": 200.0, "itl_ms": 10.0}
CAPACITY_TOLERANCE = 0.10


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
    """Run the sweep against `endpoint` (resuming), write the profile and plots; the measured EngineProfile."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.lab.profiler import check_endpoint, engine_kv_capacity, run_sweep, write_plots, write_profile
    from planner_core.perf.profile import load_profile
    from planner_core.perf.profiling import aggregate_profile, plan_sweep

    spec = _sweep(args)
    points = plan_sweep(spec)
    asyncio.run(check_endpoint(endpoint, args.model))  # unreachable or wrong model: say so before anything else
    max_kv_tokens = args.max_kv_tokens or engine_kv_capacity(endpoint, args.model)
    if max_kv_tokens is None:
        raise ValueError(f"--max-kv-tokens: {endpoint}/metrics does not publish the engine's KV capacity; give it")
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    skipped = 0
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task("profiling", total=len(points))

        def on_point(point, measurement) -> None:
            nonlocal skipped
            skipped += measurement is None
            bar.update(task, advance=1, description=point.key)

        measurements = run_sweep(endpoint, args.model, points, out, on_point=on_point)
    prefill, decode = aggregate_profile(
        measurements, max_kv_tokens=max_kv_tokens, gpus_per_engine=args.gpus_per_engine, source=str(out)
    )
    write_profile(out, prefill, decode)
    reference_arrays = (reference.prefill, reference.decode) if reference is not None else None
    try:
        plots = write_plots(
            out, prefill, decode, title=f"Profile of {args.model} at {endpoint}", reference=reference_arrays
        )
    except RuntimeError as exc:  # no matplotlib: the profile stands without its plots
        print(f"planner profile: {exc}", file=sys.stderr)
        plots = []
    profile = load_profile(out)  # what the planner will read, checked now
    print(
        f"{out}: {len(measurements)} points ({skipped} from an earlier run), {prefill.isl.size} prompt lengths, "
        f"{decode.itl_ms.size} decode points, KV capacity {max_kv_tokens:,} tokens; "
        f"plots: {', '.join(p.name for p in plots) or 'none'}"
    )
    return profile


def cmd_profile(args: argparse.Namespace) -> int:
    from planner_core.lab.profiler import ProfilerError

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


# --------------------------------------------------------------------------------------------------------
# Round trip: the live stack's mocker, measured over HTTP, against its source profile
# --------------------------------------------------------------------------------------------------------


def _capacity(profile_dir: Path) -> dict:
    """`planner capacity --json` on a profile at the check's request shape and SLA."""
    c = CAPACITY_CHECK
    command = [
        sys.executable, "-m", "planner_cli", "capacity", "--profile", str(profile_dir), "--isl", str(c["isl"]),
        "--osl", str(c["osl"]), "--ttft-ms", str(c["ttft_ms"]), "--itl-ms", str(c["itl_ms"]), "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)  # noqa: S603 - our own command
    shown = [*command[3:]]
    with contextlib.suppress(ValueError):  # the record names the profile relative to where the command ran
        shown[shown.index("--profile") + 1] = os.path.relpath(profile_dir)
    return {"command": "planner " + " ".join(shown), **json.loads(done.stdout)}


def _mocker_timing(dynamo: str, source_dir: Path, out: Path):
    """The mocker's own timing table for `source_dir` (made by Dynamo's converter), as the two functions
    `compare_with` takes: TTFT by ISL, ITL by (batch, context), each interpolated linearly on its grid."""
    import numpy as np
    from scipy.interpolate import RegularGridInterpolator

    from planner_cli import live

    script = live.REPO / "planner_core" / "lab" / "dynamo" / "mocker_timing.py"
    subprocess.run(  # noqa: S603 - our own script
        [dynamo, str(script), str(source_dir), str(out)], capture_output=True, text=True, check=True
    )
    with np.load(out) as npz:
        isl, ttft = npz["prefill_isl"], npz["prefill_ttft_ms"]
        kv, ctx, itl = npz["decode_active_kv_tokens"], npz["decode_context_length"], npz["decode_itl"]
    grid = RegularGridInterpolator((kv, ctx), itl, bounds_error=False, fill_value=None)
    return (
        lambda x: float(np.interp(x, isl, ttft)),
        lambda batch, context: float(grid([[batch * context, context]])[0]),
    )


def _rps(value: float | None) -> str:
    return "none (SLA unreachable)" if value is None else f"{value:.3f}"


def _round_trip(args: argparse.Namespace) -> int:
    from planner_cli import live
    from planner_core.config import MOCKER_COMMAND
    from planner_core.lab.profiler import write_plots, write_profile
    from planner_core.perf.profile import DecodeProfile, PrefillProfile, load_profile
    from planner_core.perf.profiling import Role, compare_profiles, compare_with
    from planner_core.runtime.connectors.local import render_command

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    slowdown = args.slowdown
    try:
        dynamo = live._tool("DYNAMO_PYTHON", live.REPO / ".dynamo-venv" / "bin" / "python", "dynamo-env")
        model_dir = live._tool("PLANNER_LIVE_MODEL_DIR", live.REPO / ".planner" / "live-model", "live-env")
    except live.LiveError as exc:
        print(f"planner profile: {exc}", file=sys.stderr)
        return 2
    source_dir = live.write_slowed_profile(out / f"source-x{slowdown:g}", slowdown)
    kv_dir, logs = out / "kv", out / "logs"
    for folder in (kv_dir, logs):
        folder.mkdir(exist_ok=True)
    port = live._free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DYN_FILE_KV": str(kv_dir), "PYTHONPATH": str(live.STUBS_DIR)}
    mocker = render_command(
        MOCKER_COMMAND,
        {
            "DYNAMO_PYTHON": dynamo,
            "PLANNER_LOCAL_MODEL_DIR": model_dir,
            "PLANNER_LOCAL_MODEL_NAME": live.MODEL_NAME,
            "DISAGGREGATION_MODE": "agg",
            "PLANNER_LOCAL_PROFILE_DIR": str(source_dir),
        },
        field="mocker",
    )
    args.model = live.MODEL_NAME
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        frontend = stack.enter_context(
            live._process(
                [dynamo, "-m", "dynamo.frontend", "--http-port", str(port), "--discovery-backend", "file"],
                logs / "frontend.log", env, nice=args.nice,
            )
        )  # fmt: skip
        engine = stack.enter_context(live._process(mocker, logs / "mocker.log", env, nice=args.nice))
        live._wait_for("Dynamo frontend", lambda: live._get(f"{endpoint}/metrics"), 120, frontend)
        live._wait_for(
            "the mocker registered with the frontend",
            lambda: live.MODEL_NAME.encode() in live._get(f"{endpoint}/v1/models"),
            300,
            engine,
        )
        measured = measure(args, endpoint, out / "measured", reference=load_profile(source_dir))
    measured_s = time.monotonic() - started
    source = load_profile(source_dir)
    comparisons = {"source": compare_profiles(measured, source)}
    comparisons["mocker_model"] = compare_with(measured, *_mocker_timing(dynamo, source_dir, out / "mocker-timing.npz"))
    # the measured engine was `slowdown` times slower than the H200 profile: undo that for the SLA check
    descaled_dir = out / "measured-descaled"
    prefill = PrefillProfile(
        isl=measured.prefill.isl,
        ttft_ms=measured.prefill.ttft_ms / slowdown,
        thpt_per_gpu=measured.prefill.thpt_per_gpu * slowdown,
    )
    decode = DecodeProfile(
        kv_usage=measured.decode.kv_usage,
        context_length=measured.decode.context_length,
        itl_ms=measured.decode.itl_ms / slowdown,
        thpt_per_gpu=measured.decode.thpt_per_gpu * slowdown,
        max_kv_tokens=measured.decode.max_kv_tokens,
    )
    write_profile(descaled_dir, prefill, decode)
    h200 = load_profile(live.PROFILE_DIR)
    with contextlib.suppress(RuntimeError):
        write_plots(descaled_dir, prefill, decode, title="Measured mocker, descaled, vs the H200 profile",
                    reference=(h200.prefill, h200.decode))  # fmt: skip
    # The same sweep points timed by each reference, descaled: the mocker's own timing there is what a perfect
    # profiler would have written (so measured vs it is the profiler's error); the source there tells the sweep's
    # coarseness apart from the mocker's fitting of its source.
    capacity = {"source": _capacity(live.PROFILE_DIR), "measured": _capacity(descaled_dir)}
    for against, comparison in comparisons.items():
        by_role = {role: [row for row in comparison.rows if row[0] == role.value] for role in Role}
        points_dir = out / f"{against}-at-points"
        write_profile(
            points_dir,
            PrefillProfile(
                isl=prefill.isl,
                ttft_ms=[row[4] / slowdown for row in by_role[Role.PREFILL]],
                thpt_per_gpu=[row[1] / (row[4] / slowdown / 1000.0) for row in by_role[Role.PREFILL]],
            ),
            DecodeProfile(
                kv_usage=decode.kv_usage,
                context_length=decode.context_length,
                itl_ms=[row[4] / slowdown for row in by_role[Role.DECODE]],
                thpt_per_gpu=[row[1] / (row[4] / slowdown / 1000.0) for row in by_role[Role.DECODE]],
                max_kv_tokens=decode.max_kv_tokens,
            ),
        )
        capacity[f"{against}_at_points"] = _capacity(points_dir)
    # the seed-004 TTFT/TPOT files of the measured profile (`planner profile-json`), beside it
    subprocess.run(  # noqa: S603 - our own command
        [sys.executable, "-m", "planner_cli", "profile-json", "--from", "dynamo", "--profile", str(descaled_dir),
         "--model", live.MODEL_NAME, "--out-dir", str(descaled_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    key = "requests_per_s_per_gpu"
    src_rps, meas_rps = capacity["source"][key], capacity["measured"][key]
    capacity_error = None if not src_rps or meas_rps is None else meas_rps / src_rps - 1.0
    model_rps = capacity["mocker_model_at_points"][key]
    profiler_capacity_error = None if not model_rps or meas_rps is None else meas_rps / model_rps - 1.0
    roles = {
        against: {
            role.value: {
                "num_points": len(comparison.errors(role)),
                "median_abs_error": comparison.median_abs(role),
                "worst_error": comparison.worst(role),
            }
            for role in Role
        }
        for against, comparison in comparisons.items()
    }
    commit = subprocess.run(  # noqa: S603,S607 - git, for the record
        ["git", "-C", str(live.REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    report = {
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "commit": commit or None,
        "command": "planner " + " ".join(args.argv),
        "slowdown": slowdown,
        "engine": "Dynamo 1.6.1 frontend + one aggregated mocker (--planner-profile-data: the H200 profile slowed)",
        "measure_s": round(measured_s, 1),
        "roles": roles,
        "points": {
            against: [
                dict(zip(("role", "x", "y", "measured_ms", "reference_ms", "relative_error"), row, strict=True))
                for row in comparison.rows
            ]
            for against, comparison in comparisons.items()
        },
        "capacity": capacity,
        "capacity_check": CAPACITY_CHECK,
        "capacity_relative_error": capacity_error,
        "capacity_within_tolerance": capacity_error is not None and abs(capacity_error) <= CAPACITY_TOLERANCE,
        "capacity_relative_error_vs_mocker_model": profiler_capacity_error,
    }
    (out / "roundtrip.json").write_text(json.dumps(report, indent=1) + "\n")
    for against, by_role in roles.items():
        for role, figures in by_role.items():
            print(
                f"vs {against}: {role}: {figures['num_points']} points, median |error| "
                f"{100 * figures['median_abs_error']:.1f} %, worst {100 * figures['worst_error']:+.1f} %"
            )
    print(
        f"capacity at ISL {CAPACITY_CHECK['isl']}/OSL {CAPACITY_CHECK['osl']}, TTFT {CAPACITY_CHECK['ttft_ms']:g} ms/"
        f"ITL {CAPACITY_CHECK['itl_ms']:g} ms: source {_rps(src_rps)} req/s/GPU, measured {_rps(meas_rps)} req/s/GPU "
        f"({'n/a' if capacity_error is None else f'{100 * capacity_error:+.1f} %'}); the mocker's own timing at the "
        f"same points {_rps(model_rps)} req/s/GPU; {out / 'roundtrip.json'}"
    )
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
    p.add_argument("--out", type=Path, default=Path(".planner/profile"), help="profile folder (resumes what it holds)")
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
