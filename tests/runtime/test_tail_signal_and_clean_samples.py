"""The load loop's tail-latency signal (frontend p95/p99 TTFT and queue time) and the online perf models' clean
samples (no engine starting or draining), with the sources that provide the tail: the simulator's observation, its
Prometheus exporter and the Prometheus source's queries."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner_core.config import ThroughputMetricsSource
from planner_core.domain import (
    Component,
    EngineLifecycle,
    Loop,
    OnlinePerfState,
    PlannerState,
    ReasonCode,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.perf.online import serving_samples
from planner_core.policy.load import calculate_load_replicas, tail_latency_signal
from planner_core.runtime.sources.prometheus import (
    RawAnswers,
    TrafficQueries,
    observation_from_answers,
)
from planner_core.tick import tick
from tests.core.test_load_policy import MODEL, TARGETS, by_step, engine, headline, inputs, prefill_fleet
from tests.core.test_tick import make_config

BOTH = (Component.PREFILL, Component.DECODE)


def frontend(**latency: float) -> TrafficObservation:
    return TrafficObservation(duration_s=5.0, num_req=50, isl=1000.0, osl=100.0, **latency)


# --- the tail rule ------------------------------------------------------------------------------------------------


def test_a_tail_above_the_target_adds_an_engine() -> None:
    """TTFT 200 ms: a p99 of 350 ms raises 3 -> 4 even when the engine estimates wanted to hold or shrink."""
    for desired in (2, 3):
        value, step = tail_latency_signal(Component.PREFILL, 3, desired, frontend(ttft_ms_p99=350.0), TARGETS)
        assert (value, step.reason) == (4, ReasonCode.TAIL_LATENCY_HIGH)


def test_queue_time_alone_adds_an_engine_and_p95_stands_in_for_p99() -> None:
    value, step = tail_latency_signal(Component.PREFILL, 2, 2, frontend(queue_ms=260.0), TARGETS)
    assert (value, step.reason) == (3, ReasonCode.TAIL_LATENCY_HIGH)
    value, step = tail_latency_signal(Component.PREFILL, 2, 2, frontend(ttft_ms_p95=201.0), TARGETS)
    assert (value, step.reason, "p95 TTFT 201 ms" in step.detail) == (3, ReasonCode.TAIL_LATENCY_HIGH, True)


def test_a_tail_near_the_target_refuses_a_scale_down_and_a_low_one_allows_it() -> None:
    """down_sensitivity 0.8: a p99 of 170 ms (> 160 ms) keeps 3; 120 ms lets the estimates' 2 through."""
    value, step = tail_latency_signal(Component.PREFILL, 3, 2, frontend(ttft_ms_p99=170.0), TARGETS)
    assert (value, step.reason) == (3, ReasonCode.TAIL_LATENCY_REFUSED_DOWN)
    value, step = tail_latency_signal(Component.PREFILL, 3, 2, frontend(ttft_ms_p99=120.0), TARGETS)
    assert (value, step.reason) == (2, ReasonCode.TAIL_LATENCY_OK)


def test_nothing_measured_changes_nothing() -> None:
    for observed in (None, frontend()):
        value, step = tail_latency_signal(Component.PREFILL, 3, 2, observed, TARGETS)
        assert (value, step.reason) == (2, ReasonCode.TAIL_LATENCY_OK) and "measures no" in step.detail


def test_the_load_proposer_applies_it_to_the_prompt_pool_only_when_asked() -> None:
    """Two idle prefill engines (the estimates would shrink to 1) under a p99 of 400 ms: off, the pool shrinks;
    on, it grows to 3. The decode pool never reads the TTFT tail."""
    fpm = prefill_fleet([0, 0])
    off, _ = calculate_load_replicas(inputs(Component.PREFILL, fpm, frontend=frontend(ttft_ms_p99=400.0)), MODEL)
    on, steps = calculate_load_replicas(
        inputs(Component.PREFILL, fpm, frontend=frontend(ttft_ms_p99=400.0), tail_latency_scaling=True), MODEL
    )
    assert (off, on) == (1, 3)
    assert headline(steps) is ReasonCode.SCALE_UP
    assert [s.reason for s in by_step(steps, "ttft_signal")][-1] is ReasonCode.TAIL_LATENCY_HIGH
    decode = tuple(engine(Component.DECODE, f"d{i}", decode_kv=1000, decode_requests=1) for i in range(2))
    _, decode_steps = calculate_load_replicas(
        inputs(Component.DECODE, decode, frontend=frontend(ttft_ms_p99=400.0), tail_latency_scaling=True), MODEL
    )
    assert not [s for s in decode_steps if s.reason is ReasonCode.TAIL_LATENCY_HIGH]


# --- the sources --------------------------------------------------------------------------------------------------


def test_the_simulator_observes_the_ttft_tail_and_the_wait_for_a_first_token() -> None:
    """One prefill engine and a clump of long prompts: the p99 TTFT is the slowest requests' and above the mean,
    and the mean wait counts every request of the window up to its first token (or the window's end)."""
    from planner_core.lab.sim.des import ClusterSimulator, SimSpec
    from tests.core.fakes import FWD, make_trace

    trace = make_trace([0.0] * 20 + [5.0], [8000.0] * 21, [10.0] * 21)
    sim = ClusterSimulator(trace, FWD, SimSpec(), num_prefill=1, num_decode=1)
    sim.run_until(30.0)
    observed = sim.observe(0.0, 30.0)
    ttft_ms = sim.result().ttft_s * 1000.0
    assert observed.ttft_ms_p99 == np.percentile(ttft_ms, 99.0)
    assert observed.ttft_ms_p99 > observed.ttft_ms_p95 > observed.ttft_ms
    assert observed.queue_ms == pytest.approx(np.mean(ttft_ms))  # every first token came within the window


