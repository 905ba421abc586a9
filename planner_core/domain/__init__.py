"""Boundary types of the decision core: enums and frozen dataclasses, one module per seam.

Everything that crosses from the I/O edges into `tick()` and back is defined here. The types are plain values
(frozen, slotted, keyword-only) so a tick's inputs, state and outcome can be stored as JSON and replayed exactly
(the store's codec, `planner_core.runtime.store.codec`, writes and reads them). No I/O, no clock.

Modules (every public name is re-exported here, so `from planner_core.domain import X` works for all of them):

* `components`: `Component` (the pools) and `Loop` (the two loops), named by every other module;
* `reasons`: `ReasonCode` by `ReasonFamily`, `StepName` and `StepRecord`: a tick's explanation;
* `observations`: traffic, worker counts, forward-pass metrics, engine limits, unplaced requests, applied targets;
* `gpu_hours`: the GPU-hours of recorded worker observations;
* `perf_state`: the online perf models' state;
* `forecast`: `Prediction` and the predictors' state (`LoadHistory` and each series' model);
* `pipeline_state`: the plugin pipeline's overrides, partial predictions, remote answers and schedules;
* `state`: `PlannerState` and the loops' own cross-tick state (threshold planner, needs, start-up, horizon);
* `ticks`: `TickInputs`, `ReplicaProposal`, `ScalingDecision` and `TickOutcome`;
* `actuation`: who owns a pool's count (`OutsideChange`, `AdoptedCount`), signal health (`Signal`,
  `SignalStatus`) and the one Event a tick posts (`TickEvent`);
* `summary`: `summarize_decision`, a decision in one line with the `DecisionStage` that set its targets.
"""

from __future__ import annotations

from planner_core.domain.actuation import (
    AdoptedCount,
    EventReason,
    OutsideChange,
    Signal,
    SignalStatus,
    TickEvent,
)
from planner_core.domain.components import (
    Component,
    Loop,
)
from planner_core.domain.forecast import (
    ArimaFit,
    ArimaSearch,
    ArimaState,
    EnsembleMember,
    EnsembleState,
    KalmanState,
    LengthQuantile,
    LoadHistory,
    LoadSeries,
    MemberScore,
    Prediction,
    SeriesModel,
)
from planner_core.domain.gpu_hours import (
    cumulative_gpu_hours,
    gpu_hours,
)
from planner_core.domain.observations import (
    PROMPT_ARRIVAL_INTERVALS_S,
    PROMPT_BURST_QUANTILES,
    AppliedTargets,
    EngineLifecycle,
    EngineLimits,
    ForwardPassMetrics,
    LatencyHistogram,
    PromptBurstQuantiles,
    QueuedRequests,
    RecordedArrivals,
    ScheduledRequests,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.domain.perf_state import (
    FpmSample,
    ModelReadiness,
    OnlineModelState,
    OnlinePerfState,
    PerfModelRole,
)
from planner_core.domain.pipeline_state import (
    REMOTE_FAILURES,
    ExecuteAction,
    HeldResult,
    HoldPolicy,
    ObservedValue,
    OverrideType,
    PartialPrediction,
    PipelineState,
    PluginSchedule,
    RemoteAnswer,
    ReplicaOverride,
)
from planner_core.domain.reasons import (
    ReasonCode,
    ReasonFamily,
    StepName,
    StepRecord,
)
from planner_core.domain.state import (
    CapacityFeedback,
    DecodeMarginState,
    ErrorBudgetState,
    HorizonWindow,
    PendingScaleUp,
    PlannerState,
    PoolFeedback,
    PromptBurstWindow,
    SizedNeed,
    StartupSample,
    StartupState,
    ThresholdPlannerState,
)
from planner_core.domain.summary import (
    DecisionStage,
    DecisionSummary,
    summarize_decision,
)
from planner_core.domain.ticks import (
    ReplicaProposal,
    ScalingDecision,
    TickInputs,
    TickOutcome,
)

__all__ = [
    "AdoptedCount",
    "EventReason",
    "OutsideChange",
    "Signal",
    "SignalStatus",
    "TickEvent",
    "AppliedTargets",
    "ArimaFit",
    "ArimaSearch",
    "ArimaState",
    "Component",
    "DecisionStage",
    "DecisionSummary",
    "EngineLifecycle",
    "EngineLimits",
    "EnsembleMember",
    "EnsembleState",
    "ExecuteAction",
    "ForwardPassMetrics",
    "FpmSample",
    "HeldResult",
    "HoldPolicy",
    "CapacityFeedback",
    "DecodeMarginState",
    "ErrorBudgetState",
    "HorizonWindow",
    "PoolFeedback",
    "KalmanState",
    "LengthQuantile",
    "LoadHistory",
    "LoadSeries",
    "Loop",
    "MemberScore",
    "ModelReadiness",
    "ObservedValue",
    "OnlineModelState",
    "OnlinePerfState",
    "OverrideType",
    "PROMPT_ARRIVAL_INTERVALS_S",
    "PROMPT_BURST_QUANTILES",
    "PromptBurstQuantiles",
    "PromptBurstWindow",
    "PartialPrediction",
    "PendingScaleUp",
    "PerfModelRole",
    "PipelineState",
    "PlannerState",
    "PluginSchedule",
    "Prediction",
    "QueuedRequests",
    "REMOTE_FAILURES",
    "ReasonCode",
    "ReasonFamily",
    "RemoteAnswer",
    "ReplicaOverride",
    "ReplicaProposal",
    "ScalingDecision",
    "ScheduledRequests",
    "SeriesModel",
    "SizedNeed",
    "StartupSample",
    "StartupState",
    "StepName",
    "StepRecord",
    "ThresholdPlannerState",
    "TickInputs",
    "TickOutcome",
    "LatencyHistogram",
    "RecordedArrivals",
    "TrafficObservation",
    "UnplacedRequests",
    "WorkerCounts",
    "cumulative_gpu_hours",
    "gpu_hours",
    "summarize_decision",
]
