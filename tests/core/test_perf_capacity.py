"""Tests of `planner_core.perf.capacity`: the per-role capacity search and the load-loop estimates (pure logic).

Every case runs on `LinearModel`, a forward-pass model defined here whose times are straight lines, so the expected
batch, latency and rate are worked out by hand in the comments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner_core.domain import (
    Component,
    EngineLimits,
    ReasonCode,
)
from planner_core.perf.capacity import (
    BatchLimit,
    CapacityRole,
    RoleCapacity,
    agg_capacity,
    agg_operating_prompt_rate,
    agg_prompt_rate,
    batch_candidates,
    chunked_prefill_s,
    decode_capacity,
    effective_accept_length,
    effective_kv_hit_rate,
    prefill_capacity,
)


@dataclass(frozen=True)
class LinearModel:
    """wall = base_s + per_token_s * prefill tokens + per_request_s * decode requests + per_kv_s * decode KV tokens."""

    base_s: float = 0.010
    per_token_s: float = 1e-5
    per_request_s: float = 0.0
    per_kv_s: float = 0.0
    ready: bool = True

    def is_ready(self) -> bool:
        return self.ready

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return self.base_s + self.per_token_s * prefill_tokens

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.base_s + self.per_request_s * num_decode_requests + self.per_kv_s * decode_kv_tokens

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return (
            self.prefill_wall_s(prefill_tokens)
            + self.decode_wall_s(num_decode_requests, decode_kv_tokens)
            - self.base_s
        )


PREFILL_MODEL = LinearModel(base_s=0.010, per_token_s=1e-5)  # 10 ms + 0.01 ms per prompt token
DECODE_MODEL = LinearModel(base_s=0.005, per_kv_s=5e-8)  # 5 ms + 0.05 ms per 1000 KV tokens
AGG_MODEL = LinearModel(base_s=0.005, per_token_s=1e-5, per_kv_s=5e-8)


# --------------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------------


def test_batch_candidates_all_up_to_128_then_128_spaced() -> None:
    """Up to 128 every size; beyond, 128 sizes 1 + i*(max-1)//127 including both ends (Dynamo's spacing)."""
    assert batch_candidates(0) == ()
    assert batch_candidates(5) == (1, 2, 3, 4, 5)
    assert batch_candidates(128) == tuple(range(1, 129))
    spaced = batch_candidates(512)
    assert len(spaced) == 128 and spaced[0] == 1 and spaced[-1] == 512
    assert spaced[40] == 1 + 40 * 511 // 127 == 161  # 20440 // 127 = 160
    assert list(spaced) == sorted(set(spaced))


@pytest.mark.parametrize(
    ("tokens", "want_s"),
    [
        (0, 0.0),
        (1000, 0.010 + 0.010),  # one chunk: 10 ms + 1000 * 0.01 ms
        (8192, 0.010 + 0.08192),  # exactly one full chunk, no tail
        (20000, 2 * (0.010 + 0.08192) + (0.010 + 0.03616)),  # 2 full chunks of 8192 + tail 3616
    ],
    ids=["nothing", "one-chunk", "one-full-chunk", "two-chunks-and-tail"],
)
def test_chunked_prefill_full_chunks_plus_tail(tokens: int, want_s: float) -> None:
    assert chunked_prefill_s(tokens, 8192, PREFILL_MODEL.prefill_wall_s) == pytest.approx(want_s)


@pytest.mark.parametrize(
    ("raw", "want", "reason"),
    [
        (None, 0.0, ReasonCode.RUNTIME_METADATA_MISSING),
        (math.nan, 0.0, ReasonCode.RUNTIME_METADATA_MISSING),
        (0.3, 0.3, ReasonCode.WITHIN_RANGE),
        (0.99, 0.95, ReasonCode.KV_HIT_RATE_CLAMPED),
        (-0.2, 0.0, ReasonCode.KV_HIT_RATE_CLAMPED),
    ],
)
def test_kv_hit_rate_clamp(raw: float | None, want: float, reason: ReasonCode) -> None:
    """Discounted fraction = clamp(hit, 0, 0.95); unknown = no discount; every outcome has a reason."""
    value, step = effective_kv_hit_rate(raw, Component.PREFILL)
    assert value == want and step.reason is reason and step.value == want and step.component is Component.PREFILL


