"""Throughput-based scaling: forecast of the next window -> replicas per pool, through an engine perf model.

For each pool, `replicas = ceil(demand / capacity_per_engine)`:
- prefill demand is `N * ISL / T` tokens/s, served at the profiled tokens/s/GPU for that ISL;
- decode demand is `N * OSL / T` tokens/s, served at the best tokens/s/GPU whose ITL meets the SLA for
  context `ISL + OSL / 2`;
then the minimum endpoints, the per-tick change cap and the GPU budget are applied, each as a recorded step.

The request shape (ISL, OSL) is the forecast mean, or with `LengthSizing.QUANTILE` the forecast length quantile
(`sizing_shape`). With `ThroughputAlgorithm.INTERPOLATION_CORRECTED`, Dynamo 0.x's correction factors
(`correction_factors`) rescale the prefill load and the decode ITL target.

Ours, off by default (Dynamo runs each pool at its searched capacity):
- headroom (`with_headroom`): the demand is divided by the pool's target utilisation before sizing;
- burst sizing (`burst_prefill_replicas`): sizing on the mean rate ignores how requests bunch up. A prefill pool
  of P engines, each computing `mu` prompt tokens/s at full chunks, behaves like one queue drained at `P * mu`;
  a request meets the TTFT target T when the tokens that arrived in any interval L before it (its own included)
  are computed within `L + T'`, where `T' = T - one full-chunk iteration` (it may arrive just after an
  iteration started). With `A(L)` the window's p99 of those tokens (the observed arrival curve), scaled by
  `g = min(1, forecast / observed prompt-token rate)`, the pool needs
  `max over L of ceil(g * A(L) / (mu * (L + T')))` engines. Long intervals give back the mean-rate sizing;
  short ones the bursts. `g` only ever shrinks the curve: the mean-rate sizing carries a forecast rise, and the
  curve of a quiet window says nothing about the size of the next burst (scaling it up by the forecast turned
  80 requests seen into 11 engines on the Azure code trace). One prompt is computed by one engine, so it delays
  the others by at most one engine's share of the interval: the arrival curve counts each prompt up to what one
  engine computes in `L + T'` (derived in the tick from the arrivals the source recorded, `with_prompt_curve`),
  so a clump of long prompts raises the pool by about one engine each, not by their whole length.
- burst sizing of aggregated engines (the same rule, `component=DECODE`): an aggregated engine computes prompts
  under its decode batch, so `mu` is its prompt rate at the operating point the capacity search chose
  (`planner_core.perf.capacity.agg_operating_prompt_rate`: `MBT - b` prompt tokens per mixed iteration with `b`
  requests decoding) and `T'` the TTFT target less one such iteration. KV hits and the prefill target utilisation
  raise and derate `mu` as they do for a prefill pool (the pool's own target utilisation is in its mean-rate size,
  and `mu` is already taken at the full operating batch, not at the lower batch that utilisation leaves), and the
  curve caps each prompt at the same engine's share.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner_core.arrivals import PromptCap, prompt_arrival_quantiles, recorded_request_arrivals
from planner_core.config import LengthSizing, PlannerConfig, PlannerMode
from planner_core.domain import (
    PROMPT_ARRIVAL_INTERVALS_S,
    Component,
    Prediction,
    ReasonCode,
    StepName,
    StepRecord,
    TrafficObservation,
)
from planner_core.perf.capacity import agg_operating_prompt_rate, full_chunk_prefill_rate
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.protocol import ThroughputPerfModel


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestShape:
    """The request lengths (tokens) a pool is sized for."""

    isl: float
    osl: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectionFactors:
    """Dynamo 0.x's observed / interpolated latency ratios; 1.0 means "no correction"."""

    prefill: float = 1.0
    decode: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputTargets:
    """Sizing parameters taken from the config."""

    ttft_ms: float
    itl_ms: float
    window_s: float
    prefill_gpus_per_engine: int
    decode_gpus_per_engine: int


