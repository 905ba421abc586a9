"""Scale to zero, and wake, through the pure tick (`planner_core.policy.scale_to_zero`): the idle hold, the scale to
zero, a pool kept at zero without demand, the wake on a held request (load tick, load loop on or off), and replay
of the same ticks deciding the same."""

from __future__ import annotations

import pytest

from planner_core.config import ConfigError, PlannerConfig
from planner_core.domain import (
    Component,
    DecisionStage,
    Loop,
    PlannerState,
    ReasonCode,
    TickInputs,
    TickOutcome,
    UnplacedRequests,
    summarize_decision,
)
from planner_core.tick import tick
from tests.core.test_tick import FAKE, decide_step, make_config, steps_named, traffic, workers

T0 = 1_700_000_000.0
HOLD_S = 300.0


def agg_config(**overrides: object) -> PlannerConfig:
    return make_config(mode="agg", min_endpoint=0, scale_to_zero_idle_seconds=HOLD_S, **overrides)


def throughput(config: PlannerConfig, state: PlannerState, now_s: float, num_req: float, decode: int) -> TickOutcome:
    """A throughput tick on a window of `num_req` requests, `decode` engines in each managed pool."""
    prefill = decode if config.mode.value == "disagg" else 0
    inputs = TickInputs(
        now_s=now_s,
        loop=Loop.THROUGHPUT,
        workers=workers(prefill, decode),
        traffic=traffic(num_req, isl=1000, osl=100),
    )
    return tick(inputs, state, config, FAKE)


def wake(config: PlannerConfig, state: PlannerState, now_s: float, held: int, decode: int = 0) -> TickOutcome:
    """A load tick with `held` requests held at the edge (what the wake listener's tick records)."""
    unplaced = (UnplacedRequests(component=Component.DECODE, num_waiting=held),) if held else ()
    inputs = TickInputs(now_s=now_s, loop=Loop.LOAD, workers=workers(0, decode), unplaced=unplaced)
    return tick(inputs, state, config, FAKE)


def zero_step(outcome: TickOutcome):
    (step,) = steps_named(outcome, "scale_to_zero", Component.DECODE)
    return step


def test_idle_pool_is_held_for_the_hold_then_goes_to_zero() -> None:
    # without the knob, the first idle window takes a zero-minimum pool to zero at once, and nothing wakes it
    plain = make_config(mode="disagg", min_endpoint=0)
    assert throughput(plain, PlannerState(), T0, num_req=0, decode=1).decision.num_decode == 0
    # with it, the same sizing (FixedRatePerf sizes the disaggregated pools: 600 requests a minute need one each)
    config = make_config(mode="disagg", min_endpoint=0, scale_to_zero_idle_seconds=HOLD_S)
    busy = throughput(config, PlannerState(), T0, num_req=600, decode=1)
    assert zero_step(busy).reason is ReasonCode.IDLE_HOLD
    assert busy.next_state.last_demand_s == T0
    # idle windows: the forecast sizes zero engines, the hold keeps one until HOLD_S has passed without demand
    state = busy.next_state
    for now_s in (T0 + 60, T0 + 120, T0 + 240):
        idle = throughput(config, state, now_s, num_req=0, decode=1)
        assert zero_step(idle).reason is ReasonCode.IDLE_HOLD
        assert "decode 1 -> 0" in decide_step(idle).detail  # the sizing wanted zero
        assert idle.decision.num_decode is None  # kept at 1: no change
        state = idle.next_state
    assert state.last_demand_s == T0  # idle ticks do not move it
    gone = throughput(config, state, T0 + HOLD_S, num_req=0, decode=1)
    assert zero_step(gone).reason is ReasonCode.SCALED_TO_ZERO
    assert gone.decision.num_decode == 0
    # the sizing's zero decides now that the hold lets it through
    assert summarize_decision(gone).text == "prefill 1->0: forecast needs 0 | decode 1->0: forecast needs 0"
    # at zero with no demand: held there (a forecast's residue does not wake it)
    stays = throughput(config, gone.next_state, T0 + HOLD_S + 60, num_req=0, decode=0)
    assert zero_step(stays).reason is ReasonCode.AT_ZERO
    assert stays.decision.num_decode is None


@pytest.mark.parametrize("load_loop", [False, True])
def test_a_held_request_wakes_a_pool_at_zero_on_a_load_tick(load_loop: bool) -> None:
    config = agg_config(enable_load_scaling=load_loop)
    state = PlannerState(last_demand_s=T0)
    quiet = wake(config, state, T0 + 1000, held=0)
    assert zero_step(quiet).reason is ReasonCode.AT_ZERO
    assert quiet.decision.num_decode is None
    woken = wake(config, quiet.next_state, T0 + 1001, held=2)
    assert zero_step(woken).reason is ReasonCode.WOKEN
    assert woken.decision.num_decode == 1
    assert woken.reason is ReasonCode.SCALE
    assert woken.next_state.last_demand_s == T0 + 1001
    summary = summarize_decision(woken)
    assert (summary.stage, summary.text) == (DecisionStage.SCALE_TO_ZERO, "decode 0->1: woken by demand 1")
    # the next throughput tick (an empty window: the held requests never reached the frontend) keeps it up
    after = throughput(config, woken.next_state, T0 + 1060, num_req=0, decode=1)
    assert zero_step(after).reason is ReasonCode.IDLE_HOLD
    assert after.decision.num_decode is None
    # replay: the recorded inputs and state decide exactly the same
    again = wake(config, quiet.next_state, T0 + 1001, held=2)
    assert again == woken


def test_load_tick_with_the_load_loop_off_and_no_scale_to_zero_is_disabled() -> None:
    config = make_config(mode="agg", min_endpoint=0)
    outcome = wake(config, PlannerState(), T0, held=3)
    assert outcome.reason is ReasonCode.DISABLED
    assert not steps_named(outcome, "scale_to_zero")


def test_first_tick_starts_the_hold_and_does_not_wake_a_pool_at_zero() -> None:
    config = agg_config()
    first = throughput(config, PlannerState(), T0, num_req=0, decode=1)
    assert zero_step(first).reason is ReasonCode.IDLE_HOLD  # watched for a whole hold before it may go
    assert first.next_state.last_demand_s == T0
    at_zero = throughput(config, PlannerState(), T0, num_req=0, decode=0)
    assert zero_step(at_zero).reason is ReasonCode.AT_ZERO
    assert at_zero.decision.num_decode is None


def test_disagg_wakes_every_zero_minimum_pool() -> None:
    config = make_config(mode="disagg", min_endpoint=0, scale_to_zero_idle_seconds=HOLD_S, enable_load_scaling=True)
    unplaced = (UnplacedRequests(component=Component.DECODE, num_waiting=1),)
    inputs = TickInputs(now_s=T0, loop=Loop.LOAD, workers=workers(0, 0), unplaced=unplaced)
    outcome = tick(inputs, PlannerState(last_demand_s=T0 - 1000), config, FAKE)
    assert (outcome.decision.num_prefill, outcome.decision.num_decode) == (1, 1)
    assert {s.reason for s in steps_named(outcome, "scale_to_zero")} == {ReasonCode.WOKEN}


def test_scale_to_zero_needs_a_zero_minimum() -> None:
    with pytest.raises(ConfigError, match="scale_to_zero_idle_seconds.*minimum endpoints 0"):
        make_config(mode="agg", min_endpoint=1, scale_to_zero_idle_seconds=HOLD_S)
