"""Clamps applied to replica proposals. Each returns the new value and a `StepRecord` with its reason code."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from planner_core.config import PlannerConfig, managed_components
from planner_core.domain import Component, ReasonCode, StepName, StepRecord


def bound_min_endpoint(component: Component, desired: int, floor: int) -> tuple[int, StepRecord]:
    """Raise `desired` to the pool's minimum endpoint count."""
    if desired < floor:
        return floor, StepRecord(
            step=StepName.MIN_ENDPOINT,
            component=component,
            value=floor,
            reason=ReasonCode.MIN_ENDPOINT_FLOOR,
            detail=f"{desired} raised to the minimum of {floor}",
        )
    return desired, StepRecord(
        step=StepName.MIN_ENDPOINT, component=component, value=desired, reason=ReasonCode.WITHIN_RANGE
    )


def bound_change_rate(component: Component, desired: int, current: int, max_delta: int) -> tuple[int, StepRecord]:
    """Limit the change from `current` to at most `max_delta` replicas per throughput tick."""
    capped = max(current - max_delta, min(current + max_delta, desired))
    if capped != desired:
        return capped, StepRecord(
            step=StepName.CHANGE_RATE,
            component=component,
            value=capped,
            reason=ReasonCode.DELTA_CAPPED,
            detail=f"{current} -> {desired} limited to {capped} (at most {max_delta} per tick)",
        )
    return desired, StepRecord(
        step=StepName.CHANGE_RATE, component=component, value=desired, reason=ReasonCode.WITHIN_RANGE
    )


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
            StepRecord(step=StepName.GPU_BUDGET, value=total, reason=ReasonCode.WITHIN_RANGE, detail=f"{total} GPUs"),
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
            step=StepName.GPU_BUDGET,
            value=new_total,
            reason=ReasonCode.GPU_BUDGET_CAPPED,
            detail=(
                f"{num_prefill}P+{num_decode}D need {total} GPUs > budget {max_gpu_budget}: "
                f"clamped to {new_prefill}P+{new_decode}D ({new_total} GPUs){over}"
            ),
        ),
    )


def min_endpoints(config: PlannerConfig) -> dict[Component, int]:
    """Each pool's minimum replicas under `config`."""
    return {
        Component.PREFILL: config.prefill_min_endpoint_effective,
        Component.DECODE: config.decode_min_endpoint_effective,
    }


def guard_config_budget(
    config: PlannerConfig,
    current: Mapping[Component, int],
    proposed: Mapping[Component, int],
    *,
    max_gpu_budget: int | None = None,
) -> tuple[dict[Component, int], StepRecord]:
    """`guard_gpu_budget` with the config's GPU widths, budget band and minimums, for the pools the mode manages
    (an unmanaged pool counts as empty). Returns the guarded targets of the managed pools and the step.
    `max_gpu_budget`: a ceiling in place of the config's (a fleet member's, `fleet_ceiling`)."""
    components = managed_components(config.mode)
    floors = min_endpoints(config)

    def pair(counts: Mapping[Component, int]) -> tuple[int, int]:
        prefill, decode = (counts[c] if c in components else 0 for c in (Component.PREFILL, Component.DECODE))
        return prefill, decode

    (num_prefill, num_decode), step = guard_gpu_budget(
        pair(current),
        pair(proposed),
        prefill_gpus=config.prefill_gpus_per_engine,
        decode_gpus=config.decode_gpus_per_engine,
        min_gpu_budget=config.min_gpu_budget,
        max_gpu_budget=config.max_gpu_budget if max_gpu_budget is None else max_gpu_budget,
        prefill_floor=floors[Component.PREFILL] if Component.PREFILL in components else 0,
        decode_floor=floors[Component.DECODE] if Component.DECODE in components else 0,
    )
    guarded = {Component.PREFILL: num_prefill, Component.DECODE: num_decode}
    return {c: guarded[c] for c in components}, step


def _gpus(pair: tuple[int, int], prefill_gpus: int, decode_gpus: int) -> int:
    return pair[0] * prefill_gpus + pair[1] * decode_gpus


