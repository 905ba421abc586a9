"""Unit tests of the pure decision core `planner_core.tick.tick` (no database, no Prefect).

Exact arithmetic uses `FixedRatePerf`, a tiny perf model with fixed tokens/s/GPU (a pure value implementing the
`ThroughputPerfModel` protocol, not a mock), so every expected replica count can be worked out by hand in the
comment next to it. Realistic sizing uses the shipped H200 TP1 profile, loaded once per module.

Unless a case says otherwise, the config is `BASE_CONFIG`: target `sla` (throughput loop on, load loop off), a
60 s throughput window, the constant predictor, no GPU budget and a change cap of 100, so that only the step under
test shapes the answer. With the constant predictor the forecast is the observed window, so
`prefill = ceil(num_req / 60 * ISL / (10_000 * gpus))` and `decode = ceil(num_req / 60 * OSL / (1_000 * gpus))`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner_core.config import LengthSizing, LoadPredictorName, PlannerConfig, managed_components, parse_config
from planner_core.data import H200_PROFILE_DIR
from planner_core.domain import (
    Component,
    LoadHistory,
    Loop,
    PlannerState,
    Prediction,
    ReasonCode,
    ScalingDecision,
    StepRecord,
    TickInputs,
    TickOutcome,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.perf.model import ProfilePerfModel
from planner_core.perf.protocol import PhaseCapacity, ThroughputPerfModel
from planner_core.policy.throughput import sizing_shape
from planner_core.tick import tick

PROFILE_DIR = H200_PROFILE_DIR
WINDOW_S = 60
PREFILL_RATE = 10_000.0  # FixedRatePerf prefill tokens/s/GPU
DECODE_RATE = 1_000.0  # FixedRatePerf decode tokens/s/GPU

BASE_CONFIG: dict[str, Any] = {
    "optimization_target": "sla",
    "throughput_adjustment_interval_seconds": WINDOW_S,
    "load_predictor": "constant",
    "max_gpu_budget": -1,
    "max_throughput_scaling_replicas": 100,
    "ttft_ms": 200,
    "itl_ms": 10,
}

# the figures of an observation (its recorded arrivals are not one)
TRAFFIC_FIELDS = tuple(f.name for f in dataclasses.fields(TrafficObservation) if f.name != "prompt_arrivals")


@dataclass(frozen=True, slots=True)
class FixedRatePerf:
    """A perf model whose engines serve fixed tokens/s/GPU whatever the shape; latency is the SLA itself."""

    prefill_tokens_per_s_per_gpu: float = PREFILL_RATE
    decode_tokens_per_s_per_gpu: float = DECODE_RATE
    sla_met: bool = True
    ttft_any_isl_ms: float = 100.0  # what the 0.x correction factors compare observed latencies with
    itl_any_load_ms: float = 5.0

    def prefill_capacity(self, *, isl: float, ttft_ms: float) -> PhaseCapacity:  # noqa: ARG002 (protocol shape)
        return PhaseCapacity(
            tokens_per_s_per_gpu=self.prefill_tokens_per_s_per_gpu, latency_ms=ttft_ms, sla_met=self.sla_met
        )

    def decode_capacity(self, *, isl: float, osl: float, itl_ms: float) -> PhaseCapacity:  # noqa: ARG002
        return PhaseCapacity(
            tokens_per_s_per_gpu=self.decode_tokens_per_s_per_gpu, latency_ms=itl_ms, sla_met=self.sla_met
        )

    def prefill_ttft_ms(self, isl: float) -> float:  # noqa: ARG002
        return self.ttft_any_isl_ms

    def decode_itl_ms(self, concurrency: float, context_length: float) -> float:  # noqa: ARG002
        return self.itl_any_load_ms

    def forward_pass_model(self) -> None:
        return None

    def profiled_max_kv_tokens(self) -> None:
        return None


FAKE: ThroughputPerfModel = FixedRatePerf()


@pytest.fixture(scope="module")
def profile_perf() -> ProfilePerfModel:
    """The shipped H200 TP1 profile (Llama-3.1-8B-Instruct-FP8), loaded once per module."""
    return ProfilePerfModel.load(PROFILE_DIR)


# --- helpers ------------------------------------------------------------------------------------------------


def make_config(**overrides: Any) -> PlannerConfig:
    return parse_config({**BASE_CONFIG, **overrides}).policy


def workers(
    expected_prefill: int = 1, expected_decode: int = 1, *, ready: tuple[int, int] | None = None
) -> WorkerCounts:
    ready_prefill, ready_decode = ready if ready is not None else (expected_prefill, expected_decode)
    return WorkerCounts(
        ready_prefill=ready_prefill,
        ready_decode=ready_decode,
        expected_prefill=expected_prefill,
        expected_decode=expected_decode,
    )


def traffic(num_req: float, isl: float = 1000.0, osl: float = 100.0, **extra: float | None) -> TrafficObservation:
    return TrafficObservation(duration_s=WINDOW_S, num_req=num_req, isl=isl, osl=osl, **extra)


def throughput_inputs(
    obs: TrafficObservation | None, counts: WorkerCounts | None = None, now_s: float = 1_700_000_000.0
) -> TickInputs:
    return TickInputs(now_s=now_s, loop=Loop.THROUGHPUT, workers=counts or workers(), traffic=obs)


def desired(outcome: TickOutcome) -> dict[Component, int]:
    return {p.component: p.desired for p in outcome.proposals}


def gpus(outcome: TickOutcome, config: PlannerConfig) -> int:
    d = desired(outcome)
    return (
        d.get(Component.PREFILL, 0) * config.prefill_gpus_per_engine
        + d.get(Component.DECODE, 0) * config.decode_gpus_per_engine
    )


def steps_named(outcome: TickOutcome, step: str, component: Component | None = None) -> list[StepRecord]:
    return [s for s in outcome.steps if s.step == step and (component is None or s.component is component)]


def decide_step(outcome: TickOutcome) -> StepRecord:
    """The builtin plugin's `decide` step: the loop's own headline before the pipeline's final invariants."""
    return steps_named(outcome, "decide")[-1]


def busy_history(num_req: tuple[float, ...], isl: tuple[float, ...], osl: tuple[float, ...]) -> LoadHistory:
    """A history as the constant predictor builds it from windows without length percentiles: the percentile
    series repeat the means and no model state is kept."""
    return LoadHistory(
        num_req=num_req,
        isl=isl,
        osl=osl,
        isl_quantile=isl,
        osl_quantile=osl,
        seen_traffic=True,
        num_windows=len(num_req),
    )


# --- sizing: ceil(demand / capacity), with +/- epsilon around each threshold -----------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingCase:
    id: str
    num_req: float
    isl: float
    osl: float
    want_prefill: int
    want_decode: int
    overrides: Mapping[str, Any] = field(default_factory=dict)


SIZING_CASES = [
    # 600 req / 60 s = 10 req/s; prefill 10 * 1000 = 10,000 tok/s -> ceil(10000/10000) = 1;
    # decode 10 * 100 = 1,000 tok/s -> ceil(1000/1000) = 1.
    SizingCase(id="brief-example-at-capacity", num_req=600, isl=1000, osl=100, want_prefill=1, want_decode=1),
    # 60 req / 60 s = 1 req/s; prefill 1 * 9999 = 9,999 tok/s -> ceil(0.9999) = 1 (capacity - 1 token/s).
    SizingCase(id="prefill-capacity-minus-1", num_req=60, isl=9999, osl=100, want_prefill=1, want_decode=1),
    # 1 req/s * 10000 = 10,000 tok/s -> ceil(1.0) = 1 (exactly at capacity: no extra engine).
    SizingCase(id="prefill-exactly-capacity", num_req=60, isl=10000, osl=100, want_prefill=1, want_decode=1),
    # 1 req/s * 10001 = 10,001 tok/s -> ceil(1.0001) = 2 (capacity + 1 token/s).
    SizingCase(id="prefill-capacity-plus-1", num_req=60, isl=10001, osl=100, want_prefill=2, want_decode=1),
    # decode 1 req/s * 999 = 999 tok/s -> ceil(0.999) = 1.
    SizingCase(id="decode-capacity-minus-1", num_req=60, isl=1000, osl=999, want_prefill=1, want_decode=1),
    # decode 1 req/s * 1000 = 1,000 tok/s -> ceil(1.0) = 1.
    SizingCase(id="decode-exactly-capacity", num_req=60, isl=1000, osl=1000, want_prefill=1, want_decode=1),
    # decode 1 req/s * 1001 = 1,001 tok/s -> ceil(1.001) = 2.
    SizingCase(id="decode-capacity-plus-1", num_req=60, isl=1000, osl=1001, want_prefill=1, want_decode=2),
    # 6000 req / 60 s = 100 req/s; prefill 100 * 2000 = 200,000 tok/s -> 20; decode 100 * 500 = 50,000 -> 50.
    SizingCase(id="large", num_req=6000, isl=2000, osl=500, want_prefill=20, want_decode=50),
    # 2 GPUs per prefill engine: 200,000 / (2 * 10,000) = 10; 4 per decode engine: 100 * 480 = 48,000 / 4,000 = 12.
    SizingCase(
        id="multi-gpu-engines",
        num_req=6000,
        isl=2000,
        osl=480,
        want_prefill=10,
        want_decode=12,
        overrides={"prefill_engine_num_gpu": 2, "decode_engine_num_gpu": 4},
    ),
    # multi-GPU threshold: 1 req/s * 20000 = 20,000 tok/s over 2 * 10,000 -> 1; decode 1 * 4001 / 4000 -> 2.
    SizingCase(
        id="multi-gpu-thresholds",
        num_req=60,
        isl=20000,
        osl=4001,
        want_prefill=1,
        want_decode=2,
        overrides={"prefill_engine_num_gpu": 2, "decode_engine_num_gpu": 4},
    ),
]


