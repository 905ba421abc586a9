"""The decision history as rows: one query behind `planner history` and the pandas helper `history_frame`.

Both read the `decision_history` view with the same SQL and the same filters, so the CLI (table, CSV, JSON) and
a notebook see the same rows. Times given for them (`--since`) are parsed by `planner_core.runtime.times`.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from planner_core.runtime.store.db import get_engine

if TYPE_CHECKING:
    import pandas as pd

# The columns `planner history` and `history_frame` return, in order (all from the `decision_history` view).
HISTORY_COLUMNS = (
    "deployment",
    "decided_at",
    "loop",
    "prefill_before",
    "decode_before",
    "target_prefill",
    "target_decode",
    "reason",
    "why",
    "predicted_num_req",
    "status",
    "num_attempts",
    "last_outcome",
    "acknowledged_at",
    "decision_id",
    "tick_id",
)

HISTORY_SQL = f"""
SELECT {", ".join(HISTORY_COLUMNS)}
  FROM decision_history
 WHERE (CAST(:deployment AS text) IS NULL OR deployment = :deployment)
   AND (CAST(:since AS timestamptz) IS NULL OR decided_at >= :since)
 ORDER BY decided_at, decision_id
"""


def history_rows(database_url: str, deployment: str | None = None, since: dt.datetime | None = None) -> list[dict]:
    """Decisions from `decision_history` (columns `HISTORY_COLUMNS`), oldest first.

    Args:
        database_url: SQLAlchemy URL of the planner database.
        deployment: only this managed deployment; None for all.
        since: only decisions whose tick was scheduled at or after this time; None for all.
    """
    with get_engine(database_url).connect() as conn:
        result = conn.execute(text(HISTORY_SQL), {"deployment": deployment, "since": since})
        return [dict(row._mapping) for row in result]


def history_frame(database_url: str, deployment: str | None = None, since: dt.datetime | None = None) -> pd.DataFrame:
    """`history_rows` as a pandas DataFrame (same rows, same columns, same order).

    Example:
        >>> from planner_core.runtime.store.history import history_frame
        >>> frame = history_frame(url, "demo")
        >>> frame.groupby("status").size()
    """
    import pandas as pd

    return pd.DataFrame.from_records(history_rows(database_url, deployment, since), columns=list(HISTORY_COLUMNS))


def jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    """A history row with timestamps as ISO 8601 strings (the JSON form `planner history --format json` prints)."""
    return {key: value.isoformat() if isinstance(value, dt.datetime) else value for key, value in row.items()}


# The two questions `planner demo` answers at its end and `planner history --examples` shows: plain SQL on the
# history views, with their answers, so a user sees what to ask the database.
EXAMPLE_QUERIES = (
    (
        "What did the planner decide, when, why, and what happened?",
        """SELECT decided_at, prefill_before AS p_before, decode_before AS d_before,
       target_prefill AS p_target, target_decode AS d_target, reason, status,
       num_attempts AS attempts, acknowledged_at IS NOT NULL AS acked
  FROM decision_history WHERE deployment = :deployment
 ORDER BY decided_at LIMIT 10""",
    ),
    (
        "Why did each tick end as it did, and how fast was the decision?",
        """SELECT reason, count(*) AS ticks, round(avg(observed_num_req)::numeric, 1) AS avg_requests,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY decide_ms)::numeric, 3) AS decide_ms_p50
  FROM tick_history WHERE deployment = :deployment
 GROUP BY reason ORDER BY ticks DESC""",
    ),
)


def example_query_frames(database_url: str, deployment: str) -> list[tuple[str, str, pd.DataFrame]]:
    """Each example query's title, SQL and answer for one deployment."""
    import pandas as pd

    with get_engine(database_url).connect() as conn:
        return [
            (title, sql, pd.read_sql(text(sql), conn, params={"deployment": deployment}))
            for title, sql in EXAMPLE_QUERIES
        ]
