"""The fleet at the I/O edge: the registry of managed deployments, which ticks are due, and the GPU budget
arbitration recorded per round.

One control plane ticks many deployments (`flows.fleet`); this module holds what it does with the database, so the
flow stays orchestration only and tests and the scale benchmark call the same code without Prefect:

- the registry (`fleet_members`, `fleet_budget`; in `planner_core.runtime.fleet_registry`, re-exported here):
  `add_member`, `remove_member`, `list_members`, `set_budget`; `read_fleet_folder` and `sync_members` register a
  folder of config files (GitOps: the folder is the fleet);
- `ContextCache`: each member's `PlannerContext`, loaded once per process and again when its config file changes;
- `due_ticks`: each member's loops on their own intervals, aligned to the epoch, so a slot's scheduled time is the
  tick's identity (a second control plane, or a retry, finds the tick recorded and skips it);
- `fleet_ceilings`: what each member may grow to in its next ticks (its grant at the newest round plus what that
  round left unallocated), a tick input (`TickInputs.gpu_ceiling`): a member held under the budget proposes its want
  but decides nothing while the budget has no room, instead of recording a decision each tick that the
  arbitration then cuts back to what it runs;
- `tick_fleet_member`: one member's tick, its traffic window collected first, the same in every fleet path;
- `arbitrate_round`: the members' claims (what their tick this round wanted, else their newest pending decision,
  else what they run now, in GPUs) go to the pure `arbitrate`; a pending decision above its grant is cut under it
  by the deployment's own GPU guard, and the round, its inputs and every grant with its reason are recorded in
  one transaction;
- `replay_round`: run a recorded round again and compare.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from planner_core.config import PlannerConfig
from planner_core.domain import DecisionStage, Loop
from planner_core.domain.summary import with_arbitration_cut
from planner_core.policy.arbitration import (
    ArbitrationRound,
    GpuClaim,
    GpuGrant,
    arbitrate,
    round_from_jsonable,
    round_to_jsonable,
)
from planner_core.policy.bounds import guard_gpu_budget
from planner_core.runtime.fleet_registry import (
    CONFIG_SUFFIXES,
    FleetError,
    FleetMember,
    FolderMember,
    SyncPlan,
    add_member,
    get_budget,
    list_members,
    member_budget_warnings,
    plan_sync,
    read_fleet_folder,
    remove_member,
    set_budget,
    sync_members,
)
from planner_core.runtime.service import (
    PlannerContext,
    TickResult,
    default_workers,
    load_context,
    run_execution,
    run_tick,
)
from planner_core.runtime.sources import collect_traffic
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import session_factory
from planner_core.runtime.store.models import (
    ArbitrationGrantRow,
    ArbitrationRoundRow,
    DecisionRow,
    Deployment,
)
from planner_core.runtime.store.partitions import TICK_TABLES as PARTITIONED_TICK_TABLES
from planner_core.runtime.store.partitions import partition_start


class ContextCache:
    """Each member's `PlannerContext`, loaded once and reloaded when its config file changes (thread-safe: the
    fleet flow ticks members from a thread pool)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._contexts: dict[tuple[str, str], tuple[int, PlannerContext]] = {}
        self._lock = threading.Lock()

    def get(self, member: FleetMember) -> PlannerContext:
        return self.load(member.name, member.config_path)

    def load(self, name: str, config_path: str) -> PlannerContext:
        """The context of deployment `name` served with `config_path` (also `planner serve`'s execution runs)."""
        key = (name, config_path)
        mtime_ns = Path(config_path).stat().st_mtime_ns
        with self._lock:
            cached = self._contexts.get(key)
            if cached is not None and cached[0] == mtime_ns:
                return cached[1]
        ctx = load_context(self.database_url, name, config_path)
        with self._lock:
            self._contexts[key] = (mtime_ns, ctx)
        return ctx


@dataclass(frozen=True, slots=True, kw_only=True)
class DueTick:
    """One member's loop whose newest slot has no tick yet."""

    deployment: str
    loop: Loop
    scheduled_at: dt.datetime
    num_missed: int  # slots between the last recorded tick and this one that were never ticked


