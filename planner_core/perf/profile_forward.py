"""Forward-pass models from the pre-deployment profile: bootstrap FPMs and a profile-backed `ForwardPassModel`.

Role in the planner: before any engine has reported a forward pass, the profile is the only perf data. Two ways
to use it, both built from the same NPZ/JSON profile (`planner_core.perf.profile.load_profile`):

- `bootstrap_fpms(profile)`: the profile as forward-pass metrics, converted as Dynamo 1.6.1 does, to warm-start
  the online regressions (`planner_core.perf.online.observe_fpm`): the bootstrap chain profile -> FPMs -> live
  FPMs. Prefill: one iteration computing one request of ISL tokens, wall time = TTFT. Decode: KV tokens
  `kv = round(kv_usage * max_kv_tokens)`, batch `round(kv / context_length)`, wall time = ITL.
- `ProfileForwardPassModel`: answers the `ForwardPassModel` question by interpolating the profile itself, and
  reproduces every profiled point exactly (`planner_core.lab.perf_accuracy` measures how well it predicts points
  it did not see):
  - prefill iteration of `t` tokens: the TTFT spline over ISL (Dynamo 0.x's cubic interpolation, the same
    spline as `PrefillInterpolator`); below the smallest profiled ISL the smallest ISL's TTFT (the iteration's
    fixed cost dominates), above the largest a straight continuation of the last segment;
  - decode iteration of `n` requests holding `kv` tokens: a least-squares plane `a + b*n + c*kv` through the
    profile's points (negative slopes clipped to 0) plus the plane's residuals interpolated linearly over the
    triangulated samples in (kv usage, context length) — exact at the samples, piecewise linear between them,
    the plane alone outside the sampled region (so ITL keeps growing with load instead of staying flat);
  - mixed iteration (aggregated engines): the disaggregated profile never measured one, so it is estimated as
    the decode iteration plus the prefill chunk's compute. A profiled TTFT holds a per-request cost besides
    compute (on the H200 profile ~17.7 ms: TTFT of 100 tokens is 19.5 ms, of 1117 tokens 38.5 ms), so the
    chunk's compute is its TTFT minus that cost, the intercept of the line through the two smallest profiled
    ISLs (clamped to [0, smallest TTFT]); below the smallest ISL, that line's slope times the tokens.

Pure: no I/O (profiles are loaded by `load_profile`); SciPy is imported by the constructor only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from planner_core.domain import Component, ForwardPassMetrics, ScheduledRequests
from planner_core.perf.online import MIN_WALL_S
from planner_core.perf.profile import DecodeProfile, EngineProfile, PrefillInterpolator, PrefillProfile

__all__ = ["BOOTSTRAP_WORKER_ID", "ProfileForwardPassModel", "bootstrap_fpms"]

BOOTSTRAP_WORKER_ID = "profile"  # worker id of the FPMs made from the profile (no engine has this id)


def bootstrap_fpms(profile: EngineProfile) -> tuple[ForwardPassMetrics, ...]:
    """The profile as forward-pass metrics (Dynamo 1.6.1's conversion): prefill rows first (by ISL), then decode
    rows in file order. `counter_id` numbers them from 0; `worker_id` is `BOOTSTRAP_WORKER_ID`."""
    fpms: list[ForwardPassMetrics] = []
    prefill = profile.prefill
    for isl, ttft_ms in sorted(zip(prefill.isl.tolist(), prefill.ttft_ms.tolist(), strict=True)):
        tokens = round(isl)
        fpms.append(
            ForwardPassMetrics(
                component=Component.PREFILL,
                worker_id=BOOTSTRAP_WORKER_ID,
                counter_id=len(fpms),
                wall_time_s=ttft_ms / 1000.0,
                scheduled=ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=tokens),
            )
        )
    decode = profile.decode
    for kv_usage, context, itl_ms in zip(
        decode.kv_usage.tolist(), decode.context_length.tolist(), decode.itl_ms.tolist(), strict=True
    ):
        kv_tokens = round(kv_usage * decode.max_kv_tokens)
        fpms.append(
            ForwardPassMetrics(
                component=Component.DECODE,
                worker_id=BOOTSTRAP_WORKER_ID,
                counter_id=len(fpms),
                wall_time_s=itl_ms / 1000.0,
                scheduled=ScheduledRequests(
                    num_decode_requests=round(kv_tokens / context), sum_decode_kv_tokens=kv_tokens
                ),
            )
        )
    return tuple(fpms)


def _plane(batch: np.ndarray, kv_tokens: np.ndarray, wall_s: np.ndarray) -> tuple[float, float, float]:
    """Least-squares `wall = a + b*batch + c*kv` with negative slopes clipped to 0 and `a` refitted."""
    x = np.column_stack([batch, kv_tokens])
    x_mean = x.mean(axis=0)
    slopes = np.linalg.lstsq(x - x_mean, wall_s - wall_s.mean(), rcond=None)[0]
    slopes = np.maximum(slopes, 0.0)
    intercept = float(np.mean(wall_s - x @ slopes))
    return intercept, float(slopes[0]), float(slopes[1])


class _TriangleInterpolator:
    """Linear interpolation over a Delaunay triangulation, 0 outside it: the values of SciPy's
    `LinearNDInterpolator(..., fill_value=0)` on the same triangulation, at a few microseconds a scalar query
    (the simulator asks once per decode segment). Each triangle's linear function is precomputed; a uniform
    grid of cells lists the triangles overlapping each cell, so a query tests one to a few triangles.
    """

    __slots__ = ("_cells", "_cell_w", "_cell_h", "_grid", "_triangles", "_x0", "_x1", "_y0", "_y1")

    _EPS = 1e-12  # barycentric slack, so points on an edge belong to a triangle

    def __init__(self, tri: Any, values: np.ndarray) -> None:
        points = tri.points
        self._x0, self._y0 = (float(v) for v in points.min(axis=0))
        self._x1, self._y1 = (float(v) for v in points.max(axis=0))
        self._grid = max(1, 3 * int(math.sqrt(len(tri.simplices))))
        self._cell_w = max((self._x1 - self._x0) / self._grid, 1e-300)
        self._cell_h = max((self._y1 - self._y0) / self._grid, 1e-300)
        triangles = []
        cells: list[list[int]] = [[] for _ in range(self._grid * self._grid)]
        for index, simplex in enumerate(tri.simplices):
            (xa, ya), (xb, yb), (xc, yc) = (points[v] for v in simplex)
            va, vb, vc = (float(values[v]) for v in simplex)
            det = (xb - xa) * (yc - ya) - (xc - xa) * (yb - ya)
            # barycentric weights of b and c as linear functions of (x, y), and the value's gradient
            triangles.append(
                (
                    float(xa),
                    float(ya),
                    float((yc - ya) / det),
                    float(-(xc - xa) / det),
                    float(-(yb - ya) / det),
                    float((xb - xa) / det),
                    va,
                    vb - va,
                    vc - va,
                )
            )
            i0, j0 = self._cell(min(xa, xb, xc), min(ya, yb, yc))
            i1, j1 = self._cell(max(xa, xb, xc), max(ya, yb, yc))
            for i in range(i0, i1 + 1):
                for j in range(j0, j1 + 1):
                    cells[i * self._grid + j].append(index)
        self._triangles = triangles
        self._cells = [tuple(cell) for cell in cells]

    def _cell(self, x: float, y: float) -> tuple[int, int]:
        i = min(self._grid - 1, max(0, int((x - self._x0) / self._cell_w)))
        j = min(self._grid - 1, max(0, int((y - self._y0) / self._cell_h)))
        return i, j

    def __call__(self, x: float, y: float) -> float:
        eps = self._EPS
        if not (self._x0 - eps <= x <= self._x1 + eps and self._y0 - eps <= y <= self._y1 + eps):
            return 0.0
        i, j = self._cell(x, y)
        for index in self._cells[i * self._grid + j]:
            xa, ya, bx, by, cx, cy, va, db, dc = self._triangles[index]
            dx, dy = x - xa, y - ya
            weight_b = bx * dx + by * dy
            weight_c = cx * dx + cy * dy
            if weight_b >= -eps and weight_c >= -eps and weight_b + weight_c <= 1.0 + eps:
                return va + weight_b * db + weight_c * dc
        return 0.0


class ProfileForwardPassModel:
    """`ForwardPassModel` interpolating a pre-deployment profile (see the module docstring). Always ready.

    Immutable after construction; queries cost a few microseconds (decode: one point location in the
    triangulation). Wall times are floored at `MIN_WALL_S`.

    Attributes:
        prefill: the prefill samples it was built from.
        decode: the decode samples it was built from.
        decode_plane: `(a, b, c)` of the decode plane `a + b*n + c*kv` (s, s/request, s/token).
        prefill_overhead_s: the per-request part of a profiled TTFT, left out of a mixed iteration's prefill.
    """

    __slots__ = (
        "_context_scale",
        "_prefill_interp",
        "_prefill_head_slope_s",
        "_prefill_max_isl",
        "_prefill_min_isl",
        "_prefill_tail_slope_s",
        "_residual",
        "decode",
        "decode_plane",
        "prefill",
        "prefill_overhead_s",
    )

    def __init__(self, prefill: PrefillProfile, decode: DecodeProfile) -> None:
        self.prefill = prefill
        self.decode = decode
        self._prefill_interp = PrefillInterpolator(prefill)
        order = np.argsort(prefill.isl, kind="stable")
        isl, ttft_s = prefill.isl[order], prefill.ttft_ms[order] / 1000.0
        self._prefill_min_isl = float(isl[0])
        self._prefill_max_isl = float(isl[-1])
        # Continuation beyond the largest ISL: the last segment's slope, never decreasing.
        self._prefill_tail_slope_s = (
            max(0.0, float((ttft_s[-1] - ttft_s[-2]) / (isl[-1] - isl[-2]))) if isl.size > 1 else 0.0
        )
        # Mixed iterations: the first segment's line splits a TTFT into per-request cost + per-token compute.
        if isl.size > 1:
            self._prefill_head_slope_s = max(0.0, float((ttft_s[1] - ttft_s[0]) / (isl[1] - isl[0])))
        else:
            self._prefill_head_slope_s = float(ttft_s[0] / isl[0])
        self.prefill_overhead_s = min(
            float(ttft_s[0]), max(0.0, float(ttft_s[0]) - self._prefill_head_slope_s * isl[0])
        )

        kv_tokens = decode.kv_usage * decode.max_kv_tokens
        batch = kv_tokens / decode.context_length
        wall_s = decode.itl_ms / 1000.0
        self.decode_plane = _plane(batch, kv_tokens, wall_s)
        a, b, c = self.decode_plane
        residual = wall_s - (a + b * batch + c * kv_tokens)
        self._context_scale = float(decode.context_length.max())
        self._residual = self._residual_interpolator(decode.kv_usage, decode.context_length, residual)

    def _residual_interpolator(self, kv_usage: np.ndarray, context: np.ndarray, residual: np.ndarray) -> Any:
        """Piecewise-linear residual over the triangulated samples; None when they cannot be triangulated
        (fewer than 3 samples, or all on one line): the plane alone is used then."""
        from scipy.spatial import Delaunay, QhullError

        if kv_usage.size < 3:
            return None
        points = np.column_stack([kv_usage, context / self._context_scale])
        try:
            return _TriangleInterpolator(Delaunay(points), residual)
        except QhullError:
            return None

    @classmethod
    def from_engine_profile(cls, profile: EngineProfile) -> ProfileForwardPassModel:
        return cls(profile.prefill, profile.decode)

    @property
    def max_kv_tokens(self) -> int:
        """KV-cache capacity of the profiled engine (tokens)."""
        return self.decode.max_kv_tokens

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        tokens = max(0.0, float(prefill_tokens))
        if tokens > self._prefill_max_isl:
            edge_s = self._prefill_interp.ttft_ms(self._prefill_max_isl) / 1000.0
            return max(MIN_WALL_S, edge_s + self._prefill_tail_slope_s * (tokens - self._prefill_max_isl))
        return max(MIN_WALL_S, self._prefill_interp.ttft_ms(tokens) / 1000.0)

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        requests = max(0.0, float(num_decode_requests))
        kv_tokens = max(0.0, float(decode_kv_tokens))
        a, b, c = self.decode_plane
        wall = a + b * requests + c * kv_tokens
        if self._residual is not None and requests > 0 and kv_tokens > 0:
            kv_usage = kv_tokens / self.decode.max_kv_tokens
            context = kv_tokens / requests / self._context_scale
            correction = float(self._residual(kv_usage, context))
            if math.isfinite(correction):
                wall += correction
        return max(MIN_WALL_S, wall)

    def prefill_compute_s(self, prefill_tokens: float) -> float:
        """The compute part of a prefill of `prefill_tokens` tokens, without the per-request cost of a TTFT."""
        tokens = max(0.0, float(prefill_tokens))
        if tokens <= self._prefill_min_isl:
            return self._prefill_head_slope_s * tokens
        return max(0.0, self.prefill_wall_s(tokens) - self.prefill_overhead_s)

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        if num_decode_requests <= 0 and decode_kv_tokens <= 0:
            return self.prefill_wall_s(prefill_tokens)
        decode_s = self.decode_wall_s(num_decode_requests, decode_kv_tokens)
        return decode_s + self.prefill_compute_s(prefill_tokens)
