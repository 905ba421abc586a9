"""Tests of `planner_core.domain`: the JSON form of every boundary dataclass (`planner_core.runtime.store.codec`)
and traffic validation (pure).

Observed behaviour of the JSON form, pinned here: NaN, +inf and -inf floats become the strings "nan", "inf" and
"-inf" (their `repr`), so `json.dumps(..., allow_nan=False)` accepts the result (JSONB has no NaN/inf), and
`from_jsonable` turns those strings back into floats for fields annotated `float` (including `float | None` and
`tuple[float, ...]`). Enums become their string values, tuples become lists, None stays None. Since NaN != NaN,
round trips containing NaN are compared through their JSON form rather than with dataclass equality.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core import domain
from planner_core.domain import (
    AdoptedCount,
    AppliedTargets,
    ArimaFit,
    ArimaSearch,
    ArimaState,
    CapacityFeedback,
    Component,
    DecisionStage,
    DecisionSummary,
    EngineLimits,
    EnsembleMember,
    EnsembleState,
    ErrorBudgetState,
    EventReason,
    ForwardPassMetrics,
    FpmSample,
    HeldResult,
    HorizonWindow,
    KalmanState,
    LatencyHistogram,
    LengthQuantile,
    LoadHistory,
    LoadSeries,
    Loop,
    MemberScore,
    ModelReadiness,
    ObservedValue,
    OnlineModelState,
    OnlinePerfState,
    OutsideChange,
    OverrideType,
    PartialPrediction,
    PendingScaleUp,
    PerfModelRole,
    PipelineState,
    PlannerState,
    PluginSchedule,
    PoolFeedback,
    Prediction,
    PromptBurstQuantiles,
    PromptBurstWindow,
    QueuedRequests,
    ReasonCode,
    RecordedArrivals,
    RemoteAnswer,
    ReplicaOverride,
    ReplicaProposal,
    ScalingDecision,
    ScheduledRequests,
    SeriesModel,
    Signal,
    SignalStatus,
    SizedNeed,
    StartupSample,
    StartupState,
    StepRecord,
    ThresholdPlannerState,
    TickEvent,
    TickInputs,
    TickOutcome,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.runtime.store.codec import from_jsonable, to_jsonable

# --- strategies ------------------------------------------------------------------------------------------------


def domain_strategies(*, finite: bool) -> dict[type, st.SearchStrategy[Any]]:
    """One strategy per domain dataclass; `finite=False` lets every float field be NaN or +/-inf."""
    floats = st.floats(allow_nan=not finite, allow_infinity=not finite)
    opt_floats = st.none() | floats
    counts = st.integers(min_value=0, max_value=10_000)
    float_tuples = st.lists(floats, max_size=5).map(tuple)

    recorded_arrivals = st.builds(
        RecordedArrivals,
        start_s=floats,
        end_s=floats,
        at_s=float_tuples,
        isl=float_tuples,
        num_req=float_tuples,
        resolution_s=floats,
    )
    burst_quantiles = st.builds(
        PromptBurstQuantiles,
        interval_s=floats,
        num_requests=counts,
        tokens=float_tuples,
    )
    latency_histogram = st.builds(LatencyHistogram, bounds_ms=float_tuples, cumulative=float_tuples, count=floats)
    traffic = st.builds(
        TrafficObservation,
        duration_s=floats,
        num_req=floats,
        isl=floats,
        osl=floats,
        isl_p90=opt_floats,
        osl_p90=opt_floats,
        ttft_ms=opt_floats,
        itl_ms=opt_floats,
        kv_hit_rate=opt_floats,
        accept_length=opt_floats,
        prompt_tokens_p99_250ms=opt_floats,
        prompt_tokens_p99_30s=opt_floats,
        prompt_arrivals=st.none() | recorded_arrivals,
        prompt_tokens_quantiles=st.lists(burst_quantiles, max_size=2).map(tuple),
        ttft_histogram=st.none() | latency_histogram,
        itl_histogram=st.none() | latency_histogram,
    )
    scheduled = st.builds(
        ScheduledRequests,
        num_prefill_requests=counts,
        sum_prefill_tokens=counts,
        var_prefill_length=floats,
        sum_prefill_kv_tokens=counts,
        num_decode_requests=counts,
        sum_decode_kv_tokens=counts,
        var_decode_kv_tokens=floats,
    )
    queued = st.builds(
        QueuedRequests,
        num_prefill_requests=counts,
        sum_prefill_tokens=counts,
        var_prefill_length=floats,
        num_decode_requests=counts,
        sum_decode_kv_tokens=counts,
        var_decode_kv_tokens=floats,
    )
    fpm = st.builds(
        ForwardPassMetrics,
        component=st.sampled_from(Component),
        worker_id=st.text(max_size=8),
        dp_rank=counts,
        counter_id=counts,
        wall_time_s=floats,
        scheduled=scheduled,
        queued=queued,
    )
    engine_limits = st.builds(
        EngineLimits,
        num_gpu=counts,
        max_num_batched_tokens=counts,
        max_num_seqs=counts,
        max_kv_tokens=counts,
        context_length=st.none() | counts,
        speculative_nextn=counts,
    )
    workers = st.builds(
        WorkerCounts, ready_prefill=counts, ready_decode=counts, expected_prefill=counts, expected_decode=counts
    )
    unplaced = st.builds(
        UnplacedRequests,
        component=st.sampled_from(Component),
        num_waiting=counts,
        num_unplaced=counts,
        num_rejected=counts,
    )
    applied_targets = st.builds(
        AppliedTargets, at_s=floats, num_prefill=st.none() | counts, num_decode=st.none() | counts
    )
    prediction = st.builds(
        Prediction,
        num_req=floats,
        isl=floats,
        osl=floats,
        quantile=st.none() | st.sampled_from(LengthQuantile).map(str),
        isl_quantile=opt_floats,
        osl_quantile=opt_floats,
    )
    kalman = st.builds(
        KalmanState,
        level=floats,
        trend=floats,
        cov_level=floats,
        cov_cross=floats,
        cov_trend=floats,
        num_points=counts,
        num_filtered=counts,
        q_level=floats,
        q_trend=floats,
        r=floats,
        log1p=st.booleans(),
    )
    orders = st.integers(min_value=0, max_value=2)
    arima_fit = st.builds(
        ArimaFit,
        p=orders,
        d=orders,
        q=orders,
        params=float_tuples,
        aic=floats,
        fitted_at=counts,
        converged=st.booleans(),
    )
    arima_search = st.builds(
        ArimaSearch,
        window_start=counts,
        window_end=counts,
        d=orders,
        num_evaluated=counts,
        best=st.none() | arima_fit,
    )
    arima_state = st.builds(
        ArimaState,
        log1p=st.booleans(),
        fit=st.none() | arima_fit,
        chosen_at=counts,
        search=st.none() | arima_search,
    )
    member_score = st.builds(MemberScore, member=st.sampled_from(EnsembleMember), loss=opt_floats, num_scored=counts)
    ensemble = st.builds(EnsembleState, num_points=counts, members=st.lists(member_score, max_size=3).map(tuple))
    series_model = st.builds(
        SeriesModel,
        kalman=st.none() | kalman,
        arima=st.none() | arima_state,
        ensemble=st.none() | ensemble,
    )
    history = st.builds(
        LoadHistory,
        num_req=float_tuples,
        isl=float_tuples,
        osl=float_tuples,
        seen_traffic=st.booleans(),
        isl_quantile=float_tuples,
        osl_quantile=float_tuples,
        length_quantile=st.sampled_from(LengthQuantile),
        num_windows=counts,
        num_req_model=series_model,
        isl_model=series_model,
        osl_model=series_model,
        isl_quantile_model=series_model,
        osl_quantile_model=series_model,
    )
    fpm_sample = st.builds(FpmSample, seq=counts, features=float_tuples, wall_time_s=floats)
    online_model = st.builds(
        OnlineModelState,
        role=st.sampled_from(PerfModelRole),
        samples=st.lists(fpm_sample, max_size=3).map(tuple),
        axis_min=float_tuples,
        axis_max=float_tuples,
        readiness=st.sampled_from(ModelReadiness),
        readiness_detail=st.text(max_size=12),
        intercept_s=opt_floats,
        coefficients=float_tuples,
        num_accepted=counts,
        num_idle_skipped=counts,
        num_invalid_skipped=counts,
        num_retired=counts,
        recent_isl=float_tuples,
        recent_decode_context=float_tuples,
        recent_num_decode=float_tuples,
    )
    online_perf = st.builds(OnlinePerfState, prefill=online_model, decode=online_model, agg=online_model)
    override = st.builds(
        ReplicaOverride,
        component=st.none() | st.sampled_from(Component),
        kind=st.sampled_from(OverrideType),
        replicas=st.none() | counts,
        reason=st.text(max_size=12),
    )
    partial_prediction = st.builds(
        PartialPrediction,
        num_req=opt_floats,
        isl=opt_floats,
        osl=opt_floats,
        quantile=st.none() | st.sampled_from(LengthQuantile).map(str),
        isl_quantile=opt_floats,
        osl_quantile=opt_floats,
    )
    observed = st.builds(ObservedValue, name=st.text(max_size=8), value=floats)
    held = st.builds(
        HeldResult,
        produced_at_s=floats,
        predictions=st.none() | partial_prediction,
        overrides=st.lists(override, max_size=3).map(tuple),
        final=st.booleans(),
        observations=st.lists(observed, max_size=2).map(tuple),
    )
    plugin_schedule = st.builds(
        PluginSchedule,
        plugin_id=st.text(max_size=12),
        registered_at_s=floats,
        last_run_at_s=opt_floats,
        held=st.none() | held,
        failures_at_s=float_tuples,
        circuit_opened_at_s=opt_floats,
    )
    remote_answer = st.builds(
        RemoteAnswer,
        plugin_id=st.text(max_size=8),
        phase=st.sampled_from(["observe", "predict", "propose", "reconcile", "constrain"]),
        reason=st.sampled_from(ReasonCode),
        detail=st.text(max_size=12),
        predictions=st.none() | partial_prediction,
        overrides=st.lists(override, max_size=2).map(tuple),
        final=st.booleans(),
        observations=st.lists(observed, max_size=2).map(tuple),
    )
    outside_change = st.builds(
        OutsideChange, component=st.sampled_from(Component), planner_replicas=counts, observed_replicas=counts
    )
    adopted_count = st.builds(
        AdoptedCount, component=st.sampled_from(Component), replicas=counts, at_s=floats, hold_until_s=floats
    )
    signal_status = st.builds(SignalStatus, signal=st.sampled_from(Signal), last_seen_s=opt_floats, num_misses=counts)
    tick_event = st.builds(
        TickEvent, reason=st.sampled_from(EventReason), message=st.text(max_size=20), warning=st.booleans()
    )
    inputs = st.builds(
        TickInputs,
        now_s=floats,
        loop=st.sampled_from(Loop),
        workers=workers,
        traffic=st.none() | traffic,
        fpm=st.lists(fpm, max_size=3).map(tuple),
        unplaced=st.lists(unplaced, max_size=2).map(tuple),
        remote=st.lists(remote_answer, max_size=2).map(tuple),
        applied=st.lists(applied_targets, max_size=2).map(tuple),
        outside_changes=st.lists(outside_change, max_size=2).map(tuple),
        workers_observed=st.booleans(),
    )
    pipeline_state = st.builds(PipelineState, plugins=st.lists(plugin_schedule, max_size=3).map(tuple))
    threshold_planner = st.builds(
        ThresholdPlannerState,
        interval_start_s=opt_floats,
        interval_num_prefill=counts,
        interval_num_decode=counts,
        prefill_queue_samples=float_tuples,
        decode_kv_samples=float_tuples,
        decode_grace_intervals_left=counts,
    )
    sized_need = st.builds(SizedNeed, at_s=floats, num_prefill=counts, num_decode=counts)
    pending_scale_up = st.builds(
        PendingScaleUp, component=st.sampled_from(Component), at_s=floats, target=counts, applied_at_s=opt_floats
    )
    startup_sample = st.builds(
        StartupSample, component=st.sampled_from(Component), at_s=floats, startup_s=floats, apply_s=opt_floats
    )
    startup = st.builds(
        StartupState,
        pending=st.lists(pending_scale_up, max_size=2).map(tuple),
        samples=st.lists(startup_sample, max_size=3).map(tuple),
    )
    horizon_window = st.builds(
        HorizonWindow,
        at_s=floats,
        planned_prefill=floats,
        observed_prefill=floats,
        planned_decode=floats,
        observed_decode=floats,
    )
    pool_feedback = st.builds(
        PoolFeedback, speed=floats, num_updates=counts, last_ready=counts, last_measured=opt_floats
    )
    capacity_feedback = st.builds(CapacityFeedback, prefill=pool_feedback, decode=pool_feedback)
    error_budget = st.builds(
        ErrorBudgetState,
        judged=floats,
        missed=floats,
        recent_judged=floats,
        recent_missed=floats,
        posture=floats,
        last_s=opt_floats,
    )
    burst_window = st.builds(PromptBurstWindow, at_s=floats, points=st.lists(burst_quantiles, max_size=2).map(tuple))
    state = st.builds(
        PlannerState,
        load_history=history,
        throughput_lower_bound_prefill=counts,
        throughput_lower_bound_decode=counts,
        num_throughput_ticks=counts,
        num_load_ticks=counts,
        perf_models=online_perf,
        pipeline=pipeline_state,
        threshold_planner=threshold_planner,
        last_kv_hit_rate=opt_floats,
        last_accept_length=opt_floats,
        recent_throughput_needs=st.lists(sized_need, max_size=3).map(tuple),
        startup=startup,
        horizon_windows=st.lists(horizon_window, max_size=3).map(tuple),
        capacity_feedback=capacity_feedback,
        recent_prompt_bursts=st.lists(burst_window, max_size=2).map(tuple),
        adopted_counts=st.lists(adopted_count, max_size=2).map(tuple),
        signals=st.lists(signal_status, max_size=4).map(tuple),
        error_budget=error_budget,
        last_demand_s=opt_floats,
    )
    step = st.builds(
        StepRecord,
        step=st.text(max_size=12),
        reason=st.sampled_from(ReasonCode),
        component=st.none() | st.sampled_from(Component),
        value=opt_floats,
        # strings that look like the JSON spelling of NaN/inf must stay strings in a `str` field
        detail=st.sampled_from(["", "nan", "inf", "-inf"]) | st.text(max_size=20),
    )
    proposal = st.builds(
        ReplicaProposal,
        component=st.sampled_from(Component),
        current=counts,
        desired=counts,
        reason=st.sampled_from(ReasonCode),
    )
    decision = st.builds(
        ScalingDecision, num_prefill=st.none() | counts, num_decode=st.none() | counts, advisory=st.booleans()
    )
    outcome = st.builds(
        TickOutcome,
        decision=decision,
        next_state=state,
        steps=st.lists(step, max_size=4).map(tuple),
        proposals=st.lists(proposal, max_size=2).map(tuple),
        prediction=st.none() | prediction,
        prediction_reason=st.none() | st.sampled_from(ReasonCode),
        reason=st.sampled_from(ReasonCode),
    )
    return {
        RecordedArrivals: recorded_arrivals,
        PromptBurstQuantiles: burst_quantiles,
        LatencyHistogram: latency_histogram,
        TrafficObservation: traffic,
        WorkerCounts: workers,
        ScheduledRequests: scheduled,
        QueuedRequests: queued,
        ForwardPassMetrics: fpm,
        EngineLimits: engine_limits,
        TickInputs: inputs,
        UnplacedRequests: unplaced,
        AppliedTargets: applied_targets,
        Prediction: prediction,
        KalmanState: kalman,
        ArimaFit: arima_fit,
        ArimaSearch: arima_search,
        ArimaState: arima_state,
        MemberScore: member_score,
        EnsembleState: ensemble,
        SeriesModel: series_model,
        LoadHistory: history,
        FpmSample: fpm_sample,
        OnlineModelState: online_model,
        OnlinePerfState: online_perf,
        ReplicaOverride: override,
        PartialPrediction: partial_prediction,
        HeldResult: held,
        ObservedValue: observed,
        RemoteAnswer: remote_answer,
        PluginSchedule: plugin_schedule,
        PipelineState: pipeline_state,
        ThresholdPlannerState: threshold_planner,
        SizedNeed: sized_need,
        PendingScaleUp: pending_scale_up,
        StartupSample: startup_sample,
        StartupState: startup,
        HorizonWindow: horizon_window,
        PoolFeedback: pool_feedback,
        CapacityFeedback: capacity_feedback,
        ErrorBudgetState: error_budget,
        PromptBurstWindow: burst_window,
        OutsideChange: outside_change,
        AdoptedCount: adopted_count,
        SignalStatus: signal_status,
        TickEvent: tick_event,
        PlannerState: state,
        StepRecord: step,
        ReplicaProposal: proposal,
        ScalingDecision: decision,
        TickOutcome: outcome,
        DecisionSummary: st.builds(DecisionSummary, stage=st.sampled_from(DecisionStage), text=st.text(max_size=160)),
    }


FINITE = domain_strategies(finite=True)
ANY_FLOAT = domain_strategies(finite=False)
DATACLASSES = list(FINITE)
IDS = [cls.__name__ for cls in DATACLASSES]


def through_json(value: Any) -> Any:
    """`to_jsonable`, then a strict JSON encode/decode as a JSONB column would do."""
    return json.loads(json.dumps(to_jsonable(value), allow_nan=False))


# --- round trips -----------------------------------------------------------------------------------------------


def test_every_domain_dataclass_is_covered() -> None:
    """The round-trip strategies cover every dataclass defined in `planner_core.domain` (its modules)."""
    defined = {
        obj
        for _, obj in inspect.getmembers(domain, inspect.isclass)
        if dataclasses.is_dataclass(obj) and obj.__module__.startswith(f"{domain.__name__}.")
    }
    assert defined == set(DATACLASSES)


@pytest.mark.parametrize("cls", DATACLASSES, ids=IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip_finite(cls: type, data: st.DataObject) -> None:
    """With finite floats, `from_jsonable(cls, json(to_jsonable(x))) == x` exactly (dataclass equality)."""
    value = data.draw(FINITE[cls])
    restored = from_jsonable(cls, through_json(value))
    assert restored == value
    assert type(restored) is cls


@pytest.mark.parametrize("cls", DATACLASSES, ids=IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip_with_nan_and_inf(cls: type, data: st.DataObject) -> None:
    """With NaN/inf allowed, the JSON form is strict JSON and survives a round trip unchanged."""
    value = data.draw(ANY_FLOAT[cls])
    encoded = through_json(value)  # allow_nan=False: raises if a NaN/inf float leaked through
    restored = from_jsonable(cls, encoded)
    assert type(restored) is cls
    assert to_jsonable(restored) == encoded


def test_round_trip_restores_enum_and_tuple_types() -> None:
    """Nested enums come back as enum members, sequences as tuples and None fields as None."""
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=2),
        next_state=PlannerState(load_history=LoadHistory(num_req=(1.0, 2.0), isl=(3.0, 4.0), osl=(5.0, 6.0))),
        steps=(StepRecord(step="decide", reason=ReasonCode.SCALE, component=Component.PREFILL, value=2.0),),
        proposals=(ReplicaProposal(component=Component.DECODE, current=1, desired=3, reason=ReasonCode.SCALE),),
        prediction=None,
        prediction_reason=ReasonCode.PREDICTOR_FALLBACK,
        reason=ReasonCode.SCALE,
    )
    restored = from_jsonable(TickOutcome, through_json(outcome))
    assert restored == outcome
    assert isinstance(restored.steps, tuple) and isinstance(restored.next_state.load_history.num_req, tuple)
    assert restored.steps[0].reason is ReasonCode.SCALE and restored.steps[0].component is Component.PREFILL
    assert restored.proposals[0].component is Component.DECODE
    assert restored.prediction is None and restored.decision.num_decode is None
    assert restored.prediction_reason is ReasonCode.PREDICTOR_FALLBACK


def test_missing_fields_take_their_defaults() -> None:
    """A JSON object without the optional fields rebuilds with the dataclass defaults."""
    assert from_jsonable(PlannerState, {}) == PlannerState()
    assert from_jsonable(TrafficObservation, {"duration_s": 60, "num_req": 1, "isl": 2, "osl": 3}) == (
        TrafficObservation(duration_s=60.0, num_req=1.0, isl=2.0, osl=3.0)
    )


def test_load_history_series_accessors_name_real_fields() -> None:
    """Every `LoadSeries` names a value field of `LoadHistory` and a `<series>_model` field next to it."""
    history = LoadHistory(num_req=(1.0,), isl=(2.0,), osl=(3.0,), isl_quantile=(4.0,), osl_quantile=(5.0,))
    assert [history.values(series) for series in LoadSeries] == [(1.0,), (2.0,), (3.0,), (4.0,), (5.0,)]
    assert all(history.model(series) == SeriesModel() for series in LoadSeries)


def test_history_stored_before_predictor_state_still_loads() -> None:
    """A history stored before the predictor state existed (four fields) loads with empty state and p90 series."""
    stored = {"num_req": [600.0], "isl": [1000.0], "osl": [100.0], "seen_traffic": True}
    restored = from_jsonable(LoadHistory, stored)
    assert restored == LoadHistory(num_req=(600.0,), isl=(1000.0,), osl=(100.0,), seen_traffic=True)
    assert restored.num_points == 1 and restored.length_quantile is LengthQuantile.P90


def test_nested_predictor_state_round_trips_with_types() -> None:
    """Predictor state nested three levels deep comes back as the same dataclasses, enums and tuples."""
    fit = ArimaFit(p=1, d=1, q=0, params=(0.5, 1.0), aic=12.5, fitted_at=70)
    model = SeriesModel(
        arima=ArimaState(log1p=True, fit=fit, chosen_at=64, search=ArimaSearch(window_start=7, window_end=70, d=1)),
        ensemble=EnsembleState(num_points=70, members=(MemberScore(member=EnsembleMember.KALMAN, loss=0.1),)),
    )
    history = LoadHistory(num_req=(1.0,), isl_model=model, length_quantile=LengthQuantile.P99)
    restored = from_jsonable(LoadHistory, through_json(history))
    assert restored == history
    assert restored.isl_model.ensemble is not None
    assert restored.isl_model.ensemble.members[0].member is EnsembleMember.KALMAN
    assert restored.length_quantile is LengthQuantile.P99
    assert restored.isl_model.arima is not None and restored.isl_model.arima.fit == fit


# --- NaN / inf in JSON ---------------------------------------------------------------------------------------------


def test_non_finite_floats_become_strings() -> None:
    """NaN, inf and -inf are written as the strings "nan", "inf", "-inf"; finite floats and None are untouched."""
    obs = TrafficObservation(duration_s=60.0, num_req=math.nan, isl=math.inf, osl=-math.inf, isl_p90=None, itl_ms=1.5)
    assert to_jsonable(obs) == {
        "duration_s": 60.0,
        "num_req": "nan",
        "isl": "inf",
        "osl": "-inf",
        "isl_p50": None,
        "isl_p90": None,
        "isl_p99": None,
        "osl_p50": None,
        "osl_p90": None,
        "osl_p99": None,
        "ttft_ms": None,
        "itl_ms": 1.5,
        "kv_hit_rate": None,
        "accept_length": None,
        **dict.fromkeys(domain.PROMPT_ARRIVAL_INTERVALS_S),
        "ttft_ms_p95": None,
        "ttft_ms_p99": None,
        "queue_ms": None,
        "prompt_arrivals": None,
        "prompt_tokens_quantiles": [],
        "ttft_histogram": None,
        "itl_histogram": None,
    }
    json.dumps(to_jsonable(obs), allow_nan=False)  # strict JSON: no bare NaN/Infinity tokens
    restored = from_jsonable(TrafficObservation, to_jsonable(obs))
    assert math.isnan(restored.num_req)
    assert (restored.isl, restored.osl) == (math.inf, -math.inf)
    assert restored.invalid_field() == "num_req"  # the rejection survives storage


def test_non_finite_floats_inside_tuples_and_optional_fields() -> None:
    """Non-finite values nested in `tuple[float, ...]` and `float | None` fields round-trip as floats."""
    history = LoadHistory(num_req=(1.0, math.inf), isl=(math.nan,), osl=(-math.inf, 0.0))
    encoded = to_jsonable(history)
    assert encoded["num_req"] == [1.0, "inf"] and encoded["isl"] == ["nan"] and encoded["osl"] == ["-inf", 0.0]
    restored = from_jsonable(LoadHistory, encoded)
    assert restored.num_req == (1.0, math.inf) and restored.osl == (-math.inf, 0.0)
    assert math.isnan(restored.isl[0])
    step = from_jsonable(StepRecord, to_jsonable(StepRecord(step="s", reason=ReasonCode.UNSET, value=math.nan)))
    assert step.value is not None and math.isnan(step.value)


def test_nan_looking_strings_in_str_fields_stay_strings() -> None:
    """A `str` field whose text is "nan" is not mistaken for a float on the way back."""
    step = StepRecord(step="inf", reason=ReasonCode.OBSERVED, detail="nan")
    assert from_jsonable(StepRecord, through_json(step)) == step


# --- TrafficObservation.invalid_field ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class InvalidFieldCase:
    id: str
    changes: dict[str, float | None]
    want: str | None


BASE_TRAFFIC = TrafficObservation(duration_s=60.0, num_req=600.0, isl=1000.0, osl=100.0)
TRAFFIC_FIELDS = [  # the figures
    f.name
    for f in dataclasses.fields(TrafficObservation)
    if f.name not in ("prompt_arrivals", "prompt_tokens_quantiles", "ttft_histogram", "itl_histogram")
]

INVALID_FIELD_CASES = [
    InvalidFieldCase(id="all-valid", changes={}, want=None),
    InvalidFieldCase(id="optional-fields-set", changes={"isl_p90": 2000.0, "itl_ms": 9.5}, want=None),
    InvalidFieldCase(id="zeros-are-valid", changes={"num_req": 0.0, "isl": 0.0, "osl": 0.0}, want=None),
    InvalidFieldCase(id="negative-zero-is-valid", changes={"num_req": -0.0}, want=None),
    InvalidFieldCase(id="tiny-negative", changes={"osl": -1e-300}, want="osl"),
    # declaration order: duration_s, num_req, isl, osl, isl_p90, osl_p90, ttft_ms, itl_ms
    InvalidFieldCase(id="first-of-two-bad", changes={"osl": math.nan, "isl": -1.0}, want="isl"),
    InvalidFieldCase(id="required-before-optional", changes={"itl_ms": math.inf, "num_req": math.nan}, want="num_req"),
    InvalidFieldCase(id="all-bad", changes={name: math.nan for name in TRAFFIC_FIELDS}, want="duration_s"),
    *(
        InvalidFieldCase(id=f"{name}-{label}", changes={name: value}, want=name)
        for name in TRAFFIC_FIELDS
        for label, value in (("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("negative", -1.0))
    ),
]


@pytest.mark.parametrize("case", INVALID_FIELD_CASES, ids=lambda c: c.id)
def test_invalid_field_names_first_bad_field(case: InvalidFieldCase) -> None:
    """`invalid_field()` names the first NaN, infinite or negative field in declaration order, else None."""
    assert dataclasses.replace(BASE_TRAFFIC, **case.changes).invalid_field() == case.want


@settings(max_examples=100, deadline=None)
@given(obs=ANY_FLOAT[TrafficObservation])
def test_invalid_field_agrees_with_definition(obs: TrafficObservation) -> None:
    """For any observation, `invalid_field()` is the first field that is not None and not finite-and-non-negative."""
    is_bad: Callable[[float | None], bool] = lambda v: v is not None and not (math.isfinite(v) and v >= 0)  # noqa: E731
    bad = [name for name in TRAFFIC_FIELDS if is_bad(getattr(obs, name))]
    assert obs.invalid_field() == (bad[0] if bad else None)
