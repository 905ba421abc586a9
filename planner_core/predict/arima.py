"""ARIMA predictor: statsmodels maximum-likelihood ARIMA on a bounded window, with a periodically re-chosen order.

Dynamo runs pmdarima's `auto_arima` once at 5 points and only updates that model afterwards, so the order picked on
the first five windows is kept for ever. Here, per series:

* **Window**: the last `FIT_WINDOW_POINTS` (64) values, in model space (log1p with `load_predictor_log1p`),
  standardised (z = (y - mean) / std) before fitting: ARIMA is affine-equivariant and the optimiser converges far
  faster on unit-scale data. 64 windows is 3.2 h at Dynamo's 180 s interval; older traffic says little about the
  next window, and fitting cost grows with the window.
* **Order choice**: d in {0, 1} by a KPSS level-stationarity test at 5 % on the window (d = 1 when stationarity is
  rejected, as pmdarima decides d), then (p, q) in {0, 1, 2} x {0, 1} by lowest AIC of the statsmodels fit (ties to
  the simpler order). Orders with more parameters than the window supports (n - d < 2k + 1 for k estimated
  parameters) are skipped, so the first choice, on 5 points, only considers white noise or a random walk.
* **When**: first on the series' first turn with at least 5 points, on its last 5 points (only white noise or a
  random walk fit that few, so this first choice completes at once); then whenever the series has grown by
  min(c, 64) points since the last choice started at point c: roughly at 5, 10, 20, 40, 80, then every 64 points.
  Early on the data doubles between choices, so the order picked on 5 points does not stick; once the window is
  full, 64 new points means the window the order was chosen on has been entirely replaced.
* **Cost control**: a statsmodels fit costs 5-60 ms on the project's 2-core machines (more under contention), too
  much to refit five series every window within the 100 ms budget per step. So maximum-likelihood work is rationed
  to one fit per window for all five series: series i takes its turn on windows whose position is i modulo 5. On
  its turn a series either evaluates the next candidate of a running order choice (on the window frozen when the
  choice started, so every candidate's AIC is comparable; a choice of 6 candidates completes within 30 windows)
  or re-estimates the parameters of the order in force on the current window (every 5 windows, starting the
  optimiser from the previous parameters).
* **Forecast** (`forecast`, every window): the parameters in force applied to the current 64-point window by the
  ARMA innovations recursion, one step ahead, mapped back and clamped at 0 (pure Python, ~0.1 ms). The recursion
  starts from zero pre-sample errors: for AR terms it equals statsmodels' state-space forecast; an MA term theta
  adds a start-up error that shrinks like theta^64, negligible unless |theta| is close to 1 (there a few percent).
  A window whose values are all equal forecasts that value.

Fallbacks, always flagged `predictor_fallback`: fewer than 5 points, or no order chosen yet (the last value is
used). A failed fit is never used: a failed candidate is not chosen, a failed re-estimation keeps the previous
parameters (the detail says from which point they are).

statsmodels and numpy are imported inside the functions that fit, never at module import.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Sequence

from planner_core.config import PlannerConfig
from planner_core.domain import ArimaFit, ArimaSearch, ArimaState, LoadSeries, SeriesModel
from planner_core.predict.base import (
    MIN_MODEL_POINTS,
    SeriesForecast,
    SeriesView,
    from_model_space,
    is_constant,
    to_model_space,
    warm_up,
)

FIT_WINDOW_POINTS = 64  # points each fit, order choice and forecast uses
MAX_P = 2  # autoregressive orders tried: 0..MAX_P
MAX_Q = 1  # moving-average orders tried: 0..MAX_Q
KPSS_ALPHA = 0.05  # KPSS p-value below which the level is taken as non-stationary (d = 1)
SERIES_TURNS = tuple(LoadSeries)  # series i has its turn on windows at positions i modulo len(SERIES_TURNS)


# --- order grid and schedule ---------------------------------------------------------------------------------


def candidate_orders(num_points: int, d: int) -> list[tuple[int, int, int]]:
    """Grid (p, d, q) a window of `num_points` values supports, simplest first.

    k estimated parameters = p + q + sigma2, + the mean when d = 0; a candidate needs n - d >= 2k + 1 points.
    """
    grid = sorted(((p, q) for p in range(MAX_P + 1) for q in range(MAX_Q + 1)), key=lambda pq: (sum(pq), pq))
    orders = []
    for p, q in grid:
        k = p + q + 1 + (1 if d == 0 else 0)
        if num_points - d >= 2 * k + 1:
            orders.append((p, d, q))
    return orders


def order_due(state: ArimaState, num_points: int) -> bool:
    """Whether a new order choice is due at point `num_points`: none yet, or grown by min(chosen_at, 64) points."""
    if state.fit is None:
        return True
    return num_points - state.chosen_at >= min(state.chosen_at, FIT_WINDOW_POINTS)


def has_turn(series: SeriesView) -> bool:
    """Whether this window is the series' turn for a maximum-likelihood fit (one series per window)."""
    return series.num_points % len(SERIES_TURNS) == SERIES_TURNS.index(series.series)


