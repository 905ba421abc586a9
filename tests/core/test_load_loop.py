"""Multi-tick scenarios of the load loop through `tick()`: the builtin load plugin in the pipeline, tick after tick.

Pure: no database, no Prefect. A small simulated cluster (`Cluster`, defined here) plays the orchestrator: a
decision sets the expected counts at once, the ready counts catch up one tick later, so the tick right after a
decision sees a scale in flight. Every ready engine reports one forward-pass metrics (FPM) message per tick: its
share of the pool's queued work, plus a scheduled batch whose wall time the "true" engine (`TRUTH`) gives, so the
online regressions learn from what the engines really did.

Timings come from `LinearForwardPass` (a value implementing `ForwardPassModel`, not a mock) with numbers that can
be worked out by hand:

- prefill iteration: 2 ms + 0.01 ms per prompt token (a full 8192-token chunk: 2 + 81.92 = 83.92 ms);
- decode iteration: 5 ms + 0.01 ms per request + 0.0001 ms per KV token;
- mixed (aggregated) iteration: the decode iteration + 0.01 ms per prompt token.

`LoadPerf` is the deployment's perf model: fixed tokens/s/GPU for the throughput loop (as `FixedRatePerf` in
tests/core/test_tick.py) and `LinearForwardPass` as the load loop's bootstrap forward-pass model. Unless a case says
otherwise the engines behave exactly like the bootstrap model, so the online fits agree with it and every
estimate below is the same whichever model answers.

Unless a case says otherwise: target `sla`, disaggregated, load loop only (5 s), TTFT 200 ms, ITL 20 ms,
sensitivity 80 %, 8192 batched tokens, no GPU budget, minimum endpoint 1, every prompt 1000 tokens (the
prefill models' moving average ISL). The TTFT of a prefill engine with `q` queued tokens is the chunked time of
`q + 1000` tokens; consolidation from N engines is safe when `TTFT(q * N/(N-1)) - TTFT(0) < (200 - TTFT(0)) * 0.8`,
with `TTFT(0) = 2 + 10 = 12 ms`, i.e. a budget of 150.4 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.config import PlannerConfig, parse_config
from planner_core.domain import (
    Component,
    ForwardPassMetrics,
    Loop,
    ModelReadiness,
    OverrideType,
    PlannerState,
    QueuedRequests,
    ReasonCode,
    ReplicaOverride,
    ScalingDecision,
    ScheduledRequests,
    StepRecord,
    TickInputs,
    TickOutcome,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.perf.protocol import PhaseCapacity
from planner_core.pipeline import FunctionPlugin, Phase, PluginResult, PluginSpec
from planner_core.tick import tick

P, D = Component.PREFILL, Component.DECODE
MS = 1e-3
LOAD_INTERVAL_S = 5
THROUGHPUT_INTERVAL_S = 60
ISL = 1000  # every prompt's length: the prefill models' moving average ISL
T0 = 1_700_000_000.0


@dataclass(frozen=True, slots=True)
class LinearForwardPass:
    """Forward-pass wall times linear in the batch (seconds); see the module docstring."""

    prefill_base_s: float = 2 * MS
    prefill_per_token_s: float = 0.01 * MS
    decode_base_s: float = 5 * MS
    decode_per_request_s: float = 0.01 * MS
    decode_per_kv_token_s: float = 0.0001 * MS

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * prefill_tokens

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return (
            self.decode_base_s
            + self.decode_per_request_s * num_decode_requests
            + self.decode_per_kv_token_s * decode_kv_tokens
        )

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.decode_wall_s(num_decode_requests, decode_kv_tokens) + self.prefill_per_token_s * prefill_tokens


BOOTSTRAP = LinearForwardPass()
TRUTH = BOOTSTRAP  # the engines' real behaviour, unless a case says otherwise


@dataclass(frozen=True, slots=True)
class LoadPerf:
    """The deployment's perf model: fixed tokens/s/GPU for the throughput loop, a linear bootstrap for the load
    loop (`forward_pass_model`)."""

    forward: LinearForwardPass | None = BOOTSTRAP
    prefill_tokens_per_s_per_gpu: float = 10_000.0
    decode_tokens_per_s_per_gpu: float = 1_000.0

    def prefill_capacity(self, *, isl: float, ttft_ms: float) -> PhaseCapacity:  # noqa: ARG002 (protocol shape)
        return PhaseCapacity(tokens_per_s_per_gpu=self.prefill_tokens_per_s_per_gpu, latency_ms=ttft_ms, sla_met=True)

    def decode_capacity(self, *, isl: float, osl: float, itl_ms: float) -> PhaseCapacity:  # noqa: ARG002
        return PhaseCapacity(tokens_per_s_per_gpu=self.decode_tokens_per_s_per_gpu, latency_ms=itl_ms, sla_met=True)

    def prefill_ttft_ms(self, isl: float) -> float:  # noqa: ARG002
        return 100.0

    def decode_itl_ms(self, concurrency: float, context_length: float) -> float:  # noqa: ARG002
        return 5.0

    def forward_pass_model(self) -> LinearForwardPass | None:
        return self.forward


PERF = LoadPerf()

BASE_CONFIG: dict[str, Any] = {
    "optimization_target": "sla",
    "mode": "disagg",
    "enable_throughput_scaling": False,
    "enable_load_scaling": True,
    "load_adjustment_interval_seconds": LOAD_INTERVAL_S,
    "throughput_adjustment_interval_seconds": THROUGHPUT_INTERVAL_S,
    "load_predictor": "constant",
    "ttft_ms": 200,
    "itl_ms": 20,
    "max_gpu_budget": -1,
    "max_throughput_scaling_replicas": 100,
}


def make_config(**overrides: Any) -> PlannerConfig:
    return parse_config({**BASE_CONFIG, **overrides}).policy


# --- the simulated cluster -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLoad:
    """What one pool carries, spread evenly over its ready engines (the first engines take the remainder).

    Attributes:
        queued_prefill_tokens: prompt tokens waiting in the pool's queues.
        queued_prefill_requests: prompts waiting (the 2025 planner's prefill queue).
        decode_kv_tokens: KV tokens of the requests being decoded.
        decode_requests: requests being decoded.
    """

    queued_prefill_tokens: int = 0
    queued_prefill_requests: int = 0
    decode_kv_tokens: int = 0
    decode_requests: int = 0


def _share(total: int, index: int, count: int) -> int:
    base, rest = divmod(total, count)
    return base + (1 if index < rest else 0)


@dataclass
class Cluster:
    """The orchestrator and its engines: expected counts follow decisions at once, ready counts a tick later."""

    expected: dict[Component, int]
    ready: dict[Component, int] = field(default_factory=dict)
    truth: LinearForwardPass = TRUTH
    counter: int = 0
    aggregated: bool = False

    def __post_init__(self) -> None:
        if not self.ready:
            self.ready = dict(self.expected)

    def workers(self) -> WorkerCounts:
        return WorkerCounts(
            ready_prefill=self.ready.get(P, 0),
            ready_decode=self.ready.get(D, 0),
            expected_prefill=self.expected.get(P, 0),
            expected_decode=self.expected.get(D, 0),
        )

    def fpm(self, load: Mapping[Component, PoolLoad]) -> tuple[ForwardPassMetrics, ...]:
        """One report per ready engine. The scheduled batch varies with the engine and the tick (1-4 prompts of
        ISL tokens; 8-10 decode requests, KV varied by 500-token steps) so every regression feature has spread;
        its wall time is the true engine's."""
        self.counter += 1
        t = self.counter
        reports = []
        for component, pool in load.items():
            n = self.ready.get(component, 0)
            for i in range(n):
                if component is P:
                    prompts = 1 + (i + t) % 4
                    scheduled = ScheduledRequests(num_prefill_requests=prompts, sum_prefill_tokens=prompts * ISL)
                    wall_s = self.truth.prefill_wall_s(scheduled.sum_prefill_tokens)
                elif self.aggregated:
                    prompts = (i + t) % 3
                    decode_requests = max(1, _share(pool.decode_requests, i, n))
                    scheduled = ScheduledRequests(
                        num_prefill_requests=prompts,
                        sum_prefill_tokens=prompts * ISL,
                        num_decode_requests=decode_requests,
                        sum_decode_kv_tokens=_share(pool.decode_kv_tokens, i, n) + 500 * ((i + 2 * t) % 5),
                    )
                    wall_s = self.truth.mixed_wall_s(
                        scheduled.sum_prefill_tokens, scheduled.num_decode_requests, scheduled.sum_decode_kv_tokens
                    )
                else:
                    scheduled = ScheduledRequests(
                        num_decode_requests=8 + (i + t) % 3,
                        sum_decode_kv_tokens=_share(pool.decode_kv_tokens, i, n) + 500 * ((i + 2 * t) % 5),
                    )
                    wall_s = self.truth.decode_wall_s(scheduled.num_decode_requests, scheduled.sum_decode_kv_tokens)
                reports.append(
                    ForwardPassMetrics(
                        component=component,
                        worker_id=f"{component.value[0]}{i}",
                        counter_id=t,
                        wall_time_s=wall_s,
                        scheduled=scheduled,
                        queued=QueuedRequests(
                            num_prefill_requests=_share(pool.queued_prefill_requests, i, n),
                            sum_prefill_tokens=_share(pool.queued_prefill_tokens, i, n),
                        ),
                    )
                )
        return tuple(reports)

    def execute(self, decision: ScalingDecision) -> None:
        """After a tick: the previous decision's workers become ready, then this decision sets new targets (an
        advisory decision is never executed)."""
        self.ready = dict(self.expected)
        if decision.advisory:
            return
        if decision.num_prefill is not None:
            self.expected[P] = decision.num_prefill
        if decision.num_decode is not None:
            self.expected[D] = decision.num_decode


@dataclass(frozen=True, slots=True, kw_only=True)
class TickRecord:
    """One tick of a scenario: what the planner saw and what it decided."""

    workers: WorkerCounts
    outcome: TickOutcome


def run_load_ticks(
    cluster: Cluster,
    loads: Sequence[Mapping[Component, PoolLoad]] | Callable[[int], Mapping[Component, PoolLoad]],
    config: PlannerConfig,
    *,
    num_ticks: int | None = None,
    state: PlannerState | None = None,
    perf: LoadPerf | None = PERF,
    plugins: Sequence[Any] = (),
    start_s: float = T0,
) -> tuple[list[TickRecord], PlannerState]:
    """Run consecutive load ticks against the cluster, each from the previous tick's next state."""
    state = state or PlannerState()
    count = len(loads) if num_ticks is None and not callable(loads) else num_ticks
    assert count is not None
    records = []
    for index in range(count):
        load = loads(index) if callable(loads) else loads[index]
        workers = cluster.workers()
        inputs = TickInputs(
            now_s=start_s + index * LOAD_INTERVAL_S, loop=Loop.LOAD, workers=workers, fpm=cluster.fpm(load)
        )
        outcome = tick(inputs, state, config, perf, plugins)
        records.append(TickRecord(workers=workers, outcome=outcome))
        state = outcome.next_state
        cluster.execute(outcome.decision)
    return records, state


def steps_named(outcome: TickOutcome, step: str, component: Component | None = None) -> list[StepRecord]:
    return [s for s in outcome.steps if s.step == step and (component is None or s.component is component)]


def load_decision(outcome: TickOutcome, component: Component) -> StepRecord:
    """The pool's headline step of the load policy."""
    [step] = steps_named(outcome, "load_decision", component)
    return step


def decide_step(outcome: TickOutcome) -> StepRecord:
    return steps_named(outcome, "decide")[-1]


def targets(records: Sequence[TickRecord], component: Component) -> list[int | None]:
    return [r.outcome.decision.num_prefill if component is P else r.outcome.decision.num_decode for r in records]


def expected_counts(records: Sequence[TickRecord], component: Component) -> list[int]:
    return [r.workers.expected(component) for r in records]


def reasons_of(records: Sequence[TickRecord]) -> list[ReasonCode]:
    return [r.outcome.reason for r in records]


def burst(queued_prefill_tokens: int, decode_kv_tokens: int = 10_000) -> dict[Component, PoolLoad]:
    return {P: PoolLoad(queued_prefill_tokens=queued_prefill_tokens), D: PoolLoad(decode_kv_tokens=decode_kv_tokens)}


# --- burst: one step per tick, the pending guard in between ------------------------------------------------------


def test_burst_scales_up_one_step_per_tick_and_waits_for_each_scale() -> None:
    """A burst adds one prefill engine per decision; the tick after each decision holds (`scaling_in_progress`,
    both pools) until the new engine is ready; the pool stops growing once an engine's TTFT is under the SLA."""
    records, _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(60_000)] * 9, make_config())
    # TTFT of q queued tokens = chunked time of q + 1000 tokens (83.92 ms per full 8192-token chunk):
    #   1 engine,  60000 each: 61000 = 7 chunks (587.44) + 3656 (38.56) = 626 ms > 200 -> 2
    #   2 engines, 30000 each: 31000 = 3 chunks (251.76) + 6424 (66.24) = 318 ms > 200 -> 3
    #   3 engines, 20000 each: 21000 = 2 chunks (167.84) + 4616 (48.16) = 216 ms > 200 -> 4
    #   4 engines, 15000 each: 16000 = 1 chunk (83.92) + 7808 (80.08) = 164 ms: no scale-up; to 3 engines the queue
    #   x 4/3 gives 216 ms, 216 - 12 = 204 >= budget 150.4: refused
    assert expected_counts(records, P) == [1, 2, 2, 3, 3, 4, 4, 4, 4]
    assert [r.workers.ready_prefill for r in records] == [1, 1, 2, 2, 3, 3, 4, 4, 4]
    assert targets(records, P) == [2, None, 3, None, 4, None, None, None, None]
    assert targets(records, D) == [1, None, 1, None, 1, None, None, None, None]  # decode carried along unchanged
    scale, held, refused = ReasonCode.SCALE, ReasonCode.SCALING_IN_PROGRESS, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION
    assert reasons_of(records) == [scale, held, scale, held, scale, held, refused, refused, refused]
    ttft = [steps_named(r.outcome, "ttft_estimate")[0].value for r in records[0:8:2]]
    assert ttft == pytest.approx([626.0, 318.0, 216.0, 164.0])
    for record in records[1:6:2]:  # the pending guard: both pools held at their expected counts, nothing sent
        assert [s.reason for s in steps_named(record.outcome, "fleet")] == [held, held]
        assert record.outcome.decision == ScalingDecision()
        assert not steps_named(record.outcome, "ttft_estimate")
    for record in records[0:5:2]:
        assert load_decision(record.outcome, P).reason is ReasonCode.SCALE_UP
        assert decide_step(record.outcome).reason is ReasonCode.SCALE_UP
        assert steps_named(record.outcome, "execute")[0].reason is ReasonCode.APPLY


