"""SQLAlchemy 2 ORM models of the planner's system of record.

Observation, prediction, proposal, step and audit tables are insert-only and keyed by `tick_id`; decisions carry
a status lifecycle; the audit log is protected by a trigger (see the initial migration) so the database itself
refuses to update or delete it. Explanations, inputs and state are JSONB built from the domain dataclasses,
never pickled. The migrations in `migrations/versions/` (beside this module) are the source of truth for the
schema; these models mirror them (a test compares the two).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSON, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from planner_core.domain import PROMPT_ARRIVAL_INTERVALS_S

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        dt.datetime: DateTime(timezone=True),
        dict[str, Any]: JSONB,
        list[Any]: JSONB,
        float: Double,
    }


class DecisionStatus(enum.StrEnum):
    """Lifecycle of a decision in the outbox."""

    PENDING = "pending"  # recorded by a tick; waiting for the execution flow
    SUPERSEDED = "superseded"  # a newer decision for the same deployment replaced it before it was applied
    ADVISORY = "advisory"  # advisory mode: recorded for the audit trail, never executed
    NOOP = "noop"  # the targets were already in place; nothing was written
    APPLIED = "applied"  # the connector accepted the targets (virtual: waiting for the orchestrator's ack)
    ACKNOWLEDGED = "acknowledged"  # the orchestrator reported the targets reached (virtual connector)
    FAILED = "failed"  # the connector refused or errored on the last attempt and gave up


class ExecutionOutcome(enum.StrEnum):
    """Result of one attempt to apply a decision."""

    APPLIED = "applied"  # targets written to the connector
    NOOP = "noop"  # connector already at the targets
    BLOCKED_UNACKNOWLEDGED = "blocked_unacknowledged"  # previous virtual decision not acknowledged yet
    BLOCKED_NOT_READY = "blocked_not_ready"  # the orchestrator's deployment is not ready (Kubernetes); kept pending
    SUPERSEDED = "superseded"  # skipped because a newer decision exists
    FAILED = "failed"  # the connector raised
    # the connector repaired its pools towards the decision in force (local: a dead worker replaced, a drain
    # finished, the targets reached); recorded against that decision, its status unchanged
    RECONCILED = "reconciled"


class LocalWorkerStatus(enum.StrEnum):
    """Lifecycle of one engine process of the local connector."""

    STARTING = "starting"  # running, not registered with the frontend yet
    READY = "ready"  # registered with the frontend (or running, without a discovery store)
    DRAINING = "draining"  # sent SIGTERM on scale-down; SIGKILL when the grace period ends
    STOPPED = "stopped"  # exited after SIGTERM
    KILLED = "killed"  # did not exit within the grace period: SIGKILL
    DIED = "died"  # exited while it should have been serving (reported, and replaced)


class DrainOutcome(enum.StrEnum):
    """How the drain of one removed engine ended (`drains.outcome`)."""

    DRAINING = "draining"  # stopped routing to it; waiting for its in-flight requests or the grace
    STOPPED = "stopped"  # exited by itself within the grace: every request it held ended
    KILLED = "killed"  # still running when the grace ended: SIGKILL, its requests still in flight cut
    HANDED_OVER = "handed_over"  # Kubernetes removes the pod (deletion cost set, grace = the pod's own); followed
    # Kubernetes, once the planner saw the pod go (migration 0026), from its engine's last forward-pass sample:
    COMPLETED = "completed"  # nothing in flight at its last sample: every request it held ended
    CUT = "cut"  # requests still in flight at its last sample (`num_cut` of them)
    UNOBSERVED = "unobserved"  # no sample of its engine since the drain began: what it cut is unknown
    NOT_REMOVED = "not_removed"  # the pod expected to go was never deleted, and no pod was seen deleted in its place


class DrainEndReason(enum.StrEnum):
    """Why a drain's record was closed (`drains.end_reason`, migration 0026)."""

    EXITED = "exited"  # local: the process exited by itself after SIGTERM
    GRACE_EXPIRED = "grace_expired"  # still running when the grace ended (local: SIGKILL; Kubernetes: pod still there)
    POD_GONE = "pod_gone"  # Kubernetes: the pod is gone from the API server
    POD_NOT_DELETED = "pod_not_deleted"  # Kubernetes: the pod was still not being deleted long after the scale-down