# --- numerics ------------------------------------------------------------------------------------------------


def _model_window(values: Sequence[float], log1p: bool) -> list[float]:
    return [to_model_space(v, log1p) for v in values]


def fit_order(
    window: Sequence[float], p: int, d: int, q: int, fitted_at: int, start: tuple[float, ...] | None = None
) -> ArimaFit:
    """Maximum-likelihood ARIMA(p, d, q) (statsmodels) on the standardised window.

    The innovation variance is concentrated out of the likelihood (one parameter fewer for the optimiser).

    Args:
        window: values in model space.
        p, d, q: the order.
        fitted_at: position of the window's newest point (stored with the fit).
        start: parameters to start the optimiser from (a previous fit of the same order), or None for
            statsmodels' own starting values.

    Raises:
        ValueError: the fit produced a non-finite parameter or AIC.
        Exception: whatever statsmodels raises for a model it cannot fit (callers treat it as "not fitted").
    """
    import numpy as np
    from statsmodels.tools.sm_exceptions import ConvergenceWarning
    from statsmodels.tsa.arima.model import ARIMA

    y = np.asarray(window, dtype=float)
    z = (y - y.mean()) / y.std()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # cov_type="none": standard errors are never used, and their numerical Hessian costs more than the fit.
        model = ARIMA(z, order=(p, d, q), concentrate_scale=True)
        result = model.fit(start_params=None if start is None else np.asarray(start), cov_type="none")
    params = tuple(float(v) for v in result.params)
    aic = float(result.aic)
    if not (math.isfinite(aic) and all(math.isfinite(v) for v in params)):
        raise ValueError(f"non-finite fit: aic {aic!r}, params {params!r}")
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return ArimaFit(p=p, d=d, q=q, params=params, aic=aic, fitted_at=fitted_at, converged=converged)


def one_step(fit: ArimaFit, window: Sequence[float]) -> float:
    """One-step forecast of `fit` applied to `window` (model space), in the window's units.

    With z the standardised window and u = z - mean (d = 0) or u = diff(z) (d = 1), the innovations are
    e(t) = u(t) - sum_i ar_i u(t-i) - sum_j ma_j e(t-j) (pre-sample u and e taken as 0), and
    u_hat = sum_i ar_i u(n+1-i) + sum_j ma_j e(n+1-j); z_hat = mean + u_hat (d = 0) or z(n) + u_hat (d = 1).
    """
    mean, std = statistics.fmean(window), statistics.pstdev(window)
    z = [(v - mean) / std for v in window]
    offset = 1 if fit.d == 0 else 0
    level = fit.params[0] if fit.d == 0 else 0.0
    ar = fit.params[offset : offset + fit.p]
    ma = fit.params[offset + fit.p : offset + fit.p + fit.q]
    u = [v - level for v in z] if fit.d == 0 else [b - a for a, b in zip(z, z[1:], strict=False)]
    errors: list[float] = []
    for t, value in enumerate(u):
        guess = sum(c * u[t - 1 - i] for i, c in enumerate(ar) if t - 1 - i >= 0)
        guess += sum(c * errors[t - 1 - j] for j, c in enumerate(ma) if t - 1 - j >= 0)
        errors.append(value - guess)
    n = len(u)
    u_next = sum(c * u[n - 1 - i] for i, c in enumerate(ar) if n - 1 - i >= 0)
    u_next += sum(c * errors[n - 1 - j] for j, c in enumerate(ma) if n - 1 - j >= 0)
    z_next = level + u_next if fit.d == 0 else z[-1] + u_next
    return mean + std * z_next


def differencing(window: Sequence[float]) -> int:
    """d = 1 when a KPSS test rejects level stationarity at `KPSS_ALPHA`, else d = 0."""
    import numpy as np
    from statsmodels.tsa.stattools import kpss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # p-values outside the KPSS table are clipped with a warning
        try:
            p_value = float(kpss(np.asarray(window, dtype=float), regression="c", nlags="auto")[1])
        except (ValueError, ZeroDivisionError, np.linalg.LinAlgError):
            return 0
    return 1 if p_value < KPSS_ALPHA else 0


# --- state transitions -----------------------------------------------------------------------------------------


def _frozen_window(series: SeriesView, search: ArimaSearch, log1p: bool) -> list[float] | None:
    """The values at positions `window_start`..`window_end` (model space), or None if no longer all retained."""
    first = series.num_points - len(series.values) + 1  # position of the oldest retained value
    if search.window_start < first or search.window_end > series.num_points:
        return None
    return _model_window(series.values[search.window_start - first : search.window_end - first + 1], log1p)


