"""What the load loop's policies share: the fleet a load tick sees, its preconditions, and the final bounds.

A load policy proposes one pool's replicas from the latest forward-pass metrics (FPM) of each engine. Before a
policy looks at the numbers, the fleet must be stable and fully reporting (`observe_fleet`), checked in this order:

1. a scale in flight (expected != ready in any pool the planner manages; as Dynamo does for disaggregated
   deployments, a scale of one pool holds both) -> hold, `scaling_in_progress`. A pool the planner does not manage
   (the prefill pool of a decode-only or aggregated planner) never holds it: its counts belong to someone else
   and may never settle as far as this planner can see;
2. no metrics from the pool -> hold, `no_fpm_data`;
3. the workers reporting metrics are not as many as the ready workers, or they report different attention-DP
   ranks -> hold, `worker_count_mismatch`.

Idle heartbeats (wall time 0) count as reports: an idle engine is the clearest "no load" signal there is, and
dropping it would hold every scale-down at zero load.

After a policy's signal (one step up, one step down, or none), `finalize_load_proposal` raises it to the throughput
floor and the minimum endpoint and names the headline reason with Dynamo's load decision names. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_core.domain import Component, ForwardPassMetrics, ReasonCode, StepName, StepRecord, WorkerCounts
from planner_core.policy.bounds import bound_min_endpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineMetrics:
    """One worker's engine: the latest forward-pass metrics of each of its attention-DP ranks, by rank."""

    worker_id: str
    ranks: tuple[ForwardPassMetrics, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """A pool that passed the preconditions: `num_workers` ready workers, each reporting every DP rank."""

    component: Component
    num_workers: int
    engines: tuple[EngineMetrics, ...]  # sorted by worker id

    @property
    def all_ranks(self) -> tuple[ForwardPassMetrics, ...]:
        """Every rank's metrics of every worker, worker by worker."""
        return tuple(fpm for engine in self.engines for fpm in engine.ranks)


def latest_per_engine(component: Component, fpm: tuple[ForwardPassMetrics, ...]) -> tuple[EngineMetrics, ...]:
    """Group a pool's metrics by worker, keeping per (worker, DP rank) the report with the highest counter.

    Metrics of other pools are ignored; on equal counters the later report in `fpm` wins.
    """
    latest: dict[tuple[str, int], ForwardPassMetrics] = {}
    for report in fpm:
        if report.component is not component:
            continue
        key = (report.worker_id, report.dp_rank)
        kept = latest.get(key)
        if kept is None or report.counter_id >= kept.counter_id:
            latest[key] = report
    workers = sorted({worker_id for worker_id, _ in latest})
    return tuple(
        EngineMetrics(
            worker_id=worker_id,
            ranks=tuple(latest[key] for key in sorted(k for k in latest if k[0] == worker_id)),
        )
        for worker_id in workers
    )


BOTH_POOLS = (Component.PREFILL, Component.DECODE)


def scale_in_flight(workers: WorkerCounts, managed: tuple[Component, ...] = BOTH_POOLS) -> str | None:
    """Why a scale is in flight in one of the `managed` pools (expected != ready), or None when all are settled.

    Returns:
        e.g. "expected != ready: prefill 1/2, decode 3/3 ready" (managed pools only).
    """
    if all(workers.ready(c) == workers.expected(c) for c in managed):
        return None
    shown = ", ".join(f"{c.value} {workers.ready(c)}/{workers.expected(c)}" for c in managed)
    return f"expected != ready: {shown} ready"


def observe_fleet(
    component: Component,
    fpm: tuple[ForwardPassMetrics, ...],
    workers: WorkerCounts,
    *,
    managed: tuple[Component, ...] = BOTH_POOLS,
) -> tuple[Fleet | None, StepRecord]:
    """Check the load loop's preconditions for one pool.

    Args:
        component: the pool (DECODE for aggregated mode's single pool).
        fpm: forward-pass metrics of the tick, the latest per (worker, DP rank); other pools' reports are ignored.
        workers: ready and expected workers of every pool.
        managed: the pools the planner scales (`config.managed_components`); a scale in flight in any of them
            holds `component`, one in another pool does not.

    Returns:
        The fleet and an `observed` step, or None and a step whose reason says why the pool is held
        (`scaling_in_progress`, `no_fpm_data`, `worker_count_mismatch`).
    """
    in_flight = scale_in_flight(workers, managed)
    if in_flight is not None:
        return None, StepRecord(
            step=StepName.FLEET,
            component=component,
            value=workers.expected(component),
            reason=ReasonCode.SCALING_IN_PROGRESS,
            detail=in_flight,
        )
    engines = latest_per_engine(component, fpm)
    ready = workers.ready(component)
    if not engines:
        return None, StepRecord(
            step=StepName.FLEET,
            component=component,
            value=0,
            reason=ReasonCode.NO_FPM_DATA,
            detail=f"no forward-pass metrics from the {component.value} engines ({ready} ready)",
        )
    if len(engines) != ready:
        return None, StepRecord(
            step=StepName.FLEET,
            component=component,
            value=len(engines),
            reason=ReasonCode.WORKER_COUNT_MISMATCH,
            detail=f"{len(engines)} workers report metrics, {ready} are ready",
        )
    rank_sets = {engine.worker_id: tuple(r.dp_rank for r in engine.ranks) for engine in engines}
    if len(set(rank_sets.values())) > 1:
        shown = ", ".join(f"{worker} {list(ranks)}" for worker, ranks in rank_sets.items())
        return None, StepRecord(
            step=StepName.FLEET,
            component=component,
            value=len(engines),
            reason=ReasonCode.WORKER_COUNT_MISMATCH,
            detail=f"workers report different DP ranks: {shown}",
        )
    num_ranks = sum(len(engine.ranks) for engine in engines)
    return Fleet(component=component, num_workers=ready, engines=engines), StepRecord(
        step=StepName.FLEET,
        component=component,
        value=ready,
        reason=ReasonCode.OBSERVED,
        detail=f"{ready} workers ({num_ranks} engine ranks) report",
    )


# Which headline wins when several pools are decided together (Dynamo's priority: the most telling first).
_HEADLINE_PRIORITY = {
    ReasonCode.SCALE_UP: 4,
    ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT: 3,
    ReasonCode.SCALE_DOWN: 2,
    ReasonCode.NO_CHANGE: 0,
}


def combine_headlines(reasons: tuple[ReasonCode, ...]) -> ReasonCode:
    """The headline of a tick that decided several pools: scale_up, then capped, then scale_down, then any
    other reason (e.g. a refusal or a hold) before no_change."""
    if not reasons:
        return ReasonCode.NO_CHANGE
    return max(reasons, key=lambda reason: _HEADLINE_PRIORITY.get(reason, 1))


def finalize_load_proposal(
    component: Component,
    *,
    current: int,
    signal: int,
    signal_reason: ReasonCode,
    lower_bound: int | None,
    min_endpoint: int,
) -> tuple[int, list[StepRecord]]:
    """Bound a load signal and name the decision.

    `desired = max(signal, lower_bound, min_endpoint)`. The signal itself moves by at most one replica; the floors
    may lift further (the throughput loop already rate-limited its bound).

    Args:
        component: the pool.
        current: its ready workers N.
        signal: the policy's proposal (N-1, N or N+1).
        signal_reason: why the policy proposed it; becomes the headline when nothing changes (e.g. a refusal).
        lower_bound: the throughput loop's floor for the pool; None when the throughput loop is off.
        min_endpoint: the pool's minimum replicas.

    Returns:
        The desired replicas and the steps: `throughput_floor` (if a bound is given), `min_endpoint`, and
        `load_decision`, whose reason is the headline: `scale_up`, `scale_down`, `scale_down_capped_by_throughput`
        (the floor blocked a scale-down), or `signal_reason` / `no_change` when nothing changes.
    """
    steps: list[StepRecord] = []
    value = signal
    floor_capped = False
    if lower_bound is not None:
        if value < lower_bound:
            floor_capped = signal < current and lower_bound <= current
            steps.append(
                StepRecord(
                    step=StepName.THROUGHPUT_FLOOR,
                    component=component,
                    value=lower_bound,
                    reason=(
                        ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT
                        if floor_capped
                        else ReasonCode.RAISED_TO_THROUGHPUT_FLOOR
                    ),
                    detail=f"load proposal {signal} raised to the throughput floor {lower_bound}",
                )
            )
            value = lower_bound
        else:
            steps.append(
                StepRecord(
                    step=StepName.THROUGHPUT_FLOOR,
                    component=component,
                    value=value,
                    reason=ReasonCode.WITHIN_RANGE,
                    detail=f"at or above the throughput floor {lower_bound}",
                )
            )
    value, min_step = bound_min_endpoint(component, value, min_endpoint)
    steps.append(min_step)
    if value > current:
        headline = ReasonCode.SCALE_UP
    elif value < current:
        headline = ReasonCode.SCALE_DOWN
    elif floor_capped:
        headline = ReasonCode.SCALE_DOWN_CAPPED_BY_THROUGHPUT
    elif signal_reason in (ReasonCode.SCALE_UP, ReasonCode.SCALE_DOWN):
        headline = ReasonCode.NO_CHANGE  # a scale-down undone by the minimum endpoint: nothing changes
    else:
        headline = signal_reason
    steps.append(
        StepRecord(
            step=StepName.LOAD_DECISION,
            component=component,
            value=value,
            reason=headline,
            detail=f"{current} -> {value}",
        )
    )
    return value, steps
