"""Tick inputs as compact JSON text without their defaults: a load tick's `ticks` row shrinks by about half.

Why: `ticks.inputs` was 1.0 kB of a load tick's 3.3 kB (`planner fleet bytes`, 3-deployment fleet bench): JSONB
keeps every key and a binary header per value, and most of an engine's forward-pass counters are zero. Now the
planner writes the inputs without the fields that hold their defaults (`to_jsonable(..., omit_defaults=True)`;
`from_jsonable` fills them back, the defaults are pinned by tests/runtime/test_stored_defaults.py) as `json`, which
stores the text as written (no spaces). Replay reads the same inputs; the view `fpm_snapshots` puts each engine's
left-out counters back, so its rows and `metrics` objects are what they were. SQL that used JSONB operators on
`ticks.inputs` itself (`@>`, `?`, jsonb_path_*) casts it: `inputs::jsonb`.
Changes: column `ticks.inputs` JSONB -> JSON (existing rows keep their whole content, as JSONB printed it); view
`fpm_snapshots` (dropped and created again over the new column: same columns, grants and comment).
Locks: ACCESS EXCLUSIVE on `ticks` while the column is rewritten (every row once: ticks are not recorded
meanwhile), and on the view.
Downgrade: back to JSONB, each engine's left-out counters written back into the stored inputs (so 0015's view
shows whole objects again); other left-out fields stay out, which the planner of that revision reads the same.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 05:30:00
"""

import json
from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# `ForwardPassMetrics`' defaults as this revision's writer leaves them out (pinned by
# tests/runtime/test_stored_defaults.py).
_SCHEDULED = {
    "num_prefill_requests": 0,
    "sum_prefill_tokens": 0,
    "var_prefill_length": 0.0,
    "sum_prefill_kv_tokens": 0,
    "num_decode_requests": 0,
    "sum_decode_kv_tokens": 0,
    "var_decode_kv_tokens": 0.0,
}
_QUEUED = {key: value for key, value in _SCHEDULED.items() if key != "sum_prefill_kv_tokens"}
FPM_DEFAULTS = {
    "dp_rank": 0,
    "counter_id": 0,
    "wall_time_s": 0.0,
    "scheduled": _SCHEDULED,
    "queued": _QUEUED,
    "lifecycle": "serving",
}


def _whole(metrics: str) -> str:
    """SQL for one engine's metrics (a jsonb expression) with every left-out field put back."""
    defaults, scheduled, queued = (json.dumps(v) for v in (FPM_DEFAULTS, _SCHEDULED, _QUEUED))
    return (
        f"('{defaults}'::jsonb || {metrics} || jsonb_build_object("
        f"'scheduled', '{scheduled}'::jsonb || COALESCE({metrics}->'scheduled', '{{}}'::jsonb), "
        f"'queued', '{queued}'::jsonb || COALESCE({metrics}->'queued', '{{}}'::jsonb)))"
    )


FPM_SNAPSHOTS_VIEW = f"""
CREATE VIEW fpm_snapshots AS
SELECT t.id AS tick_id,
       f.seq::int AS seq,
       m.metrics->>'component' AS component,
       m.metrics->>'worker_id' AS worker_id,
       (m.metrics->>'dp_rank')::int AS dp_rank,
       (m.metrics->>'wall_time_s')::float8 AS wall_time_s,
       m.metrics
  FROM ticks t
 CROSS JOIN LATERAL json_array_elements(COALESCE(t.inputs->'fpm', '[]'::json)) WITH ORDINALITY AS f(raw, seq)
 CROSS JOIN LATERAL (SELECT {_whole("f.raw::jsonb")} AS metrics) m
"""

# 0015's definition, over JSONB inputs that hold whole objects.
OLD_FPM_SNAPSHOTS_VIEW = """
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

_GRANTS_AND_COMMENT = """
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_analyst') THEN
        GRANT SELECT ON fpm_snapshots TO planner_analyst;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_writer') THEN
        GRANT SELECT ON fpm_snapshots TO planner_writer;
    END IF;
END
$$;
COMMENT ON VIEW fpm_snapshots IS {comment};
"""
_COMMENT = (
    "'The forward-pass metrics each tick saw, one row per engine, expanded from ticks.inputs (the one stored copy; "
    "migration {revisions}).'"
)

_FILL_FPM_DEFAULTS = f"""
UPDATE ticks SET inputs = jsonb_set(inputs, '{{fpm}}', (
    SELECT jsonb_agg({_whole("e.m")} ORDER BY e.n)
      FROM jsonb_array_elements(inputs->'fpm') WITH ORDINALITY AS e(m, n)))
 WHERE jsonb_typeof(inputs->'fpm') = 'array' AND jsonb_array_length(inputs->'fpm') > 0
"""


def upgrade() -> None:
    op.execute("DROP VIEW fpm_snapshots")
    op.execute("ALTER TABLE ticks ALTER COLUMN inputs TYPE json USING inputs::text::json")
    op.execute(FPM_SNAPSHOTS_VIEW)
    op.execute(_GRANTS_AND_COMMENT.format(comment=_COMMENT.format(revisions="0015, 0019")))


def downgrade() -> None:
    op.execute("DROP VIEW fpm_snapshots")
    op.execute("ALTER TABLE ticks ALTER COLUMN inputs TYPE jsonb USING inputs::jsonb")
    op.execute(_FILL_FPM_DEFAULTS)
    op.execute(OLD_FPM_SNAPSHOTS_VIEW)
    op.execute(_GRANTS_AND_COMMENT.format(comment=_COMMENT.format(revisions="0015")))
