"""Retention: `planner db prune --older-than DAYS` deletes the high-volume detail of old ticks, in batches.

What goes, for ticks scheduled before the cutoff (now - DAYS):

* `tick_steps` of load ticks: one explanation per 5 s tick, re-computable by `planner replay` while the states
  are kept;
* `planner_states` of load ticks: the largest rows (each holds the whole load history).

The steps and state of the tick a newer tick starts from (the newest tick before the cutoff, and the tick each
loop's first tick after the cutoff chained from) are kept, so the live planner and replays from the cutoff on
are unaffected.

What stays: every `ticks` row with its inputs (the forward-pass metrics the tick saw among them, the one copy the
view `fpm_snapshots` reads since migration 0015) and headline reason, observations, predictions, proposals,
throughput-tick steps and states, decisions, executions and the audit log (which the database refuses to
delete, and which references the ticks). Pruned load ticks can no longer be compared by `planner replay`
(reported as skipped); the throughput ticks between them still replay exactly, from the replayed state of the
load tick before them.

Each batch (at most `batch_size` ticks of one deployment and loop, oldest first) is one transaction: it deletes,
moves the deployment's watermark (`prune_watermarks`, so the next prune starts where this one stopped) and
appends a `history_pruned` audit event with the counts. An interrupted prune leaves whole batches done.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from planner_core.domain import Loop
from planner_core.runtime.store import partitions
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import session_factory
from planner_core.runtime.store.models import Deployment, PlannerStateRow, PruneWatermarkRow
from planner_core.runtime.store.partitions import partition_day, partition_start


@dataclass(slots=True, kw_only=True)
class PruneCounts:
    """Rows deleted (or, in a dry run, that would be)."""

    num_ticks: int = 0  # ticks examined (their detail pruned)
    num_tick_steps: int = 0
    num_planner_states: int = 0

    def add(self, other: PruneCounts) -> None:
        self.num_ticks += other.num_ticks
        self.num_tick_steps += other.num_tick_steps
        self.num_planner_states += other.num_planner_states

    def to_json(self) -> dict[str, int]:
        return {
            "ticks": self.num_ticks,
            "tick_steps": self.num_tick_steps,
            "planner_states": self.num_planner_states,
        }


@dataclass(slots=True, kw_only=True)
class PruneSummary:
    """What a prune did, per deployment and in total."""

    cutoff: dt.datetime
    dry_run: bool
    num_batches: int = 0
    total: PruneCounts = field(default_factory=PruneCounts)
    by_deployment: dict[str, PruneCounts] = field(default_factory=dict)


def prune_history(
    database_url: str,
    *,
    older_than_days: float,
    now: dt.datetime,
    deployment: str | None = None,
    batch_size: int = 5000,
    dry_run: bool = False,
    on_batch: Callable[[str, PruneCounts], None] | None = None,
) -> PruneSummary:
    """Delete the detail of ticks older than `older_than_days` (see the module docstring for what goes).

    Args:
        database_url: the planner database.
        older_than_days: ticks scheduled before `now - older_than_days` are pruned; must be >= 0.
        now: the current time (passed in: the caller owns the clock).
        deployment: only this managed deployment; None for all.
        batch_size: ticks per transaction.
        dry_run: count what would be deleted; delete nothing.
        on_batch: called after each committed batch with the deployment name and the batch's counts.

    Raises:
        ValueError: a negative `older_than_days`, a batch size below 1, or an unknown deployment.
    """
    if not older_than_days >= 0:
        raise ValueError(f"--older-than = {older_than_days!r}: must be >= 0 days")
    if batch_size < 1:
        raise ValueError(f"--batch-size = {batch_size!r}: must be >= 1")
    cutoff = now - dt.timedelta(days=older_than_days)
    summary = PruneSummary(cutoff=cutoff, dry_run=dry_run)
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        query = select(Deployment.id, Deployment.name).order_by(Deployment.id)
        if deployment is not None:
            query = query.where(Deployment.name == deployment)
        targets = [(row.id, row.name) for row in session.execute(query)]
    if deployment is not None and not targets:
        raise ValueError(f"--deployment = {deployment!r}: no such deployment")
    for deployment_id, name in targets:
        counts = PruneCounts()
        summary.by_deployment[name] = counts
        with sessions.begin() as session:
            keep = _chain_starts(session, deployment_id, cutoff)
        for loop in Loop:
            while True:
                with sessions.begin() as session:
                    if dry_run:
                        batch = _count_prunable(session, deployment_id, loop, cutoff, keep)
                    else:
                        batch = _prune_batch(session, deployment_id, loop, cutoff, keep, batch_size)
                if batch is None:
                    break
                summary.num_batches += 1
                counts.add(batch)
                summary.total.add(batch)
                if on_batch is not None:
                    on_batch(name, batch)
                if dry_run:
                    break  # a dry run counts the whole range at once
    return summary


# Which child rows of a tick are pruned, by loop: table -> (PruneCounts attribute, what one row counts for: a
# row of `tick_step_lists` holds all the steps of its tick, counted one by one as when they were rows).
_PRUNED = {
    Loop.THROUGHPUT: {},
    Loop.LOAD: {
        "tick_step_lists": ("num_tick_steps", "array_length(string_to_array(packed, ';'), 1)"),
        "planner_states": ("num_planner_states", "1"),
    },
}


def _watermark(session: Session, deployment_id: int, loop: Loop) -> dt.datetime | None:
    return session.scalar(
        select(PruneWatermarkRow.pruned_through).where(
            PruneWatermarkRow.deployment_id == deployment_id, PruneWatermarkRow.loop == loop.value
        )
    )


def _prune_batch(
    session: Session, deployment_id: int, loop: Loop, cutoff: dt.datetime, keep: list[int], batch_size: int
) -> PruneCounts | None:
    """Prune the next batch of one deployment's ticks of one loop; None when there is nothing left before `cutoff`."""
    repo.lock_deployment(session, deployment_id)  # no tick of this deployment is recorded meanwhile
    rows = session.execute(
        text(
            """SELECT id, scheduled_at FROM ticks
                WHERE deployment_id = :deployment_id AND loop = :loop
                  AND (CAST(:start AS timestamptz) IS NULL OR scheduled_at > :start) AND scheduled_at < :cutoff
                ORDER BY scheduled_at
                LIMIT :limit"""
        ),
        {
            "deployment_id": deployment_id,
            "loop": loop.value,
            "start": _watermark(session, deployment_id, loop),
            "cutoff": cutoff,
            "limit": batch_size,
        },
    ).all()
    if not rows:
        return None
    counts = PruneCounts(num_ticks=len(rows))
    # The batch's time range: Postgres reads only those days' partitions (migration 0017). A state a delta of the
    # batch is based on lies in the same day as that delta, so before the end of the last tick's day.
    params = {
        "ids": [row.id for row in rows],
        "keep": keep,
        "lo": rows[0].scheduled_at,
        "hi": rows[-1].scheduled_at,
        "day_end": partition_start(rows[-1].scheduled_at) + dt.timedelta(days=1),
    }
    if "planner_states" in _PRUNED[loop]:
        _rebuild_dependents_whole(session, params)
    for table, (attribute, weight) in _PRUNED[loop].items():
        kept = " AND NOT tick_id = ANY(:keep)"
        deleted = session.scalar(
            text(
                f"WITH gone AS (DELETE FROM {table} WHERE tick_id = ANY(:ids){kept} "
                f"AND scheduled_at >= :lo AND scheduled_at <= :hi RETURNING {weight} AS n) "
                "SELECT coalesce(sum(n), 0) FROM gone"
            ),
            params,
        )
        setattr(counts, attribute, int(deleted or 0))
    through = rows[-1].scheduled_at
    session.execute(
        pg_insert(PruneWatermarkRow)
        .values(deployment_id=deployment_id, loop=loop.value, pruned_through=through)
        .on_conflict_do_update(
            index_elements=["deployment_id", "loop"], set_={"pruned_through": through, "updated_at": text("now()")}
        )
    )
    repo.audit(
        session,
        "history_pruned",
        {"loop": loop.value, "cutoff": cutoff.isoformat(), "through": through.isoformat(), **counts.to_json()},
        deployment_id=deployment_id,
    )
    return counts


