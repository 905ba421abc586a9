"""The learned decode margin (`planner_core.policy.decode_margin`): the decode target utilization a step leaner after
a window whose ITL and TTFT met the SLA with room, back to the floor at once after a miss, kept (with its reason)
when the window cannot be read, and read by the sizing."""

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
    Loop,
    PlannerState,
    Prediction,
    QueuedRequests,
    ReasonCode,
    ScheduledRequests,
    StepName,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.policy.decode_margin import (
    RISE_STEP,
    DecodeMarginWindow,
    histogram_quantile_ms,
    learn_decode_margin,
    sizing_utilization,
)
from planner_core.policy.sizing import SizingRequest, target_utilization

CONFIG = parse_config(
    {
        "throughput_algorithm": "engine_capacity",
        "throughput_decode_learned_margin": True,
        "throughput_decode_target_utilization": 0.7,
        "throughput_decode_utilization_max": 0.9,
        "ttft_ms": 500,
        "itl_ms": 50,
        "error_budget_target": 0.99,
    },
    "test",
).policy
LIMITS = EngineLimits(num_gpu=1, max_num_batched_tokens=8192, max_num_seqs=512, max_kv_tokens=2_000_000)
WORKERS = WorkerCounts(ready_prefill=3, ready_decode=1, expected_prefill=3, expected_decode=1)
STEADY = DecodeMarginState(last_ready=1)  # the decode pool held its engine through the window
LEAN = DecodeMarginState(utilization=0.85, last_ready=1)
NUM_REQ = 3600.0


def ttft_histogram(share_within: float) -> LatencyHistogram:
    """`share_within` of the window's requests within 500 ms, the rest within 1 s."""
    return LatencyHistogram(
        bounds_ms=(250.0, 500.0, 1000.0), cumulative=(0.0, NUM_REQ * share_within, NUM_REQ), count=NUM_REQ
    )


def itl_histogram(p95_bucket_ms: float) -> LatencyHistogram:
    """Every request at or under `p95_bucket_ms` and none under the bucket before it."""
    bounds = (10.0, 25.0, 50.0, 100.0)
    cumulative = tuple(NUM_REQ if bound >= p95_bucket_ms else 0.0 for bound in bounds)
    return LatencyHistogram(bounds_ms=bounds, cumulative=cumulative, count=NUM_REQ)


def margin_window(
    *,
    itl_ms: float | None = 20.0,
    itl_hist: LatencyHistogram | None = None,
    ttft_share: float | None = 1.0,
    ttft_p99_ms: float | None = None,
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
        itl_histogram=itl_hist,
        ttft_ms_p99=ttft_p99_ms,
        ttft_histogram=None if ttft_share is None else ttft_histogram(ttft_share),
    )
    return DecodeMarginWindow(traffic=traffic, workers=workers, limits=LIMITS, fpm=fpm)


def decode_report(running: int, queued: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        component=Component.DECODE,
        worker_id="d0",
        wall_time_s=0.02,
        scheduled=ScheduledRequests(num_decode_requests=running, sum_decode_kv_tokens=running * 1100),
        queued=QueuedRequests(num_decode_requests=queued, sum_decode_kv_tokens=queued * 1100),
    )


def test_histogram_quantile_interpolates_inside_the_bucket_that_holds_the_rank() -> None:
    h = LatencyHistogram(bounds_ms=(10.0, 25.0, 50.0), cumulative=(50.0, 90.0, 100.0), count=100.0)
    assert histogram_quantile_ms(h, 0.5) == pytest.approx(10.0)
    assert histogram_quantile_ms(h, 0.95) == pytest.approx(25.0 + 25.0 * 0.5)  # half way through (25, 50]
    assert histogram_quantile_ms(LatencyHistogram(bounds_ms=(10.0,), cumulative=(0.0,), count=0.0), 0.95) is None


# --- leaner on windows met with room -----------------------------------------------------------------------------


def test_windows_met_with_room_make_it_a_step_leaner_each_up_to_the_ceiling() -> None:
    state = STEADY
    assert sizing_utilization(CONFIG, state) == pytest.approx(0.7)  # the floor until learned
    seen = []
    for _ in range(6):
        state, step = learn_decode_margin(CONFIG, state, margin_window())
        assert step.step == StepName.DECODE_MARGIN and step.reason is ReasonCode.DECODE_MARGIN_LEARNED
        seen.append(step.value)
    assert seen[:4] == pytest.approx([0.7 + RISE_STEP * (i + 1) for i in range(4)])
    assert seen[4:] == pytest.approx([0.9, 0.9])  # the ceiling


