"""Tests of the plugin pipeline (`planner_core.pipeline`): merge rules, scheduling, failures, deadlines, advisory.

Pure: no database, no Prefect. Plugins are `FunctionPlugin`s (a spec and a function: real plugins, not mocks).
Unless a case says otherwise the config is disaggregated, min endpoint 1, no GPU budget, and the tick's expected
counts are 2 prefill / 4 decode, which is the baseline PROPOSE merges onto. Times are tick times (`now_s`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import PlannerConfig, parse_config
from planner_core.domain import (
    Component,
    ExecuteAction,
    ForwardPassMetrics,
    HoldPolicy,
    Loop,
    OverrideType,
    PartialPrediction,
    PipelineState,
    PlannerState,
    ReasonCode,
    ReplicaOverride,
    StepRecord,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.pipeline import (
    Contribution,
    FunctionPlugin,
    Observation,
    Phase,
    PipelineContext,
    PipelineOutcome,
    PluginConfigError,
    PluginResult,
    PluginSpec,
    base_cadence_s,
    merge_overrides,
    observations_needed,
    resolve_plugins,
    run_pipeline,
)
from planner_core.runtime.store.codec import from_jsonable, to_jsonable

P, D = Component.PREFILL, Component.DECODE
SET, AT_LEAST, AT_MOST, REJECT = OverrideType.SET, OverrideType.AT_LEAST, OverrideType.AT_MOST, OverrideType.REJECT
CONFIG = parse_config({"max_gpu_budget": -1}).policy
BASELINE = {P: 2, D: 4}
TRAFFIC = TrafficObservation(duration_s=60.0, num_req=600.0, isl=1000.0, osl=100.0)


def tick_inputs(
    now_s: float = 0.0, *, prefill: int = 2, decode: int = 4, traffic: TrafficObservation | None = None
) -> TickInputs:
    workers = WorkerCounts(ready_prefill=prefill, ready_decode=decode, expected_prefill=prefill, expected_decode=decode)
    return TickInputs(now_s=now_s, loop=Loop.LOAD, workers=workers, traffic=traffic)


def ov(
    component: Component | None, kind: OverrideType, replicas: int | None = None, reason: str = ""
) -> ReplicaOverride:
    return ReplicaOverride(component=component, kind=kind, replicas=replicas, reason=reason)


@dataclass
class Recorder:
    """A plugin function that returns a fixed result (or calls `then`) and remembers the contexts it saw."""

    result: PluginResult | None = None
    then: Callable[[PipelineContext], Any] | None = None
    seen: list[PipelineContext] = field(default_factory=list)

    def __call__(self, context: PipelineContext) -> Any:
        self.seen.append(context)
        return self.then(context) if self.then is not None else self.result


def plugin(
    plugin_id: str,
    phase: Phase = Phase.PROPOSE,
    *overrides: ReplicaOverride,
    final: bool = False,
    function: Callable[[PipelineContext], Any] | None = None,
    **spec: Any,
) -> FunctionPlugin:
    """A plugin returning `overrides` (or whatever `function` returns)."""
    recorder = Recorder(result=PluginResult(overrides=overrides, final=final), then=function)
    return FunctionPlugin(PluginSpec(plugin_id=plugin_id, phase=phase, **spec), recorder)


def calls(p: FunctionPlugin) -> int:
    return len(p.function.seen)  # type: ignore[attr-defined]


def run(
    plugins: list[FunctionPlugin], now_s: float = 0.0, state: PlannerState | None = None, **kwargs: Any
) -> PipelineOutcome:
    config = kwargs.pop("config", CONFIG)
    inputs = kwargs.pop("inputs", None) or tick_inputs(now_s, **kwargs)
    return run_pipeline(plugins, inputs, state or PlannerState(), config)


def reasons(outcome: PipelineOutcome, step: str) -> list[ReasonCode]:
    return [s.reason for s in outcome.steps if s.step == step]


# --- merge: worked examples --------------------------------------------------------------------------------------


def c(plugin_id: str, priority: int, *overrides: ReplicaOverride, final: bool = False) -> Contribution:
    return Contribution(plugin_id=plugin_id, phase=Phase.PROPOSE, priority=priority, overrides=overrides, final=final)


@dataclass(frozen=True)
class MergeCase:
    id: str
    contributions: tuple[Contribution, ...]
    want: dict[Component, int]  # merged targets (baseline prefill 2, decode 4)
    phase: Phase = Phase.PROPOSE
    want_reason: ReasonCode | None = None  # reason of the decode merge step
    want_rejected_by: str | None = None


MERGE_CASES = [
    MergeCase("single-set", (c("a", 10, ov(D, SET, 6)),), {P: 2, D: 6}, want_reason=ReasonCode.WITHIN_RANGE),
    # floor 5 > ceiling 3: max(5, min(3, rec 4)) = 5, the floor wins the conflict
    MergeCase(
        "floor-beats-ceiling",
        (c("a", 10, ov(D, AT_LEAST, 5)), c("b", 20, ov(D, AT_MOST, 3))),
        {P: 2, D: 5},
        want_reason=ReasonCode.MERGE_FLOOR_OVER_CEILING,
    ),
    # max(0, min(6, 8)) = 6
    MergeCase(
        "ceiling-caps-set",
        (c("a", 10, ov(D, SET, 8)), c("b", 20, ov(D, AT_MOST, 6))),
        {P: 2, D: 6},
        want_reason=ReasonCode.MERGE_CEILING,
    ),
    # max(3, 2) = 3
    MergeCase(
        "floor-raises-set",
        (c("a", 10, ov(D, SET, 2)), c("b", 20, ov(D, AT_LEAST, 3))),
        {P: 2, D: 3},
        want_reason=ReasonCode.MERGE_FLOOR,
    ),
    MergeCase("smallest-priority-set-wins", (c("a", 20, ov(D, SET, 7)), c("b", 10, ov(D, SET, 5))), {P: 2, D: 5}),
    MergeCase("equal-priority-by-plugin-id", (c("b", 10, ov(D, SET, 7)), c("a", 10, ov(D, SET, 5))), {P: 2, D: 5}),
    # no SET: rec = baseline 4; max(6, 4) = 6, and a floor below the baseline changes nothing
    MergeCase(
        "floor-above-baseline", (c("a", 10, ov(D, AT_LEAST, 6)),), {P: 2, D: 6}, want_reason=ReasonCode.MERGE_FLOOR
    ),
    MergeCase(
        "floor-below-baseline", (c("a", 10, ov(D, AT_LEAST, 3)),), {P: 2, D: 4}, want_reason=ReasonCode.WITHIN_RANGE
    ),
    MergeCase(
        "ceiling-below-baseline", (c("a", 10, ov(D, AT_MOST, 1)),), {P: 2, D: 1}, want_reason=ReasonCode.MERGE_CEILING
    ),
    MergeCase("pools-are-independent", (c("a", 10, ov(P, SET, 3)), c("b", 20, ov(D, AT_LEAST, 6))), {P: 3, D: 6}),
    # finals: the smallest-priority final is taken alone, even over a smaller-priority non-final SET and a floor
    MergeCase(
        "smallest-priority-final-wins",
        (
            c("a", 5, ov(D, SET, 9), ov(D, AT_LEAST, 8)),
            c("b", 10, ov(D, SET, 3), final=True),
            c("c", 1 + 19, ov(D, SET, 7), final=True),
        ),
        {P: 2, D: 3},
    ),
    # any REJECT short-circuits, final or not
    MergeCase(
        "reject-beats-final",
        (c("a", 1, ov(D, SET, 3), final=True), c("b", 50, ov(None, REJECT, reason="maintenance"))),
        {P: 2, D: 4},
        want_rejected_by="b",
    ),
    # CONSTRAIN: the SET is dropped (baseline stays 4) and the ceiling applies: min(3, 4) = 3
    MergeCase(
        "constrain-drops-set",
        (c("a", 10, ov(D, SET, 9)), c("b", 20, ov(D, AT_MOST, 3))),
        {P: 2, D: 3},
        phase=Phase.CONSTRAIN,
    ),
    # CONSTRAIN ignores final: both bounds apply, max(5, min(3, 4)) = 5
    MergeCase(
        "constrain-ignores-final",
        (c("a", 10, ov(D, AT_MOST, 3), final=True), c("b", 20, ov(D, AT_LEAST, 5))),
        {P: 2, D: 5},
        phase=Phase.CONSTRAIN,
        want_reason=ReasonCode.MERGE_FLOOR_OVER_CEILING,
    ),
    MergeCase(
        "invalid-overrides-ignored",
        (c("a", 10, ov(D, SET), ov(D, AT_LEAST, -1), ov(None, SET, 3)), c("b", 20, ov(D, SET, 6))),
        {P: 2, D: 6},
    ),
]


@pytest.mark.parametrize("case", MERGE_CASES, ids=lambda case: case.id)
def test_merge_worked_examples(case: MergeCase) -> None:
    """The type-aware merge of one phase: REJECT, then final, then max(floor, min(ceiling, rec)) per pool."""
    contributions = tuple(dataclasses.replace(x, phase=case.phase) for x in case.contributions)
    merged = merge_overrides(case.phase, contributions, BASELINE)
    assert dict(merged.targets) == case.want
    assert (merged.rejected_by.plugin_id if merged.rejected_by else None) == case.want_rejected_by
    if case.want_reason is not None:
        [step] = [s for s in merged.steps if s.step.endswith(":merge") and s.component is D]
        assert step.reason is case.want_reason


def test_merge_steps_name_every_override_and_outcome() -> None:
    """Each override gets a step under its plugin; drops and the final choice are explained."""
    constrain = merge_overrides(
        Phase.CONSTRAIN,
        [Contribution(plugin_id="cap", phase=Phase.CONSTRAIN, priority=1, overrides=(ov(D, SET, 9),), final=True)],
        BASELINE,
    )
    assert [s.reason for s in constrain.steps] == [ReasonCode.CONSTRAIN_SET_DROPPED, ReasonCode.CONSTRAIN_FINAL_IGNORED]
    assert constrain.touched == frozenset()

    final = merge_overrides(Phase.PROPOSE, [c("a", 5, ov(D, SET, 9)), c("b", 10, ov(D, SET, 3), final=True)], BASELINE)
    merge_final = [s for s in final.steps if s.reason is ReasonCode.MERGE_FINAL]
    assert (
        len(merge_final) == 1 and "b (priority 10)" in merge_final[0].detail and "discarded: a" in merge_final[0].detail
    )
    assert [s.reason for s in final.steps if s.step == "propose:a"] == [ReasonCode.OVERRIDE_SET]

    rejected = merge_overrides(Phase.PROPOSE, [c("v", 3, ov(None, REJECT, reason="change freeze"))], BASELINE)
    assert rejected.short_circuit_reason == "rejected by v (priority 3): change freeze"


def test_merge_ignores_overrides_for_unmanaged_pools() -> None:
    """In decode-only mode a prefill override has no pool to act on: recorded, not merged."""
    merged = merge_overrides(Phase.PROPOSE, [c("a", 1, ov(P, SET, 3), ov(D, SET, 5))], {D: 4})
    assert dict(merged.targets) == {D: 5}
    assert [s.reason for s in merged.steps][:2] == [ReasonCode.UNMANAGED_COMPONENT, ReasonCode.OVERRIDE_SET]


replica_counts = st.integers(min_value=0, max_value=20)
contribution_lists = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5),  # priority (ties happen)
        st.sampled_from([SET, AT_LEAST, AT_MOST]),
        replica_counts,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(items=contribution_lists, baseline=replica_counts, seed=st.integers(0, 1000))
def test_merge_properties(items: list[tuple[int, OverrideType, int]], baseline: int, seed: int) -> None:
    """For any mix of SET/AT_LEAST/AT_MOST on one pool: the result respects the floor, respects the ceiling unless
    the floor exceeds it, equals the recommendation when unbounded, and does not depend on the listing order."""
    contributions = [c(f"p{i}", priority, ov(D, kind, n)) for i, (priority, kind, n) in enumerate(items)]
    merged = merge_overrides(Phase.PROPOSE, contributions, {D: baseline})
    result = merged.targets[D]
    floors = [n for _, kind, n in items if kind is AT_LEAST]
    ceilings = [n for _, kind, n in items if kind is AT_MOST]
    sets = sorted((priority, i, n) for i, (priority, kind, n) in enumerate(items) if kind is SET)
    rec = sets[0][2] if sets else baseline
    assert result >= max(floors, default=0)
    if ceilings and max(floors, default=0) <= min(ceilings):
        assert result <= min(ceilings)
    if not floors and not ceilings:
        assert result == rec
    shuffled = contributions[:]
    random.Random(seed).shuffle(shuffled)
    assert merge_overrides(Phase.PROPOSE, shuffled, {D: baseline}) == merged


# --- PREDICT chain ---------------------------------------------------------------------------------------------


def predictor(plugin_id: str, priority: int, final: bool = False, **fields: Any) -> FunctionPlugin:
    result = PluginResult(predictions=PartialPrediction(**fields), final=final)
    return FunctionPlugin(PluginSpec(plugin_id=plugin_id, phase=Phase.PREDICT, priority=priority), Recorder(result))


def test_predict_first_writer_wins_per_field() -> None:
    """The chain runs by priority; each field keeps the first value written, later values are only reported."""
    late = predictor("late", 5, num_req=999.0, osl=50.0)
    early = predictor("early", 0, num_req=100.0, isl=1000.0)
    reader = plugin("reader", Phase.PROPOSE)
    outcome = run([late, reader, early])
    assert outcome.predictions == PartialPrediction(num_req=100.0, isl=1000.0, osl=50.0)
    assert outcome.prediction is not None and outcome.prediction.osl == 50.0
    [late_step] = [s for s in outcome.steps if s.step == "predict:late"]
    assert late_step.reason is ReasonCode.PREDICTED
    assert late_step.detail == "osl=50; already written by an earlier plugin: num_req"
    # the second plugin saw the first one's fields; PROPOSE sees the merged forecast
    assert late.function.seen[0].predictions == PartialPrediction(num_req=100.0, isl=1000.0)  # type: ignore[attr-defined]
    assert reader.function.seen[0].prediction == outcome.prediction  # type: ignore[attr-defined]


def test_predict_final_stops_the_chain() -> None:
    """`final` ends the chain: later PREDICT plugins are not called and their schedules do not advance."""
    first = predictor("first", 0, final=True, num_req=10.0, isl=20.0, osl=30.0)
    later = predictor("later", 10, num_req=1.0)
    outcome = run([later, first], now_s=100.0)
    assert calls(later) == 0
    assert outcome.predictions == PartialPrediction(num_req=10.0, isl=20.0, osl=30.0)
    assert reasons(outcome, "predict:later") == [ReasonCode.PREDICT_CHAIN_FINAL]
    assert reasons(outcome, "predict:first") == [ReasonCode.PREDICTED, ReasonCode.PREDICT_CHAIN_FINAL]
    assert outcome.next_state.pipeline.schedule("later").last_run_at_s is None  # type: ignore[union-attr]
    assert outcome.next_state.pipeline.schedule("first").last_run_at_s == 100.0  # type: ignore[union-attr]


def test_predict_final_not_first_is_flagged() -> None:
    """A final result from a plugin that is not first in the chain is accepted but recorded with a warning."""
    outcome = run([predictor("a", 0, num_req=1.0), predictor("b", 5, final=True, isl=2.0), predictor("c", 9, osl=3.0)])
    [final_step] = [s for s in outcome.steps if s.reason is ReasonCode.PREDICT_CHAIN_FINAL and s.step == "predict:b"]
    assert "warning: not the first plugin of the chain" in final_step.detail
    assert outcome.predictions == PartialPrediction(num_req=1.0, isl=2.0)


# --- the whole tick: merge across phases, invariants, EXECUTE ---------------------------------------------------


def test_phases_chain_their_targets() -> None:
    """PROPOSE merges onto the expected counts, RECONCILE onto the PROPOSE result, CONSTRAIN onto RECONCILE's."""
    propose = plugin("throughput", Phase.PROPOSE, ov(D, SET, 8), priority=20)
    reconcile = plugin("reconcile", Phase.RECONCILE, ov(D, AT_LEAST, 9))
    constrain = plugin("cap", Phase.CONSTRAIN, ov(D, AT_MOST, 7), ov(P, SET, 5))
    outcome = run([constrain, reconcile, propose])
    # PROPOSE 8; RECONCILE max(9, 8) = 9; CONSTRAIN drops the prefill SET, min(7, 9) = 7
    assert outcome.action is ExecuteAction.APPLY
    assert (outcome.decision.num_prefill, outcome.decision.num_decode) == (2, 7)
    assert dict(reconcile.function.seen[0].targets) == {P: 2, D: 8}  # type: ignore[attr-defined]
    assert dict(constrain.function.seen[0].targets) == {P: 2, D: 9}  # type: ignore[attr-defined]
    assert [x.plugin_id for x in constrain.function.seen[0].proposals] == ["throughput", "reconcile"]  # type: ignore[attr-defined]
    assert [(p.component, p.current, p.desired, p.reason) for p in outcome.proposals] == [
        (P, 2, 2, ReasonCode.NO_CHANGE),
        (D, 4, 7, ReasonCode.SCALE),
    ]
    assert outcome.steps[-1] == StepRecord(
        step="execute", reason=ReasonCode.APPLY, detail="prefill 2 -> 2, decode 4 -> 7"
    )


