"""Planner states as deltas: most ticks store what changed since the previous tick's state, not the whole state.

Why: the planner state changes at every load tick (an online perf model gains a sample, a moving window shifts,
a counter moves) but only in a few places; stored whole it was 2.0 kB of a load tick's 5.8 kB (`planner fleet
bytes`, 3-deployment fleet bench). Now a tick's row holds either the full state (`state`) or a delta (`delta`,
`planner_core.state_delta`) against the state of `base_tick_id` (the deployment's previous tick), with a full
state at least every `FULL_STATE_EVERY` rows; `repository.state_json` rebuilds any state exactly.
Creates: columns `planner_states.delta` (BYTEA: the delta's JSON text, zlib-compressed by
`state_delta.encode_delta`, because Postgres never compresses a row under ~2 kB, whatever `toast_tuple_target`
says) and `base_tick_id` (BIGINT, references `planner_states.tick_id`, indexed, so a state a later delta needs
cannot be deleted), check `ck_planner_states_full_or_delta`.
Changes: `planner_states.state` becomes nullable (NULL on a delta row). Existing rows stay full states.
Locks: ACCESS EXCLUSIVE on `planner_states` while the columns and the check are added (no rewrite: the new
columns are NULL, and the check is validated with one scan).
Downgrade: rebuilds every delta row's full state (in tick order, from its chain) into `state`, then drops the
columns; refuses (changes nothing) if a delta's chain cannot be rebuilt.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from planner_core.runtime.store.state_delta import StateDeltaError, apply_delta, decode_delta

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("planner_states", sa.Column("delta", sa.LargeBinary(), nullable=True))
    op.add_column("planner_states", sa.Column("base_tick_id", sa.BigInteger(), nullable=True))
    op.alter_column("planner_states", "state", existing_type=postgresql.JSONB(astext_type=sa.Text()), nullable=True)
    op.create_foreign_key(
        op.f("fk_planner_states_base_tick_id_planner_states"),
        "planner_states",
        "planner_states",
        ["base_tick_id"],
        ["tick_id"],
    )
    op.create_index(op.f("ix_planner_states_base_tick_id"), "planner_states", ["base_tick_id"], unique=False)
    op.create_check_constraint(
        op.f("ck_planner_states_full_or_delta"),
        "planner_states",
        "(state IS NULL) <> (delta IS NULL) AND (delta IS NULL) = (base_tick_id IS NULL)",
    )


_FULL_STATE = sa.text("SELECT state FROM planner_states WHERE tick_id = :id")


def downgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT tick_id, base_tick_id, delta FROM planner_states WHERE delta IS NOT NULL ORDER BY tick_id")
    ).all()
    rebuilt: dict[int, object] = {}
    for row in rows:
        base = rebuilt.get(row.base_tick_id)
        if base is None:
            base = conn.scalar(_FULL_STATE, {"id": row.base_tick_id})
        if base is None:
            raise RuntimeError(
                f"planner_states: tick {row.tick_id}'s delta has no rebuildable base (tick {row.base_tick_id}); "
                "nothing was changed"
            )
        try:
            rebuilt[row.tick_id] = apply_delta(base, decode_delta(row.delta))
        except StateDeltaError as exc:
            raise RuntimeError(f"planner_states: tick {row.tick_id}'s delta does not fit its base: {exc}") from exc
    # Every state is rebuilt before any row changes: a failure above leaves the table as it was.
    update = sa.text("UPDATE planner_states SET state = :state, delta = NULL, base_tick_id = NULL WHERE tick_id = :id")
    for tick_id, state in rebuilt.items():
        conn.execute(update.bindparams(sa.bindparam("state", type_=postgresql.JSONB)), {"id": tick_id, "state": state})
    op.drop_constraint(op.f("ck_planner_states_full_or_delta"), "planner_states", type_="check")
    op.drop_index(op.f("ix_planner_states_base_tick_id"), table_name="planner_states")
    op.drop_constraint(op.f("fk_planner_states_base_tick_id_planner_states"), "planner_states", type_="foreignkey")
    op.alter_column("planner_states", "state", existing_type=postgresql.JSONB(astext_type=sa.Text()), nullable=False)
    op.drop_column("planner_states", "base_tick_id")
    op.drop_column("planner_states", "delta")
