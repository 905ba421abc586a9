"""Serve the planner's deployments: `throughput-tick`, `load-tick`, `execute-decisions`, `planner-report` and
`replay-ticks`, and execute each recorded decision as soon as its tick commits.

Interval schedules come from the config; each deployment allows one run at a time and cancels a new run that
would overlap (`CANCEL_NEW`), so a slow tick is never run twice concurrently. The load-tick deployment is
created paused when the config has load scaling off, so it is visible in the UI but does not run. The report
deployment runs every `report_interval_hours` (without a schedule, on demand only, when that is unset).
`replay-ticks` has no schedule: it runs when started from the UI (or `prefect deployment run`) with a range.
`execute-decisions` has no schedule either: the serving process LISTENs for the NOTIFY a tick sends when it records
a pending decision and runs the flow in-process right away, with a slow fallback poll
(`execution_fallback_poll_seconds`) for a notification it missed. With `scale_to_zero_idle_seconds`, it also LISTENs
for the edge's wake (`planner_core.runtime.wake`) and runs a load tick at once when a request is held for a pool at
zero. With
`metric_reporting_prometheus_port` set, the serving process also exports the planner's Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from pathlib import Path

from prefect import tags
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.logging.handlers import APILogWorker
from prefect.runner import Runner

from flows.replay import replay_ticks
from flows.report import planner_report
from flows.ticks import FOLLOWING, execute_decisions, load_tick, throughput_tick
from planner_core.config import EnvironmentKind, PlannerFile
from planner_core.planner import budget_warnings
from planner_core.runtime.execution_listener import ExecutionListener, ListenerSettings, Trigger
from planner_core.runtime.service import record_config_warnings, served_config
from planner_core.runtime.settings import DEFAULT_DEPLOYMENT, RuntimeSettings
from planner_core.runtime.store.db import get_engine, resolve_database_url, resolve_owner_database_url
from planner_core.runtime.store.migrate import upgrade
from planner_core.runtime.store.models import DecisionStatus
from planner_core.runtime.store.partitions import ensure_partitions_ahead
from planner_core.runtime.wake import WakeListener

NO_OVERLAP = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def build_deployments(loaded: PlannerFile, config_path: str, deployment: str) -> list:
    """The runner deployments for one managed deployment: three ticks and the report with schedules from the
    file (the loops' intervals from its policy, execution and reports from its service settings), and replay on
    demand. Each is named after the managed deployment (`throughput-tick/prod`), so planners of several
    deployments serve side by side on one Prefect server."""
    config, service = loaded.policy, loaded.service
    parameters = {"deployment": deployment, "config_path": config_path}
    tags = ["planner", f"deployment:{deployment}"]
    return [
        throughput_tick.to_deployment(
            name=deployment,
            interval=dt.timedelta(seconds=config.throughput_adjustment_interval_seconds),
            paused=not config.throughput_scaling_active,
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Predictive loop: forecast the next window and size the pools.",
        ),
        load_tick.to_deployment(
            name=deployment,
            interval=dt.timedelta(seconds=config.load_adjustment_interval_seconds),
            paused=not config.load_scaling_active,
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Reactive loop: correct the pools from per-engine load.",
        ),
        # No schedule: the serving process runs this flow when a tick's NOTIFY arrives, with its own fallback
        # poll (`execution_listener`); the deployment stays for runs started from the UI.
        execute_decisions.to_deployment(
            name=deployment,
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Apply pending decisions through the connector and record each attempt (on demand; "
            "`planner serve` runs it on every recorded decision).",
        ),
        planner_report.to_deployment(
            name=deployment,
            interval=(
                dt.timedelta(hours=service.report_interval_hours) if service.report_interval_hours is not None else None
            ),
            concurrency_limit=NO_OVERLAP,
            parameters=parameters,
            tags=tags,
            description="Write the HTML diagnostics report of the last period and link it as an artifact.",
        ),
        replay_ticks.to_deployment(
            name=deployment,
            # recorded configs' relative paths (the profile) are taken from the served config's folder
            parameters={"deployment": deployment, "config_dir": str(Path(config_path).parent)},
            tags=tags,
            description="Re-run recorded ticks (give start and end) and report what differs; no schedule.",
        ),
    ]


def execution_listener(database_url: str, deployment: str, config_path: str, loaded: PlannerFile) -> ExecutionListener:
    """The serving process's execution: the `execute-decisions` flow, run in this process (a flow run in the UI,
    tagged like the served deployments plus `trigger:<why>`) when a tick's NOTIFY for `deployment` arrives, on
    (re)connection, and on the fallback poll; see `planner_core.runtime.execution_listener`."""
    service = loaded.service
    settings = ListenerSettings(
        fallback_poll_s=float(service.execution_fallback_poll_seconds),
        retry_s=float(service.execution_interval_seconds),
        # the local connector replaces dead workers and finishes drains at each execution run
        always_retry=loaded.policy.environment is EnvironmentKind.LOCAL,
    )

    def execute(trigger: Trigger) -> bool:
        with tags("planner", f"deployment:{deployment}", f"trigger:{trigger.value}"):
            results = execute_decisions(deployment=deployment, config_path=config_path)
        # a decision still pending, or a drain the Kubernetes connector follows to its end: run again soon
        return any(result["status"] in (DecisionStatus.PENDING.value, FOLLOWING) for result in results)

    return ExecutionListener(database_url, deployment, execute, settings)


def wake_listener(database_url: str, deployment: str, config_path: str, quiet_s: float) -> WakeListener:
    """The serving process's wake (with `scale_to_zero_idle_seconds`): a `load-tick` flow run in this process (tagged
    `trigger:wake`) with the requests the edge holds as its input, as soon as the edge's NOTIFY arrives, instead of
    at the next scheduled tick; see `planner_core.runtime.wake`. Its decision reaches the execution listener by the
    tick's own NOTIFY, like any other. For `quiet_s` (the idle hold) after a wake tick, notifications run none."""

    def on_wake(held: int) -> None:
        with tags("planner", f"deployment:{deployment}", "trigger:wake"):
            load_tick(deployment=deployment, config_path=config_path, held_requests=held)

    return WakeListener(database_url, deployment, on_wake, quiet_s=quiet_s)


