"""Online forward-pass perf models: linear regressions of one engine iteration's wall time on its FPM.

Role in the planner: engines report a `ForwardPassMetrics` (FPM) per iteration; the planner keeps, per engine role,
a bounded set of those observations and an ordinary least-squares fit of the iteration's wall time on them. The
fit answers the `ForwardPassModel` question (how long does one iteration of this batch take), from which the
capacity search (`planner_core.perf.capacity`) and the load loop's TTFT/ITL estimates are computed.

Models (intercept `a`, slopes fitted by OLS with intercept, sklearn's `LinearRegression` solution):

- prefill: `wall = a + b * sum_prefill_tokens`
- decode: `wall = a + b * num_decode_requests + c * sum_decode_kv_tokens`
- agg: `wall = a + b * sum_prefill_tokens + c * sum_decode_kv_tokens`

Retention keeps coverage of the load range (Dynamo's bucketed retirement): each feature axis is cut into equal
buckets between the smallest and largest value ever accepted (`fpm_sample_bucket_size` buckets for a 1-D model,
its square root per axis for 2-D); when more than `max_num_fpm_samples` samples are held, the oldest sample of the
fullest bucket is dropped (ties: the bucket whose oldest sample is oldest). A long stream at one load therefore
cannot push out the few samples taken at another. Bucket membership is recomputed whenever the bounds move.
Idle heartbeats (wall time 0) are skipped, as are observations with a non-finite number. The load loop passes only
the samples of engines at work (`serving_samples`, ours): none from an engine starting or draining.

Readiness: at least `load_min_observations` samples, some spread on every feature (else the slope is not
identified: ours, Dynamo would fit a flat line), and no negative slope (more load would take less time). The one
exception, as in Dynamo: the decode slope on `num_decode_requests` competes with the KV slope (both grow with the
batch), so a slightly negative value (> -1e-6 s per request) is clipped to 0 instead of rejecting the fit. The
intercept may be negative (Dynamo does not check it); predictions are floored at 1e-6 s, Dynamo's floor.

Moving averages Dynamo keeps for the load loop's "next request" (mean ISL, mean KV tokens per decode request,
mean decode batch) are kept over the last `max_num_fpm_samples` iterations, idle heartbeats included, leading
zeros skipped. The ISL is prompt tokens per prefill request of one iteration (a chunk of a long prompt counts as
the chunk), an iteration without prefill requests counting 0; the decode context counts only iterations with
decode requests.

Everything is a value: `observe_fpm(state, fpms, config)` returns a new `OnlinePerfState` (stored with every tick
in `PlannerState.perf_models`); `OnlineForwardPassModel(state)` only reads one role's `OnlineModelState`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from planner_core.config import PlannerConfig, PlannerMode
from planner_core.domain import (
    Component,
    EngineLifecycle,
    ForwardPassMetrics,
    FpmSample,
    ModelReadiness,
    OnlineModelState,
    OnlinePerfState,
    PerfModelRole,
    ReasonCode,
    StepName,
    StepRecord,
    WorkerCounts,
)

__all__ = [
    "DECODE_REQUESTS_CLIP_TOLERANCE_S",
    "FEATURE_NAMES",
    "MIN_WALL_S",
    "OnlineForwardPassModel",
    "PerfModelError",
    "WallTimeFit",
    "features_of",
    "fit_wall_time",
    "observe_fpm",
    "serving_samples",
    "observe_role",
    "readiness_step",
    "role_of",
]

FEATURE_NAMES: dict[PerfModelRole, tuple[str, ...]] = {
    PerfModelRole.PREFILL: ("sum_prefill_tokens",),
    PerfModelRole.DECODE: ("num_decode_requests", "sum_decode_kv_tokens"),
    PerfModelRole.AGG: ("sum_prefill_tokens", "sum_decode_kv_tokens"),
}
MIN_WALL_S = 1e-6  # floor of every prediction (Dynamo's): a fit with a negative intercept never predicts <= 0
DECODE_REQUESTS_CLIP_TOLERANCE_S = 1e-6  # decode slope on num_decode_requests above -this is clipped to 0


class PerfModelError(ValueError):
    """A perf model was asked something it cannot answer: not ready, or a question of another engine role."""


# --------------------------------------------------------------------------------------------------------
# Features and routing
# --------------------------------------------------------------------------------------------------------


def features_of(role: PerfModelRole, fpm: ForwardPassMetrics) -> tuple[float, ...]:
    """The regression inputs of `role` read from one iteration's scheduled batch, in `FEATURE_NAMES` order."""
    scheduled = fpm.scheduled
    if role is PerfModelRole.PREFILL:
        return (float(scheduled.sum_prefill_tokens),)
    if role is PerfModelRole.DECODE:
        return (float(scheduled.num_decode_requests), float(scheduled.sum_decode_kv_tokens))
    return (float(scheduled.sum_prefill_tokens), float(scheduled.sum_decode_kv_tokens))


