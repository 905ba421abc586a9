"""The closed loop (`planner_core.policy.feedback`): each pool's engine speed learned from what the window showed,
learned safely (slower at once, faster only at load, nothing from a changing pool, the last speed kept when the
source goes quiet), and the sizing reading it (`planner_core.policy.sizing`)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner_core.config import ConfigError, RouterKind, load_config, parse_config
from planner_core.data import DEFAULT_CONFIG
from planner_core.domain import (
    CapacityFeedback,
    Component,
    EngineLimits,
    ForwardPassMetrics,
    Loop,
    PlannerState,
    PoolFeedback,
    ReasonCode,
    ScheduledRequests,
    StepName,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.perf.scaled import speed_scaled
from planner_core.planner import build_planner
from planner_core.policy.feedback import (
    FeedbackWindow,
    fpm_speed,
    learn_decode_speed,
    learn_prefill_speed,
    learned_model,
    sizing_speed,
)
from tests.core.fakes import FWD

CONFIG = parse_config({"throughput_capacity_feedback": True, "throughput_algorithm": "engine_capacity"}, "test").policy
LIMITS = EngineLimits(num_gpu=1, max_num_batched_tokens=8192, max_num_seqs=256, max_kv_tokens=1_000_000)
WORKERS = WorkerCounts(ready_prefill=4, ready_decode=2, expected_prefill=4, expected_decode=2)
STEADY = PoolFeedback(last_ready=4)  # the prefill pool held its 4 engines through the window
STEADY_DECODE = PoolFeedback(last_ready=2)


def traffic(**fields: float) -> TrafficObservation:
    base = {"duration_s": 60.0, "num_req": 600.0, "isl": 2000.0, "osl": 200.0}
    return TrafficObservation(**{**base, **fields})


def prefill_iteration(tokens: int, speed: float, worker: str = "p0") -> ForwardPassMetrics:
    """A prefill engine's report of one chunk of `tokens`, timed by an engine at `speed` x the model."""
    wall_s = speed_scaled(FWD, prefill_speed=speed).prefill_wall_s(tokens)
    return ForwardPassMetrics(
        component=Component.PREFILL,
        worker_id=worker,
        wall_time_s=wall_s,
        scheduled=ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=tokens),
    )


def decode_iteration(batch: int, speed: float, worker: str = "d0") -> ForwardPassMetrics:
    kv_tokens = batch * 2100
    wall_s = speed_scaled(FWD, decode_speed=speed).decode_wall_s(batch, kv_tokens)
    return ForwardPassMetrics(
        component=Component.DECODE,
        worker_id=worker,
        wall_time_s=wall_s,
        scheduled=ScheduledRequests(num_decode_requests=batch, sum_decode_kv_tokens=kv_tokens),
    )


def window(fpm: tuple[ForwardPassMetrics, ...] = (), **fields: float) -> FeedbackWindow:
    return FeedbackWindow(traffic=traffic(**fields), window_s=60.0, workers=WORKERS, limits=LIMITS, fpm=fpm)


# --- measuring ---------------------------------------------------------------------------------------------------


def test_engine_iterations_measure_the_speed_exactly() -> None:
    fpms = (prefill_iteration(8192, 0.8), prefill_iteration(1000, 0.8, "p1"), decode_iteration(64, 0.8))
    measured = fpm_speed(Component.PREFILL, fpms, FWD, LIMITS)
    assert measured is not None
    assert measured.speed == pytest.approx(0.8)
    assert measured.at_load_speed == pytest.approx(0.8)  # the full chunk; the 1000-token one is light
    assert measured.num_iterations == 2  # the decode engine's report is not the prefill pool's


