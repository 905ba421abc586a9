"""How engines serve their queues: the prefix cache, chunked prefill, decode segments and aggregated (mixed)
iterations. Part of `ClusterSimulator`, as a mixin."""

from __future__ import annotations

import heapq

from planner_core.lab.sim.des.state import (
    _AGG_ITER_END,
    _DECODE_HANDOFF,
    _PREFILL_DONE,
    _SEGMENT_END,
    _Kind,
    _Worker,
)


class _Engines:
    """Mixed into `ClusterSimulator` (`planner_core.lab.sim.des.cluster`), whose `__init__` sets the state these
    methods read and write."""

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