def test_scale_in_flight_holds_whatever_the_load() -> None:
    """While expected != ready (either pool), no load decision is taken, however loaded or idle the engines are."""
    for load in (burst(500_000), burst(0, 0)):
        cluster = Cluster(expected={P: 3, D: 2}, ready={P: 3, D: 1})
        records, _ = run_load_ticks(cluster, [load], make_config())
        assert records[0].outcome.reason is ReasonCode.SCALING_IN_PROGRESS
        assert records[0].outcome.decision == ScalingDecision()
        # each pool "proposes" its expected count: the target already in force, so nothing is sent
        assert [(p.component, p.desired, p.reason) for p in records[0].outcome.proposals] == [
            (P, 3, ReasonCode.NO_CHANGE),
            (D, 2, ReasonCode.NO_CHANGE),
        ]


# --- idle: scale down only when consolidation is safe -----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleCase:
    id: str
    start: int
    queued_prefill_tokens: int
    want: list[int]  # expected prefill counts seen by each tick
    overrides: Mapping[str, Any] = field(default_factory=dict)


IDLE_CASES = [
    # 4 x 6000: TTFT 7000 tokens = 72 ms; to 3 engines: queue 8000 -> 9000 tokens = 83.92 + 10.08 = 94 ms,
    #   94 - 12 = 82 < 150.4 -> 3;
    # 3 x 8000: to 2: queue 12000 -> 13000 tokens = 83.92 + 50.08 = 134 ms, 122 < 150.4 -> 2;
    # 2 x 12000: to 1: queue 24000 -> 25000 tokens = 3 x 83.92 + 6.24 = 258 ms, 246 >= 150.4 -> refused, stays 2.
    IdleCase(id="moderate-load-stops-at-2", start=4, queued_prefill_tokens=24_000, want=[4, 3, 3, 2, 2, 2, 2, 2]),
    # nothing queued: TTFT(0) = 12 ms everywhere, every consolidation is free; 1 engine cannot go lower (N > 1).
    IdleCase(id="empty-queues-down-to-1", start=3, queued_prefill_tokens=0, want=[3, 2, 2, 1, 1, 1, 1]),
    # 2 x 15000: TTFT 164 ms < 200 (no scale-up); to 1: queue 30000 -> 31000 tokens = 318 ms, 306 >= 150.4: refused.
    IdleCase(id="busy-pool-never-shrinks", start=2, queued_prefill_tokens=30_000, want=[2, 2, 2, 2, 2]),
    # sensitivity 0: the budget (200 - 12) x 0 = 0 is used up, nothing is ever consolidated.
    IdleCase(
        id="sensitivity-0-never-scales-down",
        start=3,
        queued_prefill_tokens=0,
        want=[3, 3, 3, 3],
        overrides={"load_scaling_down_sensitivity": 0},
    ),
    # the minimum endpoint: 3 -> 2 and no further.
    IdleCase(id="min-endpoint", start=3, queued_prefill_tokens=0, want=[3, 2, 2, 2, 2], overrides={"min_endpoint": 2}),
]


