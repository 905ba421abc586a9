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

import dataclasses
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path

from prefect import flow
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import select

from flows.report import publish_report, write_report
from flows.ticks import apply_decisions, decide_and_record
from planner_core.domain import Loop
from planner_core.lab.sim.bench import (
    BenchRow,
    FixedPolicy,
    PlannerPolicy,
    bench_config,
    policy_path,
    run_policy,
    score,
)
from planner_core.lab.sim.des import ClusterSimulator, SimSpec, spec_for_config
from planner_core.lab.sim.oracle import OracleSettings, oracle_first_window
from planner_core.perf.forward import ForwardPassModel
from planner_core.planner import build_planner
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.metrics import recorded_gpu_hours
from planner_core.runtime.report import periodic_report_path
from planner_core.runtime.service import (
    PlannerContext,
    load_context,
    prepare_database,
    resolve_report_dir,
)
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


def simulated_engines(ctx: PlannerContext, startup_s: float) -> tuple[ForwardPassModel, SimSpec]:
    """The simulated engines of the config (`spec_for_config`), timed by the profile's forward-pass model: the
    cluster the demo runs, and the one its starting size and comparison rows are found on."""
    assert ctx.perf is not None
    fwd = ctx.perf.forward_pass_model()
    assert fwd is not None
    spec = spec_for_config(ctx.config, profiled_max_kv_tokens=ctx.perf.profiled_max_kv_tokens(), startup_s=startup_s)
    return fwd, spec


# The demo's cluster starts as `planner bench` starts every policy: at the oracle's size for this first stretch of
# the trace (the bench's default oracle window).
STARTING_WINDOW_S = 180.0


