"""The storage codec of the domain types: their JSON form, and the form `ticks.inputs` stores a tick's inputs in.

`to_jsonable` turns a dataclass/enum/tuple tree of `planner_core.domain` into JSON values (what the store writes as
JSONB: planner states, outcomes, inputs); `from_jsonable` rebuilds it from the string annotations of the
dataclasses' fields, looking the types up by class name (`_DATACLASSES`, `_ENUMS`: names, not module paths, so the
domain's modules may move without touching a stored row). `stored_inputs` / `inputs_from_stored` add the compact,
partly positional form of `ticks.inputs` (migrations 0019 and 0020). Only the store and replay (which reads what
the store wrote) use it; the decision core never serialises.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from planner_core.domain import (
    AdoptedCount,
    AppliedTargets,
    ArimaFit,
    ArimaSearch,
    ArimaState,
    CapacityFeedback,
    Component,
    DecodeMarginState,
    EngineLifecycle,
    EngineLimits,
    EnsembleMember,
    EnsembleState,
    ErrorBudgetState,
    EventReason,
    ExecuteAction,
    ForwardPassMetrics,
    FpmSample,
    HeldResult,
    HoldPolicy,
    HorizonWindow,
    KalmanState,
    LatencyHistogram,
    LengthQuantile,
    LoadHistory,
    LoadSeries,
    Loop,
    MemberScore,
    ModelReadiness,
    ObservedValue,
    OnlineModelState,
    OnlinePerfState,
    OutsideChange,
    OverrideType,
    PartialPrediction,
    PendingScaleUp,
    PerfModelRole,
    PipelineState,
    PlannerState,
    PluginSchedule,
    PoolFeedback,
    Prediction,
    PromptBurstQuantiles,
    PromptBurstWindow,
    QueuedRequests,
    ReasonCode,
    RecordedArrivals,
    RemoteAnswer,
    ReplicaOverride,
    ReplicaProposal,
    ScalingDecision,
    ScheduledRequests,
    SeriesModel,
    Signal,
    SignalStatus,
    SizedNeed,
    StartupSample,
    StartupState,
    StepRecord,
    ThresholdPlannerState,
    TickEvent,
    TickInputs,
    TickOutcome,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)

T = TypeVar("T")


def to_jsonable(value: Any, *, omit_defaults: bool = False) -> Any:
    """Turn a dataclass/enum/tuple tree into JSON-compatible values (dicts, lists, str, numbers).

    With `omit_defaults`, a dataclass field holding exactly its default (same type and value, the sign of a zero
    included) is left out: `from_jsonable` fills it back in, so the tree reads back equal with less to store. What
    was stored that way depends on the defaults staying what they are (pinned by
    tests/runtime/test_stored_defaults.py).

    Replay encodes every replayed outcome and state to compare them (~150 calls a load tick), so the common cases
    come first: plain numbers, strings and None by their exact type, a series of finite floats in one pass, a
    dataclass's fields looked up once per class."""
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind is float:
        return value if value - value == 0.0 else repr(value)  # JSONB has no NaN/inf; keep them visible as strings
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        if all(type(v) is float and v - v == 0.0 for v in value):  # finite floats (x - x is NaN for NaN and inf)
            return list(value)
        return [to_jsonable(v, omit_defaults=omit_defaults) for v in value]
    fields = _dataclass_fields(kind)
    if fields is not None:
        return {
            f.name: to_jsonable(getattr(value, f.name), omit_defaults=omit_defaults)
            for f in fields
            if not (omit_defaults and _holds_default(f, getattr(value, f.name)))
        }
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):  # a float subclass
        return repr(value)
    return value


_AS_IS = frozenset({int, str, bool, type(None)})