def test_reject_short_circuits_the_tick() -> None:
    """A REJECT stops the pipeline: later phases do not run, nothing is executed, and the reason names the veto."""
    propose = plugin("throughput", Phase.PROPOSE, ov(D, SET, 8))
    veto = plugin("freeze", Phase.PROPOSE, ov(None, REJECT, reason="change freeze"), priority=200)
    constrain = plugin("cap", Phase.CONSTRAIN, ov(D, AT_MOST, 7))
    outcome = run([propose, veto, constrain])
    assert outcome.action is ExecuteAction.SKIP_SHORT_CIRCUIT
    assert outcome.decision.is_empty and outcome.proposals == ()
    assert outcome.short_circuit_reason == "rejected by freeze (priority 200): change freeze"
    assert calls(constrain) == 0
    assert reasons(outcome, "constrain:cap") == [ReasonCode.SKIP_SHORT_CIRCUIT]
    assert outcome.run_of("cap").ran is False  # type: ignore[union-attr]
    assert outcome.reason is ReasonCode.SKIP_SHORT_CIRCUIT


@dataclass(frozen=True)
class InvariantCase:
    id: str
    config: dict[str, Any]
    overrides: tuple[ReplicaOverride, ...]
    want_action: ExecuteAction
    want: tuple[int | None, int | None]  # decision (prefill, decode)
    want_reason: ReasonCode | None = None  # a step that must be present


