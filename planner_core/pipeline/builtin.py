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
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner_core.config import (
    LoadNextRequest,
    LoadPolicy,
    OptimizationTarget,
    PlannerConfig,
    PlannerMode,
    ThroughputAlgorithm,
    managed_components,
)
from planner_core.domain import (
    Component,
    Loop,
    OverrideType,
    PartialPrediction,
    PerfModelRole,
    PlannerState,
    Prediction,
    ReasonCode,
    ReplicaOverride,
    SizedNeed,
    StepName,
    StepRecord,
    TickInputs,
)
from planner_core.pipeline.types import Phase, PipelineContext, PluginResult, PluginSpec
from planner_core.policy.bounds import bound_change_rate, bound_min_endpoint, guard_config_budget, min_endpoints
from planner_core.policy.fleet import combine_headlines
from planner_core.policy.horizon import horizon_headroom, pool_startup_s, record_window
from planner_core.policy.load import LoadRuntime, LoadSlaTargets, SlaLoadInputs, calculate_load_replicas
from planner_core.policy.thresholds import (
    Threshold2025Settings,
    ThresholdInputs,
    calculate_threshold_2025,
    calculate_threshold_replicas,
    threshold_rule,
)
from planner_core.policy.throughput import (
    CorrectionFactors,
    RequestShape,
    ThroughputPerfModel,
    ThroughputTargets,
    burst_prefill_replicas,
    calculate_replicas,
    correction_factors,
    engine_prompt_rate,
    replicas_for_engine_rps,
    sizing_shape,
    with_headroom,
)
from planner_core.predict import observe_window, predict_next

if TYPE_CHECKING:
    from planner_core.perf.forward import ForwardPassModel
    from planner_core.perf.online import OnlineForwardPassModel

