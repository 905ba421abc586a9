"""Profiling tables for SLO-aware routing, built from what the project already knows of an engine's speed.

- `tables_from_forward_model`: from a `ForwardPassModel` (the simulated engines run on one; so does the planner),
  the TTFT of a prompt on an idle prefill engine (its chunks of `max_num_batched_tokens`, one iteration each) and the
  TPOT of a decode batch (one decode iteration). The model is deterministic, so every statistic of a row is that
  one value.
- `tables_from_dynamo_profile`: from a Dynamo pre-deployment profile, the TTFT rows at the profiled prompt lengths
  (exact) and the TPOT grid read off the profile's decode interpolation (ITL by concurrency and context length).

The grids are the defaults below unless given; a grid point past the engine's limits is still computed (the model
answers), so a router's prediction at heavy load is extrapolated from measured-like values rather than clamped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.profile import EngineProfile
from planner_core.routing.profiling import TpotPoint, TpotProfile, TtftPoint, TtftProfile

DEFAULT_TTFT_TOKENS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DEFAULT_TOKENS_PER_REQUEST = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def _stats(value_ms: float) -> tuple[tuple[str, float], ...]:
    return (("mean", value_ms), ("p95", value_ms), ("p99", value_ms))


def _meta(metadata: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in metadata.items())


def tables_from_forward_model(
    fwd: ForwardPassModel,
    *,
    chunk_tokens: int,
    metadata: Mapping[str, str],
    ttft_tokens: Sequence[int] = DEFAULT_TTFT_TOKENS,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    tokens_per_request: Sequence[int] = DEFAULT_TOKENS_PER_REQUEST,
) -> tuple[TtftProfile, TpotProfile]:
    """The TTFT and TPOT tables of engines running on `fwd`, prefill chunked at `chunk_tokens`."""
    ttft = []
    for tokens in sorted(set(ttft_tokens)):
        full, rest = divmod(tokens, chunk_tokens)
        wall_s = full * fwd.prefill_wall_s(chunk_tokens) + (fwd.prefill_wall_s(rest) if rest else 0.0)
        ttft.append(TtftPoint(tokens_num=tokens, p50_ms=1000.0 * wall_s, stats_ms=_stats(1000.0 * wall_s)))
    tpot = []
    for batch in sorted(set(batch_sizes)):
        for tokens in sorted(set(tokens_per_request)):
            value_ms = 1000.0 * fwd.decode_wall_s(batch, batch * tokens)
            tpot.append(
                TpotPoint(batch_size=batch, tokens_per_request=tokens, p50_ms=value_ms, stats_ms=_stats(value_ms))
            )
    meta = _meta(metadata)
    return TtftProfile(points=tuple(ttft), metadata=meta), TpotProfile(points=tuple(tpot), metadata=meta)


def tables_from_dynamo_profile(
    profile: EngineProfile,
    *,
    metadata: Mapping[str, str],
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    tokens_per_request: Sequence[int] = DEFAULT_TOKENS_PER_REQUEST,
) -> tuple[TtftProfile, TpotProfile]:
    """The TTFT rows at the profile's prompt lengths (batch 1, as profiled) and the TPOT grid from its decode
    interpolation (which clamps to the profiled KV range)."""
    ttft = sorted(
        (
            TtftPoint(tokens_num=int(round(isl)), p50_ms=float(ms))
            for isl, ms in zip(profile.prefill.isl, profile.prefill.ttft_ms, strict=True)
        ),
        key=lambda p: p.tokens_num,
    )
    decode = profile.decode_interpolator
    tpot = [
        TpotPoint(batch_size=batch, tokens_per_request=tokens, p50_ms=float(decode.itl_ms(batch, tokens)))
        for batch in sorted(set(batch_sizes))
        for tokens in sorted(set(tokens_per_request))
    ]
    meta = _meta(metadata)
    return TtftProfile(points=tuple(ttft), metadata=meta), TpotProfile(points=tuple(tpot), metadata=meta)
