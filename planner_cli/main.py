"""`planner` command line: database, demo, serving, decision history and replay.

One module per command group (`planner_cli.db`, `planner_cli.bench`, ...), each registering its parsers; a
handler parses its arguments, calls one function and prints.

Prefect is imported only by the commands that need it, after its environment (home directory, offline
switches) is set, so `planner db url` stays fast.
"""

from __future__ import annotations

import argparse
import sys

from planner_cli import bench, capacity, db, demo, forecast, history, ingest, k8s, perf, report, serve, sim
from planner_core.runtime.store.migrate import SchemaOutOfDate

# In the order `planner --help` lists them.
COMMAND_GROUPS = (db, demo, serve, capacity, perf, report, bench, history, forecast, k8s, ingest, sim)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given, for records of what was run
    try:
        return int(args.func(args))
    except (ValueError, LookupError, SchemaOutOfDate) as exc:  # config, trace, profile, schema: one line already
        print(f"planner: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
