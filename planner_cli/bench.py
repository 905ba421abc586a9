"""`planner bench`: scaling policies side by side in the cluster simulator."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from planner_cli.common import DEFAULT_PROFILE, check_output_path

if TYPE_CHECKING:
    from planner_core.lab.sim.benchmark import BenchRequest


def cmd_bench(args: argparse.Namespace) -> int:
    """Run scaling policies side by side on one trace in the discrete-event simulator."""
    import dataclasses
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.lab.sim.bench import bench_figure
    from planner_core.lab.sim.benchmark import BenchRequest, benchmark
    from planner_core.lab.sim.des import NoEndpointAction, RouterPolicy
    from planner_core.runtime.localhost import code_commit

    speed, change = engine_speed_options(args)  # before anything runs: a bad value is one line
    for flag, path in (("--json", args.json), ("--html", args.html), ("--record", args.record)):
        check_output_path(path, flag)  # not after an hour of simulation
    commit = code_commit()  # now: the checkout may move while a long bench runs, and the record names this code
    request = BenchRequest(
        trace=args.trace, profile=args.profile, rate_scale=args.rate_scale, compress=args.compress, shape=args.shape,
        shape_hours=args.shape_hours, shape_start_h=args.shape_start_h, perf_table=args.perf_table,
        max_kv_tokens=args.max_kv_tokens, configs=tuple(args.config or ()),
        policies=tuple(n.strip() for n in args.policies.split(",") if n.strip()) if args.policies else None,
        aggregated=args.mode == "agg", ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, startup_s=args.startup_s,
        max_gpu_budget=args.max_gpu_budget, throughput_interval_s=args.throughput_interval_s,
        oracle_target=args.oracle_target, oracle_context_s=args.oracle_context_s, initial=args.initial,
        dynamo_python=args.dynamo_python, router=RouterPolicy(args.router), ttft_profile=args.ttft_profile,
        tpot_profile=args.tpot_profile, ttft_dispatch_threshold=args.ttft_dispatch_threshold,
        tpot_dispatch_threshold=args.tpot_dispatch_threshold, no_endpoint=NoEndpointAction(args.no_endpoint),
        adaptive_pd=not args.no_adaptive_pd, horizon_quantiles=tuple(args.horizon_quantiles),
        engine=args.engine, dynamo_oracle=args.dynamo_oracle, engine_speed=speed, speed_change=change,
    )  # fmt: skip
    to_stdout = args.json is not None and str(args.json) == "-"
    print(f"bench: sizing the policies ({_oracle_work(request)})...", file=sys.stderr)
    with Progress(
        TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), transient=True, disable=to_stdout,
    ) as progress:  # fmt: skip
        task = progress.add_task("", total=None)
        names: list[str] = []

        def built(policies) -> None:
            names.extend(policy.name for policy in policies)
            progress.update(task, total=len(names), description=names[0] if names else "")

        def done(_row) -> None:
            progress.advance(task)
            upcoming = names[int(progress.tasks[0].completed) :]
            progress.update(task, description=upcoming[0] if upcoming else "")

        outcome = benchmark(request, on_policies_built=built, on_policy_done=done)
    for warning in outcome.warnings:
        print(f"bench: {warning}", file=sys.stderr)
    rows = [dataclasses.asdict(run.row) for run in outcome.runs]
    if args.json is not None:
        text = json.dumps(rows, indent=1)
        if to_stdout:
            print(text)
        else:
            args.json.write_text(text + "\n", encoding="utf-8")
    if args.record is not None:
        record = bench_record(rows, args.argv, commit, engine=engine_record(request))
        args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if args.html is not None:
        figure = bench_figure(list(outcome.runs), outcome.trace, ttft_ms=request.ttft_ms, itl_ms=request.itl_ms)
        figure.write_html(str(args.html), include_plotlyjs=True)
        if request.horizon_quantiles:  # the knob's frontier below the time panels
            import html

            from planner_core.lab.sim.frontier import GOAL_TEXT, describe_startup_goal, frontier_figure, run_points

            frontier = frontier_figure(
                list(outcome.runs), title=f"attainment vs GPU-hours, start-up {request.startup_s:g} s"
            ).to_html(full_html=False, include_plotlyjs=False)
            lines = [f"start-up goal: {GOAL_TEXT}", *describe_startup_goal(run_points(list(outcome.runs)))]
            frontier += "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"
            page = args.html.read_text(encoding="utf-8")
            args.html.write_text(page.replace("</body>", frontier + "</body>", 1), encoding="utf-8")
    if not to_stdout:
        print_bench_table(outcome, request)
    return 0


def bench_record(rows: list[dict], argv: list[str], commit: str | None, *, engine: dict | None = None) -> dict:
    """The `--record` file: the rows with the date (when written), the command and the commit of the code that
    produced them, taken when the bench began (the docs' benchmark pages are generated from these), and, for
    engines that do not run as profiled, `engine_speed` (`engine_record`; absent: the profile's speed)."""
    import datetime as dt
    import shlex

    record = {
        "format": "planner-bench-record/v1",
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "command": shlex.join(["planner", *argv]),
        "commit": commit or None,
    }
    if engine is not None:
        record["engine_speed"] = engine
    record["rows"] = rows
    return record


def engine_speed_options(args: argparse.Namespace):  # -> tuple[EngineSpeed, SpeedChange | None]
    """`--engine-speed` and `--engine-speed-change` parsed (a role the change leaves out keeps its speed from
    `--engine-speed`); ValueError (one line) on a bad value or with `--engine dynamo`."""
    from planner_core.lab.sim.benchmark import ENGINE_SPEED_DYNAMO_REFUSAL
    from planner_core.lab.sim.des import PROFILE_SPEED, parse_engine_speed, parse_speed_change

    speed = PROFILE_SPEED if args.engine_speed is None else parse_engine_speed(args.engine_speed)
    change = None if args.engine_speed_change is None else parse_speed_change(args.engine_speed_change, base=speed)
    if args.engine == "dynamo" and (args.engine_speed is not None or change is not None):
        raise ValueError(ENGINE_SPEED_DYNAMO_REFUSAL)
    return speed, change


def engine_record(request) -> dict | None:  # BenchRequest (imported lazily)
    """What the record says of the engines' speed: None when they run as profiled throughout, else the speed per
    phase as a multiple of the profile's and the change (`{"at_s": ..., "speed": {...}}`) or None."""
    if not request.engine_lies:
        return None
    change = request.speed_change
    return {**request.engine_speed.as_dict(), "change": None if change is None else change.as_dict()}


def engine_speed_text(request) -> str:  # BenchRequest
    """The header's words on the engines' speed ("" when they run as profiled throughout)."""
    if not request.engine_lies:
        return ""
    speed, change = request.engine_speed, request.speed_change
    text = f"engines at prefill {speed.prefill:g}x / decode {speed.decode:g}x the profile"
    if change is not None:
        text += f", from {change.at_s:g} s at prefill {change.speed.prefill:g}x / decode {change.speed.decode:g}x"
    return text + "; "


def print_bench_table(outcome, request) -> None:  # BenchOutcome, BenchRequest (imported lazily)
    """The runs as a table, after a line on the requests and, for the oracle, its sizes per window."""
    from planner_core.lab.sim.bench import OraclePolicy
    from planner_core.lab.sim.policies import OracleBudgetPolicy, StaticBestPolicy

    runs, trace, aggregated = outcome.runs, outcome.trace, request.aggregated
    if runs:
        print(
            f"{trace.source}: {trace.num_requests} requests, {trace.duration_s / 3600:.2f} h; "
            f"{'aggregated engines; ' if aggregated else ''}"
            f"SLA TTFT {request.ttft_ms:g} ms / ITL {request.itl_ms:g} ms; start-up {request.startup_s:g} s; "
            f"{engine_speed_text(request)}"
            f"{runs[0].row.attainable:.1%} of requests can meet both alone"
        )
    else:
        print("")
    for policy in outcome.policies:
        if isinstance(policy, (StaticBestPolicy, OracleBudgetPolicy)):
            print(_reference_line(policy, aggregated=aggregated))
        elif isinstance(policy, OraclePolicy):
            sizes = " ".join(f"{d}" if aggregated else f"{p}/{d}" for p, d in policy.sizes)
            infeasible = sum(not w.feasible for w in policy.windows)
            pools = "aggregated engines" if aggregated else "prefill/decode"
            print(
                f"  oracle ({pools} per {policy.interval_s:g} s window, >= {request.oracle_target:.1%} of "
                f"attainable requests; search {policy.search_s:.1f} s"
                + (f"; {infeasible} windows infeasible" if infeasible else "")
                + f"): {sizes}"
            )
    width = max([14, *(len(run.row.policy) + 2 for run in runs)])  # long names (fixed:P:D, dynamo-...) fit
    print(
        f"  {'policy':<{width}}{'SLA ok':>8}{'TTFT ok':>9}{'ITL ok':>8}{'GPU-h':>8}{'x oracle':>9}{'events':>8}"
        f"{'TTFT p90':>10}{'ITL p90':>9}{'wall s':>8}"
    )
    for run in runs:
        r = run.row
        ratio = "-" if r.gpu_hours_vs_oracle is None else f"{r.gpu_hours_vs_oracle:.2f}"
        print(
            f"  {r.policy:<{width}}{r.sla_attainment:>8.1%}{r.ttft_attainment:>9.1%}{r.itl_attainment:>8.1%}"
            f"{r.gpu_hours:>8.2f}{ratio:>9}{r.scaling_events:>8}{r.ttft_ms_p90:>10.1f}{r.itl_ms_p90:>9.2f}"
            f"{r.wall_s:>8.1f}"
        )
    if runs and runs[0].row.unplaced is not None:
        print(f"  router {runs[0].row.router}: unplaced / rejected / prefilled on decode / placed overdue; "
              "predictor error |pred - measured| / measured, median and p90")  # fmt: skip
        for run in runs:
            r = run.row
            print(
                f"  {r.policy:<{width}}{r.unplaced:>8}{r.rejected:>8}{r.local_prefills:>8}{r.overdue:>8}"
                f"  TTFT {_pct(r.ttft_pred_err_p50)} / {_pct(r.ttft_pred_err_p90)}"
                f"  TPOT {_pct(r.tpot_pred_err_p50)} / {_pct(r.tpot_pred_err_p90)}"
            )
    from planner_core.lab.sim.frontier import FORESIGHT, GOAL_TEXT, HINDSIGHT, describe_startup_goal, run_points

    if request.horizon_quantiles or any(run.row.policy in {*FORESIGHT, *HINDSIGHT} for run in runs):
        print(f"  start-up goal: {GOAL_TEXT}")
        for line in describe_startup_goal(run_points(runs)):
            print(f"  {line}")


def _reference_line(policy, *, aggregated: bool) -> str:  # StaticBestPolicy | OracleBudgetPolicy
    """The line naming what a hindsight reference found (`planner_core.lab.sim.references`)."""
    from planner_core.lab.sim.policies import StaticBestPolicy

    def size(prefill: int, decode: int) -> str:
        return f"{decode}" if aggregated else f"{prefill}P/{decode}D"

    if isinstance(policy, StaticBestPolicy):
        found = policy.search
        if found.feasible:
            what = f"the cheapest fixed size serving >= {found.num_required} of {found.num_attainable} attainable"
        else:
            what = f"no fixed size serves {found.num_required} of {found.num_attainable} attainable; the best one"
        return (
            f"  static-best = {size(*found.size)} ({what} over the whole run; {len(found.tried)} sizes simulated, "
            f"search {found.search_s:.1f} s)"
        )
    choice = policy.choice
    chosen = " ".join(f"{d}" if aggregated else f"{p}/{d}" for p, d in policy.sizes)
    planned = "" if choice is None else f", {choice.met} met in the oracle's window runs"
    kept = "; the oracle's sizes kept" if choice is not None and choice.from_fallback else ""
    return (
        f"  oracle-budget (per window, >= {policy.num_required} attainable requests over the whole run{planned}"
        f"{kept}): {chosen}"
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _quantiles(text: str) -> tuple[float, ...]:
    """`--horizon-quantiles`: comma-separated values in [0, 1)."""
    values = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--horizon-quantiles: {part!r} is not a number") from None
        if not 0.0 <= value < 1.0:
            raise argparse.ArgumentTypeError(f"--horizon-quantiles: {part} is outside [0, 1)")
        values.append(value)
    return tuple(values)


def _oracle_work(request: BenchRequest) -> str:
    """What the oracle's search will do before the runs, for the line `bench` prints while it sizes the policies:
    the whole trace only when a row needs it (an oracle or static baseline, a hindsight reference)."""
    from planner_core.lab.sim.policies import (
        BASELINE_NAMES,
        DEFAULT_AGG_POLICIES,
        DEFAULT_POLICIES,
        REFERENCE_NAMES,
    )

    names = request.policies or (DEFAULT_AGG_POLICIES if request.aggregated else DEFAULT_POLICIES)
    if any(name in (*BASELINE_NAMES, *REFERENCE_NAMES) for name in names):
        return "the oracle simulates every window at several sizes"
    if request.initial == "oracle":
        return "no oracle row: the oracle searches the first window alone, the planners' starting size"
    return "no oracle row and --initial min: no oracle search"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the bench command group's parsers."""
    bench = sub.add_parser("bench", help="compare scaling policies on one trace in the cluster simulator")
    _add_workload_arguments(bench)
    _add_policy_arguments(bench)
    _add_router_arguments(bench)
    _add_planner_arguments(bench)
    _add_output_arguments(bench)
    bench.set_defaults(func=cmd_bench)


def _add_workload_arguments(bench: argparse.ArgumentParser) -> None:
    """The trace and how it is scaled and shaped; the engines' profile."""
    bench.add_argument("--trace", type=Path, required=True, help="Azure CSV, Mooncake or Dynamo v1 trace")
    bench.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="engine profile (timing and sizing)")
    bench.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's request rate")
    bench.add_argument(
        "--compress", type=float, default=1.0, help="serve the same requests in 1/X of the time (after scaling)"
    )
    bench.add_argument(
        "--shape", type=Path, default=None,
        help="ServeGen rate CSV or folder: the trace's requests follow its mean daily cycle (multi-hour load)",
    )  # fmt: skip
    bench.add_argument("--shape-hours", type=float, default=24.0, help="with --shape: hours of load to make")
    bench.add_argument("--shape-start-h", type=float, default=0.0, help="with --shape: hour of the day to start at")
    bench.add_argument(
        "--perf-table", type=Path, default=None,
        help="aiconfigurator perf table (`planner perf-table`): the simulated engines' timing and the planners' "
        "engine model (engines of its tp GPUs); the 0.x interpolation presets still read --profile",
    )  # fmt: skip
    bench.add_argument(
        "--max-kv-tokens", type=int, default=None, help="decode engine KV-cache tokens (default: the profile's)"
    )


def _add_policy_arguments(bench: argparse.ArgumentParser) -> None:
    """The policies compared and the engines' mode."""
    bench.add_argument(
        "--config", type=Path, action="append", default=None, metavar="FILE",
        help="a planner config to bench as policy config:<file stem> (its own settings and plugins); repeatable",
    )  # fmt: skip
    bench.add_argument(
        "--policies",
        default=None,
        help="comma-separated: static-peak, static-mean, oracle, oracle-ahead, oracle-seen, oracle-peak (the oracle "
        "under the start-up time: knowing the future; never above the sizes already needed; holding the largest "
        "burst's engines until it comes), static-best, oracle-budget (hindsight references, --engine sim: the "
        "cheapest fixed size, and the fewest GPU-hours over per-window sizes, meeting --oracle-target over the "
        "whole run), threshold, dynamo-0x, dynamo-1x, planner, planner-open-loop (the recommended policy with its "
        "closed loops off: learned speeds and error budget), fixed:P:D, dynamo-1.6.1, "
        "dynamo-1.6.1-load (Dynamo's own planner; needs `make dynamo-env` or --dynamo-python). Default: "
        "static-peak,static-mean,oracle,oracle-ahead,threshold,dynamo-0x,dynamo-1x,planner; with --mode agg the same "
        "without dynamo-0x, and fixed:N (N aggregated engines)",
    )
    bench.add_argument(
        "--mode", choices=("disagg", "agg"), default="disagg",
        help="disaggregated prefill/decode pools, or one pool of aggregated engines (chunked prefill on decode)",
    )  # fmt: skip


def _add_router_arguments(bench: argparse.ArgumentParser) -> None:
    """The simulated frontend's router and the SLO-aware router's settings."""
    bench.add_argument(
        "--router", choices=("least_loaded", "round_robin", "slo"), default="least_loaded",
        help="the simulated frontend's router: least_loaded, round_robin, or slo (SLO-aware: the engine with the "
        "lowest predicted latency within SLO x dispatch threshold); the oracle sizes with least_loaded whatever "
        "this is, so static sizes are the same under every router",
    )  # fmt: skip
    bench.add_argument(
        "--ttft-profile", type=Path, default=None, metavar="FILE",
        help="router slo: TTFT profiling JSON (`planner profile-json`); default: built from the simulated engines",
    )  # fmt: skip
    bench.add_argument(
        "--tpot-profile", type=Path, default=None, metavar="FILE", help="router slo: TPOT profiling JSON"
    )
    bench.add_argument(
        "--ttft-dispatch-threshold", type=float, default=1.0, help="router slo: keep engines predicted <= TTFT x this"
    )
    bench.add_argument(
        "--tpot-dispatch-threshold", type=float, default=1.0, help="router slo: keep engines predicted <= ITL x this"
    )
    bench.add_argument(
        "--no-endpoint", choices=("queue", "reject"), default="queue",
        help="router slo: a request no engine is predicted to serve in time waits at the frontend, or is rejected",
    )  # fmt: skip
    bench.add_argument(
        "--no-adaptive-pd", action="store_true",
        help="router slo: never prefill a short prompt on a decode engine when no prefill engine is predicted in time",
    )  # fmt: skip


def _add_planner_arguments(bench: argparse.ArgumentParser) -> None:
    """The SLA, the start-up time, the planners' and the oracle's settings, and what serves the requests."""
    bench.add_argument("--ttft-ms", type=float, default=500.0, help="TTFT target (ms)")
    bench.add_argument("--itl-ms", type=float, default=50.0, help="ITL target (ms)")
    bench.add_argument("--startup-s", type=float, default=120.0, help="worker start-up time (s)")
    bench.add_argument(
        "--horizon-quantiles", type=_quantiles, default=(), metavar="Q[,Q...]",
        help="also run the recommended policy at each of these throughput_horizon_quantile values (0 <= q < 1), "
        "named planner@qQ; --html then draws their attainment vs GPU-hours frontier",
    )  # fmt: skip
    bench.add_argument("--max-gpu-budget", type=int, default=-1, help="GPU ceiling for the planners (-1: none)")
    bench.add_argument("--throughput-interval-s", type=int, default=180, help="throughput window / oracle window")
    bench.add_argument(
        "--oracle-target",
        type=float,
        default=0.99,
        help="fraction of a window's attainable requests the oracle serves within both targets",
    )
    bench.add_argument(
        "--oracle-context-s", type=float, default=60.0, help="traffic simulated before and after each oracle window (s)"
    )
    bench.add_argument(
        "--initial", choices=("oracle", "min"), default="oracle",
        help="planners start at the oracle's first-window size, or at their minimum endpoints",
    )  # fmt: skip
    bench.add_argument(
        "--engine", choices=("sim", "dynamo"), default="sim",
        help="what serves the requests: our simulator, or Dynamo 1.6.1's offline replay (its mocker engines, with "
        "every policy in its loop and its own oracle; needs `make dynamo-env` or --dynamo-python)",
    )  # fmt: skip
    bench.add_argument(
        "--engine-speed", default=None, metavar="ROLE=X[,ROLE=X]",
        help="the simulated engines run at X times the profile's speed per phase (roles prefill, decode; e.g. "
        "prefill=0.8,decode=0.9: each prefill takes 1/0.8 of the profile's time); the planners and the router still "
        "read the profile, the oracle simulates the engines as they run. Default 1 (the profile)",
    )  # fmt: skip
    bench.add_argument(
        "--engine-speed-change", default=None, metavar="TIME:ROLE=X[,ROLE=X]",
        help="from TIME on (simulated, from the first request: seconds, Ns or Nm, e.g. 20m) the engines run at "
        "these speeds (a role left out keeps its --engine-speed); iterations under way end at the old speed",
    )  # fmt: skip
    bench.add_argument(
        "--dynamo-oracle", choices=("exact", "bracket"), default="exact",
        help="--engine dynamo: the oracle's exact per-window search in Dynamo's replay, or its cheaper approximation "
        "starting from our simulator's oracle (fewer replays per window; its error is measured in docs/benchmarks.md)",
    )  # fmt: skip


def _add_output_arguments(bench: argparse.ArgumentParser) -> None:
    """The outputs (JSON, HTML, the record) and Dynamo's interpreter."""
    bench.add_argument("--json", type=Path, default=None, help="write the rows as JSON to FILE ('-': stdout)")
    bench.add_argument("--html", type=Path, default=None, help="write a Plotly page of replicas, load and latency")
    bench.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="also write the rows with the date, the command and the commit (the docs' benchmark pages read these)",
    )  # fmt: skip
    bench.add_argument(
        "--dynamo-python", default=os.environ.get("DYNAMO_PYTHON"), metavar="PATH",
        help="Python of a virtualenv with ai-dynamo 1.6.1, for the dynamo-1.6.1 policies (default: $DYNAMO_PYTHON, "
        "else .dynamo-venv from `make dynamo-env`)",
    )  # fmt: skip
