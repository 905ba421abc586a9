"""The load loop and user plugins at the I/O edge: `load_context` + `run_tick` + `run_execution` on real Postgres.

The business-hours example plugin is installed as a real distribution (its `*.dist-info` with the entry points of
`examples/plugins/business_hours/pyproject.toml`, see tests/core/test_plugin_packages.py) and enabled in the config; the
forward-pass metrics a load tick reads are inserted into `fpm_samples` as the ingest would. Configs are
`tests.conftest.write_config` (SLA target on the shared H200 profile, 200 ms TTFT, 10 ms ITL) plus overrides.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from planner_core.domain import (
    Component,
    ForwardPassMetrics,
    Loop,
    QueuedRequests,
    ReasonCode,
    ScheduledRequests,
    TrafficObservation,
)
from planner_core.pipeline import PluginConfigError
from planner_core.runtime.service import PlannerContext, load_context, run_execution, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples
from planner_core.runtime.store.models import DecisionRow, ExecutionRow, VirtualConnectorStateRow
from tests.conftest import write_config
from tests.core.test_plugin_packages import install_distribution, install_example

T0 = dt.datetime(2026, 11, 2, 10, 0, tzinfo=dt.UTC)  # a Monday, 10:00 UTC
P, D = Component.PREFILL, Component.DECODE
BUSY = TrafficObservation(duration_s=60.0, num_req=3000.0, isl=3000.0, osl=300.0)
ALWAYS_OPEN = {"start_hour": 0, "end_hour": 24, "weekends": True}


def context(database_url: str, tmp_path: Path, name: str, **overrides: Any) -> PlannerContext:
    """A planner context for `name`, its deployment row created (so metrics can be inserted for it)."""
    ctx = load_context(database_url, name, write_config(tmp_path, **overrides))
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, name, ctx.config)
    return ctx


def report(component: Component, worker_id: str, *, queued_prefill_tokens: int = 0) -> ForwardPassMetrics:
    """One engine iteration: a 2000-token prompt (prefill) or 32 requests holding 64k KV tokens (decode)."""
    if component is P:
        scheduled = ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=2000)
    else:
        scheduled = ScheduledRequests(num_decode_requests=32, sum_decode_kv_tokens=64_000)
    return ForwardPassMetrics(
        component=component,
        worker_id=worker_id,
        counter_id=1,
        wall_time_s=0.02,
        scheduled=scheduled,
        queued=QueuedRequests(sum_prefill_tokens=queued_prefill_tokens),
    )


def publish(ctx: PlannerContext, at: dt.datetime, *reports: ForwardPassMetrics) -> None:
    """Store engine reports as the ingest does, received just before `at`."""
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, ctx.deployment)
        assert deployment is not None
        samples = [FpmSample(fpm=fpm, received_at=at - dt.timedelta(seconds=1)) for fpm in reports]
        insert_fpm_samples(session, deployment.id, samples)


def stored_steps(ctx: PlannerContext, tick_id: int) -> list[tuple[str, str | None, str, float | None]]:
    with ctx.sessions.begin() as session:
        rows = session.execute(  # the view over tick_step_lists (migration 0015)
            text("SELECT step, component, reason, value FROM tick_steps WHERE tick_id = :id ORDER BY seq"),
            {"id": tick_id},
        )
        return [(row.step, row.component, row.reason, row.value) for row in rows]


# --- user plugins in the live path -----------------------------------------------------------------------------


def test_enabled_plugin_runs_in_every_tick_and_its_steps_are_stored(
    database_url: str, tmp_path: Path, site: Path
) -> None:
    """`load_context` loads the enabled example plugin once; `run_tick` runs it beside the builtin plugins in both
    loops, and its steps land in `tick_steps`."""
    install_example(site)
    ctx = context(
        database_url,
        tmp_path,
        "hours",
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5,
        plugins={
            "enabled": ["business_hours_floor"],
            "settings": {"business_hours_floor": {"decode_floor": 4, **ALWAYS_OPEN}},
        },
    )
    assert [p.spec.plugin_id for p in ctx.planner.plugins] == ["business_hours_floor"]
    assert ctx.plugin_load_errors == ()

    # throughput tick (both loops on): the builtin only sets floors; the plugin's AT_LEAST 4 is the decision
    first = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    assert first.outcome is not None and first.outcome.decision.num_decode == 4
    steps = stored_steps(ctx, first.tick_id)
    assert ("propose:business_hours_floor", None, ReasonCode.PLUGIN_OVERRIDES.value, None) in [
        (step, component, reason, None) for step, component, reason, _ in steps
    ]
    assert ("propose:business_hours_floor", "decode", ReasonCode.OVERRIDE_AT_LEAST.value, 4.0) in steps
    assert steps[-1][:3] == ("execute", None, ReasonCode.APPLY.value)
    run_execution(ctx, T0)

    # load tick: the builtin load plugin holds (the decode scale is in flight), the plugin's floor is recorded too
    later = T0 + dt.timedelta(seconds=5)
    publish(ctx, later, report(P, "p-0"), report(D, "d-0"))
    second = run_tick(ctx, Loop.LOAD, later, None)
    assert second.outcome is not None
    names = [step for step, *_ in stored_steps(ctx, second.tick_id)]
    assert "propose:builtin_load_propose" in names and "propose:business_hours_floor" in names
    assert names.index("propose:builtin_load_propose") < names.index("propose:business_hours_floor")  # priority


BROKEN_MODULE = """
def make(settings):
    raise RuntimeError("cannot reach the capacity service")
