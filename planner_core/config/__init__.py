"""The planner's static configuration: one validated, frozen `PlannerConfig` per deployment.

This package is the only place that knows the configuration file format. It accepts the same JSON/YAML
object that NVIDIA Dynamo 1.6.1's planner reads (same field names, aliases and defaults), validates it
with rules that say what is wrong in one line, and exposes derived values as read-only properties
instead of rewriting fields. It never reads `os.environ`: values that Dynamo takes from the environment
get a fixed default here, and process/runtime settings (credentials, DSNs, ...) live elsewhere.

Public entry points (import them from `planner_core.config`, not from its modules):

* `load_config(path)` reads a `.yaml`/`.yml`/`.json` file; `parse_config(data)` validates an in-memory
  mapping. Both return a `PlannerFile`: `.policy` (`PlannerConfig`) and `.service` (`ServiceConfig`). Both
  raise `ConfigError` (a `ValueError`) whose text is a single line naming the source, the
  dotted field, the offending value and what is allowed.
* `config_hash(policy)` fingerprints a policy (sha256 of its canonical JSON), to record which policy
  produced a decision.

The split (one flat file, two models). The rule is what the decision reads:

* `PlannerConfig`, the policy: every field `tick()`, the pipeline, the policies, the predictors or the perf
  models read, the inputs those models are built from (profile folder, perf table, warm-up trace, backend,
  plugins), the identity of the deployment decided for (mode, environment, namespace, model name, metrics
  series) and the fields the validation rules tie to them. Frozen, hashed by `config_hash`, handed to `tick`
  and stored with every tick so replay can rebuild it.
* `ServiceConfig`, the service settings: how the service runs around the decision and never what it decides:
  where reports go and how often, ports, the log folder, the Prometheus endpoint, the execution cadence and the
  virtual connector's timeout. Not hashed, not stored with ticks.

A field's model is chosen by its name alone, so a Dynamo-style file loads unchanged and the error messages
name the field as written in the file.

The modules, each importing at run time only those listed before it:

* `enums`: the choices (`PlannerMode`, `OptimizationTarget`, ...) and `managed_components`.
* `errors`: `ConfigError` and the rendering of one rule's violation.
* `limits`: `Number` / `Whole` (no booleans or text taken for a number) and the upper bound of every kind of field.
* `plugins`: the plugin sections of the policy (`plugins`, `scheduling` and its external plugins).
* `rules`: the policy's cross-field rules, in named groups, in the order they are reported.
* `policy`: `PlannerConfig` and its `EngineLimitsConfig` sections.
* `service`: `ServiceConfig`, its sections, and `PlannerFile` (one file: policy and service).
* `loading`: `parse_config`, `load_config`, the YAML/JSON parsing and its bounds, the paths a config names.
* `hashing`: `config_hash`.
* `live`: `LIVE_FIELDS`, the policy fields a live retune may change, and `live_changes`.
"""

from __future__ import annotations

from planner_core.config.enums import (
    Backend,
    EnvironmentKind,
    LengthSizing,
    LoadNextRequest,
    LoadPolicy,
    LoadPredictorName,
    OptimizationTarget,
    OutsideChangeRule,
    PlannerMode,
    RouterKind,
    SweepingMode,
    ThroughputAlgorithm,
    ThroughputMetricsSource,
    WorkloadKind,
    managed_components,
)
from planner_core.config.errors import ConfigError
from planner_core.config.hashing import config_hash
from planner_core.config.limits import (
    MAX_COUNT,
    MAX_GPUS,
    MAX_GPUS_PER_ENGINE,
    MAX_INTERVAL_S,
    MAX_LATENCY_MS,
    MAX_REPLICAS,
    MAX_TOKENS,
    Number,
    Whole,
)
from planner_core.config.live import LIVE_FIELDS, live_changes
from planner_core.config.loading import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    load_config,
    parse_config,
    resolve_config_relative,
    resolve_profile_dir,
)
from planner_core.config.plugins import (
    EXTERNAL_PLUGIN_NEEDS,
    EXTERNAL_PLUGIN_TYPES,
    CircuitBreakerConfig,
    ExternalPluginConfig,
    PluginOverrideConfig,
    PluginsConfig,
    SchedulingConfig,
)
from planner_core.config.policy import EngineLimitsConfig, PlannerConfig
from planner_core.config.rules import _gcd_seconds as _gcd_seconds  # the pipeline's tick period uses it too
from planner_core.config.service import (
    MOCKER_COMMAND,
    FleetShareConfig,
    KubernetesWorkloadsConfig,
    LocalWorkersConfig,
    PlannerFile,
    ServiceConfig,
    WorkloadRef,
)
from planner_core.domain import LengthQuantile

__all__ = [
    "LIVE_FIELDS",
    "OutsideChangeRule",
    "EXTERNAL_PLUGIN_NEEDS",
    "EXTERNAL_PLUGIN_TYPES",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_NODES",
    "MAX_COUNT",
    "MAX_GPUS",
    "MAX_GPUS_PER_ENGINE",
    "MAX_INTERVAL_S",
    "MAX_LATENCY_MS",
    "MAX_REPLICAS",
    "MAX_TOKENS",
    "MOCKER_COMMAND",
    "Backend",
    "CircuitBreakerConfig",
    "ConfigError",
    "EngineLimitsConfig",
    "EnvironmentKind",
    "ExternalPluginConfig",
    "FleetShareConfig",
    "KubernetesWorkloadsConfig",
    "LengthQuantile",
    "LengthSizing",
    "LoadNextRequest",
    "LoadPolicy",
    "LoadPredictorName",
    "LocalWorkersConfig",
    "Number",
    "OptimizationTarget",
    "PlannerConfig",
    "PlannerFile",
    "PlannerMode",
    "PluginOverrideConfig",
    "PluginsConfig",
    "RouterKind",
    "SchedulingConfig",
    "ServiceConfig",
    "SweepingMode",
    "ThroughputAlgorithm",
    "ThroughputMetricsSource",
    "Whole",
    "WorkloadKind",
    "WorkloadRef",
    "config_hash",
    "live_changes",
    "load_config",
    "managed_components",
    "parse_config",
    "resolve_config_relative",
    "resolve_profile_dir",
]

# Every class keeps `planner_core.config` as its module, as before the split: the configuration reference the docs
# render from the code (docs/hooks/generated.py) prints `module.Class`, and reprs and pickles name the module too, so
# none of them changes with the module a class is defined in. The package re-exports each class under that name.
for _exported in (
    Backend,
    EnvironmentKind,
    LengthSizing,
    LoadNextRequest,
    LoadPolicy,
    LoadPredictorName,
    OptimizationTarget,
    PlannerMode,
    RouterKind,
    SweepingMode,
    ThroughputAlgorithm,
    ThroughputMetricsSource,
    WorkloadKind,
    ConfigError,
    CircuitBreakerConfig,
    ExternalPluginConfig,
    PluginOverrideConfig,
    PluginsConfig,
    SchedulingConfig,
    EngineLimitsConfig,
    PlannerConfig,
    FleetShareConfig,
    KubernetesWorkloadsConfig,
    LocalWorkersConfig,
    PlannerFile,
    ServiceConfig,
    WorkloadRef,
):
    _exported.__module__ = __name__
del _exported
