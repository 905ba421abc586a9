"""What a simulation run is given and what it gives back: the cluster spec (`SimSpec`, routing and KV
allocation choices), the per-request result (`SimResult`) and the window observation both bench engines build
a tick's observation with (`window_observation`). The model itself is described in `planner_core.lab.sim.des`."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

import numpy as np

from planner_core.arrivals import with_arrivals
from planner_core.config import PlannerConfig, PlannerMode
from planner_core.domain import (
    Component,
    EngineLimits,
    LatencyHistogram,
    TrafficObservation,
)
from planner_core.lab.sim.des.speed import PROFILE_SPEED, EngineSpeed, SpeedChange
from planner_core.planner import Planner
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.scheduler import SloTargets
from planner_core.traces import RequestTrace


class RouterPolicy(enum.StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"
    SLO = "slo"  # SLO-aware: lowest predicted latency within SLO x dispatch threshold (`SloRouting`)


class NoEndpointAction(enum.StrEnum):
    """What the SLO-aware router does with a request no engine is predicted to serve within the threshold."""

    QUEUE = "queue"  # wait at the frontend (FIFO), retried; placed anyway once `max_wait_s` has passed
    REJECT = "reject"  # dropped: never served, counted as a miss


@dataclass(frozen=True, slots=True, kw_only=True)
class SloRouting:
    """The SLO-aware router's settings (router `slo`; see the module docstring).

    Attributes:
        predictor: the latency predictor (profiling tables).
        targets: TTFT / TPOT SLO and dispatch thresholds.
        no_endpoint: QUEUE or REJECT.
        adaptive_pd: prefill short prompts on a decode engine when no prefill engine is predicted within the TTFT
            threshold (disaggregated, ON_DEMAND KV only).
        adaptive_max_prompt_tokens: the longest prompt prefilled on a decode engine.
        retry_s: how often the frontend queue is retried.
        max_wait_s: the longest wait at the frontend before a request is placed whatever its prediction; None: the
            TTFT target.
    """

    predictor: LatencyPredictor
    targets: SloTargets
    no_endpoint: NoEndpointAction = NoEndpointAction.QUEUE
    adaptive_pd: bool = True
    adaptive_max_prompt_tokens: int = 1024
    retry_s: float = 0.05
    max_wait_s: float | None = None


class KvAllocation(enum.StrEnum):
    """How decode and aggregated engines hold KV cache (see the module docstring)."""

    RESERVE = "reserve"  # a request's whole footprint (ISL + OSL) at admission; never a preemption
    ON_DEMAND = "on_demand"  # the prompt at admission, one token per iteration; preemption when the cache is full


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSpec:
    """Static description of the simulated cluster.

    Attributes:
        prefill_limits, decode_limits: per-engine limits of each pool (aggregated engines use `decode_limits`).
        startup_s: time from asking for a worker to its being ready.
        kv_transfer_s_per_token: prefill-to-decode KV transfer time per prompt token (disaggregated only).
        router: how requests are spread over ready workers.
        aggregated: one pool of aggregated engines (create the simulator with `num_prefill=0`).
        first_token_from_decode: disaggregated TTFT ends with the decode engine's first iteration (see the
            module docstring); False: it ends when the prefill and the KV transfer are done.
        prefix_caching: reuse cached prefix blocks when the trace has block ids (`RequestTrace.hash_ids`).
        kv_allocation: RESERVE (the whole footprint at admission) or ON_DEMAND (allocation as tokens are
            generated, with recompute preemption of the newest request when the cache is full).
        kv_watermark: ON_DEMAND only: the fraction of `max_kv_tokens` an admission must leave free (headroom for
            the running requests' growth, as an engine's KV watermark).
        recompute_after_handoffs: ON_DEMAND, disaggregated decode engines only: requests arriving from a prefill
            engine are admitted before preempted requests waiting to be recomputed, which wait until no transferred
            request is waiting (Dynamo's mocker does so); False (default): one FIFO queue with the preempted
            requests at its head, as vLLM's scheduler.
        slo_routing: the SLO-aware router's settings; required with `router=RouterPolicy.SLO`.
        engine_speed: the engines' speed as a multiple of the profile's (`planner_core.lab.sim.des.speed`; the
            planners and the router's predictor still read the profile).
        speed_change: the engines' speed from a given time on (None: `engine_speed` throughout).
    """

    prefill_limits: EngineLimits = field(default_factory=EngineLimits)
    decode_limits: EngineLimits = field(default_factory=EngineLimits)
    startup_s: float = 120.0
    kv_transfer_s_per_token: float = 0.0
    router: RouterPolicy = RouterPolicy.LEAST_LOADED
    aggregated: bool = False
    first_token_from_decode: bool = True
    prefix_caching: bool = True
    kv_allocation: KvAllocation = KvAllocation.ON_DEMAND
    kv_watermark: float = 0.01
    recompute_after_handoffs: bool = False
    slo_routing: SloRouting | None = None
    engine_speed: EngineSpeed = PROFILE_SPEED
    speed_change: SpeedChange | None = None


def spec_for_config(config: PlannerConfig, *, profiled_max_kv_tokens: int | None, startup_s: float = 120.0) -> SimSpec:
    """The cluster a planner config describes: its engines' limits (the profile's KV capacity where the config
    leaves it unset) and its mode (`agg`: one pool of aggregated engines, `decode_limits`)."""
    return SimSpec(
        prefill_limits=config.engine_limits(Component.PREFILL, profiled_max_kv_tokens=profiled_max_kv_tokens),
        decode_limits=config.engine_limits(Component.DECODE, profiled_max_kv_tokens=profiled_max_kv_tokens),
        startup_s=startup_s,
        aggregated=config.mode is PlannerMode.AGG,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Per-request outcome (arrays indexed like the trace) and the cluster's GPU-seconds."""

    ttft_s: np.ndarray  # NaN for requests whose first token had not appeared when the run ended
    itl_s: np.ndarray  # mean gap between tokens after the first; NaN when unfinished or OSL <= 1
    finish_s: np.ndarray
    gpu_s: float
    num_scaling_events: int
    worker_timeline: tuple[tuple[float, int, int], ...]  # (time, ready prefill, ready decode) at each change
    cached_tokens: np.ndarray | None = None  # prompt tokens found in a prefix cache (0 without block ids)
    num_preemptions: int = 0  # ON_DEMAND: times a running request was evicted (each one is recomputed later)
    # router `slo` (zeros and None otherwise): requests with no available endpoint (once per stage), rejected,
    # prefilled on a decode engine, and placed past `max_wait_s` whatever their prediction
    num_unplaced: int = 0
    num_rejected: int = 0
    num_local_prefills: int = 0
    num_overdue: int = 0
    # per request: the placement's prediction (ms, NaN where none) and the dispatch time of the first stage (s)
    predicted_ttft_ms: np.ndarray | None = None
    predicted_tpot_ms: np.ndarray | None = None
    dispatch_s: np.ndarray | None = None


def window_kv_hit_rate(
    arrival_s: np.ndarray,
    isl: np.ndarray,
    cached_tokens: np.ndarray,
    ttft_s: np.ndarray,
    start_s: float,
    end_s: float,
) -> tuple[float | None, int]:
    """Prefix-cache hit rate of the window: cached prompt tokens over prompt tokens, over the requests that
    arrived in [start_s, end_s) and have been served a first token (the others have not been looked up in a
    cache yet), and how many those are. (None, 0) with no such request."""
    served = (arrival_s >= start_s) & (arrival_s < end_s) & np.isfinite(ttft_s)
    tokens = float(isl[served].sum())
    if tokens <= 0:
        return None, 0
    return float(cached_tokens[served].sum()) / tokens, int(served.sum())


# The frontend's latency histogram buckets (s): what the simulator's exporter publishes and the observation carries
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def latency_histogram(values_s: np.ndarray) -> LatencyHistogram | None:
    """The frontend's histogram (`LATENCY_BUCKETS_S`) of the finite latencies `values_s`; None without one."""
    values_s = values_s[np.isfinite(values_s)]
    if not len(values_s):
        return None
    ordered = np.sort(values_s)
    cumulative = np.searchsorted(ordered, LATENCY_BUCKETS_S, side="right")
    return LatencyHistogram(
        bounds_ms=tuple(b * 1000.0 for b in LATENCY_BUCKETS_S),
        cumulative=tuple(float(c) for c in cumulative),
        count=float(len(values_s)),
    )


def window_observation(
    trace: RequestTrace,
    start_s: float,
    end_s: float,
    *,
    ttft_ms: float | None,
    itl_ms: float | None,
    kv_hit_rate: float | None,
    planner: Planner | None = None,
    ttft_ms_p95: float | None = None,
    ttft_ms_p99: float | None = None,
    queue_ms: float | None = None,
    ttft_histogram: LatencyHistogram | None = None,
    itl_histogram: LatencyHistogram | None = None,
) -> TrafficObservation:
    """What a planner observes of the window [start_s, end_s): the trace's arrivals and lengths in it
    (`RequestTrace.observe`), the engine's mean TTFT/ITL and prefix-cache hit rate over it, and, for a `planner`,
    the requests' arrivals as recorded (`planner_core.arrivals.with_arrivals`: its tick derives the prompt-arrival
    curve from them at its engine rate). The one path by which both bench engines (this simulator and Dynamo's replay,
    `planner_core.lab.sim.dynamo_engine`) build a tick's observation; they differ only in where the latency
    figures come from. The frontend's TTFT tail, queue time and latency histograms (`ttft_ms_p95`, `ttft_ms_p99`,
    `queue_ms`, `ttft_histogram`, `itl_histogram`) are None where the engine does not measure them."""
    base = trace.observe(start_s, end_s)
    observed = dataclasses.replace(
        base,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        kv_hit_rate=kv_hit_rate,
        ttft_ms_p95=ttft_ms_p95,
        ttft_ms_p99=ttft_ms_p99,
        queue_ms=queue_ms,
        ttft_histogram=ttft_histogram,
        itl_histogram=itl_histogram,
    )
    if planner is None:
        return observed
    return with_arrivals(observed, trace.arrivals(start_s, end_s), start_s, end_s)
