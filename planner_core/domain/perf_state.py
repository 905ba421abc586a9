"""The online perf models' state: one forward-pass regression per engine role, its samples and its fit."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class PerfModelRole(enum.StrEnum):
    """Which engine an online perf model describes, and so which FPM features it regresses wall time on."""

    PREFILL = "prefill"  # wall = a + b * sum_prefill_tokens
    DECODE = "decode"  # wall = a + b * num_decode_requests + c * sum_decode_kv_tokens
    AGG = "agg"  # wall = a + b * sum_prefill_tokens + c * sum_decode_kv_tokens (aggregated engines)


class ModelReadiness(enum.StrEnum):
    """Whether an online perf model's fit may be used; values equal the matching `ReasonCode`s."""

    READY = "perf_model_ready"  # enough samples and a physically sensible fit
    INSUFFICIENT_DATA = "insufficient_data"  # fewer than load_min_observations samples, or no spread on a feature
    NEGATIVE_COEFFICIENT = "negative_coefficient"  # a fitted slope is negative: more load would take less time


@dataclass(frozen=True, slots=True, kw_only=True)
class FpmSample:
    """One forward-pass observation retained by an online perf model.

    Attributes:
        seq: position in the model's stream of accepted samples (1 = first ever); the oldest sample has the smallest.
        features: the role's regression inputs, in `PerfModelRole` order (tokens / requests).
        wall_time_s: the iteration's measured wall time.
    """

    seq: int
    features: tuple[float, ...]
    wall_time_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineModelState:
    """An online forward-pass regression of one engine role: retained samples, the fit, and moving averages.

    A value: `planner_core.perf.online.observe_fpm` returns a new one; `OnlineForwardPassModel` only reads it.

    Attributes:
        role: which features the model regresses on.
        samples: retained observations (bounded by `max_num_fpm_samples`, retired bucket by bucket).
        axis_min, axis_max: per-feature bounds of every sample ever accepted (the bucket grid spans them).
        readiness: whether the fit below may be used.
        readiness_detail: why, in words (e.g. which coefficient was negative).
        intercept_s: fitted intercept (s); None until a fit has been attempted.
        coefficients: fitted slopes per feature (s per token or per request), as used (a clipped slope is 0).
        num_accepted: samples accepted so far (the `seq` of the newest).
        num_idle_skipped: idle heartbeats (wall time 0) seen and skipped.
        num_invalid_skipped: observations skipped because a feature or the wall time was not a finite number.
        num_retired: samples dropped to keep the retained set bounded.
        recent_isl: per-iteration mean prefill length (tokens) of recent iterations, 0 for one without prefill
            requests (leading zeros skipped).
        recent_decode_context: per-iteration mean KV tokens per decode request, recent iterations with decode.
        recent_num_decode: decode requests per recent iteration (leading zeros skipped).
    """

    role: PerfModelRole
    samples: tuple[FpmSample, ...] = ()
    axis_min: tuple[float, ...] = ()
    axis_max: tuple[float, ...] = ()
    readiness: ModelReadiness = ModelReadiness.INSUFFICIENT_DATA
    readiness_detail: str = ""
    intercept_s: float | None = None
    coefficients: tuple[float, ...] = ()
    num_accepted: int = 0
    num_idle_skipped: int = 0
    num_invalid_skipped: int = 0
    num_retired: int = 0
    recent_isl: tuple[float, ...] = ()
    recent_decode_context: tuple[float, ...] = ()
    recent_num_decode: tuple[float, ...] = ()


def _empty_model(role: PerfModelRole) -> OnlineModelState:
    return OnlineModelState(role=role)


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlinePerfState:
    """The online perf models of a deployment, one per engine role (a mode uses the members it has pools for)."""

    prefill: OnlineModelState = field(default_factory=lambda: _empty_model(PerfModelRole.PREFILL))
    decode: OnlineModelState = field(default_factory=lambda: _empty_model(PerfModelRole.DECODE))
    agg: OnlineModelState = field(default_factory=lambda: _empty_model(PerfModelRole.AGG))