@pytest.mark.parametrize(
    ("raw", "nextn", "want", "reason"),
    [
        (3.0, 0, 1.0, ReasonCode.SPECULATIVE_DECODING_OFF),  # no speculation: 1 whatever is reported
        (None, 2, 1.0, ReasonCode.RUNTIME_METADATA_MISSING),
        (math.nan, 2, 1.0, ReasonCode.RUNTIME_METADATA_MISSING),
        (2.5, 2, 2.5, ReasonCode.WITHIN_RANGE),  # within [1, nextn + 1 = 3]
        (3.7, 2, 3.0, ReasonCode.ACCEPT_LENGTH_CLAMPED),  # above nextn + 1
        (0.4, 2, 1.0, ReasonCode.ACCEPT_LENGTH_CLAMPED),  # below 1
    ],
)
def test_accept_length_clamp(raw: float | None, nextn: int, want: float, reason: ReasonCode) -> None:
    value, step = effective_accept_length(raw, nextn)
    assert value == want and step.reason is reason


# --------------------------------------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillCase:
    id: str
    isl: float
    ttft_ms: float
    want_batch: int
    want_rps: float
    want_limit: BatchLimit
    want_max_batch: int
    limits: EngineLimits = field(default_factory=EngineLimits)
    hit: float | None = None
    want_reason: ReasonCode = ReasonCode.CAPACITY_SEARCHED


PREFILL_CASES = [
    # MBT 8192 // 1000 = 8 prompts per iteration; ttft(8) = 10 ms + 8000 * 0.01 ms = 90 ms <= 100 -> 8 / 0.09 s
    PrefillCase(
        id="mbt-bound",
        isl=1000,
        ttft_ms=100,
        want_batch=8,
        want_rps=8 / 0.09,
        want_limit=BatchLimit.MAX_NUM_BATCHED_TOKENS,
        want_max_batch=8,
    ),
    # TTFT 50 ms: ttft(4) = 10 + 40 = 50 ms meets it, ttft(5) = 60 ms does not -> 4 / 0.05 s = 80
    PrefillCase(
        id="ttft-bound",
        isl=1000,
        ttft_ms=50,
        want_batch=4,
        want_rps=80.0,
        want_limit=BatchLimit.MAX_NUM_BATCHED_TOKENS,
        want_max_batch=8,
    ),
    # max_num_seqs 3 < 8: ttft(3) = 40 ms -> 3 / 0.04 = 75
    PrefillCase(
        id="max-num-seqs-bound",
        isl=1000,
        ttft_ms=100,
        limits=EngineLimits(max_num_seqs=3),
        want_batch=3,
        want_rps=75.0,
        want_limit=BatchLimit.MAX_NUM_SEQS,
        want_max_batch=3,
    ),
    # hit 0.5: ISL_eff 500, 8192 // 500 = 16; ttft(16) = 10 + 80 = 90 ms -> 16 / 0.09
    PrefillCase(
        id="kv-hit-discount",
        isl=1000,
        ttft_ms=100,
        hit=0.5,
        want_batch=16,
        want_rps=16 / 0.09,
        want_limit=BatchLimit.MAX_NUM_BATCHED_TOKENS,
        want_max_batch=16,
    ),
    # hit 0.99 clamps to 0.95: ISL_eff ceil(1000 * 0.05) = 50, 8192 // 50 = 163 (spaced candidates, 163 included);
    # ttft(163) = 10 + 163 * 50 * 0.01 = 91.5 ms -> 163 / 0.0915
    PrefillCase(
        id="kv-hit-clamped",
        isl=1000,
        ttft_ms=100,
        hit=0.99,
        want_batch=163,
        want_rps=163 / 0.0915,
        want_limit=BatchLimit.MAX_NUM_BATCHED_TOKENS,
        want_max_batch=163,
    ),
    # ISL 20000 > MBT 8192: batch 1 in 2 full chunks + a 3616-token tail:
    # 2 * (10 + 81.92) + (10 + 36.16) = 230 ms > 200 ms target -> unreachable, 1 / 0.23 s
    PrefillCase(
        id="chunked-long-prompt",
        isl=20000,
        ttft_ms=200,
        want_batch=1,
        want_rps=1 / 0.23,
        want_limit=BatchLimit.PROMPT_EXCEEDS_BUDGET,
        want_max_batch=1,
        want_reason=ReasonCode.SLA_UNREACHABLE,
    ),
    # TTFT 15 ms: even ttft(1) = 20 ms misses; the closest (lowest TTFT) batch 1 is used: 1 / 0.02 = 50
    PrefillCase(
        id="unreachable-uses-closest",
        isl=1000,
        ttft_ms=15,
        want_batch=1,
        want_rps=50.0,
        want_limit=BatchLimit.MAX_NUM_BATCHED_TOKENS,
        want_max_batch=8,
        want_reason=ReasonCode.SLA_UNREACHABLE,
    ),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: c.id)
