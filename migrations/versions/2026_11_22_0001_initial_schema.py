"""Initial schema: the planner's system of record.

Why: every tick's inputs, forecast, proposals, explanation steps, decision, state and the execution of the
decision must be queryable in SQL and replayable. Creates the tables, the append-only trigger on `audit_log`
(UPDATE, DELETE and TRUNCATE are refused by the database) and the documented views `decision_history` and
`tick_history`.
Locks: creates new objects only; no existing table is locked.
Downgrade: drops the views, the trigger function and every table (all recorded history is lost).

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22 00:44:19.114055
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "planner_configs",
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("config_hash", name=op.f("pk_planner_configs")),
    )
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("environment", sa.String(length=40), nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["config_hash"],
            ["planner_configs.config_hash"],
            name=op.f("fk_deployments_config_hash_planner_configs"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployments")),
        sa.UniqueConstraint("name", name=op.f("uq_deployments_name")),
    )
    op.create_table(
        "ticks",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("loop", sa.String(length=20), nullable=False),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.Column("inputs", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("previous_tick_id", sa.BigInteger(), nullable=True),
        sa.Column("decide_ms", sa.Double(), nullable=False),
        sa.Column("flow_run_id", sa.String(length=64), nullable=True),
        sa.Column("task_run_id", sa.String(length=64), nullable=True),
        sa.CheckConstraint("loop IN ('throughput', 'load')", name=op.f("ck_ticks_loop")),
        sa.ForeignKeyConstraint(
            ["config_hash"],
            ["planner_configs.config_hash"],
            name=op.f("fk_ticks_config_hash_planner_configs"),
        ),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], name=op.f("fk_ticks_deployment_id_deployments")),
        sa.ForeignKeyConstraint(["previous_tick_id"], ["ticks.id"], name=op.f("fk_ticks_previous_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ticks")),
        sa.UniqueConstraint(
            "deployment_id", "loop", "scheduled_at", name=op.f("uq_ticks_deployment_id_loop_scheduled_at")
        ),
    )
    op.create_index(op.f("ix_ticks_deployment_id"), "ticks", ["deployment_id"], unique=False)
    op.create_table(
        "virtual_connector_state",
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("num_prefill_workers", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("num_decode_workers", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("decision_id", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("scaled_decision_id", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("ready_prefill_workers", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("ready_decode_workers", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("first_skip_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name=op.f("fk_virtual_connector_state_deployment_id_deployments"),
        ),
        sa.PrimaryKeyConstraint("deployment_id", name=op.f("pk_virtual_connector_state")),
    )
    op.create_table(
        "decisions",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("target_prefill", sa.Integer(), nullable=True),
        sa.Column("target_decode", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.Column("status", sa.String(length=30), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("status_changed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'superseded', 'advisory', 'noop', 'applied', 'acknowledged', 'failed')",
            name=op.f("ck_decisions_status"),
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_decisions_deployment_id_deployments")
        ),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_decisions_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
        sa.UniqueConstraint("tick_id", name=op.f("uq_decisions_tick_id")),
    )
    op.create_index(op.f("ix_decisions_deployment_id"), "decisions", ["deployment_id"], unique=False)
    op.create_table(
        "fpm_snapshots",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("dp_rank", sa.Integer(), nullable=False),
        sa.Column("wall_time_s", sa.Double(), nullable=False),
        sa.Column("metrics", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_fpm_snapshots_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fpm_snapshots")),
    )
    op.create_index(op.f("ix_fpm_snapshots_tick_id"), "fpm_snapshots", ["tick_id"], unique=False)
    op.create_table(
        "planner_states",
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("state", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_planner_states_deployment_id_deployments")
        ),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_planner_states_tick_id_ticks")),
        sa.PrimaryKeyConstraint("tick_id", name=op.f("pk_planner_states")),
    )
    op.create_index(op.f("ix_planner_states_deployment_id"), "planner_states", ["deployment_id"], unique=False)
    op.create_table(
        "predictions",
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("predictor", sa.String(length=40), nullable=False),
        sa.Column("num_req", sa.Double(), nullable=False),
        sa.Column("isl", sa.Double(), nullable=False),
        sa.Column("osl", sa.Double(), nullable=False),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_predictions_tick_id_ticks")),
        sa.PrimaryKeyConstraint("tick_id", name=op.f("pk_predictions")),
    )
    op.create_table(
        "proposals",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=False),
        sa.Column("current", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_proposals_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_proposals")),
        sa.UniqueConstraint("tick_id", "component", name=op.f("uq_proposals_tick_id_component")),
    )
    op.create_table(
        "tick_steps",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=80), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=True),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_tick_steps_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tick_steps")),
        sa.UniqueConstraint("tick_id", "seq", name=op.f("uq_tick_steps_tick_id_seq")),
    )
    op.create_table(
        "traffic_observations",
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("window_s", sa.Double(), nullable=False),
        sa.Column("num_req", sa.Double(), nullable=False),
        sa.Column("isl", sa.Double(), nullable=False),
        sa.Column("osl", sa.Double(), nullable=False),
        sa.Column("isl_p90", sa.Double(), nullable=True),
        sa.Column("osl_p90", sa.Double(), nullable=True),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.Column("itl_ms", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_traffic_observations_tick_id_ticks")),
        sa.PrimaryKeyConstraint("tick_id", name=op.f("pk_traffic_observations")),
    )
    op.create_table(
        "worker_observations",
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("ready_prefill", sa.Integer(), nullable=False),
        sa.Column("ready_decode", sa.Integer(), nullable=False),
        sa.Column("expected_prefill", sa.Integer(), nullable=False),
        sa.Column("expected_decode", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_worker_observations_tick_id_ticks")),
        sa.PrimaryKeyConstraint("tick_id", name=op.f("pk_worker_observations")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=True),
        sa.Column("tick_id", sa.BigInteger(), nullable=True),
        sa.Column("decision_id", sa.BigInteger(), nullable=True),
        sa.Column("event", sa.String(length=60), nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"], name=op.f("fk_audit_log_decision_id_decisions")),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_audit_log_deployment_id_deployments")
        ),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_audit_log_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_table(
        "executions",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("connector", sa.String(length=40), nullable=False),
        sa.Column("executed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=40), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "outcome IN ('applied', 'noop', 'blocked_unacknowledged', 'superseded', 'failed')",
            name=op.f("ck_executions_outcome"),
        ),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"], name=op.f("fk_executions_decision_id_decisions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_executions")),
        sa.UniqueConstraint("decision_id", "attempt", name=op.f("uq_executions_decision_id_attempt")),
    )
    op.create_index(op.f("ix_executions_decision_id"), "executions", ["decision_id"], unique=False)
    op.create_table(
        "virtual_decisions",
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.Column("planner_decision_id", sa.BigInteger(), nullable=False),
        sa.Column("num_prefill_workers", sa.Integer(), nullable=False),
        sa.Column("num_decode_workers", sa.Integer(), nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_virtual_decisions_deployment_id_deployments")
        ),
        sa.ForeignKeyConstraint(
            ["planner_decision_id"],
            ["decisions.id"],
            name=op.f("fk_virtual_decisions_planner_decision_id_decisions"),
        ),
        sa.PrimaryKeyConstraint("deployment_id", "decision_id", name=op.f("pk_virtual_decisions")),
        sa.UniqueConstraint("planner_decision_id", name=op.f("uq_virtual_decisions_planner_decision_id")),
    )

    for statement in _UPGRADE_SQL:
        op.execute(statement)


def downgrade() -> None:
    for statement in _DOWNGRADE_SQL:
        op.execute(statement)
    op.drop_table("virtual_decisions")
    op.drop_index(op.f("ix_executions_decision_id"), table_name="executions")
    op.drop_table("executions")
    op.drop_table("audit_log")
    op.drop_table("worker_observations")
    op.drop_table("traffic_observations")
    op.drop_table("tick_steps")
    op.drop_table("proposals")
    op.drop_table("predictions")
    op.drop_index(op.f("ix_planner_states_deployment_id"), table_name="planner_states")
    op.drop_table("planner_states")
    op.drop_index(op.f("ix_fpm_snapshots_tick_id"), table_name="fpm_snapshots")
    op.drop_table("fpm_snapshots")
    op.drop_index(op.f("ix_decisions_deployment_id"), table_name="decisions")
    op.drop_table("decisions")
    op.drop_table("virtual_connector_state")
    op.drop_index(op.f("ix_ticks_deployment_id"), table_name="ticks")
    op.drop_table("ticks")
    op.drop_table("deployments")
    op.drop_table("planner_configs")
    op.execute("DROP FUNCTION IF EXISTS audit_log_refuse_change()")


_UPGRADE_SQL = [
    """
    CREATE FUNCTION audit_log_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP USING ERRCODE = 'insufficient_privilege';
    END
    $$
    """,
    """
    CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_refuse_change()
    """,
    """
    CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_refuse_change()
    """,
    """
    CREATE VIEW tick_history AS
    SELECT t.id AS tick_id,
           dep.name AS deployment,
           t.loop,
           t.scheduled_at,
           t.reason,
           o.num_req AS observed_num_req, o.isl AS observed_isl, o.osl AS observed_osl,
           o.ttft_ms AS observed_ttft_ms, o.itl_ms AS observed_itl_ms,
           p.num_req AS predicted_num_req, p.isl AS predicted_isl, p.osl AS predicted_osl,
           p.reason AS prediction_reason,
           w.ready_prefill, w.ready_decode, w.expected_prefill, w.expected_decode,
           pp.desired AS proposed_prefill, pd.desired AS proposed_decode,
           d.id AS decision_id,
           t.decide_ms,
           t.config_hash
    FROM ticks t
    JOIN deployments dep ON dep.id = t.deployment_id
    LEFT JOIN traffic_observations o ON o.tick_id = t.id
    LEFT JOIN predictions p ON p.tick_id = t.id
    LEFT JOIN worker_observations w ON w.tick_id = t.id
    LEFT JOIN proposals pp ON pp.tick_id = t.id AND pp.component = 'prefill'
    LEFT JOIN proposals pd ON pd.tick_id = t.id AND pd.component = 'decode'
    LEFT JOIN decisions d ON d.tick_id = t.id
    """,
    """
    COMMENT ON VIEW tick_history IS
    'One row per recorded tick: what it observed, predicted and proposed, and the decision it made (if any).'
    """,
    """
    CREATE VIEW decision_history AS
    SELECT d.id AS decision_id,
           dep.name AS deployment,
           t.loop,
           t.scheduled_at AS decided_at,
           w.ready_prefill AS prefill_before,
           w.ready_decode AS decode_before,
           d.target_prefill,
           d.target_decode,
           d.reason,
           (SELECT string_agg(s.step || ': ' || s.reason || COALESCE(' (' || s.component || ')', ''), '; '
                              ORDER BY s.seq)
              FROM tick_steps s
             WHERE s.tick_id = t.id AND s.reason NOT IN ('observed', 'within_range')) AS why,
           p.num_req AS predicted_num_req,
           p.isl AS predicted_isl,
           p.osl AS predicted_osl,
           d.status,
           d.status_changed_at,
           e.num_attempts,
           e.last_outcome,
           e.last_executed_at,
           v.decision_id AS virtual_decision_id,
           v.acknowledged_at,
           t.id AS tick_id,
           t.config_hash
    FROM decisions d
    JOIN ticks t ON t.id = d.tick_id
    JOIN deployments dep ON dep.id = d.deployment_id
    LEFT JOIN worker_observations w ON w.tick_id = t.id
    LEFT JOIN predictions p ON p.tick_id = t.id
    LEFT JOIN LATERAL (
        SELECT count(*) AS num_attempts,
               (array_agg(x.outcome ORDER BY x.attempt DESC))[1] AS last_outcome,
               max(x.executed_at) AS last_executed_at
          FROM executions x
         WHERE x.decision_id = d.id
    ) e ON true
    LEFT JOIN virtual_decisions v ON v.planner_decision_id = d.id
    """,
    """
    COMMENT ON VIEW decision_history IS
    'What the planner decided (targets), when (the tick''s scheduled time), why (reason and the non-trivial '
    'explanation steps) and what happened (status, execution attempts, virtual-connector acknowledgement).'
    """,
]

_DOWNGRADE_SQL = [
    "DROP VIEW IF EXISTS decision_history",
    "DROP VIEW IF EXISTS tick_history",
    "DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log",
    "DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log",
]