def role_of(fpm: ForwardPassMetrics, mode: PlannerMode) -> PerfModelRole:
    """Which model an FPM teaches: every FPM teaches the agg model in aggregated mode (so the profile's prefill
    and decode bootstrap FPMs both warm it up); otherwise prefill engines teach prefill, decode engines decode."""
    if mode is PlannerMode.AGG:
        return PerfModelRole.AGG
    return PerfModelRole.PREFILL if fpm.component is Component.PREFILL else PerfModelRole.DECODE


# --------------------------------------------------------------------------------------------------------
# Observation: bounded, coverage-keeping retention
# --------------------------------------------------------------------------------------------------------


def _buckets_per_axis(num_features: int, bucket_count: int) -> int:
    return bucket_count if num_features == 1 else max(1, math.isqrt(bucket_count))


def _bucket(features: tuple[float, ...], lo: list[float], hi: list[float], per_axis: int) -> tuple[int, ...]:
    key = []
    for value, low, high in zip(features, lo, hi, strict=True):
        if high <= low:
            key.append(0)
        else:
            key.append(min(max(int((value - low) / (high - low) * per_axis), 0), per_axis - 1))
    return tuple(key)


def _retire_one(samples: list[FpmSample], keys: list[tuple[int, ...]]) -> None:
    """Drop the oldest sample of the fullest bucket (ties: the bucket whose oldest sample is oldest).

    `samples` is in arrival order, so the first sample found in any of the fullest buckets is the answer.
    """
    counts: dict[tuple[int, ...], int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    fullest = max(counts.values())
    index = next(i for i, key in enumerate(keys) if counts[key] == fullest)
    del samples[index]
    del keys[index]


def _push_window(window: tuple[float, ...], value: float, size: int, *, skip_leading_zero: bool) -> tuple[float, ...]:
    if skip_leading_zero and not window and value == 0:
        return window
    return (*window, value)[-size:] if size > 0 else ()


def _grid_bounds(
    model: OnlineModelState, samples: list[FpmSample], num_features: int
) -> tuple[list[float], list[float]]:
    """The retention grid's per-feature bounds: the state's own, else (first sample, or a state of another shape)
    those of the retained samples, if any."""
    if len(model.axis_min) == num_features and len(model.axis_max) == num_features:
        return list(model.axis_min), list(model.axis_max)
    lo, hi = [math.inf] * num_features, [-math.inf] * num_features
    for sample in samples:
        lo = [min(a, b) for a, b in zip(lo, sample.features, strict=True)]
        hi = [max(a, b) for a, b in zip(hi, sample.features, strict=True)]
    return lo, hi


def _push_recent(
    role: PerfModelRole,
    fpm: ForwardPassMetrics,
    recent_isl: tuple[float, ...],
    recent_context: tuple[float, ...],
    recent_num_decode: tuple[float, ...],
    *,
    size: int,
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """The moving-average windows (prompt length, decode context, decode batch) after one iteration's metrics."""
    scheduled = fpm.scheduled
    # Moving averages see every iteration, idle heartbeats included (a quiet engine lowers the mean batch).
    # The prompt length counts an iteration without prefill as 0 once a prompt has been seen, as Dynamo does:
    # a mostly idle prefill pool assumes a short next request.
    if role is not PerfModelRole.DECODE:
        isl = (
            scheduled.sum_prefill_tokens / scheduled.num_prefill_requests if scheduled.num_prefill_requests > 0 else 0.0
        )
        recent_isl = _push_window(recent_isl, isl, size, skip_leading_zero=True)
    if role is not PerfModelRole.PREFILL:
        if scheduled.num_decode_requests > 0:
            context = scheduled.sum_decode_kv_tokens / scheduled.num_decode_requests
            recent_context = _push_window(recent_context, context, size, skip_leading_zero=False)
        recent_num_decode = _push_window(
            recent_num_decode, float(scheduled.num_decode_requests), size, skip_leading_zero=True
        )
    return recent_isl, recent_context, recent_num_decode


def observe_role(
    model: OnlineModelState,
    fpms: Sequence[ForwardPassMetrics],
    *,
    max_num_fpm_samples: int,
    bucket_count: int,
    min_observations: int,
) -> OnlineModelState:
    """One role's model after absorbing `fpms` (in arrival order), refitted. Returns `model` itself if `fpms` is empty.

    Args:
        model: the role's current state.
        fpms: observations of engines of that role, oldest first.
        max_num_fpm_samples: retained samples at most (also the moving-average window).
        bucket_count: total buckets of the retention grid (a perfect square for 2-D models).
        min_observations: samples needed before the fit may be used.
    """
    if not fpms:
        return model
    role = model.role
    num_features = len(FEATURE_NAMES[role])
    per_axis = _buckets_per_axis(num_features, bucket_count)
    samples = list(model.samples)
    lo, hi = _grid_bounds(model, samples, num_features)
    keys = [_bucket(s.features, lo, hi, per_axis) for s in samples]
    seq, retired = model.num_accepted, model.num_retired
    idle, invalid = model.num_idle_skipped, model.num_invalid_skipped
    recent_isl, recent_context = model.recent_isl, model.recent_decode_context
    recent_num_decode = model.recent_num_decode

    for fpm in fpms:
        recent_isl, recent_context, recent_num_decode = _push_recent(
            role, fpm, recent_isl, recent_context, recent_num_decode, size=max_num_fpm_samples
        )
        if fpm.wall_time_s == 0:
            idle += 1
            continue
        features = features_of(role, fpm)
        if not (math.isfinite(fpm.wall_time_s) and fpm.wall_time_s > 0 and all(map(math.isfinite, features))):
            invalid += 1
            continue
        seq += 1
        new_lo = [min(a, b) for a, b in zip(lo, features, strict=True)]
        new_hi = [max(a, b) for a, b in zip(hi, features, strict=True)]
        if new_lo != lo or new_hi != hi:  # the grid moved: re-bucket what is held
            lo, hi = new_lo, new_hi
            keys = [_bucket(s.features, lo, hi, per_axis) for s in samples]
        samples.append(FpmSample(seq=seq, features=features, wall_time_s=float(fpm.wall_time_s)))
        keys.append(_bucket(features, lo, hi, per_axis))
        while len(samples) > max_num_fpm_samples:
            _retire_one(samples, keys)
            retired += 1

    fit = fit_wall_time(role, samples, min_observations=min_observations)
    return replace(
        model,
        samples=tuple(samples),
        axis_min=tuple(lo) if samples else (),
        axis_max=tuple(hi) if samples else (),
        readiness=fit.readiness,
        readiness_detail=fit.detail,
        intercept_s=fit.intercept_s,
        coefficients=fit.coefficients,
        num_accepted=seq,
        num_idle_skipped=idle,
        num_invalid_skipped=invalid,
        num_retired=retired,
        recent_isl=recent_isl,
        recent_decode_context=recent_context,
        recent_num_decode=recent_num_decode,
    )


def serving_samples(
    fpms: Sequence[ForwardPassMetrics], workers: WorkerCounts, managed: Sequence[Component]
) -> tuple[tuple[ForwardPassMetrics, ...], list[StepRecord]]:
    """The forward-pass metrics that may enter the online regressions, and a `samples_excluded` step per pool that
    lost some (ours; Dynamo fits every sample).

    An engine that is starting (weights loading, kernels compiling, caches cold) or draining (its batch shrinking
    to nothing) runs iterations unlike those of an engine at work, and one such sample can tilt a fit for hours.
    Left out: a report whose source marks it `STARTING` or `DRAINING`, and every report of a pool whose engines
    cannot be told apart from such engines this tick: a scale of the pool in flight (ready != expected workers),
    or more engines reporting than are ready (the extra ones are starting ahead of their readiness, or draining).
    """
    kept: list[ForwardPassMetrics] = []
    dropped: dict[Component, list[str]] = {}
    reporting: dict[Component, set[str]] = {}  # workers (not DP ranks: a worker counts once) reporting per pool
    for fpm in fpms:
        reporting.setdefault(fpm.component, set()).add(fpm.worker_id)
    for fpm in fpms:
        component = fpm.component
        num_workers = len(reporting[component])
        why = None
        if fpm.lifecycle is not EngineLifecycle.SERVING:
            why = f"{fpm.lifecycle.value} engines"
        elif component in managed and workers.ready(component) != workers.expected(component):
            why = f"scale in flight ({workers.ready(component)} ready, {workers.expected(component)} expected)"
        elif component in managed and num_workers > workers.ready(component):
            why = f"{num_workers} workers report, {workers.ready(component)} ready"
        if why is None:
            kept.append(fpm)
        elif why not in dropped.setdefault(component, []):
            dropped[component].append(why)
    steps = [
        StepRecord(
            step=StepName.SAMPLE,
            component=component,
            value=sum(1 for f in fpms if f.component is component) - sum(1 for f in kept if f.component is component),
            reason=ReasonCode.SAMPLES_EXCLUDED,
            detail="kept out of the online perf models: " + "; ".join(reasons),
        )
        for component, reasons in dropped.items()
        if reasons
    ]
    return tuple(kept), steps


def observe_fpm(state: OnlinePerfState, fpms: Iterable[ForwardPassMetrics], config: PlannerConfig) -> OnlinePerfState:
    """All roles' models after absorbing `fpms` (oldest first), each routed by `role_of` under `config.mode`.

    Uses `config.max_num_fpm_samples`, `config.fpm_sample_bucket_size` and `config.load_min_observations`.
    Roles that received nothing are returned unchanged (same object).
    """
    by_role: dict[PerfModelRole, list[ForwardPassMetrics]] = {role: [] for role in PerfModelRole}
    for fpm in fpms:
        by_role[role_of(fpm, config.mode)].append(fpm)
    options = {
        "max_num_fpm_samples": config.max_num_fpm_samples,
        "bucket_count": config.fpm_sample_bucket_size,
        "min_observations": config.load_min_observations,
    }
    return OnlinePerfState(
        prefill=observe_role(state.prefill, by_role[PerfModelRole.PREFILL], **options),
        decode=observe_role(state.decode, by_role[PerfModelRole.DECODE], **options),
        agg=observe_role(state.agg, by_role[PerfModelRole.AGG], **options),
    )


# --------------------------------------------------------------------------------------------------------
# Fit
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WallTimeFit:
    """Result of fitting one role's samples: coefficients (None/() when no fit was attempted) and readiness."""

    readiness: ModelReadiness
    detail: str
    intercept_s: float | None = None
    coefficients: tuple[float, ...] = ()


def _least_squares(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """OLS with intercept on centred data (sklearn's `LinearRegression` solution, minimum-norm if collinear)."""
    x_mean = x.mean(axis=0)
    y_mean = float(y.mean())
    slopes = np.linalg.lstsq(x - x_mean, y - y_mean, rcond=None)[0]
    return y_mean - float(x_mean @ slopes), slopes


def fit_wall_time(role: PerfModelRole, samples: Sequence[FpmSample], *, min_observations: int) -> WallTimeFit:
    """Fit `wall = a + slopes . features` on `samples` and judge whether the fit may be used.

    Returns INSUFFICIENT_DATA (no coefficients) with fewer than `min_observations` samples or a feature without
    spread; NEGATIVE_COEFFICIENT (coefficients kept for the record) when a slope is negative beyond the decode
    clip; READY otherwise.
    """
    names = FEATURE_NAMES[role]
    if len(samples) < min_observations:
        detail = f"{len(samples)} samples < load_min_observations {min_observations}"
        return WallTimeFit(readiness=ModelReadiness.INSUFFICIENT_DATA, detail=detail)
    x = np.array([s.features for s in samples], dtype=np.float64).reshape(len(samples), len(names))
    y = np.array([s.wall_time_s for s in samples], dtype=np.float64)
    flat = [name for name, column in zip(names, x.T, strict=True) if float(column.max()) == float(column.min())]
    if flat:
        detail = f"no spread in {', '.join(flat)} over {len(samples)} samples: its slope cannot be fitted"
        return WallTimeFit(readiness=ModelReadiness.INSUFFICIENT_DATA, detail=detail)
    intercept, slopes = _least_squares(x, y)
    coefficients = [float(c) for c in slopes]
    notes = []
    for index, (name, value) in enumerate(zip(names, coefficients, strict=True)):
        if value >= 0:
            continue
        clippable = role is PerfModelRole.DECODE and index == 0 and value > -DECODE_REQUESTS_CLIP_TOLERANCE_S
        if not clippable:
            return WallTimeFit(
                readiness=ModelReadiness.NEGATIVE_COEFFICIENT,
                detail=f"slope of {name} = {value:.3g} s < 0 over {len(samples)} samples",
                intercept_s=intercept,
                coefficients=tuple(coefficients),
            )
        coefficients[index] = 0.0
        notes.append(f"slope of {name} {value:.3g} s clipped to 0")
    if not (math.isfinite(intercept) and all(map(math.isfinite, coefficients))):
        detail = f"fit over {len(samples)} samples is not finite"
        return WallTimeFit(readiness=ModelReadiness.INSUFFICIENT_DATA, detail=detail)
    terms = " + ".join(f"{c:.4g}*{n}" for c, n in zip(coefficients, names, strict=True))
    detail = "; ".join([f"wall = {intercept:.4g} + {terms} s over {len(samples)} samples", *notes])
    return WallTimeFit(
        readiness=ModelReadiness.READY, detail=detail, intercept_s=intercept, coefficients=tuple(coefficients)
    )


def readiness_step(model: OnlineModelState, component: Component | None = None) -> StepRecord:
    """The model's readiness as a tick step: reason = readiness, value = retained samples, detail = why."""
    return StepRecord(
        step=StepName(f"perf_model_{model.role.value}"),
        reason=ReasonCode(model.readiness.value),
        component=component,
        value=float(len(model.samples)),
        detail=model.readiness_detail,
    )


# --------------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------------


def _mean(values: tuple[float, ...]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass(frozen=True, slots=True)
class OnlineForwardPassModel:
    """`ForwardPassModel` answered by one role's fitted regression (see the module docstring for the formulas).

    Questions of another role raise `PerfModelError` rather than return NaN, so a wiring mistake fails loudly:
    a prefill model answers `prefill_wall_s` only; a decode model `decode_wall_s` only; an agg model all three
    (its `decode_wall_s` ignores the request count, which the agg regression has no term for, and its
    `prefill_wall_s` is a prefill-only iteration). Asking a model that is not ready also raises `PerfModelError`;
    check `is_ready()` first (the capacity search does). Predictions are floored at `MIN_WALL_S`.
    """

    state: OnlineModelState

    def is_ready(self) -> bool:
        return self.state.readiness is ModelReadiness.READY and self.state.intercept_s is not None

    @property
    def role(self) -> PerfModelRole:
        return self.state.role

    @property
    def avg_isl(self) -> float:
        """Mean prefill length (tokens) of recent iterations with prefill requests; 0 before any."""
        return _mean(self.state.recent_isl)

    @property
    def avg_decode_context(self) -> float:
        """Mean KV tokens per decode request of recent iterations with decode requests; 0 before any."""
        return _mean(self.state.recent_decode_context)

    @property
    def avg_num_decode(self) -> float:
        """Mean decode batch of recent iterations (leading idle iterations skipped); 0 before any."""
        return _mean(self.state.recent_num_decode)

    def _predict(self, features: tuple[float, ...]) -> float:
        if not self.is_ready():
            raise PerfModelError(
                f"{self.role.value} perf model not ready ({self.state.readiness.value}): {self.state.readiness_detail}"
            )
        assert self.state.intercept_s is not None
        wall = self.state.intercept_s + sum(c * x for c, x in zip(self.state.coefficients, features, strict=True))
        return max(MIN_WALL_S, wall)

    def _not_applicable(self, question: str) -> PerfModelError:
        return PerfModelError(f"the {self.role.value} perf model does not answer {question}")

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        if self.role is PerfModelRole.PREFILL:
            return self._predict((float(prefill_tokens),))
        if self.role is PerfModelRole.AGG:
            return self._predict((float(prefill_tokens), 0.0))
        raise self._not_applicable("prefill_wall_s")

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        if self.role is PerfModelRole.DECODE:
            return self._predict((float(num_decode_requests), float(decode_kv_tokens)))
        if self.role is PerfModelRole.AGG:
            return self._predict((0.0, float(decode_kv_tokens)))
        raise self._not_applicable("decode_wall_s")

    def mixed_wall_s(
        self,
        prefill_tokens: float,
        num_decode_requests: float,  # noqa: ARG002 - the agg regression has no request-count term
        decode_kv_tokens: float,
    ) -> float:
        if self.role is PerfModelRole.AGG:
            return self._predict((float(prefill_tokens), float(decode_kv_tokens)))
        raise self._not_applicable("mixed_wall_s")