def test_idle_reports_measure_nothing() -> None:
    idle = ForwardPassMetrics(component=Component.PREFILL, worker_id="p0", wall_time_s=0.0)
    assert fpm_speed(Component.PREFILL, (idle,), FWD, LIMITS) is None
    # a tick of idle reports keeps the speed while the window met its TTFT target...
    kept, step = learn_prefill_speed(CONFIG, STEADY, window((idle,), ttft_ms=100.0, ttft_ms_p95=300.0), FWD)
    assert kept.speed == 1.0
    assert step.reason is ReasonCode.FEEDBACK_TOO_FEW_REQUESTS
    # ...and a missed p95 still lowers it: the miss is evidence whatever the iterations say
    lowered, step = learn_prefill_speed(CONFIG, STEADY, window((idle,), ttft_ms=300.0, ttft_ms_p95=2000.0), FWD)
    assert lowered.speed == pytest.approx(0.85)
    assert step.reason is ReasonCode.FEEDBACK_LEARNED


def test_the_sizing_model_runs_at_the_learned_speed_outside_the_dead_band() -> None:
    learned = CapacityFeedback(prefill=PoolFeedback(speed=0.8), decode=PoolFeedback(speed=1.03))
    prefill_model = learned_model(FWD, learned, Component.PREFILL)
    assert prefill_model.prefill_wall_s(8192) == pytest.approx(FWD.prefill_wall_s(8192) / 0.8)
    assert prefill_model.decode_wall_s(8, 1000) == FWD.decode_wall_s(8, 1000)  # the prefill pool's phase only
    assert learned_model(FWD, learned, Component.DECODE) is FWD  # 1.03: within the dead band, the model itself
    assert sizing_speed(PoolFeedback(speed=0.96)) == 1.0


# --- learning safely ---------------------------------------------------------------------------------------------


def test_a_slower_engine_is_learned_at_once_and_converges() -> None:
    feedback = STEADY_DECODE
    first, step = learn_decode_speed(CONFIG, feedback, window((decode_iteration(64, 0.8),)), FWD)
    assert step.reason is ReasonCode.FEEDBACK_LEARNED
    assert step.step is StepName.CAPACITY_FEEDBACK
    assert first.speed == pytest.approx(0.9)  # half way in one window
    for _ in range(5):
        first, step = learn_decode_speed(CONFIG, first, window((decode_iteration(64, 0.8),)), FWD)
    assert first.speed == pytest.approx(0.8, abs=0.8 * 0.03)
    assert step.reason is ReasonCode.FEEDBACK_CONFIRMED


def test_a_faster_engine_counts_only_at_load() -> None:
    light = window((decode_iteration(4, 1.3),))
    kept, step = learn_decode_speed(CONFIG, STEADY_DECODE, light, FWD)
    assert step.reason is ReasonCode.FEEDBACK_NOT_AT_LOAD
    assert kept.speed == 1.0
    loaded = window((decode_iteration(128, 1.3),))
    raised, step = learn_decode_speed(CONFIG, STEADY_DECODE, loaded, FWD)
    assert step.reason is ReasonCode.FEEDBACK_LEARNED
    assert raised.speed == pytest.approx(1.09)  # 30 % of the way: faster is believed slowly


def test_a_changing_pool_teaches_nothing() -> None:
    learned = PoolFeedback(speed=0.85, last_ready=4)
    changing = dataclasses.replace(window((prefill_iteration(8192, 0.5),)), workers=dataclasses.replace(
        WORKERS, expected_prefill=6
    ))  # fmt: skip
    kept, step = learn_prefill_speed(CONFIG, learned, changing, FWD)
    assert step.reason is ReasonCode.FEEDBACK_POOL_CHANGING
    assert kept.speed == 0.85
    # and the window after a change does not count either: the pool's engines differed at its start
    after, step = learn_prefill_speed(CONFIG, PoolFeedback(speed=0.85, last_ready=3), window(), FWD)
    assert step.reason is ReasonCode.FEEDBACK_POOL_CHANGING
    assert after.last_ready == 4


