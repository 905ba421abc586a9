"""Load forecasting: turn each throughput window's traffic into the history predictors learn from, and forecast.

Public API (used by `planner_core.tick` and by evaluation tools):

* `observe_window(history, traffic, config) -> (history, step)` appends one window to the five series
  (`LoadSeries`: requests, mean ISL/OSL, configured ISL/OSL percentile) and advances the configured predictor's
  fitted state (Kalman filter, ARIMA order, ensemble scores), returning a new history.
* `predict_next(history, config) -> (prediction, step)` forecasts the next window with the configured predictor.

Both are pure: the old history is never changed and `predict_next` changes nothing, so a forecast can be recomputed
from a stored history at any time (exact replay), and the history stored after a tick is all a restarted planner
needs. Every fallback (warm-up, failed fit) is recorded as `predictor_fallback` with the reason.

Predictors live one per module (`constant`, `kalman`, `arima`, `prophet`, `ensemble`) and are looked up by
`LoadPredictorName` in `registry.PREDICTORS`. Importing this package imports no heavy library: statsmodels and
prophet are imported when the predictor that uses them first fits.
"""

from __future__ import annotations

import dataclasses
import math

from planner_core.config import PlannerConfig
from planner_core.domain import (
    LengthQuantile,
    LoadHistory,
    LoadSeries,
    Prediction,
    ReasonCode,
    SeriesModel,
    StepName,
    StepRecord,
    TrafficObservation,
)
from planner_core.predict.base import MAX_HISTORY_POINTS, SeriesForecast, SeriesView
from planner_core.predict.registry import PREDICTORS

__all__ = ["MAX_HISTORY_POINTS", "PREDICTORS", "observe_window", "predict_next", "series_view"]

_QUANTILE_SERIES = (LoadSeries.ISL_QUANTILE, LoadSeries.OSL_QUANTILE)


def series_view(history: LoadHistory, series: LoadSeries) -> SeriesView:
    """One series of `history` as the predictors see it."""
    return SeriesView(
        series=series, values=history.values(series), model=history.model(series), num_points=history.num_points
    )


def _idle_point(history: LoadHistory) -> tuple[dict[LoadSeries, float], StepRecord]:
    """An idle window after traffic: 0 requests, the last busy window's lengths (and percentiles) carried forward."""
    isl, osl = _last(history.isl), _last(history.osl)
    point = {
        LoadSeries.NUM_REQ: 0.0,
        LoadSeries.ISL: isl,
        LoadSeries.OSL: osl,
        LoadSeries.ISL_QUANTILE: _last(history.isl_quantile, isl),
        LoadSeries.OSL_QUANTILE: _last(history.osl_quantile, osl),
    }
    record = StepRecord(
        step=StepName.OBSERVE,
        reason=ReasonCode.IDLE_WINDOW,
        value=0.0,
        detail=f"idle window: 0 requests, ISL {isl:.0f} / OSL {osl:.0f} carried forward",
    )
    return point, record


def _busy_point(traffic: TrafficObservation, quantile: LengthQuantile) -> tuple[dict[LoadSeries, float], StepRecord]:
    """A window with traffic: its requests, mean lengths and percentile lengths (the mean where it has none)."""
    isl_q = traffic.length_quantile("isl", quantile.value)
    osl_q = traffic.length_quantile("osl", quantile.value)
    point = {
        LoadSeries.NUM_REQ: float(traffic.num_req),
        LoadSeries.ISL: float(traffic.isl),
        LoadSeries.OSL: float(traffic.osl),
        LoadSeries.ISL_QUANTILE: float(traffic.isl if isl_q is None else isl_q),
        LoadSeries.OSL_QUANTILE: float(traffic.osl if osl_q is None else osl_q),
    }
    shape = f"ISL {traffic.isl:.0f}, OSL {traffic.osl:.0f}"
    if isl_q is not None or osl_q is not None:
        shown = [f"{name} {value:.0f}" for name, value in (("ISL", isl_q), ("OSL", osl_q)) if value is not None]
        shape += f" ({quantile.value} {', '.join(shown)})"
    record = StepRecord(
        step=StepName.OBSERVE,
        reason=ReasonCode.OBSERVED,
        value=point[LoadSeries.NUM_REQ],
        detail=f"{point[LoadSeries.NUM_REQ]:.0f} requests in {traffic.duration_s:.0f} s, {shape}",
    )
    return point, record


def _advance(
    history: LoadHistory, point: dict[LoadSeries, float], quantile: LengthQuantile, config: PlannerConfig
) -> LoadHistory:
    """The history with `point` appended to every series and the configured predictor's state advanced on it."""
    predictor = PREDICTORS[config.load_predictor]
    values: dict[LoadSeries, tuple[float, ...]] = {}
    models: dict[LoadSeries, SeriesModel] = {}
    for series in LoadSeries:
        view = series_view(history, series)
        values[series] = view.appended(point[series]).values
        models[series] = predictor.advance(view, point[series], config)
    return LoadHistory(
        num_req=values[LoadSeries.NUM_REQ],
        isl=values[LoadSeries.ISL],
        osl=values[LoadSeries.OSL],
        isl_quantile=values[LoadSeries.ISL_QUANTILE],
        osl_quantile=values[LoadSeries.OSL_QUANTILE],
        seen_traffic=True,
        length_quantile=quantile,
        num_windows=history.num_points + 1,
        num_req_model=models[LoadSeries.NUM_REQ],
        isl_model=models[LoadSeries.ISL],
        osl_model=models[LoadSeries.OSL],
        isl_quantile_model=models[LoadSeries.ISL_QUANTILE],
        osl_quantile_model=models[LoadSeries.OSL_QUANTILE],
    )


