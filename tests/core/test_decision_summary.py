"""`summarize_decision`: the stage that decided and its numbers first, in at most 160 characters.

Two kinds of cases: step chains as the demo recorded them (copied from `tick_steps` of a `planner demo` run,
details shortened), and real ticks (`tick()` with the fixed-rate perf model of test_tick), where each bound in turn
decides.
"""

from __future__ import annotations

import pytest

from planner_core.domain import (
    Component,
    DecisionStage,
    PlannerState,
    ReasonCode,
    ReplicaProposal,
    ScalingDecision,
    StepName,
    StepRecord,
    TickOutcome,
    summarize_decision,
)
from planner_core.domain.summary import MAX_SUMMARY_CHARS, with_arbitration_cut
from planner_core.tick import tick
from tests.core.test_tick import FAKE, make_config, throughput_inputs, traffic, workers

P, D = Component.PREFILL, Component.DECODE


def _step(step: str, component: Component | None, value: float | None, reason: ReasonCode, detail: str = ""):
    return StepRecord(step=step, component=component, value=value, reason=reason, detail=detail)


def _outcome(steps, current: dict, desired: dict, target: dict, *, advisory: bool = False) -> TickOutcome:
    proposals = tuple(
        ReplicaProposal(component=c, current=current[c], desired=desired[c], reason=ReasonCode.SCALE) for c in (P, D)
    )
    decision = ScalingDecision(num_prefill=target[P], num_decode=target[D], advisory=advisory)
    return TickOutcome(
        decision=decision, next_state=PlannerState(), steps=tuple(steps), proposals=proposals, reason=ReasonCode.SCALE
    )


# the sizing chain of the demo's tick at 18:38 (prefill 5 -> 7 wanted, the 8-GPU budget allowed 6)
SIZING = [
    _step(StepName.LENGTH_SIZING, None, None, ReasonCode.SIZED_ON_MEAN, "mean ISL 1344, OSL 196"),
    _step(StepName.ENGINE_CAPACITY, P, 37.69, ReasonCode.CAPACITY_SEARCHED),
    _step(StepName.DEMAND, P, 3, ReasonCode.DEMAND_SIZED, "ceil(81.467 req/s / 37.694 req/s per engine) = 3"),
    _step(StepName.HEADROOM, D, 0.7, ReasonCode.HEADROOM_APPLIED),
    _step(StepName.DEMAND, D, 2, ReasonCode.DEMAND_SIZED),
    _step(StepName.BURST, P, 7, ReasonCode.BURST_SIZED),
    _step(StepName.SCALE_DOWN_HOLD, P, 7, ReasonCode.WITHIN_RANGE),
    _step(StepName.SCALE_DOWN_HOLD, D, 2, ReasonCode.WITHIN_RANGE),
    _step(StepName.MIN_ENDPOINT, P, 7, ReasonCode.WITHIN_RANGE),
    _step(StepName.CHANGE_RATE, P, 7, ReasonCode.WITHIN_RANGE),
    _step(StepName.DECIDE, None, None, ReasonCode.SCALE, "prefill 5 -> 7, decode 2 -> 2"),
    _step("propose:builtin_throughput_propose", P, 7, ReasonCode.OVERRIDE_SET),
    _step("propose:merge", P, 7, ReasonCode.WITHIN_RANGE, "recommendation 7 (set by builtin_throughput_propose) -> 7"),
    _step("propose:merge", D, 2, ReasonCode.WITHIN_RANGE),
    _step(StepName.MIN_ENDPOINT, P, 7, ReasonCode.WITHIN_RANGE),
    _step(StepName.MIN_ENDPOINT, D, 2, ReasonCode.WITHIN_RANGE),
]


def test_a_budget_cap_after_a_burst_names_the_budget_and_both_numbers() -> None:
    budget = _step(StepName.GPU_BUDGET, None, 8, ReasonCode.GPU_BUDGET_CAPPED, "7P+2D (9 GPUs) is outside ...")
    outcome = _outcome([*SIZING, budget], {P: 5, D: 2}, {P: 6, D: 2}, {P: 6, D: 2})
    summary = summarize_decision(outcome)
    assert summary.stage is DecisionStage.BUDGET
    assert summary.text == "prefill 5->6: p99 prompt burst needs 7 (forecast 3); GPU budget allows 6 (8 GPUs)"


def test_a_burst_within_the_budget_is_the_burst() -> None:
    budget = _step(StepName.GPU_BUDGET, None, 9, ReasonCode.WITHIN_RANGE, "7P+2D = 9 GPUs within band [-, 10]")
    summary = summarize_decision(_outcome([*SIZING, budget], {P: 5, D: 2}, {P: 7, D: 2}, {P: 7, D: 2}))
    assert (summary.stage, summary.text) == (
        DecisionStage.BURST,
        "prefill 5->7: p99 prompt burst needs 7 (forecast 3)",
    )