"""


def test_plugin_load_failures_are_steps_of_every_tick(database_url: str, tmp_path: Path, site: Path) -> None:
    """An enabled entry point whose factory raises is skipped; each tick records it first, and the others run."""
    install_example(site)
    install_distribution(
        site, "broken-plugin", {"broken_plugin_mod.py": BROKEN_MODULE}, {"broken": "broken_plugin_mod:make"}
    )
    ctx = context(
        database_url,
        tmp_path,
        "broken",
        plugins={
            "enabled": ["broken", "business_hours_floor"],
            "settings": {"business_hours_floor": {"decode_floor": 3, **ALWAYS_OPEN}},
        },
    )
    assert [e.entry_point for e in ctx.plugin_load_errors] == ["broken"]
    for minute in (0, 1):
        result = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=minute), BUSY)
        steps = stored_steps(ctx, result.tick_id)
        assert steps[0][:3] == ("plugin_load:broken", None, ReasonCode.PLUGIN_LOAD_FAILED.value)
        assert any(step == "propose:business_hours_floor" for step, *_ in steps)
    with ctx.sessions.begin() as session:
        detail = session.scalar(text("SELECT detail FROM tick_steps WHERE step = 'plugin_load:broken' LIMIT 1"))
    assert detail == (
        "plugin entry point 'broken' (broken_plugin_mod:make): RuntimeError: cannot reach the capacity service"
    )


SLOW_MODULE = """
import time
from planner_core.pipeline import FunctionPlugin, Phase, PluginSpec

def make(settings):
    return FunctionPlugin(PluginSpec(plugin_id="slow", phase=Phase.CONSTRAIN), lambda context: time.sleep(0.3))
