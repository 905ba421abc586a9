"""`planner demo`: the real loop on a real trace, in accelerated (simulated) time.

A Prefect flow walks the trace window by window. The discrete-event simulator (`planner_core.lab.sim.des`) serves
the window; the throughput tick (the same task the served deployment runs) decides and records in Postgres; the
execution task applies the decision through the virtual connector; the simulated cluster, acting as the
orchestrator, wakes on the connector's NOTIFY, scales and acknowledges. Everything is in Postgres, so an
interrupted demo resumes where it stopped: recorded ticks are skipped (never recorded twice) and the cluster is
rebuilt from the acknowledged decisions. At the end it writes the deployment's diagnostics report and links it as
an artifact.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import flow
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import select

from flows.report import publish_report, write_report
from flows.ticks import apply_decisions, decide_and_record
from planner_core.domain import Loop
from planner_core.lab.sim.des import ClusterSimulator, spec_for_config
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.report import periodic_report_path
from planner_core.runtime.service import PlannerContext, load_context, prepare_database, resolve_report_dir
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import Tick, VirtualDecisionRow
from planner_core.traces import RequestTrace, load_trace


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleEvent:
    """The simulated orchestrator reached new targets at `at_s` (offset into the trace)."""

    at_s: float
    num_prefill: int
    num_decode: int


def _epoch(trace: RequestTrace, offset_s: float) -> dt.datetime:
    return repo.epoch_to_datetime(trace.start_epoch_s + offset_s)


def _new_cluster(ctx: PlannerContext, trace: RequestTrace, startup_s: float) -> ClusterSimulator:
    """The discrete-event cluster the config describes (`spec_for_config`), timed by the profile's forward-pass
    model, at the minimum endpoints."""
    assert ctx.perf is not None
    fwd = ctx.perf.forward_pass_model()
    assert fwd is not None
    spec = spec_for_config(ctx.config, profiled_max_kv_tokens=ctx.perf.profiled_max_kv_tokens(), startup_s=startup_s)
    return ClusterSimulator(
        trace,
        fwd,
        spec,
        num_prefill=0 if spec.aggregated else ctx.config.prefill_min_endpoint_effective,
        num_decode=ctx.config.decode_min_endpoint_effective,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What the requests that arrived during the demo's windows got, and what the cluster cost until then."""

    num_req: int
    sla_attainment: float
    gpu_hours: float
    mean_ttft_ms: float
    mean_itl_ms: float


def summarise_run(cluster: ClusterSimulator, end_s: float, ttft_ms: float, itl_ms: float) -> RunSummary:
    """Serve every request that arrived before `end_s` to completion and score them; GPU-hours up to `end_s`."""
    cluster.run_until(end_s)
    gpu_hours = cluster.result().gpu_s / 3600.0
    cluster.run_to_completion()
    result = cluster.result()
    arrived = cluster.trace.arrival_s < end_s
    ttft, itl = result.ttft_s[arrived] * 1000.0, result.itl_s[arrived] * 1000.0
    finished = np.isfinite(result.finish_s[arrived])
    met = np.isfinite(ttft) & (ttft <= ttft_ms) & finished & (~np.isfinite(itl) | (itl <= itl_ms))
    return RunSummary(
        num_req=int(arrived.sum()),
        sla_attainment=float(met.mean()) if arrived.any() else 1.0,
        gpu_hours=gpu_hours,
        mean_ttft_ms=float(np.nanmean(ttft)) if np.isfinite(ttft).any() else 0.0,
        mean_itl_ms=float(np.nanmean(itl)) if np.isfinite(itl).any() else 0.0,
    )


def recorded_scale_events(ctx: PlannerContext, trace: RequestTrace) -> list[ScaleEvent]:
    """Every decision written to the virtual connector, at the (simulated) time it was written."""
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, ctx.deployment)
        if deployment is None:
            return []
        rows = session.scalars(
            select(VirtualDecisionRow)
            .where(VirtualDecisionRow.deployment_id == deployment.id)
            .order_by(VirtualDecisionRow.decision_id)
        )
        return [
            ScaleEvent(
                at_s=row.written_at.timestamp() - trace.start_epoch_s,
                num_prefill=row.num_prefill_workers,
                num_decode=row.num_decode_workers,
            )
            for row in rows
        ]


def simulate_timeline(
    ctx: PlannerContext, trace: RequestTrace, events: list[ScaleEvent], end_s: float, startup_s: float
) -> ClusterSimulator:
    """Re-run the cluster from the start of the trace, applying each scale event at its time."""
    cluster = _new_cluster(ctx, trace, startup_s)
    for event in events:
        if event.at_s > end_s:
            break
        cluster.run_until(event.at_s)
        cluster.set_targets(event.num_prefill, event.num_decode)
    cluster.run_until(end_s)
    return cluster


def _recorded_tick_times(ctx: PlannerContext) -> set[dt.datetime]:
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, ctx.deployment)
        if deployment is None:
            return set()
        return set(
            session.scalars(
                select(Tick.scheduled_at).where(Tick.deployment_id == deployment.id, Tick.loop == Loop.THROUGHPUT.value)
            )
        )


def _follow_decisions(client: VirtualConnectorClient, cluster: ClusterSimulator, now: dt.datetime) -> None:
    """The simulated orchestrator: take a new decision if one was written, scale, acknowledge."""
    decision = client.wait(timeout_s=0.0)
    if decision is not None and decision.decision_id >= 0:
        cluster.set_targets(decision.num_prefill_workers, decision.num_decode_workers)
        client.complete(decision, at=now)


