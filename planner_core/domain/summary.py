"""A decision in one line: the stage that decided it and its numbers, derived from the tick's steps.

`summarize_decision(outcome)` reads a `TickOutcome` (its steps, proposals and decision) and returns a
`DecisionSummary`: the deciding `DecisionStage` (stored as `decisions.stage`, shown as `decision_history.reason`)
and a line of at most `MAX_SUMMARY_CHARS` characters (`decisions.summary`, `decision_history.why`), e.g.
`prefill 5->6: p99 prompt burst needs 7 (forecast 3); GPU budget: 6 (8 GPUs)`. The full chain stays in
`tick_steps`; this is the first thing a person reads.

How the stage is found, per pool whose target changed: the steps are walked in order, following the pool's count
through the steps whose value is a replica count (`_COUNT_STEPS`: demand, burst, hold, minimum, change rate, the
merges, the load signals, ...). Each change of the count is attributed to the step that made it, or, when that step
itself only passed the count on (`within_range`), to the step just before it that moves a count without recording
one (the start-up horizon's headroom, unplaced requests). The GPU budget and the fleet ceiling have no pool: a
target that differs from the last count followed is theirs. The deciding stage is the last attribution.

Pure (no I/O, no clock): the same outcome always gives the same summary, so a replayed tick's summary is the
recorded one whenever its steps are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from planner_core.domain.components import Component
from planner_core.domain.reasons import ReasonCode, StepName, StepRecord
from planner_core.domain.ticks import TickOutcome

MAX_SUMMARY_CHARS = 160


class DecisionStage(enum.StrEnum):
    """The stage of the planner that set a decision's targets (stored in `decisions.stage`: values never change)."""

    FORECAST = "forecast"  # the forecast demand over one engine's capacity (the throughput sizing)
    BURST = "burst"  # the observed prompt bursts (p99 prompt tokens over short intervals)
    HORIZON = "horizon"  # the start-up horizon's learned headroom
    HOLD = "hold"  # the scale-down hold or margin kept a larger size
    MINIMUM = "minimum"  # the pool's minimum endpoint count
    RATE_LIMIT = "rate_limit"  # the per-tick change limit (max_throughput_scaling_replicas)
    BUDGET = "budget"  # the GPU budget (max or min), including reconciling a deployment outside it
    FLEET = "fleet"  # a fleet member's ceiling from the fleet's arbitration
    PLUGIN = "plugin"  # a plugin's override (SET, AT_LEAST, AT_MOST, final)
    LOAD = "load"  # the load loop's latency or queue signal
    TAIL_LATENCY = "tail_latency"  # the frontend's TTFT tail or queue time
    UNPLACED = "unplaced"  # requests the SLO-aware router could not place
    THROUGHPUT_FLOOR = "throughput_floor"  # the load loop raised to (or held at) the throughput loop's floor
    OTHER = "other"  # no step recorded a count change (an older or foreign explanation)
    OWNERSHIP = "ownership"  # a count changed outside the planner was restored to the planner's (outside_change_rule)
    SCALE_TO_ZERO = "scale_to_zero"  # a zero-minimum pool woken by demand, held through its idle hold, or idle: 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionSummary:
    """The deciding stage and the one-line summary (at most `MAX_SUMMARY_CHARS` characters)."""

    stage: DecisionStage
    text: str


# Steps whose value is the pool's replica count after the step; a plugin's own override steps are opinions, not
# the count, so only the merge steps (`<phase>:merge`) count among the plugin steps.
_COUNT_STEPS = frozenset(
    {
        StepName.DEMAND,
        StepName.BURST,
        StepName.SCALE_DOWN_HOLD,
        StepName.MIN_ENDPOINT,
        StepName.CHANGE_RATE,
        StepName.TTFT_SIGNAL,
        StepName.ITL_SIGNAL,
        StepName.THRESHOLD_SIGNAL,
        StepName.AGG_SIGNAL,
        StepName.THROUGHPUT_FLOOR,
        StepName.LOAD_DECISION,
        StepName.OWNERSHIP,
    }
)
_MERGE_SUFFIX = ":merge"