def test_prefill_capacity(case: PrefillCase) -> None:
    capacity = prefill_capacity(PREFILL_MODEL, case.limits, isl=case.isl, ttft_ms=case.ttft_ms, kv_hit_rate=case.hit)
    assert capacity.role is CapacityRole.PREFILL
    assert (capacity.batch_size, capacity.max_batch_size, capacity.batch_limit) == (
        case.want_batch,
        case.want_max_batch,
        case.want_limit,
    )
    assert capacity.requests_per_s == pytest.approx(case.want_rps)
    assert capacity.tokens_per_s_per_gpu == pytest.approx(case.want_rps * case.isl)  # raw ISL tokens of demand
    assert capacity.reason is case.want_reason and capacity.usable
    assert capacity.sla_met == (case.want_reason is ReasonCode.CAPACITY_SEARCHED)
    assert capacity.latency_ms == capacity.ttft_ms and capacity.itl_ms is None
    assert capacity.steps[0].step == "kv_hit_rate" and capacity.steps[-1].reason is case.want_reason
    assert capacity.steps[-1].value == capacity.requests_per_s and capacity.detail == capacity.steps[-1].detail


def test_prefill_per_gpu_divides_by_engine_width() -> None:
    """Two GPUs per engine: the same engine rate, half the tokens per GPU."""
    one = prefill_capacity(PREFILL_MODEL, EngineLimits(), isl=1000, ttft_ms=100)
    two = prefill_capacity(PREFILL_MODEL, EngineLimits(num_gpu=2), isl=1000, ttft_ms=100)
    assert two.requests_per_s == one.requests_per_s
    assert two.tokens_per_s_per_gpu == pytest.approx(one.tokens_per_s_per_gpu / 2)


# --------------------------------------------------------------------------------------------------------
# Decode
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeCase:
    id: str
    limits: EngineLimits
    itl_ms: float
    want_batch: int
    want_itl_s: float
    want_limit: BatchLimit
    accept: float | None = None
    want_reason: ReasonCode = ReasonCode.CAPACITY_SEARCHED


