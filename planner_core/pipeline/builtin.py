"""The planner's own logic as pipeline plugins: forecasting, throughput sizing and the load loop.

`tick()` runs these through the same pipeline as user plugins (`builtin_plugins(loop, perf)`):
- throughput tick: `builtin_load_predict` (PREDICT, priority 0) observes the window and forecasts the next one;
  `builtin_throughput_propose` (PROPOSE, priority 20) sizes each pool on the forecast (optionally with our target
  utilisation, burst-aware prefill or aggregated sizing and scale-down hold, each off by default), applies the min
  endpoints and the change cap, and either proposes SET targets or, when the load loop is on too, only stores them
  as the load loop's floor;
- load tick: `builtin_load_propose` (PROPOSE, priority 10) feeds the engines' forward-pass metrics to the online
  perf models and proposes +/-1 per pool with the configured load policy (SLA per engine, threshold targets, or
  the 2025 threshold planner).
Each ends its contribution with one `decide` step whose reason is the loop's headline (Dynamo's per-loop decision
reasons). The pipeline then applies the final invariants (minimum endpoints, GPU budget guard) to every proposal.

Pure, like the rest of the decision core: plugins read only the pipeline context and return new state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner_core.config import (
    LoadNextRequest,
    LoadPolicy,
    OptimizationTarget,
    PlannerConfig,
    PlannerMode,
    managed_components,
)
from planner_core.domain import (
    Component,
    Loop,
    OverrideType,
    PartialPrediction,
    PerfModelRole,
    PlannerState,
    ReasonCode,
    ReplicaOverride,
    StepName,
    StepRecord,
    TickInputs,
)
from planner_core.pipeline.types import Phase, PipelineContext, PluginResult, PluginSpec
from planner_core.policy.bounds import guard_config_budget, min_endpoints
from planner_core.policy.fleet import combine_headlines
from planner_core.policy.load import LoadRuntime, LoadSlaTargets, SlaLoadInputs, calculate_load_replicas
from planner_core.policy.scale_to_zero import scale_to_zero_bounds
from planner_core.policy.sizing import ROLE_OF_POOL, SizingRequest, forward_model_for, size_pools
from planner_core.policy.thresholds import (
    Threshold2025Settings,
    ThresholdInputs,
    calculate_threshold_2025,
    calculate_threshold_replicas,
    threshold_rule,
)
from planner_core.policy.throughput import ThroughputPerfModel
from planner_core.predict import observe_window, predict_next

if TYPE_CHECKING:
    from planner_core.perf.forward import ForwardPassModel
    from planner_core.perf.online import OnlineForwardPassModel

__all__ = [
    "LoadPredictPlugin",
    "LoadProposePlugin",
    "ScaleToZeroPlugin",
    "ThroughputProposePlugin",
    "builtin_plugins",
    "forward_model_for",  # re-exported: the load loop's bootstrap chain lives with the sizing's
    "headline_of",
    "load_runtime",
]

PREDICT_ID = "builtin_load_predict"
THROUGHPUT_ID = "builtin_throughput_propose"
LOAD_ID = "builtin_load_propose"
SCALE_TO_ZERO_ID = "builtin_scale_to_zero"
DECIDE_STEP = StepName.DECIDE


def _decide(reason: ReasonCode, detail: str) -> StepRecord:
    return StepRecord(step=DECIDE_STEP, reason=reason, detail=detail)


# --- throughput loop -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadPredictPlugin:
    """PREDICT: validate the window's traffic, feed the predictor, forecast the next window."""

    spec: PluginSpec = PluginSpec(plugin_id=PREDICT_ID, phase=Phase.PREDICT, priority=0, wall_clock_limits=False)

    def run(self, context: PipelineContext) -> PluginResult:
        traffic = context.inputs.traffic
        if traffic is None:
            step = StepRecord(step=StepName.OBSERVE, reason=ReasonCode.NO_TRAFFIC_DATA, detail="no traffic observation")
            return PluginResult(steps=(step,))
        bad_field = traffic.invalid_field()
        if bad_field is not None:
            # Never scale (and never feed the predictor) on unusable data: hold and say why.
            step = StepRecord(
                step=StepName.OBSERVE,
                reason=ReasonCode.NO_TRAFFIC_DATA,
                detail=f"traffic.{bad_field} = {getattr(traffic, bad_field)!r} rejected (NaN, infinite or negative)",
            )
            return PluginResult(steps=(step,))
        history, observe_step = observe_window(context.state.load_history, traffic, context.config)
        prediction, predict_step = predict_next(history, context.config)
        state = context.state
        return PluginResult(
            predictions=PartialPrediction.of(prediction),
            steps=(observe_step, predict_step),
            # KV hit rate and accept length have last-value semantics: a window without them keeps the last known.
            state=dataclasses.replace(
                state,
                load_history=history,
                last_kv_hit_rate=state.last_kv_hit_rate if traffic.kv_hit_rate is None else traffic.kv_hit_rate,
                last_accept_length=(
                    state.last_accept_length if traffic.accept_length is None else traffic.accept_length
                ),
            ),
        )