def guard_gpu_budget(
    current: tuple[int, int],
    proposed: tuple[int, int],
    *,
    prefill_gpus: int,
    decode_gpus: int,
    min_gpu_budget: int,
    max_gpu_budget: int,
    prefill_floor: int,
    decode_floor: int,
) -> tuple[tuple[int, int], StepRecord]:
    """Fit a (prefill, decode) proposal into the GPU budget band without ever reversing its direction.

    The band is `[min_gpu_budget - tolerance, max_gpu_budget]` (-1 disables a side); `tolerance` is the GPU cost of
    the widest engine among the pools that change (among all pools on a hold), and only applies when both sides
    are set, so that a band narrower than one engine never traps the planner. Pools below their minimum count as
    at their minimum: the minimums win over the budget.
    - The proposal is in the band: it stands (`within_range`).
    - The current counts are outside the band: reconcile from the proposal, ignoring direction — proportionally
      down to the ceiling (`bound_gpu_budget`) or up to the floor (`ceil`, never shrinking a pool)
      (`gpu_budget_reconcile`).
    - Otherwise the result is the candidate between current and proposed closest to the proposal (`_closest_fit`:
      never past the proposal nor against it, a rebalance moves both legs or neither). When only the current
      counts fit, the proposal is held (`gpu_budget_guard_hold`); else the result is `gpu_budget_capped` (ceiling)
      or `gpu_budget_floored` (floor).
    """
    # A pool below its minimum is raised regardless of the budget (the minimums win), so never hold below it.
    current = (max(current[0], prefill_floor), max(current[1], decode_floor))
    tolerance = _tolerance(current, proposed, (prefill_gpus, decode_gpus), min_gpu_budget, max_gpu_budget)

    def in_band(pair: tuple[int, int]) -> bool:
        total = _gpus(pair, prefill_gpus, decode_gpus)
        above = max_gpu_budget >= 0 and total > max_gpu_budget
        below = min_gpu_budget >= 0 and total < min_gpu_budget - tolerance
        return not (above or below)

    proposed_gpus = _gpus(proposed, prefill_gpus, decode_gpus)
    low = "-" if min_gpu_budget < 0 else str(min_gpu_budget - tolerance)
    band = f"band [{low}, {'-' if max_gpu_budget < 0 else max_gpu_budget}]"
    if in_band(proposed):
        return proposed, StepRecord(
            step=StepName.GPU_BUDGET,
            value=proposed_gpus,
            reason=ReasonCode.WITHIN_RANGE,
            detail=f"{proposed[0]}P+{proposed[1]}D = {proposed_gpus} GPUs within {band}",
        )
    if not in_band(current):
        result = _reconcile(
            proposed, prefill_gpus, decode_gpus, min_gpu_budget, max_gpu_budget, prefill_floor, decode_floor
        )
        return result, StepRecord(
            step=StepName.GPU_BUDGET,
            value=_gpus(result, prefill_gpus, decode_gpus),
            reason=ReasonCode.GPU_BUDGET_RECONCILE,
            detail=(
                f"current {current[0]}P+{current[1]}D is outside the {band}: proposal {proposed[0]}P+{proposed[1]}D "
                f"reconciled to {result[0]}P+{result[1]}D"
            ),
        )

    result = _closest_fit(current, proposed, in_band, (prefill_gpus, decode_gpus), (prefill_floor, decode_floor))
    if result == current:
        reason = ReasonCode.GPU_BUDGET_GUARD_HOLD
    elif max_gpu_budget >= 0 and proposed_gpus > max_gpu_budget:
        reason = ReasonCode.GPU_BUDGET_CAPPED
    else:
        reason = ReasonCode.GPU_BUDGET_FLOORED
    return result, StepRecord(
        step=StepName.GPU_BUDGET,
        value=_gpus(result, prefill_gpus, decode_gpus),
        reason=reason,
        detail=(
            f"{proposed[0]}P+{proposed[1]}D ({proposed_gpus} GPUs) is outside the {band}: "
            f"{'held at' if result == current else 'moved from'} {current[0]}P+{current[1]}D"
            + ("" if result == current else f" to {result[0]}P+{result[1]}D")
        ),
    )


def _tolerance(
    current: tuple[int, int],
    proposed: tuple[int, int],
    widths: tuple[int, int],
    min_gpu_budget: int,
    max_gpu_budget: int,
) -> int:
    """The GPUs the band's low side yields (`guard_gpu_budget`): the widest engine among the pools that change, or
    among all pools on a hold; none unless both sides of the band are set."""
    pools = ((current[0], proposed[0], widths[0]), (current[1], proposed[1], widths[1]))
    # A hold is judged with the widest engine: otherwise a band narrower than one engine would force a reconcile.
    changing = [gpus for now, want, gpus in pools if now != want] or [gpus for _, _, gpus in pools]
    return max(changing) if min_gpu_budget >= 0 and max_gpu_budget >= 0 else 0