"""


def test_live_ticks_enforce_plugin_timeouts(database_url: str, tmp_path: Path, site: Path) -> None:
    """`run_tick` passes a monotonic clock: a plugin over its timeout (here the config's override, 0.05 s) has its
    result discarded and is recorded as `plugin_timeout`; the tick still decides."""
    install_distribution(site, "slow-plugin", {"slow_plugin_mod.py": SLOW_MODULE}, {"slow": "slow_plugin_mod:make"})
    ctx = context(
        database_url, tmp_path, "slow", plugins={"enabled": ["slow"], "overrides": {"slow": {"timeout_seconds": 0.05}}}
    )
    assert ctx.planner.plugins[0].spec.timeout_s == 0.05  # the override was applied when the plugin was loaded
    result = run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    assert result.outcome is not None and not result.outcome.decision.is_empty
    [slow] = [step for step in stored_steps(ctx, result.tick_id) if step[0] == "constrain:slow"]
    assert slow[2] == ReasonCode.PLUGIN_TIMEOUT.value and slow[3] >= 0.3  # value: the run's seconds


def test_user_plugin_cannot_take_a_builtin_id(database_url: str, tmp_path: Path, site: Path) -> None:
    """A user plugin named like a builtin one would stop every tick: `load_context` refuses it in one line."""
    module = (
        "from planner_core.pipeline import FunctionPlugin, Phase, PluginSpec\n"
        "def make(settings):\n"
        "    return FunctionPlugin(PluginSpec(plugin_id='builtin_load_propose', phase=Phase.PROPOSE), lambda c: None)\n"
    )
    install_distribution(site, "impostor", {"impostor_mod.py": module}, {"impostor": "impostor_mod:make"})
    path = write_config(tmp_path, plugins={"enabled": ["impostor"]})
    with pytest.raises(PluginConfigError, match=r"plugin id 'builtin_load_propose' is used by two plugins"):
        load_context(database_url, "impostor", path)


def test_overrides_may_name_builtin_plugins(database_url: str, tmp_path: Path) -> None:
    """`plugins.overrides` is checked against the builtin ids too: a builtin id is accepted, a typo is not."""
    ctx = context(database_url, tmp_path, "overrides", plugins={"overrides": {"builtin_load_predict": {"priority": 1}}})
    assert ctx.planner.plugins == ()
    path = write_config(tmp_path, plugins={"overrides": {"builtin_load_predicts": {"priority": 1}}})
    with pytest.raises(PluginConfigError, match=r"field 'plugins.overrides.builtin_load_predicts'"):
        load_context(database_url, "typo", path)


# --- advisory end to end ----------------------------------------------------------------------------------------


def test_advisory_load_decision_is_recorded_and_never_applied(database_url: str, tmp_path: Path) -> None:
    """Advisory mode through the live path: the load tick decides (a prefill burst), the decision is stored with
    status `advisory`, and the execution flow never hands it to the connector."""
    ctx = context(
        database_url,
        tmp_path,
        "advisory",
        advisory=True,
        enable_throughput_scaling=False,
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5,
    )
    # 500,000 queued prompt tokens on the only prefill engine: a TTFT far over 200 ms on the H200 profile
    publish(ctx, T0, report(P, "p-0", queued_prefill_tokens=500_000), report(D, "d-0"))
    result = run_tick(ctx, Loop.LOAD, T0, None)
    assert result.outcome is not None
    assert result.outcome.decision.advisory and result.outcome.decision.num_prefill == 2
    assert stored_steps(ctx, result.tick_id)[-1][:3] == ("execute", None, ReasonCode.ADVISORY.value)

    assert run_execution(ctx, T0 + dt.timedelta(seconds=1)) == []  # nothing pending: nothing to apply
    with ctx.sessions.begin() as session:
        [decision] = session.scalars(select(DecisionRow)).all()
        assert (decision.status, decision.target_prefill) == ("advisory", 2)
        assert session.scalars(select(ExecutionRow)).all() == []
        state = session.scalar(select(VirtualConnectorStateRow))
        assert state is None or state.decision_id == -1  # the connector never saw a target
        workers = ctx.connector.worker_counts(session, decision.deployment_id, default=result.inputs.workers)
    assert workers == result.inputs.workers  # nothing changed for the orchestrator

    # the next load tick sees the same fleet (no scale in flight) and advises again
    later = T0 + dt.timedelta(seconds=5)
    publish(ctx, later, report(P, "p-0", queued_prefill_tokens=500_000), report(D, "d-0"))
    again = run_tick(ctx, Loop.LOAD, later, None)
    assert again.outcome is not None and again.outcome.decision.advisory
    assert again.outcome.reason is ReasonCode.SCALE


# --- a single-pool planner behind the virtual connector ----------------------------------------------------------


def test_aggregated_load_loop_is_not_held_by_the_unmanaged_pool(database_url: str, tmp_path: Path) -> None:
    """An aggregated planner's decisions never name the prefill pool, so the virtual connector reports -1 expected
    prefill workers for ever; the load loop must still decide again once its own scale is done."""
    from planner_core.runtime.connectors.virtual import VirtualConnectorClient

    ctx = context(
        database_url,
        tmp_path,
        "agg",
        mode="agg",
        enable_throughput_scaling=False,
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5,
        max_gpu_budget=-1,
    )
    burst = dict(queued_prefill_tokens=500_000)
    publish(ctx, T0, report(D, "a-0", **burst))
    first = run_tick(ctx, Loop.LOAD, T0, None)
    assert first.outcome is not None and first.outcome.decision.num_decode == 2
    [applied] = run_execution(ctx, T0)
    assert applied.status.value == "applied"
    with VirtualConnectorClient(database_url, "agg") as orchestrator:
        target = orchestrator.get()
        assert (target.num_prefill_workers, target.num_decode_workers) == (-1, 2)
        orchestrator.report_workers(ready_prefill=0, ready_decode=2)
        orchestrator.complete(target)
    later = T0 + dt.timedelta(seconds=5)
    publish(ctx, later, report(D, "a-0", **burst), report(D, "a-1", **burst))
    second = run_tick(ctx, Loop.LOAD, later, None)
    assert second.outcome is not None
    assert second.inputs.workers.expected_prefill == -1  # the unmanaged pool, as the connector reports it
    assert second.outcome.reason is not ReasonCode.SCALING_IN_PROGRESS
    assert second.outcome.decision.num_decode == 3


def test_idle_engines_heartbeats_let_the_load_loop_scale_down(database_url: str, tmp_path: Path) -> None:
    """Engines with nothing to do only send idle heartbeats (wall time 0); stored like any sample, they are the
    reports that let the load loop see a quiet pool and remove an engine."""
    from planner_core.runtime.connectors.virtual import VirtualConnectorClient

    ctx = context(
        database_url,
        tmp_path,
        "idle",
        enable_throughput_scaling=False,
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5,
    )
    with VirtualConnectorClient(database_url, "idle") as orchestrator:
        orchestrator.report_workers(ready_prefill=2, ready_decode=1)
    heartbeats = [
        ForwardPassMetrics(component=c, worker_id=w, counter_id=7) for c, w in ((P, "p-0"), (P, "p-1"), (D, "d-0"))
    ]
    publish(ctx, T0, *heartbeats)
    result = run_tick(ctx, Loop.LOAD, T0, None)
    assert result.outcome is not None
    assert result.outcome.decision.num_prefill == 1
    steps = stored_steps(ctx, result.tick_id)
    assert ("fleet", "prefill", ReasonCode.OBSERVED.value, 2.0) in steps
    assert ("load_decision", "prefill", ReasonCode.SCALE_DOWN.value, 1.0) in steps
