"""The request trace as a value: `RequestTrace` (arrays sorted by arrival), its rate scaling, compression and
windows, the bounds a trace may hold, and Dynamo's warm-up throughput windows (`bucket_windows`). All pure.

The readers (`planner_core.traces.formats`) and the rate shapes (`planner_core.traces.shapes`) build on it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

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
MAX_SCALED_REQUESTS = 2_000_000
"""Most requests a rate-scaled trace may hold: the scaling alone took ~150 MB for 1.9 M requests, and every request
is then simulated; ten times the demo's default (Azure conversations at 12x: 232,392)."""


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

    def check_rate_factor(self, rate_factor: float) -> None:
        """Raise ValueError (one line) unless `scaled(rate_factor)` is possible: finite, > 0 and within
        `MAX_SCALED_REQUESTS`; cheap, so a command checks it before starting anything."""
        if not (math.isfinite(rate_factor) and rate_factor > 0):
            raise ValueError(f"{self.source}: rate factor must be a finite number > 0, got {rate_factor!r}")
        num_scaled = math.ceil(self.num_requests * rate_factor)
        if num_scaled > MAX_SCALED_REQUESTS:
            raise ValueError(
                f"{self.source}: rate factor {rate_factor:g} would make its {self.num_requests} requests "
                f"{num_scaled}, more than a run carries ({MAX_SCALED_REQUESTS}): at most "
                f"{MAX_SCALED_REQUESTS / max(1, self.num_requests):.4g} for this trace"
            )

    def scaled(self, rate_factor: float) -> RequestTrace:
        """The same traffic shape at `rate_factor` times the request rate (duration unchanged).

        Each request is repeated `floor(rate_factor)` times, plus once more for a low-discrepancy (golden-ratio)
        selection of a `rate_factor % 1` fraction of requests; copy `j` arrives `j / copies` of the mean
        inter-arrival time after the original, so copies interleave instead of stacking on one instant.
        """
        self.check_rate_factor(rate_factor)
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
