"""Traffic sources for served flows: where a tick's traffic observation comes from.

`PrometheusTrafficSource` (`planner_core.runtime.sources.prometheus`) reads a Dynamo frontend's series from Prometheus;
`TraceReplaySource` replays a request trace against the wall clock (the trace loops), for running the served
deployments without a real frontend. `collect_traffic` picks the configured one and never raises for missing
data: it returns a `CollectedTraffic` without an observation and the reason, so the tick records
`no_traffic_data` and holds.
"""

from __future__ import annotations

import datetime as dt

from planner_core.config import PlannerConfig, ServiceConfig
from planner_core.domain import TrafficObservation
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources.base import (
    CollectedTraffic,
    NoTrafficDataKind,
    TrafficSource,
    TrafficUnavailable,
    collect_safely,
)
from planner_core.traces import RequestTrace

__all__ = [
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

    def collect(self, window_start: dt.datetime, window_end: dt.datetime) -> TrafficObservation:
        duration_s = (window_end - window_start).total_seconds()
        offset_s = (window_start.timestamp() - self.trace.start_epoch_s) % self.trace.duration_s
        return self.trace.observe(offset_s, offset_s + duration_s)


def collect_traffic(
    config: PlannerConfig,
    service: ServiceConfig,
    window_start: dt.datetime,
    window_end: dt.datetime,
    settings: RuntimeSettings | None = None,
) -> CollectedTraffic | None:
    """Traffic of the window from the configured source; None when no source is configured.

    Prometheus when the config's `metric_pulling_prometheus_endpoint` or `PLANNER_PROMETHEUS_ENDPOINT` names one,
    else the trace of `PLANNER_TRACE`. A Prometheus source that cannot be built (an unreadable CA bundle) is
    reported like an unreachable one, so every tick still records why it held.
    """
    settings = settings or RuntimeSettings()
    from planner_core.runtime.sources.prometheus import PrometheusTrafficSource  # httpx only when Prometheus is used

    try:
        prometheus = PrometheusTrafficSource.from_config(config, service, settings)
    except ValueError as exc:
        return CollectedTraffic(observation=None, problem_kind=NoTrafficDataKind.UNREACHABLE, problem_detail=str(exc))
    if prometheus is not None:
        with prometheus:
            return collect_safely(prometheus, window_start, window_end)
    if settings.trace is not None:
        from planner_core.traces import load_trace

        return collect_safely(TraceReplaySource(load_trace(settings.trace)), window_start, window_end)
    return None
