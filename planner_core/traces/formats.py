"""Reading trace files into `RequestTrace`s: Azure LLM inference CSV, Mooncake JSONL and Dynamo
`dynamo.request.trace.v1` JSONL(.gz), one file (`load_trace`) or a set merged on one time origin (`load_traces`).

The only I/O of `planner_core.traces`; every value is checked against the bounds of `planner_core.traces.trace`
and a bad one is refused with one line naming the file, the line or field and the value.
"""

from __future__ import annotations

import glob
import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from planner_core.traces.trace import (
    _NS_PER_S,
    DYNAMO_TRACE_SCHEMA,
    MAX_EPOCH_MS,
    MAX_REQUEST_TOKENS,
    MAX_TRACE_SPAN_S,
    MOONCAKE_EPOCH_S,
    TRACE_SUFFIXES,
    RequestTrace,
    TraceError,
    TraceFormat,
    _build,
    _Hashes,
)


@dataclass(frozen=True, slots=True)
class _Requests:
    """One file's requests as read, on the format's own clock (unsorted)."""

    path: Path
    kind: TraceFormat
    clock: np.ndarray  # Azure: int64 ns since the Unix epoch; Mooncake: ms from the trace's zero; Dynamo: Unix ms
    isl: np.ndarray
    osl: np.ndarray
    hashes: _Hashes | None = None  # Mooncake `hash_ids`, when the file has them


def _assemble(source: str, parts: list[_Requests]) -> RequestTrace:
    """Merge files of one format on a global origin: the earliest request of all of them.

    Differences are taken on the raw clock (int64 ns or integral ms, both exact) before scaling to seconds.
    """
    clock = np.concatenate([part.clock for part in parts])
    isl = np.concatenate([part.isl for part in parts])
    osl = np.concatenate([part.osl for part in parts])
    if len(clock) == 0:
        raise TraceError(f"{source}: no requests")
    first = clock.min()
    kind = parts[0].kind
    _check_span(parts, first, _NS_PER_S if kind is TraceFormat.AZURE_CSV else 1000.0)
    if kind is TraceFormat.AZURE_CSV:
        return _build(source, int(first) / _NS_PER_S, (clock - first) / _NS_PER_S, isl, osl)
    first_s = float(first) / 1000.0
    if kind is TraceFormat.DYNAMO_V1:
        return _build(source, first_s, (clock - first) / 1000.0, isl, osl)
    hashes = _concat_hashes(parts)
    return _build(
        source, MOONCAKE_EPOCH_S + first_s, (clock - first) / 1000.0, isl, osl, clock_offset_s=first_s, hashes=hashes
    )


def _check_span(parts: list[_Requests], first: Any, ticks_per_s: float) -> None:
    """Refuse a trace whose requests spread over more than `MAX_TRACE_SPAN_S`, naming the file and the latest one."""
    for part in parts:
        last = part.clock.max()
        span_s = float(last - first) / ticks_per_s
        if span_s > MAX_TRACE_SPAN_S:
            row = int(part.clock.argmax())
            where = f"row {row + 2}" if part.kind is TraceFormat.AZURE_CSV else f"request {row + 1}"
            raise TraceError(
                f"{part.path}: {where} arrives {span_s:.3g} s after the first request; "
                f"a trace may span at most {MAX_TRACE_SPAN_S:g} s"
            )


def _concat_hashes(parts: list[_Requests]) -> _Hashes | None:
    """All files' prefix blocks in one CSR (a file without any counts as requests without prefix data)."""
    if all(part.hashes is None for part in parts):
        return None
    ids, lengths = [], []
    for part in parts:
        if part.hashes is None:
            lengths.append(np.zeros(len(part.clock), dtype=np.int64))
        else:
            ids.append(part.hashes[0])
            lengths.append(np.diff(part.hashes[1]))
    all_lengths = np.concatenate(lengths)
    offsets = np.zeros(len(all_lengths) + 1, dtype=np.int64)
    np.cumsum(all_lengths, out=offsets[1:])
    return (np.concatenate(ids).astype(np.int64) if ids else np.empty(0, dtype=np.int64)), offsets


def _trace_suffix(path: Path) -> str:
    """`.jsonl.gz` for gzipped JSONL, else the last suffix."""
    return ".jsonl.gz" if path.name.endswith(".jsonl.gz") else path.suffix


