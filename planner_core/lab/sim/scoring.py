"""What one policy's run on a trace is scored as: the bench row (SLA attainment, goodput, GPU-hours, scaling
events; `score`) and the router's prediction errors (`prediction_errors`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner_core.lab.sim.des import SimResult
from planner_core.traces import RequestTrace


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One policy's figures (the `--json` row)."""

    policy: str
    requests: int
    ttft_attainment: float
    itl_attainment: float
    sla_attainment: float
    attainable: float  # fraction of requests that meet both targets alone on an idle cluster (the ceiling)
    goodput_rps: float
    gpu_hours: float
    gpu_hours_vs_oracle: float | None
    scaling_events: int
    ttft_ms_mean: float
    ttft_ms_p90: float
    itl_ms_mean: float
    itl_ms_p90: float
    wall_s: float
    # the router the run used, and with router `slo` what it could not place and how far its predictions were
    # from the measured latencies (`prediction_errors`); None with the other routers
    router: str = "least_loaded"
    unplaced: int | None = None
    rejected: int | None = None
    local_prefills: int | None = None
    overdue: int | None = None
    ttft_pred_err_p50: float | None = None
    ttft_pred_err_p90: float | None = None
    tpot_pred_err_p50: float | None = None
    tpot_pred_err_p90: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionErrors:
    """Relative error |predicted - measured| / measured of the SLO-aware router's predictions, median and p90, over
    the requests it placed: TTFT predicted at the first stage's dispatch against the TTFT measured from that
    dispatch (the client's TTFT less its wait at the frontend; it includes the KV transfer and, with the first token
    from the decode engine, one decode iteration); TPOT predicted at the decode dispatch against the request's
    measured mean ITL. `bias` is the median of (predicted - measured) / measured (negative: predictions too low)."""

    ttft_p50: float | None
    ttft_p90: float | None
    ttft_bias: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_bias: float | None
    num_ttft: int
    num_tpot: int


def _relative_errors(
    predicted_ms: np.ndarray, measured_ms: np.ndarray
) -> tuple[float | None, float | None, float | None, int]:
    ok = np.isfinite(predicted_ms) & np.isfinite(measured_ms) & (measured_ms > 0)
    if not ok.any():
        return None, None, None, 0
    signed = (predicted_ms[ok] - measured_ms[ok]) / measured_ms[ok]
    error = np.abs(signed)
    return float(np.median(error)), float(np.percentile(error, 90)), float(np.median(signed)), int(ok.sum())


def prediction_errors(result: SimResult, trace: RequestTrace) -> PredictionErrors | None:
    """The router's prediction errors in one run (None when the run's router made no predictions)."""
    if result.predicted_ttft_ms is None or result.predicted_tpot_ms is None or result.dispatch_s is None:
        return None
    waited_s = result.dispatch_s - np.asarray(trace.arrival_s, dtype=float)
    ttft = _relative_errors(result.predicted_ttft_ms, 1000.0 * (result.ttft_s - waited_s))
    tpot = _relative_errors(result.predicted_tpot_ms, 1000.0 * result.itl_s)
    return PredictionErrors(
        ttft_p50=ttft[0], ttft_p90=ttft[1], ttft_bias=ttft[2], num_ttft=ttft[3],
        tpot_p50=tpot[0], tpot_p90=tpot[1], tpot_bias=tpot[2], num_tpot=tpot[3],
    )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRun:
    row: BenchRow
    result: SimResult


def score(
    name: str,
    trace: RequestTrace,
    result: SimResult,
    *,
    ttft_ms: float,
    itl_ms: float,
    wall_s: float,
    attainable: float = 1.0,
) -> BenchRow:
    """Attainment and cost of one run. Unfinished requests count as misses; ITL of 1-token requests is met.
    `attainable` is reported as is (the fraction of requests that could meet both targets at all)."""
    ttft = result.ttft_s * 1000.0
    itl = result.itl_s * 1000.0
    finished = np.isfinite(result.finish_s)
    ttft_met = np.isfinite(ttft) & (ttft <= ttft_ms)
    itl_met = finished & (~np.isfinite(itl) | (itl <= itl_ms))
    both = ttft_met & itl_met
    duration_s = max(trace.duration_s, 1e-9)
    return BenchRow(
        policy=name,
        requests=trace.num_requests,
        ttft_attainment=float(ttft_met.mean()) if len(ttft) else 1.0,
        itl_attainment=float(itl_met.mean()) if len(itl) else 1.0,
        sla_attainment=float(both.mean()) if len(ttft) else 1.0,
        attainable=attainable,
        goodput_rps=float(both.sum() / duration_s),
        gpu_hours=result.gpu_s / 3600.0,
        gpu_hours_vs_oracle=None,
        scaling_events=result.num_scaling_events,
        ttft_ms_mean=float(np.nanmean(ttft)) if np.isfinite(ttft).any() else math.nan,
        ttft_ms_p90=float(np.nanpercentile(ttft, 90)) if np.isfinite(ttft).any() else math.nan,
        itl_ms_mean=float(np.nanmean(itl)) if np.isfinite(itl).any() else math.nan,
        itl_ms_p90=float(np.nanpercentile(itl, 90)) if np.isfinite(itl).any() else math.nan,
        wall_s=wall_s,
    )
