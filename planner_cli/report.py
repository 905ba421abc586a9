"""`planner report`: the HTML diagnostics report of a deployment."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
        print(f"planner: warning: no ticks of {args.deployment!r} in the window", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the report command group's parsers."""
    report = sub.add_parser("report", help="write the HTML diagnostics report of a deployment (15 Plotly charts)")
    report.add_argument("--deployment", default="demo", help="managed-deployment name (default demo)")
    report.add_argument("--since", default=None, help="first tick time included, ISO 8601 (UTC unless an offset)")
    report.add_argument("--until", default=None, help="ticks before this time, ISO 8601 (UTC unless an offset)")
    report.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    report.add_argument("--log", action="store_true", help="also write the tick rows to <out>.log.jsonl.gz")
    report.add_argument(
        "--self-contained", action="store_true",
        help="inline plotly.js in the page (~4.8 MB) instead of loading the copy written beside it",
    )  # fmt: skip
    report.set_defaults(func=cmd_report)
