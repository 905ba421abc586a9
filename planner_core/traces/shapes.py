"""Rate shapes (ServeGen's daily request-rate traces) and shaped traces: a base trace's requests and burstiness
replayed under a relative rate over time, for multi-hour and multi-day load. Reading a shape is I/O; shaping is pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner_core.traces.trace import RequestTrace, TraceError, _build, _frozen, _take_hashes

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
