"""Conformance suite of the load predictors (`planner_core.predict`), plus targeted tests per predictor.

One suite, parametrized over every member of the registry (and the log1p variants of those that fit models),
checks what every predictor promises: deterministic; `predict_next` pure (history untouched, same answer twice);
forecasts finite and >= 0 on any non-negative series; no look-ahead (the forecast after a prefix equals the one
at the same point of the full run); leading idle windows skipped and idle windows after traffic carrying the
lengths forward; warm-up answered by the flagged constant fallback; and exact replay (the history stored as JSON
after every step, restored, gives identical forecasts and identical next histories).

Slow predictors get short series: ARIMA costs at most one statsmodels fit per window, Prophet one fit per varying
series per forecast (~40 ms each), so their runs keep ISL/OSL constant where the test does not need them to vary
(a constant series is forecast without fitting).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import LoadPredictorName, PlannerConfig, parse_config
from planner_core.domain import (
    ArimaFit,
    ArimaState,
    EnsembleMember,
    LengthQuantile,
    LoadHistory,
    LoadSeries,
    Loop,
    PlannerState,
    Prediction,
    ReasonCode,
    SeriesModel,
    StepRecord,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.predict import PREDICTORS, arima, ensemble, kalman, observe_window, predict_next, series_view
from planner_core.predict.base import MAX_HISTORY_POINTS, SeriesForecast, SeriesView
from planner_core.runtime.store.codec import from_jsonable, to_jsonable
from planner_core.tick import tick

WINDOW_S = 60

# --- cases ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictorCase:
    """A configured predictor and how much work the suite may give it."""

    id: str
    predictor: LoadPredictorName
    log1p: bool = False
    num_windows: int = 14  # length of the series most tests run
    num_examples: int = 25  # hypothesis examples
    warm_up_windows: int = 1  # windows before the first non-fallback forecast on a varying series
    all_fallback_windows: int | None = None  # windows where every series falls back (default warm_up_windows - 1)

    lengths_vary: bool = True  # False: only the request count varies in the suite's windows (one fit per step)

    @property
    def config(self) -> PlannerConfig:
        return make_config(load_predictor=self.predictor.value, load_predictor_log1p=self.log1p)

    def windows(self, n: int | None = None) -> list[TrafficObservation]:
        return varying_windows(self.num_windows if n is None else n, self.lengths_vary)


CASES = [
    PredictorCase(id="constant", predictor=LoadPredictorName.CONSTANT),
    PredictorCase(id="kalman", predictor=LoadPredictorName.KALMAN, warm_up_windows=5),
    PredictorCase(id="kalman-log1p", predictor=LoadPredictorName.KALMAN, log1p=True, warm_up_windows=5),
    # an order is chosen for series i at point 5 + i (one series per window): varying series forecast from 9
    PredictorCase(
        id="arima",
        predictor=LoadPredictorName.ARIMA,
        num_windows=12,
        num_examples=4,
        warm_up_windows=9,
        all_fallback_windows=4,
    ),
    PredictorCase(
        id="arima-log1p",
        predictor=LoadPredictorName.ARIMA,
        log1p=True,
        num_windows=12,
        num_examples=4,
        warm_up_windows=9,
        all_fallback_windows=4,
    ),
    PredictorCase(
        id="prophet",
        predictor=LoadPredictorName.PROPHET,
        num_windows=7,
        num_examples=2,
        warm_up_windows=5,
        lengths_vary=False,
    ),
    PredictorCase(
        id="prophet-log1p",
        predictor=LoadPredictorName.PROPHET,
        log1p=True,
        num_windows=7,
        num_examples=2,
        warm_up_windows=5,
        lengths_vary=False,
    ),
    # three scored windows: the first window cannot be scored, so forecasts are trusted from window 4
    PredictorCase(
        id="ensemble", predictor=LoadPredictorName.ENSEMBLE, num_windows=12, num_examples=4, warm_up_windows=4
    ),
    PredictorCase(
        id="ensemble-log1p",
        predictor=LoadPredictorName.ENSEMBLE,
        log1p=True,
        num_windows=12,
        num_examples=4,
        warm_up_windows=4,
    ),
]
IDS = [case.id for case in CASES]


def test_every_registered_predictor_is_in_the_suite() -> None:
    """The registry holds exactly the configurable predictors, and the suite covers each of them."""
    assert set(PREDICTORS) == set(LoadPredictorName)
    assert {case.predictor for case in CASES} == set(LoadPredictorName)


# --- helpers ----------------------------------------------------------------------------------------------------


def make_config(**overrides: Any) -> PlannerConfig:
    return parse_config({"throughput_adjustment_interval_seconds": WINDOW_S, **overrides}).policy


def window(num_req: float, isl: float = 1000.0, osl: float = 100.0, **percentiles: float | None) -> TrafficObservation:
    return TrafficObservation(duration_s=WINDOW_S, num_req=num_req, isl=isl, osl=osl, **percentiles)


def varying_windows(n: int, lengths_vary: bool = True) -> list[TrafficObservation]:
    """A busy, irregular but deterministic load with percentiles observed; every series varies unless
    `lengths_vary` is False (then only the request count does, so slow predictors fit one series)."""
    out = []
    for i in range(n):
        num_req = 300.0 + 40.0 * math.sin(i) + 7.0 * i
        isl = 1000.0 + 150.0 * math.cos(1.3 * i) if lengths_vary else 1000.0
        osl = 120.0 + 30.0 * math.sin(0.7 * i + 1.0) if lengths_vary else 120.0
        noise = (i % 3, i % 2) if lengths_vary else (0, 0)
        out.append(window(num_req, isl, osl, isl_p90=2.1 * isl + noise[0], osl_p90=2.5 * osl + noise[1]))
    return out


def requests_only(values: Sequence[float]) -> list[TrafficObservation]:
    """Windows where only the request count varies (constant lengths: slow predictors fit one series)."""
    return [window(v) for v in values]


def run(
    config: PlannerConfig, windows: Sequence[TrafficObservation], history: LoadHistory | None = None
) -> list[tuple[LoadHistory, Prediction, StepRecord]]:
    """Observe each window, then forecast: (history, prediction, predict step) after every window."""
    history = history if history is not None else LoadHistory()
    out = []
    for obs in windows:
        history, _ = observe_window(history, obs, config)
        prediction, step = predict_next(history, config)
        out.append((history, prediction, step))
    return out


def through_json(value: Any) -> Any:
    """As stored in a JSONB column: strict JSON encode, then decode."""
    return json.loads(json.dumps(to_jsonable(value), allow_nan=False))


def forecasts(prediction: Prediction) -> list[float]:
    values = [prediction.num_req, prediction.isl, prediction.osl, prediction.isl_quantile, prediction.osl_quantile]
    return [v for v in values if v is not None]


# --- the conformance suite --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_deterministic(case: PredictorCase) -> None:
    """Two independent runs over the same windows give equal histories, predictions and explanations."""
    windows = case.windows()
    assert run(case.config, windows) == run(case.config, windows)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_predict_is_pure(case: PredictorCase) -> None:
    """`predict_next` leaves the history as it was and answers the same when asked again."""
    history = LoadHistory()
    for obs in case.windows():
        history, _ = observe_window(history, obs, case.config)
        before = to_jsonable(history)
        first = predict_next(history, case.config)
        assert to_jsonable(history) == before
        assert predict_next(history, case.config) == first


load_values = st.one_of(
    st.just(0.0), st.floats(min_value=0.0, max_value=1e6, allow_nan=False), st.integers(0, 50).map(float)
)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forecasts_are_finite_and_non_negative(case: PredictorCase) -> None:
    """On any non-negative load (zeros, spikes, long flat runs) every forecast is finite and >= 0."""

    @settings(max_examples=case.num_examples, deadline=None)
    @given(
        rows=st.lists(st.tuples(load_values, load_values, load_values), min_size=1, max_size=case.num_windows),
    )
    def check(rows: list[tuple[float, float, float]]) -> None:
        windows = [window(n, i, o, isl_p90=2 * i, osl_p99=3 * o) for n, i, o in rows]
        for _, prediction, _ in run(case.config, windows):
            assert all(math.isfinite(v) and v >= 0 for v in forecasts(prediction)), prediction

    check()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_no_look_ahead(case: PredictorCase) -> None:
    """The forecast after observing a prefix equals the forecast at the same point within the full run."""
    windows = case.windows()
    full = run(case.config, windows)
    prefixes = range(1, len(windows)) if case.num_windows > 12 else (1, case.warm_up_windows, len(windows) - 1)
    for k in prefixes:
        assert run(case.config, windows[:k])[-1] == full[k - 1], f"prefix of {k} windows"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_replay_from_json_after_every_step_is_exact(case: PredictorCase) -> None:
    """Storing the history as JSON after every step and restarting from it changes nothing, forecasts included."""
    live = LoadHistory()
    restarted = LoadHistory()
    for obs in case.windows():
        live, _ = observe_window(live, obs, case.config)
        restarted, _ = observe_window(restarted, obs, case.config)
        restarted = from_jsonable(LoadHistory, through_json(restarted))
        assert restarted == live
        assert predict_next(restarted, case.config) == predict_next(live, case.config)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_leading_idle_windows_are_skipped(case: PredictorCase) -> None:
    """Idle windows before the first request leave the history empty, so the run is as if they never happened."""
    busy = requests_only([120.0, 150.0, 90.0, 160.0, 130.0, 170.0])
    idle = [window(0, 0, 0)] * 3
    with_idle = run(case.config, idle + busy)
    assert [h for h, _, _ in with_idle[:3]] == [LoadHistory()] * 3
    assert with_idle[3:] == run(case.config, busy)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_idle_window_after_traffic_carries_lengths_forward(case: PredictorCase) -> None:
    """An idle window after traffic is learned as 0 requests with the last ISL/OSL and percentiles repeated."""
    windows = [window(200.0 + 10 * i, 900.0 + i, 90.0, isl_p90=1800.0 + i, osl_p90=180.0) for i in range(5)]
    history, prediction, _ = run(case.config, [*windows, window(0, 0, 0)])[-1]
    assert history.num_req[-2:] == (240.0, 0.0)
    assert history.isl[-2:] == (904.0, 904.0) and history.osl[-1] == 90.0
    assert history.isl_quantile[-2:] == (1804.0, 1804.0) and history.osl_quantile[-1] == 180.0
    assert all(math.isfinite(v) and v >= 0 for v in forecasts(prediction))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_warm_up_uses_the_flagged_constant_fallback(case: PredictorCase) -> None:
    """Before its warm-up is over a predictor forecasts the last window and records `predictor_fallback`."""
    windows = case.windows(case.warm_up_windows)
    results = run(case.config, windows)
    all_fallback = case.warm_up_windows - 1 if case.all_fallback_windows is None else case.all_fallback_windows
    for i, ((history, prediction, step), obs) in enumerate(zip(results[:-1], windows, strict=False)):
        assert step.reason is ReasonCode.PREDICTOR_FALLBACK, step
        assert case.predictor.value in step.detail and "constant used" in step.detail
        if i < all_fallback:  # (ARIMA then gets an order for one series per window)
            assert (prediction.num_req, prediction.isl, prediction.osl) == (obs.num_req, obs.isl, obs.osl)
            assert prediction.isl_quantile == history.isl_quantile[-1] == obs.isl_p90
    _, _, last_step = results[-1]
    assert last_step.reason is ReasonCode.PREDICTED, last_step


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_empty_history_forecasts_zero_flagged(case: PredictorCase) -> None:
    """With no window yet every predictor forecasts 0 requests and says it had no history."""
    prediction, step = predict_next(LoadHistory(), case.config)
    assert (prediction.num_req, prediction.isl, prediction.osl) == (0.0, 0.0, 0.0)
    assert step.reason is ReasonCode.PREDICTOR_FALLBACK and "no history" in step.detail


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0], ids=["nan", "inf", "negative"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_unusable_observations_are_rejected_with_a_reason(case: PredictorCase, bad: float) -> None:
    """NaN, infinite or negative traffic never reaches a predictor: the tick holds and says which field."""
    history = run(case.config, requests_only([100.0, 120.0]))[-1][0]
    obs = window(bad)
    inputs = TickInputs(
        now_s=0.0,
        loop=Loop.THROUGHPUT,
        workers=WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1),
        traffic=obs,
    )
    config = make_config(optimization_target="sla", load_predictor=case.predictor.value)
    outcome = tick(inputs, PlannerState(load_history=history), config, None)
    (observe,) = [s for s in outcome.steps if s.step == "observe"]
    assert outcome.reason is ReasonCode.NO_TRAFFIC_DATA and "traffic.num_req" in observe.detail
    assert outcome.next_state.load_history == history
    # observe_window refuses it too, should a caller skip the tick's check
    unchanged, step = observe_window(history, obs, case.config)
    assert unchanged == history and step.reason is ReasonCode.NO_TRAFFIC_DATA


# --- history bounds, percentiles, heavy imports -----------------------------------------------------------------


def test_history_is_bounded() -> None:
    """Each series keeps the newest MAX_HISTORY_POINTS values; the position count keeps growing."""
    config = make_config(load_predictor="constant")
    history = LoadHistory()
    for i in range(MAX_HISTORY_POINTS + 10):
        history, _ = observe_window(history, window(float(i + 1)), config)
    assert all(len(history.values(series)) == MAX_HISTORY_POINTS for series in LoadSeries)
    assert history.num_req[-1] == MAX_HISTORY_POINTS + 10 and history.num_windows == MAX_HISTORY_POINTS + 10


@pytest.mark.parametrize("quantile", list(LengthQuantile), ids=[q.value for q in LengthQuantile])
def test_configured_length_percentile_is_learned_and_forecast(quantile: LengthQuantile) -> None:
    """The percentile series take the configured percentile of each window (the mean when it has none)."""
    config = make_config(load_predictor="constant", load_predictor_length_quantile=quantile.value)
    with_percentiles = window(100, 1000, 100, isl_p50=900, isl_p90=2000, isl_p99=5000, osl_p90=300)
    history, _ = observe_window(LoadHistory(), with_percentiles, config)
    prediction, _ = predict_next(history, config)
    want_isl = {LengthQuantile.P50: 900.0, LengthQuantile.P90: 2000.0, LengthQuantile.P99: 5000.0}[quantile]
    want_osl = 300.0 if quantile is LengthQuantile.P90 else 100.0  # only p90 of OSL observed; else the mean
    assert (prediction.quantile, prediction.isl_quantile, prediction.osl_quantile) == (quantile, want_isl, want_osl)
    history, _ = observe_window(history, window(100, 1100, 110), config)  # no percentiles: the mean is learned
    assert history.isl_quantile == (want_isl, 1100.0)


def test_changing_the_configured_percentile_restarts_the_percentile_series() -> None:
    """Switching p90 -> p99 drops the p90 values: one series never mixes two percentiles."""
    p90, p99 = (
        make_config(load_predictor="kalman"),
        make_config(load_predictor="kalman", load_predictor_length_quantile="p99"),
    )
    obs = window(100, 1000, 100, isl_p90=2000, isl_p99=5000, osl_p90=200, osl_p99=400)
    history = run(p90, [obs] * 3)[-1][0]
    assert history.isl_quantile == (2000.0,) * 3
    history, _ = observe_window(history, obs, p99)
    assert history.length_quantile is LengthQuantile.P99
    assert (history.isl_quantile, history.osl_quantile, history.num_req) == ((5000.0,), (400.0,), (100.0,) * 4)
    assert history.isl_quantile_model.kalman is not None and history.isl_quantile_model.kalman.num_filtered == 1


def test_state_of_other_predictors_is_dropped() -> None:
    """Only the configured predictor's state is carried: a stale Kalman filter never outlives a switch."""
    history = run(make_config(load_predictor="kalman"), requests_only([100.0, 110.0]))[-1][0]
    assert history.num_req_model.kalman is not None
    history, _ = observe_window(history, window(120.0), make_config(load_predictor="constant"))
    assert all(history.model(series) == SeriesModel() for series in LoadSeries)