@functools.cache
def _dataclass_fields(kind: type) -> tuple[dataclasses.Field, ...] | None:
    """The fields of a dataclass type, None for any other type (instances of these types are encoded)."""
    return dataclasses.fields(kind) if dataclasses.is_dataclass(kind) else None


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default value (its factory's product), or `dataclasses.MISSING` for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _holds_default(f: dataclasses.Field, value: Any) -> bool:
    default = field_default(f)
    return default is not dataclasses.MISSING and _strictly_equal(value, default)


def _strictly_equal(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 is not 1.0, 0.0 is not -0.0): what reads back the same."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(_strictly_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_strictly_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


def _coerce(annotation: str, raw: Any) -> Any:
    """Rebuild a field value from its JSON form using the (string) annotation of the dataclass field."""
    return _converter(annotation)(raw)


@functools.cache
def _converter(annotation: str) -> Callable[[Any], Any]:
    """The function `_coerce` applies for `annotation`, worked out once per annotation: a replayed tick decodes
    ~700k values (its recorded arrivals), and reading the annotation's text again for each one was most of the
    decoding time. A `None` stays `None` at every level; a tuple of plain floats converts in one pass (what a
    non-number in it makes `float` refuse is converted item by item instead, as before)."""
    base = annotation.replace(" | None", "").strip()
    convert: Callable[[Any], Any]
    if base in _DATACLASSES:
        cls = _DATACLASSES[base]

        def convert(raw: Any) -> Any:
            return from_jsonable(cls, raw)

    elif base in _ENUMS:
        convert = _ENUMS[base]
    elif base.startswith("tuple["):
        inner = _converter(base[len("tuple[") : -1].split(",")[0].strip())

        def convert(raw: Any) -> Any:
            if inner is _as_float:
                try:
                    return tuple(map(float, raw))
                except TypeError:  # a None among the numbers: it stays None
                    pass
            return tuple(inner(item) for item in raw)

    elif base == "float":
        return _as_float
    else:
        return _as_is

    def optional(raw: Any) -> Any:
        return None if raw is None else convert(raw)

    return optional


def _as_float(raw: Any) -> Any:
    return None if raw is None else float(raw)


def _as_is(raw: Any) -> Any:
    return raw


@functools.cache
def field_converters(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """Each field of dataclass `cls` with the function that rebuilds its value from its JSON form, as
    `from_jsonable` applies them (replay decodes a state field by field, reusing the fields that did not change)."""
    return tuple((f.name, _converter(str(f.type))) for f in dataclasses.fields(cls))


def from_jsonable(cls: type[T], data: Mapping[str, Any]) -> T:
    """Inverse of `to_jsonable` for the dataclasses of this module."""
    return cls(**{name: convert(data[name]) for name, convert in field_converters(cls) if name in data})


# --- Stored tick inputs ---------------------------------------------------------------------------------------
# `ticks.inputs` holds `to_jsonable(inputs, omit_defaults=True)` with two parts written by position instead of by
# key (migration 0020): the worker counts, and each engine's forward-pass metrics, whose long key names were most
# of a load tick's row; and without the two fields the tick's row holds in its own columns: `loop`, and `now_s`
# when it is the tick's scheduled time (as every live tick's is) to the bit. A positional record lists its
# dataclass's fields in their declared order (nested records likewise: an engine's `scheduled` and `queued`
# counters), and leaves out the trailing fields that hold their defaults (an idle queue, a serving engine). Stored
# ticks are read back by position: the field order of these records is pinned by tests/runtime/test_stored_defaults.py
# with their defaults, and changing it needs a migration.
POSITIONAL_IN_STORED_INPUTS = ("workers", "fpm")


def to_positional(value: Any) -> list[Any]:
    """A dataclass as the JSON array of its fields in declared order (nested dataclasses as arrays too), without
    the trailing fields that hold their defaults (same type and value, the sign of a zero included)."""
    fields = dataclasses.fields(value)
    items = [
        to_positional(v) if dataclasses.is_dataclass(v) else to_jsonable(v)
        for v in (getattr(value, f.name) for f in fields)
    ]
    end = len(fields)
    while end > 0 and _holds_default(fields[end - 1], getattr(value, fields[end - 1].name)):
        end -= 1
    return items[:end]


def from_positional(cls: type[T], row: list[Any]) -> T:
    """Inverse of `to_positional`: the fields it left out take their defaults."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not isinstance(row, list) or len(row) > len(fields):
        raise ValueError(f"{cls.__name__}: stored as {row!r}, not an array of at most {len(fields)} fields")
    kwargs = {}
    for f, raw in zip(fields, row, strict=False):
        nested = _DATACLASSES.get(str(f.type))
        kwargs[f.name] = from_positional(nested, raw) if nested is not None else _coerce(str(f.type), raw)
    return cls(**kwargs)


def stored_inputs(inputs: TickInputs, scheduled_s: float) -> dict[str, Any]:
    """A tick's inputs as `ticks.inputs` stores them: without the fields at their defaults, the worker counts and
    each engine's forward-pass metrics as positional arrays, without `loop` (the tick's column) and without
    `now_s` if it is `scheduled_s` exactly (the tick's `scheduled_at` in epoch seconds, which is what its
    column gives back). `inputs_from_stored` reads them back equal."""
    data = to_jsonable(inputs, omit_defaults=True)
    del data["loop"]
    if _strictly_equal(inputs.now_s, scheduled_s):
        del data["now_s"]
    data["workers"] = to_positional(inputs.workers)
    if inputs.fpm:
        data["fpm"] = [to_positional(fpm) for fpm in inputs.fpm]
    return data


def inputs_from_stored(data: Mapping[str, Any], loop: Loop, scheduled_s: float) -> TickInputs:
    """Inverse of `stored_inputs` (what replay reads from `ticks.inputs`), given the tick's `loop` and
    `scheduled_at` in epoch seconds."""
    if not isinstance(data.get("workers"), list):
        raise ValueError(f"stored inputs: workers {data.get('workers')!r} is not a positional array (migration 0020)")
    kwargs = {
        f.name: _coerce(str(f.type), data[f.name])
        for f in dataclasses.fields(TickInputs)
        if f.name in data and f.name not in (*POSITIONAL_IN_STORED_INPUTS, "loop")
    }
    kwargs.setdefault("now_s", scheduled_s)
    return TickInputs(
        **kwargs,
        loop=loop,
        workers=from_positional(WorkerCounts, data["workers"]),
        fpm=tuple(from_positional(ForwardPassMetrics, row) for row in data.get("fpm", ())),
    )


_DATACLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        RecordedArrivals,
        PromptBurstQuantiles,
        TrafficObservation,
        WorkerCounts,
        ScheduledRequests,
        QueuedRequests,
        ForwardPassMetrics,
        EngineLimits,
        FpmSample,
        OnlineModelState,
        OnlinePerfState,
        UnplacedRequests,
        TickInputs,
        Prediction,
        KalmanState,
        ArimaFit,
        ArimaSearch,
        ArimaState,
        MemberScore,
        EnsembleState,
        SeriesModel,
        LoadHistory,
        ReplicaOverride,
        PartialPrediction,
        HeldResult,
        ObservedValue,
        RemoteAnswer,
        PluginSchedule,
        PipelineState,
        ThresholdPlannerState,
        SizedNeed,
        AppliedTargets,
        PendingScaleUp,
        StartupSample,
        StartupState,
        HorizonWindow,
        PoolFeedback,
        CapacityFeedback,
        ErrorBudgetState,
        DecodeMarginState,
        LatencyHistogram,
        PromptBurstWindow,
        OutsideChange,
        AdoptedCount,
        SignalStatus,
        TickEvent,
        PlannerState,
        StepRecord,
        ReplicaProposal,
        ScalingDecision,
        TickOutcome,
    )
}
_ENUMS: dict[str, type[enum.Enum]] = {
    cls.__name__: cls
    for cls in (
        Component,
        Loop,
        ReasonCode,
        LengthQuantile,
        LoadSeries,
        EnsembleMember,
        PerfModelRole,
        ModelReadiness,
        OverrideType,
        HoldPolicy,
        ExecuteAction,
        EngineLifecycle,
        Signal,
        EventReason,
    )
}
