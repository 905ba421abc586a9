"""Serve the planner's deployments: `throughput-tick`, `load-tick`, `execute-decisions`, `planner-report` and
`replay-ticks`.

Interval schedules come from the config; each deployment allows one run at a time and cancels a new run that
would overlap (`CANCEL_NEW`), so a slow tick is never run twice concurrently. The load-tick deployment is
created paused when the config has load scaling off, so it is visible in the UI but does not run. The report
deployment runs every `report_interval_hours` (without a schedule, on demand only, when that is unset).
`replay-ticks` has no schedule: it runs when started from the UI (or `prefect deployment run`) with a range. With
`metric_reporting_prometheus_port` set, the serving process also exports the planner's Prometheus metrics.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from flows.replay import replay_ticks
from flows.report import planner_report
from flows.ticks import DEFAULT_CONFIG, execute_decisions, load_tick, throughput_tick
from planner_core.config import EnvironmentKind, PlannerFile, load_config
from planner_core.runtime.service import connect_kubernetes
from planner_core.runtime.settings import DEFAULT_DEPLOYMENT, RuntimeSettings
from planner_core.runtime.store.db import resolve_database_url
from planner_core.runtime.store.migrate import upgrade

NO_OVERLAP = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def build_deployments(loaded: PlannerFile, config_path: str, deployment: str) -> list:
    """The runner deployments for one managed deployment: three ticks and the report with schedules from the
    file (the loops' intervals from its policy, execution and reports from its service settings), and replay on
    demand."""
    config, service = loaded.policy, loaded.service
    parameters = {"deployment": deployment, "config_path": config_path}
    tags = ["planner", f"deployment:{deployment}"]
    return [
        throughput_tick.to_deployment(
            name="throughput-tick",
            interval=dt.timedelta(seconds=config.throughput_adjustment_interval_seconds),
            paused=not config.throughput_scaling_active,
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Predictive loop: forecast the next window and size the pools.",
        ),
        load_tick.to_deployment(
            name="load-tick",
            interval=dt.timedelta(seconds=config.load_adjustment_interval_seconds),
            paused=not config.load_scaling_active,
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Reactive loop: correct the pools from per-engine load.",
        ),
        execute_decisions.to_deployment(
            name="execute-decisions",
            interval=dt.timedelta(seconds=service.execution_interval_seconds),
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Apply pending decisions through the connector and record each attempt.",
        ),
        planner_report.to_deployment(
            name="planner-report",
            interval=(
                dt.timedelta(hours=service.report_interval_hours) if service.report_interval_hours is not None else None
            ),
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Write the HTML diagnostics report of the last period and link it as an artifact.",
        ),
        replay_ticks.to_deployment(
            name="replay-ticks",
            # recorded configs' relative paths (the profile) are taken from the served config's folder
            parameters={"deployment": deployment, "config_dir": str(Path(config_path).parent)},
            tags=tags,
            description="Re-run recorded ticks (give start and end) and report what differs; no schedule.",
        ),
    ]


def serve_deployments(config_path: Path | None, deployment: str | None) -> None:
    """Migrate the database, then serve the deployments until SIGTERM."""
    settings = RuntimeSettings()
    path = str((config_path or settings.config or Path(DEFAULT_CONFIG)).resolve())
    loaded = load_config(path)
    if loaded.policy.environment is EnvironmentKind.KUBERNETES:
        connect_kubernetes(loaded.policy)  # fail at start-up, in one line, if the DGD cannot be scaled as configured
    database_url = resolve_database_url(settings)
    upgrade(database_url)
    name = deployment or settings.deployment or DEFAULT_DEPLOYMENT
    if loaded.service.metric_reporting_prometheus_port:
        from planner_core.runtime.metrics import start_metrics_server

        # Flow runs execute in subprocesses, so the exporter reads what they recorded from Postgres at each scrape.
        start_metrics_server(loaded.service.metric_reporting_prometheus_port, database_url, name)
    serve(*build_deployments(loaded, path, name))