def test_heavy_libraries_are_imported_only_by_the_predictors_that_use_them() -> None:
    """Importing the package and running constant/kalman leaves statsmodels, prophet, pandas, numpy unimported."""
    code = """
import sys
from planner_core.config import parse_config
from planner_core.domain import LoadHistory, TrafficObservation
from planner_core.predict import observe_window, predict_next
for name in ("constant", "kalman"):
    config = parse_config({"load_predictor": name, "load_predictor_log1p": name == "kalman"}).policy
    history = LoadHistory()
    for n in (10, 20, 15, 30, 25, 40, 35):
        history, _ = observe_window(history, TrafficObservation(duration_s=60, num_req=n, isl=n, osl=n), config)
        predict_next(history, config)
heavy = ("statsmodels", "prophet", "cmdstanpy", "pandas", "numpy", "scipy")
print(",".join(m for m in heavy if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == ""


# --- Kalman -----------------------------------------------------------------------------------------------------


def test_kalman_tracks_a_linear_ramp() -> None:
    """On y(t) = 100 + 10 t the filter learns the trend: the forecast of the next window is within 0.5 %."""
    config = make_config(load_predictor="kalman")
    ramp = [100.0 + 10.0 * t for t in range(40)]
    history, prediction, step = run(config, requests_only(ramp))[-1]
    state = history.num_req_model.kalman
    assert state is not None and state.trend == pytest.approx(10.0, rel=0.01)
    assert prediction.num_req == pytest.approx(500.0, rel=0.005)  # next value: 100 + 10 * 40
    assert step.reason is ReasonCode.PREDICTED


def test_kalman_matches_the_matrix_form_of_the_filter() -> None:
    """The scalar update equals x = F x, P = F P F' + Q; K = P H'/(H P H' + R); x += K (z - H x); P = (I - K H) P."""
    np = pytest.importorskip("numpy")
    config = make_config(load_predictor="kalman", kalman_q_level=2.0, kalman_q_trend=0.3, kalman_r=7.0)
    values = [120.0, 95.0, 130.0, 160.0, 140.0, 210.0, 190.0, 230.0]
    f, h = np.array([[1.0, 1.0], [0.0, 1.0]]), np.array([[1.0, 0.0]])
    q, r = np.diag([2.0, 0.3]), 7.0
    x, p = np.array([[values[0]], [0.0]]), 1000.0 * np.eye(2)
    for z in values[1:]:
        x, p = f @ x, f @ p @ f.T + q
        gain = p @ h.T / (h @ p @ h.T + r)
        x, p = x + gain * (z - (h @ x).item()), (np.eye(2) - gain @ h) @ p
    history = run(config, requests_only(values))[-1][0]
    state = history.num_req_model.kalman
    assert state is not None
    got = [state.level, state.trend, state.cov_level, state.cov_cross, state.cov_trend]
    assert got == pytest.approx([x[0, 0], x[1, 0], p[0, 0], p[0, 1], p[1, 1]], rel=1e-9)


def test_kalman_parameters_and_minimum_points_come_from_the_config() -> None:
    """`kalman_min_points` sets the warm-up and the q/r parameters are stored with the filter."""
    config = make_config(load_predictor="kalman", kalman_min_points=3, kalman_r=2.5)
    results = run(config, requests_only([100.0, 120.0, 140.0]))
    assert [step.reason for _, _, step in results] == [ReasonCode.PREDICTOR_FALLBACK] * 2 + [ReasonCode.PREDICTED]
    assert results[1][2].detail == "kalman: 2 of 3 points, constant used"
    state = results[-1][0].num_req_model.kalman
    assert state is not None and (state.r, state.num_filtered) == (2.5, 3)


def test_kalman_rebuilds_a_filter_made_with_other_parameters() -> None:
    """A filter stored under other q/r is rebuilt from the retained points, equal to a run under the new config."""
    values = requests_only([100.0, 130.0, 110.0, 170.0, 150.0, 190.0])
    old, new = make_config(load_predictor="kalman", kalman_r=50.0), make_config(load_predictor="kalman", kalman_r=1.0)
    history = run(old, values)[-1][0]
    assert predict_next(history, new) == predict_next(run(new, values)[-1][0], new)


def test_kalman_log1p_forecasts_are_clamped_and_finite() -> None:
    """Falling to zero in log space never forecasts below 0."""
    config = make_config(load_predictor="kalman", load_predictor_log1p=True)
    results = run(config, requests_only([500.0, 200.0, 50.0, 5.0, 0.0, 0.0, 0.0]))
    assert all(p.num_req >= 0 and math.isfinite(p.num_req) for _, p, _ in results)


# --- ARIMA ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("chosen_at", "num_points", "due"),
    [
        (5, 9, False),  # 9 - 5 = 4 < min(5, 64)
        (5, 10, True),  # 10 - 5 = 5: the data has doubled
        (40, 79, False),
        (40, 80, True),
        (100, 163, False),  # 63 < min(100, 64)
        (100, 164, True),  # the 64-point window has been replaced
    ],
)
def test_arima_order_due_at_the_documented_cadence(chosen_at: int, num_points: int, due: bool) -> None:
    """An order is re-chosen once the series has grown by min(points at the last choice, 64)."""
    fit = ArimaFit(p=1, d=0, q=0, params=(0.0, 0.5), aic=1.0, fitted_at=chosen_at)
    state = ArimaState(log1p=False, fit=fit, chosen_at=chosen_at)
    assert arima.order_due(state, num_points) is due
    assert arima.order_due(ArimaState(log1p=False), num_points) is True  # never chosen: always due


