"""The planner's static configuration: one validated, frozen `PlannerConfig` per deployment.

This module is the only place that knows the configuration file format. It accepts the same JSON/YAML
object that NVIDIA Dynamo 1.6.1's planner reads (same field names, aliases and defaults), validates it
with rules that say what is wrong in one line, and exposes derived values as read-only properties
instead of rewriting fields. It never reads `os.environ`: values that Dynamo takes from the environment
get a fixed default here, and process/runtime settings (credentials, DSNs, ...) live elsewhere.

Public entry points:

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
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from planner_core.domain import Component, EngineLimits, HoldPolicy, LengthQuantile

__all__ = [
    "Backend",
    "ConfigError",
    "EngineLimitsConfig",
    "EnvironmentKind",
    "FleetShareConfig",
    "KubernetesWorkloadsConfig",
    "LengthQuantile",
    "LengthSizing",
    "LoadNextRequest",
    "LoadPolicy",
    "LoadPredictorName",
    "OptimizationTarget",
    "PlannerConfig",
    "PlannerFile",
    "PlannerMode",
    "PluginOverrideConfig",
    "PluginsConfig",
    "SchedulingConfig",
    "ServiceConfig",
    "SweepingMode",
    "ThroughputAlgorithm",
    "ThroughputMetricsSource",
    "WorkloadKind",
    "WorkloadRef",
    "config_hash",
    "load_config",
    "managed_components",
    "parse_config",
]


# --------------------------------------------------------------------------------------------------------
# Choices
# --------------------------------------------------------------------------------------------------------


class OptimizationTarget(enum.StrEnum):
    """What the planner optimises for."""

    THROUGHPUT = "throughput"  # static queue/KV thresholds tuned for utilisation ("easy" target)
    LATENCY = "latency"  # static thresholds tuned for headroom ("easy" target)
    LOAD = "load"  # user-supplied queue-token and KV-rate thresholds
    SLA = "sla"  # perf-model driven: meet ttft_ms / itl_ms


class LoadPolicy(enum.StrEnum):
    """Which algorithm the load loop runs (ours; Dynamo 1.x has only the first, Dynamo 0.x only the second)."""

    # Dynamo 1.x: every load tick, on the latest forward-pass metrics of each engine. Target `sla`: per-engine
    # TTFT/ITL estimates through the forward-pass model; targets throughput/latency/load: per-engine thresholds.
    PER_ENGINE = "per_engine"
    # Dynamo's deprecated 2025 load planner: averages of the prefill queue and the decode KV utilisation over an
    # adjustment interval against fixed thresholds, with a decode grace period and a prefill queue-trend check.
    THRESHOLD_2025 = "threshold_2025"


class PlannerMode(enum.StrEnum):
    """Which worker pools this planner instance manages."""

    DISAGG = "disagg"  # separate prefill and decode pools
    PREFILL = "prefill"  # only the prefill pool
    DECODE = "decode"  # only the decode pool
    AGG = "agg"  # one aggregated pool (modelled as the decode role)


class EnvironmentKind(enum.StrEnum):
    """Where scaling decisions are sent (the connector)."""

    KUBERNETES = "kubernetes"  # a Dynamo DynamoGraphDeployment
    KUBERNETES_WORKLOADS = "kubernetes-workloads"  # plain Deployments/StatefulSets, one per role
    VIRTUAL = "virtual"
    GLOBAL_PLANNER = "global-planner"
    LOCAL = "local"  # engine processes on this machine, started and stopped by the planner (`local_workers`)


class WorkloadKind(enum.StrEnum):
    """The Kubernetes workload kinds `environment: kubernetes-workloads` scales (apps/v1, scale subresource)."""

    DEPLOYMENT = "Deployment"
    STATEFUL_SET = "StatefulSet"


class Backend(enum.StrEnum):
    """Inference engine the workers run."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    MOCKER = "mocker"


class LoadPredictorName(enum.StrEnum):
    """Family of the traffic forecaster used by the throughput loop."""

    CONSTANT = "constant"  # last observed window
    ARIMA = "arima"  # statsmodels ARIMA, order chosen by AIC and re-chosen periodically
    PROPHET = "prophet"  # Prophet refitted on the last prophet_window_size windows
    KALMAN = "kalman"  # local linear trend Kalman filter
    # Ours, not Dynamo's: follows whichever of constant / kalman / arima has the lowest recent loss, and never
    # forecasts below the last window right after a burst.
    ENSEMBLE = "ensemble"


class SweepingMode(enum.StrEnum):
    """How engine performance was profiled before deployment."""

    NONE = "none"  # no bootstrap data
    RAPID = "rapid"  # simulated (AI Configurator)
    THOROUGH = "thorough"  # measured on real GPUs


class ThroughputAlgorithm(enum.StrEnum):
    """How the throughput loop turns a forecast into replicas (ours: Dynamo has one per release)."""

    # Dynamo 0.x: tokens/s/GPU interpolated from the pre-deployment profile at the forecast shape.
    INTERPOLATION = "interpolation"
    # Dynamo 0.x with its correction factors: observed / interpolated TTFT and ITL rescale the load and the ITL
    # target each interval. Needs observed TTFT and ITL; without them the factors are 1 and the step says so.
    INTERPOLATION_CORRECTED = "interpolation_corrected"
    # Dynamo 1.x: requests/s one engine sustains under the SLA, searched over batch sizes on a forward-pass model
    # (planner_core.perf.capacity): the online model fitted on live forward-pass metrics once it is ready, before
    # that the precomputed perf table if one is configured, else the profile. Also sizes aggregated mode.
    ENGINE_CAPACITY = "engine_capacity"


class LoadNextRequest(enum.StrEnum):
    """What the SLA load loop assumes of the "next request" every TTFT/ITL estimate adds."""

    # Dynamo 1.x (1.0 to 1.6.1): the engines' own moving averages over the last `max_num_fpm_samples` reports,
    # whether or not the throughput loop runs: prompt tokens computed per prefill request in an iteration (a
    # chunk of a long prompt counts as its chunk; an iteration without prefill counts 0) and KV tokens per
    # decode request.
    ENGINE_AVERAGE = "engine_average"
    # Ours: the last traffic window's mean ISL and OSL (ISL + OSL/2 of KV for decode) when the throughput loop
    # observed one, else the engines' moving averages. The whole prompt, not its chunks or the idle iterations.
    TRAFFIC_WINDOW = "traffic_window"


class LengthSizing(enum.StrEnum):
    """Which request shape the throughput loop sizes for (ours, not Dynamo's)."""

    MEAN = "mean"  # the forecast mean ISL/OSL (Dynamo's behaviour)
    # The forecast `load_predictor_length_quantile` of ISL and OSL: as if every request were as long as the
    # tail, so that requests at that quantile still fit the capacity the SLA was sized for.
    QUANTILE = "quantile"


class ThroughputMetricsSource(enum.StrEnum):
    """Which Prometheus series the traffic observation is read from."""

    FRONTEND = "frontend"
    ROUTER = "router"


# --------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------


class RouterKind(enum.StrEnum):
    """The frontend's request router (ours; the simulator runs each)."""

    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    SLO = "slo"  # SLO-aware routing (planner_core.routing): lowest predicted latency within SLO x threshold