INVARIANT_CASES = [
    InvariantCase("no-opinion", {}, (), ExecuteAction.SKIP_NO_TARGETS, (None, None)),
    InvariantCase("same-as-expected", {}, (ov(D, SET, 4),), ExecuteAction.SKIP_NO_TARGETS, (None, None)),
    # SET 0 is raised to min_endpoint 1 whoever proposed it
    InvariantCase(
        "min-endpoint-floor", {}, (ov(D, SET, 0),), ExecuteAction.APPLY, (2, 1), ReasonCode.MIN_ENDPOINT_FLOOR
    ),
    # 2P + 10D = 12 GPUs > budget 8 from 2P + 2D: the guard never moves prefill against its (unchanged) proposal,
    # so decode grows only as far as the budget allows: 2P + 6D = 8 GPUs
    InvariantCase(
        "gpu-budget",
        {"max_gpu_budget": 8},
        (ov(D, SET, 10),),
        ExecuteAction.APPLY,
        (2, 6),
        ReasonCode.GPU_BUDGET_CAPPED,
    ),
    InvariantCase(
        "advisory", {"advisory": True}, (ov(D, SET, 6),), ExecuteAction.ADVISORY, (2, 6), ReasonCode.ADVISORY
    ),
    # decode-only mode: the prefill pool is not managed
    InvariantCase("decode-mode", {"mode": "decode"}, (ov(D, SET, 6),), ExecuteAction.APPLY, (None, 6)),
]