@pytest.mark.parametrize("case", IDLE_CASES, ids=lambda case: case.id)
def test_idle_scales_down_only_when_consolidation_is_safe(case: IdleCase) -> None:
    """A quiet pool loses one engine per decision while every engine could absorb its share of a removed one."""
    config = make_config(**case.overrides)
    cluster = Cluster(expected={P: case.start, D: 1})
    records, _ = run_load_ticks(cluster, [burst(case.queued_prefill_tokens)] * len(case.want), config)
    assert expected_counts(records, P) == case.want
    for record in records:
        decision = steps_named(record.outcome, "load_decision", P)
        if not decision:
            assert record.outcome.reason is ReasonCode.SCALING_IN_PROGRESS
            continue
        consolidations = steps_named(record.outcome, "consolidation", P)
        if decision[0].reason is ReasonCode.SCALE_DOWN:
            # a scale-down needs every engine's consolidation check to pass
            assert consolidations and all(s.reason is ReasonCode.CONSOLIDATION_SAFE for s in consolidations)
        elif record.workers.expected(P) > config.prefill_min_endpoint_effective:
            # above the minimum, holding means a consolidation check refused
            assert any(s.reason is ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION for s in consolidations)


def test_consolidation_steps_carry_the_arithmetic() -> None:
    """The consolidation step's value is the TTFT after consolidation; refused when the queue share uses up the
    budget."""
    records, _ = run_load_ticks(Cluster(expected={P: 4, D: 1}), [burst(24_000)] * 5, make_config())
    safe = steps_named(records[0].outcome, "consolidation", P)
    assert [s.value for s in safe] == pytest.approx([94.0] * 4)  # see IDLE_CASES: 9000 tokens = 94 ms
    assert all(s.reason is ReasonCode.CONSOLIDATION_SAFE for s in safe)
    refused = steps_named(records[4].outcome, "consolidation", P)
    assert [s.value for s in refused] == pytest.approx([258.0])  # 25000 tokens; the first refusal stops the checks
    assert refused[0].reason is ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION
    assert "queue share 246.00 ms >= budget (200 - 12.00) x 0.8 = 150.40 ms" in refused[0].detail
    assert records[4].outcome.reason is ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION


# --- no flapping inside the tolerance band ----------------------------------------------------------------------


def test_steady_load_inside_the_band_changes_at_most_once() -> None:
    """A steady load the fleet can carry, but not with one engine fewer, settles after one change and stays."""
    # 3 x 8000: TTFT 94 ms < 200 and 3 -> 2 is safe (134 - 12 = 122 < 150.4); 2 x 12000: TTFT 134 ms < 200 and
    # 2 -> 1 is refused (258 - 12 = 246 >= 150.4): the band is 2 engines, reached after one change.
    records, _ = run_load_ticks(Cluster(expected={P: 3, D: 1}), [burst(24_000)] * 20, make_config())
    counts = expected_counts(records, P)
    assert counts == [3] + [2] * 19
    assert sum(1 for r in records if not r.outcome.decision.is_empty) == 1


def _changes(counts: Sequence[int]) -> list[int]:
    return [b - a for a, b in zip(counts, counts[1:], strict=False) if b != a]


@settings(max_examples=30, deadline=None)
@given(
    queued=st.integers(0, 150_000),
    decode_kv=st.integers(0, 900_000),
    start_prefill=st.integers(1, 6),
    start_decode=st.integers(1, 5),
)
def test_steady_load_never_flaps(queued: int, decode_kv: int, start_prefill: int, start_decode: int) -> None:
    """Under a steady load each pool only moves one way: once it scaled up it never scales down, and back.

    A scale-down needs `TTFT(N-1) - own < (SLA - own) x sensitivity`, which keeps TTFT(N-1) under the SLA, so the
    smaller fleet never wants the engine back; the same holds for ITL with the budget `ITL x sensitivity`.
    """
    cluster = Cluster(expected={P: start_prefill, D: start_decode})
    records, _ = run_load_ticks(cluster, [burst(queued, decode_kv)] * 14, make_config())
    for component in (P, D):
        steps = _changes(expected_counts(records, component))
        assert all(step in (-1, 1) for step in steps)  # one replica per decision
        assert len(set(steps)) <= 1, f"{component.value} flapped: {expected_counts(records, component)}"