class ConfigError(ValueError):
    """A configuration could not be read or is invalid.

    `str()` is always one line: ``<source>: <detail>``, e.g.
    ``planner.yaml: field 'ttft_ms' = -5: must be > 0``.

    Attributes:
        source: the file path or label the configuration came from.
        field: dotted name of the offending field, or None when the problem is not about one field
            (unreadable file, bad syntax, top level not a mapping).
    """

    def __init__(self, message: str, *, source: str = "", field: str | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.field = field


_RULE_ERROR = "planner_config_rule"
_MAX_SHOWN_VALUE = 80


def _show(value: Any) -> str:
    """Render a value for an error message: strings quoted, other scalars as JSON, one line, bounded."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str, allow_nan=True)
        except (TypeError, ValueError):
            text = repr(value)
    text = text.replace("\n", " ")
    if len(text) > _MAX_SHOWN_VALUE:
        text = text[: _MAX_SHOWN_VALUE - 3] + "..."
    return text


def _rule(field: str, value: Any, requirement: str) -> tuple[str, Any, str]:
    """One cross-field violation: the field to blame, its value, and what is required of it."""
    return field, value, requirement


def _raise_rules(violations: list[tuple[str, Any, str]]) -> None:
    """Raise the first violation as a pydantic error that remembers the field, value and remaining count."""
    if not violations:
        return
    field, value, requirement = violations[0]
    raise PydanticCustomError(
        _RULE_ERROR,
        "field '{field}' = {shown}: {requirement}",
        {"field": field, "shown": _show(value), "requirement": requirement, "more": len(violations) - 1},
    )


# --------------------------------------------------------------------------------------------------------
# Numbers: no booleans or text taken for a number, and sane maxima
# --------------------------------------------------------------------------------------------------------


def _number_only(value: Any) -> Any:
    """Refuse what pydantic's lax mode would turn into a number: `true` is not 1 ms, `"50"` is not 50."""
    if isinstance(value, (bool, str, bytes)):
        raise PydanticCustomError("float_type", "must be a number")
    return value


def _whole_only(value: Any) -> Any:
    """As `_number_only`, for integer fields (a whole float such as 60.0 still passes, 2.5 does not)."""
    if isinstance(value, (bool, str, bytes)):
        raise PydanticCustomError("int_type", "must be an integer")
    return value


Number = Annotated[float, BeforeValidator(_number_only)]
Whole = Annotated[int, BeforeValidator(_whole_only)]

# Upper bounds. A value past one of these is a typo or an attack, never a deployment: unbounded, `min_endpoint: 2**40`
# overflowed the database's integer columns on every tick and a million made the demo's simulated cluster grow
# past 3 GB. Each is far above any real cluster and inside Postgres' 32-bit `integer`.
MAX_REPLICAS = 10_000
"""Most replicas of one pool (min_endpoint, role floors, max_throughput_scaling_replicas)."""
MAX_GPUS = 1_000_000
"""Most GPUs of a budget (max_gpu_budget, min_gpu_budget)."""
MAX_GPUS_PER_ENGINE = 1024
"""Most GPUs one engine spans."""
MAX_INTERVAL_S = 86_400
"""Longest loop interval, deadline or hold (s): one day."""
MAX_LATENCY_MS = 3_600_000.0
"""Longest TTFT / ITL target (ms): one hour."""
MAX_TOKENS = 1_000_000_000
"""Most tokens of an engine limit (batched tokens, KV tokens, context length) or a queue threshold."""
MAX_COUNT = 1_000_000
"""Most samples, windows, observations or sequences a field may ask to be kept or run (memory is per count)."""
_REPLICAS = {"le": MAX_REPLICAS}
_GPUS = {"le": MAX_GPUS}
_INTERVAL = {"le": MAX_INTERVAL_S}
_TOKENS = {"le": MAX_TOKENS}
_COUNT = {"le": MAX_COUNT}
_LATENCY = {"le": MAX_LATENCY_MS}
_ENGINE_GPUS = {"le": MAX_GPUS_PER_ENGINE}
_PRIORITY = {"ge": -MAX_COUNT, "le": MAX_COUNT}
_SPECULATIVE = {"le": 64}  # draft tokens per step; real drafts propose a handful
_POWER = {"le": 1_000_000_000}  # watts: a gigawatt
_HOURS = {"le": 24 * 366}  # a year
# Thresholds and noise variances have no natural maximum; this one keeps their arithmetic finite.
_MAGNITUDE = {"le": 1e12}


# --------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------


class CircuitBreakerConfig(BaseModel):
    """A plugin's circuit breaker (ours; Dynamo's is fixed at 5 consecutive failures and a 30 s cool-down).

    Attributes:
        failure_threshold: failures (unreachable, deadline exceeded, error, garbage answer) within `window_seconds`
            that open the breaker; an open breaker skips the plugin.
        window_seconds: how far back failures count (s of tick time).
        cooldown_seconds: how long the breaker stays open before one trial call (half-open) may close it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    failure_threshold: int = Field(default=5, ge=1, description="Failures within the window that open the breaker.")
    window_seconds: float = Field(default=60.0, gt=0, description="How far back failures count (s).")
    cooldown_seconds: float = Field(default=30.0, gt=0, description="Seconds open before a trial call.")


EXTERNAL_PLUGIN_TYPES = ("observe", "predict", "propose", "reconcile", "constrain")
# `PluginSpec.needs` spellings (planner_core.pipeline.Observation values); repeated here because the config sits
# below the pipeline
EXTERNAL_PLUGIN_NEEDS = ("observations.traffic", "observations.fpm", "observations.workers")
_ENDPOINT = re.compile(r"^(grpc://)?[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}$|^unix://.+$")


class ExternalPluginConfig(BaseModel):
    """One out-of-process plugin, reached over gRPC (Dynamo's `ExternalPluginEntry`, plus our deadline and
    breaker). See docs/plugins.md, "Out-of-process plugins".

    Attributes:
        plugin_id: unique among all plugins, `[a-z][a-z0-9_.-]*`.
        plugin_type: the phase it serves: observe, predict, propose, reconcile or constrain.
        priority: merge precedence; smaller wins.
        endpoint: `grpc://host:port`, `host:port` or `unix:///path`.
        timeout_seconds: the gRPC deadline of one call (Dynamo's `request_timeout_seconds`, 5 s).
        execution_interval_seconds: run at most this often (s); 0 = every tick.
        hold_policy: what it contributes while not due (`hold_last` / `accept_when_idle`, either case).
        needs: inputs it reads (`observations.traffic`, `observations.fpm`, `observations.workers`).
        requires_produced_fields: fields earlier plugins must have produced this tick.
        circuit_breaker: when to stop calling it, and when to try again.
        auth_token, protocol_version, observation_window_seconds: Dynamo's fields; accepted, not used (no
            registration gateway; traffic is observed over the loop's own window).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    plugin_id: str = Field(pattern=r"^[a-z][a-z0-9_.-]{0,62}$", description="Unique plugin id.")
    plugin_type: str = Field(description="observe | predict | propose | reconcile | constrain.")
    priority: int = Field(default=100, description="Merge precedence; smaller wins.")
    endpoint: str = Field(description="grpc://host:port, host:port or unix:///path.")
    timeout_seconds: float = Field(default=5.0, gt=0, description="gRPC deadline of one call (s).")
    execution_interval_seconds: float = Field(default=0.0, ge=0, description="Run at most this often (s).")
    hold_policy: HoldPolicy = Field(default=HoldPolicy.ACCEPT_WHEN_IDLE, description="Contribution while not due.")
    needs: tuple[str, ...] = Field(default=(), description="Inputs it reads.")
    requires_produced_fields: tuple[str, ...] = Field(default=(), description="Fields it needs produced first.")
    circuit_breaker: CircuitBreakerConfig = Field(
        default_factory=CircuitBreakerConfig, description="Circuit breaker settings."
    )
    auth_token: str = Field(default="", description="Dynamo's; accepted, not used.")
    protocol_version: str = Field(default="1.0", description="Dynamo's; accepted, not used.")
    observation_window_seconds: float = Field(default=0.0, ge=0, description="Dynamo's; accepted, not used.")

    @model_validator(mode="before")
    @classmethod
    def _dynamo_spellings(cls, data: Any) -> Any:
        """Dynamo writes the phase and hold policy in any case (`PROPOSE`, `HOLD_LAST`)."""
        if isinstance(data, Mapping):
            data = dict(data)
            for name in ("plugin_type", "hold_policy"):
                if isinstance(data.get(name), str):
                    data[name] = data[name].lower()
        return data


class SchedulingConfig(BaseModel):
    """Cadence of the per-tick decision pipeline (Dynamo's `scheduling` section).

    Attributes:
        scale_interval_seconds: base tick period (s). None means "derive it": see
            `PlannerConfig.scale_interval_seconds_effective`. When set it must evenly divide the active
            loop intervals.
        tick_max_duration_seconds: deadline (s) for one whole tick of the pipeline.
        external_plugins: out-of-process plugins called over gRPC in every tick (Dynamo's static registrations).
        gateway: Dynamo's plugin-registration gRPC gateway settings. Accepted verbatim, not supported: external
            plugins are listed in `external_plugins`, they do not register themselves.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    scale_interval_seconds: Number | None = Field(
        **_INTERVAL, default=None, gt=0, description="Base tick period (s); None = derived from the loop intervals."
    )
    tick_max_duration_seconds: Number = Field(
        **_INTERVAL, default=30.0, gt=0, description="Deadline (s) for one whole tick of the pipeline."
    )
    external_plugins: tuple[ExternalPluginConfig, ...] = Field(
        default=(), description="Out-of-process plugins called over gRPC."
    )
    # Not supported: opaque pass-through so Dynamo configuration files load unchanged.
    gateway: dict[str, Any] | None = Field(
        default=None, description="Dynamo's plugin gateway settings; accepted, not used."
    )

    @model_validator(mode="after")
    def _external_plugins_valid(self) -> SchedulingConfig:
        seen: set[str] = set()
        violations: list[tuple[str, Any, str]] = []
        for index, entry in enumerate(self.external_plugins):
            where = f"scheduling.external_plugins[{index}]"
            if entry.plugin_id in seen:
                violations.append(_rule(f"{where}.plugin_id", entry.plugin_id, "listed twice"))
            seen.add(entry.plugin_id)
            if entry.plugin_type not in EXTERNAL_PLUGIN_TYPES:
                requirement = "must be one of " + ", ".join(EXTERNAL_PLUGIN_TYPES)
                violations.append(_rule(f"{where}.plugin_type", entry.plugin_type, requirement))
            if not _ENDPOINT.match(entry.endpoint):
                requirement = "must be grpc://host:port, host:port or unix:///path"
                violations.append(_rule(f"{where}.endpoint", entry.endpoint, requirement))
            for need in entry.needs:
                if need not in EXTERNAL_PLUGIN_NEEDS:
                    requirement = "must be one of " + ", ".join(EXTERNAL_PLUGIN_NEEDS)
                    violations.append(_rule(f"{where}.needs", need, requirement))
        _raise_rules(violations)
        return self


class EngineLimitsConfig(BaseModel):
    """Static limits of one pool's engines (ours; Dynamo reads them from the model card and the deployment).

    Unset limits take Dynamo's fallbacks: 8192 batched tokens, 512 sequences; KV tokens from the engine profile
    when one is loaded, else 2,000,000.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_num_batched_tokens: Whole = Field(
        **_TOKENS, default=8192, gt=0, description="Most tokens one engine iteration batches (tokens)."
    )
    max_num_seqs: Whole = Field(
        **_COUNT, default=512, gt=0, description="Most sequences one engine runs at once (count)."
    )
    max_kv_tokens: Whole | None = Field(
        **_TOKENS,
        default=None,
        gt=0,
        description="KV-cache capacity of one engine (tokens); None = the profile's, else 2,000,000.",
    )
    context_length: Whole | None = Field(
        **_TOKENS, default=None, gt=0, description="Longest sequence one engine accepts (tokens); None = unbounded."
    )


class PluginOverrideConfig(BaseModel):
    """Operator overrides of one plugin's scheduling (ours); unset fields keep the plugin's own spec.

    Attributes:
        priority: merge precedence; smaller wins (its SET is the recommendation, its `final` wins).
        interval_seconds: run at most this often (s); 0 means every tick.
        hold_policy: what the plugin contributes while not due.
        timeout_seconds: a run that takes longer (measured only when the caller passes a clock) is discarded; refused
            for a builtin plugin, which is never timed (a decision must not depend on the machine's speed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    priority: Whole | None = Field(**_PRIORITY, default=None, description="Merge precedence; smaller wins.")
    interval_seconds: Number | None = Field(
        **_INTERVAL, default=None, ge=0, description="Run at most this often (s); 0 = every tick."
    )
    hold_policy: HoldPolicy | None = Field(default=None, description="What the plugin contributes while not due.")
    timeout_seconds: Number | None = Field(
        **_INTERVAL, default=None, gt=0, description="Seconds after which a run is discarded (not for builtin plugins)."
    )


class PluginsConfig(BaseModel):
    """User plugins of the decision pipeline (ours; see `planner_core.pipeline`).

    Installed packages offer plugins through the `llm_planner.plugins` entry-point group; only those named in
    `enabled` are loaded, so installing a package never changes decisions by itself.

    Attributes:
        enabled: entry-point names to load, in addition to the builtin plugins.
        settings: per entry-point name, the mapping passed to its factory.
        overrides: per plugin id (builtin or user), scheduling overrides.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    enabled: tuple[str, ...] = Field(default=(), description="Entry-point names to load beside the builtin plugins.")
    settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per entry-point name, the mapping passed to its factory."
    )
    overrides: dict[str, PluginOverrideConfig] = Field(
        default_factory=dict, description="Per plugin id, scheduling overrides."
    )

    @model_validator(mode="after")
    def _settings_for_enabled_plugins(self) -> PluginsConfig:
        """Settings for a plugin that is not enabled would be silently unused; listing one twice is a slip."""
        violations: list[tuple[str, Any, str]] = []
        seen: set[str] = set()
        for name in self.enabled:
            if name in seen:
                violations.append(_rule("plugins.enabled", name, "listed more than once"))
            seen.add(name)
        for name in self.settings:
            if name not in seen:
                violations.append(_rule(f"plugins.settings.{name}", name, "not in plugins.enabled"))
        _raise_rules(violations)
        return self


# Field name -> the other accepted spellings (Dynamo's aliases).
_ALIASES: dict[str, tuple[str, ...]] = {
    "ttft_ms": ("ttft",),
    "itl_ms": ("itl",),
    "throughput_adjustment_interval_seconds": ("throughput_adjustment_interval",),
    "load_adjustment_interval_seconds": ("load_adjustment_interval",),
}
_ALIAS_TO_FIELD = {alias: name for name, aliases in _ALIASES.items() for alias in aliases}


def _aliased(name: str) -> AliasChoices:
    """Accept a field under its own name or any of its Dynamo aliases."""
    return AliasChoices(name, *_ALIASES[name])


_PORT = {"ge": 0, "le": 65535}


class PlannerConfig(BaseModel):
    """Everything that shapes the planner's decisions, validated and immutable.

    Field names, aliases and defaults follow Dynamo 1.6.1's `PlannerConfig`; see the project's Dynamo
    reference (section 2) for each field's meaning. Units are in the names: `*_ms` milliseconds,
    `*_seconds` seconds, `*_hours` hours, `total_gpu_power_limit` watts, `decode_*_kv_rate` percent of the
    KV cache (0-100), `prefill_*_queue_tokens` tokens.

    Unlike Dynamo, validation never rewrites fields (Dynamo switches the loop flags for the easy targets
    and fills in the scale interval); the values actually in force are the read-only properties
    `throughput_scaling_active`, `load_scaling_active`, `prefill_min_endpoint_effective`,
    `decode_min_endpoint_effective`, `scale_interval_seconds_effective`, `prefill_gpus_per_engine` and
    `decode_gpus_per_engine`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # --- what to optimise, for which deployment -----------------------------------------------------
    optimization_target: OptimizationTarget = Field(
        default=OptimizationTarget.THROUGHPUT,
        description="What the planner optimises for: throughput, latency, load (thresholds) or sla (TTFT/ITL).",
    )
    mode: PlannerMode = Field(
        default=PlannerMode.DISAGG,
        description="Which worker pools this planner manages: disagg, prefill, decode or agg.",
    )
    environment: EnvironmentKind = Field(
        default=EnvironmentKind.KUBERNETES,
        description="Where decisions are sent: kubernetes, kubernetes-workloads, virtual or global-planner.",
    )
    backend: Backend = Field(
        default=Backend.VLLM, description="Inference engine the workers run (selects the perf table and metric names)."
    )
    # Dynamo reads DYN_NAMESPACE here (and leaves it out of dumps); we use a fixed default and keep it in.
    namespace: str = Field(
        default="dynamo", description="Dynamo namespace of the deployment (Prometheus labels, Kubernetes lookups)."
    )
    global_planner_namespace: str | None = Field(
        default=None, description="Namespace of the global planner; required when environment is global-planner."
    )  # required when environment is global-planner
    model_name: str | None = Field(
        default=None,
        description="Served model name; None = taken from the deployment (Kubernetes) or required (virtual).",
    )  # needed by the virtual connector

    # --- SLA targets (used by the `sla` target only) -----------------------------------------------
    ttft_ms: Number = Field(
        **_LATENCY,
        default=500.0,
        gt=0,
        validation_alias=_aliased("ttft_ms"),
        description="Time-to-first-token target (ms) of the sla target.",
    )
    itl_ms: Number = Field(
        **_LATENCY,
        default=50.0,
        gt=0,
        validation_alias=_aliased("itl_ms"),
        description="Inter-token-latency target (ms) of the sla target.",
    )

    # --- routing (ours): how the frontend places requests, which the throughput loop sizes for ---------
    router: RouterKind = Field(
        default=RouterKind.LEAST_LOADED,
        description="The frontend's request router: least_loaded, round_robin, or slo (SLO-aware: an engine is "
        "loaded only while it is predicted within SLO x dispatch threshold, so the throughput loop sizes each "
        "engine's capacity at those targets).",
    )
    ttft_dispatch_threshold: float = Field(
        default=1.0,
        gt=0,
        description="Router slo: an engine is sent a prompt only if its predicted TTFT <= ttft_ms x this.",
    )
    tpot_dispatch_threshold: float = Field(
        default=1.0,
        gt=0,
        description="Router slo: an engine is sent a request to decode only if its predicted TPOT <= itl_ms x this.",
    )

    # --- the two loops --------------------------------------------------------------------------------
    enable_throughput_scaling: bool = Field(
        default=True, description="Run the predictive throughput loop (sla target only)."
    )
    enable_load_scaling: bool = Field(
        default=False, description="Run the reactive load loop with the sla target (always on for the other targets)."
    )
    throughput_adjustment_interval_seconds: Whole = Field(
        **_INTERVAL,
        description="Seconds between two throughput-loop decisions (the traffic window).",
        default=180,
        gt=0,
        validation_alias=_aliased("throughput_adjustment_interval_seconds"),
    )
    load_adjustment_interval_seconds: Whole = Field(
        **_INTERVAL,
        description="Seconds between two load-loop ticks.",
        default=5,
        gt=0,
        validation_alias=_aliased("load_adjustment_interval_seconds"),
    )
    scheduling: SchedulingConfig = Field(
        default_factory=SchedulingConfig,
        description="Cadence of the tick pipeline: base tick period and tick deadline (s).",
    )

    # --- replica and GPU limits ---------------------------------------------------------------------
    max_throughput_scaling_replicas: Whole = Field(
        **_REPLICAS, default=8, gt=0, description="Most replicas per pool the throughput loop may ask for."
    )
    max_gpu_budget: Whole = Field(
        **_GPUS, default=8, ge=-1, description="Most GPUs over all managed pools; -1 = no ceiling."
    )  # -1 disables the ceiling
    min_gpu_budget: Whole = Field(
        **_GPUS, default=-1, ge=-1, description="Fewest GPUs over all managed pools; -1 = no floor."
    )  # -1 disables the floor
    min_endpoint: Whole = Field(
        **_REPLICAS, default=1, ge=0, description="Fewest replicas per pool; 0 allows scale-to-zero."
    )  # 0 allows scale-to-zero
    prefill_min_endpoint: Whole | None = Field(
        **_REPLICAS, default=None, ge=1, description="Fewest prefill replicas; None = min_endpoint."
    )
    decode_min_endpoint: Whole | None = Field(
        **_REPLICAS, default=None, ge=1, description="Fewest decode (or aggregated) replicas; None = min_endpoint."
    )
    # Legacy per-engine GPU width; Dynamo now prefers the deployment status. None means 1.
    prefill_engine_num_gpu: Whole | None = Field(
        **_ENGINE_GPUS,
        default=None,
        ge=1,
        description="GPUs per prefill engine; None = 1 (or the deployment's value on Kubernetes).",
    )
    decode_engine_num_gpu: Whole | None = Field(
        **_ENGINE_GPUS,
        default=None,
        ge=1,
        description="GPUs per decode (or aggregated) engine; None = 1 (or the deployment's value).",
    )

    prefill_engine: EngineLimitsConfig = Field(
        default_factory=EngineLimitsConfig,
        description="Static limits of one prefill engine (batched tokens, sequences, KV tokens, context).",
    )  # ours
    decode_engine: EngineLimitsConfig = Field(
        default_factory=EngineLimitsConfig,
        description="Static limits of one decode (or aggregated) engine (batched tokens, sequences, KV tokens).",
    )  # ours; the agg pool too

    # --- traffic forecasting --------------------------------------------------------------------------
    load_predictor: LoadPredictorName = Field(
        default=LoadPredictorName.ARIMA,
        description="Traffic forecaster of the throughput loop: constant, arima, prophet, kalman or ensemble.",
    )
    load_predictor_log1p: bool = Field(
        default=False, description="Forecast log1p of the request rate instead of the rate itself."
    )
    prophet_window_size: Whole = Field(
        **_COUNT, default=50, gt=0, description="Windows Prophet is refitted on (count)."
    )
    kalman_q_level: Number = Field(
        **_MAGNITUDE, default=1.0, gt=0, description="Kalman process noise of the level (requests^2 per window)."
    )
    kalman_q_trend: Number = Field(
        **_MAGNITUDE, default=0.1, ge=0, description="Kalman process noise of the trend (requests^2 per window)."
    )
    kalman_r: Number = Field(**_MAGNITUDE, default=10.0, gt=0, description="Kalman measurement noise (requests^2).")
    kalman_min_points: Whole = Field(
        **_COUNT, default=5, gt=0, description="Windows observed before the Kalman filter forecasts (count)."
    )
    load_predictor_warmup_trace: str | None = Field(
        default=None,
        description="Request trace (file, glob or folder, relative to the config) the forecaster is warmed on.",
    )  # file, glob or directory of request traces
    # Ours, not Dynamo's: which percentile of ISL/OSL is forecast next to the mean (Prediction.isl_quantile /
    # osl_quantile), so capacity can be sized on the length distribution rather than its mean alone.
    load_predictor_length_quantile: LengthQuantile = Field(
        default=LengthQuantile.P90, description="Quantile of ISL/OSL forecast beside the mean: p50, p90 or p99."
    )
    # Ours: size on the mean request shape (Dynamo) or on the length quantile above.
    throughput_length_sizing: LengthSizing = Field(
        default=LengthSizing.MEAN, description="Request shape the throughput loop sizes for: mean or quantile."
    )
    # Ours: which sizing algorithm the throughput loop runs (see ThroughputAlgorithm).
    throughput_algorithm: ThroughputAlgorithm = Field(
        default=ThroughputAlgorithm.INTERPOLATION, description="How the throughput loop turns a forecast into replicas."
    )
    # Ours: a perf table precomputed with `planner perf-table` (may be relative to the config file): the
    # forward-pass model between the profile and live metrics in the bootstrap chain.
    perf_table: str | None = Field(
        default=None,
        description="Precomputed perf table file (relative to the config); None = profile and live metrics only.",
    )

    # --- load loop / perf-model tuning ----------------------------------------------------------------
    max_num_fpm_samples: Whole = Field(
        **_COUNT,
        default=64,
        gt=0,
        description="Forward-pass metric samples kept per engine for the moving averages (count).",
    )
    fpm_sample_bucket_size: Whole = Field(
        **_COUNT,
        default=16,
        gt=0,
        description="Buckets of the online perf model's sample grid (count, a perfect square).",
    )  # must be a perfect square
    load_min_observations: Whole = Field(
        **_COUNT, default=5, gt=0, description="Forward-pass observations needed before the load loop decides (count)."
    )
    load_scaling_down_sensitivity: Whole = Field(
        default=80, ge=0, le=100, description="How readily the load loop scales down (percent, 0-100)."
    )
    # Tail-latency signal of the SLA load loop (ours; off = Dynamo, which reads per-engine estimates only): where the
    # traffic source measures the frontend's p95/p99 TTFT and queue time, the pool that computes prompts adds an
    # engine when the p99 (else p95) TTFT or the mean wait for a first token is above the TTFT target, and does not
    # shrink while the tail is above the scale-down sensitivity's share of it (planner_core.policy.load).
    load_tail_latency_scaling: bool = Field(
        default=False, description="Load loop also scales prompt engines on frontend p95/p99 TTFT and queue time."
    )
    prefill_scale_up_queue_tokens: Whole | None = Field(
        **_TOKENS,
        default=None,
        ge=0,
        description="Queued prefill tokens per engine above which the load target adds a worker.",
    )
    prefill_scale_down_queue_tokens: Whole | None = Field(
        **_TOKENS,
        default=None,
        ge=0,
        description="Queued prefill tokens per engine below which the load target removes one.",
    )
    decode_scale_up_kv_rate: Number | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Decode KV-cache use (percent) above which the load target adds a worker.",
    )
    decode_scale_down_kv_rate: Number | None = Field(
        default=None, ge=0, le=100, description="Decode KV-cache use (percent) below which the load target removes one."
    )
    speculative_nextn: Whole = Field(
        **_SPECULATIVE,
        default=0,
        ge=0,
        description="Tokens proposed per step by speculative decoding (count); 0 = off.",
    )

    # --- profiling data -------------------------------------------------------------------------------
    pre_deployment_sweeping_mode: SweepingMode | None = Field(
        default=SweepingMode.RAPID,
        description="How the engine profile was made: none, rapid (simulated) or thorough (measured).",
    )
    profile_results_dir: str = Field(
        default="profiling_results", description="Folder of the engine profile (relative to the config file)."
    )

    # --- metrics --------------------------------------------------------------------------------------
    throughput_metrics_source: ThroughputMetricsSource = Field(
        default=ThroughputMetricsSource.FRONTEND,
        description="Prometheus series traffic is observed from: frontend or router.",
    )

    # --- operation --------------------------------------------------------------------------------------
    advisory: bool = Field(
        default=False, description="Decide and record, never execute."
    )  # decide and record, never execute
    enable_power_awareness: bool = Field(
        default=False, description="Keep the managed pools within total_gpu_power_limit."
    )
    total_gpu_power_limit: Whole | None = Field(
        **_POWER, default=None, ge=1, description="GPU power budget (W) when enable_power_awareness is on."
    )  # watts

    # --- not supported yet -------------------------------------------------------------------------
    # Accepted as opaque mappings only so that Dynamo configuration files load; nothing reads them.
    aic_interpolation: dict[str, Any] | None = Field(
        default=None, description="Dynamo's AI Configurator interpolation settings; accepted, not used."
    )
    ais_perf_model: dict[str, Any] | None = Field(
        default=None, description="Dynamo's AIS perf-model settings; accepted, not used."
    )

    # --- our extensions (not in Dynamo) -------------------------------------------------------------
    # User plugins of the decision pipeline: which entry points to load, their settings and scheduling overrides.
    plugins: PluginsConfig = Field(
        default_factory=PluginsConfig,
        description="User plugins of the decision pipeline: entry points, their settings, scheduling overrides.",
    )
    # Which algorithm the load loop runs: `per_engine` (Dynamo 1.x) or `threshold_2025` (Dynamo's 2025 load
    # planner). The fields below are read only by `threshold_2025`; their defaults are that planner's.
    load_policy: LoadPolicy = Field(
        default=LoadPolicy.PER_ENGINE,
        description="Load-loop algorithm: per_engine (Dynamo 1.x) or threshold_2025 (Dynamo's 2025 planner).",
    )
    # The SLA load loop's "next request" (`LoadNextRequest`): Dynamo's engine averages by default.
    load_next_request: LoadNextRequest = Field(
        default=LoadNextRequest.ENGINE_AVERAGE,
        description="The sla load loop's next request: engine_average or traffic_window.",
    )
    # Seconds between two decisions of `threshold_2025`; every load tick in between is one metrics sample (the
    # load interval plays the 2025 planner's `metric-pulling-interval`). 30 s is its documented default.
    threshold_2025_adjustment_interval_seconds: Whole = Field(
        **_INTERVAL, default=30, gt=0, description="Seconds between two threshold_2025 decisions."
    )
    # Interval-average KV-cache utilisation of the decode engines (fraction 0..1, queued KV included) above which a
    # decode worker is added / below which one is removed.
    decode_kv_scale_up_threshold: Number = Field(
        **_MAGNITUDE,
        default=0.9,
        ge=0,
        description="threshold_2025: decode KV use (fraction 0-1) above which a worker is added.",
    )
    decode_kv_scale_down_threshold: Number = Field(
        **_MAGNITUDE,
        default=0.5,
        ge=0,
        description="threshold_2025: decode KV use (fraction 0-1) below which one is removed.",
    )
    # Interval-average queued prefill requests (summed over the prefill engines) above which a prefill worker is
    # added / below which one is removed. 5.0 is the 2025 planner's code default (its docs said 0.5).
    prefill_queue_scale_up_threshold: Number = Field(
        **_MAGNITUDE,
        default=5.0,
        ge=0,
        description="threshold_2025: queued prefill requests above which a worker is added.",
    )
    prefill_queue_scale_down_threshold: Number = Field(
        **_MAGNITUDE,
        default=0.2,
        ge=0,
        description="threshold_2025: queued prefill requests below which one is removed.",
    )
    # Throughput-loop headroom (ours; 1.0 = Dynamo: size each pool to run at its searched capacity). Demand is
    # divided by this fraction before `ceil(demand / capacity)`, leaving room for queueing around the mean rate.
    throughput_prefill_target_utilization: Number = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Fraction (0-1] of searched prefill capacity the throughput loop sizes for.",
    )
    throughput_decode_target_utilization: Number = Field(
        default=1.0, gt=0, le=1, description="Fraction (0-1] of searched decode capacity the throughput loop sizes for."
    )
    # Burst-aware prefill sizing (ours; off = Dynamo). When the observed window carries its prompt-token arrival
    # curve (TrafficObservation.prompt_tokens_p99_*), prefill is also sized so that a p99 burst of every length,
    # scaled by the forecast's growth, drains within the TTFT target (planner_core.policy.throughput).
    throughput_prefill_burst_sizing: bool = Field(
        default=False, description="Also size prefill so a p99 prompt burst drains within the TTFT target."
    )
    # Scale-down hold (ours; 0 = Dynamo): each pool is sized for the largest need the throughput loop found over
    # the last this many seconds, so capacity removed in a lull is not missing when the traffic returns before a
    # new worker could start (start-up takes minutes; removing one is instant).
    throughput_scale_down_hold_seconds: Number = Field(
        **_INTERVAL,
        default=0.0,
        ge=0,
        description="Seconds over which the largest need found holds a pool up; 0 = off.",
    )
    # Scale-down margin (ours; 0 = Dynamo): a pool shrinks to m engines only when its need before rounding up
    # (demand / one engine's capacity, and the burst need) is at most m x (1 - margin). A need that wanders around
    # an integer at steady load otherwise drops a pool by one engine and raises it again minutes later.
    throughput_scale_down_margin: Number = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Fraction of the smaller size a pool's unrounded need must stay under to scale down; 0 = off.",
    )

    # Start-up-aware horizon (ours; 0 = off, Dynamo sizes for the next window). Each pool's need before rounding up
    # is raised by the q quantile of its residuals "peak need observed over the start-up + interval after a tick -
    # the need that tick planned" (engines), learned from the deployment's own windows (planner_core.policy.horizon),
    # before the scale-down hold. The one knob that trades GPU-hours for SLA attainment: higher q, more engines held
    # for the bursts a start-up time ahead.
    throughput_horizon_quantile: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Quantile (0-1) of the horizon shortfalls (engines) each pool's need is raised by; 0 = off.",
    )
    # The start-up time the horizon assumes for a pool until one of its scale-ups has been seen through to ready;
    # from then on the pool's measured start-up (median of its last scale-ups) is used.
    throughput_startup_seconds: float = Field(
        default=120.0, ge=0, description="Worker start-up time (s) assumed until one is measured."
    )

    # ------------------------------------------------------------------------------------------------
    # Validation (never mutates; raises the first violation and counts the rest)
    # ------------------------------------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _one_spelling_per_field(cls, data: Any) -> Any:
        """Reject a field given under two spellings (e.g. `ttft` and `ttft_ms`): which one wins is unclear."""
        if isinstance(data, Mapping):
            for alias, name in _ALIAS_TO_FIELD.items():
                if alias in data and name in data:
                    raise PydanticCustomError(
                        _RULE_ERROR,
                        "field '{field}' = {shown}: {requirement}",
                        {
                            "field": alias,
                            "shown": _show(data[alias]),
                            "requirement": f"'{name}' is also given; use only one of the two spellings",
                            "more": 0,
                        },
                    )
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PlannerConfig:
        """Check the rules that involve more than one field."""
        violations: list[tuple[str, Any, str]] = []
        mode = self.mode

        # Role-specific endpoint floors only make sense for a role this planner manages.
        if mode is PlannerMode.AGG:
            for name in ("prefill_min_endpoint", "decode_min_endpoint"):
                if getattr(self, name) is not None:
                    violations.append(_rule(name, getattr(self, name), "not allowed when mode='agg'; use min_endpoint"))
        elif mode is PlannerMode.PREFILL and self.decode_min_endpoint is not None:
            violations.append(
                _rule(
                    "decode_min_endpoint",
                    self.decode_min_endpoint,
                    "not allowed when mode='prefill' (no decode pool)",
                )
            )
        elif mode is PlannerMode.DECODE and self.prefill_min_endpoint is not None:
            violations.append(
                _rule(
                    "prefill_min_endpoint",
                    self.prefill_min_endpoint,
                    "not allowed when mode='decode' (no prefill pool)",
                )
            )

        # GPU budget band (our rule; Dynamo does not check it): the floor cannot exceed the ceiling.
        if self.min_gpu_budget >= 0 and self.max_gpu_budget >= 0 and self.min_gpu_budget > self.max_gpu_budget:
            violations.append(
                _rule(
                    "min_gpu_budget",
                    self.min_gpu_budget,
                    f"must be <= max_gpu_budget ({self.max_gpu_budget}) or -1",
                )
            )

        # The minimum endpoints must fit the ceiling: otherwise every tick is clamped to a size the budget forbids
        # (and a floor of millions makes the demo's simulated cluster, and the database's integers, overflow).
        if self.max_gpu_budget >= 0:
            floors = {
                Component.PREFILL: (self.prefill_min_endpoint_effective, self.prefill_gpus_per_engine),
                Component.DECODE: (self.decode_min_endpoint_effective, self.decode_gpus_per_engine),
            }
            floor_gpus = sum(num * gpus for c, (num, gpus) in floors.items() if c in managed_components(mode))
            if floor_gpus > self.max_gpu_budget:
                name = "min_endpoint"
                for role, field in (
                    (Component.PREFILL, "prefill_min_endpoint"),
                    (Component.DECODE, "decode_min_endpoint"),
                ):
                    if getattr(self, field) is not None and role in managed_components(mode):
                        name = field
                violations.append(
                    _rule(
                        name,
                        getattr(self, name),
                        f"the minimum endpoints need {floor_gpus} GPUs > max_gpu_budget ({self.max_gpu_budget})",
                    )
                )

        root = math.isqrt(self.fpm_sample_bucket_size)
        if root * root != self.fpm_sample_bucket_size:
            violations.append(
                _rule(
                    "fpm_sample_bucket_size",
                    self.fpm_sample_bucket_size,
                    "must be a perfect square (e.g. 4, 9, 16, 25)",
                )
            )

        if self.environment is EnvironmentKind.GLOBAL_PLANNER and not self.global_planner_namespace:
            violations.append(
                _rule(
                    "global_planner_namespace",
                    self.global_planner_namespace,
                    "required when environment='global-planner'",
                )
            )

        if self.enable_power_awareness:
            if self.total_gpu_power_limit is None:
                violations.append(
                    _rule("total_gpu_power_limit", None, "required (watts) when enable_power_awareness is true")
                )
            if self.environment is not EnvironmentKind.KUBERNETES:
                violations.append(
                    _rule(
                        "environment",
                        self.environment,
                        "must be 'kubernetes' when enable_power_awareness is true",
                    )
                )
            if mode is PlannerMode.AGG:
                violations.append(_rule("mode", mode, "power awareness is not supported with mode='agg'"))

        if self.optimization_target is OptimizationTarget.LOAD:
            violations.extend(self._load_threshold_violations())

        for up_name, down_name in (
            ("decode_kv_scale_up_threshold", "decode_kv_scale_down_threshold"),
            ("prefill_queue_scale_up_threshold", "prefill_queue_scale_down_threshold"),
        ):
            up, down = getattr(self, up_name), getattr(self, down_name)
            if up <= down:
                violations.append(_rule(up_name, up, f"must be > {down_name} ({_show(down)})"))
        if self.load_policy is LoadPolicy.THRESHOLD_2025 and not self.load_scaling_active:
            violations.append(
                _rule(
                    "load_policy",
                    self.load_policy,
                    "needs the load loop: set enable_load_scaling: true (or a target other than 'sla')",
                )
            )

        if not (self.throughput_scaling_active or self.load_scaling_active):
            violations.append(
                _rule(
                    "enable_throughput_scaling",
                    self.enable_throughput_scaling,
                    "at least one of enable_throughput_scaling / enable_load_scaling must be true",
                )
            )

        load_s = self.load_adjustment_interval_seconds
        throughput_s = self.throughput_adjustment_interval_seconds
        if self.throughput_scaling_active and self.load_scaling_active and load_s >= throughput_s:
            violations.append(
                _rule(
                    "load_adjustment_interval_seconds",
                    load_s,
                    f"must be < throughput_adjustment_interval_seconds ({throughput_s}) when both loops are active",
                )
            )

        base = self.scheduling.scale_interval_seconds
        if base is not None:
            named = {"load_adjustment_interval_seconds": load_s}
            if self.throughput_scaling_active:
                named["throughput_adjustment_interval_seconds"] = throughput_s
            if not all(_divides(base, interval) for interval in named.values()):
                listed = " and ".join(f"{name} ({value})" for name, value in named.items())
                violations.append(_rule("scheduling.scale_interval_seconds", base, f"must evenly divide {listed}"))

        _raise_rules(violations)
        return self

    def _load_threshold_violations(self) -> list[tuple[str, Any, str]]:
        """Threshold rules of the `load` target, for the roles this planner manages."""
        found: list[tuple[str, Any, str]] = []
        pairs = []
        if self.mode in (PlannerMode.DISAGG, PlannerMode.PREFILL):
            pairs.append(("prefill_scale_up_queue_tokens", "prefill_scale_down_queue_tokens"))
        if self.mode in (PlannerMode.DISAGG, PlannerMode.DECODE, PlannerMode.AGG):
            pairs.append(("decode_scale_up_kv_rate", "decode_scale_down_kv_rate"))
        for up_name, down_name in pairs:
            up, down = getattr(self, up_name), getattr(self, down_name)
            for name, value in ((up_name, up), (down_name, down)):
                if value is None:
                    found.append(_rule(name, None, f"required when optimization_target='load' and mode='{self.mode}'"))
            if up is not None and down is not None and up <= down:
                found.append(_rule(up_name, up, f"must be > {down_name} ({_show(down)})"))
        return found

    # ------------------------------------------------------------------------------------------------
    # Derived values (read-only)
    # ------------------------------------------------------------------------------------------------

    @property
    def throughput_scaling_active(self) -> bool:
        """Whether the predictive throughput loop runs: only for the `sla` target, and only if enabled."""
        return self.optimization_target is OptimizationTarget.SLA and self.enable_throughput_scaling

    @property
    def load_scaling_active(self) -> bool:
        """Whether the reactive load loop runs: always for non-`sla` targets, else per the flag."""
        return self.optimization_target is not OptimizationTarget.SLA or self.enable_load_scaling

    @property
    def prefill_min_endpoint_effective(self) -> int:
        """Minimum prefill replicas: `prefill_min_endpoint` if set, else `min_endpoint`."""
        return self.min_endpoint if self.prefill_min_endpoint is None else self.prefill_min_endpoint

    @property
    def decode_min_endpoint_effective(self) -> int:
        """Minimum decode (or aggregated) replicas: `decode_min_endpoint` if set, else `min_endpoint`."""
        return self.min_endpoint if self.decode_min_endpoint is None else self.decode_min_endpoint

    @property
    def scale_interval_seconds_effective(self) -> float:
        """Base tick period (s).

        The explicit `scheduling.scale_interval_seconds` if set; otherwise the greatest common divisor, at
        millisecond resolution, of the load interval and (only when the throughput loop is active, i.e.
        target `sla`) the throughput interval. With Dynamo's defaults this is 5 s.
        """
        if self.scheduling.scale_interval_seconds is not None:
            return self.scheduling.scale_interval_seconds
        intervals = [float(self.load_adjustment_interval_seconds)]
        if self.throughput_scaling_active:
            intervals.append(float(self.throughput_adjustment_interval_seconds))
        return _gcd_seconds(intervals)

    @property
    def capacity_ttft_ms(self) -> float:
        """The TTFT an engine is sized for: `ttft_ms`, times `ttft_dispatch_threshold` under router `slo` (the
        router sends an engine no prompt it predicts past that, so that is the load the engine will carry)."""
        return self.ttft_ms * (self.ttft_dispatch_threshold if self.router is RouterKind.SLO else 1.0)

    @property
    def capacity_itl_ms(self) -> float:
        """The ITL an engine is sized for: `itl_ms`, times `tpot_dispatch_threshold` under router `slo`."""
        return self.itl_ms * (self.tpot_dispatch_threshold if self.router is RouterKind.SLO else 1.0)

    @property
    def prefill_gpus_per_engine(self) -> int:
        """GPUs per prefill engine: `prefill_engine_num_gpu`, or 1 when unset."""
        return 1 if self.prefill_engine_num_gpu is None else self.prefill_engine_num_gpu

    @property
    def decode_gpus_per_engine(self) -> int:
        """GPUs per decode (or aggregated) engine: `decode_engine_num_gpu`, or 1 when unset."""
        return 1 if self.decode_engine_num_gpu is None else self.decode_engine_num_gpu

    def engine_limits(self, component: Component, *, profiled_max_kv_tokens: int | None = None) -> EngineLimits:
        """The static limits of one engine of `component`'s pool, as the decision core uses them.

        `profiled_max_kv_tokens` (the engine profile's KV capacity) fills `max_kv_tokens` when the config leaves it
        unset; without either, Dynamo's fallback of 2,000,000 applies.
        """
        if component is Component.PREFILL:
            limits, num_gpu = self.prefill_engine, self.prefill_gpus_per_engine
        else:
            limits, num_gpu = self.decode_engine, self.decode_gpus_per_engine
        return EngineLimits(
            num_gpu=num_gpu,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_num_seqs=limits.max_num_seqs,
            max_kv_tokens=(
                limits.max_kv_tokens
                if limits.max_kv_tokens is not None
                else (profiled_max_kv_tokens if profiled_max_kv_tokens is not None else 2_000_000)
            ),
            context_length=limits.context_length,
            speculative_nextn=self.speculative_nextn,
        )


class WorkloadRef(BaseModel):
    """One plain Kubernetes workload that serves a role: its kind, and its name or a label selector.

    Exactly one of `name` and `selector` is set (checked by `KubernetesWorkloadsConfig`, which knows the field's
    path for the error message); a selector must match exactly one workload of the kind when it is used.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: WorkloadKind = Field(description="Workload kind: Deployment or StatefulSet.")
    name: str | None = Field(default=None, min_length=1, description="Workload name; or set selector instead.")
    selector: dict[str, str] | None = Field(
        default=None, description="Labels the one workload carries (matchLabels); or set name instead."
    )
    namespace: str | None = Field(
        default=None, min_length=1, description="Namespace of the workload; None = kubernetes_workloads.namespace."
    )

    @property
    def label_selector(self) -> str | None:
        """The selector as the API's `labelSelector` query (`k=v,...`, sorted), or None when found by name."""
        if self.selector is None:
            return None
        return ",".join(f"{key}={value}" for key, value in sorted(self.selector.items()))


class KubernetesWorkloadsConfig(BaseModel):
    """The workloads `environment: kubernetes-workloads` scales, one per role the mode manages.

    `disagg` needs `prefill` and `decode`, `prefill` and `decode` modes the one pool they manage, `agg` the one
    `aggregated` workload (the planner's decode role). The namespace of a workload: its own `namespace`, else
    `namespace` here, else `PLANNER_K8S_NAMESPACE` / the pod's namespace.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    namespace: str | None = Field(
        default=None,
        min_length=1,
        description="Namespace of the workloads; None = PLANNER_K8S_NAMESPACE, else the pod's.",
    )
    prefill: WorkloadRef | None = Field(default=None, description="The prefill workload (modes disagg and prefill).")
    decode: WorkloadRef | None = Field(default=None, description="The decode workload (modes disagg and decode).")
    aggregated: WorkloadRef | None = Field(default=None, description="The aggregated workload (mode agg).")

    @model_validator(mode="after")
    def _name_or_selector(self) -> KubernetesWorkloadsConfig:
        violations: list[tuple[str, Any, str]] = []
        for role in ("prefill", "decode", "aggregated"):
            ref: WorkloadRef | None = getattr(self, role)
            if ref is None:
                continue
            where = f"kubernetes_workloads.{role}"
            if ref.name is None and ref.selector is None:
                violations.append(_rule(f"{where}.name", None, "set name or selector"))
            elif ref.name is not None and ref.selector is not None:
                violations.append(_rule(f"{where}.selector", ref.selector, "set name or selector, not both"))
            elif ref.selector is not None:
                if not ref.selector:
                    violations.append(_rule(f"{where}.selector", ref.selector, "needs at least one label"))
                for key, value in ref.selector.items():
                    # `,` and `=` would change the meaning of the labelSelector query built from them
                    if not key or any(c in key + value for c in ",=! "):
                        violations.append(
                            _rule(f"{where}.selector.{key}", value, "label keys and values cannot hold , = ! or spaces")
                        )
        _raise_rules(violations)
        return self

    def roles(self) -> tuple[tuple[Component, str, WorkloadRef], ...]:
        """(planner role, config key, workload) for each workload set; `aggregated` is the decode role."""
        keyed = ((Component.PREFILL, "prefill"), (Component.DECODE, "decode"), (Component.DECODE, "aggregated"))
        return tuple((role, key, getattr(self, key)) for role, key in keyed if getattr(self, key) is not None)


# Dynamo's mocker engine (`python -m dynamo.mocker`), the default worker command of `environment: local`: file
# discovery and the TCP request plane, so it needs no etcd or NATS; its timing comes from a planner profile.
MOCKER_COMMAND = (
    "${DYNAMO_PYTHON}", "-m", "dynamo.mocker",
    "--model-path", "${PLANNER_LOCAL_MODEL_DIR}", "--model-name", "${PLANNER_LOCAL_MODEL_NAME}",
    "--discovery-backend", "file", "--request-plane", "tcp",
    "--disaggregation-mode", "${DISAGGREGATION_MODE}",
    "--planner-profile-data", "${PLANNER_LOCAL_PROFILE_DIR}",
)  # fmt: skip


class FleetShareConfig(BaseModel):
    """This deployment's share of the fleet's GPU budget, for `planner deployments sync FOLDER` (which registers every
    config file of a folder; `planner deployments add` takes the same values as options)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="The managed deployment's name; None = the file's name without its suffix.",
    )
    min_gpus: Whole = Field(default=0, ge=0, **_GPUS, description="GPUs it always keeps, over budget or not.")
    max_gpus: Whole | None = Field(default=None, ge=0, **_GPUS, description="GPUs it may never exceed; None = no cap.")
    priority: Whole = Field(default=0, **_PRIORITY, description="Higher is served first when over budget.")
    weight: Number = Field(default=1.0, gt=0, **_MAGNITUDE, description="Its share within its priority.")

    @model_validator(mode="after")
    def _max_not_below_min(self) -> FleetShareConfig:
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")
        return self


class LocalWorkersConfig(BaseModel):
    """How `environment: local` runs engine processes on this machine: one command template per role.

    A template is an argument list; `${NAME}` in it is replaced by the worker's `ROLE` (prefill or decode),
    `DISAGGREGATION_MODE` (prefill, decode, or agg in mode agg), `WORKER_ID` (the row id), else by `env` here, else
    by the environment (a name found nowhere is an error naming the field).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    prefill_command: tuple[str, ...] = Field(
        default=MOCKER_COMMAND,
        min_length=1,
        description="Argument list starting a prefill worker (the mocker by default).",
    )
    decode_command: tuple[str, ...] = Field(
        default=MOCKER_COMMAND,
        min_length=1,
        description="Argument list starting a decode (in mode agg: aggregated) worker (the mocker by default).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables of every worker.")
    discovery_dir: str | None = Field(
        default=None,
        description=(
            "Dynamo's file discovery store (DYN_FILE_KV): a worker is ready once it registered there; "
            "None = DYN_FILE_KV, and when that is unset too a running worker counts as ready."
        ),
    )
    log_dir: str | None = Field(
        default=None, description="Folder of the workers' log files; None = local-workers/ in the data folder."
    )
    drain_grace_seconds: Number = Field(
        **_INTERVAL, default=30.0, ge=0, description="Seconds a draining worker has after SIGTERM before SIGKILL."
    )
    nice: Whole = Field(default=0, ge=0, le=19, description="Niceness the workers run at (0 = as the planner).")
    initial_prefill: Whole | None = Field(
        default=None,
        ge=0,
        description=(
            "Prefill workers started before the first decision (the deployment as it runs when the planner takes "
            "over); None = the minimum endpoints."
        ),
    )
    initial_decode: Whole | None = Field(
        default=None,
        ge=0,
        description="Decode (in mode agg: aggregated) workers started before the first decision; None = the minimum.",
    )

    def command(self, role: Component) -> tuple[str, ...]:
        return self.prefill_command if role is Component.PREFILL else self.decode_command


# The workload keys each mode needs (the others must be unset: a workload the planner ignores is a slip).
_WORKLOAD_KEYS: dict[PlannerMode, tuple[str, ...]] = {
    PlannerMode.DISAGG: ("prefill", "decode"),
    PlannerMode.PREFILL: ("prefill",),
    PlannerMode.DECODE: ("decode",),
    PlannerMode.AGG: ("aggregated",),
}


class ServiceConfig(BaseModel):
    """How the service runs around the decision: metrics endpoints, ports, reports, execution cadence.

    Read only by `planner_core.runtime` and `flows`; never by `tick`. Not hashed: moving the report folder or a
    port leaves `config_hash` (the policy identity stored with every tick) unchanged. The fields sit at the top
    level of the same Dynamo-style file as the policy's (see `PlannerFile`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # --- Dynamo fields ---------------------------------------------------------------------------------
    log_dir: str | None = Field(
        default=None, description="Folder for log files (Dynamo field, kept for compatibility)."
    )
    # Dynamo reads PROMETHEUS_ENDPOINT / PLANNER_PROMETHEUS_PORT for these; here they are plain values.
    metric_pulling_prometheus_endpoint: str | None = Field(
        default=None, description="Prometheus URL traffic is read from; None = PLANNER_PROMETHEUS_ENDPOINT."
    )
    metric_reporting_prometheus_port: Whole = Field(
        default=0, **_PORT, description="TCP port the planner's own Prometheus metrics are served on; 0 = off."
    )
    control_api_port: Whole = Field(default=9086, **_PORT, description="TCP port of the control API; 0 = off.")
    report_interval_hours: Number | None = Field(
        **_HOURS, default=24.0, gt=0, description="Hours between two periodic reports; None = no periodic report."
    )
    report_output_dir: str = Field(
        default="./planner_reports",
        description="Folder reports are written to, relative to the config file; unset = reports/ in the data folder.",
    )
    report_filename: str | None = Field(default=None, description="File name of the periodic report; None = dated.")
    report_write_gzip_log: bool = Field(default=True, description="Write the gzipped tick log beside each report.")
    live_dashboard_port: Whole = Field(default=8080, **_PORT, description="TCP port of the live dashboard; 0 = off.")
    # Not supported yet: accepted as an opaque mapping only so that Dynamo configuration files load.
    plugin_registration: dict[str, Any] | None = Field(
        default=None, description="Dynamo's plugin-registration settings; accepted, not used."
    )

    # --- ours ------------------------------------------------------------------------------------------
    # Where decisions go, not what they are: a service setting, so naming the workloads leaves config_hash alone.
    kubernetes_workloads: KubernetesWorkloadsConfig | None = Field(
        default=None,
        description="For environment kubernetes-workloads: the Deployment/StatefulSet of each role (name or selector).",
    )
    local_workers: LocalWorkersConfig | None = Field(
        default=None,
        description="For environment local: the command of each role's engine process (the mocker by default).",
    )
    fleet: FleetShareConfig | None = Field(
        default=None,
        description="Its name and share of the GPU budget when a fleet registers it from a folder of config files.",
    )
    # 10 s matches the check interval of Dynamo's virtual connector (SCALING_CHECK_INTERVAL).
    execution_interval_seconds: Number = Field(
        **_INTERVAL,
        default=10.0,
        gt=0,
        description=(
            "Seconds between two execution runs while a decision is still pending after an attempt (blocked or "
            "failed), and, with environment local, between two reconciliations of the worker processes."
        ),
    )
    # A decision is executed when its tick's NOTIFY arrives; this poll only catches one that was missed (listener
    # restarted, connection lost), so it can be slow.
    execution_fallback_poll_seconds: Number = Field(
        **_INTERVAL,
        default=60.0,
        gt=0,
        description="Seconds between two execution runs when no notification arrives (the listener's safety net).",
    )
    # Dynamo's SCALING_MAX_WAIT_TIME.
    virtual_connector_timeout_seconds: Number = Field(
        **_INTERVAL,
        default=1800.0,
        gt=0,
        description="Seconds an unacknowledged virtual-connector decision blocks newer ones.",
    )
    # 1 s: the curve's intervals of 1 s and more are seen, and a 60 s window plus the 30 s look-back is ~90 points
    # per series. Finer than the frontend's scrape interval, a scrape's increment lands in one step and the short
    # intervals overstate the bursts (docs/operations.md, "The prompt-arrival curve").
    prometheus_arrival_resolution_seconds: Number = Field(
        **_INTERVAL,
        default=1.0,
        gt=0,
        description=(
            "Step (s) of the Prometheus range queries the prompt-arrival curve is rebuilt from; the curve's "
            "intervals shorter than it are left out. Keep the frontend's scrape interval at most this."
        ),
    )


class PlannerFile(BaseModel):
    """One planner configuration file, split: the hashed `policy` and the unhashed `service` settings.

    Built only by `parse_config` / `load_config` from the flat Dynamo-style mapping; the split is by field name.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: PlannerConfig
    service: ServiceConfig = Field(default_factory=ServiceConfig)

    @model_validator(mode="after")
    def _workloads_match_environment_and_mode(self) -> PlannerFile:
        """`kubernetes_workloads` (a service setting) is required by, and only used with, that environment."""
        workloads = self.service.kubernetes_workloads
        environment, mode = self.policy.environment, self.policy.mode
        violations: list[tuple[str, Any, str]] = []
        if environment is EnvironmentKind.KUBERNETES_WORKLOADS:
            if workloads is None:
                violations.append(
                    _rule("kubernetes_workloads", None, "required when environment='kubernetes-workloads'")
                )
            else:
                needed = _WORKLOAD_KEYS[mode]
                for key in ("prefill", "decode", "aggregated"):
                    value = getattr(workloads, key)
                    if key in needed and value is None:
                        violations.append(
                            _rule(f"kubernetes_workloads.{key}", None, f"required when mode='{mode.value}'")
                        )
                    elif key not in needed and value is not None:
                        violations.append(
                            _rule(
                                f"kubernetes_workloads.{key}",
                                value.name or value.selector,
                                f"not used when mode='{mode.value}' (set {' and '.join(needed)})",
                            )
                        )
        elif workloads is not None:
            violations.append(
                _rule("environment", environment, "must be 'kubernetes-workloads' when kubernetes_workloads is set")
            )
        if self.service.local_workers is not None and environment is not EnvironmentKind.LOCAL:
            violations.append(_rule("environment", environment, "must be 'local' when local_workers is set"))
        _raise_rules(violations)
        return self


def managed_components(mode: PlannerMode) -> tuple[Component, ...]:
    """Pools the planner scales in a mode (aggregated mode's single pool is represented as DECODE)."""
    if mode is PlannerMode.PREFILL:
        return (Component.PREFILL,)
    if mode in (PlannerMode.DECODE, PlannerMode.AGG):
        return (Component.DECODE,)
    return (Component.PREFILL, Component.DECODE)


def _gcd_seconds(values: list[float]) -> float:
    """Greatest common divisor of durations in seconds, computed on whole milliseconds."""
    result = 0
    for value in values:
        result = math.gcd(result, round(value * 1000.0))
    return result / 1000.0


def _divides(base: float, value: float) -> bool:
    """Whether `value` is a whole (>= 1) multiple of `base`, tolerating float rounding."""
    ratio = value / base
    nearest = round(ratio)
    return nearest >= 1 and math.isclose(ratio, nearest, rel_tol=1e-9, abs_tol=1e-9)


# --------------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------------

_SERVICE_FIELDS = frozenset(ServiceConfig.model_fields)
_KNOWN_TOP_LEVEL = sorted(set(PlannerConfig.model_fields) | _SERVICE_FIELDS | set(_ALIAS_TO_FIELD))
_TYPE_REQUIREMENTS = {
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "tuple_type": "must be a list",
    "list_type": "must be a list",
    "missing": "is required",
}


def _dotted(loc: tuple[int | str, ...]) -> str:
    """`('scheduling', 'external_plugins', 0)` -> `scheduling.external_plugins[0]`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _describe(error: Mapping[str, Any]) -> tuple[str | None, str, str, str]:
    """Turn one pydantic error into (dotted field name, field as shown, value as shown, requirement)."""
    ctx = error.get("ctx") or {}
    kind = error["type"]
    if kind == _RULE_ERROR:
        return ctx["field"], f"'{ctx['field']}'", ctx["shown"], ctx["requirement"]

    loc = tuple(error["loc"])
    if loc and loc[0] in PlannerFile.model_fields:  # the file is flat: `policy.ttft_ms` is written `ttft_ms`
        loc = loc[1:]
    name = _dotted(loc) or None
    label = f"'{name}'" if name else "(top level)"
    if len(loc) == 1 and loc[0] in _ALIAS_TO_FIELD:
        name = _ALIAS_TO_FIELD[str(loc[0])]
        label = f"'{name}' (written '{loc[0]}')"
    shown = _show(error.get("input"))

    if kind == "greater_than":
        requirement = f"must be > {ctx['gt']:g}"
    elif kind == "greater_than_equal":
        requirement = f"must be >= {ctx['ge']:g}"
    elif kind == "less_than":
        requirement = f"must be < {ctx['lt']:g}"
    elif kind == "less_than_equal":
        requirement = f"must be <= {ctx['le']:g}"
    elif kind in ("enum", "literal_error"):
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        requirement = "allowed values are " + ", ".join(allowed)
    elif kind == "extra_forbidden":
        requirement = "unknown field"
        if len(loc) == 1:
            close = difflib.get_close_matches(str(loc[0]), _KNOWN_TOP_LEVEL, n=1)
            if close:
                requirement += f"; did you mean '{close[0]}'?"
    elif kind in _TYPE_REQUIREMENTS:
        requirement = _TYPE_REQUIREMENTS[kind]
    else:
        message = " ".join(str(error.get("msg", "invalid value")).split())
        requirement = message[:1].lower() + message[1:]
    return name, label, shown, requirement


def _from_validation_error(exc: ValidationError, source: str) -> ConfigError:
    """One-line `ConfigError` for the first pydantic error, counting the others."""
    errors = exc.errors()
    first = errors[0]
    more = len(errors) - 1 + int((first.get("ctx") or {}).get("more", 0))
    name, label, shown, requirement = _describe(first)
    message = f"{source}: field {label} = {shown}: {requirement}"
    if more:
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return ConfigError(message, source=source, field=name)


def parse_config(data: Mapping[str, Any], source: str = "<config>") -> PlannerFile:
    """Validate an in-memory configuration mapping and split it into the policy and the service settings.

    Args:
        data: the configuration object (field names or Dynamo aliases as keys).
        source: label used at the start of error messages (normally the file name).

    Returns:
        The validated, frozen file: `.policy` (hashed, what `tick` reads) and `.service` (not hashed).

    Raises:
        ConfigError: `data` is not a mapping, has an unknown field, a bad value, or breaks a cross-field
            rule. The message is one line naming `source`, the field, the value and what is allowed.
    """
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{source}: top level is {kind}; expected a mapping of field names to values", source=source)
    bad_keys = [key for key in data if not isinstance(key, str)]
    if bad_keys:
        raise ConfigError(
            f"{source}: field name {_show(bad_keys[0])} is not a string; field names must be strings",
            source=source,
        )
    try:
        return PlannerFile.model_validate(
            {
                "policy": {key: value for key, value in data.items() if key not in _SERVICE_FIELDS},
                "service": {key: value for key, value in data.items() if key in _SERVICE_FIELDS},
            }
        )
    except ValidationError as exc:
        raise _from_validation_error(exc, source) from exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML safe loader that refuses a mapping with the same key twice (a silent override otherwise)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: let the base constructor report it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _reject_duplicate_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


# A configuration file is a few kilobytes; these bound what a hostile one can make the loader build. YAML aliases
# are shared, not copied, when loaded, but validation and hashing walk them as copies: `_check_shape` counts them so.
MAX_CONFIG_BYTES = 1_000_000
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_NODES = 100_000


def _check_shape(data: Any, source: str) -> None:
    """Refuse a parsed config nested deeper than `MAX_CONFIG_DEPTH` or holding more than `MAX_CONFIG_NODES` values
    (aliases counted each time they are used); stops counting at the first excess, so it is cheap either way."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    num_nodes = 0
    while stack:
        value, depth = stack.pop()
        num_nodes += 1
        if num_nodes > MAX_CONFIG_NODES:
            raise ConfigError(
                f"{source}: more than {MAX_CONFIG_NODES} values; a planner config is far smaller", source=source
            )
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{source}: nested deeper than {MAX_CONFIG_DEPTH} levels", source=source)
        if isinstance(value, Mapping):
            stack.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1) for item in value)


