"""The GPU budget guard: band with tolerance, directional search, rebalance legs, reconcile from out of band."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import ReasonCode
from planner_core.policy.bounds import guard_gpu_budget


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardCase:
    id: str
    current: tuple[int, int]
    proposed: tuple[int, int]
    gpus: tuple[int, int] = (1, 1)  # GPUs per prefill / decode engine
    band: tuple[int, int] = (-1, 8)  # (min_gpu_budget, max_gpu_budget); -1 disables a side
    floors: tuple[int, int] = (1, 1)
    want: tuple[int, int]
    want_reason: ReasonCode


GUARD_CASES = [
    GuardCase(
        id="in-band",
        current=(2, 2),
        proposed=(3, 5),  # 8 GPUs <= 8
        want=(3, 5),
        want_reason=ReasonCode.WITHIN_RANGE,
    ),
    GuardCase(
        id="no-budget",
        current=(2, 2),
        proposed=(30, 50),
        band=(-1, -1),
        want=(30, 50),
        want_reason=ReasonCode.WITHIN_RANGE,
    ),
    # From 2P+2D towards 6P+6D under 8 GPUs: 4P+4D is 4 GPUs from the proposal, like 3P+5D and 5P+3D, and it keeps
    # the proposal's 50 % prefill share exactly.
    GuardCase(
        id="partial-up-under-ceiling",
        current=(2, 2),
        proposed=(6, 6),
        want=(4, 4),
        want_reason=ReasonCode.GPU_BUDGET_CAPPED,
    ),
    # Already at the ceiling and only growing: nothing between 4P+4D and 5P+6D fits 8 GPUs but 4P+4D itself.
    GuardCase(
        id="held-at-ceiling",
        current=(4, 4),
        proposed=(5, 6),
        want=(4, 4),
        want_reason=ReasonCode.GPU_BUDGET_GUARD_HOLD,
    ),
    # Rebalance at the ceiling: prefill 4 -> 2, decode 4 -> 8 (10 GPUs). Moving both legs: 2P+6D = 8 GPUs is 2 away
    # from the proposal (3P+5D is 4 away); prefill never goes below the proposed 2 and decode never above 8.
    GuardCase(
        id="rebalance-both-legs",
        current=(4, 4),
        proposed=(2, 8),
        want=(2, 6),
        want_reason=ReasonCode.GPU_BUDGET_CAPPED,
    ),
    # Rebalance that cannot fit with both legs: 1-GPU prefill, 4-GPU decode, 3P+1D = 7 GPUs at a ceiling of 7.
    # 2P+2D = 10 does not fit; the prefill leg alone (2P+1D) would, but a rebalance moves both legs or neither.
    GuardCase(
        id="rebalance-neither-leg",
        current=(3, 1),
        proposed=(2, 2),
        gpus=(1, 4),
        band=(-1, 7),
        want=(3, 1),
        want_reason=ReasonCode.GPU_BUDGET_GUARD_HOLD,
    ),
    # Floor 8 with tolerance 1 (largest engine among changing pools): band [7, 16]. From 4P+4D towards 2P+2D the
    # closest candidates at >= 7 GPUs are 3P+4D and 4P+3D (3 away, same share skew); the first in scan order wins.
    GuardCase(
        id="down-stops-at-floor",
        current=(4, 4),
        proposed=(2, 2),
        band=(8, 16),
        want=(3, 4),
        want_reason=ReasonCode.GPU_BUDGET_FLOORED,
    ),
    # At the floor already (8 GPUs, band [7, 16] with tolerance 1): 4P+3D = 7 is still in the band.
    GuardCase(
        id="down-within-tolerance",
        current=(4, 4),
        proposed=(4, 3),
        band=(8, 16),
        want=(4, 3),
        want_reason=ReasonCode.WITHIN_RANGE,
    ),
    # Tolerance is the largest engine that changes: 4-GPU decode going 2 -> 1 gives band [12 - 4, 20] = [8, 20];
    # 4P+1D = 8 GPUs stands.
    GuardCase(
        id="tolerance-of-a-wide-engine",
        current=(4, 2),
        proposed=(4, 1),
        gpus=(1, 4),
        band=(12, 20),
        want=(4, 1),
        want_reason=ReasonCode.WITHIN_RANGE,
    ),
    # Current 10P+10D is above the 16-GPU ceiling: reconcile proportionally from the proposal (scale 16/20:
    # prefill floor(8) = 8, decode gets 16 - 8 = 8), whatever the direction.
    GuardCase(
        id="reconcile-above-ceiling",
        current=(10, 10),
        proposed=(10, 10),
        band=(-1, 16),
        want=(8, 8),
        want_reason=ReasonCode.GPU_BUDGET_RECONCILE,
    ),
    # Current 2P+2D = 4 is below the floor 10 - 1: grow the proposal 2P+3D by 10/5 = 2 -> ceil(4) = 4P, 6D.
    GuardCase(
        id="reconcile-below-floor",
        current=(2, 2),
        proposed=(2, 3),
        band=(10, 20),
        want=(4, 6),
        want_reason=ReasonCode.GPU_BUDGET_RECONCILE,
    ),
    # A pool below its minimum is raised before the guard: current 0P counts as the floor 1P.
    GuardCase(
        id="below-minimum-is-raised",
        current=(0, 4),
        proposed=(1, 4),
        band=(-1, 5),
        want=(1, 4),
        want_reason=ReasonCode.WITHIN_RANGE,
    ),
]


@pytest.mark.parametrize("case", GUARD_CASES, ids=lambda c: c.id)
def test_guard_gpu_budget(case: GuardCase) -> None:
    result, step = guard_gpu_budget(
        case.current,
        case.proposed,
        prefill_gpus=case.gpus[0],
        decode_gpus=case.gpus[1],
        min_gpu_budget=case.band[0],
        max_gpu_budget=case.band[1],
        prefill_floor=case.floors[0],
        decode_floor=case.floors[1],
    )
    assert result == case.want
    assert step.reason is case.want_reason
    assert step.value == result[0] * case.gpus[0] + result[1] * case.gpus[1]


counts = st.integers(min_value=1, max_value=12)
engine_gpus = st.integers(min_value=1, max_value=4)


@settings(max_examples=300, deadline=None)
@given(
    current=st.tuples(counts, counts),
    proposed=st.tuples(counts, counts),
    gpus=st.tuples(engine_gpus, engine_gpus),
    max_gpu_budget=st.integers(min_value=2, max_value=60),
    min_gpu_budget=st.integers(min_value=-1, max_value=60),
)
def test_property_guard_never_reverses_and_respects_the_band(
    current: tuple[int, int],
    proposed: tuple[int, int],
    gpus: tuple[int, int],
    max_gpu_budget: int,
    min_gpu_budget: int,
) -> None:
    """From a current state inside the band, each pool moves only towards its proposal, never past it, and the
    result never exceeds the ceiling; the minimums always hold."""
    min_gpu_budget = min(min_gpu_budget, max_gpu_budget)
    current_gpus = current[0] * gpus[0] + current[1] * gpus[1]
    result, _ = guard_gpu_budget(
        current,
        proposed,
        prefill_gpus=gpus[0],
        decode_gpus=gpus[1],
        min_gpu_budget=min_gpu_budget,
        max_gpu_budget=max_gpu_budget,
        prefill_floor=1,
        decode_floor=1,
    )
    assert result[0] >= 1 and result[1] >= 1
    changing = [g for now, want, g in zip(current, proposed, gpus, strict=True) if now != want] or list(gpus)
    if current_gpus > max_gpu_budget or (min_gpu_budget >= 0 and current_gpus < min_gpu_budget - max(changing)):
        return  # out of band: reconciled, direction is not guarded
    for now, want, got in zip(current, proposed, result, strict=True):
        assert min(now, want) <= got <= max(now, want)
    assert result[0] * gpus[0] + result[1] * gpus[1] <= max_gpu_budget


def test_a_budget_that_forbids_a_pools_first_scale_up_is_a_warning_naming_the_pool() -> None:
    """`budget_warnings`: valid configs whose GPU budget leaves less than one more engine above the minimums get
    one line per pool that can never grow (printed at start by serve and demo, recorded by serve); a budget with
    room, or none, gets nothing."""
    from pathlib import Path

    from planner_core.config import parse_config
    from planner_core.planner import budget_warnings

    def warnings(**fields: object) -> tuple[str, ...]:
        body = {"optimization_target": "sla", "mode": "disagg", "ttft_ms": 500, "itl_ms": 50, **fields}
        return budget_warnings(parse_config(body, "p.yaml").policy, Path("p.yaml"))

    assert warnings(max_gpu_budget=8) == () and warnings(max_gpu_budget=-1) == ()
    assert warnings(max_gpu_budget=3) == ()  # one GPU above the minimums: either pool can grow by one engine
    prefill, decode = warnings(max_gpu_budget=2)
    assert prefill == (
        "p.yaml: field 'max_gpu_budget' = 2: the prefill pool cannot scale up from its minimum of 1 (an engine "
        "takes 1 GPU; the minimums take 2, 0 left): every scale-up it needs will be capped"
    )
    assert decode.startswith("p.yaml: field 'max_gpu_budget' = 2: the decode pool cannot scale up")
    # decode engines of 2 GPUs: one GPU left above 1P + 1D lets prefill grow, never decode
    (only,) = warnings(max_gpu_budget=4, decode_engine_num_gpu=2)
    assert "the decode pool cannot scale up from its minimum of 1 (an engine takes 2 GPUs; the minimums take 3, " in (
        only
    )
    assert warnings(max_gpu_budget=2, mode="agg") == ()  # aggregated: one pool of 1 engine, one GPU left
    assert len(warnings(max_gpu_budget=1, mode="agg")) == 1
