"""Kalman predictor: a local-linear-trend filter per series, as in Dynamo's `kalman` predictor.

Model (per window t, in model space: the value, or log1p of it with `load_predictor_log1p`):

    state x = [level, trend],  x(t) = F x(t-1) + w,  z(t) = H x(t) + v
    F = [[1, 1], [0, 1]],  H = [1, 0],  Q = cov(w) = diag(kalman_q_level, kalman_q_trend),  R = var(v) = kalman_r
    P0 = 1000 * I,  level(0) = first observation,  trend(0) = 0

`advance` runs one predict + update step per new point and stores the filter (`KalmanState`) in the history, so the
filter spans the whole run, not only the retained points, and costs O(1) per window. `forecast` is the predicted
level `level + trend`, clamped at 0 (back-transformed with expm1 in log space); it never moves the filter.

Arithmetic is plain Python on the 2x2 covariance (no numpy): faster than array calls at this size and exactly
reproducible. When the stored state is missing or was made with other parameters (a configuration change, or a
history written while another predictor was configured), the filter is rebuilt from the retained points.
"""

from __future__ import annotations

from planner_core.config import PlannerConfig
from planner_core.domain import KalmanState, SeriesModel
from planner_core.predict.base import SeriesForecast, SeriesView, from_model_space, to_model_space, warm_up

INITIAL_COVARIANCE = 1000.0  # P0 = 1000 * I: the first level and trend are barely trusted


def _start(z: float, num_points: int, config: PlannerConfig) -> KalmanState:
    """Filter initialised on its first observation `z` (model space): level z, trend 0, P = P0."""
    return KalmanState(
        level=z,
        trend=0.0,
        cov_level=INITIAL_COVARIANCE,
        cov_cross=0.0,
        cov_trend=INITIAL_COVARIANCE,
        num_points=num_points,
        num_filtered=1,
        q_level=config.kalman_q_level,
        q_trend=config.kalman_q_trend,
        r=config.kalman_r,
        log1p=config.load_predictor_log1p,
    )


def _step(state: KalmanState, z: float) -> KalmanState:
    """One predict + update step with observation `z` (model space).

    Predict: x = F x, P = F P F' + Q, i.e. level += trend and, with P = [[a, b], [b, c]],
    a' = a + 2b + c + q_level, b' = b + c, c' = c + q_trend.
    Update: innovation y = z - level', S = a' + r, gain K = [a', b'] / S; x += K y;
    P = (I - K H) P' = [[a' (1 - k0), b' (1 - k0)], [b' (1 - k0), c' - k1 b']].
    """
    level = state.level + state.trend
    a = state.cov_level + 2.0 * state.cov_cross + state.cov_trend + state.q_level
    b = state.cov_cross + state.cov_trend
    c = state.cov_trend + state.q_trend
    s = a + state.r
    k0, k1 = a / s, b / s
    innovation = z - level
    return KalmanState(
        level=level + k0 * innovation,
        trend=state.trend + k1 * innovation,
        cov_level=a * (1.0 - k0),
        cov_cross=b * (1.0 - k0),
        cov_trend=c - k1 * b,
        num_points=state.num_points + 1,
        num_filtered=state.num_filtered + 1,
        q_level=state.q_level,
        q_trend=state.q_trend,
        r=state.r,
        log1p=state.log1p,
    )


def _matches(state: KalmanState, config: PlannerConfig) -> bool:
    """Whether `state` was run with the configured parameters."""
    return (state.q_level, state.q_trend, state.r, state.log1p) == (
        config.kalman_q_level,
        config.kalman_q_trend,
        config.kalman_r,
        config.load_predictor_log1p,
    )


def filter_series(series: SeriesView, config: PlannerConfig) -> KalmanState | None:
    """The filter after the newest point: the stored one when it is current, else rebuilt from the retained values.

    Returns:
        The filter state, or None for an empty series.
    """
    state = series.model.kalman
    if state is not None and state.num_points == series.num_points and _matches(state, config):
        return state
    if not series.values:
        return None
    log1p = config.load_predictor_log1p
    first = series.num_points - len(series.values) + 1
    state = _start(to_model_space(series.values[0], log1p), first, config)
    for value in series.values[1:]:
        state = _step(state, to_model_space(value, log1p))
    return state


def advance(previous: SeriesView, value: float, config: PlannerConfig) -> SeriesModel:
    """Filter the new point: one predict + update step (or initialise the filter on the first point)."""
    state = filter_series(previous, config)
    if state is None:
        first = previous.num_points + 1  # also right for a series restarted in the middle of a run
        return SeriesModel(kalman=_start(to_model_space(value, config.load_predictor_log1p), first, config))
    return SeriesModel(kalman=_step(state, to_model_space(value, config.load_predictor_log1p)))


def forecast(series: SeriesView, config: PlannerConfig) -> SeriesForecast:
    """Predicted level for the next window: `level + trend`, back-transformed and clamped at 0.

    Below `kalman_min_points` filtered points the last value is used and flagged as a fallback.
    """
    state = filter_series(series, config)
    have = 0 if state is None else state.num_filtered
    if state is None or have < config.kalman_min_points:
        return warm_up("kalman", series, have, config.kalman_min_points)
    value = from_model_space(state.level + state.trend, state.log1p)
    return SeriesForecast(
        value=value,
        fallback=False,
        detail=f"kalman: level {state.level:.4g} + trend {state.trend:+.4g} after {state.num_filtered} points",
    )
