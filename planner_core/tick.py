"""The planner's decision core: `tick(inputs, state, config, perf) -> TickOutcome`.

Pure and deterministic: no clock (time arrives as `inputs.now_s`), no I/O, no hidden state. The same inputs,
state, config and perf model always give the same decision, next state and explanation, which is what makes
replaying a recorded tick exact. The Prefect flows collect the inputs, call this, and record the outcome.
"""

from __future__ import annotations

import dataclasses

from planner_core.config import PlannerConfig, PlannerMode, ThroughputAlgorithm
from planner_core.domain import (
    Component,
    Loop,
    PlannerState,
    ReasonCode,
    ReplicaProposal,
    ScalingDecision,
    StepRecord,
    TickInputs,
    TickOutcome,
)
from planner_core.policy.bounds import bound_change_rate, bound_min_endpoint, guard_gpu_budget
from planner_core.policy.throughput import (
    CorrectionFactors,
    ThroughputPerfModel,
    ThroughputTargets,
    calculate_replicas,
    correction_factors,
    sizing_shape,
)
from planner_core.predict import observe_window, predict_next


def managed_components(mode: PlannerMode) -> tuple[Component, ...]:
    """Pools the planner scales in a mode (aggregated mode's single pool is represented as DECODE)."""
    if mode is PlannerMode.PREFILL:
        return (Component.PREFILL,)
    if mode in (PlannerMode.DECODE, PlannerMode.AGG):
        return (Component.DECODE,)
    return (Component.PREFILL, Component.DECODE)


def tick(
    inputs: TickInputs, state: PlannerState, config: PlannerConfig, perf: ThroughputPerfModel | None
) -> TickOutcome:
    """Run one tick of the loop named in `inputs.loop`.

    Args:
        inputs: what the tick observed, with its scheduled time.
        state: the planner state after the previous tick of this deployment (either loop).
        config: the immutable planner config.
        perf: engine perf model for throughput sizing; None when no profile is available.

    Returns:
        The decision (targets to apply, possibly none), the next state and the ordered explanation steps.
    """
    if inputs.loop is Loop.THROUGHPUT:
        return _throughput_tick(inputs, state, config, perf)
    return _load_tick(inputs, state, config)


def _hold(state: PlannerState, reason: ReasonCode, steps: list[StepRecord]) -> TickOutcome:
    return TickOutcome(decision=ScalingDecision(), next_state=state, steps=tuple(steps), reason=reason)


def _load_tick(inputs: TickInputs, state: PlannerState, config: PlannerConfig) -> TickOutcome:
    state = dataclasses.replace(state, num_load_ticks=state.num_load_ticks + 1)
    if not config.load_scaling_active:
        return _hold(state, ReasonCode.DISABLED, [StepRecord(step="load", reason=ReasonCode.DISABLED)])
    if inputs.workers.scaling_in_progress:
        step = StepRecord(step="load", reason=ReasonCode.SCALING_IN_PROGRESS, detail="expected != ready")
        return _hold(state, ReasonCode.SCALING_IN_PROGRESS, [step])
    # Forward-pass metrics are not part of the tick inputs yet: the load proposer has nothing to act on.
    step = StepRecord(step="load", reason=ReasonCode.NO_FPM_DATA, detail="no forward-pass metrics observed")
    return _hold(state, ReasonCode.NO_FPM_DATA, [step])