# --- the throughput floor ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("next_request", ["engine_average", "traffic_window"])
def test_throughput_floor_blocks_the_scale_down(next_request: str) -> None:
    """With both loops on, the load loop scales an idle fleet down to the throughput loop's floor and no further
    (`scale_down_capped_by_throughput`), whichever next request the estimates add."""
    config = make_config(enable_throughput_scaling=True, load_next_request=next_request)
    # the throughput tick: 1200 req / 60 s = 20 req/s; prefill 20 x 1000 = 20,000 tok/s / 10,000 = 2; decode
    # 20 x 100 = 2,000 tok/s / 1,000 = 2: floors 2 and 2, nothing decided (`set_lower_bound`).
    window = TrafficObservation(duration_s=THROUGHPUT_INTERVAL_S, num_req=1200, isl=1000, osl=100)
    workers = WorkerCounts(ready_prefill=4, ready_decode=3, expected_prefill=4, expected_decode=3)
    throughput = tick(
        TickInputs(now_s=T0, loop=Loop.THROUGHPUT, workers=workers, traffic=window), PlannerState(), config, PERF
    )
    assert throughput.reason is ReasonCode.SET_LOWER_BOUND and throughput.decision.is_empty
    state = throughput.next_state
    assert (state.throughput_lower_bound_prefill, state.throughput_lower_bound_decode) == (2, 2)

    cluster = Cluster(expected={P: 4, D: 3})
    records, _ = run_load_ticks(cluster, [burst(0, 0)] * 6, config, state=state, start_s=T0 + LOAD_INTERVAL_S)
    # idle engines: every consolidation is safe; prefill 4 -> 3 -> 2, decode 3 -> 2, then the floors hold
    assert expected_counts(records, P) == [4, 3, 3, 2, 2, 2]
    assert expected_counts(records, D) == [3, 2, 2, 2, 2, 2]
    capped = ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT
    assert load_decision(records[2].outcome, D).reason is capped  # decode at its floor while prefill still moves
    assert load_decision(records[2].outcome, P).reason is ReasonCode.SCALE_DOWN
    for record in records[4:]:
        assert record.outcome.reason is capped and record.outcome.decision.is_empty
        for component in (P, D):
            [floor] = steps_named(record.outcome, "throughput_floor", component)
            assert (floor.reason, floor.value) == (capped, 2)
            assert load_decision(record.outcome, component).value == 2
    [next_decode] = steps_named(records[0].outcome, "next_request", D)
    if next_request == "traffic_window":
        # the window's request shape: the next decode request holds 1000 + 100/2 = 1050 tokens
        assert next_decode.reason is ReasonCode.NEXT_REQUEST_TRAFFIC_WINDOW and next_decode.value == 1050
    else:
        # Dynamo's: the decode engines' own KV tokens per decode request, not the window's shape
        assert next_decode.reason is ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE and next_decode.value != 1050
    assert f"+ next {next_decode.value:.0f}," in steps_named(records[0].outcome, "itl_estimate", D)[0].detail


# --- online models warm up from the engines' metrics -------------------------------------------------------------


# Engines slower than the profile said: prefill 1 ms + 0.02 ms/token; decode 4 ms + 0.02 ms/request + 0.0002 ms/KV.
SLOW_TRUTH = LinearForwardPass(
    prefill_base_s=1 * MS,
    prefill_per_token_s=0.02 * MS,
    decode_base_s=4 * MS,
    decode_per_request_s=0.02 * MS,
    decode_per_kv_token_s=0.0002 * MS,
)


def test_online_models_warm_up_and_replace_the_bootstrap() -> None:
    """Each load tick feeds the engines' metrics to the online regressions; once one has `load_min_observations`
    (5) samples with spread it is ready and answers instead of the bootstrap (profile) model."""
    cluster = Cluster(expected={P: 1, D: 1}, truth=SLOW_TRUTH)
    records, state = run_load_ticks(cluster, [burst(3000)] * 7, make_config())
    readiness = [steps_named(r.outcome, "perf_model_prefill", P)[0] for r in records]
    insufficient, ready = ReasonCode.INSUFFICIENT_DATA, ReasonCode.PERF_MODEL_READY
    assert [s.reason for s in readiness] == [insufficient] * 4 + [ready] * 3
    assert [s.value for s in readiness] == [1, 2, 3, 4, 5, 6, 7]  # one sample per engine and tick
    assert "1 samples < load_min_observations 5" in readiness[0].detail
    chosen = [steps_named(r.outcome, "forward_pass_model", P)[0].reason for r in records]
    assert chosen == [ReasonCode.PERF_MODEL_BOOTSTRAP] * 4 + [ready] * 3
    # 3000 queued + 1000 next = 4000 tokens: bootstrap 2 + 40 = 42 ms; the engines' own 1 + 80 = 81 ms
    ttft = [steps_named(r.outcome, "ttft_estimate", P)[0].value for r in records]
    assert ttft == pytest.approx([42.0] * 4 + [81.0] * 3)
    assert state.perf_models.prefill.readiness is ModelReadiness.READY
    assert state.perf_models.prefill.coefficients == pytest.approx((0.02 * MS,))
    # the decode regression (requests and KV) warms up the same way, from the decode engine's reports
    decode_chosen = [steps_named(r.outcome, "forward_pass_model", D)[0].reason for r in records]
    assert decode_chosen == [ReasonCode.PERF_MODEL_BOOTSTRAP] * 4 + [ready] * 3
    assert state.perf_models.decode.coefficients == pytest.approx((0.02 * MS, 0.0002 * MS))


