"""Our throughput-loop additions (pure): target utilisation, burst-aware prefill sizing and the scale-down hold.

Arithmetic as in `tests/core/test_tick.py`: `FixedRatePerf` serves 10,000 prefill and 1,000 decode tokens/s/GPU, the
constant predictor forecasts the observed window, windows are 60 s. Burst sizing needs a forward-pass model: the
linear one of the simulator tests (prefill iteration 0.010 s + 1e-5 s per token), so a full chunk of 8192 tokens
takes 0.09192 s and one engine computes 8192 / 0.09192 = 89,121.0 prompt tokens/s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest

from planner_core.domain import Component, PlannerState, ReasonCode, SizedNeed, TrafficObservation
from planner_core.policy.throughput import burst_prefill_replicas, with_headroom
from planner_core.tick import tick
from tests.core.fakes import FWD, LinearFwd
from tests.core.test_tick import (
    WINDOW_S,
    FixedRatePerf,
    desired,
    make_config,
    steps_named,
    throughput_inputs,
    traffic,
    workers,
)

CHUNK_S = 0.010 + 8192 * 1e-5  # 0.09192 s
MU = 8192 / CHUNK_S  # 89,121.0 tokens/s per engine


@dataclass(frozen=True, slots=True)
class FixedRateWithForward(FixedRatePerf):
    """`FixedRatePerf` whose forward-pass model is the linear one (for the burst sizing's engine rate)."""

    def forward_pass_model(self) -> LinearFwd:  # type: ignore[override]
        return FWD


PERF = FixedRateWithForward()


# --- target utilisation --------------------------------------------------------------------------------------


def test_headroom_divides_demand_and_says_so() -> None:
    assert with_headroom(Component.DECODE, 12.0, 1.0) == (12.0, None)  # Dynamo's sizing: no step
    raised, step = with_headroom(Component.DECODE, 12.0, 0.75)
    assert raised == pytest.approx(16.0)  # 12 / 0.75
    assert step is not None and step.reason is ReasonCode.HEADROOM_APPLIED and step.value == 0.75


def test_decode_target_utilisation_adds_replicas() -> None:
    """600 requests in 60 s of OSL 150: decode demand 1,500 tokens/s on 1,000 per engine -> 2 replicas; at a
    target utilisation of 0.5 the demand counts as 3,000 -> 3. Prefill (1,000 ISL: 10,000 tokens/s) stays at 1."""
    base = tick(throughput_inputs(traffic(600, 1000, 150)), PlannerState(), make_config(), PERF)
    derated = tick(
        throughput_inputs(traffic(600, 1000, 150)),
        PlannerState(),
        make_config(throughput_decode_target_utilization=0.5),
        PERF,
    )
    assert desired(base) == {Component.PREFILL: 1, Component.DECODE: 2}
    assert desired(derated) == {Component.PREFILL: 1, Component.DECODE: 3}
    (step,) = steps_named(derated, "headroom", Component.DECODE)
    assert step.reason is ReasonCode.HEADROOM_APPLIED


def test_engine_capacity_sizing_applies_the_target_utilisation() -> None:
    """On the engine-capacity path the request rate is divided by the utilisation before `ceil(rate / engine)`."""
    from planner_core.perf.model import ProfilePerfModel
    from tests.core.test_tick import PROFILE_DIR

    perf = ProfilePerfModel.load(PROFILE_DIR)
    config = make_config(throughput_algorithm="engine_capacity")
    obs = traffic(6000, 3000, 300)
    plain = desired(tick(throughput_inputs(obs), PlannerState(), config, perf))
    derated_config = make_config(throughput_algorithm="engine_capacity", throughput_prefill_target_utilization=0.5)
    derated = desired(tick(throughput_inputs(obs), PlannerState(), derated_config, perf))
    # 100 req/s on 16.73 req/s per prefill engine: ceil(5.98) = 6; counted as 200 req/s: ceil(11.96) = 12
    assert (plain[Component.PREFILL], derated[Component.PREFILL]) == (6, 12)
    assert derated[Component.DECODE] == plain[Component.DECODE]


# --- burst sizing ------------------------------------------------------------------------------------------------


def burst_traffic(num_req: float = 600, isl: float = 1000, **curve: float) -> TrafficObservation:
    return TrafficObservation(duration_s=WINDOW_S, num_req=num_req, isl=isl, osl=100.0, **curve)


@dataclass(frozen=True, slots=True, kw_only=True)
class BurstCase:
    id: str
    traffic: TrafficObservation
    forecast_tokens_per_s: float
    mean_rate: int
    want: int
    reason: ReasonCode


# The window carries 10,000 prompt tokens/s (600 x 1000 / 60). TTFT 200 ms leaves T' = 0.2 - 0.09192 = 0.10808 s.
BURST_CASES = [
    BurstCase(
        id="no-curve-keeps-mean-rate",
        traffic=burst_traffic(),
        forecast_tokens_per_s=10_000,
        mean_rate=1,
        want=1,
        reason=ReasonCode.BURST_UNAVAILABLE,
    ),
    BurstCase(
        id="idle-window-keeps-mean-rate",
        traffic=burst_traffic(num_req=0, isl=0, prompt_tokens_p99_1s=0.0),
        forecast_tokens_per_s=0,
        mean_rate=1,
        want=1,
        reason=ReasonCode.BURST_UNAVAILABLE,
    ),
    # 300,000 tokens within 1 s: 300,000 / (89,121.0 x 1.10808) = 3.04 -> 4 engines (the 250 ms point:
    # 50,000 / (89,121.0 x 0.35808) = 1.57 -> 2 does not bind)
    BurstCase(
        id="burst-raises-prefill",
        traffic=burst_traffic(prompt_tokens_p99_250ms=50_000, prompt_tokens_p99_1s=300_000),
        forecast_tokens_per_s=10_000,
        mean_rate=1,
        want=4,
        reason=ReasonCode.BURST_SIZED,
    ),
    # forecast twice the observed rate: g = min(1, 2) = 1, still 3.04 -> 4 (the mean rate carries a rise)
    BurstCase(
        id="a-forecast-rise-does-not-grow-the-burst",
        traffic=burst_traffic(prompt_tokens_p99_250ms=50_000, prompt_tokens_p99_1s=300_000),
        forecast_tokens_per_s=20_000,
        mean_rate=1,
        want=4,
        reason=ReasonCode.BURST_SIZED,
    ),
    # forecast half the observed rate: 0.5 x 3.04 = 1.52 -> 2
    BurstCase(
        id="a-forecast-fall-shrinks-the-burst",
        traffic=burst_traffic(prompt_tokens_p99_250ms=50_000, prompt_tokens_p99_1s=300_000),
        forecast_tokens_per_s=5_000,
        mean_rate=1,
        want=2,
        reason=ReasonCode.BURST_SIZED,
    ),
    # a 200,000-token p99 prompt changes nothing: capping each prompt at one engine's share of the interval is the
    # source's job (`TrafficObservation`), so the curve is taken as given: still 3.04 -> 4
    BurstCase(
        id="the-curve-is-taken-as-the-source-counted-it",
        traffic=burst_traffic(prompt_tokens_p99_250ms=50_000, prompt_tokens_p99_1s=300_000, isl_p99=200_000),
        forecast_tokens_per_s=10_000,
        mean_rate=1,
        want=4,
        reason=ReasonCode.BURST_SIZED,
    ),
    # the mean rate already sizes 5 >= 4
    BurstCase(
        id="mean-rate-covers-the-burst",
        traffic=burst_traffic(prompt_tokens_p99_1s=300_000),
        forecast_tokens_per_s=10_000,
        mean_rate=5,
        want=5,
        reason=ReasonCode.BURST_COVERED,
    ),
]


@pytest.mark.parametrize("case", BURST_CASES, ids=lambda c: c.id)
def test_burst_prefill_replicas(case: BurstCase) -> None:
    replicas, step, _ = burst_prefill_replicas(
        case.traffic,
        case.forecast_tokens_per_s,
        mean_rate_replicas=case.mean_rate,
        ttft_ms=200,
        engine_prompt_tokens_per_s=MU,
        iteration_s=CHUNK_S,
    )
    assert (replicas, step.reason) == (case.want, case.reason)
    assert step.component is Component.PREFILL


def test_burst_arithmetic_is_the_documented_formula() -> None:
    need = 300_000 / (MU * (1.0 + 0.2 - CHUNK_S))
    assert need == pytest.approx(3.0378, abs=1e-3)
    assert math.ceil(need) == 4


def test_burst_sizing_in_the_tick_raises_prefill_only_when_on() -> None:
    """In the tick: 600 requests of 1,000 tokens in 60 s size 1 prefill engine on the mean rate; the observed burst
    (300,000 tokens within 1 s) needs 4 when burst sizing is on. Decode is untouched."""
    obs = burst_traffic(prompt_tokens_p99_1s=300_000)
    off = tick(throughput_inputs(obs), PlannerState(), make_config(), PERF)
    on = tick(throughput_inputs(obs), PlannerState(), make_config(throughput_prefill_burst_sizing=True), PERF)
    assert desired(off) == {Component.PREFILL: 1, Component.DECODE: 1}
    assert desired(on) == {Component.PREFILL: 4, Component.DECODE: 1}
    (step,) = steps_named(on, "burst")
    assert step.reason is ReasonCode.BURST_SIZED and step.value == 4
    assert not steps_named(off, "burst")


def test_burst_sizing_derates_the_engine_by_the_prefill_utilisation() -> None:
    # at utilisation 0.5 the engine counts as 44,560.5 tokens/s: 300,000 / (44,560.5 x 1.10808) = 6.08 -> 7
    obs = burst_traffic(prompt_tokens_p99_1s=300_000)
    config = make_config(throughput_prefill_burst_sizing=True, throughput_prefill_target_utilization=0.5)
    assert desired(tick(throughput_inputs(obs), PlannerState(), config, PERF))[Component.PREFILL] == 7


def test_burst_sizing_without_a_forward_model_keeps_the_mean_rate() -> None:
    obs = burst_traffic(prompt_tokens_p99_1s=300_000)
    outcome = tick(
        throughput_inputs(obs), PlannerState(), make_config(throughput_prefill_burst_sizing=True), FixedRatePerf()
    )
    assert desired(outcome)[Component.PREFILL] == 1
    assert steps_named(outcome, "burst")[0].reason is ReasonCode.BURST_UNAVAILABLE


# --- burst sizing of aggregated engines ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AggBurstCase:
    id: str
    overrides: dict[str, object]
    kv_hit_rate: float | None
    want: int


# Aggregated engines on the linear model, ITL 50 ms: mixed_wall(p, b, kv) = 0.015 + 1e-5 p + 1e-4 b + 1e-8 kv s.
# 600 requests of ISL 1000 / OSL 100 per 60 s (10 req/s, 10,000 prompt tokens/s), context 1000 + 50 = 1050.
# The capacity search: p(b) = 10 b, itl(b) = 0.015 + 2.105e-4 b <= 0.05 -> b <= 166.3; the candidates for
# max_num_seqs 512 are 1 + i x 511 // 127, the largest within is 165 (itl 49.73 ms, 33.18 req/s: 1 engine on the
# mean rate). Its prompt rate: 8192 - 165 = 8027 tokens per 0.015 + 0.08027 + 0.0165 + 165 x 1050 x 1e-8
# = 0.1135025 s: 70,720.9 tokens/s; slack T' = 0.2 - 0.1135025 = 0.0864975 s.
AGG_BURST_CASES = [
    # 300,000 tokens within 1 s: 300,000 / (70,720.9 x 1.0864975) = 3.90 -> 4 (a prefill engine would need 4 too,
    # at 89,121 tokens/s: 3.04)
    AggBurstCase(id="burst-raises-the-agg-pool", overrides={}, kv_hit_rate=None, want=4),
    # the prefill target utilisation 0.7 derates the prompt rate: 49,504.6 tokens/s -> 300,000 / 53,786.7
    # = 5.58 -> 6
    AggBurstCase(
        id="prefill-utilisation-derates",
        overrides={"throughput_prefill_target_utilization": 0.7},
        kv_hit_rate=None,
        want=6,
    ),
    # the pool's own (decode) utilisation is in the mean-rate size only (10 / 0.7 = 14.3 req/s still fits one
    # engine of 33.18): the burst still needs 4
    AggBurstCase(
        id="decode-utilisation-leaves-the-burst-rate",
        overrides={"throughput_decode_target_utilization": 0.7},
        kv_hit_rate=None,
        want=4,
    ),
    # hit 0.5: 500 computed tokens per prompt: p(b) = 5 b, itl(b) = 0.015 + 1.605e-4 b -> b <= 218.07, candidate 218
    # (1 + 54 x 511 // 127); rate 7974 / (0.015 + 0.07974 + 0.0218 + 0.002289 = 0.118829 s) = 67,105.2 computed,
    # / (1 - 0.5) = 134,210.4 prompt tokens/s; slack 0.081171 s: 300,000 / 145,104.3 = 2.07 -> 3
    AggBurstCase(id="kv-hits-discounted", overrides={}, kv_hit_rate=0.5, want=3),
]


@pytest.mark.parametrize("case", AGG_BURST_CASES, ids=lambda c: c.id)
def test_agg_burst_sizing_in_the_tick(case: AggBurstCase) -> None:
    obs = dataclasses.replace(burst_traffic(prompt_tokens_p99_1s=300_000), kv_hit_rate=case.kv_hit_rate)
    agg = {"mode": "agg", "throughput_algorithm": "engine_capacity", "itl_ms": 50, **case.overrides}
    off = tick(throughput_inputs(obs), PlannerState(), make_config(**agg), PERF)
    on = tick(throughput_inputs(obs), PlannerState(), make_config(**agg, throughput_prefill_burst_sizing=True), PERF)
    assert desired(off) == {Component.DECODE: 1} and not steps_named(off, "burst")
    assert desired(on) == {Component.DECODE: case.want}
    (step,) = steps_named(on, "burst")
    assert (step.reason, step.component, step.value) == (ReasonCode.BURST_SIZED, Component.DECODE, case.want)


def test_agg_burst_sizing_without_a_forward_model_keeps_the_mean_rate() -> None:
    """No forward-pass model at all: the capacity search cannot run, so the tick holds before burst sizing."""
    obs = burst_traffic(prompt_tokens_p99_1s=300_000)
    config = make_config(
        mode="agg", throughput_algorithm="engine_capacity", itl_ms=50, throughput_prefill_burst_sizing=True
    )
    outcome = tick(throughput_inputs(obs), PlannerState(), config, FixedRatePerf())
    assert not steps_named(outcome, "burst") and outcome.reason is ReasonCode.MODEL_NOT_READY


def test_agg_burst_sizing_without_a_curve_says_so() -> None:
    obs = burst_traffic()
    config = make_config(
        mode="agg", throughput_algorithm="engine_capacity", itl_ms=50, throughput_prefill_burst_sizing=True
    )
    outcome = tick(throughput_inputs(obs), PlannerState(), config, PERF)
    assert desired(outcome) == {Component.DECODE: 1}
    (step,) = steps_named(outcome, "burst")
    assert (step.reason, step.component) == (ReasonCode.BURST_UNAVAILABLE, Component.DECODE)


# --- scale-down hold ----------------------------------------------------------------------------------------------


def test_scale_down_waits_for_the_hold_time() -> None:
    """Needs 10 then 1 prefill (6,000 then 600 requests of 1,000 tokens per 60 s) with a 120 s hold: the tick at
    120 s still holds 10 (the need of 60 s is 60 s old), the tick at 180 s drops to 1 (that need is 120 s old)."""
    config = make_config(throughput_scale_down_hold_seconds=120)
    state = PlannerState()
    got = []
    for now_s, num_req, current in ((60.0, 6000, 1), (120.0, 600, 10), (180.0, 600, 10)):
        outcome = tick(
            throughput_inputs(traffic(num_req), workers(current, 1), now_s=now_s), state, config, PERF
        )  # fmt: skip
        state = outcome.next_state
        got.append(desired(outcome)[Component.PREFILL])
        held = steps_named(outcome, "scale_down_hold", Component.PREFILL)[0]
        if now_s == 120.0:
            assert held.reason is ReasonCode.SCALE_DOWN_HELD
    assert got == [10, 10, 1]
    assert [n.at_s for n in state.recent_throughput_needs] == [120.0, 180.0]


def test_first_hold_counts_the_current_size_as_a_need() -> None:
    """The first sizing also holds the size the deployment already has (4 prefill, 3 decode), for the hold time."""
    config = make_config(throughput_scale_down_hold_seconds=300)
    outcome = tick(throughput_inputs(traffic(600), workers(4, 3), now_s=60.0), PlannerState(), config, PERF)
    assert desired(outcome) == {Component.PREFILL: 4, Component.DECODE: 3}
    assert outcome.next_state.recent_throughput_needs == (
        SizedNeed(at_s=60.0, num_prefill=4, num_decode=3),
        SizedNeed(at_s=60.0, num_prefill=1, num_decode=1),
    )


def test_no_hold_by_default_keeps_dynamo_sizing() -> None:
    state = dataclasses.replace(
        PlannerState(), recent_throughput_needs=(SizedNeed(at_s=0, num_prefill=9, num_decode=9),)
    )
    outcome = tick(throughput_inputs(traffic(600), workers(9, 9), now_s=60.0), state, make_config(), PERF)
    assert desired(outcome) == {Component.PREFILL: 1, Component.DECODE: 1}
    assert not steps_named(outcome, "scale_down_hold")