@pytest.mark.parametrize("case", INVARIANT_CASES, ids=lambda case: case.id)
def test_final_invariants_and_execute(case: InvariantCase) -> None:
    """After CONSTRAIN: min endpoints and the GPU budget apply to every proposal; no change means no decision."""
    config = parse_config({"max_gpu_budget": -1, **case.config}).policy
    outcome = run([plugin("p", Phase.PROPOSE, *case.overrides)], config=config)
    assert outcome.action is case.want_action
    assert (outcome.decision.num_prefill, outcome.decision.num_decode) == case.want
    assert outcome.decision.advisory is (case.want_action is ExecuteAction.ADVISORY)
    assert outcome.steps[-1].reason is ReasonCode(case.want_action.value)
    if case.want_reason is not None:
        assert case.want_reason in [s.reason for s in outcome.steps]


def test_advisory_records_everything_and_marks_the_decision() -> None:
    """Advisory mode computes and records the same targets, steps and state, but the decision is advisory."""
    plugins = [plugin("p", Phase.PROPOSE, ov(D, SET, 6))]
    normal = run(plugins)
    advisory = run(plugins, config=parse_config({"max_gpu_budget": -1, "advisory": True}).policy)
    assert advisory.proposals == normal.proposals and advisory.next_state == normal.next_state
    assert advisory.steps[:-1] == normal.steps[:-1]
    assert advisory.steps[-1].detail == "advisory mode, not executed: prefill 2 -> 2, decode 4 -> 6"
    assert advisory.to_tick_outcome().decision.advisory is True
    assert advisory.reason is ReasonCode.SCALE


