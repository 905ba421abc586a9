"""What the planner observes of a deployment: frontend traffic, worker counts, each engine's forward passes and
limits, the router's unplaced requests, and the targets the connector acknowledged."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field

from planner_core.domain.components import Component

# TrafficObservation's arrival-curve fields and the interval (s) each one covers.
PROMPT_ARRIVAL_INTERVALS_S: dict[str, float] = {
    "prompt_tokens_p99_250ms": 0.25,
    "prompt_tokens_p99_500ms": 0.5,
    "prompt_tokens_p99_1s": 1.0,
    "prompt_tokens_p99_2s": 2.0,
    "prompt_tokens_p99_5s": 5.0,
    "prompt_tokens_p99_10s": 10.0,
    "prompt_tokens_p99_30s": 30.0,
}

# The quantiles a window's prompt-arrival curve keeps of each interval's distribution (`PromptBurstQuantiles`), so
# the burst rule can pool its 99th percentile over the requests of several windows; 0.99 is the curve's own point.
PROMPT_BURST_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptBurstQuantiles:
    """One interval of a window's prompt-arrival curve as a distribution: over the window's `num_requests` requests
    (those the percentile is taken over), the prompt tokens that arrived in the `interval_s` up to each one, at the
    quantiles `PROMPT_BURST_QUANTILES` (linear interpolation, as `numpy.percentile`)."""

    interval_s: float
    num_requests: int
    tokens: tuple[float, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyHistogram:
    """A latency histogram over one window, as a frontend exports it (Prometheus' cumulative buckets): of the
    window's `count` requests, `cumulative[i]` took at most `bounds_ms[i]`. Policy-free: the tick reads the share
    within its own target from it (`share_within`).

    Attributes:
        bounds_ms: the buckets' upper bounds (ms), increasing, without the +Inf bucket.
        cumulative: the requests at or under each bound (non-decreasing, at most `count`).
        count: every request of the window the histogram counts (the +Inf bucket).
    """

    bounds_ms: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float

    def share_within(self, target_ms: float) -> float | None:
        """The share of the counted requests within `target_ms`, interpolated linearly inside the bucket that
        holds the target (as Prometheus' `histogram_quantile` does); None when the histogram counts nothing."""
        if self.count <= 0:
            return None
        lower_ms, below = 0.0, 0.0
        for bound_ms, at_most in zip(self.bounds_ms, self.cumulative, strict=True):
            if target_ms < bound_ms:
                inside = (target_ms - lower_ms) / (bound_ms - lower_ms) if bound_ms > lower_ms else 1.0
                return min(1.0, (below + (at_most - below) * max(0.0, inside)) / self.count)
            lower_ms, below = bound_ms, at_most
        return min(1.0, below / self.count)  # beyond the last bound: what the finite buckets hold


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedArrivals:
    """The request arrivals a window's prompt-arrival curve is computed from, as the source saw them (no policy in
    them: the tick derives the curve with the prompt cap of the policy in force, `planner_core.arrivals`).

    Attributes:
        start_s, end_s: the window on the arrivals' clock (the source's: epoch seconds, or the trace's).
        at_s: each request's arrival time; or, with `resolution_s` > 0, each counting step's end.
        isl: each request's prompt tokens; or each step's mean prompt tokens.
        num_req: the requests counted in each step (`resolution_s` > 0: arrivals rebuilt from counters); empty
            when each entry is one request.
        resolution_s: 0 for per-request timestamps, else the counting step (s).
    """

    start_s: float
    end_s: float
    at_s: tuple[float, ...] = ()
    isl: tuple[float, ...] = ()
    num_req: tuple[float, ...] = ()
    resolution_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficObservation:
    """Frontend traffic over one throughput window.

    Attributes:
        duration_s: length of the window the figures cover.
        num_req: requests that arrived in the window.
        isl: mean input sequence length (tokens) of those requests; 0 when idle.
        osl: mean output sequence length (tokens); 0 when idle.
        isl_p50 .. osl_p99: percentiles of the lengths where the source knows them.
        ttft_ms, itl_ms: observed mean latencies where the source knows them.
        ttft_ms_p95, ttft_ms_p99: the 95th and 99th percentile TTFT of the requests whose first token came in the
            window, where the source knows them (ours: the load loop's tail-latency signal).
        queue_ms: the mean time a request of the window waited at the frontend for its first token, where the
            source knows it (Dynamo's `dynamo_frontend_queued_requests` over the request rate, Little's law).
        kv_hit_rate: fraction of prompt tokens served from the KV cache (router metric), if known.
        accept_length: speculative-decoding mean accepted tokens per decode step, if known.
        prompt_tokens_p99_250ms .. prompt_tokens_p99_30s: the window's prompt-token arrival curve (ours): for each
            request of the window, the prompt tokens (its own included) that arrived in the 250 ms .. 30 s up to
            its arrival; the 99th percentile over the window's requests. Where the source timestamps requests.
            The tick derives them from `prompt_arrivals` under the policy in force, each prompt counted up to what
            one engine computes in the interval plus the TTFT target (one prompt occupies one engine, so it delays
            the others by no more); for aggregated engines that rate is their prompt rate under the decode batch
            (`planner_core.perf.capacity.agg_operating_prompt_rate`).
        prompt_arrivals: the window's raw request arrivals as the source recorded them (policy-free), which the
            tick derives the curve from; None where the source has none, and in ticks stored before it (whose
            stored curve is then read as it is).
        prompt_tokens_quantiles: derived in the tick with the curve, from the same arrivals and cap: each
            interval's distribution over the window's requests (`PromptBurstQuantiles`), which the burst rule pools
            over several windows (`planner_core.policy.burst_pool`); empty where the curve is not derived.
    """

    duration_s: float
    num_req: float
    isl: float
    osl: float
    isl_p50: float | None = None
    isl_p90: float | None = None
    isl_p99: float | None = None
    osl_p50: float | None = None
    osl_p90: float | None = None
    osl_p99: float | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    ttft_ms_p95: float | None = None
    ttft_ms_p99: float | None = None
    queue_ms: float | None = None
    kv_hit_rate: float | None = None  # router KV-cache hit rate over the window, 0..1
    accept_length: float | None = None  # speculative-decoding mean accepted tokens per step, >= 1
    prompt_tokens_p99_250ms: float | None = None
    prompt_tokens_p99_500ms: float | None = None
    prompt_tokens_p99_1s: float | None = None
    prompt_tokens_p99_2s: float | None = None
    prompt_tokens_p99_5s: float | None = None
    prompt_tokens_p99_10s: float | None = None
    prompt_tokens_p99_30s: float | None = None
    # the raw arrivals the curve is derived from in the tick; None (ticks stored before it): the curve as stored
    prompt_arrivals: RecordedArrivals | None = None
    # derived with the curve in the tick: each interval's distribution, which the burst rule pools over windows
    prompt_tokens_quantiles: tuple[PromptBurstQuantiles, ...] = ()
    # the frontend's TTFT and ITL histograms over the window, where the source has them: the SLA budget's reading
    ttft_histogram: LatencyHistogram | None = None
    itl_histogram: LatencyHistogram | None = None

    def prompt_arrival_curve(self) -> tuple[tuple[float, float], ...]:
        """The observed points of the prompt-token arrival curve as (interval s, p99 tokens), shortest first."""
        points = ((interval_s, getattr(self, name)) for name, interval_s in PROMPT_ARRIVAL_INTERVALS_S.items())
        return tuple((interval_s, tokens) for interval_s, tokens in points if tokens is not None)

    def length_quantile(self, which: str, quantile: str) -> float | None:
        """`which` in {"isl", "osl"}, `quantile` in {"p50", "p90", "p99"}: that percentile, if observed."""
        return getattr(self, f"{which}_{quantile}")

    def invalid_field(self) -> str | None:
        """Name of the first field that is NaN, infinite or negative, or None when all are usable."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, RecordedArrivals | LatencyHistogram | tuple):
                continue  # not a figure: the curve derived from it is checked where it is read
            if value is not None and (math.isnan(value) or math.isinf(value) or value < 0):
                return f.name
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCounts:
    """Workers per pool: `ready` serve now, `expected` is the target the orchestrator works towards."""

    ready_prefill: int
    ready_decode: int
    expected_prefill: int
    expected_decode: int

    def ready(self, component: Component) -> int:
        return self.ready_prefill if component is Component.PREFILL else self.ready_decode

    def expected(self, component: Component) -> int:
        return self.expected_prefill if component is Component.PREFILL else self.expected_decode

    @property
    def scaling_in_progress(self) -> bool:
        return (self.ready_prefill, self.ready_decode) != (self.expected_prefill, self.expected_decode)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledRequests:
    """What one engine iteration computed (Dynamo `ForwardPassMetrics.scheduled_requests`); tokens and variances."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedRequests:
    """What waited in the engine's queue at that iteration (Dynamo `ForwardPassMetrics.queued_requests`)."""

    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class EngineLifecycle(enum.StrEnum):
    """Where an engine is in its life, as far as the source of its metrics knows (ours)."""

    SERVING = "serving"  # ready and taking requests: its iterations describe the engine at work
    STARTING = "starting"  # loading weights, compiling, warming caches: its iterations are not representative
    DRAINING = "draining"  # removed from the router, finishing its batch: a shrinking, unrepresentative load


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardPassMetrics:
    """One engine iteration as the engine reports it (Dynamo's `ForwardPassMetrics` schema).

    Attributes:
        component: the pool the engine belongs to (DECODE for the single pool of aggregated mode).
        worker_id, dp_rank: the engine (attention data-parallel rank within a worker).
        counter_id: the engine's monotonically increasing iteration counter.
        wall_time_s: how long the iteration took; 0 marks an idle heartbeat (never a sample).
        lifecycle: the engine's state where the source knows it (ours; Dynamo's schema has none: SERVING).
    """

    component: Component
    worker_id: str
    dp_rank: int = 0
    counter_id: int = 0
    wall_time_s: float = 0.0
    scheduled: ScheduledRequests = field(default_factory=ScheduledRequests)
    queued: QueuedRequests = field(default_factory=QueuedRequests)
    lifecycle: EngineLifecycle = EngineLifecycle.SERVING

    @property
    def is_idle_heartbeat(self) -> bool:
        return self.wall_time_s <= 0

    @property
    def num_in_flight(self) -> int:
        """Requests the engine holds after this iteration: scheduled (prefilling or decoding) and queued. What a drain
        of the engine waits for, and what removing it at once would cut."""
        scheduled, queued = self.scheduled, self.queued
        return (
            scheduled.num_prefill_requests
            + scheduled.num_decode_requests
            + queued.num_prefill_requests
            + queued.num_decode_requests
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLimits:
    """Static limits of one engine of a pool (Dynamo's per-role capabilities). Defaults are Dynamo's fallbacks."""

    num_gpu: int = 1
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 512
    max_kv_tokens: int = 2_000_000
    context_length: int | None = None
    speculative_nextn: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class UnplacedRequests:
    """Requests the router of one pool could not place (an SLO-aware router found no available endpoint: no engine
    predicted to meet the target), as the frontend reports them.

    Attributes:
        component: the pool whose stage found no endpoint (aggregated engines: DECODE).
        num_waiting: requests waiting at the frontend for that pool now.
        num_unplaced: requests that found no available endpoint since the previous report (each counted once per
            stage, whether it then waited or was rejected).
        num_rejected: of those, the requests the frontend rejected.
    """

    component: Component
    num_waiting: int = 0
    num_unplaced: int = 0
    num_rejected: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AppliedTargets:
    """A decision the execution flow applied through the connector at `at_s` (epoch s), the connector's
    acknowledgement of its targets (the Kubernetes API took the patch; the virtual connector wrote them for the
    orchestrator, whose own acknowledgement is the readiness the workers report): its pool targets, None for a
    pool it left alone."""

    at_s: float
    num_prefill: int | None = None
    num_decode: int | None = None

    def target(self, component: Component) -> int | None:
        """The decision's target for `component`'s pool, or None."""
        return self.num_prefill if component is Component.PREFILL else self.num_decode
