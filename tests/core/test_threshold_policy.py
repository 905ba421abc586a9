"""Tests of the threshold load policies `planner_core.policy.thresholds` (pure, no database).

Two policies: Dynamo 1.x's per-engine thresholds of the `throughput`, `latency` and `load` targets
(`calculate_threshold_replicas`), and the 2025 threshold planner (`calculate_threshold_2025`) with its interval
averages, decode grace period and prefill queue trend. Unless a case says otherwise: context length 8192 tokens,
1000 KV tokens per engine (so 1 KV token = 0.001 utilisation), one DP rank per worker, minimum endpoint 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import PlannerConfig, parse_config
from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    PlannerState,
    QueuedRequests,
    ReasonCode,
    ScheduledRequests,
    StepRecord,
    ThresholdPlannerState,
    WorkerCounts,
)
from planner_core.policy.thresholds import (
    Threshold2025Outcome,
    Threshold2025Settings,
    ThresholdInputs,
    ThresholdMeasure,
    ThresholdRule,
    calculate_threshold_2025,
    calculate_threshold_replicas,
    threshold_rule,
)
from planner_core.runtime.store.codec import from_jsonable, to_jsonable

LIMITS = EngineLimits(context_length=8192, max_kv_tokens=1000)
LOAD_TARGET: dict[str, Any] = {
    "optimization_target": "load",
    "prefill_scale_up_queue_tokens": 4096,
    "prefill_scale_down_queue_tokens": 512,
    "decode_scale_up_kv_rate": 90,
    "decode_scale_down_kv_rate": 30,
}


def engine(
    component: Component,
    worker: str,
    *,
    queued_prefill: int = 0,
    queued_requests: int = 0,
    kv: int = 0,
    queued_kv: int = 0,
    dp_rank: int = 0,
) -> ForwardPassMetrics:
    """One engine rank's latest forward-pass metrics."""
    return ForwardPassMetrics(
        component=component,
        worker_id=worker,
        dp_rank=dp_rank,
        counter_id=1,
        wall_time_s=0.01,
        scheduled=ScheduledRequests(sum_decode_kv_tokens=kv),
        queued=QueuedRequests(
            sum_prefill_tokens=queued_prefill, num_prefill_requests=queued_requests, sum_decode_kv_tokens=queued_kv
        ),
    )


def prefill(queued: Sequence[int]) -> tuple[ForwardPassMetrics, ...]:
    return tuple(engine(Component.PREFILL, f"p{i}", queued_prefill=q) for i, q in enumerate(queued))


def decode(kv: Sequence[int], *, queued_prefill: int = 0) -> tuple[ForwardPassMetrics, ...]:
    return tuple(engine(Component.DECODE, f"d{i}", kv=k, queued_prefill=queued_prefill) for i, k in enumerate(kv))


def workers(num_prefill: int, num_decode: int) -> WorkerCounts:
    return WorkerCounts(
        ready_prefill=num_prefill, ready_decode=num_decode, expected_prefill=num_prefill, expected_decode=num_decode
    )


def rule_for(data: dict[str, Any], component: Component) -> ThresholdRule | None:
    return threshold_rule(parse_config(data).policy, component)


# --- rules -----------------------------------------------------------------------------------------------------