def test_replay_is_exact_and_state_survives_storage() -> None:
    """Same arguments, same outcome; and a next state stored as JSON continues exactly like the in-memory one."""
    plugins = [
        predictor("fc", 0, num_req=1.0, isl=2.0, osl=3.0),
        plugin("held", Phase.PROPOSE, ov(D, AT_LEAST, 6), interval_s=60.0, hold_policy=HoldPolicy.HOLD_LAST),
    ]
    state = PlannerState()
    for now_s in (0.0, 60.0):
        first, second = run(plugins, now_s, state), run(plugins, now_s, state)
        assert first == second
        state = first.next_state
    stored = from_jsonable(PlannerState, to_jsonable(state))
    assert stored == state
    assert run(plugins, 90.0, stored) == run(plugins, 90.0, state)


def test_plugin_state_is_threaded_but_schedules_belong_to_the_pipeline() -> None:
    """A plugin's new state is what the next plugin sees and what is stored; its `pipeline` field is ignored."""

    def count(context: PipelineContext) -> PluginResult:
        tampered = dataclasses.replace(
            context.state, num_load_ticks=context.state.num_load_ticks + 1, pipeline=PipelineState()
        )
        return PluginResult(state=tampered)

    counter = plugin("counter", Phase.PREDICT, function=count)
    reader = plugin("reader", Phase.PROPOSE)
    outcome = run([counter, reader], state=PlannerState(num_load_ticks=5))
    assert reader.function.seen[0].state.num_load_ticks == 6  # type: ignore[attr-defined]
    assert outcome.next_state.num_load_ticks == 6
    assert [s.plugin_id for s in outcome.next_state.pipeline.plugins] == ["counter", "reader"]


def test_plugin_steps_are_recorded_in_order() -> None:
    """A plugin's own steps follow its outcome step."""
    own = StepRecord(step="business_rule", reason=ReasonCode.OBSERVED, detail="why")
    p = plugin("p", Phase.PROPOSE, function=lambda _: PluginResult(overrides=(ov(D, SET, 6),), steps=(own,)))
    outcome = run([p])
    assert [s.step for s in outcome.steps[:3]] == ["propose:p", "business_rule", "propose:p"]
    assert outcome.steps[0].reason is ReasonCode.PLUGIN_OVERRIDES and outcome.steps[1] == own


# --- scheduling ------------------------------------------------------------------------------------------------


def run_ticks(plugins: list[FunctionPlugin], times: list[float], **kwargs: Any) -> list[PipelineOutcome]:
    """Run consecutive ticks, each from the previous tick's next state."""
    state, outcomes = PlannerState(), []
    for now_s in times:
        outcome = run(plugins, now_s, state, **kwargs)
        outcomes.append(outcome)
        state = outcome.next_state
    return outcomes


def test_first_run_is_one_interval_after_registration() -> None:
    """Registered at t=1000 with interval 60: not due at 1000 or 1030, runs at 1060 and 1120, not at 1090."""
    p = plugin("p", Phase.PROPOSE, ov(D, SET, 6), interval_s=60.0)
    every = plugin("every", Phase.PROPOSE)
    outcomes = run_ticks([p, every], [1000.0, 1030.0, 1060.0, 1090.0, 1120.0])
    assert [o.run_of("p").ran for o in outcomes] == [False, False, True, False, True]  # type: ignore[union-attr]
    assert [o.run_of("every").ran for o in outcomes] == [True] * 5  # type: ignore[union-attr]
    assert [s for s in outcomes[0].steps if s.step == "propose:p"] == [
        StepRecord(step="propose:p", reason=ReasonCode.PLUGIN_NOT_DUE, detail="not due until t=1060")
    ]
    schedule = outcomes[-1].next_state.pipeline.schedule("p")
    assert schedule is not None and (schedule.registered_at_s, schedule.last_run_at_s) == (1000.0, 1120.0)


