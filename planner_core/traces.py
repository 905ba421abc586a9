"""Request traces: load Azure CSV, Mooncake JSONL and Dynamo request-trace-v1 JSONL files into arrays, and
summarise time windows of them.

A `RequestTrace` is a value: arrival offsets (s, from the first request), input and output lengths, the
wall-clock time of the first request, and where the trace's own clock starts (for Dynamo's window origin).
Loading is I/O; everything else here is pure.

Formats (chosen by suffix; a `.jsonl` / `.jsonl.gz` file is sniffed from its first record):
- Azure LLM inference CSV: `TIMESTAMP` (wall clock, UTC), `ContextTokens`, `GeneratedTokens`.
- Mooncake JSONL: `timestamp` (ms, relative to the trace's zero), `input_length`, `output_length`, and optionally
  `hash_ids` (ids of the prompt's 512-token prefix blocks: equal ids mean equal content, for prefix caching).
- Dynamo `dynamo.request.trace.v1` JSONL: only `request_end` events count; arrival
  `request.request_received_ms` (Unix ms), lengths `request.replay.input_length` and `request.output_tokens`.
  A record may be wrapped as `{"event": {...}}`. Other event types (e.g. `tool_end`) are skipped.

`load_traces(spec)` takes a file, a glob or a folder (searched recursively for `.csv`, `.jsonl`, `.jsonl.gz`)
and merges the files on one global time origin, as Dynamo does for warm-up shards.

Making load from a base trace (all pure): `RequestTrace.scaled` (more requests per second, same duration),
`RequestTrace.compressed` (the same requests in less time), and `shape_trace` (the base trace's requests and
burstiness under a rate shape, e.g. ServeGen's daily cycle from `load_servegen_shape`, for multi-hour and
multi-day load).
"""

from __future__ import annotations

import enum
import glob
import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from planner_core.arrivals import LOOKBACK_S, RequestArrivals
from planner_core.domain import TrafficObservation

# Mooncake timestamps are relative; anchor them at a fixed, recognisable instant so runs are reproducible.
MOONCAKE_EPOCH_S = 1_704_067_200.0  # 2024-01-01T00:00:00Z
DYNAMO_TRACE_SCHEMA = "dynamo.request.trace.v1"
TRACE_SUFFIXES = (".csv", ".jsonl", ".jsonl.gz")
_NS_PER_S = 1_000_000_000

