"""The `tick_summary` view: one definition of the per-tick join that the metrics exporter and the report read.

Why: `planner_core.metrics` (the newest tick per loop) and `planner_core.report` (the ticks of a window) each
spelled out the same join of a tick with its deployment, config, observation, forecast, workers, proposals,
decision and per-engine capacity; two copies drift apart. The view holds it once, and both select from it with
their own filters and order. The capacity columns read the step the sizing algorithm wrote: `capacity` (the
interpolation algorithms: tokens/s per engine) or `engine_capacity` (`throughput_algorithm: engine_capacity`:
requests/s per engine), each converted to the other unit over the forecast ISL (prefill) or OSL (decode), so
ticks sized either way have both figures. `tick_history` (0001) was a subset of the same join; it becomes a
projection of `tick_summary` with the same columns, so the join exists once in the schema.
Creates: view `tick_summary` (with COMMENT ON VIEW and on its capacity columns), SELECT on it for
`planner_analyst` when that role exists; replaces `tick_history` by the same columns selected from
`tick_summary`.
Locks: CREATE VIEW and CREATE OR REPLACE VIEW take brief locks on catalog entries and an ACCESS EXCLUSIVE lock
on `tick_history` for the moment of the replacement; no table is scanned or locked for writes.
Downgrade: restores `tick_history`'s own definition from 0001 and drops `tick_summary` (no data is lost).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 14:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ANALYST_ROLE = "planner_analyst"


def _capacity(component: str, length: str, unit: str) -> str:
    """One engine's capacity from the first `capacity` / `engine_capacity` step of `component` that has a value.

    `capacity` records tokens/s per engine, `engine_capacity` requests/s per engine; a request carries `length`
    tokens (the forecast ISL for prefill, OSL for decode), so each converts to the other unit over it.
    """
    if unit == "tokens":
        converted = f"CASE s.step WHEN 'capacity' THEN s.value ELSE s.value * {length} END"
    else:
        converted = f"CASE s.step WHEN 'engine_capacity' THEN s.value ELSE s.value / NULLIF({length}, 0) END"
    return f"""(SELECT {converted}
              FROM tick_steps s
             WHERE s.tick_id = t.id AND s.component = '{component}'
               AND s.step IN ('capacity', 'engine_capacity') AND s.value IS NOT NULL
             ORDER BY s.seq
             LIMIT 1)"""


# Scalar subqueries, not lateral joins: a query on the view that does not select a capacity column (e.g. on
# `tick_history`) does not evaluate it. `planner_configs` is LEFT JOINed on its key (every tick has one) so such
# a query skips that join too.
_TICK_SUMMARY = f"""
    CREATE VIEW tick_summary AS
    SELECT t.id AS tick_id,
           dep.name AS deployment,
           t.loop,
           t.scheduled_at,
           t.recorded_at,
           extract(epoch FROM t.recorded_at - t.scheduled_at)::float8 AS lag_s,
           t.reason,
           t.decide_ms,
           t.config_hash,
           o.window_s,
           o.num_req AS observed_num_req, o.isl AS observed_isl, o.osl AS observed_osl,
           o.ttft_ms AS observed_ttft_ms, o.itl_ms AS observed_itl_ms,
           p.predictor,
           p.num_req AS predicted_num_req, p.isl AS predicted_isl, p.osl AS predicted_osl,
           p.reason AS prediction_reason,
           w.ready_prefill, w.ready_decode, w.expected_prefill, w.expected_decode,
           pp.desired AS proposed_prefill, pd.desired AS proposed_decode,
           {_capacity("prefill", "p.isl", "tokens")} AS prefill_engine_tokens_per_s,
           {_capacity("decode", "p.osl", "tokens")} AS decode_engine_tokens_per_s,
           {_capacity("prefill", "p.isl", "requests")} AS prefill_engine_requests_per_s,
           {_capacity("decode", "p.osl", "requests")} AS decode_engine_requests_per_s,
           d.id AS decision_id, d.target_prefill, d.target_decode, d.status AS decision_status,
           (c.body ->> 'ttft_ms')::float8 AS ttft_target_ms,
           (c.body ->> 'itl_ms')::float8 AS itl_target_ms,
           COALESCE((c.body ->> 'prefill_engine_num_gpu')::int, 1) AS prefill_gpus_per_engine,
           COALESCE((c.body ->> 'decode_engine_num_gpu')::int, 1) AS decode_gpus_per_engine,
           (c.body ->> 'throughput_adjustment_interval_seconds')::float8 AS throughput_interval_s
    FROM ticks t
    JOIN deployments dep ON dep.id = t.deployment_id
    LEFT JOIN planner_configs c ON c.config_hash = t.config_hash
    LEFT JOIN traffic_observations o ON o.tick_id = t.id
    LEFT JOIN predictions p ON p.tick_id = t.id
    LEFT JOIN worker_observations w ON w.tick_id = t.id
    LEFT JOIN proposals pp ON pp.tick_id = t.id AND pp.component = 'prefill'
    LEFT JOIN proposals pd ON pd.tick_id = t.id AND pd.component = 'decode'
    LEFT JOIN decisions d ON d.tick_id = t.id
    """

_COMMENTS = [
    """
    COMMENT ON VIEW tick_summary IS
    'One row per recorded tick: when (scheduled, recorded, lag), why (reason), what it observed, forecast, saw '
    'of the workers and proposed, one engine''s capacity per pool, its decision if any, and the SLA targets, '
    'GPUs per engine and throughput interval of the config in force. The metrics exporter and the diagnostics '
    'report read it.'
    """,
    "COMMENT ON COLUMN tick_summary.prefill_engine_tokens_per_s IS "
    "'Prompt tokens/s one prefill engine serves under the TTFT target: the capacity step, or the engine_capacity "
    "step''s requests/s times the forecast ISL'",
    "COMMENT ON COLUMN tick_summary.decode_engine_tokens_per_s IS "
    "'Output tokens/s one decode engine serves under the ITL target: the capacity step, or the engine_capacity "
    "step''s requests/s times the forecast OSL'",
    "COMMENT ON COLUMN tick_summary.prefill_engine_requests_per_s IS "
    "'Requests/s one prefill engine serves under the TTFT target: the engine_capacity step, or the capacity "
    "step''s tokens/s over the forecast ISL'",
    "COMMENT ON COLUMN tick_summary.decode_engine_requests_per_s IS "
    "'Requests/s one decode engine serves under the ITL target: the engine_capacity step, or the capacity "
    "step''s tokens/s over the forecast OSL'",
]

# The columns of `tick_history` as 0001 defined them, in order (CREATE OR REPLACE VIEW keeps names and types).
_TICK_HISTORY_COLUMNS = """tick_id, deployment, loop, scheduled_at, reason,
           observed_num_req, observed_isl, observed_osl, observed_ttft_ms, observed_itl_ms,
           predicted_num_req, predicted_isl, predicted_osl, prediction_reason,
           ready_prefill, ready_decode, expected_prefill, expected_decode,
           proposed_prefill, proposed_decode, decision_id, decide_ms, config_hash"""

_TICK_HISTORY_FROM_SUMMARY = f"CREATE OR REPLACE VIEW tick_history AS SELECT {_TICK_HISTORY_COLUMNS} FROM tick_summary"

# 0001's definition, restored on downgrade.
_TICK_HISTORY_0001 = """
    CREATE OR REPLACE VIEW tick_history AS
    SELECT t.id AS tick_id,
           dep.name AS deployment,
           t.loop,
           t.scheduled_at,
           t.reason,
           o.num_req AS observed_num_req, o.isl AS observed_isl, o.osl AS observed_osl,
           o.ttft_ms AS observed_ttft_ms, o.itl_ms AS observed_itl_ms,
           p.num_req AS predicted_num_req, p.isl AS predicted_isl, p.osl AS predicted_osl,
           p.reason AS prediction_reason,
           w.ready_prefill, w.ready_decode, w.expected_prefill, w.expected_decode,
           pp.desired AS proposed_prefill, pd.desired AS proposed_decode,
           d.id AS decision_id,
           t.decide_ms,
           t.config_hash
    FROM ticks t
    JOIN deployments dep ON dep.id = t.deployment_id
    LEFT JOIN traffic_observations o ON o.tick_id = t.id
    LEFT JOIN predictions p ON p.tick_id = t.id
    LEFT JOIN worker_observations w ON w.tick_id = t.id
    LEFT JOIN proposals pp ON pp.tick_id = t.id AND pp.component = 'prefill'
    LEFT JOIN proposals pd ON pd.tick_id = t.id AND pd.component = 'decode'
    LEFT JOIN decisions d ON d.tick_id = t.id
    """

# 0003's default privileges already cover views this user creates; the explicit grant also covers a role a DBA
# created after 0003 (see the README, analyst role). No role, no grant (0003 said why in a NOTICE).
_GRANT_ANALYST = f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ANALYST_ROLE}') THEN
        GRANT SELECT ON tick_summary TO {ANALYST_ROLE};
    END IF;
END
$$
"""


def upgrade() -> None:
    op.execute(_TICK_SUMMARY)
    for statement in _COMMENTS:
        op.execute(statement)
    op.execute(_TICK_HISTORY_FROM_SUMMARY)
    op.execute(_GRANT_ANALYST)


def downgrade() -> None:
    op.execute(_TICK_HISTORY_0001)
    op.execute("DROP VIEW IF EXISTS tick_summary")
