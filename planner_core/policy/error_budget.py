"""The SLA as an error budget (ours): the throughput loop keeps "a share of requests within TTFT and ITL" over a
period, not in every window, and spends the allowed misses where they are cheapest.

An SLA of 99 % is a promise about a day (or the configured period), so a window whose misses stay well under 1 %
has engines to spare and one burst that misses 3 % of a window's requests does not break it. Every throughput tick
(`throughput_error_budget: true`) reads the share of the window's requests within the targets from the frontend's
latency histograms (`TrafficObservation.ttft_histogram` / `itl_histogram`; a request missing either target counts
once per miss, so the share is never overstated), adds the window's judged and missed requests to the period's
(each window's counts decay with `exp(-age / period)`, a sliding period kept in four numbers) and to the fast-burn
horizon's, and moves the **posture**: where the margins sit between the configured ones (0, the richest the
budget uses) and the lean ones (1).

- **Burn rate.** The budget is `1 - target` of the judged requests; a burn rate of 1 spends it exactly over the
  period. Over the period and over `error_budget_fast_burn_seconds` (the burn-rate guard, as SRE practice pages on
  a fast burn): either above 1 sends the posture to 0 at once (`budget_burning`).
- **Leaner on evidence.** While the period's burn rate is under `LEAN_BELOW` and the recent one under 1, each tick
  moves the posture `LEAN_STEP` towards 1 (`budget_healthy`): four healthy windows to the leanest margins, one bad
  one back. Between the two, the posture holds (`budget_holding`).
- **Not on too little.** Until `MIN_JUDGED` requests have been judged the configured margins hold
  (`budget_warming_up`). A window without a TTFT histogram decays the counts, adds nothing and keeps the last
  posture with its reason (`budget_unavailable`): a source that stops giving latencies neither resets nor spends
  the budget.

The posture sets two margins, each linear between its configured value and its lean one: the decode target
utilization (`throughput_decode_target_utilization` -> `error_budget_lean_decode_utilization`) and the percentile of
the pooled prompt-burst curve the burst sizing reads (0.99 -> `error_budget_lean_burst_quantile`). Everything else
(the mean-rate prefill sizing, the hold, the learned engine speeds) is as without the budget. The state is
`PlannerState.error_budget`, so replay stays exact; each tick leaves an `error_budget` step with the figures.
"""

from __future__ import annotations

import dataclasses
import math

from planner_core.config import PlannerConfig
from planner_core.domain import (
    ErrorBudgetState,
    ReasonCode,
    StepName,
    StepRecord,
    TrafficObservation,
)
from planner_core.policy.burst_pool import P99

__all__ = [
    "BURST_QUANTILE",
    "LEAN_BELOW",
    "LEAN_STEP",
    "MIN_JUDGED",
    "BudgetMargins",
    "budget_margins",
    "read_error_budget",
    "window_misses",
]

MIN_JUDGED = 1000.0  # requests judged before the budget moves the margins
LEAN_BELOW = 0.5  # the period's burn rate under which the margins go leaner (half the budget unspent)
LEAN_STEP = 0.25  # posture gained per healthy window (four to the leanest)
BURST_QUANTILE = P99  # the burst sizing's percentile at the configured posture


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BudgetMargins:
    """The margins a posture sets: the decode target utilization and the prompt-burst percentile."""

    decode_utilization: float
    burst_quantile: float


def budget_margins(config: PlannerConfig, posture: float) -> BudgetMargins:
    """The margins at `posture` (0: the configured ones, 1: the lean ones); the lean ones never richer."""
    rich_decode = float(config.throughput_decode_target_utilization)
    lean_decode = max(rich_decode, float(config.error_budget_lean_decode_utilization))
    lean_quantile = min(BURST_QUANTILE, config.error_budget_lean_burst_quantile)
    return BudgetMargins(
        decode_utilization=rich_decode + posture * (lean_decode - rich_decode),
        burst_quantile=BURST_QUANTILE + posture * (lean_quantile - BURST_QUANTILE),
    )


