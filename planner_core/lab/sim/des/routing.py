"""Which engine gets a request: round-robin and least-loaded routing, the router queue, the SLO-aware router
(`SloRouting`: predicted latency, no-endpoint handling, adaptive local prefill, frontend retries) and the
engine queues. Part of `ClusterSimulator`, as a mixin."""

from __future__ import annotations

import itertools

from planner_core.domain import Component
from planner_core.lab.sim.des.spec import NoEndpointAction
from planner_core.lab.sim.des.state import (
    _FRONTEND_RETRY,
    _Kind,
    _Worker,
    _WorkerState,
)
from planner_core.routing.scheduler import (
    Candidate,
    InstanceStatus,
    RouteDecision,
    Stage,
    filter_and_select,
    predict_decode,
    predict_prefill,
)


class _Routing:
    """Mixed into `ClusterSimulator` (`planner_core.lab.sim.des.cluster`), whose `__init__` sets the state these
    methods read and write."""

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
