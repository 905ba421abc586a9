"""Safe actuation in the decision core: the rule for a count someone else changed (`policy.ownership`) and signal
health with its guard, "a missing signal never lets a pool shrink" (`policy.signals`), through `tick()` and the
pipeline. Pure: plugins are `FunctionPlugin`s proposing fixed overrides (real plugins, not mocks)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import parse_config
from planner_core.domain import (
    AdoptedCount,
    Component,
    ExecuteAction,
    ForwardPassMetrics,
    Loop,
    OutsideChange,
    OverrideType,
    PlannerState,
    ReasonCode,
    ReplicaOverride,
    Signal,
    SignalStatus,
    StepName,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.pipeline import FunctionPlugin, Phase, PluginResult, PluginSpec, run_pipeline
from planner_core.policy.signals import observe_signals
from planner_core.tick import tick

P, D = Component.PREFILL, Component.DECODE
CONFIG = parse_config({"max_gpu_budget": -1}).policy  # disagg, min endpoint 1, load loop on (target not sla)
SLA = parse_config({"optimization_target": "sla", "max_gpu_budget": -1}).policy  # throughput loop only
TRAFFIC = TrafficObservation(duration_s=60.0, num_req=600.0, isl=1000.0, osl=100.0, ttft_ms=80.0)


def workers(prefill: int, decode: int) -> WorkerCounts:
    return WorkerCounts(ready_prefill=prefill, ready_decode=decode, expected_prefill=prefill, expected_decode=decode)


def proposing(**targets: int) -> FunctionPlugin:
    """A PROPOSE plugin that sets each named pool (`prefill=`, `decode=`) to the given count."""
    overrides = tuple(
        ReplicaOverride(component=Component(name), kind=OverrideType.SET, replicas=n) for name, n in targets.items()
    )
    return FunctionPlugin(
        PluginSpec(plugin_id="proposer", phase=Phase.PROPOSE), lambda _context: PluginResult(overrides=overrides)
    )


def steps_of(outcome: Any, step: StepName) -> list[tuple[ReasonCode, Component | None, float | None]]:
    return [(s.reason, s.component, s.value) for s in outcome.steps if s.step == step]


def fpm(component: Component, worker: str) -> ForwardPassMetrics:
    return ForwardPassMetrics(component=component, worker_id=worker, wall_time_s=0.02)


# --- one owner of the replica count ----------------------------------------------------------------------------


def test_an_outside_change_is_adopted_held_then_sized_again() -> None:
    """kubectl scale decode 2 -> 5: the tick that sees it adopts 5 and holds it for the hold (600 s by default)
    against a proposal of 2; once the hold is over the planner's own sizing applies again from 5."""
    change = (OutsideChange(component=D, planner_replicas=2, observed_replicas=5),)
    shrink = [proposing(prefill=2, decode=2)]

    first = run_pipeline(shrink, TickInputs(now_s=100.0, loop=Loop.LOAD, workers=workers(2, 5),
                                            outside_changes=change), PlannerState(), CONFIG)  # fmt: skip
    assert first.action is ExecuteAction.SKIP_NO_TARGETS and first.decision.is_empty
    assert steps_of(first, StepName.OWNERSHIP) == [(ReasonCode.OUTSIDE_CHANGE_ADOPTED, D, 5.0)]
    assert first.next_state.adopted_counts == (AdoptedCount(component=D, replicas=5, at_s=100.0, hold_until_s=700.0),)

    during = run_pipeline(shrink, TickInputs(now_s=400.0, loop=Loop.LOAD, workers=workers(2, 5),
                                             outside_changes=change), first.next_state, CONFIG)  # fmt: skip
    assert during.decision.is_empty
    assert steps_of(during, StepName.OWNERSHIP) == [(ReasonCode.OUTSIDE_CHANGE_HELD, D, 5.0)]

    after = run_pipeline(shrink, TickInputs(now_s=700.0, loop=Loop.LOAD, workers=workers(2, 5),
                                            outside_changes=change), during.next_state, CONFIG)  # fmt: skip
    assert after.action is ExecuteAction.APPLY and after.decision.num_decode == 2
    assert steps_of(after, StepName.OWNERSHIP) == []  # remembered, not detected again
    assert after.next_state.adopted_counts == first.next_state.adopted_counts

    # the planner's 2 applied: the runtime reports no outside change any more and the adoption is forgotten
    # (during the hold, a decision carrying the adopted count would make it the planner's: the hold goes on)
    carried = run_pipeline(shrink, TickInputs(now_s=400.0, loop=Loop.LOAD, workers=workers(2, 5)),
                           first.next_state, CONFIG)  # fmt: skip
    assert carried.decision.is_empty and steps_of(carried, StepName.OWNERSHIP)[0][0] is ReasonCode.OUTSIDE_CHANGE_HELD
    settled = run_pipeline(shrink, TickInputs(now_s=760.0, loop=Loop.LOAD, workers=workers(2, 2)),
                           after.next_state, CONFIG)  # fmt: skip
    assert settled.next_state.adopted_counts == ()


