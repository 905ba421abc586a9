"""One tick's boundary: what it sees (`TickInputs`), what each loop proposes, the decision, and what `tick()`
returns (`TickOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass

from planner_core.domain.actuation import OutsideChange
from planner_core.domain.components import Component, Loop
from planner_core.domain.forecast import Prediction
from planner_core.domain.observations import (
    AppliedTargets,
    ForwardPassMetrics,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.domain.pipeline_state import RemoteAnswer
from planner_core.domain.reasons import ReasonCode, StepRecord
from planner_core.domain.state import PlannerState


@dataclass(frozen=True, slots=True, kw_only=True)
class TickInputs:
    """Everything one tick sees. `now_s` is the scheduled time of the tick in epoch seconds (time is data).

    `fpm` holds the forward-pass metrics observed since the previous tick (the latest per engine last), for
    the online perf models and the load loop. `unplaced` holds, per pool, the requests the router could not place
    (empty when the router does not report them: routers that never refuse a request).
    """

    now_s: float
    loop: Loop
    workers: WorkerCounts
    traffic: TrafficObservation | None = None
    fpm: tuple[ForwardPassMetrics, ...] = ()
    unplaced: tuple[UnplacedRequests, ...] = ()
    # What the out-of-process plugins answered during this tick (filled in by the runtime after the live tick,
    # recorded with the inputs): replay reads these answers and never calls a plugin.
    remote: tuple[RemoteAnswer, ...] = ()
    # A fleet member's ceiling (GPUs): its grant at the fleet's newest arbitration round plus the GPUs that round
    # left unallocated. The tick's decision grows no further (a want above it is still proposed, and reaches the
    # next arbitration as the member's claim); it never forces a pool below its expected count. None: no fleet
    # budget, or no round has granted this deployment anything yet.
    gpu_ceiling: int | None = None
    # The decisions the execution flow applied since the oldest scale-up the planner waits to see ready, oldest
    # first (ours: what splits a measured start-up into the connector's acknowledgement and the engines' own
    # start). Empty where targets apply within the deciding tick (the benchmark's simulator).
    applied: tuple[AppliedTargets, ...] = ()
    # Pools whose count in force someone else changed (ours, `planner_core.policy.ownership`): the count the planner
    # last applied and the count observed. Empty where the connector owns the count alone (local, virtual).
    outside_changes: tuple[OutsideChange, ...] = ()
    # False when the connector could not read the worker counts this tick (`workers` is then a stand-in and the
    # tick changes no pool, `planner_core.policy.signals`).
    workers_observed: bool = True

    def unplaced_for(self, component: Component) -> UnplacedRequests | None:
        """The unplaced-request report of `component`'s pool, if any."""
        return next((u for u in self.unplaced if u.component is component), None)

    def remote_answer(self, plugin_id: str, phase: str) -> RemoteAnswer | None:
        """The recorded answer of one remote plugin in one phase, or None."""
        for answer in self.remote:
            if answer.plugin_id == plugin_id and answer.phase == phase:
                return answer
        return None


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
