"""Boundary types of the decision core: enums and frozen dataclasses, and their JSON form.

Everything that crosses from the I/O edges into `tick()` and back is defined here. The types are plain values
(frozen, slotted, keyword-only) so a tick's inputs, state and outcome can be stored as JSONB and replayed
exactly. No I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class Component(enum.StrEnum):
    """A pool of workers the planner scales."""

    PREFILL = "prefill"  # computes prompts; drives TTFT
    DECODE = "decode"  # generates tokens; drives ITL (also the single pool in aggregated mode)


class Loop(enum.StrEnum):
    """Which of the planner's two loops a tick belongs to."""

    THROUGHPUT = "throughput"  # slow, predictive: forecast -> capacity model -> replicas
    LOAD = "load"  # fast, reactive: per-engine load -> +/-1 corrections


class ReasonFamily(enum.StrEnum):
    """The part of the planner a `ReasonCode` comes from; the families the source groups the codes by."""

    HEADLINE = "headline"  # a loop's decision as a whole (Dynamo's throughput/load decision reasons)
    PIPELINE = "pipeline"  # the throughput loop's steps: observe, forecast, size, clamp
    PERF = "perf"  # online perf models and engine capacity
    PLUGIN = "plugin"  # what each plugin of the pipeline did this tick
    MERGE = "merge"  # overrides and how they were merged
    EXECUTE = "execute"  # the EXECUTE phase's action (Dynamo's execute actions)
    LOAD = "load"  # the load loop's decisions and steps (Dynamo 1.x and the 2025 threshold planner)
    SIZING = "sizing"  # the throughput loop's headroom, burst sizing and scale-down hold (ours)
    NEXT_REQUEST = "next_request"  # where the SLA load loop's "next request" comes from


