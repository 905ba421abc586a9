"""The recommended policy (`planner_core/configs/policies/planner.yaml`, the default of `planner serve` and
`planner demo`): steady load does not make it flap."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from planner_core.arrivals import with_arrivals
from planner_core.config import load_config
from planner_core.data import DEFAULT_CONFIG
from planner_core.domain import Loop, PlannerState, TickInputs, WorkerCounts
from planner_core.planner import Planner, build_planner
from planner_core.traces import RequestTrace
from tests.core.fakes import make_trace

PLANNER = build_planner(load_config(DEFAULT_CONFIG).policy, DEFAULT_CONFIG)
FLAP_SEARCH_PHASES = (
    (Phase.explicit, Phase.generate, Phase.shrink)
    if os.environ.get("PLANNER_FLAP_SEARCH") == "1"
    else (Phase.explicit,)
)
NUM_WINDOWS = 30
WARM_UP_WINDOWS = 5


def steady_trace(rate_rps: float, mean_isl: float, mean_osl: float, seed: int) -> RequestTrace:
    """Poisson arrivals at a constant rate, exponential-ish lengths around the given means."""
    rng = np.random.default_rng(seed)
    duration_s = (NUM_WINDOWS + 1) * PLANNER.config.throughput_adjustment_interval_seconds
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 1.1)))
    arrival = arrival[arrival < duration_s]
    isl = np.maximum(1, rng.gamma(2.0, mean_isl / 2.0, len(arrival))).round()
    osl = np.maximum(1, rng.gamma(2.0, mean_osl / 2.0, len(arrival))).round()
    return make_trace((arrival - arrival[0]).tolist(), isl.tolist(), osl.tolist())


def settled_sizes(planner: Planner, trace: RequestTrace) -> list[tuple[int, int]]:
    """Throughput ticks on the trace's windows, each decision applied at once; the sizes after the warm-up.
    The observations come the way a live source makes them (`RequestTrace.observe`, `with_arrivals`)."""
    window_s = float(planner.config.throughput_adjustment_interval_seconds)
    state, prefill, decode = PlannerState(), 1, 1
    sizes = []
    for k in range(1, NUM_WINDOWS + 1):
        start_s, end_s = (k - 1) * window_s, k * window_s
        traffic = with_arrivals(trace.observe(start_s, end_s), trace.arrivals(start_s, end_s), start_s, end_s)
        workers = WorkerCounts(ready_prefill=prefill, ready_decode=decode, expected_prefill=prefill,
                               expected_decode=decode)  # fmt: skip
        outcome = planner.decide(TickInputs(now_s=end_s, loop=Loop.THROUGHPUT, workers=workers, traffic=traffic), state)
        state = outcome.next_state
        if outcome.decision.num_prefill is not None:
            prefill = outcome.decision.num_prefill
        if outcome.decision.num_decode is not None:
            decode = outcome.decision.num_decode
        sizes.append((prefill, decode))
    return sizes[WARM_UP_WINDOWS:]


def reversals(sizes: list[tuple[int, int]], pool: int) -> list[int]:
    """Indices where the pool's size changes in the opposite direction of its previous change."""
    changes = [(i, sizes[i][pool] - sizes[i - 1][pool]) for i in range(1, len(sizes)) if sizes[i] != sizes[i - 1]]
    changes = [(i, step) for i, step in changes if step != 0]
    return [i for (_, before), (i, after) in zip(changes, changes[1:], strict=False) if (before > 0) != (after > 0)]


