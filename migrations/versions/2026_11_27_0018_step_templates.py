"""Explanations as shared templates plus each tick's numbers: a load tick's steps shrink from ~1.6 kB to ~0.6 kB.

Why: a tick's explanation (~30 steps) was 1.6 kB of a load tick's 4.4 kB (`planner fleet bytes`, 3-deployment
fleet bench), although its sentences repeat from tick to tick with other numbers: 46 distinct templates served
540 load ticks. Now each step's name, component, reason and detail with its numbers taken out are stored once, in
`step_templates`, and a tick stores one line of template ids, values and numbers (`step_packing`); the view
`tick_steps` gives every step back with the same columns, character for character, so readers keep their SQL.
Creates: table `step_templates` (id, step VARCHAR(80), component VARCHAR(20), reason VARCHAR(60), template; unique
on (md5(template), step, component, reason), NULLs not distinct; the bounds the old step columns had), function
`step_detail(template, fields)`, column `tick_step_lists.packed` (TEXT, checked to the packed form).
Changes: the view `tick_steps` reads `packed` (same columns; `decision_history` and `tick_summary` follow).
Drops: column `tick_step_lists.steps` and its check, after every row was packed (the templates come from the
rows themselves, with the same number pattern the planner uses; joining them back gives each detail exactly).
Locks: ACCESS EXCLUSIVE on `tick_step_lists` while it is rewritten (the packing reads and writes every row once:
ticks are not recorded meanwhile), and briefly on the view.
Downgrade: rebuilds `steps` from the view (every step, in order, with its value, detail and bounds as before),
then drops `packed`, the function and `step_templates`.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# `step_packing.NUMBER_TOKEN`: a number, or a literal placeholder character (taken out like a number so a
# template's placeholders are only its own).
NUMBER_TOKEN = r"-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?|\x1f"

# fields: [template id, value, number, number, ...]; part n of the template is followed by number n.
STEP_DETAIL_FUNCTION = r"""
CREATE FUNCTION step_detail(template text, fields text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT COALESCE(string_agg(p.part || COALESCE(fields[p.n + 2], ''), '' ORDER BY p.n), '')
  FROM unnest(string_to_array(template, E'\x1f')) WITH ORDINALITY AS p(part, n)
$$
"""

TICK_STEPS_VIEW = """
CREATE OR REPLACE VIEW tick_steps AS
SELECT l.tick_id,
       (e.n - 1)::int AS seq,
       t.step::varchar(80) AS step,
       t.component::varchar(20) AS component,
       NULLIF(f.fields[2], '')::float8 AS value,
       t.reason::varchar(60) AS reason,
       step_detail(t.template, f.fields) AS detail
  FROM tick_step_lists l
 CROSS JOIN LATERAL unnest(string_to_array(l.packed, ';')) WITH ORDINALITY AS e(entry, n)
 CROSS JOIN LATERAL (SELECT string_to_array(e.entry, ',') AS fields) f
  JOIN step_templates t ON t.id = f.fields[1]::int
"""

OLD_TICK_STEPS_VIEW = """
CREATE OR REPLACE VIEW tick_steps AS
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

# One step: `id,value[,number...]`; steps joined by `;` (no number, value or id holds either delimiter).
PACKED_FORM = r"packed ~ '^[0-9]+,[^;,]*(,[^;,]*)*(;[0-9]+,[^;,]*(,[^;,]*)*)*$'"

_TEMPLATES_FROM_ROWS = """
INSERT INTO step_templates (step, component, reason, template)
SELECT DISTINCT s.e->>0, s.e->>1, s.e->>3, regexp_replace(s.e->>4, :pattern, E'\\x1f', 'g')
  FROM tick_step_lists l CROSS JOIN LATERAL jsonb_array_elements(l.steps) AS s(e)
ON CONFLICT DO NOTHING
"""

_PACK_ROWS = """
UPDATE tick_step_lists l SET packed = (
    SELECT string_agg(
               t.id::text || ',' || COALESCE(s.e->>2, '')
               || COALESCE((SELECT string_agg(',' || m.token[1], '' ORDER BY m.k)
                              FROM regexp_matches(s.e->>4, :pattern, 'g') WITH ORDINALITY AS m(token, k)), ''),
               ';' ORDER BY s.n)
      FROM jsonb_array_elements(l.steps) WITH ORDINALITY AS s(e, n)
      JOIN step_templates t
        ON md5(t.template) = md5(regexp_replace(s.e->>4, :pattern, E'\\x1f', 'g'))
       AND t.template = regexp_replace(s.e->>4, :pattern, E'\\x1f', 'g')
       AND t.step = s.e->>0 AND t.component IS NOT DISTINCT FROM s.e->>1 AND t.reason = s.e->>3)
"""

# The view's rows against the stored arrays: the packing must give back every step exactly.
_UNEQUAL_ROWS = """
SELECT count(*) FROM tick_step_lists l
 WHERE l.steps IS DISTINCT FROM (
       SELECT jsonb_agg(jsonb_build_array(s.step, s.component, s.value, s.reason, s.detail) ORDER BY s.seq)
         FROM tick_steps s WHERE s.tick_id = l.tick_id)
"""

_UNPACK_ROWS = """
UPDATE tick_step_lists l SET steps = (
    SELECT jsonb_agg(jsonb_build_array(
               s.step, s.component,
               CASE WHEN s.value IN ('Infinity', '-Infinity', 'NaN') THEN to_jsonb(s.value::text)
                    ELSE to_jsonb(s.value) END,
               s.reason, s.detail) ORDER BY s.seq)
      FROM tick_steps s WHERE s.tick_id = l.tick_id)
"""


def upgrade() -> None:
    op.create_table(
        "step_templates",
        sa.Column("id", sa.Integer(), sa.Identity(), nullable=False),
        sa.Column("step", sa.String(length=80), nullable=False),
        sa.Column("component", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.String(length=60), nullable=False),
        sa.Column("template", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_templates")),
        comment=(
            "What the same step of many ticks shares: its name, component, reason and detail with each number "
            "replaced by a placeholder (chr(31)); tick_step_lists.packed holds the numbers (migration 0018)"
        ),
    )
    op.execute(
        "CREATE UNIQUE INDEX uq_step_templates_key ON step_templates "
        "(md5(template), step, component, reason) NULLS NOT DISTINCT"
    )
    op.execute(STEP_DETAIL_FUNCTION)
    op.add_column("tick_step_lists", sa.Column("packed", sa.Text(), nullable=True))
    pattern = {"pattern": NUMBER_TOKEN}
    op.get_bind().execute(sa.text(_TEMPLATES_FROM_ROWS), pattern)
    op.get_bind().execute(sa.text(_PACK_ROWS), pattern)
    op.execute(TICK_STEPS_VIEW)
    num_unequal = op.get_bind().execute(sa.text(_UNEQUAL_ROWS)).scalar_one()
    if num_unequal:  # the transaction rolls back: nothing changed
        raise RuntimeError(f"tick_step_lists: {num_unequal} rows would not read back the same once packed")
    op.drop_constraint(op.f("ck_tick_step_lists_steps_fit"), "tick_step_lists", type_="check")
    op.drop_column("tick_step_lists", "steps")
    op.alter_column("tick_step_lists", "packed", existing_type=sa.Text(), nullable=False)
    op.create_check_constraint(op.f("ck_tick_step_lists_packed_form"), "tick_step_lists", PACKED_FORM)
    op.execute(
        "COMMENT ON VIEW tick_steps IS 'Every explanation step of every tick, one row per step in order (seq from "
        "0), put back together from tick_step_lists.packed and step_templates (migrations 0015, 0018).'"
    )


def downgrade() -> None:
    op.add_column("tick_step_lists", sa.Column("steps", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.execute(_UNPACK_ROWS)
    op.execute(OLD_TICK_STEPS_VIEW)
    op.drop_constraint(op.f("ck_tick_step_lists_packed_form"), "tick_step_lists", type_="check")
    op.drop_column("tick_step_lists", "packed")
    op.alter_column("tick_step_lists", "steps", existing_type=postgresql.JSONB(astext_type=sa.Text()), nullable=False)
    op.create_check_constraint(op.f("ck_tick_step_lists_steps_fit"), "tick_step_lists", "tick_steps_fit(steps)")
    op.execute("DROP FUNCTION step_detail(text, text[])")
    op.drop_table("step_templates")
    op.execute(
        "COMMENT ON VIEW tick_steps IS 'Every explanation step of every tick, one row per step in order (seq from "
        "0), expanded from tick_step_lists (one row per tick; migration 0015).'"
    )
