"""Engine capacity under the SLA, per role, from any `ForwardPassModel`.

Role in the planner: the throughput loop sizes each pool as `ceil(demand requests/s / engine requests/s)`; this
module answers the denominator. It asks a `ForwardPassModel` (profile-backed, or an online regression) how long
one iteration takes at each candidate batch size, within the engine's limits (`EngineLimits`), and keeps the best
operating point. (The load loop's per-engine TTFT/ITL estimates are in `planner_core.policy.load_estimates`; they share
`chunked_prefill_s`, `MAX_KV_HIT_RATE` and `effective_accept_length` with this module.)

Capacity search (Dynamo 1.6.1's engine query):

- batch candidates: every size 1..max if max <= 128, else 128 sizes evenly spaced from 1 to max (both included);
- best: a candidate that meets the SLA beats one that does not; among those that meet it, the highest request
  rate (the smaller batch on a tie). When none meets it (reason `sla_unreachable`), the candidate closest to
  meeting it (lowest latency; ours — Dynamo keeps the highest rate, so a tighter unreachable target could report
  *more* capacity than a looser reachable one and size fewer replicas);
- prefill: `ISL_eff = max(1, ceil(ISL * (1 - hit)))`; `max_b = min(max_num_seqs, MBT // ISL_eff)`, 1 when
  `ISL_eff > MBT`; `ttft(b)` = time of `b * ISL_eff` tokens in chunks of MBT (full chunks + tail);
  `rps = b / ttft(b)`;
- decode: `ctx = ISL + OSL // 2`; `max_b = min(max_num_seqs, max_kv_tokens // ctx)` (no capacity when one request
  does not fit the KV cache); `itl(b) = decode_wall(b, b * ctx) / accept`; `rps = b / (OSL * itl)`;
- aggregated: batch at most `min(decode max_b, MBT - 1)`; a batch is feasible when the prefill it must absorb per
  iteration, `p(b) = ceil(b * accept * ISL_eff / OSL)`, fits the token budget left by the decode tokens,
  `p(b) <= MBT - b`; `itl = mixed_wall(p(b), b, b * ctx) / accept`; `ttft` = chunked mixed time of
  `p(b) + ISL_eff` tokens (chunks of MBT, each with the decode batch on board); `rps = b / (OSL * itl)`;
  both TTFT and ITL targets apply. If no batch is feasible, batch 1 with the whole remaining budget
  (`MBT - 1` prefill tokens per iteration) is reported, at the rate prefill can sustain.

Prompt rate of an aggregated engine (ours, for burst sizing, `agg_operating_prompt_rate`): a prefill engine
computes a full chunk of `MBT` prompt tokens per iteration (`full_chunk_prefill_rate`); an aggregated engine shares
each iteration's budget with one token per running decode request and pays for their KV reads, so with `b`
requests decoding it computes `(MBT - b) / mixed_wall(MBT - b, b, b * ctx)` prompt tokens/s (`agg_prompt_rate`).
The rate is taken at the operating point `agg_capacity` chose for the request shape (its batch `b`, context
`ctx = ISL + OSL // 2`): the pool is sized so each engine carries about that batch, and a burst arrives on
engines already decoding it. A smaller batch (an idle engine) would overstate the rate; a larger one (the burst's
own requests joining the batch) is what the burst sizing's slack and the pool's target utilisation cover.

Runtime metadata (Dynamo 1.6.1): the KV hit rate discounts prefill compute only (`1 - clamp(hit, 0, 0.95)`;
unknown = no discount); decode KV uses the raw ISL. The speculative accept length divides decode time, clamped to
`[1, speculative_nextn + 1]`; 1 when `speculative_nextn` is 0 or the accept length is unknown. Each clamp is
recorded as a step with its reason.

Per-GPU figures: `tokens_per_s_per_gpu` counts the request's tokens of the role's demand: ISL (raw, cached
prefix included, as the throughput loop's demand counts it) for prefill, OSL for decode and aggregated.

Pure: no I/O, no clock; queries never change the model.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from planner_core.domain import Component, EngineLimits, ReasonCode, StepName, StepRecord
from planner_core.perf.forward import ForwardPassModel

__all__ = [
    "MAX_CAPACITY_CANDIDATES",
    "MAX_KV_HIT_RATE",
    "BatchLimit",
    "CapacityRole",
    "RoleCapacity",
    "AggPromptRate",
    "agg_capacity",
    "agg_operating_prompt_rate",
    "agg_prompt_rate",
    "batch_candidates",
    "chunked_prefill_s",
    "decode_capacity",
    "decode_context",
    "effective_accept_length",
    "effective_kv_hit_rate",
    "prefill_capacity",
]

MAX_CAPACITY_CANDIDATES = 128  # batch sizes tried per search (Dynamo's bound)
MAX_KV_HIT_RATE = 0.95  # at most 95 % of prefill compute is discounted for KV-cache hits (Dynamo's)


class CapacityRole(enum.StrEnum):
    """Which engine a capacity describes."""

    PREFILL = "prefill"
    DECODE = "decode"
    AGG = "agg"


class BatchLimit(enum.StrEnum):
    """What bounds the largest batch the search may try."""

    MAX_NUM_SEQS = "max_num_seqs"  # the engine's sequence limit
    MAX_NUM_BATCHED_TOKENS = "max_num_batched_tokens"  # the per-iteration token budget
    MAX_KV_TOKENS = "max_kv_tokens"  # the KV cache holds no more requests of this context
    PROMPT_EXCEEDS_BUDGET = "prompt_exceeds_budget"  # one prompt needs several chunks: batch 1
    PREFILL_DECODE_BALANCE = "prefill_decode_balance"  # agg: larger batches need more prefill than fits


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleCapacity:
    """One engine's capacity for one role at one request shape under the SLA.

    Attributes:
        role: the engine role searched.
        requests_per_s: requests/s one engine sustains at the chosen batch (0 when none is possible).
        tokens_per_s_per_gpu: the same as tokens of demand per second per GPU (see the module docstring).
        batch_size: the chosen batch (concurrent requests per iteration).
        max_batch_size: the largest batch the limits allowed.
        batch_limit: which limit set `max_batch_size`.
        latency_ms: the role's headline latency at that batch: TTFT for prefill, ITL for decode and aggregated.
        ttft_ms, itl_ms: both latencies where the role has them (None otherwise).
        sla_met: the chosen batch meets every target of the role.
        reason: `capacity_searched` (met), `sla_unreachable` (no batch meets the SLA; closest used),
            `model_not_ready` or `request_exceeds_engine` (no capacity: `requests_per_s` is 0).
        detail: one line for the tick's explanation.
        steps: the runtime-metadata clamps applied, then the capacity step itself.
    """

    role: CapacityRole
    requests_per_s: float
    tokens_per_s_per_gpu: float
    batch_size: int
    max_batch_size: int
    batch_limit: BatchLimit | None
    latency_ms: float
    ttft_ms: float | None
    itl_ms: float | None
    sla_met: bool
    reason: ReasonCode
    detail: str
    steps: tuple[StepRecord, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether `requests_per_s` is a capacity to size on (SLA met or not)."""
        return self.reason in (ReasonCode.CAPACITY_SEARCHED, ReasonCode.SLA_UNREACHABLE)