def test_rules_follow_the_target() -> None:
    """Each target's thresholds and comparisons, per pool (Dynamo's static values; `load` from the config)."""
    assert rule_for({"optimization_target": "throughput"}, Component.PREFILL) == ThresholdRule(
        measure=ThresholdMeasure.QUEUE_RATIO, up=1.0, down=0.1, up_inclusive=True, down_inclusive=False
    )
    assert rule_for({"optimization_target": "latency"}, Component.PREFILL) == ThresholdRule(
        measure=ThresholdMeasure.QUEUE_RATIO, up=0.1, down=0.0, up_inclusive=True, down_inclusive=True
    )
    assert rule_for({"optimization_target": "throughput"}, Component.DECODE) == ThresholdRule(
        measure=ThresholdMeasure.KV_UTILISATION, up=1.0, down=0.6, up_inclusive=False, down_inclusive=False
    )
    assert rule_for({"optimization_target": "latency", "mode": "agg"}, Component.DECODE) == ThresholdRule(
        measure=ThresholdMeasure.AGG_KV_UTILISATION, up=0.4, down=0.1, up_inclusive=False, down_inclusive=False
    )
    assert rule_for(LOAD_TARGET, Component.PREFILL) == ThresholdRule(
        measure=ThresholdMeasure.QUEUED_TOKENS, up=4096.0, down=512.0, up_inclusive=True, down_inclusive=True
    )
    assert rule_for(LOAD_TARGET, Component.DECODE) == ThresholdRule(
        measure=ThresholdMeasure.KV_UTILISATION, up=0.9, down=0.3, up_inclusive=True, down_inclusive=True
    )
    assert rule_for({"optimization_target": "sla"}, Component.DECODE) is None


# --- per-engine thresholds -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdCase:
    id: str
    config: dict[str, Any]
    component: Component
    fpm: tuple[ForwardPassMetrics, ...]
    want: int
    want_reason: ReasonCode
    limits: EngineLimits = LIMITS
    lower_bound: int | None = None
    min_endpoint: int = 1


THROUGHPUT = {"optimization_target": "throughput"}
LATENCY = {"optimization_target": "latency"}
AGG_THROUGHPUT = {"optimization_target": "throughput", "mode": "agg"}

