"""How well the perf models reproduce and predict a pre-deployment profile (figures for `planner perf-accuracy`).

Role: evidence for choosing between the planner's forward-pass models. Measured on a loaded `EngineProfile`:

- leave-one-out error of the profile-backed model (`ProfileForwardPassModel`): each profiled point is left out,
  the model rebuilt from the others, and the left-out TTFT (prefill, over ISL) or ITL (decode, over kv usage and
  context length) predicted. Points on the edge of the sampled region must be extrapolated, so the figures are
  given for all points and for interior points only (strictly inside the ISL range / the samples' convex hull);
  the same for Dynamo 0.x's decode grid (`DecodeInterpolator`) for comparison;
- in-sample error: the profile-backed model rebuilt on all points must reproduce them (0 up to rounding), while
  Dynamo 0.x's decode grid snaps queries to a 100 x 100 grid and does not;
- the online regressions warm-started on the profile's bootstrap FPMs (`bootstrap_fpms`): how far the straight
  lines/planes are from the profile points they were fitted on;
- engine capacity at one request shape from Dynamo 0.x's interpolation (`estimate_engine_capacity`), the capacity
  search on the profile-backed model, and on the bootstrapped online regressions.

Relative error = |predicted - measured| / measured. Pure: takes a loaded profile, returns values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner_core.config import PlannerMode, parse_config
from planner_core.domain import EngineLimits, OnlinePerfState
from planner_core.perf.capacity import decode_capacity, prefill_capacity
from planner_core.perf.online import OnlineForwardPassModel, observe_fpm
from planner_core.perf.profile import (
    DecodeInterpolator,
    DecodeProfile,
    EngineProfile,
    PrefillProfile,
    estimate_engine_capacity,
)
from planner_core.perf.profile_forward import ProfileForwardPassModel, bootstrap_fpms

__all__ = [
    "AccuracyReport",
    "CapacityRow",
    "ErrorSummary",
    "accuracy_report",
    "capacity_comparison",
    "decode_hull_interior",
    "format_report",
    "holdout_model",
    "summarize",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorSummary:
    """Relative errors of one model on one set of points.

    Attributes:
        name: what was measured.
        num_points: points compared.
        median_rel_error, worst_rel_error: over those points (0.05 = 5 %).
        worst_at: where the worst error occurs.
    """

    name: str
    num_points: int
    median_rel_error: float
    worst_rel_error: float
    worst_at: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityRow:
    """One model's engine capacity for one role at one request shape."""

    model: str
    role: str
    tokens_per_s_per_gpu: float
    latency_ms: float
    batch_or_kv: str  # the operating point: batch size, or kv usage for Dynamo 0.x's decode grid
    sla_met: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class AccuracyReport:
    """Everything `planner perf-accuracy` prints."""

    source: str
    errors: tuple[ErrorSummary, ...]
    capacity_shape: str
    capacity: tuple[CapacityRow, ...]


