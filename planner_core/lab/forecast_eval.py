"""One-step-ahead evaluation of the load predictors on a request trace, scored as Dynamo's predictor sweep.

Each window `k` of the bucketed trace is forecast from the history of windows `< k` with `predict_next`, then
observed with `observe_window`, exactly as a throughput tick would (a tick observes its window, then forecasts
the next). Scoring follows Dynamo's `simulation/load_predictor.py`:

- the first `skip_first` windows are not scored, where `skip_first` is the largest minimum number of points of
  the predictors evaluated together (constant 1, ARIMA 5, Prophet 5, Kalman `kalman_min_points`; our ensemble
  the largest of ARIMA's, Kalman's and 1 + its 3 scoring windows), so every predictor of one run is scored on
  the same windows;
- loss per window = 0.4·e(N̂·ISL̂, N·ISL) + 0.4·e(N̂·OSL̂, N·OSL) + 0.1·e(ISL̂, ISL) + 0.1·e(OSL̂, OSL) with
  e(a, b) = |log1p(max(a, 0)) − log1p(max(b, 0))|, averaged over the scored windows. The actual ISL/OSL of an
  empty window is 0, as in Dynamo's windows (the forecast of an idle window's lengths is therefore penalised).

Beyond Dynamo: the MAPE (%) of the request count, ISL and OSL over the scored windows, skipping for each series
the windows whose actual value is 0 (undefined percentage); and the cost of a step (wall time of
`predict_next` + `observe_window`, measured with `time.perf_counter` on every window, scored or not, after an
untimed rehearsal on the first windows that loads the predictor's libraries).

Pure apart from the timing; the CLI (`planner forecast`) does the reading, printing and progress bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner_core.config import PlannerConfig, parse_config
from planner_core.domain import LoadHistory, Prediction, ReasonCode, TrafficObservation
from planner_core.predict import observe_window, predict_next
from planner_core.predict.ensemble import MIN_SCORED_WINDOWS as ENSEMBLE_MIN_SCORED_WINDOWS
from planner_core.traces import RequestTrace, bucket_window_starts, bucket_windows

PREDICTOR_NAMES = ("constant", "arima", "prophet", "kalman", "ensemble")

# Dynamo's `minimum_data_points` per family (core/load/predictors.py): below it a predictor returns the last value.
_FIXED_MINIMUM_POINTS = {"constant": 1, "arima": 5, "prophet": 5}

# Weights of Dynamo's sweep loss: (N·ISL, N·OSL) carry the token load, (ISL, OSL) the request shape.
_LOAD_WEIGHT = 0.4
_SHAPE_WEIGHT = 0.1


def log1p_error(predicted: float, actual: float) -> float:
    """e(a, b) = |log1p(max(a, 0)) − log1p(max(b, 0))|: Dynamo's per-term error."""
    return abs(math.log1p(max(predicted, 0.0)) - math.log1p(max(actual, 0.0)))


def window_loss(predicted: Prediction, actual: TrafficObservation) -> float:
    """Dynamo's weighted log1p loss of one window's forecast.

    0.4·e(N̂·ISL̂, N·ISL) + 0.4·e(N̂·OSL̂, N·OSL) + 0.1·e(ISL̂, ISL) + 0.1·e(OSL̂, OSL).
    """
    return (
        _LOAD_WEIGHT * log1p_error(predicted.num_req * predicted.isl, actual.num_req * actual.isl)
        + _LOAD_WEIGHT * log1p_error(predicted.num_req * predicted.osl, actual.num_req * actual.osl)
        + _SHAPE_WEIGHT * log1p_error(predicted.isl, actual.isl)
        + _SHAPE_WEIGHT * log1p_error(predicted.osl, actual.osl)
    )


def minimum_points(config: PlannerConfig) -> int:
    """Windows a predictor needs before it forecasts with its model (Dynamo's `minimum_data_points`).

    Constant 1, ARIMA 5, Prophet 5, Kalman `kalman_min_points` (Dynamo's values, which ours share). The ensemble
    (ours) needs its slowest member (ARIMA, Kalman) and `1 + MIN_SCORED_WINDOWS` windows to have scored every
    member before it stops falling back to the constant member.
    """
    name = str(config.load_predictor)
    if name == "kalman":
        return int(config.kalman_min_points)
    if name == "ensemble":
        return max(_FIXED_MINIMUM_POINTS["arima"], int(config.kalman_min_points), 1 + ENSEMBLE_MIN_SCORED_WINDOWS)
    return _FIXED_MINIMUM_POINTS[name]