def test_a_scale_down_held_by_the_hold_names_the_hold() -> None:
    """The demo's tick at 18:56: the burst needs 3, the largest need of the hold time is 5."""
    steps = [
        _step(StepName.DEMAND, P, 2, ReasonCode.DEMAND_SIZED),
        _step(StepName.BURST, P, 3, ReasonCode.BURST_SIZED),
        _step(StepName.SCALE_DOWN_HOLD, P, 5, ReasonCode.SCALE_DOWN_HELD, "need 3; largest need of the last 450 s: 5"),
        _step(StepName.SCALE_DOWN_HOLD, P, 5, ReasonCode.WITHIN_RANGE),
        _step("propose:merge", P, 5, ReasonCode.WITHIN_RANGE),
        _step(StepName.GPU_BUDGET, None, 7, ReasonCode.WITHIN_RANGE),
    ]
    summary = summarize_decision(_outcome(steps, {P: 6, D: 2}, {P: 5, D: 2}, {P: 5, D: 2}))
    assert summary.stage is DecisionStage.HOLD
    assert summary.text == "prefill 6->5: p99 prompt burst needs 3 (forecast 2); scale-down hold keeps 5"


def test_the_start_up_horizon_is_seen_through_the_count_after_it() -> None:
    """The horizon step records engines of headroom, not a count: the hold step after it (within range) shows the
    count it gave, so the change is the horizon's."""
    steps = [
        _step(StepName.DEMAND, P, 3, ReasonCode.DEMAND_SIZED),
        _step(StepName.HORIZON, P, 0.4, ReasonCode.HORIZON_HEADROOM, "... size max(3, ceil(3.100)) = 4"),
        _step(StepName.SCALE_DOWN_HOLD, P, 4, ReasonCode.WITHIN_RANGE),
    ]
    summary = summarize_decision(_outcome(steps, {P: 2, D: 1}, {P: 4, D: 1}, {P: 4, D: 1}))
    assert summary.stage is DecisionStage.HORIZON
    assert summary.text == "prefill 2->4: forecast needs 3; start-up horizon +0.40 engines: 4"


def test_a_plugin_ceiling_names_the_plugin() -> None:
    steps = [
        _step(StepName.DEMAND, D, 6, ReasonCode.DEMAND_SIZED),
        _step("propose:builtin_throughput_propose", D, 6, ReasonCode.OVERRIDE_SET),
        _step("constrain:spot_cap", D, 4, ReasonCode.OVERRIDE_AT_MOST),
        _step("constrain:merge", D, 4, ReasonCode.MERGE_CEILING, "lowered to 4 by spot_cap (at most)"),
    ]
    summary = summarize_decision(_outcome(steps, {P: 1, D: 2}, {P: 1, D: 4}, {P: 1, D: 4}))
    assert (summary.stage, summary.text) == (
        DecisionStage.PLUGIN,
        "decode 2->4: forecast needs 6; plugin spot_cap sets 4",
    )


def test_a_load_signal_and_a_fleet_ceiling() -> None:
    steps = [
        _step(StepName.ITL_SIGNAL, D, 4, ReasonCode.SCALE_UP, "3 -> 4: ITL 61.00 ms at worst against 50 ms"),
        _step(StepName.LOAD_DECISION, D, 4, ReasonCode.SCALE_UP),
        _step(StepName.GPU_BUDGET, None, 5, ReasonCode.WITHIN_RANGE),
        _step(StepName.FLEET_CEILING, None, 5, ReasonCode.FLEET_CEILING_CAPPED),
    ]
    load = summarize_decision(_outcome(steps[:3], {P: 1, D: 3}, {P: 1, D: 4}, {P: 1, D: 4}))
    assert (load.stage, load.text) == (
        DecisionStage.LOAD,
        "decode 3->4: itl signal asks 4 (ITL 61.00 ms at worst against 50 ms)",
    )
    # in a fleet, the member's ceiling (5 GPUs, prefill holding 2) cuts the 4 decode engines to 3
    fleet = summarize_decision(_outcome(steps, {P: 2, D: 2}, {P: 2, D: 4}, {P: 2, D: 3}))
    assert (fleet.stage, fleet.text) == (
        DecisionStage.FLEET,
        "decode 2->3: itl signal asks 4 (ITL 61.00 ms at worst against 50 ms); fleet ceiling 5 GPUs allows 3",
    )


