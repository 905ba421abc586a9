"""The predictors by configured name: `PREDICTORS[config.load_predictor]`.

Importing this module imports every predictor module, none of which imports a heavy library at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from planner_core.config import LoadPredictorName
from planner_core.predict import arima, constant, ensemble, kalman, prophet
from planner_core.predict.base import Predictor

PREDICTORS: Mapping[LoadPredictorName, Predictor] = MappingProxyType(
    {
        LoadPredictorName.CONSTANT: constant,
        LoadPredictorName.ARIMA: arima,
        LoadPredictorName.PROPHET: prophet,
        LoadPredictorName.KALMAN: kalman,
        LoadPredictorName.ENSEMBLE: ensemble,
    }
)
