"""Tests of `planner_core.perf.online`: retention, fit, readiness and the model built from the state (pure)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import PlannerConfig, parse_config
from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    FpmSample,
    ModelReadiness,
    OnlineModelState,
    OnlinePerfState,
    PerfModelRole,
    PlannerState,
    ReasonCode,
    ScheduledRequests,
)
from planner_core.perf.capacity import prefill_capacity
from planner_core.perf.online import (
    MIN_WALL_S,
    OnlineForwardPassModel,
    PerfModelError,
    fit_wall_time,
    observe_fpm,
    observe_role,
    readiness_step,
)
from planner_core.runtime.store.codec import from_jsonable, to_jsonable


def prefill_fpm(tokens: int, wall_s: float, *, requests: int = 1) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        component=Component.PREFILL,
        worker_id="p0",
        wall_time_s=wall_s,
        scheduled=ScheduledRequests(num_prefill_requests=requests, sum_prefill_tokens=tokens),
    )


def decode_fpm(requests: int, kv_tokens: int, wall_s: float) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        component=Component.DECODE,
        worker_id="d0",
        wall_time_s=wall_s,
        scheduled=ScheduledRequests(num_decode_requests=requests, sum_decode_kv_tokens=kv_tokens),
    )


def line(tokens: int) -> float:
    """The prefill engine of these tests: 2 ms + 0.01 ms per token."""
    return 0.002 + 1e-5 * tokens


def config(**overrides: object) -> PlannerConfig:
    return parse_config({"optimization_target": "sla", **overrides}).policy


def observe(role: PerfModelRole, fpms: list[ForwardPassMetrics], **options: int) -> OnlineModelState:
    settings_ = {"max_num_fpm_samples": 64, "bucket_count": 16, "min_observations": 5, **options}
    return observe_role(OnlineModelState(role=role), fpms, **settings_)


# --------------------------------------------------------------------------------------------------------
# Readiness and fit
# --------------------------------------------------------------------------------------------------------


def test_needs_min_observations_then_fits_the_line_exactly() -> None:
    """4 samples < 5 -> insufficient_data; the 5th makes it ready with the line's own coefficients."""
    fpms = [prefill_fpm(t, line(t)) for t in (500, 1000, 2000, 4000, 8000)]
    four = observe(PerfModelRole.PREFILL, fpms[:4])
    assert four.readiness is ModelReadiness.INSUFFICIENT_DATA and "4 samples < load_min_observations 5" in (
        four.readiness_detail
    )
    assert not OnlineForwardPassModel(four).is_ready()
    five = observe(PerfModelRole.PREFILL, fpms)
    assert five.readiness is ModelReadiness.READY
    assert five.intercept_s == pytest.approx(0.002, abs=1e-12)
    assert five.coefficients == pytest.approx((1e-5,), abs=1e-15)
    model = OnlineForwardPassModel(five)
    assert model.is_ready() and model.prefill_wall_s(3000) == pytest.approx(0.032)


def test_negative_slope_rejects_the_fit() -> None:
    """Wall time falling as tokens grow is not physical: negative_coefficient, not ready, no capacity."""
    fpms = [prefill_fpm(t, 0.1 - 1e-5 * t) for t in (500, 1000, 2000, 4000, 8000)]
    state = observe(PerfModelRole.PREFILL, fpms)
    assert state.readiness is ModelReadiness.NEGATIVE_COEFFICIENT
    assert state.coefficients[0] == pytest.approx(-1e-5)  # kept for the record
    assert "sum_prefill_tokens" in state.readiness_detail
    model = OnlineForwardPassModel(state)
    assert not model.is_ready()
    with pytest.raises(PerfModelError, match="not ready"):
        model.prefill_wall_s(1000)
    assert prefill_capacity(model, EngineLimits(), isl=1000, ttft_ms=100).reason is ReasonCode.MODEL_NOT_READY


DECODE_POINTS = [(1, 1000), (8, 4000), (16, 20000), (32, 16000), (64, 90000), (4, 30000)]  # batch and KV not collinear


