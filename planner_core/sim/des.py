"""Discrete-event simulator of a disaggregated prefill/decode serving cluster, driven by a request trace.

Role: the rig that tells what a scaling policy costs (GPU-hours) and what it delivers (per-request TTFT and ITL)
without GPUs. Engine time comes from a `ForwardPassModel` (calibrated on measured data), so the simulator and the
planner's SLA models share one notion of engine speed.

Model:
- Prefill engines run chunked prefill: each iteration takes prompt tokens from the head of the engine's FIFO queue,
  at most `max_num_batched_tokens` tokens and `max_num_seqs` requests, and lasts `prefill_wall_s(tokens)`. A
  request's first token appears when its last chunk finishes plus the KV transfer time
  (`kv_transfer_s_per_token * ISL`); TTFT is measured from arrival.
- Decode engines run continuous batching: every iteration advances each running request by one token and lasts
  `decode_wall_s(num_running, kv_tokens)`. A request is admitted when a sequence slot is free and its whole
  footprint (ISL + OSL tokens) fits the free KV cache (reserved at admission, so no preemption), otherwise it
  waits in the engine's queue. Its ITL is the mean gap between its tokens after the first, so waiting for a
  slot counts. To stay fast, iterations are not events: between membership changes a decode engine runs a
  segment of identical-length iterations (the KV size at the segment's midpoint); an admission interrupts the
  segment at the next iteration boundary.
- Scaling is not free: a new worker is ready `startup_s` after it is requested; a removed worker first stops
  receiving requests, then leaves when its queue and batch are empty (starting workers are cancelled first).
  GPU-seconds accrue on starting, ready and draining workers.
- A router spreads requests over ready, non-draining workers: round-robin or least-loaded (queued prompt tokens
  for prefill; reserved KV tokens for decode). With no ready worker, requests wait at the router.

Deterministic for a given trace, spec and scaling timeline. No wall clock; time is the offset (s) from the first
request of the trace.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    QueuedRequests,
    ScheduledRequests,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.perf.forward import ForwardPassModel
from planner_core.traces import RequestTrace


class RouterPolicy(enum.StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_LOADED = "least_loaded"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSpec:
    """Static description of the simulated cluster."""

    prefill_limits: EngineLimits = field(default_factory=EngineLimits)
    decode_limits: EngineLimits = field(default_factory=EngineLimits)
    startup_s: float = 120.0
    kv_transfer_s_per_token: float = 0.0
    router: RouterPolicy = RouterPolicy.LEAST_LOADED


class _WorkerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


@dataclass(slots=True, eq=False)
class _Worker:
    worker_id: str
    component: Component
    state: _WorkerState
    requested_at_s: float
    ready_at_s: float
    gone_at_s: float = math.inf
    # prefill: FIFO of [request index, prompt tokens left]; decode: FIFO of request indices waiting for a slot
    queue: deque = field(default_factory=deque)
    queued_tokens: int = 0
    busy: bool = False
    # decode only: request j has produced `iter_count - joined_at[j]` tokens; `finish_heap` holds
    # (iteration at which it is done, request) so completions pop in O(log n)
    running: set[int] = field(default_factory=set)
    finish_heap: list[tuple[int, int]] = field(default_factory=list)
    iter_count: int = 0
    sum_isl_running: int = 0
    sum_joined_running: int = 0
    reserved_kv: int = 0
    segment_version: int = 0
    segment_start_s: float = 0.0
    segment_iter_s: float = 0.0
    segment_iters: int = 0
    last_iter_s: float = 0.0

    @property
    def idle(self) -> bool:
        return not self.queue and not self.running and not self.busy


_ARRIVAL, _READY, _PREFILL_DONE, _DECODE_HANDOFF, _SEGMENT_END = range(5)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Per-request outcome (arrays indexed like the trace) and the cluster's GPU-seconds."""

    ttft_s: np.ndarray  # NaN for requests whose first token had not appeared when the run ended
    itl_s: np.ndarray  # mean gap between tokens after the first; NaN when unfinished or OSL <= 1
    finish_s: np.ndarray
    gpu_s: float
    num_scaling_events: int
    worker_timeline: tuple[tuple[float, int, int], ...]  # (time, ready prefill, ready decode) at each change


