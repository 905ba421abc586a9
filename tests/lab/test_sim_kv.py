"""The simulator's KV allocation (`SimSpec.kv_allocation`) on hand-checkable cases: RESERVE holds a request's
whole footprint (ISL + OSL) from admission, ON_DEMAND its prompt plus one token per iteration, preempting the
newest request when the next iteration's growth does not fit. Linear forward-pass model of `test_sim_des`:
prefill 0.010 + 1e-5 s per token; decode 0.005 + 1e-4 s per request + 1e-8 s per KV token (a segment uses its
midpoint KV); a mixed iteration is the sum of both."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner_core.domain import EngineLimits
from planner_core.lab.sim.des import ClusterSimulator, KvAllocation, SimSpec
from planner_core.traces import RequestTrace
from tests.core.fakes import FWD, make_trace
from tests.lab.test_sim_engines import hashed_trace


def prefill_s(tokens: float) -> float:
    return 0.010 + tokens * 1e-5


def decode_s(requests: float, kv_tokens: float) -> float:
    return 0.005 + requests * 1e-4 + kv_tokens * 1e-8


def spec(allocation: KvAllocation, *, aggregated: bool = False, max_kv: int = 2300, watermark: float = 0.0) -> SimSpec:
    return SimSpec(
        decode_limits=EngineLimits(max_kv_tokens=max_kv),
        kv_allocation=allocation,
        kv_watermark=watermark,
        aggregated=aggregated,
    )


def run(trace: RequestTrace, sim_spec: SimSpec):
    sim = ClusterSimulator(trace, FWD, sim_spec, num_prefill=0 if sim_spec.aggregated else 1, num_decode=1)
    sim.run_to_completion()
    return sim.result()


TWO = make_trace([0.0, 0.0], [1000, 1000], [200, 200])

# Two requests of ISL 1000 / OSL 200 on one engine with a cache of 2300 tokens (no watermark).
# Disaggregated (the first token from the decode engine): request 0's prompt is prefilled in [0, 0.020], request 1's
# in [0.020, 0.040]. Request 0 decodes alone from 0.020 in iterations of decode_s(1, 1000 + 200 / 2).
R0_ALONE_S = decode_s(1, 1100)
# RESERVE: 1200 + 1200 > 2300, so request 1 waits for request 0. Its arrival at 0.040 (inside request 0's 4th
# iteration: 0.020 / 0.005111 = 3.9) still cuts request 0's segment at B = 0.020 + 4 iterations; request 0's other
# 196 tokens run at decode_s(1, 1004 + 196 / 2). Request 1 then decodes its 200 alone (first one after one iteration).
OD_B = 0.020 + 4 * R0_ALONE_S
RESERVE_R0_END = OD_B + 196 * decode_s(1, 1004 + 98)
RESERVE_R1_END = RESERVE_R0_END + 200 * R0_ALONE_S
# ON_DEMAND: request 1 joins at the boundary B (1004 + 1 + 1000 <= 2300). The batch of two holds 2004
# tokens and grows by 2 per iteration: (2300 - 2004) // 2 = 148 iterations fit, at decode_s(2, 2004 + 148).
# Then the next iteration would need 2302 > 2300: request 1 (the newest) is preempted holding 1000 + 148 tokens
# and owing 200 - 148 = 52 tokens. Request 0 finishes its last 200 - 152 = 48 tokens alone at
# decode_s(1, 1152 + 24); then request 1 recomputes its 1148 tokens (a prefill, which yields a token) and decodes
# the other 51 at decode_s(1, 1148 + 51 / 2).
OD_PAIR_S = decode_s(2, 2004 + 148)
OD_PREEMPT_S = OD_B + 148 * OD_PAIR_S
OD_R0_END = OD_PREEMPT_S + 48 * decode_s(1, 1152 + 24)
OD_R1_END = OD_R0_END + prefill_s(1148) + 51 * decode_s(1, 1148 + 25.5)

# Aggregated: request 0's prompt alone [0, 0.020] (its first token).
# RESERVE: 2400 > 2300, request 1's prompt waits for request 0's 199 decode iterations at decode_s(1, 1000 + 99.5).
AGG_RESERVE_R0_END = 0.020 + 199 * decode_s(1, 1099.5)
AGG_RESERVE_R1_END = AGG_RESERVE_R0_END + prefill_s(1000) + 199 * decode_s(1, 1099.5)
# ON_DEMAND: request 1's prompt rides one mixed iteration with request 0's 2nd token (prefill_s(1000) +
# decode_s(1, 1000)), its first token at A. The batch then holds 1001 + 1000 = 2001 tokens; (2300 - 2001) // 2 =
# 149 iterations fit at decode_s(2, 2001 + 149); request 1 is then preempted holding 1000 + 149 tokens and owing
# 200 - 1 - 149 = 50.
# Request 0 does its last 199 - 150 = 49 tokens alone at decode_s(1, 1150 + 24.5); request 1 recomputes 1149 tokens
# (one token) and decodes 49 more at decode_s(1, 1149 + 24.5).
AGG_A = 0.020 + prefill_s(1000) + decode_s(1, 1000)
AGG_OD_R0_END = AGG_A + 149 * decode_s(2, 2150) + 49 * decode_s(1, 1174.5)
AGG_OD_R1_END = AGG_OD_R0_END + prefill_s(1149) + 49 * decode_s(1, 1173.5)


@pytest.mark.parametrize(
    ("aggregated", "allocation", "first_token_s", "finish_s", "preemptions"),
    [
        (
            False,
            KvAllocation.RESERVE,
            [0.020 + R0_ALONE_S, RESERVE_R0_END + R0_ALONE_S],
            [RESERVE_R0_END, RESERVE_R1_END],
            0,
        ),
        (False, KvAllocation.ON_DEMAND, [0.020 + R0_ALONE_S, OD_B + OD_PAIR_S], [OD_R0_END, OD_R1_END], 1),
        (
            True,
            KvAllocation.RESERVE,
            [0.020, AGG_RESERVE_R0_END + prefill_s(1000)],
            [AGG_RESERVE_R0_END, AGG_RESERVE_R1_END],
            0,
        ),
        (True, KvAllocation.ON_DEMAND, [0.020, AGG_A], [AGG_OD_R0_END, AGG_OD_R1_END], 1),
    ],
)
def test_reserve_waits_on_demand_runs_both_then_preempts_the_newest(
    aggregated: bool, allocation: KvAllocation, first_token_s: list[float], finish_s: list[float], preemptions: int
) -> None:
    result = run(TWO, spec(allocation, aggregated=aggregated))
    assert result.ttft_s.tolist() == pytest.approx(first_token_s, abs=1e-9)
    assert result.finish_s.tolist() == pytest.approx(finish_s, abs=1e-9)
    assert result.num_preemptions == preemptions
    # ITL is still (last token - first token) / (OSL - 1): a preempted request's stall and recompute are in it
    expected_itl = (np.asarray(finish_s) - np.asarray(first_token_s)) / 199
    assert result.itl_s.tolist() == pytest.approx(expected_itl.tolist(), abs=1e-9)


def test_on_demand_serves_the_pair_sooner() -> None:
    # The point of the option: the second request starts at once instead of after the first one's 200 tokens.
    reserve, on_demand = run(TWO, spec(KvAllocation.RESERVE)), run(TWO, spec(KvAllocation.ON_DEMAND))
    assert on_demand.ttft_s[1] < 0.1 < 1.0 < reserve.ttft_s[1]
    assert on_demand.finish_s.max() < reserve.finish_s.max()


@pytest.mark.parametrize(
    ("watermark", "admitted_at_once"),
    [
        # headroom 0.1 * 2300 = 230: 1004 + 1 + 1000 = 2005 <= 2300 - 230 = 2070, request 1 joins at once
        (0.1, True),
        # headroom 0.2 * 2300 = 460: 2005 > 1840, request 1 waits for request 0 to finish (and is never preempted)
        (0.2, False),
    ],
)
def test_watermark_keeps_headroom_at_admission(watermark: float, admitted_at_once: bool) -> None:
    result = run(TWO, spec(KvAllocation.ON_DEMAND, watermark=watermark))
    assert bool(result.ttft_s[1] < 0.1) is admitted_at_once
    assert result.num_preemptions == (1 if admitted_at_once else 0)


def test_on_demand_without_pressure_matches_reserve() -> None:
    # A cache far larger than both footprints: nothing waits and nothing is preempted, so the two allocations give
    # the same schedule.
    for aggregated in (False, True):
        reserve = run(TWO, spec(KvAllocation.RESERVE, aggregated=aggregated, max_kv=100_000))
        on_demand = run(TWO, spec(KvAllocation.ON_DEMAND, aggregated=aggregated, max_kv=100_000))
        assert on_demand.num_preemptions == 0
        np.testing.assert_allclose(on_demand.finish_s, reserve.finish_s, rtol=1e-12)
        np.testing.assert_allclose(on_demand.ttft_s, reserve.ttft_s, rtol=1e-12)


def _busy_trace() -> RequestTrace:
    rng = np.random.default_rng(7)
    count = 60
    arrival = np.sort(rng.uniform(0.0, 2.0, count))
    return make_trace(arrival.tolist(), rng.integers(200, 3000, count).tolist(), rng.integers(1, 400, count).tolist())


@pytest.mark.parametrize(
    "variant",
    [
        {"aggregated": False},
        {"aggregated": True},
        {"aggregated": False, "first_token_from_decode": False},
        {"aggregated": False, "recompute_after_handoffs": True},
    ],
)
def test_on_demand_under_pressure_finishes_everything_deterministically(variant: dict) -> None:
    # 60 requests on one engine with a 6000-token cache: many preemptions; every request still produces all its
    # tokens (finite finish, first token before it), and a second run is identical.
    trace = _busy_trace()
    sim_spec = dataclasses.replace(spec(KvAllocation.ON_DEMAND, max_kv=6000), **variant)
    first, second = run(trace, sim_spec), run(trace, sim_spec)
    assert first.num_preemptions > 5
    assert np.all(np.isfinite(first.finish_s))
    assert np.all(first.ttft_s <= first.finish_s - np.asarray(trace.arrival_s) + 1e-12)
    assert first.num_preemptions == second.num_preemptions
    np.testing.assert_array_equal(first.finish_s, second.finish_s)
    np.testing.assert_array_equal(first.ttft_s, second.ttft_s)


def test_a_request_larger_than_the_cache_runs_alone() -> None:
    # ISL 3000 + OSL 50 on a 2300-token cache: an idle engine admits it and it is never preempted (nothing else
    # could make room), so it finishes; the small request after it waits.
    trace = make_trace([0.0, 0.001], [3000, 100], [50, 5])
    result = run(trace, spec(KvAllocation.ON_DEMAND))
    assert np.all(np.isfinite(result.finish_s))
    assert result.num_preemptions == 0
    assert result.ttft_s[1] + 0.001 > result.finish_s[0]


@pytest.mark.parametrize(("after_handoffs", "third_waits"), [(False, True), (True, False)])
def test_preempted_request_blocks_the_queue_unless_handoffs_go_first(after_handoffs: bool, third_waits: bool) -> None:
    # The disaggregated pair above, plus request 2 (1000 / 200) arriving at 0.85 s: its prompt reaches the decode
    # engine at 0.87 s, while request 1 (preempted at OD_PREEMPT_S = 0.813 s) waits to recompute 1148 tokens beside
    # request 0, which holds 1152 + (0.87 - 0.813) / 0.0051 = ~1163 tokens. 1163 + 1 + 1148 > 2300, so vLLM's single
    # queue (preempted request at its head) keeps request 2 waiting until request 0 is done (1.06 s); with
    # `recompute_after_handoffs` request 2 (1163 + 1 + 1000 <= 2300) joins at once and request 1 waits.
    trace = make_trace([0.0, 0.0, 0.85], [1000, 1000, 1000], [200, 200, 200])
    sim_spec = SimSpec(
        decode_limits=EngineLimits(max_kv_tokens=2300),
        kv_allocation=KvAllocation.ON_DEMAND,
        kv_watermark=0.0,
        recompute_after_handoffs=after_handoffs,
    )
    result = run(trace, sim_spec)
    assert bool(result.ttft_s[2] > OD_R0_END - 0.85) is third_waits
    assert bool(result.ttft_s[2] < 0.05) is not third_waits
    assert np.all(np.isfinite(result.finish_s))
    assert result.num_preemptions >= 1


def test_aggregated_recompute_skips_prompt_blocks_still_cached() -> None:
    # The aggregated pair above with prefix blocks (two 512-token blocks per 1000-token prompt, none shared).
    # Request 1 is preempted holding 1149 tokens; its two prompt blocks are still in the engine's prefix cache, so
    # its recompute computes 1149 - 1000 = 149 tokens instead of 1149: prefill_s(149) is 1000 * 1e-5 = 0.010 s
    # shorter, and everything after it moves 0.010 s earlier.
    trace = hashed_trace([0.0, 0.0], [1000, 1000], [[0, 1], [2, 3]], osl=200)
    cached = run(trace, spec(KvAllocation.ON_DEMAND, aggregated=True))
    uncached = run(trace, dataclasses.replace(spec(KvAllocation.ON_DEMAND, aggregated=True), prefix_caching=False))
    assert cached.num_preemptions == uncached.num_preemptions == 1
    assert uncached.finish_s[1] == pytest.approx(AGG_OD_R1_END, abs=1e-9)
    assert cached.finish_s[1] == pytest.approx(AGG_OD_R1_END - 0.010, abs=1e-9)
    assert cached.finish_s[0] == pytest.approx(uncached.finish_s[0], abs=1e-12)
