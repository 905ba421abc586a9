"""The latency predictor of SLO-aware routing: interpolation over the profiling tables (p50 values only).

- TTFT table (by prompt tokens): linear interpolation between the two profiled lengths around the query, which is
  bilinear interpolation with one axis. TPOT table (by decode batch size and tokens per request): bilinear
  interpolation between the four grid points of the cell around the query. Both are exact at profiled points.
  Outside the profiled range the edge segment / cell is extended linearly (floored at 0 ms): a load past the
  largest profiled batch is predicted slower than it, never clamped to the edge value, so a router does not take an
  overloaded engine for a fast one.
- Chunked prefill: an engine computes its queued prompt tokens and the new prompt in iterations of at most
  `chunk_tokens` tokens (`max_num_batched_tokens`), so the predicted TTFT is the sum of the table's TTFT of each
  chunk (n full chunks and the remainder), not the TTFT of one prompt of that total length.
- An engine that also decodes (an aggregated engine, or a decode engine prefilling a short prompt itself) runs each
  prefill chunk in an iteration that also carries its decode batch: every chunk iteration adds the TPOT table's
  value for that batch. An approximation: the batch's one token per request taken from the chunk budget is ignored.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from planner_core.routing.profiling import TpotProfile, TtftProfile


def _segment(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """Index i of the segment [axis[i], axis[i+1]] used for `x` (the edge one outside the axis) and the position
    t of `x` in it (0 at axis[i], 1 at axis[i+1]; below 0 or above 1 outside the axis)."""
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


@dataclass(frozen=True, slots=True)
class LatencyPredictor:
    """TTFT and TPOT predictions (ms) from a TTFT and a TPOT profile. Immutable; queries cost microseconds."""

    ttft: TtftProfile
    tpot: TpotProfile
    _ttft_x: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _ttft_y: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _batch: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _tokens: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _grid: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)  # [batch][tokens]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ttft_x", tuple(float(p.tokens_num) for p in self.ttft.points))
        object.__setattr__(self, "_ttft_y", tuple(p.p50_ms for p in self.ttft.points))
        batches = sorted({p.batch_size for p in self.tpot.points})
        tokens = sorted({p.tokens_per_request for p in self.tpot.points})
        value = {(p.batch_size, p.tokens_per_request): p.p50_ms for p in self.tpot.points}
        object.__setattr__(self, "_batch", tuple(float(b) for b in batches))
        object.__setattr__(self, "_tokens", tuple(float(t) for t in tokens))
        object.__setattr__(self, "_grid", tuple(tuple(value[(b, t)] for t in tokens) for b in batches))

    def ttft_table_ms(self, prompt_tokens: float) -> float:
        """The TTFT table at `prompt_tokens` (one prompt on an idle engine)."""
        i, t = _segment(self._ttft_x, prompt_tokens)
        y = self._ttft_y
        return max(0.0, (1.0 - t) * y[i] + t * y[i + 1])

    def tpot_table_ms(self, batch_size: float, tokens_per_request: float) -> float:
        """The TPOT table at (`batch_size`, `tokens_per_request`), bilinear in the cell around it."""
        i, u = _segment(self._batch, batch_size)
        j, v = _segment(self._tokens, tokens_per_request)
        g = self._grid
        value = (
            (1.0 - u) * (1.0 - v) * g[i][j]
            + (1.0 - u) * v * g[i][j + 1]
            + u * (1.0 - v) * g[i + 1][j]
            + u * v * g[i + 1][j + 1]
        )
        return max(0.0, value)

    def predict_ttft_ms(
        self,
        *,
        prompt_tokens: float,
        queued_prefill_tokens: float = 0.0,
        chunk_tokens: int | None = None,
        decode_batch_size: int = 0,
        decode_tokens_per_request: float = 0.0,
    ) -> float:
        """TTFT of a new prompt on an engine with `queued_prefill_tokens` still to compute before it, in chunks of
        `chunk_tokens` (None: one iteration), each chunk also carrying a decode batch of `decode_batch_size`
        requests (0: a prefill-only engine)."""
        total = max(0.0, queued_prefill_tokens) + max(0.0, prompt_tokens)
        if chunk_tokens is None or total <= chunk_tokens:
            iterations, prefill_ms = 1, self.ttft_table_ms(total)
        else:
            full, rest = divmod(total, chunk_tokens)
            iterations = int(full) + (1 if rest > 0 else 0)
            prefill_ms = full * self.ttft_table_ms(chunk_tokens) + (self.ttft_table_ms(rest) if rest > 0 else 0.0)
        if decode_batch_size > 0:
            prefill_ms += iterations * self.tpot_table_ms(decode_batch_size, decode_tokens_per_request)
        return prefill_ms

    def predict_tpot_ms(self, *, decode_batch_size: int, decode_tokens_per_request: float) -> float:
        """TPOT of a decode batch of `decode_batch_size` requests (the new one included) holding
        `decode_tokens_per_request` KV tokens each on average."""
        return self.tpot_table_ms(max(1, decode_batch_size), decode_tokens_per_request)
