"""What every traffic source promises, and the typed answer for "no usable data".

A source's `collect(window_start, window_end)` returns the window's `TrafficObservation` or raises
`TrafficUnavailable` saying why there is none (unreachable, refused, malformed, implausible). An idle window is
not "no data": it is an observation with `num_req` 0. `collect_safely` turns the exception into a
`CollectedTraffic` without an observation, so the tick records `no_traffic_data` and holds: missing data never
scales anything down.

A source that also has `arrivals(window_start, window_end)` (an `ArrivalSource`) records, for a `Planner`, the
window's request arrivals with the observation as they are (`planner_core.arrivals.with_arrivals`: no policy in
them); the tick derives the prompt-arrival curve from them. When only the arrivals fail, the observation is kept
without them and `curve_problem` says why: the tick then sizes on the mean rate (`burst_unavailable`), which is honest,
rather than holding on traffic it has.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from planner_core.arrivals import RequestArrivals, with_arrivals
from planner_core.domain import TrafficObservation
from planner_core.runtime.redact import redact_text

if TYPE_CHECKING:
    from planner_core.planner import Planner


class NoTrafficDataKind(enum.StrEnum):
    """Why a source has no observation for a window."""

    UNREACHABLE = "unreachable"  # connection refused, timed out, TLS failure
    HTTP_ERROR = "http_error"  # the server answered with a non-2xx status
    QUERY_ERROR = "query_error"  # Prometheus answered status "error" (bad query, overloaded)
    MALFORMED = "malformed"  # the answer is not what the API promises (not JSON, wrong shape, too large)
    NO_SERIES = "no_series"  # the series do not exist there: nothing scraped, wrong names or labels
    INVALID_VALUE = "invalid_value"  # a value is NaN where a number is needed, negative, or implausibly large
    WINDOW_DEADLINE = "window_deadline"  # the window's queries together ran past their deadline


class TrafficUnavailable(Exception):
    """A source could not produce an observation for the window; `kind` says why, `detail` in one line (any URL
    password in it redacted: the detail is logged and audited)."""

    def __init__(self, kind: NoTrafficDataKind, detail: str) -> None:
        detail = redact_text(detail)
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind
        self.detail = detail


class TrafficSource(Protocol):
    """Anything that reports the frontend traffic of a time window."""

    def collect(self, window_start: dt.datetime, window_end: dt.datetime) -> TrafficObservation:
        """The window's traffic; raises `TrafficUnavailable` when there is no usable answer."""
        ...


@runtime_checkable
class ArrivalSource(TrafficSource, Protocol):
    """A source that also knows when requests arrived: what the prompt-arrival curve is computed from."""

    def arrivals(self, window_start: dt.datetime, window_end: dt.datetime) -> RequestArrivals:
        """Requests of [window_start - LOOKBACK_S, window_end) on the epoch-seconds clock; raises
        `TrafficUnavailable` when there is no usable answer."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectedTraffic:
    """What a collection produced: an observation, or why there is none (`observation` None).

    `curve_problem` (`kind: detail`) is set when the observation is there but its prompt-arrival curve is not,
    because the source's arrivals could not be read; `partial_problem` when the observation lacks optional figures
    the source could not read in time (its `partial_problem` after `collect`: the window deadline)."""

    observation: TrafficObservation | None
    problem_kind: NoTrafficDataKind | None = None
    problem_detail: str = ""
    curve_problem: str | None = None
    partial_problem: str | None = None

    @property
    def problem(self) -> str | None:
        """`kind: detail` when there is no observation because of a problem, else None."""
        if self.problem_kind is None:
            return None
        return f"{self.problem_kind.value}: {self.problem_detail}"


def collect_safely(
    source: TrafficSource,
    window_start: dt.datetime,
    window_end: dt.datetime,
    planner: Planner | None = None,
) -> CollectedTraffic:
    """Collect one window; a `TrafficUnavailable` becomes an empty result carrying the reason.

    With a `planner` and a source that has arrivals, the observation carries the window's request arrivals
    (`with_arrivals`, on the epoch-seconds clock), which the tick derives the prompt-arrival curve from; when only
    the arrivals fail, it is kept without them and `curve_problem` says why.
    """
    try:
        observation = source.collect(window_start, window_end)
    except TrafficUnavailable as exc:
        return CollectedTraffic(observation=None, problem_kind=exc.kind, problem_detail=exc.detail)
    partial = getattr(source, "partial_problem", None)  # a source may say what it left out (Prometheus does)
    if planner is None or not isinstance(source, ArrivalSource):
        return CollectedTraffic(observation=observation, partial_problem=partial)
    try:
        arrivals = source.arrivals(window_start, window_end)
    except TrafficUnavailable as exc:
        curve_problem = f"{exc.kind.value}: {exc.detail}"
        return CollectedTraffic(observation=observation, curve_problem=curve_problem, partial_problem=partial)
    observed = with_arrivals(observation, arrivals, window_start.timestamp(), window_end.timestamp())
    return CollectedTraffic(observation=observed, partial_problem=partial)