# --------------------------------------------------------------------------------------------------------
# Runtime metadata
# --------------------------------------------------------------------------------------------------------


def effective_kv_hit_rate(kv_hit_rate: float | None, component: Component | None = None) -> tuple[float, StepRecord]:
    """The hit rate used to discount prefill compute: `clamp(hit, 0, 0.95)`, 0 when unknown (None or NaN)."""
    if kv_hit_rate is None or math.isnan(kv_hit_rate):
        value, reason, detail = 0.0, ReasonCode.RUNTIME_METADATA_MISSING, "KV hit rate unknown: no prefill discount"
    else:
        value = min(MAX_KV_HIT_RATE, max(0.0, float(kv_hit_rate)))
        if value == kv_hit_rate:
            reason, detail = ReasonCode.WITHIN_RANGE, f"KV hit rate {value:.3g}"
        else:
            reason, detail = ReasonCode.KV_HIT_RATE_CLAMPED, f"KV hit rate {kv_hit_rate:.3g} clamped to {value:.3g}"
    return value, StepRecord(step=StepName.KV_HIT_RATE, reason=reason, component=component, value=value, detail=detail)


def effective_accept_length(
    accept_length: float | None, speculative_nextn: int, component: Component | None = None
) -> tuple[float, StepRecord]:
    """Tokens per request per decode iteration: `accept_length` clamped to `[1, nextn + 1]`; 1 when `nextn` is 0
    (no speculative decoding) or the accept length is unknown (None or NaN)."""
    if speculative_nextn <= 0:
        value, reason, detail = 1.0, ReasonCode.SPECULATIVE_DECODING_OFF, "speculative_nextn = 0: accept length 1"
    elif accept_length is None or math.isnan(accept_length):
        value, reason, detail = 1.0, ReasonCode.RUNTIME_METADATA_MISSING, "accept length unknown: 1"
    else:
        value = min(float(speculative_nextn + 1), max(1.0, float(accept_length)))
        if value == accept_length:
            reason, detail = ReasonCode.WITHIN_RANGE, f"accept length {value:.3g}"
        else:
            reason = ReasonCode.ACCEPT_LENGTH_CLAMPED
            detail = f"accept length {accept_length:.3g} clamped to [1, {speculative_nextn + 1}]: {value:.3g}"
    return value, StepRecord(
        step=StepName.ACCEPT_LENGTH, reason=reason, component=component, value=value, detail=detail
    )