def _rebuild_dependents_whole(session: Session, params: dict[str, Any]) -> None:
    """A state that stays but is a delta against a state about to be deleted is first stored whole (migration
    0016), or it would have no base left. All are rebuilt before any is rewritten."""
    dependents = session.scalars(
        text(
            """SELECT tick_id FROM planner_states
                WHERE base_tick_id = ANY(:ids) AND NOT base_tick_id = ANY(:keep)
                  AND scheduled_at >= :lo AND scheduled_at < :day_end
                  AND (NOT tick_id = ANY(:ids) OR tick_id = ANY(:keep))
                ORDER BY tick_id"""
        ),
        params,
    ).all()
    whole = {tick_id: repo.state_json(session, tick_id) for tick_id in dependents}
    for tick_id, state in whole.items():
        session.execute(
            update(PlannerStateRow).where(PlannerStateRow.tick_id == tick_id).values(**repo.full_state_values(state))
        )


def _count_prunable(
    session: Session, deployment_id: int, loop: Loop, cutoff: dt.datetime, keep: list[int]
) -> PruneCounts | None:
    """What `_prune_batch` would delete over the whole remaining range, counted (dry run)."""
    ticks = """FROM ticks t WHERE t.deployment_id = :deployment_id AND t.loop = :loop
                 AND (CAST(:start AS timestamptz) IS NULL OR t.scheduled_at > :start) AND t.scheduled_at < :cutoff"""
    params = {
        "deployment_id": deployment_id,
        "loop": loop.value,
        "start": _watermark(session, deployment_id, loop),
        "cutoff": cutoff,
        "keep": keep,
    }
    num_ticks = int(session.scalar(text(f"SELECT count(*) {ticks}"), params) or 0)
    if num_ticks == 0:
        return None
    counts = PruneCounts(num_ticks=num_ticks)
    for table, (attribute, weight) in _PRUNED[loop].items():
        kept = " AND NOT c.tick_id = ANY(:keep)"
        sql = (
            f"SELECT coalesce(sum({weight}), 0) FROM {table} c WHERE c.tick_id IN (SELECT t.id {ticks}){kept} "
            "AND c.scheduled_at < :cutoff AND (CAST(:start AS timestamptz) IS NULL OR c.scheduled_at > :start)"
        )
        setattr(counts, attribute, int(session.scalar(text(sql), params) or 0))
    return counts