def parse_interval(text: str | float) -> int:
    """A throughput interval given on the command line: a whole number of seconds > 0 (Dynamo's type)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0 and value == int(value)):
        raise ValueError(f"--interval {text!r}: must be a whole number of seconds > 0")
    return int(value)


def parse_predictors(text: str) -> list[str]:
    """`all`, one predictor name, or a comma-separated list of names, in the order given."""
    if text.strip() == "all":
        return list(PREDICTOR_NAMES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PREDICTOR_NAMES]
    if unknown or not names:
        raise ValueError(f"--predictor {text!r}: unknown predictor; choose from {', '.join(PREDICTOR_NAMES)} or all")
    return list(dict.fromkeys(names))


def predictor_config(
    base: PlannerConfig, name: str, interval_s: int, *, log1p: bool | None = None, source: str = "<forecast>"
) -> PlannerConfig:
    """`base` with the named predictor, the window interval and (if given) the log1p switch, validated again."""
    data: dict[str, Any] = base.model_dump(mode="json", exclude_unset=True)
    data["load_predictor"] = name
    data["throughput_adjustment_interval_seconds"] = interval_s
    if log1p is not None:
        data["load_predictor_log1p"] = log1p
    return parse_config(data, source).policy


@dataclass(frozen=True, slots=True, kw_only=True)
class StepForecast:
    """The forecast of one window, made from the windows before it, and what the step cost."""

    window: int
    prediction: Prediction
    fallback: bool  # predict_next reported PREDICTOR_FALLBACK for any series (e.g. too few points, no order yet)
    step_ms: float  # predict_next + observe_window


def forecast_windows(
    windows: Sequence[TrafficObservation], config: PlannerConfig, *, on_step: Callable[[], None] | None = None
) -> list[StepForecast]:
    """Forecast every window from the history of the windows before it, then observe it, as ticks do.

    Args:
        windows: consecutive throughput windows, oldest first (see `bucket_windows`).
        config: the predictor configuration (`load_predictor`, its parameters and the interval).
        on_step: called after each window (progress reporting).

    Returns:
        One forecast per window; window 0 is forecast from the empty history.
    """
    history = LoadHistory()
    steps = []
    for index, window in enumerate(windows):
        started = time.perf_counter()
        prediction, record = predict_next(history, config)
        history, _ = observe_window(history, window, config)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        steps.append(
            StepForecast(
                window=index,
                prediction=prediction,
                fallback=record.reason is ReasonCode.PREDICTOR_FALLBACK,
                step_ms=elapsed_ms,
            )
        )
        if on_step is not None:
            on_step()
    return steps


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastScore:
    """How well one predictor forecast a trace, one window ahead.

    `loss` is Dynamo's mean weighted log1p loss over the scored windows (None when no window was scored);
    MAPEs are percentages over the scored windows whose actual value is > 0 (None when there is none).
    """

    predictor: str
    log1p: bool
    interval_s: int
    loss: float | None
    mape_requests: float | None
    mape_isl: float | None
    mape_osl: float | None
    ms_per_step_p50: float
    ms_per_step_p99: float
    num_windows: int
    num_scored: int
    num_fallback: int  # scored windows whose forecast came from a fallback, not the model

    def to_json(self) -> dict[str, Any]:
        return {
            "predictor": self.predictor,
            "loss": self.loss,
            "mape_requests": self.mape_requests,
            "mape_isl": self.mape_isl,
            "mape_osl": self.mape_osl,
            "ms_per_step_p50": self.ms_per_step_p50,
            "ms_per_step_p99": self.ms_per_step_p99,
            "log1p": self.log1p,
            "interval_s": self.interval_s,
            "num_windows": self.num_windows,
            "num_scored": self.num_scored,
            "num_fallback": self.num_fallback,
        }


def _mape(predicted: list[float], actual: list[float]) -> float | None:
    """Mean absolute percentage error (%), skipping windows whose actual value is 0."""
    errors = [abs(p - a) / a for p, a in zip(predicted, actual, strict=True) if a > 0]
    return 100.0 * float(np.mean(errors)) if errors else None


def score_forecasts(
    predictor: str,
    config: PlannerConfig,
    windows: Sequence[TrafficObservation],
    steps: Sequence[StepForecast],
    skip_first: int,
) -> ForecastScore:
    """Score forecasts against the windows, leaving out the first `skip_first` windows (Dynamo's warm-up)."""
    scored = [(step, windows[step.window]) for step in steps if step.window >= skip_first]
    losses = [window_loss(step.prediction, actual) for step, actual in scored]
    step_ms = np.array([step.step_ms for step in steps]) if steps else np.zeros(1)
    return ForecastScore(
        predictor=predictor,
        log1p=bool(config.load_predictor_log1p),
        interval_s=int(config.throughput_adjustment_interval_seconds),
        loss=float(np.mean(losses)) if losses else None,
        mape_requests=_mape([s.prediction.num_req for s, _ in scored], [a.num_req for _, a in scored]),
        mape_isl=_mape([s.prediction.isl for s, _ in scored], [a.isl for _, a in scored]),
        mape_osl=_mape([s.prediction.osl for s, _ in scored], [a.osl for _, a in scored]),
        ms_per_step_p50=float(np.percentile(step_ms, 50)),
        ms_per_step_p99=float(np.percentile(step_ms, 99)),
        num_windows=len(windows),
        num_scored=len(scored),
        num_fallback=sum(step.fallback for step, _ in scored),
    )


def evaluate(
    windows: Sequence[TrafficObservation],
    configs: dict[str, PlannerConfig],
    *,
    on_step: Callable[[str], None] | None = None,
) -> tuple[list[ForecastScore], int]:
    """Evaluate several predictors on the same windows, all scored from the same window on.

    Args:
        windows: consecutive throughput windows, oldest first.
        configs: label -> configuration (one per predictor), in the order to report them.
        on_step: called with the label after each window (progress reporting).

    Returns:
        The scores in the order of `configs`, and `skip_first`: the number of leading windows left unscored,
        the largest minimum number of points among the predictors.
    """
    skip_first = max((minimum_points(config) for config in configs.values()), default=0)
    scores = []
    for label, config in configs.items():
        # Untimed rehearsal past the first model fit: loads the predictor's libraries (statsmodels ~3 s, prophet
        # ~1 s on a cold start) so the timed steps measure the per-window cost, not a once-per-process import.
        forecast_windows(windows[: minimum_points(config) + 2], config)
        callback = (lambda label=label: on_step(label)) if on_step is not None else None
        steps = forecast_windows(windows, config, on_step=callback)
        scores.append(score_forecasts(label, config, windows, steps, skip_first))
    return scores, skip_first


def window_records(trace: RequestTrace, interval_s: int) -> list[dict[str, Any]]:
    """The bucketed windows in the shape of Dynamo's warm-up metrics, to feed Dynamo's own predictors.

    `{"interval_start", "request_count", "avg_isl", "avg_osl"}`; `interval_start` is seconds from the trace
    clock's zero, averages are 0 for an empty window (as Dynamo's `extract_metrics_from_trace`).
    """
    return [
        {
            "interval_start": start,
            "request_count": int(window.num_req),
            "avg_isl": window.isl if window.num_req else 0,
            "avg_osl": window.osl if window.num_req else 0,
        }
        for start, window in zip(
            bucket_window_starts(trace, interval_s), bucket_windows(trace, interval_s), strict=True
        )
    ]


LOSS_NOTE = (
    "loss: Dynamo's 0.4*e(N*ISL) + 0.4*e(N*OSL) + 0.1*e(ISL) + 0.1*e(OSL), e = |log1p(forecast) - log1p(actual)|, "
    "mean over scored windows; MAPE skips windows whose actual value is 0; ms/step = predict_next + "
    "observe_window over all windows; fallback = scored windows where predict_next reported predictor_fallback "
    "for any of its series (percentile series included)"
)


def score_table(scores: list[ForecastScore]) -> list[str]:
    """The scores as `planner forecast` prints them: a header and one aligned line per predictor."""

    def cell(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    header = ("predictor", "loss", "MAPE req %", "MAPE ISL %", "MAPE OSL %", "ms/step p50", "ms/step p99", "fallback")
    rows = [
        (
            score.predictor + (" (log1p)" if score.log1p else ""),
            cell(score.loss, 4),
            cell(score.mape_requests, 1),
            cell(score.mape_isl, 1),
            cell(score.mape_osl, 1),
            cell(score.ms_per_step_p50, 2),
            cell(score.ms_per_step_p99, 2),
            f"{score.num_fallback}/{score.num_scored}",
        )
        for score in scores
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            text.ljust(width) if i == 0 else text.rjust(width)
            for i, (text, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in [header, *rows]
    ]