def test_without_a_bootstrap_model_the_pool_holds_until_the_online_model_is_ready() -> None:
    """No profile: `insufficient_data` (the current count) until the engines taught the online model, then it
    decides."""
    cluster = Cluster(expected={P: 1, D: 1})
    records, _ = run_load_ticks(cluster, [burst(60_000)] * 6, make_config(), perf=LoadPerf(forward=None))
    prefill = [load_decision(r.outcome, P).reason for r in records[:5]]
    assert prefill == [ReasonCode.INSUFFICIENT_DATA] * 4 + [ReasonCode.SCALE_UP]  # 626 ms at the 5th sample
    assert [steps_named(r.outcome, "forward_pass_model", P)[0].reason for r in records[:5]] == [
        ReasonCode.INSUFFICIENT_DATA
    ] * 4 + [ReasonCode.PERF_MODEL_READY]
    assert records[0].outcome.reason is ReasonCode.INSUFFICIENT_DATA and records[0].outcome.decision.is_empty


def test_decode_estimate_counts_the_next_request_without_traffic() -> None:
    """With the load loop alone (no traffic window), the next decode request holds the engines' moving average of
    KV tokens per decode request, so the ITL estimate still includes it."""
    records, _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(0, 10_000)], make_config())
    [itl] = steps_named(records[0].outcome, "itl_estimate", D)
    # first report: 9 requests, 10000 + 500 x 2 = 11000 KV tokens -> context 11000 / 9 = 1222.2 per request;
    # ITL = 5 + 0.01 x (9 + 1) + 0.0001 x ceil(11000 + 1222.2) = 5 + 0.1 + 1.2223 = 6.3223 ms
    assert itl.value == pytest.approx(6.3223)
    assert "+ next 1222" in itl.detail


# --- aggregated mode -----------------------------------------------------------------------------------------------

# Aggregated engines whose mixed iterations the agg regression (prompt tokens, KV tokens) describes exactly: no
# per-request decode cost, prompts at 0.002 ms/token (a 1000-token prompt adds 2 ms to an iteration).
AGG_ENGINE = LinearForwardPass(decode_per_request_s=0.0, prefill_per_token_s=0.002 * MS)


def agg_load(queued_prefill_tokens: int, decode_requests: int, decode_kv_tokens: int) -> dict[Component, PoolLoad]:
    return {
        D: PoolLoad(
            queued_prefill_tokens=queued_prefill_tokens,
            decode_requests=decode_requests,
            decode_kv_tokens=decode_kv_tokens,
        )
    }


def test_aggregated_pool_combines_the_ttft_and_itl_signals() -> None:
    """One pool serving both phases: up when either signal wants up, down only when both allow it."""
    cluster = Cluster(expected={D: 1}, truth=AGG_ENGINE, aggregated=True)
    loads = (
        [agg_load(200_000, 20, 40_000)] * 6  # a prompt burst: the TTFT signal asks for engines
        + [agg_load(0, 30, 360_000)] * 3  # long decodes: TTFT would allow one fewer, the KV budget does not
        + [agg_load(0, 4, 4_000)] * 6  # quiet: both allow one fewer
    )
    records, state = run_load_ticks(cluster, loads, make_config(mode="agg"), perf=LoadPerf(forward=AGG_ENGINE))
    assert expected_counts(records, D) == [1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 2, 2, 1, 1, 1]
    assert all(not steps_named(r.outcome, "fleet", P) for r in records)  # the prefill pool is not managed

    def signals(index: int) -> tuple[ReasonCode, ReasonCode, ReasonCode]:
        outcome = records[index].outcome
        return tuple(steps_named(outcome, name, D)[0].reason for name in ("ttft_signal", "itl_signal", "agg_signal"))

    up, down = ReasonCode.SCALE_UP, ReasonCode.SCALE_DOWN
    refused = ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION
    # 200,000 queued prompt tokens on 2 engines (TTFT ~294 ms) while the ITL side could not lose an engine: up
    assert signals(2) == (up, refused, up)
    # 120,000 KV tokens per engine: ITL 17-22 ms (not every engine over 20: no scale-up); x 3/2 is over 16 ms
    assert signals(7) == (down, refused, refused)
    assert records[7].outcome.reason is refused and records[7].outcome.decision.is_empty
    assert signals(9) == (down, down, down)
    assert records[9].outcome.decision == ScalingDecision(num_prefill=None, num_decode=2)
    # the agg regression warmed up from the engines' mixed iterations
    assert state.perf_models.agg.readiness is ModelReadiness.READY
    assert state.perf_models.agg.coefficients == pytest.approx((0.002 * MS, 0.0001 * MS))
    assert steps_named(records[-1].outcome, "perf_model_agg", D)[0].reason is ReasonCode.PERF_MODEL_READY


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        # the prompt burst scales the pool; only its own scale holds the tick after
        ("per_engine", [ReasonCode.SCALE, ReasonCode.SCALING_IN_PROGRESS, ReasonCode.SCALE]),
        # the 2025 planner samples on (KV 0.02 < 0.5 would scale down, but 1 is the minimum)
        ("threshold_2025", [ReasonCode.INTERVAL_COLLECTING, ReasonCode.NO_CHANGE, ReasonCode.NO_CHANGE]),
    ],
)
def test_a_pool_the_planner_does_not_manage_never_holds_it(policy: str, want: list[ReasonCode]) -> None:
    """An aggregated (or single-pool) planner is held only by its own pool's scale: the prefill counts it sees
    belong to someone else (the virtual connector reports -1 expected for a pool no decision ever named)."""
    config = make_config(mode="agg", load_policy=policy, threshold_2025_adjustment_interval_seconds=LOAD_INTERVAL_S)
    cluster = Cluster(expected={P: -1, D: 1}, ready={P: 1, D: 1}, truth=AGG_ENGINE, aggregated=True)
    loads = [agg_load(200_000, 20, 40_000)] * 3
    records, _ = run_load_ticks(cluster, loads, config, perf=LoadPerf(forward=AGG_ENGINE))
    assert reasons_of(records) == want
    for step in (s for r in records for s in steps_named(r.outcome, "fleet")):
        assert "prefill" not in step.detail  # only the managed pool is looked at


