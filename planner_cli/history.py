"""What was recorded: `planner history` and `planner replay`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from planner_cli.common import add_deployment_argument, print_example_queries, select_deployment
from planner_core.data import DEFAULT_CONFIG
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.times import TIME_HELP

if TYPE_CHECKING:  # pandas loads only when a table is printed
    import pandas as pd


def cmd_history(args: argparse.Namespace) -> int:
    """Decisions from `decision_history` as a table, CSV or JSON (the rows `history_frame` returns)."""
    import datetime as dt
    import json

    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.runtime.store.history import history_frame, history_rows, jsonable_row
    from planner_core.runtime.times import parse_time

    url = resolve_database_url()
    if args.all_deployments and (args.deployment or args.examples):
        raise ValueError("--all-deployments: give it without --deployment and --examples")
    deployment = None if args.all_deployments else select_deployment(url, args.deployment)
    if args.examples:
        print_example_queries(url, deployment)
        return 0
    since = parse_time(args.since, now=dt.datetime.now(dt.UTC)) if args.since else None
    if args.format == "json":
        print(json.dumps([jsonable_row(row) for row in history_rows(url, deployment, since)]))
        return 0
    frame = history_frame(url, deployment, since)
    if args.format == "csv":
        frame.to_csv(sys.stdout, index=False)
    elif frame.empty:
        print("no decisions" + (f" for deployment '{deployment}'" if deployment else ""))
    else:
        _print_table(frame)
    return 0


def _print_table(frame: pd.DataFrame) -> None:
    """One line per decision (cells cut to 40 characters), each followed by its `why` in full on its own line:
    the deciding stage and its numbers (`prefill 5->6: p99 prompt burst needs 7 (forecast 3); ...`, at most 160
    characters) do not fit a table cell."""
    lines = frame.drop(columns="why").to_string(index=False, max_colwidth=40).splitlines()
    print(lines[0])
    for line, why in zip(lines[1:], frame["why"], strict=True):
        print(line)
        if isinstance(why, str) and why:  # a decision with only routine steps has none (NULL)
            print(f"    why: {why}")


def cmd_replay(args: argparse.Namespace) -> int:
    """Re-run recorded ticks and report what differs (see planner_core/runtime/replay.py)."""
    import datetime as dt
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner_core.runtime.replay import replay
    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.runtime.store.models import ReplayMode
    from planner_core.runtime.times import parse_time

    settings = RuntimeSettings()
    now = dt.datetime.now(dt.UTC)
    start = parse_time(args.start, now=now, name="--from")
    end = parse_time(args.end, now=now, name="--to") if args.end else now
    config_dir = args.config_dir or (settings.config or DEFAULT_CONFIG).resolve().parent
    url = resolve_database_url(settings)
    deployment = select_deployment(url, args.deployment)
    console = Console(stderr=True)
    columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=args.json or not console.is_terminal) as bar:
        task = bar.add_task("replay", total=None)
        summary = replay(
            url,
            deployment,
            start,
            end,
            config_path=args.config,
            recorded_config_dir=config_dir,
            profile_dir=args.profile_dir,
            mode=ReplayMode(args.mode) if args.mode else None,
            jobs=args.jobs,
            on_progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    exact_check_failed = args.config is None and summary.num_differing > 0
    if args.json:
        print(json.dumps(summary.to_json()))
        return 1 if exact_check_failed else 0
    rate = summary.num_ticks / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    under = "the recorded configs" if args.config is None else str(args.config)
    if args.config is None and summary.revisions:
        under += f" (config revisions {', '.join(str(r) for r in summary.revisions)})"
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


def register(sub: argparse._SubParsersAction) -> None:
    """Add the history command group's parsers."""
    history = sub.add_parser("history", help="the decision history (decision_history view) as a table, CSV or JSON")
    add_deployment_argument(history)
    history.add_argument("--all-deployments", action="store_true", help="the decisions of every deployment")
    history.add_argument("--since", default=None, metavar="T", help=f"only decisions from T on: {TIME_HELP}")
    history.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table (a line per decision, cells cut to 40 characters, its why in full on the line below), CSV or JSON",
    )
    history.add_argument("--examples", action="store_true", help="print the example SQL queries and their output")
    history.set_defaults(func=cmd_history)

    replay = sub.add_parser("replay", help="re-run recorded ticks from their stored inputs and state; report changes")
    add_deployment_argument(replay)
    replay.add_argument("--from", dest="start", required=True, metavar="T", help=f"start of the range: {TIME_HELP}")
    replay.add_argument(
        "--to", dest="end", default=None, metavar="T", help="end of the range, excluded, like --from (default now)"
    )
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
    replay.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="processes replaying at once, each a part of the range of at least 1,000 ticks (default: the "
        "machine's cores); recorded states only: chained states follow the replayed ticks one after the other",
    )
    replay.add_argument("--json", action="store_true", help="print {ticks, identical, differing, differences} JSON")
    replay.add_argument("--limit", type=int, default=20, help="differing ticks listed in the text output")
    replay.set_defaults(func=cmd_replay)
