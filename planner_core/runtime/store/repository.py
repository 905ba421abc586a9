"""Repositories: read and write the system of record inside a caller-owned transaction.

Every function takes a `Session` and never commits: the Prefect task (or CLI command) that calls them owns
`with factory.begin():`, so everything one tick records lands in one transaction or not at all.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from planner_core.config import ConfigError, PlannerConfig, config_hash, parse_config
from planner_core.domain import (
    PROMPT_ARRIVAL_INTERVALS_S,
    AppliedTargets,
    Component,
    Loop,
    PlannerState,
    TickInputs,
    TickOutcome,
    summarize_decision,
)
from planner_core.runtime.redact import redact_value
from planner_core.runtime.store.codec import from_jsonable, stored_inputs, to_jsonable
from planner_core.runtime.store.models import (
    AuditLogRow,
    ConfigRevisionRow,
    DecisionRow,
    DecisionStatus,
    Deployment,
    ExecutionOutcome,
    ExecutionRow,
    PlannerConfigRow,
    Tick,
)
from planner_core.runtime.store.partitions import ensure_partition, partition_bounds, same_partition
from planner_core.runtime.store.state_delta import (
    FULL_STATE_EVERY,
    StateDeltaError,
    apply_delta,
    decode_delta,
    encode_delta,
    state_delta,
)
from planner_core.runtime.store.step_packing import record_steps

# The channel a tick's transaction notifies when it records a pending decision; the payload is the deployment's
# name. Postgres delivers a NOTIFY only when its transaction commits, so a rolled-back tick wakes nobody.
DECISIONS_CHANNEL = "planner_decisions"


def epoch_to_datetime(epoch_s: float) -> dt.datetime:
    """Seconds since the epoch -> aware UTC datetime (the form timestamps take in the database)."""
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC)


def datetime_to_epoch(value: dt.datetime) -> float:
    return value.timestamp()


def audit(
    session: Session,
    event: str,
    detail: dict[str, Any],
    *,
    deployment_id: int | None = None,
    tick_id: int | None = None,
    decision_id: int | None = None,
) -> None:
    """Append one row to the audit log (the database refuses to change or delete it later, and chains it to the
    row before: migration 0009). Every string in `detail` passes `redact_value` first: a password that reached
    this table could never be scrubbed."""
    session.add(
        AuditLogRow(
            event=event,
            detail=redact_value(detail),
            deployment_id=deployment_id,
            tick_id=tick_id,
            decision_id=decision_id,
        )
    )


def register_config(session: Session, config: PlannerConfig) -> str:
    """Store the config body under its hash (once) and return the hash."""
    digest = config_hash(config)
    session.execute(
        pg_insert(PlannerConfigRow)
        .values(config_hash=digest, body=config.model_dump(mode="json"))
        .on_conflict_do_nothing(index_elements=["config_hash"])
    )
    return digest


def ensure_deployment(
    session: Session, name: str, config: PlannerConfig, *, source_path: str | None = None
) -> Deployment:
    """Get or create the managed deployment `name`, locked for the rest of the transaction (`lock_deployment`), with
    `config` (its config file's policy, from `source_path`) recorded as its newest `file` revision if the file's
    policy is not that revision's already (`follow_file`; the audit log says so through the revision's trigger).

    A live retune (a `set` revision) stays in force while the file is unchanged: the file's policy is compared with
    the newest revision that came from the file, not with the newest revision."""
    digest = config_hash(config)
    deployment = session.scalar(select(Deployment).where(Deployment.name == name))
    if deployment is None:
        register_config(session, config)
        deployment = Deployment(
            name=name, mode=config.mode.value, environment=config.environment.value, config_hash=digest
        )
        session.add(deployment)
        session.flush()
        audit(session, "deployment_created", {"name": name, "config_hash": digest}, deployment_id=deployment.id)
    lock_deployment(session, deployment.id)
    if follow_file(session, deployment.id, config, source_path) is not None:
        session.expire(deployment)  # the revision's trigger moved its config_hash and config_revision
        deployment.mode = config.mode.value
        deployment.environment = config.environment.value
    return deployment


# The newest revision of a deployment and the newest one that came from its file (migration 0024).
_REVISIONS_SQL = text(
    """SELECT d.config_revision AS revision, d.config_hash AS config_hash,
              (SELECT r.config_hash FROM config_revisions r WHERE r.deployment_id = d.id AND r.source = 'file'
                ORDER BY r.revision DESC LIMIT 1) AS file_hash
         FROM deployments d WHERE d.id = :id"""
)


def follow_file(session: Session, deployment_id: int, config: PlannerConfig, source_path: str | None) -> int | None:
    """Record `config` (the policy of the deployment's config file) as its next revision (source `file`) unless the
    newest revision from the file is this policy already; the new revision's number, or None. The caller holds the
    deployment's lock (`lock_deployment`)."""
    digest = config_hash(config)
    newest = session.execute(_REVISIONS_SQL, {"id": deployment_id}).one()
    if newest.file_hash == digest:
        return None
    register_config(session, config)
    changes: dict[str, list[Any]] = {}
    reason = f"config file {source_path}" if source_path else "config of the planner"
    if newest.revision is not None:
        before = _stored_policy(session, newest.config_hash)
        if before is not None:
            old, new = before.model_dump(mode="json"), config.model_dump(mode="json")
            changes = {name: [old.get(name), new[name]] for name in new if old.get(name) != new[name]}
        if not changes and newest.file_hash is not None and before is not None:
            reason += " (the same policy under its current hash)"  # a body stored before the policy/service split
    revision = (newest.revision or 0) + 1
    session.add(
        ConfigRevisionRow(
            deployment_id=deployment_id,
            revision=revision,
            config_hash=digest,
            source="file",
            changes=changes,
            source_path=source_path,
            reason=reason,
        )
    )
    session.flush()  # through the trigger now: it moves deployments.config_revision and audits the revision
    return revision


def stored_policy(session: Session, stored_hash: str, source: str) -> PlannerConfig:
    """The policy stored under `stored_hash`, checked to hash to it.

    Raises:
        ConfigError: no such body, a body that does not parse, or one whose policy hashes otherwise (one line
            starting with `source`).
    """
    body = session.scalar(select(PlannerConfigRow.body).where(PlannerConfigRow.config_hash == stored_hash))
    if body is None:
        raise ConfigError(f"{source}: config {stored_hash[:12]} is not in planner_configs", source=source)
    policy = parse_config(body, source).policy
    if config_hash(policy) != stored_hash:
        raise ConfigError(
            f"{source}: the policy stored as {stored_hash[:12]} hashes to {config_hash(policy)[:12]}", source=source
        )
    return policy


def _stored_policy(session: Session, stored_hash: str) -> PlannerConfig | None:
    """The policy of a stored config body, None if there is none or it does not parse. Not checked against its
    hash: a body stored before the policy/service split holds service fields under the whole file's hash."""
    body = session.scalar(select(PlannerConfigRow.body).where(PlannerConfigRow.config_hash == stored_hash))
    if body is None:
        return None
    try:
        return parse_config(body, f"planner_configs[{stored_hash[:12]}]").policy
    except ConfigError:
        return None


def find_deployment(session: Session, name: str) -> Deployment | None:
    return session.scalar(select(Deployment).where(Deployment.name == name))


def deployment_names(session: Session) -> list[str]:
    """The names of every recorded managed deployment, sorted."""
    return list(session.scalars(select(Deployment.name).order_by(Deployment.name)))


def lock_deployment(session: Session, deployment_id: int) -> None:
    """Serialise ticks and executions of one deployment for the rest of the transaction."""
    session.execute(select(Deployment.id).where(Deployment.id == deployment_id).with_for_update())


def lock_deployments(session: Session, deployment_ids: Sequence[int]) -> None:
    """`lock_deployment` of many deployments in one statement, taken in id order (the one lock order every
    caller uses, so two transactions locking overlapping sets cannot deadlock)."""
    session.execute(
        select(Deployment.id).where(Deployment.id.in_(deployment_ids)).order_by(Deployment.id).with_for_update()
    ).all()


# A known deployment locked, whether it still runs the config revision it is known with, and whether the slot is
# recorded, in one statement (three before: `ensure_deployment`, `lock_deployment`, `tick_exists`).
_LOCK_KNOWN_DEPLOYMENT = """
SELECT d.config_revision = %(revision)s AS same_config,
       EXISTS (SELECT 1 FROM ticks t
                WHERE t.deployment_id = d.id AND t.loop = %(loop)s AND t.scheduled_at = %(scheduled_at)s) AS recorded
  FROM deployments d WHERE d.id = %(deployment_id)s FOR UPDATE
"""


@dataclass(frozen=True, slots=True)
class LockedDeployment:
    """The deployment a tick is for, locked: its id, the config revision in force and its policy's hash (what the
    tick runs and records), and whether the tick's slot is recorded already."""

    deployment_id: int
    revision: int
    config_hash: str
    recorded: bool


def lock_deployment_for_tick(
    session: Session,
    name: str,
    config: PlannerConfig,
    loop: str,
    scheduled_at: dt.datetime,
    memo: TickMemo,
    *,
    source_path: str | None = None,
) -> LockedDeployment:
    """The deployment a tick is for, locked for the rest of the transaction (`lock_deployment`), with the revision
    the tick runs: the newest, read under the lock, so a retune committed before it is in force and one committed
    after waits for the tick. Made, and the file `config` came from followed, as `ensure_deployment` does; when
    `memo` knows the deployment at its newest revision, one statement does all of it."""
    if memo.deployment is not None:
        deployment_id, revision, digest = memo.deployment
        params = {"revision": revision, "loop": loop, "scheduled_at": scheduled_at, "deployment_id": deployment_id}
        row = session.connection().exec_driver_sql(_LOCK_KNOWN_DEPLOYMENT, params).first()
        if row is not None and row.same_config:
            return LockedDeployment(deployment_id, revision, digest, bool(row.recorded))
    deployment = ensure_deployment(session, name, config, source_path=source_path)
    newest = session.execute(_REVISIONS_SQL, {"id": deployment.id}).one()
    memo.deployment = (deployment.id, newest.revision, newest.config_hash)
    recorded = tick_exists(session, deployment.id, loop, scheduled_at)
    return LockedDeployment(deployment.id, newest.revision, newest.config_hash, recorded)


def tick_exists(session: Session, deployment_id: int, loop: str, scheduled_at: dt.datetime) -> bool:
    return (
        session.scalar(
            select(func.count())
            .select_from(Tick)
            .where(Tick.deployment_id == deployment_id, Tick.loop == loop, Tick.scheduled_at == scheduled_at)
        )
        > 0
    )


@dataclass(slots=True)
class TickMemo:
    """What a long-lived context (a fleet member's, `planner serve`'s) keeps of its deployment between ticks, so a
    tick need not rebuild from the database what the previous tick of the same process wrote: the newest state it
    recorded, as stored (the JSON the next delta is taken against) and as read back.

    Only a cache, never the record: `latest_state` uses it only when the database's newest state is the very tick
    it remembers (tick ids are never reused, so a tick recorded since by another control plane, or one whose
    transaction rolled back, never matches), and what it holds is what reading that tick back gives (the JSON is
    normalised through the same encoding, and the state is built from it with `from_jsonable`), so a tick decides
    from the same state whether it was remembered or read: replay stays exact."""

    newest: tuple[int, PlannerState, StoredState] | None = None  # (tick id, state, as stored): set in one assignment
    # (deployment id, the config revision its last tick ran, that revision's hash) once it is stored
    deployment: tuple[int, int, str] | None = None

    def remember(self, session: Session, tick_id: int) -> None:
        """Keep the state `record_tick` just wrote for `tick_id` in this session (no-op if it wrote none)."""
        stored = remembered_stored_state(session, tick_id)
        if stored is not None:
            self.newest = (tick_id, from_jsonable(PlannerState, stored.state), stored)


def remembered_stored_state(session: Session, tick_id: int) -> StoredState | None:
    """The stored state of `tick_id` if this session read or wrote it last (None otherwise)."""
    cached = session.info.get(_STATE_CACHE_KEY)
    return cached[1] if cached is not None and cached[0] == tick_id else None


def latest_state(
    session: Session, deployment_id: int, *, since: dt.datetime | None = None, memo: TickMemo | None = None
) -> tuple[int | None, PlannerState]:
    """The state after the most recently recorded tick of the deployment (the highest tick id), and that tick's id.

    `since`: look in the partitions from that time on first (the live tick passes the start of the day before its
    own), and in every day only if none is there. Both read one index per day they cover, and Postgres plans a
    query over every day's partitions in time growing with their number (measured on 80 days: ~12 ms planning
    against ~0.3 ms for two days; docs/database-and-sql.md, Time partitions). With `since`, a tick recorded later
    for an older day (a backfill) is not the start: the newest state of the recent days is.

    `memo`: the context's `TickMemo`; when it holds the newest tick's state, that is returned without reading the
    state's rows."""
    newest = None
    if since is not None:
        newest = session.execute(_LATEST_STATE_SINCE, {"deployment_id": deployment_id, "since": since}).first()
    if newest is None:
        newest = session.execute(_LATEST_STATE, {"deployment_id": deployment_id}).first()
    if newest is None:
        return None, PlannerState()
    tick_id = newest.tick_id
    remembered = memo.newest if memo is not None else None
    if remembered is not None and remembered[0] == tick_id:
        session.info[_STATE_CACHE_KEY] = (tick_id, remembered[2])  # what record_tick takes its delta against
        return tick_id, remembered[1]
    state = state_json(session, tick_id, scheduled_at=newest.scheduled_at)
    assert state is not None  # the row was just found, in this transaction
    return tick_id, from_jsonable(PlannerState, state)


# A deployment's newest state, in every day's partition or (`_SINCE`) in those from a time on only.
_LATEST_STATE_SQL = """SELECT tick_id, scheduled_at FROM planner_states WHERE deployment_id = :deployment_id{since}
                         ORDER BY tick_id DESC LIMIT 1"""
_LATEST_STATE = text(_LATEST_STATE_SQL.format(since=""))
_LATEST_STATE_SINCE = text(_LATEST_STATE_SQL.format(since=" AND scheduled_at >= :since"))


# The stored rows a tick's state is rebuilt from: the tick's own row, then its base's, ... back to a full state.
# `{bound}`: with the tick's time known, every row is looked for in its partition only (a chain never leaves its
# day), so Postgres reads one partition's index instead of every day's.
_STATE_CHAIN_SQL = """
WITH RECURSIVE chain AS (
    SELECT tick_id, base_tick_id, state, delta, scheduled_at, 0 AS depth FROM planner_states
     WHERE tick_id = :tick_id{bound}
    UNION ALL
    SELECT p.tick_id, p.base_tick_id, p.state, p.delta, p.scheduled_at, c.depth + 1
      FROM planner_states p JOIN chain c ON p.tick_id = c.base_tick_id
     WHERE c.state IS NULL{bound_p}
)
SELECT tick_id, base_tick_id, state, delta, scheduled_at, depth FROM chain ORDER BY depth DESC
"""
_BOUND = " AND {p}scheduled_at >= :lo AND {p}scheduled_at < :hi"
_STATE_CHAIN = text(_STATE_CHAIN_SQL.format(bound="", bound_p=""))
_STATE_CHAIN_BOUNDED = text(_STATE_CHAIN_SQL.format(bound=_BOUND.format(p=""), bound_p=_BOUND.format(p="p.")))
# Session.info: (tick_id, state JSON, deltas since the full state, the tick's scheduled_at)
_STATE_CACHE_KEY = "planner_state_json"


@dataclass(frozen=True, slots=True)
class StoredState:
    """A tick's state as stored: its JSON, how many deltas lie between it and its full state, and the tick's time
    (which partition it is in)."""

    state: dict[str, Any]
    depth: int
    scheduled_at: dt.datetime


def _stored_state(session: Session | Any, tick_id: int, scheduled_at: dt.datetime | None = None) -> StoredState | None:
    """The stored state after `tick_id` (None if the tick has no state). The newest one read is remembered in the
    session (the next tick writes its delta against it). `scheduled_at`: the tick's time, if known, which bounds
    the read to its partition."""
    info = session.info if isinstance(session, Session) else None  # a Connection's info outlives the transaction
    cached = info.get(_STATE_CACHE_KEY) if info is not None else None
    if cached is not None and cached[0] == tick_id:
        return cached[1]
    if scheduled_at is None:
        rows = session.execute(_STATE_CHAIN, {"tick_id": tick_id}).all()
    else:
        lo, hi = partition_bounds(scheduled_at)
        rows = session.execute(_STATE_CHAIN_BOUNDED, {"tick_id": tick_id, "lo": lo, "hi": hi}).all()
    if not rows:
        return None
    if rows[0].state is None and rows[0].base_tick_id is not None:
        raise StateDeltaError(f"planner state of tick {tick_id}: its chain of deltas has no full state")
    state = rows[0].state if rows[0].state is not None else apply_delta(None, decode_delta(rows[0].delta))
    for row in rows[1:]:
        state = apply_delta(state, decode_delta(row.delta))
    stored = StoredState(state=state, depth=rows[0].depth, scheduled_at=rows[-1].scheduled_at)
    if info is not None:
        info[_STATE_CACHE_KEY] = (tick_id, stored)
    return stored


def state_json(
    session: Session | Any, tick_id: int, *, scheduled_at: dt.datetime | None = None
) -> dict[str, Any] | None:
    """The planner state after `tick_id` as stored (JSON, rebuilt from its deltas); None if it has none (pruned,
    or a tick that recorded no state). Takes a Session or a Connection. `scheduled_at` (the tick's time, when the
    caller has it) lets Postgres read the tick's partition only."""
    found = _stored_state(session, tick_id, scheduled_at)
    return None if found is None else found.state


def full_state_values(state: dict[str, Any]) -> dict[str, Any]:
    """The `planner_states` columns storing `state` whole: as a delta from nothing (`{"=": state}`, no base),
    compressed like the deltas (migration 0020: ~3.4 kB where JSONB took ~5.5 kB at a 3-member fleet bench)."""
    return {"state": None, "delta": encode_delta({"=": state}), "base_tick_id": None}


def state_row_values(
    previous: StoredState | None, state: dict[str, Any], base_tick_id: int | None, scheduled_at: dt.datetime
) -> dict[str, Any]:
    """The `planner_states` columns storing `state`, the state after a tick scheduled at `scheduled_at`: a delta
    against the previous tick's state (`previous`), or the full state (a delta without a base: `{"=": state}`,
    compressed; migration 0020) when there is no previous one, the chain has
    reached `FULL_STATE_EVERY` states, or the previous tick is in another partition (another UTC day: a chain never
    crosses a partition boundary, so retention can drop a day without stranding a later day's deltas)."""
    if (
        previous is None
        or base_tick_id is None
        or previous.depth + 1 >= FULL_STATE_EVERY
        or not same_partition(previous.scheduled_at, scheduled_at)
    ):
        return full_state_values(state)
    delta = state_delta(previous.state, state)
    return {
        "state": None,
        "delta": encode_delta(delta if delta is not None else {"{": {}}),
        "base_tick_id": base_tick_id,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class TickRecord:
    """Identity and provenance of a tick to record."""

    deployment_id: int
    scheduled_at: dt.datetime
    config_hash: str
    predictor: str
    previous_tick_id: int | None
    decide_ms: float
    flow_run_id: str | None = None
    task_run_id: str | None = None
    config_revision: int | None = None  # the config revision the tick ran (migration 0024)


def _unplaced_columns(inputs: TickInputs) -> dict[str, int | None]:
    """`worker_observations`' unplaced-request columns: per pool what the router reported, NULL where it did not."""
    columns: dict[str, int | None] = {}
    for component in Component:
        report = inputs.unplaced_for(component)
        pool = component.value
        columns[f"waiting_{pool}"] = None if report is None else report.num_waiting
        columns[f"unplaced_{pool}"] = None if report is None else report.num_unplaced
        columns[f"rejected_{pool}"] = None if report is None else report.num_rejected
    return columns


# `ticks.inputs` is a `json` column, stored as sent: compact text, no spaces (migration 0019). Made once: json.dumps
# builds an encoder a call.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


# A tick's rows are inserted with plain statements on the session's connection (the ORM's unit of work and
# statement compilation took a fifth of a fleet member's tick); each statement's text is made once per column set.
_INSERT_TICK = """
INSERT INTO ticks (deployment_id, loop, scheduled_at, config_hash, reason, inputs, previous_tick_id, decide_ms,
                   flow_run_id, task_run_id, config_revision)
VALUES (%(deployment_id)s, %(loop)s, %(scheduled_at)s, %(config_hash)s, %(reason)s, %(inputs)s::json,
        %(previous_tick_id)s, %(decide_ms)s, %(flow_run_id)s, %(task_run_id)s, %(config_revision)s)
ON CONFLICT (deployment_id, loop, scheduled_at) DO NOTHING RETURNING id
"""
_INSERT_SQL: dict[tuple[str, tuple[str, ...]], str] = {}


def _insert_rows(session: Session, table: str, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows` (dicts with the same keys: column names) into `table` in one driver call (statement events
    still fire: `exec_driver_sql` skips compiling, not the engine's listeners)."""
    if not rows:
        return
    columns = tuple(rows[0])
    sql = _INSERT_SQL.get((table, columns))
    if sql is None:
        names = ", ".join(columns)
        values = ", ".join(f"%({column})s" for column in columns)
        sql = _INSERT_SQL.setdefault((table, columns), f"INSERT INTO {table} ({names}) VALUES ({values})")
    session.connection().exec_driver_sql(sql, rows[0] if len(rows) == 1 else list(rows))


def _insert_tick(session: Session, values: dict[str, Any]) -> int | None:
    return session.connection().exec_driver_sql(_INSERT_TICK, values).scalar()


def record_tick(session: Session, record: TickRecord, inputs: TickInputs, outcome: TickOutcome) -> int | None:
    """Insert a tick and everything it saw and decided. Returns the tick id, or None if already recorded.

    In this order (tests/runtime/test_tick_statements.py pins the statements): the `ticks` row, what the tick observed,
    its prediction and proposals, its steps, the planner state it leaves, its decision, and the audit rows."""
    ensure_partition(session, record.scheduled_at)  # normally a cache hit: created ahead (store/partitions.py)
    session.flush()  # rows the caller added through the ORM go first: the plain inserts below do not wait for them
    tick_id = _insert_tick(session, _tick_row(record, inputs, outcome))
    if tick_id is None:
        return None
    at = record.scheduled_at
    _record_observations(session, tick_id, at, inputs)
    _record_forecast_and_proposals(session, tick_id, at, record.predictor, outcome)
    if outcome.steps:
        record_steps(session, tick_id, at, outcome.steps)
    _record_state(session, tick_id, record, outcome.next_state)
    decision_id = _record_decision(session, tick_id, record.deployment_id, outcome)
    # A load tick that decides nothing appends no audit row: its `ticks` row is its record, and every audit row
    # holds the chain head's lock until its transaction commits, which would serialise the quiet ticks of a fleet.
    if decision_id is not None or inputs.loop is Loop.THROUGHPUT:
        audit(
            session,
            "tick_recorded",
            {
                "loop": inputs.loop.value,
                "reason": outcome.reason.value,
                "config_hash": record.config_hash,
                "config_revision": record.config_revision,
            },
            deployment_id=record.deployment_id,
            tick_id=tick_id,
            decision_id=decision_id,
        )
    return tick_id


def _tick_row(record: TickRecord, inputs: TickInputs, outcome: TickOutcome) -> dict[str, Any]:
    """The `ticks` row's values; the inputs as `ticks.inputs` stores them (`codec.stored_inputs`)."""
    at = record.scheduled_at
    return {
        "deployment_id": record.deployment_id,
        "loop": inputs.loop.value,
        "scheduled_at": at,
        "config_hash": record.config_hash,
        "reason": outcome.reason.value,
        "inputs": _COMPACT_JSON.encode(stored_inputs(inputs, at.timestamp())),
        "previous_tick_id": record.previous_tick_id,
        "decide_ms": record.decide_ms,
        "flow_run_id": record.flow_run_id,
        "task_run_id": record.task_run_id,
        "config_revision": record.config_revision,
    }


def _record_observations(session: Session, tick_id: int, at: dt.datetime, inputs: TickInputs) -> None:
    """The traffic window (if the tick saw one) and the worker counts, with the router's unplaced requests."""
    traffic = inputs.traffic
    if traffic is not None:
        _insert_rows(
            session,
            "traffic_observations",
            [
                {
                    "tick_id": tick_id,
                    "scheduled_at": at,
                    "window_s": traffic.duration_s,
                    "num_req": traffic.num_req,
                    "isl": traffic.isl,
                    "osl": traffic.osl,
                    "isl_p50": traffic.isl_p50,
                    "isl_p90": traffic.isl_p90,
                    "isl_p99": traffic.isl_p99,
                    "osl_p50": traffic.osl_p50,
                    "osl_p90": traffic.osl_p90,
                    "osl_p99": traffic.osl_p99,
                    "ttft_ms": traffic.ttft_ms,
                    "itl_ms": traffic.itl_ms,
                    "kv_hit_rate": traffic.kv_hit_rate,
                    "accept_length": traffic.accept_length,
                    "ttft_ms_p95": traffic.ttft_ms_p95,
                    "ttft_ms_p99": traffic.ttft_ms_p99,
                    "queue_ms": traffic.queue_ms,
                    **{name: getattr(traffic, name) for name in PROMPT_ARRIVAL_INTERVALS_S},
                }
            ],
        )
    workers = inputs.workers
    _insert_rows(
        session,
        "worker_observations",
        [
            {
                "tick_id": tick_id,
                "scheduled_at": at,
                "ready_prefill": workers.ready_prefill,
                "ready_decode": workers.ready_decode,
                "expected_prefill": workers.expected_prefill,
                "expected_decode": workers.expected_decode,
                **_unplaced_columns(inputs),
            }
        ],
    )
    # The forward-pass metrics the tick saw are stored once, in `ticks.inputs` (the view `fpm_snapshots` expands
    # them one row per engine; migration 0015).


def _record_forecast_and_proposals(
    session: Session, tick_id: int, at: dt.datetime, predictor: str, outcome: TickOutcome
) -> None:
    """The tick's prediction (a throughput tick that forecast) and each pool's proposal."""
    if outcome.prediction is not None:
        _insert_rows(
            session,
            "predictions",
            [
                {
                    "tick_id": tick_id,
                    "scheduled_at": at,
                    "predictor": predictor,
                    "num_req": outcome.prediction.num_req,
                    "isl": outcome.prediction.isl,
                    "osl": outcome.prediction.osl,
                    "reason": (outcome.prediction_reason or outcome.reason).value,
                    "quantile": outcome.prediction.quantile,
                    "isl_quantile": outcome.prediction.isl_quantile,
                    "osl_quantile": outcome.prediction.osl_quantile,
                }
            ],
        )
    _insert_rows(
        session,
        "proposals",
        [
            {
                "tick_id": tick_id,
                "scheduled_at": at,
                "component": proposal.component.value,
                "current": proposal.current,
                "desired": proposal.desired,
                "reason": proposal.reason.value,
            }
            for proposal in outcome.proposals
        ],
    )


def _record_state(session: Session, tick_id: int, record: TickRecord, state: PlannerState) -> None:
    """The planner state the tick leaves: whole or as a delta against the previous tick's (`state_row_values`),
    remembered in the session for the next tick's delta."""
    at = record.scheduled_at
    # The state as reading it back gives it (the JSON round trip normalises what `to_jsonable` leaves as Python
    # values): the next tick of this session or context takes its delta against exactly what is stored.
    next_state = json.loads(_COMPACT_JSON.encode(to_jsonable(state)))
    previous = None if record.previous_tick_id is None else _stored_state(session, record.previous_tick_id)
    values = state_row_values(previous, next_state, record.previous_tick_id, at)
    _insert_rows(
        session,
        "planner_states",
        [{"tick_id": tick_id, "deployment_id": record.deployment_id, "scheduled_at": at, **values}],
    )
    depth = 0 if values["base_tick_id"] is None or previous is None else previous.depth + 1
    session.info[_STATE_CACHE_KEY] = (tick_id, StoredState(state=next_state, depth=depth, scheduled_at=at))


def _record_decision(session: Session, tick_id: int, deployment_id: int, outcome: TickOutcome) -> int | None:
    """The tick's decision, if it has one: pending (the execution listeners are notified) or advisory, audited.
    Returns its id."""
    if outcome.decision.is_empty:
        return None
    status = DecisionStatus.ADVISORY if outcome.decision.advisory else DecisionStatus.PENDING
    summary = summarize_decision(outcome)
    decision = DecisionRow(
        tick_id=tick_id,
        deployment_id=deployment_id,
        target_prefill=outcome.decision.num_prefill,
        target_decode=outcome.decision.num_decode,
        reason=outcome.reason.value,
        status=status.value,
        stage=summary.stage.value,
        summary=summary.text,
    )
    session.add(decision)
    session.flush()
    if status is DecisionStatus.PENDING:
        notify_decision(session, deployment_id)
    audit(
        session,
        "decision_created",
        {
            "status": status.value,
            "target_prefill": decision.target_prefill,
            "target_decode": decision.target_decode,
            "reason": outcome.reason.value,
            "stage": summary.stage.value,
        },
        deployment_id=deployment_id,
        tick_id=tick_id,
        decision_id=decision.id,
    )
    return decision.id


def notify_decision(session: Session, deployment_id: int) -> None:
    """Tell the execution listeners that this deployment has a pending decision (`DECISIONS_CHANNEL`, payload the
    deployment's name); sent by Postgres when the caller's transaction commits, never if it rolls back."""
    session.execute(
        text("SELECT pg_notify(:channel, name) FROM deployments WHERE id = :id"),
        {"channel": DECISIONS_CHANNEL, "id": deployment_id},
    )


def set_decision_status(
    session: Session, decision: DecisionRow, status: DecisionStatus, at: dt.datetime, why: str
) -> None:
    """Move a decision along its lifecycle and audit the transition."""
    previous = decision.status
    decision.status = status.value
    decision.status_changed_at = at
    audit(
        session,
        "decision_status",
        {"from": previous, "to": status.value, "why": why},
        deployment_id=decision.deployment_id,
        tick_id=decision.tick_id,
        decision_id=decision.id,
    )


def pending_decisions(session: Session, deployment_id: int) -> list[DecisionRow]:
    """Pending decisions of a deployment, oldest first."""
    return list(
        session.scalars(
            select(DecisionRow)
            .where(DecisionRow.deployment_id == deployment_id, DecisionRow.status == DecisionStatus.PENDING.value)
            .order_by(DecisionRow.id)
        )
    )


def pending_decisions_of(session: Session, deployment_ids: Sequence[int]) -> dict[int, list[DecisionRow]]:
    """Pending decisions of many deployments in one query, each deployment's oldest first (a fleet round asks
    for every member's; a deployment with none is absent)."""
    pending: dict[int, list[DecisionRow]] = {}
    for row in session.scalars(
        select(DecisionRow)
        .where(DecisionRow.deployment_id.in_(deployment_ids), DecisionRow.status == DecisionStatus.PENDING.value)
        .order_by(DecisionRow.id)
    ):
        pending.setdefault(row.deployment_id, []).append(row)
    return pending


def applied_decisions(
    session: Session, deployment_id: int, since: dt.datetime, until: dt.datetime
) -> tuple[AppliedTargets, ...]:
    """The deployment's decisions the execution flow applied through its connector in `[since, until]`, oldest
    first, each at its first applying attempt (`TickInputs.applied`)."""
    applied_at = func.min(ExecutionRow.executed_at)
    rows = session.execute(
        select(applied_at, DecisionRow.target_prefill, DecisionRow.target_decode)
        .join(DecisionRow, DecisionRow.id == ExecutionRow.decision_id)
        .where(
            DecisionRow.deployment_id == deployment_id,
            ExecutionRow.outcome == ExecutionOutcome.APPLIED.value,
            ExecutionRow.executed_at >= since,
            ExecutionRow.executed_at <= until,
        )
        .group_by(DecisionRow.id, DecisionRow.target_prefill, DecisionRow.target_decode)
        .order_by(applied_at, DecisionRow.id)
    )
    return tuple(
        AppliedTargets(at_s=datetime_to_epoch(at), num_prefill=prefill, num_decode=decode)
        for at, prefill, decode in rows
    )


def query_rows(session: Session, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Run a read-only SQL query and return the rows as dicts (for reports and the CLI)."""
    result = session.execute(text(sql), params)
    return [dict(row._mapping) for row in result]