def _chain_starts(session: Session, deployment_id: int, cutoff: dt.datetime) -> list[int]:
    """Ticks whose state a tick at or after `cutoff` starts from, never pruned: the newest tick before the cutoff,
    and the previous tick of each loop's first tick after it (they differ only when a tick ran late)."""
    newest = session.scalar(
        text(
            """SELECT id FROM ticks WHERE deployment_id = :deployment_id AND scheduled_at < :cutoff
                ORDER BY scheduled_at DESC, id DESC LIMIT 1"""
        ),
        {"deployment_id": deployment_id, "cutoff": cutoff},
    )
    keep = {newest} if newest is not None else set()
    for loop in Loop:
        previous = session.scalar(
            text(
                """SELECT previous_tick_id FROM ticks
                    WHERE deployment_id = :deployment_id AND loop = :loop AND scheduled_at >= :cutoff
                    ORDER BY scheduled_at LIMIT 1"""
            ),
            {"deployment_id": deployment_id, "loop": loop.value, "cutoff": cutoff},
        )
        if previous is not None:
            keep.add(previous)
    return sorted(keep)


# ------------------------------------------------------------------------------------------------ partition drop


@dataclass(frozen=True, slots=True, kw_only=True)
class DroppedDay:
    """One day's partitions dropped (or, in a dry run, that would be): the rows each table held that day."""

    day: dt.date
    num_ticks: int
    rows: dict[str, int]  # table -> rows (the tick tables, `ticks` included, and the day's arbitration rounds)


