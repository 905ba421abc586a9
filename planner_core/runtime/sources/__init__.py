"""Traffic sources for served flows: where a tick's traffic observation comes from.

`PrometheusTrafficSource` (`planner_core.runtime.sources.prometheus`) reads a Dynamo frontend's series from Prometheus;
`TraceReplaySource` replays a request trace against the wall clock (the trace loops), for running the served
deployments without a real frontend. `collect_traffic` picks the configured one and never raises for missing
data: it returns a `CollectedTraffic` without an observation and the reason, so the tick records
`no_traffic_data` and holds. Given the `Planner`, both sources also record the window's request arrivals with
the observation (`planner_core.arrivals.with_arrivals` over their `arrivals`), which the tick derives the
prompt-arrival curve from; when only that fails, the observation comes without them and with a `curve_problem`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np

from planner_core.arrivals import RequestArrivals
from planner_core.config import PlannerConfig, ServiceConfig
from planner_core.domain import TrafficObservation
from planner_core.planner import Planner
from planner_core.runtime.redact import redact_text
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources.base import (
    ArrivalSource,
    CollectedTraffic,
    NoTrafficDataKind,
    TrafficSource,
    TrafficUnavailable,
    collect_safely,
)
from planner_core.traces import RequestTrace

__all__ = [
    "ArrivalSource",
    "CollectedTraffic",
    "NoTrafficDataKind",
    "TraceReplaySource",
    "TrafficSource",
    "TrafficUnavailable",
    "collect_safely",
    "collect_traffic",
]


class TraceReplaySource:
    """Traffic of a trace replayed in wall-clock time: window [t0, t1) maps to trace offsets modulo its length."""

    def __init__(self, trace: RequestTrace) -> None:
        if trace.duration_s <= 0:
            raise ValueError(f"{trace.source}: trace too short to replay ({trace.num_requests} requests)")
        self.trace = trace

    def _offset_s(self, window_start: dt.datetime) -> float:
        """The trace offset the window starts at (the trace loops)."""
        return (window_start.timestamp() - self.trace.start_epoch_s) % self.trace.duration_s

    def collect(self, window_start: dt.datetime, window_end: dt.datetime) -> TrafficObservation:
        duration_s = (window_end - window_start).total_seconds()
        offset_s = self._offset_s(window_start)
        return self.trace.observe(offset_s, offset_s + duration_s)

    def arrivals(self, window_start: dt.datetime, window_end: dt.datetime) -> RequestArrivals:
        """The trace's requests of [window_start - LOOKBACK_S, window_end) (`RequestTrace.arrivals` at the window's
        offset), timestamped on the epoch-seconds clock of the window.

        Like `collect`, the window is read from one pass of the trace: where it (or its look-back) crosses the
        trace's end (or start), only the part inside that pass is there, not the next (or previous) loop's."""
        offset_s = self._offset_s(window_start)
        duration_s = (window_end - window_start).total_seconds()
        arrivals = self.trace.arrivals(offset_s, offset_s + duration_s)
        epoch_s = np.asarray(arrivals.arrival_s, dtype=float) + (window_start.timestamp() - offset_s)
        return dataclasses.replace(arrivals, arrival_s=epoch_s)


def collect_traffic(
    config: PlannerConfig,
    service: ServiceConfig,
    window_start: dt.datetime,
    window_end: dt.datetime,
    settings: RuntimeSettings | None = None,
    planner: Planner | None = None,
) -> CollectedTraffic | None:
    """Traffic of the window from the configured source; None when no source is configured. With the `planner`
    that will decide on it, the observation carries the window's request arrivals, which its tick derives the
    prompt-arrival curve from (`collect_safely`).

    Prometheus when the config's `metric_pulling_prometheus_endpoint` or `PLANNER_PROMETHEUS_ENDPOINT` names one,
    else the trace of `PLANNER_TRACE`. A Prometheus source that cannot be built (an unreadable CA bundle) is
    reported like an unreachable one, so every tick still records why it held.
    """
    settings = settings or RuntimeSettings()
    from planner_core.runtime.sources.prometheus import PrometheusTrafficSource  # httpx only when Prometheus is used

    try:
        prometheus = PrometheusTrafficSource.from_config(config, service, settings)
    except ValueError as exc:
        detail = redact_text(str(exc))  # the message may quote the endpoint, password included
        return CollectedTraffic(observation=None, problem_kind=NoTrafficDataKind.UNREACHABLE, problem_detail=detail)
    if prometheus is not None:
        with prometheus:
            return collect_safely(prometheus, window_start, window_end, planner)
    if settings.trace is not None:
        from planner_core.traces import load_trace

        trace = load_trace(settings.trace).scaled(settings.trace_rate_scale)
        return collect_safely(TraceReplaySource(trace), window_start, window_end, planner)
    return None
