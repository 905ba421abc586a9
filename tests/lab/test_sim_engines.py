"""The simulator's aggregated engines and prefix caching on hand-checkable cases (the linear forward-pass model of
`test_sim_des`: prefill 0.010 + 1e-5 s per token; decode 0.005 + 1e-4 s per request + 1e-8 s per KV token; a mixed
iteration is the sum of both)."""

from __future__ import annotations

import numpy as np
import pytest

from planner_core.domain import Component, EngineLimits
from planner_core.lab.sim.des import ClusterSimulator, SimSpec
from planner_core.traces import RequestTrace
from tests.core.fakes import FWD, make_trace
from tests.lab.test_sim_des import PREFILL_END

AGG = SimSpec(aggregated=True)


def prefill_s(tokens: float) -> float:
    return 0.010 + tokens * 1e-5


def decode_s(requests: float, kv_tokens: float) -> float:
    return 0.005 + requests * 1e-4 + kv_tokens * 1e-8


def run_agg(trace: RequestTrace, spec: SimSpec = AGG, num_engines: int = 1):
    sim = ClusterSimulator(trace, FWD, spec, num_prefill=0, num_decode=num_engines)
    sim.run_to_completion()
    return sim, sim.result()


# --- aggregated engines -------------------------------------------------------------------------------------


def test_agg_single_request() -> None:
    # The prompt alone: one prefill-only iteration of 1000 tokens (0.020 s) that also yields the first token; then
    # 99 decode iterations at the midpoint KV 1000 + 99 / 2.
    _, result = run_agg(make_trace([0.0], [1000], [100]))
    iter_s = decode_s(1, 1000 + 99 / 2)
    assert result.ttft_s[0] == pytest.approx(prefill_s(1000))
    assert result.itl_s[0] == pytest.approx(iter_s)
    assert result.finish_s[0] == pytest.approx(prefill_s(1000) + 99 * iter_s)


