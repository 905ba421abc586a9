"""One GPU budget for a fleet: decide how many GPUs each managed deployment may use when their proposals together
exceed the fleet's budget.

Pure and deterministic: no clock, no I/O, no hidden state, and the result does not depend on the order of the
claims (ties are broken by deployment name). The fleet flow records the `ArbitrationRound` (budget and claims)
with the grants, so `arbitrate(round) == recorded grants` replays a round exactly.

The rules, in order:

1. Each claim's request is its proposal clamped into `[min_gpus, max_gpus]` (`raised_to_minimum`,
   `capped_at_maximum`).
2. Every deployment gets its minimum first, whatever the budget: the minimums win over the budget
   (`minimums_over_budget` on every grant when they alone do not fit).
3. What is left of the budget goes to priority tiers, highest `priority` first. A tier whose requests fit is
   granted in full (`granted`); the first tier that does not fit shares what is left by weighted fair share;
   the tiers below it keep their minimums (`preempted_by_priority`).
4. Weighted fair share is progressive filling, one GPU at a time: the next GPU goes to the claim whose grant
   above its minimum, plus that GPU, divided by its weight is smallest (ties: lower name). A claim stops at its
   request, so what it does not need goes to the others (`fair_share`, or `granted` when the claim got all it
   asked for anyway). Because a smaller budget's sequence of GPUs is a prefix of a larger budget's, a grant
   never shrinks when the budget grows.

Grants are whole GPUs: the fleet turns a grant into the deployment's GPU ceiling, and the deployment's own budget
guard (`planner_core.policy.bounds.guard_gpu_budget`) shapes its replicas under it.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass
from fractions import Fraction


class GrantReason(enum.StrEnum):
    """Why a deployment got the GPUs it got (stored in `arbitration_grants.reason`)."""

    GRANTED = "granted"  # the request (the proposal within min/max) in full
    RAISED_TO_MINIMUM = "raised_to_minimum"  # the proposal was below the minimum: the minimum, in full
    CAPPED_AT_MAXIMUM = "capped_at_maximum"  # the proposal was above the maximum: the maximum, in full
    FAIR_SHARE = "fair_share"  # less than requested: the weighted fair share of what was left in its tier
    PREEMPTED_BY_PRIORITY = "preempted_by_priority"  # only its minimum: higher tiers took the rest
    MINIMUMS_OVER_BUDGET = "minimums_over_budget"  # the minimums alone exceed the budget: every grant is its minimum


class ArbitrationError(ValueError):
    """A claim or budget that cannot be arbitrated (one line naming the deployment, the field and the value)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuClaim:
    """What one deployment asks of the fleet budget in one round (all in GPUs)."""

    deployment: str
    proposed_gpus: int  # what its planner decided (or what it runs now, when it decided no change)
    min_gpus: int = 0
    max_gpus: int | None = None  # None: no maximum of its own
    priority: int = 0  # higher is served first
    weight: float = 1.0  # share within its priority tier; > 0

    @property
    def request_gpus(self) -> int:
        """The proposal clamped into [min, max]."""
        ceiling = self.proposed_gpus if self.max_gpus is None else min(self.proposed_gpus, self.max_gpus)
        return max(self.min_gpus, ceiling)