def _read_azure_csv(path: Path) -> _Requests:
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except Exception as exc:  # any parse failure becomes one clear line
        raise TraceError(f"{path}: cannot parse CSV: {' '.join(str(exc).split())}") from exc
    for column in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"):
        if column not in frame.columns:
            raise TraceError(f"{path}: missing column '{column}'")
    if frame.empty:
        raise TraceError(f"{path}: no requests")
    stamps = pd.to_datetime(frame["TIMESTAMP"], utc=True, errors="coerce", format="mixed")
    _reject_bad_rows(path, frame, "TIMESTAMP", stamps.isna().to_numpy(), "is no timestamp")
    lengths = {}
    for column in ("ContextTokens", "GeneratedTokens"):
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        _reject_bad_rows(path, frame, column, ~np.isfinite(values) | (values < 0), "is not a token count >= 0")
        _reject_bad_rows(path, frame, column, values > MAX_REQUEST_TOKENS, f"is over {MAX_REQUEST_TOKENS} tokens")
        lengths[column] = values
    # pandas picks the resolution from the text (whole seconds parse to microseconds): scale to ns explicitly, after
    # refusing the dates past MAX_EPOCH_MS whose nanoseconds would overflow int64
    ticks = stamps.astype("int64").to_numpy()
    ns_per_tick = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}[stamps.dt.unit]
    outside = np.abs(ticks) > MAX_EPOCH_MS * 1_000_000 / ns_per_tick
    _reject_bad_rows(path, frame, "TIMESTAMP", outside, "is after 2100-01-01 or before 1840")
    epoch_ns = ticks * ns_per_tick
    return _Requests(path, TraceFormat.AZURE_CSV, epoch_ns, lengths["ContextTokens"], lengths["GeneratedTokens"])


def _reject_bad_rows(path: Path, frame, column: str, bad: np.ndarray, problem: str) -> None:
    """Raise a one-line TraceError for the first bad row of a CSV column (row numbers count the header as 1)."""
    if bad.any():
        row = int(bad.argmax())
        value = frame[column].iloc[row]
        value = value.item() if isinstance(value, np.generic) else value  # 1e+308, not np.float64(1e+308)
        raise TraceError(f"{path}: row {row + 2} field '{column}' = {value!r} {problem}")


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _json_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines of a JSONL or JSONL.GZ file; read errors name the line."""
    line_no = 0
    try:
        with _open_text(path) as handle:
            for line_no, line in enumerate(handle, start=1):
                if line.strip():
                    yield line_no, line
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: line {line_no + 1}: cannot read: {' '.join(str(exc).split())}") from exc


def _event_of(record: Any) -> Any:
    """The event of a Dynamo record (records may be wrapped as {"event": {...}}), else the record itself."""
    return record.get("event", record) if isinstance(record, dict) else record


def _is_dynamo_record(record: Any) -> bool:
    event = _event_of(record)
    return isinstance(event, dict) and "schema" in event


def detect_format(path: str | Path) -> TraceFormat:
    """Format of a trace file: `.csv` is Azure; `.jsonl` / `.jsonl.gz` is sniffed from the first record.

    A first record carrying a `schema` field (at the top or under `event`) is Dynamo request-trace v1;
    anything else is read as Mooncake, whose parser then names the line and key at fault.

    Raises:
        TraceError: missing file or unknown suffix.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    suffix = _trace_suffix(path)
    if suffix == ".csv":
        return TraceFormat.AZURE_CSV
    if suffix not in (".jsonl", ".jsonl.gz"):
        raise TraceError(f"{path}: unknown trace format '{suffix}' (expected .csv, .jsonl or .jsonl.gz)")
    for _, line in _json_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return TraceFormat.MOONCAKE
        return TraceFormat.DYNAMO_V1 if _is_dynamo_record(record) else TraceFormat.MOONCAKE
    return TraceFormat.MOONCAKE


_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


def _hash_list(path: Path, line_no: int, value: Any) -> list[int]:
    """A record's `hash_ids`: a list of integers >= 0."""
    if not isinstance(value, list):
        raise TraceError(f"{path}: line {line_no} field 'hash_ids' = {value!r} is not a list of integers >= 0")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise TraceError(f"{path}: line {line_no} field 'hash_ids' holds {item!r}, not an integer >= 0")
    return value


