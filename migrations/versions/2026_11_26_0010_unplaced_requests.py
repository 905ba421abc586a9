"""Unplaced requests: what an SLO-aware router could not place, per pool, as columns of `worker_observations`.

Why: with router `slo` the frontend refuses to load an engine it predicts past the SLO; requests that find no
available endpoint wait at the frontend or are rejected. The load loop reads them (`TickInputs.unplaced`) as a
reason to scale up, and `ticks.inputs` (JSONB, which replay reads) already holds them; as columns beside the worker
counts they can be queried and charted without digging into JSONB. Six nullable integer columns, NULL where the
router does not report them (every router but `slo`), per pool: requests waiting at the frontend at the tick, requests
that found no available endpoint since the previous report, and of those the rejected ones.
Creates: columns `waiting_prefill`, `waiting_decode`, `unplaced_prefill`, `unplaced_decode`, `rejected_prefill`,
`rejected_decode` on `worker_observations`, each with a COMMENT.
Locks: ALTER TABLE ... ADD COLUMN (nullable, no default) takes a brief ACCESS EXCLUSIVE lock on worker_observations,
no rewrite. No view changes.
Downgrade: drops the columns (their values remain in `ticks.inputs`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Column -> its comment; the models carry the same comments (the models-match-migrations test compares them).
_WHAT = {
    "waiting": "Requests waiting at the frontend for the {pool} pool at the tick (an SLO-aware router found no engine "
    "predicted within the SLO for them yet). NULL where the router does not report it",
    "unplaced": "Requests the router found no available endpoint for in the {pool} stage since the previous report "
    "(each counted once per stage). NULL where the router does not report it",
    "rejected": "Of the unplaced requests of the {pool} stage, those the frontend rejected. NULL where the router does "
    "not report it",
}
_COLUMNS = {
    f"{what}_{pool}": comment.format(pool=pool) for what, comment in _WHAT.items() for pool in ("prefill", "decode")
}


def upgrade() -> None:
    for column, comment in _COLUMNS.items():
        op.add_column("worker_observations", sa.Column(column, sa.Integer(), nullable=True, comment=comment))


def downgrade() -> None:
    for column in reversed(_COLUMNS):
        op.drop_column("worker_observations", column)
