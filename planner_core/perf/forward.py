"""`ForwardPassModel`: how long one engine iteration takes for a given batch.

Every SLA model of the planner reduces to this question. Engine capacity under the SLA (throughput loop) and
per-engine TTFT/ITL estimates (load loop) are computed from it, whatever answers it: the pre-deployment profile,
a table precomputed offline, or a regression fitted online on the engines' forward-pass metrics.

Implementations are immutable values or wrappers of them; queries never change the model.
"""

from __future__ import annotations

from typing import Protocol


class ForwardPassModel(Protocol):
    """Predicted wall time (seconds) of one engine iteration."""

    def is_ready(self) -> bool:
        """Whether the model can answer (an online model needs enough observations first)."""
        ...

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        """One prefill iteration computing `prefill_tokens` prompt tokens (a chunk of at most the batch budget)."""
        ...

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        """One decode iteration of `num_decode_requests` sequences holding `decode_kv_tokens` KV tokens in total."""
        ...

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        """One aggregated iteration: a prefill chunk piggybacked on a decode batch."""
        ...