def starting_size(ctx: PlannerContext, trace: RequestTrace, startup_s: float) -> tuple[int, int]:
    """Where the demo's cluster starts: a deployment already serving the trace's traffic, at the oracle's size
    for the trace's first `STARTING_WINDOW_S` (the fewest engines that serve those requests within the SLA,
    searched in the simulator up to the GPU budget: `planner_core.lab.sim.oracle`), as `planner bench` starts its
    policies. The rows the
    run is compared with start there too. (0, A) for aggregated engines."""
    fwd, spec = simulated_engines(ctx, startup_s)
    # the search stops at what the GPU budget allows: a deployment does not start above its own ceiling (and an
    # SLA no size meets would otherwise search hundreds of engines)
    budget, gpus = ctx.config.max_gpu_budget, max(spec.prefill_limits.num_gpu, spec.decode_limits.num_gpu)
    settings = OracleSettings(max_replicas=max(1, budget // gpus)) if budget > 0 else OracleSettings()
    first = oracle_first_window(
        trace, fwd, spec, ttft_ms=ctx.config.ttft_ms, itl_ms=ctx.config.itl_ms, window_s=STARTING_WINDOW_S,
        settings=settings,
    )  # fmt: skip
    assert first is not None  # a loaded trace has requests
    return first.num_prefill, first.num_decode


def _new_cluster(
    ctx: PlannerContext, trace: RequestTrace, startup_s: float, start: tuple[int, int]
) -> ClusterSimulator:
    """The discrete-event cluster the config describes (`spec_for_config`), timed by the profile's forward-pass
    model, at `start` (`starting_size`)."""
    fwd, spec = simulated_engines(ctx, startup_s)
    num_prefill, num_decode = start
    return ClusterSimulator(trace, fwd, spec, num_prefill=num_prefill, num_decode=num_decode)


def score_run(
    ctx: PlannerContext, trace: RequestTrace, events: list[ScaleEvent], startup_s: float, start: tuple[int, int]
) -> BenchRow:
    """The demo's own figures, scored as `planner bench` scores a policy: the cluster re-run from the start under
    the recorded scale events, every request served to completion."""
    started = time.perf_counter()
    cluster = simulate_timeline(ctx, trace, events, trace.duration_s, startup_s, start)
    cluster.run_to_completion()
    wall_s = time.perf_counter() - started
    name = f"{ctx.deployment} (this run)"
    return score(name, trace, cluster.result(), ttft_ms=ctx.config.ttft_ms, itl_ms=ctx.config.itl_ms, wall_s=wall_s)


def comparison_rows(
    ctx: PlannerContext, trace: RequestTrace, events: list[ScaleEvent], startup_s: float, start: tuple[int, int]
) -> list[BenchRow]:
    """The same requests under a static size (the run's peak targets, held from the start: provisioning for the
    peak instead of scaling) and under Dynamo's planner with its defaults (`dynamo-defaults.yaml` at this SLA),
    in the simulator as `planner bench` runs them, from the same start (`starting_size`) and start-up time."""
    fwd, spec = simulated_engines(ctx, startup_s)
    peak_prefill = max([start[0], *(e.num_prefill for e in events)])
    peak_decode = max([start[1], *(e.num_decode for e in events)])
    static = FixedPolicy(
        name=f"static {peak_prefill}P/{peak_decode}D (the run's peak)", num_prefill=peak_prefill,
        num_decode=peak_decode,
    )  # fmt: skip
    scenario = {field: getattr(ctx.config, field) for field in ("ttft_ms", "itl_ms")} | {
        "prefill_engine_num_gpu": ctx.config.prefill_gpus_per_engine,
        "decode_engine_num_gpu": ctx.config.decode_gpus_per_engine,
    }
    path = policy_path("dynamo-defaults")
    dynamo = PlannerPolicy(
        name="Dynamo's defaults",
        planner=build_planner(bench_config(path, scenario), path, perf=ctx.perf),
        initial_size=start,
    )
    return [
        run_policy(policy, trace, fwd, spec, ttft_ms=ctx.config.ttft_ms, itl_ms=ctx.config.itl_ms).row
        for policy in (static, dynamo)
    ]


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
    ctx: PlannerContext,
    trace: RequestTrace,
    events: list[ScaleEvent],
    end_s: float,
    startup_s: float,
    start: tuple[int, int],
) -> ClusterSimulator:
    """Re-run the cluster from the start of the trace at `start`, applying each scale event at its time."""
    cluster = _new_cluster(ctx, trace, startup_s, start)
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
    report_dir: str | None = None,
) -> dict:
    """Replay `trace_path` through the planner in simulated time; returns the run's summary figures.

    The database is the one `PLANNER_DATABASE_URL` names (else the embedded server), read here rather than taken
    as a parameter: Prefect keeps a flow run's parameters in its own database, and the URL may hold a password.
    The report of all the deployment's ticks goes to `report_dir` (default: the config's `report_output_dir`
    relative to the config file, else `reports/` in the planner's data folder).
    """
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

    recorded = _recorded_tick_times(ctx)
    done = [k for k in range(1, num_windows + 1) if _epoch(trace, k * window_s) in recorded]
    resume_s = max(done, default=0) * window_s
    # Rebuild the cluster from what Postgres says happened; acknowledge a decision written just before a stop.
    # the oracle's first size, found once for the run, its resumptions and its scoring
    start = starting_size(ctx, trace, startup_s)
    # Recorded only now, after every input has been read and checked and the starting size found: a run that fails
    # before its first tick leaves no deployment behind.
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, deployment, ctx.config)
    cluster = simulate_timeline(ctx, trace, recorded_scale_events(ctx, trace), resume_s, startup_s, start)
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
                traffic = cluster.observe(end_s - window_s, end_s, planner=ctx.planner)
                decide_and_record(ctx, Loop.THROUGHPUT, now, traffic)
                apply_decisions(ctx, now)
                _follow_decisions(client, cluster, now)
                progress.update(bar, advance=1)
    end_s = num_windows * window_s
    events = recorded_scale_events(ctx, trace)
    served = trace.head(end_s)  # the requests of the windows the planner ticked on
    rows = [score_run(ctx, served, events, startup_s, start), *comparison_rows(ctx, served, events, startup_s, start)]
    data_dir = RuntimeSettings().data_dir
    out_dir = Path(report_dir) if report_dir else resolve_report_dir(ctx.service, Path(config_path), data_dir)
    report = write_report(
        deployment,
        periodic_report_path(out_dir, _epoch(trace, end_s), ctx.service.report_filename, deployment=deployment),
        None,  # the whole run, resumed parts included
        None,
        ctx.service.report_write_gzip_log,
    )
    publish_report(report)
    return _summary_dict(ctx, rows, events, num_windows) | {"report_path": str(report.path), "starting_size": start}


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


def _summary_dict(ctx: PlannerContext, rows: list[BenchRow], events: list[ScaleEvent], num_windows: int) -> dict:
    with ctx.sessions.begin() as session:
        counts = repo.query_rows(
            session,
            """SELECT (SELECT count(*) FROM ticks t JOIN deployments d ON d.id = t.deployment_id
                        WHERE d.name = :name) AS num_ticks,
                      (SELECT count(*) FROM decision_history WHERE deployment = :name) AS num_decisions""",
            name=ctx.deployment,
        )[0]
        # the report's and the metrics' count over the same recorded ticks (`planner_core.domain.gpu_hours`)
        gpu_hours_recorded = recorded_gpu_hours(session, ctx.deployment)
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
        "num_requests": rows[0].requests,
        "sla_attainment": rows[0].sla_attainment,
        "ttft_ms": ctx.config.ttft_ms,
        "itl_ms": ctx.config.itl_ms,
        # GPU-hours as the report and the metrics count them: the ready workers each tick saw, held until the
        # next tick. The simulator's figure (the comparison rows' `gpu_hours`, the bench's) also counts starting
        # and draining workers, the first window before the first tick and the tail to the last request.
        "gpu_hours": gpu_hours_recorded,
        "simulated_gpu_hours": rows[0].gpu_hours,
        "mean_ttft_ms": rows[0].ttft_ms_mean,
        "mean_itl_ms": rows[0].itl_ms_mean,
        "scale_events": [(e.at_s, e.num_prefill, e.num_decode) for e in events],
        "comparison": [dataclasses.asdict(row) for row in rows],  # this run first, then the same requests otherwise
    }