def test_arima_candidate_grid_respects_the_window_size() -> None:
    """5 points allow white noise or a random walk only; a full window allows the whole p x q grid."""
    assert arima.candidate_orders(5, 0) == [(0, 0, 0)]
    assert arima.candidate_orders(5, 1) == [(0, 1, 0)]
    assert arima.candidate_orders(64, 1) == [(0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1), (2, 1, 0), (2, 1, 1)]


def test_arima_orders_are_chosen_and_rechosen_on_schedule_with_one_fit_per_window() -> None:
    """Over 100 windows: the first order is chosen at point 5, every later choice starts on the series' turn exactly
    when due, nothing changes off-turn, and no window does model work for more than one of the five series."""
    config = make_config(load_predictor="arima")
    history = LoadHistory()
    chosen: list[int] = []
    for obs in varying_windows(100):
        previous = history
        history, _ = observe_window(history, obs, config)
        t = history.num_points
        num_series_worked = 0
        for series in LoadSeries:
            old = previous.model(series).arima or ArimaState(log1p=False)
            new = history.model(series).arima
            assert new is not None
            turn = arima.has_turn(series_view(history, series))
            if (new.search, new.fit, new.chosen_at) != (old.search, old.fit, old.chosen_at):
                assert turn, f"{series} changed off its turn at {t}"
                num_series_worked += 1
            started = (new.search is not None and new.search.window_end == t) or new.chosen_at == t
            if started:
                assert old.search is None and arima.order_due(old, t), f"{series} choice started early at {t}"
            elif turn and old.search is None and len(history.values(series)) >= 5:
                assert not arima.order_due(old, t), f"{series} choice due at {t} but not started"
            if series is LoadSeries.NUM_REQ and new.chosen_at != old.chosen_at:
                chosen.append(new.chosen_at)
        assert num_series_worked <= 1, f"window {t}: model work for {num_series_worked} series"
    assert chosen[0] == 5  # 5 points support one candidate only: chosen at once
    assert len(chosen) >= 3  # re-chosen as the data doubles
    final = history.num_req_model.arima
    assert final is not None and final.fit is not None
    assert final.fit.fitted_at > final.chosen_at  # parameters re-estimated on newer windows since the choice


