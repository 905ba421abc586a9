"""`planner` command line: database, demo, serving, decision history and replay.

Prefect is imported only by the commands that need it, after its environment (home directory, offline
switches) is set, so `planner db url` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from planner_core.data import AZURE_CONV_TRACE, DEFAULT_CONFIG, H200_PROFILE_DIR
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.store.migrate import SchemaOutOfDate

DEFAULT_TRACE = AZURE_CONV_TRACE
DEFAULT_PROFILE = H200_PROFILE_DIR

EXAMPLE_QUERIES = (
    (
        "What did the planner decide, when, why, and what happened?",
        """SELECT decided_at, prefill_before AS p_before, decode_before AS d_before,
       target_prefill AS p_target, target_decode AS d_target, reason, status,
       num_attempts AS attempts, acknowledged_at IS NOT NULL AS acked
  FROM decision_history WHERE deployment = :deployment
 ORDER BY decided_at LIMIT 10""",
    ),
    (
        "Why did each tick end as it did, and how fast was the decision?",
        """SELECT reason, count(*) AS ticks, round(avg(observed_num_req)::numeric, 1) AS avg_requests,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY decide_ms)::numeric, 3) AS decide_ms_p50
  FROM tick_history WHERE deployment = :deployment
 GROUP BY reason ORDER BY ticks DESC""",
    ),
)


def _prefect_environment(settings: RuntimeSettings) -> None:
    """Offline-friendly Prefect defaults; anything the user set wins."""
    prefect_home = (settings.data_dir / "prefect").resolve()
    prefect_home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # Served runs inherit this: statsmodels (ARIMA) is 10-20x slower when OpenBLAS threads contend for 2 cores.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # A fresh Prefect home migrates its SQLite database on first start; on a busy 2-core machine that can
    # exceed Prefect's 20 s default.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def cmd_db(args: argparse.Namespace) -> int:
    from planner_core.runtime.store.db import resolve_database_url, stop_embedded_database, to_libpq_uri
    from planner_core.runtime.store.migrate import upgrade

    settings = RuntimeSettings()
    if args.action == "stop":
        stopped = stop_embedded_database(settings.embedded_pg_dir)
        print("stopped" if stopped else f"no embedded server running under {settings.embedded_pg_dir}")
        return 0
    url = resolve_database_url(settings)
    if args.action == "prune":
        return _db_prune(url, args)
    if args.action == "upgrade":
        upgrade(url)
        print("schema at head")
        return 0
    print(url)
    print(f'psql "{to_libpq_uri(url)}"', file=sys.stderr)
    return 0


def print_queries(database_url: str, deployment: str) -> None:
    import pandas as pd

    from planner_core.runtime.store.db import get_engine

    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 20)
    with get_engine(database_url).connect() as conn:
        for title, sql in EXAMPLE_QUERIES:
            from sqlalchemy import text

            frame = pd.read_sql(text(sql), conn, params={"deployment": deployment})
            print(f"\n-- {title}\n{sql};\n")
            print(frame.to_string(index=False))


def cmd_demo(args: argparse.Namespace) -> int:
    settings = RuntimeSettings()
    _prefect_environment(settings)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # keep the progress bar readable
    from flows.prefect_server import prefect_api
    from planner_core.config import load_config, resolve_profile_dir
    from planner_core.perf.profile import load_profile
    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.traces import load_trace

    # Check the inputs before starting anything: a bad file is one line, not a failed flow run.
    config = load_config(args.config).policy
    load_profile(resolve_profile_dir(config, args.config))
    load_trace(args.trace)
    if args.rate_scale <= 0:
        raise ValueError(f"--rate-scale = {args.rate_scale!r}: must be > 0")
    url = resolve_database_url(settings)
    started = time.perf_counter()
    with prefect_api() as api_url:
        print(f"Prefect API: {api_url}", file=sys.stderr)
        from flows.demo import demo  # Prefect reads its settings at import: import after PREFECT_API_URL is set

        result = demo(
            trace_path=str(args.trace),
            config_path=str(args.config),
            deployment=args.deployment,
            startup_s=args.startup_s,
            rate_scale=args.rate_scale,
            max_windows=args.max_windows,
            database_url=url,
        )
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
    print("  replica timeline (simulated time since the first request -> prefill/decode targets):")
    print("    " + "  ".join(f"{at_s / 60:.0f}m {p}P/{d}D" for at_s, p, d in result["scale_events"]) or "    none")
    print(f"  report: {result['report_path']}")
    print_queries(url, result["deployment"])
    print(f"\nConnect with: planner db url   (data under {settings.data_dir.resolve()})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    settings = RuntimeSettings()
    _prefect_environment(settings)
    from flows.prefect_server import prefect_api

    with prefect_api(port=args.port) as api_url:
        print(f"Prefect UI: {api_url.removesuffix('/api')}", file=sys.stderr)
        from flows.serve import serve_deployments  # import after PREFECT_API_URL is set (settings load at import)

        serve_deployments(config_path=args.config, deployment=args.deployment)
    return 0


def _db_prune(url: str, args: argparse.Namespace) -> int:
    """`planner db prune --older-than DAYS`: delete old high-volume tick detail in batches (see store/prune.py)."""
    import datetime as dt

    from planner_core.runtime.store.prune import prune_history

    if args.older_than is None:
        raise ValueError("planner db prune: --older-than DAYS is required")
    summary = prune_history(
        url,
        older_than_days=args.older_than,
        now=dt.datetime.now(dt.UTC),
        deployment=args.deployment,
        batch_size=args.batch_size,
        dry_run=args.dry_run,
    )
    verb = "would delete" if summary.dry_run else "deleted"
    print(f"ticks scheduled before {summary.cutoff.isoformat(timespec='seconds')}:")
    for name, counts in summary.by_deployment.items():
        print(
            f"  {name}: {counts.num_ticks} ticks examined; {verb} {counts.num_fpm_snapshots} fpm_snapshots, "
            f"{counts.num_tick_steps} tick_steps, {counts.num_planner_states} planner_states"
        )
    if not summary.by_deployment:
        print("  no deployments")
    if not summary.dry_run:
        print(f"{summary.num_batches} batches, each one transaction with its history_pruned audit event")
    return 0


def _bench_trace(args: argparse.Namespace):  # noqa: ANN202 - RequestTrace, imported lazily
    """The bench's requests: the trace, rate-scaled or shaped by a ServeGen daily cycle, then time-compressed."""
    from planner_core.traces import load_servegen_shape, load_trace, shape_trace

    trace = load_trace(args.trace)
    if args.shape is not None:
        shape = load_servegen_shape(args.shape).daily()
        trace = shape_trace(
            trace,
            shape,
            duration_s=args.shape_hours * 3600.0,
            rate_factor=args.rate_scale,
            start_s=args.shape_start_h * 3600.0,
        )
    elif args.rate_scale != 1.0:
        trace = trace.scaled(args.rate_scale)
    if args.compress != 1.0:
        trace = trace.compressed(args.compress)
    return trace