PREDICT_ID = "builtin_load_predict"
THROUGHPUT_ID = "builtin_throughput_propose"
LOAD_ID = "builtin_load_propose"
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
    """PROPOSE: replicas per pool for the forecast (see `planner_core.policy.throughput`)."""

    perf: ThroughputPerfModel | None
    spec: PluginSpec = PluginSpec(plugin_id=THROUGHPUT_ID, phase=Phase.PROPOSE, priority=20, wall_clock_limits=False)

    def run(self, context: PipelineContext) -> PluginResult:
        config, inputs, state = context.config, context.inputs, context.state
        prediction = context.prediction
        if prediction is None:
            return PluginResult(steps=(_decide(ReasonCode.NO_TRAFFIC_DATA, "no forecast this tick: hold"),))
        traffic = inputs.traffic
        assert traffic is not None  # a forecast exists only when the window was observed
        # The observed window's own length: a late or short collection must not distort the request rate.
        window_s = traffic.duration_s if traffic.duration_s > 0 else config.throughput_adjustment_interval_seconds
        floors = min_endpoints(config)
        components = managed_components(config.mode)
        steps: list[StepRecord] = []
        shape, shape_step = sizing_shape(prediction, config.throughput_length_sizing)
        steps.append(shape_step)
        # each pool's need before rounding up, where the sizing knows it (for the scale-down margin)
        unrounded: dict[Component, float] = {}
        # each pool's need on the window just observed, for the horizon headroom (engine-capacity sizing only)
        observed: dict[Component, float] = {}
        if config.throughput_algorithm is ThroughputAlgorithm.ENGINE_CAPACITY:
            sized = self._size_on_engine_capacity(
                context, prediction.num_req / window_s, shape, steps, unrounded, observed, traffic.num_req / window_s
            )
        else:
            sized = self._size_on_interpolation(context, prediction, shape, window_s, steps)
        if sized is None:
            steps.append(_decide(ReasonCode.MODEL_NOT_READY, "hold"))
            return PluginResult(steps=tuple(steps))
        if config.throughput_prefill_burst_sizing:
            # the pool that computes the prompts: prefill, or the aggregated engines (scaled as the decode pool)
            prompt_pool = Component.DECODE if config.mode is PlannerMode.AGG else Component.PREFILL
            if prompt_pool in sized:
                sized[prompt_pool] = self._size_for_bursts(
                    context, prediction, shape, window_s, sized[prompt_pool], steps, unrounded, observed
                )  # fmt: skip
        if config.throughput_horizon_quantile > 0 and observed:
            # before the hold and the margin: the raised size is a need the hold keeps, and the headroom is added to
            # the need before rounding up (a headroom of 0.01 engine must not add a whole engine the hold ignores)
            sized, state = _horizon_headroom(context, state, sized, unrounded, observed, components, steps)
        if config.throughput_scale_down_hold_seconds > 0:
            sized, state = _hold_scale_down(
                sized, state, inputs, config.throughput_scale_down_hold_seconds, components, steps
            )
        if config.throughput_scale_down_margin > 0:
            sized = _scale_down_margin(sized, unrounded, inputs, config.throughput_scale_down_margin, steps)
        desired: dict[Component, int] = {}
        for component in components:
            value, step = bound_min_endpoint(component, sized[component], floors[component])
            steps.append(step)
            value, step = bound_change_rate(
                component, value, inputs.workers.expected(component), config.max_throughput_scaling_replicas
            )
            steps.append(step)
            value, step = bound_min_endpoint(component, value, floors[component])  # a cap may undercut the floor
            steps.append(step)
            desired[component] = value
        summary = ", ".join(f"{c.value} {inputs.workers.expected(c)} -> {desired[c]}" for c in components)

        if not config.load_scaling_active:
            overrides = tuple(
                ReplicaOverride(component=c, kind=OverrideType.SET, replicas=desired[c], reason="throughput sizing")
                for c in components
            )
            changed = any(desired[c] != inputs.workers.expected(c) for c in components)
            steps.append(_decide(ReasonCode.SCALE if changed else ReasonCode.NO_CHANGE, summary))
            return PluginResult(overrides=overrides, steps=tuple(steps), state=state)

        # Both loops on: the throughput loop only sets the floor the load loop may not go below, fitted into the
        # GPU budget here because no pipeline invariant sees a floor that is not proposed.
        current = {c: inputs.workers.expected(c) for c in components}
        bounded, budget_step = guard_config_budget(config, current, desired)
        steps.append(budget_step)
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
        steps.append(_decide(ReasonCode.SET_LOWER_BOUND, floors_detail))
        return PluginResult(steps=tuple(steps), state=next_state)

    def _size_for_bursts(
        self,
        context: PipelineContext,
        prediction: Prediction,
        shape: RequestShape,
        window_s: float,
        mean_rate_replicas: int,
        steps: list[StepRecord],
        unrounded: dict[Component, float],
        observed: dict[Component, float],
    ) -> int:
        """Ours: raise the pool that computes prompts (prefill, or the aggregated pool) so the observed prompt bursts
        drain within the TTFT target (`burst_prefill_replicas`), at the engine rate of `_burst_engine_rate`. The
        window's own burst need (the curve not shrunk to the forecast) goes into `observed`."""
        config, traffic = context.config, context.inputs.traffic
        assert traffic is not None
        component = Component.DECODE if config.mode is PlannerMode.AGG else Component.PREFILL
        engine_tokens_per_s, iteration_s = self._burst_engine_rate(context, shape, component)
        replicas, step, burst_need = burst_prefill_replicas(
            traffic,
            prediction.num_req * prediction.isl / window_s,
            mean_rate_replicas=mean_rate_replicas,
            ttft_ms=config.ttft_ms,
            engine_prompt_tokens_per_s=engine_tokens_per_s,
            iteration_s=iteration_s,
            component=component,
        )
        steps.append(step)
        if burst_need is not None:
            unrounded[component] = max(unrounded.get(component, 0.0), burst_need)
            _, _, observed_need = burst_prefill_replicas(
                traffic,
                traffic.num_req * traffic.isl / traffic.duration_s,  # growth 1: the curve as observed
                mean_rate_replicas=mean_rate_replicas,
                ttft_ms=config.ttft_ms,
                engine_prompt_tokens_per_s=engine_tokens_per_s,
                iteration_s=iteration_s,
                component=component,
            )
            if observed_need is not None:
                observed[component] = max(observed.get(component, 0.0), observed_need)
        return replicas

    def _burst_engine_rate(
        self, context: PipelineContext, shape: RequestShape, component: Component
    ) -> tuple[float, float]:
        """Prompt tokens/s one engine of `component`'s pool computes for the burst rule, KV hits discounted and
        derated by the prefill target utilisation, and the wall time (s) of one of its prompt iterations; (0, 0)
        without a forward-pass model.

        A prefill engine: a full chunk of the prefill model in force (online, else bootstrap). An aggregated engine:
        its prompt rate under the decode batch `agg_capacity` chose at the sizing shape
        (`agg_operating_prompt_rate`); the pool's own (decode) utilisation is already in the mean-rate size, and the
        rate is taken at the full operating batch."""
        from planner_core.perf.capacity import effective_kv_hit_rate

        config, state = context.config, context.state
        bootstrap = self.perf.forward_pass_model() if self.perf is not None else None
        model, _ = forward_model_for(state, config.mode, component, bootstrap)
        if model is None:
            return 0.0, 0.0
        tokens_per_s, iteration_s = engine_prompt_rate(
            config,
            model,
            self.perf.profiled_max_kv_tokens() if self.perf is not None else None,
            isl=shape.isl,
            osl=shape.osl,
            kv_hit_rate=state.last_kv_hit_rate,
            accept_length=state.last_accept_length,
        )
        hit, _ = effective_kv_hit_rate(state.last_kv_hit_rate, component)
        # the target utilisation derates the engine for bursts as for the mean rate
        return tokens_per_s / (1.0 - hit) * config.throughput_prefill_target_utilization, iteration_s

    def _size_on_interpolation(
        self,
        context: PipelineContext,
        prediction: Prediction,
        shape: RequestShape,
        window_s: float,
        steps: list[StepRecord],
    ) -> dict[Component, int] | None:
        """Dynamo 0.x: tokens/s/GPU interpolated from the profile (optionally with correction factors)."""
        config, inputs = context.config, context.inputs
        if self.perf is None or config.mode is PlannerMode.AGG:
            detail = (
                "no profile loaded"
                if self.perf is None
                else "aggregated capacity needs throughput_algorithm: engine_capacity"
            )
            steps.append(StepRecord(step=StepName.CAPACITY, reason=ReasonCode.MODEL_NOT_READY, detail=detail))
            return None
        targets = ThroughputTargets(
            ttft_ms=config.capacity_ttft_ms,
            itl_ms=config.capacity_itl_ms,
            window_s=window_s,
            prefill_gpus_per_engine=config.prefill_gpus_per_engine,
            decode_gpus_per_engine=config.decode_gpus_per_engine,
        )
        correction = CorrectionFactors()
        if config.throughput_algorithm is ThroughputAlgorithm.INTERPOLATION_CORRECTED:
            assert inputs.traffic is not None
            correction, correction_steps = correction_factors(
                inputs.traffic, inputs.workers.ready(Component.DECODE), self.perf
            )
            steps.extend(correction_steps)
        sized: dict[Component, int] = {}
        for component in managed_components(config.mode):
            sized[component], sizing_steps = calculate_replicas(
                component,
                prediction,
                targets,
                self.perf,
                shape=shape,
                correction=correction,
                target_utilization=_target_utilization(config, component),
            )
            steps.extend(sizing_steps)
        return sized

    def _size_on_engine_capacity(
        self,
        context: PipelineContext,
        demand_rps: float,
        shape: RequestShape,
        steps: list[StepRecord],
        unrounded: dict[Component, float],
        observed: dict[Component, float],
        observed_rps: float,
    ) -> dict[Component, int] | None:
        """Dynamo 1.x: requests/s per engine searched on a forward-pass model; every pool or none (a pool whose
        model cannot answer holds its partner too). Each pool's need at the observed rate `observed_rps` (engines,
        before rounding up) goes into `observed`."""
        from planner_core.perf.capacity import agg_capacity, decode_capacity, prefill_capacity

        config, state = context.config, context.state
        bootstrap = self.perf.forward_pass_model() if self.perf is not None else None
        profiled_kv = self.perf.profiled_max_kv_tokens() if self.perf is not None else None
        sized: dict[Component, int] = {}
        not_ready: list[Component] = []
        for component in managed_components(config.mode):
            model, model_step = forward_model_for(state, config.mode, component, bootstrap)
            steps.append(model_step)
            if model is None:
                not_ready.append(component)
                continue
            limits = config.engine_limits(component, profiled_max_kv_tokens=profiled_kv)
            if config.mode is PlannerMode.AGG:
                capacity = agg_capacity(
                    model,
                    limits,
                    isl=shape.isl,
                    osl=max(1.0, shape.osl),
                    ttft_ms=config.capacity_ttft_ms,
                    itl_ms=config.capacity_itl_ms,
                    kv_hit_rate=state.last_kv_hit_rate,
                    accept_length=state.last_accept_length,
                )
            elif component is Component.PREFILL:
                capacity = prefill_capacity(
                    model, limits, isl=shape.isl, ttft_ms=config.capacity_ttft_ms, kv_hit_rate=state.last_kv_hit_rate
                )
            else:
                capacity = decode_capacity(
                    model,
                    limits,
                    isl=shape.isl,
                    osl=max(1.0, shape.osl),
                    itl_ms=config.capacity_itl_ms,
                    accept_length=state.last_accept_length,
                )
            steps.extend(capacity.steps)
            if not capacity.usable:
                not_ready.append(component)
                continue
            pool_demand_rps, headroom_step = with_headroom(
                component, demand_rps, _target_utilization(config, component)
            )
            if headroom_step is not None:
                steps.append(headroom_step)
            sized[component], step = replicas_for_engine_rps(
                component, pool_demand_rps, capacity.requests_per_s, capacity.detail
            )
            steps.append(step)
            if capacity.requests_per_s > 0:
                unrounded[component] = pool_demand_rps / capacity.requests_per_s
                observed[component] = observed_rps / _target_utilization(config, component) / capacity.requests_per_s
        if not_ready:
            for component in managed_components(config.mode):
                if component not in not_ready:
                    steps.append(
                        StepRecord(
                            step=StepName.CAPACITY,
                            component=component,
                            reason=ReasonCode.PARTNER_NOT_READY,
                            detail="held with the pool whose model cannot answer",
                        )
                    )
            return None
        return sized