class ReasonCode(enum.StrEnum):
    """Why a step of a tick produced its value. Dynamo's enum names where Dynamo has one.

    One flat enum because the values are stored (`ticks.reason`, `tick_steps.reason`, ...) and compared by value;
    the members are grouped by `ReasonFamily` in the source, each group opening with a `# family:` comment, and
    `family` says which group a member is in. Add a member to its family's group; never change a value.
    """

    @property
    def family(self) -> ReasonFamily:
        """The part of the planner this reason comes from."""
        return _REASON_FAMILIES[self]

    # family: HEADLINE (Dynamo throughput/load decision reasons)
    UNSET = "unset"
    DISABLED = "disabled"
    NO_TRAFFIC_DATA = "no_traffic_data"
    PREDICT_FAILED = "predict_failed"
    MODEL_NOT_READY = "model_not_ready"
    PARTNER_NOT_READY = "partner_not_ready"
    SET_LOWER_BOUND = "set_lower_bound"
    SCALE = "scale"
    NO_CHANGE = "no_change"
    NO_FPM_DATA = "no_fpm_data"
    SCALING_IN_PROGRESS = "scaling_in_progress"
    GPU_BUDGET_GUARD_HOLD = "gpu_budget_guard_hold"
    GPU_BUDGET_RECONCILE = "gpu_budget_reconcile"
    # family: PIPELINE (steps of our own pipeline)
    OBSERVED = "observed"  # the observation was accepted as is
    IDLE_WINDOW = "idle_window"  # zero requests: lengths carried forward from the last busy window
    PREDICTED = "predicted"  # the configured predictor produced the forecast
    PREDICTOR_FALLBACK = "predictor_fallback"  # forecast came from the fallback (e.g. warm-up), not the model
    CAPACITY_FROM_PROFILE = "capacity_from_profile"  # engine capacity interpolated from profiling data
    SLA_UNREACHABLE = "sla_unreachable"  # even batch 1 misses the SLA; best rate used anyway
    DEMAND_SIZED = "demand_sized"  # replicas = ceil(demand / capacity)
    WITHIN_RANGE = "within_range"  # a clamp left the value unchanged
    MIN_ENDPOINT_FLOOR = "min_endpoint_floor"  # raised to the minimum endpoint count
    DELTA_CAPPED = "delta_capped"  # change limited by max_throughput_scaling_replicas
    GPU_BUDGET_CAPPED = "gpu_budget_capped"  # scaled down proportionally to fit max_gpu_budget
    FLEET_CEILING_CAPPED = "fleet_ceiling_capped"  # a fleet member's targets cut to what the fleet lets it grow to
    GPU_BUDGET_FLOORED = "gpu_budget_floored"  # scaled up proportionally to reach min_gpu_budget
    ADVISORY = "advisory"  # decision recorded but not to be executed
    SIZED_ON_MEAN = "sized_on_mean"  # capacity sized for the forecast mean ISL/OSL
    SIZED_ON_QUANTILE = "sized_on_quantile"  # capacity sized for the forecast ISL/OSL quantile
    QUANTILE_UNAVAILABLE = "quantile_unavailable"  # quantile sizing asked for, no quantile forecast: mean used
    CORRECTION_APPLIED = "correction_applied"  # 0.x correction factor from observed / interpolated latency
    CORRECTION_UNAVAILABLE = "correction_unavailable"  # no observed latency (or idle window): factor 1
    # family: PERF (online perf models and engine capacity, planner_core.perf)
    # Dynamo's name: too few usable FPM samples to fit the model, or the model (or an engine limit) cannot answer
    INSUFFICIENT_DATA = "insufficient_data"
    NEGATIVE_COEFFICIENT = "negative_coefficient"  # the fit says more load takes less time: rejected
    PERF_MODEL_READY = "perf_model_ready"  # the online model's fit is usable
    PERF_MODEL_BOOTSTRAP = "perf_model_bootstrap"  # online model not ready: the perf table or profile answers
    # ours: samples of engines starting or draining (or that cannot be told apart from them) kept out of the fits
    SAMPLES_EXCLUDED = "samples_excluded"
    CAPACITY_SEARCHED = "capacity_searched"  # engine capacity from the batch search; the SLA is met
    REQUEST_EXCEEDS_ENGINE = "request_exceeds_engine"  # one request does not fit the engine (e.g. KV cache)
    RUNTIME_METADATA_MISSING = "runtime_metadata_missing"  # KV hit rate / accept length unknown: neutral value
    SPECULATIVE_DECODING_OFF = "speculative_decoding_off"  # speculative_nextn = 0: accept length 1
    KV_HIT_RATE_CLAMPED = "kv_hit_rate_clamped"  # hit rate outside [0, 0.95] clamped for the prefill discount
    ACCEPT_LENGTH_CLAMPED = "accept_length_clamped"  # accept length outside [1, nextn + 1] clamped
    # family: PLUGIN (planner_core.pipeline: what each plugin did this tick)
    PLUGIN_NO_OPINION = "plugin_no_opinion"  # ran and returned nothing (Dynamo's ACCEPT)
    PLUGIN_OVERRIDES = "plugin_overrides"  # ran and returned replica overrides
    PLUGIN_NOT_DUE = "plugin_not_due"  # its interval has not elapsed; no opinion (ACCEPT_WHEN_IDLE or nothing held)
    PLUGIN_HELD_OVER = "plugin_held_over"  # not due; its last result was replayed (HOLD_LAST)
    REQUIRED_FIELDS_MISSING = "required_fields_missing"  # due, but a field it requires was not produced; retried
    PLUGIN_RAISED = "plugin_raised"  # raised an exception; result ignored, retried next tick
    PLUGIN_INVALID_RESULT = "plugin_invalid_result"  # returned something unusable; ignored, retried next tick
    PLUGIN_TIMEOUT = "plugin_timeout"  # finished after its own time limit; result discarded, retried next tick
    PLUGIN_LOAD_FAILED = "plugin_load_failed"  # an entry point could not be loaded; the plugin is not run
    PLUGIN_OBSERVED = "plugin_observed"  # an OBSERVE plugin ran and added observations
    PLUGIN_UNAVAILABLE = "plugin_unavailable"  # an out-of-process plugin could not be reached; retried next tick
    PLUGIN_ANSWER_MISSING = "plugin_answer_missing"  # replay: the tick's record holds no answer of this remote plugin
    PLUGIN_CIRCUIT_OPEN = "plugin_circuit_open"  # its circuit breaker is open: not called this tick
    PLUGIN_CIRCUIT_OPENED = "plugin_circuit_opened"  # this failure opened its circuit breaker
    PLUGIN_CIRCUIT_HALF_OPEN = "plugin_circuit_half_open"  # cool-down over: one trial call decides open or closed
    PLUGIN_CIRCUIT_CLOSED = "plugin_circuit_closed"  # the trial call succeeded: the breaker is closed again
    PREDICT_CHAIN_FINAL = "predict_chain_final"  # a PREDICT plugin said `final`: later PREDICT plugins not run
    # family: MERGE (plugin pipeline: overrides and how they were merged)
    OVERRIDE_SET = "override_set"  # a plugin recommends exactly this many replicas
    OVERRIDE_AT_LEAST = "override_at_least"  # a plugin sets a floor
    OVERRIDE_AT_MOST = "override_at_most"  # a plugin sets a ceiling
    OVERRIDE_REJECT = "override_reject"  # a plugin vetoes scaling this tick
    OVERRIDE_INVALID = "override_invalid"  # malformed override (e.g. SET without replicas); ignored
    UNMANAGED_COMPONENT = "unmanaged_component"  # override for a pool this planner's mode does not manage; ignored
    CONSTRAIN_SET_DROPPED = "constrain_set_dropped"  # CONSTRAIN may only bound: a SET there is dropped
    CONSTRAIN_FINAL_IGNORED = "constrain_final_ignored"  # CONSTRAIN cannot claim `final`; merged normally
    MERGE_FINAL = "merge_final"  # the smallest-priority `final` result was taken verbatim
    MERGE_FLOOR = "merge_floor"  # raised to the largest AT_LEAST
    MERGE_CEILING = "merge_ceiling"  # lowered to the smallest AT_MOST
    MERGE_FLOOR_OVER_CEILING = "merge_floor_over_ceiling"  # floor > ceiling: the floor wins
    # family: EXECUTE (plugin pipeline: the EXECUTE decision, Dynamo's execute actions)
    APPLY = "apply"  # targets differ from the current counts and are to be applied
    SKIP_NO_TARGETS = "skip_no_targets"  # no plugin had an opinion, or every target equals the current count
    SKIP_SHORT_CIRCUIT = "skip_short_circuit"  # a plugin rejected the tick
    SKIP_TICK_TIMEOUT = "skip_tick_timeout"  # the tick overran scheduling.tick_max_duration_seconds
    # family: LOAD (Dynamo's load-loop decision reasons, then the steps of our own load loop)
    SCALE_UP = "scale_up"  # the load signal (or the throughput floor) adds one replica
    SCALE_DOWN = "scale_down"  # the load signal removes one replica
    SCALE_DOWN_REFUSED_CONSOLIDATION = "scale_down_refused_consolidation"  # N-1 engines would miss the SLA budget
    SCALE_DOWN_CAPPED_BY_THROUGHPUT = "scale_down_capped_by_throughput"  # the throughput floor blocked a scale-down
    WORKER_COUNT_MISMATCH = "worker_count_mismatch"  # engines reporting metrics != ready workers (or uneven DP ranks)
    UNPLACED_REQUESTS = "unplaced_requests"  # the SLO-aware router could not place requests: one replica more (ours)
    # steps of our own load loop
    LATENCY_ESTIMATED = "latency_estimated"  # an engine's TTFT/ITL estimated from its queue through the model
    LOAD_MEASURED = "load_measured"  # an engine's threshold value (queue ratio, queued tokens, KV utilisation)
    CONSOLIDATION_SAFE = "consolidation_safe"  # this engine could absorb its share of one removed engine
    RAISED_TO_THROUGHPUT_FLOOR = "raised_to_throughput_floor"  # the load proposal was below the throughput floor
    TAIL_LATENCY_HIGH = "tail_latency_high"  # the frontend's p99/p95 TTFT or queue time is above the TTFT target: +1
    TAIL_LATENCY_REFUSED_DOWN = "tail_latency_refused_down"  # the TTFT tail is too close to the target to shrink
    TAIL_LATENCY_OK = "tail_latency_ok"  # the frontend's tail latency left the load signal as it was
    INTERVAL_COLLECTING = "interval_collecting"  # 2025 threshold planner: sampled; its interval is not over
    WORKERS_CHANGED_IN_INTERVAL = "workers_changed_in_interval"  # 2025: counts changed mid-interval, no adjustment
    DECODE_GRACE_PERIOD = "decode_grace_period"  # 2025: no decode scale-down shortly after adding a decode worker
    PREFILL_QUEUE_TREND = "prefill_queue_trend"  # 2025: the queue trend falls below the up threshold; no scale-up
    # family: SIZING (throughput loop: our headroom and burst sizing, planner_core.policy.throughput)
    HEADROOM_APPLIED = "headroom_applied"  # demand divided by the pool's target utilisation before sizing
    BURST_SIZED = "burst_sized"  # prefill raised so the observed prompt bursts drain within the TTFT target
    BURST_COVERED = "burst_covered"  # the mean-rate sizing already absorbs the observed prompt bursts
    BURST_UNAVAILABLE = "burst_unavailable"  # burst sizing asked for, no arrival curve observed: mean rate only
    SCALE_DOWN_HELD = "scale_down_held"  # kept at the largest need of the hold time: a smaller need must last first
    # the start-up-aware horizon (ours): the demand over [now, now + start-up + interval]
    HORIZON_HEADROOM = "horizon_headroom"  # need raised by the learned quantile of horizon shortfalls (engines)
    HORIZON_NO_HISTORY = "horizon_no_history"  # no horizon has closed yet: the forecast alone
    HORIZON_SHORT_HISTORY = "horizon_short_history"  # too few closed horizons for the quantile: their largest ratio
    STARTUP_MEASURED = "startup_measured"  # the pool's start-up time from its own scale-ups (decided -> ready)
    STARTUP_CONFIGURED = "startup_configured"  # no scale-up of the pool completed yet: the configured start-up
    # family: NEXT_REQUEST (SLA load loop: where the "next request" of every estimate comes from)
    NEXT_REQUEST_ENGINE_AVERAGE = "next_request_engine_average"  # the engines' moving averages (Dynamo's)
    NEXT_REQUEST_TRAFFIC_WINDOW = "next_request_traffic_window"  # the last traffic window's mean lengths (ours)
    NEXT_REQUEST_UNKNOWN = "next_request_unknown"  # nothing reported yet: no next request is added