# --------------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------------


def batch_candidates(max_batch: int) -> tuple[int, ...]:
    """Every batch 1..max_batch if at most 128, else 128 sizes `1 + i * (max - 1) // 127` (ends included)."""
    if max_batch <= 0:
        return ()
    if max_batch <= MAX_CAPACITY_CANDIDATES:
        return tuple(range(1, max_batch + 1))
    span, steps = max_batch - 1, MAX_CAPACITY_CANDIDATES - 1
    return tuple(1 + i * span // steps for i in range(MAX_CAPACITY_CANDIDATES))


def chunked_prefill_s(tokens: float, max_num_batched_tokens: int, chunk_wall_s: Callable[[float], float]) -> float:
    """Time to compute `tokens` prompt tokens in iterations of at most `max_num_batched_tokens`: the full chunks
    and the tail, each costed by `chunk_wall_s`. 0 tokens take 0 s."""
    if tokens <= 0:
        return 0.0
    full_chunks = int(tokens // max_num_batched_tokens)
    tail = tokens - full_chunks * max_num_batched_tokens
    total = full_chunks * chunk_wall_s(float(max_num_batched_tokens)) if full_chunks else 0.0
    return total + (chunk_wall_s(tail) if tail > 0 else 0.0)


def full_chunk_prefill_rate(model: ForwardPassModel, max_num_batched_tokens: int) -> tuple[float, float]:
    """Prompt tokens/s one engine computes at full chunks, and the wall time (s) of one full-chunk iteration;
    (0, 0) when the model gives a non-positive iteration time."""
    iteration_s = model.prefill_wall_s(float(max_num_batched_tokens))
    if iteration_s <= 0:
        return 0.0, 0.0
    return max_num_batched_tokens / iteration_s, iteration_s


def agg_prompt_rate(
    model: ForwardPassModel, max_num_batched_tokens: int, *, batch_size: int, context: int
) -> tuple[float, float]:
    """Prompt tokens/s one aggregated engine computes while `batch_size` requests of `context` KV tokens decode, and
    the wall time (s) of one such iteration: `MBT - b` prompt tokens per `mixed_wall_s(MBT - b, b, b * context)`;
    (0, 0) when the decode batch leaves no budget or the model gives a non-positive iteration time."""
    prompt_tokens = max_num_batched_tokens - batch_size
    if prompt_tokens <= 0:
        return 0.0, 0.0
    iteration_s = model.mixed_wall_s(float(prompt_tokens), float(batch_size), float(batch_size * context))
    if not iteration_s > 0:
        return 0.0, 0.0
    return prompt_tokens / iteration_s, iteration_s


def decode_context(isl: float, osl: float) -> int:
    """KV tokens a decoding request holds on average: `max(1, floor(ISL + OSL // 2))`."""
    return max(1, math.floor(isl + osl // 2))


def _effective_isl(isl: float, hit: float) -> int:
    """Prompt tokens computed per request: `max(1, ceil(ISL * (1 - hit)))`. The ceiling forgives float noise
    (1000 * (1 - 0.95) is 50.00000000000004, which must count as 50 tokens, not 51)."""
    return max(1, math.ceil(isl * (1.0 - hit) - 1e-9))


def _check_shape(isl: float, osl: float | None = None) -> None:
    if not (math.isfinite(isl) and isl > 0):
        raise ValueError(f"isl must be a finite number > 0, got {isl!r}")
    if osl is not None and not (math.isfinite(osl) and osl >= 1):
        raise ValueError(f"osl must be a finite number >= 1, got {osl!r}")


def _check_target(name: str, value: float) -> None:
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be > 0 (inf = no target), got {value!r}")


@dataclass(frozen=True, slots=True)
class _Candidate:
    batch: int
    rps: float
    ttft_s: float | None
    itl_s: float | None
    eligible: bool
    closeness: float  # how far from the targets (max of latency / target); lower is closer


def _better(current: _Candidate | None, candidate: _Candidate) -> bool:
    if current is None:
        return True
    if candidate.eligible != current.eligible:
        return candidate.eligible
    if candidate.eligible:
        return candidate.rps > current.rps
    return candidate.closeness < current.closeness


def _best_candidate(batches: Iterable[int], evaluate: Callable[[int], _Candidate | None]) -> _Candidate | None:
    """The best of the batches' candidates (`_better`); a batch the model cannot rate (None) is skipped."""
    best: _Candidate | None = None
    for batch in batches:
        candidate = evaluate(batch)
        if candidate is not None and _better(best, candidate):
            best = candidate
    return best


def _no_capacity(
    role: CapacityRole, component: Component, reason: ReasonCode, detail: str, steps: list[StepRecord]
) -> RoleCapacity:
    step = StepRecord(step=StepName.ENGINE_CAPACITY, reason=reason, component=component, value=0.0, detail=detail)
    return RoleCapacity(
        role=role,
        requests_per_s=0.0,
        tokens_per_s_per_gpu=0.0,
        batch_size=0,
        max_batch_size=0,
        batch_limit=None,
        latency_ms=math.nan,
        ttft_ms=None,
        itl_ms=None,
        sla_met=False,
        reason=reason,
        detail=detail,
        steps=(*steps, step),
    )


def _result(
    role: CapacityRole,
    component: Component,
    best: _Candidate,
    *,
    max_batch: int,
    limit: BatchLimit,
    tokens_per_request: float,
    num_gpu: int,
    steps: list[StepRecord],
    targets: str,
) -> RoleCapacity:
    ttft_ms = None if best.ttft_s is None else best.ttft_s * 1000.0
    itl_ms = None if best.itl_s is None else best.itl_s * 1000.0
    latency_ms = ttft_ms if role is CapacityRole.PREFILL else itl_ms
    assert latency_ms is not None
    reason = ReasonCode.CAPACITY_SEARCHED if best.eligible else ReasonCode.SLA_UNREACHABLE
    latencies = ", ".join(
        f"{name} {value:.2f} ms" for name, value in (("TTFT", ttft_ms), ("ITL", itl_ms)) if value is not None
    )
    verdict = "meets" if best.eligible else "misses (no batch meets it; closest used)"
    detail = (
        f"{role.value}: batch {best.batch} of max {max_batch} ({limit.value}): {latencies} {verdict} {targets}; "
        f"{best.rps:.3g} req/s per engine"
    )
    step = StepRecord(step=StepName.ENGINE_CAPACITY, reason=reason, component=component, value=best.rps, detail=detail)
    return RoleCapacity(
        role=role,
        requests_per_s=best.rps,
        tokens_per_s_per_gpu=best.rps * tokens_per_request / num_gpu,
        batch_size=best.batch,
        max_batch_size=max_batch,
        batch_limit=limit,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        sla_met=best.eligible,
        reason=reason,
        detail=detail,
        steps=(*steps, step),
    )


def _not_ready(role: CapacityRole, component: Component, steps: list[StepRecord]) -> RoleCapacity:
    detail = f"{role.value}: perf model not ready"
    return _no_capacity(role, component, ReasonCode.MODEL_NOT_READY, detail, steps)


def _non_positive(role: CapacityRole, component: Component, steps: list[StepRecord]) -> RoleCapacity:
    detail = f"{role.value}: the perf model predicted no positive iteration time for any batch"
    return _no_capacity(role, component, ReasonCode.MODEL_NOT_READY, detail, steps)


# --------------------------------------------------------------------------------------------------------
# Capacity per role
# --------------------------------------------------------------------------------------------------------


def prefill_capacity(
    model: ForwardPassModel,
    limits: EngineLimits,
    *,
    isl: float,
    ttft_ms: float,
    kv_hit_rate: float | None = None,
) -> RoleCapacity:
    """Requests/s one prefill engine sustains at mean prompt `isl` under the TTFT target (see module docstring).

    Args:
        model: answers `prefill_wall_s`.
        limits: the prefill engine's limits (`max_num_batched_tokens`, `max_num_seqs`, `num_gpu`).
        isl: mean prompt length (tokens), > 0.
        ttft_ms: TTFT target (ms), > 0; `math.inf` for none.
        kv_hit_rate: router KV hit rate (raw; clamped here), None when unknown.

    Raises:
        ValueError: `isl` or `ttft_ms` out of range.
    """
    _check_shape(isl)
    _check_target("ttft_ms", ttft_ms)
    component = Component.PREFILL
    hit, hit_step = effective_kv_hit_rate(kv_hit_rate, component)
    steps = [hit_step]
    if not model.is_ready():
        return _not_ready(CapacityRole.PREFILL, component, steps)
    mbt = limits.max_num_batched_tokens
    isl_eff = _effective_isl(isl, hit)
    if isl_eff > mbt:
        max_batch, limit = 1, BatchLimit.PROMPT_EXCEEDS_BUDGET
    elif limits.max_num_seqs <= mbt // isl_eff:
        max_batch, limit = limits.max_num_seqs, BatchLimit.MAX_NUM_SEQS
    else:
        max_batch, limit = mbt // isl_eff, BatchLimit.MAX_NUM_BATCHED_TOKENS
    target_s = ttft_ms / 1000.0

    def evaluate(batch: int) -> _Candidate | None:
        ttft_s = chunked_prefill_s(batch * isl_eff, mbt, model.prefill_wall_s)
        if not ttft_s > 0:  # a model predicting no time cannot rate a batch (Dynamo skips it too)
            return None
        return _Candidate(batch, batch / ttft_s, ttft_s, None, ttft_s <= target_s, ttft_s / target_s)

    best = _best_candidate(batch_candidates(max_batch), evaluate)
    if best is None:
        return _non_positive(CapacityRole.PREFILL, component, steps)
    return _result(
        CapacityRole.PREFILL,
        component,
        best,
        max_batch=max_batch,
        limit=limit,
        tokens_per_request=isl,
        num_gpu=limits.num_gpu,
        steps=steps,
        targets=f"TTFT {ttft_ms:g} ms (ISL {isl:g}, {isl_eff} computed)",
    )


def _decode_batch_cap(limits: EngineLimits, context: int) -> tuple[int, BatchLimit]:
    by_kv = limits.max_kv_tokens // context
    if limits.max_num_seqs <= by_kv:
        return limits.max_num_seqs, BatchLimit.MAX_NUM_SEQS
    return by_kv, BatchLimit.MAX_KV_TOKENS


def decode_capacity(
    model: ForwardPassModel,
    limits: EngineLimits,
    *,
    isl: float,
    osl: float,
    itl_ms: float,
    accept_length: float | None = None,
) -> RoleCapacity:
    """Requests/s one decode engine sustains at mean lengths `isl`/`osl` under the ITL target (module docstring).

    Args:
        model: answers `decode_wall_s`.
        limits: the decode engine's limits (`max_kv_tokens`, `max_num_seqs`, `num_gpu`, `speculative_nextn`).
        isl, osl: mean prompt and output lengths (tokens); `isl` > 0, `osl` >= 1.
        itl_ms: ITL target (ms), > 0; `math.inf` for none.
        accept_length: speculative-decoding accept length (raw; clamped here), None when unknown.

    Raises:
        ValueError: a length or target out of range.
    """
    _check_shape(isl, osl)
    _check_target("itl_ms", itl_ms)
    component = Component.DECODE
    accept, accept_step = effective_accept_length(accept_length, limits.speculative_nextn, component)
    steps = [accept_step]
    if not model.is_ready():
        return _not_ready(CapacityRole.DECODE, component, steps)
    context = decode_context(isl, osl)
    max_batch, limit = _decode_batch_cap(limits, context)
    if max_batch < 1:
        detail = f"decode: one request of context {context} tokens exceeds max_kv_tokens {limits.max_kv_tokens}"
        return _no_capacity(CapacityRole.DECODE, component, ReasonCode.REQUEST_EXCEEDS_ENGINE, detail, steps)
    target_s = itl_ms / 1000.0

    def evaluate(batch: int) -> _Candidate | None:
        itl_s = model.decode_wall_s(batch, batch * context) / accept
        if not itl_s > 0:
            return None
        return _Candidate(batch, batch / (osl * itl_s), None, itl_s, itl_s <= target_s, itl_s / target_s)

    best = _best_candidate(batch_candidates(max_batch), evaluate)
    if best is None:
        return _non_positive(CapacityRole.DECODE, component, steps)
    return _result(
        CapacityRole.DECODE,
        component,
        best,
        max_batch=max_batch,
        limit=limit,
        tokens_per_request=osl,
        num_gpu=limits.num_gpu,
        steps=steps,
        targets=f"ITL {itl_ms:g} ms (context {context}, accept {accept:g})",
    )


def _agg_evaluator(
    model: ForwardPassModel,
    *,
    context: int,
    accept: float,
    isl_eff: int,
    osl: float,
    mbt: int,
    ttft_ms: float,
    itl_ms: float,
) -> Callable[[int, int], _Candidate | None]:
    """`evaluate(batch, prefill_per_iter)`: an aggregated engine's candidate at `batch` requests decoding next to
    `prefill_per_iter` prompt tokens per iteration (None when the model answers no positive time)."""
    ttft_target_s, itl_target_s = ttft_ms / 1000.0, itl_ms / 1000.0

    def evaluate(batch: int, prefill_per_iter: int) -> _Candidate | None:
        decode_kv = batch * context
        forward_s = model.mixed_wall_s(prefill_per_iter, batch, decode_kv)
        if not forward_s > 0:
            return None
        itl_s = forward_s / accept
        ttft_s = chunked_prefill_s(
            prefill_per_iter + isl_eff, mbt, lambda chunk: model.mixed_wall_s(chunk, batch, decode_kv)
        )
        # Decode rate b/(OSL*itl); when prefill cannot keep up (fallback only) the prefill rate binds.
        rps = min(batch / (osl * itl_s), prefill_per_iter / (isl_eff * forward_s))
        eligible = ttft_s <= ttft_target_s and itl_s <= itl_target_s
        closeness = max(ttft_s / ttft_target_s, itl_s / itl_target_s)
        return _Candidate(batch, rps, ttft_s, itl_s, eligible, closeness)

    return evaluate


def _agg_balanced_batch(
    evaluate: Callable[[int, int], _Candidate | None],
    hard_cap: int,
    limit: BatchLimit,
    *,
    accept: float,
    isl_eff: int,
    osl: float,
    mbt: int,
) -> tuple[_Candidate | None, int, BatchLimit]:
    """The best candidate among the batches whose prefill keeps up with their decode within the batch budget,
    the largest such batch and what limits it (batch 1 with the whole budget when even it cannot keep up)."""

    def prefill_per_iter(batch: int) -> int:
        """Prompt tokens per iteration that keep up with `batch` requests decoding (accepted tokens per step)."""
        return math.ceil(batch * accept * isl_eff / osl)

    feasible = [batch for batch in batch_candidates(hard_cap) if prefill_per_iter(batch) <= mbt - batch]
    best = _best_candidate(feasible, lambda batch: evaluate(batch, prefill_per_iter(batch)))
    largest_feasible = max(feasible, default=0)
    if largest_feasible == 0:  # even batch 1 needs more prefill per iteration than fits: prefill-bound
        best = evaluate(1, mbt - 1)
        max_batch, limit = 1, BatchLimit.PREFILL_DECODE_BALANCE
    elif largest_feasible < hard_cap:
        max_batch, limit = largest_feasible, BatchLimit.PREFILL_DECODE_BALANCE
    else:
        max_batch = hard_cap
    return best, max_batch, limit


def agg_capacity(
    model: ForwardPassModel,
    limits: EngineLimits,
    *,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    kv_hit_rate: float | None = None,
    accept_length: float | None = None,
) -> RoleCapacity:
    """Requests/s one aggregated engine sustains under both the TTFT and the ITL target (module docstring).

    Args:
        model: answers `mixed_wall_s`.
        limits: the aggregated engine's limits.
        isl, osl: mean prompt and output lengths (tokens); `isl` > 0, `osl` >= 1.
        ttft_ms, itl_ms: targets (ms), > 0; `math.inf` for none.
        kv_hit_rate: router KV hit rate (raw), None when unknown.
        accept_length: speculative-decoding accept length (raw), None when unknown.

    Raises:
        ValueError: a length or target out of range.
    """
    _check_shape(isl, osl)
    _check_target("ttft_ms", ttft_ms)
    _check_target("itl_ms", itl_ms)
    component = Component.DECODE  # the aggregated pool is scaled as the decode pool
    hit, hit_step = effective_kv_hit_rate(kv_hit_rate, component)
    accept, accept_step = effective_accept_length(accept_length, limits.speculative_nextn, component)
    steps = [hit_step, accept_step]
    if not model.is_ready():
        return _not_ready(CapacityRole.AGG, component, steps)
    mbt = limits.max_num_batched_tokens
    isl_eff = _effective_isl(isl, hit)
    context = decode_context(isl, osl)
    decode_cap, limit = _decode_batch_cap(limits, context)
    if decode_cap < 1 or mbt < 2:
        detail = (
            f"agg: one request of context {context} tokens exceeds max_kv_tokens {limits.max_kv_tokens}"
            if decode_cap < 1
            else f"agg: max_num_batched_tokens {mbt} leaves no room for prefill"
        )
        return _no_capacity(CapacityRole.AGG, component, ReasonCode.REQUEST_EXCEEDS_ENGINE, detail, steps)
    if mbt - 1 < decode_cap:
        hard_cap, limit = mbt - 1, BatchLimit.MAX_NUM_BATCHED_TOKENS
    else:
        hard_cap = decode_cap
    evaluate = _agg_evaluator(
        model, context=context, accept=accept, isl_eff=isl_eff, osl=osl, mbt=mbt, ttft_ms=ttft_ms, itl_ms=itl_ms
    )
    best, max_batch, limit = _agg_balanced_batch(
        evaluate, hard_cap, limit, accept=accept, isl_eff=isl_eff, osl=osl, mbt=mbt
    )
    if best is None:
        return _non_positive(CapacityRole.AGG, component, steps)
    return _result(
        CapacityRole.AGG,
        component,
        best,
        max_batch=max_batch,
        limit=limit,
        tokens_per_request=osl,
        num_gpu=limits.num_gpu,
        steps=steps,
        targets=(
            f"TTFT {ttft_ms:g} ms and ITL {itl_ms:g} ms (ISL {isl_eff} computed, context {context}, accept {accept:g})"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AggPromptRate:
    """An aggregated engine's prompt rate at its operating point (module docstring).

    Attributes:
        tokens_per_s: prompt tokens computed per second (KV hits not discounted; 0 when unknown).
        iteration_s: wall time of one iteration at that point (s; 0 when unknown).
        batch_size: the decode batch on board (`agg_capacity`'s choice; 0 when it found none).
        context: KV tokens per decoding request.
        capacity: the capacity search the operating point comes from.
    """

    tokens_per_s: float
    iteration_s: float
    batch_size: int
    context: int
    capacity: RoleCapacity


def agg_operating_prompt_rate(
    model: ForwardPassModel,
    limits: EngineLimits,
    *,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    kv_hit_rate: float | None = None,
    accept_length: float | None = None,
) -> AggPromptRate:
    """Prompt tokens/s one aggregated engine computes at the batch `agg_capacity` chooses for this shape and these
    targets (`agg_prompt_rate` at that batch). The burst sizing of the planner and the bench's arrival curve both
    take the agg engine's rate from here. Arguments and errors as `agg_capacity`."""
    capacity = agg_capacity(
        model, limits, isl=isl, osl=osl, ttft_ms=ttft_ms, itl_ms=itl_ms, kv_hit_rate=kv_hit_rate,
        accept_length=accept_length,
    )  # fmt: skip
    context = decode_context(isl, osl)
    if not capacity.usable:
        return AggPromptRate(tokens_per_s=0.0, iteration_s=0.0, batch_size=0, context=context, capacity=capacity)
    tokens_per_s, iteration_s = agg_prompt_rate(
        model, limits.max_num_batched_tokens, batch_size=capacity.batch_size, context=context
    )
    return AggPromptRate(
        tokens_per_s=tokens_per_s,
        iteration_s=iteration_s,
        batch_size=capacity.batch_size,
        context=context,
        capacity=capacity,
    )