def loop_intervals_s(config: PlannerConfig) -> dict[Loop, float]:
    """The member's active loops and their intervals (s)."""
    intervals = {}
    if config.throughput_scaling_active:
        intervals[Loop.THROUGHPUT] = float(config.throughput_adjustment_interval_seconds)
    if config.load_scaling_active:
        intervals[Loop.LOAD] = float(config.load_adjustment_interval_seconds)
    return intervals


def slot_at(now: dt.datetime, interval_s: float, phase_s: float = 0.0) -> dt.datetime:
    """The newest slot of an interval at `now`: slots are `phase_s` after a multiple of the interval since the
    epoch, so every control plane agrees on them."""
    return dt.datetime.fromtimestamp(
        math.floor((now.timestamp() - phase_s) / interval_s) * interval_s + phase_s, tz=dt.UTC
    )


# The fractional parts of k times this number spread evenly over [0, 1) for k = 1, 2, 3, ... (each new one falls
# in the largest gap left), so consecutive deployment ids get phases spread over the whole interval.
_PHASE_SPREAD = (math.sqrt(5.0) - 1.0) / 2.0


def slot_phase_s(deployment_id: int, loop: Loop, interval_s: float) -> float:
    """The offset (whole seconds) of a member's slots from the epoch's grid. Throughput slots are spread over
    their interval by deployment id: aligned, every member's 60 s tick fell in the same round, a round twice the
    size of the others every minute, the one that overran (100 members: 5 s rounds of 100 load ticks, then one
    of 200). The load loop, the fleet's fastest, stays on the grid, its slots those of the rounds that tick it."""
    if loop is not Loop.THROUGHPUT:
        return 0.0
    return float(math.floor(((deployment_id * _PHASE_SPREAD) % 1.0) * interval_s))


# The newest tick of each member and loop: one index probe each (newest first, at most one row), in the partitions
# from `since` on only; a `max()` grouped over the members' ticks read every tick of the day, a round growing
# slower with the day's history.
_NEWEST_TICKS = text("""
SELECT m.id AS deployment_id, l.loop, newest.scheduled_at
  FROM unnest(CAST(:ids AS bigint[])) AS m(id)
 CROSS JOIN unnest(CAST(:loops AS text[])) AS l(loop)
 CROSS JOIN LATERAL (
       SELECT t.scheduled_at FROM ticks t
        WHERE t.deployment_id = m.id AND t.loop = l.loop AND t.scheduled_at >= :since
        ORDER BY t.scheduled_at DESC LIMIT 1) AS newest
""")


def due_ticks(
    session: Session, members: list[FleetMember], configs: dict[str, PlannerConfig], now: dt.datetime
) -> list[DueTick]:
    """Every member's loop whose newest slot at `now` is not recorded yet, with the slots it missed since its last
    tick (one statement for the newest tick of every member and loop: in the partitions of `now`'s day and the day
    before, then in every day for those not found there)."""
    ids = [member.deployment_id for member in members]
    loops = [loop.value for loop in Loop]
    since = partition_start(now) - dt.timedelta(days=1)
    newest = {
        (row.deployment_id, row.loop): row.scheduled_at
        for row in session.execute(_NEWEST_TICKS, {"ids": ids, "loops": loops, "since": since})
    }
    stale = sorted(set(ids) - {deployment_id for deployment_id, _ in newest})
    if stale:  # new members, or members idle for more than a day: look in every day
        epoch = dt.datetime.fromtimestamp(0, tz=dt.UTC)
        for row in session.execute(_NEWEST_TICKS, {"ids": stale, "loops": loops, "since": epoch}):
            newest[(row.deployment_id, row.loop)] = row.scheduled_at
    due = []
    for member in members:
        for loop, interval_s in loop_intervals_s(configs[member.name]).items():
            slot = slot_at(now, interval_s, slot_phase_s(member.deployment_id, loop, interval_s))
            last = newest.get((member.deployment_id, loop.value))
            if last is not None and last >= slot:
                continue
            missed = 0 if last is None else max(0, round((slot - last).total_seconds() / interval_s) - 1)
            due.append(DueTick(deployment=member.name, loop=loop, scheduled_at=slot, num_missed=missed))
    return due


def _gpus(config: PlannerConfig, prefill: int, decode: int) -> int:
    return prefill * config.prefill_gpus_per_engine + decode * config.decode_gpus_per_engine