def _read_mooncake_jsonl(path: Path) -> _Requests:
    rows: list[list[float]] = []
    hash_ids: list[int] = []
    hash_lengths: list[int] = []
    any_hashes = False
    for line_no, line in _json_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: line {line_no}: {type(exc).__name__}: {exc}") from exc
        if _is_dynamo_record(record):
            raise TraceError(
                f"{path}: line {line_no} field 'schema': a Dynamo record in a Mooncake trace (one format per file)"
            )
        if not isinstance(record, dict):
            raise TraceError(f"{path}: line {line_no}: {type(record).__name__} {record!r:.80}, not a JSON object")
        missing = [key for key in _MOONCAKE_KEYS if key not in record]
        if missing:
            raise TraceError(f"{path}: line {line_no} field '{missing[0]}' is missing")
        # JSON numbers only: float() took `true` as a 1-token request and "7" as 7 (issue 43)
        for key in _MOONCAKE_KEYS:
            if isinstance(record[key], bool) or not isinstance(record[key], int | float):
                shown = json.dumps(record[key])[:80]  # as the file has it: `true`, not Python's True
                raise TraceError(f"{path}: line {line_no} field '{key}' = {shown} is not a number >= 0")
        values = [float(record[key]) for key in _MOONCAKE_KEYS]
        for key, value in zip(_MOONCAKE_KEYS, values, strict=True):
            if not math.isfinite(value) or value < 0:
                raise TraceError(f"{path}: line {line_no} field '{key}' = {record[key]!r} is not a number >= 0")
            limit = MAX_TRACE_SPAN_S * 1000.0 if key == "timestamp" else MAX_REQUEST_TOKENS
            if value > limit:
                raise TraceError(f"{path}: line {line_no} field '{key}' = {record[key]!r} is over {limit:g}")
        rows.append(values)
        # A record without `hash_ids` has no prefix data: no block of it can be found in a cache.
        blocks = _hash_list(path, line_no, record["hash_ids"]) if "hash_ids" in record else []
        any_hashes = any_hashes or "hash_ids" in record
        hash_ids.extend(blocks)
        hash_lengths.append(len(blocks))
    if not rows:
        raise TraceError(f"{path}: no requests")
    table = np.asarray(rows, dtype=float)
    hashes = None
    if any_hashes:
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(np.asarray(hash_lengths, dtype=np.int64), out=offsets[1:])
        hashes = (np.asarray(hash_ids, dtype=np.int64), offsets)
    return _Requests(path, TraceFormat.MOONCAKE, table[:, 0], table[:, 1], table[:, 2], hashes)


def _dynamo_field(path: Path, line_no: int, parent: dict, dotted: str) -> Any:
    key = dotted.rsplit(".", 1)[-1]
    if key not in parent:
        raise TraceError(f"{path}: line {line_no} field '{dotted}' is missing")
    return parent[key]


def _dynamo_object(path: Path, line_no: int, parent: dict, dotted: str) -> dict:
    value = _dynamo_field(path, line_no, parent, dotted)
    if not isinstance(value, dict):
        raise TraceError(f"{path}: line {line_no} field '{dotted}' = {value!r} is not an object")
    return value


def _dynamo_number(path: Path, line_no: int, parent: dict, dotted: str, *, count: bool) -> float:
    """A JSON number (no bool); with `count`, an integer >= 0 (Dynamo's `_length` rule)."""
    value = _dynamo_field(path, line_no, parent, dotted)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{path}: line {line_no} field '{dotted}' = {value!r} is not a number")
    if count and (not isinstance(value, int) or value < 0):
        raise TraceError(f"{path}: line {line_no} field '{dotted}' = {value!r} is not an integer >= 0")
    limit = MAX_REQUEST_TOKENS if count else MAX_EPOCH_MS
    if abs(value) > limit:
        raise TraceError(f"{path}: line {line_no} field '{dotted}' = {value!r} is over {limit:g}")
    return float(value)