@pytest.mark.parametrize("case", SIZING_CASES, ids=lambda c: c.id)
def test_sizing_is_ceil_of_demand_over_capacity(case: SizingCase) -> None:
    """Replicas per pool are ceil(forecast tokens/s / engine tokens/s), exact at the threshold."""
    config = make_config(**case.overrides)
    outcome = tick(throughput_inputs(traffic(case.num_req, case.isl, case.osl)), PlannerState(), config, FAKE)
    assert desired(outcome) == {Component.PREFILL: case.want_prefill, Component.DECODE: case.want_decode}
    demand_steps = {s.component: s for s in outcome.steps if s.step == "demand"}
    assert demand_steps[Component.PREFILL].value == case.want_prefill
    assert demand_steps[Component.DECODE].value == case.want_decode
    assert all(s.reason is ReasonCode.DEMAND_SIZED for s in demand_steps.values())
    capacity = {s.component: s for s in steps_named(outcome, "capacity")}
    assert capacity[Component.PREFILL].value == PREFILL_RATE * config.prefill_gpus_per_engine
    assert capacity[Component.DECODE].value == DECODE_RATE * config.decode_gpus_per_engine
    assert capacity[Component.PREFILL].reason is ReasonCode.CAPACITY_FROM_PROFILE


def test_sla_unreachable_is_recorded_but_still_sizes() -> None:
    """A perf model that misses the SLA even at batch 1 is flagged `sla_unreachable` and its rate used anyway."""
    outcome = tick(throughput_inputs(traffic(600)), PlannerState(), make_config(), FixedRatePerf(sla_met=False))
    assert {s.reason for s in steps_named(outcome, "capacity")} == {ReasonCode.SLA_UNREACHABLE}
    assert desired(outcome) == {Component.PREFILL: 1, Component.DECODE: 1}  # same arithmetic as the 600-req case


# --- holds: the throughput tick keeps the decision empty and says why ------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldCase:
    id: str
    want: ReasonCode
    overrides: Mapping[str, Any] = field(default_factory=dict)
    obs: TrafficObservation | None = field(default_factory=lambda: traffic(600))
    with_perf: bool = True
    history_advances: bool = False
    detail_contains: str = ""


HOLD_CASES = [
    # default target `throughput` is an "easy" target: throughput loop off, load loop on.
    HoldCase(
        id="easy-target-disables-throughput", overrides={"optimization_target": "throughput"}, want=ReasonCode.DISABLED
    ),
    HoldCase(
        id="sla-with-throughput-flag-off",
        overrides={"enable_throughput_scaling": False, "enable_load_scaling": True},
        want=ReasonCode.DISABLED,
    ),
    HoldCase(id="traffic-none", obs=None, want=ReasonCode.NO_TRAFFIC_DATA, detail_contains="no traffic"),
    HoldCase(
        id="perf-none",
        with_perf=False,
        want=ReasonCode.MODEL_NOT_READY,
        history_advances=True,
        detail_contains="no profile",
    ),
    HoldCase(
        id="agg-mode",
        overrides={"mode": "agg"},
        want=ReasonCode.MODEL_NOT_READY,
        history_advances=True,
        detail_contains="aggregated",
    ),
]


@pytest.mark.parametrize("case", HOLD_CASES, ids=lambda c: c.id)
def test_throughput_hold(case: HoldCase) -> None:
    """Each hold leaves the decision empty, names its reason and only advances what it should."""
    state = PlannerState()
    outcome = tick(throughput_inputs(case.obs), state, make_config(**case.overrides), FAKE if case.with_perf else None)
    assert outcome.reason is case.want
    assert outcome.decision == ScalingDecision()
    assert outcome.proposals == ()
    if case.want is ReasonCode.DISABLED:
        assert [s.reason for s in outcome.steps] == [ReasonCode.DISABLED]
    else:
        assert decide_step(outcome).reason is case.want
    assert any(case.detail_contains in s.detail for s in outcome.steps)
    assert outcome.next_state.num_throughput_ticks == state.num_throughput_ticks + 1
    assert outcome.next_state.num_load_ticks == state.num_load_ticks
    if case.history_advances:
        # observed 600 requests (ISL 1000, OSL 100) before the capacity check held
        assert outcome.next_state.load_history == busy_history((600.0,), (1000.0,), (100.0,))
        assert outcome.prediction is not None and outcome.prediction.num_req == 600.0
    else:
        assert outcome.next_state.load_history == state.load_history
        assert outcome.prediction is None


BAD_VALUES = {"nan": math.nan, "inf": math.inf, "negative": -1.0}


@pytest.mark.parametrize("bad", list(BAD_VALUES), ids=list(BAD_VALUES))
@pytest.mark.parametrize("field_name", TRAFFIC_FIELDS, ids=TRAFFIC_FIELDS)
def test_invalid_traffic_field_holds_without_learning(field_name: str, bad: str) -> None:
    """A NaN, infinite or negative traffic field holds with `no_traffic_data`, names the field, keeps history."""
    history = busy_history((600.0,), (1000.0,), (100.0,))
    state = PlannerState(load_history=history, num_throughput_ticks=7)
    obs = dataclasses.replace(traffic(600), **{field_name: BAD_VALUES[bad]})
    outcome = tick(throughput_inputs(obs), state, make_config(), FAKE)
    assert outcome.reason is ReasonCode.NO_TRAFFIC_DATA
    assert outcome.decision.is_empty
    (step,) = steps_named(outcome, "observe")
    assert step.reason is ReasonCode.NO_TRAFFIC_DATA
    assert f"traffic.{field_name}" in step.detail
    assert outcome.next_state.load_history == history  # not advanced
    assert outcome.next_state.num_throughput_ticks == 8


# --- the load loop ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadCase:
    id: str
    overrides: Mapping[str, Any]
    counts: WorkerCounts
    want: ReasonCode


LOAD_CASES = [
    # target sla with the load flag off: the load loop is disabled.
    LoadCase(id="disabled", overrides={}, counts=workers(2, 3), want=ReasonCode.DISABLED),
    # easy target: load scaling forced on; prefill 1 ready of 2 expected.
    LoadCase(
        id="easy-target-scaling",
        overrides={"optimization_target": "throughput"},
        counts=workers(2, 3, ready=(1, 3)),
        want=ReasonCode.SCALING_IN_PROGRESS,
    ),
    LoadCase(
        id="sla-both-loops-scaling",
        overrides={"enable_load_scaling": True},
        counts=workers(2, 3, ready=(2, 4)),
        want=ReasonCode.SCALING_IN_PROGRESS,
    ),
    LoadCase(
        id="easy-target-settled",
        overrides={"optimization_target": "throughput"},
        counts=workers(2, 3),
        want=ReasonCode.NO_FPM_DATA,
    ),
    LoadCase(
        id="sla-both-loops-settled",
        overrides={"enable_load_scaling": True},
        counts=workers(2, 3),
        want=ReasonCode.NO_FPM_DATA,
    ),
]


@pytest.mark.parametrize("case", LOAD_CASES, ids=lambda c: c.id)
def test_load_tick(case: LoadCase) -> None:
    """The load tick holds with `disabled`, `scaling_in_progress` or `no_fpm_data` and counts itself."""
    state = PlannerState(num_load_ticks=4, num_throughput_ticks=2)
    inputs = TickInputs(now_s=5.0, loop=Loop.LOAD, workers=case.counts, traffic=traffic(600))
    outcome = tick(inputs, state, make_config(**case.overrides), FAKE)
    assert outcome.reason is case.want
    assert outcome.decision == ScalingDecision()
    if case.want is ReasonCode.DISABLED:
        assert [s.reason for s in outcome.steps] == [ReasonCode.DISABLED]
    else:
        assert decide_step(outcome).reason is case.want
    # nothing else changes but the plugin schedules the pipeline keeps and the signals' health
    kept = dataclasses.replace(outcome.next_state, pipeline=state.pipeline, signals=state.signals)
    assert kept == dataclasses.replace(state, num_load_ticks=5)


