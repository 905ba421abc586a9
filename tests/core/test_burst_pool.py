"""The burst rule's percentile pooled over windows (`planner_core.policy.burst_pool`)."""

from __future__ import annotations

import numpy as np
import pytest

from planner_core.arrivals import PromptCap, RequestArrivals, prompt_arrival_curve, prompt_arrival_quantiles
from planner_core.domain import PROMPT_ARRIVAL_INTERVALS_S, PROMPT_BURST_QUANTILES, PromptBurstQuantiles
from planner_core.policy.burst_pool import pool_prompt_bursts, remember_prompt_bursts


def poisson_arrivals(rate_rps: float, duration_s: float, seed: int) -> RequestArrivals:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 1.5)))
    arrival = arrival[arrival < duration_s]
    return RequestArrivals(arrival_s=arrival, isl=rng.gamma(2.0, 800.0, len(arrival)).round())


def distribution(values: np.ndarray, interval_s: float = 1.0) -> PromptBurstQuantiles:
    tokens = np.percentile(values, [100.0 * q for q in PROMPT_BURST_QUANTILES])
    return PromptBurstQuantiles(interval_s=interval_s, num_requests=len(values), tokens=tuple(float(t) for t in tokens))


@pytest.mark.parametrize("cap", [None, PromptCap(engine_prompt_tokens_per_s=40_000.0, slack_s=0.3)])
def test_the_distributions_hold_the_curve_and_one_window_pools_to_it_exactly(cap: PromptCap | None) -> None:
    """The curve derived with the distributions is the curve alone, to the bit; pooled over one window, the
    pooled curve is that window's curve, to the bit."""
    arrivals = poisson_arrivals(3.0, 120.0, seed=7)
    curve, quantiles = prompt_arrival_quantiles(arrivals, 60.0, 120.0, cap=cap)
    assert curve == prompt_arrival_curve(arrivals, 60.0, 120.0, cap=cap)
    assert [point.interval_s for point in quantiles] == list(PROMPT_ARRIVAL_INTERVALS_S.values())
    pooled = pool_prompt_bursts(quantiles, (), min_requests=10_000, max_windows=10)
    assert pooled is not None and (pooled.num_windows, pooled.num_requests) == (1, quantiles[0].num_requests)
    assert dict(pooled.points) == {PROMPT_ARRIVAL_INTERVALS_S[name]: tokens for name, tokens in curve.items()}


def test_pooled_windows_estimate_the_percentile_of_all_their_requests_better_than_one_window() -> None:
    """Ten windows of 120 draws from one distribution: each window's p99 wanders (it is nearly its largest
    value); the pooled p99 is within 5 % of the p99 of all 1,200 draws, nearer than most windows' own."""
    rng = np.random.default_rng(3)
    windows = [rng.gamma(2.0, 1000.0, 120) for _ in range(10)]
    everything = float(np.percentile(np.concatenate(windows), 99))
    recent = ()
    for k, values in enumerate(windows[:-1]):
        recent = remember_prompt_bursts(recent, 60.0 * k, (distribution(values),), min_requests=1200, max_windows=10)
    pooled = pool_prompt_bursts((distribution(windows[-1]),), recent, min_requests=1200, max_windows=10)
    assert pooled is not None and (pooled.num_windows, pooled.num_requests) == (10, 1200)
    (_, tokens), *_ = pooled.points
    own_errors = sorted(abs(float(np.percentile(values, 99)) - everything) for values in windows)
    assert abs(tokens - everything) <= 0.05 * everything
    assert abs(tokens - everything) < own_errors[len(own_errors) // 2]


def test_a_window_that_bunches_more_moves_the_pooled_percentile_at_once() -> None:
    """Nine calm windows, then one whose last tenth of requests quadruples: the pooled p99 rises in that window,
    to the p99 of all the windows' requests together or up to 15 % above it (the burst's requests are the top
    percent; each quantile band counts at its upper end, so the pooled value errs high)."""
    rng = np.random.default_rng(5)
    calm = [rng.gamma(2.0, 1000.0, 200) for _ in range(9)]
    recent = ()
    for k, values in enumerate(calm):
        recent = remember_prompt_bursts(recent, 60.0 * k, (distribution(values),), min_requests=2000, max_windows=10)
    burst = rng.gamma(2.0, 1000.0, 200)
    burst[-20:] *= 4.0
    everything = float(np.percentile(np.concatenate([*calm, burst]), 99))
    before = pool_prompt_bursts((distribution(calm[-1]),), recent[:-1], min_requests=2000, max_windows=10)
    after = pool_prompt_bursts((distribution(burst),), recent, min_requests=2000, max_windows=10)
    assert before is not None and after is not None
    assert after.points[0][1] > 1.15 * before.points[0][1]
    assert everything <= after.points[0][1] <= 1.15 * everything


def test_the_pool_stops_at_enough_requests_or_windows_and_keeps_only_what_the_next_tick_reads() -> None:
    point = PromptBurstQuantiles(interval_s=1.0, num_requests=500, tokens=(1.0,) * len(PROMPT_BURST_QUANTILES))
    recent = ()
    for k in range(6):
        recent = remember_prompt_bursts(recent, float(k), (point,), min_requests=1200, max_windows=10)
    # three windows of 500 hold 1,200: the next tick pools its own and (at most) three before it
    assert [window.at_s for window in recent] == [3.0, 4.0, 5.0]
    pooled = pool_prompt_bursts((point,), recent, min_requests=1200, max_windows=10)
    assert pooled is not None and (pooled.num_windows, pooled.num_requests) == (3, 1500)
    # the window count bounds it too, and idle windows age out by count
    for k in range(6, 9):
        recent = remember_prompt_bursts(recent, float(k), (), min_requests=1200, max_windows=3)
    assert [window.at_s for window in recent] == [7.0, 8.0]
    pooled = pool_prompt_bursts((point,), recent, min_requests=1200, max_windows=3)
    assert pooled is not None and (pooled.num_windows, pooled.num_requests) == (3, 500)
    # a window holding enough requests alone is its own pool
    big = PromptBurstQuantiles(interval_s=1.0, num_requests=5000, tokens=(2.0,) * len(PROMPT_BURST_QUANTILES))
    pooled = pool_prompt_bursts((big,), recent, min_requests=1200, max_windows=10)
    assert pooled is not None and (pooled.num_windows, pooled.points) == (1, ((1.0, 2.0),))
    # without distributions (no recorded arrivals, or an idle window) there is nothing to pool
    assert pool_prompt_bursts((), recent, min_requests=1200, max_windows=10) is None
