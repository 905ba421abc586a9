"""How the pipeline combines what plugins return: the PREDICT chain and the type-aware override merge.

PREDICT (`merge_predictions`): plugins run in priority order and each forecast field keeps the first value
written (smaller priority wins); None means "no opinion".

PROPOSE / RECONCILE / CONSTRAIN (`merge_overrides`), per phase, against the targets coming into the phase:

1. Any REJECT short-circuits the tick (a safety veto outranks everything, `final` included).
2. Else, if some result claimed `final`, the one with the smallest priority is merged alone ("verbatim"); every
   other result of the phase is discarded.
3. Else, per pool: `floor = max(AT_LEAST)`, `ceiling = min(AT_MOST)`, `rec = SET of the smallest priority` (else
   the incoming target) and `result = max(floor, min(ceiling, rec))`: the floor wins a floor/ceiling conflict.

CONSTRAIN may only bound: its SETs are dropped and its `final` ignored. Ties of priority are broken by plugin id
so the result never depends on the order plugins were listed in. Pure functions; every override and every pool
that an override touched produces a `StepRecord`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from planner_core.domain import Component, OverrideType, PartialPrediction, ReasonCode, ReplicaOverride, StepRecord
from planner_core.pipeline.types import Contribution, Phase

_OVERRIDE_REASON = {
    OverrideType.SET: ReasonCode.OVERRIDE_SET,
    OverrideType.AT_LEAST: ReasonCode.OVERRIDE_AT_LEAST,
    OverrideType.AT_MOST: ReasonCode.OVERRIDE_AT_MOST,
    OverrideType.REJECT: ReasonCode.OVERRIDE_REJECT,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MergeOutcome:
    """The merge of one phase.

    Attributes:
        targets: per managed pool, the merged count (the incoming target where no override spoke).
        touched: pools some used override spoke about.
        rejected_by: the smallest-priority rejecting contribution, if the phase short-circuited.
        short_circuit_reason: who rejected and why ("" otherwise).
        steps: one step per override (accepted, dropped or invalid), the final/short-circuit step, and one step per
            touched pool.
    """

    targets: Mapping[Component, int]
    touched: frozenset[Component] = frozenset()
    rejected_by: Contribution | None = None
    short_circuit_reason: str = ""
    steps: tuple[StepRecord, ...] = ()


def merge_predictions(
    current: PartialPrediction, new: PartialPrediction
) -> tuple[PartialPrediction, tuple[str, ...], tuple[str, ...]]:
    """First writer wins: fill the fields of `current` that are None from `new`.

    Returns:
        The merged prediction, the fields taken from `new`, and the fields of `new` ignored because `current`
        already had them.
    """
    taken: dict[str, object] = {}
    shadowed: list[str] = []
    for name in new.fields_set():
        if getattr(current, name) is None:
            taken[name] = getattr(new, name)
        else:
            shadowed.append(name)
    return dataclasses.replace(current, **taken), tuple(taken), tuple(shadowed)


def _invalid(override: object) -> str | None:
    """Why an override cannot be merged, or None when it is well-formed."""
    if not isinstance(override, ReplicaOverride):
        return f"not a ReplicaOverride: {type(override).__name__}"
    if not isinstance(override.kind, OverrideType):
        return f"kind {override.kind!r} is not an OverrideType"
    if override.kind is OverrideType.REJECT:
        return None
    if not isinstance(override.component, Component):
        return f"{override.kind.value} needs a component, got {override.component!r}"
    replicas = override.replicas
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        return f"{override.kind.value} needs replicas as an integer >= 0, got {replicas!r}"
    return None


def _describe(contribution: Contribution) -> str:
    held = "" if contribution.held_from_s is None else f", held from t={contribution.held_from_s:g}"
    return f"{contribution.plugin_id} (priority {contribution.priority}{held})"


def merge_overrides(
    phase: Phase, contributions: Iterable[Contribution], baseline: Mapping[Component, int]
) -> MergeOutcome:
    """Merge one phase's contributions onto `baseline` (the targets coming into the phase).

    Args:
        phase: PROPOSE, RECONCILE or CONSTRAIN (CONSTRAIN drops SET and ignores `final`).
        contributions: the phase's results, fresh or replayed; any order.
        baseline: per managed pool, the incoming target; its keys are the pools overrides may speak about.

    Returns:
        The merged targets for every pool of `baseline`, what was touched, the short-circuit if any, and steps.
    """
    ordered = sorted(contributions, key=lambda c: c.order_key)
    constrain = phase is Phase.CONSTRAIN
    kept, screened = _screen(phase, ordered, baseline)
    steps: list[StepRecord] = list(screened)

    merge_step = f"{phase.value}:merge"
    for contribution in ordered:
        rejects = [o for o in kept[contribution.plugin_id] if o.kind is OverrideType.REJECT]
        if rejects:
            why = f": {rejects[0].reason}" if rejects[0].reason else ""
            reason = f"rejected by {_describe(contribution)}{why}"
            steps.append(StepRecord(step=merge_step, reason=ReasonCode.SKIP_SHORT_CIRCUIT, detail=reason))
            return MergeOutcome(
                targets=MappingProxyType(dict(baseline)),
                rejected_by=contribution,
                short_circuit_reason=reason,
                steps=tuple(steps),
            )

    used = ordered
    finals = [] if constrain else [c for c in ordered if c.final]
    if finals:
        winner = finals[0]  # `ordered` is sorted by (priority, plugin id)
        discarded = [c.plugin_id for c in ordered if c is not winner]
        detail = f"final result of {_describe(winner)} taken verbatim"
        if discarded:
            detail += "; discarded: " + ", ".join(discarded)
        steps.append(StepRecord(step=merge_step, reason=ReasonCode.MERGE_FINAL, detail=detail))
        used = [winner]

    targets = dict(baseline)
    touched: set[Component] = set()
    for component, incoming in baseline.items():
        relevant = [(c, o) for c in used for o in kept[c.plugin_id] if o.component is component]
        if not relevant:
            continue
        touched.add(component)
        targets[component], step = _merge_pool(component, incoming, relevant, merge_step)
        steps.append(step)
    return MergeOutcome(targets=MappingProxyType(targets), touched=frozenset(touched), steps=tuple(steps))


def _screen(
    phase: Phase, ordered: list[Contribution], baseline: Mapping[Component, int]
) -> tuple[dict[str, list[ReplicaOverride]], tuple[StepRecord, ...]]:
    """Each contribution's overrides the merge may use, per plugin, and a step for every override: taken, or
    dropped as invalid, for a pool this planner does not manage, or (CONSTRAIN) a SET; in CONSTRAIN a `final` is
    noted as ignored."""
    constrain = phase is Phase.CONSTRAIN
    steps: list[StepRecord] = []
    kept: dict[str, list[ReplicaOverride]] = {}
    for contribution in ordered:
        name = f"{phase.value}:{contribution.plugin_id}"
        held = "" if contribution.held_from_s is None else f" (held from t={contribution.held_from_s:g})"
        usable = kept.setdefault(contribution.plugin_id, [])
        for override in contribution.overrides:
            problem = _invalid(override)
            if problem is not None:
                steps.append(StepRecord(step=name, reason=ReasonCode.OVERRIDE_INVALID, detail=problem + held))
                continue
            component = override.component if isinstance(override.component, Component) else None
            value = None if override.replicas is None else float(override.replicas)
            if override.kind is not OverrideType.REJECT and component not in baseline:
                detail = f"{override.kind.value} {override.replicas} for a pool this planner does not manage{held}"
                reason = ReasonCode.UNMANAGED_COMPONENT
            elif constrain and override.kind is OverrideType.SET:
                detail = f"set {override.replicas} dropped: CONSTRAIN may only bound (AT_LEAST / AT_MOST){held}"
                reason = ReasonCode.CONSTRAIN_SET_DROPPED
            else:
                detail = f"{override.reason}{held}" if override.reason else held.strip(" ()")
                reason = _OVERRIDE_REASON[override.kind]
                usable.append(override)
            steps.append(StepRecord(step=name, reason=reason, component=component, value=value, detail=detail))
        if constrain and contribution.final:
            steps.append(
                StepRecord(
                    step=name,
                    reason=ReasonCode.CONSTRAIN_FINAL_IGNORED,
                    detail="final is ignored in CONSTRAIN; merged with the others" + held,
                )
            )
    return kept, tuple(steps)


def _merge_pool(
    component: Component,
    incoming: int,
    relevant: list[tuple[Contribution, ReplicaOverride]],
    merge_step: str,
) -> tuple[int, StepRecord]:
    """One pool's merged target: the first SET (else the incoming target), capped by the lowest AT_MOST, raised
    to the highest AT_LEAST (a floor over a ceiling wins), and its merge step naming who set each bound."""
    floors = [(o.replicas, c.plugin_id) for c, o in relevant if o.kind is OverrideType.AT_LEAST]
    ceilings = [(o.replicas, c.plugin_id) for c, o in relevant if o.kind is OverrideType.AT_MOST]
    sets = [(o.replicas, c.plugin_id) for c, o in relevant if o.kind is OverrideType.SET]
    floor = max((value for value, _ in floors), default=0)
    ceiling = min((value for value, _ in ceilings), default=None)
    rec, rec_source = (sets[0][0], f"set by {sets[0][1]}") if sets else (incoming, "incoming target")
    result = max(floor, rec if ceiling is None else min(ceiling, rec))
    if ceiling is not None and floor > ceiling:
        reason = ReasonCode.MERGE_FLOOR_OVER_CEILING
    elif result > rec:
        reason = ReasonCode.MERGE_FLOOR
    elif result < rec:
        reason = ReasonCode.MERGE_CEILING
    else:
        reason = ReasonCode.WITHIN_RANGE
    parts = [f"recommendation {rec} ({rec_source})"]
    if floors:
        parts.append(f"floor {floor} ({', '.join(p for v, p in floors if v == floor)})")
    if ceilings:
        parts.append(f"ceiling {ceiling} ({', '.join(p for v, p in ceilings if v == ceiling)})")
    detail = ", ".join(parts) + f" -> {result}"
    return result, StepRecord(step=merge_step, reason=reason, component=component, value=float(result), detail=detail)