def test_throughput_tick_counts_only_itself() -> None:
    """A throughput tick advances `num_throughput_ticks` by one and leaves `num_load_ticks` alone."""
    state = PlannerState(num_load_ticks=4, num_throughput_ticks=2)
    outcome = tick(throughput_inputs(traffic(600)), state, make_config(), FAKE)
    assert (outcome.next_state.num_throughput_ticks, outcome.next_state.num_load_ticks) == (3, 4)


# --- idle windows ----------------------------------------------------------------------------------------------


def test_leading_idle_window_is_skipped() -> None:
    """Before any traffic, an idle window leaves the history untouched and is recorded as `idle_window`."""
    outcome = tick(throughput_inputs(traffic(0, isl=0, osl=0)), PlannerState(), make_config(), FAKE)
    assert outcome.next_state.load_history == LoadHistory()
    observe = steps_named(outcome, "observe")
    assert [s.reason for s in observe] == [ReasonCode.IDLE_WINDOW]
    assert "leading" in observe[0].detail
    # empty history forecasts 0 requests -> ceil(0) = 0 -> raised to min_endpoint 1
    assert desired(outcome) == {Component.PREFILL: 1, Component.DECODE: 1}
    assert outcome.reason is ReasonCode.NO_CHANGE


def test_idle_window_after_traffic_carries_lengths_forward() -> None:
    """After traffic, an idle window appends 0 requests with the last ISL/OSL carried forward."""
    history = busy_history((600.0,), (1000.0,), (100.0,))
    outcome = tick(throughput_inputs(traffic(0, isl=0, osl=0)), PlannerState(load_history=history), make_config(), FAKE)
    assert outcome.next_state.load_history == busy_history((600.0, 0.0), (1000.0, 1000.0), (100.0, 100.0))
    assert steps_named(outcome, "observe")[0].reason is ReasonCode.IDLE_WINDOW
    assert outcome.prediction is not None and outcome.prediction.num_req == 0.0


def test_idle_busy_idle_sequence_builds_history() -> None:
    """Over idle, idle, busy, idle ticks only the busy window and the idle one after it are learned."""
    config, state = make_config(), PlannerState()
    windows = [traffic(0, isl=0, osl=0), traffic(0, isl=0, osl=0), traffic(120, 500, 50), traffic(0, isl=0, osl=0)]
    reasons = []
    for i, obs in enumerate(windows):
        outcome = tick(throughput_inputs(obs, now_s=60.0 * i), state, config, FAKE)
        reasons.append(steps_named(outcome, "observe")[0].reason)
        state = outcome.next_state
    assert reasons == [ReasonCode.IDLE_WINDOW, ReasonCode.IDLE_WINDOW, ReasonCode.OBSERVED, ReasonCode.IDLE_WINDOW]
    assert state.load_history == busy_history((120.0, 0.0), (500.0, 500.0), (50.0, 50.0))
    assert state.num_throughput_ticks == 4


# --- predictor -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predictor", "want"),
    [
        (name.value, ReasonCode.PREDICTED if name is LoadPredictorName.CONSTANT else ReasonCode.PREDICTOR_FALLBACK)
        for name in LoadPredictorName
    ],
    ids=[name.value for name in LoadPredictorName],
)
def test_predictor_reason(predictor: str, want: ReasonCode) -> None:
    """On the first window only `constant` has enough points: every other predictor is still warming up, uses the
    last window and is recorded as `predictor_fallback`, naming itself."""
    outcome = tick(throughput_inputs(traffic(600)), PlannerState(), make_config(load_predictor=predictor), FAKE)
    assert outcome.prediction_reason is want
    (step,) = steps_named(outcome, "predict")
    assert step.reason is want
    if want is ReasonCode.PREDICTOR_FALLBACK:
        assert predictor in step.detail
    # every predictor currently forecasts the last window: 600 requests, ISL 1000, OSL 100 -> 1P + 1D
    assert outcome.prediction is not None
    assert (outcome.prediction.num_req, outcome.prediction.isl, outcome.prediction.osl) == (600.0, 1000.0, 100.0)


def test_dynamo_default_predictor_is_a_fallback_only_while_warming_up() -> None:
    """Without `load_predictor` the Dynamo default `arima` is used: flagged as a fallback while it has no order for
    every series, then `predicted` (orders are chosen one series per window from point 5: series 5 at window 9)."""
    config = parse_config({k: v for k, v in BASE_CONFIG.items() if k != "load_predictor"}).policy
    assert config.load_predictor is LoadPredictorName.ARIMA
    state, reasons = PlannerState(), []
    for i in range(10):
        obs = traffic(600 + 37 * (i % 4) + 5 * i, isl=1000 + 90 * (i % 3), osl=100 + 11 * (i % 5))
        outcome = tick(throughput_inputs(obs, now_s=60.0 * i), state, config, FAKE)
        reasons.append(outcome.prediction_reason)
        state = outcome.next_state
    assert reasons == [ReasonCode.PREDICTOR_FALLBACK] * 8 + [ReasonCode.PREDICTED] * 2
    assert "arima: ARIMA(" in steps_named(outcome, "predict")[0].detail


@pytest.mark.parametrize(
    ("predictor", "num_windows"),
    [("constant", 1), ("kalman", 5), ("ensemble", 4)],
    ids=["constant", "kalman", "ensemble"],
)
def test_predictor_is_used_once_warmed_up(predictor: str, num_windows: int) -> None:
    """Each predictor is `predicted` from its first warmed-up window on: kalman after `kalman_min_points` (5),
    the ensemble after 3 scored windows (the first window cannot be scored)."""
    config = make_config(load_predictor=predictor)
    state, reasons = PlannerState(), []
    for i in range(num_windows + 2):
        outcome = tick(throughput_inputs(traffic(600 + 50 * i), now_s=60.0 * i), state, config, FAKE)
        reasons.append(outcome.prediction_reason)
        state = outcome.next_state
    fallbacks = num_windows - 1
    assert reasons == [ReasonCode.PREDICTOR_FALLBACK] * fallbacks + [ReasonCode.PREDICTED] * (len(reasons) - fallbacks)


# --- bounds ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundsCase:
    id: str
    overrides: Mapping[str, Any]
    obs: TrafficObservation
    want_prefill: int
    want_decode: int
    want_step: tuple[str, Component | None, ReasonCode]
    expected: tuple[int, int] = (1, 1)