def test_a_quiet_source_keeps_the_last_speed() -> None:
    learned = PoolFeedback(speed=0.7, num_updates=3, last_ready=2)
    kept, step = learn_decode_speed(CONFIG, learned, window(), FWD)  # no ITL, no engine reports
    assert step.reason is ReasonCode.FEEDBACK_NO_LATENCY
    assert (kept.speed, kept.num_updates) == (0.7, 3)
    few, step = learn_decode_speed(CONFIG, learned, window(itl_ms=30.0, num_req=5.0), FWD)
    assert step.reason is ReasonCode.FEEDBACK_TOO_FEW_REQUESTS
    assert few.speed == 0.7


def test_the_speed_stays_within_its_bounds() -> None:
    feedback = STEADY
    for _ in range(20):
        feedback, _ = learn_prefill_speed(CONFIG, feedback, window((prefill_iteration(8192, 0.1),)), FWD)
    assert feedback.speed == CONFIG.throughput_feedback_speed_min


# --- from latency alone (sources without engine reports) ---------------------------------------------------------


def test_decode_speed_from_the_mean_itl() -> None:
    """Little's law gives the batch; an ITL 1 / 0.8 of the model's at that batch is a 0.8 engine."""
    engine = speed_scaled(FWD, decode_speed=0.8)
    rate_per_engine = 600.0 / 60.0 / 2
    itl_s = 0.02  # consistent batch: b = rate x OSL x ITL
    batch = rate_per_engine * 200.0 * itl_s
    context = 2000 + 200 // 2
    itl_ms = engine.decode_wall_s(batch, batch * context) * 1000.0
    learned, step = learn_decode_speed(CONFIG, STEADY_DECODE, window(itl_ms=itl_ms), FWD)
    assert step.reason is ReasonCode.FEEDBACK_LEARNED
    assert learned.last_measured is not None
    # the batch the planner infers uses the observed ITL, not the 20 ms above: the measure is close, not exact
    assert learned.last_measured < 1.0


def test_a_ttft_tail_over_target_lowers_the_prefill_speed_by_a_bounded_step() -> None:
    missed, step = learn_prefill_speed(CONFIG, STEADY, window(ttft_ms=300.0, ttft_ms_p99=2000.0), FWD)
    assert step.reason is ReasonCode.FEEDBACK_LEARNED
    assert missed.speed == pytest.approx(0.85)  # sqrt(500 / 2000) = 0.5, floored at one 15 % step
    small_miss, _ = learn_prefill_speed(CONFIG, STEADY, window(ttft_ms=300.0, ttft_ms_p99=510.0), FWD)
    assert small_miss.speed == pytest.approx(0.97)  # at least 3 %


def test_misses_of_prompts_too_long_for_the_target_say_nothing_of_the_pool() -> None:
    """Prompts whose compute alone exceeds the TTFT target miss on any pool: their tail is not the pool's."""
    long_prompts = window(ttft_ms=9000.0, ttft_ms_p99=20000.0, ttft_ms_p95=15000.0, isl=60000.0)
    kept, step = learn_prefill_speed(CONFIG, STEADY, long_prompts, FWD)
    assert kept.speed == 1.0
    assert step.reason is ReasonCode.FEEDBACK_CONFIRMED
    assert "tail unusable" in step.detail


def test_a_ttft_below_the_compute_time_proves_a_faster_engine() -> None:
    """Queueing only adds to a TTFT: a mean TTFT below the modelled compute bounds the speed from below."""
    compute_ms = FWD.prefill_wall_s(2000) * 1000.0
    faster, step = learn_prefill_speed(CONFIG, STEADY, window(ttft_ms=compute_ms / 1.5, ttft_ms_p99=100.0), FWD)
    assert step.reason is ReasonCode.FEEDBACK_LEARNED
    assert faster.speed == pytest.approx(1.0 + 0.3 * 0.5)


