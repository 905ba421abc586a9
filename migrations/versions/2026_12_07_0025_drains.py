"""Drains: every engine removed by a scale-down, with the requests its drain waited for and those it cut.

Why: a scale-down removed engines without a record of what it cost. Now the connectors pick the least-loaded
engines (their in-flight requests from the forward-pass metrics), stop routing to them, wait for their in-flight
requests or the grace, and record each removal here: the engine, its in-flight requests when the drain started, how
many of them it waited for, how many it cut (still in flight when the grace ended), the grace and the duration.
Creates: table `drains` (one row per removed engine; `ended_at`, `num_waited_for`, `num_cut` and `duration_s` are
filled when the drain ends; NULL counts mean the engine's load was unknown: no forward-pass sample for it).
Locks: none on existing tables (a new table).
Downgrade: drops the table (the drains' `engine_drain_*` audit rows stay).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 12:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OUTCOMES = ("draining", "stopped", "killed", "handed_over")


def upgrade() -> None:
    outcomes = ", ".join(f"'{v}'" for v in _OUTCOMES)
    op.create_table(
        "drains",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=True),
        sa.Column("connector", sa.String(length=40), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("engine", sa.String(length=300), nullable=False),
        sa.Column("local_worker_id", sa.BigInteger(), nullable=True),
        sa.Column("worker_ids", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("grace_s", sa.Float(), nullable=False),
        sa.Column("num_in_flight_at_start", sa.Integer(), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("num_waited_for", sa.Integer(), nullable=True),
        sa.Column("num_cut", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.CheckConstraint(f"outcome IN ({outcomes})", name=op.f("ck_drains_outcome")),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"], name=op.f("fk_drains_decision_id_decisions")),
        sa.ForeignKeyConstraint(
            ["local_worker_id"], ["local_workers.id"], name=op.f("fk_drains_local_worker_id_local_workers")
        ),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_drains_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drains")),
        comment="Every engine a scale-down removed: in flight at the start, waited for, cut (migration 0025)",
    )
    op.create_index(op.f("ix_drains_deployment_id_started_at"), "drains", ["deployment_id", "started_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_drains_deployment_id_started_at"), table_name="drains")
    op.drop_table("drains")
