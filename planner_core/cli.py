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

from planner_core.settings import RuntimeSettings
from planner_core.store.migrate import SchemaOutOfDate

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
DEFAULT_TRACE = SHARED_DIR / "traces" / "AzureLLMInferenceTrace_conv.csv"
DEFAULT_CONFIG = REPO_ROOT / "infra" / "configs" / "demo.yaml"

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
    from planner_core.store.db import resolve_database_url, stop_embedded_database, to_libpq_uri
    from planner_core.store.migrate import upgrade

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

    from planner_core.store.db import get_engine

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
    from planner_core.config import load_config
    from planner_core.perf.profile import load_profile
    from planner_core.service import resolve_profile_dir
    from planner_core.store.db import resolve_database_url
    from planner_core.traces import load_trace

    # Check the inputs before starting anything: a bad file is one line, not a failed flow run.
    config = load_config(args.config)
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

    from planner_core.store.prune import prune_history

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


def cmd_history(args: argparse.Namespace) -> int:
    """Decisions from `decision_history` as a table, CSV or JSON (the rows `history_frame` returns)."""
    import datetime as dt
    import json

    from planner_core.store.db import resolve_database_url
    from planner_core.store.history import history_frame, history_rows, jsonable_row, parse_time

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
    """Re-run recorded ticks and report what differs (see planner_core/replay.py)."""
    import datetime as dt
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.replay import replay
    from planner_core.store.db import resolve_database_url
    from planner_core.store.history import parse_time
    from planner_core.store.models import ReplayMode

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

    from planner_core import forecast_eval
    from planner_core.config import load_config, parse_config
    from planner_core.traces import bucket_windows, load_traces

    interval_s = forecast_eval.parse_interval(args.interval)
    names = forecast_eval.parse_predictors(args.predictor)
    source = str(args.config) if args.config is not None else "<forecast defaults>"
    base = load_config(args.config) if args.config is not None else parse_config({"optimization_target": "sla"}, source)
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
    capacity.add_argument("--isl", type=float, required=True, help="input sequence length (tokens)")
    capacity.add_argument("--osl", type=float, required=True, help="output sequence length (tokens)")
    capacity.add_argument("--ttft-ms", type=float, required=True, help="TTFT target (ms)")
    capacity.add_argument("--itl-ms", type=float, required=True, help="ITL target (ms)")
    capacity.add_argument("--prefill-gpus", type=int, default=1, help="GPUs per prefill engine")
    capacity.add_argument("--decode-gpus", type=int, default=1, help="GPUs per decode engine")
    capacity.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    capacity.set_defaults(func=cmd_capacity)

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