@flow(name="planner-demo")
def demo(
    trace_path: str,
    config_path: str,
    deployment: str = "demo",
    startup_s: float = 120.0,
    rate_scale: float = 1.0,
    max_windows: int | None = None,
    database_url: str | None = None,
    report_dir: str | None = None,
) -> dict:
    """Replay `trace_path` through the planner in simulated time; returns the run's summary figures.

    The report of all the deployment's ticks goes to `report_dir` (default: the config's `report_output_dir`
    relative to the config file, else `reports/` in the planner's data folder).
    """
    from planner_core.runtime.store.db import resolve_database_url

    url = database_url or resolve_database_url()
    prepare_database(url)
    ctx = load_context(url, deployment, config_path)
    if ctx.perf is None:
        raise ValueError(f"{config_path}: field 'profile_results_dir' = {ctx.config.profile_results_dir!r}: not found")
    trace = load_trace(trace_path).scaled(rate_scale)
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, deployment, ctx.config)
    window_s = float(ctx.config.throughput_adjustment_interval_seconds)
    num_windows = max(1, int(trace.duration_s // window_s))  # full windows only: a partial last one looks idle
    if max_windows is not None:
        num_windows = min(num_windows, max_windows)

    recorded = _recorded_tick_times(ctx)
    done = [k for k in range(1, num_windows + 1) if _epoch(trace, k * window_s) in recorded]
    resume_s = max(done, default=0) * window_s
    # Rebuild the cluster from what Postgres says happened; acknowledge a decision written just before a stop.
    cluster = simulate_timeline(ctx, trace, recorded_scale_events(ctx, trace), resume_s, startup_s)
    with VirtualConnectorClient(url, deployment) as client:
        _acknowledge_after_restart(client, ctx, trace)
        if resume_s > 0:
            # A stop between recording the last tick and executing its decision leaves it pending: finish that
            # tick's execution at its own time, exactly as an uninterrupted run would have.
            apply_decisions(ctx, _epoch(trace, resume_s))
            _follow_decisions(client, cluster, _epoch(trace, resume_s))
        with Progress(
            TextColumn("[bold]demo[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ) as progress:
            bar = progress.add_task(f"{trace.num_requests} requests, {window_s:.0f} s ticks", total=num_windows)
            progress.update(bar, completed=len(done))
            for k in range(1, num_windows + 1):
                end_s = k * window_s
                if end_s <= resume_s:
                    continue
                now = _epoch(trace, end_s)
                cluster.run_until(end_s)
                counts = cluster.worker_counts()
                client.report_workers(ready_prefill=counts.ready_prefill, ready_decode=counts.ready_decode)
                decide_and_record(ctx, Loop.THROUGHPUT, now, cluster.observe(end_s - window_s, end_s))
                apply_decisions(ctx, now)
                _follow_decisions(client, cluster, now)
                progress.update(bar, advance=1)
    end_s = num_windows * window_s
    events = recorded_scale_events(ctx, trace)
    final = simulate_timeline(ctx, trace, events, end_s, startup_s)
    summary = summarise_run(final, end_s, ctx.config.ttft_ms, ctx.config.itl_ms)
    data_dir = RuntimeSettings().data_dir
    out_dir = Path(report_dir) if report_dir else resolve_report_dir(ctx.service, Path(config_path), data_dir)
    report = write_report(
        url,
        deployment,
        periodic_report_path(out_dir, _epoch(trace, end_s), ctx.service.report_filename),
        None,  # the whole run, resumed parts included
        None,
        ctx.service.report_write_gzip_log,
    )
    publish_report(report)
    return _summary_dict(ctx, summary, events, num_windows) | {"report_path": str(report.path)}


def _acknowledge_after_restart(client: VirtualConnectorClient, ctx: PlannerContext, trace: RequestTrace) -> None:
    """Catch the client up with the current decision after a (re)start.

    The rebuilt cluster already applied every written decision, so one written but not acknowledged before a
    stop is acknowledged now, at the simulated time it was written.
    """
    current = client.wait(timeout_s=0.0)
    if current is None or current.decision_id < 0:
        return
    events = recorded_scale_events(ctx, trace)
    client.complete(current, at=_epoch(trace, events[-1].at_s))


def _summary_dict(ctx: PlannerContext, summary: RunSummary, events: list[ScaleEvent], num_windows: int) -> dict:
    with ctx.sessions.begin() as session:
        counts = repo.query_rows(
            session,
            """SELECT (SELECT count(*) FROM ticks t JOIN deployments d ON d.id = t.deployment_id
                        WHERE d.name = :name) AS num_ticks,
                      (SELECT count(*) FROM decision_history WHERE deployment = :name) AS num_decisions""",
            name=ctx.deployment,
        )[0]
        statuses = repo.query_rows(
            session,
            "SELECT status, count(*) AS n FROM decision_history WHERE deployment = :name GROUP BY status ORDER BY 1",
            name=ctx.deployment,
        )
    return {
        "deployment": ctx.deployment,
        "window_s": float(ctx.config.throughput_adjustment_interval_seconds),
        "num_windows": num_windows,
        "num_ticks": counts["num_ticks"],
        "num_decisions": counts["num_decisions"],
        "decision_statuses": ", ".join(f"{row['n']} {row['status']}" for row in statuses) or "none",
        "num_requests": summary.num_req,
        "sla_attainment": summary.sla_attainment,
        "ttft_ms": ctx.config.ttft_ms,
        "itl_ms": ctx.config.itl_ms,
        "gpu_hours": summary.gpu_hours,
        "mean_ttft_ms": summary.mean_ttft_ms,
        "mean_itl_ms": summary.mean_itl_ms,
        "scale_events": [(e.at_s, e.num_prefill, e.num_decode) for e in events],
    }
