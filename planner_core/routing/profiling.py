"""The profiling data formats of SLO-aware routing: TTFT by prompt tokens and TPOT by decode batch.

TTFT file: `{"metadata": {...}, "results": [{"tokens_num": 128, "mean": .., "p50": 42.0, "p95": .., "p99": ..}]}`
(ms, one row per profiled prompt length). TPOT file: `{"metadata": {...}, "results": [{"batch_size": 16,
"tokens_per_request": 8, "mean": .., "p50": 11.8, "p95": ..}]}` (ms per output token, one row per point of a full
batch-size x tokens-per-request grid; `tokens_per_request` is the KV context each running request holds). Only
`p50` is used by the predictor; the other statistics are kept when present so a file round-trips.

Parsing is pure (mappings in, frozen values out); a bad file raises `ProfilingDataError` with one line naming the
source, the field and the value. Reading and writing files is the caller's job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OPTIONAL_STATS = ("mean", "p95", "p99")


class ProfilingDataError(ValueError):
    """A profiling file that cannot be used; the message names the source, the field and the value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TtftPoint:
    """TTFT (ms) of a prompt of `tokens_num` tokens on an idle engine."""

    tokens_num: int
    p50_ms: float
    stats_ms: tuple[tuple[str, float], ...] = ()  # the other statistics of the row (mean, p95, p99), if given


@dataclass(frozen=True, slots=True, kw_only=True)
class TpotPoint:
    """TPOT (ms per output token) of a decode batch of `batch_size` requests of `tokens_per_request` KV tokens."""

    batch_size: int
    tokens_per_request: int
    p50_ms: float
    stats_ms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TtftProfile:
    """The TTFT table, sorted by `tokens_num` (at least two distinct points)."""

    points: tuple[TtftPoint, ...]
    metadata: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class TpotProfile:
    """The TPOT table: a full grid (every batch size with every tokens-per-request value), sorted."""

    points: tuple[TpotPoint, ...]
    metadata: tuple[tuple[str, str], ...] = field(default=())


def _number(source: str, where: str, name: str, value: Any, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProfilingDataError(f"{source}: {where}.{name} = {value!r}: expected a finite number >= 0")
    if integer and (value != int(value) or value < 1):
        raise ProfilingDataError(f"{source}: {where}.{name} = {value!r}: expected an integer >= 1")
    return float(value)


def _rows(source: str, data: Any) -> list[Mapping[str, Any]]:
    if not isinstance(data, Mapping):
        raise ProfilingDataError(f"{source}: expected a JSON object with 'results', got {type(data).__name__}")
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise ProfilingDataError(f"{source}: results = {rows!r}: expected a non-empty list")
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ProfilingDataError(f"{source}: results[{index}] = {row!r}: expected an object")
    return rows


def _metadata(data: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    metadata = data.get("metadata") or {}
    return tuple((str(k), str(v)) for k, v in metadata.items()) if isinstance(metadata, Mapping) else ()


def _stats(source: str, where: str, row: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    return tuple(
        (name, _number(source, where, name, row[name], integer=False)) for name in OPTIONAL_STATS if name in row
    )


def _required(source: str, where: str, row: Mapping[str, Any], name: str) -> Any:
    if name not in row:
        raise ProfilingDataError(f"{source}: {where}.{name} is missing")
    return row[name]


def parse_ttft_profile(data: Any, *, source: str = "<memory>") -> TtftProfile:
    """The TTFT table of a parsed TTFT JSON file. Raises ProfilingDataError (one line) on a bad row."""
    points = []
    seen: set[int] = set()
    for index, row in enumerate(_rows(source, data)):
        where = f"results[{index}]"
        tokens = int(_number(source, where, "tokens_num", _required(source, where, row, "tokens_num"), integer=True))
        if tokens in seen:
            raise ProfilingDataError(f"{source}: {where}.tokens_num = {tokens}: duplicate point")
        seen.add(tokens)
        p50 = _number(source, where, "p50", _required(source, where, row, "p50"), integer=False)
        points.append(TtftPoint(tokens_num=tokens, p50_ms=p50, stats_ms=_stats(source, where, row)))
    if len(points) < 2:
        raise ProfilingDataError(f"{source}: results has {len(points)} point: at least 2 tokens_num values needed")
    points.sort(key=lambda p: p.tokens_num)
    return TtftProfile(points=tuple(points), metadata=_metadata(data))


def parse_tpot_profile(data: Any, *, source: str = "<memory>") -> TpotProfile:
    """The TPOT table of a parsed TPOT JSON file; the points must form a full grid with at least two values per
    axis (bilinear interpolation needs a bounding box). Raises ProfilingDataError (one line) otherwise."""
    points = []
    seen: set[tuple[int, int]] = set()
    for index, row in enumerate(_rows(source, data)):
        where = f"results[{index}]"
        batch = int(_number(source, where, "batch_size", _required(source, where, row, "batch_size"), integer=True))
        tokens = int(
            _number(
                source, where, "tokens_per_request", _required(source, where, row, "tokens_per_request"), integer=True
            )
        )
        if (batch, tokens) in seen:
            raise ProfilingDataError(f"{source}: {where}: duplicate point batch_size={batch} tokens={tokens}")
        seen.add((batch, tokens))
        p50 = _number(source, where, "p50", _required(source, where, row, "p50"), integer=False)
        points.append(
            TpotPoint(batch_size=batch, tokens_per_request=tokens, p50_ms=p50, stats_ms=_stats(source, where, row))
        )
    batches = sorted({p.batch_size for p in points})
    tokens_axis = sorted({p.tokens_per_request for p in points})
    if len(batches) < 2 or len(tokens_axis) < 2:
        raise ProfilingDataError(
            f"{source}: results spans batch_size {batches} x tokens_per_request {tokens_axis}: at least 2 values "
            "per axis needed"
        )
    missing = [(b, t) for b in batches for t in tokens_axis if (b, t) not in seen]
    if missing:
        b, t = missing[0]
        raise ProfilingDataError(
            f"{source}: results has no point batch_size={b} tokens_per_request={t}: the points must form a full "
            f"grid ({len(missing)} missing)"
        )
    points.sort(key=lambda p: (p.batch_size, p.tokens_per_request))
    return TpotProfile(points=tuple(points), metadata=_metadata(data))


def _row(p50_ms: float, stats_ms: Sequence[tuple[str, float]]) -> dict[str, float]:
    stats = dict(stats_ms)
    row = {"mean": stats["mean"]} if "mean" in stats else {}
    row["p50"] = p50_ms
    row.update({name: stats[name] for name in ("p95", "p99") if name in stats})
    return row


def ttft_profile_to_json(profile: TtftProfile) -> dict[str, Any]:
    """The TTFT file's content (the inverse of `parse_ttft_profile`)."""
    return {
        "metadata": dict(profile.metadata),
        "results": [{"tokens_num": p.tokens_num, **_row(p.p50_ms, p.stats_ms)} for p in profile.points],
    }


def tpot_profile_to_json(profile: TpotProfile) -> dict[str, Any]:
    """The TPOT file's content (the inverse of `parse_tpot_profile`)."""
    return {
        "metadata": dict(profile.metadata),
        "results": [
            {"batch_size": p.batch_size, "tokens_per_request": p.tokens_per_request, **_row(p.p50_ms, p.stats_ms)}
            for p in profile.points
        ],
    }