# Each member's grant at the newest arbitration round, and the GPUs that round granted in all.
_NEWEST_GRANTS = text("""
SELECT g.deployment_id, g.granted_gpus, sum(g.granted_gpus) OVER () AS granted_in_all
  FROM arbitration_grants g
 WHERE g.round_id = (SELECT max(id) FROM arbitration_rounds)
""")


def fleet_ceilings(session: Session) -> dict[int, int]:
    """Each member's ceiling for its next ticks (`TickInputs.gpu_ceiling`), by deployment id: its grant at the
    newest arbitration round plus the GPUs of the budget (as set now) that round left unallocated, so a member
    takes free GPUs at once and waits for the arbitration only when the budget is full. Empty without a budget
    or before the first round; a member the newest round did not grant anything to has no ceiling."""
    budget_gpus = get_budget(session)
    if budget_gpus is None:
        return {}
    rows = session.execute(_NEWEST_GRANTS).all()
    return {row.deployment_id: row.granted_gpus + max(0, budget_gpus - int(row.granted_in_all)) for row in rows}


def tick_fleet_member(
    ctx: PlannerContext,
    due: DueTick,
    *,
    gpu_ceiling: int | None,
    flow_run_id: str | None = None,
    task_run_id: str | None = None,
) -> TickResult:
    """One member's tick for one loop and slot, in its own transaction (skipped if already recorded): the loop's
    traffic window from the member's source first (the throughput loop's, and the load loop's when it scales on
    tail latency), then `run_tick` with the member's ceiling. Every fleet path ticks a member through here."""
    observation, traffic_problem, curve_problem, partial_problem = None, None, None, None
    if due.loop is Loop.THROUGHPUT or ctx.config.load_tail_latency_scaling:
        interval_s = (
            ctx.config.throughput_adjustment_interval_seconds
            if due.loop is Loop.THROUGHPUT
            else ctx.config.load_adjustment_interval_seconds
        )
        window_start = due.scheduled_at - dt.timedelta(seconds=interval_s)
        collected = collect_traffic(ctx.config, ctx.service, window_start, due.scheduled_at, planner=ctx.planner)
        if collected is not None:
            observation = collected.observation
            if due.loop is Loop.THROUGHPUT:
                traffic_problem, curve_problem = collected.problem, collected.curve_problem
                partial_problem = collected.partial_problem
    return run_tick(
        ctx,
        due.loop,
        due.scheduled_at,
        observation,
        flow_run_id=flow_run_id,
        task_run_id=task_run_id,
        traffic_problem=traffic_problem,
        curve_problem=curve_problem,
        partial_problem=partial_problem,
        gpu_ceiling=gpu_ceiling,
    )


def arbitrate_round(
    session: Session, scheduled_at: dt.datetime, members: list[FleetMember], contexts: dict[str, PlannerContext]
) -> tuple[GpuGrant, ...] | None:
    """Arbitrate the fleet budget for the round at `scheduled_at` and record it; None without a budget or when the
    round is already recorded. Runs in the caller's transaction, holding every member's row lock, so no tick or
    execution of a member changes its decisions meanwhile.

    A member's claim is what its tick of this round wanted (its proposals: the targets before its fleet ceiling,
    `TickInputs.gpu_ceiling`), else its newest pending decision (pools it leaves unset at their expected count),
    else its expected counts, in GPUs. A pending decision above its grant is cut under it by the member's own GPU guard
    (`guard_gpu_budget` with the grant as ceiling, its minimum endpoints as floors); the original and the cut
    targets are recorded with the grant.
    """
    budget_gpus = get_budget(session)
    if budget_gpus is None or not members:
        return None
    claims, pending, current = [], {}, {}
    # one statement for every member's lock, in id order: no deadlock with a second control plane
    repo.lock_deployments(session, [member.deployment_id for member in members])
    decisions_of = repo.pending_decisions_of(session, [member.deployment_id for member in members])
    wanted_of = _wanted_this_round(session, scheduled_at, [member.deployment_id for member in members])
    for member in members:
        claim, newest, counts = _member_claim(
            session,
            member,
            contexts[member.name],
            decisions_of.get(member.deployment_id, []),
            wanted_of.get(member.deployment_id),
        )
        pending[member.name], current[member.name] = newest, counts
        claims.append(claim)
    arbitration = ArbitrationRound(budget_gpus=budget_gpus, claims=tuple(claims))
    grants = arbitrate(arbitration)
    round_id = session.scalar(
        pg_insert(ArbitrationRoundRow)
        .values(scheduled_at=scheduled_at, budget_gpus=budget_gpus, inputs=round_to_jsonable(arbitration))
        .on_conflict_do_nothing(index_elements=["scheduled_at"])
        .returning(ArbitrationRoundRow.id)
    )
    if round_id is None:
        return None
    by_name = {member.name: member for member in members}
    for grant in grants:
        member, decision = by_name[grant.deployment], pending[grant.deployment]
        config = contexts[grant.deployment].config
        session.add(_grant_row(session, round_id, grant, member, decision, config, current[grant.deployment]))
    session.flush()
    return grants