def _horizon_headroom(
    context: PipelineContext,
    state: PlannerState,
    sized: dict[Component, int],
    unrounded: dict[Component, float],
    observed: dict[Component, float],
    components: tuple[Component, ...],
    steps: list[StepRecord],
) -> tuple[dict[Component, int], PlannerState]:
    """Ours: each pool's need before rounding up raised by its learned headroom for its start-up horizon
    (`planner_core.policy.horizon`), then rounded: `max(size, ceil(need + headroom))`. It runs before the scale-down
    hold and margin, so the raised size is a need the hold keeps, and `unrounded` is raised in place so the margin
    measures the raised need. The need before the headroom (what the sizing alone planned: the residuals measure
    its shortfall) and the observed need are recorded in the state; a pool without an unrounded need plans its
    size. Each pool gets a `horizon` step with the headroom and the size it gives."""
    config = context.config
    planned = {component: unrounded.get(component, float(value)) for component, value in sized.items()}
    windows = record_window(state.horizon_windows, context.inputs.now_s, planned, observed)
    raised = dict(sized)
    for component in components:
        if component not in observed:
            continue
        startup_s, startup_step = pool_startup_s(state.startup, component, config.throughput_startup_seconds)
        steps.append(startup_step)
        headroom, headroom_step = horizon_headroom(
            windows,
            startup_s=startup_s,
            interval_s=float(config.throughput_adjustment_interval_seconds),
            quantile=config.throughput_horizon_quantile,
            component=component,
        )
        need = planned[component] + headroom
        raised[component] = max(sized[component], math.ceil(need - 1e-9))
        if component in unrounded:
            unrounded[component] = need
        steps.append(
            dataclasses.replace(
                headroom_step,
                detail=(
                    f"{headroom_step.detail}; need {planned[component]:.3f} + {headroom:.3f} = {need:.3f} engines: "
                    f"size max({sized[component]}, ceil({need:.3f})) = {raised[component]}"
                ),
            )
        )
    return raised, dataclasses.replace(state, horizon_windows=windows)