# Bounds on what a trace may hold. Past them a value is a corrupt or hostile file, never traffic: a request of 1e308
# tokens or a timestamp of 1e308 ms was accepted and made every window empty or every size overflow.
MAX_REQUEST_TOKENS = 10_000_000
"""Most input or output tokens of one request (10 M: beyond any model's context)."""
MAX_TRACE_SPAN_S = 366 * 86_400.0
"""Longest time from a trace's first request to its last (a year): a replay or demo runs one tick per window."""
MAX_EPOCH_MS = 4_102_444_800_000.0
"""Latest absolute (Unix ms) timestamp accepted: 2100-01-01T00:00:00Z."""


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line or field and the value."""


class TraceFormat(enum.StrEnum):
    """On-disk format of a request trace."""

    AZURE_CSV = "azure_csv"  # Azure LLM inference trace: wall-clock TIMESTAMP, ContextTokens, GeneratedTokens
    MOONCAKE = "mooncake"  # JSONL, `timestamp` in ms relative to the trace's own zero
    DYNAMO_V1 = "dynamo_v1"  # JSONL(.gz) of `dynamo.request.trace.v1` events, Unix ms


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTrace:
    """Requests sorted by arrival. Arrays are read-only and of equal length.

    `clock_offset_s` is the time from the zero of the trace's own clock to the first request. Dynamo counts
    warm-up windows from that zero: for Mooncake (relative timestamps) it is the first `timestamp`, for
    wall-clock formats (Azure, Dynamo v1) the zero is the first request itself, so 0.
    """

    source: str
    start_epoch_s: float
    arrival_s: np.ndarray  # offset from the first request (s)
    isl: np.ndarray  # input tokens
    osl: np.ndarray  # output tokens
    clock_offset_s: float = 0.0
    # Prefix blocks, when the trace has them (Mooncake `hash_ids`): request i's block ids are
    # `hash_ids[hash_offsets[i]:hash_offsets[i + 1]]`, each id standing for `block_tokens` prompt tokens.
    hash_ids: np.ndarray | None = None  # int64, all requests' ids one after the other
    hash_offsets: np.ndarray | None = None  # int64, num_requests + 1
    block_tokens: int = 512

    @property
    def has_hashes(self) -> bool:
        return self.hash_ids is not None and self.hash_offsets is not None

    def request_hashes(self, index: int) -> np.ndarray:
        """Prefix block ids of request `index` (empty when the trace has none)."""
        if self.hash_ids is None or self.hash_offsets is None:
            return np.empty(0, dtype=np.int64)
        return self.hash_ids[self.hash_offsets[index] : self.hash_offsets[index + 1]]

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)

    def scaled(self, rate_factor: float) -> RequestTrace:
        """The same traffic shape at `rate_factor` times the request rate (duration unchanged).

        Each request is repeated `floor(rate_factor)` times, plus once more for a low-discrepancy (golden-ratio)
        selection of a `rate_factor % 1` fraction of requests; copy `j` arrives `j / copies` of the mean
        inter-arrival time after the original, so copies interleave instead of stacking on one instant.
        """
        if not rate_factor > 0:
            raise ValueError(f"{self.source}: rate factor must be > 0, got {rate_factor!r}")
        if rate_factor == 1:
            return self
        num_copies = int(np.ceil(rate_factor))
        whole, fraction = int(np.floor(rate_factor)), rate_factor - np.floor(rate_factor)
        gap_s = self.duration_s / max(1, self.num_requests - 1)
        # The partial copy takes exactly round(n * fraction) requests: those with the smallest golden-ratio
        # key, which spreads them evenly over the trace; the last request is always kept so the scaled trace
        # still spans the whole duration.
        keys = (np.arange(self.num_requests) * 0.6180339887498949) % 1.0
        keys[-1] = -1.0
        keep_fraction = np.zeros(self.num_requests, dtype=bool)
        keep_fraction[np.argsort(keys, kind="stable")[: int(round(self.num_requests * fraction))]] = True
        parts = []
        index = np.arange(self.num_requests)
        for copy in range(num_copies):
            keep = np.ones(self.num_requests, dtype=bool) if copy < whole else keep_fraction
            parts.append((self.arrival_s[keep] + copy * gap_s / num_copies, index[keep]))
        arrival = np.concatenate([part[0] for part in parts])
        taken = np.concatenate([part[1] for part in parts])
        hashes = None
        if self.has_hashes:
            # A copy is another user with the same request shape: its prefix blocks are its own (ids shifted per
            # copy), so repeating a request does not turn into prefix-cache hits the base trace never had.
            id_span = int(self.hash_ids.max()) + 1 if len(self.hash_ids) else 1  # type: ignore[union-attr]
            shift = np.concatenate([np.full(len(part[1]), copy, dtype=np.int64) for copy, part in enumerate(parts)])
            hashes = _take_hashes(self, taken, shift * id_span)
        return _build(
            f"{self.source} x{rate_factor:g}",
            self.start_epoch_s,
            arrival,
            self.isl[taken],
            self.osl[taken],
            clock_offset_s=self.clock_offset_s,
            hashes=hashes,
            block_tokens=self.block_tokens,
        )

    def head(self, end_s: float) -> RequestTrace:
        """The requests arriving before `end_s` (offset from the first request), e.g. the windows a demo ran."""
        stop = int(np.searchsorted(self.arrival_s, end_s, side="left"))
        if stop >= self.num_requests:
            return self
        if stop == 0:
            raise ValueError(f"{self.source}: no request arrives before {end_s:g} s")
        taken = np.arange(stop)
        return _build(
            self.source,
            self.start_epoch_s,
            self.arrival_s[taken],
            self.isl[taken],
            self.osl[taken],
            clock_offset_s=self.clock_offset_s,
            hashes=_take_hashes(self, taken) if self.has_hashes else None,
            block_tokens=self.block_tokens,
        )

    def compressed(self, factor: float) -> RequestTrace:
        """The same requests in `1 / factor` of the time: every arrival offset divided by `factor` (> 1 speeds
        the trace up, < 1 slows it down). The request rate grows by `factor`; lengths and prefixes are unchanged.
        """
        if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"{self.source}: compression factor must be a finite number > 0, got {factor!r}")
        if factor == 1:
            return self
        return RequestTrace(
            source=f"{self.source} /{factor:g}",
            start_epoch_s=self.start_epoch_s,
            arrival_s=_frozen(self.arrival_s / factor),
            isl=self.isl,
            osl=self.osl,
            clock_offset_s=self.clock_offset_s / factor,
            hash_ids=self.hash_ids,
            hash_offsets=self.hash_offsets,
            block_tokens=self.block_tokens,
        )

    def window(self, start_s: float, end_s: float) -> slice:
        """Index range of requests arriving in [start_s, end_s) (offsets from the first request)."""
        lo = int(np.searchsorted(self.arrival_s, start_s, side="left"))
        hi = int(np.searchsorted(self.arrival_s, end_s, side="left"))
        return slice(lo, hi)

    def observe(self, start_s: float, end_s: float) -> TrafficObservation:
        """Traffic in [start_s, end_s) as a frontend would report it (no latency figures)."""
        idx = self.window(start_s, end_s)
        return _summarise(end_s - start_s, self.isl[idx], self.osl[idx])

    def arrivals(self, start_s: float, end_s: float) -> RequestArrivals:
        """The requests arriving in [start_s - LOOKBACK_S, end_s), timestamped: what the arrival curve of the
        window [start_s, end_s) is computed from (`planner_core.arrivals`)."""
        idx = self.window(start_s - LOOKBACK_S, end_s)
        return RequestArrivals(arrival_s=self.arrival_s[idx], isl=self.isl[idx])


def _summarise(duration_s: float, isl: np.ndarray, osl: np.ndarray) -> TrafficObservation:
    """One window's observation: request count, mean and p50/p90/p99 lengths (all 0 / None when empty)."""
    if len(isl) == 0:
        return TrafficObservation(duration_s=duration_s, num_req=0.0, isl=0.0, osl=0.0)
    isl_p50, isl_p90, isl_p99 = (float(v) for v in np.percentile(isl, (50, 90, 99)))
    osl_p50, osl_p90, osl_p99 = (float(v) for v in np.percentile(osl, (50, 90, 99)))
    return TrafficObservation(
        duration_s=duration_s,
        num_req=float(len(isl)),
        isl=float(isl.mean()),
        osl=float(osl.mean()),
        isl_p50=isl_p50,
        isl_p90=isl_p90,
        isl_p99=isl_p99,
        osl_p50=osl_p50,
        osl_p90=osl_p90,
        osl_p99=osl_p99,
    )


