"""`planner forecast`: the load predictors scored one window ahead on a trace."""

from __future__ import annotations

import argparse
from pathlib import Path


def _predictor_configs(args: argparse.Namespace, interval_s: int) -> dict:
    """Each predictor asked for, configured from `--config` (else the forecast defaults) at the window."""
    from planner_core.config import load_config, parse_config
    from planner_core.lab import forecast_eval

    names = forecast_eval.parse_predictors(args.predictor)
    source = str(args.config) if args.config is not None else "<forecast defaults>"
    base = (
        load_config(args.config).policy
        if args.config is not None
        else parse_config({"optimization_target": "sla"}, source).policy
    )
    log1p = True if args.log1p else None
    return {name: forecast_eval.predictor_config(base, name, interval_s, log1p=log1p, source=source) for name in names}


def cmd_forecast(args: argparse.Namespace) -> int:
    """Score load predictors one window ahead on a trace, with Dynamo's predictor-sweep loss."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.lab import forecast_eval
    from planner_core.traces import bucket_windows, load_traces

    interval_s = forecast_eval.parse_interval(args.interval)
    configs = _predictor_configs(args, interval_s)
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

    for line in forecast_eval.score_table(scores):
        print(line)
    print(forecast_eval.LOSS_NOTE)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the forecast command group's parsers."""
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
