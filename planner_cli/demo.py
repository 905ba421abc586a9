"""`planner demo`: the planner loop on a real trace in simulated time, then example SQL queries."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from planner_cli.common import DEFAULT_TRACE, prefect_environment, print_example_queries
from planner_core.config import PlannerConfig
from planner_core.data import DEFAULT_CONFIG
from planner_core.runtime.settings import RuntimeSettings

MAX_SIMULATED_FLOOR_ENGINES = 1000
"""Most engines the demo's simulated cluster may be held at by the config's floors: 800 (min_endpoint 400, both
pools, no GPU ceiling) ran 2 windows in 42 s at 384 MB peak; 20,000 (min_endpoint 10000) ran for minutes at 700 MB
without finishing a window (issue 43, 2026-12-07)."""


def cmd_demo(args: argparse.Namespace) -> int:
    settings = RuntimeSettings()
    prefect_environment(settings)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # keep the progress bar readable
    # A failed run ends in our one line (planner_cli.main); Prefect's console copy of it is a traceback. The run's
    # logs, that traceback included, still reach the Prefect server (its UI shows them).
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    from flows.prefect_server import prefect_api
    from planner_core.config import load_config
    from planner_core.planner import RequestShape, budget_warnings, refuse_what_cannot_work
    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.traces import load_trace

    # Check the inputs before starting anything: a bad file, a missing profile or an SLA the profile cannot reach
    # for the trace's mean request is one line, not a failed flow run or a run at 0 %.
    config = load_config(args.config).policy
    check_simulated_floor(config, args.config)
    trace = load_trace(args.trace)
    try:  # the scaled trace's size: a rate the run cannot carry is one line now, not gigabytes later
        trace.check_rate_factor(args.rate_scale)
    except ValueError as exc:
        raise ValueError(f"--rate-scale = {args.rate_scale:g}: {exc}") from None
    mean = RequestShape(isl=float(trace.isl.mean()), osl=float(trace.osl.mean()), source="the trace's mean request")
    refuse_what_cannot_work(config, args.config, shape=mean)
    for warning in budget_warnings(config, args.config):  # not errors: said before the run, as serve does
        print(f"planner demo: warning: {warning}", file=sys.stderr)
    url = resolve_database_url(settings)
    started = time.perf_counter()
    with prefect_api(exit_when_lost=True) as api_url:
        print(f"Prefect API: {api_url}", file=sys.stderr)
        from flows.demo import demo  # Prefect reads its settings at import: import after PREFECT_API_URL is set

        result = demo(
            trace_path=str(args.trace),
            config_path=str(args.config),
            deployment=args.deployment,
            startup_s=args.startup_s,
            rate_scale=args.rate_scale,
            max_windows=args.max_windows,
        )  # no database URL among the parameters: Prefect stores them, and the URL may hold a password
    elapsed_s = time.perf_counter() - started
    simulated_h = result["num_windows"] * result["window_s"] / 3600.0
    print(f"\nDemo '{result['deployment']}' on {Path(args.trace).name} at {args.rate_scale:g}x its rate")
    print(
        f"  simulated {simulated_h:.2f} h in {elapsed_s:.1f} s of wall time; "
        f"ticks recorded {result['num_ticks']}, decisions {result['num_decisions']} "
        f"({result['decision_statuses']})"
    )
    print(
        f"  requests {result['num_requests']}, SLA attainment {100 * result['sla_attainment']:.1f}% "
        f"(TTFT <= {result['ttft_ms']:g} ms and ITL <= {result['itl_ms']:g} ms), "
        f"mean TTFT {result['mean_ttft_ms']:.0f} ms, mean ITL {result['mean_itl_ms']:.1f} ms, "
        f"GPU-hours {result['gpu_hours']:.2f}"
    )
    print(
        f"  (GPU-hours of the ready workers each tick saw, held until the next tick, as the report and the metrics "
        f"count them; the simulator's {result['simulated_gpu_hours']:.2f} below also counts starting and draining "
        "workers, the first window and the tail to the last request)"
    )
    print_comparison(result["comparison"])
    capped = result["budget_capped"]
    if capped:  # not an error (the budget is a choice), but the run did less than the planner asked for
        print(
            f"  warning: the GPU budget (max_gpu_budget {result['max_gpu_budget']}) set {len(capped)} of the "
            f"{result['num_decisions']} decisions, the first: {capped[0]} (decision_history, reason 'budget')"
        )
    prefill, decode = result["starting_size"]
    print(f"  started at {prefill}P/{decode}D, as if already serving (the oracle's size for the first 3 minutes)")
    print("  replica timeline (simulated time since the first request -> prefill/decode targets):")
    print("    " + "  ".join(f"{at_s / 60:.0f}m {p}P/{d}D" for at_s, p, d in result["scale_events"]) or "    none")
    print(f"  report: {result['report_path']}")
    print_example_queries(url, result["deployment"])
    print(f"\nConnect with: planner db url   (data under {settings.data_dir.resolve()})")
    return 0


def check_simulated_floor(config: PlannerConfig, path: Path) -> None:
    """Raise ValueError (one line naming the file, field and value) when the floors hold the simulated cluster
    above `MAX_SIMULATED_FLOOR_ENGINES` engines; a GPU ceiling bounds them already (a config rule)."""
    from planner_core.config import managed_components
    from planner_core.domain import Component

    floors = {
        Component.PREFILL: ("prefill_min_endpoint", config.prefill_min_endpoint_effective),
        Component.DECODE: ("decode_min_endpoint", config.decode_min_endpoint_effective),
    }
    managed = [floors[c] for c in managed_components(config.mode) if c in floors]
    num_engines = sum(num for _, num in managed)
    if num_engines > MAX_SIMULATED_FLOOR_ENGINES:
        field = next((name for name, _ in managed if getattr(config, name) is not None), "min_endpoint")
        raise ValueError(
            f"{path}: field {field!r} = {getattr(config, field)}: the floors hold the demo's simulated cluster at "
            f"{num_engines} engines, more than it carries ({MAX_SIMULATED_FLOOR_ENGINES})"
        )


def print_comparison(rows: list[dict]) -> None:
    """The run beside the same requests served by a static size and by Dynamo's defaults (`planner bench`'s
    scoring: both targets, every request served to completion)."""
    width = max(len(row["policy"]) for row in rows) + 2
    print("  the same requests, scored alike (simulated cluster, same start and start-up time):")
    print(f"    {'policy':<{width}}{'SLA ok':>8}{'TTFT ok':>9}{'ITL ok':>8}{'GPU-h':>8}{'events':>8}")
    for row in rows:
        print(
            f"    {row['policy']:<{width}}{row['sla_attainment']:>8.1%}{row['ttft_attainment']:>9.1%}"
            f"{row['itl_attainment']:>8.1%}{row['gpu_hours']:>8.2f}{row['scaling_events']:>8}"
        )


def register(sub: argparse._SubParsersAction) -> None:
    """Add the demo command group's parsers."""
    demo = sub.add_parser("demo", help="run the planner loop on a real trace in simulated time")
    demo.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure CSV or Mooncake JSONL trace")
    demo.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG,
        help="PlannerConfig YAML/JSON (default: the recommended policy, planner_core/configs/policies/planner.yaml)",
    )  # fmt: skip
    demo.add_argument("--deployment", default="demo", help="managed-deployment name (a new name starts afresh)")
    # the numbers are checked as they are parsed: a bad one is refused before the deployment is recorded
    demo.add_argument("--startup-s", type=float, default=120.0, help="simulated worker start-up time")
    demo.add_argument("--rate-scale", type=float, default=12.0, help="multiply the trace's request rate (shape kept)")
    demo.add_argument("--max-windows", type=int, default=None, help="stop after this many throughput windows (>= 1)")
    demo.set_defaults(func=cmd_demo)
