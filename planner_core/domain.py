"""Boundary types of the decision core: enums and frozen dataclasses, and their JSON form.

Everything that crosses from the I/O edges into `tick()` and back is defined here. The types are plain values
(frozen, slotted, keyword-only) so a tick's inputs, state and outcome can be stored as JSONB and replayed
exactly. No I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class Component(enum.StrEnum):
    """A pool of workers the planner scales."""

    PREFILL = "prefill"  # computes prompts; drives TTFT
    DECODE = "decode"  # generates tokens; drives ITL (also the single pool in aggregated mode)


class Loop(enum.StrEnum):
    """Which of the planner's two loops a tick belongs to."""

    THROUGHPUT = "throughput"  # slow, predictive: forecast -> capacity model -> replicas
    LOAD = "load"  # fast, reactive: per-engine load -> +/-1 corrections


class ReasonCode(enum.StrEnum):
    """Why a step of a tick produced its value. Dynamo's enum names where Dynamo has one."""

    # Dynamo throughput/load decision reasons
    UNSET = "unset"
    DISABLED = "disabled"
    NO_TRAFFIC_DATA = "no_traffic_data"
    PREDICT_FAILED = "predict_failed"
    MODEL_NOT_READY = "model_not_ready"
    PARTNER_NOT_READY = "partner_not_ready"
    SET_LOWER_BOUND = "set_lower_bound"
    SCALE = "scale"
    NO_CHANGE = "no_change"
    NO_FPM_DATA = "no_fpm_data"
    SCALING_IN_PROGRESS = "scaling_in_progress"
    GPU_BUDGET_GUARD_HOLD = "gpu_budget_guard_hold"
    GPU_BUDGET_RECONCILE = "gpu_budget_reconcile"
    # Steps of our own pipeline
    OBSERVED = "observed"  # the observation was accepted as is
    IDLE_WINDOW = "idle_window"  # zero requests: lengths carried forward from the last busy window
    PREDICTED = "predicted"  # the configured predictor produced the forecast
    PREDICTOR_FALLBACK = "predictor_fallback"  # forecast came from the fallback (e.g. warm-up), not the model
    CAPACITY_FROM_PROFILE = "capacity_from_profile"  # engine capacity interpolated from profiling data
    SLA_UNREACHABLE = "sla_unreachable"  # even batch 1 misses the SLA; best rate used anyway
    DEMAND_SIZED = "demand_sized"  # replicas = ceil(demand / capacity)
    WITHIN_RANGE = "within_range"  # a clamp left the value unchanged
    MIN_ENDPOINT_FLOOR = "min_endpoint_floor"  # raised to the minimum endpoint count
    DELTA_CAPPED = "delta_capped"  # change limited by max_throughput_scaling_replicas
    GPU_BUDGET_CAPPED = "gpu_budget_capped"  # scaled down proportionally to fit max_gpu_budget
    GPU_BUDGET_FLOORED = "gpu_budget_floored"  # scaled up proportionally to reach min_gpu_budget
    ADVISORY = "advisory"  # decision recorded but not to be executed


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficObservation:
    """Frontend traffic over one throughput window.

    Attributes:
        duration_s: length of the window the figures cover.
        num_req: requests that arrived in the window.
        isl: mean input sequence length (tokens) of those requests; 0 when idle.
        osl: mean output sequence length (tokens); 0 when idle.
        isl_p50 .. osl_p99: percentiles of the lengths where the source knows them.
        ttft_ms, itl_ms: observed mean latencies where the source knows them.
    """

    duration_s: float
    num_req: float
    isl: float
    osl: float
    isl_p50: float | None = None
    isl_p90: float | None = None
    isl_p99: float | None = None
    osl_p50: float | None = None
    osl_p90: float | None = None
    osl_p99: float | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None

    def length_quantile(self, which: str, quantile: str) -> float | None:
        """`which` in {"isl", "osl"}, `quantile` in {"p50", "p90", "p99"}: that percentile, if observed."""
        return getattr(self, f"{which}_{quantile}")

    def invalid_field(self) -> str | None:
        """Name of the first field that is NaN, infinite or negative, or None when all are usable."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (math.isnan(value) or math.isinf(value) or value < 0):
                return f.name
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCounts:
    """Workers per pool: `ready` serve now, `expected` is the target the orchestrator works towards."""

    ready_prefill: int
    ready_decode: int
    expected_prefill: int
    expected_decode: int

    def ready(self, component: Component) -> int:
        return self.ready_prefill if component is Component.PREFILL else self.ready_decode

    def expected(self, component: Component) -> int:
        return self.expected_prefill if component is Component.PREFILL else self.expected_decode

    @property
    def scaling_in_progress(self) -> bool:
        return (self.ready_prefill, self.ready_decode) != (self.expected_prefill, self.expected_decode)


@dataclass(frozen=True, slots=True, kw_only=True)
class TickInputs:
    """Everything one tick sees. `now_s` is the scheduled time of the tick in epoch seconds (time is data)."""

    now_s: float
    loop: Loop
    workers: WorkerCounts
    traffic: TrafficObservation | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Forecast of the next throughput window.

    `isl_quantile` / `osl_quantile` forecast the configured percentile (`quantile`, e.g. "p90") of the lengths,
    for sizing on the distribution; None when no percentile was observed.
    """

    num_req: float
    isl: float
    osl: float
    quantile: str | None = None
    isl_quantile: float | None = None
    osl_quantile: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadHistory:
    """Observed per-window load the predictors learn from (most recent last, bounded in length)."""

    num_req: tuple[float, ...] = ()
    isl: tuple[float, ...] = ()
    osl: tuple[float, ...] = ()
    seen_traffic: bool = False  # False until the first non-idle window: leading idle windows are skipped


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerState:
    """Cross-tick state of one managed deployment; stored as JSONB after every tick."""

    load_history: LoadHistory = field(default_factory=LoadHistory)
    throughput_lower_bound_prefill: int = 1
    throughput_lower_bound_decode: int = 1
    num_throughput_ticks: int = 0
    num_load_ticks: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One named step of a tick: its value and why. The list of these is the tick's explanation."""

    step: str
    reason: ReasonCode
    component: Component | None = None
    value: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaProposal:
    """A loop's proposed replica count for one pool, before execution."""

    component: Component
    current: int
    desired: int
    reason: ReasonCode


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingDecision:
    """Targets to apply; None means "no opinion" for that pool."""

    num_prefill: int | None = None
    num_decode: int | None = None
    advisory: bool = False

    @property
    def is_empty(self) -> bool:
        return self.num_prefill is None and self.num_decode is None


