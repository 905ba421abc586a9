"""The plugin pipeline a planner tick runs in: PREDICT -> PROPOSE -> RECONCILE -> CONSTRAIN -> EXECUTE.

Builtin and user plugins share one contract (`Plugin`: a `PluginSpec` and `run(context) -> PluginResult`). The
pipeline schedules them per plugin on one base cadence, merges what they return with Dynamo's type-aware rules,
applies the final invariants (minimum endpoints, GPU budget) and decides whether to execute; every step is a
`StepRecord`. `run_pipeline` is pure apart from an optional clock for deadlines; `load_entry_point_plugins` and
`resolve_plugins` (the edges) find user plugins through the `llm_planner.plugins` entry-point group.
"""

from planner_core.domain import ExecuteAction, HoldPolicy, OverrideType, PartialPrediction, ReplicaOverride
from planner_core.pipeline.loader import (
    ENTRY_POINT_GROUP,
    PluginConfigError,
    PluginLoadError,
    load_entry_point_plugins,
    resolve_plugins,
)
from planner_core.pipeline.merge import MergeOutcome, merge_overrides, merge_predictions
from planner_core.pipeline.run import run_pipeline
from planner_core.pipeline.schedule import base_cadence_s, is_due, next_due_s, observations_needed
from planner_core.pipeline.types import (
    DEFAULT_PLUGIN_TIMEOUT_S,
    PRODUCED_FIELDS,
    ConfiguredPlugin,
    Contribution,
    FunctionPlugin,
    Observation,
    Phase,
    PipelineContext,
    PipelineOutcome,
    Plugin,
    PluginResult,
    PluginRun,
    PluginSpec,
)

__all__ = [
    "DEFAULT_PLUGIN_TIMEOUT_S",
    "ENTRY_POINT_GROUP",
    "PRODUCED_FIELDS",
    "ConfiguredPlugin",
    "Contribution",
    "ExecuteAction",
    "FunctionPlugin",
    "HoldPolicy",
    "MergeOutcome",
    "Observation",
    "OverrideType",
    "PartialPrediction",
    "Phase",
    "PipelineContext",
    "PipelineOutcome",
    "Plugin",
    "PluginConfigError",
    "PluginLoadError",
    "PluginResult",
    "PluginRun",
    "PluginSpec",
    "ReplicaOverride",
    "base_cadence_s",
    "is_due",
    "load_entry_point_plugins",
    "merge_overrides",
    "merge_predictions",
    "next_due_s",
    "observations_needed",
    "resolve_plugins",
    "run_pipeline",
]
