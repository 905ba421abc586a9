"""Executions: allow the outcome `blocked_not_ready` (the Kubernetes connector refused a not-ready DGD).

Why: the Kubernetes connector does not write to a DynamoGraphDeployment that is not Ready, has not observed
its newest generation, is being deleted or is rolling out; the attempt is recorded with its own outcome and
the decision stays pending, instead of being counted as a failure.
Locks: dropping and re-adding the CHECK constraint takes an ACCESS EXCLUSIVE lock on `executions` and scans
it once to validate the new constraint (no rewrite).
Downgrade: restores the old list; it refuses (the CHECK fails) while rows with `blocked_not_ready` exist,
so delete or re-label them first if you really mean to go back.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 12:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("applied", "noop", "blocked_unacknowledged", "superseded", "failed")
_NEW = ("applied", "noop", "blocked_unacknowledged", "blocked_not_ready", "superseded", "failed")


def _replace_check(values: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_executions_outcome"), "executions", type_="check")
    allowed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(op.f("ck_executions_outcome"), "executions", f"outcome IN ({allowed})")


def upgrade() -> None:
    _replace_check(_NEW)


def downgrade() -> None:
    _replace_check(_OLD)
