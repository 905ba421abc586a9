"""The throughput loop's forecast and the predictors' state: the load history of past windows and each series'
fitted model (Kalman, ARIMA, ensemble scores)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Forecast of the next throughput window.

    `isl_quantile` / `osl_quantile` forecast the configured percentile (`quantile`, e.g. "p90") of the lengths,
    for sizing on the distribution; None while the history holds no window yet. A window whose observation had no
    percentile contributes its mean to that series.
    """

    num_req: float
    isl: float
    osl: float
    quantile: str | None = None
    isl_quantile: float | None = None
    osl_quantile: float | None = None


class LengthQuantile(enum.StrEnum):
    """Which percentile of the request lengths (ISL/OSL) is forecast next to the mean."""

    P50 = "p50"  # median request
    P90 = "p90"  # one request in ten is longer
    P99 = "p99"  # one request in a hundred is longer


class LoadSeries(enum.StrEnum):
    """The per-window series the predictors forecast; each value is also the `LoadHistory` field holding it."""

    NUM_REQ = "num_req"  # requests per window
    ISL = "isl"  # mean input sequence length (tokens)
    OSL = "osl"  # mean output sequence length (tokens)
    ISL_QUANTILE = "isl_quantile"  # configured ISL percentile (tokens); the mean when a window has none
    OSL_QUANTILE = "osl_quantile"  # configured OSL percentile (tokens); the mean when a window has none


class EnsembleMember(enum.StrEnum):
    """Predictors the ensemble scores and chooses from (values equal their `LoadPredictorName`)."""

    CONSTANT = "constant"  # last value
    KALMAN = "kalman"  # local linear trend filter
    ARIMA = "arima"  # statsmodels ARIMA refitted on a bounded window


@dataclass(frozen=True, slots=True, kw_only=True)
class KalmanState:
    """Local-linear-trend Kalman filter of one series after its newest point, in model space.

    Model space is the raw value, or log1p of it when `log1p` is set. The state is [level, trend] with covariance
    P = [[cov_level, cov_cross], [cov_cross, cov_trend]]; the filter parameters it was run with are kept so a
    change of configuration is detected (the filter is then rebuilt from the retained points).

    Attributes:
        level: filtered level after the newest point (model-space units per window).
        trend: filtered change of the level per window.
        cov_level, cov_cross, cov_trend: entries of P.
        num_points: position of the newest filtered point in the series (1 = first point ever appended).
        num_filtered: points the filter has consumed (fewer than `num_points` when rebuilt from a bounded history).
        q_level, q_trend, r, log1p: the parameters the filter was run with.
    """

    level: float
    trend: float
    cov_level: float
    cov_cross: float
    cov_trend: float
    num_points: int
    num_filtered: int
    q_level: float
    q_trend: float
    r: float
    log1p: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ArimaFit:
    """An ARIMA(p, d, q) order with parameters estimated by maximum likelihood on one window.

    Attributes:
        p, d, q: autoregressive order, differencing order and moving-average order.
        params: statsmodels' parameter vector (innovation variance concentrated out), estimated on the
            standardised window (z = (y - mean) / std, model space): [mean (only when d = 0)], ar.L1 .. ar.Lp,
            ma.L1 .. ma.Lq.
        aic: Akaike information criterion of the fit (lower is better).
        fitted_at: position of the newest point of the window the parameters were estimated on.
        converged: whether the likelihood optimiser reported convergence.
    """

    p: int
    d: int
    q: int
    params: tuple[float, ...]
    aic: float
    fitted_at: int
    converged: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ArimaSearch:
    """An ARIMA order choice in progress: candidate orders are fitted one per turn on a frozen window.

    Attributes:
        window_start, window_end: positions of the oldest and newest points of the frozen window the candidates are
            compared on.
        d: differencing order chosen for that window (KPSS test).
        num_evaluated: candidates of the grid fitted so far.
        best: the lowest-AIC candidate so far, None if none could be fitted yet.
    """

    window_start: int
    window_end: int
    d: int
    num_evaluated: int = 0
    best: ArimaFit | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ArimaState:
    """The ARIMA predictor's state for one series: the order and parameters in force, and when they were chosen.

    Attributes:
        log1p: whether the series is modelled as log1p of its values.
        fit: the order and parameters in force; None until the first order choice completes.
        chosen_at: `window_end` of the search that chose the order in force (0 = never chosen).
        search: an order choice in progress, if any.
    """

    log1p: bool
    fit: ArimaFit | None = None
    chosen_at: int = 0
    search: ArimaSearch | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberScore:
    """One ensemble member's recent accuracy on one series.

    Attributes:
        member: which predictor.
        loss: exponentially weighted mean of |log1p(forecast) - log1p(actual)| over the scored windows; None
            until the first window is scored.
        num_scored: windows scored so far.
    """

    member: EnsembleMember
    loss: float | None = None
    num_scored: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EnsembleState:
    """Losses of every ensemble member on one series, up to and including point `num_points`."""

    num_points: int
    members: tuple[MemberScore, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesModel:
    """Fitted state the configured predictor carries for one series; None where that predictor needs none."""

    kalman: KalmanState | None = None
    arima: ArimaState | None = None
    ensemble: EnsembleState | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadHistory:
    """Observed per-window load the predictors learn from, plus the predictors' fitted state.

    A value: `planner_core.predict.observe_window` returns a new one per window, `predict_next` only reads it, and
    it is stored (as JSON) with every tick, so a restart or a replay continues from exactly this state.

    Attributes:
        num_req, isl, osl: requests per window and mean ISL/OSL (tokens), most recent last, bounded in length
            (`planner_core.predict.MAX_HISTORY_POINTS`).
        isl_quantile, osl_quantile: the `length_quantile` percentile of ISL/OSL per window (tokens); the window's
            mean where the observation had no percentile. Restarted when the configured percentile changes.
        length_quantile: which percentile the quantile series hold.
        seen_traffic: False until the first non-idle window: leading idle windows are skipped.
        num_windows: windows appended since the first busy one (the series keep only the newest of them).
        num_req_model .. osl_quantile_model: the configured predictor's fitted state per series.
    """

    num_req: tuple[float, ...] = ()
    isl: tuple[float, ...] = ()
    osl: tuple[float, ...] = ()
    seen_traffic: bool = False  # False until the first non-idle window: leading idle windows are skipped
    isl_quantile: tuple[float, ...] = ()
    osl_quantile: tuple[float, ...] = ()
    length_quantile: LengthQuantile = LengthQuantile.P90
    num_windows: int = 0
    num_req_model: SeriesModel = field(default_factory=SeriesModel)
    isl_model: SeriesModel = field(default_factory=SeriesModel)
    osl_model: SeriesModel = field(default_factory=SeriesModel)
    isl_quantile_model: SeriesModel = field(default_factory=SeriesModel)
    osl_quantile_model: SeriesModel = field(default_factory=SeriesModel)

    def values(self, series: LoadSeries) -> tuple[float, ...]:
        """The retained values of one series, most recent last."""
        return getattr(self, series.value)  # type: ignore[no-any-return]

    def model(self, series: LoadSeries) -> SeriesModel:
        """The fitted predictor state of one series."""
        return getattr(self, f"{series.value}_model")  # type: ignore[no-any-return]

    @property
    def num_points(self) -> int:
        """Position of the newest point (windows appended so far; at least the retained length)."""
        return max(self.num_windows, len(self.num_req))