def test_a_new_outside_count_during_a_hold_is_adopted_afresh() -> None:
    """The operator changes the pool again (5 -> 3) during the hold: 3 is adopted with a hold of its own."""
    state = PlannerState(adopted_counts=(AdoptedCount(component=D, replicas=5, at_s=0.0, hold_until_s=600.0),))
    change = (OutsideChange(component=D, planner_replicas=2, observed_replicas=3),)
    outcome = run_pipeline([proposing(decode=6)], TickInputs(now_s=60.0, loop=Loop.LOAD, workers=workers(2, 3),
                                                             outside_changes=change), state, CONFIG)  # fmt: skip
    assert outcome.decision.is_empty  # held at 3 against the proposal of 6
    assert outcome.next_state.adopted_counts == (AdoptedCount(component=D, replicas=3, at_s=60.0, hold_until_s=660.0),)


def test_restore_writes_the_planners_count_back_even_without_an_opinion() -> None:
    """outside_change_rule restore: the tick's target is the count the planner last applied, though no plugin
    spoke; the minimum endpoints still apply to it."""
    config = parse_config({"max_gpu_budget": -1, "outside_change_rule": "restore", "min_endpoint": 2}).policy
    change = (OutsideChange(component=P, planner_replicas=3, observed_replicas=1),)
    outcome = run_pipeline([], TickInputs(now_s=0.0, loop=Loop.LOAD, workers=workers(1, 4), outside_changes=change),
                           PlannerState(), config)  # fmt: skip
    assert outcome.action is ExecuteAction.APPLY
    assert (outcome.decision.num_prefill, outcome.decision.num_decode) == (3, 4)
    assert steps_of(outcome, StepName.OWNERSHIP) == [(ReasonCode.OUTSIDE_CHANGE_RESTORED, P, 3.0)]
    assert outcome.next_state.adopted_counts == ()
    # what decision_history shows for it (through tick(), which summarises the same steps)
    from planner_core.domain import DecisionStage, summarize_decision

    inputs = TickInputs(now_s=0.0, loop=Loop.LOAD, workers=workers(1, 4), outside_changes=change)
    summary = summarize_decision(tick(inputs, PlannerState(), config, None))
    assert summary.stage is DecisionStage.OWNERSHIP
    assert summary.text == "prefill 1->3: changed outside the planner: its 3 restored"


def test_an_outside_change_of_a_pool_the_mode_does_not_manage_is_ignored() -> None:
    config = parse_config({"max_gpu_budget": -1, "mode": "decode"}).policy
    change = (OutsideChange(component=P, planner_replicas=3, observed_replicas=1),)
    outcome = run_pipeline([], TickInputs(now_s=0.0, loop=Loop.LOAD, workers=workers(1, 4), outside_changes=change),
                           PlannerState(), config)  # fmt: skip
    assert steps_of(outcome, StepName.OWNERSHIP) == [] and outcome.next_state.adopted_counts == ()


def test_the_ownership_step_reaches_the_tick_through_tick() -> None:
    """Through `tick()` with the builtin load loop: the adoption is a step of the tick's explanation."""
    change = (OutsideChange(component=D, planner_replicas=1, observed_replicas=3),)
    inputs = TickInputs(now_s=10.0, loop=Loop.LOAD, workers=workers(1, 3), outside_changes=change)
    outcome = tick(inputs, PlannerState(), CONFIG, None)
    assert steps_of(outcome, StepName.OWNERSHIP) == [(ReasonCode.OUTSIDE_CHANGE_ADOPTED, D, 3.0)]


# --- signal health --------------------------------------------------------------------------------------------