# `make test` runs the examples below; PLANNER_FLAP_SEARCH=1 adds a search of 20 random loads (it once found the
# loads of test_mid_rate_prompt_bursts_hold_one_prefill_size, below, by chance in a CI run: a search that may find
# a new case belongs to `make explore`, not to every run).
@settings(max_examples=20, deadline=None, derandomize=True, phases=FLAP_SEARCH_PHASES)
# loads the search found flapping before the scale-down margin: decode 3 -> 2 -> 3 within minutes
@example(rate_rps=43.75, mean_isl=1210.0, mean_osl=516.0, seed=1)
@example(rate_rps=42.75, mean_isl=1212.0, mean_osl=520.0, seed=2)
@example(rate_rps=36.875, mean_isl=890.0, mean_osl=20.0, seed=1)
# long prompts at a prefill size boundary (with the start-up horizon knob on they once flapped 3 -> 5 -> 4 -> 3:
# see the knob-on property below)
@example(rate_rps=28.75, mean_isl=3699.0, mean_osl=20.0, seed=1)
@example(rate_rps=27.97, mean_isl=3667.0, mean_osl=20.0, seed=2)
@given(
    rate_rps=st.floats(2.0, 120.0),
    mean_isl=st.floats(200.0, 4000.0),
    mean_osl=st.floats(20.0, 600.0),
    seed=st.integers(0, 2**16),
)
def test_steady_load_does_not_flap(rate_rps: float, mean_isl: float, mean_osl: float, seed: int) -> None:
    """At steady load, after a warm-up, no change of a pool is undone within the scale-down hold (450 s), and a
    pool makes at most one excursion (one reversal) in the 25 minutes observed. A steady load can still sit at a
    size boundary, where a window's p99 burst lifts a pool and the hold brings it back later: that is the one
    excursion allowed, not a constant size."""
    assert_no_flapping(settled_sizes(PLANNER, steady_trace(rate_rps, mean_isl, mean_osl, seed)))


# The recommended policy with the start-up horizon knob on (q = 0.75, the setting the bench's `planner@q0.75` rows
# run): the policy as a user who turns the knob on gets it.
HORIZON_PLANNER = Planner(
    config=PLANNER.config.model_copy(update={"throughput_horizon_quantile": 0.75}), perf=PLANNER.perf
)


# The headroom was added to the rounded size after the scale-down hold: a 0.01-engine headroom added a whole engine
# the hold did not keep, prefill 3 -> 5 -> 4 -> 3 with the 5 -> 4 300 s after the raise (the first case). Fixed
# cases, not a search: the search finds the knob's own wandering below (a known defect, strict xfail).
@pytest.mark.parametrize(
    ("rate_rps", "mean_isl", "mean_osl", "seed"),
    [
        (28.75, 3699.0, 20.0, 1),
        (27.97, 3667.0, 20.0, 2),
        (42.75, 1212.0, 520.0, 2),
        (43.75, 1210.0, 516.0, 1),
        (36.875, 890.0, 20.0, 1),
        (2.0, 3980.0, 20.0, 65535),
    ],
)
def test_steady_load_does_not_flap_with_the_horizon_knob_on(
    rate_rps: float, mean_isl: float, mean_osl: float, seed: int
) -> None:
    """The property above with the knob on: the headroom raises the need before the hold, so the hold keeps it."""
    assert_no_flapping(settled_sizes(HORIZON_PLANNER, steady_trace(rate_rps, mean_isl, mean_osl, seed)))


# Found by the search the cases above replaced, once a known defect: with the knob on, ~15 req/s of long prompts
# at a prefill size boundary wandered 2 -> 3, 3 -> 2 after the hold, 2 -> 3 seven windows later, as each window's
# p99 burst crossed the boundary. The burst percentile pooled over 2,000 requests (planner.yaml) holds one size.
@pytest.mark.parametrize(
    ("rate_rps", "mean_isl", "seed"),
    [(15.066517304197601, 3468.453543335732, 3839), (15.066517304197601, 1668.0, 3841)],
)
def test_the_horizon_headroom_does_not_wander_at_a_size_boundary(rate_rps: float, mean_isl: float, seed: int) -> None:
    assert_no_flapping(settled_sizes(HORIZON_PLANNER, steady_trace(rate_rps, mean_isl, 20.0, seed)))


