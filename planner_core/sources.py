"""Traffic sources for served flows: where a tick's traffic observation comes from.

`TraceReplaySource` replays a request trace against the wall clock (the trace loops), for running the served
deployments without a real frontend. Production sources (Prometheus) plug in beside it.
"""

from __future__ import annotations

import datetime as dt

from planner_core.domain import TrafficObservation
from planner_core.traces import RequestTrace


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
