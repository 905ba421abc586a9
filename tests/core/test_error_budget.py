"""The SLA error budget (`planner_core.policy.error_budget`): the share within the targets read from the frontend's
histograms, the period's and the recent burn, and the posture that moves the decode margin and burst percentile."""

from __future__ import annotations

import math

import pytest

from planner_core.config import PlannerConfig
from planner_core.domain import ErrorBudgetState, LatencyHistogram, ReasonCode, StepName, TrafficObservation
from planner_core.policy.burst_pool import pool_prompt_bursts
from planner_core.policy.error_budget import (
    LEAN_STEP,
    MIN_JUDGED,
    budget_margins,
    read_error_budget,
    window_misses,
)

BOUNDS_MS = (100.0, 250.0, 500.0, 1000.0)
CONFIG = PlannerConfig(
    ttft_ms=500,
    itl_ms=50,
    throughput_error_budget=True,
    throughput_decode_target_utilization=0.7,
    error_budget_lean_decode_utilization=0.9,
    error_budget_lean_burst_quantile=0.95,
    error_budget_period_seconds=3600,
    error_budget_fast_burn_seconds=600,
)


def histogram(count: float, within: float, bounds_ms: tuple[float, ...] = BOUNDS_MS) -> LatencyHistogram:
    """`count` requests, `within` of them at or under 500 ms (the rest between 500 ms and 1 s)."""
    cumulative = tuple(within if bound <= 500.0 else count for bound in bounds_ms)
    return LatencyHistogram(bounds_ms=bounds_ms, cumulative=cumulative, count=count)


def window(count: float, within: float, *, itl_within: float | None = None) -> TrafficObservation:
    itl = None
    if itl_within is not None:
        itl = LatencyHistogram(bounds_ms=(25.0, 50.0, 100.0), cumulative=(0.0, itl_within, count), count=count)
    return TrafficObservation(
        duration_s=60.0,
        num_req=count,
        isl=1000.0,
        osl=100.0,
        ttft_histogram=histogram(count, within),
        itl_histogram=itl,
    )


# --- the histogram ------------------------------------------------------------------------------------------------


def test_share_within_reads_a_bucket_bound_exactly_and_interpolates_inside_a_bucket() -> None:
    h = LatencyHistogram(bounds_ms=(100.0, 500.0, 1000.0), cumulative=(10.0, 90.0, 100.0), count=100.0)
    assert h.share_within(500.0) == pytest.approx(0.90)
    assert h.share_within(300.0) == pytest.approx((10.0 + 80.0 * 0.5) / 100.0)  # half way through (100, 500]
    assert h.share_within(50.0) == pytest.approx(0.05)  # the first bucket starts at 0
    assert h.share_within(5000.0) == pytest.approx(1.0)


def test_share_within_past_the_last_bound_is_what_the_finite_buckets_hold() -> None:
    h = LatencyHistogram(bounds_ms=(100.0, 500.0), cumulative=(10.0, 90.0), count=100.0)  # 10 beyond 500 ms
    assert h.share_within(2000.0) == pytest.approx(0.90)


def test_an_empty_histogram_has_no_share() -> None:
    assert LatencyHistogram(bounds_ms=BOUNDS_MS, cumulative=(0.0,) * 4, count=0.0).share_within(500.0) is None


def test_a_window_misses_either_target_and_never_more_than_its_requests() -> None:
    assert window_misses(CONFIG, window(1000.0, 990.0)) == (1000.0, pytest.approx(10.0))
    assert window_misses(CONFIG, window(1000.0, 990.0, itl_within=995.0)) == (1000.0, pytest.approx(15.0))
    assert window_misses(CONFIG, window(100.0, 0.0, itl_within=0.0)) == (100.0, pytest.approx(100.0))
    no_histogram = TrafficObservation(duration_s=60.0, num_req=100.0, isl=1000.0, osl=100.0, ttft_ms=80.0)
    assert window_misses(CONFIG, no_histogram) is None


# --- the posture --------------------------------------------------------------------------------------------------


def run(windows: list[TrafficObservation], state: ErrorBudgetState | None = None, *, every_s: float = 60.0):
    state = state or ErrorBudgetState()
    steps = []
    for k, traffic in enumerate(windows, start=1):
        state, step = read_error_budget(CONFIG, state, traffic, every_s * k)
        steps.append(step)
    return state, steps


def test_healthy_windows_make_the_margins_leaner_a_step_at_a_time() -> None:
    state, steps = run([window(2000.0, 2000.0)] * 6)
    assert [s.value for s in steps] == [LEAN_STEP, 2 * LEAN_STEP, 3 * LEAN_STEP, 1.0, 1.0, 1.0]
    assert {s.reason for s in steps} == {ReasonCode.BUDGET_HEALTHY}
    assert all(s.step is StepName.ERROR_BUDGET for s in steps)
    assert state.posture == 1.0
    assert "decode utilization 0.90, burst p95" in steps[-1].detail


def test_the_configured_margins_hold_until_enough_requests_are_judged() -> None:
    state, steps = run([window(200.0, 200.0)] * 4)  # 800 judged
    assert 800 < MIN_JUDGED and state.posture == 0.0
    assert {s.reason for s in steps} == {ReasonCode.BUDGET_WARMING_UP}
    state, step = read_error_budget(CONFIG, state, window(300.0, 300.0), 300.0)
    assert step.reason is ReasonCode.BUDGET_HEALTHY and state.posture == LEAN_STEP


