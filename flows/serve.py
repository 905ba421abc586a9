"""Serve the planner's deployments: `throughput-tick`, `load-tick`, `execute-decisions` and `replay-ticks`.

Interval schedules come from the config; each deployment allows one run at a time and cancels a new run that
would overlap (`CANCEL_NEW`), so a slow tick is never run twice concurrently. The load-tick deployment is
created paused when the config has load scaling off, so it is visible in the UI but does not run.
`replay-ticks` has no schedule: it runs when started from the UI (or `prefect deployment run`) with a range.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

from flows.replay import replay_ticks
from flows.ticks import DEFAULT_CONFIG, execute_decisions, load_tick, throughput_tick
from planner_core.config import PlannerConfig, load_config
from planner_core.settings import RuntimeSettings
from planner_core.store.db import resolve_database_url
from planner_core.store.migrate import upgrade

NO_OVERLAP = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def build_deployments(config: PlannerConfig, config_path: str, deployment: str) -> list:
    """The runner deployments for one managed deployment: three ticks with schedules from `config`, and replay."""
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
            interval=dt.timedelta(seconds=config.execution_interval_seconds),
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Apply pending decisions through the connector and record each attempt.",
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
    config = load_config(path)
    upgrade(resolve_database_url(settings))
    serve(*build_deployments(config, path, deployment or settings.deployment))
