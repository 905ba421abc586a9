"""Loading a report's data from Postgres (`load_report_data`): the only database code of the report. The tick rows
come from the `tick_summary` view, which the metrics exporter reads too."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import DateTime, bindparam, text
from sqlalchemy.orm import Session

from planner_core.domain import Loop
from planner_core.runtime.report.data import (
    ROUTINE_STEP_REASONS,
    DecisionEvent,
    EngineLoadRow,
    ReportData,
    StepRow,
    TickRow,
    UnknownDeployment,
)

_WINDOW = """dep.name = :deployment
      AND (CAST(:since AS timestamptz) IS NULL OR t.scheduled_at >= :since)
      AND (CAST(:until AS timestamptz) IS NULL OR t.scheduled_at < :until)"""

# The per-tick rows come from the `tick_summary` view (migration 0006), which the metrics exporter reads too; a
# decided tick's `why` from `decision_history` (migration 0008), as `planner history` shows it.
_TICKS_SQL = """
SELECT tick_id, loop, scheduled_at, lag_s, reason, decide_ms,
       window_s, observed_num_req, observed_isl, observed_osl, observed_ttft_ms, observed_itl_ms,
       predictor, predicted_num_req, predicted_isl, predicted_osl, prediction_reason,
       ready_prefill, ready_decode, expected_prefill, expected_decode, proposed_prefill, proposed_decode,
       prefill_engine_tokens_per_s, decode_engine_tokens_per_s,
       decision_id, target_prefill, target_decode, decision_status,
       ttft_target_ms, itl_target_ms, prefill_gpus_per_engine, decode_gpus_per_engine, throughput_interval_s,
       (SELECT h.why FROM decision_history h WHERE h.decision_id = tick_summary.decision_id) AS why
  FROM tick_summary
 WHERE deployment = :deployment
   AND (CAST(:since AS timestamptz) IS NULL OR scheduled_at >= :since)
   AND (CAST(:until AS timestamptz) IS NULL OR scheduled_at < :until)
 ORDER BY scheduled_at, tick_id
"""

_STEPS_SQL = f"""
SELECT s.tick_id, t.loop, t.scheduled_at, s.seq, s.step, s.component, s.reason, s.value, s.detail
  FROM tick_steps s
  JOIN ticks t ON t.id = s.tick_id
  JOIN deployments dep ON dep.id = t.deployment_id
 WHERE {_WINDOW} AND s.reason NOT IN :routine
 ORDER BY t.scheduled_at, s.tick_id, s.seq
"""

_FPM_SQL = f"""
SELECT t.scheduled_at, f.component, f.worker_id, f.dp_rank, f.metrics
  FROM fpm_snapshots f
  JOIN ticks t ON t.id = f.tick_id
  JOIN deployments dep ON dep.id = t.deployment_id
 WHERE {_WINDOW}
 ORDER BY t.scheduled_at, f.component, f.worker_id, f.dp_rank
"""

_EVENTS_SQL = """
SELECT x.decision_id, x.executed_at AS at, x.outcome AS event, x.detail, 0 AS rank
  FROM executions x
  JOIN decisions d ON d.id = x.decision_id
  JOIN deployments dep ON dep.id = d.deployment_id
 WHERE dep.name = :deployment
   AND (CAST(:since AS timestamptz) IS NULL OR x.executed_at >= :since)
   AND (CAST(:until AS timestamptz) IS NULL OR x.executed_at < :until)
UNION ALL
SELECT v.planner_decision_id, v.acknowledged_at, 'acknowledged', '', 1  -- acknowledged after applied at one time
  FROM virtual_decisions v
  JOIN deployments dep ON dep.id = v.deployment_id
 WHERE dep.name = :deployment AND v.acknowledged_at IS NOT NULL
   AND (CAST(:since AS timestamptz) IS NULL OR v.acknowledged_at >= :since)
   AND (CAST(:until AS timestamptz) IS NULL OR v.acknowledged_at < :until)
 ORDER BY 2, 5, 1
"""


def _query(session: Session, sql: str, params: dict[str, Any], *extra: Any) -> list[dict[str, Any]]:
    statement = text(sql).bindparams(
        bindparam("since", type_=DateTime(timezone=True)),
        bindparam("until", type_=DateTime(timezone=True)),
        *extra,
    )
    return [dict(row._mapping) for row in session.execute(statement, params)]


def _nested_number(metrics: dict[str, Any], section: str, key: str) -> float | None:
    value = (metrics.get(section) or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def load_report_data(
    session: Session, deployment: str, since: dt.datetime | None = None, until: dt.datetime | None = None
) -> ReportData:
    """Read what `deployment`'s ticks recorded with `since <= scheduled time < until` (either bound optional).

    Raises:
        UnknownDeployment: no deployment of that name was ever recorded.
    """
    known = [row["name"] for row in session.execute(text("SELECT name FROM deployments ORDER BY name")).mappings()]
    if deployment not in known:
        shown = ", ".join(known[:10]) or "none"
        raise UnknownDeployment(f"deployment {deployment!r}: not found in the database (known: {shown})")
    params = {"deployment": deployment, "since": since, "until": until}
    ticks = []
    for row in _query(session, _TICKS_SQL, params):
        scheduled_at = row.pop("scheduled_at")
        ticks.append(TickRow(**row | {"loop": Loop(row["loop"])}, at_s=scheduled_at.timestamp()))
    steps = tuple(
        StepRow(
            tick_id=row["tick_id"],
            loop=Loop(row["loop"]),
            at_s=row["scheduled_at"].timestamp(),
            seq=row["seq"],
            step=row["step"],
            component=row["component"],
            reason=row["reason"],
            value=row["value"],
            detail=row["detail"],
        )
        for row in _query(
            session,
            _STEPS_SQL,
            params | {"routine": tuple(sorted(ROUTINE_STEP_REASONS))},
            bindparam("routine", expanding=True),
        )
    )
    engine_loads = tuple(
        EngineLoadRow(
            at_s=row["scheduled_at"].timestamp(),
            component=row["component"],
            worker_id=row["worker_id"],
            dp_rank=row["dp_rank"],
            # the JSON form of `ForwardPassMetrics` (planner_core.domain): queued and scheduled sections
            queued_prefill_tokens=_nested_number(row["metrics"], "queued", "sum_prefill_tokens"),
            queued_decode_kv_tokens=_nested_number(row["metrics"], "queued", "sum_decode_kv_tokens"),
            inflight_decode_kv_tokens=_nested_number(row["metrics"], "scheduled", "sum_decode_kv_tokens"),
        )
        for row in _query(session, _FPM_SQL, params)
    )
    events = tuple(
        DecisionEvent(
            decision_id=row["decision_id"], at_s=row["at"].timestamp(), event=row["event"], detail=row["detail"]
        )
        for row in _query(session, _EVENTS_SQL, params)
    )
    return ReportData(
        deployment=deployment,
        since_s=since.timestamp() if since else None,
        until_s=until.timestamp() if until else None,
        ticks=tuple(ticks),
        steps=steps,
        engine_loads=engine_loads,
        decision_events=events,
    )