def _search_step(state: ArimaState, series: SeriesView) -> ArimaState:
    """Fit the next candidate of the running order choice; adopt the best order after the last candidate."""
    search = state.search
    assert search is not None
    window = _frozen_window(series, search, state.log1p)
    if window is None:  # the frozen window scrolled out of the retained history: start over on the next turn
        return dataclasses.replace(state, search=None)
    candidates = candidate_orders(len(window), search.d)
    best = search.best
    if search.num_evaluated < len(candidates):
        p, d, q = candidates[search.num_evaluated]
        try:
            fit = fit_order(window, p, d, q, fitted_at=search.window_end)
        except Exception:  # a candidate that cannot be fitted is simply not chosen
            fit = None
        if fit is not None and (best is None or fit.aic < best.aic):
            best = fit
    num_evaluated = search.num_evaluated + 1
    if num_evaluated < len(candidates):
        return dataclasses.replace(state, search=dataclasses.replace(search, num_evaluated=num_evaluated, best=best))
    # Choice complete. If no candidate could be fitted the previous order stays, and the choice is due again.
    return ArimaState(
        log1p=state.log1p,
        fit=best if best is not None else state.fit,
        chosen_at=search.window_end,
        search=None,
    )


def _refit(state: ArimaState, series: SeriesView) -> ArimaState:
    """Re-estimate the parameters of the order in force on the current window (kept as they are if that fails)."""
    fit = state.fit
    assert fit is not None
    window = _model_window(series.values[-FIT_WINDOW_POINTS:], state.log1p)
    if is_constant(tuple(window)):
        return state
    try:
        # Warm start from the parameters in force: a few windows later they are close to the new optimum, which
        # roughly halves the optimiser's work and keeps the parameters from jumping between local optima.
        new_fit = fit_order(window, fit.p, fit.d, fit.q, fitted_at=series.num_points, start=fit.params)
    except Exception:  # the previous parameters stay; forecasts say which point they are from
        return state
    return dataclasses.replace(state, fit=new_fit)


def current_state(series: SeriesView, config: PlannerConfig) -> ArimaState | None:
    """The stored state when it models the configured space (raw or log1p), else None."""
    state = series.model.arima
    if state is None or state.log1p != config.load_predictor_log1p:
        return None
    return state


def advance(previous: SeriesView, value: float, config: PlannerConfig) -> SeriesModel:
    """Do this window's share of model work for the series: at most one maximum-likelihood fit, on its turn."""
    series = previous.appended(value)
    state = current_state(previous, config) or ArimaState(log1p=config.load_predictor_log1p)
    if len(series.values) < MIN_MODEL_POINTS or not has_turn(series):
        return SeriesModel(arima=state)
    if state.search is None and order_due(state, series.num_points):
        # The first choice looks at the last 5 points only, so it completes on the series' first turn.
        size = MIN_MODEL_POINTS if state.chosen_at == 0 else FIT_WINDOW_POINTS
        window = _model_window(series.values[-size:], state.log1p)
        if is_constant(tuple(window)):  # nothing to choose on; try again on the next turn
            return SeriesModel(arima=state)
        search = ArimaSearch(
            window_start=series.num_points - len(window) + 1, window_end=series.num_points, d=differencing(window)
        )
        state = dataclasses.replace(state, search=search)
    if state.search is not None:
        return SeriesModel(arima=_search_step(state, series))
    return SeriesModel(arima=_refit(state, series))


def forecast(series: SeriesView, config: PlannerConfig) -> SeriesForecast:
    """The parameters in force applied to the last `FIT_WINDOW_POINTS` values, one step ahead (see module docstring)."""
    have = len(series.values)
    if have < MIN_MODEL_POINTS:
        return warm_up("arima", series, have, MIN_MODEL_POINTS)
    window = _model_window(series.values[-FIT_WINDOW_POINTS:], config.load_predictor_log1p)
    if is_constant(tuple(window)):
        return SeriesForecast(value=series.last, fallback=False, detail="arima: constant series, its value used")
    state = current_state(series, config)
    if state is None or state.fit is None:
        search = None if state is None else state.search
        searching = "" if search is None else f" ({search.num_evaluated} candidates fitted)"
        return SeriesForecast(
            value=series.last, fallback=True, detail=f"arima: no order chosen yet{searching}, constant used"
        )
    fit = state.fit
    value = from_model_space(one_step(fit, window), state.log1p)
    order = f"ARIMA({fit.p},{fit.d},{fit.q})"
    if not math.isfinite(value):
        return SeriesForecast(value=series.last, fallback=True, detail=f"arima: {order} forecast is not finite")
    note = "" if fit.converged else ", optimiser did not converge"
    return SeriesForecast(
        value=value,
        fallback=False,
        detail=f"arima: {order} chosen at point {state.chosen_at}, parameters from point {fit.fitted_at}{note}",
    )