def sizing_shape(prediction: Prediction, sizing: LengthSizing) -> tuple[RequestShape, StepRecord]:
    """The request shape to size for: the forecast mean, or the forecast length quantile when asked and known."""
    mean = RequestShape(isl=prediction.isl, osl=prediction.osl)
    if sizing is LengthSizing.MEAN:
        step = StepRecord(
            step=StepName.LENGTH_SIZING,
            reason=ReasonCode.SIZED_ON_MEAN,
            detail=f"mean ISL {mean.isl:.0f}, OSL {mean.osl:.0f}",
        )
        return mean, step
    if prediction.isl_quantile is None or prediction.osl_quantile is None:
        step = StepRecord(
            step=StepName.LENGTH_SIZING,
            reason=ReasonCode.QUANTILE_UNAVAILABLE,
            detail=f"no {prediction.quantile or 'length'} forecast yet: mean ISL {mean.isl:.0f}, OSL {mean.osl:.0f}",
        )
        return mean, step
    # A quantile below the mean (possible for skewed forecasts) would size for less than the mean shape.
    shape = RequestShape(isl=max(prediction.isl_quantile, mean.isl), osl=max(prediction.osl_quantile, mean.osl))
    step = StepRecord(
        step=StepName.LENGTH_SIZING,
        reason=ReasonCode.SIZED_ON_QUANTILE,
        detail=f"{prediction.quantile} ISL {shape.isl:.0f}, OSL {shape.osl:.0f} (mean {mean.isl:.0f}, {mean.osl:.0f})",
    )
    return shape, step


def correction_factors(
    traffic: TrafficObservation, num_decode_workers: int, perf: ThroughputPerfModel
) -> tuple[CorrectionFactors, list[StepRecord]]:
    """Dynamo 0.x's correction factors from the window just observed.

    `prefill = observed TTFT / interpolated TTFT(observed ISL)`; `decode = observed ITL / interpolated
    ITL(concurrency, ISL + OSL/2)` with `concurrency = num_req / num_decode_workers * request_duration / T`.
    The window has no request-duration figure, so `request_duration = TTFT + ITL * OSL` from the observed means.
    A factor is 1.0 when its latency was not observed, the window was idle, or the interpolation gives 0.
    """
    steps: list[StepRecord] = []
    prefill = decode = 1.0
    busy = traffic.num_req > 0 and traffic.duration_s > 0
    expected_ttft_ms = perf.prefill_ttft_ms(traffic.isl) if busy else 0.0
    if busy and traffic.ttft_ms is not None and expected_ttft_ms > 0:
        prefill = traffic.ttft_ms / expected_ttft_ms
        steps.append(
            StepRecord(
                step=StepName.CORRECTION,
                component=Component.PREFILL,
                value=prefill,
                reason=ReasonCode.CORRECTION_APPLIED,
                detail=f"observed TTFT {traffic.ttft_ms:.1f} ms / interpolated {expected_ttft_ms:.1f} ms",
            )
        )
    else:
        steps.append(
            StepRecord(
                step=StepName.CORRECTION,
                component=Component.PREFILL,
                value=1.0,
                reason=ReasonCode.CORRECTION_UNAVAILABLE,
                detail="no observed TTFT in a busy window",
            )
        )
    if busy and traffic.ttft_ms is not None and traffic.itl_ms is not None and num_decode_workers > 0:
        request_duration_s = (traffic.ttft_ms + traffic.itl_ms * traffic.osl) / 1000.0
        concurrency = traffic.num_req / num_decode_workers * request_duration_s / traffic.duration_s
        context = traffic.isl + traffic.osl / 2.0
        expected_itl_ms = perf.decode_itl_ms(concurrency, context)
        if expected_itl_ms > 0:
            decode = traffic.itl_ms / expected_itl_ms
            steps.append(
                StepRecord(
                    step=StepName.CORRECTION,
                    component=Component.DECODE,
                    value=decode,
                    reason=ReasonCode.CORRECTION_APPLIED,
                    detail=(
                        f"observed ITL {traffic.itl_ms:.2f} ms / interpolated {expected_itl_ms:.2f} ms "
                        f"at concurrency {concurrency:.1f}, context {context:.0f}"
                    ),
                )
            )
            return CorrectionFactors(prefill=prefill, decode=decode), steps
    steps.append(
        StepRecord(
            step=StepName.CORRECTION,
            component=Component.DECODE,
            value=1.0,
            reason=ReasonCode.CORRECTION_UNAVAILABLE,
            detail="no observed TTFT and ITL in a busy window",
        )
    )
    return CorrectionFactors(prefill=prefill, decode=decode), steps