def test_the_prometheus_source_asks_for_the_tail_and_the_queue() -> None:
    queries = TrafficQueries()
    p99 = queries.quantile(queries.series.time_to_first_token_s, 0.99, "60s")
    assert p99.startswith("histogram_quantile(0.99, sum by (le) (increase(dynamo_frontend_time_to_first_token")
    queue = queries.queue_s("60s")
    assert queue is not None and "avg_over_time(dynamo_frontend_queued_requests" in queue
    router = TrafficQueries(source=ThroughputMetricsSource.ROUTER)
    assert router.queue_s("60s") is None  # the router exports no queued-requests gauge
    obs = observation_from_answers(
        RawAnswers(duration_s=60.0, num_req=60.0, isl=1000.0, osl=100.0, ttft_p95_s=0.3, ttft_p99_s=0.9, queue_s=0.05)
    )
    assert (obs.ttft_ms_p95, obs.ttft_ms_p99, obs.queue_ms) == (300.0, 900.0, 50.0)


def test_the_exporter_publishes_the_queued_requests_gauge() -> None:
    """Ten long prompts at once on one prefill engine: 50 ms in most still wait for a first token; a minute
    later none does."""
    from planner_core.lab.sim.des import ClusterSimulator, SimSpec
    from planner_core.lab.sim.exporter import TraceMetricsExporter
    from tests.core.fakes import FWD, make_trace

    trace = make_trace([0.0] * 10, [8000.0] * 10, [10.0] * 10)
    clock = [0.0]
    sim = ClusterSimulator(trace, FWD, SimSpec(), num_prefill=1, num_decode=1)
    exporter = TraceMetricsExporter(sim, model="m", started_at_s=0.0, clock=lambda: clock[0])
    clock[0] = 0.05
    waiting = {s.name: s.value for family in exporter.collect() for s in family.samples}
    assert 0 < waiting["dynamo_frontend_queued_requests"] <= 10
    clock[0] = 60.0
    done = {s.name: s.value for family in exporter.collect() for s in family.samples}
    assert done["dynamo_frontend_queued_requests"] == 0


# --- clean perf-model samples ---------------------------------------------------------------------------------


def stable(prefill: int, decode: int) -> WorkerCounts:
    return WorkerCounts(ready_prefill=prefill, ready_decode=decode, expected_prefill=prefill, expected_decode=decode)


def test_starting_and_draining_engines_never_reach_the_regressions() -> None:
    fpms = (
        engine(Component.PREFILL, "p0", queued_prefill=100),
        dataclasses.replace(engine(Component.PREFILL, "p1"), lifecycle=EngineLifecycle.STARTING),
        dataclasses.replace(engine(Component.DECODE, "d0", decode_kv=100), lifecycle=EngineLifecycle.DRAINING),
    )
    kept, steps = serving_samples(fpms, stable(2, 1), BOTH)
    assert [f.worker_id for f in kept] == ["p0"]
    assert {(s.component, s.reason, s.value) for s in steps} == {
        (Component.PREFILL, ReasonCode.SAMPLES_EXCLUDED, 1),
        (Component.DECODE, ReasonCode.SAMPLES_EXCLUDED, 1),
    }


def test_a_pool_scaling_or_with_extra_reporters_is_left_out_whole() -> None:
    """Prefill 2 ready of 3 expected (one starting); decode 2 workers reporting for 1 ready (one draining):
    neither pool's reports can be told apart from the engines in transit, so none is kept."""
    fpms = (
        engine(Component.PREFILL, "p0"),
        engine(Component.PREFILL, "p1"),
        engine(Component.DECODE, "d0", decode_kv=10),
        engine(Component.DECODE, "d1", decode_kv=10),
    )
    counts = WorkerCounts(ready_prefill=2, ready_decode=1, expected_prefill=3, expected_decode=1)
    kept, steps = serving_samples(fpms, counts, BOTH)
    assert kept == ()
    details = {s.component: s.detail for s in steps}
    assert "scale in flight (2 ready, 3 expected)" in details[Component.PREFILL]
    assert "2 workers report, 1 ready" in details[Component.DECODE]
    kept, steps = serving_samples(fpms, stable(2, 2), BOTH)  # settled: everything counts
    assert len(kept) == 4 and steps == []


def test_a_load_tick_during_a_scale_up_leaves_the_online_models_as_they_were() -> None:
    config = make_config(optimization_target="sla", enable_throughput_scaling=False, enable_load_scaling=True)
    fpms = tuple(engine(Component.PREFILL, f"p{i}", queued_prefill=100 * i, counter=i) for i in range(2))
    scaling = WorkerCounts(ready_prefill=2, ready_decode=1, expected_prefill=3, expected_decode=1)
    outcome = tick(TickInputs(now_s=10.0, loop=Loop.LOAD, workers=scaling, fpm=fpms), PlannerState(), config, None)
    assert outcome.next_state.perf_models == OnlinePerfState()
    assert [s.reason for s in outcome.steps if s.step == "sample"] == [ReasonCode.SAMPLES_EXCLUDED]
    settled = tick(TickInputs(now_s=10.0, loop=Loop.LOAD, workers=stable(2, 1), fpm=fpms), PlannerState(), config, None)
    assert len(settled.next_state.perf_models.prefill.samples) == 2
