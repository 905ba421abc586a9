"""The simulator's mutable per-worker state (`_Worker`) and its event kinds; private to `planner_core.lab.sim.des`."""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from planner_core.domain import Component


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