# The tick tables are partitioned by `scheduled_at`, one partition per UTC day (migration 0017; partitions are
# created by `store.partitions`, dropped by `planner db prune --drop-partitions-older-than`). Every table of one
# tick's rows carries its tick's `scheduled_at` and references it by (tick_id, scheduled_at).
PARTITIONED = {"postgresql_partition_by": "RANGE (scheduled_at)"}
SCHEDULED_AT_COMMENT = (
    "The scheduled time of the tick the row belongs to (copied from ticks.scheduled_at): the partition key "
    "(migration 0017)"
)
DROPPED_TICK_COMMENT = (
    "A tick id (no foreign key since migration 0017): may name a tick whose partition retention dropped"
)
STAGE_COMMENT = (
    "The stage that set the targets (planner_core.domain.summary.DecisionStage: forecast, burst, hold, budget, "
    "plugin, load, ...); NULL before migration 0023"
)
SUMMARY_COMMENT = (
    "The decision in one line, the deciding stage's numbers first (at most 160 characters); NULL before migration "
    "0023 (tick_steps has the full chain)"
)


def _of_tick(*args: Any) -> tuple[Any, ...]:
    """`__table_args__` of a partitioned table of one tick's rows: the composite foreign key to its tick."""
    return (*args, ForeignKeyConstraint(["tick_id", "scheduled_at"], ["ticks.id", "ticks.scheduled_at"]), PARTITIONED)


def _tick_time() -> Any:
    return mapped_column(DateTime(timezone=True), primary_key=True, comment=SCHEDULED_AT_COMMENT)


def _enum_check(name: str, column: str, values: type[enum.Enum]) -> CheckConstraint:
    allowed = ", ".join(f"'{v.value}'" for v in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=name)


class PlannerConfigRow(Base):
    """Every config a tick ran under, by hash, so replay can recover it."""

    __tablename__ = "planner_configs"
    config_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    body: Mapped[dict[str, Any]]
    created_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class Deployment(Base):
    """A managed serving deployment (one DynamoGraphDeployment or one virtual-connector namespace)."""

    __tablename__ = "deployments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    mode: Mapped[str] = mapped_column(String(20))
    environment: Mapped[str] = mapped_column(String(40))
    config_hash: Mapped[str] = mapped_column(ForeignKey("planner_configs.config_hash"))
    created_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())
    config_revision: Mapped[int | None] = mapped_column(
        Integer, comment="The newest config revision (config_revisions); NULL before any (migration 0024)"
    )


class ConfigRevisionRow(Base):
    """One config revision of a deployment (migration 0024): from its file or a live retune, append-only. The
    trigger `config_revisions_guard` numbers them (the current revision plus one, else refused as stale), allows a
    `set` revision to `planner_operator` members only, sets `author` and moves `deployments.config_revision`."""

    __tablename__ = "config_revisions"
    __table_args__ = (
        UniqueConstraint("deployment_id", "revision", "config_hash"),
        CheckConstraint("source IN ('file', 'set')", name="source"),
        CheckConstraint("revision >= 1", name="revision"),
        {
            "comment": "Every config a deployment has run, numbered: from its file (source file) or a live retune "
            "(source set, planner_operator only); append-only (migration 0024)"
        },
    )
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    config_hash: Mapped[str] = mapped_column(ForeignKey("planner_configs.config_hash"))
    source: Mapped[str] = mapped_column(String(10))
    changes: Mapped[dict[str, Any]] = mapped_column(
        server_default=text("'{}'::jsonb"), comment="field -> [before, after] against the previous revision"
    )
    source_path: Mapped[str | None] = mapped_column(
        Text,
        comment="The config file whose folder relative paths (profile, perf table, warm-up trace) are taken from",
    )
    author: Mapped[str] = mapped_column(
        Text,
        server_default=text("SESSION_USER"),
        comment="The database login that wrote the revision (session_user, set by the trigger)",
    )
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class Tick(Base):
    """One run of a loop for one deployment at one scheduled time: recorded at most once."""

    __tablename__ = "ticks"
    __table_args__ = (
        UniqueConstraint("deployment_id", "loop", "scheduled_at"),
        CheckConstraint("loop IN ('throughput', 'load')", name="loop"),
        # Time ranges over both loops of a deployment (history queries, prune); migration 0003.
        Index("ix_ticks_deployment_id_scheduled_at", "deployment_id", "scheduled_at"),
        # Hourly roll-ups of throughput ticks (`sla_by_hour` filtered on its hour); migration 0003.
        Index(
            "ix_ticks_throughput_hour",
            "deployment_id",
            text("date_trunc('hour', scheduled_at, 'UTC')"),
            postgresql_where=text("loop = 'throughput'"),
        ),
        # The revision a tick ran, and its config hash is that revision's (migration 0024).
        ForeignKeyConstraint(
            ["deployment_id", "config_revision", "config_hash"],
            ["config_revisions.deployment_id", "config_revisions.revision", "config_revisions.config_hash"],
            name="fk_ticks_deployment_id_config_revisions",
        ),
        PARTITIONED,
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    loop: Mapped[str] = mapped_column(String(20))
    scheduled_at: Mapped[dt.datetime] = mapped_column(primary_key=True)
    # The table's key is (id, scheduled_at) (a partitioned table's keys hold its partition key); the id alone
    # names a tick, so the ORM looks rows up by it (`session.get(Tick, id)`).
    __mapper_args__ = {"primary_key": [id]}
    recorded_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())
    config_hash: Mapped[str] = mapped_column(ForeignKey("planner_configs.config_hash"))
    reason: Mapped[str] = mapped_column(String(60))
    # JSON text without the fields at their defaults (`to_jsonable(..., omit_defaults=True)`; migration 0019)
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON)
    previous_tick_id: Mapped[int | None] = mapped_column(BigInteger, comment=DROPPED_TICK_COMMENT)
    decide_ms: Mapped[float]
    flow_run_id: Mapped[str | None] = mapped_column(String(64))
    task_run_id: Mapped[str | None] = mapped_column(String(64))
    config_revision: Mapped[int | None] = mapped_column(
        Integer,
        comment="The config revision the tick ran (config_revisions); NULL on ticks recorded before migration 0024",
    )


