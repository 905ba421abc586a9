"""Throughput-based scaling: forecast of the next window -> replicas per pool, through an engine perf model.

For each pool, `replicas = ceil(demand / capacity_per_engine)`:
- prefill demand is `N * ISL / T` tokens/s, served at the profiled tokens/s/GPU for that ISL;
- decode demand is `N * OSL / T` tokens/s, served at the best tokens/s/GPU whose ITL meets the SLA for
  context `ISL + OSL / 2`;
then the minimum endpoints, the per-tick change cap and the GPU budget are applied, each as a recorded step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from planner_core.domain import Component, Prediction, ReasonCode, StepRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseCapacity:
    """What one GPU of a pool serves under the SLA at the forecast shape."""

    tokens_per_s_per_gpu: float
    latency_ms: float  # TTFT for prefill, ITL for decode, at that operating point
    sla_met: bool


class ThroughputPerfModel(Protocol):
    """Engine capacity queries the throughput loop needs. Queries never change the model."""

    def prefill_capacity(self, *, isl: float, ttft_ms: float) -> PhaseCapacity: ...

    def decode_capacity(self, *, isl: float, osl: float, itl_ms: float) -> PhaseCapacity: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputTargets:
    """Sizing parameters taken from the config."""

    ttft_ms: float
    itl_ms: float
    window_s: float
    prefill_gpus_per_engine: int
    decode_gpus_per_engine: int


def calculate_replicas(
    component: Component,
    prediction: Prediction,
    targets: ThroughputTargets,
    perf: ThroughputPerfModel,
) -> tuple[int, list[StepRecord]]:
    """Replicas one pool needs for the forecast demand, before any bound.

    Args:
        component: the pool to size.
        prediction: forecast requests per window and mean ISL/OSL (tokens).
        targets: SLA targets (ms), window length (s) and GPUs per engine.
        perf: the engine perf model.

    Returns:
        `ceil(demand_tokens_per_s / (tokens_per_s_per_gpu * gpus_per_engine))` and the steps explaining it.
    """
    steps: list[StepRecord] = []
    if component is Component.PREFILL:
        demand_tokens_per_s = prediction.num_req * prediction.isl / targets.window_s
        capacity = perf.prefill_capacity(isl=prediction.isl, ttft_ms=targets.ttft_ms)
        gpus, latency_name, target_ms = targets.prefill_gpus_per_engine, "TTFT", targets.ttft_ms
    else:
        demand_tokens_per_s = prediction.num_req * prediction.osl / targets.window_s
        capacity = perf.decode_capacity(isl=prediction.isl, osl=prediction.osl, itl_ms=targets.itl_ms)
        gpus, latency_name, target_ms = targets.decode_gpus_per_engine, "ITL", targets.itl_ms
    engine_tokens_per_s = capacity.tokens_per_s_per_gpu * gpus
    steps.append(
        StepRecord(
            step="capacity",
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
            step="demand",
            component=component,
            value=desired,
            reason=ReasonCode.DEMAND_SIZED,
            detail=f"ceil({demand_tokens_per_s:.0f} / {engine_tokens_per_s:.0f}) = {desired}",
        )
    )
    return desired, steps