def _closest_fit(
    current: tuple[int, int],
    proposed: tuple[int, int],
    in_band: Callable[[tuple[int, int]], bool],
    widths: tuple[int, int],
    floors: tuple[int, int],
) -> tuple[int, int]:
    """The candidate between current and proposed (per pool, inclusive) that fits the band and the (prefill,
    decode) minimums `floors`, closest to the proposal in GPUs (`widths`: GPUs per engine), then closest in prefill
    share, then furthest from current, then first in scan order (fewest prefill, then fewest decode). Unlike a
    proportional clamp, this never moves a pool past its proposal or against it; a down proposal stops at the floor
    rather than being refused outright. A rebalance (one pool up, the other down) moves both legs or neither.
    `current` when no other candidate fits (`guard_gpu_budget`)."""
    prefill_gpus, decode_gpus = widths

    def between(a: int, b: int) -> range:
        return range(min(a, b), max(a, b) + 1)

    proposed_gpus = _gpus(proposed, prefill_gpus, decode_gpus)
    rebalance = (proposed[0] - current[0]) * (proposed[1] - current[1]) < 0
    share = proposed[0] * prefill_gpus / proposed_gpus if proposed_gpus else 0.0
    best: tuple[tuple[float, float, int, int], tuple[int, int]] | None = None
    for num_prefill in between(current[0], proposed[0]):
        for num_decode in between(current[1], proposed[1]):
            pair = (num_prefill, num_decode)
            if not in_band(pair) or num_prefill < floors[0] or num_decode < floors[1]:
                continue
            if rebalance and pair != current and (num_prefill == current[0] or num_decode == current[1]):
                continue  # both legs of a rebalance or neither
            total = _gpus(pair, prefill_gpus, decode_gpus)
            distance = abs(num_prefill - proposed[0]) * prefill_gpus + abs(num_decode - proposed[1]) * decode_gpus
            # rounded so that mirror-image candidates tie exactly and the scan order decides
            skew = round(abs((num_prefill * prefill_gpus / total if total else 0.0) - share), 9)
            progress = abs(num_prefill - current[0]) * prefill_gpus + abs(num_decode - current[1]) * decode_gpus
            key = (distance, skew, -progress, total)
            if best is None or key < best[0]:
                best = (key, pair)
    return current if best is None else best[1]


def _reconcile(
    proposed: tuple[int, int],
    prefill_gpus: int,
    decode_gpus: int,
    min_gpu_budget: int,
    max_gpu_budget: int,
    prefill_floor: int,
    decode_floor: int,
) -> tuple[int, int]:
    """Bring a proposal into the band proportionally: down to the ceiling or up to the floor."""
    total = _gpus(proposed, prefill_gpus, decode_gpus)
    if max_gpu_budget >= 0 and total > max_gpu_budget:
        num_prefill, num_decode, _ = bound_gpu_budget(
            proposed[0],
            proposed[1],
            prefill_gpus=prefill_gpus,
            decode_gpus=decode_gpus,
            max_gpu_budget=max_gpu_budget,
            prefill_floor=prefill_floor,
            decode_floor=decode_floor,
        )
        return num_prefill, num_decode
    if min_gpu_budget >= 0 and 0 < total < min_gpu_budget:  # an all-zero proposal has no proportions to grow
        scale = min_gpu_budget / total
        grown = (math.ceil(proposed[0] * scale), max(proposed[1], math.ceil(proposed[1] * scale)))
        if max_gpu_budget >= 0 and _gpus(grown, prefill_gpus, decode_gpus) > max_gpu_budget:
            return _reconcile(grown, prefill_gpus, decode_gpus, -1, max_gpu_budget, prefill_floor, decode_floor)
        return grown
    return proposed


def fleet_ceiling(
    config: PlannerConfig, current: Mapping[Component, int], targets: Mapping[Component, int], ceiling_gpus: int
) -> tuple[dict[Component, int], StepRecord]:
    """A fleet member's targets fitted under its fleet ceiling (`TickInputs.gpu_ceiling`) by the same guard as the
    config's budget, never forcing a pool below its current count: the ceiling is raised to the GPUs the current
    counts hold, so it only stops growth (the arbitration decides who shrinks, not this tick). The targets fit
    the config's own budget already (`guard_config_budget` ran first). Step `fleet_ceiling`, reason
    `fleet_ceiling_capped` when it cut a target, `within_range` otherwise."""
    components = managed_components(config.mode)
    widths = {Component.PREFILL: config.prefill_gpus_per_engine, Component.DECODE: config.decode_gpus_per_engine}
    current_gpus = sum(current[c] * widths[c] for c in components)
    ceiling = max(ceiling_gpus, current_gpus)
    wanted_gpus = sum(targets[c] * widths[c] for c in components)
    if wanted_gpus <= ceiling:
        return dict(targets), StepRecord(
            step=StepName.FLEET_CEILING,
            value=ceiling,
            reason=ReasonCode.WITHIN_RANGE,
            detail=f"{wanted_gpus} GPUs within the fleet ceiling {ceiling} (granted + unallocated {ceiling_gpus})",
        )
    capped, _ = guard_config_budget(config, current, targets, max_gpu_budget=ceiling)
    before = ", ".join(f"{c.value} {targets[c]}" for c in components)
    after = ", ".join(f"{c.value} {capped[c]}" for c in components)
    return capped, StepRecord(
        step=StepName.FLEET_CEILING,
        value=ceiling,
        reason=ReasonCode.FLEET_CEILING_CAPPED,
        detail=(
            f"{before} ({wanted_gpus} GPUs) cut to {after} under the fleet ceiling {ceiling} GPUs "
            f"(granted + unallocated {ceiling_gpus}, current {current_gpus})"
        ),
    )
