"""Operator views: `sla_by_hour` reports 0 attainment for an hour that met no target, and `decision_history.why`
carries the numbers behind each decision.

Why: `sla_by_hour.request_weighted_attainment` divided the requests of the windows within target by those of the
windows with latency data; an hour with latency data and no window within target summed no rows, so the
numerator was NULL and the attainment NULL instead of 0, and the worst hours dropped out of dashboards (NULL
stays for an hour with no latency data at all: there the attainment is unknown). `decision_history.why` listed
step names and reason codes only (`demand: demand_sized (prefill)`); the arithmetic
(`ceil(450000 / 49481) = 10`) was in `tick_steps.detail`, which a reader of the view had to join by hand. `why`
becomes the non-routine steps' details in tick order, `step (component): detail` joined by "; " (the reason code
where a step has no detail), each detail cut at 160 characters and the whole at 1500 (a cut ends with "...";
`tick_steps` keeps every step in full): on the recommended policy a decision's sizing arithmetic (capacity,
headroom, demand, burst, clamps, decision) takes about 1400. Left out: steps whose reason is `observed` or
`within_range` (as before), `predicted` (the forecast is in the view's `predicted_*` columns; an ensemble's
explanation alone runs to 650 characters), and the built-in propose plugins' bookkeeping (`plugin_overrides`,
`override_set`), which repeats the planner's own `demand` steps (their errors and hold-overs still show). Both
views keep their columns, so CREATE OR REPLACE VIEW replaces them in place: grants (`planner_analyst`) and
comments survive. The definitions are 0001's and 0003's, taken from their modules with the one expression
replaced, so each view stays written once.
Creates: nothing new; replaces the definitions of `sla_by_hour` and `decision_history`, the COMMENT ON VIEW of
`decision_history`, and adds COMMENT ON COLUMN to `decision_history.why` and
`sla_by_hour.request_weighted_attainment`.
Locks: CREATE OR REPLACE VIEW takes a brief ACCESS EXCLUSIVE lock on each view (queries on it wait for the
moment of the replacement); no table is scanned or locked for writes.
Downgrade: restores 0001's `decision_history` and 0003's `sla_by_hour` (CREATE OR REPLACE VIEW: grants kept),
0001's view comment, and removes the two column comments. No data is involved.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 16:00:00
"""