class _GracefulRunner(Runner):
    """Prefect's runner, stopped by SIGTERM as cleanly as by Ctrl-C.

    Prefect's own SIGTERM handler calls `sys.exit` inside the event loop: a traceback, schedules left unpaused and
    the run in flight left `Running` in Prefect's database. This one asks the runner to stop from the loop: the
    polling stops, the runs in flight finish, and the schedules are paused (`pause_on_shutdown`)."""

    def handle_sigterm(self, *args: object, **kwargs: object) -> None:  # noqa: ARG002 - signal handler signature
        self._logger.info("SIGTERM received: finishing the runs in flight, pausing the schedules")
        loop = asyncio.get_running_loop()
        loop.call_soon_threadsafe(lambda: loop.create_task(self.astop()))


async def pause_deployments(full_names: list[str]) -> None:
    """Pause each deployment (`flow/deployment`) that exists and is not paused yet."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        for full_name in full_names:
            try:
                found = await client.read_deployment_by_name(full_name)
            except ObjectNotFound:
                continue
            if not found.paused:
                await client.pause_deployment(found.id)


def serve_deployments(config_path: Path | None, deployment: str | None) -> None:
    """Migrate the database, then serve the deployments until SIGTERM or Ctrl-C (then the runs in flight finish
    and the schedules are paused)."""
    settings = RuntimeSettings()
    path, loaded = served_config(config_path, settings)
    database_url = resolve_database_url(settings)
    upgrade(resolve_owner_database_url(settings))  # as the owner; the flows write through `database_url`
    ensure_partitions_ahead(get_engine(database_url), dt.datetime.now(dt.UTC))  # today's and the next days'
    name = deployment or settings.deployment or DEFAULT_DEPLOYMENT
    # `planner serve` printed them at start; the audit log keeps them
    record_config_warnings(database_url, name, budget_warnings(loaded.policy, Path(path)))
    if loaded.service.metric_reporting_prometheus_port:
        from planner_core.runtime.metrics import start_metrics_server

        # Flow runs execute in subprocesses, so the exporter reads what they recorded from Postgres at each scrape.
        start_metrics_server(
            loaded.service.metric_reporting_prometheus_port,
            database_url,
            name,
            addr=settings.metrics_bind,
            cache_s=settings.metrics_cache_s,
        )
    runner = _GracefulRunner(pause_on_shutdown=True)
    served = build_deployments(loaded, path, name)
    for runner_deployment in served:
        runner.add_deployment(runner_deployment)
    listener = execution_listener(database_url, name, path, loaded)
    listener.start()
    waker = None
    if loaded.policy.scale_to_zero_idle_seconds is not None:
        waker = wake_listener(database_url, name, path, float(loaded.policy.scale_to_zero_idle_seconds))
        waker.start()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(runner.start())
        # the runner pauses the deployments it had registered when the signal came; one stopped while it was still
        # registering them (a busy machine) left the others scheduled: pause every served one by name
        asyncio.run(pause_deployments([d.full_name for d in served]))
    finally:
        listener.close()  # at most a second's wait, plus the execution run in flight
        if waker is not None:
            waker.close()
    # send the runner's last log lines while the Prefect server is still up (it stops when the command returns)
    APILogWorker.drain_all(timeout=5)
