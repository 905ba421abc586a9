"""Request traces: load Azure CSV and Mooncake JSONL files into arrays, and summarise time windows of them.

A `RequestTrace` is a value: arrival offsets (s, from the first request), input and output lengths, and the
wall-clock time of the first request. Loading is I/O; everything else here is pure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner_core.domain import TrafficObservation

# Mooncake timestamps are relative; anchor them at a fixed, recognisable instant so runs are reproducible.
MOONCAKE_EPOCH_S = 1_704_067_200.0  # 2024-01-01T00:00:00Z


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, the line or field and the value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTrace:
    """Requests sorted by arrival. Arrays are read-only and of equal length."""

    source: str
    start_epoch_s: float
    arrival_s: np.ndarray  # offset from the first request (s)
    isl: np.ndarray  # input tokens
    osl: np.ndarray  # output tokens

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
        for copy in range(num_copies):
            keep = np.ones(self.num_requests, dtype=bool) if copy < whole else keep_fraction
            parts.append((self.arrival_s[keep] + copy * gap_s / num_copies, self.isl[keep], self.osl[keep]))
        arrival, isl, osl = (np.concatenate([part[i] for part in parts]) for i in range(3))
        return _build(f"{self.source} x{rate_factor:g}", self.start_epoch_s, arrival, isl, osl)

    def window(self, start_s: float, end_s: float) -> slice:
        """Index range of requests arriving in [start_s, end_s) (offsets from the first request)."""
        lo = int(np.searchsorted(self.arrival_s, start_s, side="left"))
        hi = int(np.searchsorted(self.arrival_s, end_s, side="left"))
        return slice(lo, hi)

    def observe(self, start_s: float, end_s: float) -> TrafficObservation:
        """Traffic in [start_s, end_s) as a frontend would report it (no latency figures)."""
        idx = self.window(start_s, end_s)
        isl, osl = self.isl[idx], self.osl[idx]
        if len(isl) == 0:
            return TrafficObservation(duration_s=end_s - start_s, num_req=0.0, isl=0.0, osl=0.0)
        isl_p50, isl_p90, isl_p99 = (float(v) for v in np.percentile(isl, (50, 90, 99)))
        osl_p50, osl_p90, osl_p99 = (float(v) for v in np.percentile(osl, (50, 90, 99)))
        return TrafficObservation(
            duration_s=end_s - start_s,
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


def _frozen(values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values)
    values.setflags(write=False)
    return values


def _build(source: str, start_epoch_s: float, arrival_s, isl, osl) -> RequestTrace:
    arrival = np.asarray(arrival_s, dtype=float)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    return RequestTrace(
        source=source,
        start_epoch_s=start_epoch_s + float(arrival[0]),
        arrival_s=_frozen(arrival - arrival[0]),
        isl=_frozen(np.asarray(isl, dtype=float)[order]),
        osl=_frozen(np.asarray(osl, dtype=float)[order]),
    )


def load_azure_csv(path: Path) -> RequestTrace:
    """Azure LLM inference trace: `TIMESTAMP` (wall clock, UTC), `ContextTokens`, `GeneratedTokens`."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure becomes one clear line
        raise TraceError(f"{path}: cannot parse CSV: {exc}") from exc
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
        lengths[column] = values
    epoch_s = stamps.astype("int64").to_numpy() / 1e9
    first = float(epoch_s.min())
    return _build(str(path), first, epoch_s - first, lengths["ContextTokens"], lengths["GeneratedTokens"])


def _reject_bad_rows(path: Path, frame, column: str, bad: np.ndarray, problem: str) -> None:  # noqa: ANN001
    """Raise a one-line TraceError for the first bad row of a CSV column (row numbers count the header as 1)."""
    if bad.any():
        row = int(bad.argmax())
        raise TraceError(f"{path}: row {row + 2} field '{column}' = {frame[column].iloc[row]!r} {problem}")


def load_mooncake_jsonl(path: Path) -> RequestTrace:
    """Mooncake trace: one JSON object per line with `timestamp` (ms, relative), `input_length`, `output_length`."""
    arrival_ms, isl, osl = [], [], []
    with path.open() as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                values = [float(record[key]) for key in ("timestamp", "input_length", "output_length")]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise TraceError(f"{path}: line {line_no}: {type(exc).__name__}: {exc}") from exc
            for key, value in zip(("timestamp", "input_length", "output_length"), values, strict=True):
                if not math.isfinite(value) or value < 0:
                    raise TraceError(f"{path}: line {line_no} field '{key}' = {record[key]!r} is not a number >= 0")
            arrival_ms.append(values[0])
            isl.append(values[1])
            osl.append(values[2])
    if not arrival_ms:
        raise TraceError(f"{path}: no requests")
    return _build(str(path), MOONCAKE_EPOCH_S, np.asarray(arrival_ms) / 1000.0, isl, osl)


def load_trace(path: str | Path) -> RequestTrace:
    """Load a trace file, choosing the format by suffix (`.csv` Azure, `.jsonl` Mooncake)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.suffix == ".csv":
        return load_azure_csv(path)
    if path.suffix == ".jsonl":
        return load_mooncake_jsonl(path)
    raise TraceError(f"{path}: unknown trace format '{path.suffix}' (expected .csv or .jsonl)")