THRESHOLD_CASES = [
    # prefill, throughput: ratio queued / 8192; up when any >= 1.0
    ThresholdCase(
        id="prefill-one-context-queued",
        config=THROUGHPUT,
        component=Component.PREFILL,
        fpm=prefill([8192, 0]),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    # 8191 / 8192 = 0.99988: not over; 0 is under 0.1 but 0.99988 is not: hold
    ThresholdCase(
        id="prefill-one-token-short",
        config=THROUGHPUT,
        component=Component.PREFILL,
        fpm=prefill([8191, 0]),
        want=2,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    # 819 / 8192 = 0.09998 < 0.1 on both; x 2/1 = 0.19995 < 1.0: down
    ThresholdCase(
        id="prefill-all-under-down",
        config=THROUGHPUT,
        component=Component.PREFILL,
        fpm=prefill([819, 819]),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # 820 / 8192 = 0.10010 is not < 0.1: hold
    ThresholdCase(
        id="prefill-just-over-down",
        config=THROUGHPUT,
        component=Component.PREFILL,
        fpm=prefill([820, 0]),
        want=2,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    # latency: up when any >= 0.1 (820 / 8192 = 0.1001)
    ThresholdCase(
        id="prefill-latency-up",
        config=LATENCY,
        component=Component.PREFILL,
        fpm=prefill([820, 0]),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    # latency: down only on empty queues; one queued token holds
    ThresholdCase(
        id="prefill-latency-needs-empty-queues",
        config=LATENCY,
        component=Component.PREFILL,
        fpm=prefill([1, 0]),
        want=2,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    ThresholdCase(
        id="prefill-latency-empty-down",
        config=LATENCY,
        component=Component.PREFILL,
        fpm=prefill([0, 0]),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # decode, throughput: util (kv) / 1000; up when any > 1.0 (1001 tokens), not at exactly 1.0
    ThresholdCase(
        id="decode-over-capacity",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([1001, 0]),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    ThresholdCase(
        id="decode-at-capacity-is-not-over",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([1000, 0]),
        want=2,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    # all 0.599 < 0.6, but 0.599 x 2/1 = 1.198 >= 1.0: the survivor would be over at once -> refused
    ThresholdCase(
        id="decode-anti-oscillation-two-to-one",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([599, 599]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # N=3: 0.599 x 3/2 = 0.8985 < 1.0 -> down
    ThresholdCase(
        id="decode-three-to-two",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([599, 599, 599]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # refusal boundary, N=2: 0.499 x 2 = 0.998 < 1.0 -> down; 0.5 x 2 = 1.0 >= 1.0 -> refused
    ThresholdCase(
        id="decode-consolidated-just-under-up",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([499, 0]),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    ThresholdCase(
        id="decode-consolidated-at-up",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([500, 0]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # latency: up > 0.4; down < 0.1 (0.099 x 2 = 0.198 < 0.4)
    ThresholdCase(
        id="decode-latency-up",
        config=LATENCY,
        component=Component.DECODE,
        fpm=decode([401, 0]),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    ThresholdCase(
        id="decode-latency-down",
        config=LATENCY,
        component=Component.DECODE,
        fpm=decode([99, 99]),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # queued KV counts: 300 + 300 queued = 0.6, not < 0.6
    ThresholdCase(
        id="decode-queued-kv-counts",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=tuple(engine(Component.DECODE, f"d{i}", kv=300, queued_kv=300) for i in range(3)),
        want=3,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    # agg: queued prompt tokens count as KV: 500 + 501 = 1.001 > 1.0 -> up
    ThresholdCase(
        id="agg-queued-prompts-count",
        config=AGG_THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([500, 0], queued_prefill=501),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    # load target: prefill tokens up >= 4096, down <= 512 (inclusive); 512 x 2 = 1024 < 4096
    ThresholdCase(
        id="load-prefill-up-at-threshold",
        config=LOAD_TARGET,
        component=Component.PREFILL,
        fpm=prefill([4096, 0]),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    ThresholdCase(
        id="load-prefill-down-at-threshold",
        config=LOAD_TARGET,
        component=Component.PREFILL,
        fpm=prefill([512, 512]),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # load target decode: up >= 0.9, down <= 0.3 (0.3 x 3/2 = 0.45 < 0.9)
    ThresholdCase(
        id="load-decode-up-at-threshold",
        config=LOAD_TARGET,
        component=Component.DECODE,
        fpm=decode([900, 0]),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    ThresholdCase(
        id="load-decode-down-at-threshold",
        config=LOAD_TARGET,
        component=Component.DECODE,
        fpm=decode([300, 300, 300]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # bounds
    ThresholdCase(
        id="floor-blocks-down",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([0, 0]),
        lower_bound=2,
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT,
    ),
    ThresholdCase(
        id="min-endpoint-holds",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([0, 0]),
        min_endpoint=2,
        want=2,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    ThresholdCase(
        id="single-worker-never-down",
        config=THROUGHPUT,
        component=Component.DECODE,
        fpm=decode([0]),
        want=1,
        want_reason=ReasonCode.NO_CHANGE,
    ),
    ThresholdCase(
        id="no-context-length",
        config=THROUGHPUT,
        component=Component.PREFILL,
        fpm=prefill([90_000, 0]),
        limits=EngineLimits(),
        want=2,
        want_reason=ReasonCode.INSUFFICIENT_DATA,
    ),
]


def run(case: ThresholdCase) -> tuple[int, tuple[StepRecord, ...]]:
    n = len({f.worker_id for f in case.fpm})
    counts = workers(n, 1) if case.component is Component.PREFILL else workers(1, n)
    return calculate_threshold_replicas(
        ThresholdInputs(
            component=case.component,
            fpm=case.fpm,
            workers=counts,
            limits=case.limits,
            rule=rule_for(case.config, case.component),
            throughput_lower_bound=case.lower_bound,
            min_endpoint=case.min_endpoint,
        )
    )


@pytest.mark.parametrize("case", THRESHOLD_CASES, ids=lambda c: c.id)
def test_threshold_decision(case: ThresholdCase) -> None:
    """Up if any engine is over; down if all are under and the consolidated maximum stays under `up`."""
    desired, steps = run(case)
    assert (desired, steps[-1].reason) == (case.want, case.want_reason)


def test_threshold_steps_record_every_engine_value() -> None:
    """Every engine rank's value is a `load_measured` step; the refusal names its arithmetic."""
    [case] = [c for c in THRESHOLD_CASES if c.id == "decode-anti-oscillation-two-to-one"]
    _, steps = run(case)
    values = [s for s in steps if s.step == "engine_load"]
    assert [s.value for s in values] == pytest.approx([0.599, 0.599])
    assert all(s.reason is ReasonCode.LOAD_MEASURED for s in values)
    [signal] = [s for s in steps if s.step == "threshold_signal"]
    assert "0.599 x 2/1 = 1.198 >= 1" in signal.detail


def test_threshold_holds_like_the_sla_proposer() -> None:
    """Scale in flight, no metrics and worker count mismatch hold at the expected count."""
    rule = rule_for(THROUGHPUT, Component.DECODE)
    base = ThresholdInputs(
        component=Component.DECODE, fpm=decode([0, 0]), workers=workers(1, 2), limits=LIMITS, rule=rule
    )
    in_flight = dataclasses.replace(base, workers=dataclasses.replace(workers(1, 2), expected_decode=3))
    cases = [
        (in_flight, 3, ReasonCode.SCALING_IN_PROGRESS),
        (dataclasses.replace(base, fpm=()), 2, ReasonCode.NO_FPM_DATA),
        (dataclasses.replace(base, fpm=decode([0])), 2, ReasonCode.WORKER_COUNT_MISMATCH),
    ]
    for request, want, reason in cases:
        desired, steps = calculate_threshold_replicas(request)
        assert (desired, [s.reason for s in steps]) == (want, [reason])


def test_anti_oscillation_keeps_the_pool_stable_over_ticks() -> None:
    """A steady 1100 KV tokens of work: on 2 engines each is at 0.55 (< 0.6); removing one would put the survivor at
    1.1 (> 1.0) and the next tick would add it back. The refusal keeps 2 tick after tick."""
    rule = rule_for(THROUGHPUT, Component.DECODE)
    n, history = 2, []
    for _ in range(5):
        per_engine = 1100 // n
        request = ThresholdInputs(
            component=Component.DECODE, fpm=decode([per_engine] * n), workers=workers(1, n), limits=LIMITS, rule=rule
        )
        n, steps = calculate_threshold_replicas(request)
        history.append((n, steps[-1].reason))
    assert history == [(2, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION)] * 5


@settings(max_examples=300, deadline=None)
@given(
    target=st.sampled_from(["throughput", "latency", "load"]),
    component=st.sampled_from(Component),
    values=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=5),
    lower_bound=st.none() | st.integers(min_value=0, max_value=8),
    min_endpoint=st.integers(min_value=0, max_value=4),
)
def test_threshold_result_is_one_step_and_never_below_the_floors(
    target: str, component: Component, values: list[int], lower_bound: int | None, min_endpoint: int
) -> None:
    """Never below max(throughput floor, minimum endpoint); within one replica of N when those floors allow."""
    config = {**LOAD_TARGET, "optimization_target": target}
    fpm = prefill(values) if component is Component.PREFILL else decode([v // 10 for v in values])
    n = len(values)
    desired, steps = calculate_threshold_replicas(
        ThresholdInputs(
            component=component,
            fpm=fpm,
            workers=workers(n, 1) if component is Component.PREFILL else workers(1, n),
            limits=LIMITS,
            rule=rule_for(config, component),
            throughput_lower_bound=lower_bound,
            min_endpoint=min_endpoint,
        )
    )
    floor = max(lower_bound or 0, min_endpoint)
    assert desired >= floor and desired >= n - 1
    assert abs(desired - n) <= 1 if floor <= n + 1 else desired == floor
    assert (steps[-1].reason is ReasonCode.SCALE_UP) == (desired > n)
    assert (steps[-1].reason is ReasonCode.SCALE_DOWN) == (desired < n)


# --- the 2025 threshold planner --------------------------------------------------------------------------------

INTERVAL_S = 30.0
SETTINGS = Threshold2025Settings(adjustment_interval_s=INTERVAL_S, decode_max_kv_tokens=1000)


def fleet_2025(num_prefill: int, num_decode: int, *, queued_requests: int, kv: int) -> tuple[ForwardPassMetrics, ...]:
    """Prefill engines sharing `queued_requests` (the first holds the remainder), decode engines at `kv` tokens."""
    share, rest = divmod(queued_requests, num_prefill) if num_prefill else (0, 0)
    prefill_engines = tuple(
        engine(Component.PREFILL, f"p{i}", queued_requests=share + (rest if i == 0 else 0)) for i in range(num_prefill)
    )
    return prefill_engines + decode([kv] * num_decode)


@dataclass(slots=True)
class Cluster2025:
    """A disaggregated deployment driven by the 2025 planner, one load tick every 5 s; a decision lands on the next
    tick (which therefore sees the scale in flight)."""

    num_prefill: int = 2
    num_decode: int = 2
    expected_prefill: int = 2
    expected_decode: int = 2
    now_s: float = 0.0
    state: ThresholdPlannerState = field(default_factory=ThresholdPlannerState)
    settings: Threshold2025Settings = SETTINGS
    outcomes: list[Threshold2025Outcome] = field(default_factory=list)

    def tick(self, *, queued_requests: int = 0, kv: int = 0) -> Threshold2025Outcome:
        counts = WorkerCounts(
            ready_prefill=self.num_prefill,
            ready_decode=self.num_decode,
            expected_prefill=self.expected_prefill,
            expected_decode=self.expected_decode,
        )
        outcome = calculate_threshold_2025(
            now_s=self.now_s,
            fpm=fleet_2025(self.num_prefill, self.num_decode, queued_requests=queued_requests, kv=kv),
            workers=counts,
            state=self.state,
            settings=self.settings,
        )
        self.outcomes.append(outcome)
        self.state = outcome.next_state
        if counts.scaling_in_progress:
            self.num_prefill, self.num_decode = self.expected_prefill, self.expected_decode
        if outcome.num_prefill is not None:
            self.expected_prefill = outcome.num_prefill
        if outcome.num_decode is not None:
            self.expected_decode = outcome.num_decode
        self.now_s += 5.0
        return outcome

    def run_interval(self, **load: int) -> Threshold2025Outcome:
        """Tick until an adjustment (or a hold that is not interval collection) happens."""
        while True:
            outcome = self.tick(**load)
            if outcome.reason is not ReasonCode.INTERVAL_COLLECTING:
                return outcome


def test_2025_collects_then_adjusts_on_interval_averages() -> None:
    """Ticks at 0..25 s only sample; the tick at 30 s (7 samples) compares the averages: KV 0.95 > 0.9 adds a decode
    worker, the queue of 3 requests is within 0.2..5 and changes nothing."""
    cluster = Cluster2025()
    for _ in range(6):
        outcome = cluster.tick(queued_requests=3, kv=950)
        assert (outcome.num_prefill, outcome.num_decode, outcome.reason) == (None, None, ReasonCode.INTERVAL_COLLECTING)
    assert cluster.state.prefill_queue_samples == (3.0,) * 6
    assert cluster.state.decode_kv_samples == pytest.approx((0.95,) * 6)
    outcome = cluster.tick(queued_requests=3, kv=950)
    assert (outcome.num_prefill, outcome.num_decode, outcome.reason) == (2, 3, ReasonCode.SCALE_UP)
    averages = {s.component: s.value for s in outcome.steps if s.step == "interval_average"}
    assert averages == pytest.approx({Component.PREFILL: 3.0, Component.DECODE: 0.95})
    # a new interval opens at this tick; the grace period starts
    assert cluster.state.interval_start_s == 30.0 and cluster.state.prefill_queue_samples == ()
    assert cluster.state.decode_grace_intervals_left == 3


def test_2025_thresholds_are_strict() -> None:
    """Averages exactly at a threshold do nothing: queue 5.0 is not > 5.0, KV 0.5 is not < 0.5; with the down
    threshold of the queue at 1.0 and the up threshold of KV at 0.75, queue 1.0 and KV 0.75 do nothing either."""
    cluster = Cluster2025()
    outcome = cluster.run_interval(queued_requests=5, kv=500)
    assert (outcome.num_prefill, outcome.num_decode, outcome.reason) == (2, 2, ReasonCode.NO_CHANGE)
    other = Cluster2025(settings=dataclasses.replace(SETTINGS, prefill_queue_down=1.0, decode_kv_up=0.75))
    outcome = other.run_interval(queued_requests=1, kv=750)
    assert (outcome.num_prefill, outcome.num_decode, outcome.reason) == (2, 2, ReasonCode.NO_CHANGE)
    # one token of KV more (0.751 > 0.75) adds a decode worker
    assert Cluster2025(settings=other.settings).run_interval(queued_requests=1, kv=751).num_decode == 3


def test_2025_decode_grace_period_after_adding_a_worker() -> None:
    """After a decode worker is added, the next 3 adjustments refuse decode scale-downs; the 4th allows one."""
    cluster = Cluster2025()
    assert cluster.run_interval(queued_requests=3, kv=950).num_decode == 3
    assert cluster.tick().reason is ReasonCode.SCALING_IN_PROGRESS  # sampling paused while the worker starts
    grace = [cluster.run_interval(queued_requests=3, kv=100) for _ in range(3)]
    assert [(o.num_decode, o.reason) for o in grace] == [(3, ReasonCode.DECODE_GRACE_PERIOD)] * 3
    assert [s.value for o in grace for s in o.steps if s.step == "decode_grace"] == [3, 2, 1]
    final = cluster.run_interval(queued_requests=3, kv=100)
    assert (final.num_decode, final.reason) == (2, ReasonCode.SCALE_DOWN)


def test_2025_prefill_trend_buffer() -> None:
    """Average queue above 5 scales prefill up only if last + (last - first) x 3 stays above 5."""
    rising = Cluster2025()
    queues = [4, 5, 6, 7, 8, 9, 10]  # average 7 > 5; 10 + (10 - 4) x 3 = 28 > 5 -> up
    outcomes = [rising.tick(queued_requests=q, kv=700) for q in queues]
    assert (outcomes[-1].num_prefill, outcomes[-1].reason) == (3, ReasonCode.SCALE_UP)

    draining = Cluster2025()
    queues = [12, 10, 8, 6, 4, 3, 2]  # average 6.43 > 5; 2 + (2 - 12) x 3 = -28 <= 5 -> no scale-up
    outcomes = [draining.tick(queued_requests=q, kv=700) for q in queues]
    last = outcomes[-1]
    assert (last.num_prefill, last.reason) == (2, ReasonCode.PREFILL_QUEUE_TREND)
    [trend] = [s for s in last.steps if s.reason is ReasonCode.PREFILL_QUEUE_TREND and s.step == "threshold_signal"]
    assert "predicts -28" in trend.detail

    # flat at 6: 6 + 0 x 3 = 6 > 5 -> up
    flat = Cluster2025()
    assert flat.run_interval(queued_requests=6, kv=700).num_prefill == 3


def test_2025_scale_down_both_pools_and_stop_at_the_minimum() -> None:
    """Idle: queue 0 < 0.2 and KV 0 < 0.5 remove one of each per adjustment, never below the minimum endpoint."""
    cluster = Cluster2025(num_prefill=2, num_decode=2)
    first = cluster.run_interval()
    assert (first.num_prefill, first.num_decode, first.reason) == (1, 1, ReasonCode.SCALE_DOWN)
    assert cluster.tick().reason is ReasonCode.SCALING_IN_PROGRESS
    second = cluster.run_interval()
    assert (second.num_prefill, second.num_decode, second.reason) == (1, 1, ReasonCode.NO_CHANGE)


def test_2025_scale_in_flight_pauses_sampling_and_restarts_the_interval() -> None:
    """While a scale is in flight nothing is sampled and the interval restarts; the grace counter survives."""
    state = ThresholdPlannerState(
        interval_start_s=0.0, prefill_queue_samples=(9.0,), decode_kv_samples=(0.7,), decode_grace_intervals_left=2
    )
    outcome = calculate_threshold_2025(
        now_s=5.0,
        fpm=fleet_2025(2, 2, queued_requests=9, kv=700),
        workers=WorkerCounts(ready_prefill=2, ready_decode=2, expected_prefill=3, expected_decode=2),
        state=state,
        settings=SETTINGS,
    )
    assert outcome.reason is ReasonCode.SCALING_IN_PROGRESS and outcome.num_prefill is None
    assert outcome.next_state == ThresholdPlannerState(decode_grace_intervals_left=2)


def test_2025_workers_changed_during_the_interval_skip_the_adjustment() -> None:
    """Ready counts that differ from the interval's start (a worker crashed) skip the adjustment and the grace count."""
    state = ThresholdPlannerState(
        interval_start_s=0.0,
        interval_num_prefill=2,
        interval_num_decode=3,
        prefill_queue_samples=(9.0,) * 6,
        decode_kv_samples=(0.95,) * 6,
        decode_grace_intervals_left=2,
    )
    outcome = calculate_threshold_2025(
        now_s=30.0,
        fpm=fleet_2025(2, 2, queued_requests=9, kv=950),
        workers=workers(2, 2),
        state=state,
        settings=SETTINGS,
    )
    assert (outcome.num_prefill, outcome.num_decode) == (None, None)
    assert outcome.reason is ReasonCode.WORKERS_CHANGED_IN_INTERVAL
    assert outcome.next_state == ThresholdPlannerState(
        interval_start_s=30.0, interval_num_prefill=2, interval_num_decode=2, decode_grace_intervals_left=2
    )


def test_2025_gpu_budget_limits_scale_ups_after_scale_downs() -> None:
    """Budget 4 GPUs with 2P + 2D: a prefill scale-up alone does not fit (4 + 1 > 4); when decode scales down in the
    same adjustment, the GPU it frees lets prefill grow (3 + 1 <= 4)."""
    tight = dataclasses.replace(SETTINGS, max_gpu_budget=4)
    blocked = Cluster2025(settings=tight).run_interval(queued_requests=9, kv=700)
    assert (blocked.num_prefill, blocked.num_decode) == (2, 2)
    assert blocked.reason is ReasonCode.GPU_BUDGET_GUARD_HOLD
    rebalanced = Cluster2025(settings=tight).run_interval(queued_requests=9, kv=100)
    assert (rebalanced.num_prefill, rebalanced.num_decode, rebalanced.reason) == (3, 1, ReasonCode.SCALE_UP)


def test_2025_missing_pool_metrics_are_not_sampled() -> None:
    """A pool without metrics (or with a mismatch) contributes no sample; an interval without samples changes
    nothing for that pool."""
    cluster = Cluster2025()
    outcomes = []
    for _ in range(7):
        counts = workers(2, 2)
        outcome = calculate_threshold_2025(
            now_s=cluster.now_s, fpm=decode([950, 950]), workers=counts, state=cluster.state, settings=SETTINGS
        )
        cluster.state, cluster.now_s = outcome.next_state, cluster.now_s + 5
        outcomes.append(outcome)
    assert all(
        s.reason is ReasonCode.NO_FPM_DATA
        for o in outcomes
        for s in o.steps
        if s.component is Component.PREFILL and s.step == "fleet"
    )
    last = outcomes[-1]
    assert (last.num_prefill, last.num_decode) == (2, 3)
    assert [s.reason for s in last.steps if s.step == "interval_average" and s.component is Component.PREFILL] == [
        ReasonCode.NO_FPM_DATA
    ]


def test_2025_aggregated_pool_counts_queued_prompts_as_kv() -> None:
    """Aggregated mode manages one pool; its KV utilisation includes queued prompt tokens: (400 + 550) / 1000."""
    settings_agg = dataclasses.replace(SETTINGS, components=(Component.DECODE,), aggregated=True)
    state = ThresholdPlannerState()
    outcome = None
    for tick in range(7):
        outcome = calculate_threshold_2025(
            now_s=5.0 * tick,
            fpm=decode([400, 400], queued_prefill=550),
            workers=workers(0, 2),
            state=state,
            settings=settings_agg,
        )
        state = outcome.next_state
    assert outcome is not None
    assert (outcome.num_prefill, outcome.num_decode, outcome.reason) == (None, 3, ReasonCode.SCALE_UP)


def test_2025_throughput_floor_caps_scale_down() -> None:
    """With the throughput loop on, its floor blocks the 2025 planner's scale-down too."""
    cluster = Cluster2025()
    while True:
        outcome = calculate_threshold_2025(
            now_s=cluster.now_s,
            fpm=fleet_2025(2, 2, queued_requests=0, kv=0),
            workers=workers(2, 2),
            state=cluster.state,
            settings=SETTINGS,
            lower_bound_prefill=2,
            lower_bound_decode=1,
        )
        cluster.state, cluster.now_s = outcome.next_state, cluster.now_s + 5
        if outcome.reason is not ReasonCode.INTERVAL_COLLECTING:
            break
    assert (outcome.num_prefill, outcome.num_decode) == (2, 1)
    assert outcome.reason is ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT


def test_2025_settings_from_config() -> None:
    """The config's 2025 fields reach the settings; defaults are the 2025 planner's."""
    config = parse_config({"load_policy": "threshold_2025", "mode": "agg", "max_gpu_budget": 6}).policy
    got = Threshold2025Settings.from_config(config, (Component.DECODE,))
    assert (got.adjustment_interval_s, got.prefill_queue_up, got.prefill_queue_down) == (30.0, 5.0, 0.2)
    assert (got.decode_kv_up, got.decode_kv_down, got.aggregated, got.max_gpu_budget) == (0.9, 0.5, True, 6)
    assert (got.grace_intervals, got.trend_intervals, got.decode_max_kv_tokens) == (3, 3, 2_000_000)
    assert isinstance(config, PlannerConfig)


def test_2025_state_survives_json_inside_planner_state() -> None:
    """The 2025 planner's state is part of `PlannerState` and round-trips through its JSON form."""
    cluster = Cluster2025()
    for _ in range(3):
        cluster.tick(queued_requests=3, kv=950)
    stored = PlannerState(threshold_planner=cluster.state)
    assert from_jsonable(PlannerState, to_jsonable(stored)) == stored
    assert from_jsonable(PlannerState, {}).threshold_planner == ThresholdPlannerState()


@settings(max_examples=150, deadline=None)
@given(
    loads=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 1200)), min_size=1, max_size=40),
    num_prefill=st.integers(1, 4),
    num_decode=st.integers(1, 4),
    floors=st.tuples(st.none() | st.integers(0, 5), st.none() | st.integers(0, 5)),
)
def test_2025_decisions_move_one_step_and_respect_the_floors(
    loads: list[tuple[int, int]], num_prefill: int, num_decode: int, floors: tuple[int | None, int | None]
) -> None:
    """Over any load sequence: each adjustment moves a pool by at most one (unless a floor is higher), never below
    max(floor, minimum endpoint), and the grace counter stays within 0..3."""
    cluster = Cluster2025(
        num_prefill=num_prefill, num_decode=num_decode, expected_prefill=num_prefill, expected_decode=num_decode
    )
    for queued, kv in loads:
        before = (cluster.num_prefill, cluster.num_decode)
        counts = workers(*before)
        outcome = calculate_threshold_2025(
            now_s=cluster.now_s,
            fpm=fleet_2025(*before, queued_requests=queued, kv=kv),
            workers=counts,
            state=cluster.state,
            settings=SETTINGS,
            lower_bound_prefill=floors[0],
            lower_bound_decode=floors[1],
        )
        cluster.state, cluster.now_s = outcome.next_state, cluster.now_s + 5
        assert 0 <= cluster.state.decode_grace_intervals_left <= 3
        for current, desired, floor in zip(before, (outcome.num_prefill, outcome.num_decode), floors, strict=True):
            if desired is None:
                continue
            lowest = max(floor or 0, 1)
            assert desired >= lowest
            assert abs(desired - current) <= 1 or desired == lowest
        # apply at once (no in-flight tick) so the fleet keeps moving
        cluster.num_prefill = outcome.num_prefill or cluster.num_prefill
        cluster.num_decode = outcome.num_decode or cluster.num_decode