def test_both_pools_fit_the_limit_and_advisory_says_so() -> None:
    steps = [
        _step(StepName.DEMAND, P, 12, ReasonCode.DEMAND_SIZED),
        _step(StepName.DEMAND, D, 9, ReasonCode.DEMAND_SIZED),
        _step(StepName.CHANGE_RATE, P, 10, ReasonCode.DELTA_CAPPED, "2 -> 12 limited to 10 (at most 8 per tick)"),
        _step(StepName.MIN_ENDPOINT, D, 9, ReasonCode.WITHIN_RANGE),
        _step(StepName.GPU_BUDGET, None, 16, ReasonCode.GPU_BUDGET_CAPPED),
    ]
    summary = summarize_decision(_outcome(steps, {P: 2, D: 3}, {P: 9, D: 7}, {P: 9, D: 7}, advisory=True))
    assert summary.stage is DecisionStage.BUDGET  # the first pool's deciding stage
    assert summary.text == (
        "advisory: prefill 2->9: forecast needs 12; change limit allows 10; GPU budget allows 9 (16 GPUs) | "
        "decode 3->7: forecast needs 9; GPU budget allows 7 (16 GPUs)"
    )
    assert len(summary.text) <= MAX_SUMMARY_CHARS


def test_a_long_summary_is_cut_to_the_limit() -> None:
    steps = [_step(StepName.DEMAND, c, 123456789, ReasonCode.DEMAND_SIZED) for c in (P, D)]
    steps += [_step(f"propose:{'x' * 120}", c, 5, ReasonCode.OVERRIDE_SET) for c in (P, D)]
    steps += [_step("propose:merge", c, 5, ReasonCode.MERGE_FINAL, f"by {'x' * 120}") for c in (P, D)]
    summary = summarize_decision(_outcome(steps, {P: 1, D: 1}, {P: 5, D: 5}, {P: 5, D: 5}))
    assert len(summary.text) == MAX_SUMMARY_CHARS and summary.text.endswith("...")
    assert summary.stage is DecisionStage.PLUGIN


def test_an_arbitration_cut_comes_first() -> None:
    text = with_arbitration_cut("prefill 2->6: forecast needs 6", granted_gpus=5, prefill=3, decode=2)
    assert text == "fleet arbitration grants 5 GPUs: prefill 3, decode 2; tick: prefill 2->6: forecast needs 6"


# --- real ticks: each bound in turn decides ------------------------------------------------------------------------
# FixedRatePerf: prefill = ceil(num_req / 60 * ISL / 10,000), decode = ceil(num_req / 60 * OSL / 1,000) per GPU.
# 6,000 requests a minute at ISL 1,000, OSL 100: 100 req/s -> prefill ceil(100,000 / 10,000) = 10, decode 10.


@pytest.mark.parametrize(
    ("overrides", "stage", "text"),
    [
        ({}, DecisionStage.FORECAST, "prefill 1->10: forecast needs 10 | decode 1->10: forecast needs 10"),
        (
            {"max_throughput_scaling_replicas": 3},
            DecisionStage.RATE_LIMIT,
            "prefill 1->4: forecast needs 10; change limit allows 4 | decode 1->4: forecast needs 10; change limit "
            "allows 4",
        ),
        (
            {"max_gpu_budget": 8},
            DecisionStage.BUDGET,
            "prefill 1->4: forecast needs 10; GPU budget allows 4 (8 GPUs) | decode 1->4: forecast needs 10; GPU "
            "budget allows 4 (8 GPUs)",
        ),
    ],
    ids=["forecast", "rate-limit", "budget"],
)
def test_a_real_tick_names_the_bound_that_decided(overrides: dict, stage: DecisionStage, text: str) -> None:
    config = make_config(**overrides)
    outcome = tick(throughput_inputs(traffic(6000), workers(1, 1)), PlannerState(), config, FAKE)
    summary = summarize_decision(outcome)
    assert (summary.stage, summary.text) == (stage, text)


def test_a_real_tick_raised_to_its_minimum() -> None:
    """6 requests a minute need one engine of each pool (the current count: the forecast's need is still shown, as
    the baseline); the minimum of 3 engines per pool decides."""
    config = make_config(min_endpoint=3)
    outcome = tick(throughput_inputs(traffic(6), workers(1, 1)), PlannerState(), config, FAKE)
    summary = summarize_decision(outcome)
    assert summary.stage is DecisionStage.MINIMUM
    assert summary.text == "prefill 1->3: forecast needs 1; minimum 3 | decode 1->3: forecast needs 1; minimum 3"


def test_a_real_load_tick_names_its_signal_and_what_the_engines_measured() -> None:
    """test_load_loop's burst: one prefill engine's TTFT is 626 ms against 200 ms, so the load loop adds one."""
    from tests.core.test_load_loop import Cluster, burst, make_config, run_load_ticks

    records, _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(60_000)], make_config())
    summary = summarize_decision(records[0].outcome)
    assert (summary.stage, summary.text) == (
        DecisionStage.LOAD,
        "prefill 1->2: ttft signal asks 2 (every engine's TTFT is above 200 ms (lowest 626.00 ms))",
    )