# The stage a step's reason names when the step changes a count.
_STAGE_OF_REASON = {
    ReasonCode.DEMAND_SIZED: DecisionStage.FORECAST,
    ReasonCode.BURST_SIZED: DecisionStage.BURST,
    ReasonCode.BURST_BY_COUNT_SIZED: DecisionStage.BURST,
    ReasonCode.HORIZON_HEADROOM: DecisionStage.HORIZON,
    ReasonCode.HORIZON_SHORT_HISTORY: DecisionStage.HORIZON,
    ReasonCode.SCALE_DOWN_HELD: DecisionStage.HOLD,
    ReasonCode.MIN_ENDPOINT_FLOOR: DecisionStage.MINIMUM,
    ReasonCode.DELTA_CAPPED: DecisionStage.RATE_LIMIT,
    ReasonCode.GPU_BUDGET_CAPPED: DecisionStage.BUDGET,
    ReasonCode.GPU_BUDGET_FLOORED: DecisionStage.BUDGET,
    ReasonCode.GPU_BUDGET_RECONCILE: DecisionStage.BUDGET,
    ReasonCode.GPU_BUDGET_GUARD_HOLD: DecisionStage.BUDGET,
    ReasonCode.FLEET_CEILING_CAPPED: DecisionStage.FLEET,
    ReasonCode.MERGE_FINAL: DecisionStage.PLUGIN,
    ReasonCode.MERGE_FLOOR: DecisionStage.PLUGIN,
    ReasonCode.MERGE_CEILING: DecisionStage.PLUGIN,
    ReasonCode.MERGE_FLOOR_OVER_CEILING: DecisionStage.PLUGIN,
    ReasonCode.SCALE_UP: DecisionStage.LOAD,
    ReasonCode.SCALE_DOWN: DecisionStage.LOAD,
    ReasonCode.TAIL_LATENCY_HIGH: DecisionStage.TAIL_LATENCY,
    ReasonCode.TAIL_LATENCY_REFUSED_DOWN: DecisionStage.TAIL_LATENCY,
    ReasonCode.UNPLACED_REQUESTS: DecisionStage.UNPLACED,
    ReasonCode.RAISED_TO_THROUGHPUT_FLOOR: DecisionStage.THROUGHPUT_FLOOR,
    ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT: DecisionStage.THROUGHPUT_FLOOR,
    ReasonCode.OUTSIDE_CHANGE_RESTORED: DecisionStage.OWNERSHIP,
    ReasonCode.WOKEN: DecisionStage.SCALE_TO_ZERO,
    ReasonCode.IDLE_HOLD: DecisionStage.SCALE_TO_ZERO,
    ReasonCode.SCALED_TO_ZERO: DecisionStage.SCALE_TO_ZERO,
}
# The scale-to-zero bounds (a CONSTRAIN plugin's): the count they set shows in the merge step after them, which is
# theirs rather than an anonymous plugin's.
_ZERO_BOUNDS = frozenset({ReasonCode.WOKEN, ReasonCode.IDLE_HOLD, ReasonCode.SCALED_TO_ZERO})
# Steps that move a pool's count without recording the count (their value is engines of headroom, or requests):
# a count step after them that only passes its input on shows their effect.
_UNCOUNTED = frozenset(
    {ReasonCode.HORIZON_HEADROOM, ReasonCode.HORIZON_SHORT_HISTORY, ReasonCode.UNPLACED_REQUESTS, *_ZERO_BOUNDS}
)
# Pool-less steps that set targets of both pools: a final target that differs from the count followed is theirs.
_POOL_LESS = frozenset({StepName.GPU_BUDGET, StepName.FLEET_CEILING})


@dataclass(frozen=True, slots=True)
class _Change:
    stage: DecisionStage
    phrase: str


def _phrase(stage: DecisionStage, step: StepRecord, count: int) -> str:
    """What one stage did to a pool's count, with its number."""
    value = 0.0 if step.value is None else step.value
    match stage:
        case DecisionStage.FORECAST:
            return f"forecast needs {count}"
        case DecisionStage.BURST:
            return f"p99 prompt burst needs {count}"
        case DecisionStage.HORIZON:
            return f"start-up horizon +{value:.2f} engines: {count}"
        case DecisionStage.HOLD:
            return f"scale-down hold keeps {count}"
        case DecisionStage.MINIMUM:
            return f"minimum {count}"
        case DecisionStage.RATE_LIMIT:
            return f"change limit allows {count}"
        case DecisionStage.BUDGET:
            return f"GPU budget allows {count} ({value:g} GPUs)"
        case DecisionStage.FLEET:
            return f"fleet ceiling {value:g} GPUs allows {count}"
        case DecisionStage.PLUGIN:
            return f"plugin {_plugin_of(step)}sets {count}"
        case DecisionStage.LOAD:
            # the load signals' details read `<n> -> <desired>: <what the engines measured>`: that measure is kept
            signal = str(step.step).removesuffix("_signal").replace("_", " ")
            _, _, measured = step.detail.partition(": ")
            return f"{signal} signal asks {count}" + (f" ({measured})" if measured else "")
        case DecisionStage.TAIL_LATENCY:
            # `<tail and queue> above the <target> ms TTFT target: <n> -> <raised>`: the measure is kept
            measured = step.detail.rpartition(": ")[0]
            return f"frontend TTFT tail asks {count}" + (f" ({measured})" if measured else "")
        case DecisionStage.UNPLACED:
            return f"{value:.0f} unplaced requests: {count}"
        case DecisionStage.THROUGHPUT_FLOOR:
            return f"throughput floor {count}"
        case DecisionStage.OWNERSHIP:
            return f"changed outside the planner: its {count} restored"
        case DecisionStage.SCALE_TO_ZERO:
            why = {ReasonCode.WOKEN: "woken by demand", ReasonCode.SCALED_TO_ZERO: "idle for the hold"}
            return f"{why.get(step.reason, 'idle hold keeps')} {count}"
    return f"{step.step} {count}"


