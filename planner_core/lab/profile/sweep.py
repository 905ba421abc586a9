"""Measuring a running OpenAI-compatible engine: the sweep (prefill TTFT by prompt length, decode ITL by batch and
context), resumable, written in Dynamo's profile layout with its plots (`planner profile --endpoint`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planner_core.perf.profile import EngineProfile
    from planner_core.perf.profiling import SweepSpec


def measure(
    endpoint: str,
    model: str,
    out: Path,
    *,
    sweep: SweepSpec,
    max_kv_tokens: int | None = None,
    gpus_per_engine: int = 1,
    reference: EngineProfile | None = None,
) -> EngineProfile:
    """Run the sweep against `endpoint` (resuming), write the profile and plots; the measured EngineProfile."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.lab.profiler import check_endpoint, engine_kv_capacity, run_sweep, write_plots, write_profile
    from planner_core.perf.profile import load_profile
    from planner_core.perf.profiling import aggregate_profile, plan_sweep

    points = plan_sweep(sweep)
    asyncio.run(check_endpoint(endpoint, model))  # unreachable or wrong model: say so before anything else
    max_kv_tokens = max_kv_tokens or engine_kv_capacity(endpoint, model)
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

        measurements = run_sweep(endpoint, model, points, out, on_point=on_point)
    prefill, decode = aggregate_profile(
        measurements, max_kv_tokens=max_kv_tokens, gpus_per_engine=gpus_per_engine, source=str(out)
    )
    write_profile(out, prefill, decode)
    reference_arrays = (reference.prefill, reference.decode) if reference is not None else None
    try:
        plots = write_plots(out, prefill, decode, title=f"Profile of {model} at {endpoint}", reference=reference_arrays)
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