def window_misses(config: PlannerConfig, traffic: TrafficObservation) -> tuple[float, float] | None:
    """The window's judged requests and those that missed a target, from its latency histograms; None without a
    TTFT histogram that counts a request. A request missing both targets may count twice (the histograms are
    separate), so the misses are capped at the judged requests and never understated."""
    ttft = traffic.ttft_histogram
    ttft_share = ttft.share_within(config.ttft_ms) if ttft is not None else None
    if ttft is None or ttft_share is None:
        return None
    missed_share = 1.0 - ttft_share
    itl = traffic.itl_histogram
    itl_share = itl.share_within(config.itl_ms) if itl is not None else None
    if itl_share is not None:
        missed_share += 1.0 - itl_share
    return ttft.count, min(ttft.count, ttft.count * missed_share)


def _burn(missed: float, judged: float, allowed_share: float) -> float:
    return missed / judged / allowed_share if judged > 0 else 0.0


def read_error_budget(
    config: PlannerConfig, budget: ErrorBudgetState, traffic: TrafficObservation, now_s: float
) -> tuple[ErrorBudgetState, StepRecord]:
    """The budget after the window just observed, and its step (module docstring): value = the new posture."""
    age_s = 0.0 if budget.last_s is None else max(0.0, now_s - budget.last_s)
    keep_period = math.exp(-age_s / float(config.error_budget_period_seconds))
    keep_recent = math.exp(-age_s / float(config.error_budget_fast_burn_seconds))
    judged, missed = budget.judged * keep_period, budget.missed * keep_period
    recent_judged, recent_missed = budget.recent_judged * keep_recent, budget.recent_missed * keep_recent
    window = window_misses(config, traffic)
    if window is not None:
        judged, missed = judged + window[0], missed + window[1]
        recent_judged, recent_missed = recent_judged + window[0], recent_missed + window[1]
    allowed_share = 1.0 - config.error_budget_target
    burn_period = _burn(missed, judged, allowed_share)
    burn_recent = _burn(recent_missed, recent_judged, allowed_share)
    posture = budget.posture
    if window is None:
        reason, posture_why = ReasonCode.BUDGET_UNAVAILABLE, "no TTFT histogram in the window: posture kept"
    elif judged < MIN_JUDGED:
        reason, posture_why = ReasonCode.BUDGET_WARMING_UP, f"{judged:.0f} requests judged (< {MIN_JUDGED:g})"
    elif burn_period > 1.0 or burn_recent > 1.0:
        reason, posture = ReasonCode.BUDGET_BURNING, 0.0
        posture_why = "burning faster than the period allows: the configured margins"
    elif burn_period < LEAN_BELOW:
        reason, posture = ReasonCode.BUDGET_HEALTHY, min(1.0, posture + LEAN_STEP)
        posture_why = f"period burn under {LEAN_BELOW:g}: leaner"
    else:
        reason, posture_why = ReasonCode.BUDGET_HOLDING, "within the budget: posture kept"
    margins = budget_margins(config, posture)
    seen = (
        "window: no histogram"
        if window is None
        else f"window: {window[1]:.0f} of {window[0]:.0f} requests missed a target"
    )
    detail = (
        f"{seen}; period: {1.0 - (missed / judged if judged > 0 else 0.0):.2%} within "
        f"(target {config.error_budget_target:.2%}), burn {burn_period:.2f}, recent burn {burn_recent:.2f}; "
        f"{posture_why}; posture {budget.posture:.2f} -> {posture:.2f}: decode utilization "
        f"{margins.decode_utilization:.2f}, burst p{margins.burst_quantile * 100:g}"
    )
    updated = ErrorBudgetState(
        judged=judged,
        missed=missed,
        recent_judged=recent_judged,
        recent_missed=recent_missed,
        posture=posture,
        last_s=now_s,
    )
    return updated, StepRecord(step=StepName.ERROR_BUDGET, value=posture, reason=reason, detail=detail)