def _plugin_of(step: StepRecord) -> str:
    """The plugin named in a merge step's detail (`... (set by NAME) ...`), with a trailing space; '' if none."""
    marker = "by "
    at = step.detail.find(marker)
    if at < 0:
        return ""
    name = step.detail[at + len(marker) :].split(")")[0].split(",")[0].split()[0:1]
    return f"{name[0]} " if name else ""


def _stage_of_count_step(step: StepRecord) -> DecisionStage | None:
    stage = _STAGE_OF_REASON.get(step.reason)
    if stage is None and str(step.step).endswith(_MERGE_SUFFIX):
        # a merge that took a plugin's SET over the builtin's (within_range, the recommendation changed)
        return DecisionStage.PLUGIN
    return stage


def _changes(
    steps: tuple[StepRecord, ...], component: Component, *, current: int, desired: int, target: int
) -> list[_Change]:
    """The changes of `component`'s count along the steps, from `current`, each attributed to a stage, in order.
    `desired` is the count after the GPU budget (the proposal), `target` the decision's (after the fleet ceiling)."""
    changes: list[_Change] = []
    count = current
    uncounted: StepRecord | None = None
    for step in steps:
        if step.component is None and step.step in _POOL_LESS:
            after = desired if step.step == StepName.GPU_BUDGET else target
            stage = _STAGE_OF_REASON.get(step.reason)
            if stage is not None and after != count:
                changes.append(_Change(stage, _phrase(stage, step, after)))
                count = after
            continue
        if step.component is not component:
            continue
        if step.reason in _UNCOUNTED:
            uncounted = step
            continue
        is_count = step.step in _COUNT_STEPS or str(step.step).endswith(_MERGE_SUFFIX)
        if not is_count or step.value is None:
            continue
        value = int(round(step.value))
        # the forecast's need is the baseline the later stages are read against: shown even when it is the count
        if value != count or (step.reason is ReasonCode.DEMAND_SIZED and not changes):
            stage, source = _stage_of_count_step(step), step
            bounded = uncounted is not None and uncounted.reason in _ZERO_BOUNDS
            if (stage is None or step.reason is ReasonCode.WITHIN_RANGE or bounded) and uncounted is not None:
                stage, source = _STAGE_OF_REASON[uncounted.reason], uncounted
            if stage is not None:
                changes.append(_Change(stage, _phrase(stage, source, value)))
            count = value
        uncounted = None
    return changes


def _line(component: Component, current: int, target: int, changes: list[_Change]) -> str:
    """`prefill 5->6: p99 prompt burst needs 7 (forecast 3); GPU budget ...`: the sizing's first need folded into
    the burst that raised it, so the deciding numbers come first."""
    phrases = [c.phrase for c in changes]
    if len(changes) >= 2 and changes[0].stage is DecisionStage.FORECAST and changes[1].stage is DecisionStage.BURST:
        forecast = changes[0].phrase.removeprefix("forecast needs ")
        phrases = [f"{changes[1].phrase} (forecast {forecast})", *phrases[2:]]
    return f"{component.value} {current}->{target}: " + ("; ".join(phrases) or "no count recorded")


def _cut(text: str, limit: int = MAX_SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarize_decision(outcome: TickOutcome) -> DecisionSummary:
    """The deciding stage and the one-line summary of a tick's decision (module docstring).

    A tick without a decision (no target changes) gets the stage `other` and its headline reason as the text.
    """
    decision = outcome.decision
    targets = {Component.PREFILL: decision.num_prefill, Component.DECODE: decision.num_decode}
    lines: list[str] = []
    stage: DecisionStage | None = None
    for proposal in outcome.proposals:
        target = targets.get(proposal.component)
        if target is None or target == proposal.current:
            continue
        changes = _changes(
            outcome.steps, proposal.component, current=proposal.current, desired=proposal.desired, target=target
        )
        lines.append(_line(proposal.component, proposal.current, target, changes))
        if stage is None and changes:
            stage = changes[-1].stage
    if not lines:
        return DecisionSummary(stage=DecisionStage.OTHER, text=_cut(outcome.reason.value))
    text = " | ".join(lines)
    if decision.advisory:
        text = "advisory: " + text
    return DecisionSummary(stage=stage or DecisionStage.OTHER, text=_cut(text))


def with_arbitration_cut(summary: str | None, *, granted_gpus: int, prefill: int | None, decode: int | None) -> str:
    """A decision's summary once the fleet's arbitration cut its targets (stage `fleet`): the cut first, since it
    decided, then what the tick had decided."""
    targets = ", ".join(
        f"{name} {value}" for name, value in (("prefill", prefill), ("decode", decode)) if value is not None
    )
    cut = f"fleet arbitration grants {granted_gpus} GPUs: {targets}"
    return _cut(f"{cut}; tick: {summary}" if summary else cut)