class TrafficObservationRow(Base):
    """Frontend traffic the tick saw over its window."""

    __tablename__ = "traffic_observations"
    __table_args__ = _of_tick()
    tick_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    scheduled_at: Mapped[dt.datetime] = _tick_time()
    __mapper_args__ = {"primary_key": [tick_id]}  # one row per tick: the ORM looks it up by the tick id
    window_s: Mapped[float]
    num_req: Mapped[float]
    isl: Mapped[float]
    osl: Mapped[float]
    isl_p90: Mapped[float | None]
    osl_p90: Mapped[float | None]
    isl_p50: Mapped[float | None]
    isl_p99: Mapped[float | None]
    osl_p50: Mapped[float | None]
    osl_p99: Mapped[float | None]
    ttft_ms: Mapped[float | None]
    itl_ms: Mapped[float | None]
    kv_hit_rate: Mapped[float | None] = mapped_column(
        comment="Fraction (0..1) of the window's prompt tokens served from the KV cache (the router's hit rate). "
        "NULL where the source does not report it"
    )
    accept_length: Mapped[float | None] = mapped_column(
        comment="Speculative decoding: mean tokens accepted per decode step over the window (tokens per step). "
        "NULL where the source does not report it"
    )
    ttft_ms_p95: Mapped[float | None] = mapped_column(
        comment="95th percentile of the time to first token of the window's requests (ms), as the frontend "
        "measured it. NULL where the source does not report it"
    )
    ttft_ms_p99: Mapped[float | None] = mapped_column(
        comment="99th percentile of the time to first token of the window's requests (ms), as the frontend "
        "measured it. NULL where the source does not report it"
    )
    queue_ms: Mapped[float | None] = mapped_column(
        comment="Mean time the window's requests waited at the frontend for a first token (ms). NULL where the "
        "source does not report it"
    )
    # The prompt-token arrival curve, one column per field of `PROMPT_ARRIVAL_INTERVALS_S`; their comments are set
    # below from that dict (so a field added there without a column here fails at import).
    prompt_tokens_p99_250ms: Mapped[float | None]
    prompt_tokens_p99_500ms: Mapped[float | None]
    prompt_tokens_p99_1s: Mapped[float | None]
    prompt_tokens_p99_2s: Mapped[float | None]
    prompt_tokens_p99_5s: Mapped[float | None]
    prompt_tokens_p99_10s: Mapped[float | None]
    prompt_tokens_p99_30s: Mapped[float | None]


def _arrival_curve_comment(interval_s: float) -> str:
    """The comment migration 0007 gives the arrival-curve column of `interval_s`."""
    span = f"{interval_s * 1000:g} ms" if interval_s < 1 else f"{interval_s:g} s"
    return (
        f"Prompt-token arrival curve, {span} point (tokens): the 99th percentile over the window's requests of "
        f"the prompt tokens that arrived in the {span} up to each one, its own included. NULL where the source "
        "does not timestamp requests"
    )


for _name, _interval_s in PROMPT_ARRIVAL_INTERVALS_S.items():
    TrafficObservationRow.__table__.c[_name].comment = _arrival_curve_comment(_interval_s)


