"""The trace replay source: a trace looped against the wall clock, with the arrivals of its windows on the epoch
clock, so a served tick without a frontend still gets the prompt-arrival curve (reads the shipped trace)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from planner_core.arrivals import with_arrivals
from planner_core.config import load_config
from planner_core.data import AZURE_CONV_TRACE, DEFAULT_CONFIG
from planner_core.domain import PROMPT_ARRIVAL_INTERVALS_S
from planner_core.planner import build_planner
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources import TraceReplaySource, collect_safely, collect_traffic
from planner_core.traces import load_trace


def _at(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC)


def test_trace_replay_arrivals_and_curve_on_the_epoch_clock() -> None:
    """Two loops after the trace's start, a window 100 s into it: the trace's requests of [70 s, 160 s), shifted
    onto the window's clock, and the planner's curve is the one computed on the trace's own offsets."""
    trace = load_trace(AZURE_CONV_TRACE)
    source = TraceReplaySource(trace)
    start_s = trace.start_epoch_s + 2 * trace.duration_s + 100.0
    arrivals = source.arrivals(_at(start_s), _at(start_s + 60.0))
    expected = trace.arrivals(100.0, 160.0)
    assert arrivals.num_requests == expected.num_requests > 0
    np.testing.assert_allclose(arrivals.arrival_s, np.asarray(expected.arrival_s) + start_s - 100.0, atol=1e-5)
    assert arrivals.isl.tolist() == expected.isl.tolist() and arrivals.resolution_s == 0.0

    planner = build_planner(load_config(DEFAULT_CONFIG).policy, DEFAULT_CONFIG)
    collected = collect_safely(source, _at(start_s), _at(start_s + 60.0), planner)
    assert collected.curve_problem is None and collected.observation is not None
    assert collected.observation.prompt_arrival_curve() == ()  # the source records arrivals, the tick derives
    on_epoch = planner.traffic_features(collected.observation)
    on_offsets = planner.traffic_features(with_arrivals(trace.observe(100.0, 160.0), expected, 100.0, 160.0))
    for name in PROMPT_ARRIVAL_INTERVALS_S:
        assert getattr(on_epoch, name) == pytest.approx(getattr(on_offsets, name), rel=1e-9), name


def test_trace_replay_window_across_the_loop_reads_one_pass() -> None:
    """A window crossing the trace's end has the requests before the end only (as `collect` counts them), and
    a look-back before the trace's start has none of the previous loop."""
    trace = load_trace(AZURE_CONV_TRACE)
    source = TraceReplaySource(trace)
    pass_start_s = trace.start_epoch_s + trace.duration_s  # the second pass starts here
    late = source.arrivals(_at(pass_start_s - 10.0), _at(pass_start_s + 50.0))
    assert late.num_requests == trace.arrivals(trace.duration_s - 10.0, trace.duration_s + 50.0).num_requests
    assert float(np.max(late.arrival_s)) < pass_start_s + 1e-3
    early = source.arrivals(_at(pass_start_s + 5.0), _at(pass_start_s + 65.0))
    assert float(np.min(early.arrival_s)) >= pass_start_s - 1e-3


def test_collect_traffic_from_a_trace_carries_the_curve() -> None:
    """`collect_traffic` with the planner (what the served throughput tick passes) records the arrivals the tick
    derives the curve from."""
    loaded = load_config(DEFAULT_CONFIG)
    planner = build_planner(loaded.policy, DEFAULT_CONFIG)
    trace = load_trace(AZURE_CONV_TRACE)
    start = _at(trace.start_epoch_s + 600.0)
    settings = RuntimeSettings(trace=AZURE_CONV_TRACE)
    collected = collect_traffic(
        loaded.policy, loaded.service, start, start + dt.timedelta(seconds=60), settings, planner=planner
    )
    assert collected is not None and collected.observation is not None
    assert collected.observation.prompt_arrivals is not None
    derived = planner.traffic_features(collected.observation)
    assert len(derived.prompt_arrival_curve()) == len(PROMPT_ARRIVAL_INTERVALS_S)
    without = collect_traffic(loaded.policy, loaded.service, start, start + dt.timedelta(seconds=60), settings)
    assert without.observation.prompt_arrivals is None
    assert planner.traffic_features(without.observation).prompt_arrival_curve() == ()


def test_trace_replay_is_rate_scaled_by_the_setting(tmp_path) -> None:
    """`PLANNER_TRACE_RATE_SCALE` multiplies the replayed trace's request rate (so a served trial scales): the
    same window holds about 3x the requests at 3."""
    config = load_config(DEFAULT_CONFIG)
    trace = load_trace(AZURE_CONV_TRACE)
    start, end = _at(trace.start_epoch_s + 600.0), _at(trace.start_epoch_s + 660.0)
    counts = {}
    for scale in (1.0, 3.0):
        settings = RuntimeSettings(trace=AZURE_CONV_TRACE, trace_rate_scale=scale, data_dir=tmp_path)
        collected = collect_traffic(config.policy, config.service, start, end, settings)
        assert collected is not None and collected.observation is not None
        counts[scale] = collected.observation.num_req
    assert counts[3.0] == pytest.approx(3 * counts[1.0], rel=0.02)
