"""The three served flows: `throughput-tick`, `load-tick` and `execute-decisions`.

Each tick is one Prefect task run that decides and records in one transaction; collecting traffic is a
separate task with retries (the only network I/O). The execution flow applies pending decisions.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run, task_run

from planner_core.domain import Loop, TrafficObservation
from planner_core.service import PlannerContext, load_context, run_execution, run_tick
from planner_core.settings import RuntimeSettings
from planner_core.sources import TraceReplaySource
from planner_core.store.db import resolve_database_url
from planner_core.traces import load_trace

DEFAULT_CONFIG = str(Path(__file__).resolve().parents[1] / "infra" / "configs" / "demo.yaml")


def _context(deployment: str, config_path: str | None) -> PlannerContext:
    settings = RuntimeSettings()
    path = config_path or (str(settings.config) if settings.config else DEFAULT_CONFIG)
    return load_context(resolve_database_url(settings), deployment, path)


def _scheduled_at() -> dt.datetime:
    """The flow run's scheduled start (the tick's identity); ad-hoc runs use their creation time."""
    scheduled = flow_run.scheduled_start_time
    return dt.datetime.fromtimestamp(scheduled.timestamp(), tz=dt.UTC)


@task(name="collect-traffic", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def collect_traffic(window_start: dt.datetime, window_end: dt.datetime) -> TrafficObservation | None:
    """Traffic over the window from the configured source; None when no source is configured."""
    settings = RuntimeSettings()
    if settings.trace is None:
        return None
    return TraceReplaySource(load_trace(settings.trace)).collect(window_start, window_end)


@task(
    name="tick",
    task_run_name="{loop}-tick {scheduled_at:%Y-%m-%d %H:%M:%S}",
    cache_policy=NO_CACHE,
)
def decide_and_record(
    ctx: PlannerContext, loop: Loop, scheduled_at: dt.datetime, traffic: TrafficObservation | None
) -> dict:
    """Run the pure tick on the inputs and record everything in one transaction (skipped if already recorded)."""
    result = run_tick(
        ctx,
        loop,
        scheduled_at,
        traffic,
        flow_run_id=str(flow_run.id or ""),
        task_run_id=str(task_run.id or ""),
    )
    if result.outcome is None:
        return {"tick_id": None, "skipped": "already recorded"}
    decision = result.outcome.decision
    return {
        "tick_id": result.tick_id,
        "reason": result.outcome.reason.value,
        "target_prefill": decision.num_prefill,
        "target_decode": decision.num_decode,
    }


@task(name="apply-decisions", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def apply_decisions(ctx: PlannerContext, now: dt.datetime) -> list[dict]:
    """Apply the newest pending decision through the connector and record the attempt."""
    return [
        {
            "decision_id": s.decision_id,
            "outcome": s.outcome.value,
            "status": s.status.value,
            "detail": s.detail,
        }
        for s in run_execution(ctx, now)
    ]


@flow(name="throughput-tick", log_prints=False)
def throughput_tick(deployment: str = "default", config_path: str | None = None) -> dict:
    """Predictive loop: observe the last window, forecast the next, size the pools."""
    ctx = _context(deployment, config_path)
    scheduled_at = _scheduled_at()
    window_start = scheduled_at - dt.timedelta(seconds=ctx.config.throughput_adjustment_interval_seconds)
    traffic = collect_traffic(window_start, scheduled_at)
    return decide_and_record(ctx, Loop.THROUGHPUT, scheduled_at, traffic)


@flow(name="load-tick", log_prints=False)
def load_tick(deployment: str = "default", config_path: str | None = None) -> dict:
    """Reactive loop: correct the pools from per-engine load."""
    ctx = _context(deployment, config_path)
    return decide_and_record(ctx, Loop.LOAD, _scheduled_at(), None)


@flow(name="execute-decisions", log_prints=False)
def execute_decisions(deployment: str = "default", config_path: str | None = None) -> list[dict]:
    """Apply pending decisions through the connector (the outbox)."""
    ctx = _context(deployment, config_path)
    return apply_decisions(ctx, dt.datetime.now(dt.UTC))