def test_engines_at_profile_speed_that_miss_their_ttft_target_are_sized_slower() -> None:
    """Iterations at the model's speed measure the compute alone; a router that is not least loaded or bursts
    queue requests the iterations never see, and a missed p95 TTFT bounds the speed the sizing reads. A p99 miss
    alone is a burst the forecast missed (the burst sizing answers those): it leaves the iterations' speed."""
    at_speed = (prefill_iteration(8192, 1.0),)
    missed, step = learn_prefill_speed(CONFIG, STEADY, window(at_speed, ttft_ms=300.0, ttft_ms_p95=2000.0), FWD)
    assert missed.speed == pytest.approx(0.85)  # one bounded step, as on the latency path
    assert step.reason is ReasonCode.FEEDBACK_LEARNED and "the missed tail bounds it" in step.detail
    burst = window(at_speed, ttft_ms=150.0, ttft_ms_p95=400.0, ttft_ms_p99=2000.0)
    kept, step = learn_prefill_speed(CONFIG, STEADY, burst, FWD)
    assert kept.speed == 1.0 and step.reason is ReasonCode.FEEDBACK_CONFIRMED
    met, step = learn_prefill_speed(CONFIG, STEADY, window(at_speed, ttft_ms=100.0, ttft_ms_p95=300.0), FWD)
    assert met.speed == 1.0 and step.reason is ReasonCode.FEEDBACK_CONFIRMED


def test_a_miss_in_a_window_whose_own_bursts_outgrew_the_pool_is_the_loads_not_the_engines() -> None:
    at_speed = (prefill_iteration(8192, 1.0),)
    missed = window(at_speed, ttft_ms=300.0, ttft_ms_p95=2000.0)
    outgrown = dataclasses.replace(missed, prompt_need_engines=6.5)  # 4 engines ready
    kept, step = learn_prefill_speed(CONFIG, STEADY, outgrown, FWD)
    assert kept.speed == 1.0 and "needed 6.5 engines of the 4 ready" in step.detail
    assert step.reason is ReasonCode.FEEDBACK_MISS_WAS_LOAD
    fitted = dataclasses.replace(missed, prompt_need_engines=3.5)
    lowered, _ = learn_prefill_speed(CONFIG, STEADY, fitted, FWD)
    assert lowered.speed == pytest.approx(0.85)
    no_reports = dataclasses.replace(outgrown, fpm=())  # the latency path reads the same evidence
    kept, step = learn_prefill_speed(CONFIG, STEADY, no_reports, FWD)
    assert kept.speed == 1.0 and "needed 6.5 engines" in step.detail
    assert step.reason is ReasonCode.FEEDBACK_MISS_WAS_LOAD


def test_faster_iterations_raise_the_speed_only_in_a_window_that_met_its_target_comfortably() -> None:
    lowered = dataclasses.replace(STEADY, speed=0.8)
    at_load = (prefill_iteration(8192, 1.0),)
    tight = window(at_load, ttft_ms=150.0, ttft_ms_p95=450.0)  # met, but over 80 % of the 500 ms target
    kept, step = learn_prefill_speed(CONFIG, lowered, tight, FWD)
    assert kept.speed == 0.8 and step.reason is ReasonCode.FEEDBACK_NOT_AT_LOAD
    comfortable = window(at_load, ttft_ms=100.0, ttft_ms_p95=300.0)
    raised, step = learn_prefill_speed(CONFIG, lowered, comfortable, FWD)
    assert raised.speed == pytest.approx(0.8 + 0.3 * 0.2) and step.reason is ReasonCode.FEEDBACK_LEARNED


