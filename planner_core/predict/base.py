"""What every load predictor implements, and the small helpers they share.

A predictor forecasts one series (requests per window, mean ISL, ...) one window ahead. It is two pure functions,
in the style of an online model `update(state, obs) -> state` / `predict(state)`:

* `advance(previous, value, config) -> SeriesModel`: the fitted state after the series gained `value` (the filter
  step of a Kalman filter, the periodic order choice of ARIMA, the loss update of the ensemble). Called once per
  window by `observe_window`.
* `forecast(series, config) -> SeriesForecast`: the forecast for the next window. Never changes anything, so
  calling it twice gives the same answer and a stored history can be re-forecast at any time.

Predictors are modules implementing this protocol, registered by `LoadPredictorName` in
`planner_core.predict.registry`. Heavy libraries (statsmodels, prophet) are imported inside the functions that use
them, never when this package is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from planner_core.config import PlannerConfig
from planner_core.domain import LoadSeries, SeriesModel

# Enough for every predictor window used here (ARIMA uses the last 64 points plus up to 30 more while an order
# choice runs, Prophet keeps 50 by default), small enough that the history stored as JSON with every tick stays
# ~25 kB (5 series x 256 floats).
MAX_HISTORY_POINTS = 256

# Points before a fitted model (ARIMA, Prophet) is used; Dynamo's minimum for both.
MIN_MODEL_POINTS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesView:
    """One series as a predictor sees it: retained values, fitted state and the position of the newest point.

    Attributes:
        series: which series this is.
        values: retained values, most recent last (at most `MAX_HISTORY_POINTS`).
        model: the predictor state after the newest value.
        num_points: position of the newest value in the whole series (>= len(values); older points were dropped).
    """

    series: LoadSeries
    values: tuple[float, ...]
    model: SeriesModel
    num_points: int

    @property
    def last(self) -> float:
        """The newest value, or 0 for an empty series."""
        return self.values[-1] if self.values else 0.0

    def appended(self, value: float) -> SeriesView:
        """The series with `value` appended (bounded); the model is carried over unchanged for `advance` to update."""
        return SeriesView(
            series=self.series,
            values=(*self.values, value)[-MAX_HISTORY_POINTS:],
            model=self.model,
            num_points=self.num_points + 1,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesForecast:
    """A one-window-ahead forecast of one series.

    Attributes:
        value: the forecast (value units: requests or tokens), finite and >= 0.
        fallback: True when the predictor's model was not used (warm-up, fit failure): the value is then the last
            observed one and the tick records `predictor_fallback`.
        detail: why, e.g. "kalman: 3 of 5 points, constant used".
    """

    value: float
    fallback: bool
    detail: str


class Predictor(Protocol):
    """One forecasting method. Implemented by the modules `constant`, `kalman`, `arima`, `prophet`, `ensemble`."""

    def advance(self, previous: SeriesView, value: float, config: PlannerConfig) -> SeriesModel:
        """State after the series gained `value`. Pure: `previous` is not changed."""
        ...

    def forecast(self, series: SeriesView, config: PlannerConfig) -> SeriesForecast:
        """Forecast for the window after the newest point. Pure: never changes `series`."""
        ...


def warm_up(name: str, series: SeriesView, have: int, need: int) -> SeriesForecast:
    """The warm-up fallback: the last value, flagged, e.g. "kalman: 3 of 5 points, constant used"."""
    return SeriesForecast(value=series.last, fallback=True, detail=f"{name}: {have} of {need} points, constant used")


def failed(name: str, series: SeriesView, why: str) -> SeriesForecast:
    """The failure fallback: the last value, flagged with the reason (never a silent fallback)."""
    return SeriesForecast(value=series.last, fallback=True, detail=f"{name}: {why}; last value used")


def to_model_space(value: float, log1p: bool) -> float:
    """`log1p(value)` when fitting in log space, else the value itself (values are >= 0)."""
    return math.log1p(value) if log1p else value


def from_model_space(value: float, log1p: bool) -> float:
    """Inverse of `to_model_space`, clamped to >= 0: `max(0, expm1(y))` in log space, else `max(0, y)`.

    Overflow in `expm1` gives +inf, which the caller rejects as non-finite.
    """
    if log1p:
        try:
            return max(0.0, math.expm1(value))
        except OverflowError:
            return math.inf
    return max(0.0, value)


def is_constant(values: tuple[float, ...]) -> bool:
    """Whether every value equals the first (a fitted model would add nothing but numerical noise)."""
    return all(v == values[0] for v in values)