@pytest.mark.parametrize(
    ("max_batched", "chunks"),
    [
        # budget 8192 - 1 decoding request: the whole 1000-token prompt in one mixed iteration
        (8192, [1000]),
        # budget 600 - 1: chunks of 599 and 401 (and request 0's own prompt took 600 + 400 before)
        (600, [599, 401]),
    ],
)
def test_agg_prompt_piggybacks_on_the_decode_batch(max_batched: int, chunks: list[int]) -> None:
    # Request 0 (1000 / 500) decodes alone from its first token on, in iterations of decode_s(1, 1000 + 499 / 2).
    # Request 1 arrives at 0.1 s, in the middle of an iteration; from the end of that iteration (the 16th or 14th
    # of the segment, kv = 1000 + that count) its prompt is computed in mixed iterations, each also decoding one
    # token of request 0 (so kv grows by one per iteration); its first token is at the end of the last one.
    spec = SimSpec(aggregated=True, decode_limits=EngineLimits(max_num_batched_tokens=max_batched))
    first_token_0 = sum(prefill_s(t) for t in ((1000,) if max_batched > 1000 else (600, 400)))
    alone_s = decode_s(1, 1000 + 499 / 2)
    done = int((0.1 - first_token_0) // alone_s) + 1
    at_s = first_token_0 + done * alone_s
    for step, tokens in enumerate(chunks):
        at_s += prefill_s(tokens) + decode_s(1, 1000 + done + step)
    _, result = run_agg(make_trace([0.0, 0.1], [1000, 1000], [500, 10]), spec)
    assert result.ttft_s[0] == pytest.approx(first_token_0)
    assert result.ttft_s[1] == pytest.approx(at_s - 0.1)
    # request 0's gaps include the slower mixed iterations
    assert result.itl_s[0] > alone_s


def test_agg_kv_capacity_makes_a_prompt_wait() -> None:
    # KV cache of 1500 tokens: request 1 (1000 + 100) is admitted only once request 0 (1100) is done.
    spec = SimSpec(aggregated=True, decode_limits=EngineLimits(max_kv_tokens=1500))
    _, result = run_agg(make_trace([0.0, 0.0], [1000, 1000], [100, 100]), spec)
    assert result.ttft_s[1] == pytest.approx(result.finish_s[0] + prefill_s(1000))


def test_agg_max_num_seqs_counts_prefilling_and_running() -> None:
    # max_num_seqs 1: the second prompt waits for the first request to finish decoding.
    spec = SimSpec(aggregated=True, decode_limits=EngineLimits(max_num_seqs=1))
    _, result = run_agg(make_trace([0.0, 0.0], [100, 100], [5, 5]), spec)
    assert result.ttft_s[1] == pytest.approx(result.finish_s[0] + prefill_s(100))


def test_agg_reports_mixed_forward_passes_and_refuses_a_prefill_pool() -> None:
    sim = ClusterSimulator(make_trace([0.0], [1000], [10]), FWD, AGG, num_prefill=0, num_decode=1)
    sim.run_until(0.01)  # inside the 0.020 s prefill iteration
    (fpm,) = sim.latest_fpm()
    assert fpm.component is Component.DECODE
    assert (fpm.scheduled.sum_prefill_tokens, fpm.wall_time_s) == (1000, pytest.approx(prefill_s(1000)))
    with pytest.raises(ValueError, match="num_prefill must be 0"):
        sim.set_targets(1, None)
    with pytest.raises(ValueError, match="num_prefill must be 0"):
        ClusterSimulator(make_trace([0.0], [10], [10]), FWD, AGG, num_prefill=1, num_decode=1)


def test_agg_scales_and_drains() -> None:
    trace = make_trace([0.0, 50.0, 50.0], [1000, 1000, 1000], [2000, 10, 10])
    sim = ClusterSimulator(trace, FWD, SimSpec(aggregated=True, startup_s=10.0), num_prefill=0, num_decode=1)
    sim.run_until(1.0)
    sim.set_targets(None, 2)
    sim.run_until(20.0)
    assert sim.worker_counts().ready_decode == 2
    sim.set_targets(None, 1)  # drains the less loaded (the new, idle) engine at once
    assert sim.worker_counts().ready_decode == 1
    sim.run_to_completion()
    assert np.all(np.isfinite(sim.result().finish_s))


# --- prefix caching -----------------------------------------------------------------------------------------


def hashed_trace(arrival_s: list[float], isl: list[int], blocks: list[list[int]], osl: int = 2) -> RequestTrace:
    base = make_trace(arrival_s, isl, [osl] * len(isl))
    offsets = np.cumsum([0] + [len(b) for b in blocks]).astype(np.int64)
    ids = np.asarray([i for b in blocks for i in b], dtype=np.int64)
    return RequestTrace(
        source="test",
        start_epoch_s=0.0,
        arrival_s=base.arrival_s,
        isl=base.isl,
        osl=base.osl,
        hash_ids=ids,
        hash_offsets=offsets,
    )


@pytest.mark.parametrize(
    ("second_blocks", "cached", "computed"),
    [
        # the same 3 blocks: all of the prompt is cached but one token, which is computed
        ([1, 2, 3], 1535, 1),
        # the first two blocks match: 1024 cached, 512 computed
        ([1, 2, 9], 1024, 512),
        # a prefix match needs the first block
        ([9, 2, 3], 0, 1536),
    ],
)
def test_prefix_hits_skip_cached_blocks(second_blocks: list[int], cached: int, computed: int) -> None:
    trace = hashed_trace([0.0, 1.0], [1536, 1536], [[1, 2, 3], second_blocks])
    for spec, num_prefill, num_decode in ((PREFILL_END, 1, 1), (AGG, 0, 1)):
        sim = ClusterSimulator(trace, FWD, spec, num_prefill=num_prefill, num_decode=num_decode)
        sim.run_to_completion()
        result = sim.result()
        assert result.cached_tokens.tolist() == [0, cached]
        assert result.ttft_s[1] == pytest.approx(prefill_s(computed))


def test_prefix_caching_is_optional() -> None:
    trace = hashed_trace([0.0, 1.0], [1536, 1536], [[1, 2, 3], [1, 2, 3]])
    sim = ClusterSimulator(trace, FWD, SimSpec(prefix_caching=False), num_prefill=1, num_decode=1)
    sim.run_to_completion()
    assert sim.result().cached_tokens.tolist() == [0, 0]


def test_prefix_is_looked_up_when_the_request_is_scheduled() -> None:
    # Both arrive at 0; max_num_seqs 1 makes the second wait until the first is computed (0.010 + 0.01536 s), and
    # when it is scheduled then, the first one's blocks are in the cache.
    spec = SimSpec(prefill_limits=EngineLimits(max_num_seqs=1), first_token_from_decode=False)
    trace = hashed_trace([0.0, 0.0], [1536, 1536], [[1, 2, 3], [1, 2, 3]])
    sim = ClusterSimulator(trace, FWD, spec, num_prefill=1, num_decode=1)
    sim.run_to_completion()
    assert sim.result().ttft_s[1] == pytest.approx(prefill_s(1536) + prefill_s(1))


def test_cache_evicts_a_finished_prompt_tail_first() -> None:
    # Room for 3 blocks. [1, 2, 3] is cached; [4] then evicts one block: block 3 (the tail), not block 1, so
    # [1, 2, 5] still finds 1 and 2.
    spec = SimSpec(prefill_limits=EngineLimits(max_kv_tokens=3 * 512), first_token_from_decode=False)
    trace = hashed_trace([0.0, 1.0, 2.0], [1536, 512, 1536], [[1, 2, 3], [4], [1, 2, 5]])
    sim = ClusterSimulator(trace, FWD, spec, num_prefill=1, num_decode=1)
    sim.run_to_completion()
    assert sim.result().cached_tokens.tolist() == [0, 0, 1024]