def _member_claim(
    session: Session,
    member: FleetMember,
    ctx: PlannerContext,
    decisions: list[DecisionRow],
    wanted: dict[str, int] | None,
) -> tuple[GpuClaim, DecisionRow | None, tuple[tuple[int, int], tuple[int, int]]]:
    """One member's claim on the round (`arbitrate_round`), its newest pending decision, and its (expected,
    proposed) counts: what its tick of this round wanted, else its newest pending decision (pools it leaves unset
    at their expected count), else its expected counts."""
    workers = ctx.connector.worker_counts(session, member.deployment_id, default=default_workers(ctx.config))
    now_counts = (workers.expected_prefill, workers.expected_decode)
    newest = decisions[-1] if decisions else None
    proposed = now_counts
    if newest is not None:
        proposed = (
            now_counts[0] if newest.target_prefill is None else newest.target_prefill,
            now_counts[1] if newest.target_decode is None else newest.target_decode,
        )
    if wanted is not None:
        proposed = (wanted.get("prefill", proposed[0]), wanted.get("decode", proposed[1]))
    claim = GpuClaim(
        deployment=member.name,
        proposed_gpus=_gpus(ctx.config, *proposed),
        min_gpus=member.min_gpus,
        max_gpus=member.max_gpus,
        priority=member.priority,
        weight=member.weight,
    )
    return claim, newest, (now_counts, proposed)


def _grant_row(
    session: Session,
    round_id: int,
    grant: GpuGrant,
    member: FleetMember,
    decision: DecisionRow | None,
    config: PlannerConfig,
    counts: tuple[tuple[int, int], tuple[int, int]],
) -> ArbitrationGrantRow:
    """The recorded grant of one member; a pending decision above its grant is cut under it by the member's own GPU
    guard (`guard_gpu_budget`, its minimum endpoints as floors) and the cut audited."""
    row = ArbitrationGrantRow(
        round_id=round_id,
        deployment_id=member.deployment_id,
        proposed_gpus=grant.proposed_gpus,
        request_gpus=grant.request_gpus,
        granted_gpus=grant.granted_gpus,
        reason=grant.reason.value,
    )
    if decision is not None:
        now_counts, proposed = counts
        row.decision_id = decision.id
        row.proposed_prefill, row.proposed_decode = decision.target_prefill, decision.target_decode
        if grant.granted_gpus < grant.proposed_gpus:
            (prefill, decode), step = guard_gpu_budget(
                now_counts,
                proposed,
                prefill_gpus=config.prefill_gpus_per_engine,
                decode_gpus=config.decode_gpus_per_engine,
                min_gpu_budget=-1,
                max_gpu_budget=grant.granted_gpus,
                prefill_floor=config.prefill_min_endpoint_effective,
                decode_floor=config.decode_min_endpoint_effective,
            )
            # a pool the decision left unset stays unset: the cut never scales a pool the planner does not manage
            decision.target_prefill = None if decision.target_prefill is None else prefill
            decision.target_decode = None if decision.target_decode is None else decode
            decision.stage = DecisionStage.FLEET.value
            decision.summary = with_arbitration_cut(
                decision.summary,
                granted_gpus=grant.granted_gpus,
                prefill=decision.target_prefill,
                decode=decision.target_decode,
            )
            repo.audit(
                session,
                "decision_arbitrated",
                {
                    "round_id": round_id,
                    "granted_gpus": grant.granted_gpus,
                    "reason": grant.reason.value,
                    "from": [row.proposed_prefill, row.proposed_decode],
                    "to": [decision.target_prefill, decision.target_decode],
                    "guard": step.reason.value,
                },
                deployment_id=member.deployment_id,
                tick_id=decision.tick_id,
                decision_id=decision.id,
            )
        row.granted_prefill, row.granted_decode = decision.target_prefill, decision.target_decode
    return row