# ISL 1000, OSL 200: context 1000 + 200 // 2 = 1100; itl(b) = 5 ms + b * 1100 * 5e-8 s = 5 + 0.055 b ms
DECODE_CASES = [
    # ITL 10 ms: 5 + 0.055 b <= 10 -> b <= 90.9 -> 90 (seqs 128 < 2e6 // 1100 = 1818: every size tried)
    DecodeCase(
        id="itl-bound",
        limits=EngineLimits(max_num_seqs=128),
        itl_ms=10,
        want_batch=90,
        want_itl_s=0.00995,
        want_limit=BatchLimit.MAX_NUM_SEQS,
    ),
    # max_kv 55000 // 1100 = 50 requests fit: itl(50) = 7.75 ms
    DecodeCase(
        id="kv-bound",
        limits=EngineLimits(max_num_seqs=128, max_kv_tokens=55_000),
        itl_ms=10,
        want_batch=50,
        want_itl_s=0.00775,
        want_limit=BatchLimit.MAX_KV_TOKENS,
    ),
    # 512 sequences: spaced candidates 1 + i * 511 // 127; ...89 (i=22), 93 (i=23) > 90.9 -> 89: itl 9.895 ms
    DecodeCase(
        id="spaced-candidates",
        limits=EngineLimits(max_num_seqs=512),
        itl_ms=10,
        want_batch=89,
        want_itl_s=0.009895,
        want_limit=BatchLimit.MAX_NUM_SEQS,
    ),
    # accept 2.5 clamped to nextn + 1 = 2: itl(b) = (5 + 0.055 b) / 2 <= 10 for b <= 272 -> all 128:
    # itl(128) = (5 + 7.04) / 2 = 6.02 ms
    DecodeCase(
        id="accept-length-clamped",
        limits=EngineLimits(max_num_seqs=128, speculative_nextn=1),
        itl_ms=10,
        accept=2.5,
        want_batch=128,
        want_itl_s=0.00602,
        want_limit=BatchLimit.MAX_NUM_SEQS,
    ),
    # nextn 0: a reported accept length of 3 is ignored (1.0) -> as "itl-bound"
    DecodeCase(
        id="no-speculation-ignores-accept",
        limits=EngineLimits(max_num_seqs=128),
        itl_ms=10,
        accept=3.0,
        want_batch=90,
        want_itl_s=0.00995,
        want_limit=BatchLimit.MAX_NUM_SEQS,
    ),
    # ITL 4 ms < itl(1) = 5.055 ms: unreachable; closest is batch 1
    DecodeCase(
        id="unreachable-uses-closest",
        limits=EngineLimits(max_num_seqs=128),
        itl_ms=4,
        want_batch=1,
        want_itl_s=0.005055,
        want_limit=BatchLimit.MAX_NUM_SEQS,
        want_reason=ReasonCode.SLA_UNREACHABLE,
    ),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.id)
def test_decode_capacity(case: DecodeCase) -> None:
    capacity = decode_capacity(
        DECODE_MODEL, case.limits, isl=1000, osl=200, itl_ms=case.itl_ms, accept_length=case.accept
    )
    assert (capacity.batch_size, capacity.batch_limit, capacity.reason) == (
        case.want_batch,
        case.want_limit,
        case.want_reason,
    )
    assert capacity.itl_ms == pytest.approx(case.want_itl_s * 1000)
    # Little's law: b requests each needing OSL iterations of itl seconds
    assert capacity.requests_per_s == pytest.approx(case.want_batch / (200 * case.want_itl_s))
    assert capacity.tokens_per_s_per_gpu == pytest.approx(case.want_batch / case.want_itl_s)  # rps * OSL
    assert capacity.steps[0].step == "accept_length"


def test_decode_request_larger_than_kv_cache_has_no_capacity() -> None:
    """Context 1100 > max_kv_tokens 1000: not one request fits; rate 0 with its own reason, not usable."""
    capacity = decode_capacity(DECODE_MODEL, EngineLimits(max_kv_tokens=1000), isl=1000, osl=200, itl_ms=10)
    assert capacity.reason is ReasonCode.REQUEST_EXCEEDS_ENGINE and not capacity.usable
    assert capacity.requests_per_s == 0.0 and capacity.batch_size == 0


@pytest.mark.parametrize("search", [prefill_capacity, decode_capacity, agg_capacity], ids=["prefill", "decode", "agg"])
def test_model_not_ready_gives_no_capacity(search: object) -> None:
    kwargs = {"isl": 1000, "osl": 200, "ttft_ms": 100, "itl_ms": 10}
    if search is prefill_capacity:
        del kwargs["osl"], kwargs["itl_ms"]
    if search is decode_capacity:
        del kwargs["ttft_ms"]
    capacity: RoleCapacity = search(LinearModel(ready=False), EngineLimits(), **kwargs)  # type: ignore[operator]
    assert capacity.reason is ReasonCode.MODEL_NOT_READY and capacity.requests_per_s == 0 and not capacity.usable