def summarize(name: str, predicted: Sequence[float], measured: Sequence[float], labels: Sequence[str]) -> ErrorSummary:
    """Median and worst relative error of `predicted` against `measured` (same length, measured > 0)."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    worst = int(np.argmax(errors))
    return ErrorSummary(
        name=name,
        num_points=len(errors),
        median_rel_error=float(np.median(errors)),
        worst_rel_error=float(errors[worst]),
        worst_at=labels[worst],
    )


def _subset(mask: np.ndarray, values: Sequence[float]) -> list[float]:
    return [v for v, keep in zip(values, mask, strict=True) if keep]


def _select(
    summary_name: str, mask: np.ndarray, predicted: list[float], measured: list[float], labels: list[str]
) -> ErrorSummary:
    return summarize(summary_name, _subset(mask, predicted), _subset(mask, measured), _subset(mask, labels))


def _decode_points(decode: DecodeProfile) -> tuple[np.ndarray, np.ndarray, list[float], list[str]]:
    kv_tokens = decode.kv_usage * decode.max_kv_tokens
    batch = kv_tokens / decode.context_length
    labels = [
        f"context {c:g}, kv usage {u:.4f} (batch {b:.0f})"
        for c, u, b in zip(decode.context_length, decode.kv_usage, batch, strict=True)
    ]
    return batch, kv_tokens, [float(v) for v in decode.itl_ms], labels


def decode_hull_interior(decode: DecodeProfile) -> np.ndarray:
    """Mask of the decode samples strictly inside the convex hull of (kv usage, context / max context)."""
    from scipy.spatial import ConvexHull

    points = np.column_stack([decode.kv_usage, decode.context_length / decode.context_length.max()])
    interior = np.ones(len(points), dtype=bool)
    # Vertices and samples lying on a hull edge (e.g. every batch-1 sample) are on the boundary.
    for a, b, c in ConvexHull(points).equations:
        interior &= np.abs(a * points[:, 0] + b * points[:, 1] + c) > 1e-9
    return interior


def holdout_model(
    profile: EngineProfile,
    *,
    prefill_isl: Sequence[float] = (),
    decode_points: Sequence[tuple[float, float]] = (),
) -> ProfileForwardPassModel:
    """The profile-backed model built without some of the profile's points, to check predictions against them.

    Args:
        profile: the full profile.
        prefill_isl: ISLs of the prefill rows to leave out.
        decode_points: `(context length, batch)` of the decode rows to leave out, batch being
            `kv usage * max_kv_tokens / context length` (matched within 0.5).

    Raises:
        ValueError: a point that is not in the profile.
    """
    prefill = profile.prefill
    keep_prefill = np.ones(prefill.isl.size, dtype=bool)
    for isl in prefill_isl:
        match = np.flatnonzero(prefill.isl == isl)
        if match.size == 0:
            raise ValueError(f"{prefill.source_file}: no prefill point at ISL {isl:g}")
        keep_prefill[match] = False
    decode = profile.decode
    batch = decode.kv_usage * decode.max_kv_tokens / decode.context_length
    keep_decode = np.ones(decode.kv_usage.size, dtype=bool)
    for context, size in decode_points:
        match = np.flatnonzero((decode.context_length == context) & (np.abs(batch - size) <= 0.5))
        if match.size == 0:
            raise ValueError(f"{decode.source_file}: no decode point at context {context:g}, batch {size:g}")
        keep_decode[match] = False
    kept_prefill = PrefillProfile(
        isl=prefill.isl[keep_prefill],
        ttft_ms=prefill.ttft_ms[keep_prefill],
        thpt_per_gpu=prefill.thpt_per_gpu[keep_prefill],
        source_file=prefill.source_file,
    )
    kept_decode = DecodeProfile(
        **{name: values[keep_decode] for name, values in _decode_arrays(decode).items()},
        max_kv_tokens=decode.max_kv_tokens,
        source_file=decode.source_file,
    )
    return ProfileForwardPassModel(kept_prefill, kept_decode)


def _drop(profile_arrays: dict[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    return {key: np.delete(value, index) for key, value in profile_arrays.items()}


def _loo_prefill(profile: EngineProfile) -> tuple[list[float], list[float], list[str]]:
    prefill = profile.prefill
    order = np.argsort(prefill.isl, kind="stable")
    arrays = {"isl": prefill.isl[order], "ttft_ms": prefill.ttft_ms[order], "thpt_per_gpu": prefill.thpt_per_gpu[order]}
    predicted, measured, labels = [], [], []
    for index in range(arrays["isl"].size):
        kept = _drop(arrays, index)
        model = ProfileForwardPassModel(PrefillProfile(**kept), profile.decode)
        predicted.append(model.prefill_wall_s(float(arrays["isl"][index])) * 1000.0)
        measured.append(float(arrays["ttft_ms"][index]))
        labels.append(f"ISL {arrays['isl'][index]:g}")
    return predicted, measured, labels


def _decode_arrays(decode: DecodeProfile) -> dict[str, np.ndarray]:
    return {
        "kv_usage": decode.kv_usage,
        "context_length": decode.context_length,
        "itl_ms": decode.itl_ms,
        "thpt_per_gpu": decode.thpt_per_gpu,
    }


def _loo_decode(
    profile: EngineProfile, predict_with: Callable[[DecodeProfile, float, float, float, float], float]
) -> list[float]:
    decode = profile.decode
    arrays = _decode_arrays(decode)
    batch, kv_tokens, _, _ = _decode_points(decode)
    predicted = []
    for index in range(decode.itl_ms.size):
        kept = DecodeProfile(**_drop(arrays, index), max_kv_tokens=decode.max_kv_tokens)
        predicted.append(
            predict_with(
                kept,
                float(batch[index]),
                float(kv_tokens[index]),
                float(decode.kv_usage[index]),
                float(decode.context_length[index]),
            )
        )
    return predicted


def _profile_model_itl_ms(prefill: PrefillProfile) -> Callable[[DecodeProfile, float, float, float, float], float]:
    def predict(decode: DecodeProfile, batch: float, kv_tokens: float, _usage: float, _context: float) -> float:
        return ProfileForwardPassModel(prefill, decode).decode_wall_s(batch, kv_tokens) * 1000.0

    return predict


def _grid_itl_ms(decode: DecodeProfile, batch: float, _kv: float, _usage: float, context: float) -> float:
    return DecodeInterpolator(decode).itl_ms(batch, context)


def _online_states(profile: EngineProfile) -> tuple[OnlinePerfState, OnlinePerfState]:
    """Online models warm-started on the bootstrap FPMs, disaggregated and aggregated, keeping every point."""
    fpms = bootstrap_fpms(profile)
    options = {"max_num_fpm_samples": max(64, len(fpms)), "optimization_target": "sla"}
    disagg = observe_fpm(OnlinePerfState(), fpms, parse_config(options).policy)
    agg = observe_fpm(OnlinePerfState(), fpms, parse_config({**options, "mode": PlannerMode.AGG.value}).policy)
    return disagg, agg


def accuracy_report(
    profile: EngineProfile,
    *,
    isl: float = 3000,
    osl: float = 300,
    ttft_ms: float = 200,
    itl_ms: float = 10,
    include_grid_loo: bool = True,
) -> AccuracyReport:
    """All figures for one profile (see the module docstring); capacity at `isl`/`osl` under `ttft_ms`/`itl_ms`.

    `include_grid_loo=False` skips Dynamo 0.x's decode-grid leave-one-out (it rebuilds a cubic grid per point).
    """
    errors = [*_loo_errors(profile, include_grid_loo), *_in_sample_errors(profile)]
    disagg, agg = _online_states(profile)
    errors += _online_errors(profile, disagg, agg)
    shape = f"ISL {isl:g} / OSL {osl:g} under TTFT {ttft_ms:g} ms / ITL {itl_ms:g} ms"
    rows = capacity_comparison(profile, isl=isl, osl=osl, ttft_ms=ttft_ms, itl_ms=itl_ms, online=disagg)
    return AccuracyReport(source=profile.source_dir, errors=tuple(errors), capacity_shape=shape, capacity=rows)


def _loo_errors(profile: EngineProfile, include_grid_loo: bool) -> list[ErrorSummary]:
    """Leave-one-out errors: the profile model's prefill TTFT and decode ITL, and Dynamo 0.x's decode grid."""
    errors: list[ErrorSummary] = []
    prefill = profile.prefill

    predicted, measured, labels = _loo_prefill(profile)
    errors.append(summarize("prefill TTFT, profile model, leave-one-out, all ISLs", predicted, measured, labels))
    inner = np.array([0 < i < len(measured) - 1 for i in range(len(measured))])
    errors.append(
        _select("prefill TTFT, profile model, leave-one-out, interior ISLs", inner, predicted, measured, labels)
    )

    batch, kv_tokens, itl_measured, decode_labels = _decode_points(profile.decode)
    interior = decode_hull_interior(profile.decode)
    loo = _loo_decode(profile, _profile_model_itl_ms(prefill))
    errors.append(summarize("decode ITL, profile model, leave-one-out, all points", loo, itl_measured, decode_labels))
    errors.append(
        _select("decode ITL, profile model, leave-one-out, interior points", interior, loo, itl_measured, decode_labels)
    )
    if include_grid_loo:
        grid_loo = _loo_decode(profile, _grid_itl_ms)
        errors.append(
            summarize("decode ITL, Dynamo 0.x grid, leave-one-out, all points", grid_loo, itl_measured, decode_labels)
        )
        errors.append(
            _select(
                "decode ITL, Dynamo 0.x grid, leave-one-out, interior points",
                interior,
                grid_loo,
                itl_measured,
                decode_labels,
            )
        )
    return errors


def _in_sample_errors(profile: EngineProfile) -> list[ErrorSummary]:
    """In-sample errors: the profile model's prefill TTFT and decode ITL, and Dynamo 0.x's decode grid."""
    errors: list[ErrorSummary] = []
    prefill = profile.prefill
    batch, kv_tokens, itl_measured, decode_labels = _decode_points(profile.decode)
    model = ProfileForwardPassModel.from_engine_profile(profile)
    isl_values = [float(v) for v in prefill.isl]
    ttft_measured = [float(v) for v in prefill.ttft_ms]
    isl_labels = [f"ISL {v:g}" for v in isl_values]
    errors.append(
        summarize(
            "prefill TTFT, profile model, in sample",
            [model.prefill_wall_s(v) * 1000.0 for v in isl_values],
            ttft_measured,
            isl_labels,
        )
    )
    errors.append(
        summarize(
            "decode ITL, profile model, in sample",
            [model.decode_wall_s(b, k) * 1000.0 for b, k in zip(batch, kv_tokens, strict=True)],
            itl_measured,
            decode_labels,
        )
    )
    grid = profile.decode_interpolator
    errors.append(
        summarize(
            "decode ITL, Dynamo 0.x grid, in sample",
            [grid.itl_ms(b, c) for b, c in zip(batch, profile.decode.context_length, strict=True)],
            itl_measured,
            decode_labels,
        )
    )
    return errors


def _online_errors(profile: EngineProfile, disagg: OnlinePerfState, agg: OnlinePerfState) -> list[ErrorSummary]:
    """Errors of the online regressions fitted on the bootstrap forward-pass metrics (the ready ones)."""
    errors: list[ErrorSummary] = []
    isl_values = [float(v) for v in profile.prefill.isl]
    ttft_measured = [float(v) for v in profile.prefill.ttft_ms]
    isl_labels = [f"ISL {v:g}" for v in isl_values]
    batch, kv_tokens, itl_measured, decode_labels = _decode_points(profile.decode)
    online_prefill = OnlineForwardPassModel(disagg.prefill)
    online_decode = OnlineForwardPassModel(disagg.decode)
    online_agg = OnlineForwardPassModel(agg.agg)
    fits = (
        ("prefill TTFT, online regression on bootstrap FPMs", online_prefill, "prefill"),
        ("decode ITL, online regression on bootstrap FPMs", online_decode, "decode"),
        ("prefill TTFT, online agg regression on bootstrap FPMs", online_agg, "prefill"),
        ("decode ITL, online agg regression on bootstrap FPMs", online_agg, "decode"),
    )
    for name, online, role in fits:
        if not online.is_ready():
            continue
        if role == "prefill":
            predicted = [online.prefill_wall_s(v) * 1000.0 for v in isl_values]
            errors.append(summarize(name, predicted, ttft_measured, isl_labels))
        else:
            predicted = [online.decode_wall_s(b, k) * 1000.0 for b, k in zip(batch, kv_tokens, strict=True)]
            errors.append(summarize(name, predicted, itl_measured, decode_labels))
    return errors


def capacity_comparison(
    profile: EngineProfile,
    *,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    online: OnlinePerfState | None = None,
    limits: EngineLimits | None = None,
) -> tuple[CapacityRow, ...]:
    """Prefill and decode capacity per GPU from Dynamo 0.x's interpolation and from the capacity search on the
    profile-backed model and (if given, else bootstrapped here) the online regressions.

    `limits` defaults to Dynamo's fallbacks with the profile's `max_kv_tokens`.
    """
    if online is None:
        online = _online_states(profile)[0]
    limits = limits or EngineLimits(max_kv_tokens=profile.decode.max_kv_tokens)
    legacy = estimate_engine_capacity(profile, isl=isl, osl=osl, ttft_ms=ttft_ms, itl_ms=itl_ms)
    rows = [
        CapacityRow(
            model="Dynamo 0.x interpolation",
            role="prefill",
            tokens_per_s_per_gpu=legacy.prefill_tokens_per_s_per_gpu,
            latency_ms=legacy.prefill_ttft_ms,
            batch_or_kv="batch 1",
            sla_met=legacy.prefill_sla_met,
        ),
        CapacityRow(
            model="Dynamo 0.x interpolation",
            role="decode",
            tokens_per_s_per_gpu=legacy.decode_tokens_per_s_per_gpu,
            latency_ms=legacy.decode_itl_ms,
            batch_or_kv=(
                f"kv usage {legacy.decode_kv_usage:.3f} "
                f"(batch {legacy.decode_kv_usage * profile.decode.max_kv_tokens / (isl + osl / 2):.1f})"
            ),
            sla_met=legacy.decode_sla_met,
        ),
    ]
    models = (
        ("capacity search, profile model", ProfileForwardPassModel.from_engine_profile(profile)),
        ("capacity search, online prefill model", OnlineForwardPassModel(online.prefill)),
        ("capacity search, online decode model", OnlineForwardPassModel(online.decode)),
    )
    for name, model in models:
        if name.endswith("decode model"):
            capacities = [decode_capacity(model, limits, isl=isl, osl=osl, itl_ms=itl_ms)]
        elif name.endswith("prefill model"):
            capacities = [prefill_capacity(model, limits, isl=isl, ttft_ms=ttft_ms)]
        else:
            capacities = [
                prefill_capacity(model, limits, isl=isl, ttft_ms=ttft_ms),
                decode_capacity(model, limits, isl=isl, osl=osl, itl_ms=itl_ms),
            ]
        for capacity in capacities:
            if not capacity.usable:
                continue
            rows.append(
                CapacityRow(
                    model=name,
                    role=capacity.role.value,
                    tokens_per_s_per_gpu=capacity.tokens_per_s_per_gpu,
                    latency_ms=capacity.latency_ms,
                    batch_or_kv=f"batch {capacity.batch_size}",
                    sla_met=capacity.sla_met,
                )
            )
    return tuple(rows)


def _percent(value: float) -> str:
    return f"{value * 100:.1f} %" if math.isfinite(value) else str(value)


def format_report(report: AccuracyReport) -> list[str]:
    """The report as aligned text lines."""
    width = max(len(e.name) for e in report.errors)
    lines = [f"profile: {report.source}", "", f"{'relative error':<{width}}  points   median    worst  (worst at)"]
    for e in report.errors:
        lines.append(
            f"{e.name:<{width}}  {e.num_points:>6}  {_percent(e.median_rel_error):>7}  "
            f"{_percent(e.worst_rel_error):>7}  ({e.worst_at})"
        )
    lines += ["", f"engine capacity at {report.capacity_shape}"]
    model_width = max(len(r.model) for r in report.capacity)
    for r in report.capacity:
        lines.append(
            f"{r.model:<{model_width}}  {r.role:<7}  {r.tokens_per_s_per_gpu:>8.0f} tokens/s/GPU  "
            f"{r.latency_ms:>6.2f} ms  {r.batch_or_kv}{'' if r.sla_met else '  (SLA missed)'}"
        )
    return lines