BOUNDS_CASES = [
    # 60 req / 60 s = 1 req/s: prefill 1,000 tok/s -> ceil(0.1) = 1 -> raised to 3; decode 100 tok/s -> 1 -> 3.
    BoundsCase(
        id="min-endpoint-floor",
        overrides={"min_endpoint": 3},
        obs=traffic(60, 1000, 100),
        want_prefill=3,
        want_decode=3,
        want_step=("min_endpoint", Component.PREFILL, ReasonCode.MIN_ENDPOINT_FLOOR),
    ),
    # same demand (1P, 1D); per-role floors 2 and 4 override min_endpoint 1.
    BoundsCase(
        id="per-role-min-endpoints",
        overrides={"prefill_min_endpoint": 2, "decode_min_endpoint": 4},
        obs=traffic(60, 1000, 100),
        want_prefill=2,
        want_decode=4,
        want_step=("min_endpoint", Component.DECODE, ReasonCode.MIN_ENDPOINT_FLOOR),
    ),
    # only the prefill override: prefill floor 3, decode falls back to min_endpoint 2.
    BoundsCase(
        id="prefill-override-only",
        overrides={"min_endpoint": 2, "prefill_min_endpoint": 3},
        obs=traffic(60, 1000, 100),
        want_prefill=3,
        want_decode=2,
        want_step=("min_endpoint", Component.PREFILL, ReasonCode.MIN_ENDPOINT_FLOOR),
    ),
    # min_endpoint 0 allows scale-to-zero: no traffic yet -> forecast 0 -> ceil(0) = 0 for both.
    BoundsCase(
        id="scale-to-zero",
        overrides={"min_endpoint": 0},
        obs=traffic(0, 0, 0),
        want_prefill=0,
        want_decode=0,
        want_step=("min_endpoint", Component.DECODE, ReasonCode.WITHIN_RANGE),
    ),
    # 100 req/s: demand 20P / 50D; from 2 expected, at most +3 -> 5 each.
    BoundsCase(
        id="delta-capped-up",
        overrides={"max_throughput_scaling_replicas": 3},
        obs=traffic(6000, 2000, 500),
        expected=(2, 2),
        want_prefill=5,
        want_decode=5,
        want_step=("change_rate", Component.DECODE, ReasonCode.DELTA_CAPPED),
    ),
    # demand 1P / 1D; from 10 expected, at most -3 -> 7 each.
    BoundsCase(
        id="delta-capped-down",
        overrides={"max_throughput_scaling_replicas": 3},
        obs=traffic(60, 1000, 100),
        expected=(10, 10),
        want_prefill=7,
        want_decode=7,
        want_step=("change_rate", Component.PREFILL, ReasonCode.DELTA_CAPPED),
    ),
    # demand 20P / 50D is exactly expected + cap (17 + 3, 47 + 3): not capped.
    BoundsCase(
        id="delta-exactly-at-cap",
        overrides={"max_throughput_scaling_replicas": 3},
        obs=traffic(6000, 2000, 500),
        expected=(17, 47),
        want_prefill=20,
        want_decode=50,
        want_step=("change_rate", Component.DECODE, ReasonCode.WITHIN_RANGE),
    ),
    # demand 1 -> floor 4 -> cap from 1 expected: min(1 + 2, 4) = 3 -> floor again: 4 (the floor wins over the cap).
    BoundsCase(
        id="floor-beats-cap",
        overrides={"min_endpoint": 4, "max_throughput_scaling_replicas": 2},
        obs=traffic(60, 1000, 100),
        want_prefill=4,
        want_decode=4,
        want_step=("change_rate", Component.PREFILL, ReasonCode.DELTA_CAPPED),
    ),
    # 100 req/s, ISL 1000 -> 100,000 / 10,000 = 10P; OSL 300 -> 30,000 / 1,000 = 30D; 40 GPUs > 20:
    # scale 20/40 = 0.5 -> 5P, decode gets the rest 20 - 5 = 15.
    BoundsCase(
        id="gpu-budget-capped",
        overrides={"max_gpu_budget": 20},
        obs=traffic(6000, 1000, 300),
        want_prefill=5,
        want_decode=15,
        want_step=("gpu_budget", None, ReasonCode.GPU_BUDGET_CAPPED),
    ),
    # same demand, 40 GPUs == budget 40: untouched.
    BoundsCase(
        id="gpu-budget-exactly-fits",
        overrides={"max_gpu_budget": 40},
        obs=traffic(6000, 1000, 300),
        want_prefill=10,
        want_decode=30,
        want_step=("gpu_budget", None, ReasonCode.WITHIN_RANGE),
    ),
    # 100 req/s, ISL 100 -> 10,000 tok/s -> 1P; OSL 390 -> 39,000 -> 39D; 40 GPUs > 39 by one:
    # scale 39/40 -> prefill max(1, round(0.975)) = 1, decode 39 - 1 = 38.
    BoundsCase(
        id="gpu-budget-one-over",
        overrides={"max_gpu_budget": 39},
        obs=traffic(6000, 100, 390),
        want_prefill=1,
        want_decode=38,
        want_step=("gpu_budget", None, ReasonCode.GPU_BUDGET_CAPPED),
    ),
    # -1 disables the budget: 10P + 30D = 40 GPUs kept.
    BoundsCase(
        id="gpu-budget-disabled",
        overrides={"max_gpu_budget": -1},
        obs=traffic(6000, 1000, 300),
        want_prefill=10,
        want_decode=30,
        want_step=("gpu_budget", None, ReasonCode.WITHIN_RANGE),
    ),
    # 2-GPU prefill engines: 200,000 / 20,000 = 10P; 4-GPU decode: 48,000 / 4,000 = 12D; 10*2 + 12*4 = 68 GPUs.
    BoundsCase(
        id="multi-gpu-within-budget",
        overrides={"prefill_engine_num_gpu": 2, "decode_engine_num_gpu": 4, "max_gpu_budget": 68},
        obs=traffic(6000, 2000, 480),
        want_prefill=10,
        want_decode=12,
        want_step=("gpu_budget", None, ReasonCode.WITHIN_RANGE),
    ),
    # 68 GPUs > 34: scale 0.5 -> 5P (10 GPUs); decode (34 - 10) / 4 = 6 -> 10 + 24 = 34 GPUs.
    BoundsCase(
        id="multi-gpu-budget-capped",
        overrides={"prefill_engine_num_gpu": 2, "decode_engine_num_gpu": 4, "max_gpu_budget": 34},
        obs=traffic(6000, 2000, 480),
        want_prefill=5,
        want_decode=6,
        want_step=("gpu_budget", None, ReasonCode.GPU_BUDGET_CAPPED),
    ),
]


@pytest.mark.parametrize("case", BOUNDS_CASES, ids=lambda c: c.id)
def test_bounds(case: BoundsCase) -> None:
    """Floors, the change cap and the GPU budget each shape the answer and leave their reason in the steps."""
    config = make_config(**case.overrides)
    outcome = tick(throughput_inputs(case.obs, workers(*case.expected)), PlannerState(), config, FAKE)
    assert desired(outcome) == {Component.PREFILL: case.want_prefill, Component.DECODE: case.want_decode}
    step_name, component, reason = case.want_step
    assert reason in {s.reason for s in steps_named(outcome, step_name, component)}
    (budget_step,) = steps_named(outcome, "gpu_budget")
    assert budget_step.value == gpus(outcome, config)