@dataclass(frozen=True, slots=True, kw_only=True)
class ArbitrationRound:
    """One round's inputs: the fleet budget and every member's claim."""

    budget_gpus: int
    claims: tuple[GpuClaim, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuGrant:
    """One deployment's result: the GPUs it may use and why."""

    deployment: str
    proposed_gpus: int
    request_gpus: int
    granted_gpus: int
    reason: GrantReason


def validate_round(arbitration: ArbitrationRound) -> None:
    """Raise `ArbitrationError` (one line) for a negative budget, a duplicate name or a claim that does not fit."""
    if arbitration.budget_gpus < 0:
        raise ArbitrationError(f"fleet budget: budget_gpus must be >= 0, got {arbitration.budget_gpus}")
    seen: set[str] = set()
    for claim in arbitration.claims:
        where = f"deployment {claim.deployment!r}"
        if claim.deployment in seen:
            raise ArbitrationError(f"{where}: claimed twice in one round")
        seen.add(claim.deployment)
        if claim.proposed_gpus < 0:
            raise ArbitrationError(f"{where}: proposed_gpus must be >= 0, got {claim.proposed_gpus}")
        if claim.min_gpus < 0:
            raise ArbitrationError(f"{where}: min_gpus must be >= 0, got {claim.min_gpus}")
        if claim.max_gpus is not None and claim.max_gpus < claim.min_gpus:
            raise ArbitrationError(f"{where}: max_gpus {claim.max_gpus} is below min_gpus {claim.min_gpus}")
        if not claim.weight > 0 or claim.weight == float("inf"):
            raise ArbitrationError(f"{where}: weight must be a finite number > 0, got {claim.weight}")


def _full_reason(claim: GpuClaim) -> GrantReason:
    if claim.proposed_gpus < claim.min_gpus:
        return GrantReason.RAISED_TO_MINIMUM
    if claim.max_gpus is not None and claim.proposed_gpus > claim.max_gpus:
        return GrantReason.CAPPED_AT_MAXIMUM
    return GrantReason.GRANTED


def _fair_share(claims: list[GpuClaim], spare_gpus: int) -> dict[str, int]:
    """GPUs above the minimum for each claim of one tier: progressive filling by weight, `spare_gpus` in all."""
    extra = {claim.deployment: 0 for claim in claims}
    # The key of a claim's next GPU: (its extra after that GPU) / weight, exact (Fraction) so ties are real ties.
    heap = [
        (Fraction(1) / Fraction(claim.weight), claim.deployment, claim)
        for claim in claims
        if claim.request_gpus > claim.min_gpus
    ]
    heapq.heapify(heap)
    for _ in range(spare_gpus):
        if not heap:
            break
        _, name, claim = heapq.heappop(heap)
        extra[name] += 1
        if claim.min_gpus + extra[name] < claim.request_gpus:
            heapq.heappush(heap, (Fraction(extra[name] + 1) / Fraction(claim.weight), name, claim))
    return extra


def arbitrate(arbitration: ArbitrationRound) -> tuple[GpuGrant, ...]:
    """The grant of every claim, sorted by deployment name (see the module docstring for the rules).

    Raises:
        ArbitrationError: the round is invalid (`validate_round`).
    """
    validate_round(arbitration)
    claims = sorted(arbitration.claims, key=lambda claim: claim.deployment)

    def grant(claim: GpuClaim, gpus: int, reason: GrantReason) -> GpuGrant:
        return GpuGrant(
            deployment=claim.deployment,
            proposed_gpus=claim.proposed_gpus,
            request_gpus=claim.request_gpus,
            granted_gpus=gpus,
            reason=reason,
        )

    if sum(claim.request_gpus for claim in claims) <= arbitration.budget_gpus:
        return tuple(grant(claim, claim.request_gpus, _full_reason(claim)) for claim in claims)
    spare_gpus = arbitration.budget_gpus - sum(claim.min_gpus for claim in claims)
    if spare_gpus <= 0:
        return tuple(grant(claim, claim.min_gpus, GrantReason.MINIMUMS_OVER_BUDGET) for claim in claims)

    granted: dict[str, GpuGrant] = {}
    for priority in sorted({claim.priority for claim in claims}, reverse=True):
        tier = [claim for claim in claims if claim.priority == priority]
        wanted = sum(claim.request_gpus - claim.min_gpus for claim in tier)
        if spare_gpus == 0 and wanted > 0:
            for claim in tier:
                reason = (
                    GrantReason.PREEMPTED_BY_PRIORITY if claim.request_gpus > claim.min_gpus else _full_reason(claim)
                )
                granted[claim.deployment] = grant(claim, claim.min_gpus, reason)
        elif wanted <= spare_gpus:
            for claim in tier:
                granted[claim.deployment] = grant(claim, claim.request_gpus, _full_reason(claim))
            spare_gpus -= wanted
        else:
            extra = _fair_share(tier, spare_gpus)
            for claim in tier:
                gpus = claim.min_gpus + extra[claim.deployment]
                reason = _full_reason(claim) if gpus == claim.request_gpus else GrantReason.FAIR_SHARE
                granted[claim.deployment] = grant(claim, gpus, reason)
            spare_gpus = 0
    return tuple(granted[claim.deployment] for claim in claims)


def round_to_jsonable(arbitration: ArbitrationRound) -> dict:
    """The round as JSON values (what `arbitration_rounds.inputs` stores); `round_from_jsonable` inverts it."""
    return {
        "budget_gpus": arbitration.budget_gpus,
        "claims": [
            {
                "deployment": claim.deployment,
                "proposed_gpus": claim.proposed_gpus,
                "min_gpus": claim.min_gpus,
                "max_gpus": claim.max_gpus,
                "priority": claim.priority,
                "weight": claim.weight,  # a float round-trips exactly through JSONB
            }
            for claim in arbitration.claims
        ],
    }


def round_from_jsonable(data: dict) -> ArbitrationRound:
    """Inverse of `round_to_jsonable`."""
    return ArbitrationRound(
        budget_gpus=int(data["budget_gpus"]),
        claims=tuple(
            GpuClaim(
                deployment=str(claim["deployment"]),
                proposed_gpus=int(claim["proposed_gpus"]),
                min_gpus=int(claim["min_gpus"]),
                max_gpus=None if claim["max_gpus"] is None else int(claim["max_gpus"]),
                priority=int(claim["priority"]),
                weight=float(claim["weight"]),
            )
            for claim in data["claims"]
        ),
    )
