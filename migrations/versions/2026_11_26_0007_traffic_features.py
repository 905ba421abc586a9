"""Traffic features: the KV-cache hit rate, the speculative accept length and the prompt-token arrival curve of
each tick's window, as columns of `traffic_observations` and `tick_summary`.

Why: the decision reads these fields of `TrafficObservation`, but only the tick's inputs JSON (`ticks.inputs`,
which replay reads) held them; SQL users and reports had to dig them out of JSONB. They become nullable columns
beside the lengths and latencies, with a COMMENT ON COLUMN each, and `tick_summary` appends them to its columns
(CREATE OR REPLACE VIEW may add columns only at the end; the view's other columns, and so `tick_history`, the
metrics exporter and the report, are unchanged). The view is 0006's definition with the new columns appended,
taken from 0006's module so the join stays written once. Ticks recorded before this revision have NULL in the
new columns (their values remain in `ticks.inputs`).
Creates: columns `kv_hit_rate`, `accept_length`, `prompt_tokens_p99_250ms` .. `prompt_tokens_p99_30s` on
`traffic_observations` and, with the same names and comments, on `tick_summary`.
Locks: ALTER TABLE ... ADD COLUMN (nullable, no default) takes a brief ACCESS EXCLUSIVE lock on
traffic_observations, no rewrite; CREATE OR REPLACE VIEW a brief ACCESS EXCLUSIVE lock on `tick_summary`.
Downgrade: rebuilds `tick_summary` as 0006 left it (0006's downgrade then upgrade: `tick_history` is pointed at
its own join meanwhile, so it and its grants survive; the view's comments and analyst grant are restored), then
drops the columns (their values are lost from the table, not from `ticks.inputs`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 10:00:00
"""

from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# `planner_core.domain.PROMPT_ARRIVAL_INTERVALS_S` as of this revision: the arrival-curve fields and the interval
# (s) each covers. Copied, not imported: a migration must create the same columns whatever the domain becomes
# (a test checks that the models, which do read the domain, match the migrated schema).
_ARRIVAL_CURVE_INTERVALS_S = {
    "prompt_tokens_p99_250ms": 0.25,
    "prompt_tokens_p99_500ms": 0.5,
    "prompt_tokens_p99_1s": 1.0,
    "prompt_tokens_p99_2s": 2.0,
    "prompt_tokens_p99_5s": 5.0,
    "prompt_tokens_p99_10s": 10.0,
    "prompt_tokens_p99_30s": 30.0,
}


def _arrival_curve_comment(interval_s: float) -> str:
    span = f"{interval_s * 1000:g} ms" if interval_s < 1 else f"{interval_s:g} s"
    return (
        f"Prompt-token arrival curve, {span} point (tokens): the 99th percentile over the window's requests of "
        f"the prompt tokens that arrived in the {span} up to each one, its own included. NULL where the source "
        "does not timestamp requests"
    )


# Column -> its comment, in the order the columns are added to the table and the view.
# The models carry the same comments (the models-match-migrations test compares them).
_COLUMNS = {
    "kv_hit_rate": "Fraction (0..1) of the window's prompt tokens served from the KV cache (the router's hit "
    "rate). NULL where the source does not report it",
    "accept_length": "Speculative decoding: mean tokens accepted per decode step over the window (tokens per "
    "step). NULL where the source does not report it",
    **{name: _arrival_curve_comment(interval_s) for name, interval_s in _ARRIVAL_CURVE_INTERVALS_S.items()},
}

# 0006's `tick_summary` ends its column list with this line, then its joins.
_LAST_COLUMN_0006 = "(c.body ->> 'throughput_adjustment_interval_seconds')::float8 AS throughput_interval_s\n"


def _revision_0006() -> ModuleType:
    """0006's module (Alembic's own loading of it, as its cookbook's replaceable objects do)."""
    return op.get_context().script.get_revision("0006").module


def _tick_summary_with_traffic_features(tick_summary_0006: str) -> str:
    """0006's CREATE VIEW with the new columns appended to its column list, as CREATE OR REPLACE VIEW."""
    if tick_summary_0006.count(_LAST_COLUMN_0006) != 1:
        raise RuntimeError(
            "0006's tick_summary no longer ends with throughput_interval_s; append after its last column"
        )
    appended = "".join(f",\n           o.{column}" for column in _COLUMNS)
    return tick_summary_0006.replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1).replace(
        _LAST_COLUMN_0006, _LAST_COLUMN_0006.rstrip("\n") + appended + "\n"
    )


def upgrade() -> None:
    for column, comment in _COLUMNS.items():
        op.add_column("traffic_observations", sa.Column(column, sa.Double(), nullable=True, comment=comment))
    op.execute(_tick_summary_with_traffic_features(_revision_0006()._TICK_SUMMARY))
    for column, comment in _COLUMNS.items():
        quoted = comment.replace("'", "''")
        op.execute(f"COMMENT ON COLUMN tick_summary.{column} IS '{quoted}'")


def downgrade() -> None:
    revision_0006 = _revision_0006()
    revision_0006.downgrade()  # `tick_history` on its own join again; `tick_summary` dropped
    revision_0006.upgrade()  # `tick_summary` with 0006's columns, comments and grant; `tick_history` its projection
    for column in reversed(_COLUMNS):
        op.drop_column("traffic_observations", column)
