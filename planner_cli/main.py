"""`planner` command line: database, demo, serving, decision history and replay.

One module per command group (`planner_cli.db`, `planner_cli.bench`, ...), each registering its parsers; a
handler parses its arguments, calls one function and prints.

Prefect is imported only by the commands that need it, after its environment (home directory, offline
switches) is set, so `planner db url` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import os
import signal
import sys
import warnings

from planner_cli import (
    audit,
    bench,
    capacity,
    chaos,
    completion,
    config,
    db,
    demo,
    doctor,
    fleet,
    forecast,
    history,
    ingest,
    k8s,
    keda,
    live,
    perf,
    profile,
    report,
    route_proxy,
    serve,
    sim,
)
from planner_cli.parser import PlannerArgumentParser, VersionAction, walk_parsers
from planner_cli.ranges import bound_numeric_options
from planner_core.runtime.redact import install_log_redaction, redact_text, redact_value
from planner_core.runtime.store.db import dispose_engines
from planner_core.runtime.store.migrate import SchemaOutOfDate

# In the order `planner --help` lists them.
COMMAND_GROUPS = (
    db, demo, serve, fleet, config, capacity, perf, profile, report, bench, history, audit, chaos, forecast, k8s, keda,
    ingest, sim, live, route_proxy, doctor, completion,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = PlannerArgumentParser(prog="planner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction, help="print the installed version and exit")
    parser.set_defaults(root_parser=parser)  # for commands that read the tree itself (`planner completion`)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="the command to run")
    for group in COMMAND_GROUPS:
        group.register(sub)
    for each in walk_parsers(parser):
        bound_numeric_options(each)  # every int and float option inside its range (planner_cli/ranges.py)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `planner` command: its exit status (130 when stopped by Ctrl-C or SIGTERM)."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        # a second stop that lands while the first one's cleanup runs (the `finally` below; seen in CI as a death by
        # SIGINT, -2, after "planner: interrupted" was printed, 2026-12-07): the command was stopping already
        return 130


def _run(argv: list[str] | None) -> int:
    # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR (usual in containers)
    # platformdirs falls back to /tmp/runtime-<uid> and says so in two lines on every command. The fallback works,
    # and it is the dir every pgserver process shares its lock in, so keep it and drop only that notice.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    # One OpenBLAS thread for every command, set before anything loads numpy: the predictors' statsmodels fits are
    # on 64 points, where BLAS threads only fight each other and other processes for the cores. `planner replay`
    # of the demo's 58 ticks took 8.1-15.5 s with OpenBLAS' default threads against 4.6-5.6 s with one (2-core
    # machine, load ~3.5, 2026-12-07); `demo` and `serve` already set it for their flows (`prefect_environment`).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if hasattr(signal, "SIGUSR1"):
        # `kill -USR1 <pid>` prints every thread's stack to stderr and the command goes on: how to see where a
        # command that seems stuck is waiting (`planner chaos` does it before killing a hung demo). Not when stderr
        # is no file (called in-process with stderr captured): there is nowhere to write the stacks to.
        with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
            faulthandler.register(signal.SIGUSR1, all_threads=True)
    install_log_redaction()  # a password quoted by any library's log line is masked before a handler sees it
    args = build_parser().parse_args(argv)
    args.argv = redact_value(list(sys.argv[1:] if argv is None else argv))  # as given (no password), for records
    try:
        return int(args.func(args))
    except (ValueError, LookupError, SchemaOutOfDate) as exc:  # config, trace, profile, schema: one line already
        print(f"planner: error: {redact_text(usage_error_line(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the last resort: one line, the traceback only on request
        if os.environ.get("PLANNER_DEBUG"):
            raise
        print(
            f"planner: error: {redact_text(one_line_error(exc))} (PLANNER_DEBUG=1 shows the traceback)", file=sys.stderr
        )
        return 1
    finally:
        dispose_engines()  # the pools' connections closed now, not by the garbage collector with a ResourceWarning


def usage_error_line(exc: ValueError | LookupError | SchemaOutOfDate) -> str:
    """The error of a bad input in one line. Ours are one line already; pydantic's `ValidationError` of the
    environment's settings (`RuntimeSettings`) lists each error on three: the first is kept, naming the variable,
    the value and what is wrong, and the others are counted."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError) or not exc.errors():
        return str(exc)
    first, *rest = exc.errors()
    where = ".".join(str(part) for part in first["loc"]) or exc.title
    if exc.title == "RuntimeSettings" and not where.isupper():  # a field read from its PLANNER_ variable
        where = f"PLANNER_{where.upper()}"
    more = f" (and {len(rest)} more)" if rest else ""
    return f"{exc.title}: {where} = {first.get('input')!r}: {first['msg']}{more}"


def one_line_error(exc: BaseException) -> str:
    """An unexpected failure in one line: what failed (the database, the Prefect server, ...) and its message.

    A lost database surfaces as SQLAlchemy's `OperationalError` (or psycopg's) wrapping the driver's multi-line text;
    only its first line is kept, and the SQL statement and parameters SQLAlchemy appends are dropped.
    """
    name = type(exc).__name__
    module = type(exc).__module__.split(".")[0]
    text = str(getattr(exc, "orig", None) or exc).split("\n[SQL:")[0]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if module in ("sqlalchemy", "psycopg"):
        return f"database unavailable or failing ({name}): {first}"
    if module in ("httpx", "httpcore", "prefect"):
        return f"Prefect server unavailable or failing ({name}): {first}"
    return f"{name}: {first}" if first else name


if __name__ == "__main__":
    raise SystemExit(main())
