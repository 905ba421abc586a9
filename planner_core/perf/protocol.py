"""What the throughput loop asks of an engine performance model: the capacity of one GPU of a pool under the SLA.

Implemented by `ProfilePerfModel` (a Dynamo profile) and by test doubles; the policy layer depends on this
protocol only, never on a model's implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the forward-pass models load numpy; the protocol only needs the name
    from planner_core.perf.forward import ForwardPassModel


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseCapacity:
    """What one GPU of a pool serves under the SLA at the forecast shape."""

    tokens_per_s_per_gpu: float
    latency_ms: float  # TTFT for prefill, ITL for decode, at that operating point
    sla_met: bool


class ThroughputPerfModel(Protocol):
    """Engine capacity queries the throughput loop needs. Queries never change the model."""

    def prefill_capacity(self, *, isl: float, ttft_ms: float) -> PhaseCapacity: ...

    def decode_capacity(self, *, isl: float, osl: float, itl_ms: float) -> PhaseCapacity: ...

    def prefill_ttft_ms(self, isl: float) -> float: ...

    def decode_itl_ms(self, concurrency: float, context_length: float) -> float: ...

    def forward_pass_model(self) -> ForwardPassModel | None:
        """The forward-pass model the loops start from before their online models are ready, if any."""
        ...

    def profiled_max_kv_tokens(self) -> int | None:
        """The decode engine's KV-cache capacity (tokens) the profile measured, if known."""
        ...