# What each member's ticks of a round wanted, per pool (the higher of its two loops' when both ticked).
_WANTED_THIS_ROUND = text("""
SELECT t.deployment_id, p.component, max(p.desired) AS desired
  FROM ticks t JOIN proposals p ON p.tick_id = t.id AND p.scheduled_at = t.scheduled_at
 WHERE t.scheduled_at = :at AND t.deployment_id = ANY(CAST(:ids AS bigint[]))
 GROUP BY t.deployment_id, p.component
""")


def _wanted_this_round(session: Session, at: dt.datetime, deployment_ids: list[int]) -> dict[int, dict[str, int]]:
    wanted: dict[int, dict[str, int]] = {}
    for row in session.execute(_WANTED_THIS_ROUND, {"at": at, "ids": deployment_ids}):
        wanted.setdefault(row.deployment_id, {})[row.component] = int(row.desired)
    return wanted


def replay_round(session: Session, round_id: int) -> tuple[bool, tuple[GpuGrant, ...]]:
    """Run a recorded round's inputs through `arbitrate` again: (same grants and reasons as recorded, the grants)."""
    recorded = session.get(ArbitrationRoundRow, round_id)
    if recorded is None:
        raise FleetError(f"arbitration round {round_id}: not recorded")
    grants = arbitrate(round_from_jsonable(recorded.inputs))
    names = dict(session.execute(select(Deployment.id, Deployment.name)).tuples().all())
    stored = sorted(
        (names[row.deployment_id], row.granted_gpus, row.reason)
        for row in session.scalars(select(ArbitrationGrantRow).where(ArbitrationGrantRow.round_id == round_id))
    )
    return stored == sorted((g.deployment, g.granted_gpus, g.reason.value) for g in grants), grants


def _tick_tables() -> tuple[str, ...]:
    """The tables holding what one tick recorded: the partitioned tick tables (`ticks` and the tables of one
    tick's rows, `store.partitions.TICK_TABLES`), plus `decisions` and `audit_log`, whose rows name their tick
    without a foreign key since migration 0017 (they are not partitioned: few rows, and the audit log may never
    lose one). Not `replay_ticks`: a replay's comparison, written by `planner replay`, not by the tick."""
    return (*PARTITIONED_TICK_TABLES, "decisions", "audit_log")


TICK_TABLES = _tick_tables()


def stored_bytes_per_tick(session: Session, loop: Loop, deployment_ids: list[int] | None = None) -> dict[str, float]:
    """Mean bytes stored per tick of `loop`, by table: the size of each row as stored (`pg_column_size` of the
    whole row: its header and columns, TOAST-compressed where Postgres compressed them), indexes not counted.
    `deployment_ids`: only those deployments' ticks (default: all). The key "total" sums the tables; "num_ticks"
    says how many ticks the mean is over."""
    where = "t.loop = :loop" + ("" if deployment_ids is None else " AND t.deployment_id = ANY(:ids)")
    params = {"loop": loop.value, "ids": deployment_ids or []}
    num_ticks = repo.query_rows(session, f"SELECT count(*) AS n FROM ticks t WHERE {where}", **params)[0]["n"]
    result: dict[str, float] = {"num_ticks": float(num_ticks)}
    if num_ticks == 0:
        return result
    total = 0.0
    for table in TICK_TABLES:
        key = "t.id = r.id" if table == "ticks" else "t.id = r.tick_id"
        sql = f"SELECT coalesce(sum(pg_column_size(r.*)), 0) AS b FROM {table} r JOIN ticks t ON {key} WHERE {where}"
        table_bytes = float(repo.query_rows(session, sql, **params)[0]["b"]) / num_ticks
        result[table] = table_bytes
        total += table_bytes
    result["total"] = total
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundResult:
    """What one fleet round did (`run_round`)."""

    num_ticked: int  # ticks this round recorded (a tick another control plane recorded first is not counted)
    num_missed: int
    tick_ms: tuple[float, ...]  # wall time of each member tick (`run_tick`), recorded or skipped
    failed: dict[str, str]  # member -> one line
    grants: tuple[GpuGrant, ...] | None  # None: no budget, or the round was recorded by another control plane
    executed: tuple[str, ...]