def calculate_replicas(
    component: Component,
    prediction: Prediction,
    targets: ThroughputTargets,
    perf: ThroughputPerfModel,
    *,
    shape: RequestShape | None = None,
    correction: CorrectionFactors | None = None,
    target_utilization: float = 1.0,
) -> tuple[int, list[StepRecord]]:
    """Replicas one pool needs for the forecast demand, before any bound.

    Args:
        component: the pool to size.
        prediction: forecast requests per window and mean ISL/OSL (tokens).
        targets: SLA targets (ms), window length (s) and GPUs per engine.
        perf: the engine perf model.
        shape: the request lengths to size for (default: the forecast means).
        correction: 0.x correction factors (default: none). Prefill load is scaled by `min(1, prefill)`,
            the decode ITL target divided by `decode`.
        target_utilization: the demand is divided by it first (`with_headroom`); 1 = none.

    Returns:
        `ceil(demand_tokens_per_s / (tokens_per_s_per_gpu * gpus_per_engine))` and the steps explaining it.
    """
    steps: list[StepRecord] = []
    shape = shape or RequestShape(isl=prediction.isl, osl=prediction.osl)
    correction = correction or CorrectionFactors()
    if component is Component.PREFILL:
        demand_tokens_per_s = prediction.num_req * shape.isl / targets.window_s * min(1.0, correction.prefill)
        capacity = perf.prefill_capacity(isl=shape.isl, ttft_ms=targets.ttft_ms)
        gpus, latency_name, target_ms = targets.prefill_gpus_per_engine, "TTFT", targets.ttft_ms
    else:
        demand_tokens_per_s = prediction.num_req * shape.osl / targets.window_s
        target_ms = targets.itl_ms / correction.decode if correction.decode > 0 else targets.itl_ms
        capacity = perf.decode_capacity(isl=shape.isl, osl=shape.osl, itl_ms=target_ms)
        gpus, latency_name = targets.decode_gpus_per_engine, "ITL"
    demand_tokens_per_s, headroom_step = with_headroom(component, demand_tokens_per_s, target_utilization)
    if headroom_step is not None:
        steps.append(headroom_step)
    engine_tokens_per_s = capacity.tokens_per_s_per_gpu * gpus
    steps.append(
        StepRecord(
            step=StepName.CAPACITY,
            component=component,
            value=engine_tokens_per_s,
            reason=ReasonCode.CAPACITY_FROM_PROFILE if capacity.sla_met else ReasonCode.SLA_UNREACHABLE,
            detail=(
                f"{engine_tokens_per_s:.0f} tokens/s per engine at {latency_name} {capacity.latency_ms:.1f} ms"
                + ("" if capacity.sla_met else f" (above the {target_ms:g} ms target even at batch 1)")
            ),
        )
    )
    desired = math.ceil(demand_tokens_per_s / engine_tokens_per_s) if engine_tokens_per_s > 0 else 0
    steps.append(
        StepRecord(
            step=StepName.DEMAND,
            component=component,
            value=desired,
            reason=ReasonCode.DEMAND_SIZED,
            detail=f"ceil({demand_tokens_per_s:.0f} / {engine_tokens_per_s:.0f}) = {desired}",
        )
    )
    return desired, steps


def replicas_for_engine_rps(
    component: Component, demand_rps: float, engine_rps: float, detail_capacity: str
) -> tuple[int, StepRecord]:
    """`ceil(demand requests/s / requests/s one engine sustains)` (Dynamo 1.x sizing), with its step."""
    desired = math.ceil(demand_rps / engine_rps - 1e-9) if engine_rps > 0 and demand_rps > 0 else 0
    return desired, StepRecord(
        step=StepName.DEMAND,
        component=component,
        value=desired,
        reason=ReasonCode.DEMAND_SIZED,
        detail=f"ceil({demand_rps:.3f} req/s / {engine_rps:.3f} req/s per engine) = {desired} ({detail_capacity})",
    )