class WorkerObservationRow(Base):
    """Worker counts the tick saw (ready now, expected by the orchestrator)."""

    __tablename__ = "worker_observations"
    __table_args__ = _of_tick()
    tick_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    scheduled_at: Mapped[dt.datetime] = _tick_time()
    __mapper_args__ = {"primary_key": [tick_id]}  # one row per tick: the ORM looks it up by the tick id
    ready_prefill: Mapped[int]
    ready_decode: Mapped[int]
    expected_prefill: Mapped[int]
    expected_decode: Mapped[int]
    # What an SLO-aware router could not place (`TickInputs.unplaced`); comments set below, as in migration 0010.
    waiting_prefill: Mapped[int | None]
    waiting_decode: Mapped[int | None]
    unplaced_prefill: Mapped[int | None]
    unplaced_decode: Mapped[int | None]
    rejected_prefill: Mapped[int | None]
    rejected_decode: Mapped[int | None]


_UNPLACED_COMMENTS = {
    "waiting": "Requests waiting at the frontend for the {pool} pool at the tick (an SLO-aware router found no engine "
    "predicted within the SLO for them yet). NULL where the router does not report it",
    "unplaced": "Requests the router found no available endpoint for in the {pool} stage since the previous report "
    "(each counted once per stage). NULL where the router does not report it",
    "rejected": "Of the unplaced requests of the {pool} stage, those the frontend rejected. NULL where the router does "
    "not report it",
}
for _what, _comment in _UNPLACED_COMMENTS.items():
    for _pool in ("prefill", "decode"):
        WorkerObservationRow.__table__.c[f"{_what}_{_pool}"].comment = _comment.format(pool=_pool)


class PredictionRow(Base):
    """Forecast of the next window made by a throughput tick."""

    __tablename__ = "predictions"
    __table_args__ = _of_tick()
    tick_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    scheduled_at: Mapped[dt.datetime] = _tick_time()
    __mapper_args__ = {"primary_key": [tick_id]}  # one row per tick: the ORM looks it up by the tick id
    predictor: Mapped[str] = mapped_column(String(40))
    num_req: Mapped[float]
    isl: Mapped[float]
    osl: Mapped[float]
    reason: Mapped[str] = mapped_column(String(60))
    quantile: Mapped[str | None] = mapped_column(String(8))
    isl_quantile: Mapped[float | None]
    osl_quantile: Mapped[float | None]


class ProposalRow(Base):
    """A loop's proposed replica count for one pool, with its reason."""

    __tablename__ = "proposals"
    __table_args__ = _of_tick(UniqueConstraint("tick_id", "component", "scheduled_at"))
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tick_id: Mapped[int] = mapped_column(BigInteger)
    scheduled_at: Mapped[dt.datetime] = _tick_time()
    __mapper_args__ = {"primary_key": [id]}
    component: Mapped[str] = mapped_column(String(20))
    current: Mapped[int]
    desired: Mapped[int]
    reason: Mapped[str] = mapped_column(String(60))


STEP_TEMPLATES_COMMENT = (
    "What the same step of many ticks shares: its name, component, reason and detail with each number replaced by "
    "a placeholder (chr(31)); tick_step_lists.packed holds the numbers (migration 0018)"
)


class StepTemplateRow(Base):
    """What the same step of many ticks shares: name, component, reason and the detail with its numbers taken out
    (`step_packing`); stored once, referenced by id from `tick_step_lists.packed` (migration 0018). The column
    bounds are the ones a step always had."""

    __tablename__ = "step_templates"
    __table_args__ = (
        Index(
            "uq_step_templates_key",
            func.md5(text("template")),
            "step",
            "component",
            "reason",
            unique=True,
            postgresql_nulls_not_distinct=True,
        ),
        {"comment": STEP_TEMPLATES_COMMENT},
    )
    id: Mapped[int] = mapped_column(Integer, Identity(), primary_key=True)
    step: Mapped[str] = mapped_column(String(80))
    component: Mapped[str | None] = mapped_column(String(20))
    reason: Mapped[str] = mapped_column(String(60))
    template: Mapped[str] = mapped_column(Text)


class TickStepListRow(Base):
    """A tick's explanation, all its steps in order in one row: per step its template id, value and the numbers of
    its detail (`step_packing.record_steps`). The view `tick_steps` gives it back one row per step (migrations 0015,
    0018)."""

    __tablename__ = "tick_step_lists"
    __table_args__ = _of_tick(
        CheckConstraint(r"packed ~ '^[0-9]+,[^;,]*(,[^;,]*)*(;[0-9]+,[^;,]*(,[^;,]*)*)*$'", name="packed_form")
    )
    tick_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    scheduled_at: Mapped[dt.datetime] = _tick_time()
    __mapper_args__ = {"primary_key": [tick_id]}  # one row per tick: the ORM looks it up by the tick id
    packed: Mapped[str] = mapped_column(Text)


