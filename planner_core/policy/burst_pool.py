"""Ours: the burst rule's prompt-arrival curve pooled over more requests than one window holds.

Each point of a window's curve is a 99th percentile over the window's requests. At a few requests per second a
60 s window holds a hundred or so, and its p99 is nearly its largest value: at a steady load it swings from window
to window, and a pool at a size boundary goes up on one window's outlier, back down after the scale-down hold, and
up again at the next outlier. Pooled over at least `throughput_burst_pool_requests` requests (the newest windows',
at most `throughput_burst_pool_windows` of them, the window just observed always among them) the percentile is
steady where the load is steady, and it still moves at once where the load moves: a window whose requests bunch
more tightly holds most of the pooled top percent, and a window that alone holds enough requests is its own pool.

A window keeps each interval's distribution at the quantiles `PROMPT_BURST_QUANTILES` (`PromptBurstQuantiles`,
derived in the tick with the curve). The pooled percentile reads those quantiles as a weighted sample: the value at
quantile q_j stands for the requests between q_(j-1) and q_j (the median for the lower half), each window weighted
by its requests; the pooled p99 is the smallest value at which the weights reach 99 %. Each band counts at its
upper end, so where the windows differ the pooled value errs high (within 15 % in the tests). The weights are whole
numbers (per mille of a window's requests), so with one window the pooled p99 is that window's p99 to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_core.domain import (
    PROMPT_ARRIVAL_INTERVALS_S,
    PROMPT_BURST_QUANTILES,
    PromptBurstQuantiles,
    PromptBurstWindow,
)

__all__ = ["P99", "PooledCurve", "pool_prompt_bursts", "remember_prompt_bursts"]

# each kept quantile's share of a window's requests, in per mille (whole numbers: the sums below are exact)
_PER_MILLE = tuple(round(1000 * q) for q in PROMPT_BURST_QUANTILES)
_BAND_PER_MILLE = tuple(high - low for low, high in zip((0, *_PER_MILLE[:-1]), _PER_MILLE, strict=True))
P99 = 0.99  # the percentile the burst rule reads unless the SLA error budget chose a leaner one


@dataclass(frozen=True, slots=True, kw_only=True)
class PooledCurve:
    """The prompt-arrival curve the burst rule reads, as (interval s, p99 tokens) shortest first, pooled over
    `num_requests` requests of `num_windows` windows (the window just observed and the newest before it)."""

    points: tuple[tuple[float, float], ...]
    num_requests: int
    num_windows: int


def pool_prompt_bursts(
    current: tuple[PromptBurstQuantiles, ...],
    recent: tuple[PromptBurstWindow, ...],
    *,
    min_requests: int,
    max_windows: int,
    quantile: float = P99,
) -> PooledCurve | None:
    """The curve pooled over the window just observed (`current`, its distributions) and, newest first, as many
    of the `recent` windows as it takes to hold `min_requests` requests, at most `max_windows` windows in all, at
    `quantile` (the p99 unless the SLA error budget chose a leaner one, `planner_core.policy.error_budget`).
    None when the window just observed has no distributions (no recorded arrivals, or no requests): the burst rule
    then reads the window's own curve, or none."""
    if not current:
        return None
    pooled = [current]
    num_requests = PromptBurstWindow(at_s=0.0, points=current).num_requests
    for window in reversed(recent):
        if num_requests >= min_requests or len(pooled) >= max_windows:
            break
        pooled.append(window.points)
        num_requests += window.num_requests
    points = []
    for interval_s in PROMPT_ARRIVAL_INTERVALS_S.values():
        seen = [point for points_ in pooled for point in points_ if point.interval_s == interval_s]
        if any(point.interval_s == interval_s for point in current):
            points.append((interval_s, _pooled_quantile(seen, quantile)))
    return PooledCurve(points=tuple(points), num_requests=num_requests, num_windows=len(pooled))


def remember_prompt_bursts(
    recent: tuple[PromptBurstWindow, ...],
    at_s: float,
    current: tuple[PromptBurstQuantiles, ...],
    *,
    min_requests: int,
    max_windows: int,
) -> tuple[PromptBurstWindow, ...]:
    """`recent` with the window just observed appended (an idle one too, so windows age by count), trimmed to
    what the next tick may pool: the newest windows until they hold `min_requests` requests, at most
    `max_windows - 1` of them (the next tick's own window is the last)."""
    windows = (*recent, PromptBurstWindow(at_s=at_s, points=current))
    kept: list[PromptBurstWindow] = []
    num_requests = 0
    for window in reversed(windows):
        if num_requests >= min_requests or len(kept) >= max_windows - 1:
            break
        kept.append(window)
        num_requests += window.num_requests
    return tuple(reversed(kept))


def _pooled_quantile(points: list[PromptBurstQuantiles], quantile: float) -> float:
    """The smallest kept value at which the windows' weighted quantile bands reach `quantile` of their requests
    (in whole per-ten-thousands, so the sums are exact and one window at the p99 gives its own p99)."""
    weighted = sorted(
        (token, point.num_requests * band * 10)
        for point in points
        for token, band in zip(point.tokens, _BAND_PER_MILLE, strict=True)
    )
    target = round(quantile * 10_000) * sum(point.num_requests for point in points)
    reached = 0
    for token, weight in weighted:
        reached += weight
        if reached >= target:
            return token
    return weighted[-1][0]
