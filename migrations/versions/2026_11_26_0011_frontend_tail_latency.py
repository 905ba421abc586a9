"""Frontend tail latency: the p95/p99 TTFT and the queue time of each tick's window, as columns of
`traffic_observations`.

Why: the load loop's tail-latency signal (`load_tail_latency_scaling`) reads these fields of `TrafficObservation`,
and until now only the tick's inputs JSON (`ticks.inputs`, which replay reads) held them. They become nullable
columns beside the mean latencies, each with a COMMENT ON COLUMN. `tick_summary` is left as it is. Ticks recorded
before this revision have NULL in the new columns; their values remain in `ticks.inputs`.
Creates: columns `ttft_ms_p95`, `ttft_ms_p99`, `queue_ms` on `traffic_observations`.
Locks: ALTER TABLE ... ADD COLUMN (nullable, no default) takes a brief ACCESS EXCLUSIVE lock on
traffic_observations, no rewrite.
Downgrade: drops the columns (their values are lost from the table, not from `ticks.inputs`).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Column -> its comment; the models carry the same comments (the models-match-migrations test compares them).
_COLUMNS = {
    "ttft_ms_p95": "95th percentile of the time to first token of the window's requests (ms), as the frontend "
    "measured it. NULL where the source does not report it",
    "ttft_ms_p99": "99th percentile of the time to first token of the window's requests (ms), as the frontend "
    "measured it. NULL where the source does not report it",
    "queue_ms": "Mean time the window's requests waited at the frontend for a first token (ms). NULL where the "
    "source does not report it",
}


def upgrade() -> None:
    for column, comment in _COLUMNS.items():
        op.add_column("traffic_observations", sa.Column(column, sa.Double(), nullable=True, comment=comment))


def downgrade() -> None:
    for column in reversed(_COLUMNS):
        op.drop_column("traffic_observations", column)