@dataclass(frozen=True, slots=True)
class ThroughputProposePlugin:
    """PROPOSE: replicas per pool for the forecast, sized by `planner_core.policy.sizing.size_pools`."""

    perf: ThroughputPerfModel | None
    spec: PluginSpec = PluginSpec(plugin_id=THROUGHPUT_ID, phase=Phase.PROPOSE, priority=20, wall_clock_limits=False)

    def run(self, context: PipelineContext) -> PluginResult:
        config, inputs = context.config, context.inputs
        prediction = context.prediction
        if prediction is None:
            return PluginResult(steps=(_decide(ReasonCode.NO_TRAFFIC_DATA, "no forecast this tick: hold"),))
        request = SizingRequest(
            config=config, perf=self.perf, inputs=inputs, state=context.state, prediction=prediction
        )
        outcome = size_pools(request)
        desired, state = outcome.desired, outcome.state
        if desired is None:
            return PluginResult(steps=(*outcome.steps, _decide(ReasonCode.MODEL_NOT_READY, "hold")))
        components = request.components
        if not config.load_scaling_active:
            summary = ", ".join(f"{c.value} {inputs.workers.expected(c)} -> {desired[c]}" for c in components)
            overrides = tuple(
                ReplicaOverride(component=c, kind=OverrideType.SET, replicas=desired[c], reason="throughput sizing")
                for c in components
            )
            changed = any(desired[c] != inputs.workers.expected(c) for c in components)
            decide = _decide(ReasonCode.SCALE if changed else ReasonCode.NO_CHANGE, summary)
            return PluginResult(overrides=overrides, steps=(*outcome.steps, decide), state=state)
        return _lower_bounds(config, inputs, state, desired, outcome.steps)


def _lower_bounds(
    config: PlannerConfig,
    inputs: TickInputs,
    state: PlannerState,
    desired: Mapping[Component, int],
    steps: tuple[StepRecord, ...],
) -> PluginResult:
    """Both loops on: the throughput loop only sets the floor the load loop may not go below, fitted into the GPU
    budget here because no pipeline invariant sees a floor that is not proposed."""
    components = managed_components(config.mode)
    current = {c: inputs.workers.expected(c) for c in components}
    bounded, budget_step = guard_config_budget(config, current, desired)
    next_state = dataclasses.replace(
        state,
        throughput_lower_bound_prefill=(
            bounded[Component.PREFILL] if Component.PREFILL in components else state.throughput_lower_bound_prefill
        ),
        throughput_lower_bound_decode=(
            bounded[Component.DECODE] if Component.DECODE in components else state.throughput_lower_bound_decode
        ),
    )
    floors_detail = ", ".join(f"{c.value} floor {bounded[c]}" for c in components)
    decide = _decide(ReasonCode.SET_LOWER_BOUND, floors_detail)
    return PluginResult(steps=(*steps, budget_step, decide), state=next_state)


NEXT_REQUEST_STEP = StepName.NEXT_REQUEST


