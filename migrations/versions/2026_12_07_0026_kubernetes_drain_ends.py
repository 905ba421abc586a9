"""Drains: the end of a Kubernetes drain (what the pod's drain waited for and cut), and why each record was closed.

Why: on Kubernetes the kubelet drains a removed pod (SIGTERM, SIGKILL after its grace), so the drain records stayed
`handed_over` with no count of what was cut. The execution runs now follow each handed-over pod until it is gone
and close its record from its engine's last forward-pass sample: `completed` (nothing in flight), `cut` (`num_cut`
requests still in flight), `unobserved` (no sample since the drain began) or `not_removed` (the pod was never
deleted). Every closed record says why (`end_reason`: `exited`, `grace_expired`, `pod_gone`, `pod_not_deleted`),
when the kubelet began terminating the pod (`terminating_at`) and when the sample it counts from arrived
(`last_sample_at`).
Creates: columns `drains.end_reason` (with a CHECK on its values), `drains.terminating_at`, `drains.last_sample_at`
(all NULL for existing rows); the outcome CHECK allows the four new outcomes.
Locks: ACCESS EXCLUSIVE on `drains` for the column additions (no rewrite: nullable, no default) and while the
outcome CHECK is replaced and validated (one scan of a small table).
Downgrade: drops the three columns and restores the old outcome list; it refuses (the CHECK fails) while rows with a
new outcome exist: delete or re-label them first (e.g. back to `handed_over`) if you really mean to go back.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 15:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_OUTCOMES = ("draining", "stopped", "killed", "handed_over")
_NEW_OUTCOMES = (*_OLD_OUTCOMES, "completed", "cut", "unobserved", "not_removed")
_END_REASONS = ("exited", "grace_expired", "pod_gone", "pod_not_deleted")

END_REASON_COMMENT = "Why the record was closed (DrainEndReason); NULL while open, and before migration 0026"
TERMINATING_AT_COMMENT = (
    "Kubernetes: when the kubelet began terminating the pod (its deletionTimestamp less its deletion grace); NULL "
    "if the planner never saw it terminating (migration 0026)"
)
LAST_SAMPLE_AT_COMMENT = (
    "Kubernetes: when the engine's last forward-pass sample that num_cut counts from was received (migration 0026)"
)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _replace_outcome_check(values: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_drains_outcome"), "drains", type_="check")
    op.create_check_constraint(op.f("ck_drains_outcome"), "drains", f"outcome IN ({_in(values)})")


def upgrade() -> None:
    op.add_column("drains", sa.Column("end_reason", sa.String(length=20), nullable=True, comment=END_REASON_COMMENT))
    op.add_column(
        "drains",
        sa.Column("terminating_at", sa.DateTime(timezone=True), nullable=True, comment=TERMINATING_AT_COMMENT),
    )
    op.add_column(
        "drains",
        sa.Column("last_sample_at", sa.DateTime(timezone=True), nullable=True, comment=LAST_SAMPLE_AT_COMMENT),
    )
    op.create_check_constraint(op.f("ck_drains_end_reason"), "drains", f"end_reason IN ({_in(_END_REASONS)})")
    _replace_outcome_check(_NEW_OUTCOMES)


def downgrade() -> None:
    _replace_outcome_check(_OLD_OUTCOMES)
    op.drop_constraint(op.f("ck_drains_end_reason"), "drains", type_="check")
    op.drop_column("drains", "last_sample_at")
    op.drop_column("drains", "terminating_at")
    op.drop_column("drains", "end_reason")