def test_arima_forecast_equals_statsmodels_state_space_forecast() -> None:
    """The stored parameters applied by the innovations recursion give statsmodels' own (Kalman filter) one-step
    forecast: exactly for AR terms, and up to a start-up error that has died out for MA terms away from +/-1."""
    from statsmodels.tsa.arima.model import ARIMA

    np = pytest.importorskip("numpy")
    values = [300.0 + 40.0 * math.sin(i) + 5.0 * math.cos(3 * i) + 20.0 * math.sin(i * i) for i in range(64)]
    y = np.asarray(values)
    z = (y - y.mean()) / y.std()
    for p, d, q in ((1, 0, 0), (2, 0, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)):
        fit = arima.fit_order(values, p, d, q, fitted_at=64)
        ma = fit.params[(1 if d == 0 else 0) + p :][:q]
        assert all(abs(c) < 0.95 for c in ma), (p, d, q, ma)  # the series is chosen so no MA term nears +/-1
        model = ARIMA(z, order=(p, d, q), concentrate_scale=True)
        statsmodels_step = float(model.filter(np.asarray(fit.params)).forecast(1)[0])
        assert arima.one_step(fit, values) == pytest.approx(y.mean() + y.std() * statsmodels_step, rel=1e-6)


def test_arima_constant_series_forecasts_the_constant() -> None:
    """A constant series is forecast as that constant, without fitting (and not as a fallback)."""
    config = make_config(load_predictor="arima")
    results = run(config, requests_only([250.0] * 8))
    assert results[-1][1].num_req == 250.0 and results[-1][2].reason is ReasonCode.PREDICTED
    assert "constant series" in results[-1][2].detail


