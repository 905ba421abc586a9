"""Clamps applied to replica proposals. Each returns the new value and a `StepRecord` with its reason code."""

from __future__ import annotations

import math

from planner_core.domain import Component, ReasonCode, StepRecord


def bound_min_endpoint(component: Component, desired: int, floor: int) -> tuple[int, StepRecord]:
    """Raise `desired` to the pool's minimum endpoint count."""
    if desired < floor:
        return floor, StepRecord(
            step="min_endpoint",
            component=component,
            value=floor,
            reason=ReasonCode.MIN_ENDPOINT_FLOOR,
            detail=f"{desired} raised to the minimum of {floor}",
        )
    return desired, StepRecord(step="min_endpoint", component=component, value=desired, reason=ReasonCode.WITHIN_RANGE)


def bound_change_rate(component: Component, desired: int, current: int, max_delta: int) -> tuple[int, StepRecord]:
    """Limit the change from `current` to at most `max_delta` replicas per throughput tick."""
    capped = max(current - max_delta, min(current + max_delta, desired))
    if capped != desired:
        return capped, StepRecord(
            step="change_rate",
            component=component,
            value=capped,
            reason=ReasonCode.DELTA_CAPPED,
            detail=f"{current} -> {desired} limited to {capped} (at most {max_delta} per tick)",
        )
    return desired, StepRecord(step="change_rate", component=component, value=desired, reason=ReasonCode.WITHIN_RANGE)


def bound_gpu_budget(
    num_prefill: int,
    num_decode: int,
    *,
    prefill_gpus: int,
    decode_gpus: int,
    max_gpu_budget: int,
    prefill_floor: int,
    decode_floor: int,
) -> tuple[int, int, StepRecord]:
    """Scale both pools down proportionally when their GPUs exceed `max_gpu_budget` (-1 disables).

    Prefill is scaled first and keeps room for decode's minimum,
    `num_p = max(floor_p, min(floor(num_p * budget / total), floor((budget - floor_d * gpus_d) / gpus_p)))`,
    and decode gets what remains, `num_d = max(floor_d, floor((budget - num_p * gpus_p) / gpus_d))`.
    Flooring (Dynamo 0.x rounded) keeps the result within the budget whenever the minimums fit it; when they
    do not, the minimums win and the step says so.
    """
    total = num_prefill * prefill_gpus + num_decode * decode_gpus
    if max_gpu_budget < 0 or total <= max_gpu_budget:
        return (
            num_prefill,
            num_decode,
            StepRecord(step="gpu_budget", value=total, reason=ReasonCode.WITHIN_RANGE, detail=f"{total} GPUs"),
        )
    scale = max_gpu_budget / total
    room_for_prefill = (max_gpu_budget - decode_floor * decode_gpus) // prefill_gpus
    new_prefill = max(prefill_floor, min(math.floor(num_prefill * scale), room_for_prefill))
    new_decode = max(decode_floor, (max_gpu_budget - new_prefill * prefill_gpus) // decode_gpus)
    if num_decode == 0 and decode_floor == 0:
        new_decode = 0  # a pool the mode does not manage stays empty
    new_total = new_prefill * prefill_gpus + new_decode * decode_gpus
    over = " (the minimum endpoints alone exceed the budget)" if new_total > max_gpu_budget else ""
    return (
        new_prefill,
        new_decode,
        StepRecord(
            step="gpu_budget",
            value=new_total,
            reason=ReasonCode.GPU_BUDGET_CAPPED,
            detail=(
                f"{num_prefill}P+{num_decode}D need {total} GPUs > budget {max_gpu_budget}: "
                f"clamped to {new_prefill}P+{new_decode}D ({new_total} GPUs){over}"
            ),
        ),
    )
