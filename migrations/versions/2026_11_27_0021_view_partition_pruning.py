"""The history views read only the days a time filter names: one tick's rows looked up by (tick_id, scheduled_at).

Why: since migration 0017 partitioned the tick tables by day, a view filtered on time read every day of the tables
it joins to `ticks`: a filter on `ticks.scheduled_at` is not carried over to the joined tables, and Postgres, which
costs a parameterized lookup as one probe per partition (it does not count run-time pruning), chose hash joins over
all partitions, and the explanation subqueries (`tick_steps`, which has no `scheduled_at`) probed every day's
`tick_step_lists`. Measured on an 80-day history: `tick_history` for the last hour ~1.1 s (3.7 ms unpartitioned),
`decision_history` over 7 days ~0.35 s (21 ms).
Changes (CREATE OR REPLACE: the same columns, types and rows; grants and comments kept):
- `tick_summary` (and so `tick_history`, which selects from it), `decision_history`, `scaling_events`: each tick
  table joined to `ticks` is read in a LEFT JOIN LATERAL subquery bound to the tick's (tick_id, scheduled_at), so
  each tick's row is one lookup in its own day's partition (run-time pruning). The subquery aggregates that row
  (at most one: the keys are unique), `(array_agg(x))[1]`, so that it is not flattened back into a hash join and
  Postgres can still leave it out when no column of it is selected (`SELECT reason, count(*) FROM tick_history`
  reads `ticks` only, as before).
- their explanation subqueries (capacity columns, `why`) expand the tick's `tick_step_lists` row looked up by
  (tick_id, scheduled_at) as `tick_steps` does, instead of reading `tick_steps` by tick id.
Not changed: `sla_by_hour` and `predictor_accuracy` (aggregates over every window of a range: a hash join suits
them), `tick_steps`, `fpm_snapshots`, `replay_comparison`.
Locks: ACCESS EXCLUSIVE on the three views, briefly; no table is rewritten.
Downgrade: 0020's definitions.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27 09:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _row_of(table: str) -> str:
    """The tick's one row of `table` (or none) as a composite `r`, looked up by the tick's partition key; an
    aggregate so the planner neither flattens it into a join over every partition nor keeps it when unused."""
    return f"(SELECT (array_agg(x))[1] AS r FROM {table} x WHERE x.tick_id = t.id AND x.scheduled_at = t.scheduled_at)"


def _desired(component: str) -> str:
    """The tick's proposal for `component` (unique per tick), as its `desired` workers."""
    return (
        "(SELECT (array_agg(x.desired))[1] AS desired FROM proposals x "
        f"WHERE x.tick_id = t.id AND x.scheduled_at = t.scheduled_at AND x.component::text = '{component}')"
    )


# The tick's steps, with `tick_steps`' columns (0018's expansion of the packed line), from its own partition.
STEPS_OF_TICK = """(SELECT (u.n - 1)::int AS seq, st.step, st.component, NULLIF(f.fields[2], '')::float8 AS value,
               st.reason, step_detail(st.template, f.fields) AS detail
          FROM tick_step_lists l
         CROSS JOIN LATERAL unnest(string_to_array(l.packed, ';')) WITH ORDINALITY AS u(entry, n)
         CROSS JOIN LATERAL (SELECT string_to_array(u.entry, ',') AS fields) f
          JOIN step_templates st ON st.id = f.fields[1]::int
         WHERE l.tick_id = t.id AND l.scheduled_at = t.scheduled_at) s"""

_PARTS = {
    "{steps}": STEPS_OF_TICK,
    "{o}": _row_of("traffic_observations"),
    "{p}": _row_of("predictions"),
    "{w}": _row_of("worker_observations"),
    "{pp}": _desired("prefill"),
    "{pd}": _desired("decode"),
}


def _fill(definition: str) -> str:
    """A definition below with its placeholders (`{steps}`, `{o}`, ...) replaced by the lookups above."""
    for placeholder, sql in _PARTS.items():
        definition = definition.replace(placeholder, sql)
    return definition


