"""The scheduling pipeline of SLO-aware routing, per stage: filters, then a selector, or no available endpoint.

Prefill stage (metric: predicted TTFT) and decode stage (metric: predicted TPOT) run the same pipeline over the
instances' status:

1. failover filter (global): every instance of a failure domain that holds an unhealthy instance is blocked;
2. schedulability filter: an instance that does not take new requests (starting, draining) is blocked;
3. staleness filter: an instance whose status is older than `max_status_age_s` is blocked (its load is unknown);
4. metric filter: an instance whose predicted latency exceeds `SLO x dispatch threshold` is blocked;
5. selector: the remaining instance with the lowest predicted latency (ties: the first in the given order).

With nothing left after the filters the outcome is `NO_AVAILABLE_ENDPOINT`: the decision names no instance, and
what happens to the request (queued at the frontend, rejected, prefilled elsewhere) is the caller's policy. Each
blocked instance carries the filter that blocked it, so the outcome can be explained.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from planner_core.routing.predictor import LatencyPredictor


class Stage(enum.StrEnum):
    PREFILL = "prefill"  # metric: predicted TTFT
    DECODE = "decode"  # metric: predicted TPOT


class RouteOutcome(enum.StrEnum):
    SELECTED = "selected"
    NO_AVAILABLE_ENDPOINT = "no_available_endpoint"


class BlockReason(enum.StrEnum):
    """Which filter blocked an instance."""

    FAILOVER = "failover"  # its failure domain holds an unhealthy instance
    UNSCHEDULABLE = "unschedulable"
    STALE = "stale"  # status older than the staleness limit
    PREDICTED_OVER_SLO = "predicted_over_slo"  # predicted latency > SLO x dispatch threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceStatus:
    """What the router knows of one engine instance.

    Attributes:
        instance_id: its name.
        failure_domain: instances sharing a domain fail together (a node, a rack); None: a domain of its own.
        healthy / schedulable: health, and whether it takes new requests.
        status_age_s: age of this status.
        queued_prefill_tokens: prompt tokens it still has to compute (queued and in progress).
        decode_batch_size: requests it decodes (running and admitted-to-be).
        decode_kv_tokens: KV tokens those requests hold.
        chunk_tokens: its prefill chunk budget (`max_num_batched_tokens`); None: one iteration per prompt.
    """

    instance_id: str
    failure_domain: str | None = None
    healthy: bool = True
    schedulable: bool = True
    status_age_s: float = 0.0
    queued_prefill_tokens: int = 0
    decode_batch_size: int = 0
    decode_kv_tokens: int = 0
    chunk_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SloTargets:
    """The SLO and the dispatch thresholds: an instance is kept only if predicted <= SLO x threshold."""

    ttft_ms: float
    tpot_ms: float
    ttft_dispatch_threshold: float = 1.0
    tpot_dispatch_threshold: float = 1.0

    def limit_ms(self, stage: Stage) -> float:
        if stage is Stage.PREFILL:
            return self.ttft_ms * self.ttft_dispatch_threshold
        return self.tpot_ms * self.tpot_dispatch_threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An instance with its predicted latency for this request at this stage (ms)."""

    status: InstanceStatus
    predicted_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteDecision:
    """The outcome of one stage for one request."""

    stage: Stage
    outcome: RouteOutcome
    instance_id: str | None  # None with NO_AVAILABLE_ENDPOINT
    predicted_ms: float | None  # the chosen instance's prediction
    limit_ms: float  # SLO x dispatch threshold
    blocked: tuple[tuple[str, BlockReason], ...]  # (instance, the first filter that blocked it)