# --- threshold targets and the 2025 threshold planner ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdScenario:
    id: str
    overrides: Mapping[str, Any]
    start: int
    queued: list[int]  # total queued prompt tokens of the prefill pool, per tick
    want: list[int]  # expected prefill counts seen by each tick


CONTEXT_10K = {"prefill_engine": {"context_length": 10_000}}
THRESHOLD_SCENARIOS = [
    # latency: up when any engine's queue >= 0.1 context (1000 tokens), down only when every queue is empty.
    # 5000 queued: 1 x 5000, 2 x 2500, 3 x 1667, 4 x 1250, 5 x 1000 are all >= 1000 -> up; 6 x 834 stays.
    # Then empty queues: 0 x 6/5 = 0 < 0.1, one down per decision.
    ThresholdScenario(
        id="latency-burst-then-idle",
        overrides={"optimization_target": "latency", **CONTEXT_10K},
        start=1,
        queued=[5000] * 12 + [0] * 5,
        want=[1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 6, 5, 5, 4, 4],
    ),
    # throughput: up at >= 1.0 context (10,000 tokens): 1 x 25000, 2 x 12500 -> up; 3 x 8334 is inside the band
    # (down needs < 0.1, i.e. < 1000 tokens).
    ThresholdScenario(
        id="throughput-band",
        overrides={"optimization_target": "throughput", **CONTEXT_10K},
        start=1,
        queued=[25_000] * 8,
        want=[1, 2, 2, 3, 3, 3, 3, 3],
    ),
    # load: up at >= 1500 queued tokens, down at <= 1000. 2 x 1000 are all under, but one engine would carry
    # 1000 x 2/1 = 2000 >= 1500 and be over at once: refused (anti-oscillation), on every tick.
    ThresholdScenario(
        id="load-anti-oscillation",
        overrides={
            "optimization_target": "load",
            "prefill_scale_up_queue_tokens": 1500,
            "prefill_scale_down_queue_tokens": 1000,
            "decode_scale_up_kv_rate": 80,
            "decode_scale_down_kv_rate": 20,
        },
        start=2,
        queued=[2000] * 6,
        want=[2] * 6,
    ),
]


@pytest.mark.parametrize("case", THRESHOLD_SCENARIOS, ids=lambda case: case.id)
def test_threshold_targets_scale_one_step_per_tick(case: ThresholdScenario) -> None:
    """The per-engine threshold targets run in the same load tick: +/-1 per decision, the pending guard in between,
    and no oscillation inside the band."""
    config = make_config(**case.overrides)
    assert config.load_scaling_active and not config.throughput_scaling_active  # easy targets: load loop only
    records, _ = run_load_ticks(Cluster(expected={P: case.start, D: 1}), [burst(q) for q in case.queued], config)
    assert expected_counts(records, P) == case.want
    for record in records:
        if record.workers.scaling_in_progress:
            assert record.outcome.reason is ReasonCode.SCALING_IN_PROGRESS
        else:
            assert steps_named(record.outcome, "engine_load", P)  # every engine's value is recorded
            assert not steps_named(record.outcome, "ttft_estimate")  # no SLA model on these targets
    if case.id == "load-anti-oscillation":
        assert {r.outcome.reason for r in records} == {ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION}


def test_threshold_2025_planner_through_the_tick() -> None:
    """`load_policy: threshold_2025`: every load tick is a sample, each adjustment interval ends in at most one
    step per pool, and sampling pauses while a scale is in flight."""
    config = make_config(
        load_policy="threshold_2025",
        threshold_2025_adjustment_interval_seconds=15,
        decode_engine={"max_kv_tokens": 100_000},
    )
    busy = {P: PoolLoad(queued_prefill_requests=12), D: PoolLoad(decode_kv_tokens=120_000)}
    quiet = {P: PoolLoad(), D: PoolLoad(decode_kv_tokens=120_000)}
    records, state = run_load_ticks(Cluster(expected={P: 1, D: 2}), [busy] * 10 + [quiet] * 6, config)
    # samples at t = 0, 5, 10; at t = 15 the interval (15 s) is over: mean queue 12 > 5.0 and the flat trend
    # 12 + (12 - 12) x 3 = 12 > 5.0 -> one more prefill worker. Decode KV: 60,000 (+ up to 2000) / 100,000 per
    # engine, between 0.5 and 0.9: unchanged. A new interval starts once the new worker is ready.
    collecting, held = ReasonCode.INTERVAL_COLLECTING, ReasonCode.SCALING_IN_PROGRESS
    scale = ReasonCode.SCALE
    assert reasons_of(records) == [collecting] * 3 + [scale, held] + [collecting] * 3 + [scale, held] + [
        collecting
    ] * 3 + [scale, held, collecting]
    assert expected_counts(records, P) == [1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 2, 2]
    assert expected_counts(records, D) == [2] * 16
    [average] = steps_named(records[3].outcome, "interval_average", P)
    assert average.value == 12.0 and "mean of 4 samples" in average.detail
    # the quiet interval: mean queue 0 < 0.2 -> one prefill worker fewer
    assert load_decision(records[13].outcome, P).reason is ReasonCode.SCALE_DOWN
    assert state.threshold_planner.interval_start_s == T0 + 15 * LOAD_INTERVAL_S  # the fresh interval


