"""The plugin pipeline's types: overrides, predictions a plugin writes, remote plugins' answers, and each plugin's
schedule and held result (the pipeline's cross-tick state)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from planner_core.domain.components import Component
from planner_core.domain.forecast import Prediction
from planner_core.domain.reasons import ReasonCode


class OverrideType(enum.StrEnum):
    """How a plugin's replica count for a pool is meant (merged as described in `planner_core.pipeline.merge`)."""

    SET = "set"  # recommend exactly this count (the smallest-priority SET is the recommendation)
    AT_LEAST = "at_least"  # floor: the merged count is at least this
    AT_MOST = "at_most"  # ceiling: the merged count is at most this (a conflicting floor wins)
    REJECT = "reject"  # veto: nothing is executed this tick


class HoldPolicy(enum.StrEnum):
    """What a plugin contributes on a tick where its interval has not elapsed."""

    HOLD_LAST = "hold_last"  # replay the result of its last successful run
    ACCEPT_WHEN_IDLE = "accept_when_idle"  # no opinion


class ExecuteAction(enum.StrEnum):
    """The EXECUTE decision of one pipeline tick (Dynamo's execute actions, plus advisory mode)."""

    APPLY = "apply"  # hand the targets to the connector
    SKIP_NO_TARGETS = "skip_no_targets"  # nothing to change
    SKIP_SHORT_CIRCUIT = "skip_short_circuit"  # a plugin rejected the tick
    SKIP_TICK_TIMEOUT = "skip_tick_timeout"  # the whole tick overran its deadline
    ADVISORY = "advisory"  # would apply, but the planner is advisory: recorded, never executed


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaOverride:
    """One plugin's opinion about one pool's replica count.

    Attributes:
        component: the pool; None only for a REJECT, which vetoes the whole tick whatever the pool.
        kind: SET, AT_LEAST, AT_MOST or REJECT.
        replicas: the count (>= 0); required except for REJECT.
        reason: the plugin's own short explanation, recorded with the override.
    """

    component: Component | None
    kind: OverrideType
    replicas: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedValue:
    """One named number an OBSERVE plugin added to a tick (e.g. an external queue depth or a spot price)."""

    name: str
    value: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PartialPrediction:
    """Forecast fields written by PREDICT plugins; None means "no opinion" on that field.

    The PREDICT chain fills it field by field, first writer (smallest priority) wins. `complete()` is the
    `Prediction` the sizing logic needs once `num_req`, `isl` and `osl` are all known.
    """

    num_req: float | None = None
    isl: float | None = None
    osl: float | None = None
    quantile: str | None = None
    isl_quantile: float | None = None
    osl_quantile: float | None = None

    @classmethod
    def of(cls, prediction: Prediction) -> PartialPrediction:
        """Every field of a full prediction."""
        return cls(**{f.name: getattr(prediction, f.name) for f in dataclasses.fields(Prediction)})

    def fields_set(self) -> tuple[str, ...]:
        """Names of the fields that hold a value, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def complete(self) -> Prediction | None:
        """The full `Prediction`, or None while num_req, isl or osl is missing."""
        if self.num_req is None or self.isl is None or self.osl is None:
            return None
        return Prediction(
            num_req=self.num_req,
            isl=self.isl,
            osl=self.osl,
            quantile=self.quantile,
            isl_quantile=self.isl_quantile,
            osl_quantile=self.osl_quantile,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldResult:
    """A plugin's last successful result, replayed on ticks where it is not due (HOLD_LAST).

    Attributes:
        produced_at_s: scheduled time of the tick that produced it.
        predictions: what a PREDICT plugin wrote (None for other phases or no opinion).
        overrides: what a PROPOSE/RECONCILE/CONSTRAIN plugin returned.
        final: whether the result claimed `final`.
    """

    produced_at_s: float
    predictions: PartialPrediction | None = None
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    observations: tuple[ObservedValue, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSchedule:
    """When one plugin of the pipeline was registered and last ran, and its held result.

    Attributes:
        plugin_id: the plugin.
        registered_at_s: scheduled time of the first tick that saw the plugin; a plugin with an interval first
            runs at `registered_at_s + interval`.
        last_run_at_s: scheduled time of its last successful run (None: never ran); the next run is due at
            `last_run_at_s + interval`.
        held: its last result, kept only under HOLD_LAST.
        failures_at_s, circuit_opened_at_s: its circuit breaker (`planner_core.pipeline.breaker`).
    """

    plugin_id: str
    registered_at_s: float
    last_run_at_s: float | None = None
    held: HeldResult | None = None
    # circuit breaker (plugins with a `BreakerSpec` only), in tick time: the failures inside the window, oldest
    # first, and when the breaker opened (None: closed)
    failures_at_s: tuple[float, ...] = ()
    circuit_opened_at_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteAnswer:
    """What one out-of-process (gRPC) plugin answered in one phase of one tick, as the pipeline will use it.

    The runtime turns the wire answer (or the failure: unreachable, deadline exceeded, garbage) into this record;
    the pipeline turns the record into the plugin's result (`planner_core.pipeline.remote.answer_result`). Live
    ticks and replay go through the same conversion, so a replayed tick uses exactly what the plugin said.

    Attributes:
        plugin_id: the plugin (`scheduling.external_plugins[].plugin_id`).
        phase: the phase's value ("observe", "predict", "propose", "reconcile", "constrain").
        reason: PLUGIN_OBSERVED / PREDICTED / PLUGIN_OVERRIDES / PLUGIN_NO_OPINION when it answered usefully;
            PLUGIN_TIMEOUT, PLUGIN_UNAVAILABLE, PLUGIN_INVALID_RESULT or PLUGIN_RAISED when the call failed.
        detail: the plugin's own reason string, or what went wrong (one line).
        predictions, overrides, final, observations: the answer (PREDICT, PROPOSE/RECONCILE/CONSTRAIN, OBSERVE).
    """

    plugin_id: str
    phase: str
    reason: ReasonCode
    detail: str = ""
    predictions: PartialPrediction | None = None
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    observations: tuple[ObservedValue, ...] = ()

    @property
    def failed(self) -> bool:
        return self.reason in REMOTE_FAILURES


# The reasons of a remote answer that is a failure: the plugin is skipped and its breaker counts it.
REMOTE_FAILURES = frozenset(
    {
        ReasonCode.PLUGIN_TIMEOUT,
        ReasonCode.PLUGIN_UNAVAILABLE,
        ReasonCode.PLUGIN_INVALID_RESULT,
        ReasonCode.PLUGIN_RAISED,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineState:
    """Scheduling state of the plugin pipeline: one entry per plugin, sorted by plugin id."""

    plugins: tuple[PluginSchedule, ...] = ()

    def schedule(self, plugin_id: str) -> PluginSchedule | None:
        """The entry of one plugin, or None if the pipeline has not seen it yet."""
        for entry in self.plugins:
            if entry.plugin_id == plugin_id:
                return entry
        return None
