"""Throughput sizing as one pure function: each pool's replicas for the forecast, stage by stage.

`size_pools(request)` is what the throughput loop's PROPOSE plugin (`planner_core.pipeline.builtin`) asks. It runs
the stages in a fixed order, each a function that returns its value and its steps and changes nothing it is given:

0. feedback (ours, optional): each pool's engine speed learned from the latency it served (`learn_engine_speeds`,
   `planner_core.policy.feedback`); every later stage reads the pools' models at the learned speeds; then the SLA
   error budget (ours, optional): the window's misses against the period's budget, which set the posture of the
   decode margin and the burst percentile the later stages read (`read_budget`, `planner_core.policy.error_budget`);
1. shape: the request shape the pools are sized for (`sizing_shape`);
2. capacity: each pool's size at the forecast rate, on the engines' forward-pass capacity (Dynamo 1.x,
   `size_on_engine_capacity`) or on the profile's interpolated throughput (Dynamo 0.x, `size_on_interpolation`);
3. bursts (ours, optional): the pool that computes prompts raised to drain the observed prompt bursts within the
   TTFT target (`size_for_bursts`), their percentile pooled over the newest windows where configured;
4. horizon (ours, optional): each need raised by its learned start-up-horizon headroom (`raise_for_horizon`);
5. hold (ours, optional): each pool at its largest need of the last hold seconds (`hold_scale_down`);
6. margin (ours, optional): a shrinking pool kept until its need clears a hysteresis margin (`scale_down_margin`);
7. bounds: minimum endpoints and the change cap (`bound_pools`).

Between stages the sizes travel as `PoolSizes`: the rounded size of each pool, and where the sizing knows them, its
need before rounding up (the scale-down margin reads it) and its need on the window just observed (the horizon
headroom learns from it). The outcome is the bounded targets, or None (hold) when no model can size the pools,
with the steps in the order the stages ran and the planner state the feedback, the horizon and the hold leave.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner_core.config import PlannerConfig, PlannerMode, RouterKind, ThroughputAlgorithm, managed_components
from planner_core.domain import (
    CapacityFeedback,
    Component,
    PerfModelRole,
    PlannerState,
    Prediction,
    ReasonCode,
    SizedNeed,
    StepName,
    StepRecord,
    TickInputs,
    TrafficObservation,
)
from planner_core.policy.bounds import bound_change_rate, bound_min_endpoint, min_endpoints
from planner_core.policy.burst_pool import pool_prompt_bursts, remember_prompt_bursts
from planner_core.policy.decode_margin import DecodeMarginWindow, learn_decode_margin, sizing_utilization
from planner_core.policy.dispatch import by_count_prefill_size
from planner_core.policy.error_budget import BURST_QUANTILE, budget_margins, read_error_budget
from planner_core.policy.feedback import (
    FeedbackWindow,
    learn_pool_speed,
    learned_model,
    sizing_speed,
)
from planner_core.policy.horizon import horizon_headroom, pool_startup_s, record_window
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

if TYPE_CHECKING:
    from planner_core.perf.capacity import RoleCapacity
    from planner_core.perf.forward import ForwardPassModel

__all__ = [
    "MODEL_STEP",
    "ROLE_OF_POOL",
    "PoolSizes",
    "SizingOutcome",
    "SizingRequest",
    "bound_pools",
    "burst_quantile",
    "forward_model_for",
    "hold_scale_down",
    "learn_decode_utilization",
    "learn_engine_speeds",
    "read_budget",
    "raise_for_horizon",
    "scale_down_margin",
    "size_for_bursts",
    "size_on_engine_capacity",
    "size_on_interpolation",
    "size_pools",
    "target_utilization",
]

MODEL_STEP = StepName.FORWARD_PASS_MODEL
ROLE_OF_POOL = {Component.PREFILL: PerfModelRole.PREFILL, Component.DECODE: PerfModelRole.DECODE}
Steps = tuple[StepRecord, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingRequest:
    """What the sizing reads: the policy and its perf model, the tick's inputs, the state, and the forecast."""

    config: PlannerConfig
    perf: ThroughputPerfModel | None
    inputs: TickInputs
    state: PlannerState
    prediction: Prediction

    @property
    def traffic(self) -> TrafficObservation:
        traffic = self.inputs.traffic
        assert traffic is not None  # a forecast exists only when the window was observed
        return traffic

    @property
    def window_s(self) -> float:
        """The observed window's own length: a late or short collection must not distort the request rate."""
        traffic = self.traffic
        return traffic.duration_s if traffic.duration_s > 0 else self.config.throughput_adjustment_interval_seconds

    @property
    def components(self) -> tuple[Component, ...]:
        return managed_components(self.config.mode)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSizes:
    """Each pool's size between stages (rounded up), with its need before rounding up where the sizing knows it
    (`unrounded`, for the scale-down margin) and its need on the window just observed (`observed`, engine-capacity
    sizing only, for the horizon headroom). Stages build new mappings; none is changed in place."""

    sized: Mapping[Component, int]
    unrounded: Mapping[Component, float] = dataclasses.field(default_factory=dict)
    observed: Mapping[Component, float] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingOutcome:
    """The bounded targets per managed pool (None: no model could size them, hold), the steps in stage order and
    the planner state the horizon and the hold leave."""

    desired: Mapping[Component, int] | None
    steps: Steps
    state: PlannerState