class PlannerStateRow(Base):
    """The planner state after a tick: a delta (`delta`, `planner_core.runtime.store.state_delta`) against the state of
    `base_tick_id`, the deployment's previous tick, with a whole state at least every `FULL_STATE_EVERY` rows
    (migration 0016): since migration 0020 a delta from nothing (`{"=": state}`, no base), before it JSONB in
    `state`. `repository.state_json` rebuilds any of them."""

    __tablename__ = "planner_states"
    # A deployment's newest state (`latest_state`, every tick) in one index probe; migration 0003.
    __table_args__ = _of_tick(
        Index("ix_planner_states_deployment_id_tick_id", "deployment_id", "tick_id"),
        CheckConstraint(
            "(state IS NULL) <> (delta IS NULL) AND (state IS NULL OR base_tick_id IS NULL)",
            name="full_or_delta",
        ),
    )
    tick_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    scheduled_at: Mapped[dt.datetime] = _tick_time()
    __mapper_args__ = {"primary_key": [tick_id]}  # one row per tick: the ORM looks it up by the tick id
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    # None is SQL NULL (not JSON null): the check tells a JSONB row from a delta row by it. A delta is stored
    # zlib-compressed with a preset dictionary (`state_delta.encode_delta`): Postgres never compresses a row this
    # small, and a whole state so compressed takes ~3.4 kB where JSONB took ~5.5 kB.
    state: Mapped[dict[str, Any] | None] = mapped_column(JSONB(none_as_null=True))
    delta: Mapped[bytes | None] = mapped_column(LargeBinary)
    # The previous tick of the same deployment, always in the same partition (a tick whose previous tick is in
    # another day stores its state whole: `partitions.same_partition`), so dropping a day never strands a delta.
    # No foreign key (a partitioned table's key includes `scheduled_at`); `prune` rebuilds a delta whole before it
    # deletes its base.
    base_tick_id: Mapped[int | None] = mapped_column(BigInteger, index=True)


class DecisionRow(Base):
    """A scaling decision in the outbox, with its status lifecycle."""

    __tablename__ = "decisions"
    __table_args__ = (_enum_check("status", "status", DecisionStatus),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    tick_id: Mapped[int] = mapped_column(BigInteger, unique=True, comment=DROPPED_TICK_COMMENT)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), index=True)
    target_prefill: Mapped[int | None]
    target_decode: Mapped[int | None]
    reason: Mapped[str] = mapped_column(String(60))
    status: Mapped[str] = mapped_column(String(30))
    created_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())
    status_changed_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())
    # The stage that set the targets and the decision in one line (`planner_core.domain.summary`; migration 0023).
    # NULL on decisions recorded before 0023: `decision_history` shows their headline reason and step chain.
    stage: Mapped[str | None] = mapped_column(String(20), comment=STAGE_COMMENT)
    summary: Mapped[str | None] = mapped_column(Text, comment=SUMMARY_COMMENT)


class ExecutionRow(Base):
    """One attempt of the execution flow to apply a decision through a connector."""

    __tablename__ = "executions"
    __table_args__ = (
        UniqueConstraint("decision_id", "attempt"),
        _enum_check("outcome", "outcome", ExecutionOutcome),
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"), index=True)
    attempt: Mapped[int]
    connector: Mapped[str] = mapped_column(String(40))
    executed_at: Mapped[dt.datetime]
    outcome: Mapped[str] = mapped_column(String(40))
    detail: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class LocalWorkerRow(Base):
    """One engine process the local connector started; what it needs to find the process again after a restart."""

    __tablename__ = "local_workers"
    __table_args__ = (_enum_check("status", "status", LocalWorkerStatus),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), index=True)
    role: Mapped[str] = mapped_column(String(20))
    pid: Mapped[int]
    # the process' start time in clock ticks since boot (/proc/PID/stat): a recycled pid never matches it
    proc_start_ticks: Mapped[int] = mapped_column(BigInteger)
    command: Mapped[list] = mapped_column(JSONB)
    log_path: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(20))
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id"))  # the decision that started it
    started_at: Mapped[dt.datetime]
    ready_at: Mapped[dt.datetime | None]
    drain_started_at: Mapped[dt.datetime | None]
    ended_at: Mapped[dt.datetime | None]
    end_detail: Mapped[str | None] = mapped_column(Text)
    metrics_port: Mapped[int | None] = mapped_column(
        comment="TCP port the worker serves its Prometheus metrics on (DYN_SYSTEM_PORT); NULL = none"
    )


