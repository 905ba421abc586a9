"""The planner's decision core: `tick(inputs, state, config, perf, plugins=()) -> TickOutcome`.

Pure and deterministic: no clock (time arrives as `inputs.now_s`), no I/O, no hidden state. The same inputs,
state, config, perf model and plugins always give the same decision, next state and explanation, which is what
makes replaying a recorded tick exact. The Prefect flows collect the inputs, call this, and record the outcome.

A tick runs the plugin pipeline (`planner_core.pipeline`): the loop's builtin plugins
(`planner_core.pipeline.builtin`) and the user's plugins go through the same phases, merge and final invariants
(minimum endpoints, GPU budget guard). Before them, the tick derives what the policy reads of the window's recorded
arrivals (the prompt-arrival curve, counted at this policy's engine rate: `policy.throughput.with_prompt_curve`),
so what a source records holds no policy and a replay under another config derives it again. The tick's headline
reason is the builtin plugin's own (Dynamo's per-loop decision reasons, e.g. `set_lower_bound`, `no_traffic_data`,
`scale_down_refused_consolidation`), except that a tick whose targets are executed (or recorded in advisory mode)
is `scale` and a vetoed or timed-out one says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from planner_core.config import PlannerConfig, managed_components
from planner_core.domain import (
    Component,
    ExecuteAction,
    Loop,
    PlannerState,
    ReasonCode,
    ScalingDecision,
    StepName,
    StepRecord,
    TickInputs,
    TickOutcome,
)
from planner_core.perf.protocol import ThroughputPerfModel
from planner_core.pipeline.builtin import ScaleToZeroPlugin, builtin_plugins, headline_of
from planner_core.pipeline.loader import configured
from planner_core.pipeline.run import run_pipeline
from planner_core.pipeline.types import Plugin
from planner_core.policy.horizon import track_startups
from planner_core.policy.signals import observe_signals
from planner_core.policy.throughput import with_prompt_curve

__all__ = ["tick"]


def tick(
    inputs: TickInputs,
    state: PlannerState,
    config: PlannerConfig,
    perf: ThroughputPerfModel | None,
    plugins: Sequence[Plugin] = (),
    *,
    clock: Callable[[], float] | None = None,
) -> TickOutcome:
    """Run one tick of the loop named in `inputs.loop`.

    Args:
        inputs: what the tick observed, with its scheduled time.
        state: the planner state after the previous tick of this deployment (either loop).
        config: the immutable planner config.
        perf: engine perf model for the SLA policies; None when no profile is available.
        plugins: the user's plugins (already resolved against the config), run beside the builtin ones.
        clock: monotonic seconds, only to enforce plugin and tick deadlines; None (replay) enforces none.

    Returns:
        The decision (targets to apply, possibly none), the next state and the ordered explanation steps.
    """
    if inputs.loop is Loop.THROUGHPUT:
        state = dataclasses.replace(state, num_throughput_ticks=state.num_throughput_ticks + 1)
        active = config.throughput_scaling_active
    else:
        state = dataclasses.replace(state, num_load_ticks=state.num_load_ticks + 1)
        active = config.load_scaling_active
    scale_to_zero = config.scale_to_zero_idle_seconds is not None
    # With the load loop off, a load tick still bounds the zero-minimum pools: it is how a request held at the edge
    # wakes a pool at zero without waiting for the next throughput tick (`planner_core.policy.scale_to_zero`).
    wake_only = not active and scale_to_zero and inputs.loop is Loop.LOAD
    if not active and not wake_only:
        step = StepRecord(step=StepName(inputs.loop.value), reason=ReasonCode.DISABLED)
        return TickOutcome(decision=ScalingDecision(), next_state=state, steps=(step,), reason=ReasonCode.DISABLED)

    if inputs.traffic is not None and inputs.traffic.invalid_field() is None:
        # what the policy reads of the recorded arrivals is derived here, so a replay under another config re-derives
        # it (an unusable observation is not: the forecast holds on it with `no_traffic_data`)
        inputs = dataclasses.replace(inputs, traffic=with_prompt_curve(config, perf, inputs.traffic))
    # The config's `plugins.overrides` apply to builtin plugins as to user ones (validated at load time).
    of_loop = builtin_plugins(inputs.loop, perf, scale_to_zero=scale_to_zero)
    if wake_only:
        of_loop = tuple(plugin for plugin in of_loop if isinstance(plugin, ScaleToZeroPlugin))
    builtins = tuple(configured(plugin, config) for plugin in of_loop)
    # the signals this loop's builtin plugins read: a missing one keeps every pool from shrinking (policy.signals)
    health = observe_signals(config, inputs, state.signals)
    outcome = run_pipeline((*builtins, *plugins), inputs, state, config, clock=clock, health=health)
    builtin_headline = headline_of(outcome.steps)
    if outcome.action in (ExecuteAction.APPLY, ExecuteAction.ADVISORY):
        headline = ReasonCode.SCALE
    elif outcome.action in (ExecuteAction.SKIP_SHORT_CIRCUIT, ExecuteAction.SKIP_TICK_TIMEOUT):
        headline = outcome.reason
    elif builtin_headline in (None, ReasonCode.SCALE, ReasonCode.SCALE_UP, ReasonCode.SCALE_DOWN):
        headline = ReasonCode.NO_CHANGE  # the builtin wanted a change the final invariants took back
    else:
        headline = builtin_headline
    prediction_reason = next((s.reason for s in outcome.steps if s.step == StepName.PREDICT), None)
    result = outcome.to_tick_outcome(reason=headline, prediction_reason=prediction_reason)
    if config.throughput_horizon_quantile > 0:
        # the measured start-up times the horizon reads: either loop's scale-ups count (policy.horizon)
        decision = result.decision
        targets = {}
        if not decision.advisory:
            targets = {
                component: value
                for component, value in (
                    (Component.PREFILL, decision.num_prefill),
                    (Component.DECODE, decision.num_decode),
                )
                if value is not None
            }
        startup = track_startups(
            result.next_state.startup,
            inputs.now_s,
            inputs.workers,
            targets,
            managed_components(config.mode),
            applied=inputs.applied,
        )
        result = dataclasses.replace(result, next_state=dataclasses.replace(result.next_state, startup=startup))
    return result
