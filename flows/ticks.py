"""The three served flows: `throughput-tick`, `load-tick` and `execute-decisions`.

Each tick is one Prefect task run that decides and records in one transaction (calling the out-of-process
plugins of `scheduling.external_plugins`, if any, over gRPC); collecting traffic is a separate task: Prometheus
when the config or `PLANNER_PROMETHEUS_ENDPOINT` names one, else the `PLANNER_TRACE` replay, with the window's
prompt-arrival curve counted for the context's planner. A source without usable data makes the tick record
`no_traffic_data` and hold, with the reason in the audit log; one whose arrivals alone fail gives the observation
without the curve (the burst step says `burst_unavailable`), and the audit log says why. Load ticks read the
newest ingested forward-pass metrics per engine (`planner ingest`). The execution flow applies pending decisions;
`planner serve` runs it when a tick's NOTIFY arrives (`planner_core.runtime.execution_listener`).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.runtime import flow_run, task_run

from planner_core.config import PlannerConfig, ServiceConfig
from planner_core.data import DEFAULT_CONFIG as SHIPPED_DEFAULT_CONFIG
from planner_core.domain import (
    Component,
    DecisionStage,
    Loop,
    TickOutcome,
    TrafficObservation,
    UnplacedRequests,
    summarize_decision,
)
from planner_core.planner import Planner
from planner_core.runtime.fleet import ContextCache
from planner_core.runtime.redact import redact_text
from planner_core.runtime.service import PlannerContext, drains_followed, load_context, run_execution, run_tick
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources import CollectedTraffic
from planner_core.runtime.sources import collect_traffic as collect_from_source
from planner_core.runtime.store.db import resolve_database_url

DEFAULT_CONFIG = str(SHIPPED_DEFAULT_CONFIG)


def _config_path(config_path: str | None, settings: RuntimeSettings) -> str:
    """The flow's config: its parameter, else `PLANNER_CONFIG`, else the shipped default."""
    return config_path or (str(settings.config) if settings.config else DEFAULT_CONFIG)


def _context(deployment: str, config_path: str | None) -> PlannerContext:
    settings = RuntimeSettings()
    return load_context(resolve_database_url(settings), deployment, _config_path(config_path, settings))


def _scheduled_at() -> dt.datetime:
    """The flow run's scheduled start (the tick's identity); ad-hoc runs use their creation time."""
    scheduled = flow_run.scheduled_start_time
    return dt.datetime.fromtimestamp(scheduled.timestamp(), tz=dt.UTC)


