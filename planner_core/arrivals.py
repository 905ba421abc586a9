"""Request arrivals, and the prompt-token arrival curve computed from them: the burst features a tick reads.

Every traffic source reaches the curve through `prompt_arrival_curve`, the one function that computes it:
- the trace source and the simulator pass the requests themselves (`RequestArrivals` with `resolution_s` 0);
- the Prometheus source passes arrivals rebuilt from counter increments at its query resolution
  (`arrivals_from_counts`): the requests counted in each step, spread evenly over it, each with the step's mean
  prompt length. Bursts shorter than a step cannot be seen that way, so the curve leaves out the intervals
  shorter than the resolution (the burst rule reads the points that are there).

The curve (`TrafficObservation.prompt_tokens_p99_*`): for each interval L of `PROMPT_ARRIVAL_INTERVALS_S`, the
99th percentile, over the requests arriving in the window, of the prompt tokens that arrived in the L seconds up
to and including each one (earlier windows' requests count, so a source passes `LOOKBACK_S` of arrivals before
the window). With a `PromptCap` (the engine rate of the pool that computes prompts, and the burst rule's slack),
each prompt counts up to what one engine computes in `L + slack`: one prompt occupies one engine, so it delays
the others by no more than that share; and a request whose prompt alone outlasts the slack misses the target
whatever the pool, so it sets no need (the percentile is over the others, or over all when none fits).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from planner_core.domain import (
    PROMPT_ARRIVAL_INTERVALS_S,
    PROMPT_BURST_QUANTILES,
    PromptBurstQuantiles,
    RecordedArrivals,
    TrafficObservation,
)

__all__ = [
    "LOOKBACK_S",
    "CountedSteps",
    "PromptCap",
    "RequestArrivals",
    "arrivals_from_counts",
    "prompt_arrival_curve",
    "prompt_arrival_quantiles",
    "recorded_request_arrivals",
    "with_arrivals",
]

# How far before a window a source must pass arrivals: the curve's longest interval.
LOOKBACK_S = max(PROMPT_ARRIVAL_INTERVALS_S.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class CountedSteps:
    """What `arrivals_from_counts` rebuilt arrivals from: per step, its end (s), its request count and mean prompt
    length. A source records these rather than the requests they expand to (fewer numbers, the same arrivals)."""

    step_end_s: np.ndarray
    num_req: np.ndarray
    mean_isl: np.ndarray


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestArrivals:
    """Requests' arrival times (s, non-decreasing, any origin) and prompt lengths (tokens).

    `resolution_s` is how finely the source knows the times: 0 for per-request timestamps; a Prometheus source's
    query step for arrivals rebuilt from counters (`arrivals_from_counts`)."""

    arrival_s: np.ndarray
    isl: np.ndarray
    resolution_s: float = 0.0
    counted: CountedSteps | None = None  # the counts they were rebuilt from (`arrivals_from_counts`), if so

    def __post_init__(self) -> None:
        if len(self.arrival_s) != len(self.isl):
            raise ValueError(f"{len(self.arrival_s)} arrival times but {len(self.isl)} prompt lengths")
        if not (math.isfinite(self.resolution_s) and self.resolution_s >= 0):
            raise ValueError(f"resolution_s = {self.resolution_s!r}: must be a finite number >= 0")
        if len(self.arrival_s) > 1 and bool(np.any(np.diff(self.arrival_s) < 0)):
            raise ValueError("arrival times must be non-decreasing")

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)


@dataclass(frozen=True, slots=True)
class PromptCap:
    """What one engine of the pool that computes prompts does in the burst rule's terms: its prompt tokens/s and
    the slack `T'` (the TTFT target less one prompt iteration, `planner_core.policy.throughput.burst_slack_s`)."""

    engine_prompt_tokens_per_s: float
    slack_s: float


def prompt_arrival_curve(
    arrivals: RequestArrivals, start_s: float, end_s: float, *, cap: PromptCap | None = None
) -> dict[str, float]:
    """The window [start_s, end_s)'s prompt-token arrival curve as `TrafficObservation` field values (module
    docstring); intervals shorter than `arrivals.resolution_s` are left out, and so is everything for a window
    without requests."""
    points = _curve_points(arrivals, start_s, end_s, cap=cap, quantiles=(99.0,))
    return {
        name: point.tokens[0]
        for name, point in zip(PROMPT_ARRIVAL_INTERVALS_S, points, strict=True)
        if point is not None
    }


def prompt_arrival_quantiles(
    arrivals: RequestArrivals, start_s: float, end_s: float, *, cap: PromptCap | None = None
) -> tuple[dict[str, float], tuple[PromptBurstQuantiles, ...]]:
    """The curve of `prompt_arrival_curve` and, from the same counts, each interval's distribution at
    `PROMPT_BURST_QUANTILES` (what the burst rule pools over windows); the curve's points are the 0.99 quantiles."""
    percents = tuple(100.0 * q for q in PROMPT_BURST_QUANTILES)
    p99 = PROMPT_BURST_QUANTILES.index(0.99)
    curve, points = {}, []
    for name, point in zip(
        PROMPT_ARRIVAL_INTERVALS_S, _curve_points(arrivals, start_s, end_s, cap=cap, quantiles=percents), strict=True
    ):
        if point is not None:
            curve[name] = point.tokens[p99]
            points.append(point)
    return curve, tuple(points)