def _hold_scale_down(
    sized: dict[Component, int],
    state: PlannerState,
    inputs: TickInputs,
    hold_s: float,
    components: tuple[Component, ...],
    steps: list[StepRecord],
) -> tuple[dict[Component, int], PlannerState]:
    """Ours: each pool at the largest need sized over the last `hold_s` seconds (this tick's included); needs older
    than that are forgotten. Needs are recorded before this hold, so a held size never holds itself. With no need
    recorded yet (the planner's first sizing), the pools' current sizes count as a need of this tick too: the
    deployment was sized for its traffic, and the planner has seen only one window of it."""
    now_s = inputs.now_s
    need = SizedNeed(at_s=now_s, num_prefill=sized.get(Component.PREFILL, 0), num_decode=sized.get(Component.DECODE, 0))
    recent = tuple(n for n in state.recent_throughput_needs if now_s - n.at_s < hold_s and n.at_s <= now_s)
    if not state.recent_throughput_needs:
        current = SizedNeed(
            at_s=now_s,
            num_prefill=inputs.workers.expected_prefill if Component.PREFILL in components else 0,
            num_decode=inputs.workers.expected_decode if Component.DECODE in components else 0,
        )
        recent = (current,)
    recent = (*recent, need)
    held: dict[Component, int] = {}
    for component, value in sized.items():
        field_name = "num_prefill" if component is Component.PREFILL else "num_decode"
        largest = max(getattr(n, field_name) for n in recent)
        held[component] = max(value, largest)
        steps.append(
            StepRecord(
                step=StepName.SCALE_DOWN_HOLD,
                component=component,
                value=held[component],
                reason=ReasonCode.SCALE_DOWN_HELD if largest > value else ReasonCode.WITHIN_RANGE,
                detail=f"need {value}; largest need of the last {hold_s:g} s: {largest} ({len(recent)} ticks)",
            )
        )
    return held, dataclasses.replace(state, recent_throughput_needs=recent)


