"""The pipeline's plugin sections of the policy: in-process plugins (`plugins`) and the out-of-process ones that
`scheduling` calls over gRPC, with their circuit breakers, and the tick's cadence (Dynamo's `scheduling` section).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner_core.config.errors import Violation, _raise_rules, _rule
from planner_core.config.limits import _COUNT, _INTERVAL, _PRIORITY, Number, Whole
from planner_core.domain import HoldPolicy


class CircuitBreakerConfig(BaseModel):
    """A plugin's circuit breaker (ours; Dynamo's is fixed at 5 consecutive failures and a 30 s cool-down).

    Attributes:
        failure_threshold: failures (unreachable, deadline exceeded, error, garbage answer) within `window_seconds`
            that open the breaker; an open breaker skips the plugin.
        window_seconds: how far back failures count (s of tick time).
        cooldown_seconds: how long the breaker stays open before one trial call (half-open) may close it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    failure_threshold: int = Field(
        **_COUNT, default=5, ge=1, description="Failures within the window that open the breaker."
    )
    window_seconds: float = Field(**_INTERVAL, default=60.0, gt=0, description="How far back failures count (s).")
    cooldown_seconds: float = Field(**_INTERVAL, default=30.0, gt=0, description="Seconds open before a trial call.")


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
    priority: int = Field(**_PRIORITY, default=100, description="Merge precedence; smaller wins.")
    endpoint: str = Field(description="grpc://host:port, host:port or unix:///path.")
    timeout_seconds: float = Field(**_INTERVAL, default=5.0, gt=0, description="gRPC deadline of one call (s).")
    execution_interval_seconds: float = Field(**_INTERVAL, default=0.0, ge=0, description="Run at most this often (s).")
    hold_policy: HoldPolicy = Field(default=HoldPolicy.ACCEPT_WHEN_IDLE, description="Contribution while not due.")
    needs: tuple[str, ...] = Field(default=(), description="Inputs it reads.")
    requires_produced_fields: tuple[str, ...] = Field(default=(), description="Fields it needs produced first.")
    circuit_breaker: CircuitBreakerConfig = Field(
        default_factory=CircuitBreakerConfig, description="Circuit breaker settings."
    )
    auth_token: str = Field(default="", description="Dynamo's; accepted, not used.")
    protocol_version: str = Field(default="1.0", description="Dynamo's; accepted, not used.")
    observation_window_seconds: float = Field(
        **_INTERVAL, default=0.0, ge=0, description="Dynamo's; accepted, not used."
    )

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
        violations: list[Violation] = []
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
        violations: list[Violation] = []
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