@pytest.mark.parametrize(
    "kwargs",
    [{"isl": 0}, {"isl": math.nan}, {"osl": 0.5}, {"itl_ms": 0}, {"itl_ms": math.nan}],
    ids=["isl-zero", "isl-nan", "osl-below-one", "itl-zero", "itl-nan"],
)
def test_decode_rejects_bad_shapes(kwargs: dict[str, float]) -> None:
    arguments = {"isl": 1000.0, "osl": 200.0, "itl_ms": 10.0, **kwargs}
    with pytest.raises(ValueError):
        decode_capacity(DECODE_MODEL, EngineLimits(), **arguments)


# --------------------------------------------------------------------------------------------------------
# Aggregated
# --------------------------------------------------------------------------------------------------------


def test_agg_capacity_balances_prefill_and_decode() -> None:
    """ISL 1000, OSL 200, seqs 128: prefill per iteration p(b) = ceil(b * 1000 / 200) = 5b (fits 8192 - b).

    itl(b) = 5 ms + 5b * 0.01 ms + b * 1100 * 5e-5 ms = 5 + 0.105 b ms <= 10 -> b <= 47.6 -> 47: itl 9.935 ms;
    ttft(47) = one chunk of 5*47 + 1000 = 1235 tokens with the batch on board:
    5 + 12.35 + 47 * 1100 * 5e-5 = 19.935 ms <= 200 ms; rps = 47 / (200 * 9.935 ms).
    """
    capacity = agg_capacity(AGG_MODEL, EngineLimits(max_num_seqs=128), isl=1000, osl=200, ttft_ms=200, itl_ms=10)
    assert capacity.role is CapacityRole.AGG and capacity.reason is ReasonCode.CAPACITY_SEARCHED
    assert capacity.batch_size == 47 and capacity.max_batch_size == 128
    assert capacity.itl_ms == pytest.approx(9.935) and capacity.ttft_ms == pytest.approx(19.935)
    assert capacity.latency_ms == capacity.itl_ms
    assert capacity.requests_per_s == pytest.approx(47 / (200 * 0.009935))
    assert [s.step for s in capacity.steps] == ["kv_hit_rate", "accept_length", "engine_capacity"]


def test_agg_ttft_target_binds_too() -> None:
    """TTFT 18 ms: ttft(b) = 5 + (5b + 1000) * 0.01 + 0.055 b = 15 + 0.105 b ms <= 18 -> b <= 28.6 -> 28."""
    capacity = agg_capacity(AGG_MODEL, EngineLimits(max_num_seqs=128), isl=1000, osl=200, ttft_ms=18, itl_ms=10)
    assert capacity.batch_size == 28 and capacity.sla_met
    assert capacity.ttft_ms == pytest.approx(15 + 0.105 * 28)


def test_agg_rate_balance_caps_the_batch() -> None:
    """MBT 600, ISL 1000, OSL 200: 5b <= 600 - b -> b <= 100; with no SLA pressure the largest feasible wins."""
    capacity = agg_capacity(
        AGG_MODEL,
        EngineLimits(max_num_seqs=128, max_num_batched_tokens=600),
        isl=1000,
        osl=200,
        ttft_ms=math.inf,
        itl_ms=math.inf,
    )
    assert capacity.batch_size == 100 and capacity.max_batch_size == 100
    assert capacity.batch_limit is BatchLimit.PREFILL_DECODE_BALANCE


def test_agg_prefill_bound_fallback() -> None:
    """ISL 10000, OSL 1: even batch 1 needs 10000 prefill tokens per iteration > 8191: batch 1 absorbs 8191.

    forward = 5 + 81.91 + 10000 * 5e-5 = 87.41 ms; rate = min(1 / (1 * 87.41 ms), 8191 / (10000 * 87.41 ms)) = 9.371
    """
    capacity = agg_capacity(AGG_MODEL, EngineLimits(), isl=10000, osl=1, ttft_ms=1000, itl_ms=10)
    assert capacity.batch_size == 1 and capacity.batch_limit is BatchLimit.PREFILL_DECODE_BALANCE
    assert capacity.requests_per_s == pytest.approx(8191 / (10000 * 0.08741))
    assert capacity.reason is ReasonCode.SLA_UNREACHABLE