@pytest.mark.parametrize(
    ("request_slope_s", "want"),
    [
        (-5e-7, ModelReadiness.READY),  # slightly negative (> -1e-6 s/request): clipped to 0
        (-2e-6, ModelReadiness.NEGATIVE_COEFFICIENT),  # clearly negative: rejected
        (3e-5, ModelReadiness.READY),
    ],
    ids=["clipped", "rejected", "positive"],
)
def test_decode_request_slope_clip(request_slope_s: float, want: ModelReadiness) -> None:
    """wall = 5 ms + slope * requests + 1e-8 s * KV tokens, fitted exactly on 6 non-collinear points."""
    fpms = [decode_fpm(n, kv, 0.005 + request_slope_s * n + 1e-8 * kv) for n, kv in DECODE_POINTS]
    state = observe(PerfModelRole.DECODE, fpms)
    assert state.readiness is want
    if want is ModelReadiness.READY:
        expected = max(0.0, request_slope_s)
        assert state.coefficients[0] == pytest.approx(expected, abs=1e-12)
        assert state.coefficients[1] == pytest.approx(1e-8, rel=1e-6)
        assert ("clipped to 0" in state.readiness_detail) == (request_slope_s < 0)


def test_negative_kv_slope_is_never_clipped() -> None:
    fpms = [decode_fpm(n, kv, 0.01 + 1e-5 * n - 1e-8 * kv) for n, kv in DECODE_POINTS]
    assert observe(PerfModelRole.DECODE, fpms).readiness is ModelReadiness.NEGATIVE_COEFFICIENT


def test_feature_without_spread_is_insufficient_data() -> None:
    """Every chunk exactly 8192 tokens (a saturated engine): the slope is not identified."""
    state = observe(PerfModelRole.PREFILL, [prefill_fpm(8192, 0.09 + i * 1e-4) for i in range(6)])
    assert state.readiness is ModelReadiness.INSUFFICIENT_DATA and "no spread in sum_prefill_tokens" in (
        state.readiness_detail
    )


def test_negative_intercept_is_allowed_and_predictions_are_floored() -> None:
    """wall = -2 ms + 0.01 ms/token (Dynamo does not judge the intercept): 100 tokens would be -1 ms -> 1e-6 s."""
    fpms = [prefill_fpm(t, -0.002 + 1e-5 * t) for t in (1000, 2000, 4000, 8000, 16000)]
    model = OnlineForwardPassModel(observe(PerfModelRole.PREFILL, fpms))
    assert model.is_ready()
    assert model.prefill_wall_s(100) == MIN_WALL_S
    assert model.prefill_wall_s(3000) == pytest.approx(0.028)


def test_idle_heartbeats_and_invalid_observations_are_skipped() -> None:
    fpms = [prefill_fpm(t, line(t)) for t in (500, 1000, 2000)]
    fpms += [prefill_fpm(0, 0.0), prefill_fpm(100, math.nan), prefill_fpm(100, -0.1), prefill_fpm(100, math.inf)]
    state = observe(PerfModelRole.PREFILL, fpms)
    assert len(state.samples) == 3 and state.num_accepted == 3
    assert state.num_idle_skipped == 1 and state.num_invalid_skipped == 3


def test_readiness_step_names_the_reason() -> None:
    state = observe(PerfModelRole.PREFILL, [prefill_fpm(t, line(t)) for t in (500, 1000)])
    step = readiness_step(state, Component.PREFILL)
    assert (step.step, step.reason, step.value, step.component) == (
        "perf_model_prefill",
        ReasonCode.INSUFFICIENT_DATA,
        2.0,
        Component.PREFILL,
    )
    for readiness in ModelReadiness:  # every readiness maps onto a reason code of the same name
        assert ReasonCode(readiness.value).value == readiness.value


def test_fit_wall_time_direct() -> None:
    samples = [FpmSample(seq=i + 1, features=(float(t),), wall_time_s=line(t)) for i, t in enumerate((1, 2, 3))]
    assert fit_wall_time(PerfModelRole.PREFILL, samples, min_observations=3).readiness is ModelReadiness.READY


# --------------------------------------------------------------------------------------------------------
# Retention
# --------------------------------------------------------------------------------------------------------


def test_retention_keeps_a_few_high_load_samples_after_a_long_low_load_stream() -> None:
    """16 samples, 16 buckets over [100, 8000]: after 300 low-load iterations and 5 high-load ones, the 5 high
    ones stay (their buckets are small) and the low-load range keeps the rest; a FIFO would keep the same here,
    but not in the next test."""
    low = [prefill_fpm(100 + (i * 37) % 900, line(100 + (i * 37) % 900)) for i in range(300)]
    high = [prefill_fpm(7000 + 200 * i, line(7000 + 200 * i)) for i in range(5)]
    state = observe(PerfModelRole.PREFILL, low + high, max_num_fpm_samples=16)
    tokens = [s.features[0] for s in state.samples]
    assert len(tokens) == 16 and state.num_retired == 305 - 16
    assert sum(t >= 7000 for t in tokens) == 5
    assert sum(t < 1000 for t in tokens) == 11


