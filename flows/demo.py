"""`planner demo`: the real loop on a real trace, in accelerated (simulated) time.

A Prefect flow walks the trace window by window. The discrete-event simulator (`planner_core.lab.sim.des`) serves
the window; the throughput tick (the same task the served deployment runs) decides and records in Postgres; the
execution task applies the decision through the virtual connector; the simulated cluster, acting as the
orchestrator, wakes on the connector's NOTIFY, scales and acknowledges. Everything is in Postgres, so an
interrupted demo resumes where it stopped: recorded ticks are skipped (never recorded twice) and the cluster is
rebuilt from the acknowledged decisions. At the end it writes the deployment's diagnostics report and links it as
an artifact.

The simulated cluster, its scoring and the reads of the records are the lab's demo room (`planner_core.lab.demo`);
this flow walks the windows and calls the ticks.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import flow
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flows.report import publish_report, write_report
from flows.ticks import apply_decisions, decide_and_record
from planner_core.domain import Loop
from planner_core.lab.demo import (
    acknowledge_after_restart,
    comparison_rows,
    epoch,
    follow_decisions,
    recorded_scale_events,
    recorded_tick_times,
    score_run,
    simulate_timeline,
    starting_size,
    summary_dict,
)
from planner_core.lab.sim.des import ClusterSimulator
from planner_core.planner import budget_warnings
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.report import periodic_report_path
from planner_core.runtime.service import (
    PlannerContext,
    load_context,
    prepare_database,
    record_config_warnings,
    resolve_report_dir,
)
from planner_core.runtime.settings import RuntimeSettings
from planner_core.traces import RequestTrace, load_trace


def _walk_windows(
    ctx: PlannerContext,
    client: VirtualConnectorClient,
    cluster: ClusterSimulator,
    trace: RequestTrace,
    *,
    window_s: float,
    num_windows: int,
    resume_s: float,
    num_done: int,
) -> None:
    """Every window after `resume_s`: the cluster serves it, the throughput tick decides and records, the execution
    applies, the simulated orchestrator follows."""
    with Progress(
        TextColumn("[bold]demo[/bold] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ) as progress:
        bar = progress.add_task(f"{trace.num_requests} requests, {window_s:.0f} s ticks", total=num_windows)
        progress.update(bar, completed=num_done)
        for k in range(1, num_windows + 1):
            end_s = k * window_s
            if end_s <= resume_s:
                continue
            now = epoch(trace, end_s)
            cluster.run_until(end_s)
            counts = cluster.worker_counts()
            client.report_workers(ready_prefill=counts.ready_prefill, ready_decode=counts.ready_decode)
            if ctx.config.throughput_capacity_feedback:
                _publish_engine_iterations(ctx, cluster, now)
            traffic = cluster.observe(end_s - window_s, end_s, planner=ctx.planner)
            decide_and_record(ctx, Loop.THROUGHPUT, now, traffic)
            apply_decisions(ctx, now)
            follow_decisions(client, cluster, now)
            progress.update(bar, advance=1)


def _publish_engine_iterations(ctx: PlannerContext, cluster: ClusterSimulator, now: dt.datetime) -> None:
    """The simulated engines' latest iterations into `fpm_samples`, as the forward-pass ingest stores a real
    engine's: the closed loop's tick reads them there (`service._tick_inputs`), as the bench's reads the
    simulator's (`PlannerPolicy.decide`)."""
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples

    samples = [FpmSample(fpm=fpm, received_at=now) for fpm in cluster.latest_fpm()]
    with ctx.sessions.begin() as session:
        deployment = repo.ensure_deployment(session, ctx.deployment, ctx.config)
        insert_fpm_samples(session, deployment.id, samples)


def _publish_run_report(ctx: PlannerContext, config_path: str, report_dir: str | None, at: dt.datetime):
    """The report of all the deployment's ticks (resumed parts included), written and linked as an artifact."""
    data_dir = RuntimeSettings().data_dir
    out_dir = Path(report_dir) if report_dir else resolve_report_dir(ctx.service, Path(config_path), data_dir)
    report = write_report(
        ctx.deployment,
        periodic_report_path(out_dir, at, ctx.service.report_filename, deployment=ctx.deployment),
        None,  # the whole run, resumed parts included
        None,
        ctx.service.report_write_gzip_log,
    )
    publish_report(report)
    return report


@flow(name="planner-demo")
def demo(
    trace_path: str,
    config_path: str,
    deployment: str = "demo",
    startup_s: float = 120.0,
    rate_scale: float = 1.0,
    max_windows: int | None = None,
    report_dir: str | None = None,
) -> dict:
    """Replay `trace_path` through the planner in simulated time; returns the run's summary figures.

    The database is the one `PLANNER_DATABASE_URL` names (else the embedded server), read here rather than taken
    as a parameter: Prefect keeps a flow run's parameters in its own database, and the URL may hold a password.
    The report of all the deployment's ticks goes to `report_dir` (default: the config's `report_output_dir`
    relative to the config file, else `reports/` in the planner's data folder).
    """
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import resolve_database_url, resolve_owner_database_url

    url = resolve_database_url()
    prepare_database(resolve_owner_database_url())  # migrations as the owner; the run writes through `url`
    ctx = load_context(url, deployment, config_path)
    if ctx.perf is None:
        raise ValueError(f"{config_path}: field 'profile_results_dir' = {ctx.config.profile_results_dir!r}: not found")
    trace = load_trace(trace_path).scaled(rate_scale)
    window_s = float(ctx.config.throughput_adjustment_interval_seconds)
    num_windows = max(1, int(trace.duration_s // window_s))  # full windows only: a partial last one looks idle
    if max_windows is not None:
        num_windows = min(num_windows, max_windows)

    recorded = recorded_tick_times(ctx)
    done = [k for k in range(1, num_windows + 1) if epoch(trace, k * window_s) in recorded]
    resume_s = max(done, default=0) * window_s
    # Rebuild the cluster from what Postgres says happened; acknowledge a decision written just before a stop.
    # the oracle's first size, found once for the run, its resumptions and its scoring
    start = starting_size(ctx, trace, startup_s)
    # Recorded only now, after every input has been read and checked and the starting size found: a run that fails
    # before its first tick leaves no deployment behind.
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, deployment, ctx.config)
    # `planner demo` printed them at start; the audit log keeps them, as `serve`'s does
    record_config_warnings(url, deployment, budget_warnings(ctx.config, Path(config_path)))
    cluster = simulate_timeline(ctx, trace, recorded_scale_events(ctx, trace), resume_s, startup_s, start)
    with VirtualConnectorClient(url, deployment) as client:
        acknowledge_after_restart(client, ctx, trace)
        if resume_s > 0:
            # A stop between recording the last tick and executing its decision leaves it pending: finish that
            # tick's execution at its own time, exactly as an uninterrupted run would have.
            apply_decisions(ctx, epoch(trace, resume_s))
            follow_decisions(client, cluster, epoch(trace, resume_s))
        _walk_windows(
            ctx, client, cluster, trace, window_s=window_s, num_windows=num_windows, resume_s=resume_s,
            num_done=len(done),
        )  # fmt: skip
    end_s = num_windows * window_s
    events = recorded_scale_events(ctx, trace)
    served = trace.head(end_s)  # the requests of the windows the planner ticked on
    rows = [score_run(ctx, served, events, startup_s, start), *comparison_rows(ctx, served, events, startup_s, start)]
    report = _publish_run_report(ctx, config_path, report_dir, epoch(trace, end_s))
    return summary_dict(ctx, rows, events, num_windows) | {"report_path": str(report.path), "starting_size": start}