def test_hold_last_replays_the_last_result() -> None:
    """HOLD_LAST: between runs the cached overrides are merged again (with the plugin's current priority)."""
    now_seen: list[float] = []

    def by_time(context: PipelineContext) -> PluginResult:
        now_seen.append(context.now_s)
        return PluginResult(overrides=(ov(D, SET, 5 + len(now_seen)),))  # 6 on the first run, 7 on the second

    p = plugin("p", Phase.PROPOSE, function=by_time, interval_s=60.0, hold_policy=HoldPolicy.HOLD_LAST)
    outcomes = run_ticks([p], [0.0, 60.0, 90.0, 120.0, 150.0])
    assert now_seen == [60.0, 120.0]
    assert [o.decision.num_decode for o in outcomes] == [None, 6, 6, 7, 7]
    assert [o.run_of("p").reason for o in outcomes] == [  # type: ignore[union-attr]
        ReasonCode.PLUGIN_NOT_DUE,
        ReasonCode.PLUGIN_OVERRIDES,
        ReasonCode.PLUGIN_HELD_OVER,
        ReasonCode.PLUGIN_OVERRIDES,
        ReasonCode.PLUGIN_HELD_OVER,
    ]
    assert "no result held yet" in outcomes[0].steps[0].detail
    held_override = [s for s in outcomes[2].steps if s.reason is ReasonCode.OVERRIDE_SET]
    assert held_override[0].detail == "held from t=60"


def test_accept_when_idle_gives_no_opinion_between_runs() -> None:
    """ACCEPT_WHEN_IDLE: between runs the plugin says nothing, so nothing is decided."""
    p = plugin("p", Phase.PROPOSE, ov(D, SET, 6), interval_s=60.0, hold_policy=HoldPolicy.ACCEPT_WHEN_IDLE)
    outcomes = run_ticks([p], [0.0, 60.0, 90.0])
    assert [o.action for o in outcomes] == [
        ExecuteAction.SKIP_NO_TARGETS,
        ExecuteAction.APPLY,
        ExecuteAction.SKIP_NO_TARGETS,
    ]
    assert outcomes[2].run_of("p").reason is ReasonCode.PLUGIN_NOT_DUE  # type: ignore[union-attr]
    assert outcomes[1].next_state.pipeline.schedule("p").held is None  # type: ignore[union-attr]


def test_missing_inputs_and_fields_skip_without_advancing() -> None:
    """A due predictor without traffic is skipped, so the proposer that requires its predictions is skipped too;
    neither schedule advances, and both run on the next tick that has traffic."""
    forecast = predictor("forecast", 0, num_req=600.0, isl=1000.0, osl=100.0)
    forecast = FunctionPlugin(
        dataclasses.replace(forecast.spec, interval_s=60.0, needs=(Observation.TRAFFIC,)), forecast.function
    )
    size = plugin("size", Phase.PROPOSE, ov(D, SET, 6), interval_s=60.0, requires_produced_fields=("predictions",))
    state = run([forecast, size], 0.0).next_state
    no_traffic = run([forecast, size], 60.0, state)
    assert [no_traffic.run_of(i).reason for i in ("forecast", "size")] == [  # type: ignore[union-attr]
        ReasonCode.NO_TRAFFIC_DATA,
        ReasonCode.REQUIRED_FIELDS_MISSING,
    ]
    assert calls(forecast) == 0 and calls(size) == 0
    assert no_traffic.next_state.pipeline == state.pipeline  # anchors not advanced
    retried = run([forecast, size], 65.0, no_traffic.next_state, traffic=TRAFFIC)
    assert [retried.run_of(i).ran for i in ("forecast", "size")] == [True, True]  # type: ignore[union-attr]
    assert retried.decision.num_decode == 6
    assert retried.next_state.pipeline.schedule("size").last_run_at_s == 65.0  # type: ignore[union-attr]


def test_predict_plugin_may_require_an_earlier_field() -> None:
    """A refining PREDICT plugin that requires `predictions.num_req` runs once an earlier plugin wrote it."""
    refine = plugin("refine", Phase.PREDICT, priority=5, requires_produced_fields=("predictions.num_req",))
    assert run([refine]).run_of("refine").reason is ReasonCode.REQUIRED_FIELDS_MISSING  # type: ignore[union-attr]
    assert run([refine, predictor("base", 0, num_req=5.0)]).run_of("refine").ran  # type: ignore[union-attr]


def test_requires_produced_proposals() -> None:
    """A RECONCILE plugin requiring `proposals` runs only on ticks where some PROPOSE plugin overrode something."""
    reconcile = plugin("r", Phase.RECONCILE, requires_produced_fields=("proposals",))
    assert run([reconcile, plugin("quiet", Phase.PROPOSE)]).run_of("r").reason is ReasonCode.REQUIRED_FIELDS_MISSING  # type: ignore[union-attr]
    assert run([reconcile, plugin("loud", Phase.PROPOSE, ov(D, SET, 6))]).run_of("r").ran  # type: ignore[union-attr]


def test_observations_needed_lists_what_due_plugins_read() -> None:
    """Only the needs of plugins due at that time: the I/O edge can skip the traffic query otherwise."""
    traffic = plugin("t", Phase.PREDICT, interval_s=60.0, needs=(Observation.TRAFFIC,))
    fpm = plugin("f", Phase.PROPOSE, needs=(Observation.FPM, Observation.WORKERS))
    state = run([traffic, fpm], 0.0).next_state
    assert observations_needed([traffic, fpm], state, 30.0) == {Observation.FPM, Observation.WORKERS}
    assert observations_needed([traffic, fpm], state, 60.0) == {
        Observation.TRAFFIC,
        Observation.FPM,
        Observation.WORKERS,
    }


