"""SLO-aware routing (planner_core.routing): the profiling formats, the predictor's interpolation, and the filter and
selector semantics of both stages, table-driven."""

from __future__ import annotations

import pytest

from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.profiling import (
    ProfilingDataError,
    parse_tpot_profile,
    parse_ttft_profile,
    tpot_profile_to_json,
    ttft_profile_to_json,
)
from planner_core.routing.scheduler import (
    BlockReason,
    Candidate,
    InstanceStatus,
    RouteOutcome,
    SloTargets,
    Stage,
    filter_and_select,
    route_decode,
    route_prefill,
)

TTFT_JSON = {
    "metadata": {"model": "m", "timestamp": "2026-01-01T00:00:00Z", "description": "TTFT profiling results"},
    "results": [
        {"tokens_num": 128, "mean": 45.2, "p50": 42.0, "p95": 58.1, "p99": 62.3},
        {"tokens_num": 1024, "p50": 100.0},
        {"tokens_num": 512, "p50": 70.0},
    ],
}
# TPOT p50 = 10 + 0.5 * batch + 0.01 * tokens, except one point off the plane (so bilinear is tested, not linear)
TPOT_POINTS = {(1, 100): 11.5, (1, 1000): 20.5, (16, 100): 19.0, (16, 1000): 40.0}
TPOT_JSON = {
    "metadata": {"model": "m"},
    "results": [{"batch_size": b, "tokens_per_request": t, "p50": v} for (b, t), v in TPOT_POINTS.items()],
}


@pytest.fixture
def predictor() -> LatencyPredictor:
    return LatencyPredictor(parse_ttft_profile(TTFT_JSON), parse_tpot_profile(TPOT_JSON))


# --- profiling formats -----------------------------------------------------------------------------------------


def test_profiles_round_trip_sorted_with_their_statistics() -> None:
    ttft = parse_ttft_profile(TTFT_JSON)
    assert [p.tokens_num for p in ttft.points] == [128, 512, 1024]
    again = ttft_profile_to_json(ttft)
    assert again["results"][0] == {"tokens_num": 128, "mean": 45.2, "p50": 42.0, "p95": 58.1, "p99": 62.3}
    assert parse_ttft_profile(again) == ttft
    tpot = parse_tpot_profile(TPOT_JSON)
    assert parse_tpot_profile(tpot_profile_to_json(tpot)) == tpot


@pytest.mark.parametrize(
    ("parse", "data", "message"),
    [
        (parse_ttft_profile, {"results": []}, "results = []: expected a non-empty list"),
        (parse_ttft_profile, {"results": [{"tokens_num": 1, "p50": 1.0}]}, "at least 2 tokens_num"),
        (
            parse_ttft_profile,
            {"results": [{"tokens_num": 8}, {"tokens_num": 9, "p50": 1}]},
            "results[0].p50 is missing",
        ),
        (parse_ttft_profile, {"results": [{"tokens_num": 0, "p50": 1}]}, "results[0].tokens_num = 0"),
        (parse_ttft_profile, {"results": [{"tokens_num": 8, "p50": -1}]}, "results[0].p50 = -1"),
        (parse_ttft_profile, {"results": [{"tokens_num": 8, "p50": 1}, {"tokens_num": 8, "p50": 2}]}, "duplicate"),
        (
            parse_tpot_profile,
            {"results": [{"batch_size": 1, "tokens_per_request": 1, "p50": 1}]},
            "at least 2 values per axis",
        ),
        (
            parse_tpot_profile,
            {"results": [{"batch_size": b, "tokens_per_request": t, "p50": 1} for b, t in ((1, 1), (1, 2), (2, 1))]},
            "no point batch_size=2 tokens_per_request=2",
        ),
        (parse_tpot_profile, [1, 2], "expected a JSON object"),
    ],
)
def test_bad_profiles_name_the_field_and_value(parse, data, message: str) -> None:
    with pytest.raises(ProfilingDataError, match="^ttft.json: ") as raised:
        parse(data, source="ttft.json")
    assert message in str(raised.value)


# --- predictor -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", TTFT_JSON["results"])
def test_ttft_exact_at_profiled_points(predictor: LatencyPredictor, point: dict) -> None:
    assert predictor.ttft_table_ms(point["tokens_num"]) == point["p50"]


@pytest.mark.parametrize(("batch", "tokens"), list(TPOT_POINTS))
def test_tpot_exact_at_profiled_points(predictor: LatencyPredictor, batch: int, tokens: int) -> None:
    assert predictor.tpot_table_ms(batch, tokens) == TPOT_POINTS[(batch, tokens)]


@pytest.mark.parametrize(
    ("tokens", "expected_ms"),
    [
        (320, 42.0 + (70.0 - 42.0) * (320 - 128) / (512 - 128)),  # between two points
        (768, 85.0),  # midway
        (2048, 100.0 + (100.0 - 70.0) * (2048 - 1024) / (1024 - 512)),  # past the last point: the edge line
        (0, 42.0 - 128 * (70.0 - 42.0) / (512 - 128)),  # below the first point: the edge line
    ],
)
def test_ttft_linear_between_points(predictor: LatencyPredictor, tokens: int, expected_ms: float) -> None:
    assert predictor.ttft_table_ms(tokens) == pytest.approx(expected_ms)


