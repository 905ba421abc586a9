"""`planner chaos`: kill -9 the demo's processes at random and check that no decision is duplicated or lost. The
fault suite is the lab's chaos room (`planner_core.lab.chaos`, whose docstring tells the run); this module parses
the command, runs it and prints the report's summary."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from planner_cli.common import DEFAULT_TRACE, check_output_path, stop_like_ctrl_c
from planner_core.data import CHAOS_CONFIG
from planner_core.lab.chaos.options import FAULTS


def cmd_chaos(args: argparse.Namespace) -> int:
    from planner_core.lab.chaos import ChaosOptions, report_clean, report_summary, run_chaos

    check_output_path(args.report, "--report")  # before the runs, not after them

    fields = {f.name for f in dataclasses.fields(ChaosOptions)} - {"argv"}
    options = ChaosOptions(**{name: getattr(args, name) for name in fields}, argv=tuple(args.argv))
    # SIGINT is set too, since a process started in the background by a shell inherits SIGINT ignored and Ctrl-C
    # (or a SIGINT sent to it) would otherwise be lost
    stop_like_ctrl_c()
    report = run_chaos(options)
    print(json.dumps(report_summary(report), indent=2, default=str))
    return 0 if report_clean(report) else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add the chaos command's parser."""
    chaos = sub.add_parser(
        "chaos", help="kill -9 the demo, Postgres and Prefect at random; report duplicated or lost decisions"
    )
    chaos.add_argument("--kills", type=int, default=10, help="faults to inject over demo runs (0: no demo leg)")
    chaos.add_argument(
        "--ingest-kills", type=int, default=0,
        help="faults to inject under a running FPM ingest first (kill -9 of the ingest, or of Postgres under it)",
    )  # fmt: skip
    chaos.add_argument(
        "--ingest-rate-hz", type=float, default=50.0, help="forward-pass messages per second the ingest leg publishes"
    )
    chaos.add_argument(
        "--ingest-reconnect-s", type=float, default=1.0,
        help="after a restarted ingest listens, how long a message may still be lost (publisher reconnection)",
    )  # fmt: skip
    chaos.add_argument("--windows", type=int, default=12, help="throughput windows of each demo run")
    chaos.add_argument("--seed", type=int, default=0, help="seed of the fault draws and their moments")
    chaos.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the demo's trace")
    chaos.add_argument(
        "--config", type=Path, default=CHAOS_CONFIG,
        help="the demo's PlannerConfig (default: the recommended policy without its scale-down hold: it decides often)",
    )  # fmt: skip
    chaos.add_argument("--rate-scale", type=float, default=12.0, help="the demo's --rate-scale")
    chaos.add_argument(
        "--data-dir", type=Path, default=None,
        help="folder of the run (its Postgres, Prefect home, logs); default: chaos-<time> in the data dir",
    )  # fmt: skip
    chaos.add_argument(
        "--faults", type=lambda text: tuple(text.split(",")), default=FAULTS,
        help=f"comma-separated fault kinds to draw from (default: all of {','.join(FAULTS)})",
    )  # fmt: skip
    chaos.add_argument(
        "--cycle", action="store_true", help="take the faults in turn (in --faults order) instead of drawing them"
    )
    chaos.add_argument(
        "--max-duration-s", type=float, default=None,
        help="inject no fault after this much wall time; the round under way is finished and reported",
    )  # fmt: skip
    chaos.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    chaos.add_argument(
        "--attempt-timeout-s", type=float, default=900.0, help="a demo attempt running longer is hung: killed"
    )
    chaos.set_defaults(func=cmd_chaos)