from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The longest `why` and the longest step detail in it (characters); longer ones are cut, ending with "..." (ASCII
# so any database encoding takes it).
MAX_WHY_CHARS = 1500
MAX_STEP_DETAIL_CHARS = 160

# 0003's attainment numerator: NULL when no window of the hour was within target.
_ATTAINMENT_0003 = """sum(o.num_req) FILTER (
               WHERE o.ttft_ms <= (c.body ->> 'ttft_ms')::float8 AND o.itl_ms <= (c.body ->> 'itl_ms')::float8
           ) / NULLIF("""
_ATTAINMENT_0008 = """COALESCE(sum(o.num_req) FILTER (
               WHERE o.ttft_ms <= (c.body ->> 'ttft_ms')::float8 AND o.itl_ms <= (c.body ->> 'itl_ms')::float8
           ), 0) / NULLIF("""

# 0001's `why`: step names and reason codes.
_WHY_0001 = """(SELECT string_agg(s.step || ': ' || s.reason || COALESCE(' (' || s.component || ')', ''), '; '
                              ORDER BY s.seq)
              FROM tick_steps s
             WHERE s.tick_id = t.id AND s.reason NOT IN ('observed', 'within_range')) AS why"""

# The built-in propose plugins' steps (`propose:<plugin id>`, planner_core.pipeline.builtin) and the reasons of
# their routine records, which repeat the planner's own `demand` steps.
_BUILTIN_PROPOSE_STEPS = "'propose:builtin_throughput_propose', 'propose:builtin_load_propose'"
_BUILTIN_ROUTINE_REASONS = "'plugin_overrides', 'plugin_no_opinion', 'override_set'"


def _cut(expression: str, max_chars: int) -> str:
    """`expression` (text) cut to `max_chars` characters, ending with "..." when it was longer."""
    return (
        f"CASE WHEN length({expression}) > {max_chars} THEN left({expression}, {max_chars - 3}) || '...' "
        f"ELSE {expression} END"
    )


_WHY_0008 = f"""(SELECT {_cut("e.why", MAX_WHY_CHARS)}
              FROM (SELECT string_agg(
                               s.step || COALESCE(' (' || s.component || ')', '') || ': '
                                 || {_cut("COALESCE(NULLIF(s.detail, ''), s.reason)", MAX_STEP_DETAIL_CHARS)},
                               '; ' ORDER BY s.seq) AS why
                      FROM tick_steps s
                     WHERE s.tick_id = t.id AND s.reason NOT IN ('observed', 'within_range', 'predicted')
                       AND NOT (s.step IN ({_BUILTIN_PROPOSE_STEPS})
                                AND s.reason IN ({_BUILTIN_ROUTINE_REASONS}))) e) AS why"""

_DECISION_HISTORY_COMMENT_0001 = (
    "What the planner decided (targets), when (the tick''s scheduled time), why (reason and the non-trivial "
    "explanation steps) and what happened (status, execution attempts, virtual-connector acknowledgement)."
)
_DECISION_HISTORY_COMMENT = (
    "What the planner decided (targets), when (the tick''s scheduled time), why (reason, and in why the "
    "non-routine explanation steps with their numbers) and what happened (status, execution attempts, "
    "virtual-connector acknowledgement)."
)
_WHY_COMMENT = (
    "The tick''s non-routine explanation steps in order, step (component): detail, joined by ''; '' (the reason "
    f"code where a step has no detail); each detail at most {MAX_STEP_DETAIL_CHARS} characters and the whole at "
    f"most {MAX_WHY_CHARS}, a longer one cut and ending with ''...'' (tick_steps has every step in full)"
)
_ATTAINMENT_COMMENT = (
    "Requests of the windows within both targets over the requests of the windows with TTFT and ITL data "
    "(0..1); 0 when none was within target, NULL when the hour had no latency data"
)


def _module(revision_id: str) -> ModuleType:
    """An earlier revision's module (Alembic's own loading of it, as 0007 does)."""
    return op.get_context().script.get_revision(revision_id).module


def _replaced(statements: list[str], view: str, old: str, new: str) -> str:
    """The CREATE VIEW of `view` among an earlier revision's statements, with `old` replaced by `new`, as CREATE
    OR REPLACE VIEW."""
    [statement] = [s for s in statements if f"CREATE VIEW {view} AS" in s]
    if statement.count(old) != 1:
        raise RuntimeError(f"{view}: the expression this revision replaces is not found exactly once")
    return statement.replace(old, new).replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1)


def _definitions(*, fixed: bool) -> list[str]:
    """`sla_by_hour` and `decision_history`: this revision's definitions (`fixed`) or the earlier ones."""
    attainment, why = (_ATTAINMENT_0008, _WHY_0008) if fixed else (_ATTAINMENT_0003, _WHY_0001)
    return [
        _replaced(_module("0003")._VIEWS, "sla_by_hour", _ATTAINMENT_0003, attainment),
        _replaced(_module("0001")._UPGRADE_SQL, "decision_history", _WHY_0001, why),
    ]


def upgrade() -> None:
    for statement in _definitions(fixed=True):
        op.execute(statement)
    op.execute(f"COMMENT ON VIEW decision_history IS '{_DECISION_HISTORY_COMMENT}'")
    op.execute(f"COMMENT ON COLUMN decision_history.why IS '{_WHY_COMMENT}'")
    op.execute(f"COMMENT ON COLUMN sla_by_hour.request_weighted_attainment IS '{_ATTAINMENT_COMMENT}'")


def downgrade() -> None:
    for statement in _definitions(fixed=False):
        op.execute(statement)
    op.execute(f"COMMENT ON VIEW decision_history IS '{_DECISION_HISTORY_COMMENT_0001}'")
    op.execute("COMMENT ON COLUMN decision_history.why IS NULL")
    op.execute("COMMENT ON COLUMN sla_by_hour.request_weighted_attainment IS NULL")
