"""Ensemble predictor (ours, not Dynamo's): follow whichever member forecast the recent windows best.

Members: constant, kalman and arima, each run exactly as when configured alone (same parameters, same log1p
setting, same state). Prophet is left out: one Prophet fit per series per window (~50 ms at 50 points on the
project's machines, five series) costs more than the whole 100 ms budget per step.

Per series, when a window's actual value arrives (`advance`):

1. **Score**: every member forecasts that window from the history *before* it (a pure function of the previous
   history, so replay is exact), and the error e = |log1p(forecast) - log1p(actual)| (the error of Dynamo's
   predictor sweep: scale-free, so requests and tokens are scored alike) updates the member's loss, an
   exponentially weighted mean L = (1 - `LOSS_WEIGHT`) L + `LOSS_WEIGHT` e (L = e on the first scored window).
   With a weight of 0.3 a window's error has lost half its influence after 2 windows: recent enough to follow a
   change of regime, smooth enough not to flip on one lucky forecast.
2. **Advance** every member's own state (Kalman filter, ARIMA order and parameters).

`forecast` asks every member for the next window and returns the forecast of the member with the lowest loss (ties
to the simpler member: constant, kalman, arima). Until every member has `MIN_SCORED_WINDOWS` scored windows the
constant member is used and the step says `predictor_fallback`.

**Burst rule**: when the newest value is more than `BURST_RATIO` (2x) the mean of the `BURST_LOOKBACK` (5) values
before it, the forecast is at least the newest value. Losses only react after a burst has cost a member a window;
the rule covers that first window, where forecasting the old level is what breaks the SLA.
"""

from __future__ import annotations

import math

from planner_core.config import PlannerConfig
from planner_core.domain import EnsembleMember, EnsembleState, MemberScore, SeriesModel
from planner_core.predict import arima, constant, kalman
from planner_core.predict.base import Predictor, SeriesForecast, SeriesView

LOSS_WEIGHT = 0.3  # weight of the newest error in the exponentially weighted loss
MIN_SCORED_WINDOWS = 3  # scored windows every member needs before losses are trusted
BURST_RATIO = 2.0  # a burst: newest value > BURST_RATIO x mean of the previous BURST_LOOKBACK values
BURST_LOOKBACK = 5  # values before the newest one that define the recent level

MEMBERS: tuple[tuple[EnsembleMember, Predictor], ...] = (
    (EnsembleMember.CONSTANT, constant),
    (EnsembleMember.KALMAN, kalman),
    (EnsembleMember.ARIMA, arima),
)


def log_error(forecast: float, actual: float) -> float:
    """|log1p(forecast) - log1p(actual)| for values >= 0."""
    return abs(math.log1p(forecast) - math.log1p(actual))


def _scores(series: SeriesView) -> dict[EnsembleMember, MemberScore]:
    """The stored scores when they are up to date with the series' newest point, else fresh (unscored) ones."""
    state = series.model.ensemble
    if state is None or state.num_points != series.num_points:
        return {member: MemberScore(member=member) for member, _ in MEMBERS}
    return {score.member: score for score in state.members}


def advance(previous: SeriesView, value: float, config: PlannerConfig) -> SeriesModel:
    """Score every member's forecast of `value` (made from `previous`), then advance every member's state."""
    old = _scores(previous)
    scores = []
    for member, predictor in MEMBERS:
        score = old.get(member, MemberScore(member=member))
        if previous.values:  # no forecast to score before the first point
            error = log_error(predictor.forecast(previous, config).value, value)
            loss = error if score.loss is None else (1.0 - LOSS_WEIGHT) * score.loss + LOSS_WEIGHT * error
            score = MemberScore(member=member, loss=loss, num_scored=score.num_scored + 1)
        scores.append(score)
    return SeriesModel(
        kalman=kalman.advance(previous, value, config).kalman,
        arima=arima.advance(previous, value, config).arima,
        ensemble=EnsembleState(num_points=previous.num_points + 1, members=tuple(scores)),
    )


def burst_level(values: tuple[float, ...]) -> float | None:
    """The recent level when the newest value is a burst, else None.

    Returns:
        mean(values[-1 - BURST_LOOKBACK : -1]) when values[-1] > BURST_RATIO x that mean; None otherwise or with
        fewer than 2 values.
    """
    if len(values) < 2:
        return None
    recent = values[-1 - BURST_LOOKBACK : -1]
    level = sum(recent) / len(recent)
    return level if values[-1] > BURST_RATIO * level else None


def forecast(series: SeriesView, config: PlannerConfig) -> SeriesForecast:
    """The forecast of the member with the lowest recent loss, raised to the newest value after a burst."""
    if not series.values:
        return constant.forecast(series, config)
    scores = _scores(series)
    fewest = min(scores[member].num_scored for member, _ in MEMBERS)
    if fewest < MIN_SCORED_WINDOWS:
        chosen = constant.forecast(series, config)
        value, fallback = chosen.value, True
        detail = f"ensemble: {fewest} of {MIN_SCORED_WINDOWS} scored windows, constant used"
    else:
        # Lowest loss; min() keeps the first of equal losses and MEMBERS lists the simpler members first.
        member, predictor = min(MEMBERS, key=lambda item: _loss(scores[item[0]]))
        chosen = predictor.forecast(series, config)
        # e.g. arima chosen while it has no order yet: the value is its flagged last-value fallback
        value, fallback = chosen.value, chosen.fallback
        losses = ", ".join(f"{m.value} {_loss(scores[m]):.3f}" for m, _ in MEMBERS)
        detail = f"ensemble: {member.value} has the lowest loss ({losses}); {chosen.detail}"
    level = burst_level(series.values)
    if level is not None and value < series.last:
        value = series.last
        detail += f"; burst: last {series.last:.4g} > {BURST_RATIO:g} x recent mean {level:.4g}, last value used"
    return SeriesForecast(value=value, fallback=fallback, detail=detail)


def _loss(score: MemberScore) -> float:
    return math.inf if score.loss is None else score.loss