def load_runtime(
    state: PlannerState, online: OnlineForwardPassModel, *, source: LoadNextRequest, component: Component
) -> tuple[LoadRuntime, StepRecord]:
    """What the SLA load proposer assumes of the next request, and a `next_request` step saying where it came from.

    `LoadNextRequest.ENGINE_AVERAGE` (Dynamo's): the moving averages of `online`, the pool's role model: prompt
    tokens per prefill request of recent iterations (a chunk counts as its chunk, an idle iteration as 0) and
    KV tokens per decode request. `TRAFFIC_WINDOW` (ours): the last traffic window's mean ISL and OSL when the
    throughput loop observed one, else the engine averages. Without either, no next request is added
    (`next_request_unknown`); the decode estimate would then leave out the request it is sizing for.

    The step's value is what the pool's estimate adds: prompt tokens for prefill (and aggregated) pools, KV
    tokens of the next decode request for decode pools.
    """
    history = state.load_history
    if source is LoadNextRequest.TRAFFIC_WINDOW and history.isl:
        runtime = LoadRuntime(
            kv_hit_rate=state.last_kv_hit_rate,
            accept_length=state.last_accept_length,
            avg_isl=history.isl[-1],
            avg_osl=history.osl[-1] if history.osl else 0.0,
        )
        reason = ReasonCode.NEXT_REQUEST_TRAFFIC_WINDOW
        detail = f"last traffic window: mean ISL {runtime.avg_isl:.0f}, OSL {runtime.avg_osl:.0f}"
    else:
        context = online.avg_decode_context
        runtime = LoadRuntime(
            kv_hit_rate=state.last_kv_hit_rate,
            accept_length=state.last_accept_length,
            avg_isl=online.avg_isl,
            next_decode_context=context if context > 0 else None,
        )
        known = runtime.avg_isl > 0 or runtime.next_decode_context is not None
        reason = ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE if known else ReasonCode.NEXT_REQUEST_UNKNOWN
        detail = (
            f"engine averages ({online.role.value}, last {len(online.state.recent_isl)} prefill iterations): "
            f"{runtime.avg_isl:.0f} prompt tokens per prefill request, {context:.0f} KV tokens per decode request"
        )
        if source is LoadNextRequest.TRAFFIC_WINDOW:
            detail = "no traffic window observed yet; " + detail
    if component is Component.DECODE and online.role is not PerfModelRole.AGG:
        value = (
            runtime.next_decode_context
            if runtime.next_decode_context is not None
            else max(runtime.avg_isl, 0.0) + max(runtime.avg_osl, 0.0) / 2.0
        )
    else:
        value = runtime.avg_isl
    return runtime, StepRecord(step=NEXT_REQUEST_STEP, reason=reason, component=component, value=value, detail=detail)