def cmd_bench(args: argparse.Namespace) -> int:
    """Run scaling policies side by side on one trace in the discrete-event simulator."""
    import dataclasses
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.config import load_config
    from planner_core.domain import EngineLimits
    from planner_core.lab.sim.bench import (
        DEFAULT_AGG_POLICIES,
        DEFAULT_POLICIES,
        OraclePolicy,
        UserPlannerConfig,
        bench_figure,
        build_policies,
        run_bench,
    )
    from planner_core.lab.sim.des import SimSpec
    from planner_core.lab.sim.oracle import OracleSettings
    from planner_core.perf.model import ProfilePerfModel
    from planner_core.perf.table import TablePerfModel
    from planner_core.runtime.service import load_plugins

    trace = _bench_trace(args)
    perf = ProfilePerfModel.load(args.profile, perf_table=args.perf_table)
    fwd = perf.forward_pass_model()
    assert fwd is not None
    # a perf table describes engines of `tp` GPUs: the simulator's engines and the planners' sizing both use it
    gpus_per_engine = fwd.table.header.tp if isinstance(fwd, TablePerfModel) else 1
    base = {
        "ttft_ms": args.ttft_ms,
        "itl_ms": args.itl_ms,
        "max_gpu_budget": args.max_gpu_budget,
        "throughput_adjustment_interval_seconds": args.throughput_interval_s,
        "max_throughput_scaling_replicas": 8,
        "prefill_engine_num_gpu": gpus_per_engine,
        "decode_engine_num_gpu": gpus_per_engine,
    }
    aggregated = args.mode == "agg"
    if args.policies is None:
        args.policies = ",".join(DEFAULT_AGG_POLICIES if aggregated else DEFAULT_POLICIES)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    max_kv_tokens = args.max_kv_tokens or perf.profiled_max_kv_tokens() or 2_000_000
    spec = SimSpec(
        prefill_limits=EngineLimits(num_gpu=gpus_per_engine),
        decode_limits=EngineLimits(num_gpu=gpus_per_engine, max_kv_tokens=max_kv_tokens),
        startup_s=args.startup_s,
        aggregated=aggregated,  # the aggregated engines are the decode pool: `decode_limits`, GPUs per engine
    )
    user_configs = []
    for path in args.config or ():
        config = load_config(path).policy
        plugins, broken = load_plugins(config, perf, source=str(path))
        for error in broken:
            print(
                f"bench: {path}: plugin {error.entry_point} ({error.target}) not loaded: {error.message}",
                file=sys.stderr,
            )
        if (config.ttft_ms, config.itl_ms) != (args.ttft_ms, args.itl_ms):
            print(
                f"bench: {path} plans for TTFT {config.ttft_ms:g} ms / ITL {config.itl_ms:g} ms; requests are scored "
                f"against --ttft-ms {args.ttft_ms:g} / --itl-ms {args.itl_ms:g}",
                file=sys.stderr,
            )
        taken = {*names, *(user.name for user in user_configs)}
        name = f"config:{path.stem}" if f"config:{path.stem}" not in taken else f"config:{path}"
        user_configs.append(UserPlannerConfig(name=name, config=config, plugins=plugins))
    oracle = OracleSettings(target_attainment=args.oracle_target, context_s=args.oracle_context_s)
    print("bench: sizing the policies (the oracle simulates every window at several sizes)...", file=sys.stderr)
    policies = build_policies(
        names, base, trace, perf, fwd, spec, window_s=args.throughput_interval_s, oracle=oracle, initial=args.initial,
        dynamo_python=args.dynamo_python, user_configs=user_configs,
    )  # fmt: skip
    with Progress(
        TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), transient=True, disable=args.json is not None and str(args.json) == "-",
    ) as progress:  # fmt: skip
        task = progress.add_task(policies[0].name if policies else "", total=len(policies))

        def done(_row) -> None:  # noqa: ANN001
            progress.advance(task)
            upcoming = [p.name for p in policies][int(progress.tasks[0].completed) :]
            progress.update(task, description=upcoming[0] if upcoming else "")

        runs = run_bench(policies, trace, fwd, spec, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, on_policy_done=done)
    rows = [dataclasses.asdict(run.row) for run in runs]
    if args.json is not None:
        text = json.dumps(rows, indent=1)
        if str(args.json) == "-":
            print(text)
        else:
            args.json.write_text(text + "\n", encoding="utf-8")
    if args.html is not None:
        bench_figure(runs, trace).write_html(str(args.html), include_plotlyjs=True)
    if args.json is None or str(args.json) != "-":
        print(
            f"{trace.source}: {trace.num_requests} requests, {trace.duration_s / 3600:.2f} h; "
            f"{'aggregated engines; ' if aggregated else ''}"
            f"SLA TTFT {args.ttft_ms:g} ms / ITL {args.itl_ms:g} ms; start-up {args.startup_s:g} s; "
            f"{runs[0].row.attainable:.1%} of requests can meet both alone"
            if runs
            else ""
        )
        for policy in policies:
            if isinstance(policy, OraclePolicy):
                sizes = " ".join(f"{d}" if aggregated else f"{p}/{d}" for p, d in policy.sizes)
                infeasible = sum(not w.feasible for w in policy.windows)
                pools = "aggregated engines" if aggregated else "prefill/decode"
                print(
                    f"  oracle ({pools} per {policy.interval_s:g} s window, >= {args.oracle_target:.1%} of "
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
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """Decisions from `decision_history` as a table, CSV or JSON (the rows `history_frame` returns)."""
    import datetime as dt
    import json

    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.runtime.store.history import history_frame, history_rows, jsonable_row, parse_time

    url = resolve_database_url()
    if args.examples:
        print_queries(url, args.deployment or "demo")
        return 0
    since = parse_time(args.since, now=dt.datetime.now(dt.UTC)) if args.since else None
    if args.format == "json":
        print(json.dumps([jsonable_row(row) for row in history_rows(url, args.deployment, since)]))
        return 0
    frame = history_frame(url, args.deployment, since)
    if args.format == "csv":
        frame.to_csv(sys.stdout, index=False)
    elif frame.empty:
        print("no decisions" + (f" for deployment '{args.deployment}'" if args.deployment else ""))
    else:
        print(frame.to_string(index=False, max_colwidth=40))  # CSV and JSON carry `why` in full
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Re-run recorded ticks and report what differs (see planner_core/runtime/replay.py)."""
    import datetime as dt
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.runtime.replay import replay
    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.runtime.store.history import parse_time
    from planner_core.runtime.store.models import ReplayMode

    settings = RuntimeSettings()
    now = dt.datetime.now(dt.UTC)
    start = parse_time(args.start, now=now, name="--from")
    end = parse_time(args.end, now=now, name="--to") if args.end else now
    config_dir = args.config_dir or (settings.config or DEFAULT_CONFIG).resolve().parent
    console = Console(stderr=True)
    columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=args.json or not console.is_terminal) as bar:
        task = bar.add_task("replay", total=None)
        summary = replay(
            resolve_database_url(settings),
            args.deployment,
            start,
            end,
            config_path=args.config,
            recorded_config_dir=config_dir,
            profile_dir=args.profile_dir,
            mode=ReplayMode(args.mode) if args.mode else None,
            on_progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    exact_check_failed = args.config is None and summary.num_differing > 0
    if args.json:
        print(json.dumps(summary.to_json()))
        return 1 if exact_check_failed else 0
    rate = summary.num_ticks / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    under = "the recorded configs" if args.config is None else str(args.config)
    print(
        f"Replayed {summary.num_ticks} ticks of '{summary.deployment}' scheduled in [{start.isoformat()}, "
        f"{end.isoformat()}) under {under}, {summary.mode.value} states, in {summary.elapsed_s:.2f} s "
        f"({rate:,.0f} ticks/s)"
    )
    print(
        f"  {summary.num_identical} identical, {summary.num_differing} differing, {summary.num_skipped} skipped "
        f"(replay run {summary.run_id}: SELECT * FROM replay_comparison WHERE run_id = {summary.run_id})"
    )
    shown = summary.differences[: args.limit]
    for difference in shown:
        fields = difference.fields
        what = "; ".join(
            f["field"] if "note" in f else f"{f['field']}: {_short(f['recorded'])} -> {_short(f['replayed'])}"
            for f in fields[:4]
        )
        if len(fields) > 4:
            what += f"; ... {len(fields) - 4} more"
        print(
            f"  tick {difference.tick_id} {difference.loop} {difference.scheduled_at.isoformat()} "
            f"{difference.outcome.value}: {what or difference.detail}"
        )
    if len(summary.differences) > len(shown):
        print(f"  ... {len(summary.differences) - len(shown)} more (--limit, --json or the replay_comparison view)")
    return 1 if exact_check_failed else 0


def _short(value: object, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def cmd_forecast(args: argparse.Namespace) -> int:
    """Score load predictors one window ahead on a trace, with Dynamo's predictor-sweep loss."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.config import load_config, parse_config
    from planner_core.lab import forecast_eval
    from planner_core.traces import bucket_windows, load_traces

    interval_s = forecast_eval.parse_interval(args.interval)
    names = forecast_eval.parse_predictors(args.predictor)
    source = str(args.config) if args.config is not None else "<forecast defaults>"
    base = (
        load_config(args.config).policy
        if args.config is not None
        else parse_config({"optimization_target": "sla"}, source).policy
    )
    log1p = True if args.log1p else None
    configs = {
        name: forecast_eval.predictor_config(base, name, interval_s, log1p=log1p, source=source) for name in names
    }
    trace = load_traces(args.trace)
    windows = bucket_windows(trace, interval_s)
    if args.dump_windows is not None:
        lines = [json.dumps(record) + "\n" for record in forecast_eval.window_records(trace, interval_s)]
        try:
            Path(args.dump_windows).write_text("".join(lines))
        except OSError as exc:
            raise ValueError(f"--dump-windows {args.dump_windows}: cannot write ({exc.strerror or exc})") from exc

    console = Console(stderr=True)
    columns = (TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=args.json or not console.is_terminal) as bar:
        tasks = {name: bar.add_task(name, total=len(windows)) for name in configs}
        scores, skip_first = forecast_eval.evaluate(windows, configs, on_step=lambda name: bar.advance(tasks[name]))

    if args.json:
        print(json.dumps([score.to_json() for score in scores], indent=2))
        return 0
    num_empty = sum(window.num_req == 0 for window in windows)
    print(
        f"{trace.source}: {trace.num_requests} requests over {trace.duration_s / 60:.1f} min -> "
        f"{len(windows)} windows of {interval_s} s ({num_empty} empty)"
    )
    why = "the largest minimum number of points of the predictors evaluated, so all are scored on the same windows"
    if skip_first < len(windows):
        print(f"scored on windows {skip_first + 1}..{len(windows)}: the first {skip_first} are not scored ({why})")
    else:
        print(f"no window scored: the first {skip_first} windows are not scored ({why})")

    def cell(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    header = ("predictor", "loss", "MAPE req %", "MAPE ISL %", "MAPE OSL %", "ms/step p50", "ms/step p99", "fallback")
    rows = [
        (
            score.predictor + (" (log1p)" if score.log1p else ""),
            cell(score.loss, 4),
            cell(score.mape_requests, 1),
            cell(score.mape_isl, 1),
            cell(score.mape_osl, 1),
            cell(score.ms_per_step_p50, 2),
            cell(score.ms_per_step_p99, 2),
            f"{score.num_fallback}/{score.num_scored}",
        )
        for score in scores
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(
                text.ljust(width) if i == 0 else text.rjust(width)
                for i, (text, width) in enumerate(zip(row, widths, strict=True))
            )
        )
    print(
        "loss: Dynamo's 0.4*e(N*ISL) + 0.4*e(N*OSL) + 0.1*e(ISL) + 0.1*e(OSL), e = |log1p(forecast) - log1p(actual)|, "
        "mean over scored windows; MAPE skips windows whose actual value is 0; ms/step = predict_next + "
        "observe_window over all windows; fallback = scored windows where predict_next reported predictor_fallback "
        "for any of its series (percentile series included)"
    )
    return 0


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


def cmd_k8s_check(args: argparse.Namespace) -> int:
    """Validate the parent DynamoGraphDeployment as the planner does at start-up; show what it would scale."""
    from planner_core.config import load_config
    from planner_core.runtime.connectors.kubernetes import KubernetesApiError, KubernetesConnector, readiness_problem
    from planner_core.runtime.service import default_workers

    config = load_config(args.config).policy
    connector = KubernetesConnector.connect(config)
    try:
        problem = readiness_problem(connector.read_dgd([]))
        counts = connector.worker_counts(None, 0, default=default_workers(config))
    except KubernetesApiError as exc:
        raise ValueError(str(exc)) from None
    info = connector.info
    print(f"{info.label} ({info.api_version}): {'ready' if problem is None else 'NOT READY: ' + problem}")
    print(f"  model: {info.model_name}")
    for role, component in info.roles:
        gpus = (
            "no GPU resources" if component.gpus_per_replica is None else f"{component.gpus_per_replica} GPU(s)/replica"
        )
        print(
            f"  {role.value}: {component.name} (type {component.component_type}), {gpus}, "
            f"{counts.ready(role)} ready of {counts.expected(role)} expected"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the HTML diagnostics report of one deployment over a time window."""
    import datetime as dt

    from planner_core.runtime.report import generate_report, parse_report_time
    from planner_core.runtime.store.db import resolve_database_url, session_factory

    since = parse_report_time(args.since, "--since")
    until = parse_report_time(args.until, "--until")
    if since is not None and until is not None and since >= until:
        raise ValueError(f"--since {args.since!r} is not before --until {args.until!r}")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out}: is a directory (give a file name, e.g. report.html)")
    with session_factory(resolve_database_url()).begin() as session:
        try:
            written = generate_report(
                session,
                args.deployment,
                out,
                since=since,
                until=until,
                generated_at=dt.datetime.now(dt.UTC),
                write_log=args.log,
            )
        except OSError as exc:
            raise ValueError(f"--out {out}: cannot write ({exc.strerror or exc})") from exc
    summary = written.summary
    num_ticks = sum(summary.num_ticks.values())
    print(
        f"{written.path}: {written.num_charts} charts, {num_ticks} ticks, "
        f"{sum(summary.num_decisions.values())} decisions, {summary.gpu_hours:.2f} GPU-hours"
    )
    if written.log_path is not None:
        print(f"{written.log_path}: tick log (JSON lines, gzip)")
    if num_ticks == 0:
        print(f"planner: warning: no ticks of {args.deployment!r} in the window", file=sys.stderr)
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    """Receive forward-pass metrics over ZMQ into Postgres until SIGINT/SIGTERM."""
    import logging

    from planner_core.runtime.ingest import FpmIngest, resolve_deployment_id, serve_until_signalled
    from planner_core.runtime.store.db import resolve_database_url

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = RuntimeSettings()
    deployment = args.deployment or settings.deployment
    config = args.config or settings.config or DEFAULT_CONFIG
    url = resolve_database_url(settings)
    deployment_id = resolve_deployment_id(url, deployment, config)
    retention_minutes = settings.fpm_retention_minutes if args.retention_minutes is None else args.retention_minutes
    if retention_minutes <= 0:
        raise ValueError(f"--retention-minutes = {retention_minutes!r}: must be > 0")
    bind = args.bind or ([] if args.connect else [settings.fpm_bind])
    ingest = FpmIngest(url, deployment_id, bind=bind, connect=args.connect or (), retention_s=retention_minutes * 60)
    print(
        f"ingesting forward-pass metrics for deployment '{deployment}' on {', '.join(ingest.endpoints)} "
        f"(retention {retention_minutes:g} min); stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    stats = serve_until_signalled(ingest, stats_every_s=args.stats_every_s)
    print(f"stopped: {stats.summary()}", file=sys.stderr)
    return 0


def cmd_fpm_publish(args: argparse.Namespace) -> int:
    """Publish synthetic forward-pass metrics to an ingest (trials and throughput measurements)."""
    import random

    from planner_core.domain import Component
    from planner_core.runtime.ingest import FpmPublisher, synthetic_fpm

    if args.rate <= 0 or args.seconds <= 0 or args.workers <= 0:
        raise ValueError("--rate, --seconds and --workers must be > 0")
    rng = random.Random(args.seed)
    component = Component(args.component)
    with FpmPublisher(args.connect) as publisher:
        if not publisher.wait_for_subscriber(timeout_s=10.0):
            raise ValueError(f"--connect {args.connect}: no ingest subscribed within 10 s")
        started = time.perf_counter()
        total = int(args.rate * args.seconds)
        for i in range(total):
            worker = i % args.workers
            publisher.publish(synthetic_fpm(component, f"worker-{worker}", i // args.workers, rng))
            ahead_s = (i + 1) / args.rate - (time.perf_counter() - started)
            if ahead_s > 0:
                time.sleep(ahead_s)
        elapsed_s = time.perf_counter() - started
    print(f"published {total} messages from {args.workers} workers in {elapsed_s:.2f} s ({total / elapsed_s:.0f}/s)")
    return 0


def cmd_sim_exporter(args: argparse.Namespace) -> int:
    """Serve the simulated frontend's Dynamo-named metrics of a trace replay on /metrics."""
    import signal
    import threading

    from planner_core.config import load_config, resolve_profile_dir
    from planner_core.lab.sim.des import ClusterSimulator, spec_for_config
    from planner_core.lab.sim.exporter import TraceMetricsExporter
    from planner_core.perf.model import ProfilePerfModel
    from planner_core.traces import load_trace

    config = load_config(args.config).policy
    profile_dir = resolve_profile_dir(config, args.config)
    perf = ProfilePerfModel.load(profile_dir)
    fwd = perf.forward_pass_model()
    if fwd is None:
        raise ValueError(f"{profile_dir}: the profile gives no forward-pass model to time the simulator with")
    trace = load_trace(args.trace).scaled(args.rate_scale)
    spec = spec_for_config(config, profiled_max_kv_tokens=perf.profiled_max_kv_tokens())
    num_prefill = 0 if spec.aggregated else args.prefill
    sim = ClusterSimulator(trace, fwd, spec, num_prefill=num_prefill, num_decode=args.decode)
    exporter = TraceMetricsExporter(
        sim,
        model=config.model_name or "model",
        namespace=config.namespace,
        speedup=args.speedup,
        kv_hit_rate=args.kv_hit_rate,
        accept_length=args.accept_length,
    )
    port = exporter.serve(args.port, args.addr)
    print(
        f"serving {trace.source} ({trace.num_requests} requests, {trace.duration_s / args.speedup:.0f} s of wall time) "
        f"at http://{args.addr}:{port}/metrics; stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    exporter.stop()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="the database: url (print how to connect), upgrade, stop, prune")
    db.add_argument("action", choices=["url", "upgrade", "stop", "prune"])
    db.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="prune: ticks older than DAYS")
    db.add_argument("--deployment", default=None, help="prune: only this deployment (default all)")
    db.add_argument("--batch-size", type=int, default=5000, help="prune: ticks per transaction")
    db.add_argument("--dry-run", action="store_true", help="prune: count what would be deleted, delete nothing")
    db.set_defaults(func=cmd_db)

    demo = sub.add_parser("demo", help="run the planner loop on a real trace in simulated time")
    demo.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure CSV or Mooncake JSONL trace")
    demo.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="PlannerConfig YAML/JSON")
    demo.add_argument("--deployment", default="demo", help="managed-deployment name (a new name starts afresh)")
    demo.add_argument("--startup-s", type=float, default=120.0, help="simulated worker start-up time")
    demo.add_argument("--rate-scale", type=float, default=12.0, help="multiply the trace's request rate (shape kept)")
    demo.add_argument("--max-windows", type=int, default=None, help="stop after this many throughput windows")
    demo.set_defaults(func=cmd_demo)

    serve = sub.add_parser("serve", help="serve the throughput-tick, load-tick and execute-decisions deployments")
    serve.add_argument("--config", type=Path, default=None, help="PlannerConfig (default: PLANNER_CONFIG or demo)")
    serve.add_argument("--deployment", default=None, help="managed-deployment name (default: PLANNER_DEPLOYMENT)")
    serve.add_argument("--port", type=int, default=4200, help="port of the local Prefect server")
    serve.set_defaults(func=cmd_serve)

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

    report = sub.add_parser("report", help="write the HTML diagnostics report of a deployment (15 Plotly charts)")
    report.add_argument("--deployment", default="demo", help="managed-deployment name (default demo)")
    report.add_argument("--since", default=None, help="first tick time included, ISO 8601 (UTC unless an offset)")
    report.add_argument("--until", default=None, help="ticks before this time, ISO 8601 (UTC unless an offset)")
    report.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    report.add_argument("--log", action="store_true", help="also write the tick rows to <out>.log.jsonl.gz")
    report.set_defaults(func=cmd_report)

    bench = sub.add_parser("bench", help="compare scaling policies on one trace in the cluster simulator")
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
    bench.add_argument(
        "--config", type=Path, action="append", default=None, metavar="FILE",
        help="a planner config to bench as policy config:<file stem> (its own settings and plugins); repeatable",
    )  # fmt: skip
    bench.add_argument(
        "--policies",
        default=None,
        help="comma-separated: static-peak, static-mean, oracle, threshold, dynamo-0x, dynamo-1x, planner, fixed:P:D, "
        "dynamo-1.6.1, dynamo-1.6.1-load (Dynamo's own planner; needs --dynamo-python). Default: "
        "static-peak,static-mean,oracle,threshold,dynamo-0x,dynamo-1x,planner; with --mode agg the same without "
        "dynamo-0x, and fixed:N (N aggregated engines)",
    )
    bench.add_argument(
        "--mode", choices=("disagg", "agg"), default="disagg",
        help="disaggregated prefill/decode pools, or one pool of aggregated engines (chunked prefill on decode)",
    )  # fmt: skip
    bench.add_argument("--ttft-ms", type=float, default=500.0, help="TTFT target (ms)")
    bench.add_argument("--itl-ms", type=float, default=50.0, help="ITL target (ms)")
    bench.add_argument("--startup-s", type=float, default=120.0, help="worker start-up time (s)")
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
    bench.add_argument("--json", type=Path, default=None, help="write the rows as JSON to FILE ('-': stdout)")
    bench.add_argument("--html", type=Path, default=None, help="write a Plotly page of replicas, load and latency")
    bench.add_argument(
        "--dynamo-python", default=os.environ.get("DYNAMO_PYTHON"), metavar="PATH",
        help="Python of a virtualenv with ai-dynamo 1.6.1, for the dynamo-1.6.1 policies (default: $DYNAMO_PYTHON)",
    )  # fmt: skip
    bench.set_defaults(func=cmd_bench)

    history = sub.add_parser("history", help="the decision history (decision_history view) as a table, CSV or JSON")
    history.add_argument("--deployment", default=None, help="only this deployment (default all)")
    history.add_argument("--since", default=None, help="ISO 8601 time (naive = UTC) or a span back from now: 12h, 7d")
    history.add_argument("--format", choices=["table", "csv", "json"], default="table")
    history.add_argument("--examples", action="store_true", help="print the example SQL queries and their output")
    history.set_defaults(func=cmd_history)

    replay = sub.add_parser("replay", help="re-run recorded ticks from their stored inputs and state; report changes")
    replay.add_argument("--deployment", required=True, help="managed deployment whose ticks are replayed")
    replay.add_argument("--from", dest="start", required=True, help="ISO 8601 time (naive = UTC) or a span: 7d")
    replay.add_argument("--to", dest="end", default=None, help="end of the range, excluded (default now)")
    replay.add_argument("--config", type=Path, default=None, help="what-if config (default: each tick's recorded one)")
    replay.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="folder the recorded config file was in, for its relative paths (default: PLANNER_CONFIG's or demo's)",
    )
    replay.add_argument("--profile-dir", type=Path, default=None, help="profile folder instead of the configs' own")
    replay.add_argument(
        "--mode",
        choices=["recorded", "chained"],
        default=None,
        help="state each tick starts from: recorded (default without --config) or chained (default with it)",
    )
    replay.add_argument("--json", action="store_true", help="print {ticks, identical, differing, differences} JSON")
    replay.add_argument("--limit", type=int, default=20, help="differing ticks listed in the text output")
    replay.set_defaults(func=cmd_replay)

    forecast = sub.add_parser("forecast", help="score the load predictors one window ahead on a trace (Dynamo's loss)")
    forecast.add_argument(
        "--trace", required=True, help="trace file, glob or folder (Azure CSV, Mooncake or Dynamo v1)"
    )
    forecast.add_argument("--interval", required=True, help="throughput window in whole seconds")
    forecast.add_argument("--predictor", default="all", help="constant|arima|prophet|kalman|ensemble|all (default all)")
    forecast.add_argument("--json", action="store_true", help="print the scores as JSON (no table, no progress bar)")
    forecast.add_argument("--log1p", action="store_true", help="fit the predictors on log1p(y)")
    forecast.add_argument("--config", type=Path, default=None, help="take predictor parameters from this PlannerConfig")
    forecast.add_argument("--dump-windows", type=Path, default=None, help="write the windows as JSON lines to FILE")
    forecast.set_defaults(func=cmd_forecast)

    k8s_check = sub.add_parser(
        "k8s-check", help="validate the parent DynamoGraphDeployment (DYN_PARENT_DGD_K8S_NAME) as at start-up"
    )
    k8s_check.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="PlannerConfig (mode, model_name)")
    k8s_check.set_defaults(func=cmd_k8s_check)

    ingest = sub.add_parser("ingest", help="receive engines' forward-pass metrics over ZMQ into Postgres")
    ingest.add_argument(
        "--bind", action="append", default=[], help="ZMQ endpoint to bind (repeatable; default PLANNER_FPM_BIND)"
    )
    ingest.add_argument("--connect", action="append", default=[], help="ZMQ endpoint of a publisher to connect to")
    ingest.add_argument("--deployment", default=None, help="managed-deployment name (default: PLANNER_DEPLOYMENT)")
    ingest.add_argument("--config", type=Path, default=None, help="config used if the deployment does not exist yet")
    ingest.add_argument("--retention-minutes", type=float, default=None, help="keep raw samples this long")
    ingest.add_argument("--stats-every-s", type=float, default=60.0, help="log the counters this often")
    ingest.set_defaults(func=cmd_ingest)

    publish = sub.add_parser("fpm-publish", help="publish synthetic forward-pass metrics to an ingest (trials)")
    publish.add_argument("--connect", default="tcp://127.0.0.1:20380", help="the ingest's ZMQ endpoint")
    publish.add_argument("--component", choices=["prefill", "decode"], default="decode")
    publish.add_argument("--workers", type=int, default=2, help="engines to imitate")
    publish.add_argument("--rate", type=float, default=100.0, help="messages per second, all engines together")
    publish.add_argument("--seconds", type=float, default=10.0)
    publish.add_argument("--seed", type=int, default=0)
    publish.set_defaults(func=cmd_fpm_publish)

    exporter = sub.add_parser("sim-exporter", help="serve a simulated frontend's metrics (Dynamo names) on /metrics")
    exporter.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace replayed against the wall clock")
    exporter.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="PlannerConfig (profile, SLA, names)")
    exporter.add_argument("--port", type=int, default=9400)
    exporter.add_argument("--addr", default="127.0.0.1")
    exporter.add_argument("--speedup", type=float, default=1.0, help="trace seconds per wall-clock second")
    exporter.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's request rate")
    exporter.add_argument("--prefill", type=int, default=1, help="simulated prefill workers")
    exporter.add_argument("--decode", type=int, default=1, help="simulated decode (or aggregated) workers")
    exporter.add_argument(
        "--kv-hit-rate", type=float, default=None, help="export this router KV hit rate (default: the simulated one)"
    )
    exporter.add_argument("--accept-length", type=float, default=None, help="export vLLM spec-decode counters")
    exporter.set_defaults(func=cmd_sim_exporter)

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, LookupError, SchemaOutOfDate) as exc:  # config, trace, profile, schema: one line already
        print(f"planner: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
