"""Decisions that explain themselves in one line: `decisions.stage` and `decisions.summary`, shown first.

Why: `decision_history.why` listed every non-routine step of the tick (about 1,500 characters a row) with the step
that decided (a prompt burst, the GPU budget) at its end, and `decision_history.reason` said `scale` on every row.
The planner now records, with each decision, the stage that set its targets and a summary of at most 160 characters
naming that stage and its numbers first (`planner_core.domain.summary`, derived from the tick's steps).
Changes:
- `decisions`: two nullable columns, `stage` (varchar(20)) and `summary` (text); NULL on the decisions recorded
  before this revision.
- `decision_history` (CREATE OR REPLACE: same columns, grants kept): `reason` is the deciding stage
  (`COALESCE(stage, reason)`: the headline reason on older rows), `why` is the summary (the old step chain on older
  rows), and a new last column `headline_reason` keeps the loop's headline reason (`scale`, Dynamo's enum).
Locks: ACCESS EXCLUSIVE on `decisions` for the two ADD COLUMNs (no rewrite: nullable, no default), briefly on the
view.
Downgrade: 0021's `decision_history` (and its comments), then drops the two columns.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 06:30:00
"""

from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# the columns' comments (bound by SQLAlchemy); the views' below go into SQL text, their quotes doubled
_STAGE_COMMENT = (
    "The stage that set the targets (planner_core.domain.summary.DecisionStage: forecast, burst, hold, budget, "
    "plugin, load, ...); NULL before migration 0023"
)
_SUMMARY_COMMENT = (
    "The decision in one line, the deciding stage's numbers first (at most 160 characters); NULL before migration "
    "0023 (tick_steps has the full chain)"
)
_REASON_COMMENT = (
    "The stage that set the targets (decisions.stage: forecast, burst, hold, budget, plugin, load, ...); the "
    "headline reason on decisions recorded before migration 0023"
)
_WHY_COMMENT = (
    "The decision in one line, the deciding stage and its numbers first (decisions.summary, at most 160 characters); "
    "on decisions recorded before migration 0023 the non-routine steps in order (tick_steps has every step in full)"
)
_HEADLINE_COMMENT = "The loop''s headline reason (decisions.reason: scale, Dynamo''s per-loop decision reasons)"
_DECISION_HISTORY_COMMENT = (
    "What the planner decided (targets), when (the tick''s scheduled time), why (reason: the deciding stage; why: "
    "the decision in one line with its numbers) and what happened (status, execution attempts, virtual-connector "
    "acknowledgement)."
)

# The expressions of 0021's definition this revision replaces, each found exactly once.
_OLD_REASON = "    d.reason,\n    ( SELECT"
_NEW_REASON = "    COALESCE(d.stage, d.reason)::character varying(60) AS reason,\n    COALESCE(d.summary, ( SELECT"
_OLD_WHY_END = "        e_1) AS why,"
_NEW_WHY_END = "        e_1)) AS why,"
_OLD_TAIL = "    t.config_hash\n   FROM decisions d"
_NEW_TAIL = "    t.config_hash,\n    d.reason AS headline_reason\n   FROM decisions d"


def _module(revision_id: str) -> ModuleType:
    """An earlier revision's module (Alembic's own loading of it, as 0008 does)."""
    return op.get_context().script.get_revision(revision_id).module


def _replaced(definition: str) -> str:
    for old, new in ((_OLD_REASON, _NEW_REASON), (_OLD_WHY_END, _NEW_WHY_END), (_OLD_TAIL, _NEW_TAIL)):
        if definition.count(old) != 1:
            raise RuntimeError(f"decision_history: {old!r} is not found exactly once in 0021's definition")
        definition = definition.replace(old, new)
    return definition


def upgrade() -> None:
    op.add_column("decisions", sa.Column("stage", sa.String(length=20), nullable=True, comment=_STAGE_COMMENT))
    op.add_column("decisions", sa.Column("summary", sa.Text(), nullable=True, comment=_SUMMARY_COMMENT))
    op.execute(f"CREATE OR REPLACE VIEW decision_history AS {_replaced(_module('0021').NEW_DECISION_HISTORY)}")
    op.execute(f"COMMENT ON VIEW decision_history IS '{_DECISION_HISTORY_COMMENT}'")
    op.execute(f"COMMENT ON COLUMN decision_history.reason IS '{_REASON_COMMENT}'")
    op.execute(f"COMMENT ON COLUMN decision_history.why IS '{_WHY_COMMENT}'")
    op.execute(f"COMMENT ON COLUMN decision_history.headline_reason IS '{_HEADLINE_COMMENT}'")


def downgrade() -> None:
    # a view loses columns only by being dropped: recreate 0021's, with its grants and comments
    earlier = _module("0008")
    grants = op.get_bind().execute(
        sa.text(
            "SELECT grantee, privilege_type FROM information_schema.role_table_grants "
            "WHERE table_name = 'decision_history' AND grantee <> current_user"
        )
    )
    saved = list(grants)
    op.execute("DROP VIEW decision_history")
    op.execute(f"CREATE VIEW decision_history AS {_module('0021').NEW_DECISION_HISTORY}")
    for grantee, privilege in saved:
        op.execute(f'GRANT {privilege} ON decision_history TO "{grantee}"')
    op.execute(f"COMMENT ON VIEW decision_history IS '{earlier._DECISION_HISTORY_COMMENT}'")
    op.execute(f"COMMENT ON COLUMN decision_history.why IS '{earlier._WHY_COMMENT}'")
    op.drop_column("decisions", "summary")
    op.drop_column("decisions", "stage")