def finish_round(
    database_url: str,
    members: list[FleetMember],
    contexts: dict[str, PlannerContext],
    at: dt.datetime,
    pool: Executor,
) -> tuple[tuple[GpuGrant, ...] | None, tuple[str, ...]]:
    """The end of a round, once its ticks are recorded: the arbitration (`arbitrate_round`, in its own
    transaction), then the execution of every member with a pending decision, each in its own transaction on
    `pool` (one after another, a round's executions took a second of a 100-member round). Returns the grants and
    the members executed."""
    with session_factory(database_url).begin() as session:
        grants = arbitrate_round(session, at, members, contexts)
        with_pending = repo.pending_decisions_of(session, [member.deployment_id for member in members])
        pending = tuple(member.name for member in members if member.deployment_id in with_pending)
    list(pool.map(lambda name: run_execution(contexts[name], at), pending))
    return grants, pending


def run_round(
    database_url: str,
    members: list[FleetMember],
    contexts: dict[str, PlannerContext],
    at: dt.datetime,
    pool: Executor,
    *,
    due: list[DueTick] | None = None,
    flow_run_id: str | None = None,
    task_run_id: str | None = None,
    finish: bool = True,
) -> RoundResult:
    """One fleet round without Prefect (the benchmark's; the `fleet-tick` flow does the same as task runs): the
    due ticks on `pool`, each its own transaction; the arbitration; the execution of every pending decision.

    `due`: the round's due ticks when the caller has found them already (`due_ticks` at `at`); `flow_run_id`,
    `task_run_id`: the Prefect run the round runs in (`fleet-round`), recorded with every tick it ticks.
    `finish` False: only the ticks (a part of the round's due ticks; the last part arbitrates and executes)."""
    sessions = session_factory(database_url)
    configs = {name: ctx.config for name, ctx in contexts.items()}
    by_name = {member.name: member for member in members}
    if due is None:
        with sessions.begin() as session:
            due = due_ticks(session, members, configs, at)

    with sessions.begin() as session:
        ceilings = fleet_ceilings(session)

    def tick_one(item: DueTick) -> tuple[float, bool, str | None]:
        began = time.perf_counter()
        try:
            ctx = contexts[item.deployment]
            result = tick_fleet_member(
                ctx, item, gpu_ceiling=ceilings.get(by_name[item.deployment].deployment_id),
                flow_run_id=flow_run_id, task_run_id=task_run_id,
            )  # fmt: skip
            recorded = result.tick_id is not None
            problem = None
        except Exception as exc:  # a failing member is reported, the others go on
            recorded, problem = False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return (time.perf_counter() - began) * 1000.0, recorded, problem

    outcomes = list(pool.map(tick_one, due))
    failed = {item.deployment: problem for item, (_, _, problem) in zip(due, outcomes, strict=True) if problem}
    grants, pending = finish_round(database_url, members, contexts, at, pool) if finish else (None, ())
    return RoundResult(
        num_ticked=sum(recorded for _, recorded, _ in outcomes),
        num_missed=sum(item.num_missed for item in due),
        tick_ms=tuple(ms for ms, _, _ in outcomes),
        failed=failed,
        grants=grants,
        executed=pending,
    )


__all__ = [
    "CONFIG_SUFFIXES",
    "ContextCache",
    "DueTick",
    "FleetError",
    "FleetMember",
    "FolderMember",
    "RoundResult",
    "SyncPlan",
    "TICK_TABLES",
    "add_member",
    "arbitrate_round",
    "due_ticks",
    "finish_round",
    "fleet_ceilings",
    "get_budget",
    "list_members",
    "loop_intervals_s",
    "member_budget_warnings",
    "plan_sync",
    "read_fleet_folder",
    "remove_member",
    "replay_round",
    "run_round",
    "set_budget",
    "slot_at",
    "slot_phase_s",
    "stored_bytes_per_tick",
    "sync_members",
    "tick_fleet_member",
]