def with_headroom(component: Component, demand: float, target_utilization: float) -> tuple[float, StepRecord | None]:
    """`demand / target_utilization` and its step; no step when the utilisation is 1 (Dynamo's sizing)."""
    if target_utilization >= 1.0:
        return demand, None
    raised = demand / target_utilization
    return raised, StepRecord(
        step=StepName.HEADROOM,
        component=component,
        value=target_utilization,
        reason=ReasonCode.HEADROOM_APPLIED,
        detail=f"demand {demand:.3g} / target utilisation {target_utilization:g} = {raised:.3g}",
    )


def burst_slack_s(ttft_ms: float, iteration_s: float) -> float:
    """`T'` of the burst rule: the TTFT target less one prompt iteration (a request may arrive just after one
    started), at least 0. The arrival curve's source caps prompts with the same slack."""
    return max(0.0, ttft_ms / 1000.0 - iteration_s)


def engine_prompt_rate(
    config: PlannerConfig,
    model: ForwardPassModel,
    profiled_max_kv_tokens: int | None,
    *,
    isl: float,
    osl: float,
    kv_hit_rate: float | None,
    accept_length: float | None,
) -> tuple[float, float]:
    """Prompt tokens/s one engine of the pool that computes prompts runs at, and the wall time (s) of one of its
    prompt iterations (KV hits not discounted): a prefill engine computes full chunks of `max_num_batched_tokens`
    (`full_chunk_prefill_rate`); an aggregated engine computes prompts under its decode batch, at the operating
    point the capacity search chooses for the shape (`agg_operating_prompt_rate`). The burst rule's engine rate
    (with the model in force) and the curve's prompt cap (`prompt_cap`, with the bootstrap model) both start here."""
    if config.mode is PlannerMode.AGG:
        rate = agg_operating_prompt_rate(
            model,
            config.engine_limits(Component.DECODE, profiled_max_kv_tokens=profiled_max_kv_tokens),
            isl=isl,
            osl=max(1.0, osl),
            ttft_ms=config.ttft_ms,
            itl_ms=config.itl_ms,
            kv_hit_rate=kv_hit_rate,
            accept_length=accept_length,
        )
        return rate.tokens_per_s, rate.iteration_s
    return full_chunk_prefill_rate(model, config.engine_limits(Component.PREFILL).max_num_batched_tokens)


def prompt_cap(
    config: PlannerConfig, perf: ThroughputPerfModel | None, traffic: TrafficObservation
) -> PromptCap | None:
    """How the tick counts each prompt in the arrival curve for this policy (`with_prompt_curve`):
    one engine's prompt tokens/s and the slack `T'`, from the bootstrap forward-pass model (the engines as
    profiled; KV hits not discounted, the prompt tokens counted are the ones that arrive).

    A prefill engine computes full chunks of `max_num_batched_tokens`; an aggregated engine computes prompts under
    its decode batch, at the operating point the capacity search chooses for the window's mean shape
    (`agg_operating_prompt_rate`). None (whole prompts counted) without a forward-pass model, for an idle window
    in aggregated mode, or when the rate comes out 0.
    """
    model = perf.forward_pass_model() if perf is not None else None
    if model is None:
        return None
    if config.mode is PlannerMode.AGG and (traffic.num_req <= 0 or traffic.isl <= 0):
        return None
    tokens_per_s, iteration_s = engine_prompt_rate(
        config,
        model,
        perf.profiled_max_kv_tokens(),
        isl=traffic.isl,
        osl=traffic.osl,
        kv_hit_rate=traffic.kv_hit_rate,
        accept_length=traffic.accept_length,
    )
    if not tokens_per_s > 0:
        return None
    return PromptCap(engine_prompt_tokens_per_s=tokens_per_s, slack_s=burst_slack_s(config.ttft_ms, iteration_s))


def with_prompt_curve(
    config: PlannerConfig, perf: ThroughputPerfModel | None, traffic: TrafficObservation
) -> TrafficObservation:
    """`traffic` with the prompt-arrival curve this policy reads (and each interval's distribution, which the burst
    rule pools over windows), derived from the arrivals the source recorded
    (`TrafficObservation.prompt_arrivals`), each prompt counted up to this policy's engine share (`prompt_cap`):
    the tick calls it, so a replay under another config derives the curve again. Every curve field is replaced
    (an interval the arrivals cannot show is None). Without recorded arrivals (a source without timestamps, or a
    tick stored before they were recorded) `traffic` is returned as it is: its stored curve, if any, stands."""
    record = traffic.prompt_arrivals
    if record is None:
        return traffic
    cap = prompt_cap(config, perf, traffic)
    curve, quantiles = prompt_arrival_quantiles(
        recorded_request_arrivals(record), record.start_s, record.end_s, cap=cap
    )
    return dataclasses.replace(
        traffic,
        **{name: curve.get(name) for name in PROMPT_ARRIVAL_INTERVALS_S},
        prompt_tokens_quantiles=quantiles,
    )


