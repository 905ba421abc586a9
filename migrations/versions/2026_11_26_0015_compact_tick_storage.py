"""Compact tick storage: one copy of the forward-pass metrics a tick saw, and one row per tick for its steps.

Why: a load tick stored 10.4 kB (`planner fleet bytes`, 3-deployment fleet bench), of which 2.2 kB were its
engines' forward-pass metrics stored a second time (`ticks.inputs`, which replay reads, and one row per engine in
`fpm_snapshots`) and 3.9 kB its explanation as ~27 rows of `tick_steps` (each with a 24-byte row header, an id and
the tick id). Now the metrics are stored once, in `ticks.inputs`, and the steps as one compressed JSON array per
tick; views of the old names give the old columns back, so readers keep their SQL.
Creates: view `fpm_snapshots` (tick_id, seq, component, worker_id, dp_rank, wall_time_s, metrics) over
`ticks.inputs->'fpm'`; table `tick_step_lists` (tick_id, steps: `[[step, component, value, reason, detail], ...]`,
compressed from 128 bytes on, checked by function `tick_steps_fit` to the old column bounds); view `tick_steps`
(tick_id, seq, step, component, value, reason, detail) over it; `decision_history` and `tick_summary` re-pointed at
the view (same columns, grants, comments); SELECT on both views for `planner_analyst` and `planner_writer` where those
roles exist.
Drops: table `fpm_snapshots` (its rows are the elements of each tick's `inputs->'fpm'`, written from the same
objects in the same transaction, so nothing is lost; the upgrade checks this and refuses otherwise; a tick whose
snapshots were pruned shows them again); table `tick_steps` after copying its rows (a tick's steps in `seq` order;
`seq` becomes 0, 1, 2, ... without gaps).
Locks: ACCESS EXCLUSIVE on `fpm_snapshots` and `tick_steps` (rewritten: the copy takes about as long as reading
the table; ticks are not recorded meanwhile), and briefly on the two views re-pointed.
Downgrade: recreates both tables and fills them from `ticks.inputs` (every tick's snapshots, pruned ones included)
and `tick_step_lists`; re-points the views at the table.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 23:00:00
"""

import re
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


# `tick_steps` as it was: one row per step (migration 0001); the view below gives these columns back.
TICK_STEPS_VIEW = """
CREATE VIEW tick_steps AS
SELECT l.tick_id,
       (s.n - 1)::int AS seq,
       (s.step->>0)::varchar(80) AS step,
       (s.step->>1)::varchar(20) AS component,
       (s.step->>2)::float8 AS value,
       (s.step->>3)::varchar(60) AS reason,
       (s.step->>4)::text AS detail
  FROM tick_step_lists l
 CROSS JOIN LATERAL jsonb_array_elements(l.steps) WITH ORDINALITY AS s(step, n)
"""

# The views that read `relation` (decision_history, tick_summary), each with its definition.
_DEPENDENT_VIEWS = """
SELECT DISTINCT v.relname, pg_get_viewdef(v.oid) AS definition
  FROM pg_depend d
  JOIN pg_rewrite r ON r.oid = d.objid
  JOIN pg_class v ON v.oid = r.ev_class
 WHERE d.refobjid = CAST(CAST(:relation AS text) AS regclass) AND v.relname::text <> CAST(:relation AS text)
"""


def _repoint_views(renamed: str, name: str) -> None:
    """Point the views that read `renamed` at the relation now called `name` (CREATE OR REPLACE keeps their
    columns, grants and comments; a renamed relation's dependents follow its OID, not its name)."""
    bind = op.get_bind()
    for view, definition in bind.execute(sa.text(_DEPENDENT_VIEWS), {"relation": renamed}).all():
        pattern = re.compile(rf"\b{renamed}\b")
        op.execute(f"CREATE OR REPLACE VIEW {view} AS {pattern.sub(name, definition)}")


