"""One owner of the replica count (ours): the rule for a pool whose count someone else changed.

The runtime detects the change (the count in force differs from every count the planner applied or has in flight)
and hands it to the tick as an `OutsideChange`; this module applies `outside_change_rule`, purely:

- `adopt_and_hold` (the default): the outside count becomes the pool's; for `outside_change_hold_seconds` the
  tick keeps the pool at it whatever the loops or plugins propose (the hold is applied after the minimum endpoints
  and the GPU budget: an operator's count is the operator's), then the planner sizes the pool again from it. The
  adoption is remembered (`PlannerState.adopted_counts`) so the same outside count is not detected again, and
  forgotten once the pool is back at a count the planner applied (no outside change reported) after its hold.
- `restore`: the tick's target for the pool is the count the planner last applied (then the minimum endpoints and
  the budget), so the next execution writes it back.

Either way the tick records an `ownership` step whose reason says what happened (`outside_change_adopted`,
`outside_change_held`, `outside_change_restored`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner_core.config import OutsideChangeRule, PlannerConfig, managed_components
from planner_core.domain import (
    AdoptedCount,
    Component,
    OutsideChange,
    ReasonCode,
    StepName,
    StepRecord,
    TickInputs,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnershipOutcome:
    """What the rule asks of this tick: pools to hold at a count, pools to restore to a count, the adoptions to
    remember, and the `ownership` steps."""

    hold: dict[Component, int]
    restore: dict[Component, int]
    adopted: tuple[AdoptedCount, ...]
    steps: tuple[StepRecord, ...]


def _step(reason: ReasonCode, component: Component, value: int, detail: str) -> StepRecord:
    return StepRecord(step=StepName.OWNERSHIP, reason=reason, component=component, value=float(value), detail=detail)


def _held_step(known: AdoptedCount) -> StepRecord:
    c = known.component
    detail = f"{c.value} held at the count adopted at t={known.at_s:g} until t={known.hold_until_s:g}"
    return _step(ReasonCode.OUTSIDE_CHANGE_HELD, c, known.replicas, detail)


def resolve_ownership(config: PlannerConfig, inputs: TickInputs, adopted: Sequence[AdoptedCount]) -> OwnershipOutcome:
    """Apply `config.outside_change_rule` to this tick's outside changes (`inputs.outside_changes`).

    Args:
        config: the rule and the hold.
        inputs: the tick's time and the outside changes the runtime observed (pools the mode does not manage are
            ignored).
        adopted: the counts adopted by earlier ticks (`PlannerState.adopted_counts`).

    Returns:
        The pools to hold (at their adopted count) and to restore (to the planner's count), the adoptions to carry
        forward and one `ownership` step per pool changed outside the planner.
    """
    now_s = inputs.now_s
    managed = managed_components(config.mode)
    earlier = {record.component: record for record in adopted}
    hold: dict[Component, int] = {}
    restore: dict[Component, int] = {}
    kept: list[AdoptedCount] = []
    steps: list[StepRecord] = []
    changes = {change.component: change for change in _changes_by_pool(inputs.outside_changes, managed)}
    for c in managed:
        known = earlier.get(c)
        if c not in changes:
            # no outside change reported: a decision of the planner's carried the adopted count (a decision names
            # every managed pool), so the count is the planner's now; the hold still runs while the count is it
            if known is not None and now_s < known.hold_until_s and inputs.workers.expected(c) == known.replicas:
                steps.append(_held_step(known))
                hold[c] = known.replicas
                kept.append(known)
            continue
        change = changes[c]
        seen = f"{c.value} count changed outside the planner: {change.planner_replicas} -> {change.observed_replicas}"
        if config.outside_change_rule is OutsideChangeRule.RESTORE:
            restore[c] = change.planner_replicas
            steps.append(
                _step(
                    ReasonCode.OUTSIDE_CHANGE_RESTORED,
                    c,
                    change.planner_replicas,
                    f"{seen}; restored to {change.planner_replicas} (outside_change_rule: restore)",
                )
            )
            continue
        if known is None or known.replicas != change.observed_replicas:
            known = AdoptedCount(
                component=c,
                replicas=change.observed_replicas,
                at_s=now_s,
                hold_until_s=now_s + float(config.outside_change_hold_seconds),
            )
            steps.append(
                _step(
                    ReasonCode.OUTSIDE_CHANGE_ADOPTED,
                    c,
                    known.replicas,
                    f"{seen}; adopted, held until t={known.hold_until_s:g} ({config.outside_change_hold_seconds:g} s)",
                )
            )
            hold[c] = known.replicas
        elif now_s < known.hold_until_s:
            steps.append(_held_step(known))
            hold[c] = known.replicas
        # past its hold, an adoption is only remembered: the planner sizes the pool from the adopted count
        kept.append(known)
    return OwnershipOutcome(hold=hold, restore=restore, adopted=tuple(kept), steps=tuple(steps))


def _changes_by_pool(changes: Sequence[OutsideChange], managed: Sequence[Component]) -> list[OutsideChange]:
    """The outside changes of the managed pools, one per pool (the last reported wins), in pool order."""
    by_pool = {change.component: change for change in changes if change.component in managed}
    return [by_pool[c] for c in managed if c in by_pool]
