"""Types of the plugin pipeline: phases, plugin specs, what a plugin sees and returns, and the tick's outcome.

A plugin is any object with a `spec` (`PluginSpec`) and a `run(context) -> PluginResult | None` method. The
pipeline (`planner_core.pipeline.run.run_pipeline`) calls the plugins that are due, in phase order, and merges what
they return. Types that reach the planner state or the database (`ReplicaOverride`, `PartialPrediction`,
`HoldPolicy`, `ExecuteAction`, ...) live in `planner_core.domain`; the ones here exist only during a tick.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from planner_core.config import PlannerConfig
from planner_core.domain import (
    Component,
    ExecuteAction,
    HoldPolicy,
    ObservedValue,
    PartialPrediction,
    PlannerState,
    Prediction,
    ReasonCode,
    ReplicaOverride,
    ReplicaProposal,
    ScalingDecision,
    StepRecord,
    TickInputs,
    TickOutcome,
)

# Dynamo's per-call deadline of a plugin (the transport's request_timeout_seconds).
DEFAULT_PLUGIN_TIMEOUT_S = 5.0
# Step names are stored in a varchar(80) column; a plugin step is named "<phase>:<plugin_id>".
MAX_STEP_NAME_CHARS = 80
PLUGIN_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]{0,62}$")


class Phase(enum.StrEnum):
    """The stages of one tick, in order. Plugins run in OBSERVE, PREDICT, PROPOSE, RECONCILE and CONSTRAIN."""

    # the caller collects the tick's inputs (traffic, workers, FPM) before the pipeline runs; OBSERVE plugins then
    # add named observations (a chain in priority order, first writer wins per name) that every later plugin sees
    OBSERVE = "observe"
    PREDICT = "predict"  # forecast fields; a chain in priority order, first writer wins per field
    PROPOSE = "propose"  # replica overrides from the scaling policies, merged type-aware
    RECONCILE = "reconcile"  # overrides on top of the merged proposal (sees every PROPOSE result)
    CONSTRAIN = "constrain"  # AT_LEAST / AT_MOST only: SET is dropped and `final` ignored
    EXECUTE = "execute"  # the decision: apply, skip, or advisory; taken by the pipeline itself


PLUGIN_PHASES = (Phase.OBSERVE, Phase.PREDICT, Phase.PROPOSE, Phase.RECONCILE, Phase.CONSTRAIN)
PHASE_ORDER = {phase: index for index, phase in enumerate(Phase)}


class Observation(enum.StrEnum):
    """What of the tick's inputs a plugin reads (`PluginSpec.needs`); Dynamo's spelling of its `needs`."""

    TRAFFIC = "observations.traffic"  # `inputs.traffic` (frontend traffic over the last window)
    FPM = "observations.fpm"  # `inputs.fpm` (forward-pass metrics of the engines)
    WORKERS = "observations.workers"  # `inputs.workers` (always observed)


# Names a plugin may list in `requires_produced_fields`: the complete prediction (num_req, isl and osl), one
# prediction field, or at least one PROPOSE override.
PREDICTION_FIELDS = tuple(f.name for f in dataclasses.fields(PartialPrediction))
PRODUCED_FIELDS = frozenset({"predictions", "proposals", *(f"predictions.{name}" for name in PREDICTION_FIELDS)})


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerSpec:
    """A plugin's circuit breaker (`planner_core.pipeline.breaker`), measured in tick time.

    Attributes:
        failure_threshold: this many failures (raised, timed out, unreachable, unusable answer) within
            `window_s` open the breaker: the plugin is then skipped.
        window_s: how far back failures count (s of tick time).
        cooldown_s: after this long open, the next due tick makes one trial call (half-open): success closes the
            breaker, failure opens it again.
    """

    failure_threshold: int = 5
    window_s: float = 60.0
    cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.failure_threshold, bool) or not isinstance(self.failure_threshold, int):
            raise ValueError(f"breaker: field 'failure_threshold' = {self.failure_threshold!r}: must be an integer")
        if self.failure_threshold < 1:
            raise ValueError(f"breaker: field 'failure_threshold' = {self.failure_threshold!r}: must be >= 1")
        for name in ("window_s", "cooldown_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"breaker: field '{name}' = {value!r}: must be a finite number of seconds > 0")


class PluginFailure(Exception):  # a plugin's recorded outcome, not a programming error
    """Raised by a plugin's `run` to be recorded with a specific reason code (e.g. PLUGIN_TIMEOUT for a remote
    deadline) instead of PLUGIN_RAISED; the pipeline treats it like any failure (skipped, retried, breaker)."""

    def __init__(self, reason: ReasonCode, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSpec:
    """How the pipeline schedules and merges one plugin.

    Attributes:
        plugin_id: unique name, `[a-z][a-z0-9_.-]*`, at most 63 characters (it names the plugin's steps).
        phase: PREDICT, PROPOSE, RECONCILE or CONSTRAIN.
        priority: precedence, smaller first: the PREDICT chain runs in this order (first writer wins) and in the
            other phases the smallest-priority SET is the recommendation and the smallest-priority `final` wins.
            Ties are broken by plugin id.
        interval_s: run at most every this many seconds of tick time; None or 0 runs on every tick. A plugin
            with an interval first runs at the time it was registered (first seen) plus the interval.
        hold_policy: what the plugin contributes on ticks where it is not due.
        needs: inputs the plugin reads; a due plugin whose needed input is missing is skipped (and retried).
        requires_produced_fields: fields earlier plugins must have produced this tick (`PRODUCED_FIELDS`); until
            they exist the plugin is skipped without advancing its schedule.
        timeout_s: a run taking longer (measured when the caller passes a clock) is discarded; None means
            `DEFAULT_PLUGIN_TIMEOUT_S`. Not applied when `wall_clock_limits` is False.
        breaker: a circuit breaker for this plugin; None (in-process plugins by default) means none.
        wall_clock_limits: whether the pipeline holds the plugin to `timeout_s` and to the tick deadline when the
            caller passes a clock. False for the builtin plugins: they are the planner's own pure code, so their
            run time says nothing but how loaded the machine is, and a decision must not depend on it (a live tick
            and its replay, or a run and its rerun after a crash, decide alike).
    """

    plugin_id: str
    phase: Phase
    priority: int = 100
    interval_s: float | None = None
    hold_policy: HoldPolicy = HoldPolicy.ACCEPT_WHEN_IDLE
    needs: tuple[Observation, ...] = ()
    requires_produced_fields: tuple[str, ...] = ()
    timeout_s: float | None = None
    breaker: BreakerSpec | None = None
    wall_clock_limits: bool = True

    def __post_init__(self) -> None:
        def bad(name: str, value: object, requirement: str) -> ValueError:
            return ValueError(f"plugin {self.plugin_id!r}: field '{name}' = {value!r}: {requirement}")

        if not isinstance(self.plugin_id, str) or not PLUGIN_ID_PATTERN.match(self.plugin_id):
            raise bad("plugin_id", self.plugin_id, "must match [a-z][a-z0-9_.-]* and have at most 63 characters")
        if self.phase not in PLUGIN_PHASES:
            raise bad("phase", self.phase, "must be one of " + ", ".join(p.value for p in PLUGIN_PHASES))
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise bad("priority", self.priority, "must be an integer")
        if self.interval_s is not None and (
            not math.isfinite(self.interval_s) or self.interval_s < 0 or 0 < self.interval_s < 0.001
        ):
            raise bad("interval_s", self.interval_s, "must be None, 0 or a finite number of seconds >= 0.001")
        if not isinstance(self.hold_policy, HoldPolicy):
            raise bad("hold_policy", self.hold_policy, "must be a HoldPolicy")
        for need in self.needs:
            if not isinstance(need, Observation):
                raise bad("needs", need, "must be an Observation (" + ", ".join(o.value for o in Observation) + ")")
        for name in self.requires_produced_fields:
            if name not in PRODUCED_FIELDS:
                raise bad("requires_produced_fields", name, "must be one of " + ", ".join(sorted(PRODUCED_FIELDS)))
        if self.timeout_s is not None and (not math.isfinite(self.timeout_s) or self.timeout_s <= 0):
            raise bad("timeout_s", self.timeout_s, "must be None or a finite number of seconds > 0")
        if self.breaker is not None and not isinstance(self.breaker, BreakerSpec):
            raise bad("breaker", self.breaker, "must be None or a BreakerSpec")
        if not isinstance(self.wall_clock_limits, bool):
            raise bad("wall_clock_limits", self.wall_clock_limits, "must be True or False")

    @property
    def every_tick(self) -> bool:
        """Whether the plugin is due on every tick (no interval)."""
        return not self.interval_s

    @property
    def effective_timeout_s(self) -> float:
        return DEFAULT_PLUGIN_TIMEOUT_S if self.timeout_s is None else self.timeout_s

    @property
    def order_key(self) -> tuple[int, int, str]:
        """Run order: phase, then priority, then plugin id."""
        return (PHASE_ORDER[self.phase], self.priority, self.plugin_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contribution:
    """One plugin's overrides in one phase of this tick: from a run, or replayed from its held result.

    Attributes:
        plugin_id, phase, priority: whose, where, and its current precedence.
        overrides: what it returned.
        final: whether it claimed `final` (ignored in CONSTRAIN).
        held_from_s: for a replayed (HOLD_LAST) result, the tick time it was produced at; None for a fresh run.
    """

    plugin_id: str
    phase: Phase
    priority: int
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    held_from_s: float | None = None

    @property
    def order_key(self) -> tuple[int, str]:
        return (self.priority, self.plugin_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginResult:
    """What one run of a plugin returns. Returning None from `run` is the same as `PluginResult()` (no opinion).

    Attributes:
        observations: OBSERVE only: named numbers every later plugin sees and the tick records.
        predictions: PREDICT only: forecast fields (None fields = no opinion).
        overrides: PROPOSE / RECONCILE / CONSTRAIN only: replica overrides.
        final: PREDICT: stop the chain after this plugin. PROPOSE / RECONCILE: this result wins verbatim if it is
            the smallest-priority final one. Ignored in CONSTRAIN.
        steps: the plugin's own explanation, recorded with the tick (step names at most 80 characters).
        state: a new planner state, for builtin plugins that own part of it (e.g. the load history); the next
            plugin sees it. Its `pipeline` field is ignored (the pipeline owns it). None leaves the state alone.
    """

    predictions: PartialPrediction | None = None
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    steps: tuple[StepRecord, ...] = ()
    state: PlannerState | None = None
    observations: tuple[ObservedValue, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineContext:
    """Everything a plugin may read; the only channel from the pipeline to a plugin.

    Attributes:
        inputs: what the tick observed; `inputs.now_s` is the tick's time (use it, never a clock).
        state: the planner state as left by the plugins that ran before this one.
        config: the planner config.
        spec: this plugin's effective spec (after config overrides).
        predictions: forecast fields produced so far this tick (in PREDICT: by the plugins before this one).
        proposals: every PROPOSE contribution (RECONCILE), plus the RECONCILE ones (CONSTRAIN); empty before.
        targets: merged replica counts per managed pool going into this phase: the expected counts for PREDICT and
            PROPOSE, the merged PROPOSE result for RECONCILE, the merged RECONCILE result for CONSTRAIN.
        produced: the `PRODUCED_FIELDS` available so far.
        observations: what the OBSERVE plugins added this tick (in OBSERVE: the plugins before this one).
    """

    inputs: TickInputs
    state: PlannerState
    config: PlannerConfig
    spec: PluginSpec
    predictions: PartialPrediction = field(default_factory=PartialPrediction)
    proposals: tuple[Contribution, ...] = ()
    targets: Mapping[Component, int] = field(default_factory=lambda: MappingProxyType({}))
    produced: frozenset[str] = frozenset()
    observations: tuple[ObservedValue, ...] = ()

    @property
    def now_s(self) -> float:
        return self.inputs.now_s

    @property
    def prediction(self) -> Prediction | None:
        """The complete forecast, or None while num_req, isl or osl is missing."""
        return self.predictions.complete()

    def observation(self, name: str) -> float | None:
        """The value an OBSERVE plugin added under `name` this tick, or None."""
        return next((o.value for o in self.observations if o.name == name), None)


@runtime_checkable
class Plugin(Protocol):
    """A pipeline plugin: its spec and one method. `run` must not keep state between calls that changes results
    (return a new planner state instead, or nothing), so that a recorded tick replays exactly."""

    @property
    def spec(self) -> PluginSpec: ...

    def run(self, context: PipelineContext) -> PluginResult | None: ...


@dataclass(frozen=True, slots=True)
class FunctionPlugin:
    """A plugin made of a spec and a function, e.g. `FunctionPlugin(spec, lambda ctx: PluginResult(...))`."""

    spec: PluginSpec
    function: Callable[[PipelineContext], PluginResult | None]

    def run(self, context: PipelineContext) -> PluginResult | None:
        return self.function(context)


@dataclass(frozen=True, slots=True)
class ConfiguredPlugin:
    """A plugin whose spec was changed by `plugins.overrides` in the config; runs the wrapped plugin."""

    spec: PluginSpec
    inner: Plugin

    def run(self, context: PipelineContext) -> PluginResult | None:
        return self.inner.run(context)


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginRun:
    """What happened to one plugin this tick.

    Attributes:
        plugin_id, phase: which plugin.
        reason: its outcome (PREDICTED / PLUGIN_OVERRIDES / PLUGIN_NO_OPINION when it ran; PLUGIN_HELD_OVER,
            PLUGIN_NOT_DUE, REQUIRED_FIELDS_MISSING, NO_TRAFFIC_DATA, NO_FPM_DATA, PLUGIN_RAISED,
            PLUGIN_INVALID_RESULT, PLUGIN_TIMEOUT, SKIP_TICK_TIMEOUT, SKIP_SHORT_CIRCUIT, PREDICT_CHAIN_FINAL when not).
        ran: whether its result was used (a fresh run that succeeded in time).
        elapsed_s: how long the run took, when the caller passed a clock.
    """

    plugin_id: str
    phase: Phase
    reason: ReasonCode
    ran: bool = False
    elapsed_s: float | None = None


_HEADLINE = {
    ExecuteAction.APPLY: ReasonCode.SCALE,
    ExecuteAction.ADVISORY: ReasonCode.SCALE,
    ExecuteAction.SKIP_NO_TARGETS: ReasonCode.NO_CHANGE,
    ExecuteAction.SKIP_SHORT_CIRCUIT: ReasonCode.SKIP_SHORT_CIRCUIT,
    ExecuteAction.SKIP_TICK_TIMEOUT: ReasonCode.SKIP_TICK_TIMEOUT,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineOutcome:
    """What one pipeline tick decided and recorded.

    Attributes:
        action: the EXECUTE decision.
        decision: the targets to apply (only pools whose target differs from the expected count); empty unless
            `action` is APPLY or ADVISORY (then `decision.advisory` is set).
        proposals: per managed pool, the target after the final invariants (min endpoints, GPU budget) against
            the expected count; empty when the tick was short-circuited, timed out or no plugin had an opinion.
        next_state: the planner state to store: the plugins' state changes plus the advanced plugin schedules.
        steps: the explanation, in order: every plugin's outcome and own steps, every override, every merge,
            the invariants and the EXECUTE step.
        predictions: the forecast fields produced this tick.
        runs: per plugin, in run order, what happened to it.
        short_circuit_reason: who rejected the tick and why ("" unless SKIP_SHORT_CIRCUIT).
        observations: what the OBSERVE plugins added this tick.
    """

    action: ExecuteAction
    decision: ScalingDecision
    proposals: tuple[ReplicaProposal, ...]
    next_state: PlannerState
    steps: tuple[StepRecord, ...]
    predictions: PartialPrediction = field(default_factory=PartialPrediction)
    runs: tuple[PluginRun, ...] = ()
    short_circuit_reason: str = ""
    observations: tuple[ObservedValue, ...] = ()

    @property
    def prediction(self) -> Prediction | None:
        return self.predictions.complete()

    @property
    def reason(self) -> ReasonCode:
        """Headline reason: SCALE (apply or advisory), NO_CHANGE, SKIP_SHORT_CIRCUIT or SKIP_TICK_TIMEOUT."""
        return _HEADLINE[self.action]

    def run_of(self, plugin_id: str) -> PluginRun | None:
        """What happened to one plugin this tick, or None if it was not in the pipeline."""
        return next((run for run in self.runs if run.plugin_id == plugin_id), None)

    def to_tick_outcome(
        self, *, reason: ReasonCode | None = None, prediction_reason: ReasonCode | None = None
    ) -> TickOutcome:
        """The `TickOutcome` the store records; `reason` replaces the headline (e.g. a builtin plugin's own)."""
        prediction = self.prediction
        return TickOutcome(
            decision=self.decision,
            next_state=self.next_state,
            steps=self.steps,
            proposals=self.proposals,
            prediction=prediction,
            prediction_reason=prediction_reason
            if prediction_reason is not None
            else (ReasonCode.PREDICTED if prediction is not None else None),
            reason=self.reason if reason is None else reason,
        )