def _scale_down_margin(
    sized: dict[Component, int],
    unrounded: dict[Component, float],
    inputs: TickInputs,
    margin: float,
    steps: list[StepRecord],
) -> dict[Component, int]:
    """Ours: a pool below its current size shrinks only as far as its need before rounding up stays at most
    m x (1 - margin) of the new size m: `min(current, max(sized, ceil(need / (1 - margin))))`. Hysteresis: a need
    of 2.05 raises a pool to 3, and only a need under 1.8 (margin 0.1) brings it back to 2, so a steady load whose
    need wanders around an integer does not flap. Pools growing, or without an unrounded need, are left alone."""
    held = dict(sized)
    for component, value in sized.items():
        current = inputs.workers.expected(component)
        need = unrounded.get(component)
        if need is None or value >= current:
            continue
        floor = min(current, max(value, math.ceil(need / (1.0 - margin) - 1e-9)))
        held[component] = floor
        steps.append(
            StepRecord(
                step=StepName.SCALE_DOWN_HOLD,
                component=component,
                value=floor,
                reason=ReasonCode.SCALE_DOWN_HELD if floor > value else ReasonCode.WITHIN_RANGE,
                detail=(
                    f"scale-down margin {margin:g}: need {need:.3f} engines; "
                    f"min({current}, max({value}, ceil({need:.3f} / {1.0 - margin:g}))) = {floor}"
                ),
            )
        )
    return held


def _target_utilization(config: PlannerConfig, component: Component) -> float:
    """The pool's throughput-sizing target utilisation (the aggregated pool is sized as decode)."""
    if component is Component.PREFILL:
        return config.throughput_prefill_target_utilization
    return config.throughput_decode_target_utilization


