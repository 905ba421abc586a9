"""Tests of the SLA load proposer `planner_core.policy.load` and the shared fleet checks (pure, no database).

Every timing comes from `LinearForwardPass`, a tiny forward-pass model defined here (a value implementing the
`ForwardPassModel` protocol, not a mock) whose answers can be worked out by hand:

- prefill iteration: 2 ms + 0.01 ms per prompt token (a full 8192-token chunk: 2 + 81.92 = 83.92 ms);
- decode iteration: 5 ms + 0.0001 ms per KV token (100,000 KV tokens: 15 ms), independent of the request count;
- mixed (aggregated) iteration: 5 ms + 0.01 ms per prompt token + 0.0001 ms per KV token.

Unless a case says otherwise: TTFT 200 ms, ITL 20 ms, sensitivity 0.8, ISL 1000, OSL 200 (the next decode request
holds 1000 + 200/2 = 1100 KV tokens), no KV hit rate, 8192 batched tokens, 1,000,000 KV tokens per engine, one DP
rank per worker, no throughput floor, minimum endpoint 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    QueuedRequests,
    ReasonCode,
    ScheduledRequests,
    StepRecord,
    WorkerCounts,
)
from planner_core.policy.fleet import combine_headlines, finalize_load_proposal, latest_per_engine, observe_fleet
from planner_core.policy.load import (
    LoadRuntime,
    LoadSlaTargets,
    SlaLoadInputs,
    calculate_load_replicas,
    estimate_agg_ttft_s,
    estimate_decode_itl_s,
    estimate_prefill_ttft_s,
    prefill_compute_fraction,
)

MS = 1e-3


@dataclass(frozen=True, slots=True)
class LinearForwardPass:
    """Forward-pass wall times linear in the batch (seconds); see the module docstring."""

    prefill_base_s: float = 2 * MS
    prefill_per_token_s: float = 0.01 * MS
    decode_base_s: float = 5 * MS
    decode_per_kv_token_s: float = 0.0001 * MS
    ready: bool = True

    def is_ready(self) -> bool:
        return self.ready

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * prefill_tokens

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:  # noqa: ARG002 (shape)
        return self.decode_base_s + self.decode_per_kv_token_s * decode_kv_tokens

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.decode_wall_s(num_decode_requests, decode_kv_tokens) + self.prefill_per_token_s * prefill_tokens


MODEL = LinearForwardPass()
TARGETS = LoadSlaTargets(ttft_ms=200.0, itl_ms=20.0, down_sensitivity=0.8)
RUNTIME = LoadRuntime(avg_isl=1000.0, avg_osl=200.0)
LIMITS = EngineLimits(max_num_batched_tokens=8192, max_kv_tokens=1_000_000)


def engine(
    component: Component,
    worker: str,
    *,
    queued_prefill: int = 0,
    queued_prefill_requests: int = 0,
    decode_kv: int = 0,
    decode_requests: int = 0,
    queued_decode_kv: int = 0,
    scheduled_prefill: int = 0,
    dp_rank: int = 0,
    counter: int = 1,
) -> ForwardPassMetrics:
    """One engine rank's latest forward-pass metrics."""
    return ForwardPassMetrics(
        component=component,
        worker_id=worker,
        dp_rank=dp_rank,
        counter_id=counter,
        wall_time_s=0.01,
        scheduled=ScheduledRequests(
            num_decode_requests=decode_requests, sum_decode_kv_tokens=decode_kv, sum_prefill_tokens=scheduled_prefill
        ),
        queued=QueuedRequests(
            sum_prefill_tokens=queued_prefill,
            num_prefill_requests=queued_prefill_requests,
            sum_decode_kv_tokens=queued_decode_kv,
        ),
    )


def prefill_fleet(queued: Sequence[int]) -> tuple[ForwardPassMetrics, ...]:
    return tuple(engine(Component.PREFILL, f"p{i}", queued_prefill=q) for i, q in enumerate(queued))


def decode_fleet(kv: Sequence[int], *, queued_kv: int = 0) -> tuple[ForwardPassMetrics, ...]:
    return tuple(
        engine(Component.DECODE, f"d{i}", decode_kv=k, decode_requests=10, queued_decode_kv=queued_kv)
        for i, k in enumerate(kv)
    )


def stable(component: Component, n: int, other: int = 1) -> WorkerCounts:
    """N ready and expected workers in `component`'s pool, `other` in the other pool."""
    p, d = (n, other) if component is Component.PREFILL else (other, n)
    return WorkerCounts(ready_prefill=p, ready_decode=d, expected_prefill=p, expected_decode=d)