def size_pools(request: SizingRequest) -> SizingOutcome:
    """Size every managed pool for the forecast, stage by stage (module docstring)."""
    config = request.config
    steps: Steps = ()
    if config.throughput_capacity_feedback:
        request, steps = learn_engine_speeds(request)
    if config.throughput_error_budget:
        request, budget_step = read_budget(request)
        steps += (budget_step,)
    if config.throughput_decode_learned_margin and config.mode is not PlannerMode.AGG:
        request, margin_step = learn_decode_utilization(request)
        steps += (margin_step,)
    state = request.state
    shape, shape_step = sizing_shape(request.prediction, config.throughput_length_sizing)
    steps += (shape_step,)
    if config.throughput_algorithm is ThroughputAlgorithm.ENGINE_CAPACITY:
        sizes, stage_steps = size_on_engine_capacity(request, shape)
    else:
        sizes, stage_steps = size_on_interpolation(request, shape)
    steps += stage_steps
    if sizes is None:
        return SizingOutcome(desired=None, steps=steps, state=state)
    if config.throughput_prefill_burst_sizing:
        sizes, state, stage_steps = size_for_bursts(request, state, shape, sizes)
        steps += stage_steps
    if config.router is RouterKind.ROUND_ROBIN:
        sizes, stage_steps = size_by_count(request, sizes)
        steps += stage_steps
    if config.throughput_horizon_quantile > 0 and sizes.observed:
        # before the hold and the margin: the raised size is a need the hold keeps, and the headroom is added to
        # the need before rounding up (a headroom of 0.01 engine must not add a whole engine the hold ignores)
        sizes, state, stage_steps = raise_for_horizon(request, state, sizes)
        steps += stage_steps
    if config.throughput_scale_down_hold_seconds > 0:
        sizes, state, stage_steps = hold_scale_down(request, state, sizes)
        steps += stage_steps
    if config.throughput_scale_down_margin > 0:
        sizes, stage_steps = scale_down_margin(request, sizes)
        steps += stage_steps
    desired, stage_steps = bound_pools(request, sizes)
    return SizingOutcome(desired=desired, steps=steps + stage_steps, state=state)


# --- feedback ----------------------------------------------------------------------------------------------------


def learn_engine_speeds(request: SizingRequest) -> tuple[SizingRequest, Steps]:
    """Ours: each managed pool's engine speed after the window just observed (`planner_core.policy.feedback`), in
    the request's state, with a `capacity_feedback` step per pool. A pool without a model keeps its speed."""
    from planner_core.perf.online import serving_samples

    config, perf, state = request.config, request.perf, request.state
    bootstrap = perf.forward_pass_model() if perf is not None else None
    profiled_kv = perf.profiled_max_kv_tokens() if perf is not None else None
    traffic = request.traffic
    learned = state.capacity_feedback
    serving, _ = serving_samples(request.inputs.fpm, request.inputs.workers, request.components)
    steps: Steps = ()
    for component in request.components:
        model = _base_model_for(state, config.mode, component, bootstrap)
        if model is None:
            continue
        window = FeedbackWindow(
            traffic=traffic,
            window_s=request.window_s,
            workers=request.inputs.workers,
            limits=config.engine_limits(component, profiled_max_kv_tokens=profiled_kv),
            kv_hit_rate=traffic.kv_hit_rate if traffic.kv_hit_rate is not None else state.last_kv_hit_rate,
            accept_length=state.last_accept_length,
            fpm=serving,
            **_own_burst(request, component),
        )
        pool, step = learn_pool_speed(component, config, learned.of(component), window, model)
        field_name = "prefill" if component is Component.PREFILL else "decode"
        learned = dataclasses.replace(learned, **{field_name: pool})
        steps += (step,)
    return dataclasses.replace(request, state=dataclasses.replace(state, capacity_feedback=learned)), steps


