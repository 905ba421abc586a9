"""Pre-deployment engine profiles and the capacity interpolators built from them (Dynamo 0.x legacy model).

Role in the planner: this is the perf model behind the throughput loop. A profile measured before
deployment (Dynamo's `selected_{prefill,decode}_interpolation/raw_data.npz`, or the JSON twins
`prefill_raw_data.json` / `decode_raw_data.json` that Dynamo mounts from a ConfigMap) is loaded once by
`load_profile`, validated, and turned into immutable interpolators. The planner then asks every tick what
one GPU serves under the TTFT/ITL targets at the forecast request shape (`estimate_engine_capacity`).

Interpolation follows Dynamo 0.x (`planner/utils/perf_interpolation.py`):

- prefill: 1-D cubic spline (not-a-knot, the spline `scipy.interpolate.interp1d(kind="cubic")` builds) over
  ISL for TTFT (ms) and throughput (tokens/s/GPU); the query ISL is clamped to the sampled range;
- decode: `scipy.interpolate.griddata(method="cubic")` of ITL (ms) and throughput (tokens/s/GPU) over the
  scattered samples (kv_usage, context_length), evaluated once on a 100 x 100 grid (kv_usage 0..1, context
  0..max sampled context, both in the samples' raw units, not rescaled), cells outside the samples' convex
  hull filled by `method="nearest"`; queries snap to the nearest grid cell.

Where this module departs from Dynamo, it says so: `DecodeInterpolator.find_best_throughput_per_gpu`
returns a throughput that never drops when the ITL target is loosened (Dynamo's scan does not guarantee
that; `dynamo_literal=True` gives Dynamo's exact answer), and degenerate decode profiles (one context length
or one kv usage, on which `griddata` cannot triangulate) are interpolated in 1-D instead of failing.

Pure: the only I/O is `load_profile`; no clock, no global state, no side effects at import. SciPy is
imported inside the constructors that need it, so importing this module stays cheap.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DECODE_JSON_NAME",
    "DECODE_SUBDIR",
    "DEFAULT_GRID_RESOLUTION",
    "NPZ_NAME",
    "PREFILL_JSON_NAME",
    "PREFILL_SUBDIR",
    "DecodeInterpolator",
    "DecodeOperatingPoint",
    "DecodeProfile",
    "EngineCapacity",
    "EngineProfile",
    "PrefillInterpolator",
    "PrefillProfile",
    "ProfileError",
    "estimate_engine_capacity",
    "load_profile",
]

PREFILL_SUBDIR = "selected_prefill_interpolation"
DECODE_SUBDIR = "selected_decode_interpolation"
NPZ_NAME = "raw_data.npz"
PREFILL_JSON_NAME = "prefill_raw_data.json"
DECODE_JSON_NAME = "decode_raw_data.json"
DEFAULT_GRID_RESOLUTION = 100  # cells per decode grid axis, as in Dynamo 0.x

FloatArray = NDArray[np.float64]


class ProfileError(ValueError):
    """A profile file is missing, unreadable or holds a missing/malformed array.

    `str(error)` is one line: `<file>: <problem>`, e.g. `.../raw_data.npz: missing array 'prefill_ttft'`.

    Attributes:
        path: the file (or directory) at fault.
        problem: what is wrong with it, naming the array where there is one.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(problem.split())  # keep the message on one line
        super().__init__(f"{self.path}: {self.problem}")


# --------------------------------------------------------------------------------------------------------
# Profiles (validated, immutable data)
# --------------------------------------------------------------------------------------------------------


