"""Local workers' metrics port: the port each engine the local connector starts serves its Prometheus metrics on.

Why: a disaggregated live stack scrapes its prefill and decode engines as well as the frontend (queue depths,
in-flight requests and request durations per pool). The local connector gives each worker a free port (Dynamo's
`DYN_SYSTEM_PORT`) and lists the running workers' ports in a Prometheus file-discovery targets file; the port is
kept with the worker so that a planner started later (which adopts the running workers) writes the same file.
Creates: column `local_workers.metrics_port` (NULL: the worker was started without a metrics port, as every worker
before this migration and every worker of a config without `local_workers.metrics_targets_file`).
Locks: ACCESS EXCLUSIVE on `local_workers` for a catalogue-only change (a nullable column without a default).
Downgrade: drops the column.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07 15:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COMMENT = "TCP port the worker serves its Prometheus metrics on (DYN_SYSTEM_PORT); NULL = none"


def upgrade() -> None:
    op.add_column("local_workers", sa.Column("metrics_port", sa.Integer(), nullable=True, comment=_COMMENT))


def downgrade() -> None:
    op.drop_column("local_workers", "metrics_port")