_TICK_SUMMARY = """
 SELECT t.id AS tick_id,
    dep.name AS deployment,
    t.loop,
    t.scheduled_at,
    t.recorded_at,
    EXTRACT(epoch FROM t.recorded_at - t.scheduled_at)::double precision AS lag_s,
    t.reason,
    t.decide_ms,
    t.config_hash,
    (o.r).window_s,
    (o.r).num_req AS observed_num_req,
    (o.r).isl AS observed_isl,
    (o.r).osl AS observed_osl,
    (o.r).ttft_ms AS observed_ttft_ms,
    (o.r).itl_ms AS observed_itl_ms,
    (p.r).predictor,
    (p.r).num_req AS predicted_num_req,
    (p.r).isl AS predicted_isl,
    (p.r).osl AS predicted_osl,
    (p.r).reason AS prediction_reason,
    (w.r).ready_prefill,
    (w.r).ready_decode,
    (w.r).expected_prefill,
    (w.r).expected_decode,
    pp.desired AS proposed_prefill,
    pd.desired AS proposed_decode,
    ( SELECT
                CASE s.step
                    WHEN 'capacity'::text THEN s.value
                    ELSE s.value * (p.r).isl
                END AS "case"
           FROM {steps}
          WHERE s.component::text = 'prefill'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS prefill_engine_tokens_per_s,
    ( SELECT
                CASE s.step
                    WHEN 'capacity'::text THEN s.value
                    ELSE s.value * (p.r).osl
                END AS "case"
           FROM {steps}
          WHERE s.component::text = 'decode'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS decode_engine_tokens_per_s,
    ( SELECT
                CASE s.step
                    WHEN 'engine_capacity'::text THEN s.value
                    ELSE s.value / NULLIF((p.r).isl, 0::double precision)
                END AS "case"
           FROM {steps}
          WHERE s.component::text = 'prefill'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS prefill_engine_requests_per_s,
    ( SELECT
                CASE s.step
                    WHEN 'engine_capacity'::text THEN s.value
                    ELSE s.value / NULLIF((p.r).osl, 0::double precision)
                END AS "case"
           FROM {steps}
          WHERE s.component::text = 'decode'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS decode_engine_requests_per_s,
    d.id AS decision_id,
    d.target_prefill,
    d.target_decode,
    d.status AS decision_status,
    (c.body ->> 'ttft_ms'::text)::double precision AS ttft_target_ms,
    (c.body ->> 'itl_ms'::text)::double precision AS itl_target_ms,
    COALESCE((c.body ->> 'prefill_engine_num_gpu'::text)::integer, 1) AS prefill_gpus_per_engine,
    COALESCE((c.body ->> 'decode_engine_num_gpu'::text)::integer, 1) AS decode_gpus_per_engine,
    (c.body ->> 'throughput_adjustment_interval_seconds'::text)::double precision AS throughput_interval_s,
    (o.r).kv_hit_rate,
    (o.r).accept_length,
    (o.r).prompt_tokens_p99_250ms,
    (o.r).prompt_tokens_p99_500ms,
    (o.r).prompt_tokens_p99_1s,
    (o.r).prompt_tokens_p99_2s,
    (o.r).prompt_tokens_p99_5s,
    (o.r).prompt_tokens_p99_10s,
    (o.r).prompt_tokens_p99_30s
   FROM ticks t
     JOIN deployments dep ON dep.id = t.deployment_id
     LEFT JOIN planner_configs c ON c.config_hash::text = t.config_hash::text
     LEFT JOIN LATERAL {o} o ON true
     LEFT JOIN LATERAL {p} p ON true
     LEFT JOIN LATERAL {w} w ON true
     LEFT JOIN LATERAL {pp} pp ON true
     LEFT JOIN LATERAL {pd} pd ON true
     LEFT JOIN decisions d ON d.tick_id = t.id
"""
NEW_TICK_SUMMARY = _fill(_TICK_SUMMARY)

