"""The routing proxy's decision core: per-worker load it tracks itself, and the choice of a worker for a request.

A proxy in front of engines that it cannot query (Dynamo's frontend in `direct` mode, which sends a request to the
worker named in it) knows each worker's load only from the requests it sent there. `DispatchState` is that
knowledge, immutable (each event returns a new state), with no clock (times are arguments):

- a request placed on a worker waits for its first token: its prompt tokens count as the worker's queued prefill
  tokens (`admit`);
- at its first token it joins the worker's decode batch, holding its prompt tokens of KV context (`first_token`);
  the output tokens it adds later are not counted (the proxy does not parse the stream), so context is a floor;
- at its end it leaves the worker (`finish`); a worker gone from discovery is dropped with its requests
  (`with_workers`).

`choose` asks the routing library for a worker: the decode stage (TPOT if the request joined the worker's batch)
blocks the workers predicted over `ITL x threshold`, then the prefill stage (TTFT of the prompt after the worker's
queued prefill, chunked, each chunk carrying the worker's decode batch: an aggregated engine) picks the lowest
predicted TTFT among the rest under `TTFT x threshold`. Nothing left: `NO_AVAILABLE_ENDPOINT`, and the caller queues
or rejects (`NoEndpointPolicy`). `choose(..., force=True)` skips the metric filters: the lowest predicted TTFT over
every worker (a queued request whose wait reached its TTFT target is placed anyway).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace

from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.scheduler import (
    BlockReason,
    Candidate,
    InstanceStatus,
    RouteDecision,
    RouteOutcome,
    SloTargets,
    Stage,
    filter_and_select,
    predict_decode,
    predict_prefill,
)


class NoEndpointPolicy(enum.StrEnum):
    QUEUE = "queue"  # hold the request at the proxy until a worker is predicted to meet the SLO, or its TTFT target
    REJECT = "reject"  # answer 503 at once


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLoad:
    """What the proxy sent to one worker and is not finished: requests waiting for their first token (id, prompt
    tokens) and requests decoding (id, KV context tokens)."""

    worker_id: str
    prefilling: tuple[tuple[str, int], ...] = ()
    decoding: tuple[tuple[str, int], ...] = ()

    def status(self, chunk_tokens: int | None) -> InstanceStatus:
        return InstanceStatus(
            instance_id=self.worker_id,
            queued_prefill_tokens=sum(tokens for _, tokens in self.prefilling),
            decode_batch_size=len(self.decoding),
            decode_kv_tokens=sum(tokens for _, tokens in self.decoding),
            chunk_tokens=chunk_tokens,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchState:
    """Every known worker's load, in discovery order (the selector's tie-break)."""

    workers: tuple[WorkerLoad, ...] = ()

    def worker(self, worker_id: str) -> WorkerLoad | None:
        return next((w for w in self.workers if w.worker_id == worker_id), None)

    def with_workers(self, worker_ids: Iterable[str]) -> DispatchState:
        """The workers now registered, sorted: known ones keep their load, new ones start idle, gone ones are
        dropped with their requests (a later `first_token`/`finish` of those is a no-op)."""
        known = {w.worker_id: w for w in self.workers}
        return DispatchState(workers=tuple(known.get(i, WorkerLoad(worker_id=i)) for i in sorted(set(worker_ids))))

    def _with(self, load: WorkerLoad) -> DispatchState:
        return DispatchState(workers=tuple(load if w.worker_id == load.worker_id else w for w in self.workers))

    def admit(self, worker_id: str, request_id: str, prompt_tokens: int) -> DispatchState:
        """A request placed on `worker_id`: its prompt waits for prefill there."""
        load = self.worker(worker_id)
        if load is None:
            return self
        return self._with(replace(load, prefilling=(*load.prefilling, (request_id, prompt_tokens))))

    def first_token(self, worker_id: str, request_id: str) -> DispatchState:
        """The request's first token: it leaves the prefill queue and joins the decode batch with its prompt."""
        load = self.worker(worker_id)
        entry = next((e for e in load.prefilling if e[0] == request_id), None) if load else None
        if load is None or entry is None:
            return self
        return self._with(
            replace(
                load,
                prefilling=tuple(e for e in load.prefilling if e[0] != request_id),
                decoding=(*load.decoding, entry),
            )
        )

    def finish(self, worker_id: str, request_id: str) -> DispatchState:
        """The request ended (done, failed or cancelled), wherever it was."""
        load = self.worker(worker_id)
        if load is None:
            return self
        return self._with(
            replace(
                load,
                prefilling=tuple(e for e in load.prefilling if e[0] != request_id),
                decoding=tuple(e for e in load.decoding if e[0] != request_id),
            )
        )

    def num_in_flight(self) -> int:
        return sum(len(w.prefilling) + len(w.decoding) for w in self.workers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """The proxy's decision for one request: the prefill stage's decision, and the workers the decode stage blocked
    (predicted TPOT over its limit) before it."""

    decision: RouteDecision
    decode_blocked: tuple[str, ...]

    @property
    def worker_id(self) -> str | None:
        return self.decision.instance_id

    @property
    def placed(self) -> bool:
        return self.decision.outcome is RouteOutcome.SELECTED


def choose(
    state: DispatchState,
    predictor: LatencyPredictor,
    targets: SloTargets,
    prompt_tokens: int,
    *,
    chunk_tokens: int | None,
    force: bool = False,
) -> Choice:
    """The worker for a request of `prompt_tokens` (see the module docstring)."""
    statuses = [w.status(chunk_tokens) for w in state.workers]
    decode = filter_and_select(
        Stage.DECODE,
        [Candidate(status=s, predicted_ms=predict_decode(predictor, s, prompt_tokens)) for s in statuses],
        targets,
        apply_metric_filter=not force,
    )
    decode_blocked = tuple(i for i, reason in decode.blocked if reason is BlockReason.PREDICTED_OVER_SLO)
    prefill_candidates = [
        Candidate(status=s, predicted_ms=predict_prefill(predictor, s, prompt_tokens))
        for s in statuses
        if s.instance_id not in decode_blocked
    ]
    decision = filter_and_select(Stage.PREFILL, prefill_candidates, targets, apply_metric_filter=not force)
    return Choice(decision=decision, decode_blocked=decode_blocked)


def estimate_prompt_tokens(text_chars: int, chars_per_token: float) -> int:
    """Prompt tokens of a prompt of `text_chars` characters at `chars_per_token` (at least 1): the proxy's count
    when no tokenizer is at hand."""
    return max(1, round(text_chars / chars_per_token))
