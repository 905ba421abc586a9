"""The capacity interpolators built from a profile (Dynamo 0.x `planner/utils/perf_interpolation.py`):
`PrefillInterpolator` (a 1-D not-a-knot cubic spline over ISL) and `DecodeInterpolator` (`griddata` cubic over
(kv_usage, context_length) on a grid, with `find_best_throughput_per_gpu`). See `planner_core.perf.profile` for
where they depart from Dynamo.

Pure. SciPy is imported inside the constructors that need it, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from planner_core.perf.profile_data import (
    DEFAULT_GRID_RESOLUTION,
    DecodeProfile,
    FloatArray,
    PrefillProfile,
    ProfileError,
)


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