def assert_no_flapping(sizes: list[tuple[int, int]]) -> None:
    """The check of the property above, for both pools."""
    hold_windows = (
        PLANNER.config.throughput_scale_down_hold_seconds / PLANNER.config.throughput_adjustment_interval_seconds
    )
    for pool in (0, 1):
        turns = reversals(sizes, pool)
        assert len(turns) <= 1, f"pool {pool} flaps at steady load: {[size[pool] for size in sizes]}"
        changed_at = [i for i in range(1, len(sizes)) if sizes[i][pool] != sizes[i - 1][pool]]
        for turn in turns:
            previous = max(i for i in changed_at if i < turn)
            assert turn - previous >= hold_windows, f"pool {pool} undid a change within the hold: {sizes}"


# Once a known defect: 2 req/s of ~4000-token prompts (gamma-distributed, so a few reach ~14k tokens): about one
# window in ten held a 0.25 s burst whose p99 sizing needed 1.01 prefill engines, so the pool went 1 -> 2, back
# after the hold, and up again at the next such window. A window of 120 requests has a p99 that is nearly its
# largest value; pooled over 2,000 requests (planner.yaml) the need stays near 0.8 engine.
def test_low_rate_long_prompt_bursts_do_not_flap() -> None:
    assert_no_flapping(settled_sizes(PLANNER, steady_trace(2.0, 3980.0, 20.0, 65535)))


# Once a known defect (found by the property above on 2026-12-07): 18-20 req/s of ~1700-token prompts with
# 20-token outputs sit at a prefill size boundary of 1-2 engines; a window's p99 prompt burst crossed it every few
# windows, 1 -> 2 -> 1 -> 2. Pooled over 2,000 requests (two windows) the percentile holds one size.
@pytest.mark.parametrize("rate_rps", [18.0, 20.0])
def test_mid_rate_prompt_bursts_hold_one_prefill_size(rate_rps: float) -> None:
    assert_no_flapping(settled_sizes(PLANNER, steady_trace(rate_rps, 1688.0, 20.0, 1)))


def test_the_flap_check_sees_flapping() -> None:
    """The check above is not vacuous: a pool turning 3 -> 4 -> 3 -> 4 (what Dynamo 0.x's interpolation with a
    constant forecast did to decode at steady load, once a minute) has two reversals; a pool rising twice has none."""
    assert reversals([(1, 3), (1, 4), (1, 3), (1, 4)], 1) == [2, 3]
    assert reversals([(1, 3), (2, 3), (3, 3)], 0) == []


def test_without_the_margin_a_steady_load_flaps() -> None:
    """The margin is what keeps the pools still: without it (the hold alone) the first load above drops decode from
    3 to 2 and raises it again within the hold."""
    config = PLANNER.config.model_copy(update={"throughput_scale_down_margin": 0.0})
    sizes = settled_sizes(Planner(config=config, perf=PLANNER.perf), steady_trace(43.75, 1210.0, 516.0, 1))
    assert len(reversals(sizes, 1)) >= 1, sizes
    assert settled_sizes(PLANNER, steady_trace(43.75, 1210.0, 516.0, 1))[-1][1] == 3  # with it: held at 3


def test_without_the_pooled_percentile_low_and_mid_rates_flap() -> None:
    """The pooling is what holds the loads above still: each window's own p99 (`throughput_burst_pool_requests:
    0`) turns the prefill pool more than once at 2 and at 18 req/s."""
    config = PLANNER.config.model_copy(update={"throughput_burst_pool_requests": 0})
    per_window = Planner(config=config, perf=PLANNER.perf)
    for load in ((2.0, 3980.0, 20.0, 65535), (18.0, 1688.0, 20.0, 1)):
        sizes = settled_sizes(per_window, steady_trace(*load))
        assert len(reversals(sizes, 0)) >= 2, sizes
