"""Raw forward-pass metrics samples, written by `planner ingest`.

Why: engines publish one forward-pass metrics message per iteration; the load loop needs the newest one per
engine and the online perf models need many. `fpm_snapshots` records what one tick saw; this table holds the raw
stream for a retention period (the ingest deletes older rows in batches). The index on
(deployment_id, received_at) serves both the newest-per-engine read and the retention delete.
Locks: creates a new table and its index; no existing table is locked (the foreign key takes a SHARE ROW
EXCLUSIVE lock on `deployments` for the moment of creation).
Downgrade: drops the table (the raw samples are lost; recorded ticks keep their `fpm_snapshots`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REQUEST_COLUMNS = (
    ("scheduled_num_prefill_requests", sa.Integer()),
    ("scheduled_sum_prefill_tokens", sa.BigInteger()),
    ("scheduled_var_prefill_length", sa.Double()),
    ("scheduled_sum_prefill_kv_tokens", sa.BigInteger()),
    ("scheduled_num_decode_requests", sa.Integer()),
    ("scheduled_sum_decode_kv_tokens", sa.BigInteger()),
    ("scheduled_var_decode_kv_tokens", sa.Double()),
    ("queued_num_prefill_requests", sa.Integer()),
    ("queued_sum_prefill_tokens", sa.BigInteger()),
    ("queued_var_prefill_length", sa.Double()),
    ("queued_num_decode_requests", sa.Integer()),
    ("queued_sum_decode_kv_tokens", sa.BigInteger()),
    ("queued_var_decode_kv_tokens", sa.Double()),
)


def upgrade() -> None:
    op.create_table(
        "fpm_samples",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("dp_rank", sa.Integer(), nullable=False),
        sa.Column("counter_id", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("wall_time_s", sa.Double(), nullable=False),
        *(sa.Column(name, column_type, nullable=False) for name, column_type in _REQUEST_COLUMNS),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_fpm_samples_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fpm_samples")),
    )
    op.create_index(
        "ix_fpm_samples_deployment_id_received_at", "fpm_samples", ["deployment_id", "received_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_fpm_samples_deployment_id_received_at", table_name="fpm_samples")
    op.drop_table("fpm_samples")