def test_a_fast_burn_goes_back_to_the_configured_margins_at_once() -> None:
    lean, _ = run([window(2000.0, 2000.0)] * 4)
    assert lean.posture == 1.0
    # 5 % of one window missed: 100 misses against 1 % of the ~10,000 recent requests (burn ~1.0 .. 1.4)
    state, step = read_error_budget(CONFIG, lean, window(2000.0, 1900.0), 300.0)
    assert step.reason is ReasonCode.BUDGET_BURNING and state.posture == 0.0
    assert "burn" in step.detail and "posture 1.00 -> 0.00" in step.detail


def test_within_the_budget_but_not_far_under_it_the_posture_holds() -> None:
    # 0.7 % missed over the period: burn 0.7, between LEAN_BELOW and 1
    state, steps = run([window(2000.0, 1986.0)] * 3, ErrorBudgetState(posture=0.5))
    assert {s.reason for s in steps} == {ReasonCode.BUDGET_HOLDING}
    assert state.posture == 0.5


def test_a_window_without_a_histogram_keeps_the_posture_and_decays_the_counts() -> None:
    lean, _ = run([window(2000.0, 2000.0)] * 4)
    quiet = TrafficObservation(duration_s=60.0, num_req=50.0, isl=1000.0, osl=100.0, ttft_ms=90.0)
    state, step = read_error_budget(CONFIG, lean, quiet, lean.last_s + 600.0)
    assert step.reason is ReasonCode.BUDGET_UNAVAILABLE and state.posture == lean.posture
    assert state.judged == pytest.approx(lean.judged * math.exp(-600.0 / 3600.0))
    assert state.recent_judged == pytest.approx(lean.recent_judged * math.exp(-1.0))


def test_the_posture_sets_each_margin_between_the_configured_and_the_lean_one() -> None:
    assert budget_margins(CONFIG, 0.0).decode_utilization == pytest.approx(0.7)
    assert budget_margins(CONFIG, 0.5).decode_utilization == pytest.approx(0.8)
    assert budget_margins(CONFIG, 1.0).burst_quantile == pytest.approx(0.95)
    assert budget_margins(CONFIG, 0.5).burst_quantile == pytest.approx(0.97)
    # a lean setting richer than the configured one is never used
    richer = CONFIG.model_copy(update={"error_budget_lean_decode_utilization": 0.5})
    assert budget_margins(richer, 1.0).decode_utilization == pytest.approx(0.7)


def test_the_pooled_burst_curve_reads_the_posture_percentile() -> None:
    from planner_core.domain import PromptBurstQuantiles

    # one window's distribution at PROMPT_BURST_QUANTILES (0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)
    tokens = (100.0, 900.0, 950.0, 980.0, 990.0, 995.0, 999.0, 1000.0)
    current = (PromptBurstQuantiles(interval_s=1.0, num_requests=1000, tokens=tokens),)
    at_p99 = pool_prompt_bursts(current, (), min_requests=1, max_windows=1)
    at_p95 = pool_prompt_bursts(current, (), min_requests=1, max_windows=1, quantile=0.95)
    assert at_p99 is not None and at_p95 is not None
    assert at_p99.points == ((1.0, 990.0),) and at_p95.points == ((1.0, 950.0),)


# --- in the tick ----------------------------------------------------------------------------------------------------


def test_the_tick_reads_the_budget_and_sizes_decode_at_the_posture_margin() -> None:
    """The recommended policy with the budget on: each throughput tick leaves an `error_budget` step before the
    capacity stages, and on a load served within the targets the decode headroom step moves from the configured
    utilization to the lean one as the posture rises."""
    import dataclasses

    from planner_core.arrivals import with_arrivals
    from planner_core.config import load_config
    from planner_core.data import DEFAULT_CONFIG
    from planner_core.domain import Component, Loop, PlannerState, TickInputs, WorkerCounts
    from planner_core.planner import build_planner
    from tests.core.test_recommended_policy import steady_trace

    policy = load_config(DEFAULT_CONFIG).policy.model_copy(update={"throughput_error_budget": True})
    planner = build_planner(policy, DEFAULT_CONFIG)
    trace = steady_trace(40.0, 1200.0, 300.0, 1)
    state = PlannerState()
    headroom = []
    for k in range(1, 7):
        start_s, end_s = (k - 1) * 60.0, k * 60.0
        traffic = with_arrivals(trace.observe(start_s, end_s), trace.arrivals(start_s, end_s), start_s, end_s)
        served = histogram(traffic.num_req, traffic.num_req)  # every request within the targets
        traffic = dataclasses.replace(traffic, ttft_histogram=served)
        workers = WorkerCounts(ready_prefill=3, ready_decode=3, expected_prefill=3, expected_decode=3)
        outcome = planner.decide(TickInputs(now_s=end_s, loop=Loop.THROUGHPUT, workers=workers, traffic=traffic), state)
        state = outcome.next_state
        names = [s.step for s in outcome.steps]
        assert StepName.ERROR_BUDGET in names and names.index(StepName.ERROR_BUDGET) < names.index(StepName.HEADROOM)
        headroom += [s.value for s in outcome.steps if s.step is StepName.HEADROOM and s.component is Component.DECODE]
    assert state.error_budget.posture == 1.0  # 40 req/s: 2,400 judged a window, healthy from the first
    assert headroom == pytest.approx([0.75, 0.8, 0.85, 0.9, 0.9, 0.9])