def test_extrapolation_is_floored_at_zero() -> None:
    steep = parse_ttft_profile({"results": [{"tokens_num": 100, "p50": 1.0}, {"tokens_num": 200, "p50": 100.0}]})
    assert LatencyPredictor(steep, parse_tpot_profile(TPOT_JSON)).ttft_table_ms(10) == 0.0


@pytest.mark.parametrize(
    ("batch", "tokens"), [(8.5, 550.0), (4.0, 100.0), (1.0, 325.0), (12.25, 900.0), (32.0, 1000.0), (16.0, 2000.0)]
)
def test_tpot_bilinear_between_points(predictor: LatencyPredictor, batch: float, tokens: float) -> None:
    u = (batch - 1) / (16 - 1)
    v = (tokens - 100) / (1000 - 100)
    g = TPOT_POINTS
    expected = (
        (1 - u) * (1 - v) * g[(1, 100)]
        + (1 - u) * v * g[(1, 1000)]
        + u * (1 - v) * g[(16, 100)]
        + u * v * g[(16, 1000)]
    )
    assert predictor.tpot_table_ms(batch, tokens) == pytest.approx(expected)
    # bilinear, not a plane: the centre of the cell is the mean of its corners
    assert predictor.tpot_table_ms(8.5, 550.0) == pytest.approx(sum(g.values()) / 4)


@pytest.mark.parametrize(
    ("prompt", "queued", "chunk", "batch", "kv", "expected_ms"),
    [
        (512, 0, None, 0, 0, 70.0),  # one prompt, idle engine: the table
        (512, 512, None, 0, 0, 100.0),  # no chunking: the table at the total
        (512, 512, 512, 0, 0, 140.0),  # two chunks of 512
        (128, 1024, 512, 0, 0, 182.0),  # 1152 tokens: 2 x 512 + 128 -> 2 x 70 + 42
        (512, 0, 512, 16, 16 * 1000, 70.0 + 40.0),  # one chunk carrying a decode batch of 16 x 1000 tokens
        (128, 1024, 512, 16, 16 * 1000, 182.0 + 3 * 40.0),  # three chunk iterations, each with the batch
    ],
)
def test_ttft_prediction_models_chunked_prefill(
    predictor: LatencyPredictor, prompt: int, queued: int, chunk: int | None, batch: int, kv: int, expected_ms: float
) -> None:
    got = predictor.predict_ttft_ms(
        prompt_tokens=prompt,
        queued_prefill_tokens=queued,
        chunk_tokens=chunk,
        decode_batch_size=batch,
        decode_tokens_per_request=kv / batch if batch else 0.0,
    )
    assert got == pytest.approx(expected_ms)


# --- filters and selector ------------------------------------------------------------------------------------

TARGETS = SloTargets(ttft_ms=100.0, tpot_ms=20.0, ttft_dispatch_threshold=1.0, tpot_dispatch_threshold=1.0)


def _c(name: str, predicted: float, **status) -> Candidate:
    return Candidate(status=InstanceStatus(instance_id=name, **status), predicted_ms=predicted)