def _parse_text(text: str, suffix: str, source: str) -> Any:
    """Parse YAML or JSON text; syntax errors and excessive size or nesting become a one-line `ConfigError`."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{source}: {len(text)} characters; a config may hold at most {MAX_CONFIG_BYTES}", source=source
        )
    try:
        data = _parse_syntax(text, suffix, source)
    except RecursionError as exc:  # nesting deep enough to exhaust the parser's stack
        raise ConfigError(f"{source}: nested deeper than {MAX_CONFIG_DEPTH} levels", source=source) from exc
    _check_shape(data, source)
    return data


def _parse_syntax(text: str, suffix: str, source: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text, object_pairs_hook=_reject_duplicate_json_keys)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", source=source
            ) from exc
        except ValueError as exc:  # duplicate key
            raise ConfigError(f"{source}: not valid JSON ({exc})", source=source) from exc
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        detail = " ".join(f"{where}{problem}".split())
        raise ConfigError(f"{source}: not valid YAML ({detail})", source=source) from exc


_SUFFIXES = (".yaml", ".yml", ".json")


def resolve_config_relative(path_value: str | Path, config_path: Path | None) -> Path:
    """A path from the config as written; relative paths are taken from the config file's folder."""
    path = Path(path_value)
    if not path.is_absolute() and config_path is not None:
        path = config_path.parent / path
    return path


