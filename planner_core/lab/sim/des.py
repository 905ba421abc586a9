"""Discrete-event simulator of a serving cluster (disaggregated prefill/decode pools, or one pool of aggregated
engines), driven by a request trace.

Role: the rig that tells what a scaling policy costs (GPU-hours) and what it delivers (per-request TTFT and ITL)
without GPUs. Engine time comes from a `ForwardPassModel` (calibrated on measured data), so the simulator and the
planner's SLA models share one notion of engine speed.

Model:
- Prefill engines (disaggregated) run chunked prefill: each iteration takes prompt tokens from the head of the
  engine's FIFO queue, at most `max_num_batched_tokens` tokens and `max_num_seqs` requests, and lasts
  `prefill_wall_s(tokens)`. When a prompt's last chunk is done its KV cache moves to a decode engine
  (`kv_transfer_s_per_token * ISL`).
- Decode engines run continuous batching: every iteration advances each running request by one token and lasts
  `decode_wall_s(num_running, kv_tokens)`. A request is admitted when a sequence slot is free and its KV fits
  (`kv_allocation` below: by default its prompt, then one token per iteration, with preemption when the cache
  is full), otherwise it waits in the engine's queue. To
  stay fast, iterations are not events: between membership changes a decode engine runs a segment of
  identical-length iterations (the KV size at the segment's midpoint); an admission interrupts the segment at the
  next iteration boundary.
- First token: with `first_token_from_decode` (default) the client's first token is the decode engine's first
  iteration after admission, as in a disaggregated deployment where the decode worker streams every token (the
  prefill worker's sampled token is not returned); the request then decodes OSL iterations. Otherwise the first
  token appears when the prefill (plus transfer) ends and decode runs OSL - 1 iterations.
- Aggregated engines (`SimSpec.aggregated`, the decode pool only, `decode_limits`): chunked prefill piggybacked
  on the decode batch. Each iteration every running request decodes one token and takes one token of the
  `max_num_batched_tokens` budget; the rest of the budget goes to admitted prompts in FIFO order. A mixed
  iteration lasts `mixed_wall_s(prefill tokens, num_decode, kv)` (`prefill_wall_s` with nothing decoding); the
  iteration that finishes a prompt yields its first token. A prompt is admitted when a sequence slot
  (running + prefilling < `max_num_seqs`) and its KV fit (`kv_allocation`). Pure-decode stretches run as
  segments, as above; an arriving request interrupts a segment at the next iteration boundary.
- KV allocation (`kv_allocation`): RESERVE holds a request's whole footprint (ISL + OSL tokens) from admission,
  so nothing is preempted, but it uses the output length and leaves KV idle. ON_DEMAND (default), as vLLM's
  scheduler: a decode or
  aggregated engine holds a request's prompt from admission and one more token per iteration. At every iteration
  boundary the running requests' next tokens are allocated first: while they do not fit `max_kv_tokens`, the most
  recently admitted request (running or prefilling) is preempted (its KV freed, it goes back to the head of the
  engine's queue, counted in `SimResult.num_preemptions`); one request alone is never preempted. Only at a boundary
  without preemption are waiting requests admitted, in FIFO order, when a sequence slot is free and their KV (the
  prompt, or for a preempted request its prompt plus the tokens generated so far) fits beside the running
  requests' next tokens and `kv_watermark * max_kv_tokens` of headroom. A preempted request is recomputed on its
  engine: its prompt and generated tokens are prefilled again (chunked, in mixed iterations with the running
  batch, `mixed_wall_s`, or `prefill_wall_s` alone; on an aggregated engine the leading prompt blocks still in its
  prefix cache are skipped), the iteration that completes it yields its next token, and it then decodes the rest.
  KV is counted in tokens, not blocks. Pure-decode segments end before the iteration whose growth would not fit.
  `recompute_after_handoffs` has a disaggregated decode engine admit transferred requests before preempted ones.
- Prefix caching (`prefix_caching`, when the trace has prefix block ids): every prefill or aggregated engine keeps
  an LRU cache of `max_kv_tokens // block_tokens` blocks. When the engine first schedules a request, the
  leading blocks of its prompt found there are skipped (at least one token is always computed); its blocks enter
  the cache as chunks complete them, and when the prompt is done they are ordered for eviction tail first.
- Scaling is not free: a new worker is ready `startup_s` after it is requested; a removed worker first stops
  receiving requests, then leaves when its queue and batch are empty (starting workers are cancelled first).
  GPU-seconds accrue on starting, ready and draining workers.
- A router spreads requests over ready, non-draining workers: round-robin or least-loaded (queued prompt tokens
  for prefill; reserved plus waiting KV tokens for decode and aggregated engines). With no ready worker,
  requests wait at the router.
- Router `slo` (`SloRouting`, `planner_core.routing`): at each stage the engine with the lowest predicted latency
  among those predicted within `SLO x dispatch threshold` (prefill and aggregated engines: TTFT from their queued
  prompt tokens, in chunks, with their decode batch; decode engines: TPOT with the request in the batch). With
  none, the request has no available endpoint, counted once per stage (`SimResult.num_unplaced`), and then: with
  `adaptive_pd`, a prompt of at most `adaptive_max_prompt_tokens` is prefilled on the decode engine predicted to
  give the lowest TTFT within the threshold (chunked, in mixed iterations with its batch, as a recompute; ON_DEMAND
  only; counted in `num_local_prefills`); else `no_endpoint` REJECT drops it (never served, a miss) or QUEUE holds
  it at the frontend, FIFO, retried every `retry_s`: the head is placed when an engine is predicted within the
  threshold, or, once it has waited `max_wait_s` (default the TTFT target: past it the request misses its TTFT
  anyway), on the lowest-predicted engine whatever the prediction (`num_overdue`). Every placement records its
  prediction (`SimResult.predicted_ttft_ms` / `predicted_tpot_ms`) for the predictor's error against the
  measured latency.

Deterministic for a given trace, spec and scaling timeline. No wall clock; time is the offset (s) from the first
request of the trace.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import heapq
import itertools
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from planner_core.arrivals import with_arrivals
from planner_core.config import PlannerConfig, PlannerMode
from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    QueuedRequests,
    ScheduledRequests,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.perf.forward import ForwardPassModel
from planner_core.planner import Planner
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.scheduler import (
    Candidate,
    InstanceStatus,
    RouteDecision,
    SloTargets,
    Stage,
    filter_and_select,
    predict_decode,
    predict_prefill,
)
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


def spec_for_config(config: PlannerConfig, *, profiled_max_kv_tokens: int | None, startup_s: float = 120.0) -> SimSpec:
    """The cluster a planner config describes: its engines' limits (the profile's KV capacity where the config
    leaves it unset) and its mode (`agg`: one pool of aggregated engines, `decode_limits`)."""
    return SimSpec(
        prefill_limits=config.engine_limits(Component.PREFILL, profiled_max_kv_tokens=profiled_max_kv_tokens),
        decode_limits=config.engine_limits(Component.DECODE, profiled_max_kv_tokens=profiled_max_kv_tokens),
        startup_s=startup_s,
        aggregated=config.mode is PlannerMode.AGG,
    )


class _WorkerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


class _Kind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    AGG = "agg"


@dataclass(slots=True, eq=False)
class _Worker:
    worker_id: str
    component: Component
    kind: _Kind
    state: _WorkerState
    requested_at_s: float
    ready_at_s: float
    gone_at_s: float = math.inf
    # prefill: FIFO of [request index, prompt tokens left, scheduled yet]; decode and agg: FIFO of request indices
    # waiting for a slot (agg engines keep their admitted, still prefilling requests in `prefilling`)
    queue: deque = field(default_factory=deque)
    queued_tokens: int = 0  # prompt tokens still to compute (prefill: queue; agg: queue + prefilling)
    queued_footprint: int = 0  # decode and agg: ISL + OSL of the waiting requests
    busy: bool = False  # an iteration event is in flight (prefill, or an agg mixed iteration)
    prefilling: deque = field(default_factory=deque)  # agg: [request index, prompt tokens left]
    # decode and agg: request j has produced `iter_count - joined_at[j]` tokens; `finish_heap` holds
    # (iteration at which it is done, request) so completions pop in O(log n)
    running: set[int] = field(default_factory=set)
    finish_heap: list[tuple[int, int]] = field(default_factory=list)
    # decode: requests admitted at the running segment's start; their first token is its first iteration's end
    first_pending: list[int] = field(default_factory=list)
    iter_count: int = 0
    sum_isl_running: int = 0
    sum_joined_running: int = 0
    reserved_kv: int = 0
    prefill_kv: int = 0  # ON_DEMAND: KV tokens allocated to the admitted prompts still prefilling
    preempted: deque = field(default_factory=deque)  # ON_DEMAND with `recompute_after_handoffs`: decode recomputes
    segment_version: int = 0
    segment_start_s: float = 0.0
    segment_iter_s: float = 0.0
    segment_iters: int = 0
    last_iter_s: float = 0.0
    last_chunk_requests: int = 0
    last_chunk_tokens: int = 0
    # prefill and agg with prefix caching: block id -> None, least recently used first
    cache: OrderedDict | None = None
    cache_blocks: int = 0

    @property
    def idle(self) -> bool:
        return not self.queue and not self.running and not self.busy and not self.prefilling and not self.preempted


_ARRIVAL, _READY, _PREFILL_DONE, _DECODE_HANDOFF, _SEGMENT_END, _AGG_ITER_END, _OD_ITER_END, _FRONTEND_RETRY = range(8)


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
) -> TrafficObservation:
    """What a planner observes of the window [start_s, end_s): the trace's arrivals and lengths in it
    (`RequestTrace.observe`), the engine's mean TTFT/ITL and prefix-cache hit rate over it, and, for a `planner`,
    the requests' arrivals as recorded (`planner_core.arrivals.with_arrivals`: its tick derives the prompt-arrival
    curve from them at its engine rate). The one path by which both bench engines (this simulator and Dynamo's replay,
    `planner_core.lab.sim.dynamo_engine`) build a tick's observation; they differ only in where the latency
    figures come from. The frontend's TTFT tail and queue time (`ttft_ms_p95`, `ttft_ms_p99`, `queue_ms`) are None
    where the engine does not measure them."""
    base = trace.observe(start_s, end_s)
    observed = dataclasses.replace(
        base,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        kv_hit_rate=kv_hit_rate,
        ttft_ms_p95=ttft_ms_p95,
        ttft_ms_p99=ttft_ms_p99,
        queue_ms=queue_ms,
    )
    if planner is None:
        return observed
    return with_arrivals(observed, trace.arrivals(start_s, end_s), start_s, end_s)


class ClusterSimulator:
    """A mutable simulation run. Drive it with `run_until(t)`, read `observe()`, change it with `set_targets()`.

    Aggregated mode (`spec.aggregated`): pass `num_prefill=0` and the aggregated engines as `num_decode`; they
    are the decode pool for `set_targets`, `worker_counts` and `latest_fpm`.
    """

    def __init__(
        self,
        trace: RequestTrace,
        fwd: ForwardPassModel,
        spec: SimSpec,
        *,
        num_prefill: int,
        num_decode: int,
    ) -> None:
        if spec.aggregated and num_prefill:
            raise ValueError(f"aggregated mode has no prefill pool: num_prefill must be 0, got {num_prefill}")
        if spec.router is RouterPolicy.SLO and spec.slo_routing is None:
            raise ValueError("router 'slo' needs SimSpec.slo_routing (the predictor and the SLO targets)")
        self.trace = trace
        self.fwd = fwd
        self.spec = spec
        self.now_s = 0.0
        self._isl = np.asarray(trace.isl, dtype=np.int64)
        self._osl = np.maximum(np.asarray(trace.osl, dtype=np.int64), 1)
        # Python ints for the hot paths (NumPy scalars are slow to index and add one by one).
        self._isl_l: list[int] = self._isl.tolist()
        self._osl_l: list[int] = self._osl.tolist()
        self._footprint_l: list[int] = (self._isl + self._osl).tolist()
        self._arrival_l: list[float] = np.asarray(trace.arrival_s, dtype=float).tolist()
        n = trace.num_requests
        self._ttft_s = np.full(n, np.nan)
        self._first_token_s = np.full(n, np.nan)
        self._finish_s = np.full(n, np.nan)
        self._joined_at: list[int] = [0] * n  # decode engine's iteration count at admission
        self._prefill_tokens: list[int] = [max(1, v) for v in self._isl_l]  # prompt tokens left after cache hits
        self._blocks_cached: list[int] = [0] * n  # leading prefix blocks of the request in its engine's cache
        self._cached = np.zeros(n, dtype=np.int64)
        # KV tokens a decoding request held when it joined its batch: its prompt, or (after a recompute) its prompt
        # plus the tokens generated before it was preempted
        self._base_kv: list[int] = list(self._isl_l)
        self._on_demand = spec.kv_allocation is KvAllocation.ON_DEMAND
        self._recompute: list[int] = [0] * n  # ON_DEMAND: tokens to prefill again after a preemption (0: none)
        self._iters_left: list[int] = [0] * n  # ON_DEMAND: decode iterations a preempted request still owes
        self._admitted_seq: list[int] = [0] * n  # ON_DEMAND: admission order (the newest is preempted first)
        self._admissions = itertools.count()
        self._num_preemptions = 0
        self._use_cache = spec.prefix_caching and trace.has_hashes
        self._events: list[tuple[float, int, int, int, object]] = []
        self._horizon_s = 0.0  # the latest time any event was scheduled for
        self._seq = itertools.count()
        self._workers: dict[Component, list[_Worker]] = {Component.PREFILL: [], Component.DECODE: []}
        self._router_queue: dict[Component, deque[int]] = {Component.PREFILL: deque(), Component.DECODE: deque()}
        self._rr: dict[Component, int] = {Component.PREFILL: 0, Component.DECODE: 0}
        self._names = itertools.count()
        self._gpu_s = 0.0
        self._gpu_clock_s = 0.0
        self._held_gpus = 0  # GPUs of starting, ready and draining workers
        self._num_scaling_events = 0
        self._timeline: list[tuple[float, int, int]] = []
        self._next_arrival = 0
        self._decode_iters_extra = 1 if spec.first_token_from_decode else 0
        # router `slo`
        self._slo = spec.slo_routing if spec.router is RouterPolicy.SLO else None
        self._frontend: dict[Component, deque[tuple[int, float]]] = {c: deque() for c in Component}
        self._retry_pending: dict[Component, bool] = dict.fromkeys(Component, False)
        self._unplaced_s: dict[Component, list[float]] = {c: [] for c in Component}  # no-endpoint times
        self._rejected_s: dict[Component, list[float]] = {c: [] for c in Component}
        self._num_local_prefills = 0
        self._num_overdue = 0
        self._predicted_ttft_ms = np.full(n, np.nan)
        self._predicted_tpot_ms = np.full(n, np.nan)
        self._dispatch_s = np.full(n, np.nan)
        for component, count in ((Component.PREFILL, num_prefill), (Component.DECODE, num_decode)):
            for _ in range(count):
                self._add_worker(component, ready_at_s=0.0)
        self._record_timeline()
        self._schedule_next_arrival()

    # --- public API ----------------------------------------------------------------------------------------

    def run_until(self, until_s: float) -> None:
        """Process every event up to `until_s` (inclusive) and advance the clock there."""
        events = self._events
        while events and events[0][0] <= until_s:
            at_s, kind, _, _, payload = heapq.heappop(events)
            if at_s > self._gpu_clock_s:
                self._gpu_s += self._held_gpus * (at_s - self._gpu_clock_s)
                self._gpu_clock_s = at_s
            self.now_s = at_s
            self._handle(kind, payload)
        self._accrue_gpu(until_s)
        self.now_s = max(self.now_s, until_s)

    def run_to_completion(self, *, grace_s: float = 3600.0) -> None:
        """Run until no event is left (every request finished), or `grace_s` after the last arrival. The clock,
        and GPU-seconds with it, stop at the last event."""
        limit_s = self.trace.duration_s + grace_s
        while self._events and self._events[0][0] <= limit_s:
            # Run up to the latest event scheduled so far (more may follow), in one call.
            self.run_until(min(limit_s, self._horizon_s))
        if self._events:
            self.run_until(limit_s)

    def set_targets(self, num_prefill: int | None, num_decode: int | None) -> None:
        """Ask for `num_prefill` / `num_decode` workers (None leaves a pool alone)."""
        if self.spec.aggregated and num_prefill:
            raise ValueError(f"aggregated mode has no prefill pool: num_prefill must be 0 or None, got {num_prefill}")
        for component, target in ((Component.PREFILL, num_prefill), (Component.DECODE, num_decode)):
            if target is None:
                continue
            live = [w for w in self._workers[component] if w.state in (_WorkerState.STARTING, _WorkerState.READY)]
            if target > len(live):
                self._num_scaling_events += 1
                for _ in range(target - len(live)):
                    self._add_worker(component, ready_at_s=self.now_s + self.spec.startup_s)
            elif target < len(live):
                self._num_scaling_events += 1
                surplus = len(live) - target
                starting = sorted(
                    (w for w in live if w.state is _WorkerState.STARTING), key=lambda w: -w.requested_at_s
                )
                for worker in starting[:surplus]:
                    self._set_gone(worker)
                surplus -= min(surplus, len(starting))
                ready = sorted((w for w in live if w.state is _WorkerState.READY), key=self._load)
                for worker in ready[:surplus]:
                    worker.state = _WorkerState.DRAINING
                    self._retire_if_idle(worker)
        self._record_timeline()

    def worker_counts(self) -> WorkerCounts:
        """Ready and expected (ready + starting) workers per pool, as a connector reports them."""
        counts = {}
        for component in Component:
            workers = self._workers[component]
            counts[component] = (
                sum(w.state is _WorkerState.READY for w in workers),
                sum(w.state in (_WorkerState.READY, _WorkerState.STARTING) for w in workers),
            )
        return WorkerCounts(
            ready_prefill=counts[Component.PREFILL][0],
            ready_decode=counts[Component.DECODE][0],
            expected_prefill=counts[Component.PREFILL][1],
            expected_decode=counts[Component.DECODE][1],
        )

    def observe(self, start_s: float, end_s: float, *, planner: Planner | None = None) -> TrafficObservation:
        """The frontend's view of [start_s, end_s): arrivals, lengths, the mean TTFT/ITL of requests whose
        first token (TTFT) or last token (ITL) came in the window, their p95/p99 TTFT and the mean time the window's
        requests waited for a first token (`queue_ms`, counted up to the window's end); for a `planner`, also the
        requests' arrivals its tick derives the prompt-arrival curve from (`window_observation`)."""
        first = (self._first_token_s >= start_s) & (self._first_token_s < end_s)
        done = (self._finish_s >= start_s) & (self._finish_s < end_s) & (self._osl > 1)
        ttft_ms = float(np.mean(self._ttft_s[first]) * 1000.0) if first.any() else None
        tail_ms = np.percentile(self._ttft_s[first], [95.0, 99.0]) * 1000.0 if first.any() else None
        # the time each request of the window waited for its first token, up to the window's end (a frontend's
        # queued-requests gauge integrated over the window, divided by the arrivals: Little's law)
        arrival_s = np.asarray(self.trace.arrival_s)  # sorted
        lo, hi = np.searchsorted(arrival_s, [start_s, end_s], side="left")
        if hi > lo:
            waited_s = np.fmin(self._first_token_s[lo:hi], end_s) - arrival_s[lo:hi]
            queue_ms = float(np.mean(np.maximum(waited_s, 0.0)) * 1000.0)
        else:
            queue_ms = None
        itl = self._itl_s()
        itl_ms = float(np.nanmean(itl[done]) * 1000.0) if done.any() else None
        kv_hit_rate, _ = self.kv_hit_rate(start_s, end_s)
        return window_observation(
            self.trace,
            start_s,
            end_s,
            ttft_ms=ttft_ms,
            itl_ms=itl_ms,
            kv_hit_rate=kv_hit_rate,
            planner=planner,
            ttft_ms_p95=None if tail_ms is None else float(tail_ms[0]),
            ttft_ms_p99=None if tail_ms is None else float(tail_ms[1]),
            queue_ms=queue_ms,
        )

    def kv_hit_rate(self, start_s: float, end_s: float) -> tuple[float | None, int]:
        """The router's prefix-cache hit rate over [start_s, end_s) and the number of requests it covers
        (`window_kv_hit_rate` over the cache hits so far); (None, 0) when the trace has no prefix blocks (no cache
        is simulated) or no request of the window has been served."""
        if not self.trace.has_hashes:
            return None, 0
        return window_kv_hit_rate(
            np.asarray(self.trace.arrival_s), np.asarray(self.trace.isl), self._cached, self._ttft_s, start_s, end_s
        )

    def latest_fpm(self) -> tuple[ForwardPassMetrics, ...]:
        """A forward-pass snapshot per ready engine: what it computes now and what waits in its queue."""
        snapshots = []
        for worker in self._workers[Component.PREFILL]:
            if worker.state is not _WorkerState.READY:
                continue
            chunk = min(worker.queued_tokens, self.spec.prefill_limits.max_num_batched_tokens)
            snapshots.append(
                ForwardPassMetrics(
                    component=Component.PREFILL,
                    worker_id=worker.worker_id,
                    wall_time_s=self.fwd.prefill_wall_s(chunk) if chunk else 0.0,
                    scheduled=ScheduledRequests(
                        num_prefill_requests=min(1, len(worker.queue)), sum_prefill_tokens=chunk
                    ),
                    queued=QueuedRequests(
                        num_prefill_requests=max(0, len(worker.queue) - 1),
                        sum_prefill_tokens=worker.queued_tokens - chunk,
                    ),
                )
            )
        for worker in self._workers[Component.DECODE]:
            if worker.state is not _WorkerState.READY:
                continue
            kv = self._kv_now(worker)
            queued_kv = sum(self._isl_l[i] for i in worker.queue) + sum(self._recompute[i] for i in worker.preempted)
            computing = worker.busy or bool(worker.running)
            if worker.kind is _Kind.AGG:
                in_chunk = worker.last_chunk_tokens if worker.busy else 0
                scheduled = ScheduledRequests(
                    num_prefill_requests=worker.last_chunk_requests if worker.busy else 0,
                    sum_prefill_tokens=in_chunk,
                    num_decode_requests=len(worker.running),
                    sum_decode_kv_tokens=kv,
                )
                queued = QueuedRequests(
                    num_prefill_requests=len(worker.queue) + len(worker.prefilling),
                    sum_prefill_tokens=max(0, worker.queued_tokens - in_chunk),
                )
            else:
                scheduled = ScheduledRequests(num_decode_requests=len(worker.running), sum_decode_kv_tokens=kv)
                queued = QueuedRequests(
                    num_decode_requests=len(worker.queue) + len(worker.preempted), sum_decode_kv_tokens=queued_kv
                )
            snapshots.append(
                ForwardPassMetrics(
                    component=Component.DECODE,
                    worker_id=worker.worker_id,
                    wall_time_s=worker.last_iter_s if computing else 0.0,
                    scheduled=scheduled,
                    queued=queued,
                )
            )
        return tuple(snapshots)

    def request_times(self, requests: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """First-token time, finish time (offsets, s; NaN until simulated) and prompt tokens found in a prefix cache
        of the requests indexed by `requests`, without copying every request's state (the live exporter asks for
        the requests in flight only). A time can lie past `now_s` by up to one iteration or a KV transfer: an
        event is stamped when it is scheduled, so readers compare it with their clock."""
        first_token_s = self._first_token_s[requests]
        self._fill_certain_first_tokens(requests, first_token_s)
        return first_token_s, self._finish_s[requests], self._cached[requests]

    def result(self) -> SimResult:
        return SimResult(
            ttft_s=self._ttft_s.copy(),
            itl_s=self._itl_s(),
            finish_s=self._finish_s.copy(),
            gpu_s=self._gpu_s,
            num_scaling_events=self._num_scaling_events,
            worker_timeline=tuple(self._timeline),
            cached_tokens=self._cached.copy(),
            num_preemptions=self._num_preemptions,
            num_unplaced=sum(len(times) for times in self._unplaced_s.values()),
            num_rejected=sum(len(times) for times in self._rejected_s.values()),
            num_local_prefills=self._num_local_prefills,
            num_overdue=self._num_overdue,
            predicted_ttft_ms=self._predicted_ttft_ms.copy() if self._slo is not None else None,
            predicted_tpot_ms=self._predicted_tpot_ms.copy() if self._slo is not None else None,
            dispatch_s=self._dispatch_s.copy() if self._slo is not None else None,
        )

    def unplaced(self, start_s: float, end_s: float) -> tuple[UnplacedRequests, ...]:
        """Per pool, what the SLO-aware router could not place: waiting at the frontend now, and the requests that
        found no available endpoint (and those rejected) in [start_s, end_s). Empty with another router (they
        never refuse a request)."""
        if self._slo is None:
            return ()
        reports = []
        for component in (Component.DECODE,) if self.spec.aggregated else tuple(Component):
            unplaced, rejected = self._unplaced_s[component], self._rejected_s[component]
            reports.append(
                UnplacedRequests(
                    component=component,
                    num_waiting=len(self._frontend[component]),
                    num_unplaced=bisect.bisect_left(unplaced, end_s) - bisect.bisect_left(unplaced, start_s),
                    num_rejected=bisect.bisect_left(rejected, end_s) - bisect.bisect_left(rejected, start_s),
                )
            )
        return tuple(reports)

    # --- internals -----------------------------------------------------------------------------------------

    def _fill_certain_first_tokens(self, requests: np.ndarray, first_token_s: np.ndarray) -> None:
        """Fill in first tokens that have come by `now_s` but are not stamped yet: a decode segment stamps its
        joiners' first token only when it ends or is interrupted, yet once its first iteration is over (by
        `now_s`) that time is certain."""
        pending: dict[int, float] = {}
        for worker in self._workers[Component.DECODE]:
            if worker.first_pending and worker.segment_iters > 0:
                first_s = worker.segment_start_s + worker.segment_iter_s
                if first_s <= self.now_s:
                    pending.update(dict.fromkeys(worker.first_pending, first_s))
        if not pending:
            return
        keys = np.fromiter(pending, dtype=np.int64, count=len(pending))
        values = np.fromiter(pending.values(), dtype=float, count=len(pending))
        positions = np.flatnonzero(np.isin(requests, keys))
        order = np.argsort(keys)
        first_token_s[positions] = values[order[np.searchsorted(keys, requests[positions], sorter=order)]]

    def _itl_s(self) -> np.ndarray:
        decode_tokens = self._osl - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            itl = (self._finish_s - self._first_token_s) / decode_tokens
        itl[decode_tokens <= 0] = np.nan
        return itl

    def _push(self, at_s: float, kind: int, payload: object, version: int = 0) -> None:
        heapq.heappush(self._events, (at_s, kind, next(self._seq), version, payload))
        if at_s > self._horizon_s:
            self._horizon_s = at_s

    def _schedule_next_arrival(self) -> None:
        if self._next_arrival < self.trace.num_requests:
            self._push(self._arrival_l[self._next_arrival], _ARRIVAL, self._next_arrival)
            self._next_arrival += 1

    def _gpus(self, component: Component) -> int:
        limits = self.spec.prefill_limits if component is Component.PREFILL else self.spec.decode_limits
        return limits.num_gpu

    def _accrue_gpu(self, to_s: float) -> None:
        if to_s > self._gpu_clock_s:
            self._gpu_s += self._held_gpus * (to_s - self._gpu_clock_s)
            self._gpu_clock_s = to_s

    def _record_timeline(self) -> None:
        counts = self.worker_counts()
        entry = (self.now_s, counts.ready_prefill, counts.ready_decode)
        if not self._timeline or self._timeline[-1][1:] != entry[1:]:
            self._timeline.append(entry)

    def _add_worker(self, component: Component, *, ready_at_s: float) -> None:
        name = f"{component.value}-{next(self._names)}"
        state = _WorkerState.READY if ready_at_s <= self.now_s else _WorkerState.STARTING
        if component is Component.PREFILL:
            kind, limits = _Kind.PREFILL, self.spec.prefill_limits
        else:
            kind = _Kind.AGG if self.spec.aggregated else _Kind.DECODE
            limits = self.spec.decode_limits
        worker = _Worker(
            worker_id=name,
            component=component,
            kind=kind,
            state=state,
            requested_at_s=self.now_s,
            ready_at_s=ready_at_s,
        )
        if self._use_cache and kind is not _Kind.DECODE:
            worker.cache = OrderedDict()
            worker.cache_blocks = max(1, limits.max_kv_tokens // self.trace.block_tokens)
        self._workers[component].append(worker)
        self._held_gpus += limits.num_gpu
        if state is _WorkerState.STARTING:
            self._push(ready_at_s, _READY, worker)

    def _set_gone(self, worker: _Worker) -> None:
        worker.state, worker.gone_at_s = _WorkerState.GONE, self.now_s
        self._held_gpus -= self._gpus(worker.component)

    def _load(self, worker: _Worker) -> float:
        if worker.kind is _Kind.PREFILL:
            return worker.queued_tokens
        return worker.reserved_kv + worker.queued_footprint

    def _pick(self, component: Component) -> _Worker | None:
        ready = [w for w in self._workers[component] if w.state is _WorkerState.READY]
        if not ready:
            return None
        if self.spec.router is RouterPolicy.ROUND_ROBIN:
            self._rr[component] += 1
            return ready[self._rr[component] % len(ready)]
        return min(ready, key=self._load)

    def _handle(self, kind: int, payload: object) -> None:
        if kind == _ARRIVAL:
            assert isinstance(payload, int)
            self._schedule_next_arrival()
            self._route(Component.DECODE if self.spec.aggregated else Component.PREFILL, payload)
        elif kind == _READY:
            assert isinstance(payload, _Worker)
            if payload.state is _WorkerState.STARTING:
                payload.state = _WorkerState.READY
                self._record_timeline()
                self._drain_router_queue(payload.component)
        elif kind == _PREFILL_DONE:
            assert isinstance(payload, tuple)
            self._finish_prefill_iteration(*payload)
        elif kind == _DECODE_HANDOFF:
            assert isinstance(payload, int)
            self._route(Component.DECODE, payload)
        elif kind == _SEGMENT_END:
            self._end_segment(payload)
        elif kind == _AGG_ITER_END:
            assert isinstance(payload, tuple)
            self._end_agg_iteration(*payload)
        elif kind == _OD_ITER_END:
            assert isinstance(payload, tuple)
            self._od_end_iteration(*payload)
        elif kind == _FRONTEND_RETRY:
            assert isinstance(payload, Component)
            self._retry_frontend(payload)

    def _route(self, component: Component, request: int) -> None:
        if self._slo is not None:
            self._route_slo(component, request)
            return
        worker = self._pick(component)
        if worker is None:
            self._router_queue[component].append(request)
            return
        self._enqueue(worker, request)

    def _drain_router_queue(self, component: Component) -> None:
        waiting = self._router_queue[component]
        if self._slo is not None:
            while waiting and any(w.state is _WorkerState.READY for w in self._workers[component]):
                self._route_slo(component, waiting.popleft())
            return
        while waiting and (worker := self._pick(component)) is not None:
            self._enqueue(worker, waiting.popleft())

    # SLO-aware router ----------------------------------------------------------------------------------------

    def _status(self, worker: _Worker, stage: Stage) -> InstanceStatus:
        """What the router knows of an engine: live and fresh in the simulator (READY workers only are asked)."""
        if worker.kind is _Kind.PREFILL:
            return InstanceStatus(
                instance_id=worker.worker_id,
                queued_prefill_tokens=worker.queued_tokens,
                chunk_tokens=self.spec.prefill_limits.max_num_batched_tokens,
            )
        chunk = self.spec.decode_limits.max_num_batched_tokens
        if stage is Stage.DECODE:
            # the batch the new request joins: running, prefilling and waiting requests
            waiting = itertools.chain(worker.queue, worker.preempted, (e[0] for e in worker.prefilling))
            batch = len(worker.running) + len(worker.queue) + len(worker.preempted) + len(worker.prefilling)
            kv = self._kv_now(worker) + sum(self._recompute[i] or self._isl_l[i] for i in waiting)
            return InstanceStatus(
                instance_id=worker.worker_id, decode_batch_size=batch, decode_kv_tokens=kv, chunk_tokens=chunk
            )
        # a prompt on an aggregated or decode engine: the prompt tokens ahead of it, each chunk with the batch
        if worker.kind is _Kind.AGG:
            queued = worker.queued_tokens
        else:
            queued = sum(e[1] for e in worker.prefilling) + sum(self._recompute[i] for i in worker.queue)
        return InstanceStatus(
            instance_id=worker.worker_id,
            queued_prefill_tokens=queued,
            decode_batch_size=len(worker.running),
            decode_kv_tokens=self._kv_now(worker),
            chunk_tokens=chunk,
        )

    def _slo_decide(
        self, workers: list[_Worker], stage: Stage, request: int, *, metric_filter: bool = True
    ) -> tuple[RouteDecision, _Worker | None]:
        assert self._slo is not None
        predictor, isl = self._slo.predictor, self._isl_l[request]
        candidates = []
        for worker in workers:
            status = self._status(worker, stage)
            if stage is Stage.PREFILL:
                predicted = predict_prefill(predictor, status, self._prefill_tokens[request])
            else:
                predicted = predict_decode(predictor, status, isl)
            candidates.append(Candidate(status=status, predicted_ms=predicted))
        decision = filter_and_select(stage, candidates, self._slo.targets, apply_metric_filter=metric_filter)
        chosen = next((w for w in workers if w.worker_id == decision.instance_id), None)
        return decision, chosen

    def _stage_of(self, component: Component) -> Stage:
        return Stage.PREFILL if component is Component.PREFILL or self.spec.aggregated else Stage.DECODE

    def _place_slo(self, component: Component, request: int, *, overdue: bool) -> bool:
        """Place `request` at `component`'s stage if an engine is predicted within the threshold (any ready engine
        when `overdue`), or prefill it on a decode engine (adaptive disaggregation). False: not placed."""
        ready = [w for w in self._workers[component] if w.state is _WorkerState.READY]
        stage = self._stage_of(component)
        if ready:
            decision, worker = self._slo_decide(ready, stage, request, metric_filter=not overdue)
            if worker is not None:
                self._record_placement(stage, request, decision)
                self._enqueue(worker, request)
                return True
        if component is Component.PREFILL and self._adaptive_prefill(request):
            return True
        return False

    def _record_placement(self, stage: Stage, request: int, decision: RouteDecision) -> None:
        if stage is Stage.PREFILL:
            self._predicted_ttft_ms[request] = decision.predicted_ms
            self._dispatch_s[request] = self.now_s
        else:
            self._predicted_tpot_ms[request] = decision.predicted_ms

    def _adaptive_prefill(self, request: int) -> bool:
        """Adaptive disaggregation: prefill a short prompt on the decode engine predicted to give the lowest TTFT
        within the threshold; it then decodes there (no transfer)."""
        assert self._slo is not None
        if not (self._slo.adaptive_pd and self._on_demand and not self.spec.aggregated):
            return False
        if self._isl_l[request] > self._slo.adaptive_max_prompt_tokens:
            return False
        ready = [w for w in self._workers[Component.DECODE] if w.state is _WorkerState.READY]
        if not ready:
            return False
        decision, worker = self._slo_decide(ready, Stage.PREFILL, request)
        if worker is None:
            return False
        self._record_placement(Stage.PREFILL, request, decision)
        self._num_local_prefills += 1
        # As a recompute: the decode engine prefills the prompt in mixed iterations, the iteration that ends it
        # yields the first token, and the request decodes its OSL - 1 other tokens there.
        self._recompute[request] = self._isl_l[request]
        self._iters_left[request] = self._osl_l[request]
        self._enqueue(worker, request)
        return True

    def _route_slo(self, component: Component, request: int) -> None:
        if not any(w.state is _WorkerState.READY for w in self._workers[component]):
            if component is Component.PREFILL and self._adaptive_prefill(request):
                return
            self._router_queue[component].append(request)  # no worker at all: wait for one, as other routers
            return
        if self._place_slo(component, request, overdue=False):
            return
        self._unplaced_s[component].append(self.now_s)
        assert self._slo is not None
        if self._slo.no_endpoint is NoEndpointAction.REJECT:
            self._rejected_s[component].append(self.now_s)
            return
        self._frontend[component].append((request, self.now_s))
        self._schedule_retry(component)

    def _schedule_retry(self, component: Component) -> None:
        if not self._retry_pending[component] and self._frontend[component]:
            assert self._slo is not None
            self._retry_pending[component] = True
            self._push(self.now_s + self._slo.retry_s, _FRONTEND_RETRY, component)

    def _retry_frontend(self, component: Component) -> None:
        """Place the frontend queue's requests in FIFO order until the head cannot be placed yet."""
        assert self._slo is not None
        self._retry_pending[component] = False
        max_wait_s = self._slo.max_wait_s if self._slo.max_wait_s is not None else self._slo.targets.ttft_ms / 1000
        queue = self._frontend[component]
        while queue:
            request, since_s = queue[0]
            overdue = self.now_s - since_s >= max_wait_s
            if not self._place_slo(component, request, overdue=overdue):
                if overdue:  # no ready engine at all: wait at the router for one
                    queue.popleft()
                    self._router_queue[component].append(request)
                    continue
                break
            queue.popleft()
            self._num_overdue += overdue
        self._schedule_retry(component)

    def _enqueue(self, worker: _Worker, request: int) -> None:
        if self._on_demand and worker.kind is not _Kind.PREFILL:
            if worker.kind is _Kind.AGG:
                worker.queued_tokens += self._prefill_tokens[request]
            worker.queue.append(request)
            worker.queued_footprint += self._footprint_l[request]
            self._od_wake(worker)
        elif worker.kind is _Kind.PREFILL:
            tokens = self._prefill_tokens[request]
            worker.queue.append([request, tokens, False])
            worker.queued_tokens += tokens
            if not worker.busy:
                self._start_prefill_iteration(worker)
        elif worker.kind is _Kind.DECODE:
            worker.queue.append(request)
            worker.queued_footprint += self._footprint_l[request]
            self._admit_decode(worker)
        else:
            worker.queued_tokens += self._prefill_tokens[request]
            worker.queue.append(request)
            worker.queued_footprint += self._footprint_l[request]
            self._wake_agg(worker)

    # prefix cache --------------------------------------------------------------------------------------------

    def _lookup_prefix(self, worker: _Worker, request: int) -> int:
        """Prompt tokens the engine must compute for `request`: its ISL less the leading blocks in the cache.

        Looked up when the engine first schedules the request (as an engine's scheduler does), not on arrival, so
        a prefix computed while the request waited in the queue counts."""
        cache = worker.cache
        if cache is None:
            return self._prefill_tokens[request]
        hit_blocks = 0
        for block in self.trace.request_hashes(request).tolist():
            if block not in cache:
                break
            cache.move_to_end(block)
            hit_blocks += 1
        isl = self._isl_l[request]
        hit_tokens = max(0, min(hit_blocks * self.trace.block_tokens, isl - 1))
        self._cached[request] = hit_tokens
        self._blocks_cached[request] = hit_blocks
        tokens = max(1, isl - hit_tokens)
        self._prefill_tokens[request] = tokens
        return tokens

    def _cache_progress(self, worker: _Worker, request: int, tokens_left: int) -> None:
        """Blocks of the prompt computed so far enter the cache: every full block after each chunk, the last
        (partial) one when the prompt is done."""
        cache = worker.cache
        if cache is None:
            return
        blocks = self.trace.request_hashes(request)
        computed = self._isl_l[request] - tokens_left
        upto = len(blocks) if tokens_left <= 0 else min(len(blocks), computed // self.trace.block_tokens)
        start = self._blocks_cached[request]
        if upto > start:
            self._blocks_cached[request] = upto
            for block in blocks[start:upto].tolist():
                if block in cache:
                    cache.move_to_end(block)
                else:
                    cache[block] = None
                    if len(cache) > worker.cache_blocks:
                        cache.popitem(last=False)
        if tokens_left <= 0:
            # The finished request's blocks become evictable tail first, so its first blocks, which later
            # prompts can share, are the last of them to go (a prefix match needs them; a tail alone is useless).
            for block in reversed(blocks.tolist()):
                if block in cache:
                    cache.move_to_end(block)

    # prefill -------------------------------------------------------------------------------------------------

    def _start_prefill_iteration(self, worker: _Worker) -> None:
        limits = self.spec.prefill_limits
        budget, chunk = limits.max_num_batched_tokens, []
        for entry in worker.queue:
            if budget <= 0 or len(chunk) >= limits.max_num_seqs:
                break
            if not entry[2]:
                entry[2] = True
                tokens = self._lookup_prefix(worker, entry[0])
                worker.queued_tokens -= entry[1] - tokens
                entry[1] = tokens
            take = min(entry[1], budget)
            chunk.append((entry[0], take))
            budget -= take
        tokens = limits.max_num_batched_tokens - budget
        if tokens <= 0:
            worker.busy = False
            return
        worker.busy = True
        self._push(self.now_s + self.fwd.prefill_wall_s(tokens), _PREFILL_DONE, (worker, tuple(chunk)))

    def _finish_prefill_iteration(self, worker: _Worker, chunk: tuple[tuple[int, int], ...]) -> None:
        transfer_s_per_token = self.spec.kv_transfer_s_per_token
        for request, take in chunk:
            head = worker.queue[0]
            assert head[0] == request
            head[1] -= take
            worker.queued_tokens -= take
            self._cache_progress(worker, request, head[1])
            if head[1] <= 0:
                worker.queue.popleft()
                handoff_s = self.now_s + transfer_s_per_token * self._isl_l[request]
                if self.spec.first_token_from_decode:
                    self._push(handoff_s, _DECODE_HANDOFF, request)
                    continue
                self._first_token(request, handoff_s)
                if self._osl_l[request] <= 1:
                    self._finish_s[request] = handoff_s
                else:
                    self._push(handoff_s, _DECODE_HANDOFF, request)
        worker.busy = False
        self._start_prefill_iteration(worker)
        self._retire_if_idle(worker)

    def _first_token(self, request: int, at_s: float) -> None:
        self._first_token_s[request] = at_s
        self._ttft_s[request] = at_s - self._arrival_l[request]

    # decode --------------------------------------------------------------------------------------------------

    def _kv_now(self, worker: _Worker) -> int:
        """KV tokens held by the running requests: prompts plus the tokens generated so far."""
        return worker.sum_isl_running + len(worker.running) * worker.iter_count - worker.sum_joined_running

    def _interrupt_segment(self, worker: _Worker) -> float | None:
        """End the running decode segment at the end of the iteration in progress: the boundary's time, or None
        when the segment ends there anyway (its end event then does the work)."""
        if self.now_s <= worker.segment_start_s:
            # The segment has not begun (it starts now, or at a boundary still ahead): join it from its start.
            done = 0
        else:
            elapsed = self.now_s - worker.segment_start_s
            done = min(worker.segment_iters, int(elapsed // worker.segment_iter_s) + 1)
            if done >= worker.segment_iters:
                return None
            self._stamp_first_tokens(worker)
        worker.iter_count += done
        worker.segment_iters = 0
        return worker.segment_start_s + done * worker.segment_iter_s

    def _stamp_first_tokens(self, worker: _Worker) -> None:
        """The running segment's first iteration is done: the requests admitted at its start have their first
        token at its end."""
        if worker.first_pending:
            first_s = worker.segment_start_s + worker.segment_iter_s
            for request in worker.first_pending:
                self._first_token(request, first_s)
            worker.first_pending.clear()

    def _admit_decode(self, worker: _Worker) -> None:
        """Admit waiting requests at the next iteration boundary and restart the segment."""
        if worker.running and worker.segment_iters > 0:
            boundary_s = self._interrupt_segment(worker)
            if boundary_s is None:
                return  # admission happens at the segment's end
        else:
            boundary_s = self.now_s
        self._take_waiting(worker)
        self._start_segment(worker, boundary_s)

    def _join(self, worker: _Worker, request: int, decode_iterations: int) -> None:
        """`request` joins the running batch and is done after `decode_iterations` more iterations."""
        worker.running.add(request)
        worker.sum_isl_running += self._base_kv[request]
        worker.sum_joined_running += worker.iter_count
        self._joined_at[request] = worker.iter_count
        heapq.heappush(worker.finish_heap, (worker.iter_count + decode_iterations, request))

    def _take_waiting(self, worker: _Worker) -> None:
        limits = self.spec.decode_limits
        extra = self._decode_iters_extra
        while worker.queue and len(worker.running) < limits.max_num_seqs:
            request = worker.queue[0]
            footprint = self._footprint_l[request]
            if worker.running and worker.reserved_kv + footprint > limits.max_kv_tokens:
                break
            worker.queue.popleft()
            worker.queued_footprint -= footprint
            worker.reserved_kv += footprint
            self._join(worker, request, self._osl_l[request] - 1 + extra)
            if extra:
                worker.first_pending.append(request)

    def _start_segment(self, worker: _Worker, start_s: float) -> None:
        worker.segment_version += 1
        if not worker.running:
            worker.segment_iters = 0
            self._retire_if_idle(worker)
            return
        iterations = max(1, worker.finish_heap[0][0] - worker.iter_count)
        num_running = len(worker.running)
        if self._on_demand:
            # The segment ends before the iteration whose growth (one token per running request) would not fit.
            room = self.spec.decode_limits.max_kv_tokens - self._kv_now(worker) - worker.prefill_kv
            iterations = min(iterations, max(1, room // num_running))
        mid_kv = self._kv_now(worker) + num_running * iterations / 2.0
        iter_s = self.fwd.decode_wall_s(num_running, mid_kv)
        worker.segment_start_s, worker.segment_iter_s, worker.segment_iters = start_s, iter_s, iterations
        worker.last_iter_s = iter_s
        self._push(start_s + iterations * iter_s, _SEGMENT_END, (worker, worker.segment_version))

    def _finish_running(self, worker: _Worker) -> None:
        """Requests whose last token came with the iteration just completed leave the batch."""
        while worker.finish_heap and worker.finish_heap[0][0] <= worker.iter_count:
            _, request = heapq.heappop(worker.finish_heap)
            worker.running.discard(request)
            self._finish_s[request] = self.now_s
            worker.reserved_kv -= self._footprint_l[request]
            worker.sum_isl_running -= self._base_kv[request]
            worker.sum_joined_running -= self._joined_at[request]

    def _end_segment(self, payload: object) -> None:
        worker, version = payload  # type: ignore[misc]
        if version != worker.segment_version:
            return  # superseded by an admission
        self._stamp_first_tokens(worker)
        worker.iter_count += worker.segment_iters
        worker.segment_iters = 0
        self._finish_running(worker)
        if self._on_demand:
            self._od_boundary(worker, self.now_s)
            return
        if worker.kind is _Kind.AGG:
            self._next_agg_iteration(worker, self.now_s)
            return
        self._take_waiting(worker)
        self._start_segment(worker, self.now_s)

    # aggregated ----------------------------------------------------------------------------------------------

    def _wake_agg(self, worker: _Worker) -> None:
        """A request arrived at an aggregated engine: start an iteration now if idle, at the next boundary if
        decoding, or leave it to the mixed iteration in flight."""
        if worker.busy:
            return
        if worker.running and worker.segment_iters > 0:
            boundary_s = self._interrupt_segment(worker)
            if boundary_s is None:
                return
        else:
            boundary_s = self.now_s
        self._next_agg_iteration(worker, boundary_s)

    def _admit_agg(self, worker: _Worker) -> None:
        limits = self.spec.decode_limits
        while worker.queue and len(worker.running) + len(worker.prefilling) < limits.max_num_seqs:
            request = worker.queue[0]
            footprint = self._footprint_l[request]
            if (worker.running or worker.prefilling) and worker.reserved_kv + footprint > limits.max_kv_tokens:
                break
            worker.queue.popleft()
            worker.queued_footprint -= footprint
            worker.reserved_kv += footprint
            before = self._prefill_tokens[request]
            tokens = self._lookup_prefix(worker, request)
            worker.queued_tokens -= before - tokens
            worker.prefilling.append([request, tokens])

    def _next_agg_iteration(self, worker: _Worker, start_s: float) -> None:
        worker.segment_version += 1
        worker.segment_iters = 0
        self._admit_agg(worker)
        self._start_mixed_iteration(worker, start_s, _AGG_ITER_END)

    def _start_mixed_iteration(self, worker: _Worker, start_s: float, end_event: int) -> None:
        """Start a mixed iteration at `start_s`, ending with `end_event`: every running request decodes one token
        out of the `max_num_batched_tokens` budget and the rest goes to the prefilling prompts in FIFO order;
        with no prompt tokens to compute (or no budget left) a pure-decode segment runs instead."""
        budget = self.spec.decode_limits.max_num_batched_tokens - len(worker.running)
        chunk = []
        for request, tokens_left in worker.prefilling:
            if budget <= 0:
                break
            take = min(tokens_left, budget)
            chunk.append((request, take))
            budget -= take
        if not chunk:
            self._start_segment(worker, start_s)
            return
        tokens = sum(take for _, take in chunk)
        if worker.running:
            iter_s = self.fwd.mixed_wall_s(tokens, len(worker.running), self._kv_now(worker))
        else:
            iter_s = self.fwd.prefill_wall_s(tokens)
        worker.busy = True
        worker.last_iter_s = iter_s
        worker.last_chunk_requests, worker.last_chunk_tokens = len(chunk), tokens
        self._push(start_s + iter_s, end_event, (worker, tuple(chunk)))

    def _end_agg_iteration(self, worker: _Worker, chunk: tuple[tuple[int, int], ...]) -> None:
        worker.busy = False
        if worker.running:
            worker.iter_count += 1
            self._finish_running(worker)
        for request, take in chunk:
            head = worker.prefilling[0]
            assert head[0] == request
            head[1] -= take
            worker.queued_tokens -= take
            self._cache_progress(worker, request, head[1])
            if head[1] > 0:
                continue
            worker.prefilling.popleft()
            self._first_token(request, self.now_s)  # the iteration that ends a prompt samples its first token
            if self._osl_l[request] <= 1:
                self._finish_s[request] = self.now_s
                worker.reserved_kv -= self._footprint_l[request]
            else:
                self._join(worker, request, self._osl_l[request] - 1)
        self._next_agg_iteration(worker, self.now_s)

    # on-demand KV (decode and aggregated engines) ---------------------------------------------------------------

    def _od_wake(self, worker: _Worker) -> None:
        """A request arrived: schedule at once when idle, at the next iteration boundary when decoding, or leave it
        to the mixed iteration in flight."""
        if worker.busy:
            return
        if worker.running and worker.segment_iters > 0:
            boundary_s = self._interrupt_segment(worker)
            if boundary_s is None:
                return
        else:
            boundary_s = self.now_s
        self._od_boundary(worker, boundary_s)

    def _od_boundary(self, worker: _Worker, start_s: float) -> None:
        """An iteration boundary: make room for the running requests' next token (preempting the newest if the
        cache is full), admit waiting requests only when nothing was preempted (as vLLM's scheduler), then run a
        mixed iteration if a prompt or a recompute is prefilling, else a pure-decode segment."""
        worker.segment_version += 1
        worker.segment_iters = 0
        if not self._od_preempt(worker):
            self._od_admit(worker)
        self._start_mixed_iteration(worker, start_s, _OD_ITER_END)

    def _od_kv_used(self, worker: _Worker) -> int:
        return self._kv_now(worker) + worker.prefill_kv

    def _od_preempt(self, worker: _Worker) -> bool:
        """Preempt the most recently admitted requests until every running request's next token fits (one request
        is never preempted: it runs alone even past the cache, as nothing else could free room for it)."""
        max_kv = self.spec.decode_limits.max_kv_tokens
        preempted = False
        while (
            len(worker.running) + len(worker.prefilling) > 1 and self._od_kv_used(worker) + len(worker.running) > max_kv
        ):
            victim = max(
                itertools.chain(worker.running, (e[0] for e in worker.prefilling)), key=self._admitted_seq.__getitem__
            )
            self._od_evict(worker, victim)
            preempted = True
        return preempted

    def _od_evict(self, worker: _Worker, request: int) -> None:
        """Free `request`'s KV and put it back at the head of the engine's queue; it will prefill its prompt and the
        tokens generated so far again (recompute)."""
        self._num_preemptions += 1
        if request in worker.running:
            held = self._base_kv[request] + worker.iter_count - self._joined_at[request]
            finish_at = next(at for at, r in worker.finish_heap if r == request)
            worker.finish_heap = [(at, r) for at, r in worker.finish_heap if r != request]
            heapq.heapify(worker.finish_heap)
            worker.running.discard(request)
            worker.sum_isl_running -= self._base_kv[request]
            worker.sum_joined_running -= self._joined_at[request]
            if request in worker.first_pending:
                worker.first_pending.remove(request)
            self._recompute[request] = held
            self._iters_left[request] = finish_at - worker.iter_count
            if worker.kind is _Kind.AGG:
                worker.queued_tokens += held
        else:
            index = next(i for i, e in enumerate(worker.prefilling) if e[0] == request)
            tokens_left = worker.prefilling[index][1]
            del worker.prefilling[index]
            recompute = self._recompute[request]
            allocated = recompute or self._isl_l[request]
            worker.prefill_kv -= allocated
            if worker.kind is _Kind.AGG:
                # the prompt's progress is lost: its tokens are to compute again
                worker.queued_tokens += (recompute or self._prefill_tokens[request]) - tokens_left  # hits count again
        if self.spec.recompute_after_handoffs and worker.kind is _Kind.DECODE:
            worker.preempted.appendleft(request)
        else:
            worker.queue.appendleft(request)
        worker.reserved_kv -= self._footprint_l[request]
        worker.queued_footprint += self._footprint_l[request]

    def _od_admit(self, worker: _Worker) -> None:
        """Admit waiting requests in FIFO order while a sequence slot is free and the KV they need now (the prompt,
        or the prompt and generated tokens of a recompute) fits beside the running requests' next tokens and the
        watermark (an idle engine admits its head request whatever its size)."""
        limits = self.spec.decode_limits
        free_after = limits.max_kv_tokens - int(self.spec.kv_watermark * limits.max_kv_tokens)
        extra = self._decode_iters_extra
        while len(worker.running) + len(worker.prefilling) < limits.max_num_seqs:
            # preempted requests kept apart (`recompute_after_handoffs`) come only when no transfer waits
            waiting = worker.queue or worker.preempted
            if not waiting:
                break
            request = waiting[0]
            recompute = self._recompute[request]
            need = recompute or self._isl_l[request]
            busy = worker.running or worker.prefilling
            if busy and self._od_kv_used(worker) + len(worker.running) + need > free_after:
                break
            waiting.popleft()
            footprint = self._footprint_l[request]
            worker.queued_footprint -= footprint
            worker.reserved_kv += footprint
            self._admitted_seq[request] = next(self._admissions)
            if recompute:
                # The KV of the whole prefix is allocated again; the leading prompt blocks still in the engine's
                # prefix cache are not computed again (an aggregated engine's freed blocks stay cached).
                hit_tokens = self._recompute_hit(worker, request, recompute)
                worker.queued_tokens -= hit_tokens
                worker.prefilling.append([request, recompute - hit_tokens])
                worker.prefill_kv += recompute
            elif worker.kind is _Kind.DECODE:
                self._join(worker, request, self._osl_l[request] - 1 + extra)
                if extra:
                    worker.first_pending.append(request)
            else:
                before = self._prefill_tokens[request]
                tokens = self._lookup_prefix(worker, request)
                worker.queued_tokens -= before - tokens
                worker.prefilling.append([request, tokens])
                worker.prefill_kv += need

    def _recompute_hit(self, worker: _Worker, request: int, recompute: int) -> int:
        """Tokens of a recompute found in the engine's prefix cache: its leading prompt blocks (at least one token
        is computed)."""
        cache = worker.cache
        if cache is None:
            return 0
        hit_blocks = 0
        for block in self.trace.request_hashes(request).tolist():
            if block not in cache:
                break
            cache.move_to_end(block)
            hit_blocks += 1
        return max(0, min(hit_blocks * self.trace.block_tokens, self._isl_l[request], recompute - 1))

    def _od_end_iteration(self, worker: _Worker, chunk: tuple[tuple[int, int], ...]) -> None:
        worker.busy = False
        if worker.running:
            worker.iter_count += 1
            for request in worker.first_pending:
                self._first_token(request, self.now_s)
            worker.first_pending.clear()
            self._finish_running(worker)
        is_agg = worker.kind is _Kind.AGG
        for request, take in chunk:
            head = worker.prefilling[0]
            assert head[0] == request
            head[1] -= take
            recompute = self._recompute[request]
            if is_agg:
                worker.queued_tokens -= take
                if not recompute:
                    self._cache_progress(worker, request, head[1])
            if head[1] > 0:
                continue
            worker.prefilling.popleft()
            # The iteration that ends a prompt (or a recompute) samples the next token.
            if recompute:
                worker.prefill_kv -= recompute
                self._recompute[request] = 0
                self._base_kv[request] = recompute
                iterations = self._iters_left[request] - 1
                if math.isnan(self._first_token_s[request]):
                    self._first_token(request, self.now_s)
            else:
                worker.prefill_kv -= self._isl_l[request]
                self._first_token(request, self.now_s)
                iterations = self._osl_l[request] - 1
            if iterations <= 0:
                self._finish_s[request] = self.now_s
                worker.reserved_kv -= self._footprint_l[request]
                self._base_kv[request] = self._isl_l[request]
            else:
                self._join(worker, request, iterations)
        self._od_boundary(worker, self.now_s)

    # draining ------------------------------------------------------------------------------------------------

    def _retire_if_idle(self, worker: _Worker) -> None:
        if worker.state is _WorkerState.DRAINING and worker.idle:
            self._set_gone(worker)
            self._record_timeline()