@dataclass(slots=True, kw_only=True)
class DropSummary:
    """What `drop_partitions` did: the days dropped oldest first, and those kept although old enough."""

    cutoff: dt.datetime
    dry_run: bool
    dropped: list[DroppedDay] = field(default_factory=list)
    kept: dict[dt.date, str] = field(default_factory=dict)  # day -> why it was kept


def drop_partitions(
    database_url: str,
    *,
    older_than_days: float,
    now: dt.datetime,
    dry_run: bool = False,
    on_day: Callable[[DroppedDay], None] | None = None,
) -> DropSummary:
    """Drop every day's partitions of the tick tables (`partitions.TICK_TABLES`) that lie entirely before
    `now - older_than_days`, oldest first, each day in its own transaction with a `partitions_dropped` audit
    event (the day, the cutoff, the ticks and rows per table it held).

    The fleet's arbitration rounds of the day and their grants are deleted with the day (counted in the event).
    Never dropped: a day holding the newest tick of a deployment and loop, or the newest planner state of a
    deployment (the state the live planner starts its next tick from). `decisions`, `executions` and the audit log
    are not partitioned and keep every row (a decision's or audit row's `tick_id` may then name a dropped tick).
    No delta chain of planner states crosses a day (`partitions.same_partition`), so no state left is stranded.

    Raises:
        ValueError: `older_than_days` below 1 (a partition is a whole day).
    """
    if not older_than_days >= 1:
        raise ValueError(f"--drop-partitions-older-than = {older_than_days!r}: must be >= 1 day (partitions are days)")
    cutoff = now - dt.timedelta(days=older_than_days)
    summary = DropSummary(cutoff=cutoff, dry_run=dry_run)
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        days = [day for day in partitions.partition_days(session) if _day_end(day) <= cutoff]
    for day in days:
        dropped = _drop_day(sessions, day, cutoff, dry_run, summary)
        if dropped is None:
            continue
        summary.dropped.append(dropped)
        if on_day is not None:
            on_day(dropped)
    return summary


LOCK_TIMEOUT_MS = 500  # below Postgres' deadlock_timeout (1 s): the drop gives way before a tick could be the victim
LOCK_ATTEMPTS = 20


def _drop_day(
    sessions: Any, day: dt.date, cutoff: dt.datetime, dry_run: bool, summary: DropSummary
) -> DroppedDay | None:
    """Drop (or count) one day in its own transaction; None if it is kept (the reason in `summary.kept`).

    The drop locks the seven tables at once, `ticks` first as a tick's transaction takes them, waiting at most
    `LOCK_TIMEOUT_MS` each time: a tick that holds one of them and waits for another makes the drop give up and
    try again (up to `LOCK_ATTEMPTS` times) rather than be part of a deadlock in which Postgres might abort the
    tick."""
    for _attempt in range(LOCK_ATTEMPTS):
        try:
            with sessions.begin() as session:
                if not dry_run:
                    session.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
                    tables = ", ".join(partitions.TICK_TABLES)
                    session.execute(text(f"LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE"))
                why = _why_kept(session, day)
                if why is not None:
                    summary.kept[day] = why
                    return None
                rows = {
                    table: int(
                        session.scalar(text(f"SELECT count(*) FROM {partitions.partition_name(table, day)}")) or 0
                    )
                    for table in partitions.TICK_TABLES
                }
                rows |= _arbitration_rows(session, day, delete=not dry_run)
                dropped = DroppedDay(day=day, num_ticks=rows["ticks"], rows=rows)
                if not dry_run:
                    session.execute(text("SELECT planner_drop_tick_partitions(CAST(:day AS date))"), {"day": day})
                    detail = {"day": day.isoformat(), "cutoff": cutoff.isoformat(), "ticks": dropped.num_ticks}
                    repo.audit(session, "partitions_dropped", {**detail, "rows": rows})
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            time.sleep(0.2)
            continue
        if not dry_run:
            partitions.forget(session.get_bind(), day)
        return dropped
    summary.kept[day] = f"the tick tables stayed busy ({LOCK_ATTEMPTS} tries of {LOCK_TIMEOUT_MS} ms); try again"
    return None


