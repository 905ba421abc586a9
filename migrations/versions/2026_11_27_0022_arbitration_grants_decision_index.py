"""An index on the decisions the fleet's arbitration cut (`arbitration_grants.decision_id`).

Why: replay compares a fleet member's tick with the decision as the tick made it, and a decision the arbitration
cut holds the cut targets; the targets before the cut are in the decision's first grant row. Replay looks that row
up for every replayed tick with a decision, and `arbitration_grants` holds a row per member per round (100 members
at 5 s rounds: 1.7 million rows a day), so without an index each lookup read the whole table.
Changes: a partial index on `arbitration_grants (decision_id, round_id)` where `decision_id` is set (most grants
are for members without a pending decision).
Locks: SHARE on `arbitration_grants` while the index is built (writes to it wait; reads do not).
Downgrade: drops the index.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27 11:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_arbitration_grants_decision_id ON arbitration_grants (decision_id, round_id) "
        "WHERE decision_id IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_arbitration_grants_decision_id")