def predict_prefill(predictor: LatencyPredictor, status: InstanceStatus, prompt_tokens: int) -> float:
    """Predicted TTFT (ms) of a prompt sent to `status`'s instance: its queued prompt tokens first, in chunks, each
    chunk with the instance's decode batch (none on a prefill-only instance)."""
    batch = status.decode_batch_size
    return predictor.predict_ttft_ms(
        prompt_tokens=prompt_tokens,
        queued_prefill_tokens=status.queued_prefill_tokens,
        chunk_tokens=status.chunk_tokens,
        decode_batch_size=batch,
        decode_tokens_per_request=status.decode_kv_tokens / batch if batch else 0.0,
    )


def predict_decode(predictor: LatencyPredictor, status: InstanceStatus, context_tokens: int) -> float:
    """Predicted TPOT (ms) on `status`'s instance once a request holding `context_tokens` KV tokens joins its batch."""
    batch = status.decode_batch_size + 1
    return predictor.predict_tpot_ms(
        decode_batch_size=batch, decode_tokens_per_request=(status.decode_kv_tokens + context_tokens) / batch
    )


def filter_and_select(
    stage: Stage,
    candidates: Sequence[Candidate],
    targets: SloTargets,
    *,
    max_status_age_s: float | None = None,
    apply_metric_filter: bool = True,
) -> RouteDecision:
    """Run the filters in order, then the selector (see the module docstring). `apply_metric_filter=False` skips
    the metric filter only (a caller dispatching a request that can no longer meet its SLO anyway)."""
    limit_ms = targets.limit_ms(stage)
    failed_domains = {
        c.status.failure_domain for c in candidates if not c.status.healthy and c.status.failure_domain is not None
    }
    blocked: list[tuple[str, BlockReason]] = []
    kept: list[Candidate] = []
    for candidate in candidates:
        status = candidate.status
        if not status.healthy or (status.failure_domain is not None and status.failure_domain in failed_domains):
            reason: BlockReason | None = BlockReason.FAILOVER
        elif not status.schedulable:
            reason = BlockReason.UNSCHEDULABLE
        elif max_status_age_s is not None and status.status_age_s > max_status_age_s:
            reason = BlockReason.STALE
        elif apply_metric_filter and candidate.predicted_ms > limit_ms:
            reason = BlockReason.PREDICTED_OVER_SLO
        else:
            reason = None
        if reason is None:
            kept.append(candidate)
        else:
            blocked.append((status.instance_id, reason))
    if not kept:
        return RouteDecision(
            stage=stage,
            outcome=RouteOutcome.NO_AVAILABLE_ENDPOINT,
            instance_id=None,
            predicted_ms=None,
            limit_ms=limit_ms,
            blocked=tuple(blocked),
        )
    best = min(kept, key=lambda c: c.predicted_ms)  # min keeps the first of equal predictions
    return RouteDecision(
        stage=stage,
        outcome=RouteOutcome.SELECTED,
        instance_id=best.status.instance_id,
        predicted_ms=best.predicted_ms,
        limit_ms=limit_ms,
        blocked=tuple(blocked),
    )


def route_prefill(
    predictor: LatencyPredictor,
    instances: Sequence[InstanceStatus],
    prompt_tokens: int,
    targets: SloTargets,
    *,
    max_status_age_s: float | None = None,
) -> RouteDecision:
    """The prefill stage: predicted TTFT per instance, the filters, the lowest predicted TTFT."""
    candidates = [Candidate(status=s, predicted_ms=predict_prefill(predictor, s, prompt_tokens)) for s in instances]
    return filter_and_select(Stage.PREFILL, candidates, targets, max_status_age_s=max_status_age_s)


def route_decode(
    predictor: LatencyPredictor,
    instances: Sequence[InstanceStatus],
    context_tokens: int,
    targets: SloTargets,
    *,
    max_status_age_s: float | None = None,
) -> RouteDecision:
    """The decode stage: predicted TPOT per instance, the filters, the lowest predicted TPOT."""
    candidates = [Candidate(status=s, predicted_ms=predict_decode(predictor, s, context_tokens)) for s in instances]
    return filter_and_select(Stage.DECODE, candidates, targets, max_status_age_s=max_status_age_s)