def test_a_throughput_tick_without_traffic_misses_it_and_shrinks_nothing() -> None:
    """No traffic window: `signal_missed` with the streak, and a plugin's scale-down is taken back."""
    state = PlannerState(signals=(SignalStatus(signal=Signal.TRAFFIC, last_seen_s=60.0, num_misses=1),))
    inputs = TickInputs(now_s=180.0, loop=Loop.THROUGHPUT, workers=workers(3, 3))
    outcome = tick(inputs, state, SLA, None, plugins=(proposing(prefill=1, decode=5),))
    assert steps_of(outcome, StepName.SIGNAL) == [(ReasonCode.SIGNAL_MISSED, None, 2.0)]
    assert steps_of(outcome, StepName.SIGNAL_GUARD) == [(ReasonCode.STALE_SIGNAL_NO_SHRINK, P, 3.0)]
    assert (outcome.decision.num_prefill, outcome.decision.num_decode) == (3, 5)  # growing stays allowed
    traffic = next(s for s in outcome.next_state.signals if s.signal is Signal.TRAFFIC)
    assert traffic == SignalStatus(signal=Signal.TRAFFIC, last_seen_s=60.0, num_misses=2)


def test_a_signal_back_is_recorded_and_lets_pools_shrink_again() -> None:
    state = PlannerState(signals=(SignalStatus(signal=Signal.TRAFFIC, last_seen_s=60.0, num_misses=2),))
    inputs = TickInputs(now_s=240.0, loop=Loop.THROUGHPUT, workers=workers(3, 3), traffic=TRAFFIC)
    outcome = tick(inputs, state, SLA, None, plugins=(proposing(prefill=1),))
    assert steps_of(outcome, StepName.SIGNAL) == [(ReasonCode.SIGNAL_RECOVERED, None, 2.0)]
    assert outcome.decision.num_prefill == 1 and steps_of(outcome, StepName.SIGNAL_GUARD) == []


def test_load_tick_needs_every_ready_pools_forward_pass_metrics() -> None:
    """The decode engines report, the prefill engines do not: fpm is missing, nothing shrinks."""
    inputs = TickInputs(now_s=5.0, loop=Loop.LOAD, workers=workers(2, 2), fpm=(fpm(D, "d0"), fpm(D, "d1")))
    health = observe_signals(CONFIG, inputs, ())
    assert health.missing == (Signal.FPM,)
    both = TickInputs(now_s=5.0, loop=Loop.LOAD, workers=workers(2, 2), fpm=(fpm(D, "d0"), fpm(P, "p0")))
    assert observe_signals(CONFIG, both, ()).missing == ()
    # a pool without ready engines has nothing to report
    idle = TickInputs(now_s=5.0, loop=Loop.LOAD, workers=workers(0, 0))
    assert observe_signals(CONFIG, idle, ()).missing == ()


def test_latency_is_expected_only_once_the_source_has_shown_it() -> None:
    """With the closed loop on, a source that never reported latency does not go quiet; one that did, does."""
    config = parse_config({"optimization_target": "sla", "throughput_capacity_feedback": True,
                           "throughput_algorithm": "engine_capacity"}).policy  # fmt: skip
    no_latency = TrafficObservation(duration_s=60.0, num_req=600.0, isl=1000.0, osl=100.0)
    inputs = TickInputs(now_s=60.0, loop=Loop.THROUGHPUT, workers=workers(1, 1), traffic=no_latency)
    assert observe_signals(config, inputs, ()).missing == ()
    seen = (SignalStatus(signal=Signal.LATENCY, last_seen_s=0.0),)
    assert observe_signals(config, inputs, seen).missing == (Signal.LATENCY,)
    idle = TickInputs(
        now_s=60.0, loop=Loop.THROUGHPUT, workers=workers(1, 1),
        traffic=TrafficObservation(duration_s=60.0, num_req=0.0, isl=0.0, osl=0.0),
    )  # fmt: skip
    assert observe_signals(config, idle, seen).missing == ()  # an idle window has no latency to show


def test_without_worker_counts_no_pool_changes_at_all() -> None:
    inputs = TickInputs(now_s=5.0, loop=Loop.THROUGHPUT, workers=workers(2, 2), traffic=TRAFFIC, workers_observed=False)
    outcome = tick(inputs, PlannerState(), SLA, None, plugins=(proposing(prefill=4, decode=1),))
    assert outcome.decision.is_empty
    assert [r for r, _, _ in steps_of(outcome, StepName.SIGNAL_GUARD)] == [ReasonCode.WORKER_COUNTS_UNAVAILABLE] * 2