# The first member of each family, in source order: a member belongs to the family of the last start before it.
_FAMILY_STARTS: dict[ReasonCode, ReasonFamily] = {
    ReasonCode.UNSET: ReasonFamily.HEADLINE,
    ReasonCode.OBSERVED: ReasonFamily.PIPELINE,
    ReasonCode.INSUFFICIENT_DATA: ReasonFamily.PERF,
    ReasonCode.PLUGIN_NO_OPINION: ReasonFamily.PLUGIN,
    ReasonCode.OVERRIDE_SET: ReasonFamily.MERGE,
    ReasonCode.APPLY: ReasonFamily.EXECUTE,
    ReasonCode.SCALE_UP: ReasonFamily.LOAD,
    ReasonCode.HEADROOM_APPLIED: ReasonFamily.SIZING,
    ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE: ReasonFamily.NEXT_REQUEST,
}


def _families() -> dict[ReasonCode, ReasonFamily]:
    families: dict[ReasonCode, ReasonFamily] = {}
    family = ReasonFamily.HEADLINE
    for code in ReasonCode:
        family = _FAMILY_STARTS.get(code, family)
        families[code] = family
    return families


_REASON_FAMILIES = _families()


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
            if isinstance(value, RecordedArrivals):
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


def cumulative_gpu_hours(observations: Iterable[tuple[float, int]]) -> list[tuple[float, float]]:
    """The GPU-hours of recorded worker observations, accumulated from the first to each later one.

    The one definition of "GPU-hours" that the report, the Prometheus metrics and `planner demo`'s summary use
    (the simulator's own `SimResult.gpu_s` is the exact integral of every worker it held, which an operator never
    observes): each observation `(at_s, gpus)` (epoch or offset seconds, in time order; GPUs of the ready
    workers then) holds until the next one, and nothing is counted before the first or after the last:
    `sum_i gpus_i * (at_{i+1} - at_i) / 3600`. Runs of equal counts are integrated as one interval, so the
    result depends only on where the count changed and on the last observation (the metrics exporter reads those
    rows alone and gets the report's figure exactly).

    Returns one (at_s, GPU-hours so far) point per observation, the first at 0.
    """
    points: list[tuple[float, float]] = []
    total_before_run_h = 0.0
    run_start_s = 0.0
    run_gpus = 0
    for at_s, gpus in observations:
        if not points:
            points.append((at_s, 0.0))
            run_start_s, run_gpus = at_s, gpus
            continue
        total_h = total_before_run_h + run_gpus * (at_s - run_start_s) / 3600.0
        points.append((at_s, total_h))
        if gpus != run_gpus:
            total_before_run_h, run_start_s, run_gpus = total_h, at_s, gpus
    return points


def gpu_hours(observations: Iterable[tuple[float, int]]) -> float:
    """The total of `cumulative_gpu_hours` (0 without at least two observations)."""
    points = cumulative_gpu_hours(observations)
    return points[-1][1] if points else 0.0


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


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLimits:
    """Static limits of one engine of a pool (Dynamo's per-role capabilities). Defaults are Dynamo's fallbacks."""

    num_gpu: int = 1
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 512
    max_kv_tokens: int = 2_000_000
    context_length: int | None = None
    speculative_nextn: int = 0


class PerfModelRole(enum.StrEnum):
    """Which engine an online perf model describes, and so which FPM features it regresses wall time on."""

    PREFILL = "prefill"  # wall = a + b * sum_prefill_tokens
    DECODE = "decode"  # wall = a + b * num_decode_requests + c * sum_decode_kv_tokens
    AGG = "agg"  # wall = a + b * sum_prefill_tokens + c * sum_decode_kv_tokens (aggregated engines)


class ModelReadiness(enum.StrEnum):
    """Whether an online perf model's fit may be used; values equal the matching `ReasonCode`s."""

    READY = "perf_model_ready"  # enough samples and a physically sensible fit
    INSUFFICIENT_DATA = "insufficient_data"  # fewer than load_min_observations samples, or no spread on a feature
    NEGATIVE_COEFFICIENT = "negative_coefficient"  # a fitted slope is negative: more load would take less time


@dataclass(frozen=True, slots=True, kw_only=True)
class FpmSample:
    """One forward-pass observation retained by an online perf model.

    Attributes:
        seq: position in the model's stream of accepted samples (1 = first ever); the oldest sample has the smallest.
        features: the role's regression inputs, in `PerfModelRole` order (tokens / requests).
        wall_time_s: the iteration's measured wall time.
    """

    seq: int
    features: tuple[float, ...]
    wall_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineModelState:
    """An online forward-pass regression of one engine role: retained samples, the fit, and moving averages.

    A value: `planner_core.perf.online.observe_fpm` returns a new one; `OnlineForwardPassModel` only reads it.

    Attributes:
        role: which features the model regresses on.
        samples: retained observations (bounded by `max_num_fpm_samples`, retired bucket by bucket).
        axis_min, axis_max: per-feature bounds of every sample ever accepted (the bucket grid spans them).
        readiness: whether the fit below may be used.
        readiness_detail: why, in words (e.g. which coefficient was negative).
        intercept_s: fitted intercept (s); None until a fit has been attempted.
        coefficients: fitted slopes per feature (s per token or per request), as used (a clipped slope is 0).
        num_accepted: samples accepted so far (the `seq` of the newest).
        num_idle_skipped: idle heartbeats (wall time 0) seen and skipped.
        num_invalid_skipped: observations skipped because a feature or the wall time was not a finite number.
        num_retired: samples dropped to keep the retained set bounded.
        recent_isl: per-iteration mean prefill length (tokens) of recent iterations, 0 for one without prefill
            requests (leading zeros skipped).
        recent_decode_context: per-iteration mean KV tokens per decode request, recent iterations with decode.
        recent_num_decode: decode requests per recent iteration (leading zeros skipped).
    """

    role: PerfModelRole
    samples: tuple[FpmSample, ...] = ()
    axis_min: tuple[float, ...] = ()
    axis_max: tuple[float, ...] = ()
    readiness: ModelReadiness = ModelReadiness.INSUFFICIENT_DATA
    readiness_detail: str = ""
    intercept_s: float | None = None
    coefficients: tuple[float, ...] = ()
    num_accepted: int = 0
    num_idle_skipped: int = 0
    num_invalid_skipped: int = 0
    num_retired: int = 0
    recent_isl: tuple[float, ...] = ()
    recent_decode_context: tuple[float, ...] = ()
    recent_num_decode: tuple[float, ...] = ()


