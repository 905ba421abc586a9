"""The recommended policy (`planner_core/configs/policies/planner.yaml`, the default of `planner serve` and
`planner demo`): steady load does not make it flap."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import load_config
from planner_core.data import DEFAULT_CONFIG
from planner_core.domain import Loop, PlannerState, TickInputs, WorkerCounts
from planner_core.planner import build_planner
from tests.test_sim_des import make_trace

PLANNER = build_planner(load_config(DEFAULT_CONFIG).policy, DEFAULT_CONFIG)
NUM_WINDOWS = 30
WARM_UP_WINDOWS = 5


def steady_trace(rate_rps: float, mean_isl: float, mean_osl: float, seed: int):  # noqa: ANN201
    """Poisson arrivals at a constant rate, exponential-ish lengths around the given means."""
    rng = np.random.default_rng(seed)
    duration_s = (NUM_WINDOWS + 1) * PLANNER.config.throughput_adjustment_interval_seconds
    arrival = np.cumsum(rng.exponential(1.0 / rate_rps, int(rate_rps * duration_s * 1.1)))
    arrival = arrival[arrival < duration_s]
    isl = np.maximum(1, rng.gamma(2.0, mean_isl / 2.0, len(arrival))).round()
    osl = np.maximum(1, rng.gamma(2.0, mean_osl / 2.0, len(arrival))).round()
    return make_trace((arrival - arrival[0]).tolist(), isl.tolist(), osl.tolist())


@settings(max_examples=12, deadline=None)
@given(
    rate_rps=st.floats(2.0, 40.0),
    mean_isl=st.floats(200.0, 4000.0),
    mean_osl=st.floats(20.0, 600.0),
    seed=st.integers(0, 2**16),
)
def test_steady_load_does_not_flap(rate_rps: float, mean_isl: float, mean_osl: float, seed: int) -> None:
    """Throughput ticks on windows of the same steady load, each applied at once: after a warm-up of a few windows
    the targets of each pool never reverse direction (no up then down, no down then up), and change at most once.
    The observations come the way a live source makes them (`RequestTrace.observe`, `Planner.observed`)."""
    trace = steady_trace(rate_rps, mean_isl, mean_osl, seed)
    window_s = float(PLANNER.config.throughput_adjustment_interval_seconds)
    state, prefill, decode = PlannerState(), 1, 1
    sizes = []
    for k in range(1, NUM_WINDOWS + 1):
        start_s, end_s = (k - 1) * window_s, k * window_s
        traffic = PLANNER.observed(trace.observe(start_s, end_s), trace.arrivals(start_s, end_s), start_s, end_s)
        workers = WorkerCounts(ready_prefill=prefill, ready_decode=decode, expected_prefill=prefill,
                               expected_decode=decode)  # fmt: skip
        outcome = PLANNER.decide(TickInputs(now_s=end_s, loop=Loop.THROUGHPUT, workers=workers, traffic=traffic), state)
        state = outcome.next_state
        if outcome.decision.num_prefill is not None:
            prefill = outcome.decision.num_prefill
        if outcome.decision.num_decode is not None:
            decode = outcome.decision.num_decode
        sizes.append((prefill, decode))
    for pool in (0, 1):
        settled = [size[pool] for size in sizes[WARM_UP_WINDOWS:]]
        steps = [b - a for a, b in zip(settled, settled[1:], strict=False) if b != a]
        assert len(steps) <= 1, f"pool {pool} flaps at steady load: {settled}"