def test_fpm_need_is_checked() -> None:
    """A plugin needing forward-pass metrics is skipped with Dynamo's `no_fpm_data` when none were observed."""
    p = plugin("load", Phase.PROPOSE, ov(D, SET, 6), needs=(Observation.FPM,))
    assert run([p]).run_of("load").reason is ReasonCode.NO_FPM_DATA  # type: ignore[union-attr]
    fpm = (ForwardPassMetrics(component=D, worker_id="w0", wall_time_s=0.02),)
    inputs = dataclasses.replace(tick_inputs(), fpm=fpm)
    assert run([p], inputs=inputs).decision.num_decode == 6


@pytest.mark.parametrize(
    ("config", "intervals", "want"),
    [
        # default target `throughput`: only the load loop (5 s); gcd(5, 60, 90) = 5
        ({}, [60.0, 90.0], 5.0),
        # sla with both loops: gcd(5, 180) = 5, with a 7 s plugin gcd(5, 180, 7) = 1
        ({"optimization_target": "sla", "enable_load_scaling": True}, [7.0], 1.0),
        # a 2.5 s plugin: gcd(5, 2.5) = 2.5 (millisecond resolution)
        ({}, [2.5, None], 2.5),
        # sla, throughput only, 60 s: gcd(5, 60) = 5 (Dynamo counts the load interval anyway)
        ({"optimization_target": "sla", "throughput_adjustment_interval_seconds": 60}, [], 5.0),
        # explicit base cadence wins
        ({"scheduling": {"scale_interval_seconds": 10}, "load_adjustment_interval_seconds": 10}, [30.0], 10.0),
    ],
)
def test_base_cadence_is_gcd_of_intervals(config: dict[str, Any], intervals: list[float | None], want: float) -> None:
    specs = [PluginSpec(plugin_id=f"p{i}", phase=Phase.PROPOSE, interval_s=s) for i, s in enumerate(intervals)]
    assert base_cadence_s(parse_config(config).policy, specs) == want


# --- failures and deadlines ------------------------------------------------------------------------------------


def boom(context: PipelineContext) -> PluginResult:
    raise RuntimeError("model file\nmissing")


def test_raising_plugin_is_recorded_and_skipped() -> None:
    """A plugin that raises is recorded with the error, the others still decide, and it is retried next tick."""
    bad = plugin("bad", Phase.PROPOSE, function=boom, priority=1, hold_policy=HoldPolicy.HOLD_LAST)
    bad_predict = plugin("bad_predict", Phase.PREDICT, function=boom)
    good = plugin("good", Phase.PROPOSE, ov(D, SET, 6), priority=50)
    outcome = run([bad, good, bad_predict], now_s=10.0)
    assert outcome.action is ExecuteAction.APPLY and outcome.decision.num_decode == 6
    [step] = [s for s in outcome.steps if s.step == "propose:bad"]
    assert step.reason is ReasonCode.PLUGIN_RAISED
    assert step.detail == "RuntimeError: model file missing; retried next tick"
    assert outcome.run_of("bad_predict").reason is ReasonCode.PLUGIN_RAISED  # type: ignore[union-attr]
    assert outcome.next_state.pipeline.schedule("bad").last_run_at_s is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        (42, "returned int, not a PluginResult"),
        (PluginResult(predictions=PartialPrediction(num_req=1.0)), "a PROPOSE plugin returned predictions"),
        (PluginResult(steps=(StepRecord(step="x" * 81, reason=ReasonCode.OBSERVED),)), "at most 80 characters"),
        (PluginResult(state="new"), "state is str, not a PlannerState"),  # type: ignore[arg-type]
    ],
)
def test_unusable_result_is_recorded_and_skipped(returned: Any, problem: str) -> None:
    outcome = run(
        [plugin("odd", Phase.PROPOSE, function=lambda _: returned), plugin("ok", Phase.PROPOSE, ov(D, SET, 6))]
    )
    [step] = [s for s in outcome.steps if s.step == "propose:odd"]
    assert step.reason is ReasonCode.PLUGIN_INVALID_RESULT and problem in step.detail
    assert outcome.decision.num_decode == 6


@dataclass
class FakeClock:
    """A deterministic monotonic clock: plugins advance it to simulate how long they took."""

    now: float = 1000.0
    reads: int = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def spend(self, seconds: float, result: PluginResult | None = None) -> Callable[[PipelineContext], Any]:
        def slow(context: PipelineContext) -> PluginResult | None:
            self.now += seconds
            return result

        return slow


def test_plugin_overrunning_its_timeout_is_discarded() -> None:
    """A plugin that takes 6 s (default limit 5 s) has its result discarded; the tick goes on and applies."""
    clock = FakeClock()
    slow = plugin(
        "slow", Phase.PROPOSE, function=clock.spend(6.0, PluginResult(overrides=(ov(D, SET, 9),))), priority=1
    )
    quick = plugin("quick", Phase.PROPOSE, function=clock.spend(0.5, PluginResult(overrides=(ov(D, SET, 6),))))
    outcome = run_pipeline([slow, quick], tick_inputs(), PlannerState(), CONFIG, clock=clock)
    assert outcome.action is ExecuteAction.APPLY and outcome.decision.num_decode == 6
    [step] = [s for s in outcome.steps if s.step == "propose:slow"]
    assert step.reason is ReasonCode.PLUGIN_TIMEOUT and step.value == 6.0
    assert step.detail == "took 6.000 s > timeout 5 s; result discarded; retried next tick"
    assert outcome.run_of("quick").elapsed_s == 0.5  # type: ignore[union-attr]
    assert clock.reads == 2 * 2  # before and after each run