_DECISION_HISTORY = """
 SELECT d.id AS decision_id,
    dep.name AS deployment,
    t.loop,
    t.scheduled_at AS decided_at,
    (w.r).ready_prefill AS prefill_before,
    (w.r).ready_decode AS decode_before,
    d.target_prefill,
    d.target_decode,
    d.reason,
    ( SELECT
                CASE
                    WHEN length(e_1.why) > 1500 THEN "left"(e_1.why, 1497) || '...'::text
                    ELSE e_1.why
                END AS why
           FROM ( SELECT string_agg(((s.step::text || COALESCE((' ('::text || s.component::text) || ')'::text,
               ''::text)) || ': '::text) ||
                        CASE
                            WHEN length(COALESCE(NULLIF(s.detail, ''::text),
                                s.reason::text)) > 160 THEN "left"(COALESCE(NULLIF(s.detail, ''::text),
                                    s.reason::text), 157) || '...'::text
                            ELSE COALESCE(NULLIF(s.detail, ''::text), s.reason::text)
                        END, '; '::text ORDER BY s.seq) AS why
                   FROM {steps}
                  WHERE (s.reason::text <> ALL (ARRAY['observed'::character varying::text,
                      'within_range'::character varying::text, 'predicted'::character varying::text]))
                      AND NOT ((s.step::text = ANY (ARRAY['propose:builtin_throughput_propose'::character varying::text,
                          'propose:builtin_load_propose'::character varying::text]))
                      AND (s.reason::text = ANY (ARRAY['plugin_overrides'::character varying::text,
                          'plugin_no_opinion'::character varying::text, 'override_set'::character varying::text]))))
        e_1) AS why,
    (p.r).num_req AS predicted_num_req,
    (p.r).isl AS predicted_isl,
    (p.r).osl AS predicted_osl,
    d.status,
    d.status_changed_at,
    e.num_attempts,
    e.last_outcome,
    e.last_executed_at,
    v.decision_id AS virtual_decision_id,
    v.acknowledged_at,
    t.id AS tick_id,
    t.config_hash
   FROM decisions d
     JOIN ticks t ON t.id = d.tick_id
     JOIN deployments dep ON dep.id = d.deployment_id
     LEFT JOIN LATERAL {w} w ON true
     LEFT JOIN LATERAL {p} p ON true
     LEFT JOIN LATERAL ( SELECT count(*) AS num_attempts,
            (array_agg(x.outcome ORDER BY x.attempt DESC))[1] AS last_outcome,
            max(x.executed_at) AS last_executed_at
           FROM executions x
          WHERE x.decision_id = d.id) e ON true
     LEFT JOIN virtual_decisions v ON v.planner_decision_id = d.id
"""
NEW_DECISION_HISTORY = _fill(_DECISION_HISTORY)

_SCALING_EVENTS = """
 SELECT d.id AS decision_id,
    dep.name AS deployment,
    t.loop,
    t.scheduled_at AS decided_at,
    (w.r).expected_prefill AS prefill_from,
    COALESCE(d.target_prefill, (w.r).expected_prefill) AS prefill_to,
    (w.r).expected_decode AS decode_from,
    COALESCE(d.target_decode, (w.r).expected_decode) AS decode_to,
    COALESCE(d.target_prefill - (w.r).expected_prefill, 0) AS prefill_delta,
    COALESCE(d.target_decode - (w.r).expected_decode, 0) AS decode_delta,
    COALESCE(d.target_prefill - (w.r).expected_prefill, 0)
        * COALESCE((c.body ->> 'prefill_engine_num_gpu'::text)::integer, 1)
            + COALESCE(d.target_decode - (w.r).expected_decode, 0)
                * COALESCE((c.body ->> 'decode_engine_num_gpu'::text)::integer, 1) AS gpu_delta,
        CASE
            WHEN COALESCE(d.target_prefill - (w.r).expected_prefill, 0) >= 0
                AND COALESCE(d.target_decode - (w.r).expected_decode, 0) >= 0 THEN 'up'::text
            WHEN COALESCE(d.target_prefill - (w.r).expected_prefill, 0) <= 0
                AND COALESCE(d.target_decode - (w.r).expected_decode, 0) <= 0 THEN 'down'::text
            ELSE 'mixed'::text
        END AS direction,
    d.reason,
    d.status,
    v.written_at AS applied_at,
    v.acknowledged_at,
    EXTRACT(epoch FROM v.acknowledged_at - t.scheduled_at)::double precision AS seconds_to_acknowledge,
    t.id AS tick_id,
    t.config_hash
   FROM decisions d
     JOIN ticks t ON t.id = d.tick_id
     JOIN deployments dep ON dep.id = d.deployment_id
     LEFT JOIN LATERAL {w} w ON true
     LEFT JOIN planner_configs c ON c.config_hash::text = t.config_hash::text
     LEFT JOIN virtual_decisions v ON v.planner_decision_id = d.id
"""
NEW_SCALING_EVENTS = _fill(_SCALING_EVENTS)