def test_arima_without_a_chosen_order_falls_back_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """If no fit ever succeeds the forecast is the last value, flagged, never silently."""

    def failing_fit(*args: object, **kwargs: object) -> None:
        raise ValueError("synthetic fit failure")

    monkeypatch.setattr(arima, "fit_order", failing_fit)
    config = make_config(load_predictor="arima")
    history, prediction, step = run(config, requests_only([100.0, 140.0, 90.0, 180.0, 120.0, 160.0, 130.0]))[-1]
    assert step.reason is ReasonCode.PREDICTOR_FALLBACK
    assert "arima: no order chosen yet" in step.detail
    assert prediction.num_req == 130.0
    state = history.num_req_model.arima
    assert state is not None and state.fit is None


def test_predict_guards_against_an_unusable_forecast() -> None:
    """A predictor answering NaN or a negative value is replaced by the flagged last value."""
    from planner_core.predict import _checked

    view = SeriesView(series=LoadSeries.NUM_REQ, values=(5.0,), model=SeriesModel(), num_points=1)
    for bad in (math.nan, math.inf, -1.0):
        guarded = _checked(SeriesForecast(value=bad, fallback=False, detail="x"), view, "arima")
        assert (guarded.value, guarded.fallback) == (5.0, True) and "unusable" in guarded.detail