def forward_model_for(
    state: PlannerState, mode: PlannerMode, component: Component, bootstrap: ForwardPassModel | None
) -> tuple[ForwardPassModel | None, StepRecord]:
    """The bootstrap chain for one pool, and a step saying which model answers: the online regression once its
    fit is ready, else the bootstrap model (perf table or profile), else none (recorded, so the audit trail shows
    when the engines' own metrics were not used yet)."""
    from planner_core.perf.online import OnlineForwardPassModel

    role = PerfModelRole.AGG if mode is PlannerMode.AGG else _ROLE_OF_POOL[component]
    online_state = getattr(state.perf_models, role.value)
    online = OnlineForwardPassModel(online_state)
    samples = f"{len(online_state.samples)} samples"
    if online.is_ready():
        detail = f"the online {role.value} regression answers ({samples})"
        return online, StepRecord(
            step=MODEL_STEP, component=component, reason=ReasonCode.PERF_MODEL_READY, detail=detail
        )
    why = f"the online {role.value} model is {online_state.readiness.value} ({samples})"
    if bootstrap is None:
        detail = f"{why} and there is no bootstrap model"
        return None, StepRecord(
            step=MODEL_STEP, component=component, reason=ReasonCode.INSUFFICIENT_DATA, detail=detail
        )
    return bootstrap, StepRecord(
        step=MODEL_STEP,
        component=component,
        reason=ReasonCode.PERF_MODEL_BOOTSTRAP,
        detail=f"{why}: {type(bootstrap).__name__} answers",
    )


_ROLE_OF_POOL = {Component.PREFILL: PerfModelRole.PREFILL, Component.DECODE: PerfModelRole.DECODE}
MODEL_STEP = StepName.FORWARD_PASS_MODEL


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
        from planner_core.perf.online import OnlineForwardPassModel, observe_fpm, readiness_step, serving_samples

        config, inputs = context.config, context.inputs
        components = managed_components(config.mode)
        # only engines at work feed the regressions: none starting or draining (the load decision still reads all)
        samples, excluded_steps = serving_samples(inputs.fpm, inputs.workers, components)
        state = dataclasses.replace(context.state, perf_models=observe_fpm(context.state.perf_models, samples, config))
        aggregated = config.mode is PlannerMode.AGG
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
                    role = PerfModelRole.AGG if aggregated else _ROLE_OF_POOL[component]
                    online_state = getattr(state.perf_models, role.value)
                    online = OnlineForwardPassModel(online_state)
                    steps.append(readiness_step(online_state, component))
                    chosen, model_step = forward_model_for(state, config.mode, component, self.bootstrap)
                    steps.append(model_step)
                    model = online if chosen is None else chosen  # not ready: the policy says insufficient_data
                    runtime, runtime_step = load_runtime(
                        state, online, source=config.load_next_request, component=component
                    )
                    steps.append(runtime_step)
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
                            throughput_lower_bound=lower_bounds[component],
                            min_endpoint=floors[component],
                            managed=components,
                            unplaced=inputs.unplaced_for(component),
                            frontend=inputs.traffic,
                            tail_latency_scaling=config.load_tail_latency_scaling,
                        ),
                        model,
                    )
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


def builtin_plugins(
    loop: Loop, perf: ThroughputPerfModel | None
) -> tuple[LoadPredictPlugin | ThroughputProposePlugin | LoadProposePlugin, ...]:
    """The builtin plugins of one loop's tick."""
    if loop is Loop.THROUGHPUT:
        return (LoadPredictPlugin(), ThroughputProposePlugin(perf))
    bootstrap = perf.forward_pass_model() if perf is not None else None
    return (LoadProposePlugin(bootstrap),)


def headline_of(steps: tuple[StepRecord, ...]) -> ReasonCode | None:
    """The loop's headline as its builtin plugin decided it: the reason of the last `decide` step."""
    for step in reversed(steps):
        if step.step == DECIDE_STEP:
            return step.reason
    return None