def _readonly_1d(
    source: str,
    name: str,
    value: Any,
    *,
    allow_zero: bool = False,
    expected_len: tuple[str, int] | None = None,
) -> FloatArray:
    """A validated read-only float64 copy of one profile array.

    Args:
        source: file the array came from (for error messages).
        name: the array's key in Dynamo's format, e.g. `prefill_ttft`.
        value: anything `np.asarray` accepts.
        allow_zero: accept 0 (kv usage); otherwise every value must be > 0.
        expected_len: `(other_name, length)` the array must match.

    Raises:
        ProfileError: not numeric, not 1-D, empty, wrong length, non-finite or out of range.
    """
    try:
        array = np.array(value, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise ProfileError(source, f"bad array {name!r}: not numeric ({exc})") from exc
    if array.ndim != 1:
        raise ProfileError(source, f"bad array {name!r}: expected a 1-D array, got shape {array.shape}")
    if array.size == 0:
        raise ProfileError(source, f"bad array {name!r}: empty")
    if expected_len is not None and array.size != expected_len[1]:
        other, length = expected_len
        raise ProfileError(source, f"bad array {name!r}: length {array.size} does not match {other!r} length {length}")
    finite = np.isfinite(array)
    if not finite.all():
        index = int(np.flatnonzero(~finite)[0])
        raise ProfileError(source, f"bad array {name!r}: non-finite value {array[index]} at index {index}")
    out_of_range = array < 0 if allow_zero else array <= 0
    if out_of_range.any():
        index = int(np.flatnonzero(out_of_range)[0])
        bound = "negative" if allow_zero else "non-positive"
        raise ProfileError(source, f"bad array {name!r}: {bound} value {array[index]:g} at index {index}")
    array.flags.writeable = False
    return array


def _positive_count(source: str, name: str, value: Any) -> int:
    """A positive whole number given as a scalar (JSON) or a 1-element array (NPZ stores `[n]`)."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProfileError(source, f"bad array {name!r}: not numeric ({exc})") from exc
    if array.size != 1 or array.ndim > 1:
        raise ProfileError(source, f"bad array {name!r}: expected one value, got shape {array.shape}")
    number = float(array.reshape(()))
    if not math.isfinite(number) or number <= 0 or number != round(number):
        raise ProfileError(source, f"bad array {name!r}: expected a positive whole number, got {number:g}")
    return int(number)


def _arrays_equal(left: tuple[FloatArray, ...], right: tuple[FloatArray, ...]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(left, right, strict=True))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PrefillProfile:
    """Prefill measurements at batch 1: one row per sampled ISL.

    Arrays are validated (1-D, same length, finite, > 0) and stored as read-only float64 copies. Equality and
    hash compare the data only, not `source_file`.

    Attributes:
        isl: input sequence lengths (tokens); Dynamo key `prefill_isl`.
        ttft_ms: time to first token at that ISL (ms); `prefill_ttft`.
        thpt_per_gpu: prefill throughput (tokens/s/GPU); `prefill_thpt_per_gpu`.
        source_file: where the data came from, used in error messages.
    """

    isl: FloatArray
    ttft_ms: FloatArray
    thpt_per_gpu: FloatArray
    source_file: str = "<memory>"

    def __post_init__(self) -> None:
        src = self.source_file
        isl = _readonly_1d(src, "prefill_isl", self.isl)
        expected = ("prefill_isl", isl.size)
        ttft_ms = _readonly_1d(src, "prefill_ttft", self.ttft_ms, expected_len=expected)
        thpt = _readonly_1d(src, "prefill_thpt_per_gpu", self.thpt_per_gpu, expected_len=expected)
        unique_isl, counts = np.unique(isl, return_counts=True)
        if (counts > 1).any():
            duplicate = unique_isl[counts > 1][0]
            raise ProfileError(src, f"bad array 'prefill_isl': duplicate value {duplicate:g}")
        object.__setattr__(self, "isl", isl)
        object.__setattr__(self, "ttft_ms", ttft_ms)
        object.__setattr__(self, "thpt_per_gpu", thpt)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source_file: str = "<memory>") -> PrefillProfile:
        """Build from Dynamo's keys (`prefill_isl`, `prefill_ttft`, `prefill_thpt_per_gpu`).

        Raises:
            ProfileError: a key is missing or its array is malformed.
        """
        _require_keys(source_file, data, ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"))
        return cls(
            isl=data["prefill_isl"],
            ttft_ms=data["prefill_ttft"],
            thpt_per_gpu=data["prefill_thpt_per_gpu"],
            source_file=source_file,
        )

    def _data(self) -> tuple[FloatArray, ...]:
        return (self.isl, self.ttft_ms, self.thpt_per_gpu)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefillProfile):
            return NotImplemented
        return _arrays_equal(self._data(), other._data())

    def __hash__(self) -> int:
        return hash(tuple(a.tobytes() for a in self._data()))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DecodeProfile:
    """Decode measurements: scattered samples of (kv usage, context length) -> (ITL, throughput).

    Arrays are validated (1-D, same length, finite; kv usage >= 0, the others > 0) and stored as read-only
    float64 copies. Equality and hash compare the data only, not `source_file`.

    Attributes:
        kv_usage: active KV-cache fraction, `concurrency * context_length / max_kv_tokens`; `x_kv_usage`.
        context_length: tokens per request in the KV cache (ISL + OSL/2 when profiled); `y_context_length`.
        itl_ms: inter-token latency (ms); `z_itl`.
        thpt_per_gpu: decode throughput (tokens/s/GPU); `z_thpt_per_gpu`.
        max_kv_tokens: KV-cache capacity of one engine (tokens); `max_kv_tokens` (NPZ `[n]`, JSON `n`).
        source_file: where the data came from, used in error messages.
    """

    kv_usage: FloatArray
    context_length: FloatArray
    itl_ms: FloatArray
    thpt_per_gpu: FloatArray
    max_kv_tokens: int
    source_file: str = "<memory>"

    def __post_init__(self) -> None:
        src = self.source_file
        kv_usage = _readonly_1d(src, "x_kv_usage", self.kv_usage, allow_zero=True)
        expected = ("x_kv_usage", kv_usage.size)
        context = _readonly_1d(src, "y_context_length", self.context_length, expected_len=expected)
        itl_ms = _readonly_1d(src, "z_itl", self.itl_ms, expected_len=expected)
        thpt = _readonly_1d(src, "z_thpt_per_gpu", self.thpt_per_gpu, expected_len=expected)
        object.__setattr__(self, "kv_usage", kv_usage)
        object.__setattr__(self, "context_length", context)
        object.__setattr__(self, "itl_ms", itl_ms)
        object.__setattr__(self, "thpt_per_gpu", thpt)
        object.__setattr__(self, "max_kv_tokens", _positive_count(src, "max_kv_tokens", self.max_kv_tokens))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source_file: str = "<memory>") -> DecodeProfile:
        """Build from a mapping with Dynamo's decode keys.

        Keys: `x_kv_usage`, `y_context_length`, `z_itl`, `z_thpt_per_gpu`, `max_kv_tokens`.

        Raises:
            ProfileError: a key is missing or its array is malformed.
        """
        keys = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens")
        _require_keys(source_file, data, keys)
        return cls(
            kv_usage=data["x_kv_usage"],
            context_length=data["y_context_length"],
            itl_ms=data["z_itl"],
            thpt_per_gpu=data["z_thpt_per_gpu"],
            max_kv_tokens=data["max_kv_tokens"],
            source_file=source_file,
        )

    def _data(self) -> tuple[FloatArray, ...]:
        return (self.kv_usage, self.context_length, self.itl_ms, self.thpt_per_gpu)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DecodeProfile):
            return NotImplemented
        return self.max_kv_tokens == other.max_kv_tokens and _arrays_equal(self._data(), other._data())

    def __hash__(self) -> int:
        return hash((self.max_kv_tokens, *(a.tobytes() for a in self._data())))


def _require_keys(source: str, data: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in data:
            raise ProfileError(source, f"missing array {key!r}")


# --------------------------------------------------------------------------------------------------------
# Interpolators
# --------------------------------------------------------------------------------------------------------


class _Spline1d:
    """A 1-D not-a-knot cubic spline, evaluated in plain Python (bisect + Horner) with the input clamped.

    It is the spline `interp1d(kind="cubic")` builds (n >= 4 points); with 3 points it is the parabola and
    with 2 the line through them (where `interp1d` would refuse), with 1 point a constant.
    """

    __slots__ = ("_breaks", "_coeffs", "x_max", "x_min")

    def __init__(self, x: FloatArray, y: FloatArray) -> None:
        self.x_min = float(x[0])
        self.x_max = float(x[-1])
        if x.size == 1:
            self._breaks = [self.x_min]
            self._coeffs = [(0.0, 0.0, 0.0, float(y[0]))]
            return
        from scipy.interpolate import CubicSpline

        spline = CubicSpline(x, y, bc_type="not-a-knot")
        self._breaks = [float(b) for b in spline.x[:-1]]
        self._coeffs = [tuple(float(c) for c in column) for column in spline.c.T]

    def __call__(self, value: float) -> float:
        value = min(max(value, self.x_min), self.x_max)
        index = max(bisect_right(self._breaks, value) - 1, 0)
        c3, c2, c1, c0 = self._coeffs[index]
        dx = value - self._breaks[index]
        return ((c3 * dx + c2) * dx + c1) * dx + c0

    def on(self, points: FloatArray) -> FloatArray:
        """Vectorised evaluation (used once, to fill grids)."""
        return np.array([self(float(p)) for p in points], dtype=np.float64)


def _finite_nonnegative(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class PrefillInterpolator:
    """TTFT (ms) and throughput (tokens/s/GPU) as functions of ISL, from a `PrefillProfile`.

    1-D cubic interpolation over the sampled ISLs (Dynamo 0.x `interp1d(kind="cubic")`); a query ISL outside
    the sampled range is clamped to it. Queries cost about a microsecond (no NumPy on the query path).
    Immutable after construction.
    """

    __slots__ = ("_thpt", "_ttft", "isl_max", "isl_min")

    def __init__(self, profile: PrefillProfile) -> None:
        """Fit the splines.

        Args:
            profile: validated prefill samples (any order; sorted here by ISL).
        """
        order = np.argsort(profile.isl, kind="stable")
        isl = profile.isl[order]
        self._ttft = _Spline1d(isl, profile.ttft_ms[order])
        self._thpt = _Spline1d(isl, profile.thpt_per_gpu[order])
        self.isl_min = float(isl[0])
        self.isl_max = float(isl[-1])

    def ttft_ms(self, isl: float) -> float:
        """Interpolated time to first token (ms) of one request of `isl` tokens, ISL clamped to the samples.

        Raises:
            ValueError: `isl` is not a finite number >= 0.
        """
        return self._ttft(_finite_nonnegative("isl", isl))

    def thpt_per_gpu(self, isl: float) -> float:
        """Interpolated prefill throughput (tokens/s/GPU) at `isl` tokens, ISL clamped to the samples.

        Raises:
            ValueError: `isl` is not a finite number >= 0.
        """
        return self._thpt(_finite_nonnegative("isl", isl))


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeOperatingPoint:
    """One decode grid cell: the operating point chosen for an ITL target.

    Attributes:
        thpt_per_gpu: decode throughput there (tokens/s/GPU).
        itl_ms: interpolated inter-token latency there (ms); above the target when no cell meets it.
        kv_usage: active KV-cache fraction of the cell (0..1).
    """

    thpt_per_gpu: float
    itl_ms: float
    kv_usage: float


@dataclass(frozen=True, slots=True)
class _Frontier:
    """Per grid row: cells that are an answer of the top-down scan for some ITL target.

    `itl_ms` is increasing, so `bisect_right(itl_ms, target) - 1` finds the answer for `target`;
    `cell[k]` is the grid column returned for that position.
    """

    itl_ms: list[float]
    cell: list[int]


def _row_frontiers(itl_row: list[float], thpt_row: list[float], *, best: bool) -> _Frontier:
    """Precompute the answers of `find_best_throughput_per_gpu` for one grid row.

    Dynamo scans from the highest kv cell down and takes the first cell with ITL <= target, i.e. the
    highest column whose ITL is <= target. Those columns are exactly the strict suffix minima of the row's
    ITL (a column whose ITL is below every column to its right), and their ITLs increase with the column,
    so a bisection over them returns the scan's answer.

    With `best=True`, columns with a non-positive throughput or ITL (cubic undershoot) are skipped and each
    position maps to the highest-throughput column among the positions up to it: the running maximum of the
    scan's answer over tighter targets, the smallest answer >= Dynamo's that never drops as the target grows.
    """
    cells: list[int] = []
    itls: list[float] = []
    lowest = math.inf
    for column in range(len(itl_row) - 1, -1, -1):
        if best and not (thpt_row[column] > 0 and itl_row[column] > 0):
            continue
        if itl_row[column] < lowest:
            lowest = itl_row[column]
            cells.append(column)
            itls.append(lowest)
    cells.reverse()
    itls.reverse()
    if best:
        running: list[int] = []
        for column in cells:
            if not running or thpt_row[column] > thpt_row[running[-1]]:
                running.append(column)
            else:
                running.append(running[-1])
        cells = running
    return _Frontier(itl_ms=itls, cell=cells)


class DecodeInterpolator:
    """ITL (ms) and throughput (tokens/s/GPU) over (concurrency, context length), from a `DecodeProfile`.

    The surfaces are computed once, at construction, on a `resolution` x `resolution` grid: kv usage 0..1
    (columns) by context length 0..max sampled context in tokens (rows), exactly as Dynamo 0.x does: cubic
    `griddata` over the samples' raw (kv_usage, context_length) coordinates, NaN cells (outside the convex
    hull) filled by nearest-neighbour. A query snaps to the nearest cell (ties to even, like `np.round`), so
    it costs about a microsecond. Immutable after construction.

    Degenerate profiles (Dynamo would crash in Qhull): if every sample has the same context length, the
    surfaces are a 1-D cubic spline along kv usage (context ignored; `mode == "1d-kv-usage"`); if every
    sample has the same kv usage, a 1-D spline along context length (`mode == "1d-context"`). Queries beyond
    the sampled range take the end value, as the nearest fill would. Otherwise `mode == "griddata-cubic"`.

    Attributes:
        kv_usage_axis: grid column coordinates (fraction, read-only).
        context_axis: grid row coordinates (tokens, read-only).
        itl_grid_ms: ITL surface, shape (rows = context, columns = kv usage), read-only.
        thpt_grid_per_gpu: throughput surface (tokens/s/GPU), same shape, read-only.
        max_kv_tokens: KV-cache capacity of one engine (tokens).
        mode: how the surfaces were built (see above).
    """

    __slots__ = (
        "_best",
        "_context_step",
        "_itl_rows",
        "_kv_step",
        "_literal",
        "_thpt_rows",
        "context_axis",
        "itl_grid_ms",
        "kv_usage_axis",
        "max_kv_tokens",
        "mode",
        "resolution",
        "thpt_grid_per_gpu",
    )

    def __init__(self, profile: DecodeProfile, *, resolution: int = DEFAULT_GRID_RESOLUTION) -> None:
        """Build the grids.

        Args:
            profile: validated decode samples.
            resolution: cells per axis (Dynamo: 100).

        Raises:
            ValueError: `resolution` < 2.
            ProfileError: the samples are collinear in (kv_usage, context_length) and cannot be triangulated.
        """
        if resolution < 2:
            raise ValueError(f"resolution must be >= 2, got {resolution}")
        self.resolution = resolution
        self.max_kv_tokens = profile.max_kv_tokens
        kv_axis = np.linspace(0.0, 1.0, resolution)
        context_axis = np.linspace(0.0, float(profile.context_length.max()), resolution)
        itl_grid, thpt_grid, self.mode = _decode_surfaces(profile, kv_axis, context_axis)
        for array in (kv_axis, context_axis, itl_grid, thpt_grid):
            array.flags.writeable = False
        self.kv_usage_axis = kv_axis
        self.context_axis = context_axis
        self.itl_grid_ms = itl_grid
        self.thpt_grid_per_gpu = thpt_grid
        # Same step arithmetic as Dynamo (`(v - axis[0]) / (axis[1] - axis[0])`), so cells match exactly.
        self._kv_step = float(kv_axis[1] - kv_axis[0])
        self._context_step = float(context_axis[1] - context_axis[0])
        self._itl_rows: list[list[float]] = itl_grid.tolist()
        self._thpt_rows: list[list[float]] = thpt_grid.tolist()
        self._literal = [_row_frontiers(i, t, best=False) for i, t in zip(self._itl_rows, self._thpt_rows, strict=True)]
        self._best = [_row_frontiers(i, t, best=True) for i, t in zip(self._itl_rows, self._thpt_rows, strict=True)]

    def _index(self, value: float, step: float) -> int:
        return min(max(round(value / step), 0), self.resolution - 1)

    def _cell(self, concurrency: float, context_length: float) -> tuple[int, int]:
        concurrency = _finite_nonnegative("concurrency", concurrency)
        context_length = _finite_nonnegative("context_length", context_length)
        kv_usage = concurrency * context_length / self.max_kv_tokens
        return self._index(kv_usage, self._kv_step), self._index(context_length, self._context_step)

    def itl_ms(self, concurrency: float, context_length: float) -> float:
        """Interpolated ITL (ms) with `concurrency` requests of `context_length` tokens in one engine.

        kv usage = concurrency * context_length / max_kv_tokens, snapped (and clamped) to the grid.

        Raises:
            ValueError: an argument is not a finite number >= 0.
        """
        column, row = self._cell(concurrency, context_length)
        return self._itl_rows[row][column]

    def thpt_per_gpu(self, concurrency: float, context_length: float) -> float:
        """Interpolated decode throughput (tokens/s/GPU) at that concurrency and context length.

        Raises:
            ValueError: an argument is not a finite number >= 0.
        """
        column, row = self._cell(concurrency, context_length)
        return self._thpt_rows[row][column]

    def find_best_throughput_per_gpu(
        self, itl_ms: float, context_length: float, *, dynamo_literal: bool = False
    ) -> DecodeOperatingPoint:
        """The decode operating point for an ITL target at a context length.

        Dynamo 0.x (`dynamo_literal=True`): take the grid row of `context_length`, scan kv usage from the
        highest cell downwards and return the first cell whose ITL <= `itl_ms`; if none, cell 0 (kv usage 0).
        Computed by bisection over precomputed per-row answers, identical to the scan.

        Default: the same scan, made monotone. The interpolated surfaces are not monotone in kv usage (cubic
        overshoot; saturated samples), so Dynamo's answer can drop, even to a negative throughput, when the
        target is loosened. Here a loosened target never returns less: the answer is the highest-throughput
        cell among Dynamo's answers for this or any tighter target (all meet the target), cells with
        non-positive interpolated throughput or ITL are never chosen, and if no cell meets the target the
        lowest-ITL usable cell is returned (Dynamo's cell 0 whenever cell 0 has the row's lowest ITL). On the
        shipped H200 profile at ISL 3000/OSL 300, ITL 10 ms, both give Dynamo's documented 4555.68.

        Args:
            itl_ms: ITL target (ms).
            context_length: mean tokens per request in the KV cache (ISL + OSL/2).
            dynamo_literal: reproduce Dynamo 0.x exactly, including its non-monotone answers.

        Returns:
            The chosen cell; its `itl_ms` is above the target only when no cell meets the target.

        Raises:
            ValueError: `itl_ms` is NaN or `context_length` is not a finite number >= 0.
        """
        if math.isnan(itl_ms):
            raise ValueError("itl_ms must not be NaN")
        row = self._index(_finite_nonnegative("context_length", context_length), self._context_step)
        frontier = (self._literal if dynamo_literal else self._best)[row]
        position = bisect_right(frontier.itl_ms, itl_ms) - 1
        if position >= 0:
            column = frontier.cell[position]
        elif dynamo_literal or not frontier.cell:
            column = 0
        else:
            column = frontier.cell[0]
        return DecodeOperatingPoint(
            thpt_per_gpu=self._thpt_rows[row][column],
            itl_ms=self._itl_rows[row][column],
            kv_usage=float(self.kv_usage_axis[column]),
        )


def _decode_surfaces(
    profile: DecodeProfile, kv_axis: FloatArray, context_axis: FloatArray
) -> tuple[FloatArray, FloatArray, str]:
    """ITL and throughput grids (rows = context, columns = kv usage) and the mode used to build them."""
    shape = (context_axis.size, kv_axis.size)
    values = (profile.itl_ms, profile.thpt_per_gpu)
    if np.unique(profile.context_length).size == 1 or np.unique(profile.kv_usage).size == 1:
        along_kv = np.unique(profile.context_length).size == 1
        coords, name, axis = (
            (profile.kv_usage, "x_kv_usage", kv_axis)
            if along_kv
            else (profile.context_length, "y_context_length", context_axis)
        )
        unique, counts = np.unique(coords, return_counts=True)
        if (counts > 1).any():
            duplicate = unique[counts > 1][0]
            raise ProfileError(
                profile.source_file,
                f"bad array {name!r}: duplicate value {duplicate:g} in a profile with a single "
                f"{'context length' if along_kv else 'kv usage'} (1-D interpolation needs distinct points)",
            )
        order = np.argsort(coords, kind="stable")
        grids = []
        for z in values:
            line = _Spline1d(coords[order], z[order]).on(axis)
            grid = np.broadcast_to(line, shape) if along_kv else np.broadcast_to(line[:, None], shape)
            grids.append(np.array(grid, dtype=np.float64))
        return grids[0], grids[1], "1d-kv-usage" if along_kv else "1d-context"

    from scipy.interpolate import griddata
    from scipy.spatial import QhullError

    points = (profile.kv_usage, profile.context_length)
    kv_mesh, context_mesh = np.meshgrid(kv_axis, context_axis)
    grids = []
    for z in values:
        try:
            grid = griddata(points, z, (kv_mesh, context_mesh), method="cubic")
        except QhullError as exc:
            raise ProfileError(
                profile.source_file,
                "bad arrays 'x_kv_usage'/'y_context_length': samples are collinear, cannot triangulate",
            ) from exc
        missing = np.isnan(grid)
        if missing.any():
            nearest = griddata(points, z, (kv_mesh, context_mesh), method="nearest")
            grid[missing] = nearest[missing]
        grids.append(np.asarray(grid, dtype=np.float64))
    return grids[0], grids[1], "griddata-cubic"


# --------------------------------------------------------------------------------------------------------
# Engine profile and capacity
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineProfile:
    """A disaggregated engine's prefill and decode profile, with its interpolators built once.

    Constructing one builds both interpolators (the decode grid takes tens of milliseconds); the planner
    keeps the instance and queries it every tick. Equality compares the data and `source_dir`; the
    interpolators are derived and excluded.

    Attributes:
        prefill: prefill samples.
        decode: decode samples.
        source_dir: the profile directory (holding the `selected_*_interpolation/` folders or JSON twins).
        decode_grid_resolution: cells per decode grid axis (Dynamo: 100).
        prefill_interpolator: built from `prefill` at construction.
        decode_interpolator: built from `decode` at construction.
    """

    prefill: PrefillProfile
    decode: DecodeProfile
    source_dir: str = "<memory>"
    decode_grid_resolution: int = DEFAULT_GRID_RESOLUTION
    prefill_interpolator: PrefillInterpolator = field(init=False, repr=False, compare=False)
    decode_interpolator: DecodeInterpolator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_interpolator", PrefillInterpolator(self.prefill))
        object.__setattr__(
            self,
            "decode_interpolator",
            DecodeInterpolator(self.decode, resolution=self.decode_grid_resolution),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCapacity:
    """What the profiled engines serve at one request shape under TTFT/ITL targets.

    Attributes:
        prefill_tokens_per_s_per_gpu: interpolated prefill throughput at the ISL (tokens/s/GPU).
        prefill_ttft_ms: interpolated TTFT at the ISL (ms), batch 1, no queueing.
        decode_tokens_per_s_per_gpu: best decode throughput whose ITL meets the target (tokens/s/GPU).
        decode_itl_ms: interpolated ITL at that operating point (ms).
        decode_kv_usage: active KV-cache fraction at that operating point (0..1).
        requests_per_s_per_gpu: requests/s one prefill GPU and one decode GPU (a GPU pair) sustain
            together: `min(prefill_tokens_per_s_per_gpu / ISL, decode_tokens_per_s_per_gpu / OSL)`, the
            per-GPU rate of the slower phase. This is Dynamo's "~15 request/s/gpu for both prefill and
            decode" (ISL 3000/OSL 300: min(16.49, 15.19)). Per physical GPU of a 1P1D pair it is half that.
        prefill_engine_rps: requests/s one prefill engine serves: tokens/s/GPU * GPUs per engine / ISL.
        decode_engine_rps: requests/s one decode engine serves: tokens/s/GPU * GPUs per engine / OSL.
        prefill_sla_met: `prefill_ttft_ms <= ttft target`.
        decode_sla_met: `decode_itl_ms <= itl target`.
    """

    prefill_tokens_per_s_per_gpu: float
    prefill_ttft_ms: float
    decode_tokens_per_s_per_gpu: float
    decode_itl_ms: float
    decode_kv_usage: float
    requests_per_s_per_gpu: float
    prefill_engine_rps: float
    decode_engine_rps: float
    prefill_sla_met: bool
    decode_sla_met: bool

    def to_json_dict(self) -> dict[str, float]:
        """The headline figures, JSON-ready (plain floats)."""
        return {
            "prefill_tokens_per_s_per_gpu": float(self.prefill_tokens_per_s_per_gpu),
            "prefill_ttft_ms": float(self.prefill_ttft_ms),
            "decode_tokens_per_s_per_gpu": float(self.decode_tokens_per_s_per_gpu),
            "decode_itl_ms": float(self.decode_itl_ms),
            "requests_per_s_per_gpu": float(self.requests_per_s_per_gpu),
        }


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _gpu_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def estimate_engine_capacity(
    profile: EngineProfile,
    *,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    prefill_gpus_per_engine: int = 1,
    decode_gpus_per_engine: int = 1,
    dynamo_literal: bool = False,
) -> EngineCapacity:
    """Per-GPU and per-engine capacity at one request shape under TTFT/ITL targets (Dynamo 0.x sizing).

    Prefill: throughput and TTFT interpolated at `isl` (clamped to the profiled ISLs); as in Dynamo the
    throughput is used whether or not the TTFT target is met (`prefill_sla_met` says which). Decode:
    `find_best_throughput_per_gpu(itl_ms, isl + osl / 2)`. See `EngineCapacity` for the derived rates.

    Args:
        profile: the engine profile (interpolators prebuilt).
        isl: mean input sequence length (tokens).
        osl: mean output sequence length (tokens).
        ttft_ms: TTFT target (ms).
        itl_ms: ITL target (ms).
        prefill_gpus_per_engine: GPUs in one prefill engine.
        decode_gpus_per_engine: GPUs in one decode engine.
        dynamo_literal: use Dynamo's exact (non-monotone) decode scan instead of the monotone one.

    Raises:
        ValueError: a length or target is not finite and > 0, or a GPU count is not an integer >= 1.
    """
    isl = _positive("isl", isl)
    osl = _positive("osl", osl)
    ttft_target_ms = _positive("ttft_ms", ttft_ms)
    itl_target_ms = _positive("itl_ms", itl_ms)
    prefill_gpus = _gpu_count("prefill_gpus_per_engine", prefill_gpus_per_engine)
    decode_gpus = _gpu_count("decode_gpus_per_engine", decode_gpus_per_engine)

    prefill = profile.prefill_interpolator
    prefill_tokens_per_s = prefill.thpt_per_gpu(isl)
    prefill_ttft_ms = prefill.ttft_ms(isl)
    point = profile.decode_interpolator.find_best_throughput_per_gpu(
        itl_target_ms, isl + osl / 2, dynamo_literal=dynamo_literal
    )
    return EngineCapacity(
        prefill_tokens_per_s_per_gpu=prefill_tokens_per_s,
        prefill_ttft_ms=prefill_ttft_ms,
        decode_tokens_per_s_per_gpu=point.thpt_per_gpu,
        decode_itl_ms=point.itl_ms,
        decode_kv_usage=point.kv_usage,
        requests_per_s_per_gpu=min(prefill_tokens_per_s / isl, point.thpt_per_gpu / osl),
        prefill_engine_rps=prefill_tokens_per_s * prefill_gpus / isl,
        decode_engine_rps=point.thpt_per_gpu * decode_gpus / osl,
        prefill_sla_met=prefill_ttft_ms <= ttft_target_ms,
        decode_sla_met=point.itl_ms <= itl_target_ms,
    )


# --------------------------------------------------------------------------------------------------------
# Loading (the only I/O)
# --------------------------------------------------------------------------------------------------------


def _looks_like_profile_dir(directory: Path) -> bool:
    return (
        (directory / PREFILL_SUBDIR).is_dir()
        or (directory / DECODE_SUBDIR).is_dir()
        or (directory / PREFILL_JSON_NAME).is_file()
        or (directory / DECODE_JSON_NAME).is_file()
    )


def _resolve_profile_dir(root: Path) -> Path:
    if not root.is_dir():
        raise ProfileError(root, "missing directory" if not root.exists() else "not a directory")
    if _looks_like_profile_dir(root):
        return root
    children = sorted(child for child in root.iterdir() if child.is_dir() and _looks_like_profile_dir(child))
    if len(children) == 1:
        return children[0]
    if not children:
        raise ProfileError(
            root,
            f"no profile: expected {PREFILL_SUBDIR}/{NPZ_NAME} or {PREFILL_JSON_NAME} here or in exactly one subfolder",
        )
    names = ", ".join(child.name for child in children)
    raise ProfileError(root, f"ambiguous profile: {len(children)} subfolders hold one ({names})")


def _find_source(profile_dir: Path, subdir: str, json_name: str) -> Path:
    """NPZ in the subfolder (Dynamo's first choice), else the JSON twin at the top (Dynamo's ConfigMap
    mount), else the JSON twin in the subfolder."""
    candidates = (profile_dir / subdir / NPZ_NAME, profile_dir / json_name, profile_dir / subdir / json_name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ProfileError(candidates[0], f"missing file (no JSON twin at {candidates[1]} or {candidates[2]} either)")


# A real profile is kilobytes (tens of points per array); this bounds what a corrupt or hostile file can make the
# loader hold in memory: the file on disk and, for an NPZ (a zip), its arrays once decompressed.
MAX_PROFILE_BYTES = 64 * 1024 * 1024


def _check_size(path: Path) -> None:
    """Refuse a profile file (or its decompressed NPZ members) over `MAX_PROFILE_BYTES`, before reading it."""
    try:
        size = path.stat().st_size
        if path.suffix == ".npz" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                size = max(size, sum(member.file_size for member in archive.infolist()))
    except (OSError, zipfile.BadZipFile) as exc:
        raise ProfileError(path, f"unreadable ({type(exc).__name__}: {exc})") from exc
    if size > MAX_PROFILE_BYTES:
        raise ProfileError(path, f"{size} bytes (decompressed), more than the {MAX_PROFILE_BYTES} a profile may hold")


def _read_arrays(path: Path) -> Mapping[str, Any]:
    """Every array of an NPZ file, or every key of a JSON object."""
    _check_size(path)
    if path.suffix == ".npz":
        try:
            loaded = np.load(path, allow_pickle=False)
            if not isinstance(loaded, Mapping):  # a bare .npy array saved under an .npz name
                raise ValueError("not an NPZ archive")
            with loaded as npz:
                return {name: npz[name] for name in npz.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ProfileError(path, f"unreadable NPZ ({type(exc).__name__}: {exc})") from exc
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ProfileError(path, f"unreadable JSON ({type(exc).__name__}: {' '.join(str(exc).split())})") from exc
    if not isinstance(data, dict):
        raise ProfileError(path, f"bad JSON: expected an object of arrays, got {type(data).__name__}")
    return data


def load_profile(
    profile_dir: str | os.PathLike[str], *, decode_grid_resolution: int = DEFAULT_GRID_RESOLUTION
) -> EngineProfile:
    """Load and validate a Dynamo pre-deployment profile and build its interpolators.

    Layouts accepted (per phase, first found wins):
    `<dir>/selected_prefill_interpolation/raw_data.npz`, then `<dir>/prefill_raw_data.json` (where Dynamo
    mounts its ConfigMap), then `<dir>/selected_prefill_interpolation/prefill_raw_data.json`; likewise
    `selected_decode_interpolation/raw_data.npz` / `decode_raw_data.json`. `profile_dir` may also be a folder
    whose single profile sits one level down (e.g. `dynamo-planner-test-profile/` holding `H200_TP1P_TP1D/`);
    with several such subfolders it is ambiguous and rejected.

    Args:
        profile_dir: the profile directory, or its parent as above.
        decode_grid_resolution: cells per decode grid axis (Dynamo: 100).

    Returns:
        The validated profile with interpolators built.

    Raises:
        ProfileError: one line naming the file and the missing/bad array (missing directory or file,
            unreadable file, missing key, wrong shape, length mismatch, non-finite or out-of-range value).
    """
    directory = _resolve_profile_dir(Path(profile_dir))
    prefill_path = _find_source(directory, PREFILL_SUBDIR, PREFILL_JSON_NAME)
    decode_path = _find_source(directory, DECODE_SUBDIR, DECODE_JSON_NAME)
    prefill = PrefillProfile.from_mapping(_read_arrays(prefill_path), source_file=str(prefill_path))
    decode = DecodeProfile.from_mapping(_read_arrays(decode_path), source_file=str(decode_path))
    return EngineProfile(
        prefill=prefill,
        decode=decode,
        source_dir=str(directory),
        decode_grid_resolution=decode_grid_resolution,
    )
