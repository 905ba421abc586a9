"""Prefill sizing for a round-robin router (`planner_core.policy.dispatch`): where the config declares one, the prefill
pool is sized for a by-count dispatch of the window's recorded prompts (`planner_core.policy.sizing.size_by_count`)."""

from __future__ import annotations

import random

from planner_core.config import RouterKind, load_config
from planner_core.data import DEFAULT_CONFIG
from planner_core.domain import (
    CapacityFeedback,
    Loop,
    PlannerState,
    PoolFeedback,
    ReasonCode,
    RecordedArrivals,
    StepName,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.planner import build_planner
from planner_core.policy.dispatch import by_count_prefill_need


def pooled_need(arrivals: list[float], compute: list[float], *, ttft_s: float, required: float) -> int:
    """The reference: the fewest engines serving `required` prompts within `ttft_s` when each prompt goes to the
    engine free first (a load-balancing router)."""
    for replicas in range(1, 64):
        free_s, within = [0.0] * replicas, 0
        for at_s, work_s in zip(arrivals, compute, strict=True):
            engine = min(range(replicas), key=free_s.__getitem__)
            free_s[engine] = max(at_s, free_s[engine]) + work_s
            within += free_s[engine] - at_s <= ttft_s
        if within >= required:
            return replicas
    raise AssertionError("no size serves the window")


def test_a_by_count_dispatch_of_heavy_tailed_prompts_needs_more_engines_than_a_pooled_one() -> None:
    """One prompt in five takes 0.45 s, the rest 0.03 s, one every 50 ms (2.4 engines of work): the engine free first
    serves 99 % within 0.5 s with 5 engines; by count a long prompt holds its engine while the router keeps sending
    it every P-th request, and 8 are needed."""
    draw = random.Random(7)
    arrivals = [0.05 * i for i in range(600)]
    compute = [0.45 if draw.random() < 0.2 else 0.03 for _ in range(600)]
    assert pooled_need(arrivals, compute, ttft_s=0.5, required=0.99 * 600) == 5
    assert by_count_prefill_need(arrivals, compute, ttft_s=0.5, target_share=0.99, max_replicas=16) == 8
    assert by_count_prefill_need(arrivals, compute, ttft_s=0.5, target_share=0.99, max_replicas=6) == 6  # capped
    assert by_count_prefill_need(arrivals, [1.0] * 600, ttft_s=0.5, target_share=0.99, max_replicas=16) is None


def heavy_window() -> TrafficObservation:
    """900 requests in 60 s, one prompt in five (at random) of 20,000 tokens, the rest of 2,000: recorded one by
    one."""
    draw = random.Random(3)
    lengths = tuple(20000.0 if draw.random() < 0.2 else 2000.0 for _ in range(900))
    arrivals = RecordedArrivals(start_s=0.0, end_s=60.0, at_s=tuple(i / 15.0 for i in range(900)), isl=lengths)
    return TrafficObservation(
        duration_s=60.0, num_req=900.0, isl=sum(lengths) / 900.0, osl=150.0, prompt_arrivals=arrivals
    )


def tick(router: RouterKind, learned: CapacityFeedback):
    update = {"throughput_capacity_feedback": True, "router": router}
    policy = load_config(DEFAULT_CONFIG).policy.model_copy(update=update)
    planner = build_planner(policy, DEFAULT_CONFIG)
    workers = WorkerCounts(ready_prefill=2, ready_decode=2, expected_prefill=2, expected_decode=2)
    inputs = TickInputs(now_s=600.0, loop=Loop.THROUGHPUT, workers=workers, traffic=heavy_window())
    return planner.decide(inputs, PlannerState(capacity_feedback=learned))


STEADY = CapacityFeedback(prefill=PoolFeedback(last_ready=2), decode=PoolFeedback(last_ready=2))


def by_count_steps(outcome) -> list:
    return [s for s in outcome.steps if s.step == StepName.BURST and "by_count" in s.reason.value]


def test_a_declared_round_robin_router_sizes_the_prefill_pool_by_count() -> None:
    pooled = tick(RouterKind.LEAST_LOADED, STEADY)
    by_count = tick(RouterKind.ROUND_ROBIN, STEADY)
    assert not by_count_steps(pooled)
    (step,) = by_count_steps(by_count)
    assert step.reason is ReasonCode.BURST_BY_COUNT_SIZED
    assert (pooled.decision.num_prefill, by_count.decision.num_prefill) == (3, 5)