END_REASON_COMMENT = "Why the record was closed (DrainEndReason); NULL while open, and before migration 0026"
TERMINATING_AT_COMMENT = (
    "Kubernetes: when the kubelet began terminating the pod (its deletionTimestamp less its deletion grace); NULL "
    "if the planner never saw it terminating (migration 0026)"
)
LAST_SAMPLE_AT_COMMENT = (
    "Kubernetes: when the engine's last forward-pass sample that num_cut counts from was received (migration 0026)"
)


class DrainRow(Base):
    """One engine a scale-down removed: its load when the drain started, what the drain waited for and cut.

    Written by the connector that removed it (local: at SIGTERM, completed when the process exits or is killed;
    Kubernetes: the pods given the lowest deletion cost, handed over to the ReplicaSet controller, then followed by
    the execution runs until each pod is gone and completed from its engine's last sample, migration 0026). Counts
    are the engine's in-flight requests from a forward-pass sample; NULL = unknown (no sample for the engine).
    """

    __tablename__ = "drains"
    __table_args__ = (
        _enum_check("outcome", "outcome", DrainOutcome),
        _enum_check("end_reason", "end_reason", DrainEndReason),
        Index("ix_drains_deployment_id_started_at", "deployment_id", "started_at"),
        {"comment": "Every engine a scale-down removed: in flight at the start, waited for, cut (migration 0025)"},
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id"))
    connector: Mapped[str] = mapped_column(String(40))
    role: Mapped[str] = mapped_column(String(20))
    engine: Mapped[str] = mapped_column(String(300))  # "local worker 12 (pid 4711)", "pod ns/name"
    local_worker_id: Mapped[int | None] = mapped_column(ForeignKey("local_workers.id"))  # local connector only
    worker_ids: Mapped[str | None] = mapped_column(Text)  # its Dynamo instance ids (fpm_samples.worker_id), comma
    started_at: Mapped[dt.datetime]
    grace_s: Mapped[float]
    num_in_flight_at_start: Mapped[int | None]
    ended_at: Mapped[dt.datetime | None]
    duration_s: Mapped[float | None]
    num_waited_for: Mapped[int | None]
    num_cut: Mapped[int | None]
    outcome: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str | None] = mapped_column(Text)
    end_reason: Mapped[str | None] = mapped_column(String(20), comment=END_REASON_COMMENT)
    terminating_at: Mapped[dt.datetime | None] = mapped_column(comment=TERMINATING_AT_COMMENT)
    last_sample_at: Mapped[dt.datetime | None] = mapped_column(comment=LAST_SAMPLE_AT_COMMENT)


class LocalConnectorStateRow(Base):
    """The pool sizes the local connector keeps, and the decision they come from (None = the minimum endpoints)."""

    __tablename__ = "local_connector_state"
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    target_prefill: Mapped[int]
    target_decode: Mapped[int]
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id"))
    updated_at: Mapped[dt.datetime]


class VirtualConnectorStateRow(Base):
    """The virtual connector's shared keys for one deployment (Dynamo's etcd keys, in Postgres)."""

    __tablename__ = "virtual_connector_state"
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    num_prefill_workers: Mapped[int] = mapped_column(server_default="-1")
    num_decode_workers: Mapped[int] = mapped_column(server_default="-1")
    decision_id: Mapped[int] = mapped_column(server_default="-1")
    scaled_decision_id: Mapped[int] = mapped_column(server_default="-1")
    # Workers the orchestrator reports as serving (-1 = never reported); Dynamo discovers these at runtime.
    ready_prefill_workers: Mapped[int] = mapped_column(server_default="-1")
    ready_decode_workers: Mapped[int] = mapped_column(server_default="-1")
    first_skip_at: Mapped[dt.datetime | None]
    updated_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class VirtualDecisionRow(Base):
    """Every decision written to the virtual connector, and when the orchestrator acknowledged it."""

    __tablename__ = "virtual_decisions"
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    decision_id: Mapped[int] = mapped_column(primary_key=True)
    planner_decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"), unique=True)
    num_prefill_workers: Mapped[int]
    num_decode_workers: Mapped[int]
    written_at: Mapped[dt.datetime]
    acknowledged_at: Mapped[dt.datetime | None]


