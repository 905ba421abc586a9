"""One copy of the forward-pass metrics a tick saw: `fpm_snapshots` becomes a view over `ticks.inputs`.

Why: a load tick stored its engines' forward-pass metrics twice, in `ticks.inputs` (which replay reads) and one row
per engine in `fpm_snapshots` (which the report and the metrics read): 2.2 kB of a load tick's 10.4 kB
(`planner fleet bytes`, 3-deployment fleet bench). The view expands `ticks.inputs->'fpm'` into the same columns, so
readers keep their SQL; replay keeps reading `ticks.inputs`.
Creates: view `fpm_snapshots` (tick_id, seq, component, worker_id, dp_rank, wall_time_s, metrics), SELECT on it for
`planner_analyst` and `planner_writer` where those roles exist.
Drops: table `fpm_snapshots` (its rows are the elements of each tick's `inputs->'fpm'`, written from the same
objects in the same transaction, so nothing is lost; a tick whose snapshots were pruned shows them again).
Locks: ACCESS EXCLUSIVE on `fpm_snapshots` for the drop (a small table; ticks are not locked).
Downgrade: recreates the table and fills it from `ticks.inputs` (every tick's snapshots, pruned ones included).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The columns of the table it replaces, plus `seq` (the engine's position in the tick's inputs).
FPM_SNAPSHOTS_VIEW = """
CREATE VIEW fpm_snapshots AS
SELECT t.id AS tick_id,
       f.seq::int AS seq,
       f.metrics->>'component' AS component,
       f.metrics->>'worker_id' AS worker_id,
       (f.metrics->>'dp_rank')::int AS dp_rank,
       (f.metrics->>'wall_time_s')::float8 AS wall_time_s,
       f.metrics
  FROM ticks t
 CROSS JOIN LATERAL jsonb_array_elements(COALESCE(t.inputs->'fpm', '[]'::jsonb)) WITH ORDINALITY AS f(metrics, seq)
"""

# Default privileges (0003, 0009) cover relations this user creates; the explicit grants also cover a role a DBA
# created later. The planner's writer role reads the view (report, metrics); the analyst role reads everything.
_GRANTS = """
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_analyst') THEN
        GRANT SELECT ON fpm_snapshots TO planner_analyst;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_writer') THEN
        GRANT {writer} ON fpm_snapshots TO planner_writer;
    END IF;
END
$$
"""


def upgrade() -> None:
    # Refuse rather than lose data: every stored snapshot must be an element of its tick's inputs.
    missing = op.get_bind().scalar(
        sa.text(
            """SELECT count(*) FROM fpm_snapshots f JOIN ticks t ON t.id = f.tick_id
                WHERE NOT COALESCE(t.inputs->'fpm', '[]'::jsonb) @> jsonb_build_array(f.metrics)"""
        )
    )
    if missing:
        raise RuntimeError(f"migration 0015: {missing} fpm_snapshots rows are not in their tick's inputs; not dropped")
    op.drop_table("fpm_snapshots")
    op.execute(FPM_SNAPSHOTS_VIEW)
    op.execute(
        "COMMENT ON VIEW fpm_snapshots IS 'The forward-pass metrics each tick saw, one row per engine, expanded from "
        "ticks.inputs (the one stored copy; migration 0015).'"
    )
    op.execute(_GRANTS.format(writer="SELECT"))


def downgrade() -> None:
    op.execute("DROP VIEW fpm_snapshots")
    op.create_table(
        "fpm_snapshots",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("dp_rank", sa.Integer(), nullable=False),
        sa.Column("wall_time_s", sa.Double(), nullable=False),
        sa.Column("metrics", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_fpm_snapshots_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fpm_snapshots")),
    )
    op.create_index(op.f("ix_fpm_snapshots_tick_id"), "fpm_snapshots", ["tick_id"], unique=False)
    op.execute(
        """INSERT INTO fpm_snapshots (tick_id, component, worker_id, dp_rank, wall_time_s, metrics)
           SELECT t.id, f.metrics->>'component', f.metrics->>'worker_id', (f.metrics->>'dp_rank')::int,
                  (f.metrics->>'wall_time_s')::float8, f.metrics
             FROM ticks t
            CROSS JOIN LATERAL jsonb_array_elements(COALESCE(t.inputs->'fpm', '[]'::jsonb))
                  WITH ORDINALITY AS f(metrics, seq)
            ORDER BY t.id, f.seq"""
    )
    op.execute(_GRANTS.format(writer="SELECT, INSERT, UPDATE, DELETE"))
