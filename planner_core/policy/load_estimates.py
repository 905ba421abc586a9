"""The load loop's per-engine latency estimates: the TTFT and ITL of the next request on one engine rank, from its
latest forward-pass metrics and the pool's forward-pass model (prefill, decode and aggregated engines, with the
queue or decode load scaled as after a consolidation). `planner_core.policy.load` turns them into signals.

Pure: the forward-pass model answers every timing question; no clock, no I/O.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner_core.domain import ForwardPassMetrics
from planner_core.perf.capacity import MAX_KV_HIT_RATE, chunked_prefill_s

if TYPE_CHECKING:  # the protocol only types the argument; importing planner_core.perf would load numpy/scipy
    from planner_core.perf.forward import ForwardPassModel

__all__ = [
    "estimate_agg_itl_s",
    "estimate_agg_ttft_s",
    "estimate_decode_itl_s",
    "estimate_prefill_ttft_s",
    "prefill_compute_fraction",
]

# The KV hit rate never discounts more than 95% of a prompt: some prompt is always computed (Dynamo's clamp).


def prefill_compute_fraction(kv_hit_rate: float | None) -> float:
    """Share of prompt tokens an engine must compute: `1 - clamp(hit, 0, 0.95)`; 1 when the hit rate is unknown."""
    if kv_hit_rate is None or math.isnan(kv_hit_rate):
        return 1.0
    return 1.0 - min(max(kv_hit_rate, 0.0), MAX_KV_HIT_RATE)


def _ceil(value: float) -> int:
    """Token and request counts are whole: round a scaled count up (never below 0).

    Float noise is dropped first (`21000 * (1 - 0.95)` is 1050.0000000000002, which is 1050 tokens, not 1051).
    """
    return math.ceil(round(value, 6)) if value > 0 else 0


def estimate_prefill_ttft_s(
    model: ForwardPassModel,
    fpm: ForwardPassMetrics,
    *,
    max_num_batched_tokens: int,
    avg_isl: float,
    kv_hit_rate: float | None,
    queue_scale: float = 1.0,
) -> float:
    """TTFT (s) of the next request on one prefill engine rank.

    `tokens = ceil((queued_prefill_tokens * queue_scale + avg_isl) * (1 - clamp(hit, 0, 0.95)))`, computed in
    chunks of `max_num_batched_tokens` through `model.prefill_wall_s`.
    """
    queued = fpm.queued.sum_prefill_tokens * queue_scale
    tokens = _ceil((queued + max(avg_isl, 0.0)) * prefill_compute_fraction(kv_hit_rate))
    return chunked_prefill_s(tokens, max_num_batched_tokens, model.prefill_wall_s)


def _next_decode_context(avg_isl: float, avg_osl: float, next_context: float | None) -> float:
    """KV tokens of the next decode request: `next_context` when given, else `ISL + OSL/2` (0 = unknown)."""
    if next_context is not None:
        return max(next_context, 0.0)
    return max(avg_isl, 0.0) + max(avg_osl, 0.0) / 2.0


def estimate_decode_itl_s(
    model: ForwardPassModel,
    fpm: ForwardPassMetrics,
    *,
    avg_isl: float,
    avg_osl: float,
    accept_length: float,
    decode_scale: float = 1.0,
    next_context: float | None = None,
) -> float:
    """ITL (s) of the next request on one decode engine rank.

    `decode_wall_s((scheduled + queued requests) * scale + 1, (scheduled + queued KV) * scale + context)
    / accept_length`, with the next request's context `next_context` if given, else ISL + OSL/2; the next
    request (the `+ 1` and its context) only when that context is known (> 0).
    """
    num_requests = (fpm.scheduled.num_decode_requests + fpm.queued.num_decode_requests) * decode_scale
    kv_tokens = (fpm.scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens) * decode_scale
    next_context = _next_decode_context(avg_isl, avg_osl, next_context)
    if next_context > 0:
        num_requests += 1
        kv_tokens += next_context
    return model.decode_wall_s(_ceil(num_requests), _ceil(kv_tokens)) / accept_length


def estimate_agg_ttft_s(
    model: ForwardPassModel,
    fpm: ForwardPassMetrics,
    *,
    max_num_batched_tokens: int,
    avg_isl: float,
    kv_hit_rate: float | None,
    queue_scale: float = 1.0,
    decode_scale: float = 1.0,
    include_queued_decode: bool = False,
) -> float:
    """TTFT (s) of the next request on one aggregated engine rank: its prompt chunks ride on the decode batch.

    Prompt tokens as in `estimate_prefill_ttft_s`; each iteration computes a chunk next to the decode batch
    (scheduled decode, plus queued decode when `include_queued_decode`, times `decode_scale`) through
    `model.mixed_wall_s`. Every decode request takes one token of the batch budget, so a chunk holds at most
    `max_num_batched_tokens - decode requests` prompt tokens (at least 1).
    """
    queued = fpm.queued.sum_prefill_tokens * queue_scale
    tokens = _ceil((queued + max(avg_isl, 0.0)) * prefill_compute_fraction(kv_hit_rate))
    decode_requests = fpm.scheduled.num_decode_requests
    decode_kv = fpm.scheduled.sum_decode_kv_tokens
    if include_queued_decode:
        decode_requests += fpm.queued.num_decode_requests
        decode_kv += fpm.queued.sum_decode_kv_tokens
    num_decode = _ceil(decode_requests * decode_scale)
    kv_tokens = _ceil(decode_kv * decode_scale)
    chunk_tokens = max(1, max_num_batched_tokens - num_decode)
    return chunked_prefill_s(tokens, chunk_tokens, lambda chunk: model.mixed_wall_s(chunk, num_decode, kv_tokens))


def estimate_agg_itl_s(
    model: ForwardPassModel,
    fpm: ForwardPassMetrics,
    *,
    avg_isl: float,
    avg_osl: float,
    accept_length: float,
    decode_scale: float = 1.0,
    include_queued_prefill: bool = False,
    next_context: float | None = None,
) -> float:
    """ITL (s) of the next request on one aggregated engine rank.

    As `estimate_decode_itl_s`, with the engine's scheduled prompt chunk in every iteration (`model.mixed_wall_s`);
    with `include_queued_prefill`, queued prompts count as future decode requests and KV before scaling.
    """
    num_requests = float(fpm.scheduled.num_decode_requests + fpm.queued.num_decode_requests)
    kv_tokens = float(fpm.scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens)
    if include_queued_prefill:
        num_requests += fpm.queued.num_prefill_requests
        kv_tokens += fpm.queued.sum_prefill_tokens
    num_requests *= decode_scale
    kv_tokens *= decode_scale
    next_context = _next_decode_context(avg_isl, avg_osl, next_context)
    if next_context > 0:
        num_requests += 1
        kv_tokens += next_context
    wall_s = model.mixed_wall_s(fpm.scheduled.sum_prefill_tokens, _ceil(num_requests), _ceil(kv_tokens))
    return wall_s / accept_length