# --- ensemble ---------------------------------------------------------------------------------------------------


def chosen_member(step: StepRecord) -> str:
    """The member named in the num_req part of an ensemble step detail."""
    part = step.detail.split(";")[0]
    return part.split("ensemble: ")[1].split(" has the lowest loss")[0]


def test_ensemble_follows_the_member_that_is_clearly_best() -> None:
    """On a ramp the trend-following Kalman member wins; on a flat, noisy load it is not the constant member."""
    config = make_config(load_predictor="ensemble")
    ramp = run(config, requests_only([100.0 + 25.0 * t for t in range(20)]))
    _, prediction, step = ramp[-1]
    assert step.reason is ReasonCode.PREDICTED and chosen_member(step) == "kalman"
    assert prediction.num_req == pytest.approx(600.0, rel=0.01)  # 100 + 25 * 20
    # alternating load: last-value forecasts are always off by the full swing; the other members average it out
    alternating = run(config, requests_only([100.0 + (200.0 if t % 2 else 0.0) + (t * 7 % 5) for t in range(24)]))
    assert chosen_member(alternating[-1][2]) != "constant"


def test_ensemble_losses_are_exponentially_weighted_log_errors() -> None:
    """Loss = 0.7 L + 0.3 |log1p(forecast) - log1p(actual)|, scored on each window once it is observed."""
    config = make_config(load_predictor="ensemble")
    history = run(config, requests_only([100.0, 200.0, 50.0]))[-1][0]
    state = history.num_req_model.ensemble
    assert state is not None
    constant_score = next(s for s in state.members if s.member is EnsembleMember.CONSTANT)
    e1 = abs(math.log1p(100.0) - math.log1p(200.0))  # window 2 forecast by window 1's value
    e2 = abs(math.log1p(200.0) - math.log1p(50.0))
    assert constant_score.num_scored == 2
    assert constant_score.loss == pytest.approx(0.7 * e1 + 0.3 * e2)