@task(name="collect-traffic", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def collect_traffic(
    config: PlannerConfig,
    service: ServiceConfig,
    window_start: dt.datetime,
    window_end: dt.datetime,
    planner: Planner | None = None,
) -> CollectedTraffic | None:
    """Traffic over the window from the configured source; None when no source is configured. With the `planner`
    that decides on it, the observation carries the window's prompt-arrival curve at its engine rate.

    Missing or unusable data is not an error here (no retry): it comes back without an observation and with the
    reason, and the tick holds on it; arrivals that cannot be read leave the observation without its curve.
    """
    collected = collect_from_source(config, service, window_start, window_end, planner=planner)
    if collected is not None and collected.problem is not None:
        problem = redact_text(collected.problem)  # a plugin source's text too: it may quote its URL
        _logger().warning("no traffic data for [%s, %s): %s", window_start, window_end, problem)
    if collected is not None and collected.curve_problem is not None:
        problem = redact_text(collected.curve_problem)
        _logger().warning("no prompt-arrival curve for [%s, %s): %s", window_start, window_end, problem)
    if collected is not None and collected.partial_problem is not None:
        _logger().warning("partial traffic data for [%s, %s): %s", window_start, window_end, collected.partial_problem)
    return collected


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The run logger inside a Prefect run (shipped to the UI), a plain logger when a test calls `.fn()`."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


@task(
    name="tick",
    task_run_name="{loop}-tick {scheduled_at:%Y-%m-%d %H:%M:%S}",
    cache_policy=NO_CACHE,
)
def decide_and_record(
    ctx: PlannerContext,
    loop: Loop,
    scheduled_at: dt.datetime,
    traffic: TrafficObservation | None,
    traffic_problem: str | None = None,
    curve_problem: str | None = None,
    partial_problem: str | None = None,
    held_requests: int = 0,
) -> dict:
    """Run the pure tick on the inputs and record everything in one transaction (skipped if already recorded).
    `held_requests`: requests held at the edge for a pool at zero (a wake tick's input, `TickInputs.unplaced`)."""
    result = run_tick(
        ctx,
        loop,
        scheduled_at,
        traffic,
        flow_run_id=str(flow_run.id or ""),
        task_run_id=str(task_run.id or ""),
        traffic_problem=traffic_problem,
        curve_problem=curve_problem,
        partial_problem=partial_problem,
        unplaced=(UnplacedRequests(component=Component.DECODE, num_waiting=held_requests),) if held_requests else (),
    )
    if result.outcome is None:
        return {"tick_id": None, "skipped": "already recorded"}
    decision = result.outcome.decision
    _logger().info("%s", tick_summary_line(ctx.deployment, loop, scheduled_at, result.outcome))
    if not decision.is_empty and summarize_decision(result.outcome).stage is DecisionStage.BUDGET:
        # not an error (the budget is the operator's choice), but less than the planner asked for: said in the run
        # log as a warning; the decision records it (decisions.stage 'budget')
        _logger().warning(
            "the GPU budget (max_gpu_budget %s) set this decision: %s",
            ctx.config.max_gpu_budget,
            summarize_decision(result.outcome).text,
        )
    _publish_tick_artifact(ctx.deployment, loop, scheduled_at, result.tick_id, result.outcome)
    return {
        "tick_id": result.tick_id,
        "reason": result.outcome.reason.value,
        "target_prefill": decision.num_prefill,
        "target_decode": decision.num_decode,
    }


def _targets(outcome: TickOutcome) -> str:
    decision = outcome.decision
    if decision.is_empty:
        return "no change"
    prefill = "-" if decision.num_prefill is None else str(decision.num_prefill)
    decode = "-" if decision.num_decode is None else str(decision.num_decode)
    return f"{prefill}P/{decode}D" + (" (advisory)" if decision.advisory else "")


def tick_summary_line(deployment: str, loop: Loop, scheduled_at: dt.datetime, outcome: TickOutcome) -> str:
    """One line for the flow run's log: the tick, its decision and why (the deciding stage and its numbers, as
    `decision_history` shows them; the headline reason without a decision), and the forecast it sized for."""
    line = f"{deployment} {loop.value} tick {scheduled_at.isoformat()}: {_targets(outcome)}, {_why(outcome)}"
    if outcome.prediction is not None:
        p = outcome.prediction
        line += f"; forecast {p.num_req:.0f} requests, ISL {p.isl:.0f}, OSL {p.osl:.0f}"
    return line


def _why(outcome: TickOutcome) -> str:
    """`<stage>: <summary>` for a decision (`summarize_decision`, what `decision_history` records), else the
    tick's headline reason."""
    if outcome.decision.is_empty:
        return outcome.reason.value
    summary = summarize_decision(outcome)
    return f"{summary.stage.value}: {summary.text}"


def _publish_tick_artifact(
    deployment: str, loop: Loop, scheduled_at: dt.datetime, tick_id: int | None, outcome: TickOutcome
) -> None:
    """A markdown artifact on the tick's flow run (one key per deployment and loop, so the UI lists the ticks as
    versions): targets, reason, forecast and each step with its numbers. Only inside a Prefect run."""
    if flow_run.id is None:
        return
    from prefect.artifacts import create_markdown_artifact

    rows = [
        f"| {step.step} | {step.component.value if step.component else ''} "
        f"| {'' if step.value is None else f'{step.value:g}'} | {step.reason.value} | {step.detail.replace('|', '/')} |"
        for step in outcome.steps
    ]
    forecast = (
        f"{outcome.prediction.num_req:.0f} requests, ISL {outcome.prediction.isl:.0f}, OSL {outcome.prediction.osl:.0f}"
        if outcome.prediction is not None
        else "none"
    )
    markdown = "\n".join(
        [
            f"### {deployment}: {loop.value} tick {scheduled_at.isoformat()} (tick {tick_id})",
            "",
            f"**Targets** {_targets(outcome)} · **reason** `{outcome.reason.value}` · **forecast** {forecast}",
            "",
            f"**Why** {_why(outcome)}",
            "",
            "| step | pool | value | reason | detail |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    key = re.sub(r"[^a-z0-9-]+", "-", f"tick-{deployment}-{loop.value}".lower()).strip("-")
    create_markdown_artifact(
        markdown=markdown, key=key, description=tick_summary_line(deployment, loop, scheduled_at, outcome)
    )


# The status of an `apply-decisions` entry for a drain the connector still follows: the listener keeps running the
# execution at its retry cadence, as for a pending decision, until the drain ends.
FOLLOWING = "following"


@task(name="apply-decisions", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def apply_decisions(ctx: PlannerContext, now: dt.datetime) -> list[dict]:
    """Apply the newest pending decision through the connector and record the attempt; one entry more per drain the
    connector still follows (status `following`)."""
    applied = [
        {
            "decision_id": s.decision_id,
            "outcome": s.outcome.value,
            "status": s.status.value,
            "detail": s.detail,
        }
        for s in run_execution(ctx, now)
    ]
    return applied + [{"drain_of": engine, "status": FOLLOWING} for engine in drains_followed(ctx)]


@flow(name="throughput-tick", log_prints=False)
def throughput_tick(deployment: str = "default", config_path: str | None = None) -> dict:
    """Predictive loop: observe the last window, forecast the next, size the pools."""
    ctx = _context(deployment, config_path)
    scheduled_at = _scheduled_at()
    window_start = scheduled_at - dt.timedelta(seconds=ctx.config.throughput_adjustment_interval_seconds)
    collected = collect_traffic(ctx.config, ctx.service, window_start, scheduled_at, ctx.planner)
    if collected is None:
        return decide_and_record(ctx, Loop.THROUGHPUT, scheduled_at, None)
    return decide_and_record(
        ctx, Loop.THROUGHPUT, scheduled_at, collected.observation, collected.problem, collected.curve_problem,
        collected.partial_problem,
    )  # fmt: skip


@flow(name="load-tick", log_prints=False)
def load_tick(deployment: str = "default", config_path: str | None = None, held_requests: int = 0) -> dict:
    """Reactive loop: correct the pools from per-engine load (the newest ingested forward-pass metrics) and, with
    `load_tail_latency_scaling`, the frontend's TTFT tail and queue time over the load interval. `held_requests`:
    the wake tick's (`planner serve` runs one when the edge holds requests for a pool at zero,
    `planner_core.runtime.wake`); the scheduled ticks have none."""
    ctx = _context(deployment, config_path)
    scheduled_at = _scheduled_at()
    if not ctx.config.load_tail_latency_scaling:
        return decide_and_record(ctx, Loop.LOAD, scheduled_at, None, held_requests=held_requests)
    window_start = scheduled_at - dt.timedelta(seconds=ctx.config.load_adjustment_interval_seconds)
    collected = collect_traffic(ctx.config, ctx.service, window_start, scheduled_at, ctx.planner)
    observation = None if collected is None else collected.observation
    return decide_and_record(ctx, Loop.LOAD, scheduled_at, observation, held_requests=held_requests)


_EXECUTION_CONTEXTS: dict[str, ContextCache] = {}


def _execution_context(deployment: str, config_path: str | None) -> PlannerContext:
    """The context of an execution run, loaded once per process and reloaded when the config file changes:
    `planner serve` runs executions in its own process on every notification, so the profile and connector are
    not loaded again each time (a scheduled run in its own subprocess loads it once, as before)."""
    settings = RuntimeSettings()
    path = str(Path(_config_path(config_path, settings)).resolve())
    url = resolve_database_url(settings)
    return _EXECUTION_CONTEXTS.setdefault(url, ContextCache(url)).load(deployment, path)


@flow(name="execute-decisions", log_prints=False)
def execute_decisions(deployment: str = "default", config_path: str | None = None) -> list[dict]:
    """Apply pending decisions through the connector (the outbox)."""
    ctx = _execution_context(deployment, config_path)
    return apply_decisions(ctx, dt.datetime.now(dt.UTC))