def test_tick_deadline_discards_the_late_plugin_and_skips_the_tick() -> None:
    """With a 10 s tick deadline, a plugin finishing at 12 s is discarded, later plugins are not run, and EXECUTE is
    skip_tick_timeout (Python cannot preempt a running plugin, so the overrun is seen when it returns)."""
    clock = FakeClock()
    config = parse_config({"max_gpu_budget": -1, "scheduling": {"tick_max_duration_seconds": 10}}).policy
    early = plugin(
        "early", Phase.PREDICT, function=clock.spend(1.0, PluginResult(predictions=PartialPrediction(isl=5.0)))
    )
    late = plugin("late", Phase.PROPOSE, function=clock.spend(11.0), timeout_s=60.0)
    never = plugin("never", Phase.CONSTRAIN, ov(D, AT_MOST, 3))
    outcome = run_pipeline([never, late, early], tick_inputs(50.0), PlannerState(), config, clock=clock)
    assert outcome.action is ExecuteAction.SKIP_TICK_TIMEOUT and outcome.decision.is_empty
    assert [outcome.run_of(i).reason for i in ("early", "late", "never")] == [  # type: ignore[union-attr]
        ReasonCode.PREDICTED,
        ReasonCode.SKIP_TICK_TIMEOUT,
        ReasonCode.SKIP_TICK_TIMEOUT,
    ]
    assert calls(never) == 0
    assert outcome.predictions.isl == 5.0  # what finished in time is kept
    pipeline = outcome.next_state.pipeline
    assert pipeline.schedule("early").last_run_at_s == 50.0  # type: ignore[union-attr]
    assert pipeline.schedule("late").last_run_at_s is None  # type: ignore[union-attr]
    assert outcome.steps[-1].reason is ReasonCode.SKIP_TICK_TIMEOUT


def test_no_clock_means_no_deadline() -> None:
    """Without a clock nothing is timed: replay of a recorded tick cannot depend on how fast the machine is."""
    clock = FakeClock()
    outcome = run(
        [plugin("slow", Phase.PROPOSE, function=clock.spend(100.0, PluginResult(overrides=(ov(D, SET, 6),))))]
    )
    assert outcome.decision.num_decode == 6 and outcome.run_of("slow").elapsed_s is None  # type: ignore[union-attr]


# --- specs, config overrides -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"plugin_id": "Bad Id"}, "plugin 'Bad Id': field 'plugin_id' = 'Bad Id': must match"),
        ({"phase": Phase.EXECUTE}, "field 'phase' = <Phase.EXECUTE: 'execute'>: must be one of observe, predict"),
        ({"interval_s": -1.0}, "field 'interval_s' = -1.0"),
        ({"requires_produced_fields": ("prediction",)}, "field 'requires_produced_fields' = 'prediction'"),
        ({"needs": ("traffic",)}, "field 'needs' = 'traffic': must be an Observation"),
        ({"timeout_s": 0.0}, "field 'timeout_s' = 0.0"),
    ],
)
def test_spec_validation_is_one_line(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        PluginSpec(**{"plugin_id": "ok", "phase": Phase.PROPOSE, **changes})
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_duplicate_plugin_ids_are_a_wiring_error() -> None:
    with pytest.raises(ValueError, match="plugin id 'p' is used by two plugins"):
        run([plugin("p"), plugin("p", Phase.CONSTRAIN)])


def config_with(plugins: dict[str, Any], **extra: Any) -> PlannerConfig:
    return parse_config({"max_gpu_budget": -1, "plugins": plugins, **extra}).policy


def test_config_overrides_change_priority_and_schedule() -> None:
    """`plugins.overrides` replaces spec fields by plugin id; the overridden plugin still runs its own code."""
    a = plugin("a", Phase.PROPOSE, ov(D, SET, 6), priority=10)
    b = plugin("b", Phase.PROPOSE, ov(D, SET, 8), priority=20)
    config = config_with({"overrides": {"b": {"priority": 5, "interval_seconds": 0, "hold_policy": "hold_last"}}})
    resolved = resolve_plugins([a, b], config)
    assert [p.spec.plugin_id for p in resolved] == ["b", "a"]
    assert resolved[0].spec.hold_policy is HoldPolicy.HOLD_LAST
    assert run(list(resolved), config=config).decision.num_decode == 8  # b now has the smaller priority


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            config_with({"overrides": {"nope": {"priority": 1}}}),
            "config: field 'plugins.overrides.nope' = 'nope': no plugin with that id (plugins: a)",
        ),
        (
            config_with({"overrides": {"a": {"interval_seconds": 0.0001}}}),
            "config: field 'plugins.overrides.a': plugin 'a': field 'interval_s' = 0.0001",
        ),
        (
            config_with(
                {"overrides": {"a": {"interval_seconds": 7}}},
                scheduling={"scale_interval_seconds": 5},
            ),
            "config: plugin 'a': interval 7 s is not a multiple of scheduling.scale_interval_seconds (5 s)",
        ),
    ],
)
def test_bad_plugin_config_is_one_line(config: PlannerConfig, message: str) -> None:
    with pytest.raises(PluginConfigError) as raised:
        resolve_plugins([plugin("a")], config)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