def observe_window(
    history: LoadHistory, traffic: TrafficObservation, config: PlannerConfig
) -> tuple[LoadHistory, StepRecord]:
    """Append one throughput window to the history and advance the configured predictor's state.

    Leading idle windows (before any traffic was seen) are skipped: a predictor fed zeros before the first request
    would forecast zero for the first busy window. An idle window after traffic is fed as 0 requests with ISL/OSL
    (and their percentiles) carried forward from the last busy window, so the shape of requests is not forgotten.
    The percentile series take the configured `load_predictor_length_quantile` when the observation has it, else
    the window's mean; when the configured percentile changes they restart empty.

    The tick rejects NaN, infinite and negative observations before calling this; should one arrive anyway it is
    refused here too (history unchanged, step `no_traffic_data`).

    Args:
        history: the history after the previous window (not modified).
        traffic: the window just observed.
        config: selects the predictor whose state is advanced (others' state is dropped) and its parameters.

    Returns:
        The new history and the step record saying what was done.
    """
    bad_field = traffic.invalid_field()
    if bad_field is not None:
        detail = f"traffic.{bad_field} = {getattr(traffic, bad_field)!r} rejected (NaN, infinite or negative)"
        return history, StepRecord(step=StepName.OBSERVE, reason=ReasonCode.NO_TRAFFIC_DATA, detail=detail)

    quantile = config.load_predictor_length_quantile
    if history.length_quantile is not quantile:
        history = _restart_quantile_series(history, quantile)
    if traffic.num_req <= 0:
        if not history.seen_traffic:
            return history, StepRecord(
                step=StepName.OBSERVE, reason=ReasonCode.IDLE_WINDOW, value=0.0, detail="leading idle window skipped"
            )
        point, record = _idle_point(history)
    else:
        point, record = _busy_point(traffic, quantile)
    return _advance(history, point, quantile, config), record


def predict_next(history: LoadHistory, config: PlannerConfig) -> tuple[Prediction, StepRecord]:
    """Forecast the next window from the history with the configured predictor. Pure.

    Returns:
        The prediction (requests, mean ISL/OSL and the history's ISL/OSL percentile, all >= 0) and the step record:
        `predicted`, or `predictor_fallback` when any series used the fallback (warm-up, failed fit), with a detail
        saying why, e.g. "kalman: 3 of 5 points, constant used".
    """
    name = config.load_predictor.value
    if not history.num_req:
        prediction = Prediction(num_req=0.0, isl=0.0, osl=0.0, quantile=history.length_quantile.value)
        step = StepRecord(
            step=StepName.PREDICT,
            reason=ReasonCode.PREDICTOR_FALLBACK,
            value=0.0,
            detail=f"{name}: no history yet, forecast 0",
        )
        return prediction, step

    predictor = PREDICTORS[config.load_predictor]
    forecasts: dict[LoadSeries, SeriesForecast] = {}
    for series in LoadSeries:
        view = series_view(history, series)
        if view.values:
            forecasts[series] = _checked(predictor.forecast(view, config), view, name)
    quantile_forecasts = [forecasts.get(series) for series in _QUANTILE_SERIES]
    prediction = Prediction(
        num_req=forecasts[LoadSeries.NUM_REQ].value,
        isl=forecasts[LoadSeries.ISL].value,
        osl=forecasts[LoadSeries.OSL].value,
        quantile=history.length_quantile.value,
        isl_quantile=None if quantile_forecasts[0] is None else quantile_forecasts[0].value,
        osl_quantile=None if quantile_forecasts[1] is None else quantile_forecasts[1].value,
    )
    fallback = any(f.fallback for f in forecasts.values())
    step = StepRecord(
        step=StepName.PREDICT,
        reason=ReasonCode.PREDICTOR_FALLBACK if fallback else ReasonCode.PREDICTED,
        value=prediction.num_req,
        detail=_explain(forecasts),
    )
    return prediction, step


def _checked(forecast: SeriesForecast, view: SeriesView, name: str) -> SeriesForecast:
    """Guard the contract every predictor promises (finite, >= 0): anything else becomes a flagged fallback."""
    if math.isfinite(forecast.value) and forecast.value >= 0:
        return forecast
    return SeriesForecast(
        value=view.last, fallback=True, detail=f"{name}: forecast {forecast.value!r} is unusable; last value used"
    )


def _explain(forecasts: dict[LoadSeries, SeriesForecast]) -> str:
    """One detail for the step: shared by all series, or per series ("num_req: ...; isl: ...")."""
    details = {f.detail for f in forecasts.values()}
    if len(details) == 1:
        return details.pop()
    return "; ".join(f"{series.value}: {f.detail}" for series, f in forecasts.items())


def _last(values: tuple[float, ...], default: float = 0.0) -> float:
    return values[-1] if values else default


def _restart_quantile_series(history: LoadHistory, quantile: LengthQuantile) -> LoadHistory:
    """The history with empty percentile series: they held another percentile than the one now configured."""
    empty = SeriesModel()
    return dataclasses.replace(
        history,
        isl_quantile=(),
        osl_quantile=(),
        isl_quantile_model=empty,
        osl_quantile_model=empty,
        length_quantile=quantile,
    )