# --- load loop -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadProposePlugin:
    """PROPOSE: +/-1 per pool from the engines' latest forward-pass metrics."""

    bootstrap: ForwardPassModel | None  # before the online models are ready (profile or precomputed table)
    spec: PluginSpec = PluginSpec(plugin_id=LOAD_ID, phase=Phase.PROPOSE, priority=10, wall_clock_limits=False)

    def run(self, context: PipelineContext) -> PluginResult:
        from planner_core.perf.online import observe_fpm, serving_samples

        config, inputs = context.config, context.inputs
        components = managed_components(config.mode)
        # only engines at work feed the regressions: none starting or draining (the load decision still reads all)
        samples, excluded_steps = serving_samples(inputs.fpm, inputs.workers, components)
        state = dataclasses.replace(context.state, perf_models=observe_fpm(context.state.perf_models, samples, config))
        lower_bounds = {
            Component.PREFILL: state.throughput_lower_bound_prefill if config.throughput_scaling_active else None,
            Component.DECODE: state.throughput_lower_bound_decode if config.throughput_scaling_active else None,
        }
        floors = min_endpoints(config)
        steps: list[StepRecord] = list(excluded_steps)
        desired: dict[Component, int | None] = {}
        headlines: list[ReasonCode] = []

        if config.load_policy is LoadPolicy.THRESHOLD_2025:
            outcome = calculate_threshold_2025(
                now_s=inputs.now_s,
                fpm=inputs.fpm,
                workers=inputs.workers,
                state=state.threshold_planner,
                settings=Threshold2025Settings.from_config(config, components),
                lower_bound_prefill=lower_bounds[Component.PREFILL],
                lower_bound_decode=lower_bounds[Component.DECODE],
            )
            state = dataclasses.replace(state, threshold_planner=outcome.next_state)
            steps.extend(outcome.steps)
            desired = {Component.PREFILL: outcome.num_prefill, Component.DECODE: outcome.num_decode}
            headlines.append(outcome.reason)
        else:
            for component in components:
                if config.optimization_target is OptimizationTarget.SLA:
                    value, pool_steps = self._sla_pool(config, inputs, state, component, lower_bounds[component])
                else:
                    value, pool_steps = calculate_threshold_replicas(
                        ThresholdInputs(
                            component=component,
                            fpm=inputs.fpm,
                            workers=inputs.workers,
                            limits=config.engine_limits(component),
                            rule=threshold_rule(config, component),
                            throughput_lower_bound=lower_bounds[component],
                            min_endpoint=floors[component],
                            managed=components,
                        )
                    )
                steps.extend(pool_steps)
                desired[component] = value
                headlines.append(pool_steps[-1].reason)

        overrides = tuple(
            ReplicaOverride(component=c, kind=OverrideType.SET, replicas=desired[c], reason="load loop")
            for c in components
            if desired.get(c) is not None
        )
        headline = combine_headlines(tuple(headlines))
        summary = ", ".join(
            f"{c.value} {inputs.workers.expected(c)} -> {desired[c]}" for c in components if desired.get(c) is not None
        )
        steps.append(_decide(headline, summary or "no opinion this tick"))
        return PluginResult(overrides=overrides, steps=tuple(steps), state=state)

    def _sla_pool(
        self,
        config: PlannerConfig,
        inputs: TickInputs,
        state: PlannerState,
        component: Component,
        lower_bound: int | None,
    ) -> tuple[int | None, tuple[StepRecord, ...]]:
        """One pool's SLA load proposal: the online model's readiness, the model that answers, the next request
        assumed, then the policy's own steps (`calculate_load_replicas`, whose last step is the pool's headline)."""
        from planner_core.perf.online import OnlineForwardPassModel, readiness_step

        aggregated = config.mode is PlannerMode.AGG
        role = PerfModelRole.AGG if aggregated else ROLE_OF_POOL[component]
        online_state = getattr(state.perf_models, role.value)
        online = OnlineForwardPassModel(online_state)
        chosen, model_step = forward_model_for(state, config.mode, component, self.bootstrap)
        model = online if chosen is None else chosen  # not ready: the policy says insufficient_data
        runtime, runtime_step = load_runtime(state, online, source=config.load_next_request, component=component)
        value, pool_steps = calculate_load_replicas(
            SlaLoadInputs(
                component=component,
                aggregated=aggregated,
                fpm=inputs.fpm,
                workers=inputs.workers,
                limits=config.engine_limits(component),
                targets=LoadSlaTargets(
                    ttft_ms=config.ttft_ms,
                    itl_ms=config.itl_ms,
                    down_sensitivity=config.load_scaling_down_sensitivity / 100.0,
                ),
                runtime=runtime,
                throughput_lower_bound=lower_bound,
                min_endpoint=min_endpoints(config)[component],
                managed=managed_components(config.mode),
                unplaced=inputs.unplaced_for(component),
                frontend=inputs.traffic,
                tail_latency_scaling=config.load_tail_latency_scaling,
            ),
            model,
        )
        return value, (readiness_step(online_state, component), model_step, runtime_step, *pool_steps)


# --- scale to zero ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleToZeroPlugin:
    """CONSTRAIN (both loops, with `scale_to_zero_idle_seconds`): each zero-minimum pool kept at one replica or more
    through the idle hold and woken by demand, or held at zero (`planner_core.policy.scale_to_zero`)."""

    spec: PluginSpec = PluginSpec(
        plugin_id=SCALE_TO_ZERO_ID, phase=Phase.CONSTRAIN, priority=0, wall_clock_limits=False
    )

    def run(self, context: PipelineContext) -> PluginResult:
        bounds = scale_to_zero_bounds(context.config, context.inputs, context.state)
        return PluginResult(overrides=bounds.overrides, steps=bounds.steps, state=bounds.state)


def builtin_plugins(
    loop: Loop, perf: ThroughputPerfModel | None, *, scale_to_zero: bool = False
) -> tuple[LoadPredictPlugin | ThroughputProposePlugin | LoadProposePlugin | ScaleToZeroPlugin, ...]:
    """The builtin plugins of one loop's tick; with `scale_to_zero`, the zero-minimum pools' bounds too."""
    zero = (ScaleToZeroPlugin(),) if scale_to_zero else ()
    if loop is Loop.THROUGHPUT:
        return (LoadPredictPlugin(), ThroughputProposePlugin(perf), *zero)
    bootstrap = perf.forward_pass_model() if perf is not None else None
    return (LoadProposePlugin(bootstrap), *zero)


def headline_of(steps: tuple[StepRecord, ...]) -> ReasonCode | None:
    """The loop's headline as its builtin plugin decided it: the reason of the last `decide` step."""
    for step in reversed(steps):
        if step.step == DECIDE_STEP:
            return step.reason
    return None
