"""The measured start-up at the I/O edge: live ticks read when the execution flow applied their decisions
(`TickInputs.applied`, from `executions`) and time a scale-up from the deciding tick, through the connector's
acknowledgement, to the orchestrator's ready workers; on real Postgres with the virtual connector."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from planner_core.domain import AppliedTargets, Component, Loop, ReasonCode
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.replay import ReplayMode, replay
from planner_core.runtime.service import run_execution, run_tick
from tests.runtime.test_load_loop_service import BUSY, T0, context

MINUTE = dt.timedelta(minutes=1)


def test_a_live_scale_up_is_timed_through_its_acknowledgement_to_ready(database_url: str, tmp_path: Path) -> None:
    """The pools raised at T0; the execution flow applies the decision 25 s later; the orchestrator reports the
    engines ready before the tick at T0 + 2 min: one sample per raised pool of 120 s, 25 s of it to the
    acknowledgement. The tick between the two reads the applied decision, and replay reproduces every tick from
    what was recorded."""
    ctx = context(
        database_url,
        tmp_path,
        "startup",
        throughput_algorithm="engine_capacity",  # the sizing the horizon headroom applies to
        throughput_horizon_quantile=0.75,
        max_gpu_budget=-1,
    )
    first = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    assert first.outcome is not None
    target = first.outcome.decision.num_prefill
    assert target is not None and target > 1
    assert first.inputs is not None and first.inputs.applied == ()  # nothing pending before the first tick
    raised = {p.component for p in first.outcome.next_state.startup.pending}
    assert Component.PREFILL in raised
    assert all(p.applied_at_s is None for p in first.outcome.next_state.startup.pending)

    applied_at = T0 + dt.timedelta(seconds=25)
    [summary] = run_execution(ctx, applied_at)
    assert summary.status.value == "applied"

    second = run_tick(ctx, Loop.THROUGHPUT, T0 + MINUTE, BUSY)  # applied, still starting
    assert second.inputs is not None and second.outcome is not None
    assert second.inputs.applied == (
        AppliedTargets(
            at_s=applied_at.timestamp(),
            num_prefill=target,
            num_decode=first.outcome.decision.num_decode,
        ),
    )
    pending = second.outcome.next_state.startup.pending
    assert {p.component for p in pending} == raised
    assert all(p.applied_at_s == applied_at.timestamp() for p in pending)

    with VirtualConnectorClient(database_url, "startup") as orchestrator:
        decision = orchestrator.get()
        orchestrator.report_workers(
            ready_prefill=decision.num_prefill_workers, ready_decode=decision.num_decode_workers
        )
        orchestrator.complete(decision, at=T0 + dt.timedelta(seconds=100))

    third = run_tick(ctx, Loop.THROUGHPUT, T0 + 2 * MINUTE, BUSY)
    assert third.outcome is not None
    samples = third.outcome.next_state.startup.samples
    assert {s.component: (s.startup_s, s.apply_s) for s in samples} == {c: (120.0, 25.0) for c in raised}

    fourth = run_tick(ctx, Loop.THROUGHPUT, T0 + 3 * MINUTE, BUSY)
    assert fourth.outcome is not None
    [startup] = [s for s in fourth.outcome.steps if s.step == "startup" and s.component is Component.PREFILL]
    assert (startup.reason, startup.value) == (ReasonCode.STARTUP_MEASURED, 120.0)
    assert "acknowledgement: median 25 s of 1" in startup.detail

    for mode in ReplayMode:  # from each tick's recorded state, and chained from the first one's
        summary = replay(database_url, "startup", T0, T0 + 4 * MINUTE, recorded_config_dir=tmp_path, mode=mode)
        assert (summary.num_ticks, summary.num_identical) == (4, 4), summary.differences
