"""`planner` command line: database, demo, serving, decision history and replay.

One module per command group (`planner_cli.db`, `planner_cli.bench`, ...), each registering its parsers; a
handler parses its arguments, calls one function and prints.

Prefect is imported only by the commands that need it, after its environment (home directory, offline
switches) is set, so `planner db url` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from planner_cli import (
    audit,
    bench,
    capacity,
    chaos,
    completion,
    db,
    demo,
    forecast,
    history,
    ingest,
    k8s,
    keda,
    perf,
    report,
    serve,
    sim,
)
from planner_cli.parser import PlannerArgumentParser, VersionAction
from planner_core.runtime.store.migrate import SchemaOutOfDate

# In the order `planner --help` lists them.
COMMAND_GROUPS = (
    db, demo, serve, capacity, perf, report, bench, history, audit, chaos, forecast, k8s, keda, ingest, sim,
    completion,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = PlannerArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="the command to run")
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR (usual in containers)
    # platformdirs falls back to /tmp/runtime-<uid> and says so in two lines on every command. The fallback works,
    # and it is the dir every pgserver process shares its lock in, so keep it and drop only that notice.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given, for records of what was run
    try:
        return int(args.func(args))
    except (ValueError, LookupError, SchemaOutOfDate) as exc:  # config, trace, profile, schema: one line already
        print(f"planner: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
