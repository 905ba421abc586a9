"""Scale to zero, and wake (ours): a pool whose minimum endpoints is 0 goes to zero only after it has been idle for
`scale_to_zero_idle_seconds`, and a pool at zero is woken by the first request seen for it.

Pure, like the rest of the policy: the tick's inputs say whether there was demand this tick, and the planner state
carries when demand was last seen (`PlannerState.last_demand_s`), so a replayed tick decides exactly as it did live.
Demand is any of:

- requests held at the edge for the deployment (`TickInputs.unplaced`: the routing proxy holds a request while no
  engine is ready and reports how many it holds; the wake tick it triggers records that count as its input);
- requests that arrived in the tick's traffic window (`traffic.num_req`, a valid observation only);
- engines with requests scheduled or queued in their newest forward passes (`fpm`, load ticks).

Per managed pool whose minimum is 0 (`scale_to_zero_bounds`), as CONSTRAIN bounds of the pipeline:

- demand this tick: at least one replica (`woken` for a pool at zero, `idle_hold` otherwise);
- a pool above zero, idle for the hold: at most zero (`scaled_to_zero`);
- a pool above zero, idle for less than the hold: at least one (`idle_hold`: another plugin's zero waits);
- a pool at zero without demand: at most zero (`at_zero`): only demand wakes it, not a forecast's residue.

A source that misses its signal keeps the pool from shrinking (the signal guard, `planner_core.policy.signals`), so a
Prometheus outage does not look like an idle pool.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner_core.config import PlannerConfig, managed_components
from planner_core.domain import (
    OverrideType,
    PlannerState,
    ReasonCode,
    ReplicaOverride,
    StepName,
    StepRecord,
    TickInputs,
)
from planner_core.policy.bounds import min_endpoints


@dataclass(frozen=True, slots=True, kw_only=True)
class DemandSeen:
    """The demand one tick saw: requests held at the edge, arrived in its window, and in the engines' queues."""

    num_held: int = 0
    num_arrived: float = 0.0
    num_in_engines: int = 0

    @property
    def any(self) -> bool:
        return self.num_held > 0 or self.num_arrived > 0 or self.num_in_engines > 0

    def describe(self) -> str:
        return (
            f"{self.num_held} held at the edge, {self.num_arrived:g} arrived in the window, "
            f"{self.num_in_engines} in the engines"
        )


def demand_seen(inputs: TickInputs) -> DemandSeen:
    """What demand the tick's inputs show (see the module docstring)."""
    num_held = sum(u.num_waiting + u.num_unplaced for u in inputs.unplaced)
    traffic = inputs.traffic
    arrived = traffic.num_req if traffic is not None and traffic.invalid_field() is None else 0.0
    in_engines = sum(
        f.scheduled.num_prefill_requests
        + f.scheduled.num_decode_requests
        + f.queued.num_prefill_requests
        + f.queued.num_decode_requests
        for f in inputs.fpm
    )
    return DemandSeen(num_held=num_held, num_arrived=arrived, num_in_engines=in_engines)


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroBounds:
    """The bounds for the pools at minimum 0, their steps, and the state with the last demand's time."""

    overrides: tuple[ReplicaOverride, ...]
    steps: tuple[StepRecord, ...]
    state: PlannerState


def scale_to_zero_bounds(config: PlannerConfig, inputs: TickInputs, state: PlannerState) -> ZeroBounds:
    """Each zero-minimum pool's bound this tick (see the module docstring); none without `scale_to_zero_idle_seconds`.

    The idle time counts from the last tick that saw demand; a deployment's first tick starts it (a pool is never
    taken to zero before the planner has watched it for a whole hold)."""
    hold_s = config.scale_to_zero_idle_seconds
    if hold_s is None:
        return ZeroBounds(overrides=(), steps=(), state=state)
    now_s = inputs.now_s
    demand = demand_seen(inputs)
    last_s = now_s if demand.any or state.last_demand_s is None else state.last_demand_s
    idle_s = now_s - last_s
    floors = min_endpoints(config)
    overrides: list[ReplicaOverride] = []
    steps: list[StepRecord] = []
    for component in managed_components(config.mode):
        if floors[component] != 0:
            continue
        current = inputs.workers.expected(component)
        kind, reason, detail = _bound(current, demand, idle_s, hold_s)
        replicas = 1 if kind is OverrideType.AT_LEAST else 0
        overrides.append(ReplicaOverride(component=component, kind=kind, replicas=replicas, reason=reason.value))
        steps.append(
            StepRecord(step=StepName.SCALE_TO_ZERO, component=component, value=replicas, reason=reason, detail=detail)
        )
    return ZeroBounds(
        overrides=tuple(overrides), steps=tuple(steps), state=dataclasses.replace(state, last_demand_s=last_s)
    )


def _bound(current: int, demand: DemandSeen, idle_s: float, hold_s: float) -> tuple[OverrideType, ReasonCode, str]:
    """One pool's bound: its kind (AT_LEAST 1 or AT_MOST 0), reason code and explanation."""
    if demand.any:
        reason = ReasonCode.WOKEN if current == 0 else ReasonCode.IDLE_HOLD
        verb = "woken: 0 -> at least 1" if current == 0 else f"kept at least 1 (now {current})"
        return OverrideType.AT_LEAST, reason, f"demand this tick ({demand.describe()}): {verb}"
    if current == 0:
        return OverrideType.AT_MOST, ReasonCode.AT_ZERO, "at zero, no demand this tick: kept at zero until a request"
    if idle_s >= hold_s:
        detail = f"idle for {idle_s:g} s >= the hold {hold_s:g} s: {current} -> 0"
        return OverrideType.AT_MOST, ReasonCode.SCALED_TO_ZERO, detail
    detail = f"idle for {idle_s:g} s < the hold {hold_s:g} s: kept at least 1 (now {current})"
    return OverrideType.AT_LEAST, ReasonCode.IDLE_HOLD, detail