def test_floor_beats_cap_step_sequence() -> None:
    """The floor is re-applied after the change cap: floor, cap, floor, in that order, per pool."""
    config = make_config(min_endpoint=4, max_throughput_scaling_replicas=2)
    outcome = tick(throughput_inputs(traffic(60)), PlannerState(), config, FAKE)
    prefill = [(s.step, s.reason, s.value) for s in outcome.steps if s.component is Component.PREFILL]
    assert prefill[:5] == [
        ("capacity", ReasonCode.CAPACITY_FROM_PROFILE, 10_000.0),
        ("demand", ReasonCode.DEMAND_SIZED, 1),  # 1 req/s * 1000 / 10,000 -> 1
        ("min_endpoint", ReasonCode.MIN_ENDPOINT_FLOOR, 4),
        ("change_rate", ReasonCode.DELTA_CAPPED, 3),  # from expected 1: at most 1 + 2
        ("min_endpoint", ReasonCode.MIN_ENDPOINT_FLOOR, 4),
    ]
    # then the pipeline's override, its merge and its final invariants, which find the floor already met
    assert prefill[5:] == [
        ("propose:builtin_throughput_propose", ReasonCode.OVERRIDE_SET, 4.0),
        ("propose:merge", ReasonCode.WITHIN_RANGE, 4.0),
        ("min_endpoint", ReasonCode.WITHIN_RANGE, 4),
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetClampCase:
    id: str
    overrides: Mapping[str, Any]
    obs: TrafficObservation
    expected: tuple[int | None, int | None]  # (prefill, decode) after the budget guard
    want_reason: ReasonCode


BUDGET_CLAMP_CASES = [
    # demand: 100 req/s * 300 / 10,000 = 3P; 100 * 10 / 1,000 = 1D -> 4 GPUs > 2. Current 1P + 1D already uses the
    # 2 GPUs and the proposal only grows prefill: no candidate between 1P+1D and 3P+1D fits except 1P+1D -> held.
    BudgetClampCase(
        id="disagg-held-at-ceiling",
        overrides={"max_gpu_budget": 2},
        obs=traffic(6000, 300, 10),
        expected=(1, 1),
        want_reason=ReasonCode.GPU_BUDGET_GUARD_HOLD,
    ),
    # 1-GPU prefill, 2-GPU decode; demand 3P, 100 * 40 / 2,000 = 2D -> 3 + 4 = 7 GPUs > 5; current 1P + 1D = 3.
    # Candidates P in 1..3, D in 1..2 within 5 GPUs: 3P+1D (5, 2 GPUs from the proposal), 1P+2D (5, 2 away),
    # 2P+1D (4, 3 away). Tie on distance -> prefill share closest to 3/7: 3/5 (off .17) beats 1/5 (off .23).
    BudgetClampCase(
        id="disagg-closest-candidate",
        overrides={"max_gpu_budget": 5, "decode_engine_num_gpu": 2},
        obs=traffic(6000, 300, 40),
        expected=(3, 1),
        want_reason=ReasonCode.GPU_BUDGET_CAPPED,
    ),
    # prefill-only, 2-GPU engines: 100 * 2000 / 20,000 = 10P = 20 GPUs > 7; from 1P the largest fit is 3P (6 GPUs).
    BudgetClampCase(
        id="prefill-mode",
        overrides={"mode": "prefill", "max_gpu_budget": 7, "prefill_engine_num_gpu": 2},
        obs=traffic(6000, 2000, 100),
        expected=(3, None),
        want_reason=ReasonCode.GPU_BUDGET_CAPPED,
    ),
    # decode-only, 2-GPU engines: 100 * 100 / 2,000 = 5D = 10 GPUs > 7; from 1D the largest fit is 3D (6 GPUs).
    BudgetClampCase(
        id="decode-mode",
        overrides={"mode": "decode", "max_gpu_budget": 7, "decode_engine_num_gpu": 2},
        obs=traffic(6000, 1000, 100),
        expected=(None, 3),
        want_reason=ReasonCode.GPU_BUDGET_CAPPED,
    ),
]


@pytest.mark.parametrize("case", BUDGET_CLAMP_CASES, ids=lambda c: c.id)
def test_gpu_budget_is_never_exceeded_when_floors_fit(case: BudgetClampCase) -> None:
    """When the minimum footprint fits `max_gpu_budget`, the guarded proposal never uses more GPUs than it."""
    config = make_config(**case.overrides)
    outcome = tick(throughput_inputs(case.obs), PlannerState(), config, FAKE)
    assert steps_named(outcome, "gpu_budget")[0].reason is case.want_reason
    assert gpus(outcome, config) <= config.max_gpu_budget
    desired = {p.component: p.desired for p in outcome.proposals}
    assert (desired.get(Component.PREFILL), desired.get(Component.DECODE)) == case.expected


# --- a fleet member's ceiling ----------------------------------------------------------------------------------


def test_fleet_ceiling_cuts_the_decision_but_the_proposals_keep_the_want() -> None:
    """100 req/s wants 20P + 50D (70 GPUs, within the config's 100). Running 2P + 2D (4 GPUs) with a fleet ceiling
    of 10 GPUs, the decision is cut by the budget guard's search to 10 GPUs, while the proposals still say 20P +
    50D: what the fleet's arbitration reads as the member's claim."""
    config = make_config(max_gpu_budget=100)
    inputs = dataclasses.replace(throughput_inputs(traffic(6000, 2000, 500), workers(2, 2)), gpu_ceiling=10)
    outcome = tick(inputs, PlannerState(), config, FAKE)
    assert desired(outcome) == {Component.PREFILL: 20, Component.DECODE: 50}
    [step] = steps_named(outcome, "fleet_ceiling")
    assert (step.reason, step.value) == (ReasonCode.FLEET_CEILING_CAPPED, 10)
    decided = (outcome.decision.num_prefill or 0) + (outcome.decision.num_decode or 0)
    assert decided == 10 and outcome.decision.num_prefill >= 2 and outcome.decision.num_decode >= 2
    # the same tick outside a fleet decides the whole want
    free = tick(dataclasses.replace(inputs, gpu_ceiling=None), PlannerState(), config, FAKE)
    assert (free.decision.num_prefill, free.decision.num_decode) == (20, 50)
    assert steps_named(free, "fleet_ceiling") == []


def test_fleet_ceiling_at_what_runs_holds_without_a_decision_and_never_shrinks() -> None:
    """A ceiling at (or below) the GPUs the member runs leaves it where it is: no decision (nothing to execute,
    nothing for the arbitration to cut), and never a scale-down forced by the ceiling itself."""
    config = make_config(max_gpu_budget=100)
    for ceiling in (4, 1):
        inputs = dataclasses.replace(throughput_inputs(traffic(6000, 2000, 500), workers(2, 2)), gpu_ceiling=ceiling)
        outcome = tick(inputs, PlannerState(), config, FAKE)
        assert outcome.decision.is_empty
        assert steps_named(outcome, "fleet_ceiling")[0].reason is ReasonCode.FLEET_CEILING_CAPPED
        assert desired(outcome) == {Component.PREFILL: 20, Component.DECODE: 50}
    # a want under the ceiling is decided as it is (a scale-down too)
    inputs = dataclasses.replace(throughput_inputs(traffic(60, 2000, 500), workers(4, 4)), gpu_ceiling=8)
    outcome = tick(inputs, PlannerState(), config, FAKE)
    assert steps_named(outcome, "fleet_ceiling")[0].reason is ReasonCode.WITHIN_RANGE
    assert (outcome.decision.num_prefill, outcome.decision.num_decode) == (
        desired(outcome)[Component.PREFILL],
        desired(outcome)[Component.DECODE],
    )


# --- both loops on, advisory, decisions per mode -------------------------------------------------------------


def test_both_loops_set_lower_bounds_without_deciding() -> None:
    """With the load loop on too, the throughput tick only stores lower bounds: no decision, `set_lower_bound`."""
    config = make_config(enable_load_scaling=True)
    # 100 req/s: 100 * 2000 / 10,000 = 20P; 100 * 500 / 1,000 = 50D (cap 100 from 1 expected: not capped).
    outcome = tick(throughput_inputs(traffic(6000, 2000, 500)), PlannerState(), config, FAKE)
    assert outcome.reason is ReasonCode.SET_LOWER_BOUND
    assert outcome.decision == ScalingDecision()
    assert (outcome.next_state.throughput_lower_bound_prefill, outcome.next_state.throughput_lower_bound_decode) == (
        20,
        50,
    )
    assert outcome.proposals == ()  # nothing proposed: the floors live in the state
    assert decide_step(outcome).reason is ReasonCode.SET_LOWER_BOUND
    assert outcome.steps[-1].step == "execute" and outcome.steps[-1].reason is ReasonCode.SKIP_NO_TARGETS


def test_both_loops_prefill_mode_keeps_decode_bound() -> None:
    """In prefill-only mode with both loops on, only the prefill lower bound is updated."""
    config = make_config(enable_load_scaling=True, mode="prefill")
    state = PlannerState(throughput_lower_bound_prefill=1, throughput_lower_bound_decode=9)
    outcome = tick(throughput_inputs(traffic(6000, 2000, 500)), state, config, FAKE)
    # prefill 20 (as above); decode untouched at 9
    assert (outcome.next_state.throughput_lower_bound_prefill, outcome.next_state.throughput_lower_bound_decode) == (
        20,
        9,
    )


def test_advisory_decision_is_flagged() -> None:
    """An advisory config still decides, flags the decision advisory and records an `advisory` step."""
    outcome = tick(throughput_inputs(traffic(6000, 2000, 500)), PlannerState(), make_config(advisory=True), FAKE)
    assert outcome.decision == ScalingDecision(num_prefill=20, num_decode=50, advisory=True)  # 20P / 50D as above
    assert [s.step for s in outcome.steps if s.reason is ReasonCode.ADVISORY] == ["execute"]
    assert outcome.steps[-1].step == "execute" and outcome.steps[-1].reason is ReasonCode.ADVISORY


def test_advisory_without_change_has_no_advisory_step() -> None:
    """An advisory config with nothing to change emits no decision and no `advisory` step."""
    outcome = tick(throughput_inputs(traffic(600)), PlannerState(), make_config(advisory=True), FAKE)
    assert outcome.reason is ReasonCode.NO_CHANGE
    assert ReasonCode.ADVISORY not in {s.reason for s in outcome.steps}


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionCase:
    id: str
    mode: str
    expected: tuple[int, int]
    want_reason: ReasonCode
    want_decision: ScalingDecision
    want_components: tuple[Component, ...]


# demand for all cases: 6000 req / 60 s = 100 req/s -> 100 * 2000 / 10,000 = 20P; 100 * 500 / 1,000 = 50D.
DECISION_CASES = [
    DecisionCase(
        id="disagg-no-change",
        mode="disagg",
        expected=(20, 50),
        want_reason=ReasonCode.NO_CHANGE,
        want_decision=ScalingDecision(),
        want_components=(Component.PREFILL, Component.DECODE),
    ),
    DecisionCase(
        id="disagg-both-change",
        mode="disagg",
        expected=(1, 1),
        want_reason=ReasonCode.SCALE,
        want_decision=ScalingDecision(num_prefill=20, num_decode=50),
        want_components=(Component.PREFILL, Component.DECODE),
    ),
    # only decode differs (49 -> 50); the decision still carries both targets.
    DecisionCase(
        id="disagg-one-pool-changes",
        mode="disagg",
        expected=(20, 49),
        want_reason=ReasonCode.SCALE,
        want_decision=ScalingDecision(num_prefill=20, num_decode=50),
        want_components=(Component.PREFILL, Component.DECODE),
    ),
    DecisionCase(
        id="prefill-only",
        mode="prefill",
        expected=(1, 1),
        want_reason=ReasonCode.SCALE,
        want_decision=ScalingDecision(num_prefill=20),
        want_components=(Component.PREFILL,),
    ),
    DecisionCase(
        id="prefill-only-no-change",
        mode="prefill",
        expected=(20, 1),  # decode's 1 vs 50 is not this planner's business
        want_reason=ReasonCode.NO_CHANGE,
        want_decision=ScalingDecision(),
        want_components=(Component.PREFILL,),
    ),
    DecisionCase(
        id="decode-only",
        mode="decode",
        expected=(1, 1),
        want_reason=ReasonCode.SCALE,
        want_decision=ScalingDecision(num_decode=50),
        want_components=(Component.DECODE,),
    ),
]


@pytest.mark.parametrize("case", DECISION_CASES, ids=lambda c: c.id)
def test_decision_only_when_a_pool_changes(case: DecisionCase) -> None:
    """A decision is emitted only when a managed pool's target differs from its expected count."""
    outcome = tick(
        throughput_inputs(traffic(6000, 2000, 500), workers(*case.expected)),
        PlannerState(),
        make_config(mode=case.mode),
        FAKE,
    )
    assert outcome.reason is case.want_reason
    assert outcome.decision == case.want_decision
    assert tuple(p.component for p in outcome.proposals) == case.want_components
    sized = {s.component for s in outcome.steps if s.component is not None}
    assert sized == set(case.want_components)  # the other pool is never sized
    assert decide_step(outcome).reason is case.want_reason
    assert outcome.steps[-1].step == "execute"


# --- determinism and immutability ----------------------------------------------------------------------------


def test_same_inputs_same_outcome_and_inputs_untouched() -> None:
    """Two calls with equal arguments give equal outcomes; the inputs and state are unchanged afterwards."""
    history = busy_history((300.0, 600.0), (900.0, 1000.0), (90.0, 100.0))
    state = PlannerState(load_history=history, num_throughput_ticks=2, num_load_ticks=30)
    inputs = throughput_inputs(traffic(6000, 2000, 500), workers(3, 4))
    config = make_config(max_gpu_budget=30, max_throughput_scaling_replicas=5, advisory=True)
    inputs_before, state_before = copy.deepcopy(inputs), copy.deepcopy(state)
    first = tick(inputs, state, config, FAKE)
    second = tick(inputs, state, config, FAKE)
    assert first == second
    assert (inputs, state) == (inputs_before, state_before)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.workers.expected_prefill = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.num_load_ticks = 0  # type: ignore[misc]


@dataclass
class LoadedMachineClock:
    """A monotonic clock on an overloaded machine: each read is `step_s` later, so every plugin run (read before and
    after) seems to take `step_s` seconds."""

    step_s: float
    now_s: float = 0.0

    def __call__(self) -> float:
        self.now_s += self.step_s
        return self.now_s


@pytest.mark.parametrize("seconds_per_run", [6.0, 100.0])  # over the 5 s plugin timeout; over the 30 s tick deadline
def test_builtin_plugins_decide_alike_however_slow_the_machine(seconds_per_run: float) -> None:
    """A live tick (with a clock) on a machine so loaded that each builtin plugin takes over its 5 s timeout, or
    the whole 30 s tick deadline, decides, explains and carries state exactly as the same tick without a clock
    (replay): a decision never depends on how fast the machine is (a run's rerun after a crash decides alike)."""
    inputs = throughput_inputs(traffic(6000, 2000, 500), workers(3, 4))
    config = make_config()
    unhurried = tick(inputs, PlannerState(), config, FAKE)
    assert desired(unhurried) == {Component.PREFILL: 20, Component.DECODE: 50}  # sizing worked out above
    loaded = tick(inputs, PlannerState(), config, FAKE, clock=LoadedMachineClock(seconds_per_run))
    assert loaded == unhurried
    assert not [s for s in loaded.steps if s.reason in (ReasonCode.PLUGIN_TIMEOUT, ReasonCode.SKIP_TICK_TIMEOUT)]


def test_a_slow_user_plugin_is_still_timed_beside_untimed_builtins() -> None:
    """The wall clock still holds a user's in-process plugin to its timeout (its result discarded, recorded), while
    the builtin plugins beside it, just as slow, decide as without a clock."""
    from planner_core.domain import OverrideType, ReplicaOverride
    from planner_core.pipeline import FunctionPlugin, Phase, PluginResult, PluginSpec

    cap = ReplicaOverride(component=Component.DECODE, kind=OverrideType.AT_MOST, replicas=7)
    user = FunctionPlugin(
        PluginSpec(plugin_id="user_cap", phase=Phase.CONSTRAIN), lambda _: PluginResult(overrides=(cap,))
    )
    inputs = throughput_inputs(traffic(6000, 2000, 500), workers(3, 4))
    config = make_config()
    assert desired(tick(inputs, PlannerState(), config, FAKE, (user,)))[Component.DECODE] == 7  # the cap, unhurried
    loaded = tick(inputs, PlannerState(), config, FAKE, (user,), clock=LoadedMachineClock(6.0))
    [timed_out] = [s for s in loaded.steps if s.step == "constrain:user_cap"]
    assert timed_out.reason is ReasonCode.PLUGIN_TIMEOUT and timed_out.value == 6.0
    assert desired(loaded) == {Component.PREFILL: 20, Component.DECODE: 50}  # the builtin's sizing, uncapped


def test_a_timeout_override_of_a_builtin_plugin_is_refused() -> None:
    """`plugins.overrides.<builtin>.timeout_seconds` would do nothing (builtins are not timed): a one-line error."""
    from planner_core.pipeline import PluginConfigError
    from planner_core.pipeline.builtin import builtin_plugins
    from planner_core.pipeline.loader import configured

    config = make_config(plugins={"overrides": {"builtin_load_predict": {"timeout_seconds": 1}}})
    with pytest.raises(PluginConfigError, match=r"plugins\.overrides\.builtin_load_predict\.timeout_seconds' = 1"):
        configured(builtin_plugins(Loop.THROUGHPUT, FAKE)[0], config)


# --- realistic sizing with the shipped profile ------------------------------------------------------------------


def test_real_profile_dynamo_documented_case(profile_perf: ProfilePerfModel) -> None:
    """Dynamo's ISL 3000 / OSL 300 at TTFT 200 ms / ITL 10 ms: ~49.5k prefill, ~4.56k decode tokens/s/GPU."""
    config = make_config(ttft_ms=200, itl_ms=10)
    # 12,000 req / 60 s = 200 req/s
    # prefill: 200 * 3000 = 600,000 tok/s / 49,481 tok/s/GPU = 12.13 -> 13
    # decode:  200 * 300  =  60,000 tok/s /  4,555.7 tok/s/GPU = 13.17 -> 14
    outcome = tick(throughput_inputs(traffic(12_000, 3000, 300)), PlannerState(), config, profile_perf)
    capacity = {s.component: s for s in steps_named(outcome, "capacity")}
    assert capacity[Component.PREFILL].value == pytest.approx(49_481, rel=1e-3)
    assert capacity[Component.DECODE].value == pytest.approx(4_555.7, rel=1e-3)
    assert {s.reason for s in capacity.values()} == {ReasonCode.CAPACITY_FROM_PROFILE}
    assert desired(outcome) == {Component.PREFILL: 13, Component.DECODE: 14}
    assert outcome.decision == ScalingDecision(num_prefill=13, num_decode=14)


def test_real_profile_tight_itl_is_unreachable(profile_perf: ProfilePerfModel) -> None:
    """An ITL target below what the engine achieves at batch 1 is recorded as `sla_unreachable` for decode."""
    outcome = tick(throughput_inputs(traffic(600, 3000, 300)), PlannerState(), make_config(itl_ms=1), profile_perf)
    capacity = {s.component: s.reason for s in steps_named(outcome, "capacity")}
    assert capacity == {
        Component.PREFILL: ReasonCode.CAPACITY_FROM_PROFILE,
        Component.DECODE: ReasonCode.SLA_UNREACHABLE,
    }


# --- properties --------------------------------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, report_multiple_bugs=False)

requests = st.integers(min_value=0, max_value=200_000)
lengths = st.integers(min_value=1, max_value=16_000)


@st.composite
def bounded_configs(draw: st.DrawFn) -> PlannerConfig:
    """Valid `sla` configs that vary the mode, floors, change cap, GPU budget and engine widths."""
    mode = draw(st.sampled_from(["disagg", "prefill", "decode"]))
    overrides: dict[str, Any] = {
        "mode": mode,
        "min_endpoint": draw(st.integers(0, 4)),
        "max_throughput_scaling_replicas": draw(st.integers(1, 50)),
        "max_gpu_budget": draw(st.sampled_from([-1]) | st.integers(0, 64)),
        "prefill_engine_num_gpu": draw(st.integers(1, 4)),
        "decode_engine_num_gpu": draw(st.integers(1, 4)),
        "enable_load_scaling": draw(st.booleans()),
        "advisory": draw(st.booleans()),
    }
    if mode != "decode":
        overrides["prefill_min_endpoint"] = draw(st.none() | st.integers(1, 4))
    if mode != "prefill":
        overrides["decode_min_endpoint"] = draw(st.none() | st.integers(1, 4))
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides["max_gpu_budget"] >= 0:
        # a budget below the minimum endpoints' GPUs is a config error: draw it at or above them
        unbounded = make_config(**{**overrides, "max_gpu_budget": -1})
        floor_gpus = sum(
            _floors(unbounded)[c] * gpus
            for c, gpus in (
                (Component.PREFILL, unbounded.prefill_gpus_per_engine),
                (Component.DECODE, unbounded.decode_gpus_per_engine),
            )
            if c in managed_components(unbounded.mode)
        )
        overrides["max_gpu_budget"] = floor_gpus + overrides["max_gpu_budget"]
    return make_config(**overrides)


expected_counts = st.builds(workers, st.integers(0, 60), st.integers(0, 60))


def _floors(config: PlannerConfig) -> dict[Component, int]:
    return {
        Component.PREFILL: config.prefill_min_endpoint_effective,
        Component.DECODE: config.decode_min_endpoint_effective,
    }


def _check_monotone(
    perf: ThroughputPerfModel, config: PlannerConfig, counts: WorkerCounts, a: int, b: int, isl: int, osl: int
) -> None:
    low, high = sorted((a, b))
    out_low = tick(throughput_inputs(traffic(low, isl, osl), counts), PlannerState(), config, perf)
    out_high = tick(throughput_inputs(traffic(high, isl, osl), counts), PlannerState(), config, perf)
    for component, value in desired(out_low).items():
        assert desired(out_high)[component] >= value


@PROPERTY_SETTINGS
@given(
    config=bounded_configs().filter(lambda c: c.max_gpu_budget < 0),
    counts=expected_counts,
    a=requests,
    b=requests,
    isl=lengths,
    osl=lengths,
)
def test_property_monotone_in_requests_fake(
    config: PlannerConfig, counts: WorkerCounts, a: int, b: int, isl: int, osl: int
) -> None:
    """Without a GPU budget, more requests never give fewer replicas of any pool (fixed-rate perf model)."""
    _check_monotone(FAKE, config, counts, a, b, isl, osl)


@PROPERTY_SETTINGS
@given(
    config=bounded_configs().filter(lambda c: c.max_gpu_budget < 0),
    counts=expected_counts,
    a=requests,
    b=requests,
    isl=lengths,
    osl=lengths,
)
def test_property_monotone_in_requests_profile(
    profile_perf: ProfilePerfModel, config: PlannerConfig, counts: WorkerCounts, a: int, b: int, isl: int, osl: int
) -> None:
    """Without a GPU budget, more requests never give fewer replicas of any pool (real profile)."""
    _check_monotone(profile_perf, config, counts, a, b, isl, osl)


def _check_invariants(
    perf: ThroughputPerfModel, config: PlannerConfig, counts: WorkerCounts, obs: TrafficObservation, state: PlannerState
) -> None:
    outcome = tick(throughput_inputs(obs, counts), state, config, perf)
    floors = _floors(config)
    for component, value in desired(outcome).items():
        assert value >= floors[component]
    assert outcome.steps[-1].step == "execute"
    assert decide_step(outcome).reason in {ReasonCode.SCALE, ReasonCode.NO_CHANGE, ReasonCode.SET_LOWER_BOUND}
    assert outcome.reason in {ReasonCode.SCALE, ReasonCode.NO_CHANGE, ReasonCode.SET_LOWER_BOUND}
    assert outcome.decision.is_empty is (outcome.reason is not ReasonCode.SCALE)


histories = st.sampled_from([LoadHistory(), busy_history((600.0,), (1000.0,), (100.0,))])


@PROPERTY_SETTINGS
@given(
    config=bounded_configs(),
    counts=expected_counts,
    num_req=requests,
    isl=lengths,
    osl=lengths,
    history=histories,
)
def test_property_floors_and_decide_step_fake(
    config: PlannerConfig, counts: WorkerCounts, num_req: int, isl: int, osl: int, history: LoadHistory
) -> None:
    """Every sized throughput tick stays at or above the min endpoints and ends with its `decide` step."""
    _check_invariants(FAKE, config, counts, traffic(num_req, isl, osl), PlannerState(load_history=history))


@PROPERTY_SETTINGS
@given(
    config=bounded_configs(),
    counts=expected_counts,
    num_req=requests,
    isl=lengths,
    osl=lengths,
    history=histories,
)
def test_property_floors_and_decide_step_profile(
    profile_perf: ProfilePerfModel,
    config: PlannerConfig,
    counts: WorkerCounts,
    num_req: int,
    isl: int,
    osl: int,
    history: LoadHistory,
) -> None:
    """With the real profile too, replicas never drop below the min endpoints and the last step is `decide`."""
    _check_invariants(profile_perf, config, counts, traffic(num_req, isl, osl), PlannerState(load_history=history))


def _check_budget(
    perf: ThroughputPerfModel, config: PlannerConfig, counts: WorkerCounts, obs: TrafficObservation
) -> None:
    outcome = tick(throughput_inputs(obs, counts), PlannerState(), config, perf)
    floors = _floors(config)
    footprint = sum(
        floors[p.component]
        * (config.prefill_gpus_per_engine if p.component is Component.PREFILL else config.decode_gpus_per_engine)
        for p in outcome.proposals
    )
    if footprint <= config.max_gpu_budget:
        assert gpus(outcome, config) <= config.max_gpu_budget


budget_configs = bounded_configs().filter(lambda c: c.max_gpu_budget >= 0)


@PROPERTY_SETTINGS
@given(config=budget_configs, counts=expected_counts, num_req=requests, isl=lengths, osl=lengths)
@example(  # the first BUDGET_CLAMP_CASES row: 3P + 1D held at 1P + 1D = 2 GPUs
    config=make_config(max_gpu_budget=2), counts=workers(), num_req=6000, isl=300, osl=10
)
def test_property_gpu_budget_fake(
    config: PlannerConfig, counts: WorkerCounts, num_req: int, isl: int, osl: int
) -> None:
    """When the minimum footprint fits, the proposal never uses more GPUs than `max_gpu_budget` (fake perf)."""
    _check_budget(FAKE, config, counts, traffic(num_req, isl, osl))


@PROPERTY_SETTINGS
@given(config=budget_configs, counts=expected_counts, num_req=requests, isl=lengths, osl=lengths)
@example(  # prefill-only, 2-GPU engines: 200 req/s * 3000 = 600,000 tok/s / (2 * 49,481) = 6.06 -> 7P = 14 GPUs > 7;
    # floor(7 * 7/14 = 3.5) = 3P = 6 GPUs
    config=make_config(mode="prefill", max_gpu_budget=7, prefill_engine_num_gpu=2),
    counts=workers(),
    num_req=12_000,
    isl=3000,
    osl=300,
)
def test_property_gpu_budget_profile(
    profile_perf: ProfilePerfModel, config: PlannerConfig, counts: WorkerCounts, num_req: int, isl: int, osl: int
) -> None:
    """When the minimum footprint fits, the proposal never uses more GPUs than `max_gpu_budget` (real profile)."""
    _check_budget(profile_perf, config, counts, traffic(num_req, isl, osl))


def test_request_rate_uses_the_observed_window_length() -> None:
    """A window shorter than the configured interval is sized on its own duration, not the interval's."""
    config = make_config(max_gpu_budget=-1)
    short = TrafficObservation(duration_s=WINDOW_S / 2, num_req=600, isl=1000, osl=100)
    # 600 requests in 30 s = 20 req/s * 1000 = 20,000 prefill tok/s / 10,000 -> 2 (the 60 s interval would say 1)
    assert desired(tick(throughput_inputs(short), PlannerState(), config, FAKE))[Component.PREFILL] == 2


# --- request shape and 0.x correction factors -------------------------------------------------------------------


def test_quantile_sizing_uses_the_forecast_tail() -> None:
    """With `throughput_length_sizing: quantile`, both pools are sized as if every request had the p90 lengths."""
    config = make_config(throughput_length_sizing="quantile")
    obs = traffic(6000, 2000, 500, isl_p90=4000.0, osl_p90=1000.0)
    outcome = tick(throughput_inputs(obs), PlannerState(), config, FAKE)
    # 100 req/s * 4000 / 10,000 = 40P; 100 * 1000 / 1,000 = 100D (the mean shape gives 20P / 50D)
    assert desired(outcome) == {Component.PREFILL: 40, Component.DECODE: 100}
    (step,) = steps_named(outcome, "length_sizing")
    assert step.reason is ReasonCode.SIZED_ON_QUANTILE and "p90 ISL 4000, OSL 1000" in step.detail


def test_quantile_sizing_without_observed_percentiles_sizes_on_the_mean() -> None:
    """No observed percentiles: the quantile series carries the mean forward, so the sizing equals the mean's."""
    config = make_config(throughput_length_sizing="quantile")
    outcome = tick(throughput_inputs(traffic(6000, 2000, 500)), PlannerState(), config, FAKE)
    assert desired(outcome) == {Component.PREFILL: 20, Component.DECODE: 50}
    assert "p90 ISL 2000, OSL 500 (mean 2000, 500)" in steps_named(outcome, "length_sizing")[0].detail


@pytest.mark.parametrize(
    ("isl_quantile", "osl_quantile", "want_shape", "want_reason"),
    [
        (None, None, (2000.0, 500.0), ReasonCode.QUANTILE_UNAVAILABLE),  # no quantile forecast: the mean
        (3000.0, None, (2000.0, 500.0), ReasonCode.QUANTILE_UNAVAILABLE),  # both are needed
        (3000.0, 800.0, (3000.0, 800.0), ReasonCode.SIZED_ON_QUANTILE),
        (1500.0, 800.0, (2000.0, 800.0), ReasonCode.SIZED_ON_QUANTILE),  # a quantile below the mean: the mean
    ],
)
def test_sizing_shape(
    isl_quantile: float | None, osl_quantile: float | None, want_shape: tuple[float, float], want_reason: ReasonCode
) -> None:
    prediction = Prediction(
        num_req=10.0, isl=2000.0, osl=500.0, quantile="p90", isl_quantile=isl_quantile, osl_quantile=osl_quantile
    )
    shape, step = sizing_shape(prediction, LengthSizing.QUANTILE)
    assert (shape.isl, shape.osl) == want_shape
    assert step.reason is want_reason


def test_mean_sizing_is_the_default() -> None:
    outcome = tick(throughput_inputs(traffic(6000, 2000, 500, isl_p90=4000.0)), PlannerState(), make_config(), FAKE)
    assert desired(outcome) == {Component.PREFILL: 20, Component.DECODE: 50}
    assert steps_named(outcome, "length_sizing")[0].reason is ReasonCode.SIZED_ON_MEAN


def test_correction_factors_rescale_prefill_load_and_decode_target() -> None:
    """0.x mode: prefill load x min(1, TTFT_obs / TTFT_interp); decode ITL target / (ITL_obs / ITL_interp)."""
    config = make_config(throughput_algorithm="interpolation_corrected")
    obs = traffic(6000, 2000, 500, ttft_ms=50.0, itl_ms=10.0)
    outcome = tick(throughput_inputs(obs), PlannerState(), config, FAKE)
    factors = {s.component: s.value for s in steps_named(outcome, "correction")}
    assert factors == {Component.PREFILL: 0.5, Component.DECODE: 2.0}  # 50 / 100 and 10 / 5
    # prefill: 100 req/s * 2000 * min(1, 0.5) / 10,000 = 10P; decode keeps 50D (fixed-rate model) but is sized
    # for an ITL target of 10 ms / 2 = 5 ms
    assert desired(outcome) == {Component.PREFILL: 10, Component.DECODE: 50}
    decode_capacity = steps_named(outcome, "capacity", Component.DECODE)[0]
    assert "at ITL 5.0 ms" in decode_capacity.detail


def test_correction_factor_above_one_never_inflates_prefill_load() -> None:
    config = make_config(throughput_algorithm="interpolation_corrected")
    obs = traffic(6000, 2000, 500, ttft_ms=300.0, itl_ms=5.0)  # TTFT 3x the interpolation: min(1, 3) = 1
    outcome = tick(throughput_inputs(obs), PlannerState(), config, FAKE)
    assert desired(outcome) == {Component.PREFILL: 20, Component.DECODE: 50}


def test_correction_unavailable_without_observed_latency() -> None:
    config = make_config(throughput_algorithm="interpolation_corrected")
    outcome = tick(throughput_inputs(traffic(6000, 2000, 500)), PlannerState(), config, FAKE)
    assert {s.reason for s in steps_named(outcome, "correction")} == {ReasonCode.CORRECTION_UNAVAILABLE}
    assert desired(outcome) == {Component.PREFILL: 20, Component.DECODE: 50}


def test_correction_with_the_profile_sizes_decode_for_the_tighter_target(profile_perf: ProfilePerfModel) -> None:
    """Observed ITL above the interpolation (factor > 1) tightens the ITL target: never fewer decode replicas."""
    # 6000 requests of 60 + 80 * 300 ms over 60 s on one decode worker: concurrency ~2400, interpolated ITL < 80 ms
    obs = traffic(6000, 3000, 300, ttft_ms=60.0, itl_ms=80.0)
    plain = tick(throughput_inputs(obs), PlannerState(), make_config(), profile_perf)
    corrected = tick(
        throughput_inputs(obs),
        PlannerState(),
        make_config(throughput_algorithm="interpolation_corrected"),
        profile_perf,
    )
    (decode_factor,) = [s.value for s in steps_named(corrected, "correction", Component.DECODE)]
    assert decode_factor is not None and decode_factor > 1.0
    assert desired(corrected)[Component.DECODE] >= desired(plain)[Component.DECODE]


# --- Dynamo 1.x sizing: engine capacity searched on a forward-pass model ------------------------------------------


def _engine_capacity_config(**overrides: Any) -> PlannerConfig:
    return make_config(throughput_algorithm="engine_capacity", **overrides)


def test_engine_capacity_sizing_with_the_profile_model(profile_perf: ProfilePerfModel) -> None:
    """Before any forward-pass metrics, the profile's forward-pass model answers; replicas = ceil(demand / engine
    requests/s) with the engine capacity the search finds at that shape."""
    from planner_core.perf.capacity import decode_capacity, prefill_capacity

    config = _engine_capacity_config()
    outcome = tick(throughput_inputs(traffic(6000, 3000, 300)), PlannerState(), config, profile_perf)
    fwd = profile_perf.forward_pass_model()
    assert fwd is not None
    limits = {
        c: config.engine_limits(c, profiled_max_kv_tokens=profile_perf.profiled_max_kv_tokens()) for c in Component
    }
    prefill = prefill_capacity(fwd, limits[Component.PREFILL], isl=3000, ttft_ms=200)
    decode = decode_capacity(fwd, limits[Component.DECODE], isl=3000, osl=300, itl_ms=10)
    # 6000 requests / 60 s = 100 req/s against ~16.7 (prefill) and ~15.5 (decode) requests/s per engine
    want = {
        Component.PREFILL: math.ceil(100 / prefill.requests_per_s),
        Component.DECODE: math.ceil(100 / decode.requests_per_s),
    }
    assert want == {Component.PREFILL: 6, Component.DECODE: 7}
    assert desired(outcome) == want
    assert {s.reason for s in steps_named(outcome, "forward_pass_model")} == {ReasonCode.PERF_MODEL_BOOTSTRAP}
    assert [s.value for s in steps_named(outcome, "demand")] == [6, 7]


def test_engine_capacity_sizes_aggregated_mode(profile_perf: ProfilePerfModel) -> None:
    outcome = tick(
        throughput_inputs(traffic(600, 1000, 200)), PlannerState(), _engine_capacity_config(mode="agg"), profile_perf
    )
    (proposal,) = outcome.proposals
    assert proposal.component is Component.DECODE and proposal.desired >= 1
    assert decide_step(outcome).reason in {ReasonCode.SCALE, ReasonCode.NO_CHANGE}


def test_engine_capacity_without_any_model_holds_both_pools() -> None:
    outcome = tick(throughput_inputs(traffic(6000)), PlannerState(), _engine_capacity_config(), None)
    assert outcome.reason is ReasonCode.MODEL_NOT_READY
    assert {s.reason for s in steps_named(outcome, "forward_pass_model")} == {ReasonCode.INSUFFICIENT_DATA}
    assert outcome.decision.is_empty


def test_engine_capacity_prefers_the_online_model_once_ready(profile_perf: ProfilePerfModel) -> None:
    """The bootstrap chain's last link: online regressions fitted on forward-pass metrics replace the profile."""
    from planner_core.perf.online import observe_fpm
    from planner_core.perf.profile_forward import bootstrap_fpms

    config = _engine_capacity_config()
    models = observe_fpm(PlannerState().perf_models, bootstrap_fpms(profile_perf.profile), config)
    state = PlannerState(perf_models=models)
    outcome = tick(throughput_inputs(traffic(6000, 3000, 300)), state, config, profile_perf)
    assert {s.reason for s in steps_named(outcome, "forward_pass_model")} == {ReasonCode.PERF_MODEL_READY}
    assert all(v >= 1 for v in desired(outcome).values())


def test_config_overrides_reach_builtin_plugins_and_schedules_survive_the_other_loop() -> None:
    """`plugins.overrides` on a builtin id changes its schedule; a throughput tick in between keeps the load
    plugin's schedule (the pipeline carries absent plugins' schedules forward)."""
    config = make_config(
        enable_load_scaling=True,
        load_adjustment_interval_seconds=5,
        plugins={"overrides": {"builtin_load_propose": {"interval_seconds": 10}}},
    )
    state = PlannerState()
    reasons = {}
    for now_s, loop in ((5.0, Loop.LOAD), (10.0, Loop.LOAD), (12.0, Loop.THROUGHPUT), (15.0, Loop.LOAD)):
        obs = traffic(600) if loop is Loop.THROUGHPUT else None
        outcome = tick(TickInputs(now_s=now_s, loop=loop, workers=workers(), traffic=obs), state, config, FAKE)
        state = outcome.next_state
        reasons[now_s] = [s.reason for s in outcome.steps if s.step == "propose:builtin_load_propose"]
    # registered at 5 s: not due at 10 s, due again at 5 + 10 = 15 s even after the throughput tick at 12 s
    assert reasons[10.0] == [ReasonCode.PLUGIN_NOT_DUE]
    assert reasons[12.0] == []
    assert reasons[15.0] and ReasonCode.PLUGIN_NOT_DUE not in reasons[15.0]
    assert state.pipeline.schedule("builtin_load_propose") is not None
    assert state.pipeline.schedule("builtin_throughput_propose") is not None