def test_ensemble_reacts_to_a_burst() -> None:
    """A window far above the recent level is forecast to last at least one more window, and the step says so."""
    config = make_config(load_predictor="ensemble")
    steady = [100.0 + (30.0 if t % 2 else 0.0) for t in range(15)]  # the constant member is off by 30 each window
    _, prediction, step = run(config, requests_only([*steady, 1000.0]))[-1]
    assert prediction.num_req >= 1000.0
    assert "burst: last 1000" in step.detail


@pytest.mark.parametrize(
    ("last", "burst"),
    [(200.0, False), (200.0 + 1e-9, True), (199.0, False)],
    ids=["exactly-2x", "just-above", "below"],
)
def test_burst_threshold(last: float, burst: bool) -> None:
    """A burst is strictly more than 2x the mean of the previous 5 values (here 100)."""
    values = (50.0, 150.0, 100.0, 80.0, 120.0, last)
    assert (ensemble.burst_level(values) is not None) is burst


def test_ensemble_warm_up_names_the_scored_windows() -> None:
    """Until every member has 3 scored windows the constant member is used, flagged, and the count is shown."""
    config = make_config(load_predictor="ensemble")
    steps = [step for _, _, step in run(config, requests_only([100.0, 120.0, 110.0, 130.0]))]
    assert [s.reason for s in steps] == [ReasonCode.PREDICTOR_FALLBACK] * 3 + [ReasonCode.PREDICTED]
    assert steps[1].detail.startswith("ensemble: 1 of 3 scored windows, constant used")


def test_kalman_step_is_cheap() -> None:
    """A Kalman step (observe + predict, five series) is plain arithmetic: well under 5 ms even on a busy machine."""
    import time

    config = make_config(load_predictor="kalman")
    history = run(config, varying_windows(300))[-1][0]
    costs = []
    for obs in varying_windows(50):
        start = time.perf_counter()
        history, _ = observe_window(history, obs, config)
        predict_next(history, config)
        costs.append(time.perf_counter() - start)
    assert sorted(costs)[len(costs) // 2] < 0.005


def test_series_view_of_a_hand_built_history() -> None:
    """A history built without predictor state still forecasts: the Kalman filter is rebuilt from its values."""
    history = LoadHistory(num_req=(100.0, 110.0, 120.0, 130.0, 140.0), isl=(1.0,) * 5, osl=(1.0,) * 5)
    prediction, step = predict_next(history, make_config(load_predictor="kalman"))
    assert step.reason is ReasonCode.PREDICTED and prediction.num_req > 140.0
    assert prediction.isl_quantile is None  # no percentile series in that history
    assert kalman.filter_series(series_view(history, LoadSeries.NUM_REQ), make_config()) is not None