def _throughput_tick(
    inputs: TickInputs, state: PlannerState, config: PlannerConfig, perf: ThroughputPerfModel | None
) -> TickOutcome:
    state = dataclasses.replace(state, num_throughput_ticks=state.num_throughput_ticks + 1)
    if not config.throughput_scaling_active:
        return _hold(state, ReasonCode.DISABLED, [StepRecord(step="throughput", reason=ReasonCode.DISABLED)])
    traffic = inputs.traffic
    if traffic is None:
        step = StepRecord(step="observe", reason=ReasonCode.NO_TRAFFIC_DATA, detail="no traffic observation")
        return _hold(state, ReasonCode.NO_TRAFFIC_DATA, [step])
    bad_field = traffic.invalid_field()
    if bad_field is not None:
        # Never scale (and never feed the predictor) on unusable data: hold and say why.
        step = StepRecord(
            step="observe",
            reason=ReasonCode.NO_TRAFFIC_DATA,
            detail=f"traffic.{bad_field} = {getattr(traffic, bad_field)!r} rejected (NaN, infinite or negative)",
        )
        return _hold(state, ReasonCode.NO_TRAFFIC_DATA, [step])

    history, observe_step = observe_window(state.load_history, traffic, config)
    state = dataclasses.replace(state, load_history=history)
    prediction, predict_step = predict_next(history, config)
    steps = [observe_step, predict_step]
    if perf is None or config.mode is PlannerMode.AGG:
        detail = "no profile loaded" if perf is None else "aggregated capacity needs the online perf model"
        steps.append(StepRecord(step="capacity", reason=ReasonCode.MODEL_NOT_READY, detail=detail))
        outcome = _hold(state, ReasonCode.MODEL_NOT_READY, steps)
        return dataclasses.replace(outcome, prediction=prediction, prediction_reason=predict_step.reason)

    targets = ThroughputTargets(
        ttft_ms=config.ttft_ms,
        itl_ms=config.itl_ms,
        # The observed window's own length: a late or short collection must not distort the request rate.
        window_s=traffic.duration_s if traffic.duration_s > 0 else config.throughput_adjustment_interval_seconds,
        prefill_gpus_per_engine=config.prefill_gpus_per_engine,
        decode_gpus_per_engine=config.decode_gpus_per_engine,
    )
    floors = {
        Component.PREFILL: config.prefill_min_endpoint_effective,
        Component.DECODE: config.decode_min_endpoint_effective,
    }
    components = managed_components(config.mode)
    shape, shape_step = sizing_shape(prediction, config.throughput_length_sizing)
    steps.append(shape_step)
    correction = CorrectionFactors()
    if config.throughput_algorithm is ThroughputAlgorithm.INTERPOLATION_CORRECTED:
        correction, correction_steps = correction_factors(traffic, inputs.workers.ready(Component.DECODE), perf)
        steps.extend(correction_steps)
    desired: dict[Component, int] = {}
    for component in components:
        value, sizing_steps = calculate_replicas(
            component, prediction, targets, perf, shape=shape, correction=correction
        )
        steps.extend(sizing_steps)
        value, step = bound_min_endpoint(component, value, floors[component])
        steps.append(step)
        value, step = bound_change_rate(
            component, value, inputs.workers.expected(component), config.max_throughput_scaling_replicas
        )
        steps.append(step)
        value, step = bound_min_endpoint(component, value, floors[component])  # a cap may undercut the floor
        steps.append(step)
        desired[component] = value

    current = {c: inputs.workers.expected(c) if c in components else 0 for c in Component}
    (num_prefill, num_decode), budget_step = guard_gpu_budget(
        (current[Component.PREFILL], current[Component.DECODE]),
        (desired.get(Component.PREFILL, 0), desired.get(Component.DECODE, 0)),
        prefill_gpus=config.prefill_gpus_per_engine,
        decode_gpus=config.decode_gpus_per_engine,
        min_gpu_budget=config.min_gpu_budget,
        max_gpu_budget=config.max_gpu_budget,
        prefill_floor=floors[Component.PREFILL] if Component.PREFILL in components else 0,
        decode_floor=floors[Component.DECODE] if Component.DECODE in components else 0,
    )
    steps.append(budget_step)
    desired = {c: {Component.PREFILL: num_prefill, Component.DECODE: num_decode}[c] for c in components}

    if config.load_scaling_active:
        # Both loops on: the throughput loop only sets the floor the load loop may not go below.
        state = dataclasses.replace(
            state,
            throughput_lower_bound_prefill=desired.get(Component.PREFILL, state.throughput_lower_bound_prefill),
            throughput_lower_bound_decode=desired.get(Component.DECODE, state.throughput_lower_bound_decode),
        )
        headline = ReasonCode.SET_LOWER_BOUND
    else:
        headline = ReasonCode.NO_CHANGE
    proposals = []
    for component in components:
        current = inputs.workers.expected(component)
        changed = desired[component] != current and headline is not ReasonCode.SET_LOWER_BOUND
        reason = ReasonCode.SCALE if changed else headline
        proposals.append(
            ReplicaProposal(component=component, current=current, desired=desired[component], reason=reason)
        )
        if changed:
            headline = ReasonCode.SCALE
    decision = ScalingDecision()
    if headline is ReasonCode.SCALE:
        decision = ScalingDecision(
            num_prefill=desired.get(Component.PREFILL),
            num_decode=desired.get(Component.DECODE),
            advisory=config.advisory,
        )
        if config.advisory:
            steps.append(StepRecord(step="execute", reason=ReasonCode.ADVISORY, detail="advisory mode"))
    steps.append(
        StepRecord(
            step="decide",
            reason=headline,
            detail=", ".join(f"{p.component.value} {p.current} -> {p.desired}" for p in proposals),
        )
    )
    return TickOutcome(
        decision=decision,
        next_state=state,
        steps=tuple(steps),
        proposals=tuple(proposals),
        prediction=prediction,
        prediction_reason=predict_step.reason,
        reason=headline,
    )
