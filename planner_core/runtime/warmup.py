"""Warm start: pre-fill a deployment's load history from request traces before its first live window.

Used by the service when a deployment has no stored state yet. As in Dynamo (`warm_from_observations`), only
the `sla` optimisation target warms its predictors; the trace (`load_predictor_warmup_trace`: a file, glob or
folder of Mooncake, Dynamo request-trace-v1 or Azure traces) is cut into throughput windows
(`bucket_windows`) and each window is fed through `observe_window`, exactly as live ticks would feed it.

Afterwards the leading-idle skip is re-armed (`seen_traffic=False`), as Dynamo's `reset_idle_skip`: idle
windows right after deployment are skipped again until live traffic arrives, instead of teaching the
predictors a run of zeros. Pure apart from reading the trace.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

from planner_core.config import OptimizationTarget, PlannerConfig
from planner_core.domain import LoadHistory, TrafficObservation
from planner_core.predict import observe_window
from planner_core.traces import bucket_windows, load_traces


def history_from_windows(config: PlannerConfig, windows: Iterable[TrafficObservation]) -> LoadHistory:
    """The load history after observing `windows` (oldest first) from an empty history, idle skip re-armed.

    Pure. Returns the empty history unless `config.optimization_target` is `sla` (Dynamo warms only then).
    """
    if config.optimization_target is not OptimizationTarget.SLA:
        return LoadHistory()
    history = LoadHistory()
    for window in windows:
        history, _ = observe_window(history, window, config)
    return dataclasses.replace(history, seen_traffic=False)


def warm_history(config: PlannerConfig, trace_spec: str | Path | None = None) -> LoadHistory:
    """Load history warmed from a trace, for a deployment without stored state.

    Args:
        config: the deployment's configuration; its `throughput_adjustment_interval_seconds` is the window.
        trace_spec: file, glob or folder of traces; defaults to `config.load_predictor_warmup_trace`.

    Returns:
        The warmed history; the empty `LoadHistory()` when there is no trace or the target is not `sla`
        (the trace is then not read).

    Raises:
        TraceError: the trace cannot be read (one line naming the file, line and field). Dynamo logs such a
            failure and starts cold; the caller decides.
    """
    spec = trace_spec if trace_spec is not None else config.load_predictor_warmup_trace
    if spec is None or config.optimization_target is not OptimizationTarget.SLA:
        return LoadHistory()
    trace = load_traces(spec)
    return history_from_windows(config, bucket_windows(trace, config.throughput_adjustment_interval_seconds))
