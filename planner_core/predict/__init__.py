"""Load forecasting: turn each throughput window's traffic into the history predictors learn from, and forecast.

Pure: `observe_window` returns a new history (the old one is untouched) and `predict_next` never changes
anything, so a forecast can be recomputed from a stored history at any time (exact replay).
"""

from __future__ import annotations

from planner_core.domain import LoadHistory, Prediction, ReasonCode, StepRecord, TrafficObservation

# Enough for every predictor window Dynamo uses (Prophet keeps 50 points); bounded so state stays small.
MAX_HISTORY_POINTS = 256


def observe_window(
    history: LoadHistory, traffic: TrafficObservation, *, max_points: int = MAX_HISTORY_POINTS
) -> tuple[LoadHistory, StepRecord]:
    """Append one window to the history.

    Leading idle windows (before any traffic was seen) are skipped: a predictor fed zeros before the first
    request would forecast zero for the first busy window. An idle window after traffic is fed as 0 requests
    with ISL/OSL carried forward from the last busy window, so the shape of requests is not forgotten.

    Returns:
        The new history and the step record saying what was done.
    """
    if traffic.num_req <= 0:
        if not history.seen_traffic:
            return history, StepRecord(
                step="observe", reason=ReasonCode.IDLE_WINDOW, value=0.0, detail="leading idle window skipped"
            )
        isl = history.isl[-1] if history.isl else 0.0
        osl = history.osl[-1] if history.osl else 0.0
        record = StepRecord(
            step="observe",
            reason=ReasonCode.IDLE_WINDOW,
            value=0.0,
            detail=f"idle window: 0 requests, ISL {isl:.0f} / OSL {osl:.0f} carried forward",
        )
        num_req = 0.0
    else:
        num_req, isl, osl = float(traffic.num_req), float(traffic.isl), float(traffic.osl)
        record = StepRecord(
            step="observe",
            reason=ReasonCode.OBSERVED,
            value=num_req,
            detail=f"{num_req:.0f} requests in {traffic.duration_s:.0f} s, ISL {isl:.0f}, OSL {osl:.0f}",
        )
    new_history = LoadHistory(
        num_req=(*history.num_req, num_req)[-max_points:],
        isl=(*history.isl, isl)[-max_points:],
        osl=(*history.osl, osl)[-max_points:],
        seen_traffic=True,
    )
    return new_history, record


def predict_next(history: LoadHistory, predictor: str) -> tuple[Prediction, StepRecord]:
    """Forecast the next window from the history with the named predictor.

    Only the constant predictor (last value) exists in this version; any other name falls back to it and the
    step says so with `predictor_fallback`, never silently.
    """
    last = Prediction(
        num_req=history.num_req[-1] if history.num_req else 0.0,
        isl=history.isl[-1] if history.isl else 0.0,
        osl=history.osl[-1] if history.osl else 0.0,
    )
    if predictor == "constant":
        reason, detail = ReasonCode.PREDICTED, "constant predictor: last observed window"
    elif not history.num_req:
        reason, detail = ReasonCode.PREDICTOR_FALLBACK, "no history yet: forecast 0"
    else:
        reason = ReasonCode.PREDICTOR_FALLBACK
        detail = f"predictor '{predictor}' is not available; used the last observed window (constant)"
    return last, StepRecord(step="predict", reason=reason, value=last.num_req, detail=detail)
