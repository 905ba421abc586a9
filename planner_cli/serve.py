"""`planner serve`: the Prefect deployments on the config's schedules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner_cli.common import add_deployment_argument, prefect_environment, select_deployment
from planner_core.runtime.settings import RuntimeSettings


def cmd_serve(args: argparse.Namespace) -> int:
    from planner_core.runtime.localhost import check_port_free
    from planner_core.runtime.service import served_config

    check_port_free(args.port)  # first: a taken port is one line within a second, before the config's checks
    settings = RuntimeSettings()
    path, loaded = served_config(args.config, settings)  # a bad config fails in one line before a Prefect server starts
    from planner_core.planner import budget_warnings

    for warning in budget_warnings(loaded.policy, Path(path)):  # not errors: said now, and recorded as it serves
        print(f"planner serve: warning: {warning}", file=sys.stderr)
    prefect_environment(settings)
    from flows.prefect_server import prefect_api

    with prefect_api(port=args.port, exit_when_lost=True) as api_url:
        print(f"Prefect UI: {api_url.removesuffix('/api')}", file=sys.stderr)
        from flows.serve import serve_deployments  # import after PREFECT_API_URL is set (settings load at import)

        serve_deployments(config_path=args.config, deployment=select_deployment(None, args.deployment, records=True))
    print("planner serve: stopped; the schedules are paused", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the serve command group's parsers."""
    serve = sub.add_parser("serve", help="serve the throughput-tick, load-tick and execute-decisions deployments")
    serve.add_argument(
        "--config", type=Path, default=None,
        help="PlannerConfig (default: PLANNER_CONFIG, else the recommended policy planner.yaml)",
    )  # fmt: skip
    add_deployment_argument(serve, records=True)
    serve.add_argument("--port", type=int, default=4200, help="port of the local Prefect server")
    serve.set_defaults(func=cmd_serve)