class ClusterSimulator:
    """A mutable simulation run. Drive it with `run_until(t)`, read `observe()`, change it with `set_targets()`."""

    def __init__(
        self,
        trace: RequestTrace,
        fwd: ForwardPassModel,
        spec: SimSpec,
        *,
        num_prefill: int,
        num_decode: int,
    ) -> None:
        self.trace = trace
        self.fwd = fwd
        self.spec = spec
        self.now_s = 0.0
        self._isl = np.asarray(trace.isl, dtype=np.int64)
        self._osl = np.maximum(np.asarray(trace.osl, dtype=np.int64), 1)
        n = trace.num_requests
        self._ttft_s = np.full(n, np.nan)
        self._first_token_s = np.full(n, np.nan)
        self._finish_s = np.full(n, np.nan)
        self._joined_at = np.zeros(n, dtype=np.int64)  # decode engine's iteration count at admission
        self._events: list[tuple[float, int, int, int, object]] = []
        self._seq = itertools.count()
        self._workers: dict[Component, list[_Worker]] = {Component.PREFILL: [], Component.DECODE: []}
        self._router_queue: dict[Component, deque[int]] = {Component.PREFILL: deque(), Component.DECODE: deque()}
        self._rr: dict[Component, int] = {Component.PREFILL: 0, Component.DECODE: 0}
        self._names = itertools.count()
        self._gpu_s = 0.0
        self._gpu_clock_s = 0.0
        self._num_scaling_events = 0
        self._timeline: list[tuple[float, int, int]] = []
        self._next_arrival = 0
        for component, count in ((Component.PREFILL, num_prefill), (Component.DECODE, num_decode)):
            for _ in range(count):
                self._add_worker(component, ready_at_s=0.0)
        self._record_timeline()
        self._schedule_next_arrival()

    # --- public API ----------------------------------------------------------------------------------------

    def run_until(self, until_s: float) -> None:
        """Process every event up to `until_s` (inclusive) and advance the clock there."""
        while self._events and self._events[0][0] <= until_s:
            at_s, kind, _, _, payload = heapq.heappop(self._events)
            self._accrue_gpu(at_s)
            self.now_s = at_s
            self._handle(kind, payload)
        self._accrue_gpu(until_s)
        self.now_s = max(self.now_s, until_s)

    def run_to_completion(self, *, grace_s: float = 3600.0) -> None:
        """Run until no event is left (every request finished), or `grace_s` after the last arrival. The clock,
        and GPU-seconds with it, stop at the last event."""
        limit_s = self.trace.duration_s + grace_s
        while self._events and self._events[0][0] <= limit_s:
            self.run_until(self._events[0][0])
        if self._events:
            self.run_until(limit_s)

    def set_targets(self, num_prefill: int | None, num_decode: int | None) -> None:
        """Ask for `num_prefill` / `num_decode` workers (None leaves a pool alone)."""
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
                    worker.state, worker.gone_at_s = _WorkerState.GONE, self.now_s
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

    def observe(self, start_s: float, end_s: float) -> TrafficObservation:
        """The frontend's view of [start_s, end_s): arrivals, lengths, and the mean TTFT/ITL of requests whose
        first token (TTFT) or last token (ITL) came in the window."""
        base = self.trace.observe(start_s, end_s)
        first = (self._first_token_s >= start_s) & (self._first_token_s < end_s)
        done = (self._finish_s >= start_s) & (self._finish_s < end_s) & (self._osl > 1)
        ttft_ms = float(np.mean(self._ttft_s[first]) * 1000.0) if first.any() else None
        itl = self._itl_s()
        itl_ms = float(np.nanmean(itl[done]) * 1000.0) if done.any() else None
        return TrafficObservation(
            duration_s=base.duration_s,
            num_req=base.num_req,
            isl=base.isl,
            osl=base.osl,
            isl_p50=base.isl_p50,
            isl_p90=base.isl_p90,
            isl_p99=base.isl_p99,
            osl_p50=base.osl_p50,
            osl_p90=base.osl_p90,
            osl_p99=base.osl_p99,
            ttft_ms=ttft_ms,
            itl_ms=itl_ms,
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
            queued_kv = int(sum(self._isl[i] for i in worker.queue))
            snapshots.append(
                ForwardPassMetrics(
                    component=Component.DECODE,
                    worker_id=worker.worker_id,
                    wall_time_s=worker.last_iter_s if worker.running else 0.0,
                    scheduled=ScheduledRequests(num_decode_requests=len(worker.running), sum_decode_kv_tokens=kv),
                    queued=QueuedRequests(num_decode_requests=len(worker.queue), sum_decode_kv_tokens=queued_kv),
                )
            )
        return tuple(snapshots)

    def result(self) -> SimResult:
        return SimResult(
            ttft_s=self._ttft_s.copy(),
            itl_s=self._itl_s(),
            finish_s=self._finish_s.copy(),
            gpu_s=self._gpu_s,
            num_scaling_events=self._num_scaling_events,
            worker_timeline=tuple(self._timeline),
        )

    # --- internals -----------------------------------------------------------------------------------------

    def _itl_s(self) -> np.ndarray:
        decode_tokens = self._osl - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            itl = (self._finish_s - self._first_token_s) / decode_tokens
        itl[decode_tokens <= 0] = np.nan
        return itl

    def _push(self, at_s: float, kind: int, payload: object, version: int = 0) -> None:
        heapq.heappush(self._events, (at_s, kind, next(self._seq), version, payload))

    def _schedule_next_arrival(self) -> None:
        if self._next_arrival < self.trace.num_requests:
            self._push(float(self.trace.arrival_s[self._next_arrival]), _ARRIVAL, self._next_arrival)
            self._next_arrival += 1

    def _gpus(self, component: Component) -> int:
        limits = self.spec.prefill_limits if component is Component.PREFILL else self.spec.decode_limits
        return limits.num_gpu

    def _accrue_gpu(self, to_s: float) -> None:
        if to_s <= self._gpu_clock_s:
            return
        held = 0
        for component, workers in self._workers.items():
            held += self._gpus(component) * sum(w.state is not _WorkerState.GONE for w in workers)
        self._gpu_s += held * (to_s - self._gpu_clock_s)
        self._gpu_clock_s = to_s

    def _record_timeline(self) -> None:
        counts = self.worker_counts()
        entry = (self.now_s, counts.ready_prefill, counts.ready_decode)
        if not self._timeline or self._timeline[-1][1:] != entry[1:]:
            self._timeline.append(entry)

    def _add_worker(self, component: Component, *, ready_at_s: float) -> None:
        name = f"{component.value}-{next(self._names)}"
        state = _WorkerState.READY if ready_at_s <= self.now_s else _WorkerState.STARTING
        worker = _Worker(
            worker_id=name, component=component, state=state, requested_at_s=self.now_s, ready_at_s=ready_at_s
        )
        self._workers[component].append(worker)
        if state is _WorkerState.STARTING:
            self._push(ready_at_s, _READY, worker)

    def _load(self, worker: _Worker) -> float:
        if worker.component is Component.PREFILL:
            return worker.queued_tokens
        return worker.reserved_kv + sum(int(self._isl[i] + self._osl[i]) for i in worker.queue)

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
            self._route(Component.PREFILL, payload)
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

    def _route(self, component: Component, request: int) -> None:
        worker = self._pick(component)
        if worker is None:
            self._router_queue[component].append(request)
            return
        self._enqueue(worker, request)

    def _drain_router_queue(self, component: Component) -> None:
        waiting = self._router_queue[component]
        while waiting and (worker := self._pick(component)) is not None:
            self._enqueue(worker, waiting.popleft())

    def _enqueue(self, worker: _Worker, request: int) -> None:
        if worker.component is Component.PREFILL:
            tokens = int(self._isl[request])
            worker.queue.append([request, tokens])
            worker.queued_tokens += tokens
            if not worker.busy:
                self._start_prefill_iteration(worker)
        else:
            worker.queue.append(request)
            self._admit_decode(worker)

    # prefill -------------------------------------------------------------------------------------------------

    def _start_prefill_iteration(self, worker: _Worker) -> None:
        limits = self.spec.prefill_limits
        budget, chunk = limits.max_num_batched_tokens, []
        for entry in worker.queue:
            if budget <= 0 or len(chunk) >= limits.max_num_seqs:
                break
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
        for request, take in chunk:
            head = worker.queue[0]
            assert head[0] == request
            head[1] -= take
            worker.queued_tokens -= take
            if head[1] <= 0:
                worker.queue.popleft()
                first_token_s = self.now_s + self.spec.kv_transfer_s_per_token * float(self._isl[request])
                self._first_token_s[request] = first_token_s
                self._ttft_s[request] = first_token_s - float(self.trace.arrival_s[request])
                if self._osl[request] <= 1:
                    self._finish_s[request] = first_token_s
                else:
                    self._push(first_token_s, _DECODE_HANDOFF, request)
        worker.busy = False
        self._start_prefill_iteration(worker)
        self._retire_if_idle(worker)

    # decode --------------------------------------------------------------------------------------------------

    def _kv_now(self, worker: _Worker) -> int:
        """KV tokens held by the running requests: prompts plus the tokens generated so far."""
        return worker.sum_isl_running + len(worker.running) * worker.iter_count - worker.sum_joined_running

    def _admit_decode(self, worker: _Worker) -> None:
        """Admit waiting requests at the next iteration boundary and restart the segment."""
        if worker.running and worker.segment_iters > 0:
            # Interrupt the running segment at the end of the iteration in progress.
            elapsed = max(0.0, self.now_s - worker.segment_start_s)
            done = min(worker.segment_iters, int(elapsed // worker.segment_iter_s) + 1)
            if done >= worker.segment_iters:
                return  # the segment ends at that boundary anyway; admission happens there
            worker.iter_count += done
            boundary_s = worker.segment_start_s + done * worker.segment_iter_s
        else:
            boundary_s = self.now_s
        self._take_waiting(worker)
        self._start_segment(worker, boundary_s)

    def _take_waiting(self, worker: _Worker) -> None:
        limits = self.spec.decode_limits
        while worker.queue and len(worker.running) < limits.max_num_seqs:
            request = worker.queue[0]
            footprint = int(self._isl[request] + self._osl[request])
            if worker.running and worker.reserved_kv + footprint > limits.max_kv_tokens:
                break
            worker.queue.popleft()
            worker.running.add(request)
            worker.reserved_kv += footprint
            worker.sum_isl_running += int(self._isl[request])
            worker.sum_joined_running += worker.iter_count
            self._joined_at[request] = worker.iter_count
            heapq.heappush(worker.finish_heap, (worker.iter_count + int(self._osl[request]) - 1, request))

    def _start_segment(self, worker: _Worker, start_s: float) -> None:
        worker.segment_version += 1
        if not worker.running:
            worker.segment_iters = 0
            self._retire_if_idle(worker)
            return
        iterations = max(1, worker.finish_heap[0][0] - worker.iter_count)
        num_running = len(worker.running)
        mid_kv = self._kv_now(worker) + num_running * iterations / 2.0
        iter_s = self.fwd.decode_wall_s(num_running, mid_kv)
        worker.segment_start_s, worker.segment_iter_s, worker.segment_iters = start_s, iter_s, iterations
        worker.last_iter_s = iter_s
        self._push(start_s + iterations * iter_s, _SEGMENT_END, (worker, worker.segment_version))

    def _end_segment(self, payload: object) -> None:
        worker, version = payload  # type: ignore[misc]
        if version != worker.segment_version:
            return  # superseded by an admission
        worker.iter_count += worker.segment_iters
        worker.segment_iters = 0
        while worker.finish_heap and worker.finish_heap[0][0] <= worker.iter_count:
            _, request = heapq.heappop(worker.finish_heap)
            worker.running.discard(request)
            self._finish_s[request] = self.now_s
            worker.reserved_kv -= int(self._isl[request] + self._osl[request])
            worker.sum_isl_running -= int(self._isl[request])
            worker.sum_joined_running -= int(self._joined_at[request])
        self._take_waiting(worker)
        self._start_segment(worker, self.now_s)

    # draining ------------------------------------------------------------------------------------------------

    def _retire_if_idle(self, worker: _Worker) -> None:
        if worker.state is _WorkerState.DRAINING and worker.idle:
            worker.state, worker.gone_at_s = _WorkerState.GONE, self.now_s
            self._record_timeline()
