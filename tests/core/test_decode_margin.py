"""The learned decode margin (`planner_core.policy.decode_margin`): the decode target utilization at which the
window's own concurrency peaks fill an engine's batch, recorded only when the ITL met the target with room, back to
the floor at once on a miss, kept (with its reason) when the window cannot be read, and read by the sizing."""

from __future__ import annotations

import dataclasses

import pytest

from planner_core.config import parse_config
from planner_core.domain import (
    Component,
    DecodeMarginState,
    EngineLimits,
    ForwardPassMetrics,
    LatencyHistogram,
    PlannerState,
    QueuedRequests,
    ReasonCode,
    RecordedArrivals,
    ScheduledRequests,
    StepName,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.policy.decode_margin import (
    RECENT_WINDOWS,
    DecodeMarginWindow,
    concurrency_peak_factor,
    histogram_quantile_ms,
    learn_decode_margin,
    sizing_utilization,
)
from tests.core.fakes import FWD

CONFIG = parse_config(
    {
        "throughput_algorithm": "engine_capacity",
        "throughput_decode_learned_margin": True,
        "throughput_decode_target_utilization": 0.7,
        "throughput_decode_utilization_max": 0.9,
        "itl_ms": 50,
    },
    "test",
).policy
LIMITS = EngineLimits(num_gpu=1, max_num_batched_tokens=8192, max_num_seqs=512, max_kv_tokens=2_000_000)
WORKERS = WorkerCounts(ready_prefill=3, ready_decode=1, expected_prefill=3, expected_decode=1)
STEADY = DecodeMarginState(last_ready=1)  # the decode pool held its engine through the window
NUM_REQ = 3600  # 60 req/s over the 60 s window


def steady_arrivals(num_req: int = NUM_REQ) -> RecordedArrivals:
    """Requests evenly spaced over the window: the concurrency never rises above its mean."""
    return RecordedArrivals(start_s=0.0, end_s=60.0, at_s=tuple(60.0 * i / num_req for i in range(num_req)),
                            isl=(1000.0,) * num_req)  # fmt: skip


def bursty_arrivals(num_req: int = NUM_REQ) -> RecordedArrivals:
    """The same requests, half of them in a 2 s burst every 10 s."""
    half = num_req // 2
    even = [60.0 * i / half for i in range(half)]
    bursts = [10.0 * (i % 6) + 2.0 * (i // 6) / (half // 6) for i in range(half)]
    at_s = tuple(sorted(even + bursts))
    return RecordedArrivals(start_s=0.0, end_s=60.0, at_s=at_s, isl=(1000.0,) * len(at_s))


def itl_histogram(count: float, p95_bucket_ms: float) -> LatencyHistogram:
    """`count` requests, all at or under `p95_bucket_ms` and none under the bucket before it."""
    bounds = (10.0, 25.0, 50.0, 100.0)
    cumulative = tuple(count if bound >= p95_bucket_ms else 0.0 for bound in bounds)
    return LatencyHistogram(bounds_ms=bounds, cumulative=cumulative, count=count)


def margin_window(
    *,
    itl_ms: float | None = 20.0,
    histogram: LatencyHistogram | None = None,
    arrivals: RecordedArrivals | None = None,
    workers: WorkerCounts = WORKERS,
    fpm: tuple[ForwardPassMetrics, ...] = (),
    num_req: float = NUM_REQ,
) -> DecodeMarginWindow:
    traffic = TrafficObservation(
        duration_s=60.0,
        num_req=num_req,
        isl=1000.0,
        osl=250.0,
        itl_ms=itl_ms,
        itl_histogram=histogram,
        prompt_arrivals=steady_arrivals() if arrivals is None else arrivals,
    )
    return DecodeMarginWindow(
        traffic=traffic, window_s=60.0, workers=workers, limits=LIMITS, model=FWD, itl_target_ms=50.0, fpm=fpm
    )


def full_batch(queued: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        component=Component.DECODE,
        worker_id="d0",
        wall_time_s=0.02,
        scheduled=ScheduledRequests(num_decode_requests=LIMITS.max_num_seqs, sum_decode_kv_tokens=600_000),
        queued=QueuedRequests(num_decode_requests=queued, sum_decode_kv_tokens=queued * 1100),
    )


# --- the window's figures ----------------------------------------------------------------------------------------


def test_histogram_quantile_interpolates_inside_the_bucket_that_holds_the_rank() -> None:
    h = LatencyHistogram(bounds_ms=(10.0, 25.0, 50.0), cumulative=(50.0, 90.0, 100.0), count=100.0)
    assert histogram_quantile_ms(h, 0.5) == pytest.approx(10.0)
    assert histogram_quantile_ms(h, 0.95) == pytest.approx(25.0 + 25.0 * 0.5)  # half way through (25, 50]
    assert histogram_quantile_ms(LatencyHistogram(bounds_ms=(10.0,), cumulative=(0.0,), count=0.0), 0.95) is None


def test_the_peak_factor_is_one_for_even_arrivals_and_larger_for_bursts() -> None:
    rate, lifetime_s = NUM_REQ / 60.0, 5.0
    even = steady_arrivals()
    bursty = bursty_arrivals()
    assert concurrency_peak_factor(even.at_s, 0.0, rate, lifetime_s) == pytest.approx(1.0, abs=0.01)
    assert concurrency_peak_factor(bursty.at_s, 0.0, rate, lifetime_s) > 1.2


# --- the rules ---------------------------------------------------------------------------------------------------


def test_a_window_met_with_room_records_the_utilization_its_concurrency_fits_within_the_ceiling() -> None:
    state, step = learn_decode_margin(CONFIG, STEADY, margin_window())
    assert step.step == StepName.DECODE_MARGIN and step.reason is ReasonCode.DECODE_MARGIN_LEARNED
    assert state.recent == (pytest.approx(0.9),)  # even arrivals fit far above the ceiling: bounded to it
    assert sizing_utilization(CONFIG, state) == step.value == pytest.approx(0.9)


def test_bursty_arrivals_fit_a_lower_utilization_than_even_ones() -> None:
    roomy = CONFIG.model_copy(update={"throughput_decode_utilization_max": 1.0})
    even, _ = learn_decode_margin(roomy, STEADY, margin_window())
    bursty, step = learn_decode_margin(roomy, STEADY, margin_window(arrivals=bursty_arrivals()))
    assert bursty.recent[0] < even.recent[0]
    assert "concurrency p99" in step.detail


def test_a_missed_itl_sends_the_margin_to_the_floor_at_once_and_only_recent_windows_bring_it_back() -> None:
    lean = DecodeMarginState(recent=(0.9,) * RECENT_WINDOWS, last_ready=1)
    state, step = learn_decode_margin(CONFIG, lean, margin_window(itl_ms=60.0, histogram=itl_histogram(NUM_REQ, 100.0)))
    assert step.reason is ReasonCode.DECODE_MARGIN_MISSED
    assert sizing_utilization(CONFIG, state) == pytest.approx(0.7)
    for _ in range(RECENT_WINDOWS - 1):  # the miss stays among the recent windows
        state, _ = learn_decode_margin(CONFIG, state, margin_window())
        assert sizing_utilization(CONFIG, state) == pytest.approx(0.7)
    state, _ = learn_decode_margin(CONFIG, state, margin_window())
    assert sizing_utilization(CONFIG, state) == pytest.approx(0.9)


def test_the_p95_from_the_histogram_judges_the_window_not_the_mean() -> None:
    # a mean of 20 ms, but the p95 lies in (50, 100] ms: a miss
    _, step = learn_decode_margin(CONFIG, STEADY, margin_window(itl_ms=20.0, histogram=itl_histogram(NUM_REQ, 100.0)))
    assert step.reason is ReasonCode.DECODE_MARGIN_MISSED


def test_requests_queued_behind_a_full_decode_batch_are_a_miss() -> None:
    state, step = learn_decode_margin(CONFIG, STEADY, margin_window(fpm=(full_batch(queued=12),)))
    assert step.reason is ReasonCode.DECODE_MARGIN_MISSED and state.recent == (pytest.approx(0.7),)
    # a request waiting for the next iteration of a batch with room is no miss
    not_full = dataclasses.replace(full_batch(queued=3), scheduled=ScheduledRequests(num_decode_requests=100))
    _, step = learn_decode_margin(CONFIG, STEADY, margin_window(fpm=(not_full,)))
    assert step.reason is ReasonCode.DECODE_MARGIN_LEARNED


def test_an_itl_met_without_room_keeps_the_margin() -> None:
    lean = DecodeMarginState(recent=(0.85,), last_ready=1)
    state, step = learn_decode_margin(CONFIG, lean, margin_window(itl_ms=45.0))
    assert step.reason is ReasonCode.DECODE_MARGIN_NO_EVIDENCE and state.recent == lean.recent


@pytest.mark.parametrize(
    ("workers", "last_ready"),
    [
        (WorkerCounts(ready_prefill=3, ready_decode=1, expected_prefill=3, expected_decode=2), 1),  # one starting
        (WORKERS, 2),  # one left during the window
    ],
)
def test_a_changing_decode_pool_keeps_the_margin(workers: WorkerCounts, last_ready: int) -> None:
    lean = DecodeMarginState(recent=(0.85,), last_ready=last_ready)
    state, step = learn_decode_margin(CONFIG, lean, margin_window(workers=workers))
    assert step.reason is ReasonCode.DECODE_MARGIN_NO_EVIDENCE and state.recent == lean.recent
    assert state.last_ready == workers.ready(Component.DECODE)
    assert step.value == pytest.approx(0.85)


def test_a_source_without_an_itl_keeps_the_last_margin_with_its_reason() -> None:
    lean = DecodeMarginState(recent=(0.85,), last_ready=1)
    state, step = learn_decode_margin(CONFIG, lean, margin_window(itl_ms=None))
    assert step.reason is ReasonCode.DECODE_MARGIN_NO_LATENCY and state.recent == lean.recent
    assert step.value == pytest.approx(0.85)


def test_without_per_request_arrivals_or_with_too_few_requests_nothing_is_recorded() -> None:
    counted = RecordedArrivals(start_s=0.0, end_s=60.0, at_s=(30.0, 60.0), isl=(1000.0, 1000.0),
                               num_req=(1800.0, 1800.0), resolution_s=30.0)  # fmt: skip
    for window in (margin_window(arrivals=counted), margin_window(num_req=5.0)):
        state, step = learn_decode_margin(CONFIG, STEADY, window)
        assert step.reason is ReasonCode.DECODE_MARGIN_NO_EVIDENCE and state.recent == ()


# --- the sizing reads it -----------------------------------------------------------------------------------------


def test_the_sizing_reads_the_learned_utilization_only_with_the_knob_on() -> None:
    from planner_core.domain import Loop, Prediction, TickInputs
    from planner_core.policy.sizing import SizingRequest, target_utilization

    state = PlannerState(decode_margin=DecodeMarginState(recent=(0.88, 0.85), last_ready=1))
    inputs = TickInputs(now_s=60.0, loop=Loop.THROUGHPUT, workers=WORKERS, traffic=margin_window().traffic)
    prediction = Prediction(num_req=NUM_REQ, isl=1000.0, osl=250.0)
    request = SizingRequest(config=CONFIG, perf=None, inputs=inputs, state=state, prediction=prediction)
    assert target_utilization(request, Component.DECODE) == pytest.approx(0.85)  # the lowest recent window
    assert target_utilization(request, Component.PREFILL) == CONFIG.throughput_prefill_target_utilization
    off = dataclasses.replace(request, config=CONFIG.model_copy(update={"throughput_decode_learned_margin": False}))
    assert target_utilization(off, Component.DECODE) == pytest.approx(0.7)