def burst_prefill_replicas(
    traffic: TrafficObservation,
    forecast_prompt_tokens_per_s: float,
    *,
    mean_rate_replicas: int,
    ttft_ms: float,
    engine_prompt_tokens_per_s: float,
    iteration_s: float,
    component: Component = Component.PREFILL,
    curve: tuple[tuple[float, float], ...] | None = None,
    pooled: str = "",
) -> tuple[int, StepRecord, float | None]:
    """Prefill engines that also drain the observed prompt bursts, shrunk to a lower forecast, within the TTFT target.

    Args:
        traffic: the window just observed; its `prompt_arrival_curve()` and mean prompt-token rate are read.
        forecast_prompt_tokens_per_s: forecast requests/s times forecast mean ISL for the next window.
        mean_rate_replicas: the pool's size from the mean-rate sizing.
        ttft_ms: the TTFT target.
        engine_prompt_tokens_per_s: prompt tokens/s one engine computes at full chunks (KV hits discounted).
        iteration_s: wall time of one full-chunk iteration (s).
        component: the pool sized: PREFILL, or DECODE for aggregated engines (their prompt rate and iteration under
            the decode batch then stand for `engine_prompt_tokens_per_s` and `iteration_s`).
        curve: the curve to read in place of the window's own (the pooled one, `planner_core.policy.burst_pool`),
            as (interval s, p99 tokens); `pooled` says in the step what it was pooled over.

    Returns:
        The larger of `mean_rate_replicas` and `max over L of ceil(g * A(L) / (mu * (L + T')))` (module
        docstring), its step: `burst_sized` (raised), `burst_covered` (not), or `burst_unavailable` (the
        window has no arrival curve or no prompt tokens, or the engine rate is unknown: `mean_rate_replicas` kept),
        and the burst need in engines before rounding up (None when unavailable).
    """
    if curve is None:
        curve = traffic.prompt_arrival_curve()
    observed_tokens_per_s = traffic.num_req * traffic.isl / traffic.duration_s if traffic.duration_s > 0 else 0.0
    if not curve or observed_tokens_per_s <= 0 or engine_prompt_tokens_per_s <= 0:
        why = (
            "no prompt-token arrival curve observed"
            if not curve
            else "no prompt tokens observed"
            if observed_tokens_per_s <= 0
            else "no prefill engine rate"
            if component is Component.PREFILL
            else "no aggregated engine prompt rate"
        )
        step = StepRecord(
            step=StepName.BURST, component=component, reason=ReasonCode.BURST_UNAVAILABLE, detail=f"{why}: mean rate"
        )
        return mean_rate_replicas, step, None
    growth = min(1.0, forecast_prompt_tokens_per_s / observed_tokens_per_s)
    slack_s = burst_slack_s(ttft_ms, iteration_s)
    needs = [
        (growth * tokens / (engine_prompt_tokens_per_s * (interval_s + slack_s)), interval_s, tokens)
        for interval_s, tokens in curve
    ]
    need, interval_s, tokens = max(needs)
    burst = math.ceil(need - 1e-9)
    replicas = max(burst, mean_rate_replicas)
    step = StepRecord(
        step=StepName.BURST,
        component=component,
        value=replicas,
        reason=ReasonCode.BURST_SIZED if burst > mean_rate_replicas else ReasonCode.BURST_COVERED,
        detail=(
            f"ceil({growth:.3g} x {tokens:.0f} p99 tokens in {interval_s:g} s{pooled} / "
            f"({engine_prompt_tokens_per_s:.0f} tokens/s x ({interval_s:g} + {slack_s:.3f}) s)) = {burst}; "
            f"mean rate {mean_rate_replicas}"
        ),
    )
    return replicas, step, need