def test_retention_keeps_old_samples_of_another_load_range() -> None:
    """5 high-load samples first, then 500 at low load: the old high-load samples survive (a FIFO of 16 would
    have dropped them 16 iterations later), so the fit still knows the high end of the range."""
    high = [prefill_fpm(6000 + 400 * i, line(6000 + 400 * i)) for i in range(5)]
    low = [prefill_fpm(200 + (i * 53) % 800, line(200 + (i * 53) % 800)) for i in range(500)]
    state = observe(PerfModelRole.PREFILL, high + low, max_num_fpm_samples=16)
    seqs_kept = sorted(s.seq for s in state.samples)
    assert seqs_kept[:5] == [1, 2, 3, 4, 5]  # the first five (high-load) samples are still held
    assert state.axis_min == (200.0,) and state.axis_max == (7600.0,)


def test_retention_drops_the_oldest_of_the_fullest_bucket() -> None:
    """max 4, 16 buckets over [0, 1600] (100 tokens each): samples at 1600, 0, 50, 60 -> buckets 15, 0, 0, 0;
    the 5th (1590, bucket 15) makes 5 > 4: the fullest is bucket 0 (3 samples), its oldest (tokens 0, the 2nd
    sample) goes; the oldest sample overall (1600) stays, unlike a FIFO."""
    fpms = [prefill_fpm(t, line(t)) for t in (1600, 0, 50, 60, 1590)]
    state = observe(PerfModelRole.PREFILL, fpms, max_num_fpm_samples=4, min_observations=1)
    assert [s.features[0] for s in state.samples] == [1600.0, 50.0, 60.0, 1590.0]
    assert [s.seq for s in state.samples] == [1, 3, 4, 5]


def test_two_dimensional_grid_keeps_corners() -> None:
    """Decode: 16 buckets = 4 x 4 over (requests, KV). A long stream at (small batch, small KV) leaves the single
    samples at the other corners in place."""
    corners = [decode_fpm(64, 200_000, 0.02), decode_fpm(64, 4_000, 0.012), decode_fpm(2, 150_000, 0.01)]
    busy = [decode_fpm(1 + i % 4, 1000 + (i * 97) % 3000, 0.005 + 1e-6 * i) for i in range(400)]
    state = observe(PerfModelRole.DECODE, corners + busy, max_num_fpm_samples=12)
    kept = {s.features for s in state.samples}
    assert {(64.0, 200_000.0), (64.0, 4_000.0), (2.0, 150_000.0)} <= kept
    assert len(state.samples) == 12


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=120),
    max_samples=st.integers(min_value=1, max_value=20),
    buckets=st.sampled_from([1, 4, 9, 16]),
)
def test_retention_invariants(tokens: list[int], max_samples: int, buckets: int) -> None:
    """Bounded, in arrival order, nothing lost from the count, bounds span every sample ever accepted."""
    fpms = [prefill_fpm(t, line(t)) for t in tokens]
    state = observe(PerfModelRole.PREFILL, fpms, max_num_fpm_samples=max_samples, bucket_count=buckets)
    assert len(state.samples) == min(len(tokens), max_samples)
    assert state.num_accepted == len(state.samples) + state.num_retired == len(tokens)
    seqs = [s.seq for s in state.samples]
    assert seqs == sorted(seqs) and seqs[-1] == len(tokens)  # the newest sample is always kept
    assert state.axis_min == (float(min(tokens)),) and state.axis_max == (float(max(tokens)),)


def test_observing_in_several_calls_equals_one_call() -> None:
    """The state carries everything: feeding a stream tick by tick gives the same state as all at once."""
    fpms = [prefill_fpm(100 + (i * 311) % 8000, line(100 + (i * 311) % 8000)) for i in range(100)]
    at_once = observe(PerfModelRole.PREFILL, fpms, max_num_fpm_samples=10)
    stepwise = OnlineModelState(role=PerfModelRole.PREFILL)
    for start in range(0, 100, 7):
        stepwise = observe_role(
            stepwise, fpms[start : start + 7], max_num_fpm_samples=10, bucket_count=16, min_observations=5
        )
    assert stepwise == at_once


# --------------------------------------------------------------------------------------------------------
# Routing, moving averages, roles, JSON
# --------------------------------------------------------------------------------------------------------


def test_observe_fpm_routes_by_component_or_to_agg() -> None:
    fpms = [prefill_fpm(1000, 0.012), decode_fpm(8, 8000, 0.006), decode_fpm(0, 0, 0.0)]
    disagg = observe_fpm(OnlinePerfState(), fpms, config())
    assert (len(disagg.prefill.samples), len(disagg.decode.samples), len(disagg.agg.samples)) == (1, 1, 0)
    assert disagg.decode.num_idle_skipped == 1
    agg = observe_fpm(OnlinePerfState(), fpms, config(mode="agg"))
    assert (len(agg.prefill.samples), len(agg.decode.samples), len(agg.agg.samples)) == (0, 0, 2)
    assert agg.agg.samples[0].features == (1000.0, 0.0) and agg.agg.samples[1].features == (0.0, 8000.0)
    assert observe_fpm(disagg, [], config()) == disagg