def test_a_source_with_only_the_mean_ttft_is_judged_on_a_p95_estimated_from_it() -> None:
    """Mean TTFT 2000-token prompts: compute ~c ms each; a mean of c + 200 ms waits gives p95 ~ c + 3 x 200 ms."""
    compute_ms = FWD.prefill_wall_s(2000) * 1000.0
    queued = window((prefill_iteration(8192, 1.0),), ttft_ms=compute_ms + 200.0)
    lowered, step = learn_prefill_speed(CONFIG, STEADY, queued, FWD)
    expected_p95 = compute_ms + math.log(20.0) * 200.0
    assert expected_p95 > 500.0
    assert lowered.speed == pytest.approx(max(0.85, min(0.97, math.sqrt(500.0 / expected_p95))))
    assert f"p95 from the mean {expected_p95:.0f} ms" in step.detail
    short_waits = window((prefill_iteration(8192, 1.0),), ttft_ms=compute_ms + 50.0)
    kept, step = learn_prefill_speed(CONFIG, STEADY, short_waits, FWD)
    assert kept.speed == 1.0  # p95 ~ c + 150 ms: met
    too_long = window((prefill_iteration(8192, 1.0),), ttft_ms=20000.0, isl=60000.0)
    kept, step = learn_prefill_speed(CONFIG, STEADY, too_long, FWD)
    assert kept.speed == 1.0 and step.reason is ReasonCode.FEEDBACK_CONFIRMED  # no prompt can meet it alone


# --- the sizing reads it -----------------------------------------------------------------------------------------


def sized(feedback: bool, learned: CapacityFeedback) -> tuple[dict[Component, int], PlannerState, tuple]:
    policy = load_config(DEFAULT_CONFIG).policy.model_copy(update={"throughput_capacity_feedback": feedback})
    planner = build_planner(policy, DEFAULT_CONFIG)
    workers = WorkerCounts(ready_prefill=2, ready_decode=2, expected_prefill=2, expected_decode=2)
    state = PlannerState(capacity_feedback=learned)
    inputs = TickInputs(
        now_s=600.0, loop=Loop.THROUGHPUT, workers=workers, traffic=traffic(num_req=1800.0, isl=3000.0, osl=150.0)
    )
    outcome = planner.decide(inputs, state)
    decision = outcome.decision  # a pool left out keeps its 2 engines
    targets = {
        Component.PREFILL: 2 if decision.num_prefill is None else decision.num_prefill,
        Component.DECODE: 2 if decision.num_decode is None else decision.num_decode,
    }
    return targets, outcome.next_state, outcome.steps


def test_the_sizing_sizes_a_slower_prefill_pool_larger_and_records_why() -> None:
    steady = CapacityFeedback(prefill=PoolFeedback(speed=1.0, last_ready=2), decode=PoolFeedback(last_ready=2))
    slow = dataclasses.replace(steady, prefill=PoolFeedback(speed=0.6, last_ready=2))
    at_model, _, _ = sized(True, steady)
    at_slow, state, steps = sized(True, slow)
    assert at_slow[Component.PREFILL] > at_model[Component.PREFILL]
    assert at_slow[Component.DECODE] == at_model[Component.DECODE]
    feedback_steps = [s for s in steps if s.step == StepName.CAPACITY_FEEDBACK]
    assert {s.component for s in feedback_steps} == {Component.PREFILL, Component.DECODE}
    assert state.capacity_feedback.prefill.speed == 0.6  # no latency in the window: kept, not reset
    assert any("at the learned speed 0.600" in s.detail for s in steps if s.step == StepName.FORWARD_PASS_MODEL)


def test_with_the_loop_off_a_learned_speed_is_never_read() -> None:
    slow = CapacityFeedback(prefill=PoolFeedback(speed=0.6, last_ready=2), decode=PoolFeedback(last_ready=2))
    off_slow, _, steps = sized(False, slow)
    on_model, _, _ = sized(True, CapacityFeedback())
    assert not [s for s in steps if s.step == StepName.CAPACITY_FEEDBACK]
    assert off_slow == on_model


