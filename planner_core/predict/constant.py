"""Constant predictor: the next window looks like the last one (Dynamo's `constant`).

Carries no fitted state. Needs one point; an empty series forecasts 0 and says so.
"""

from __future__ import annotations

from planner_core.config import PlannerConfig
from planner_core.domain import SeriesModel
from planner_core.predict.base import SeriesForecast, SeriesView, warm_up


def advance(previous: SeriesView, value: float, config: PlannerConfig) -> SeriesModel:  # noqa: ARG001
    """No state: the last value is read from the series itself."""
    return SeriesModel()


def forecast(series: SeriesView, config: PlannerConfig) -> SeriesForecast:  # noqa: ARG001
    """The last value: `y_hat(t+1) = y(t)`; 0 with a fallback flag while the series is empty."""
    if not series.values:
        return warm_up("constant", series, 0, 1)
    return SeriesForecast(value=series.last, fallback=False, detail="constant: last window")
