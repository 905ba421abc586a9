"""Length percentiles: observed ISL/OSL p50/p99 and the forecast percentile of each tick.

Why: forecasting (and later sizing) on the distribution of sequence lengths needs the observed percentiles of
each window and the forecast percentile recorded beside the mean.
Locks: ALTER TABLE ... ADD COLUMN (nullable, no default) takes a brief ACCESS EXCLUSIVE lock on
traffic_observations and predictions; no rewrite.
Downgrade: drops the columns (their values are lost).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 01:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OBSERVED = ("isl_p50", "isl_p99", "osl_p50", "osl_p99")


def upgrade() -> None:
    for column in _OBSERVED:
        op.add_column("traffic_observations", sa.Column(column, sa.Double(), nullable=True))
    op.add_column("predictions", sa.Column("quantile", sa.String(length=8), nullable=True))
    op.add_column("predictions", sa.Column("isl_quantile", sa.Double(), nullable=True))
    op.add_column("predictions", sa.Column("osl_quantile", sa.Double(), nullable=True))


def downgrade() -> None:
    for column in ("osl_quantile", "isl_quantile", "quantile"):
        op.drop_column("predictions", column)
    for column in reversed(_OBSERVED):
        op.drop_column("traffic_observations", column)
