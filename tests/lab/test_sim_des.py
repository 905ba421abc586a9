"""The discrete-event cluster simulator on hand-checkable cases (a linear forward-pass model: pure logic)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from planner_core.domain import Component, EngineLimits
from planner_core.lab.sim.des import ClusterSimulator, RouterPolicy, SimSpec
from planner_core.traces import RequestTrace
from tests.core.fakes import FWD, make_trace

# The first token when the prefill (plus transfer) ends, so TTFT is the prefill alone: for tests of the prefill
# engines. The default spec has the decode engine emit it (one decode iteration later).
PREFILL_END = SimSpec(first_token_from_decode=False)


def run(trace: RequestTrace, spec: SimSpec | None = None, *, num_prefill: int = 1, num_decode: int = 1):
    sim = ClusterSimulator(trace, FWD, spec or SimSpec(), num_prefill=num_prefill, num_decode=num_decode)
    sim.run_to_completion()
    return sim, sim.result()


def test_single_request_latencies() -> None:
    # prefill 1000 tokens: 0.010 + 0.01 = 0.020 s (no transfer cost); the decode engine then runs all 100 output
    # tokens in one segment at the midpoint KV 1000 + 100 / 2 = 1050: 0.005 + 1e-4 + 1050e-8 = 0.0051105 s each.
    # TTFT = 0.020 + 0.0051105 (the first decode iteration); the other 99 tokens follow one iteration apart.
    _, result = run(make_trace([0.0], [1000], [100]))
    iter_s = 0.005 + 1e-4 + 1050e-8
    assert result.ttft_s[0] == pytest.approx(0.020 + iter_s)
    assert result.itl_s[0] == pytest.approx(iter_s)
    assert result.finish_s[0] == pytest.approx(0.020 + 100 * iter_s)


def test_single_request_latencies_first_token_at_prefill_end() -> None:
    # TTFT 20 ms (the prefill); decode 99 iterations at the midpoint KV 1000 + 99 / 2 = 1049.5:
    # 0.005 + 1e-4 + 1049.5e-8 = 0.0051104950 s per token
    _, result = run(make_trace([0.0], [1000], [100]), PREFILL_END)
    assert result.ttft_s[0] == pytest.approx(0.020)
    iter_s = 0.005 + 1e-4 + 1049.5e-8
    assert result.itl_s[0] == pytest.approx(iter_s)
    assert result.finish_s[0] == pytest.approx(0.020 + 99 * iter_s)


def test_one_token_request_still_passes_through_decode() -> None:
    # OSL 1: prefill 0.020 s, then one decode iteration at KV 1000 + 1/2: 0.005 + 1e-4 + 1000.5e-8 s, which is
    # both the first and the last token. At prefill end instead, it is done with the prefill.
    iter_s = 0.005 + 1e-4 + 1000.5e-8
    _, result = run(make_trace([0.0], [1000], [1]))
    assert (result.ttft_s[0], result.finish_s[0]) == pytest.approx((0.020 + iter_s, 0.020 + iter_s))
    assert np.isnan(result.itl_s[0])
    _, result = run(make_trace([0.0], [1000], [1]), PREFILL_END)
    assert (result.ttft_s[0], result.finish_s[0]) == pytest.approx((0.020, 0.020))


def test_kv_transfer_adds_to_ttft() -> None:
    # 1000 tokens * 20 us = 20 ms on top of the 20 ms prefill
    _, result = run(
        make_trace([0.0], [1000], [10]), SimSpec(kv_transfer_s_per_token=20e-6, first_token_from_decode=False)
    )
    assert result.ttft_s[0] == pytest.approx(0.040)


def test_chunked_prefill_splits_at_max_num_batched_tokens() -> None:
    # A 20,000-token prompt runs as chunks of 8192 + 8192 + 3616: 3 * 0.010 + 20,000e-5 = 0.23 s.
    _, result = run(make_trace([0.0], [20_000], [2]), PREFILL_END)
    assert result.ttft_s[0] == pytest.approx(0.23)


def test_prompts_share_a_chunk_while_the_engine_is_busy() -> None:
    # Request 0 (6000 tokens) starts alone at t=0 and ends at 0.010 + 0.06 = 0.07 s. Requests 1 and 2 arrive at
    # 0.01 s while it runs; the next chunk takes all 6000 of request 1 and 2192 of request 2 (0.010 + 0.08192 s),
    # the last one the remaining 3808 tokens of request 2 (0.010 + 0.03808 s).
    trace = make_trace([0.0, 0.01, 0.01], [6000, 6000, 6000], [2, 2, 2])
    _, result = run(trace, PREFILL_END)
    second_end = 0.07 + 0.010 + 8192e-5
    assert result.ttft_s.tolist() == pytest.approx([0.07, second_end - 0.01, second_end + 0.010 + 3808e-5 - 0.01])


def test_max_num_seqs_limits_a_prefill_chunk() -> None:
    # max_num_seqs 1: each 100-token prompt is its own iteration of 0.010 + 0.001 s.
    spec = SimSpec(prefill_limits=EngineLimits(max_num_seqs=1), first_token_from_decode=False)
    _, result = run(make_trace([0.0, 0.0, 0.0], [100, 100, 100], [2, 2, 2]), spec)
    assert result.ttft_s.tolist() == pytest.approx([0.011, 0.022, 0.033])


def test_a_request_joining_mid_segment_starts_at_the_next_iteration() -> None:
    # Request 0 decodes alone: iterations of 0.005 + 1e-4 + (1000 + 499/2)e-8 s from t = 0.020 (its TTFT).
    # Request 1 arrives at 0.5 s; its prefill ends at 0.520 s and it joins request 0's batch at the end of the
    # iteration in progress then. Both finish, and request 0's ITL grows because the batch grew.
    trace = make_trace([0.0, 0.5], [1000, 1000], [500, 500])
    _, result = run(trace, PREFILL_END)
    alone_iter_s = 0.005 + 1e-4 + (1000 + 499 / 2) * 1e-8
    assert result.ttft_s[1] == pytest.approx(0.020)
    joined_iters = math.floor((0.520 - 0.020) / alone_iter_s) + 1
    assert joined_iters < 499
    assert result.itl_s[0] > alone_iter_s
    assert np.all(np.isfinite(result.finish_s))
    # request 0 produced `joined_iters` tokens alone, then ran in a batch of two until its 499th token
    assert result.finish_s[0] > 0.020 + 499 * alone_iter_s


def test_kv_capacity_makes_requests_wait_for_a_slot() -> None:
    # KV cache of 1500 tokens: request 1 (footprint 1000 + 100) cannot join request 0 (1100) and waits for it.
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=1500))
    _, result = run(make_trace([0.0, 0.0], [1000, 1000], [100, 100]), spec)
    assert result.finish_s[1] > result.finish_s[0]
    # its first token comes from the decode engine, so the wait for the slot is part of its TTFT
    assert result.ttft_s[1] > result.finish_s[0]
    # with the first token at prefill end, the wait shows in its mean ITL instead
    _, result = run(
        make_trace([0.0, 0.0], [1000, 1000], [100, 100]), dataclasses.replace(spec, first_token_from_decode=False)
    )
    assert result.itl_s[1] > 1.5 * result.itl_s[0]


def test_startup_delay_and_gpu_seconds() -> None:
    # One decode worker from t=0 and a second requested at t=10 with a 120 s start-up: the second is not ready at
    # 100 s, ready at 130 s. GPU-seconds count the starting worker.
    trace = make_trace([0.0, 200.0], [100, 100], [2, 2])
    sim = ClusterSimulator(trace, FWD, SimSpec(startup_s=120.0), num_prefill=1, num_decode=1)
    sim.run_until(10.0)
    sim.set_targets(None, 2)
    sim.run_until(100.0)
    assert (sim.worker_counts().ready_decode, sim.worker_counts().expected_decode) == (1, 2)
    sim.run_until(130.0)
    assert sim.worker_counts().ready_decode == 2
    # 1 prefill + 1 decode for 130 s, plus the second decode worker from 10 s: 260 + 120 = 380 GPU-seconds
    assert sim.result().gpu_s == pytest.approx(380.0)


def test_scale_down_cancels_starting_workers_first_then_drains() -> None:
    trace = make_trace([0.0], [100], [1000])
    sim = ClusterSimulator(trace, FWD, SimSpec(startup_s=60.0), num_prefill=1, num_decode=2)
    sim.run_until(1.0)
    sim.set_targets(None, 3)  # one starting
    sim.set_targets(None, 1)  # cancels the starting one, then drains one ready worker
    counts = sim.worker_counts()
    assert (counts.ready_decode, counts.expected_decode) == (1, 1)
    sim.run_to_completion()
    assert np.isfinite(sim.result().finish_s[0])  # the request on a draining worker still finishes


@pytest.mark.parametrize("router", [RouterPolicy.ROUND_ROBIN, RouterPolicy.LEAST_LOADED])  # slo: test_sim_routing
def test_routers_spread_requests(router: RouterPolicy) -> None:
    trace = make_trace([0.0] * 8, [4000] * 8, [2] * 8)
    sim, result = run(trace, SimSpec(router=router, first_token_from_decode=False), num_prefill=4)
    # 8 prompts of 4000 tokens at t=0 on 4 engines, 2 per engine: the first starts alone (0.010 + 0.04 s), the
    # second follows it (0.1 s).
    assert sorted(result.ttft_s.tolist()) == pytest.approx([0.05] * 4 + [0.1] * 4)
    assert {f.component for f in sim.latest_fpm()} == {Component.PREFILL, Component.DECODE}


def test_deterministic() -> None:
    rng = np.random.default_rng(7)
    arrivals = np.sort(rng.uniform(0, 60, 300)).tolist()
    trace = make_trace(arrivals, rng.integers(100, 4000, 300).tolist(), rng.integers(2, 400, 300).tolist())
    first, second = run(trace, num_prefill=2, num_decode=2)[1], run(trace, num_prefill=2, num_decode=2)[1]
    assert np.array_equal(first.finish_s, second.finish_s)
    assert np.all(np.isfinite(first.finish_s))


@pytest.mark.parametrize(
    ("until_s", "first_known"),
    [
        (0.022, False),  # prefill done at 0.020 s; the first decode iteration ends at 0.0251105 s
        (0.026, True),  # that iteration is over: its end is the first token, though the segment runs on
    ],
)
def test_request_times_give_a_first_token_once_its_iteration_is_over(until_s: float, first_known: bool) -> None:
    # As in test_single_request_latencies: one segment of 100 iterations of 0.0051105 s from 0.020 s. The segment
    # stamps its first token when it ends (0.53105 s), so `result()` has none yet; `request_times` fills it in.
    sim = ClusterSimulator(make_trace([0.0], [1000], [100]), FWD, SimSpec(), num_prefill=1, num_decode=1)
    sim.run_until(until_s)
    assert np.isnan(sim.result().ttft_s[0])
    first_s, finish_s, cached = sim.request_times(np.array([0]))
    assert np.isnan(finish_s[0]) and cached[0] == 0
    if first_known:
        assert first_s[0] == pytest.approx(0.020 + 0.005 + 1e-4 + 1050e-8)
    else:
        assert np.isnan(first_s[0])