def _empty_model(role: PerfModelRole) -> OnlineModelState:
    return OnlineModelState(role=role)


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlinePerfState:
    """The online perf models of a deployment, one per engine role (a mode uses the members it has pools for)."""

    prefill: OnlineModelState = field(default_factory=lambda: _empty_model(PerfModelRole.PREFILL))
    decode: OnlineModelState = field(default_factory=lambda: _empty_model(PerfModelRole.DECODE))
    agg: OnlineModelState = field(default_factory=lambda: _empty_model(PerfModelRole.AGG))


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
class TickInputs:
    """Everything one tick sees. `now_s` is the scheduled time of the tick in epoch seconds (time is data).

    `fpm` holds the forward-pass metrics observed since the previous tick (the latest per engine last), for
    the online perf models and the load loop. `unplaced` holds, per pool, the requests the router could not place
    (empty when the router does not report them: routers that never refuse a request).
    """

    now_s: float
    loop: Loop
    workers: WorkerCounts
    traffic: TrafficObservation | None = None
    fpm: tuple[ForwardPassMetrics, ...] = ()
    unplaced: tuple[UnplacedRequests, ...] = ()
    # What the out-of-process plugins answered during this tick (filled in by the runtime after the live tick,
    # recorded with the inputs): replay reads these answers and never calls a plugin.
    remote: tuple[RemoteAnswer, ...] = ()
    # A fleet member's ceiling (GPUs): its grant at the fleet's newest arbitration round plus the GPUs that round
    # left unallocated. The tick's decision grows no further (a want above it is still proposed, and reaches the
    # next arbitration as the member's claim); it never forces a pool below its expected count. None: no fleet
    # budget, or no round has granted this deployment anything yet.
    gpu_ceiling: int | None = None
    # The decisions the execution flow applied since the oldest scale-up the planner waits to see ready, oldest
    # first (ours: what splits a measured start-up into the connector's acknowledgement and the engines' own
    # start). Empty where targets apply within the deciding tick (the benchmark's simulator).
    applied: tuple[AppliedTargets, ...] = ()

    def unplaced_for(self, component: Component) -> UnplacedRequests | None:
        """The unplaced-request report of `component`'s pool, if any."""
        return next((u for u in self.unplaced if u.component is component), None)

    def remote_answer(self, plugin_id: str, phase: str) -> RemoteAnswer | None:
        """The recorded answer of one remote plugin in one phase, or None."""
        for answer in self.remote:
            if answer.plugin_id == plugin_id and answer.phase == phase:
                return answer
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Forecast of the next throughput window.

    `isl_quantile` / `osl_quantile` forecast the configured percentile (`quantile`, e.g. "p90") of the lengths,
    for sizing on the distribution; None while the history holds no window yet. A window whose observation had no
    percentile contributes its mean to that series.
    """

    num_req: float
    isl: float
    osl: float
    quantile: str | None = None
    isl_quantile: float | None = None
    osl_quantile: float | None = None


class LengthQuantile(enum.StrEnum):
    """Which percentile of the request lengths (ISL/OSL) is forecast next to the mean."""

    P50 = "p50"  # median request
    P90 = "p90"  # one request in ten is longer
    P99 = "p99"  # one request in a hundred is longer


class LoadSeries(enum.StrEnum):
    """The per-window series the predictors forecast; each value is also the `LoadHistory` field holding it."""

    NUM_REQ = "num_req"  # requests per window
    ISL = "isl"  # mean input sequence length (tokens)
    OSL = "osl"  # mean output sequence length (tokens)
    ISL_QUANTILE = "isl_quantile"  # configured ISL percentile (tokens); the mean when a window has none
    OSL_QUANTILE = "osl_quantile"  # configured OSL percentile (tokens); the mean when a window has none


class EnsembleMember(enum.StrEnum):
    """Predictors the ensemble scores and chooses from (values equal their `LoadPredictorName`)."""

    CONSTANT = "constant"  # last value
    KALMAN = "kalman"  # local linear trend filter
    ARIMA = "arima"  # statsmodels ARIMA refitted on a bounded window


@dataclass(frozen=True, slots=True, kw_only=True)
class KalmanState:
    """Local-linear-trend Kalman filter of one series after its newest point, in model space.

    Model space is the raw value, or log1p of it when `log1p` is set. The state is [level, trend] with covariance
    P = [[cov_level, cov_cross], [cov_cross, cov_trend]]; the filter parameters it was run with are kept so a
    change of configuration is detected (the filter is then rebuilt from the retained points).

    Attributes:
        level: filtered level after the newest point (model-space units per window).
        trend: filtered change of the level per window.
        cov_level, cov_cross, cov_trend: entries of P.
        num_points: position of the newest filtered point in the series (1 = first point ever appended).
        num_filtered: points the filter has consumed (fewer than `num_points` when rebuilt from a bounded history).
        q_level, q_trend, r, log1p: the parameters the filter was run with.
    """

    level: float
    trend: float
    cov_level: float
    cov_cross: float
    cov_trend: float
    num_points: int
    num_filtered: int
    q_level: float
    q_trend: float
    r: float
    log1p: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ArimaFit:
    """An ARIMA(p, d, q) order with parameters estimated by maximum likelihood on one window.

    Attributes:
        p, d, q: autoregressive order, differencing order and moving-average order.
        params: statsmodels' parameter vector (innovation variance concentrated out), estimated on the
            standardised window (z = (y - mean) / std, model space): [mean (only when d = 0)], ar.L1 .. ar.Lp,
            ma.L1 .. ma.Lq.
        aic: Akaike information criterion of the fit (lower is better).
        fitted_at: position of the newest point of the window the parameters were estimated on.
        converged: whether the likelihood optimiser reported convergence.
    """

    p: int
    d: int
    q: int
    params: tuple[float, ...]
    aic: float
    fitted_at: int
    converged: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ArimaSearch:
    """An ARIMA order choice in progress: candidate orders are fitted one per turn on a frozen window.

    Attributes:
        window_start, window_end: positions of the oldest and newest points of the frozen window the candidates are
            compared on.
        d: differencing order chosen for that window (KPSS test).
        num_evaluated: candidates of the grid fitted so far.
        best: the lowest-AIC candidate so far, None if none could be fitted yet.
    """

    window_start: int
    window_end: int
    d: int
    num_evaluated: int = 0
    best: ArimaFit | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ArimaState:
    """The ARIMA predictor's state for one series: the order and parameters in force, and when they were chosen.

    Attributes:
        log1p: whether the series is modelled as log1p of its values.
        fit: the order and parameters in force; None until the first order choice completes.
        chosen_at: `window_end` of the search that chose the order in force (0 = never chosen).
        search: an order choice in progress, if any.
    """

    log1p: bool
    fit: ArimaFit | None = None
    chosen_at: int = 0
    search: ArimaSearch | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberScore:
    """One ensemble member's recent accuracy on one series.

    Attributes:
        member: which predictor.
        loss: exponentially weighted mean of |log1p(forecast) - log1p(actual)| over the scored windows; None
            until the first window is scored.
        num_scored: windows scored so far.
    """

    member: EnsembleMember
    loss: float | None = None
    num_scored: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EnsembleState:
    """Losses of every ensemble member on one series, up to and including point `num_points`."""

    num_points: int
    members: tuple[MemberScore, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesModel:
    """Fitted state the configured predictor carries for one series; None where that predictor needs none."""

    kalman: KalmanState | None = None
    arima: ArimaState | None = None
    ensemble: EnsembleState | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadHistory:
    """Observed per-window load the predictors learn from, plus the predictors' fitted state.

    A value: `planner_core.predict.observe_window` returns a new one per window, `predict_next` only reads it, and
    it is stored (as JSON) with every tick, so a restart or a replay continues from exactly this state.

    Attributes:
        num_req, isl, osl: requests per window and mean ISL/OSL (tokens), most recent last, bounded in length
            (`planner_core.predict.MAX_HISTORY_POINTS`).
        isl_quantile, osl_quantile: the `length_quantile` percentile of ISL/OSL per window (tokens); the window's
            mean where the observation had no percentile. Restarted when the configured percentile changes.
        length_quantile: which percentile the quantile series hold.
        seen_traffic: False until the first non-idle window: leading idle windows are skipped.
        num_windows: windows appended since the first busy one (the series keep only the newest of them).
        num_req_model .. osl_quantile_model: the configured predictor's fitted state per series.
    """

    num_req: tuple[float, ...] = ()
    isl: tuple[float, ...] = ()
    osl: tuple[float, ...] = ()
    seen_traffic: bool = False  # False until the first non-idle window: leading idle windows are skipped
    isl_quantile: tuple[float, ...] = ()
    osl_quantile: tuple[float, ...] = ()
    length_quantile: LengthQuantile = LengthQuantile.P90
    num_windows: int = 0
    num_req_model: SeriesModel = field(default_factory=SeriesModel)
    isl_model: SeriesModel = field(default_factory=SeriesModel)
    osl_model: SeriesModel = field(default_factory=SeriesModel)
    isl_quantile_model: SeriesModel = field(default_factory=SeriesModel)
    osl_quantile_model: SeriesModel = field(default_factory=SeriesModel)

    def values(self, series: LoadSeries) -> tuple[float, ...]:
        """The retained values of one series, most recent last."""
        return getattr(self, series.value)  # type: ignore[no-any-return]

    def model(self, series: LoadSeries) -> SeriesModel:
        """The fitted predictor state of one series."""
        return getattr(self, f"{series.value}_model")  # type: ignore[no-any-return]

    @property
    def num_points(self) -> int:
        """Position of the newest point (windows appended so far; at least the retained length)."""
        return max(self.num_windows, len(self.num_req))


class OverrideType(enum.StrEnum):
    """How a plugin's replica count for a pool is meant (merged as described in `planner_core.pipeline.merge`)."""

    SET = "set"  # recommend exactly this count (the smallest-priority SET is the recommendation)
    AT_LEAST = "at_least"  # floor: the merged count is at least this
    AT_MOST = "at_most"  # ceiling: the merged count is at most this (a conflicting floor wins)
    REJECT = "reject"  # veto: nothing is executed this tick


