"""The SLA load loop's "next request" (`config.load_next_request`): where its lengths come from, and what that does
to a decision (pure: no database, no Prefect).

Dynamo (1.0 to 1.6.1) adds to every TTFT/ITL estimate a next request whose lengths are the engines' own moving
averages: prompt tokens computed per prefill request in an iteration (a chunk of a long prompt counts as the
chunk; an iteration without prefill as 0, once a prompt has been seen) and KV tokens per decode request. Ours
can use the last traffic window's mean ISL/OSL instead (`traffic_window`). On long prompts and a mostly idle
prefill pool the two are far apart; the last test shows an idle pool scaled down under one and up under the other.

Engine timing of these tests: a prefill iteration takes 2 ms + 0.01 ms per prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from planner_core.config import LoadNextRequest, parse_config
from planner_core.domain import (
    Component,
    ForwardPassMetrics,
    LoadHistory,
    Loop,
    OnlineModelState,
    OnlinePerfState,
    PerfModelRole,
    PlannerState,
    ReasonCode,
    ScheduledRequests,
    TickInputs,
    WorkerCounts,
)
from planner_core.perf.online import OnlineForwardPassModel, observe_role
from planner_core.pipeline.builtin import load_runtime
from planner_core.tick import tick

P, D = Component.PREFILL, Component.DECODE
ENGINE, WINDOW = LoadNextRequest.ENGINE_AVERAGE, LoadNextRequest.TRAFFIC_WINDOW


def prefill_iteration(tokens: int, *, requests: int = 1, worker_id: str = "p0") -> ForwardPassMetrics:
    """One prefill iteration (`tokens` = 0: an idle heartbeat)."""
    return ForwardPassMetrics(
        component=P,
        worker_id=worker_id,
        wall_time_s=0.002 + 1e-5 * tokens if tokens else 0.0,
        scheduled=ScheduledRequests(num_prefill_requests=requests if tokens else 0, sum_prefill_tokens=tokens),
    )


def decode_iteration(requests: int, kv_tokens: int, *, worker_id: str = "d0") -> ForwardPassMetrics:
    return ForwardPassMetrics(
        component=D,
        worker_id=worker_id,
        wall_time_s=0.005 + 1e-8 * kv_tokens if requests else 0.0,
        scheduled=ScheduledRequests(num_decode_requests=requests, sum_decode_kv_tokens=kv_tokens),
    )


def observed(role: PerfModelRole, fpms: list[ForwardPassMetrics], *, window: int = 64) -> OnlineModelState:
    return observe_role(
        OnlineModelState(role=role), fpms, max_num_fpm_samples=window, bucket_count=16, min_observations=5
    )


# 0 = an idle iteration; (tokens, requests) otherwise
IDLE = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AverageCase:
    name: str
    role: PerfModelRole
    iterations: tuple[int | tuple[int, int], ...]
    window: int
    recent: tuple[float, ...]
    average: float


AVERAGE_CASES = [
    # leading idle iterations skipped; then 8192 / 1, 0, 3000 / 2 = 1500, 0 -> (8192 + 0 + 1500 + 0) / 4 = 2423
    AverageCase(
        name="idle_counts_as_zero",
        role=PerfModelRole.PREFILL,
        iterations=(IDLE, IDLE, (8192, 1), IDLE, (3000, 2), IDLE),
        window=64,
        recent=(8192.0, 0.0, 1500.0, 0.0),
        average=2423.0,
    ),
    # window 3: the 8192 ages out behind three idle iterations -> (0, 0, 0), no next request
    AverageCase(
        name="window_of_idle",
        role=PerfModelRole.PREFILL,
        iterations=((8192, 1), IDLE, IDLE, IDLE),
        window=3,
        recent=(0.0, 0.0, 0.0),
        average=0.0,
    ),
    # never a prompt: nothing kept
    AverageCase(name="all_idle", role=PerfModelRole.PREFILL, iterations=(IDLE, IDLE), window=64, recent=(), average=0),
    # the aggregated model keeps the same average: (4000 + 0) / 2 = 2000
    AverageCase(
        name="aggregated",
        role=PerfModelRole.AGG,
        iterations=((4000, 1), IDLE),
        window=64,
        recent=(4000.0, 0.0),
        average=2000.0,
    ),  # fmt: skip
]


@pytest.mark.parametrize("case", AVERAGE_CASES, ids=lambda c: c.name)
def test_prompt_average_counts_idle_iterations(case: AverageCase) -> None:
    """The engines' prompt average is per iteration, an iteration without prefill counting 0 after the first
    prompt (Dynamo's), over the last `max_num_fpm_samples` iterations."""
    fpms = [prefill_iteration(0) if it == IDLE else prefill_iteration(it[0], requests=it[1]) for it in case.iterations]
    state = observed(case.role, fpms, window=case.window)
    assert state.recent_isl == case.recent
    assert OnlineForwardPassModel(state).avg_isl == pytest.approx(case.average)


def test_decode_context_average_skips_idle_iterations() -> None:
    # 8000 KV / 4 requests = 2000, idle skipped, 1000 / 2 = 500 -> (2000 + 500) / 2 = 1250
    state = observed(
        PerfModelRole.DECODE, [decode_iteration(4, 8000), decode_iteration(0, 0), decode_iteration(2, 1000)]
    )
    assert state.recent_decode_context == (2000.0, 500.0)
    assert OnlineForwardPassModel(state).avg_decode_context == pytest.approx(1250.0)
    assert state.recent_isl == ()


# Prefill engines computed one 12,000-token prompt as 8192 + 3808 and were idle in between:
# (8192 + 0 + 3808 + 0) / 4 = 3000 prompt tokens per iteration.
PREFILL_ENGINES = observed(
    PerfModelRole.PREFILL,
    [prefill_iteration(8192), prefill_iteration(0), prefill_iteration(3808), prefill_iteration(0)],
)
# Decode engines held 4 requests of 8000 KV tokens: 2000 KV tokens per decode request.
DECODE_ENGINES = observed(PerfModelRole.DECODE, [decode_iteration(4, 8000)])
# The last traffic window: mean ISL 12,000, OSL 200.
SEEN_WINDOW = LoadHistory(num_req=(1000.0,), isl=(12_000.0,), osl=(200.0,), seen_traffic=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCase:
    name: str
    source: LoadNextRequest
    history: LoadHistory
    engines: OnlineModelState
    component: Component
    reason: ReasonCode
    value: float  # prompt tokens (prefill) or KV tokens of the next decode request (decode)
    avg_isl: float


RUNTIME_CASES = [
    # Dynamo's: the engines' 3000, whatever the window says
    RuntimeCase(name="engine_prefill", source=ENGINE, history=SEEN_WINDOW, engines=PREFILL_ENGINES, component=P,
                reason=ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE, value=3000.0, avg_isl=3000.0),
    # ours: the window's whole prompt, 12,000
    RuntimeCase(name="window_prefill", source=WINDOW, history=SEEN_WINDOW, engines=PREFILL_ENGINES, component=P,
                reason=ReasonCode.NEXT_REQUEST_TRAFFIC_WINDOW, value=12_000.0, avg_isl=12_000.0),
    # ours before any window (load loop alone): the engines' 3000
    RuntimeCase(name="window_unseen", source=WINDOW, history=LoadHistory(), engines=PREFILL_ENGINES, component=P,
                reason=ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE, value=3000.0, avg_isl=3000.0),
    # no prompt reported yet: no next request
    RuntimeCase(name="engine_unknown", source=ENGINE, history=SEEN_WINDOW, engines=observed(PerfModelRole.PREFILL, []),
                component=P, reason=ReasonCode.NEXT_REQUEST_UNKNOWN, value=0.0, avg_isl=0.0),
    # decode, Dynamo's: 2000 KV tokens per decode request
    RuntimeCase(name="engine_decode", source=ENGINE, history=SEEN_WINDOW, engines=DECODE_ENGINES, component=D,
                reason=ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE, value=2000.0, avg_isl=0.0),
    # decode, ours: ISL + OSL / 2 = 12,000 + 100 = 12,100
    RuntimeCase(name="window_decode", source=WINDOW, history=SEEN_WINDOW, engines=DECODE_ENGINES, component=D,
                reason=ReasonCode.NEXT_REQUEST_TRAFFIC_WINDOW, value=12_100.0, avg_isl=12_000.0),
]  # fmt: skip


@pytest.mark.parametrize("case", RUNTIME_CASES, ids=lambda c: c.name)
def test_load_runtime(case: RuntimeCase) -> None:
    state = PlannerState(load_history=case.history, last_kv_hit_rate=0.25)
    runtime, step = load_runtime(
        state, OnlineForwardPassModel(case.engines), source=case.source, component=case.component
    )
    assert (step.step, step.reason, step.component) == ("next_request", case.reason, case.component)
    assert step.value == pytest.approx(case.value)
    assert runtime.avg_isl == pytest.approx(case.avg_isl)
    assert runtime.kv_hit_rate == 0.25  # the hit rate is the last observed one in both cases


@pytest.mark.parametrize(
    ("source", "reason", "target", "next_tokens"),
    [
        # engine average: ten iterations 8192, 0, 3808, 0, 8192, 0, 3808, 0, 8192, 0, then this tick's four idle
        # reports -> 32,192 / 14 = 2299.4, computed as 2300 tokens: TTFT = 2 + 23 = 25 ms on every idle engine;
        # budget (100 - 25) x 0.8 = 60 ms > 0 queue share -> 4 -> 3
        (ENGINE, ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE, 3, 32_192 / 14),
        # traffic window: 12,000 tokens = 8192 + 3808: (2 + 81.92) + (2 + 38.08) = 124 ms > 100 ms on every
        # engine -> 4 -> 5
        (WINDOW, ReasonCode.NEXT_REQUEST_TRAFFIC_WINDOW, 5, 12_000.0),
    ],
)
def test_idle_prefill_pool_after_long_prompts(
    source: LoadNextRequest, reason: ReasonCode, target: int, next_tokens: float
) -> None:
    """Four idle prefill engines after a window of 12,000-token prompts, TTFT target 100 ms: Dynamo's engine
    average (chunks and idle iterations) scales the pool down, the window's mean prompt scales it up."""
    config = parse_config(
        {
            "optimization_target": "sla",
            "mode": "disagg",
            "enable_throughput_scaling": True,
            "enable_load_scaling": True,
            "load_adjustment_interval_seconds": 5,
            "throughput_adjustment_interval_seconds": 60,
            "ttft_ms": 100,
            "itl_ms": 20,
            "load_next_request": source.value,
        }
    ).policy
    history = [prefill_iteration(t, worker_id="p0") for t in (8192, 0, 3808, 0, 8192, 0, 3808, 0, 8192, 0)]
    engines = observed(PerfModelRole.PREFILL, history)
    state = PlannerState(load_history=SEEN_WINDOW, perf_models=OnlinePerfState(prefill=engines))
    idle = tuple(prefill_iteration(0, worker_id=f"p{i}") for i in range(4)) + (decode_iteration(0, 0),)
    workers = WorkerCounts(ready_prefill=4, expected_prefill=4, ready_decode=1, expected_decode=1)
    outcome = tick(TickInputs(now_s=5.0, loop=Loop.LOAD, workers=workers, fpm=idle), state, config, None)
    [step] = [s for s in outcome.steps if s.step == "next_request" and s.component is P]
    assert step.reason is reason and step.value == pytest.approx(next_tokens)
    assert outcome.decision.num_prefill == target