def resolve_profile_dir(config: PlannerConfig, config_path: Path | None) -> Path:
    """`profile_results_dir`, relative to the config file's folder."""
    return resolve_config_relative(config.profile_results_dir, config_path)


def load_config(path: str | Path) -> PlannerFile:
    """Read and validate a planner configuration file.

    The format is chosen by the suffix: `.yaml`/`.yml` (YAML, safe loader) or `.json`. Keys are Dynamo
    `PlannerConfig` field names or their aliases. Duplicate keys are refused.

    Args:
        path: the file to read.

    Returns:
        The validated, frozen file: `.policy` (hashed, what `tick` reads) and `.service` (not hashed).

    Raises:
        ConfigError: the suffix is not supported, the file cannot be read or parsed, the top level is not
            a mapping, or validation fails. The message is one line starting with the path.
    """
    path = Path(path)
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        shown_suffix = repr(suffix) if suffix else "(no suffix)"
        raise ConfigError(
            f"{source}: unsupported file type {shown_suffix}; use .yaml, .yml or .json",
            source=source,
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{source}: file not found", source=source) from exc
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"{source}: cannot read file ({' '.join(reason.split())})", source=source) from exc
    return parse_config(_parse_text(text, suffix, source), source)


def config_hash(config: PlannerConfig) -> str:
    """Fingerprint a policy: the identity stored with every tick.

    Only the policy is hashed, so service settings (reports, ports, endpoints) can change without changing it.
    Rows recorded before the split carry the hash of the whole file; they are looked up by that stored hash
    and their stored body still parses (see `planner_core.runtime.store.repository.ensure_deployment`).

    Args:
        config: the policy to fingerprint.

    Returns:
        The sha256 hex digest of the canonical JSON (sorted keys, no whitespace) of
        `config.model_dump(mode="json")`. Spelling a field by its alias does not change it; changing any
        value does.
    """
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
