"""Local connector: the engine processes it started (`local_workers`), the pool sizes it keeps
(`local_connector_state`), and the execution outcome `reconciled`.

Why: `environment: local` starts and stops engine processes on the planner's machine. Flow runs are short-lived
subprocesses, so which processes belong to a deployment (pid and process start time, to tell a recycled pid apart),
their state (starting, ready, draining, stopped, killed, died) and the sizes in force live in Postgres; a planner
restarted later finds the workers still running there and adopts them. What the connector does between decisions
(a dead worker replaced, a drain finished, the targets reached) is an `executions` row with the outcome
`reconciled`, recorded against the decision in force.
Creates: tables `local_workers`, `local_connector_state`.
Locks: the two tables are new; dropping and re-adding the CHECK constraint of `executions` takes an ACCESS
EXCLUSIVE lock on it and scans it once (no rewrite).
Downgrade: drops both tables and restores the old outcome list; it refuses while `reconciled` rows exist.

Revision ID: 0013
Revises: 0011
Create Date: 2026-11-26 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("applied", "noop", "blocked_unacknowledged", "blocked_not_ready", "superseded", "failed")
_NEW = (*_OLD, "reconciled")
_WORKER_STATUSES = ("starting", "ready", "draining", "stopped", "killed", "died")


def _replace_check(values: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_executions_outcome"), "executions", type_="check")
    allowed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(op.f("ck_executions_outcome"), "executions", f"outcome IN ({allowed})")


def upgrade() -> None:
    _replace_check(_NEW)
    statuses = ", ".join(f"'{v}'" for v in _WORKER_STATUSES)
    op.create_table(
        "local_workers",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("proc_start_ticks", sa.BigInteger(), nullable=False),
        sa.Column("command", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("log_path", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("drain_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_detail", sa.Text(), nullable=True),
        sa.CheckConstraint(f"status IN ({statuses})", name=op.f("ck_local_workers_status")),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"], name=op.f("fk_local_workers_decision_id_decisions")),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_local_workers_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_local_workers")),
    )
    op.create_index(op.f("ix_local_workers_deployment_id"), "local_workers", ["deployment_id"], unique=False)
    op.create_table(
        "local_connector_state",
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("target_prefill", sa.Integer(), nullable=False),
        sa.Column("target_decode", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name=op.f("fk_local_connector_state_decision_id_decisions")
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_local_connector_state_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("deployment_id", name=op.f("pk_local_connector_state")),
    )


def downgrade() -> None:
    op.drop_table("local_connector_state")
    op.drop_index(op.f("ix_local_workers_deployment_id"), table_name="local_workers")
    op.drop_table("local_workers")
    _replace_check(_OLD)
