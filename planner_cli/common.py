"""What the command groups share: default inputs, the deployment a command acts on, the Prefect environment."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from planner_core.data import AZURE_CONV_TRACE, H200_PROFILE_DIR
from planner_core.runtime.settings import DEFAULT_DEPLOYMENT, RuntimeSettings

DEFAULT_TRACE = AZURE_CONV_TRACE
DEFAULT_PROFILE = H200_PROFILE_DIR

_KNOWN_SHOWN = 20  # deployment names listed in an error; a longer list would bury the message


def add_deployment_argument(parser: argparse.ArgumentParser, *, records: bool = False) -> None:
    """`--deployment NAME`, its help stating the rule `select_deployment` applies."""
    fallback = repr(DEFAULT_DEPLOYMENT) if records else "the only deployment recorded"
    parser.add_argument(
        "--deployment",
        default=None,
        metavar="NAME",
        help=f"managed deployment (default: PLANNER_DEPLOYMENT, else {fallback})",
    )


def select_deployment(database_url: str | None, requested: str | None, *, records: bool = False) -> str:
    """The managed deployment a command acts on; every command with `--deployment` (but the demo) asks here.

    The rule: `requested` (`--deployment`), else `PLANNER_DEPLOYMENT`, else a fallback. Commands that read what
    was recorded (history, report, replay, db prune) need a recorded name and fall back to the only deployment
    recorded. Commands that record (`records=True`: serve, ingest) may name a new deployment and fall back to
    `DEFAULT_DEPLOYMENT`, never to a guess from the database, so they cannot write into, say, the demo's.

    Args:
        database_url: the planner database (unused, and may be None, when `records`).
        requested: the `--deployment` value, None when not given.
        records: the command records ticks (serve, ingest) rather than reading them.

    Raises:
        LookupError: one line naming the deployments recorded, when a reading command names one not recorded,
            or names none and the database holds none or several.
        SchemaOutOfDate: a reading command on a database without the current schema.
    """
    env_name = RuntimeSettings().deployment
    name, source = (requested, "--deployment") if requested else (env_name, "PLANNER_DEPLOYMENT")
    if records:
        return name or DEFAULT_DEPLOYMENT
    from planner_core.runtime.store.db import session_factory
    from planner_core.runtime.store.migrate import check_schema_current
    from planner_core.runtime.store.repository import deployment_names

    if database_url is None:
        raise ValueError("select_deployment: a reading command needs the database URL")
    check_schema_current(database_url)  # one line with the fix, not a traceback on a missing table
    with session_factory(database_url).begin() as session:
        known = deployment_names(session)
    more = len(known) - _KNOWN_SHOWN
    shown = ", ".join(known[:_KNOWN_SHOWN]) + (f", ... {more} more" if more > 0 else "") or "none"
    if name:
        if name not in known:
            raise LookupError(f"{source} = {name!r}: no such deployment (known: {shown})")
        return name
    if len(known) == 1:
        return known[0]
    if not known:
        raise LookupError("no deployment recorded yet (known: none): run `planner demo` or `planner serve` first")
    raise LookupError(f"{len(known)} deployments recorded (known: {shown}): choose one with --deployment NAME")


def check_output_path(path: Path | None, flag: str) -> None:
    """Refuse, before any work, an output file whose folder does not exist or is not writable, or that names a
    folder: one line naming the flag and the path (`-` is stdout, and passes)."""
    if path is None or str(path) == "-":
        return
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder, not a file")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: folder {folder} is not writable")


def data_subfolder(path: Path | None, name: str) -> Path:
    """An output folder given by a flag, else `name` under PLANNER_DATA_DIR (`.planner` by default), where the
    database, Prefect's home and the reports already go."""
    return path if path is not None else RuntimeSettings().data_dir / name


def prefect_environment(settings: RuntimeSettings) -> None:
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


def print_example_queries(database_url: str, deployment: str) -> None:
    """The example queries on the history views, each with its answer (`planner demo`, `planner history
    --examples`)."""
    import pandas as pd

    from planner_core.runtime.store.history import example_query_frames

    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 20)
    for title, sql, frame in example_query_frames(database_url, deployment):
        print(f"\n-- {title}\n{sql};\n")
        print(frame.to_string(index=False))


def stop_like_ctrl_c() -> None:
    """SIGTERM (a stopped run) unwinds like Ctrl-C from here on, so the command's `finally` blocks stop what it
    started (servers, engines) instead of leaving them running."""
    import signal

    stopping = False

    def interrupt(*_: object) -> None:
        # the first signal stops the command; a second (an impatient Ctrl-C, a supervisor's repeat) must not break
        # the stopping half-way and leave servers behind (each is SIGKILLed after its own grace anyway). Ignoring
        # the signals is not enough: Prefect's flow engine puts back the handler it found (this one) when the
        # interrupt unwinds through a flow run, and re-sends a SIGTERM it caught; a second KeyboardInterrupt then
        # escaped `main` after "planner: interrupted", and the process died of SIGINT (-2) instead of exiting 130.
        nonlocal stopping
        if stopping:
            return
        stopping = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