class AuditLogRow(Base):
    """Append-only audit trail; a trigger makes the database refuse UPDATE, DELETE and TRUNCATE, and another
    chains each row to the one before (`prev_hash`, `row_hash`: set by the database, never by the writer)."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(server_default=func.now())
    deployment_id: Mapped[int | None] = mapped_column(ForeignKey("deployments.id"))
    tick_id: Mapped[int | None] = mapped_column(BigInteger, comment=DROPPED_TICK_COMMENT)
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id"))
    event: Mapped[str] = mapped_column(String(60))
    detail: Mapped[dict[str, Any]]
    prev_hash: Mapped[bytes] = mapped_column(LargeBinary)
    row_hash: Mapped[bytes] = mapped_column(LargeBinary)


class AuditChainHead(Base):
    """The newest row of the audit log's hash chain (one row, id 1): the `audit_log_chain` trigger locks and
    moves it on every audit insert; the writer role may only read it."""

    __tablename__ = "audit_chain_head"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)
    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    last_id: Mapped[int | None] = mapped_column(BigInteger)
    last_hash: Mapped[bytes] = mapped_column(LargeBinary)


class FpmSampleRow(Base):
    """One forward-pass metrics message as an engine published it (raw samples, kept for a retention period).

    Written in batches by `planner ingest`, idle heartbeats (`wall_time` 0) included: they are an idle engine's only
    report, and the engines' load (`runtime.engine_load`) reads them as "idle now". `received_at` is the ingest's
    clock when the message arrived; the load tick reads the newest sample per engine (component, worker, dp_rank).
    """

    __tablename__ = "fpm_samples"
    __table_args__ = (Index("ix_fpm_samples_deployment_id_received_at", "deployment_id", "received_at"),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    received_at: Mapped[dt.datetime]
    component: Mapped[str] = mapped_column(String(20))
    worker_id: Mapped[str] = mapped_column(String(200))
    dp_rank: Mapped[int]
    counter_id: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int | None]
    wall_time_s: Mapped[float]
    scheduled_num_prefill_requests: Mapped[int]
    scheduled_sum_prefill_tokens: Mapped[int] = mapped_column(BigInteger)
    scheduled_var_prefill_length: Mapped[float]
    scheduled_sum_prefill_kv_tokens: Mapped[int] = mapped_column(BigInteger)
    scheduled_num_decode_requests: Mapped[int]
    scheduled_sum_decode_kv_tokens: Mapped[int] = mapped_column(BigInteger)
    scheduled_var_decode_kv_tokens: Mapped[float]
    queued_num_prefill_requests: Mapped[int]
    queued_sum_prefill_tokens: Mapped[int] = mapped_column(BigInteger)
    queued_var_prefill_length: Mapped[float]
    queued_num_decode_requests: Mapped[int]
    queued_sum_decode_kv_tokens: Mapped[int] = mapped_column(BigInteger)
    queued_var_decode_kv_tokens: Mapped[float]


class ReplayMode(enum.StrEnum):
    """Which state a replayed tick starts from."""

    RECORDED = "recorded"  # the state the original run had before the tick: checks every tick on its own
    CHAINED = "chained"  # the previous replayed tick's state: a what-if trajectory under another config


class ReplayTickOutcome(enum.StrEnum):
    """How a replayed tick compares with the recorded one."""

    IDENTICAL = "identical"  # same reason, decision, proposals, forecast, steps and next state
    DIFFERING = "differing"  # at least one of those differs; `differences` lists the fields
    SKIPPED = "skipped"  # not replayable: a state it needs was pruned (see `detail`)


class ReplayRunRow(Base):
    """One `planner replay` run: what was replayed, under which config and code, and the tallies."""

    __tablename__ = "replay_runs"
    __table_args__ = (_enum_check("mode", "mode", ReplayMode),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"))
    started_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())
    finished_at: Mapped[dt.datetime | None]
    range_start: Mapped[dt.datetime]
    range_end: Mapped[dt.datetime]
    mode: Mapped[str] = mapped_column(String(20))
    config_source: Mapped[str] = mapped_column(Text)  # "recorded", or the path of the what-if config file
    config_hash: Mapped[str | None] = mapped_column(String(64))  # the what-if config's hash
    config_body: Mapped[dict[str, Any] | None]  # the what-if config (never added to planner_configs)
    profile_dir: Mapped[str | None] = mapped_column(Text)
    code_version: Mapped[str] = mapped_column(String(120))
    num_ticks: Mapped[int]
    num_identical: Mapped[int]
    num_differing: Mapped[int]
    num_skipped: Mapped[int]
    elapsed_s: Mapped[float]


class ReplayTickRow(Base):
    """One replayed tick: the replayed headline and targets, and what differs from the recorded tick."""

    __tablename__ = "replay_ticks"
    __table_args__ = (_enum_check("outcome", "outcome", ReplayTickOutcome),)
    run_id: Mapped[int] = mapped_column(ForeignKey("replay_runs.id", ondelete="CASCADE"), primary_key=True)
    tick_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, comment=DROPPED_TICK_COMMENT)
    outcome: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(String(60))
    target_prefill: Mapped[int | None]
    target_decode: Mapped[int | None]
    differences: Mapped[list[Any] | None]  # [{"field", "recorded", "replayed"}, ...]; None when identical
    detail: Mapped[str | None] = mapped_column(Text)


class PruneWatermarkRow(Base):
    """How far `planner db prune` got: ticks of this deployment and loop up to `pruned_through` are pruned."""

    __tablename__ = "prune_watermarks"
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    loop: Mapped[str] = mapped_column(String(20), primary_key=True)
    pruned_through: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class FleetMemberRow(Base):
    """A managed deployment ticked by the fleet control plane, with its share of the GPU budget (migration 0014)."""

    __tablename__ = "fleet_members"
    __table_args__ = (
        CheckConstraint("min_gpus >= 0", name="min_gpus_non_negative"),
        CheckConstraint("max_gpus IS NULL OR max_gpus >= min_gpus", name="max_over_min"),
        CheckConstraint("weight > 0", name="weight_positive"),
        {"comment": "Managed deployments ticked by the fleet control plane, with their share of the GPU budget"},
    )
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    config_path: Mapped[str] = mapped_column(Text, comment="The PlannerConfig file the deployment runs")
    min_gpus: Mapped[int] = mapped_column(Integer, comment="GPUs it always keeps, whatever the budget")
    max_gpus: Mapped[int | None] = mapped_column(Integer, comment="GPUs it may never exceed; NULL: no maximum")
    priority: Mapped[int] = mapped_column(Integer, comment="Higher is served first when over budget")
    weight: Mapped[float] = mapped_column(comment="Share within its priority tier (> 0)")
    added_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class FleetBudgetRow(Base):
    """The fleet's GPU budget: one row, or none (no budget, nothing arbitrated)."""

    __tablename__ = "fleet_budget"
    __table_args__ = (
        CheckConstraint("id = 1", name="single_row"),
        CheckConstraint("budget_gpus >= 0", name="non_negative"),
        {"comment": "The fleet's GPU budget (one row); no row: no fleet budget, nothing is arbitrated"},
    )
    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    budget_gpus: Mapped[int] = mapped_column(Integer, comment="GPUs the whole fleet may use")
    updated_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class ArbitrationRoundRow(Base):
    """One arbitration of the fleet's GPU budget, with the inputs it ran on."""

    __tablename__ = "arbitration_rounds"
    __table_args__ = ({"comment": "One GPU budget arbitration across the fleet per fleet tick"},)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    scheduled_at: Mapped[dt.datetime] = mapped_column(unique=True)
    budget_gpus: Mapped[int] = mapped_column(Integer)
    inputs: Mapped[dict[str, Any]] = mapped_column(
        comment="The ArbitrationRound (budget and claims) that arbitrate() ran on: replay reads it"
    )
    recorded_at: Mapped[dt.datetime] = mapped_column(server_default=func.now())