# Each step as the old columns bounded it (VARCHAR(80), (20), (60), NOT NULL): a step that does not fit fails the
# insert with the same error class (22001, "value too long") as before, so a tick is never half written.
STEPS_FIT_FUNCTION = """
CREATE FUNCTION tick_steps_fit(steps jsonb) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    s jsonb;
BEGIN
    IF jsonb_typeof(steps) <> 'array' THEN
        RETURN false;
    END IF;
    FOR s IN SELECT e FROM jsonb_array_elements(steps) AS e LOOP
        IF jsonb_typeof(s) <> 'array' OR jsonb_array_length(s) <> 5
           OR s->>0 IS NULL OR s->>3 IS NULL OR s->>4 IS NULL THEN
            RETURN false;
        END IF;
        IF length(s->>0) > 80 OR length(s->>1) > 20 OR length(s->>3) > 60 THEN
            RAISE EXCEPTION 'value too long for a tick step (step 80, component 20, reason 60 characters): %',
                left(s::text, 200) USING ERRCODE = 'string_data_right_truncation';
        END IF;
    END LOOP;
    RETURN true;
END
$$
"""


def _upgrade_tick_steps() -> None:
    op.execute("ALTER TABLE tick_steps RENAME TO tick_steps_rows")  # its views follow it
    op.execute(STEPS_FIT_FUNCTION)
    op.create_table(
        "tick_step_lists",
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("steps", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint("tick_steps_fit(steps)", name=op.f("ck_tick_step_lists_steps_fit")),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_tick_step_lists_tick_id_ticks")),
        sa.PrimaryKeyConstraint("tick_id", name=op.f("pk_tick_step_lists")),
    )
    # Compress a row from 128 bytes on (default: about 2 kB): most explanations are 1-4 kB of repetitive JSON.
    op.execute("ALTER TABLE tick_step_lists SET (toast_tuple_target = 128)")
    op.execute(
        """INSERT INTO tick_step_lists (tick_id, steps)
           SELECT tick_id, jsonb_agg(jsonb_build_array(step, component, value, reason, detail) ORDER BY seq)
             FROM tick_steps_rows GROUP BY tick_id"""
    )
    op.execute(TICK_STEPS_VIEW)
    _repoint_views("tick_steps_rows", "tick_steps")
    op.drop_table("tick_steps_rows")
    op.execute(
        "COMMENT ON VIEW tick_steps IS 'Every explanation step of every tick, one row per step in order (seq from "
        "0), expanded from tick_step_lists (one row per tick; migration 0015).'"
    )
    op.execute(_GRANTS.replace("fpm_snapshots", "tick_steps").format(writer="SELECT"))


def _downgrade_tick_steps() -> None:
    op.create_table(
        "tick_steps_rows",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=80), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=True),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_tick_steps_tick_id_ticks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tick_steps")),
        sa.UniqueConstraint("tick_id", "seq", name=op.f("uq_tick_steps_tick_id_seq")),
    )
    op.execute(
        """INSERT INTO tick_steps_rows (tick_id, seq, step, component, value, reason, detail)
           SELECT tick_id, seq, step, component, value, reason, detail FROM tick_steps ORDER BY tick_id, seq"""
    )
    _repoint_views("tick_steps", "tick_steps_rows")
    op.execute("DROP VIEW tick_steps")
    op.drop_table("tick_step_lists")
    op.execute("DROP FUNCTION tick_steps_fit(jsonb)")
    op.execute("ALTER TABLE tick_steps_rows RENAME TO tick_steps")
    op.execute("ALTER SEQUENCE tick_steps_rows_id_seq RENAME TO tick_steps_id_seq")
    op.execute(_GRANTS.replace("fpm_snapshots", "tick_steps").format(writer="SELECT, INSERT, UPDATE, DELETE"))
    op.execute(
        """DO $$ BEGIN
               IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_writer') THEN
                   GRANT USAGE, SELECT ON SEQUENCE tick_steps_id_seq TO planner_writer;
               END IF;
           END $$"""
    )


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
    _upgrade_tick_steps()


def downgrade() -> None:
    _downgrade_tick_steps()
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
