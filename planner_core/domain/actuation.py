"""Safe actuation (ours): who owns a pool's replica count, and how healthy the signals a tick decides on are.

- **Ownership.** The runtime compares the count in force on the cluster with the count the planner itself last
  applied and hands a difference to the tick as an `OutsideChange` (`TickInputs.outside_changes`): an HPA, a
  `kubectl scale` or an operator changed it. The core applies the configured rule (`planner_core.policy.ownership`)
  and keeps the counts it adopted in `PlannerState.adopted_counts`.
- **Signal health.** Each source signal (`Signal`) has a freshness (when it was last seen) and a streak of ticks
  that expected it and missed it (`SignalStatus`, kept in `PlannerState.signals`, updated by
  `planner_core.policy.signals`); a tick whose signal is missing never shrinks a pool.
- **Events.** What a tick did, in one Kubernetes-Event-shaped record (`TickEvent`), at most one per tick; the
  runtime posts it on the scaled object.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from planner_core.domain.components import Component


class Signal(enum.StrEnum):
    """A source signal the planner decides on (values are stored in the planner state and label the metrics)."""

    TRAFFIC = "traffic"  # the frontend's request counts and lengths of a throughput window
    LATENCY = "latency"  # the frontend's TTFT/ITL of that window (where the config reads latency)
    FPM = "fpm"  # the engines' forward-pass metrics (the load loop)
    WORKERS = "workers"  # the ready and expected worker counts the connector reads


@dataclass(frozen=True, slots=True, kw_only=True)
class OutsideChange:
    """A pool whose count in force differs from every count the planner applied or has in flight.

    Attributes:
        component: the pool.
        planner_replicas: the count the planner last applied to the pool (its newest applied decision's target).
        observed_replicas: the count in force now (the connector's expected count: what the scale holds).
    """

    component: Component
    planner_replicas: int
    observed_replicas: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AdoptedCount:
    """A count someone else set that the planner adopted (`outside_change_rule: adopt_and_hold`).

    `at_s` is the tick that detected it; until `hold_until_s` the planner keeps the pool at `replicas`. The record
    stays while the runtime still reports the same outside count (so it is not detected again) and goes once the
    pool is back at a count the planner applied."""

    component: Component
    replicas: int
    at_s: float
    hold_until_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalStatus:
    """One signal's health after a tick: `last_seen_s` the newest tick that had it (None: never), `num_misses`
    the ticks in a row, up to this one, that expected it and did not have it (0: fresh)."""

    signal: Signal
    last_seen_s: float | None = None
    num_misses: int = 0


class EventReason(enum.StrEnum):
    """The reason of a Kubernetes Event the planner posts on the scaled object (llm-d's names where it has one)."""

    SCALED_UP = "ScaledUp"  # a pool's target raised
    SCALED_DOWN = "ScaledDown"  # a pool's target lowered
    RESOURCE_CONSTRAINED = "ResourceConstrained"  # the GPU budget or the fleet ceiling cut what the planner wanted
    METRICS_UNAVAILABLE = "MetricsUnavailable"  # a signal the tick expected was missing (no pool shrinks)
    DECISION_FAILED = "DecisionFailed"  # the tick raised before it could decide
    OUTSIDE_CHANGE = "ReplicasChangedOutside"  # someone else changed a pool's count (ours)


@dataclass(frozen=True, slots=True, kw_only=True)
class TickEvent:
    """The one Event a tick posts: its reason, a one-line message and whether it is a Warning (else Normal)."""

    reason: EventReason
    message: str
    warning: bool = False