class ArbitrationGrantRow(Base):
    """One deployment's grant in a round, with its reason and the decision it capped."""

    __tablename__ = "arbitration_grants"
    __table_args__ = (
        # The grants of the decisions the arbitration applied to, first round first (replay's lookup); migration 0022.
        Index(
            "ix_arbitration_grants_decision_id",
            "decision_id",
            "round_id",
            postgresql_where=text("decision_id IS NOT NULL"),
        ),
        {"comment": "Each deployment's GPU grant in an arbitration round, with its reason code"},
    )
    round_id: Mapped[int] = mapped_column(ForeignKey("arbitration_rounds.id"), primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), primary_key=True)
    decision_id: Mapped[int | None] = mapped_column(
        ForeignKey("decisions.id"), comment="The pending decision it applied to"
    )
    proposed_gpus: Mapped[int] = mapped_column(Integer)
    request_gpus: Mapped[int] = mapped_column(Integer)
    granted_gpus: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(60))
    proposed_prefill: Mapped[int | None] = mapped_column(Integer, comment="The decision's targets before the grant")
    proposed_decode: Mapped[int | None] = mapped_column(Integer)
    granted_prefill: Mapped[int | None] = mapped_column(Integer, comment="The decision's targets under the grant")
    granted_decode: Mapped[int | None] = mapped_column(Integer)