def _read_dynamo_jsonl(path: Path) -> _Requests:
    rows: list[tuple[float, float, float]] = []
    for line_no, line in _json_lines(path):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: line {line_no}: JSONDecodeError: {exc}") from exc
        event = _event_of(record)
        if not isinstance(event, dict):
            raise TraceError(f"{path}: line {line_no}: record is a {type(event).__name__}, not a JSON object")
        schema = event.get("schema")
        if schema != DYNAMO_TRACE_SCHEMA:
            raise TraceError(
                f"{path}: line {line_no} field 'schema' = {schema!r} is not '{DYNAMO_TRACE_SCHEMA}' "
                "(one format per file)"
            )
        if event.get("event_type") != "request_end":
            continue  # tool events and other non-request rows carry no request
        request = _dynamo_object(path, line_no, event, "request")
        replay = _dynamo_object(path, line_no, request, "request.replay")
        rows.append(
            (
                _dynamo_number(path, line_no, request, "request.request_received_ms", count=False),
                _dynamo_number(path, line_no, replay, "request.replay.input_length", count=True),
                _dynamo_number(path, line_no, request, "request.output_tokens", count=True),
            )
        )
    if not rows:
        raise TraceError(f"{path}: no requests (no '{DYNAMO_TRACE_SCHEMA}' request_end events)")
    table = np.asarray(rows, dtype=float)
    return _Requests(path, TraceFormat.DYNAMO_V1, table[:, 0], table[:, 1], table[:, 2])


_READERS = {
    TraceFormat.AZURE_CSV: _read_azure_csv,
    TraceFormat.MOONCAKE: _read_mooncake_jsonl,
    TraceFormat.DYNAMO_V1: _read_dynamo_jsonl,
}


def _read_file(path: Path) -> _Requests:
    return _READERS[detect_format(path)](path)


def load_trace(path: str | Path) -> RequestTrace:
    """Load one trace file: `.csv` Azure; `.jsonl` / `.jsonl.gz` Mooncake or Dynamo v1 (sniffed)."""
    path = Path(path)
    return _assemble(str(path), [_read_file(path)])


def resolve_trace_paths(spec: str | Path) -> list[Path]:
    """The files a trace spec names: a file; a folder (recursively, `.csv`/`.jsonl`/`.jsonl.gz`); or a glob.

    Sorted by path. Like Dynamo, refuses a set holding both `x.jsonl` and `x.jsonl.gz` (the same shard twice).

    Raises:
        TraceError: nothing matched, or a shard appears both compressed and uncompressed.
    """
    text = str(spec)
    path = Path(text)
    if path.is_dir():
        paths = sorted(p for p in path.rglob("*") if p.is_file() and _trace_suffix(p) in TRACE_SUFFIXES)
    elif path.exists():
        paths = [path]
    elif glob.has_magic(text):
        paths = sorted(Path(match) for match in glob.glob(text, recursive=True) if Path(match).is_file())
    else:
        raise TraceError(f"{text}: no such file or directory")
    if not paths:
        raise TraceError(f"{text}: no trace files matched (expected {', '.join(TRACE_SUFFIXES)})")
    by_shard: dict[str, Path] = {}
    for candidate in paths:
        shard = str(candidate).removesuffix(".gz") if candidate.name.endswith(".jsonl.gz") else str(candidate)
        if shard in by_shard:
            raise TraceError(f"{candidate}: the same shard also matched as {by_shard[shard]}; select one copy")
        by_shard[shard] = candidate
    return paths


def load_traces(spec: str | Path) -> RequestTrace:
    """Load a file, a glob or a folder of traces of one format as one trace on a global time origin.

    Timestamps of all files are pooled before the origin is taken, as Dynamo does for shards: Azure and Dynamo
    v1 clocks are absolute, so shards interleave in wall-clock time; Mooncake timestamps are relative to one
    trace zero shared by all shards. The source is the spec for several files, the file for one.

    Raises:
        TraceError: nothing matched, a file is bad (one line naming file, line and field), or the files mix
            formats.
    """
    paths = resolve_trace_paths(spec)
    parts = [_read_file(path) for path in paths]
    for part in parts[1:]:
        if part.kind is not parts[0].kind:
            raise TraceError(
                f"{part.path}: {part.kind.value} trace, but {parts[0].path} is {parts[0].kind.value}; "
                "a trace set must use one format"
            )
    source = str(paths[0]) if len(paths) == 1 else f"{spec} ({len(paths)} files)"
    return _assemble(source, parts)