@dataclass(frozen=True, slots=True, kw_only=True)
class AggPromptRateCase:
    id: str
    model: LinearModel
    mbt: int
    batch: int
    context: int
    want_tokens_per_s: float
    want_iteration_s: float


# AGG_MODEL: mixed_wall(p, b, kv) = 5 ms + 0.01 ms per prompt token + 5e-8 s per decode KV token.
AGG_PROMPT_RATE_CASES = [
    # nothing decoding: the whole budget: 8192 / (0.005 + 0.08192) = 8192 / 0.08692 = 94,247.6 tokens/s
    AggPromptRateCase(
        id="idle-engine-whole-budget", model=AGG_MODEL, mbt=8192, batch=0, context=1100,
        want_tokens_per_s=8192 / 0.08692, want_iteration_s=0.08692,
    ),
    # 47 decoding at context 1100: 8145 prompt tokens / (0.005 + 0.08145 + 47 x 1100 x 5e-8 = 0.089035 s)
    # = 91,480.9 tokens/s: the batch takes 47 tokens of budget and 2.585 ms of KV reads per iteration
    AggPromptRateCase(
        id="decode-batch-shares-the-iteration", model=AGG_MODEL, mbt=8192, batch=47, context=1100,
        want_tokens_per_s=8145 / 0.089035, want_iteration_s=0.089035,
    ),
    # MBT 600, 100 decoding at context 10,000: 500 / (0.005 + 0.005 + 100 x 10,000 x 5e-8 = 0.06 s) = 8,333.3
    AggPromptRateCase(
        id="long-contexts-slow-the-prompts", model=AGG_MODEL, mbt=600, batch=100, context=10_000,
        want_tokens_per_s=500 / 0.06, want_iteration_s=0.06,
    ),
    # the batch takes the whole budget: no prompt tokens
    AggPromptRateCase(
        id="no-budget-left", model=AGG_MODEL, mbt=600, batch=600, context=1100,
        want_tokens_per_s=0.0, want_iteration_s=0.0,
    ),
    # a model predicting no time cannot rate the engine
    AggPromptRateCase(
        id="zero-time-model", model=LinearModel(base_s=0.0, per_token_s=0.0), mbt=8192, batch=10, context=1100,
        want_tokens_per_s=0.0, want_iteration_s=0.0,
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", AGG_PROMPT_RATE_CASES, ids=lambda c: c.id)
def test_agg_prompt_rate(case: AggPromptRateCase) -> None:
    tokens_per_s, iteration_s = agg_prompt_rate(case.model, case.mbt, batch_size=case.batch, context=case.context)
    assert tokens_per_s == pytest.approx(case.want_tokens_per_s)
    assert iteration_s == pytest.approx(case.want_iteration_s)


@pytest.mark.parametrize(
    ("kv_hit_rate", "want_batch", "want_tokens_per_s", "want_iteration_s"),
    [
        # the operating point of test_agg_capacity_balances_prefill_and_decode: batch 47, context 1100:
        # 8145 / 0.089035 s (the second rate case)
        (None, 47, 8145 / 0.089035, 0.089035),
        # hit 0.5: 500 computed tokens per prompt, p(b) = ceil(2.5 b); itl(b) = 5 + 0.01 ceil(2.5 b) + 0.055 b ms:
        # b = 62 gives 5 + 1.55 + 3.41 = 9.96 ms, b = 63 gives 10.045 > 10: batch 62. The rate is not discounted
        # here (the caller divides by 1 - hit): 8130 / (0.005 + 0.0813 + 62 x 1100 x 5e-8 = 0.08971 s)
        (0.5, 62, 8130 / 0.08971, 0.08971),
    ],
)
def test_agg_operating_prompt_rate_is_taken_at_the_capacity_batch(
    kv_hit_rate: float | None, want_batch: int, want_tokens_per_s: float, want_iteration_s: float
) -> None:
    rate = agg_operating_prompt_rate(
        AGG_MODEL, EngineLimits(max_num_seqs=128), isl=1000, osl=200, ttft_ms=200, itl_ms=10, kv_hit_rate=kv_hit_rate
    )
    assert (rate.batch_size, rate.context) == (want_batch, 1100)
    assert rate.capacity.batch_size == want_batch
    assert rate.tokens_per_s == pytest.approx(want_tokens_per_s)
    assert rate.iteration_s == pytest.approx(want_iteration_s)


def test_agg_operating_prompt_rate_without_a_ready_model_is_zero() -> None:
    rate = agg_operating_prompt_rate(
        LinearModel(ready=False), EngineLimits(), isl=1000, osl=200, ttft_ms=200, itl_ms=10
    )
    assert (rate.tokens_per_s, rate.iteration_s, rate.batch_size) == (0.0, 0.0, 0)
    assert rate.capacity.reason is ReasonCode.MODEL_NOT_READY


# --------------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------------

linear_models = st.builds(
    LinearModel,
    base_s=st.floats(min_value=1e-4, max_value=0.05),
    per_token_s=st.floats(min_value=1e-7, max_value=1e-4),
    per_request_s=st.floats(min_value=0, max_value=1e-4),
    per_kv_s=st.floats(min_value=0, max_value=1e-6),
)
# At most 128 sequences: every batch size is tried (with spaced candidates the search is approximate).
small_limits = st.builds(
    EngineLimits,
    max_num_batched_tokens=st.integers(min_value=64, max_value=16384),
    max_num_seqs=st.integers(min_value=1, max_value=128),
    max_kv_tokens=st.integers(min_value=50_000, max_value=3_000_000),
)
limits_any = st.builds(
    EngineLimits,
    max_num_batched_tokens=st.integers(min_value=64, max_value=16384),
    max_num_seqs=st.integers(min_value=1, max_value=1024),
    max_kv_tokens=st.integers(min_value=50_000, max_value=3_000_000),
)
lengths = st.floats(min_value=1, max_value=20_000)
targets_ms = st.floats(min_value=0.5, max_value=2_000)


@settings(max_examples=200, deadline=None)
@given(model=linear_models, limits=small_limits, isl=lengths, more=lengths, ttft_ms=targets_ms)
def test_prefill_capacity_does_not_grow_with_isl(
    model: LinearModel, limits: EngineLimits, isl: float, more: float, ttft_ms: float
) -> None:
    """A longer prompt never gets more capacity, unless the shorter one misses the SLA while the longer meets it
    (cannot happen: a longer prompt is never faster) - compared within the same SLA outcome."""
    short = prefill_capacity(model, limits, isl=isl, ttft_ms=ttft_ms)
    long = prefill_capacity(model, limits, isl=isl + more, ttft_ms=ttft_ms)
    assert not (long.sla_met and not short.sla_met)
    if long.sla_met == short.sla_met:
        assert long.requests_per_s <= short.requests_per_s * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(model=linear_models, limits=limits_any, isl=lengths, tight=targets_ms, slack=targets_ms)
def test_prefill_relaxed_ttft_never_gives_less(
    model: LinearModel, limits: EngineLimits, isl: float, tight: float, slack: float
) -> None:
    tight_capacity = prefill_capacity(model, limits, isl=isl, ttft_ms=tight)
    loose_capacity = prefill_capacity(model, limits, isl=isl, ttft_ms=tight + slack)
    assert loose_capacity.requests_per_s >= tight_capacity.requests_per_s


@settings(max_examples=200, deadline=None)
@given(model=linear_models, limits=limits_any, isl=lengths, osl=lengths, tight=targets_ms, slack=targets_ms)
def test_decode_relaxed_itl_never_gives_less(
    model: LinearModel, limits: EngineLimits, isl: float, osl: float, tight: float, slack: float
) -> None:
    assume(limits.max_kv_tokens // math.floor(isl + osl // 2) >= 1)
    tight_capacity = decode_capacity(model, limits, isl=isl, osl=osl, itl_ms=tight)
    loose_capacity = decode_capacity(model, limits, isl=isl, osl=osl, itl_ms=tight + slack)
    assert loose_capacity.requests_per_s >= tight_capacity.requests_per_s