class HoldPolicy(enum.StrEnum):
    """What a plugin contributes on a tick where its interval has not elapsed."""

    HOLD_LAST = "hold_last"  # replay the result of its last successful run
    ACCEPT_WHEN_IDLE = "accept_when_idle"  # no opinion


class ExecuteAction(enum.StrEnum):
    """The EXECUTE decision of one pipeline tick (Dynamo's execute actions, plus advisory mode)."""

    APPLY = "apply"  # hand the targets to the connector
    SKIP_NO_TARGETS = "skip_no_targets"  # nothing to change
    SKIP_SHORT_CIRCUIT = "skip_short_circuit"  # a plugin rejected the tick
    SKIP_TICK_TIMEOUT = "skip_tick_timeout"  # the whole tick overran its deadline
    ADVISORY = "advisory"  # would apply, but the planner is advisory: recorded, never executed


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaOverride:
    """One plugin's opinion about one pool's replica count.

    Attributes:
        component: the pool; None only for a REJECT, which vetoes the whole tick whatever the pool.
        kind: SET, AT_LEAST, AT_MOST or REJECT.
        replicas: the count (>= 0); required except for REJECT.
        reason: the plugin's own short explanation, recorded with the override.
    """

    component: Component | None
    kind: OverrideType
    replicas: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedValue:
    """One named number an OBSERVE plugin added to a tick (e.g. an external queue depth or a spot price)."""

    name: str
    value: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PartialPrediction:
    """Forecast fields written by PREDICT plugins; None means "no opinion" on that field.

    The PREDICT chain fills it field by field, first writer (smallest priority) wins. `complete()` is the
    `Prediction` the sizing logic needs once `num_req`, `isl` and `osl` are all known.
    """

    num_req: float | None = None
    isl: float | None = None
    osl: float | None = None
    quantile: str | None = None
    isl_quantile: float | None = None
    osl_quantile: float | None = None

    @classmethod
    def of(cls, prediction: Prediction) -> PartialPrediction:
        """Every field of a full prediction."""
        return cls(**{f.name: getattr(prediction, f.name) for f in dataclasses.fields(Prediction)})

    def fields_set(self) -> tuple[str, ...]:
        """Names of the fields that hold a value, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def complete(self) -> Prediction | None:
        """The full `Prediction`, or None while num_req, isl or osl is missing."""
        if self.num_req is None or self.isl is None or self.osl is None:
            return None
        return Prediction(
            num_req=self.num_req,
            isl=self.isl,
            osl=self.osl,
            quantile=self.quantile,
            isl_quantile=self.isl_quantile,
            osl_quantile=self.osl_quantile,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldResult:
    """A plugin's last successful result, replayed on ticks where it is not due (HOLD_LAST).

    Attributes:
        produced_at_s: scheduled time of the tick that produced it.
        predictions: what a PREDICT plugin wrote (None for other phases or no opinion).
        overrides: what a PROPOSE/RECONCILE/CONSTRAIN plugin returned.
        final: whether the result claimed `final`.
    """

    produced_at_s: float
    predictions: PartialPrediction | None = None
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    observations: tuple[ObservedValue, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSchedule:
    """When one plugin of the pipeline was registered and last ran, and its held result.

    Attributes:
        plugin_id: the plugin.
        registered_at_s: scheduled time of the first tick that saw the plugin; a plugin with an interval first
            runs at `registered_at_s + interval`.
        last_run_at_s: scheduled time of its last successful run (None: never ran); the next run is due at
            `last_run_at_s + interval`.
        held: its last result, kept only under HOLD_LAST.
        failures_at_s, circuit_opened_at_s: its circuit breaker (`planner_core.pipeline.breaker`).
    """

    plugin_id: str
    registered_at_s: float
    last_run_at_s: float | None = None
    held: HeldResult | None = None
    # circuit breaker (plugins with a `BreakerSpec` only), in tick time: the failures inside the window, oldest
    # first, and when the breaker opened (None: closed)
    failures_at_s: tuple[float, ...] = ()
    circuit_opened_at_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteAnswer:
    """What one out-of-process (gRPC) plugin answered in one phase of one tick, as the pipeline will use it.

    The runtime turns the wire answer (or the failure: unreachable, deadline exceeded, garbage) into this record;
    the pipeline turns the record into the plugin's result (`planner_core.pipeline.remote.answer_result`). Live
    ticks and replay go through the same conversion, so a replayed tick uses exactly what the plugin said.

    Attributes:
        plugin_id: the plugin (`scheduling.external_plugins[].plugin_id`).
        phase: the phase's value ("observe", "predict", "propose", "reconcile", "constrain").
        reason: PLUGIN_OBSERVED / PREDICTED / PLUGIN_OVERRIDES / PLUGIN_NO_OPINION when it answered usefully;
            PLUGIN_TIMEOUT, PLUGIN_UNAVAILABLE, PLUGIN_INVALID_RESULT or PLUGIN_RAISED when the call failed.
        detail: the plugin's own reason string, or what went wrong (one line).
        predictions, overrides, final, observations: the answer (PREDICT, PROPOSE/RECONCILE/CONSTRAIN, OBSERVE).
    """

    plugin_id: str
    phase: str
    reason: ReasonCode
    detail: str = ""
    predictions: PartialPrediction | None = None
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    observations: tuple[ObservedValue, ...] = ()

    @property
    def failed(self) -> bool:
        return self.reason in REMOTE_FAILURES


# The reasons of a remote answer that is a failure: the plugin is skipped and its breaker counts it.
REMOTE_FAILURES = frozenset(
    {
        ReasonCode.PLUGIN_TIMEOUT,
        ReasonCode.PLUGIN_UNAVAILABLE,
        ReasonCode.PLUGIN_INVALID_RESULT,
        ReasonCode.PLUGIN_RAISED,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineState:
    """Scheduling state of the plugin pipeline: one entry per plugin, sorted by plugin id."""

    plugins: tuple[PluginSchedule, ...] = ()

    def schedule(self, plugin_id: str) -> PluginSchedule | None:
        """The entry of one plugin, or None if the pipeline has not seen it yet."""
        for entry in self.plugins:
            if entry.plugin_id == plugin_id:
                return entry
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdPlannerState:
    """Cross-tick state of the 2025 threshold load planner (`load_policy: threshold_2025`).

    The planner samples every load tick and decides once per adjustment interval on the interval's averages, so
    it carries the samples of the interval in progress. An interval starts on the first stable tick (no scale in
    flight) and restarts after every adjustment, and whenever a scale is in flight (sampling is blocked then).

    Attributes:
        interval_start_s: scheduled time of the tick that opened the interval in progress; None = no interval open.
        interval_num_prefill, interval_num_decode: ready workers when the interval opened; an adjustment is skipped
            if they changed meanwhile (the averages would mix two fleet sizes).
        prefill_queue_samples: queued prefill requests summed over the prefill engines, one per sampled tick, oldest
            first (the first and last give the queue trend).
        decode_kv_samples: KV-cache utilisation (0..1, queued KV included) averaged over the decode engines, one
            per sampled tick, oldest first.
        decode_grace_intervals_left: adjustments that still may not remove a decode worker (set after adding one).
    """

    interval_start_s: float | None = None
    interval_num_prefill: int = 0
    interval_num_decode: int = 0
    prefill_queue_samples: tuple[float, ...] = ()
    decode_kv_samples: tuple[float, ...] = ()
    decode_grace_intervals_left: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SizedNeed:
    """What the throughput loop sized each pool for at one tick, before bounds (kept for the scale-down hold)."""

    at_s: float
    num_prefill: int
    num_decode: int


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


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingScaleUp:
    """A pool's scale-up the planner decided and is waiting to see ready (for the measured start-up time).

    `at_s` is the tick that raised the pool's target to `target` engines; `applied_at_s` when the execution flow
    applied a decision with at least that target through the connector (its acknowledgement), once a tick's
    `TickInputs.applied` has shown it. The start-up runs from `at_s` until a tick sees `target` engines ready."""

    component: Component
    at_s: float
    target: int
    applied_at_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartupSample:
    """One completed scale-up: `startup_s` from the tick that raised the target to the first tick that saw the new
    engines ready (an upper bound, to within one tick interval), observed at `at_s`; `apply_s`, of that time, from
    the raising tick to the connector's acknowledgement of the target (None where no acknowledgement was seen: the
    connector applied it within the deciding tick)."""

    component: Component
    at_s: float
    startup_s: float
    apply_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartupState:
    """The measured start-up times (ours): scale-ups in flight and the last completed ones, per pool."""

    pending: tuple[PendingScaleUp, ...] = ()
    samples: tuple[StartupSample, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HorizonWindow:
    """One throughput window for the learned horizon headroom (ours), per pool in engines before rounding up:
    `planned_*` is what the tick at `at_s` sized the pool for (its forecast: mean rate and prompt bursts), and
    `observed_*` what the window that ended at `at_s` needed (the same sizing on what was observed)."""

    at_s: float
    planned_prefill: float = 0.0
    observed_prefill: float = 0.0
    planned_decode: float = 0.0
    observed_decode: float = 0.0

    def planned(self, component: Component) -> float:
        return self.planned_prefill if component is Component.PREFILL else self.planned_decode

    def observed(self, component: Component) -> float:
        return self.observed_prefill if component is Component.PREFILL else self.observed_decode


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerState:
    """Cross-tick state of one managed deployment; stored as JSONB after every tick."""

    load_history: LoadHistory = field(default_factory=LoadHistory)
    throughput_lower_bound_prefill: int = 1
    throughput_lower_bound_decode: int = 1
    num_throughput_ticks: int = 0
    num_load_ticks: int = 0
    # Last observed router KV hit rate and speculative accept length (last-value semantics; None = never seen).
    last_kv_hit_rate: float | None = None
    last_accept_length: float | None = None
    perf_models: OnlinePerfState = field(default_factory=OnlinePerfState)  # online FPM regressions per role
    pipeline: PipelineState = field(default_factory=PipelineState)  # plugin schedules (planner_core.pipeline)
    threshold_planner: ThresholdPlannerState = field(default_factory=ThresholdPlannerState)
    # Ours: the throughput loop's needs over the last `throughput_scale_down_hold_seconds`, oldest first.
    recent_throughput_needs: tuple[SizedNeed, ...] = ()
    # Ours: scale-ups in flight and completed, for each pool's measured start-up time (`planner_core.policy.horizon`).
    startup: StartupState = field(default_factory=StartupState)
    # Ours: the last windows' observed and forecast rates, whose closed horizons give the learned headroom.
    horizon_windows: tuple[HorizonWindow, ...] = ()


class StepName(enum.StrEnum):
    """The name of a step the planner itself records (`StepRecord.step`); the values are stored in `tick_steps`.

    Plugin steps are named at the plugin boundary instead (`planner_core.pipeline`): `<phase>:<plugin_id>`,
    `<phase>:merge`, `predict:<plugin_id>`, `plugin_load:<entry point>`, and whatever names a user plugin gives
    its own steps. Those stay plain strings because plugin ids and user step names are open-ended (user code
    chooses them); `StepRecord` turns a string that is one of these values into the member.
    """

    ACCEPT_LENGTH = "accept_length"
    AGG_SIGNAL = "agg_signal"
    BURST = "burst"
    CAPACITY = "capacity"
    CHANGE_RATE = "change_rate"
    CONSOLIDATION = "consolidation"
    CORRECTION = "correction"
    DECIDE = "decide"
    DECODE_GRACE = "decode_grace"
    DEMAND = "demand"
    ENGINE_CAPACITY = "engine_capacity"
    ENGINE_LOAD = "engine_load"
    EXECUTE = "execute"
    FLEET = "fleet"
    FLEET_CEILING = "fleet_ceiling"
    FORWARD_PASS_MODEL = "forward_pass_model"
    GPU_BUDGET = "gpu_budget"
    HEADROOM = "headroom"
    INTERVAL = "interval"
    INTERVAL_AVERAGE = "interval_average"
    ITL_ESTIMATE = "itl_estimate"
    ITL_SIGNAL = "itl_signal"
    KV_HIT_RATE = "kv_hit_rate"
    LENGTH_SIZING = "length_sizing"
    LOAD = "load"
    LOAD_DECISION = "load_decision"
    MIN_ENDPOINT = "min_endpoint"
    MODEL = "model"
    NEXT_REQUEST = "next_request"
    OBSERVE = "observe"
    PERF_MODEL_AGG = "perf_model_agg"
    PERF_MODEL_DECODE = "perf_model_decode"
    PERF_MODEL_PREFILL = "perf_model_prefill"
    PLUGIN = "plugin"
    PREDICT = "predict"
    SAMPLE = "sample"
    SCALE_DOWN_HOLD = "scale_down_hold"
    HORIZON = "horizon"
    STARTUP = "startup"
    THRESHOLD_SIGNAL = "threshold_signal"
    THROUGHPUT = "throughput"
    THROUGHPUT_FLOOR = "throughput_floor"
    TTFT_ESTIMATE = "ttft_estimate"
    TTFT_SIGNAL = "ttft_signal"
    UNPLACED_SIGNAL = "unplaced_signal"  # the load loop: requests the router could not place


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One named step of a tick: its value and why. The list of these is the tick's explanation.

    `step` is a `StepName` for the planner's own steps, a plain string only for the plugin-scoped names described
    in `StepName` (a string equal to a `StepName` value is stored as that member, so a row read back compares the
    same way).
    """

    step: StepName | str
    reason: ReasonCode
    component: Component | None = None
    value: float | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.step, StepName) and self.step in _STEP_NAMES:
            object.__setattr__(self, "step", StepName(self.step))