COUNTS = st.integers(min_value=0, max_value=12)


@settings(max_examples=200, deadline=None)
@given(
    expected=st.tuples(COUNTS, COUNTS),
    proposed=st.tuples(COUNTS, COUNTS),
    missing=st.sets(st.sampled_from([Signal.TRAFFIC, Signal.LATENCY]), min_size=1),
    outside=st.none() | st.tuples(st.sampled_from(Component), COUNTS),
    rule=st.sampled_from(["adopt_and_hold", "restore"]),
    min_endpoint=st.integers(min_value=0, max_value=3),
)
def test_a_missing_signal_never_lets_a_pool_shrink(
    expected: tuple[int, int],
    proposed: tuple[int, int],
    missing: set[Signal],
    outside: tuple[Component, int] | None,
    rule: str,
    min_endpoint: int,
) -> None:
    """Whatever a plugin proposes, whatever the ownership rule restores, whatever the minimum endpoints: on a
    throughput tick missing its traffic (or its latency, once seen), no pool's target is below its expected count."""
    config = parse_config(
        {
            "optimization_target": "sla",
            "throughput_capacity_feedback": True,
            "throughput_algorithm": "engine_capacity",
            "max_gpu_budget": -1,
            "outside_change_rule": rule,
            "min_endpoint": min_endpoint,
        }
    ).policy
    traffic = None if Signal.TRAFFIC in missing else TrafficObservation(duration_s=60, num_req=5, isl=10, osl=10)
    changes = () if outside is None else (OutsideChange(component=outside[0], planner_replicas=outside[1],
                                                        observed_replicas=expected[outside[0] is D]),)  # fmt: skip
    inputs = TickInputs(now_s=120.0, loop=Loop.THROUGHPUT, workers=workers(*expected), traffic=traffic,
                        outside_changes=changes)  # fmt: skip
    state = PlannerState(signals=(SignalStatus(signal=Signal.LATENCY, last_seen_s=60.0),))
    outcome = tick(inputs, state, config, None, plugins=(proposing(prefill=proposed[0], decode=proposed[1]),))
    decision = outcome.decision
    for component, target in ((P, decision.num_prefill), (D, decision.num_decode)):
        assert target is None or target >= inputs.workers.expected(component)


# --- the tick's one Event ---------------------------------------------------------------------------------------


def test_one_event_per_tick_the_most_telling_first() -> None:
    """A missing signal outranks an outside change, which outranks a budget cut, which outranks the scale itself;
    an unchanged tick posts nothing."""
    from planner_core.domain import EventReason, ScalingDecision, StepRecord, TickOutcome
    from planner_core.policy.events import tick_event

    inputs = TickInputs(now_s=0.0, loop=Loop.LOAD, workers=workers(2, 4))

    def outcome(decision: ScalingDecision, *reasons: ReasonCode) -> TickOutcome:
        steps = tuple(StepRecord(step="x", reason=r, detail=r.value) for r in reasons)
        return TickOutcome(decision=decision, next_state=PlannerState(), steps=steps, reason=ReasonCode.SCALE)

    up, down = ScalingDecision(num_prefill=3, num_decode=4), ScalingDecision(num_prefill=2, num_decode=3)
    cases = [
        (outcome(up, ReasonCode.GPU_BUDGET_CAPPED, ReasonCode.OUTSIDE_CHANGE_ADOPTED, ReasonCode.SIGNAL_MISSED),
         EventReason.METRICS_UNAVAILABLE),
        (outcome(up, ReasonCode.GPU_BUDGET_CAPPED, ReasonCode.OUTSIDE_CHANGE_RESTORED), EventReason.OUTSIDE_CHANGE),
        (outcome(up, ReasonCode.FLEET_CEILING_CAPPED), EventReason.RESOURCE_CONSTRAINED),
        (outcome(up), EventReason.SCALED_UP),
        (outcome(down), EventReason.SCALED_DOWN),
    ]  # fmt: skip
    for tick_outcome, want in cases:
        event = tick_event(inputs, tick_outcome)
        assert event is not None and event.reason is want
    assert tick_event(inputs, outcome(down)).message == "load tick: prefill 2 -> 2, decode 4 -> 3 (scale)"
    assert tick_event(inputs, outcome(ScalingDecision())) is None
    assert tick_event(inputs, outcome(ScalingDecision(num_prefill=1, advisory=True))) is None
