"""`planner report`: the HTML diagnostics report of a deployment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner_cli.common import add_deployment_argument, select_deployment
from planner_core.runtime.times import TIME_HELP


def cmd_report(args: argparse.Namespace) -> int:
    """Write the HTML diagnostics report of one deployment over a time window."""
    import datetime as dt

    from planner_core.runtime.report import generate_report
    from planner_core.runtime.store.db import resolve_database_url, session_factory
    from planner_core.runtime.times import parse_time

    now = dt.datetime.now(dt.UTC)
    since = parse_time(args.since, now=now, name="--since") if args.since else None
    until = parse_time(args.until, now=now, name="--until") if args.until else None
    if since is not None and until is not None and since >= until:
        raise ValueError(f"--since {args.since!r} is not before --until {args.until!r}")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out}: is a directory (give a file name, e.g. report.html)")
    url = resolve_database_url()
    deployment = select_deployment(url, args.deployment)
    with session_factory(url).begin() as session:
        try:
            written = generate_report(
                session,
                deployment,
                out,
                since=since,
                until=until,
                generated_at=now,
                write_log=args.log,
                self_contained=args.self_contained,
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
        print(f"planner: warning: no ticks of {deployment!r} in the window", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the report command group's parsers."""
    report = sub.add_parser("report", help="write the HTML diagnostics report of a deployment (15 Plotly charts)")
    add_deployment_argument(report)
    report.add_argument("--since", default=None, metavar="T", help=f"first tick time included: {TIME_HELP}")
    report.add_argument(
        "--until", default=None, metavar="T", help="ticks before this time, like --since (default: no bound)"
    )
    report.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    report.add_argument("--log", action="store_true", help="also write the tick rows to <out>.log.jsonl.gz")
    report.add_argument(
        "--self-contained", action="store_true",
        help="inline plotly.js in the page (~4.8 MB) instead of loading the copy written beside it",
    )  # fmt: skip
    report.set_defaults(func=cmd_report)