def test_moving_averages() -> None:
    """ISL per prefill iteration = tokens / requests; decode context = KV / requests; batch leading zeros skipped."""
    prefill = observe(PerfModelRole.PREFILL, [prefill_fpm(3000, 0.03, requests=2), prefill_fpm(1000, 0.012)])
    assert OnlineForwardPassModel(prefill).avg_isl == pytest.approx((1500 + 1000) / 2)
    decode = observe(
        PerfModelRole.DECODE,
        [decode_fpm(0, 0, 0.0), decode_fpm(4, 8000, 0.006), decode_fpm(0, 0, 0.0), decode_fpm(8, 8000, 0.006)],
    )
    model = OnlineForwardPassModel(decode)
    assert model.avg_decode_context == pytest.approx((2000 + 1000) / 2)
    assert model.avg_num_decode == pytest.approx((4 + 0 + 8) / 3)  # the leading idle iteration is skipped
    windowed = observe(
        PerfModelRole.PREFILL, [prefill_fpm(t, line(t)) for t in range(100, 1100, 100)], max_num_fpm_samples=4
    )
    assert windowed.recent_isl == (700.0, 800.0, 900.0, 1000.0)


def ready_state(role: PerfModelRole) -> OnlineModelState:
    if role is PerfModelRole.PREFILL:
        return observe(role, [prefill_fpm(t, line(t)) for t in (500, 1000, 2000, 4000, 8000)])
    if role is PerfModelRole.DECODE:
        return observe(role, [decode_fpm(n, kv, 0.005 + 1e-5 * n + 1e-8 * kv) for n, kv in DECODE_POINTS])
    fpms = [prefill_fpm(t, line(t)) for t in (500, 2000, 8000)] + [
        decode_fpm(n, kv, 0.002 + 1e-8 * kv) for n, kv in DECODE_POINTS
    ]
    return observe_fpm(OnlinePerfState(), fpms, config(mode="agg")).agg


def test_each_role_answers_only_its_own_questions() -> None:
    prefill = OnlineForwardPassModel(ready_state(PerfModelRole.PREFILL))
    decode = OnlineForwardPassModel(ready_state(PerfModelRole.DECODE))
    agg = OnlineForwardPassModel(ready_state(PerfModelRole.AGG))
    assert prefill.prefill_wall_s(1000) == pytest.approx(0.012)
    assert decode.decode_wall_s(10, 10_000) == pytest.approx(0.005 + 1e-4 + 1e-4)
    assert agg.mixed_wall_s(1000, 10, 10_000) == pytest.approx(0.002 + 0.01 + 1e-4, rel=1e-6)
    assert agg.prefill_wall_s(1000) == pytest.approx(0.012, rel=1e-6)
    assert agg.decode_wall_s(10, 10_000) == pytest.approx(0.002 + 1e-4, rel=1e-6)
    with pytest.raises(PerfModelError, match="does not answer"):
        prefill.decode_wall_s(1, 1)
    with pytest.raises(PerfModelError, match="does not answer"):
        prefill.mixed_wall_s(1, 1, 1)
    with pytest.raises(PerfModelError, match="does not answer"):
        decode.prefill_wall_s(1)
    with pytest.raises(PerfModelError, match="does not answer"):
        decode.mixed_wall_s(1, 1, 1)


def test_state_round_trips_through_json_inside_planner_state() -> None:
    perf = OnlinePerfState(
        prefill=ready_state(PerfModelRole.PREFILL),
        decode=ready_state(PerfModelRole.DECODE),
        agg=ready_state(PerfModelRole.AGG),
    )
    state = PlannerState(perf_models=perf)
    restored = from_jsonable(PlannerState, json.loads(json.dumps(to_jsonable(state), allow_nan=False)))
    assert restored == state
    assert restored.perf_models.decode.readiness is ModelReadiness.READY
    assert isinstance(restored.perf_models.decode.samples[0], FpmSample)
    assert OnlineForwardPassModel(restored.perf_models.decode).decode_wall_s(7, 7000) == OnlineForwardPassModel(
        perf.decode
    ).decode_wall_s(7, 7000)
    assert from_jsonable(PlannerState, {}).perf_models == OnlinePerfState()  # states stored before this field