# --- advisory -----------------------------------------------------------------------------------------------------


def test_advisory_load_loop_computes_and_records_but_never_executes() -> None:
    """Advisory mode: the same steps and targets, the decision flagged advisory; the orchestrator never acts on it,
    so the burst is proposed again on every tick (no scale is ever in flight)."""
    advisory_config = make_config(advisory=True)
    records, _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(60_000)] * 4, advisory_config)
    for record in records:
        assert record.workers == WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
        assert record.outcome.decision == ScalingDecision(num_prefill=2, num_decode=1, advisory=True)
        assert record.outcome.reason is ReasonCode.SCALE
        execute = record.outcome.steps[-1]
        assert (execute.step, execute.reason) == ("execute", ReasonCode.ADVISORY)
        assert execute.detail == "advisory mode, not executed: prefill 1 -> 2, decode 1 -> 1"
    [normal], _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(60_000)], make_config())
    assert records[0].outcome.steps[:-1] == normal.outcome.steps[:-1]  # computed exactly as for real
    assert records[0].outcome.proposals == normal.outcome.proposals
    assert records[0].outcome.next_state == normal.outcome.next_state


# --- user plugins beside the builtin load plugin -----------------------------------------------------------------


def fixed_plugin(plugin_id: str, phase: Phase, *overrides: ReplicaOverride, priority: int = 100) -> FunctionPlugin:
    """A user plugin that always returns `overrides`."""
    return FunctionPlugin(
        PluginSpec(plugin_id=plugin_id, phase=phase, priority=priority),
        lambda _context: PluginResult(overrides=overrides),
    )


def test_reject_in_reconcile_vetoes_the_load_loop() -> None:
    """A RECONCILE plugin's REJECT stops the tick after the builtin load plugin decided: nothing is executed, the
    builtin's decision stays on record, and the fleet never grows."""
    freeze = fixed_plugin(
        "change_freeze", Phase.RECONCILE, ReplicaOverride(component=None, kind=OverrideType.REJECT, reason="freeze")
    )
    records, _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(60_000)] * 3, make_config(), plugins=[freeze])
    for record in records:
        outcome = record.outcome
        assert outcome.reason is ReasonCode.SKIP_SHORT_CIRCUIT
        assert outcome.decision.is_empty and outcome.proposals == ()
        assert decide_step(outcome).reason is ReasonCode.SCALE_UP  # what the load loop wanted
        assert [s.reason for s in steps_named(outcome, "propose:builtin_load_propose")] == [
            ReasonCode.PLUGIN_OVERRIDES,
            ReasonCode.OVERRIDE_SET,
            ReasonCode.OVERRIDE_SET,
        ]
        assert steps_named(outcome, "execute")[0].detail == "rejected by change_freeze (priority 100): freeze"
    assert expected_counts(records, P) == [1, 1, 1]


def test_user_floor_beats_user_ceiling_over_the_load_proposal() -> None:
    """In PROPOSE, the builtin's SET 2 (priority 10) is the recommendation; a floor of 5 and a ceiling of 3 from
    user plugins conflict and the floor wins: max(5, min(3, 2)) = 5."""
    floor = fixed_plugin("floor", Phase.PROPOSE, ReplicaOverride(component=P, kind=OverrideType.AT_LEAST, replicas=5))
    ceiling = fixed_plugin(
        "ceiling", Phase.PROPOSE, ReplicaOverride(component=P, kind=OverrideType.AT_MOST, replicas=3)
    )
    [record], _ = run_load_ticks(
        Cluster(expected={P: 1, D: 1}), [burst(60_000)], make_config(), plugins=[ceiling, floor]
    )
    outcome = record.outcome
    assert outcome.decision == ScalingDecision(num_prefill=5, num_decode=1)
    assert outcome.reason is ReasonCode.SCALE
    [merged] = steps_named(outcome, "propose:merge", P)
    assert (merged.reason, merged.value) == (ReasonCode.MERGE_FLOOR_OVER_CEILING, 5.0)
    assert load_decision(outcome, P).value == 2  # the load loop's own step of one


def test_user_floor_holds_back_the_load_loops_scale_down() -> None:
    """A CONSTRAIN floor at the current count turns the load loop's scale-down into no change."""
    floor = fixed_plugin(
        "keep_four", Phase.CONSTRAIN, ReplicaOverride(component=P, kind=OverrideType.AT_LEAST, replicas=4)
    )
    [record], _ = run_load_ticks(Cluster(expected={P: 4, D: 1}), [burst(0)], make_config(), plugins=[floor])
    assert load_decision(record.outcome, P).reason is ReasonCode.SCALE_DOWN
    assert record.outcome.decision.is_empty
    assert record.outcome.reason is ReasonCode.NO_CHANGE  # the builtin wanted a change the plugins took back


def test_a_raising_user_plugin_never_takes_the_load_tick_down() -> None:
    """A user plugin that raises is recorded and skipped; the load loop's decision still goes through."""

    def broken(_context: object) -> PluginResult:
        raise RuntimeError("capacity service unreachable")

    plugin = FunctionPlugin(PluginSpec(plugin_id="broken", phase=Phase.CONSTRAIN), broken)
    [record], _ = run_load_ticks(Cluster(expected={P: 1, D: 1}), [burst(60_000)], make_config(), plugins=[plugin])
    assert record.outcome.decision == ScalingDecision(num_prefill=2, num_decode=1)
    [failed] = steps_named(record.outcome, "constrain:broken")
    assert failed.reason is ReasonCode.PLUGIN_RAISED
    assert failed.detail == "RuntimeError: capacity service unreachable; retried next tick"
