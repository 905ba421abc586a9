"""`ClusterSimulator`: the event loop, the public API (run, scale, observe, results) and worker lifecycle. The
routers, engines and on-demand KV are mixed in from the sibling modules (`routing`, `engines`, `kv`); the model
is described in `planner_core.lab.sim.des`."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import OrderedDict, deque

import numpy as np

from planner_core.domain import (
    Component,
    ForwardPassMetrics,
    QueuedRequests,
    ScheduledRequests,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.lab.sim.des.engines import _Engines
from planner_core.lab.sim.des.kv import _OnDemandKv
from planner_core.lab.sim.des.routing import _Routing
from planner_core.lab.sim.des.spec import (
    KvAllocation,
    RouterPolicy,
    SimResult,
    SimSpec,
    latency_histogram,
    window_kv_hit_rate,
    window_observation,
)
from planner_core.lab.sim.des.speed import engine_model
from planner_core.lab.sim.des.state import (
    _AGG_ITER_END,
    _ARRIVAL,
    _DECODE_HANDOFF,
    _FRONTEND_RETRY,
    _OD_ITER_END,
    _PREFILL_DONE,
    _READY,
    _SEGMENT_END,
    _Kind,
    _Worker,
    _WorkerState,
)
from planner_core.perf.forward import ForwardPassModel
from planner_core.planner import Planner
from planner_core.traces import RequestTrace


class ClusterSimulator(_Routing, _Engines, _OnDemandKv):
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
        # the engines' timing: the profile's model at the spec's engine speed (the profile's own at speed 1.0)
        self.fwd = engine_model(fwd, spec.engine_speed)
        self._profile_fwd = fwd
        self._speed_change = spec.speed_change  # None once applied
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
        if self._speed_change is not None and self._speed_change.at_s <= until_s:
            self._change_speed()
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
            ttft_histogram=latency_histogram(self._ttft_s[first]),
            itl_histogram=latency_histogram(itl[done]),
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

    def _change_speed(self) -> None:
        """`spec.speed_change` comes: process the events before its time, then time every later iteration at its
        speed; running decode segments are cut at the end of their iteration in progress (as an arrival cuts them)
        so that the iterations after it run at the new speed. Iterations already scheduled end at the old speed."""
        change = self._speed_change
        assert change is not None
        self._speed_change = None
        events = self._events
        while events and events[0][0] < change.at_s:
            at_s, kind, _, _, payload = heapq.heappop(events)
            if at_s > self._gpu_clock_s:
                self._gpu_s += self._held_gpus * (at_s - self._gpu_clock_s)
                self._gpu_clock_s = at_s
            self.now_s = at_s
            self._handle(kind, payload)
        self._accrue_gpu(change.at_s)
        self.now_s = max(self.now_s, change.at_s)
        if change.speed == self.spec.engine_speed:
            return  # no change: the same timing, the segments left whole
        self.fwd = engine_model(self._profile_fwd, change.speed)
        for worker in self._workers[Component.DECODE]:
            if worker.state is _WorkerState.GONE or worker.busy or not (worker.running and worker.segment_iters > 0):
                continue
            if self._on_demand:
                self._od_wake(worker)
            elif worker.kind is _Kind.AGG:
                self._wake_agg(worker)
            else:
                self._admit_decode(worker)

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

    def _retire_if_idle(self, worker: _Worker) -> None:
        if worker.state is _WorkerState.DRAINING and worker.idle:
            self._set_gone(worker)
            self._record_timeline()