_STEP_NAMES = frozenset(StepName)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaProposal:
    """A loop's proposed replica count for one pool, before execution."""

    component: Component
    current: int
    desired: int
    reason: ReasonCode


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingDecision:
    """Targets to apply; None means "no opinion" for that pool."""

    num_prefill: int | None = None
    num_decode: int | None = None
    advisory: bool = False

    @property
    def is_empty(self) -> bool:
        return self.num_prefill is None and self.num_decode is None


@dataclass(frozen=True, slots=True, kw_only=True)
class TickOutcome:
    """What `tick()` returns: the decision, the state to carry forward, and the explanation."""

    decision: ScalingDecision
    next_state: PlannerState
    steps: tuple[StepRecord, ...]
    proposals: tuple[ReplicaProposal, ...] = ()
    prediction: Prediction | None = None
    prediction_reason: ReasonCode | None = None
    reason: ReasonCode = ReasonCode.UNSET  # the loop's headline reason (Dynamo's per-loop decision enum)


# --- JSON form ------------------------------------------------------------------------------------------------


def to_jsonable(value: Any, *, omit_defaults: bool = False) -> Any:
    """Turn a dataclass/enum/tuple tree into JSON-compatible values (dicts, lists, str, numbers).

    With `omit_defaults`, a dataclass field holding exactly its default (same type and value, the sign of a zero
    included) is left out: `from_jsonable` fills it back in, so the tree reads back equal with less to store. What
    was stored that way depends on the defaults staying what they are (pinned by tests/test_stored_defaults.py)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name), omit_defaults=omit_defaults)
            for f in dataclasses.fields(value)
            if not (omit_defaults and _holds_default(f, getattr(value, f.name)))
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_jsonable(v, omit_defaults=omit_defaults) for v in value]
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return repr(value)  # JSONB has no NaN/inf; keep them visible as strings
    return value


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (its factory's product), or `dataclasses.MISSING` for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _holds_default(f: dataclasses.Field, value: Any) -> bool:
    default = field_default(f)
    return default is not dataclasses.MISSING and _strictly_equal(value, default)


def _strictly_equal(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 is not 1.0, 0.0 is not -0.0): what reads back the same."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(_strictly_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_strictly_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def _coerce(annotation: str, raw: Any) -> Any:
    """Rebuild a field value from its JSON form using the (string) annotation of the dataclass field."""
    if raw is None:
        return None
    base = annotation.replace(" | None", "").strip()
    if base in _DATACLASSES:
        return from_jsonable(_DATACLASSES[base], raw)
    if base in _ENUMS:
        return _ENUMS[base](raw)
    if base.startswith("tuple["):
        inner = base[len("tuple[") : -1].split(",")[0].strip()
        return tuple(_coerce(inner, item) for item in raw)
    if base == "float":
        return float(raw)
    return raw


def from_jsonable(cls: type[T], data: Mapping[str, Any]) -> T:
    """Inverse of `to_jsonable` for the dataclasses of this module."""
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _coerce(str(f.type), data[f.name])
    return cls(**kwargs)


# --- Stored tick inputs ---------------------------------------------------------------------------------------
# `ticks.inputs` holds `to_jsonable(inputs, omit_defaults=True)` with two parts written by position instead of by
# key (migration 0020): the worker counts, and each engine's forward-pass metrics, whose long key names were most
# of a load tick's row; and without the two fields the tick's row holds in its own columns: `loop`, and `now_s`
# when it is the tick's scheduled time (as every live tick's is) to the bit. A positional record lists its
# dataclass's fields in their declared order (nested records likewise: an engine's `scheduled` and `queued`
# counters), and leaves out the trailing fields that hold their defaults (an idle queue, a serving engine). Stored
# ticks are read back by position: the field order of these records is pinned by tests/test_stored_defaults.py
# with their defaults, and changing it needs a migration.
POSITIONAL_IN_STORED_INPUTS = ("workers", "fpm")


def to_positional(value: Any) -> list[Any]:
    """A dataclass as the JSON array of its fields in declared order (nested dataclasses as arrays too), without
    the trailing fields that hold their defaults (same type and value, the sign of a zero included)."""
    fields = dataclasses.fields(value)
    items = [
        to_positional(v) if dataclasses.is_dataclass(v) else to_jsonable(v)
        for v in (getattr(value, f.name) for f in fields)
    ]
    end = len(fields)
    while end > 0 and _holds_default(fields[end - 1], getattr(value, fields[end - 1].name)):
        end -= 1
    return items[:end]


def from_positional(cls: type[T], row: list[Any]) -> T:
    """Inverse of `to_positional`: the fields it left out take their defaults."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not isinstance(row, list) or len(row) > len(fields):
        raise ValueError(f"{cls.__name__}: stored as {row!r}, not an array of at most {len(fields)} fields")
    kwargs = {}
    for f, raw in zip(fields, row, strict=False):
        nested = _DATACLASSES.get(str(f.type))
        kwargs[f.name] = from_positional(nested, raw) if nested is not None else _coerce(str(f.type), raw)
    return cls(**kwargs)