@dataclass(frozen=True, slots=True, kw_only=True)
class TickOutcome:
    """What `tick()` returns: the decision, the state to carry forward, and the explanation."""

    decision: ScalingDecision
    next_state: PlannerState
    steps: tuple[StepRecord, ...]
    proposals: tuple[ReplicaProposal, ...] = ()
    prediction: Prediction | None = None
    prediction_reason: ReasonCode | None = None
    reason: ReasonCode = ReasonCode.UNSET  # the loop's headline reason (Dynamo's per-loop decision enum)


# --- JSON form ------------------------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """Turn a dataclass/enum/tuple tree into JSON-compatible values (dicts, lists, str, numbers)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return repr(value)  # JSONB has no NaN/inf; keep them visible as strings
    return value


def _coerce(annotation: str, raw: Any) -> Any:
    """Rebuild a field value from its JSON form using the (string) annotation of the dataclass field."""
    if raw is None:
        return None
    base = annotation.replace(" | None", "").strip()
    if base in _DATACLASSES:
        return from_jsonable(_DATACLASSES[base], raw)
    if base in _ENUMS:
        return _ENUMS[base](raw)
    if base.startswith("tuple["):
        inner = base[len("tuple[") : -1].split(",")[0].strip()
        return tuple(_coerce(inner, item) for item in raw)
    if base == "float":
        return float(raw)
    return raw


def from_jsonable(cls: type[T], data: Mapping[str, Any]) -> T:
    """Inverse of `to_jsonable` for the dataclasses of this module."""
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _coerce(str(f.type), data[f.name])
    return cls(**kwargs)


_DATACLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        TrafficObservation,
        WorkerCounts,
        TickInputs,
        Prediction,
        LoadHistory,
        PlannerState,
        StepRecord,
        ReplicaProposal,
        ScalingDecision,
        TickOutcome,
    )
}
_ENUMS: dict[str, type[enum.Enum]] = {cls.__name__: cls for cls in (Component, Loop, ReasonCode)}