def max_by_count_replicas(config: PlannerConfig) -> int:
    """The most prefill engines the by-count sizing tries: the GPU budget's, else `MAX_BY_COUNT_REPLICAS`."""
    if config.max_gpu_budget > 0:
        return max(1, config.max_gpu_budget // config.prefill_gpus_per_engine)
    return MAX_BY_COUNT_REPLICAS


MAX_BY_COUNT_REPLICAS = 128  # without a GPU budget: beyond this many engines the bounds decide anyway


def size_by_count(request: SizingRequest, sizes: PoolSizes) -> tuple[PoolSizes, Steps]:
    """Ours: the prefill pool raised to what a router spreading prompts by count needs for the window just observed
    (`planner_core.policy.dispatch`), at the learned speed; a `burst` step. Runs where the config declares a
    round-robin router."""
    from planner_core.perf.capacity import chunked_prefill_s, effective_kv_hit_rate

    config, state, perf = request.config, request.state, request.perf
    if Component.PREFILL not in sizes.sized:
        return sizes, ()
    bootstrap = perf.forward_pass_model() if perf is not None else None
    model, _ = forward_model_for(state, config.mode, Component.PREFILL, bootstrap, learned=learned_speeds(request))
    limits = config.engine_limits(
        Component.PREFILL, profiled_max_kv_tokens=perf.profiled_max_kv_tokens() if perf is not None else None
    )
    hit, _ = effective_kv_hit_rate(state.last_kv_hit_rate, Component.PREFILL)
    current = sizes.sized[Component.PREFILL]
    need, step = by_count_prefill_size(
        request.traffic,
        None
        if model is None
        else lambda tokens: chunked_prefill_s(tokens, limits.max_num_batched_tokens, model.prefill_wall_s),
        hit=hit,
        ttft_ms=config.ttft_ms,
        target_share=config.error_budget_target,
        max_replicas=max_by_count_replicas(config),
        current=current,
    )
    if need is None:
        return sizes, (step,)
    unrounded = {**sizes.unrounded, Component.PREFILL: max(sizes.unrounded.get(Component.PREFILL, 0.0), float(need))}
    observed = {**sizes.observed, Component.PREFILL: max(sizes.observed.get(Component.PREFILL, 0.0), float(need))}
    sized = {**sizes.sized, Component.PREFILL: max(current, need)}
    return PoolSizes(sized=sized, unrounded=unrounded, observed=observed), (step,)


def _own_burst(request: SizingRequest, component: Component) -> dict[str, float | None]:
    """The burst rule on the window just observed, as the feedback reads it: `prompt_need_engines`, the engines
    its own prompt bursts needed at the speeds learned so far to drain within the TTFT target (not pooled, not
    shrunk to a forecast), and `engine_prompt_tokens_per_s`, the rate of one engine it assumed; both None for the
    decode pool of disaggregated engines, without the burst sizing, and the need None where the rule has no curve
    or rate."""
    config, traffic = request.config, request.traffic
    if not config.throughput_prefill_burst_sizing or (
        component is Component.DECODE and config.mode is not PlannerMode.AGG
    ):
        return {"prompt_need_engines": None, "engine_prompt_tokens_per_s": None}
    shape = RequestShape(isl=max(1.0, traffic.isl), osl=max(1.0, traffic.osl))
    engine_tokens_per_s, iteration_s = burst_engine_rate(request, shape, component)
    observed_tokens_per_s = traffic.num_req * traffic.isl / traffic.duration_s if traffic.duration_s > 0 else 0.0
    _, _, need = burst_prefill_replicas(
        traffic,
        observed_tokens_per_s,
        mean_rate_replicas=0,
        ttft_ms=config.ttft_ms,
        engine_prompt_tokens_per_s=engine_tokens_per_s,
        iteration_s=iteration_s,
        component=component,
    )
    return {"prompt_need_engines": need, "engine_prompt_tokens_per_s": engine_tokens_per_s or None}


def learned_speeds(request: SizingRequest) -> CapacityFeedback | None:
    """The engine speeds the sizing reads: the closed loop's, when it is on (a state learned under another config is
    not read by one with the loop off)."""
    return request.state.capacity_feedback if request.config.throughput_capacity_feedback else None


def learn_decode_utilization(request: SizingRequest) -> tuple[SizingRequest, StepRecord]:
    """Ours: the learned decode margin after the window just observed (`planner_core.policy.decode_margin`), in
    the request's state, with its `decode_margin` step."""
    from planner_core.perf.online import serving_samples

    config, perf, state = request.config, request.perf, request.state
    profiled_kv = perf.profiled_max_kv_tokens() if perf is not None else None
    serving, _ = serving_samples(request.inputs.fpm, request.inputs.workers, request.components)
    window = DecodeMarginWindow(
        traffic=request.traffic,
        workers=request.inputs.workers,
        limits=config.engine_limits(Component.DECODE, profiled_max_kv_tokens=profiled_kv),
        fpm=serving,
    )
    margin, step = learn_decode_margin(config, state.decode_margin, window)
    return dataclasses.replace(request, state=dataclasses.replace(state, decode_margin=margin)), step


def read_budget(request: SizingRequest) -> tuple[SizingRequest, StepRecord]:
    """Ours: the SLA error budget after the window just observed (`planner_core.policy.error_budget`), in the
    request's state, with its `error_budget` step; the later stages read the margins its posture sets."""
    state = request.state
    budget, step = read_error_budget(request.config, state.error_budget, request.traffic, request.inputs.now_s)
    return dataclasses.replace(request, state=dataclasses.replace(state, error_budget=budget)), step


# --- capacity ----------------------------------------------------------------------------------------------------


def size_on_interpolation(request: SizingRequest, shape: RequestShape) -> tuple[PoolSizes | None, Steps]:
    """Dynamo 0.x: tokens/s/GPU interpolated from the profile (optionally with correction factors)."""
    config, inputs, perf = request.config, request.inputs, request.perf
    if perf is None or config.mode is PlannerMode.AGG:
        detail = (
            "no profile loaded" if perf is None else "aggregated capacity needs throughput_algorithm: engine_capacity"
        )
        return None, (StepRecord(step=StepName.CAPACITY, reason=ReasonCode.MODEL_NOT_READY, detail=detail),)
    targets = ThroughputTargets(
        ttft_ms=config.capacity_ttft_ms,
        itl_ms=config.capacity_itl_ms,
        window_s=request.window_s,
        prefill_gpus_per_engine=config.prefill_gpus_per_engine,
        decode_gpus_per_engine=config.decode_gpus_per_engine,
    )
    steps: Steps = ()
    correction = CorrectionFactors()
    if config.throughput_algorithm is ThroughputAlgorithm.INTERPOLATION_CORRECTED:
        correction, correction_steps = correction_factors(request.traffic, inputs.workers.ready(Component.DECODE), perf)
        steps += tuple(correction_steps)
    sized: dict[Component, int] = {}
    for component in request.components:
        sized[component], sizing_steps = calculate_replicas(
            component,
            request.prediction,
            targets,
            perf,
            shape=shape,
            correction=correction,
            target_utilization=target_utilization(request, component),
        )
        steps += tuple(sizing_steps)
    return PoolSizes(sized=sized), steps


def size_on_engine_capacity(request: SizingRequest, shape: RequestShape) -> tuple[PoolSizes | None, Steps]:
    """Dynamo 1.x: requests/s per engine searched on a forward-pass model; every pool or none (a pool whose model
    cannot answer holds its partner too). Each pool's need at the observed request rate (engines, before rounding
    up) goes into `observed`."""
    config, perf = request.config, request.perf
    demand_rps = request.prediction.num_req / request.window_s
    observed_rps = request.traffic.num_req / request.window_s
    bootstrap = perf.forward_pass_model() if perf is not None else None
    profiled_kv = perf.profiled_max_kv_tokens() if perf is not None else None
    steps: Steps = ()
    sized: dict[Component, int] = {}
    unrounded: dict[Component, float] = {}
    observed: dict[Component, float] = {}
    not_ready: list[Component] = []
    for component in request.components:
        model, model_step = forward_model_for(
            request.state, config.mode, component, bootstrap, learned=learned_speeds(request)
        )
        steps += (model_step,)
        if model is None:
            not_ready.append(component)
            continue
        capacity = _pool_capacity(request, shape, component, model, profiled_kv)
        steps += tuple(capacity.steps)
        if not capacity.usable:
            not_ready.append(component)
            continue
        utilization = target_utilization(request, component)
        pool_demand_rps, headroom_step = with_headroom(component, demand_rps, utilization)
        if headroom_step is not None:
            steps += (headroom_step,)
        sized[component], step = replicas_for_engine_rps(
            component, pool_demand_rps, capacity.requests_per_s, capacity.detail
        )
        steps += (step,)
        if capacity.requests_per_s > 0:
            unrounded[component] = pool_demand_rps / capacity.requests_per_s
            observed[component] = observed_rps / utilization / capacity.requests_per_s
    if not_ready:
        partners = tuple(
            StepRecord(
                step=StepName.CAPACITY,
                component=component,
                reason=ReasonCode.PARTNER_NOT_READY,
                detail="held with the pool whose model cannot answer",
            )
            for component in request.components
            if component not in not_ready
        )
        return None, steps + partners
    return PoolSizes(sized=sized, unrounded=unrounded, observed=observed), steps


def _pool_capacity(
    request: SizingRequest,
    shape: RequestShape,
    component: Component,
    model: ForwardPassModel,
    profiled_kv: int | None,
) -> RoleCapacity:
    """One engine's capacity in `component`'s pool at the sizing shape (`planner_core.perf.capacity`)."""
    from planner_core.perf.capacity import agg_capacity, decode_capacity, prefill_capacity

    config, state = request.config, request.state
    limits = config.engine_limits(component, profiled_max_kv_tokens=profiled_kv)
    if config.mode is PlannerMode.AGG:
        return agg_capacity(
            model,
            limits,
            isl=shape.isl,
            osl=max(1.0, shape.osl),
            ttft_ms=config.capacity_ttft_ms,
            itl_ms=config.capacity_itl_ms,
            kv_hit_rate=state.last_kv_hit_rate,
            accept_length=state.last_accept_length,
        )
    if component is Component.PREFILL:
        return prefill_capacity(
            model, limits, isl=shape.isl, ttft_ms=config.capacity_ttft_ms, kv_hit_rate=state.last_kv_hit_rate
        )
    return decode_capacity(
        model,
        limits,
        isl=shape.isl,
        osl=max(1.0, shape.osl),
        itl_ms=config.capacity_itl_ms,
        accept_length=state.last_accept_length,
    )


# --- bursts ------------------------------------------------------------------------------------------------------


def size_for_bursts(
    request: SizingRequest, state: PlannerState, shape: RequestShape, sizes: PoolSizes
) -> tuple[PoolSizes, PlannerState, Steps]:
    """Ours: raise the pool that computes prompts (prefill, or the aggregated engines, scaled as the decode pool)
    so the observed prompt bursts drain within the TTFT target (`burst_prefill_replicas`), at the engine rate of
    `burst_engine_rate`. With `throughput_burst_pool_requests` the curve read is pooled over the newest windows
    (`planner_core.policy.burst_pool`), whose distributions the state keeps. The window's own burst need (the curve
    not shrunk to the forecast) goes into `observed`."""
    config, prediction, traffic = request.config, request.prediction, request.traffic
    component = Component.DECODE if config.mode is PlannerMode.AGG else Component.PREFILL
    if component not in sizes.sized:
        return sizes, state, ()
    curve, pooled = None, ""
    if config.throughput_burst_pool_requests > 0:
        pool = {
            "min_requests": config.throughput_burst_pool_requests,
            "max_windows": config.throughput_burst_pool_windows,
        }
        quantile = burst_quantile(request)
        pooled_curve = pool_prompt_bursts(
            traffic.prompt_tokens_quantiles, state.recent_prompt_bursts, **pool, quantile=quantile
        )
        if pooled_curve is not None:
            curve = pooled_curve.points
            at = "" if quantile == BURST_QUANTILE else f" at p{quantile * 100:g} (the error budget's posture)"
            pooled = f" (pooled: {pooled_curve.num_requests} requests, {pooled_curve.num_windows} windows{at})"
        recent = remember_prompt_bursts(
            state.recent_prompt_bursts, request.inputs.now_s, traffic.prompt_tokens_quantiles, **pool
        )
        state = dataclasses.replace(state, recent_prompt_bursts=recent)
    mean_rate_replicas = sizes.sized[component]
    engine_tokens_per_s, iteration_s = burst_engine_rate(request, shape, component)
    rule = {
        "mean_rate_replicas": mean_rate_replicas,
        "ttft_ms": config.ttft_ms,
        "engine_prompt_tokens_per_s": engine_tokens_per_s,
        "iteration_s": iteration_s,
        "component": component,
        "curve": curve,
        "pooled": pooled,
    }
    replicas, step, burst_need = burst_prefill_replicas(
        traffic, prediction.num_req * prediction.isl / request.window_s, **rule
    )
    unrounded, observed = dict(sizes.unrounded), dict(sizes.observed)
    if burst_need is not None:
        unrounded[component] = max(unrounded.get(component, 0.0), burst_need)
        # growth 1: the curve as observed
        _, _, observed_need = burst_prefill_replicas(
            traffic, traffic.num_req * traffic.isl / traffic.duration_s, **rule
        )
        if observed_need is not None:
            observed[component] = max(observed.get(component, 0.0), observed_need)
    sized = {**sizes.sized, component: replicas}
    return PoolSizes(sized=sized, unrounded=unrounded, observed=observed), state, (step,)


def burst_engine_rate(request: SizingRequest, shape: RequestShape, component: Component) -> tuple[float, float]:
    """Prompt tokens/s one engine of `component`'s pool computes for the burst rule, KV hits discounted and
    derated by the prefill target utilisation, and the wall time (s) of one of its prompt iterations; (0, 0)
    without a forward-pass model.

    A prefill engine: a full chunk of the prefill model in force (online, else bootstrap). An aggregated engine:
    its prompt rate under the decode batch `agg_capacity` chose at the sizing shape
    (`agg_operating_prompt_rate`); the pool's own (decode) utilisation is already in the mean-rate size, and the
    rate is taken at the full operating batch."""
    from planner_core.perf.capacity import effective_kv_hit_rate

    config, state, perf = request.config, request.state, request.perf
    bootstrap = perf.forward_pass_model() if perf is not None else None
    model, _ = forward_model_for(state, config.mode, component, bootstrap, learned=learned_speeds(request))
    if model is None:
        return 0.0, 0.0
    tokens_per_s, iteration_s = engine_prompt_rate(
        config,
        model,
        perf.profiled_max_kv_tokens() if perf is not None else None,
        isl=shape.isl,
        osl=shape.osl,
        kv_hit_rate=state.last_kv_hit_rate,
        accept_length=state.last_accept_length,
    )
    hit, _ = effective_kv_hit_rate(state.last_kv_hit_rate, component)
    # the target utilisation derates the engine for bursts as for the mean rate
    return tokens_per_s / (1.0 - hit) * config.throughput_prefill_target_utilization, iteration_s


# --- horizon, hold, margin -----------------------------------------------------------------------------------------


def raise_for_horizon(
    request: SizingRequest, state: PlannerState, sizes: PoolSizes
) -> tuple[PoolSizes, PlannerState, Steps]:
    """Ours: each pool's need before rounding up raised by its learned headroom for its start-up horizon
    (`planner_core.policy.horizon`), then rounded: `max(size, ceil(need + headroom))`. It runs before the scale-down
    hold and margin, so the raised size is a need the hold keeps, and the returned `unrounded` is the raised need
    the margin measures. The need before the headroom (what the sizing alone planned: the residuals measure its
    shortfall) and the observed need are recorded in the state; a pool without an unrounded need plans its size.
    Each pool gets a `horizon` step with the headroom and the size it gives."""
    config, sized = request.config, sizes.sized
    planned = {component: sizes.unrounded.get(component, float(value)) for component, value in sized.items()}
    windows = record_window(state.horizon_windows, request.inputs.now_s, planned, dict(sizes.observed))
    raised, unrounded = dict(sized), dict(sizes.unrounded)
    steps: Steps = ()
    for component in request.components:
        if component not in sizes.observed:
            continue
        startup_s, startup_step = pool_startup_s(state.startup, component, config.throughput_startup_seconds)
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
        detail = (
            f"{headroom_step.detail}; need {planned[component]:.3f} + {headroom:.3f} = {need:.3f} engines: "
            f"size max({sized[component]}, ceil({need:.3f})) = {raised[component]}"
        )
        steps += (startup_step, dataclasses.replace(headroom_step, detail=detail))
    next_sizes = PoolSizes(sized=raised, unrounded=unrounded, observed=sizes.observed)
    return next_sizes, dataclasses.replace(state, horizon_windows=windows), steps


def hold_scale_down(
    request: SizingRequest, state: PlannerState, sizes: PoolSizes
) -> tuple[PoolSizes, PlannerState, Steps]:
    """Ours: each pool at the largest need sized over the last `throughput_scale_down_hold_seconds` (this tick's
    included); needs older than that are forgotten. Needs are recorded before this hold, so a held size never
    holds itself. With no need recorded yet (the planner's first sizing), the pools' current sizes count as a need
    of this tick too: the deployment was sized for its traffic, and the planner has seen only one window of it."""
    inputs, sized = request.inputs, sizes.sized
    hold_s = request.config.throughput_scale_down_hold_seconds
    now_s = inputs.now_s
    need = SizedNeed(at_s=now_s, num_prefill=sized.get(Component.PREFILL, 0), num_decode=sized.get(Component.DECODE, 0))
    recent = tuple(n for n in state.recent_throughput_needs if now_s - n.at_s < hold_s and n.at_s <= now_s)
    if not state.recent_throughput_needs:
        components = request.components
        current = SizedNeed(
            at_s=now_s,
            num_prefill=inputs.workers.expected_prefill if Component.PREFILL in components else 0,
            num_decode=inputs.workers.expected_decode if Component.DECODE in components else 0,
        )
        recent = (current,)
    recent = (*recent, need)
    held: dict[Component, int] = {}
    steps: Steps = ()
    for component, value in sized.items():
        field_name = "num_prefill" if component is Component.PREFILL else "num_decode"
        largest = max(getattr(n, field_name) for n in recent)
        held[component] = max(value, largest)
        step = StepRecord(
            step=StepName.SCALE_DOWN_HOLD,
            component=component,
            value=held[component],
            reason=ReasonCode.SCALE_DOWN_HELD if largest > value else ReasonCode.WITHIN_RANGE,
            detail=f"need {value}; largest need of the last {hold_s:g} s: {largest} ({len(recent)} ticks)",
        )
        steps += (step,)
    next_sizes = dataclasses.replace(sizes, sized=held)
    return next_sizes, dataclasses.replace(state, recent_throughput_needs=recent), steps


def scale_down_margin(request: SizingRequest, sizes: PoolSizes) -> tuple[PoolSizes, Steps]:
    """Ours: a pool below its current size shrinks only as far as its need before rounding up stays at most
    m x (1 - margin) of the new size m: `min(current, max(sized, ceil(need / (1 - margin))))`. Hysteresis: a need
    of 2.05 raises a pool to 3, and only a need under 1.8 (margin 0.1) brings it back to 2, so a steady load whose
    need wanders around an integer does not flap. Pools growing, or without an unrounded need, are left alone."""
    margin = request.config.throughput_scale_down_margin
    held = dict(sizes.sized)
    steps: Steps = ()
    for component, value in sizes.sized.items():
        current = request.inputs.workers.expected(component)
        need = sizes.unrounded.get(component)
        if need is None or value >= current:
            continue
        floor = min(current, max(value, math.ceil(need / (1.0 - margin) - 1e-9)))
        held[component] = floor
        step = StepRecord(
            step=StepName.SCALE_DOWN_HOLD,
            component=component,
            value=floor,
            reason=ReasonCode.SCALE_DOWN_HELD if floor > value else ReasonCode.WITHIN_RANGE,
            detail=(
                f"scale-down margin {margin:g}: need {need:.3f} engines; "
                f"min({current}, max({value}, ceil({need:.3f} / {1.0 - margin:g}))) = {floor}"
            ),
        )
        steps += (step,)
    return dataclasses.replace(sizes, sized=held), steps


# --- bounds ------------------------------------------------------------------------------------------------------


def bound_pools(request: SizingRequest, sizes: PoolSizes) -> tuple[dict[Component, int], Steps]:
    """Each managed pool raised to its minimum endpoints, its change capped per tick, and raised again (a cap may
    undercut the floor)."""
    config, workers = request.config, request.inputs.workers
    floors = min_endpoints(config)
    desired: dict[Component, int] = {}
    steps: Steps = ()
    for component in request.components:
        value, floor_step = bound_min_endpoint(component, sizes.sized[component], floors[component])
        value, rate_step = bound_change_rate(
            component, value, workers.expected(component), config.max_throughput_scaling_replicas
        )
        value, refloor_step = bound_min_endpoint(component, value, floors[component])
        steps += (floor_step, rate_step, refloor_step)
        desired[component] = value
    return desired, steps


# --- models ------------------------------------------------------------------------------------------------------


def target_utilization(request: SizingRequest, component: Component) -> float:
    """The pool's throughput-sizing target utilisation (the aggregated pool is sized as decode): the configured
    one, or for decode, where the SLA error budget is on, the one its posture sets."""
    config = request.config
    if component is Component.PREFILL:
        return config.throughput_prefill_target_utilization
    if config.throughput_decode_learned_margin and config.mode is not PlannerMode.AGG:
        return sizing_utilization(config, request.state.decode_margin)
    if config.throughput_error_budget:
        return budget_margins(config, request.state.error_budget.posture).decode_utilization
    return config.throughput_decode_target_utilization


def burst_quantile(request: SizingRequest) -> float:
    """The percentile of the pooled prompt-burst curve the burst sizing reads: the p99, or where the SLA error
    budget is on, the one its posture sets."""
    config = request.config
    if config.throughput_error_budget:
        return budget_margins(config, request.state.error_budget.posture).burst_quantile
    return BURST_QUANTILE


def _base_model_for(
    state: PlannerState, mode: PlannerMode, component: Component, bootstrap: ForwardPassModel | None
) -> ForwardPassModel | None:
    """The pool's model before the closed loop's speed: the online regression once ready, else the bootstrap."""
    model, _ = forward_model_for(state, mode, component, bootstrap)
    return model


def forward_model_for(
    state: PlannerState,
    mode: PlannerMode,
    component: Component,
    bootstrap: ForwardPassModel | None,
    *,
    learned: CapacityFeedback | None = None,
) -> tuple[ForwardPassModel | None, StepRecord]:
    """The bootstrap chain for one pool, and a step saying which model answers: the online regression once its
    fit is ready, else the bootstrap model (perf table or profile), else none (recorded, so the audit trail shows
    when the engines' own metrics were not used yet). With `learned` (the closed loop on), a disaggregated pool's
    model runs at the engine speed the loop learned for it (`planner_core.policy.feedback`)."""
    from planner_core.perf.online import OnlineForwardPassModel

    role = PerfModelRole.AGG if mode is PlannerMode.AGG else ROLE_OF_POOL[component]
    online_state = getattr(state.perf_models, role.value)
    online = OnlineForwardPassModel(online_state)
    samples = f"{len(online_state.samples)} samples"
    speed = ""
    if learned is not None and mode is not PlannerMode.AGG:
        pool_speed = sizing_speed(learned.of(component))
        speed = "" if pool_speed == 1.0 else f", at the learned speed {pool_speed:.3f}"
    base: ForwardPassModel | None = online if online.is_ready() else bootstrap
    if base is not None and learned is not None and speed:
        base = learned_model(base, learned, component)
    why = f"the online {role.value} model is {online_state.readiness.value} ({samples})"
    if online.is_ready():
        reason, detail = ReasonCode.PERF_MODEL_READY, f"the online {role.value} regression answers ({samples}){speed}"
    elif bootstrap is None:
        reason, detail = ReasonCode.INSUFFICIENT_DATA, f"{why} and there is no bootstrap model"
    else:
        reason, detail = ReasonCode.PERF_MODEL_BOOTSTRAP, f"{why}: {type(bootstrap).__name__} answers{speed}"
    return base, StepRecord(step=MODEL_STEP, component=component, reason=reason, detail=detail)