@pytest.mark.parametrize(
    ("candidates", "targets", "max_age_s", "chosen", "blocked"),
    [
        # the selector: lowest prediction wins; ties go to the first given
        ([_c("a", 50), _c("b", 30), _c("c", 40)], TARGETS, None, "b", {}),
        ([_c("a", 30), _c("b", 30)], TARGETS, None, "a", {}),
        # metric filter: predicted > SLO x threshold is blocked; equal to the limit is kept
        ([_c("a", 120), _c("b", 100)], TARGETS, None, "b", {"a": BlockReason.PREDICTED_OVER_SLO}),
        # the threshold multiplier: 0.8 x 100 ms = 80 ms blocks b (90 ms) and keeps c
        (
            [_c("a", 120), _c("b", 90), _c("c", 80)],
            SloTargets(ttft_ms=100, tpot_ms=20, ttft_dispatch_threshold=0.8),
            None,
            "c",
            {"a": BlockReason.PREDICTED_OVER_SLO, "b": BlockReason.PREDICTED_OVER_SLO},
        ),
        # a multiplier above 1 lets a slightly late instance through
        ([_c("a", 120)], SloTargets(ttft_ms=100, tpot_ms=20, ttft_dispatch_threshold=1.25), None, "a", {}),
        # no instance under the threshold: no available endpoint
        (
            [_c("a", 120), _c("b", 101)],
            TARGETS,
            None,
            None,
            {"a": BlockReason.PREDICTED_OVER_SLO, "b": BlockReason.PREDICTED_OVER_SLO},
        ),
        ([], TARGETS, None, None, {}),  # no instance at all
        # failover: an unhealthy instance blocks its whole failure domain, other domains stay
        (
            [_c("a", 10, failure_domain="n1"), _c("b", 20, failure_domain="n1", healthy=False), _c("c", 50)],
            TARGETS,
            None,
            "c",
            {"a": BlockReason.FAILOVER, "b": BlockReason.FAILOVER},
        ),
        # an unhealthy instance without a domain blocks only itself
        ([_c("a", 10, healthy=False), _c("b", 50)], TARGETS, None, "b", {"a": BlockReason.FAILOVER}),
        # schedulability and staleness (the latter only with a limit)
        ([_c("a", 10, schedulable=False), _c("b", 50)], TARGETS, None, "b", {"a": BlockReason.UNSCHEDULABLE}),
        ([_c("a", 10, status_age_s=9), _c("b", 50)], TARGETS, 5.0, "b", {"a": BlockReason.STALE}),
        ([_c("a", 10, status_age_s=9), _c("b", 50)], TARGETS, None, "a", {}),
        # every instance blocked by some filter: no available endpoint
        (
            [_c("a", 10, schedulable=False), _c("b", 10, status_age_s=9), _c("c", 500)],
            TARGETS,
            5.0,
            None,
            {"a": BlockReason.UNSCHEDULABLE, "b": BlockReason.STALE, "c": BlockReason.PREDICTED_OVER_SLO},
        ),
    ],
)
def test_prefill_filters_and_selector(candidates, targets, max_age_s, chosen, blocked) -> None:
    decision = filter_and_select(Stage.PREFILL, candidates, targets, max_status_age_s=max_age_s)
    assert decision.instance_id == chosen
    assert decision.outcome is (RouteOutcome.SELECTED if chosen else RouteOutcome.NO_AVAILABLE_ENDPOINT)
    assert dict(decision.blocked) == blocked
    assert decision.limit_ms == pytest.approx(targets.ttft_ms * targets.ttft_dispatch_threshold)
    if chosen:
        assert decision.predicted_ms == min(c.predicted_ms for c in candidates if c.status.instance_id == chosen)
    else:
        assert decision.predicted_ms is None


@pytest.mark.parametrize(
    ("threshold", "predictions", "chosen"),
    [(1.0, (25.0, 19.0), "b"), (0.9, (25.0, 19.0), None), (0.9, (25.0, 18.0), "b"), (1.3, (25.0, 26.0), "a")],
)
def test_decode_stage_uses_the_tpot_slo_and_its_multiplier(
    threshold: float, predictions: tuple[float, float], chosen: str | None
) -> None:
    targets = SloTargets(ttft_ms=1.0, tpot_ms=20.0, ttft_dispatch_threshold=100.0, tpot_dispatch_threshold=threshold)
    candidates = [_c("a", predictions[0]), _c("b", predictions[1])]
    decision = filter_and_select(Stage.DECODE, candidates, targets)
    assert decision.instance_id == chosen
    assert decision.limit_ms == pytest.approx(20.0 * threshold)


def test_metric_filter_can_be_skipped_for_overdue_requests() -> None:
    decision = filter_and_select(Stage.PREFILL, [_c("a", 500), _c("b", 300)], TARGETS, apply_metric_filter=False)
    assert (decision.outcome, decision.instance_id) == (RouteOutcome.SELECTED, "b")


def test_route_prefill_predicts_each_instance_from_its_queue(predictor: LatencyPredictor) -> None:
    instances = [
        InstanceStatus(instance_id="busy", queued_prefill_tokens=1024, chunk_tokens=512),  # 3 chunks: 182 ms
        InstanceStatus(instance_id="idle", chunk_tokens=512),  # 42 ms
    ]
    decision = route_prefill(predictor, instances, 128, TARGETS)
    assert (decision.instance_id, decision.predicted_ms) == ("idle", pytest.approx(42.0))
    assert dict(decision.blocked) == {"busy": BlockReason.PREDICTED_OVER_SLO}
    # only the busy one: nothing meets 100 ms
    alone = route_prefill(predictor, instances[:1], 128, TARGETS)
    assert alone.outcome is RouteOutcome.NO_AVAILABLE_ENDPOINT


def test_route_decode_counts_the_new_request_in_the_batch(predictor: LatencyPredictor) -> None:
    # 15 running requests of 1000 tokens + a new one of 1000: batch 16 x 1000 -> 40 ms; an empty engine: 1 x 1000
    instances = [
        InstanceStatus(instance_id="full", decode_batch_size=15, decode_kv_tokens=15_000),
        InstanceStatus(instance_id="empty"),
    ]
    targets = SloTargets(ttft_ms=100.0, tpot_ms=45.0)
    decision = route_decode(predictor, instances, 1000, targets)
    assert (decision.instance_id, decision.predicted_ms) == ("empty", pytest.approx(20.5))
    only_full = route_decode(predictor, instances[:1], 1000, targets)
    assert (only_full.instance_id, only_full.predicted_ms) == ("full", pytest.approx(40.0))
    strict = route_decode(
        predictor, instances[:1], 1000, SloTargets(ttft_ms=100.0, tpot_ms=45.0, tpot_dispatch_threshold=0.8)
    )
    assert strict.outcome is RouteOutcome.NO_AVAILABLE_ENDPOINT