def test_an_itl_or_ttft_met_without_room_keeps_the_margin() -> None:
    for window in (margin_window(itl_ms=45.0), margin_window(ttft_share=None, ttft_p99_ms=None)):
        state, step = learn_decode_margin(CONFIG, LEAN, window)
        assert step.reason is ReasonCode.DECODE_MARGIN_NO_EVIDENCE and state.utilization == LEAN.utilization


# --- back at once on a miss --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window",
    [
        margin_window(itl_ms=60.0),  # the mean ITL over the target (no histogram)
        margin_window(itl_ms=20.0, itl_hist=itl_histogram(100.0)),  # a mean under it, the p95 in (50, 100] ms
        margin_window(ttft_share=0.98),  # under 99 % of the requests within the TTFT target
        margin_window(ttft_share=None, ttft_p99_ms=700.0),  # without the histogram: the p99 over the target
        margin_window(fpm=(decode_report(running=512, queued=12),)),  # requests queued behind a full batch
    ],
    ids=["itl-mean", "itl-p95", "ttft-share", "ttft-p99", "full-batch"],
)
def test_a_miss_sends_the_margin_to_the_floor_at_once(window: DecodeMarginWindow) -> None:
    state, step = learn_decode_margin(CONFIG, LEAN, window)
    assert step.reason is ReasonCode.DECODE_MARGIN_MISSED
    assert sizing_utilization(CONFIG, state) == step.value == pytest.approx(0.7)


def test_a_request_waiting_for_the_next_iteration_of_a_batch_with_room_is_no_miss() -> None:
    _, step = learn_decode_margin(CONFIG, LEAN, margin_window(fpm=(decode_report(running=100, queued=3),)))
    assert step.reason is ReasonCode.DECODE_MARGIN_LEARNED


# --- nothing from what cannot be read ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "last_ready"),
    [
        (WorkerCounts(ready_prefill=3, ready_decode=1, expected_prefill=3, expected_decode=2), 1),  # one starting
        (WORKERS, 2),  # one left during the window
    ],
)
def test_a_changing_decode_pool_keeps_the_margin_even_on_a_miss(workers: WorkerCounts, last_ready: int) -> None:
    before = dataclasses.replace(LEAN, last_ready=last_ready)
    state, step = learn_decode_margin(CONFIG, before, margin_window(workers=workers, itl_ms=80.0))
    assert step.reason is ReasonCode.DECODE_MARGIN_NO_EVIDENCE and state.utilization == LEAN.utilization
    assert state.last_ready == workers.ready(Component.DECODE)


def test_a_source_without_an_itl_keeps_the_last_margin_with_its_reason() -> None:
    state, step = learn_decode_margin(CONFIG, LEAN, margin_window(itl_ms=None))
    assert step.reason is ReasonCode.DECODE_MARGIN_NO_LATENCY and state.utilization == LEAN.utilization
    assert step.value == pytest.approx(0.85)


def test_a_window_of_too_few_requests_keeps_the_margin() -> None:
    state, step = learn_decode_margin(CONFIG, LEAN, margin_window(num_req=5.0, itl_ms=80.0))
    assert step.reason is ReasonCode.DECODE_MARGIN_NO_EVIDENCE and state.utilization == LEAN.utilization


# --- the sizing reads it -----------------------------------------------------------------------------------------


def test_the_sizing_reads_the_learned_utilization_only_with_the_knob_on() -> None:
    state = PlannerState(decode_margin=LEAN)
    inputs = TickInputs(now_s=60.0, loop=Loop.THROUGHPUT, workers=WORKERS, traffic=margin_window().traffic)
    prediction = Prediction(num_req=NUM_REQ, isl=1000.0, osl=250.0)
    request = SizingRequest(config=CONFIG, perf=None, inputs=inputs, state=state, prediction=prediction)
    assert target_utilization(request, Component.DECODE) == pytest.approx(0.85)
    assert target_utilization(request, Component.PREFILL) == CONFIG.throughput_prefill_target_utilization
    off = dataclasses.replace(request, config=CONFIG.model_copy(update={"throughput_decode_learned_margin": False}))
    assert target_utilization(off, Component.DECODE) == pytest.approx(0.7)
    # a ceiling configured under the floor never takes the pool below the floor's margin
    low = dataclasses.replace(request, config=CONFIG.model_copy(update={"throughput_decode_utilization_max": 0.5}))
    assert target_utilization(low, Component.DECODE) == pytest.approx(0.7)