# 0020's definitions (pg_get_viewdef), restored by the downgrade.
OLD_TICK_SUMMARY = """
 SELECT t.id AS tick_id,
    dep.name AS deployment,
    t.loop,
    t.scheduled_at,
    t.recorded_at,
    EXTRACT(epoch FROM t.recorded_at - t.scheduled_at)::double precision AS lag_s,
    t.reason,
    t.decide_ms,
    t.config_hash,
    o.window_s,
    o.num_req AS observed_num_req,
    o.isl AS observed_isl,
    o.osl AS observed_osl,
    o.ttft_ms AS observed_ttft_ms,
    o.itl_ms AS observed_itl_ms,
    p.predictor,
    p.num_req AS predicted_num_req,
    p.isl AS predicted_isl,
    p.osl AS predicted_osl,
    p.reason AS prediction_reason,
    w.ready_prefill,
    w.ready_decode,
    w.expected_prefill,
    w.expected_decode,
    pp.desired AS proposed_prefill,
    pd.desired AS proposed_decode,
    ( SELECT
                CASE s.step
                    WHEN 'capacity'::text THEN s.value
                    ELSE s.value * p.isl
                END AS "case"
           FROM tick_steps s
          WHERE s.tick_id = t.id AND s.component::text = 'prefill'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS prefill_engine_tokens_per_s,
    ( SELECT
                CASE s.step
                    WHEN 'capacity'::text THEN s.value
                    ELSE s.value * p.osl
                END AS "case"
           FROM tick_steps s
          WHERE s.tick_id = t.id AND s.component::text = 'decode'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS decode_engine_tokens_per_s,
    ( SELECT
                CASE s.step
                    WHEN 'engine_capacity'::text THEN s.value
                    ELSE s.value / NULLIF(p.isl, 0::double precision)
                END AS "case"
           FROM tick_steps s
          WHERE s.tick_id = t.id AND s.component::text = 'prefill'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS prefill_engine_requests_per_s,
    ( SELECT
                CASE s.step
                    WHEN 'engine_capacity'::text THEN s.value
                    ELSE s.value / NULLIF(p.osl, 0::double precision)
                END AS "case"
           FROM tick_steps s
          WHERE s.tick_id = t.id AND s.component::text = 'decode'::text
              AND (s.step::text = ANY (ARRAY['capacity'::character varying::text,
                  'engine_capacity'::character varying::text])) AND s.value IS NOT NULL
          ORDER BY s.seq
         LIMIT 1) AS decode_engine_requests_per_s,
    d.id AS decision_id,
    d.target_prefill,
    d.target_decode,
    d.status AS decision_status,
    (c.body ->> 'ttft_ms'::text)::double precision AS ttft_target_ms,
    (c.body ->> 'itl_ms'::text)::double precision AS itl_target_ms,
    COALESCE((c.body ->> 'prefill_engine_num_gpu'::text)::integer, 1) AS prefill_gpus_per_engine,
    COALESCE((c.body ->> 'decode_engine_num_gpu'::text)::integer, 1) AS decode_gpus_per_engine,
    (c.body ->> 'throughput_adjustment_interval_seconds'::text)::double precision AS throughput_interval_s,
    o.kv_hit_rate,
    o.accept_length,
    o.prompt_tokens_p99_250ms,
    o.prompt_tokens_p99_500ms,
    o.prompt_tokens_p99_1s,
    o.prompt_tokens_p99_2s,
    o.prompt_tokens_p99_5s,
    o.prompt_tokens_p99_10s,
    o.prompt_tokens_p99_30s
   FROM ticks t
     JOIN deployments dep ON dep.id = t.deployment_id
     LEFT JOIN planner_configs c ON c.config_hash::text = t.config_hash::text
     LEFT JOIN traffic_observations o ON o.tick_id = t.id AND o.scheduled_at = t.scheduled_at
     LEFT JOIN predictions p ON p.tick_id = t.id AND p.scheduled_at = t.scheduled_at
     LEFT JOIN worker_observations w ON w.tick_id = t.id AND w.scheduled_at = t.scheduled_at
     LEFT JOIN proposals pp ON pp.tick_id = t.id AND pp.scheduled_at = t.scheduled_at
         AND pp.component::text = 'prefill'::text
     LEFT JOIN proposals pd ON pd.tick_id = t.id AND pd.scheduled_at = t.scheduled_at
         AND pd.component::text = 'decode'::text
     LEFT JOIN decisions d ON d.tick_id = t.id
"""