# A fleet's arbitration rounds of a day and their grants (one per member and round: 1.7 M rows a day at 100
# members, 5 s rounds) go with the day's ticks; the decisions a grant capped stay, as every decision does.
_ARBITRATION_OF_DAY = """
WITH day_rounds AS (SELECT id FROM arbitration_rounds WHERE scheduled_at >= :start AND scheduled_at < :end),
     grants AS ({grants}),
     rounds AS ({rounds})
SELECT (SELECT count(*) FROM rounds) AS arbitration_rounds, (SELECT count(*) FROM grants) AS arbitration_grants
"""


def _arbitration_rows(session: Session, day: dt.date, *, delete: bool) -> dict[str, int]:
    """The arbitration rounds of `day` and their grants, counted, and deleted with `delete`."""
    if delete:
        grants = "DELETE FROM arbitration_grants WHERE round_id IN (SELECT id FROM day_rounds) RETURNING 1"
        rounds = "DELETE FROM arbitration_rounds WHERE id IN (SELECT id FROM day_rounds) RETURNING 1"
    else:
        grants = "SELECT 1 FROM arbitration_grants WHERE round_id IN (SELECT id FROM day_rounds)"
        rounds = "SELECT 1 FROM day_rounds"
    # One statement: the grants' foreign key to their rounds (NO ACTION) is checked at its end, after both deletes.
    row = session.execute(
        text(_ARBITRATION_OF_DAY.format(grants=grants, rounds=rounds)),
        {"start": _day_end(day) - dt.timedelta(days=1), "end": _day_end(day)},
    ).one()
    return {"arbitration_rounds": int(row.arbitration_rounds), "arbitration_grants": int(row.arbitration_grants)}


def _day_end(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC) + dt.timedelta(days=1)


def _why_kept(session: Session, day: dt.date) -> str | None:
    """Why `day`'s partitions must stay, or None: the day holds the newest tick of a deployment and loop, or a
    deployment's newest planner state (what `repository.latest_state` starts the next tick from). One index probe
    per deployment and loop: the newest rows, wherever they are."""
    newest = session.execute(
        text(
            """SELECT d.name, l.loop, n.scheduled_at, s.tick_id, s.scheduled_at AS state_at
                 FROM deployments d
                CROSS JOIN (VALUES ('throughput'), ('load')) AS l(loop)
                 LEFT JOIN LATERAL (SELECT t.scheduled_at FROM ticks t
                                     WHERE t.deployment_id = d.id AND t.loop = l.loop
                                     ORDER BY t.scheduled_at DESC LIMIT 1) n ON true
                 LEFT JOIN LATERAL (SELECT p.tick_id, p.scheduled_at FROM planner_states p
                                     WHERE p.deployment_id = d.id ORDER BY p.tick_id DESC LIMIT 1) s ON true
                ORDER BY d.name, l.loop"""
        )
    ).all()
    for row in newest:
        if row.scheduled_at is not None and partition_day(row.scheduled_at) == day:
            return f"holds the newest {row.loop} tick of {row.name}"
    for row in newest:
        if row.state_at is not None and partition_day(row.state_at) == day:
            return f"holds the newest planner state of {row.name} (tick {row.tick_id})"
    return None
