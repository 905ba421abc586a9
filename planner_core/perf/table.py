"""Perf tables: forward-pass wall times precomputed offline (with aiconfigurator) and read as a `ForwardPassModel`.

Role in the planner: the middle link of the perf-model bootstrap chain (profiling files -> precomputed tables ->
live forward-pass metrics). `planner perf-table` asks aiconfigurator once per grid point for a model, GPU system,
backend and TP the user names, and writes one small JSON file; the planner only ever reads that file, so
aiconfigurator is never needed (or called) at tick time.

File format (`format: "planner-perf-table/v1"`, times in milliseconds as aiconfigurator reports them):

```
{"format": "planner-perf-table/v1",
 "header": {"model", "system", "backend", "backend_version", "tp", "precision": {"gemm", "kvcache", ...},
            "aiconfigurator_version", optional "aic_model", "database_mode", "generated_at", "command"},
 "grid": {"isl": [...], "prefill_batch": [1, ...], "decode_batch": [...], "decode_ctx": [...]},
 "prefill_ms": [[one per isl] one row per prefill_batch],      # one prefill iteration of batch x isl tokens
 "decode_ms": [[one per decode_ctx] one row per decode_batch], # one decode step, each sequence holding ctx tokens
 "decode_fits_memory": [[bool, same shape as decode_ms]]}       # aiconfigurator's memory check (information)
```

`TablePerfModel` answers the `ForwardPassModel` questions by interpolation, piecewise linear in log-log space
(log time over log ISL; bilinear in log batch and log context for decode): grid points are reproduced exactly,
a power law between two grid points is reproduced exactly and values stay positive. The model first lifts each
time to the running maximum along its axes (more prompt tokens, more sequences or more context never take less
time), so the interpolant never decreases when a query grows and a capacity search over it is well defined;
aiconfigurator's measured kernels have small dips (on the committed H200 table 11 of 108 decode points, by at
most 2.5 %, all at batch <= 64 and context <= 4096), which this removes. The file keeps aiconfigurator's values
as they were. Queries outside the grid are clamped to its edge
(so a table must cover the range it is used for: ISL up to the engines' batched-token budget, decode batch up to
the largest concurrency). Prefill uses the batch-1 row: a prefill chunk is costed as one prompt of that many
tokens, as Dynamo's profiles measure it (an upper bound for a chunk made of several shorter prompts, whose
attention is cheaper). Decode takes the mean context per sequence, `decode_kv_tokens / num_decode_requests`.
A mixed (aggregated) iteration is approximated from the two phases, see `TablePerfModel.mixed_wall_s`.

Pure: the only I/O is `load_perf_table`; no clock, no global state.
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PERF_TABLE_FORMAT",
    "PerfTable",
    "PerfTableError",
    "PerfTableHeader",
    "TablePerfModel",
    "load_perf_table",
    "monotone_envelope",
    "parse_perf_table",
]

PERF_TABLE_FORMAT = "planner-perf-table/v1"


class PerfTableError(ValueError):
    """A perf table is unreadable or malformed: `str(error)` is one line `<file>: field '<field>' = <value>: ...`."""

    def __init__(self, source: str, field_name: str | None, problem: str, *, value: Any = ...) -> None:
        self.source = source
        self.field_name = field_name
        shown = "" if value is ... else f" = {_short_repr(value)}"
        where = f"field '{field_name}'{shown}: " if field_name is not None else ""
        super().__init__(" ".join(f"{source}: {where}{problem}".split()))


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True, slots=True, kw_only=True)
class PerfTableHeader:
    """What a table describes and how it was made.

    Attributes:
        model: the model as the user named it (Hugging Face id), e.g. `nvidia/Llama-3.1-8B-Instruct-FP8`.
        system: aiconfigurator's GPU system name, e.g. `h200_sxm`.
        backend: serving engine (`vllm`, `sglang`, `trtllm`).
        backend_version: the aiconfigurator database version the times come from (not the engine you run).
        tp: tensor-parallel size of one engine.
        precision: quantisation modes aiconfigurator used as sorted `(part, mode)` pairs, e.g.
            `(("fmha", "bfloat16"), ("gemm", "fp8"), ("kvcache", "bfloat16"))`; `dict(header.precision)` for a dict.
        aiconfigurator_version: the aiconfigurator release that estimated the times.
        aic_model: the model aiconfigurator was asked about when it differs from `model` (an architecturally
            identical checkpoint it knows offline), else None.
        database_mode: aiconfigurator's database mode (`SILICON`: measured kernels only).
        generated_at: ISO-8601 UTC time of generation (information only).
        command: the command line that generated the table (information only).
    """

    model: str
    system: str
    backend: str
    backend_version: str
    tp: int
    precision: tuple[tuple[str, str], ...]
    aiconfigurator_version: str
    aic_model: str | None = None
    database_mode: str = "SILICON"
    generated_at: str | None = None
    command: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "system": self.system,
            "backend": self.backend,
            "backend_version": self.backend_version,
            "tp": self.tp,
            "precision": dict(self.precision),
            "aiconfigurator_version": self.aiconfigurator_version,
            "database_mode": self.database_mode,
        }
        for name in ("aic_model", "generated_at", "command"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class PerfTable:
    """Validated forward-pass wall times (ms) on a rectangular grid; build with `parse_perf_table`.

    Attributes:
        header: what the table describes.
        isl: prompt lengths (tokens), strictly increasing.
        prefill_batch: prefill batch sizes, strictly increasing, starting at 1.
        decode_batch: decode batch sizes (sequences), strictly increasing.
        decode_ctx: per-sequence context lengths (KV tokens), strictly increasing.
        prefill_ms: `prefill_ms[i][j]` = one prefill iteration of `prefill_batch[i]` prompts of `isl[j]` tokens.
        decode_ms: `decode_ms[i][j]` = one decode step of `decode_batch[i]` sequences of `decode_ctx[j]` tokens.
        decode_fits_memory: whether aiconfigurator found that decode point fits in GPU memory.
    """

    header: PerfTableHeader
    isl: tuple[float, ...]
    prefill_batch: tuple[float, ...]
    decode_batch: tuple[float, ...]
    decode_ctx: tuple[float, ...]
    prefill_ms: tuple[tuple[float, ...], ...]
    decode_ms: tuple[tuple[float, ...], ...]
    decode_fits_memory: tuple[tuple[bool, ...], ...]

    @property
    def num_points(self) -> int:
        return len(self.isl) * len(self.prefill_batch) + len(self.decode_batch) * len(self.decode_ctx)

    def to_json_dict(self) -> dict[str, Any]:
        """The file body (`parse_perf_table(table.to_json_dict(), ...) == table`)."""
        return {
            "format": PERF_TABLE_FORMAT,
            "header": self.header.to_json_dict(),
            "grid": {
                "isl": [_json_number(value) for value in self.isl],
                "prefill_batch": [_json_number(value) for value in self.prefill_batch],
                "decode_batch": [_json_number(value) for value in self.decode_batch],
                "decode_ctx": [_json_number(value) for value in self.decode_ctx],
            },
            "prefill_ms": [list(row) for row in self.prefill_ms],
            "decode_ms": [list(row) for row in self.decode_ms],
            "decode_fits_memory": [list(row) for row in self.decode_fits_memory],
        }


def _json_number(value: float) -> int | float:
    """Whole grid values are written as integers (`1024`, not `1024.0`)."""
    return int(value) if value == int(value) else value


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


def _require(source: str, data: Mapping[str, Any], key: str, prefix: str = "") -> Any:
    if key not in data:
        raise PerfTableError(source, f"{prefix}{key}", "missing")
    return data[key]


def _text(source: str, name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise PerfTableError(source, name, "must be a non-empty string", value=value)
    return value


def _positive_number(source: str, name: str, value: Any) -> float:
    # bool is an int subclass; `true` is never a valid time or size
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise PerfTableError(source, name, "must be a finite number > 0", value=value)
    return float(value)


def _axis(source: str, name: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise PerfTableError(source, name, "must be a non-empty list of numbers", value=value)
    axis = tuple(_positive_number(source, f"{name}[{index}]", item) for index, item in enumerate(value))
    for index in range(1, len(axis)):
        if axis[index] <= axis[index - 1]:
            raise PerfTableError(
                source, f"{name}[{index}]", "grid values must be strictly increasing", value=value[index]
            )
    return axis


def _matrix(
    source: str, name: str, value: Any, *, rows: tuple[str, int], columns: tuple[str, int], cell: Any
) -> tuple[tuple[Any, ...], ...]:
    row_axis, num_rows = rows
    column_axis, num_columns = columns
    if not isinstance(value, list) or len(value) != num_rows:
        length = len(value) if isinstance(value, list) else type(value).__name__
        raise PerfTableError(source, name, f"must be a list of {num_rows} rows (one per {row_axis}), got {length}")
    out = []
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != num_columns:
            length = len(row) if isinstance(row, list) else type(row).__name__
            raise PerfTableError(
                source, f"{name}[{i}]", f"must be a list of {num_columns} values (one per {column_axis}), got {length}"
            )
        out.append(tuple(cell(source, f"{name}[{i}][{j}]", item) for j, item in enumerate(row)))
    return tuple(out)


def _flag(source: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PerfTableError(source, name, "must be true or false", value=value)
    return value


def _header(source: str, data: Any) -> PerfTableHeader:
    if not isinstance(data, dict):
        raise PerfTableError(source, "header", "must be an object", value=data)
    tp = _require(source, data, "tp", "header.")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise PerfTableError(source, "header.tp", "must be a whole number >= 1", value=tp)
    precision = _require(source, data, "precision", "header.")
    if not isinstance(precision, dict) or not all(
        isinstance(key, str) and isinstance(mode, str) for key, mode in precision.items()
    ):
        raise PerfTableError(source, "header.precision", "must be an object of strings", value=precision)
    text = {
        name: _text(source, f"header.{name}", _require(source, data, name, "header."))
        for name in ("model", "system", "backend", "backend_version", "aiconfigurator_version")
    }
    optional = {
        name: _text(source, f"header.{name}", data.get(name), optional=True)
        for name in ("aic_model", "generated_at", "command")
    }
    return PerfTableHeader(
        tp=tp,
        precision=tuple(sorted(precision.items())),
        database_mode=_text(source, "header.database_mode", data.get("database_mode", "SILICON")) or "SILICON",
        **text,
        **optional,
    )


def parse_perf_table(data: Any, source: str = "<memory>") -> PerfTable:
    """Validate a decoded table body and build the `PerfTable`.

    Raises:
        PerfTableError: one line naming `source`, the field (e.g. `decode_ms[3][2]`) and the bad value.
    """
    if not isinstance(data, dict):
        raise PerfTableError(source, None, f"expected a JSON object, got {type(data).__name__}")
    fmt = _require(source, data, "format")
    if fmt != PERF_TABLE_FORMAT:
        raise PerfTableError(source, "format", f"must be {PERF_TABLE_FORMAT!r}", value=fmt)
    header = _header(source, _require(source, data, "header"))
    grid = _require(source, data, "grid")
    if not isinstance(grid, dict):
        raise PerfTableError(source, "grid", "must be an object", value=grid)
    axes = {name: _axis(source, f"grid.{name}", _require(source, grid, name, "grid.")) for name in _AXES}
    if axes["prefill_batch"][0] != 1:
        raise PerfTableError(
            source, "grid.prefill_batch[0]", "must be 1 (the prefill curve is batch 1)", value=grid["prefill_batch"][0]
        )
    prefill_shape = {"rows": ("prefill_batch", len(axes["prefill_batch"])), "columns": ("isl", len(axes["isl"]))}
    decode_shape = {
        "rows": ("decode_batch", len(axes["decode_batch"])),
        "columns": ("decode_ctx", len(axes["decode_ctx"])),
    }
    return PerfTable(
        header=header,
        prefill_ms=_matrix(
            source, "prefill_ms", _require(source, data, "prefill_ms"), cell=_positive_number, **prefill_shape
        ),
        decode_ms=_matrix(
            source, "decode_ms", _require(source, data, "decode_ms"), cell=_positive_number, **decode_shape
        ),
        decode_fits_memory=_matrix(
            source, "decode_fits_memory", _require(source, data, "decode_fits_memory"), cell=_flag, **decode_shape
        ),
        **axes,
    )


_AXES = ("isl", "prefill_batch", "decode_batch", "decode_ctx")


def load_perf_table(path: str | os.PathLike[str]) -> PerfTable:
    """Read and validate a perf table file (the module's only I/O).

    Raises:
        PerfTableError: missing or unreadable file, invalid JSON, or a malformed field (one line).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PerfTableError(source, None, f"unreadable ({problem})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PerfTableError(source, None, f"invalid JSON ({exc})") from exc
    return parse_perf_table(data, source)


# ---------------------------------------------------------------------------------------------------------
# Interpolation
# ---------------------------------------------------------------------------------------------------------


def _segment(axis: Sequence[float], value: float) -> tuple[int, float]:
    """Lower index and weight of `value` (already in log space) on a sorted axis, clamped to its ends."""
    if len(axis) == 1 or value <= axis[0]:
        return 0, 0.0
    if value >= axis[-1]:
        return len(axis) - 2, 1.0
    index = bisect_right(axis, value) - 1
    return index, (value - axis[index]) / (axis[index + 1] - axis[index])


def _interp_1d(axis: Sequence[float], values: Sequence[float], value: float) -> float:
    if len(axis) == 1:
        return values[0]
    index, weight = _segment(axis, value)
    return values[index] + weight * (values[index + 1] - values[index])


def _interp_2d(
    rows: Sequence[float], columns: Sequence[float], values: Sequence[Sequence[float]], row: float, column: float
) -> float:
    if len(rows) == 1:
        return _interp_1d(columns, values[0], column)
    index, weight = _segment(rows, row)
    low = _interp_1d(columns, values[index], column)
    high = _interp_1d(columns, values[index + 1], column)
    return low + weight * (high - low)


def _log_axis(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(math.log(value) for value in values)


def _running_max(values: Sequence[float]) -> tuple[float, ...]:
    out: list[float] = []
    for value in values:
        out.append(max(value, out[-1]) if out else value)
    return tuple(out)


def monotone_envelope(values: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """Each value lifted to the largest value at or below it along both axes (rows, then columns).

    Lifting along rows keeps the columns non-decreasing: the smallest monotone grid above the data.
    """
    rows = [list(row) for row in values]
    for i in range(1, len(rows)):
        rows[i] = [max(value, above) for value, above in zip(rows[i], rows[i - 1], strict=True)]
    return tuple(_running_max(row) for row in rows)


def _log_matrix(values: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(_log_axis(row) for row in values)


def _checked(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} = {value!r}: must be a finite number >= 0")
    return value


@dataclass(frozen=True, slots=True)
class TablePerfModel:
    """`ForwardPassModel` over a `PerfTable`: log-log piecewise-linear interpolation of the table's monotone
    envelope (`monotone_envelope`), clamped to the grid.

    Always ready (the table is complete by construction). Queries are pure; the log-space grids are computed
    once at construction.
    """

    table: PerfTable
    _log_isl: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _log_prefill_ms: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _log_batch: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _log_ctx: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _log_decode_ms: tuple[tuple[float, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        table = self.table
        object.__setattr__(self, "_log_isl", _log_axis(table.isl))
        object.__setattr__(self, "_log_prefill_ms", _log_axis(_running_max(table.prefill_ms[0])))  # batch-1 row
        object.__setattr__(self, "_log_batch", _log_axis(table.decode_batch))
        object.__setattr__(self, "_log_ctx", _log_axis(table.decode_ctx))
        object.__setattr__(self, "_log_decode_ms", _log_matrix(monotone_envelope(table.decode_ms)))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TablePerfModel:
        return cls(load_perf_table(path))

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        """One prefill iteration of `prefill_tokens` tokens, costed as one prompt of that length (batch-1 curve).

        0 tokens is no iteration (0 s); below the smallest grid ISL the smallest ISL's time is returned.
        """
        if _checked("prefill_tokens", prefill_tokens) == 0:
            return 0.0
        log_ms = _interp_1d(self._log_isl, self._log_prefill_ms, math.log(prefill_tokens))
        return math.exp(log_ms) / 1000.0

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        """One decode step of `num_decode_requests` sequences holding `decode_kv_tokens` KV tokens in total.

        Interpolated at batch = `num_decode_requests`, context = `decode_kv_tokens / num_decode_requests`
        (a context below the smallest grid context, 0 included, is clamped to it). 0 requests is no step (0 s).
        """
        if _checked("num_decode_requests", num_decode_requests) == 0:
            return 0.0
        context = max(_checked("decode_kv_tokens", decode_kv_tokens) / num_decode_requests, self.table.decode_ctx[0])
        log_ms = _interp_2d(
            self._log_batch, self._log_ctx, self._log_decode_ms, math.log(num_decode_requests), math.log(context)
        )
        return math.exp(log_ms) / 1000.0

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        """One aggregated iteration: a prefill chunk piggybacked on a decode batch (approximation).

        The table has no mixed points, so the iteration is built from its parts: the decode tokens ride through
        the same weight reads as the chunk, costed as `prefill_wall_s(prefill_tokens + num_decode_requests)`,
        plus the decode batch's attention over its KV cache, taken as the decode step's growth over the same
        batch at the smallest grid context (`decode_wall_s(n, kv) - decode_wall_s(n, 0)`, never negative).
        With no prefill tokens it is exactly `decode_wall_s`; with no decode requests exactly `prefill_wall_s`.
        """
        _checked("prefill_tokens", prefill_tokens)
        _checked("num_decode_requests", num_decode_requests)
        _checked("decode_kv_tokens", decode_kv_tokens)
        if prefill_tokens == 0:
            return self.decode_wall_s(num_decode_requests, decode_kv_tokens)
        if num_decode_requests == 0:
            return self.prefill_wall_s(prefill_tokens)
        attention_s = self.decode_wall_s(num_decode_requests, decode_kv_tokens) - self.decode_wall_s(
            num_decode_requests, 0.0
        )
        return self.prefill_wall_s(prefill_tokens + num_decode_requests) + max(attention_s, 0.0)
