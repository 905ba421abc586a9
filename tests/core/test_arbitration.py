"""The fleet's GPU budget arbitration: a worked example, the reason codes, bad input, and its properties."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.policy.arbitration import (
    ArbitrationError,
    ArbitrationRound,
    GpuClaim,
    GrantReason,
    arbitrate,
)


def test_three_deployments_over_budget_worked_by_hand() -> None:
    """Budget 16 GPUs; proposals 6 + 10 + 8 = 24 GPUs, over budget by 8.

    | deployment | priority | weight | min | max | proposed |
    |------------|----------|--------|-----|-----|----------|
    | chat       | 2        | 1      | 2   | 8   | 6        |
    | batch      | 1        | 2      | 2   | 12  | 10       |
    | code       | 1        | 1      | 1   | 12  | 8        |

    1. Minimums first: 2 + 2 + 1 = 5 GPUs; 16 - 5 = 11 GPUs left.
    2. Priority 2 (chat) wants 6 - 2 = 4 more; 4 <= 11, so chat gets 6 in full (`granted`); 7 GPUs left.
    3. Priority 1 wants (10 - 2) + (8 - 1) = 15 more; only 7 left: weighted fair share, 2 : 1. The next GPU goes to
       the smallest (extra after it) / weight, ties to the lower name:
       GPU 1 batch 1/2; GPU 2 batch 2/2 = 1 (tie with code 1/1: "batch" < "code"); GPU 3 code 1/1;
       GPU 4 batch 3/2; GPU 5 batch 4/2 = 2 (tie with code 2/1, batch first); GPU 6 code 2/1; GPU 7 batch 5/2.
       batch: 2 + 5 = 7, code: 1 + 2 = 3 (the exact 2 : 1 split of 7 is 4.67 : 2.33).
    4. Total 6 + 7 + 3 = 16 = the budget.
    """
    grants = arbitrate(
        ArbitrationRound(
            budget_gpus=16,
            claims=(
                GpuClaim(deployment="chat", proposed_gpus=6, min_gpus=2, max_gpus=8, priority=2, weight=1.0),
                GpuClaim(deployment="batch", proposed_gpus=10, min_gpus=2, max_gpus=12, priority=1, weight=2.0),
                GpuClaim(deployment="code", proposed_gpus=8, min_gpus=1, max_gpus=12, priority=1, weight=1.0),
            ),
        )
    )
    assert [(g.deployment, g.granted_gpus, g.reason) for g in grants] == [
        ("batch", 7, GrantReason.FAIR_SHARE),
        ("chat", 6, GrantReason.GRANTED),
        ("code", 3, GrantReason.FAIR_SHARE),
    ]


@pytest.mark.parametrize(
    ("budget", "claims", "want"),
    [
        pytest.param(
            100,
            (
                GpuClaim(deployment="a", proposed_gpus=1, min_gpus=2),
                GpuClaim(deployment="b", proposed_gpus=9, max_gpus=4),
            ),
            [("a", 2, GrantReason.RAISED_TO_MINIMUM), ("b", 4, GrantReason.CAPPED_AT_MAXIMUM)],
            id="under-budget-clamped-to-min-max",
        ),
        pytest.param(
            3,
            (
                GpuClaim(deployment="a", proposed_gpus=5, min_gpus=2),
                GpuClaim(deployment="b", proposed_gpus=5, min_gpus=2),
            ),
            [("a", 2, GrantReason.MINIMUMS_OVER_BUDGET), ("b", 2, GrantReason.MINIMUMS_OVER_BUDGET)],
            id="minimums-win-over-budget",
        ),
        pytest.param(
            6,
            (
                GpuClaim(deployment="hi", proposed_gpus=5, min_gpus=1, priority=5),
                GpuClaim(deployment="lo", proposed_gpus=5, min_gpus=1, priority=0),
                GpuClaim(deployment="lo-small", proposed_gpus=1, min_gpus=1, priority=0),
            ),
            [
                ("hi", 4, GrantReason.FAIR_SHARE),  # 6 - 2 minimums below = 4: the top tier alone is short
                ("lo", 1, GrantReason.PREEMPTED_BY_PRIORITY),
                ("lo-small", 1, GrantReason.GRANTED),  # asked for its minimum only: nothing was taken from it
            ],
            id="priority-preempts",
        ),
        pytest.param(
            10,
            (
                GpuClaim(deployment="a", proposed_gpus=2, priority=1),
                GpuClaim(deployment="b", proposed_gpus=20, priority=1),
                GpuClaim(deployment="c", proposed_gpus=20, priority=1),
            ),
            [("a", 2, GrantReason.GRANTED), ("b", 4, GrantReason.FAIR_SHARE), ("c", 4, GrantReason.FAIR_SHARE)],
            id="fair-share-redistributes-what-a-small-claim-leaves",
        ),
    ],
)
def test_reasons(budget: int, claims: tuple[GpuClaim, ...], want: list[tuple[str, int, GrantReason]]) -> None:
    grants = arbitrate(ArbitrationRound(budget_gpus=budget, claims=claims))
    assert [(g.deployment, g.granted_gpus, g.reason) for g in grants] == want


@pytest.mark.parametrize(
    ("budget", "claim", "message"),
    [
        (-1, GpuClaim(deployment="a", proposed_gpus=1), "budget_gpus must be >= 0, got -1"),
        (4, GpuClaim(deployment="a", proposed_gpus=1, weight=0.0), "deployment 'a': weight must be"),
        (4, GpuClaim(deployment="a", proposed_gpus=1, min_gpus=3, max_gpus=2), "max_gpus 2 is below min_gpus 3"),
        (4, GpuClaim(deployment="a", proposed_gpus=-2), "proposed_gpus must be >= 0, got -2"),
    ],
)
def test_bad_input_is_one_line(budget: int, claim: GpuClaim, message: str) -> None:
    with pytest.raises(ArbitrationError, match=message):
        arbitrate(ArbitrationRound(budget_gpus=budget, claims=(claim,)))


def test_stored_reason_values_are_pinned() -> None:
    assert {reason.value for reason in GrantReason} == {
        "granted",
        "raised_to_minimum",
        "capped_at_maximum",
        "fair_share",
        "preempted_by_priority",
        "minimums_over_budget",
    }


@st.composite
def rounds(draw: st.DrawFn) -> ArbitrationRound:
    num = draw(st.integers(min_value=1, max_value=7))
    claims = []
    for index in range(num):
        min_gpus = draw(st.integers(min_value=0, max_value=6))
        max_gpus = draw(st.one_of(st.none(), st.integers(min_value=min_gpus, max_value=min_gpus + 20)))
        claims.append(
            GpuClaim(
                deployment=f"d{index}",
                proposed_gpus=draw(st.integers(min_value=0, max_value=30)),
                min_gpus=min_gpus,
                max_gpus=max_gpus,
                priority=draw(st.integers(min_value=0, max_value=2)),
                weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
            )
        )
    return ArbitrationRound(budget_gpus=draw(st.integers(min_value=0, max_value=120)), claims=tuple(claims))


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_properties_of_one_round(arbitration: ArbitrationRound) -> None:
    grants = arbitrate(arbitration)
    by_name = {claim.deployment: claim for claim in arbitration.claims}
    total_min = sum(claim.min_gpus for claim in arbitration.claims)
    total = sum(grant.granted_gpus for grant in grants)
    for grant in grants:
        claim = by_name[grant.deployment]
        assert claim.min_gpus <= grant.granted_gpus <= claim.request_gpus  # never below minimum, never above request
    if total_min <= arbitration.budget_gpus:
        assert total <= arbitration.budget_gpus  # never above the budget when the minimums fit
        # work-conserving: a GPU is left idle only when every request is met
        if total < arbitration.budget_gpus:
            assert all(grant.granted_gpus == grant.request_gpus for grant in grants)
    else:
        assert all(grant.granted_gpus == by_name[grant.deployment].min_gpus for grant in grants)
    # priority: a deployment above its minimum means every higher-priority deployment got its whole request
    for low in grants:
        if low.granted_gpus > by_name[low.deployment].min_gpus:
            for high in grants:
                if by_name[high.deployment].priority > by_name[low.deployment].priority:
                    assert high.granted_gpus == high.request_gpus
    # deterministic and independent of the claims' order (replayable)
    shuffled = dataclasses.replace(arbitration, claims=tuple(reversed(arbitration.claims)))
    assert arbitrate(shuffled) == grants == arbitrate(arbitration)


@settings(max_examples=300, deadline=None)
@given(rounds(), st.integers(min_value=1, max_value=20))
def test_monotone_in_budget(arbitration: ArbitrationRound, more_gpus: int) -> None:
    """More budget never takes a GPU from anyone."""
    before = arbitrate(arbitration)
    after = arbitrate(dataclasses.replace(arbitration, budget_gpus=arbitration.budget_gpus + more_gpus))
    for small, large in zip(before, after, strict=True):
        assert large.granted_gpus >= small.granted_gpus


@settings(max_examples=300, deadline=None)
@given(rounds(), st.data())
def test_monotone_in_own_proposal(arbitration: ArbitrationRound, data: st.DataObject) -> None:
    """Asking for more never gets a deployment fewer GPUs, and never gets any other deployment more."""
    index = data.draw(st.integers(min_value=0, max_value=len(arbitration.claims) - 1))
    claims = list(arbitration.claims)
    claims[index] = dataclasses.replace(
        claims[index], proposed_gpus=claims[index].proposed_gpus + data.draw(st.integers(1, 10))
    )
    before = {g.deployment: g.granted_gpus for g in arbitrate(arbitration)}
    after = {g.deployment: g.granted_gpus for g in arbitrate(dataclasses.replace(arbitration, claims=tuple(claims)))}
    name = claims[index].deployment
    assert after[name] >= before[name]
    assert all(after[other] <= before[other] for other in before if other != name)


@settings(max_examples=200, deadline=None)
@given(rounds())
def test_weighted_share_within_one_gpu(arbitration: ArbitrationRound) -> None:
    """Within the tier that shares, two cut claims' extras (above minimum) per weight differ by at most one GPU's
    worth of the other's weight: nobody is cut while another of its tier is far ahead."""
    grants = {g.deployment: g for g in arbitrate(arbitration)}
    cut = [c for c in arbitration.claims if grants[c.deployment].reason is GrantReason.FAIR_SHARE]
    for a in cut:
        for b in cut:
            extra_a = (grants[a.deployment].granted_gpus - a.min_gpus) / a.weight
            extra_b = (grants[b.deployment].granted_gpus - b.min_gpus) / b.weight
            assert extra_a <= extra_b + 1 / b.weight + 1e-9