def stored_inputs(inputs: TickInputs, scheduled_s: float) -> dict[str, Any]:
    """A tick's inputs as `ticks.inputs` stores them: without the fields at their defaults, the worker counts and
    each engine's forward-pass metrics as positional arrays, without `loop` (the tick's column) and without
    `now_s` if it is `scheduled_s` exactly (the tick's `scheduled_at` in epoch seconds, which is what its
    column gives back). `inputs_from_stored` reads them back equal."""
    data = to_jsonable(inputs, omit_defaults=True)
    del data["loop"]
    if _strictly_equal(inputs.now_s, scheduled_s):
        del data["now_s"]
    data["workers"] = to_positional(inputs.workers)
    if inputs.fpm:
        data["fpm"] = [to_positional(fpm) for fpm in inputs.fpm]
    return data


def inputs_from_stored(data: Mapping[str, Any], loop: Loop, scheduled_s: float) -> TickInputs:
    """Inverse of `stored_inputs` (what replay reads from `ticks.inputs`), given the tick's `loop` and
    `scheduled_at` in epoch seconds."""
    if not isinstance(data.get("workers"), list):
        raise ValueError(f"stored inputs: workers {data.get('workers')!r} is not a positional array (migration 0020)")
    kwargs = {
        f.name: _coerce(str(f.type), data[f.name])
        for f in dataclasses.fields(TickInputs)
        if f.name in data and f.name not in (*POSITIONAL_IN_STORED_INPUTS, "loop")
    }
    kwargs.setdefault("now_s", scheduled_s)
    return TickInputs(
        **kwargs,
        loop=loop,
        workers=from_positional(WorkerCounts, data["workers"]),
        fpm=tuple(from_positional(ForwardPassMetrics, row) for row in data.get("fpm", ())),
    )


_DATACLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        RecordedArrivals,
        TrafficObservation,
        WorkerCounts,
        ScheduledRequests,
        QueuedRequests,
        ForwardPassMetrics,
        EngineLimits,
        FpmSample,
        OnlineModelState,
        OnlinePerfState,
        UnplacedRequests,
        TickInputs,
        Prediction,
        KalmanState,
        ArimaFit,
        ArimaSearch,
        ArimaState,
        MemberScore,
        EnsembleState,
        SeriesModel,
        LoadHistory,
        ReplicaOverride,
        PartialPrediction,
        HeldResult,
        ObservedValue,
        RemoteAnswer,
        PluginSchedule,
        PipelineState,
        ThresholdPlannerState,
        SizedNeed,
        AppliedTargets,
        PendingScaleUp,
        StartupSample,
        StartupState,
        HorizonWindow,
        PlannerState,
        StepRecord,
        ReplicaProposal,
        ScalingDecision,
        TickOutcome,
    )
}
_ENUMS: dict[str, type[enum.Enum]] = {
    cls.__name__: cls
    for cls in (
        Component,
        Loop,
        ReasonCode,
        LengthQuantile,
        LoadSeries,
        EnsembleMember,
        PerfModelRole,
        ModelReadiness,
        OverrideType,
        HoldPolicy,
        ExecuteAction,
        EngineLifecycle,
    )
}