def test_the_loop_needs_disaggregated_pools_on_engine_capacity() -> None:
    with pytest.raises(ConfigError, match="throughput_capacity_feedback.*needs mode: disagg"):
        parse_config({"throughput_capacity_feedback": True, "mode": "agg"}, "test")
    with pytest.raises(ConfigError, match="needs throughput_algorithm: engine_capacity"):
        parse_config({"throughput_capacity_feedback": True, "throughput_algorithm": "interpolation"}, "test")


def test_a_miss_beyond_what_the_windows_own_bursts_make_at_the_pools_size_is_the_engines() -> None:
    """The pool (4 engines at 20,000 prompt tokens/s each) was short for its bursts: 440,000 tokens in 5 s wait
    440,000 / 80,000 - 5 = 0.5 s. A p95 near that wait plus a prompt's compute is the load's; one of 2 s on the same
    load is not (a router that spreads the burst worse than least loaded, or slower engines): the part the load
    does not explain lowers the speed, bounded as any miss."""
    at_speed = (prefill_iteration(8192, 1.0),)
    compute_ms = FWD.prefill_wall_s(2000) * 1000.0
    load_tail_ms = 500.0 + compute_ms

    def short(p95_ms: float) -> FeedbackWindow:
        missed = window(at_speed, ttft_ms=300.0, ttft_ms_p95=p95_ms, prompt_tokens_p99_5s=440_000.0)
        return dataclasses.replace(missed, prompt_need_engines=6.5, engine_prompt_tokens_per_s=20_000.0)

    kept, step = learn_prefill_speed(CONFIG, STEADY, short(1.2 * load_tail_ms), FWD)
    assert kept.speed == 1.0 and step.reason is ReasonCode.FEEDBACK_MISS_WAS_LOAD
    assert f"the load alone makes {load_tail_ms:.0f} ms" in step.detail
    lowered, step = learn_prefill_speed(CONFIG, STEADY, short(2000.0), FWD)
    assert step.reason is ReasonCode.FEEDBACK_MISS_BEYOND_LOAD
    assert lowered.speed == pytest.approx(max(0.85, (load_tail_ms / 2000.0) ** 0.5))
    assert "the rest is the engines' or the router's" in step.detail
    # the latency path (no iterations reported) reads the same evidence
    latency_only, step = learn_prefill_speed(CONFIG, STEADY, dataclasses.replace(short(2000.0), fpm=()), FWD)
    assert latency_only.speed < 1.0 and step.reason is ReasonCode.FEEDBACK_MISS_BEYOND_LOAD
    # without the rule's rate the load's tail is unknown: the miss stays the load's, as before
    unknown = dataclasses.replace(short(2000.0), engine_prompt_tokens_per_s=None)
    kept, step = learn_prefill_speed(CONFIG, STEADY, unknown, FWD)
    assert kept.speed == 1.0 and step.reason is ReasonCode.FEEDBACK_MISS_WAS_LOAD


def test_under_a_declared_round_robin_router_a_miss_beyond_the_burst_rules_tail_stays_the_loads() -> None:
    """The by-count sizing answers a round-robin router's spreading (`planner_core.policy.dispatch`); lowering the
    speed for the same miss as well would count it twice."""
    at_speed = (prefill_iteration(8192, 1.0),)
    missed = window(at_speed, ttft_ms=300.0, ttft_ms_p95=2000.0, prompt_tokens_p99_5s=440_000.0)
    outgrown = dataclasses.replace(missed, prompt_need_engines=6.5, engine_prompt_tokens_per_s=20_000.0)
    round_robin = CONFIG.model_copy(update={"router": RouterKind.ROUND_ROBIN})
    kept, step = learn_prefill_speed(round_robin, STEADY, outgrown, FWD)
    assert kept.speed == 1.0 and step.reason is ReasonCode.FEEDBACK_MISS_WAS_LOAD
    assert "round-robin router: sized by count" in step.detail
    lowered, _ = learn_prefill_speed(CONFIG, STEADY, outgrown, FWD)  # least loaded: the excess is the engines'
    assert lowered.speed < 1.0
