"""Prophet predictor (Dynamo's `prophet`): Prophet refitted from scratch on the last `prophet_window_size` windows.

Timestamps are synthetic, as in Dynamo: point number i of the whole series sits at 2024-01-01 + i x the throughput
interval, so a window's timestamps do not depend on when it was replayed. Values are fitted in log1p space with
`load_predictor_log1p`. The forecast is Prophet's `yhat` for the next timestamp, back-transformed and clamped at 0.
Carries no state between windows; needs `MIN_MODEL_POINTS` (5) points. A series whose window is constant forecasts
that value without fitting. A failed fit falls back to the last value, flagged.

Cost: one Stan optimisation per series per window (~50 ms at 50 points on this project's machines, ~0.3 s at
2,000), so Prophet is the one predictor outside the 100 ms per-step budget. pandas and prophet are imported, and
cmdstanpy's logging silenced, inside `forecast` only.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import warnings

from planner_core.config import PlannerConfig
from planner_core.domain import SeriesModel
from planner_core.predict.base import (
    MIN_MODEL_POINTS,
    SeriesForecast,
    SeriesView,
    failed,
    from_model_space,
    is_constant,
    to_model_space,
    warm_up,
)

EPOCH = dt.datetime(2024, 1, 1)  # timestamp of the first point of every series (Dynamo's choice)


def advance(previous: SeriesView, value: float, config: PlannerConfig) -> SeriesModel:  # noqa: ARG001
    """No state: every forecast refits on the retained window."""
    return SeriesModel()


def forecast(series: SeriesView, config: PlannerConfig) -> SeriesForecast:
    """Prophet `yhat` for the next window from a fit on the last `prophet_window_size` points."""
    have = len(series.values)
    if have < MIN_MODEL_POINTS:
        return warm_up("prophet", series, have, MIN_MODEL_POINTS)
    values = series.values[-config.prophet_window_size :]
    if is_constant(values):
        return SeriesForecast(value=series.last, fallback=False, detail="prophet: constant series, its value used")
    try:
        yhat = _fit_and_predict(series, values, config)
    except Exception as exc:  # never silent: the step records the fallback and the error
        return failed("prophet", series, f"fit failed ({type(exc).__name__}: {exc})")
    value = from_model_space(yhat, config.load_predictor_log1p)
    if not math.isfinite(value):
        return failed("prophet", series, "forecast is not finite")
    return SeriesForecast(value=value, fallback=False, detail=f"prophet: fitted on {len(values)} points")


def _fit_and_predict(series: SeriesView, values: tuple[float, ...], config: PlannerConfig) -> float:
    """Fit Prophet on `values` (the newest points of `series`) and return `yhat` for the next step, in model space."""
    import pandas as pd
    from prophet import Prophet

    # cmdstanpy logs every optimisation at INFO through its own handler; silence it here, where Prophet is used.
    logging.getLogger("cmdstanpy").disabled = True
    step = dt.timedelta(seconds=config.throughput_adjustment_interval_seconds)
    first = series.num_points - len(values)  # zero-based position of the first value in the whole series
    frame = pd.DataFrame(
        {
            "ds": [EPOCH + (first + i) * step for i in range(len(values))],
            "y": [to_model_space(v, config.load_predictor_log1p) for v in values],
        }
    )
    future = pd.DataFrame({"ds": [EPOCH + series.num_points * step]})
    with warnings.catch_warnings():
        # Prophet's own use of deprecated pandas APIs warns on every fit; it says nothing about this forecast.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model = Prophet()
        model.fit(frame)
        return float(model.predict(future)["yhat"].iloc[0])
