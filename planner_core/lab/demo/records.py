"""What the demo reads back from Postgres (the ORM and the history views): the scale events written to the virtual
connector, the throughput ticks already recorded, the run's summary; and the simulated orchestrator's side of the
virtual connector (follow a written decision, acknowledge one left unacknowledged by a stop)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import select

from planner_core.domain import Loop
from planner_core.lab.demo.scoring import ScaleEvent, epoch
from planner_core.lab.sim.bench import BenchRow
from planner_core.lab.sim.des import ClusterSimulator
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.metrics import recorded_gpu_hours
from planner_core.runtime.service import PlannerContext
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.models import Tick, VirtualDecisionRow
from planner_core.traces import RequestTrace


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


def recorded_tick_times(ctx: PlannerContext) -> set[dt.datetime]:
    """The scheduled times of the deployment's recorded throughput ticks (the windows a resumed run skips)."""
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, ctx.deployment)
        if deployment is None:
            return set()
        return set(
            session.scalars(
                select(Tick.scheduled_at).where(Tick.deployment_id == deployment.id, Tick.loop == Loop.THROUGHPUT.value)
            )
        )


def follow_decisions(client: VirtualConnectorClient, cluster: ClusterSimulator, now: dt.datetime) -> None:
    """The simulated orchestrator: take a new decision if one was written, scale, acknowledge."""
    decision = client.wait(timeout_s=0.0)
    if decision is not None and decision.decision_id >= 0:
        cluster.set_targets(decision.num_prefill_workers, decision.num_decode_workers)
        client.complete(decision, at=now)


def acknowledge_after_restart(client: VirtualConnectorClient, ctx: PlannerContext, trace: RequestTrace) -> None:
    """Catch the client up with the current decision after a (re)start.

    The rebuilt cluster already applied every written decision, so one written but not acknowledged before a
    stop is acknowledged now, at the simulated time it was written.
    """
    current = client.wait(timeout_s=0.0)
    if current is None or current.decision_id < 0:
        return
    events = recorded_scale_events(ctx, trace)
    client.complete(current, at=epoch(trace, events[-1].at_s))


def summary_dict(ctx: PlannerContext, rows: list[BenchRow], events: list[ScaleEvent], num_windows: int) -> dict:
    """The run's summary figures: its ticks and decisions as recorded, its GPU-hours as the report counts them, and
    the scored rows (this run first)."""
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
        # the decisions the GPU budget set (their deciding stage, `decisions.stage`): the demo warns about them
        capped = repo.query_rows(
            session,
            "SELECT why FROM decision_history WHERE deployment = :name AND reason = 'budget' ORDER BY decided_at",
            name=ctx.deployment,
        )
    return {
        "deployment": ctx.deployment,
        "window_s": float(ctx.config.throughput_adjustment_interval_seconds),
        "num_windows": num_windows,
        "num_ticks": counts["num_ticks"],
        "num_decisions": counts["num_decisions"],
        "decision_statuses": ", ".join(f"{row['n']} {row['status']}" for row in statuses) or "none",
        "budget_capped": [row["why"] for row in capped],
        "max_gpu_budget": ctx.config.max_gpu_budget,
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
