"""On-demand KV allocation on decode and aggregated engines (`KvAllocation.ON_DEMAND`): per-iteration growth,
preemption of the newest request, admission with headroom, and recompute. Part of `ClusterSimulator`, as a mixin."""

from __future__ import annotations

import heapq
import itertools
import math

from planner_core.lab.sim.des.state import (
    _OD_ITER_END,
    _Kind,
    _Worker,
)


class _OnDemandKv:
    """Mixed into `ClusterSimulator` (`planner_core.lab.sim.des.cluster`), whose `__init__` sets the state these
    methods read and write."""

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