def inputs(
    component: Component,
    fpm: tuple[ForwardPassMetrics, ...],
    *,
    n: int | None = None,
    aggregated: bool = False,
    **changes: object,
) -> SlaLoadInputs:
    base = SlaLoadInputs(
        component=component,
        aggregated=aggregated,
        fpm=fpm,
        workers=stable(component, len(fpm) if n is None else n),
        limits=LIMITS,
        targets=TARGETS,
        runtime=RUNTIME,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def headline(steps: tuple[StepRecord, ...]) -> ReasonCode:
    return steps[-1].reason


def by_step(steps: tuple[StepRecord, ...], name: str) -> list[StepRecord]:
    return [s for s in steps if s.step == name]


# --- estimates -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimateCase:
    id: str
    queued: int
    want_ms: float
    hit: float | None = None
    queue_scale: float = 1.0
    mbt: int = 8192


PREFILL_ESTIMATE_CASES = [
    # 0 + 1000 tokens, one iteration: 2 + 10 = 12 ms
    EstimateCase(id="next-request-only", queued=0, want_ms=12.0),
    # 20000 + 1000 = 21000 tokens: 8192 + 8192 + 4616 -> 3 iterations: 3 x 2 + 210 = 216 ms
    EstimateCase(id="chunked-queue", queued=20_000, want_ms=216.0),
    # exactly one chunk: 7192 + 1000 = 8192 -> 2 + 81.92 = 83.92 ms; one more token needs a second iteration
    EstimateCase(id="exactly-one-chunk", queued=7192, want_ms=83.92),
    EstimateCase(id="one-token-over-a-chunk", queued=7193, want_ms=85.93),
    # queue ignored: the next request alone, 12 ms
    EstimateCase(id="queue-scale-zero", queued=20_000, queue_scale=0.0, want_ms=12.0),
    # 20000 x 2 + 1000 = 41000 tokens -> 6 iterations (5 full + 40): 12 + 410 = 422 ms
    EstimateCase(id="queue-doubled", queued=20_000, queue_scale=2.0, want_ms=422.0),
    # hit 0.5: 21000 x 0.5 = 10500 tokens -> 2 iterations: 4 + 105 = 109 ms
    EstimateCase(id="half-cached", queued=20_000, hit=0.5, want_ms=109.0),
    # hit 0.99 clamped to 0.95: 21000 x 0.05 = 1050 tokens -> 2 + 10.5 = 12.5 ms
    EstimateCase(id="hit-rate-clamped", queued=20_000, hit=0.99, want_ms=12.5),
    # negative hit rate clamped to 0: 21000 tokens as without discount
    EstimateCase(id="negative-hit-rate", queued=20_000, hit=-0.3, want_ms=216.0),
    # chunks of 1000: 21 iterations: 42 + 210 = 252 ms
    EstimateCase(id="small-batch-budget", queued=20_000, mbt=1000, want_ms=252.0),
]


@pytest.mark.parametrize("case", PREFILL_ESTIMATE_CASES, ids=lambda c: c.id)
def test_prefill_ttft_estimate(case: EstimateCase) -> None:
    """TTFT = queue x scale + one ISL, discounted by the clamped hit rate, in chunks of the batch budget."""
    fpm = engine(Component.PREFILL, "p0", queued_prefill=case.queued)
    got_s = estimate_prefill_ttft_s(
        MODEL, fpm, max_num_batched_tokens=case.mbt, avg_isl=1000, kv_hit_rate=case.hit, queue_scale=case.queue_scale
    )
    assert got_s * 1000 == pytest.approx(case.want_ms)


def test_decode_itl_estimate_counts_queue_next_request_and_accept_length() -> None:
    """ITL = decode(scheduled + queued + next) / accept length; the next request holds ISL + OSL/2 KV tokens."""
    fpm = engine(Component.DECODE, "d0", decode_kv=100_000, decode_requests=50, queued_decode_kv=20_000)
    # 100000 + 20000 + 1100 = 121100 KV tokens: 5 + 12.11 = 17.11 ms
    itl = estimate_decode_itl_s(MODEL, fpm, avg_isl=1000, avg_osl=200, accept_length=1.0)
    assert itl * 1000 == pytest.approx(17.11)
    # accept length 2: 8.555 ms
    assert estimate_decode_itl_s(MODEL, fpm, avg_isl=1000, avg_osl=200, accept_length=2.0) * 1000 == pytest.approx(
        8.555
    )
    # load x 1.5: 180000 + 1100 = 181100 -> 5 + 18.11 = 23.11 ms
    scaled = estimate_decode_itl_s(MODEL, fpm, avg_isl=1000, avg_osl=200, accept_length=1.0, decode_scale=1.5)
    assert scaled * 1000 == pytest.approx(23.11)
    # lengths unknown: no next request, 120000 -> 17 ms
    assert estimate_decode_itl_s(MODEL, fpm, avg_isl=0, avg_osl=0, accept_length=1.0) * 1000 == pytest.approx(17.0)
    # the next request's context given (the engines' moving average, 2000 KV tokens) wins over ISL + OSL/2:
    # 120000 + 2000 = 122000 -> 5 + 12.2 = 17.2 ms
    given = estimate_decode_itl_s(MODEL, fpm, avg_isl=1000, avg_osl=200, accept_length=1.0, next_context=2000)
    assert given * 1000 == pytest.approx(17.2)


def test_agg_ttft_chunks_ride_on_the_decode_batch() -> None:
    """Aggregated TTFT: each chunk is a mixed iteration; decode requests take their share of the batch budget."""
    fpm = engine(Component.DECODE, "a0", queued_prefill=7100, decode_kv=100_000, decode_requests=192)
    # 8100 prompt tokens in chunks of 8192 - 192 = 8000 (not 8192): 8000 + 100 -> 2 iterations of (5 + 10 ms
    # decode): 2 x 15 + 0.01 x 8100 = 111 ms
    got = estimate_agg_ttft_s(MODEL, fpm, max_num_batched_tokens=8192, avg_isl=1000, kv_hit_rate=None)
    assert got * 1000 == pytest.approx(111.0)


def test_prefill_compute_fraction() -> None:
    """1 - clamp(hit, 0, 0.95); unknown hit rate = no discount."""
    assert [prefill_compute_fraction(h) for h in (None, 0.0, 0.4, 0.95, 1.0, -1.0)] == pytest.approx(
        [1.0, 1.0, 0.6, 0.05, 0.05, 1.0]
    )


# --- preconditions ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldCase:
    id: str
    fpm: tuple[ForwardPassMetrics, ...]
    workers: WorkerCounts
    want_reason: ReasonCode
    want: int
    model: LinearForwardPass = MODEL


IDLE2 = prefill_fleet([0, 0])
HOLD_CASES = [
    HoldCase(
        id="scale-in-flight-returns-expected",
        fpm=IDLE2,
        workers=WorkerCounts(ready_prefill=2, ready_decode=1, expected_prefill=3, expected_decode=1),
        want_reason=ReasonCode.SCALING_IN_PROGRESS,
        want=3,
    ),
    HoldCase(
        # the other pool's scale holds this one too (as Dynamo does for disaggregated deployments)
        id="other-pool-in-flight",
        fpm=IDLE2,
        workers=WorkerCounts(ready_prefill=2, ready_decode=1, expected_prefill=2, expected_decode=2),
        want_reason=ReasonCode.SCALING_IN_PROGRESS,
        want=2,
    ),
    HoldCase(
        id="in-flight-wins-over-no-data",
        fpm=(),
        workers=WorkerCounts(ready_prefill=2, ready_decode=1, expected_prefill=1, expected_decode=1),
        want_reason=ReasonCode.SCALING_IN_PROGRESS,
        want=1,
    ),
    HoldCase(id="no-metrics", fpm=(), workers=stable(Component.PREFILL, 2), want_reason=ReasonCode.NO_FPM_DATA, want=2),
    HoldCase(
        id="only-decode-metrics",
        fpm=decode_fleet([0]),
        workers=stable(Component.PREFILL, 2),
        want_reason=ReasonCode.NO_FPM_DATA,
        want=2,
    ),
    HoldCase(
        id="no-data-wins-over-model-not-ready",
        fpm=(),
        workers=stable(Component.PREFILL, 2),
        want_reason=ReasonCode.NO_FPM_DATA,
        want=2,
        model=LinearForwardPass(ready=False),
    ),
    HoldCase(
        id="fewer-reporting-than-ready",
        fpm=prefill_fleet([0]),
        workers=stable(Component.PREFILL, 2),
        want_reason=ReasonCode.WORKER_COUNT_MISMATCH,
        want=2,
    ),
    HoldCase(
        id="more-reporting-than-ready",
        fpm=prefill_fleet([0, 0, 0]),
        workers=stable(Component.PREFILL, 2),
        want_reason=ReasonCode.WORKER_COUNT_MISMATCH,
        want=2,
    ),
    HoldCase(
        id="uneven-dp-ranks",
        fpm=(
            engine(Component.PREFILL, "p0", dp_rank=0),
            engine(Component.PREFILL, "p0", dp_rank=1),
            engine(Component.PREFILL, "p1", dp_rank=0),
        ),
        workers=stable(Component.PREFILL, 2),
        want_reason=ReasonCode.WORKER_COUNT_MISMATCH,
        want=2,
    ),
    HoldCase(
        id="mismatch-wins-over-model-not-ready",
        fpm=prefill_fleet([0]),
        workers=stable(Component.PREFILL, 2),
        want_reason=ReasonCode.WORKER_COUNT_MISMATCH,
        want=2,
        model=LinearForwardPass(ready=False),
    ),
]


@pytest.mark.parametrize("case", HOLD_CASES, ids=lambda c: c.id)
def test_preconditions_hold_in_order(case: HoldCase) -> None:
    """Scale in flight, then no metrics, then worker count mismatch: each holds at the expected count, one step."""
    desired, steps = calculate_load_replicas(inputs(Component.PREFILL, case.fpm, workers=case.workers), case.model)
    assert desired == case.want
    assert [s.reason for s in steps] == [case.want_reason]


def test_model_not_ready_holds_but_keeps_the_floors() -> None:
    """Model not ready: `insufficient_data` at the current count, still raised to the throughput floor."""
    not_ready = LinearForwardPass(ready=False)
    desired, steps = calculate_load_replicas(inputs(Component.PREFILL, IDLE2), not_ready)
    assert (desired, headline(steps)) == (2, ReasonCode.INSUFFICIENT_DATA)
    desired, steps = calculate_load_replicas(inputs(Component.PREFILL, IDLE2, throughput_lower_bound=4), not_ready)
    assert desired == 4 and headline(steps) is ReasonCode.SCALE_UP  # the floor, not the load signal, lifts it
    assert by_step(steps, "throughput_floor")[0].reason is ReasonCode.RAISED_TO_THROUGHPUT_FLOOR


@pytest.mark.parametrize(
    ("managed", "want_reason"),
    [
        ((Component.PREFILL, Component.DECODE), ReasonCode.SCALING_IN_PROGRESS),  # disagg: either pool holds both
        ((Component.DECODE,), ReasonCode.SCALE_DOWN),  # decode-only or aggregated: the prefill pool is someone else's
    ],
)
def test_only_managed_pools_hold_the_loop(managed: tuple[Component, ...], want_reason: ReasonCode) -> None:
    """A prefill scale in flight (1 of 2 ready) holds the decode pool only when this planner manages prefill too."""
    workers = WorkerCounts(ready_prefill=1, ready_decode=2, expected_prefill=2, expected_decode=2)
    fleet = decode_fleet([0, 0])
    desired, steps = calculate_load_replicas(inputs(Component.DECODE, fleet, workers=workers, managed=managed), MODEL)
    assert steps[-1].reason is want_reason
    assert desired == (2 if want_reason is ReasonCode.SCALING_IN_PROGRESS else 1)


def test_idle_heartbeats_count_as_reports() -> None:
    """An idle engine (wall time 0) still reports its empty queue, so an idle fleet can scale down."""
    idle = tuple(dataclasses.replace(f, wall_time_s=0.0) for f in IDLE2)
    desired, steps = calculate_load_replicas(inputs(Component.PREFILL, idle), MODEL)
    assert (desired, headline(steps)) == (1, ReasonCode.SCALE_DOWN)


def test_latest_report_per_rank_wins() -> None:
    """Two reports of one (worker, rank): the higher counter is used, whatever the order."""
    old = engine(Component.PREFILL, "p0", queued_prefill=50_000, counter=7)
    new = engine(Component.PREFILL, "p0", queued_prefill=0, counter=8)
    for fpm in ((old, new), (new, old)):
        engines = latest_per_engine(Component.PREFILL, fpm)
        assert [e.ranks[0].counter_id for e in engines] == [8]
    fleet, step = observe_fleet(Component.PREFILL, (old, new), stable(Component.PREFILL, 1))
    assert fleet is not None and step.reason is ReasonCode.OBSERVED


# --- prefill ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadCase:
    id: str
    fpm: tuple[ForwardPassMetrics, ...]
    want: int
    want_reason: ReasonCode
    targets: LoadSlaTargets = TARGETS
    runtime: LoadRuntime = RUNTIME
    limits: EngineLimits = LIMITS
    lower_bound: int | None = None
    min_endpoint: int = 1
    aggregated: bool = False


PREFILL_CASES = [
    # 21000 tokens on each: 216 ms > 200 on both -> 3
    LoadCase(id="all-over-ttft", fpm=prefill_fleet([20_000, 20_000]), want=3, want_reason=ReasonCode.SCALE_UP),
    # 216 ms and 114 ms (11000 tokens: 4 + 110): not all over. Consolidation on p0: own 12 ms, budget
    # (200 - 12) x 0.8 = 150.4 ms, post (41000 tokens) 422 ms -> share 410 >= 150.4: refused
    LoadCase(
        id="one-over-refused",
        fpm=prefill_fleet([20_000, 10_000]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # idle: 12 ms each, post 12 ms, share 0 < 150.4 -> 1
    LoadCase(id="idle-consolidates", fpm=prefill_fleet([0, 0]), want=1, want_reason=ReasonCode.SCALE_DOWN),
    # N=3, 3000 queued each: post queue 4500 + 1000 = 5500 tokens -> 57 ms, share 45 < 150.4 -> 2
    LoadCase(id="light-queue-three-to-two", fpm=prefill_fleet([3000] * 3), want=2, want_reason=ReasonCode.SCALE_DOWN),
    # share = post - own with post = 2 iterations of (2q + 1000) tokens: q=7419 -> 4 + 158.38 - 12 = 150.38 < 150.4
    LoadCase(id="share-just-under-budget", fpm=prefill_fleet([7419, 7419]), want=1, want_reason=ReasonCode.SCALE_DOWN),
    # q=7421 -> 4 + 158.42 - 12 = 150.42 >= 150.4: refused
    LoadCase(
        id="share-just-over-budget",
        fpm=prefill_fleet([7421, 7421]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    LoadCase(
        id="sensitivity-zero-never-scales-down",
        fpm=prefill_fleet([0, 0]),
        targets=dataclasses.replace(TARGETS, down_sensitivity=0.0),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # hit 0.5: estimates 109 ms (no scale-up); post 20500 tokens = 211 ms, own 7 ms: share 204 >= (200-7) x 0.8
    LoadCase(
        id="kv-hits-avoid-scale-up",
        fpm=prefill_fleet([20_000, 20_000]),
        runtime=dataclasses.replace(RUNTIME, kv_hit_rate=0.5),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    LoadCase(id="single-worker-idle", fpm=prefill_fleet([0]), want=1, want_reason=ReasonCode.NO_CHANGE),
    LoadCase(
        id="at-minimum-endpoint", fpm=prefill_fleet([0, 0]), min_endpoint=2, want=2, want_reason=ReasonCode.NO_CHANGE
    ),
    # idle N=3 would go to 2, the throughput floor says 3
    LoadCase(
        id="floor-blocks-scale-down",
        fpm=prefill_fleet([0, 0, 0]),
        lower_bound=3,
        want=3,
        want_reason=ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT,
    ),
    LoadCase(
        id="floor-below-allows-scale-down",
        fpm=prefill_fleet([0, 0, 0]),
        lower_bound=2,
        want=2,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # a floor two above the fleet lifts it in one tick (the throughput loop already rate-limited its bound)
    LoadCase(
        id="floor-lifts-past-one-step",
        fpm=prefill_fleet([0, 0]),
        lower_bound=4,
        want=4,
        want_reason=ReasonCode.SCALE_UP,
    ),
    LoadCase(
        id="no-batch-budget",
        fpm=prefill_fleet([20_000, 20_000]),
        limits=dataclasses.replace(LIMITS, max_num_batched_tokens=0),
        want=2,
        want_reason=ReasonCode.INSUFFICIENT_DATA,
    ),
]


def run(case: LoadCase, component: Component) -> tuple[int, tuple[StepRecord, ...]]:
    request = inputs(
        component,
        case.fpm,
        aggregated=case.aggregated,
        targets=case.targets,
        runtime=case.runtime,
        limits=case.limits,
        throughput_lower_bound=case.lower_bound,
        min_endpoint=case.min_endpoint,
    )
    return calculate_load_replicas(request, MODEL)


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: c.id)
def test_prefill_load_decision(case: LoadCase) -> None:
    """Prefill: up when every TTFT estimate is over; down when every engine can absorb one removed engine."""
    desired, steps = run(case, Component.PREFILL)
    assert (desired, headline(steps)) == (case.want, case.want_reason)


def test_estimate_equal_to_the_target_is_not_over_it() -> None:
    """Scale-up needs every estimate strictly above the target; at the target itself an idle pool has no budget
    left ((target - own) x 0.8 = 0), so it neither scales up nor down."""
    idle_ms = 1000 * estimate_prefill_ttft_s(
        MODEL, IDLE2[0], max_num_batched_tokens=8192, avg_isl=1000, kv_hit_rate=None
    )
    at_target = dataclasses.replace(TARGETS, ttft_ms=idle_ms)  # 12 ms, as the model computes it
    desired, steps = calculate_load_replicas(inputs(Component.PREFILL, IDLE2, targets=at_target), MODEL)
    assert (desired, headline(steps)) == (2, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION)
    busy = prefill_fleet([20_000, 20_000])
    busy_ms = 1000 * estimate_prefill_ttft_s(
        MODEL, busy[0], max_num_batched_tokens=8192, avg_isl=1000, kv_hit_rate=None
    )
    for target_ms, want in ((busy_ms, 2), (busy_ms * (1 - 1e-9), 3)):  # 216 ms at the target / just under it
        request = inputs(Component.PREFILL, busy, targets=dataclasses.replace(TARGETS, ttft_ms=target_ms))
        assert calculate_load_replicas(request, MODEL)[0] == want


def test_prefill_steps_explain_the_decision() -> None:
    """Each engine's estimate and consolidation check is a step with its value in ms."""
    _, steps = run(PREFILL_CASES[1], Component.PREFILL)
    estimates = by_step(steps, "ttft_estimate")
    assert [s.value for s in estimates] == pytest.approx([216.0, 114.0])
    assert all(s.reason is ReasonCode.LATENCY_ESTIMATED for s in estimates)
    [check] = by_step(steps, "consolidation")  # the first refusal ends the checks
    assert check.reason is ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION and check.value == pytest.approx(422.0)
    assert "150.40" in check.detail
    assert [s.step for s in steps][-3:] == ["ttft_signal", "min_endpoint", "load_decision"]


def test_dp_ranks_of_a_worker_use_the_slowest_rank() -> None:
    """A worker with two DP ranks is as slow as its busiest rank: one busy rank on each worker scales up."""
    fpm = (
        engine(Component.PREFILL, "p0", dp_rank=0, queued_prefill=20_000),
        engine(Component.PREFILL, "p0", dp_rank=1),
        engine(Component.PREFILL, "p1", dp_rank=0),
        engine(Component.PREFILL, "p1", dp_rank=1, queued_prefill=20_000),
    )
    desired, steps = calculate_load_replicas(inputs(Component.PREFILL, fpm, n=2), MODEL)
    assert (desired, headline(steps)) == (3, ReasonCode.SCALE_UP)
    assert [s.value for s in by_step(steps, "ttft_estimate")] == pytest.approx([216.0, 216.0])


# --- decode ----------------------------------------------------------------------------------------------------


DECODE_CASES = [
    # 150000 + 1100 KV: 5 + 15.11 = 20.11 ms > 20 on both -> 3
    LoadCase(id="all-over-itl", fpm=decode_fleet([150_000, 150_000]), want=3, want_reason=ReasonCode.SCALE_UP),
    # idle: 5.11 ms; post 5.11 < 20 x 0.8 = 16 -> 1
    LoadCase(id="idle-consolidates", fpm=decode_fleet([0, 0]), want=1, want_reason=ReasonCode.SCALE_DOWN),
    # 60000 each: 11.11 ms; post (120000 + 1100) 17.11 >= 16: refused
    LoadCase(
        id="itl-after-consolidation-too-high",
        fpm=decode_fleet([60_000, 60_000]),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # queued KV counts: 30000 + 30000 queued = 60000 each: as above
    LoadCase(
        id="queued-kv-counts",
        fpm=decode_fleet([30_000, 30_000], queued_kv=30_000),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # N=3: post = 5 + 0.0001 x (1.5k + 1100) < 16 <=> k < 72600
    LoadCase(id="kv-just-under-itl-budget", fpm=decode_fleet([72_599] * 3), want=2, want_reason=ReasonCode.SCALE_DOWN),
    LoadCase(
        id="kv-just-over-itl-budget",
        fpm=decode_fleet([72_601] * 3),
        want=3,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # capacity 100000: 60000 x 2 = 120000 >= 100000 refuses even with an ITL target of 1 s
    LoadCase(
        id="kv-capacity-refuses",
        fpm=decode_fleet([60_000, 60_000]),
        targets=dataclasses.replace(TARGETS, itl_ms=1000.0),
        limits=dataclasses.replace(LIMITS, max_kv_tokens=100_000),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # 49999 x 2 = 99998 < 100000 fits
    LoadCase(
        id="kv-capacity-fits",
        fpm=decode_fleet([49_999, 49_999]),
        targets=dataclasses.replace(TARGETS, itl_ms=1000.0),
        limits=dataclasses.replace(LIMITS, max_kv_tokens=100_000),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
    # speculative decoding, accept 2 (nextn 1): 20.11 / 2 = 10.06 ms, not over; post 35.11 / 2 = 17.56 >= 16
    LoadCase(
        id="accept-length-divides-itl",
        fpm=decode_fleet([150_000, 150_000]),
        runtime=dataclasses.replace(RUNTIME, accept_length=2.0),
        limits=dataclasses.replace(LIMITS, speculative_nextn=1),
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # without speculation (nextn 0) an observed accept length is ignored: 20.11 > 20 -> up
    LoadCase(
        id="accept-length-ignored-without-speculation",
        fpm=decode_fleet([150_000, 150_000]),
        runtime=dataclasses.replace(RUNTIME, accept_length=2.0),
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    LoadCase(
        id="floor-blocks-decode-scale-down",
        fpm=decode_fleet([0, 0]),
        lower_bound=2,
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT,
    ),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: c.id)
def test_decode_load_decision(case: LoadCase) -> None:
    """Decode: up when every ITL estimate is over; down when KV fits and the consolidated ITL is under ITL x sens."""
    desired, steps = run(case, Component.DECODE)
    assert (desired, headline(steps)) == (case.want, case.want_reason)


# --- aggregated ------------------------------------------------------------------------------------------------


def agg_fleet(queued: Sequence[int], kv: Sequence[int], *, queued_requests: int = 0) -> tuple[ForwardPassMetrics, ...]:
    return tuple(
        engine(Component.DECODE, f"a{i}", queued_prefill=q, queued_prefill_requests=queued_requests, decode_kv=k)
        for i, (q, k) in enumerate(zip(queued, kv, strict=True))
    )


AGG_CASES = [
    # TTFT: 21000 tokens in chunks of 8192 (no decode requests) -> 3 mixed iterations of 5 ms + 210 = 225 ms > 200 on
    # both -> up, although ITL (5.11 ms) would allow a scale-down
    LoadCase(
        id="prefill-burst-scales-up",
        fpm=agg_fleet([20_000, 20_000], [0, 0]),
        aggregated=True,
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    # ITL: 150000 + 1100 -> 20.11 ms > 20 on both -> up, although TTFT (5 + 10 = 15 ms) is far below
    LoadCase(
        id="decode-pressure-scales-up",
        fpm=agg_fleet([0, 0], [150_000, 150_000]),
        aggregated=True,
        want=3,
        want_reason=ReasonCode.SCALE_UP,
    ),
    # idle: TTFT own 15, post 15, share 0; ITL post 5.11 < 16: both down -> 1
    LoadCase(
        id="idle-both-down", fpm=agg_fleet([0, 0], [0, 0]), aggregated=True, want=1, want_reason=ReasonCode.SCALE_DOWN
    ),
    # TTFT consolidation: queue 5000 x 2 + 1000 = 11000 tokens -> 2 mixed iterations with decode KV 2 x 50000:
    # own = 5 + 10 + 10 = 25 ms, post = 2 x 15 + 110 = 140 ms, share 115 < (200 - 25) x 0.8 = 140: allowed;
    # ITL: queued prompts count as KV: (50000 + 5000) x 2 + 1100 = 111100 -> 16.11 >= 16: refused -> hold
    # (without the queued prompts: 101100 -> 15.11 < 16 would have allowed 2 -> 1)
    LoadCase(
        id="queued-prompts-count-as-future-kv",
        fpm=agg_fleet([5000, 5000], [50_000, 50_000]),
        aggregated=True,
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # TTFT refused: queue 15000 x 2 + 1000 = 31000 -> 4 iterations: own 15 ms, post 20 + 310 = 330 ms, share 315
    # >= 148; ITL (5.11) allows: the refusal holds the pool
    LoadCase(
        id="ttft-refusal-holds-the-pool",
        fpm=agg_fleet([15_000, 15_000], [0, 0]),
        aggregated=True,
        want=2,
        want_reason=ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION,
    ),
    # no batch budget: no TTFT signal, ITL alone may scale down
    LoadCase(
        id="decode-only-down-without-prefill-signal",
        fpm=agg_fleet([15_000, 15_000], [0, 0]),
        aggregated=True,
        limits=dataclasses.replace(LIMITS, max_num_batched_tokens=0),
        want=1,
        want_reason=ReasonCode.SCALE_DOWN,
    ),
]


@pytest.mark.parametrize("case", AGG_CASES, ids=lambda c: c.id)
def test_agg_load_decision(case: LoadCase) -> None:
    """Aggregated: up if either signal wants up; down only if both do; decode alone when TTFT has no signal."""
    desired, steps = run(case, Component.DECODE)
    assert (desired, headline(steps)) == (case.want, case.want_reason)
    assert len(by_step(steps, "agg_signal")) == 1


# --- multi-tick scenarios --------------------------------------------------------------------------------------


@dataclass(slots=True)
class PrefillPool:
    """A prefill pool whose total queue is spread evenly over its engines; decisions take effect one tick later
    (the tick in between sees the scale in flight)."""

    ready: int
    expected: int
    lower_bound: int | None = None
    history: list[tuple[int, ReasonCode]] = field(default_factory=list)

    def tick(self, total_queued: int) -> None:
        per_engine = total_queued // self.ready
        workers = WorkerCounts(
            ready_prefill=self.ready, ready_decode=1, expected_prefill=self.expected, expected_decode=1
        )
        request = inputs(
            Component.PREFILL,
            prefill_fleet([per_engine] * self.ready),
            workers=workers,
            throughput_lower_bound=self.lower_bound,
        )
        desired, steps = calculate_load_replicas(request, MODEL)
        reason = headline(steps)
        self.history.append((desired, reason))
        if reason is ReasonCode.SCALING_IN_PROGRESS:
            self.ready = self.expected  # the new workers become ready
        else:
            self.expected = desired


def test_burst_scales_up_one_step_per_decision() -> None:
    """A sustained burst of 120000 queued tokens grows the pool by one replica per decision, each followed by one
    held tick while the new worker starts, until the TTFT estimate is under 200 ms."""
    pool = PrefillPool(ready=2, expected=2)
    for _ in range(12):
        pool.tick(total_queued=120_000)
    decisions = [d for d, r in pool.history if r is not ReasonCode.SCALING_IN_PROGRESS]
    # per engine, queue + 1000 tokens: N=2: 61000 tokens (8 iterations) 626 ms; 3: 41000 (6) 422 ms;
    # 4: 31000 (4) 318 ms; 5: 25000 (4) 258 ms; 6: 21000 (3) 216 ms; 7: 18142 (3) 187.42 ms < 200: stop.
    # At 7, one fewer would queue 19999 + 1000 tokens (215.99 ms), share 203.99 >= 150.4: refused.
    assert decisions == [3, 4, 5, 6, 7, 7, 7]
    assert [r for _, r in pool.history[:10]] == [ReasonCode.SCALE_UP, ReasonCode.SCALING_IN_PROGRESS] * 5
    assert pool.history[-1] == (7, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION)


def test_idle_scales_down_to_the_floor_and_stops() -> None:
    """Idle traffic: 4 -> 3 -> 2 (each after the previous one landed), then the throughput floor of 2 holds it."""
    pool = PrefillPool(ready=4, expected=4, lower_bound=2)
    for _ in range(6):
        pool.tick(total_queued=0)
    assert pool.history == [
        (3, ReasonCode.SCALE_DOWN),
        (3, ReasonCode.SCALING_IN_PROGRESS),  # a held pool proposes its expected count: applying it changes nothing
        (2, ReasonCode.SCALE_DOWN),
        (2, ReasonCode.SCALING_IN_PROGRESS),
        (2, ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT),
        (2, ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT),
    ]


def test_moderate_load_is_not_consolidated() -> None:
    """24000 queued tokens on 3 engines: 8000 + 1000 per engine = 2 iterations, 94 ms (under 200 ms). Going to 2
    would queue 12000 + 1000 = 13000 tokens per engine (134 ms): share 122 < 150.4, so 3 -> 2 is safe; on 2 the
    estimate is 134 ms, and going to 1 would mean 24000 + 1000 tokens (4 iterations, 258 ms), share 246 >= 150.4:
    refused. The pool settles at 2 without oscillating."""
    pool = PrefillPool(ready=3, expected=3)
    for _ in range(6):
        pool.tick(total_queued=24_000)
    assert pool.history[:2] == [(2, ReasonCode.SCALE_DOWN), (2, ReasonCode.SCALING_IN_PROGRESS)]
    assert pool.history[2:] == [(2, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION)] * 4


# --- fleet helpers ---------------------------------------------------------------------------------------------


def test_finalize_names_the_headline() -> None:
    """Finalize: floor then minimum endpoint; the headline compares the result with the current count."""
    cases = [
        # (current, signal, reason, floor, min) -> (desired, headline)
        ((3, 4, ReasonCode.SCALE_UP, None, 1), (4, ReasonCode.SCALE_UP)),
        ((3, 2, ReasonCode.SCALE_DOWN, 2, 1), (2, ReasonCode.SCALE_DOWN)),
        ((3, 2, ReasonCode.SCALE_DOWN, 3, 1), (3, ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT)),
        ((3, 2, ReasonCode.SCALE_DOWN, 5, 1), (5, ReasonCode.SCALE_UP)),
        ((3, 3, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION, 1, 1), (3, ReasonCode.SCALE_DOWN_REFUSED_CONSOLIDATION)),
        ((1, 1, ReasonCode.NO_CHANGE, None, 2), (2, ReasonCode.SCALE_UP)),
        ((0, 0, ReasonCode.INSUFFICIENT_DATA, None, 0), (0, ReasonCode.INSUFFICIENT_DATA)),
    ]
    for (current, signal, reason, floor, minimum), want in cases:
        desired, steps = finalize_load_proposal(
            Component.DECODE,
            current=current,
            signal=signal,
            signal_reason=reason,
            lower_bound=floor,
            min_endpoint=minimum,
        )
        assert (desired, steps[-1].reason) == want, (current, signal, reason, floor, minimum)


def test_combined_headline_prefers_the_most_telling() -> None:
    """Several pools: scale_up > capped > scale_down > other reasons > no_change."""
    assert combine_headlines((ReasonCode.SCALE_DOWN, ReasonCode.SCALE_UP)) is ReasonCode.SCALE_UP
    assert (
        combine_headlines((ReasonCode.SCALE_DOWN, ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT))
        is ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT
    )
    assert combine_headlines((ReasonCode.NO_CHANGE, ReasonCode.DECODE_GRACE_PERIOD)) is ReasonCode.DECODE_GRACE_PERIOD
    assert combine_headlines(()) is ReasonCode.NO_CHANGE


# --- properties ------------------------------------------------------------------------------------------------

queues = st.integers(min_value=0, max_value=200_000)
kvs = st.integers(min_value=0, max_value=600_000)


@st.composite
def sla_requests(draw: st.DrawFn) -> SlaLoadInputs:
    """Any stable pool of 1-5 workers with any queues, targets, floors and minimums."""
    component = draw(st.sampled_from(Component))
    aggregated = component is Component.DECODE and draw(st.booleans())
    n = draw(st.integers(min_value=1, max_value=5))
    fpm = tuple(
        engine(
            component, f"w{i}", queued_prefill=draw(queues), decode_kv=draw(kvs), decode_requests=draw(queues) // 1000
        )
        for i in range(n)
    )
    return inputs(
        component,
        fpm,
        aggregated=aggregated,
        targets=LoadSlaTargets(
            ttft_ms=draw(st.floats(min_value=1, max_value=2000)),
            itl_ms=draw(st.floats(min_value=1, max_value=100)),
            down_sensitivity=draw(st.floats(min_value=0, max_value=1)),
        ),
        runtime=LoadRuntime(
            kv_hit_rate=draw(st.none() | st.floats(min_value=-1, max_value=2)),
            avg_isl=draw(st.floats(min_value=0, max_value=20_000)),
            avg_osl=draw(st.floats(min_value=0, max_value=2000)),
        ),
        throughput_lower_bound=draw(st.none() | st.integers(min_value=0, max_value=8)),
        min_endpoint=draw(st.integers(min_value=0, max_value=4)),
    )


@settings(max_examples=300, deadline=None)
@given(request=sla_requests())
def test_result_is_one_step_and_never_below_the_floors(request: SlaLoadInputs) -> None:
    """Never below max(throughput floor, minimum endpoint); within one replica of N whenever those floors are at most
    N + 1 (a higher floor is reached in one tick); the headline agrees with the direction."""
    n = request.workers.ready(request.component)
    desired, steps = calculate_load_replicas(request, MODEL)
    floor = max(request.throughput_lower_bound or 0, request.min_endpoint)
    assert desired >= floor
    assert desired >= n - 1
    if floor <= n + 1:
        assert abs(desired - n) <= 1
    else:
        assert desired == floor
    want = ReasonCode.SCALE_UP if desired > n else ReasonCode.SCALE_DOWN if desired < n else None
    if want is not None:
        assert headline(steps) is want
    else:
        assert headline(steps) not in (ReasonCode.SCALE_UP, ReasonCode.SCALE_DOWN)


@settings(max_examples=200, deadline=None)
@given(request=sla_requests(), extra=st.lists(queues, min_size=5, max_size=5))
def test_more_queued_work_never_proposes_fewer(request: SlaLoadInputs, extra: list[int]) -> None:
    """Monotone in load: adding queued prompt tokens and KV to every engine never lowers the proposal."""
    heavier = tuple(
        dataclasses.replace(
            f,
            queued=dataclasses.replace(f.queued, sum_prefill_tokens=f.queued.sum_prefill_tokens + more),
            scheduled=dataclasses.replace(f.scheduled, sum_decode_kv_tokens=f.scheduled.sum_decode_kv_tokens + more),
        )
        for f, more in zip(request.fpm, extra, strict=False)
    )
    light, _ = calculate_load_replicas(request, MODEL)
    heavy, _ = calculate_load_replicas(dataclasses.replace(request, fpm=heavier), MODEL)
    assert heavy >= light


@settings(max_examples=100, deadline=None)
@given(request=sla_requests(), expected=st.integers(min_value=0, max_value=9))
def test_scale_in_flight_always_holds_at_the_expected_count(request: SlaLoadInputs, expected: int) -> None:
    """Whatever the metrics, a pool whose expected count differs from the ready count proposes the expected count."""
    n = request.workers.ready(request.component)
    if expected == n:
        expected += 1
    workers = (
        dataclasses.replace(request.workers, expected_prefill=expected)
        if request.component is Component.PREFILL
        else dataclasses.replace(request.workers, expected_decode=expected)
    )
    desired, steps = calculate_load_replicas(dataclasses.replace(request, workers=workers), MODEL)
    assert desired == expected and [s.reason for s in steps] == [ReasonCode.SCALING_IN_PROGRESS]
