"""The one Event a tick posts on the scaled object (ours; llm-d's reasons): what the tick did, by priority.

`tick_event(inputs, outcome)` is pure; the runtime posts what it returns (`planner_core.runtime.service`). At most
one per tick, the most telling first: `MetricsUnavailable` (a signal the tick expected was missing, so no pool
shrank), `ReplicasChangedOutside` (someone else changed a pool's count), `ResourceConstrained` (the GPU budget or
the fleet ceiling cut the targets), then `ScaledUp` / `ScaledDown` (an executed decision that raises or lowers a
pool). A tick that did none of these posts nothing; `DecisionFailed` is the runtime's, for a tick that raised.
"""

from __future__ import annotations

from planner_core.domain import (
    Component,
    EventReason,
    ReasonCode,
    TickEvent,
    TickInputs,
    TickOutcome,
)

_CONSTRAINED = (ReasonCode.GPU_BUDGET_CAPPED, ReasonCode.FLEET_CEILING_CAPPED)
_OUTSIDE = (ReasonCode.OUTSIDE_CHANGE_ADOPTED, ReasonCode.OUTSIDE_CHANGE_RESTORED)


def tick_event(inputs: TickInputs, outcome: TickOutcome) -> TickEvent | None:
    """The Event of one recorded tick, or None."""
    prefix = f"{inputs.loop.value} tick"
    missed = [s.detail for s in outcome.steps if s.reason is ReasonCode.SIGNAL_MISSED]
    if missed:
        return TickEvent(reason=EventReason.METRICS_UNAVAILABLE, message=f"{prefix}: {'; '.join(missed)}", warning=True)
    outside = [s.detail for s in outcome.steps if s.reason in _OUTSIDE]
    if outside:
        return TickEvent(reason=EventReason.OUTSIDE_CHANGE, message=f"{prefix}: {'; '.join(outside)}", warning=True)
    decision = outcome.decision
    if decision.is_empty or decision.advisory:
        return None
    changes = []
    up = down = False
    for component, target in ((Component.PREFILL, decision.num_prefill), (Component.DECODE, decision.num_decode)):
        if target is None:
            continue
        current = inputs.workers.expected(component)
        up, down = up or target > current, down or target < current
        changes.append(f"{component.value} {current} -> {target}")
    summary = f"{prefix}: {', '.join(changes)} ({outcome.reason.value})"
    constrained = [s.detail for s in outcome.steps if s.reason in _CONSTRAINED]
    if constrained:
        return TickEvent(
            reason=EventReason.RESOURCE_CONSTRAINED, message=f"{summary}; {'; '.join(constrained)}", warning=True
        )
    if up:
        return TickEvent(reason=EventReason.SCALED_UP, message=summary)
    if down:
        return TickEvent(reason=EventReason.SCALED_DOWN, message=summary)
    return None