# ---------------------------------------------------------------------------------------------------------
# Throughput windows, as Dynamo's warm-up builds them
# ---------------------------------------------------------------------------------------------------------


def _window_indices(trace: RequestTrace, interval_s: float) -> np.ndarray:
    """Window index of every request: floor((t - origin) / interval), t and origin on the trace's own clock.

    Computed on integer nanoseconds, so a request exactly on a boundary (e.g. Mooncake `timestamp` 60000 ms at
    a 60 s interval) falls in the later window, as in Dynamo's `timestamp_ms // interval_ms`, regardless of
    the float rounding of `arrival_s + clock_offset_s`.
    """
    try:
        value = float(interval_s)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(interval_s, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"window interval must be a finite number of seconds > 0, got {interval_s!r}")
    interval_ns = round(value * _NS_PER_S)
    if interval_ns <= 0:
        raise ValueError(f"window interval {interval_s!r} s is shorter than 1 ns")
    clock_ns = np.rint(trace.arrival_s * _NS_PER_S).astype(np.int64) + round(trace.clock_offset_s * _NS_PER_S)
    return clock_ns // interval_ns


def bucket_windows(trace: RequestTrace, interval_s: float) -> list[TrafficObservation]:
    """Cut a trace into consecutive throughput windows, exactly as Dynamo's warm-up does.

    Window `k` holds the requests with `floor((t - origin) / interval_s) == k`; the origin is the zero of the
    trace's clock (`RequestTrace.clock_offset_s`: the first request for wall-clock formats, time 0 for
    Mooncake). Empty windows between requests are kept (`num_req` 0, lengths 0, no percentiles: idle-window
    handling is the predictors' job); leading and trailing empty windows are dropped, so the first and the
    last window hold requests. Each window carries the count, mean ISL/OSL and their p50/p90/p99 (numpy's
    linear percentile), and `duration_s = interval_s`.

    Args:
        trace: the requests.
        interval_s: window length (s), > 0 (Dynamo's `throughput_adjustment_interval_seconds`).

    Returns:
        One observation per window, oldest first; empty for a trace without requests.

    Raises:
        ValueError: `interval_s` is not a finite number > 0.
    """
    indices = _window_indices(trace, interval_s)
    if len(indices) == 0:
        return []
    first, last = int(indices[0]), int(indices[-1])
    # arrival_s is sorted, so the indices are too: one searchsorted gives every window's slice.
    bounds = np.searchsorted(indices, np.arange(first, last + 2), side="left")
    return [
        _summarise(float(interval_s), trace.isl[lo:hi], trace.osl[lo:hi])
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def bucket_window_starts(trace: RequestTrace, interval_s: float) -> list[float]:
    """Start of each window of `bucket_windows` (s from the trace clock's zero): Dynamo's `interval_start`."""
    indices = _window_indices(trace, interval_s)
    if len(indices) == 0:
        return []
    return [k * interval_s for k in range(int(indices[0]), int(indices[-1]) + 1)]


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


def _frozen(values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values)
    values.setflags(write=False)
    return values


_Hashes = tuple[np.ndarray, np.ndarray]  # (flat ids, offsets): the CSR layout of RequestTrace.hash_ids


def _reorder_hashes(
    ids: np.ndarray, offsets: np.ndarray, order: np.ndarray, shift: np.ndarray | None = None
) -> _Hashes:
    """Block ids of requests `order[0], order[1], ...` (indices into the CSR `ids`/`offsets`, repeats allowed),
    each request's ids plus `shift[k]` when given."""
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    within = np.arange(int(new_offsets[-1]), dtype=np.int64) - np.repeat(new_offsets[:-1], lengths)
    new_ids = ids[np.repeat(offsets[:-1][order], lengths) + within]
    if shift is not None:
        new_ids = new_ids + np.repeat(shift, lengths)
    return new_ids.astype(np.int64, copy=False), new_offsets


def _take_hashes(trace: RequestTrace, taken: np.ndarray, shift: np.ndarray | None = None) -> _Hashes:
    assert trace.hash_ids is not None and trace.hash_offsets is not None
    return _reorder_hashes(trace.hash_ids, trace.hash_offsets, taken, shift)


def _build(
    source: str,
    start_epoch_s: float,
    arrival_s,
    isl,
    osl,
    *,
    clock_offset_s: float = 0.0,
    hashes: _Hashes | None = None,
    block_tokens: int = 512,
) -> RequestTrace:
    arrival = np.asarray(arrival_s, dtype=float)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    hash_ids = hash_offsets = None
    if hashes is not None:
        hash_ids, hash_offsets = (_frozen(a) for a in _reorder_hashes(*hashes, order))
    return RequestTrace(
        source=source,
        start_epoch_s=start_epoch_s + float(arrival[0]),
        arrival_s=_frozen(arrival - arrival[0]),
        isl=_frozen(np.asarray(isl, dtype=float)[order]),
        osl=_frozen(np.asarray(osl, dtype=float)[order]),
        clock_offset_s=clock_offset_s + float(arrival[0]),
        hash_ids=hash_ids,
        hash_offsets=hash_offsets,
        block_tokens=block_tokens,
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
        try:
            values = [float(record[key]) for key in _MOONCAKE_KEYS]
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{path}: line {line_no}: {type(exc).__name__}: {exc}") from exc
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


# ---------------------------------------------------------------------------------------------------------
# Rate shapes (ServeGen) and shaped traces
# ---------------------------------------------------------------------------------------------------------

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RateShape:
    """A relative request rate over time, constant within equal windows (window `k` covers
    `[k * window_s, (k + 1) * window_s)`). Only the ratios matter; `shape_trace` sets the absolute rate."""

    source: str
    window_s: float
    rates: np.ndarray  # >= 0, read-only, not all 0

    @property
    def duration_s(self) -> float:
        return self.window_s * len(self.rates)

    def daily(self) -> RateShape:
        """The mean day: each time-of-day window averaged over the shape's days (whole days only, at least one)."""
        per_day = DAY_S / self.window_s
        if per_day != round(per_day) or len(self.rates) < per_day:
            raise ValueError(f"{self.source}: a daily shape needs whole days of {self.window_s:g} s windows")
        per_day = round(per_day)
        days = len(self.rates) // per_day
        mean_day = self.rates[: days * per_day].reshape(days, per_day).mean(axis=0)
        return RateShape(source=f"{self.source} (mean of {days} days)", window_s=self.window_s, rates=_frozen(mean_day))

    def over(self, start_s: float, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Piecewise-constant pieces covering `[start_s, start_s + duration_s)` of the shape, repeated cyclically:
        (piece boundaries as offsets from `start_s`, one more than rates; the rate of each piece)."""
        if not (math.isfinite(duration_s) and duration_s > 0 and math.isfinite(start_s) and start_s >= 0):
            raise ValueError(f"{self.source}: need start >= 0 and duration > 0, got {start_s!r}, {duration_s!r}")
        first = int(start_s // self.window_s)
        last = int(math.ceil((start_s + duration_s) / self.window_s))
        windows = np.arange(first, max(last, first + 1))
        edges = np.clip(np.append(windows, windows[-1] + 1) * self.window_s - start_s, 0.0, duration_s)
        return edges, self.rates[windows % len(self.rates)]

    def peak_to_mean(self, start_s: float = 0.0, duration_s: float | None = None) -> float:
        """Busiest window's rate over the mean rate of `[start_s, start_s + duration_s)` (default: the whole shape)."""
        edges, rates = self.over(start_s, self.duration_s if duration_s is None else duration_s)
        return float(rates.max() / (np.sum(rates * np.diff(edges)) / edges[-1]))


def load_servegen_shape(path: str | Path) -> RateShape:
    """ServeGen's request-rate trace: one CSV per client (`chunk-N-trace.csv`, no header; columns `window_start_s`,
    `rate`, `cv`, inter-arrival family, two parameters), or a folder of them, whose rates are summed per window.
    ServeGen gives relative rates only, so the result is a shape, not a request trace.

    Raises:
        TraceError: no CSV files, or a row with a bad window start or rate (one line naming file, row, value).
    """
    root = Path(path)
    files = sorted(root.rglob("*.csv")) if root.is_dir() else [root]
    if not files or not files[0].exists():
        raise TraceError(f"{root}: no ServeGen CSV files")
    starts_all: list[np.ndarray] = []
    rates_all: list[np.ndarray] = []
    for file in files:
        rows = []
        with file.open(encoding="utf-8") as handle:
            for row_no, line in enumerate(handle, start=1):
                fields = line.strip().split(",")
                if fields == [""]:
                    continue
                try:
                    start, rate = float(fields[0]), float(fields[1])
                except (IndexError, ValueError) as exc:
                    raise TraceError(
                        f"{file}: row {row_no}: expected 'window_start_s,rate,...', got {line.strip()!r}"
                    ) from exc
                if not (math.isfinite(start) and start >= 0):
                    raise TraceError(f"{file}: row {row_no} field 'window_start_s' = {fields[0]!r} is not a time >= 0")
                if not (math.isfinite(rate) and rate >= 0):
                    raise TraceError(f"{file}: row {row_no} field 'rate' = {fields[1]!r} is not a rate >= 0")
                rows.append((start, rate))
        if rows:
            table = np.asarray(rows)
            starts_all.append(table[:, 0])
            rates_all.append(table[:, 1])
    if not starts_all:
        raise TraceError(f"{root}: no ServeGen rows")
    starts = np.concatenate(starts_all)
    rates = np.concatenate(rates_all)
    distinct = np.unique(starts)
    window_s = float(np.min(np.diff(distinct))) if len(distinct) > 1 else 600.0
    index = np.rint(starts / window_s).astype(np.int64)
    total = np.bincount(index - index.min(), weights=rates)
    if not total.any():
        raise TraceError(f"{root}: every rate is 0")
    return RateShape(source=str(root), window_s=window_s, rates=_frozen(total))


def shape_trace(
    base: RequestTrace,
    shape: RateShape,
    *,
    duration_s: float,
    rate_factor: float = 1.0,
    start_s: float = 0.0,
) -> RequestTrace:
    """`duration_s` of load whose request rate follows `shape` from `start_s` on (cyclically), made of the base
    trace's requests.

    The base trace is repeated back to back and its time axis warped so the cumulative request count follows
    the shape: request `i` at base time `u_i` arrives at the `t` where the shape's cumulative area, scaled to
    a mean of `rate_factor` times the base's mean rate, reaches the base's count at `u_i`. Lengths, prefixes and
    the base's burstiness (relative inter-arrival gaps) are kept; the mean rate over the span is `rate_factor`
    times the base's, the peak `rate_factor * shape.peak_to_mean(start_s, duration_s)` times. Each repetition's
    prefix blocks are its own (ids shifted), like the copies of `RequestTrace.scaled`.
    """
    if not (math.isfinite(rate_factor) and rate_factor > 0):
        raise ValueError(f"{base.source}: rate factor must be a finite number > 0, got {rate_factor!r}")
    if base.num_requests < 2:
        raise ValueError(f"{base.source}: a base trace needs at least 2 requests")
    edges, rates = shape.over(start_s, duration_s)
    # Cumulative shape area, normalised to the span's mean rate: area(duration) == duration.
    area = np.concatenate([[0.0], np.cumsum(rates * np.diff(edges))])
    area *= duration_s / area[-1]
    # Base time needed: rate_factor * duration_s. One repetition spans the base's duration plus one mean gap, so
    # repetitions do not land on one instant at the seams.
    period_s = base.duration_s * base.num_requests / (base.num_requests - 1)
    needed_s = rate_factor * duration_s
    copies = int(math.ceil(needed_s / period_s))
    base_time = np.concatenate([base.arrival_s + k * period_s for k in range(copies)])
    keep = base_time < needed_s
    base_time = base_time[keep]
    taken = np.tile(np.arange(base.num_requests), copies)[keep]
    # Invert the piecewise-linear cumulative area; windows of rate 0 (flat area) receive no request.
    area_unique, first = np.unique(area, return_index=True)
    arrival = np.interp(base_time / rate_factor, area_unique, edges[first])
    hashes = None
    if base.has_hashes:
        id_span = int(base.hash_ids.max()) + 1 if len(base.hash_ids) else 1  # type: ignore[union-attr]
        shift = np.repeat(np.arange(copies, dtype=np.int64), base.num_requests)[keep] * id_span
        hashes = _take_hashes(base, taken, shift)
    return _build(
        f"{base.source} shaped by {shape.source} from {start_s:g} s for {duration_s:g} s x{rate_factor:g}",
        base.start_epoch_s,
        arrival,
        base.isl[taken],
        base.osl[taken],
        hashes=hashes,
        block_tokens=base.block_tokens,
    )
