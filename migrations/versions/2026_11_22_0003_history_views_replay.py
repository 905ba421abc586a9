"""History views, a read-only analyst role, history indexes and the replay tables.

Why: operators and analysts ask the decision history questions in SQL ("when did we scale and why", "did we
meet the SLA hour by hour", "how good were the forecasts"); these views answer them directly. A read-only role
lets analysts connect without being able to change the system of record. `planner replay` re-runs recorded
ticks and must keep its results apart from the production history, in `replay_runs` and `replay_ticks`. The
indexes keep time-ranged history queries and `planner db prune` fast on a year of 5 s load ticks.
Creates:
- views `scaling_events`, `sla_by_hour`, `predictor_accuracy`, `replay_comparison` (with COMMENT ON VIEW);
- index `ix_ticks_deployment_id_scheduled_at` (time ranges over both loops of a deployment), the partial
  expression index `ix_ticks_throughput_hour` (hourly SLA roll-ups of throughput ticks) and
  `ix_planner_states_deployment_id_tick_id` (a deployment's newest state, read by every tick); drops
  `ix_ticks_deployment_id` and `ix_planner_states_deployment_id`, prefixes of the new ones;
- tables `replay_runs`, `replay_ticks` and `prune_watermarks` (how far `planner db prune` got per deployment
  and loop, so a daily prune starts where the last one stopped);
- role `planner_analyst` (NOLOGIN) if it does not exist yet and this user may create roles (otherwise a NOTICE
  says so and the grants are skipped; a DBA can create the role and re-run the grants in the README), with USAGE
  on the schema, SELECT on every table and view, and SELECT by default on tables created later by this user.
Locks: CREATE INDEX takes a SHARE lock on `ticks` / `planner_states` for the duration of the build (ticks
wait; measured 0.6, 0.2 and 0.5 s on 1.78M ticks, so expect seconds to tens of seconds on a year of 5 s
ticks): run it in a quiet period, or create the indexes by hand with CREATE INDEX CONCURRENTLY first (the
migration skips indexes that already exist). DROP INDEX takes a brief ACCESS EXCLUSIVE lock on its table. New
views and tables lock nothing else; GRANT takes brief locks on catalog entries only.
Downgrade: drops the views, the replay tables (replay results are lost), the prune watermarks (a later prune
re-examines old ticks, deleting nothing twice) and the new indexes, and recreates the two it dropped; revokes the
analyst's privileges in this database and drops the role only when nothing in any database still depends on
it and it has no members (roles are cluster-wide: other planner databases on the server may use it).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ANALYST_ROLE = "planner_analyst"


def upgrade() -> None:
    op.execute("CREATE INDEX IF NOT EXISTS ix_ticks_deployment_id_scheduled_at ON ticks (deployment_id, scheduled_at)")
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_ticks_throughput_hour ON ticks "
        "(deployment_id, date_trunc('hour', scheduled_at, 'UTC')) WHERE loop = 'throughput'"
    )
    # The newest state of a deployment (read by every tick) without walking other deployments' newer rows.
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_planner_states_deployment_id_tick_id ON planner_states (deployment_id, tick_id)"
    )
    # Both are prefixes of the indexes above: dropping them saves a write per tick on the busiest tables.
    op.execute("DROP INDEX IF EXISTS ix_ticks_deployment_id")
    op.execute("DROP INDEX IF EXISTS ix_planner_states_deployment_id")
    op.create_table(
        "replay_runs",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("range_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("range_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("config_source", sa.Text(), nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=True),
        sa.Column("config_body", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("profile_dir", sa.Text(), nullable=True),
        sa.Column("code_version", sa.String(length=120), nullable=False),
        sa.Column("num_ticks", sa.Integer(), nullable=False),
        sa.Column("num_identical", sa.Integer(), nullable=False),
        sa.Column("num_differing", sa.Integer(), nullable=False),
        sa.Column("num_skipped", sa.Integer(), nullable=False),
        sa.Column("elapsed_s", sa.Double(), nullable=False),
        sa.CheckConstraint("mode IN ('recorded', 'chained')", name=op.f("ck_replay_runs_mode")),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_replay_runs_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replay_runs")),
    )
    op.create_table(
        "replay_ticks",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("tick_id", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=60), nullable=True),
        sa.Column("target_prefill", sa.Integer(), nullable=True),
        sa.Column("target_decode", sa.Integer(), nullable=True),
        sa.Column("differences", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.CheckConstraint("outcome IN ('identical', 'differing', 'skipped')", name=op.f("ck_replay_ticks_outcome")),
        sa.ForeignKeyConstraint(
            ["run_id"], ["replay_runs.id"], name=op.f("fk_replay_ticks_run_id_replay_runs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["tick_id"], ["ticks.id"], name=op.f("fk_replay_ticks_tick_id_ticks")),
        sa.PrimaryKeyConstraint("run_id", "tick_id", name=op.f("pk_replay_ticks")),
    )
    op.create_table(
        "prune_watermarks",
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("loop", sa.String(length=20), nullable=False),
        sa.Column("pruned_through", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"], ["deployments.id"], name=op.f("fk_prune_watermarks_deployment_id_deployments")
        ),
        sa.PrimaryKeyConstraint("deployment_id", "loop", name=op.f("pk_prune_watermarks")),
    )
    for statement in _VIEWS:
        op.execute(statement)
    op.execute(_GRANT_ANALYST)


def downgrade() -> None:
    op.execute(_REVOKE_ANALYST)
    for view in ("replay_comparison", "predictor_accuracy", "sla_by_hour", "scaling_events"):
        op.execute(f"DROP VIEW IF EXISTS {view}")
    op.drop_table("prune_watermarks")
    op.drop_table("replay_ticks")
    op.drop_table("replay_runs")
    op.execute("CREATE INDEX IF NOT EXISTS ix_planner_states_deployment_id ON planner_states (deployment_id)")
    op.execute("CREATE INDEX IF NOT EXISTS ix_ticks_deployment_id ON ticks (deployment_id)")
    op.execute("DROP INDEX IF EXISTS ix_planner_states_deployment_id_tick_id")
    op.execute("DROP INDEX IF EXISTS ix_ticks_throughput_hour")
    op.execute("DROP INDEX IF EXISTS ix_ticks_deployment_id_scheduled_at")


_VIEWS = [
    """
    CREATE VIEW scaling_events AS
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
               * COALESCE((c.body ->> 'prefill_engine_num_gpu')::int, 1)
             + COALESCE(d.target_decode - w.expected_decode, 0)
               * COALESCE((c.body ->> 'decode_engine_num_gpu')::int, 1) AS gpu_delta,
           CASE
               WHEN COALESCE(d.target_prefill - w.expected_prefill, 0) >= 0
                    AND COALESCE(d.target_decode - w.expected_decode, 0) >= 0 THEN 'up'
               WHEN COALESCE(d.target_prefill - w.expected_prefill, 0) <= 0
                    AND COALESCE(d.target_decode - w.expected_decode, 0) <= 0 THEN 'down'
               ELSE 'mixed'
           END AS direction,
           d.reason,
           d.status,
           v.written_at AS applied_at,
           v.acknowledged_at,
           extract(epoch FROM v.acknowledged_at - t.scheduled_at)::float8 AS seconds_to_acknowledge,
           t.id AS tick_id,
           t.config_hash
    FROM decisions d
    JOIN ticks t ON t.id = d.tick_id
    JOIN deployments dep ON dep.id = d.deployment_id
    LEFT JOIN worker_observations w ON w.tick_id = t.id
    LEFT JOIN planner_configs c ON c.config_hash = t.config_hash
    LEFT JOIN virtual_decisions v ON v.planner_decision_id = d.id
    """,
    """
    COMMENT ON VIEW scaling_events IS
    'One row per scaling decision: replicas per pool before (what the orchestrator was working towards) and '
    'after, the change in replicas and GPUs, its direction (up, down, mixed), why, its status and, through the '
    'virtual connector, when it was written and acknowledged. Filter status IN (''applied'', ''acknowledged'') '
    'for the changes that were carried out.'
    """,
    "COMMENT ON COLUMN scaling_events.gpu_delta IS "
    "'GPUs added (+) or released (-): replica deltas times GPUs per engine of the config in force'",
    "COMMENT ON COLUMN scaling_events.seconds_to_acknowledge IS "
    "'From the tick''s scheduled time to the orchestrator''s acknowledgement (virtual connector only)'",
    """
    CREATE VIEW sla_by_hour AS
    SELECT dep.name AS deployment,
           date_trunc('hour', t.scheduled_at, 'UTC') AS hour,
           count(*) AS num_windows,
           sum(o.num_req) AS num_req,
           count(*) FILTER (WHERE o.ttft_ms IS NOT NULL AND o.itl_ms IS NOT NULL) AS num_windows_with_latency,
           count(*) FILTER (
               WHERE o.ttft_ms <= (c.body ->> 'ttft_ms')::float8 AND o.itl_ms <= (c.body ->> 'itl_ms')::float8
           ) AS num_windows_met,
           sum(o.num_req) FILTER (
               WHERE o.ttft_ms <= (c.body ->> 'ttft_ms')::float8 AND o.itl_ms <= (c.body ->> 'itl_ms')::float8
           ) / NULLIF(sum(o.num_req) FILTER (WHERE o.ttft_ms IS NOT NULL AND o.itl_ms IS NOT NULL), 0)
               AS request_weighted_attainment,
           sum(o.num_req * o.ttft_ms) / NULLIF(sum(o.num_req) FILTER (WHERE o.ttft_ms IS NOT NULL), 0)
               AS mean_ttft_ms,
           sum(o.num_req * o.itl_ms) / NULLIF(sum(o.num_req) FILTER (WHERE o.itl_ms IS NOT NULL), 0)
               AS mean_itl_ms,
           max(o.ttft_ms) AS worst_window_ttft_ms,
           max(o.itl_ms) AS worst_window_itl_ms,
           max((c.body ->> 'ttft_ms')::float8) AS ttft_target_ms,
           max((c.body ->> 'itl_ms')::float8) AS itl_target_ms,
           avg(w.ready_prefill)::float8 AS mean_ready_prefill,
           avg(w.ready_decode)::float8 AS mean_ready_decode,
           sum(o.window_s * (w.ready_prefill * COALESCE((c.body ->> 'prefill_engine_num_gpu')::int, 1)
                             + w.ready_decode * COALESCE((c.body ->> 'decode_engine_num_gpu')::int, 1))) / 3600.0
               AS gpu_hours
    FROM ticks t
    JOIN deployments dep ON dep.id = t.deployment_id
    JOIN traffic_observations o ON o.tick_id = t.id
    LEFT JOIN worker_observations w ON w.tick_id = t.id
    LEFT JOIN planner_configs c ON c.config_hash = t.config_hash
    WHERE t.loop = 'throughput'
    GROUP BY dep.name, date_trunc('hour', t.scheduled_at, 'UTC')
    """,
    """
    COMMENT ON VIEW sla_by_hour IS
    'Per deployment and UTC hour, from the throughput windows observed: requests, windows whose mean TTFT and '
    'ITL were within the targets of the config in force (num_windows_met; request_weighted_attainment weights '
    'them by requests), request-weighted mean latencies, the worst window, mean ready replicas and GPU-hours '
    '(ready workers times window length). Latency is the traffic source''s window mean, not per request.'
    """,
    """
    CREATE VIEW predictor_accuracy AS
    SELECT dep.name AS deployment,
           t.id AS tick_id,
           t.scheduled_at AS predicted_at,
           n.scheduled_at AS window_end,
           p.predictor,
           p.reason AS prediction_reason,
           p.num_req AS predicted_num_req,
           o.num_req AS actual_num_req,
           p.isl AS predicted_isl,
           o.isl AS actual_isl,
           p.osl AS predicted_osl,
           o.osl AS actual_osl,
           abs(p.num_req - o.num_req) / NULLIF(o.num_req, 0) AS num_req_abs_pct_error,
           abs(ln(1 + GREATEST(p.num_req, 0)) - ln(1 + GREATEST(o.num_req, 0))) AS num_req_log1p_error,
           0.4 * abs(ln(1 + GREATEST(p.num_req * p.isl, 0)) - ln(1 + GREATEST(o.num_req * o.isl, 0)))
             + 0.4 * abs(ln(1 + GREATEST(p.num_req * p.osl, 0)) - ln(1 + GREATEST(o.num_req * o.osl, 0)))
             + 0.1 * abs(ln(1 + GREATEST(p.isl, 0)) - ln(1 + GREATEST(o.isl, 0)))
             + 0.1 * abs(ln(1 + GREATEST(p.osl, 0)) - ln(1 + GREATEST(o.osl, 0))) AS loss
    FROM ticks t
    JOIN deployments dep ON dep.id = t.deployment_id
    JOIN predictions p ON p.tick_id = t.id
    JOIN planner_configs c ON c.config_hash = t.config_hash
    JOIN LATERAL (
        SELECT nt.id, nt.scheduled_at
          FROM ticks nt
         WHERE nt.deployment_id = t.deployment_id
           AND nt.loop = 'throughput'
           AND nt.scheduled_at > t.scheduled_at
           AND nt.scheduled_at <= t.scheduled_at
               + make_interval(secs => 1.5 * (c.body ->> 'throughput_adjustment_interval_seconds')::float8)
         ORDER BY nt.scheduled_at
         LIMIT 1
    ) n ON true
    JOIN traffic_observations o ON o.tick_id = n.id
    WHERE t.loop = 'throughput'
    """,
    """
    COMMENT ON VIEW predictor_accuracy IS
    'Each throughput forecast next to what the following window (the next throughput tick, if it came within '
    '1.5 intervals) observed: absolute percentage error of the request count, log1p errors, and the loss of '
    'Dynamo''s predictor sweep: 0.4 e(N*ISL) + 0.4 e(N*OSL) + 0.1 e(ISL) + 0.1 e(OSL), e = |log1p(a) - log1p(b)|.'
    """,
    """
    CREATE VIEW replay_comparison AS
    SELECT r.run_id,
           run.mode,
           run.config_source,
           dep.name AS deployment,
           t.id AS tick_id,
           t.loop,
           t.scheduled_at,
           r.outcome,
           t.reason AS recorded_reason,
           r.reason AS replayed_reason,
           d.target_prefill AS recorded_prefill,
           r.target_prefill AS replayed_prefill,
           d.target_decode AS recorded_decode,
           r.target_decode AS replayed_decode,
           r.differences,
           r.detail
    FROM replay_ticks r
    JOIN replay_runs run ON run.id = r.run_id
    JOIN ticks t ON t.id = r.tick_id
    JOIN deployments dep ON dep.id = t.deployment_id
    LEFT JOIN decisions d ON d.tick_id = t.id
    """,
    """
    COMMENT ON VIEW replay_comparison IS
    'Each replayed tick next to the recorded one: headline reason and targets, recorded and replayed, whether '
    'the replay was identical, and the differing fields (JSON list of {field, recorded, replayed}).'
    """,
]

_GRANT_ANALYST = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ANALYST_ROLE}') THEN
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = current_user AND (rolcreaterole OR rolsuper)) THEN
            RAISE NOTICE 'role {ANALYST_ROLE} not created: % may not create roles (see README, analyst role)',
                current_user;
            RETURN;
        END IF;
        CREATE ROLE {ANALYST_ROLE} NOLOGIN;
        COMMENT ON ROLE {ANALYST_ROLE} IS
            'Read-only access to the planner history: grant it to a login user (see the README)';
    END IF;
    GRANT USAGE ON SCHEMA public TO {ANALYST_ROLE};
    GRANT SELECT ON ALL TABLES IN SCHEMA public TO {ANALYST_ROLE};
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {ANALYST_ROLE};
END
$$
"""

_REVOKE_ANALYST = f"""
DO $$
DECLARE
    analyst oid;
BEGIN
    SELECT oid INTO analyst FROM pg_roles WHERE rolname = '{ANALYST_ROLE}';
    IF analyst IS NULL THEN
        RETURN;
    END IF;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {ANALYST_ROLE};
    REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM {ANALYST_ROLE};
    REVOKE USAGE ON SCHEMA public FROM {ANALYST_ROLE};
    IF NOT EXISTS (SELECT FROM pg_shdepend WHERE refclassid = 'pg_authid'::regclass AND refobjid = analyst)
       AND NOT EXISTS (SELECT FROM pg_auth_members WHERE roleid = analyst) THEN
        BEGIN
            DROP ROLE {ANALYST_ROLE};
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'role {ANALYST_ROLE} kept: % may not drop roles', current_user;
        END;
    END IF;
END
$$
"""