OLD_DECISION_HISTORY = """
 SELECT d.id AS decision_id,
    dep.name AS deployment,
    t.loop,
    t.scheduled_at AS decided_at,
    w.ready_prefill AS prefill_before,
    w.ready_decode AS decode_before,
    d.target_prefill,
    d.target_decode,
    d.reason,
    ( SELECT
                CASE
                    WHEN length(e_1.why) > 1500 THEN "left"(e_1.why, 1497) || '...'::text
                    ELSE e_1.why
                END AS why
           FROM ( SELECT string_agg(((s.step::text || COALESCE((' ('::text || s.component::text) || ')'::text,
               ''::text)) || ': '::text) ||
                        CASE
                            WHEN length(COALESCE(NULLIF(s.detail, ''::text),
                                s.reason::text)) > 160 THEN "left"(COALESCE(NULLIF(s.detail, ''::text),
                                    s.reason::text), 157) || '...'::text
                            ELSE COALESCE(NULLIF(s.detail, ''::text), s.reason::text)
                        END, '; '::text ORDER BY s.seq) AS why
                   FROM tick_steps s
                  WHERE s.tick_id = t.id AND (s.reason::text <> ALL (ARRAY['observed'::character varying::text,
                      'within_range'::character varying::text, 'predicted'::character varying::text]))
                      AND NOT ((s.step::text = ANY (ARRAY['propose:builtin_throughput_propose'::character varying::text,
                          'propose:builtin_load_propose'::character varying::text]))
                      AND (s.reason::text = ANY (ARRAY['plugin_overrides'::character varying::text,
                          'plugin_no_opinion'::character varying::text, 'override_set'::character varying::text]))))
        e_1) AS why,
    p.num_req AS predicted_num_req,
    p.isl AS predicted_isl,
    p.osl AS predicted_osl,
    d.status,
    d.status_changed_at,
    e.num_attempts,
    e.last_outcome,
    e.last_executed_at,
    v.decision_id AS virtual_decision_id,
    v.acknowledged_at,
    t.id AS tick_id,
    t.config_hash
   FROM decisions d
     JOIN ticks t ON t.id = d.tick_id
     JOIN deployments dep ON dep.id = d.deployment_id
     LEFT JOIN worker_observations w ON w.tick_id = t.id AND w.scheduled_at = t.scheduled_at
     LEFT JOIN predictions p ON p.tick_id = t.id AND p.scheduled_at = t.scheduled_at
     LEFT JOIN LATERAL ( SELECT count(*) AS num_attempts,
            (array_agg(x.outcome ORDER BY x.attempt DESC))[1] AS last_outcome,
            max(x.executed_at) AS last_executed_at
           FROM executions x
          WHERE x.decision_id = d.id) e ON true
     LEFT JOIN virtual_decisions v ON v.planner_decision_id = d.id
"""

OLD_SCALING_EVENTS = """
 SELECT d.id AS decision_id,
    dep.name AS deployment,
    t.loop,
    t.scheduled_at AS decided_at,
    w.expected_prefill AS prefill_from,
    COALESCE(d.target_prefill, w.expected_prefill) AS prefill_to,
    w.expected_decode AS decode_from,
    COALESCE(d.target_decode, w.expected_decode) AS decode_to,
    COALESCE(d.target_prefill - w.expected_prefill, 0) AS prefill_delta,
    COALESCE(d.target_decode - w.expected_decode, 0) AS decode_delta,
    COALESCE(d.target_prefill - w.expected_prefill, 0)
        * COALESCE((c.body ->> 'prefill_engine_num_gpu'::text)::integer, 1)
            + COALESCE(d.target_decode - w.expected_decode, 0)
                * COALESCE((c.body ->> 'decode_engine_num_gpu'::text)::integer, 1) AS gpu_delta,
        CASE
            WHEN COALESCE(d.target_prefill - w.expected_prefill, 0) >= 0
                AND COALESCE(d.target_decode - w.expected_decode, 0) >= 0 THEN 'up'::text
            WHEN COALESCE(d.target_prefill - w.expected_prefill, 0) <= 0
                AND COALESCE(d.target_decode - w.expected_decode, 0) <= 0 THEN 'down'::text
            ELSE 'mixed'::text
        END AS direction,
    d.reason,
    d.status,
    v.written_at AS applied_at,
    v.acknowledged_at,
    EXTRACT(epoch FROM v.acknowledged_at - t.scheduled_at)::double precision AS seconds_to_acknowledge,
    t.id AS tick_id,
    t.config_hash
   FROM decisions d
     JOIN ticks t ON t.id = d.tick_id
     JOIN deployments dep ON dep.id = d.deployment_id
     LEFT JOIN worker_observations w ON w.tick_id = t.id AND w.scheduled_at = t.scheduled_at
     LEFT JOIN planner_configs c ON c.config_hash::text = t.config_hash::text
     LEFT JOIN virtual_decisions v ON v.planner_decision_id = d.id
"""


def _replace(definitions: dict[str, str]) -> None:
    """CREATE OR REPLACE each view: its columns are the same, so its grants, comments and dependents stay."""
    for view, definition in definitions.items():
        op.execute(f"CREATE OR REPLACE VIEW {view} AS {definition}")


def upgrade() -> None:
    _replace(
        {
            "tick_summary": NEW_TICK_SUMMARY,
            "decision_history": NEW_DECISION_HISTORY,
            "scaling_events": NEW_SCALING_EVENTS,
        }
    )


def downgrade() -> None:
    _replace(
        {
            "tick_summary": OLD_TICK_SUMMARY,
            "decision_history": OLD_DECISION_HISTORY,
            "scaling_events": OLD_SCALING_EVENTS,
        }
    )