def _curve_points(
    arrivals: RequestArrivals, start_s: float, end_s: float, *, cap: PromptCap | None, quantiles: tuple[float, ...]
) -> list[PromptBurstQuantiles | None]:
    """Per interval of `PROMPT_ARRIVAL_INTERVALS_S`, the percentiles `quantiles` (0..100) of the prompt tokens
    that arrived in the interval up to each request of the window (None where the source cannot see the interval,
    and for every interval of a window without requests). With `quantiles=(99.0,)` the one point is the curve's."""
    arrival = np.asarray(arrivals.arrival_s, dtype=float)
    isl = np.asarray(arrivals.isl, dtype=float)
    first = int(np.searchsorted(arrival, start_s, side="left"))
    stop = int(np.searchsorted(arrival, end_s, side="left"))
    if stop <= first:
        return [None] * len(PROMPT_ARRIVAL_INTERVALS_S)
    observers = np.arange(first, stop)
    if cap is not None:
        # a request whose prompt alone outlasts the slack misses the target whatever the pool: it sets no need
        fits = observers[isl[observers] <= cap.engine_prompt_tokens_per_s * cap.slack_s]
        observers = fits if len(fits) else observers
    upto = observers + 1  # cumulative[upto] counts every request up to and including each one
    points: list[PromptBurstQuantiles | None] = []
    for interval_s in PROMPT_ARRIVAL_INTERVALS_S.values():
        if interval_s < arrivals.resolution_s - 1e-9:
            points.append(None)  # the source cannot see bursts this short
            continue
        counted = isl if cap is None else np.minimum(isl, cap.engine_prompt_tokens_per_s * (interval_s + cap.slack_s))
        cumulative = np.concatenate([[0.0], np.cumsum(counted)])
        since = np.searchsorted(arrival, arrival[observers] - interval_s, side="right")
        tokens = np.percentile(cumulative[upto] - cumulative[since], quantiles)
        points.append(
            PromptBurstQuantiles(
                interval_s=interval_s, num_requests=len(observers), tokens=tuple(float(t) for t in tokens)
            )
        )
    return points


def arrivals_from_counts(
    step_end_s: np.ndarray, num_req: np.ndarray, mean_isl: np.ndarray, *, resolution_s: float
) -> RequestArrivals:
    """Arrivals rebuilt from per-step counts: `num_req[k]` requests (rounded to whole requests) in the step
    (step_end_s[k] - resolution_s, step_end_s[k]], spread evenly over it, each `mean_isl[k]` tokens long.

    Raises ValueError on arrays of different lengths, a step that is not > 0, or a negative or non-finite count
    or length (a counter reset is the caller's to handle)."""
    step_end_s = np.asarray(step_end_s, dtype=float)
    counts = np.asarray(num_req, dtype=float)
    lengths = np.asarray(mean_isl, dtype=float)
    if not (len(step_end_s) == len(counts) == len(lengths)):
        raise ValueError(f"{len(step_end_s)} steps, {len(counts)} counts and {len(lengths)} lengths")
    if not (math.isfinite(resolution_s) and resolution_s > 0):
        raise ValueError(f"resolution_s = {resolution_s!r}: must be a finite number > 0")
    for name, values in (("request count", counts), ("prompt length", lengths)):
        if len(values) and not bool(np.all(np.isfinite(values) & (values >= 0))):
            raise ValueError(f"a {name} per step is negative or not finite")
    whole = np.rint(counts).astype(np.int64)
    step = np.repeat(np.arange(len(whole)), whole)
    # the j-th of n requests of a step arrives at (j + 1/2) / n of the way through it
    rank = np.arange(len(step)) - np.repeat(np.cumsum(whole) - whole, whole)
    arrival_s = step_end_s[step] - resolution_s + (rank + 0.5) * resolution_s / np.maximum(whole[step], 1)
    counted = CountedSteps(step_end_s=step_end_s, num_req=counts, mean_isl=lengths)
    return RequestArrivals(arrival_s=arrival_s, isl=lengths[step], resolution_s=resolution_s, counted=counted)


def with_arrivals(
    traffic: TrafficObservation, arrivals: RequestArrivals, start_s: float, end_s: float
) -> TrafficObservation:
    """`traffic` (the window [start_s, end_s), on the arrivals' clock) with the arrivals recorded as they are
    (`TrafficObservation.prompt_arrivals`): what every source that knows arrivals records. No policy is read: the
    tick derives the prompt-arrival curve from them (`planner_core.policy.throughput.with_prompt_curve`)."""
    if arrivals.counted is not None:
        counted = arrivals.counted
        record = RecordedArrivals(
            start_s=start_s,
            end_s=end_s,
            at_s=tuple(np.asarray(counted.step_end_s, dtype=float).tolist()),
            isl=tuple(np.asarray(counted.mean_isl, dtype=float).tolist()),
            num_req=tuple(np.asarray(counted.num_req, dtype=float).tolist()),
            resolution_s=arrivals.resolution_s,
        )
    else:
        record = RecordedArrivals(
            start_s=start_s,
            end_s=end_s,
            at_s=tuple(np.asarray(arrivals.arrival_s, dtype=float).tolist()),
            isl=tuple(np.asarray(arrivals.isl, dtype=float).tolist()),
            resolution_s=arrivals.resolution_s,
        )
    return dataclasses.replace(traffic, prompt_arrivals=record)


def recorded_request_arrivals(record: RecordedArrivals) -> RequestArrivals:
    """The arrivals a source recorded (`with_arrivals`), as it passed them: the same numbers, bit for bit."""
    if record.resolution_s > 0 and record.num_req:
        return arrivals_from_counts(
            np.asarray(record.at_s, dtype=float),
            np.asarray(record.num_req, dtype=float),
            np.asarray(record.isl, dtype=float),
            resolution_s=record.resolution_s,
        )
    return RequestArrivals(
        arrival_s=np.asarray(record.at_s, dtype=float),
        isl=np.asarray(record.isl, dtype=float),
        resolution_s=record.resolution_s,
    )
