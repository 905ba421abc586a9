"""Alembic discipline: one head, a full round trip with data, and models that match the migrations."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from planner_core.domain import PROMPT_ARRIVAL_INTERVALS_S, Loop, TrafficObservation
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store.db import get_engine, to_libpq_uri
from planner_core.runtime.store.migrate import MIGRATIONS_DIR, downgrade, heads, upgrade
from planner_core.runtime.store.models import Base
from tests.conftest import write_config

TABLES = {
    "planner_configs",
    "deployments",
    "ticks",
    "traffic_observations",
    "worker_observations",
    "fpm_samples",
    "predictions",
    "proposals",
    "tick_step_lists",
    "step_templates",
    "planner_states",
    "decisions",
    "executions",
    "virtual_connector_state",
    "virtual_decisions",
    "local_workers",
    "local_connector_state",
    "audit_log",
    "audit_chain_head",
    "replay_runs",
    "replay_ticks",
    "prune_watermarks",
    "fleet_members",
    "fleet_budget",
    "arbitration_rounds",
    "arbitration_grants",
    "config_revisions",
    "drains",
}
VIEWS = {
    "decision_history",
    "tick_history",
    "scaling_events",
    "sla_by_hour",
    "predictor_accuracy",
    "replay_comparison",
    "tick_summary",
    "fpm_snapshots",
    "tick_steps",
}


def _tables(url: str) -> set[str]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows} - {"alembic_version"}


def _views(url: str) -> set[str]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        rows = conn.execute("SELECT viewname FROM pg_views WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_single_head() -> None:
    """The migration history has exactly one head."""
    assert len(heads()) == 1


def test_migration_files_say_why_locks_and_downgrade() -> None:
    """Every migration's docstring explains why, which locks it takes, and what downgrade does."""
    for path in sorted((MIGRATIONS_DIR / "versions").glob("*.py")):
        text = path.read_text()
        for heading in ("Why:", "Locks:", "Downgrade:"):
            assert heading in text, f"{path.name} lacks '{heading}'"


def test_upgrade_downgrade_upgrade_round_trip_with_data(empty_database_url: str, tmp_path, profile_dir) -> None:
    """Upgrade, record a tick, downgrade to base (everything gone), upgrade again (empty schema works)."""
    url = empty_database_url
    upgrade(url)
    assert _tables(url) == TABLES
    assert _views(url) == VIEWS
    ctx = load_context(url, "roundtrip", write_config(tmp_path))
    traffic = TrafficObservation(duration_s=60, num_req=3000, isl=3000, osl=300)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert run_tick(ctx, Loop.THROUGHPUT, at, traffic).tick_id is not None
    get_engine(url).dispose()

    downgrade(url, "base")
    assert _tables(url) == set()
    assert _views(url) == set()
    with psycopg.connect(to_libpq_uri(url)) as conn:
        functions = conn.execute("SELECT proname FROM pg_proc WHERE proname = 'audit_log_refuse_change'").fetchall()
    assert functions == []

    upgrade(url)
    assert _tables(url) == TABLES
    result = run_tick(ctx, Loop.THROUGHPUT, at, traffic)
    assert result.tick_id is not None  # the old tick is gone, so the same scheduled time records again
    get_engine(url).dispose()


def test_models_match_migrations(database_url: str) -> None:
    """Autogenerate finds no difference between the ORM models and the migrated schema, the day partitions of the
    tick tables (migration 0017) left to the partitioned tables they belong to."""
    from planner_core.runtime.store.partitions import ensure_partitions, include_name, include_object

    assert ensure_partitions(get_engine(database_url), [dt.date(2026, 1, 5)]) > 0
    with get_engine(database_url).connect() as conn:
        opts = {"compare_type": True, "include_name": include_name, "include_object": include_object}
        diff = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert diff == []


@pytest.mark.parametrize(
    "statement", ["UPDATE audit_log SET event = 'x'", "DELETE FROM audit_log", "TRUNCATE audit_log"]
)
def test_audit_log_is_append_only(database_url: str, tmp_path, profile_dir, statement: str) -> None:
    """The database itself refuses to update, delete or truncate audit rows."""
    ctx = load_context(database_url, "audit", write_config(tmp_path))
    run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone()[0] >= 2
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute(statement)


def test_an_out_of_date_schema_is_reported_with_the_fix(empty_database_url: str, tmp_path, profile_dir) -> None:
    """Ticks refuse to run on a database below the newest migration, saying how to fix it in one line."""
    from planner_core.runtime.store.migrate import SchemaOutOfDate

    config = write_config(tmp_path)
    with pytest.raises(SchemaOutOfDate, match=r"at no schema, .* run `planner db upgrade`"):
        load_context(empty_database_url, "old", config)
    upgrade(empty_database_url, "0001")
    with pytest.raises(SchemaOutOfDate, match="schema is at 0001"):
        load_context(empty_database_url, "old", config)
    upgrade(empty_database_url)
    assert load_context(empty_database_url, "old", config).config.ttft_ms == 200
    get_engine(empty_database_url).dispose()


def _relation(url: str, sql: str) -> tuple[list[str], list[tuple]]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        cursor = conn.execute(sql)
        return [c.name for c in cursor.description], cursor.fetchall()


def test_migration_0006_tick_summary_downgrades_and_upgrades_again(empty_database_url, tmp_path, profile_dir) -> None:
    """0006 -> 0005 drops `tick_summary` and gives `tick_history` back its own join, with the same columns and rows;
    upgrading again restores the view, its analyst grant, and `tick_history` as its projection."""
    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "views", write_config(tmp_path))
    traffic = TrafficObservation(duration_s=60, num_req=3000, isl=3000, osl=300)
    for minute in (0, 1):
        at = dt.datetime(2026, 1, 1, 0, minute, tzinfo=dt.UTC)
        assert run_tick(ctx, Loop.THROUGHPUT, at, traffic).tick_id is not None
    get_engine(url).dispose()
    history_sql = "SELECT * FROM tick_history ORDER BY tick_id"
    columns, rows = _relation(url, history_sql)
    assert len(rows) == 2 and "decision_id" in columns
    summary_columns, summary_rows = _relation(url, f"SELECT {', '.join(columns)} FROM tick_summary ORDER BY tick_id")
    assert (summary_columns, summary_rows) == (columns, rows)
    uses_summary = "SELECT pg_get_viewdef('tick_history') LIKE '%tick_summary%'"
    assert _relation(url, uses_summary)[1] == [(True,)]
    grant = "SELECT has_table_privilege('planner_analyst', 'tick_summary', 'SELECT')"
    assert _relation(url, grant)[1] == [(True,)]

    downgrade(url, "0005")
    assert _views(url) == VIEWS - {"tick_summary", "fpm_snapshots", "tick_steps"}
    assert _relation(url, history_sql) == (columns, rows)
    assert _relation(url, uses_summary)[1] == [(False,)]

    upgrade(url)
    assert _views(url) == VIEWS
    assert _relation(url, history_sql) == (columns, rows)
    assert _relation(url, uses_summary)[1] == [(True,)]
    assert _relation(url, grant)[1] == [(True,)]


def test_migration_0007_traffic_features_downgrades_and_upgrades_again(
    empty_database_url, tmp_path, profile_dir
) -> None:
    """0007 -> 0006 drops the traffic-feature columns from `traffic_observations` and `tick_summary`, leaving
    `tick_summary` with 0006's columns, its comments and grant, and `tick_history` unchanged; upgrading again
    appends them (NULL for ticks recorded meanwhile: their values are in `ticks.inputs`)."""
    url = empty_database_url
    features = ("kv_hit_rate", "accept_length", *PROMPT_ARRIVAL_INTERVALS_S)
    upgrade(url)
    ctx = load_context(url, "features", write_config(tmp_path))
    curve = {name: 8000.0 * interval_s for name, interval_s in PROMPT_ARRIVAL_INTERVALS_S.items()}
    traffic = TrafficObservation(
        duration_s=60, num_req=3000, isl=3000, osl=300, kv_hit_rate=0.5, accept_length=3.0, **curve
    )
    assert run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), traffic).tick_id is not None
    get_engine(url).dispose()
    summary_sql = "SELECT * FROM tick_summary ORDER BY tick_id"
    history_sql = "SELECT * FROM tick_history ORDER BY tick_id"
    summary_columns, [summary_row] = _relation(url, summary_sql)
    assert summary_columns[-len(features) :] == list(features)
    assert summary_row[-len(features) :] == (0.5, 3.0, *curve.values())
    history = _relation(url, history_sql)
    comments = (
        "SELECT col_description('tick_summary'::regclass, a.attnum), col_description('traffic_observations'::regclass,"
        " b.attnum) FROM pg_attribute a JOIN pg_attribute b ON b.attname = a.attname"
        " AND b.attrelid = 'traffic_observations'::regclass WHERE a.attrelid = 'tick_summary'::regclass"
        " AND a.attname = 'kv_hit_rate'"
    )
    [(view_comment, table_comment)] = _relation(url, comments)[1]
    assert view_comment == table_comment and "Fraction (0..1)" in view_comment
    grant = "SELECT has_table_privilege('planner_analyst', 'tick_summary', 'SELECT')"
    view_comment_sql = "SELECT obj_description('tick_summary'::regclass, 'pg_class') IS NOT NULL"
    table_columns = "SELECT column_name FROM information_schema.columns WHERE table_name = 'traffic_observations'"

    downgrade(url, "0006")
    columns_0006, [row_0006] = _relation(url, summary_sql)
    assert columns_0006 == summary_columns[: -len(features)]
    assert row_0006 == summary_row[: -len(features)]
    assert _relation(url, history_sql) == history
    assert _relation(url, grant)[1] == [(True,)] and _relation(url, view_comment_sql)[1] == [(True,)]
    assert not {c for (c,) in _relation(url, table_columns)[1]} & set(features)

    upgrade(url)
    assert _relation(url, summary_sql) == (summary_columns, [(*row_0006, *[None] * len(features))])
    assert _relation(url, history_sql) == history
    assert _relation(url, grant)[1] == [(True,)]


def test_migration_0008_operator_views_downgrades_and_upgrades_again(empty_database_url, tmp_path, profile_dir) -> None:
    """0008: an hour whose windows all missed the TTFT target has attainment 0 (0007: NULL), and `why` carries each
    step's numbers (0007: step names and reason codes); both views keep their columns, grants and view comments
    through 0008 -> 0007 -> 0008."""
    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "operator", write_config(tmp_path))  # TTFT target 200 ms, ITL 10 ms
    for minute, num_req in ((0, 3000), (1, 9000)):
        traffic = TrafficObservation(duration_s=60, num_req=num_req, isl=3000, osl=300, ttft_ms=250, itl_ms=9)
        at = dt.datetime(2026, 1, 1, 0, minute, tzinfo=dt.UTC)
        assert run_tick(ctx, Loop.THROUGHPUT, at, traffic).tick_id is not None
    get_engine(url).dispose()
    downgrade(url, "0022")  # `why` as 0008 made it (0023 shows the decision's summary instead)
    sla_sql = "SELECT num_windows_with_latency, num_windows_met, request_weighted_attainment FROM sla_by_hour"
    why_sql = "SELECT why FROM decision_history ORDER BY decision_id"
    grants = (
        "SELECT has_table_privilege('planner_analyst', 'sla_by_hour', 'SELECT'), "
        "has_table_privilege('planner_analyst', 'decision_history', 'SELECT')"
    )
    view_comment = "SELECT obj_description('decision_history'::regclass, 'pg_class')"
    why_comment = (
        "SELECT col_description('decision_history'::regclass, a.attnum) FROM pg_attribute a"
        " WHERE a.attrelid = 'decision_history'::regclass AND a.attname = 'why'"
    )
    history_columns = _relation(url, "SELECT * FROM decision_history")[0]
    sla_columns = _relation(url, "SELECT * FROM sla_by_hour")[0]

    assert _relation(url, sla_sql)[1] == [(2, 0, 0.0)]
    first_why, second_why = (why for (why,) in _relation(url, why_sql)[1])
    # the arithmetic of `tick_steps.detail`, not reason codes; the built-in plugins' bookkeeping left out
    assert "demand (prefill): ceil(150000 / 49481) = 4" in first_why
    assert "capacity (decode): 4556 tokens/s per engine at ITL 9.7 ms" in first_why
    assert "change_rate (prefill): 1 -> 10 limited to 9 (at most 8 per tick)" in second_why
    assert "demand_sized" not in first_why and "builtin" not in first_why
    assert all(len(why) <= 1500 for why in (first_why, second_why))
    assert _relation(url, grants)[1] == [(True, True)]
    assert "with their numbers" in _relation(url, view_comment)[1][0][0]
    assert _relation(url, why_comment)[1][0][0].startswith("The tick's non-routine explanation steps")

    downgrade(url, "0007")
    assert _relation(url, sla_sql)[1] == [(2, 0, None)]  # the defect 0008 fixes
    old_why = _relation(url, why_sql)[1][0][0]
    assert "demand: demand_sized (prefill)" in old_why and "ceil(" not in old_why
    assert _relation(url, "SELECT * FROM decision_history")[0] == history_columns
    assert _relation(url, "SELECT * FROM sla_by_hour")[0] == sla_columns
    assert _relation(url, grants)[1] == [(True, True)]
    assert "non-trivial explanation steps" in _relation(url, view_comment)[1][0][0]
    assert _relation(url, why_comment)[1] == [(None,)]

    upgrade(url)
    assert _relation(url, sla_sql)[1] == [(2, 0, 0.0)]
    assert [why for (why,) in _relation(url, why_sql)[1]] == [first_why, second_why]
    assert _relation(url, grants)[1] == [(True, True)]


def test_migration_0008_bounds_why(empty_database_url, tmp_path, profile_dir) -> None:
    """A step's detail in `why` is cut at 160 characters and the whole at 1500, each cut ending with '...'."""
    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "long", write_config(tmp_path))
    traffic = TrafficObservation(duration_s=60, num_req=3000, isl=3000, osl=300)
    tick_id = run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), traffic).tick_id
    get_engine(url).dispose()
    downgrade(url, "0022")  # `why` as 0008 made it (0023 shows the decision's summary instead)
    insert = (  # steps appended to the tick's explanation (`tick_step_lists` with `step_templates`, migration 0018)
        "WITH t AS (INSERT INTO step_templates (step, reason, template) VALUES ('plugin', 'override_set', "
        "repeat(%(text)s, %(n)s)) RETURNING id) "
        "UPDATE tick_step_lists SET packed = packed || repeat(';' || (SELECT id FROM t) || ',', %(steps)s) "
        "WHERE tick_id = %(tick)s"
    )
    with psycopg.connect(to_libpq_uri(url)) as conn:
        conn.execute(insert, {"text": "y", "n": 300, "steps": 1, "tick": tick_id})
    [(why,)] = _relation(url, "SELECT why FROM decision_history")[1]
    assert why.endswith("; plugin: " + "y" * 157 + "...") and len(why) < 1500
    with psycopg.connect(to_libpq_uri(url)) as conn:
        conn.execute(insert, {"text": "x", "n": 100, "steps": 20, "tick": tick_id})
    [(why,)] = _relation(url, "SELECT why FROM decision_history")[1]
    assert len(why) == 1500 and why.endswith("x...")


_FPM_COLUMNS = "SELECT tick_id, component, worker_id, dp_rank, wall_time_s, metrics FROM fpm_snapshots"
_OLD_FPM_ROWS = f"{_FPM_COLUMNS} ORDER BY tick_id, id"
_VIEW_FPM_ROWS = f"{_FPM_COLUMNS} ORDER BY tick_id, seq"


def _load_tick_with_fpm(url: str, tmp_path, at: dt.datetime, engines: list[tuple[str, str]]) -> int:
    """A load tick that saw one forward-pass report per (component, worker) in `engines`."""
    from planner_core.domain import Component, ForwardPassMetrics, ScheduledRequests
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples

    ctx = load_context(url, "fpm", write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5))
    with ctx.sessions.begin() as session:
        samples = [
            FpmSample(
                fpm=ForwardPassMetrics(
                    component=Component(component),
                    worker_id=worker,
                    counter_id=i + 1,
                    wall_time_s=0.02 + i / 1000,
                    scheduled=ScheduledRequests(num_decode_requests=i + 1, sum_decode_kv_tokens=1000 * (i + 1)),
                ),
                received_at=at - dt.timedelta(seconds=1),
            )
            for i, (component, worker) in enumerate(engines)
        ]
        insert_fpm_samples(session, repo.ensure_deployment(session, "fpm", ctx.config).id, samples)
    tick_id = run_tick(ctx, Loop.LOAD, at, None).tick_id
    get_engine(url).dispose()
    assert tick_id is not None
    return tick_id


def test_migration_0015_compact_tick_storage(empty_database_url, tmp_path, profile_dir) -> None:
    """0015 -> 0014 refills the `fpm_snapshots` table from `ticks.inputs` (the rows 0014's writer stored, one per
    engine in the order of the inputs) and `tick_steps` from `tick_step_lists`; 0014 -> 0015 on that data reads the
    same rows back through the views, one `tick_step_lists` row per tick, `decision_history` unchanged; a snapshot
    that is not in its tick's inputs makes the upgrade refuse, dropping nothing. (The planner refuses to run on an
    old schema, so the old rows are made by the downgrade.)"""
    url = empty_database_url
    upgrade(url)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    first = _load_tick_with_fpm(url, tmp_path, at, [("decode", "d-0"), ("prefill", "p-0")])
    second = _load_tick_with_fpm(url, tmp_path, at + dt.timedelta(seconds=20), [("decode", "d-1")])  # first's stale
    assert "fpm_snapshots" not in _tables(url) and "fpm_snapshots" in _views(url)
    view = _relation(url, _VIEW_FPM_ROWS)[1]
    assert [row[:3] for row in view] == [(first, "decode", "d-0"), (first, "prefill", "p-0"), (second, "decode", "d-1")]
    assert [row[5]["counter_id"] for row in view] == [1, 2, 1]
    get_engine(url).dispose()
    downgrade(url, "0022")  # `decision_history` with 0021's columns (0023 adds one)

    steps_sql = "SELECT tick_id, seq, step, component, value, reason, detail FROM tick_steps ORDER BY tick_id, seq"
    steps = _relation(url, steps_sql)
    assert len(steps[1]) > 10 and {row[0] for row in steps[1]} == {first, second}
    history = _relation(url, "SELECT * FROM decision_history ORDER BY decision_id")

    downgrade(url, "0014")
    assert "fpm_snapshots" in _tables(url) and "fpm_snapshots" not in _views(url)
    assert _relation(url, _OLD_FPM_ROWS)[1] == view
    assert "tick_steps" in _tables(url) and "tick_step_lists" not in _tables(url)
    assert _relation(url, steps_sql) == steps  # the rows of 0014's table, as its writer stored them
    assert _relation(url, "SELECT * FROM decision_history ORDER BY decision_id") == history

    with psycopg.connect(to_libpq_uri(url)) as conn:  # a row the inputs do not hold: the upgrade refuses
        conn.execute("UPDATE fpm_snapshots SET metrics = jsonb_set(metrics, '{counter_id}', '99') WHERE id = 1")
    with pytest.raises(RuntimeError, match="1 fpm_snapshots rows are not in their tick's inputs"):
        upgrade(url)
    assert "fpm_snapshots" in _tables(url)
    with psycopg.connect(to_libpq_uri(url)) as conn:
        conn.execute("UPDATE fpm_snapshots SET metrics = jsonb_set(metrics, '{counter_id}', '1') WHERE id = 1")

    upgrade(url, "0015")  # the steps as 0015 stores them (0018 packs them: test_migration_0018_step_templates)
    assert "fpm_snapshots" not in _tables(url) and "fpm_snapshots" in _views(url)
    assert _relation(url, _VIEW_FPM_ROWS)[1] == view
    assert "tick_steps" in _views(url) and _relation(url, steps_sql) == steps  # 0014's rows migrated
    assert _relation(url, "SELECT count(*) FROM tick_step_lists")[1] == [(2,)]  # one row per tick
    assert _relation(url, "SELECT * FROM decision_history ORDER BY decision_id") == history
    with psycopg.connect(to_libpq_uri(url)) as conn, pytest.raises(psycopg.errors.StringDataRightTruncation):
        conn.execute(  # a step longer than the old column allowed is refused, as before
            "UPDATE tick_step_lists SET steps = steps || jsonb_build_array(jsonb_build_array("
            "repeat('x', 81), NULL, NULL, 'no_change', '')) WHERE tick_id = %s",
            (first,),
        )
    grants = "SELECT has_table_privilege('planner_analyst', 'fpm_snapshots', 'SELECT')"
    assert _relation(url, grants)[1] == [(True,)]


def _columns(url: str, table: str) -> list[str]:
    sql = "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position"
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return [name for (name,) in conn.execute(sql, (table,))]


def test_migration_0016_planner_state_deltas(empty_database_url, tmp_path, profile_dir) -> None:
    """0016 -> 0015 stores every delta row's state whole, equal to what the chain rebuilt; 0015 -> 0016 keeps those
    full states and the next tick is a delta again; a delta that does not fit its base makes the downgrade refuse,
    changing nothing."""
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.state_delta import encode_delta

    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "deltas", write_config(tmp_path))
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    traffic = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)
    ids = [run_tick(ctx, Loop.THROUGHPUT, at + dt.timedelta(minutes=i), traffic).tick_id for i in range(5)]
    with ctx.sessions.begin() as session:
        states = {tick_id: repo.state_json(session, tick_id) for tick_id in ids}
    assert len({str(s) for s in states.values()}) == 5  # the state moved at every tick
    kinds = (  # whole states (JSONB, or since 0020 a compressed delta without a base) and deltas
        "SELECT count(*) FILTER (WHERE base_tick_id IS NULL), count(*) FILTER (WHERE base_tick_id IS NOT NULL) "
        "FROM planner_states"
    )
    assert _relation(url, kinds)[1] == [(1, 4)]

    downgrade(url, "0015")
    assert _columns(url, "planner_states") == ["tick_id", "deployment_id", "state"]
    stored = _relation(url, "SELECT tick_id, state FROM planner_states ORDER BY tick_id")[1]
    assert stored == sorted(states.items())

    upgrade(url)
    assert _relation(url, kinds)[1] == [(5, 0)]
    ids.append(run_tick(ctx, Loop.THROUGHPUT, at + dt.timedelta(minutes=5), traffic).tick_id)
    assert _relation(url, kinds)[1] == [(5, 1)]
    with ctx.sessions.begin() as session:
        assert {tick_id: repo.state_json(session, tick_id) for tick_id in ids[:5]} == states

    with psycopg.connect(to_libpq_uri(url)) as conn:  # a delta that does not fit its base
        conn.execute("UPDATE planner_states SET delta = %s WHERE tick_id = %s", (encode_delta({"[": []}), ids[5]))
    with pytest.raises(RuntimeError, match=f"tick {ids[5]}'s delta does not fit its base"):
        downgrade(url, "0015")
    assert "delta" in _columns(url, "planner_states") and _relation(url, kinds)[1] == [(5, 1)]
    get_engine(url).dispose()


def test_migration_0018_step_templates(empty_database_url, tmp_path, profile_dir) -> None:
    """0018 -> 0016 gives every tick its steps back as the JSON arrays 0016's writer stored (non-finite values as
    words); 0016 -> 0018 packs those rows into templates and numbers and the view reads every step back the same,
    details with the placeholder character and both delimiters included; `decision_history` unchanged."""
    from planner_core.domain import PlannerState, ReasonCode, ScalingDecision, StepRecord, TickInputs, TickOutcome
    from tests.runtime.databases import record_outcome

    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "packing", write_config(tmp_path))
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    traffic = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)
    run_tick(ctx, Loop.THROUGHPUT, at, traffic)
    workers = run_tick(ctx, Loop.LOAD, at, None).inputs.workers
    details = ("", "a\x1fb 1,2;3", "-1.5e-07 x 2e+05", "no numbers", "p0: 399.50 ms")
    values = (None, float("inf"), 0.1 + 0.2, float("nan"), 7)
    steps = tuple(
        StepRecord(step=f"s{i}", reason=ReasonCode.NO_CHANGE, value=v, detail=d)
        for i, (v, d) in enumerate(zip(values, details, strict=True))
    )
    inputs = TickInputs(now_s=(at + dt.timedelta(minutes=1)).timestamp(), loop=Loop.THROUGHPUT, workers=workers)
    with ctx.sessions.begin() as session:
        record_outcome(
            session, "packing", inputs, TickOutcome(decision=ScalingDecision(), next_state=PlannerState(), steps=steps)
        )
    steps_sql = (
        "SELECT tick_id, seq, step, component, value::text, reason, detail FROM tick_steps ORDER BY tick_id, seq"
    )
    view = _relation(url, steps_sql)
    assert len(view[1]) > 20 and [row[6] for row in view[1][-5:]] == list(details)
    get_engine(url).dispose()
    downgrade(url, "0022")  # `decision_history` with 0021's columns (0023 adds one)
    history = _relation(url, "SELECT * FROM decision_history ORDER BY decision_id")

    downgrade(url, "0017")
    assert "step_templates" not in _tables(url) and "steps" in _columns(url, "tick_step_lists")
    assert _relation(url, steps_sql) == view
    last = _relation(url, "SELECT steps FROM tick_step_lists ORDER BY tick_id DESC LIMIT 1")[1][0][0]
    assert [step[2] for step in last] == [None, "Infinity", 0.30000000000000004, "NaN", 7]

    upgrade(url, "0022")
    assert "packed" in _columns(url, "tick_step_lists") and "steps" not in _columns(url, "tick_step_lists")
    assert _relation(url, steps_sql) == view
    assert _relation(url, "SELECT * FROM decision_history ORDER BY decision_id") == history
    get_engine(url).dispose()


def test_migration_0019_compact_tick_inputs(empty_database_url, tmp_path, profile_dir) -> None:
    """At 0019 a tick's inputs are stored as compact JSON text without the fields at their defaults, and the view
    `fpm_snapshots` gives every engine's whole metrics back; 0019 -> 0018 writes the left-out counters back into
    JSONB inputs (0015's view reads the same rows); 0018 -> 0019 reads them the same again."""
    url = empty_database_url
    upgrade(url)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    tick_id = _load_tick_with_fpm(url, tmp_path, at, [("decode", "d-0"), ("prefill", "p-0")])
    [(stored,)] = _relation(url, f"SELECT inputs::text FROM ticks WHERE id = {tick_id}")[1]
    assert ", " not in stored and '"queued"' not in stored and '"dp_rank"' not in stored  # compact, no defaults
    view = _relation(url, _VIEW_FPM_ROWS)[1]
    assert [row[5]["queued"] for row in view] == [{**{k: 0 for k in view[0][5]["queued"]}}] * 2
    assert view[0][5]["scheduled"]["sum_decode_kv_tokens"] == 1000 and view[0][5]["lifecycle"] == "serving"

    downgrade(url, "0018")
    assert _relation(url, _VIEW_FPM_ROWS)[1] == view
    [(whole,)] = _relation(url, f"SELECT inputs->'fpm' FROM ticks WHERE id = {tick_id}")[1]
    assert whole == [row[5] for row in view]

    upgrade(url)
    assert _relation(url, _VIEW_FPM_ROWS)[1] == view
    get_engine(url).dispose()


def test_migration_0020_positional_inputs_and_delta_dictionary(empty_database_url, tmp_path, profile_dir) -> None:
    """At 0020 a tick's worker counts and engines are stored as positional arrays and planner-state deltas are
    compressed with the preset dictionary; `fpm_snapshots` gives the same rows as at 0019, replay reads the same
    inputs and every state is rebuilt the same. 0020 -> 0019 writes 0019's objects and dictionary-less deltas back
    (0019's view and reader see the same), 0019 -> 0020 converts them again."""
    from planner_core.domain import (
        Component,
        EngineLifecycle,
        ForwardPassMetrics,
        PlannerState,
        QueuedRequests,
        ScalingDecision,
        ScheduledRequests,
        TickInputs,
        TickOutcome,
    )
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.codec import inputs_from_stored
    from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples
    from tests.runtime.databases import record_outcome

    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "fpm", write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5))
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    recorded = []
    for i in range(3):
        now = at + dt.timedelta(seconds=5 * i)
        engines = [
            ForwardPassMetrics(
                component=Component.DECODE,
                worker_id="d-0",
                counter_id=10 + i,
                wall_time_s=0.02 + i / 1000,
                scheduled=ScheduledRequests(num_decode_requests=20 + i, sum_decode_kv_tokens=40_000 + 999 * i),
            ),
            ForwardPassMetrics(
                component=Component.PREFILL,
                worker_id="p-0",
                dp_rank=1,
                counter_id=7 + i,
                wall_time_s=0.05 + i / 997,
                scheduled=ScheduledRequests(num_prefill_requests=1, sum_prefill_tokens=3000 + 17 * i),
                queued=QueuedRequests(sum_prefill_tokens=500 * i, var_decode_kv_tokens=0.25),
            ),
        ]
        with ctx.sessions.begin() as session:
            deployment_id = repo.ensure_deployment(session, "fpm", ctx.config).id
            received = now - dt.timedelta(seconds=1)
            insert_fpm_samples(session, deployment_id, [FpmSample(fpm=e, received_at=received) for e in engines])
        result = run_tick(ctx, Loop.LOAD, now, None)
        assert result.inputs.fpm == tuple(engines)
        recorded.append((result.tick_id, result.inputs))
    starting = ForwardPassMetrics(  # a field not at its default after defaults, a negative zero, a lifecycle
        component=Component.DECODE,
        worker_id="d-1",
        scheduled=ScheduledRequests(var_prefill_length=-0.0),
        lifecycle=EngineLifecycle.STARTING,
    )
    later = (at + dt.timedelta(seconds=15)).timestamp() + 4e-7  # between microseconds: not a scheduled_at
    inputs = TickInputs(now_s=later, loop=Loop.LOAD, workers=result.inputs.workers, fpm=(*engines, starting))
    with ctx.sessions.begin() as session:
        outcome = TickOutcome(decision=ScalingDecision(), next_state=PlannerState(), steps=())
        recorded.append((record_outcome(session, "fpm", inputs, outcome, previous_tick_id=result.tick_id), inputs))
    get_engine(url).dispose()
    ids = [tick_id for tick_id, _ in recorded]

    def stored_inputs() -> list[dict]:
        return [row[0] for row in _relation(url, "SELECT inputs FROM ticks ORDER BY id")[1]]

    def states() -> dict:
        with ctx.sessions.begin() as session:
            return {tick_id: repo.state_json(session, tick_id) for tick_id in ids}

    def delta_flags() -> set[bool]:  # whether each stored delta's zlib header names a dictionary
        rows = _relation(url, "SELECT get_byte(delta, 1) & 32 <> 0 FROM planner_states WHERE delta IS NOT NULL")[1]
        return {flag for (flag,) in rows}

    positional = stored_inputs()
    rows = _relation(url, "SELECT loop, scheduled_at FROM ticks ORDER BY id")[1]
    read = [
        inputs_from_stored(stored, Loop(loop), when.timestamp())
        for stored, (loop, when) in zip(positional, rows, strict=True)
    ]
    assert read == [inputs for _, inputs in recorded]
    assert [sorted(stored) for stored in positional] == [["fpm", "workers"]] * 3 + [["fpm", "now_s", "workers"]]
    assert positional[3]["now_s"] == later
    workers = recorded[2][1].workers
    assert positional[2]["workers"] == [
        workers.ready_prefill,
        workers.ready_decode,
        workers.expected_prefill,
        workers.expected_decode,
    ]
    assert positional[2]["fpm"] == [
        ["decode", "d-0", 0, 12, 0.02 + 2 / 1000, [0, 0, 0.0, 0, 22, 41998]],  # its idle queue and lifecycle left out
        ["prefill", "p-0", 1, 9, 0.05 + 2 / 997, [1, 3034], [0, 1000, 0.0, 0, 0, 0.25]],
    ]
    assert positional[3]["fpm"][2] == ["decode", "d-1", 0, 0, 0.0, [0, 0, -0.0], [], "starting"]
    view = _relation(url, _VIEW_FPM_ROWS)[1]
    assert len(view) == 9 and view[8][5]["lifecycle"] == "starting" and view[5][3] == 1
    assert view[5][5]["queued"] == {
        "num_prefill_requests": 0, "sum_prefill_tokens": 1000, "var_prefill_length": 0.0,
        "num_decode_requests": 0, "sum_decode_kv_tokens": 0, "var_decode_kv_tokens": 0.25,
    }  # fmt: skip
    before = states()
    assert len(delta_flags()) == 1 and delta_flags() == {True}
    whole = "SELECT count(*) FILTER (WHERE state IS NOT NULL), count(*) FILTER (WHERE base_tick_id IS NULL) "
    whole += "FROM planner_states"
    assert _relation(url, whole)[1] == [(0, 1)]  # the first tick's state: whole, compressed as a delta from nothing

    downgrade(url, "0019")
    objects = stored_inputs()
    assert all(isinstance(stored["workers"], dict) for stored in objects)
    assert objects[2]["fpm"][1] == {
        "component": "prefill",
        "worker_id": "p-0",
        "dp_rank": 1,
        "counter_id": 9,
        "wall_time_s": 0.05 + 2 / 997,
        "scheduled": {"num_prefill_requests": 1, "sum_prefill_tokens": 3034},
        "queued": {"sum_prefill_tokens": 1000, "var_decode_kv_tokens": 0.25},
    }  # fmt: skip  (0019's form: the fields at their defaults left out)
    assert objects[3]["fpm"][2] == {
        "component": "decode", "worker_id": "d-1", "scheduled": {"var_prefill_length": -0.0}, "lifecycle": "starting"
    }  # fmt: skip
    assert _relation(url, _VIEW_FPM_ROWS)[1] == view
    assert delta_flags() == {False}
    assert _relation(url, whole)[1] == [(1, 1)]  # JSONB again
    assert states() == before

    upgrade(url)
    assert stored_inputs() == positional
    assert _relation(url, _VIEW_FPM_ROWS)[1] == view
    assert delta_flags() == {True} and states() == before and _relation(url, whole)[1] == [(0, 1)]
    get_engine(url).dispose()


def test_migration_0023_decision_summary(empty_database_url, tmp_path, profile_dir) -> None:
    """0023: a decision records its deciding stage and summary; `decision_history.reason` is the stage, `why` the
    summary, `headline_reason` the loop's headline. 0023 -> 0022 gives 0022's view back (columns, rows, grants,
    comments; the step chain in `why`); 0022 -> 0023 shows those older decisions with their headline and chain."""
    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "summary", write_config(tmp_path, max_throughput_scaling_replicas=2))
    traffic = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)
    assert run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 1, tzinfo=dt.UTC), traffic).tick_id is not None
    get_engine(url).dispose()
    history_sql = "SELECT reason, why, headline_reason FROM decision_history"
    grants = "SELECT has_table_privilege('planner_analyst', 'decision_history', 'SELECT')"
    # 6000 req/min needs 7 engines per pool (test_store's arithmetic); at most 2 more per tick: 1 -> 3
    [(stage, why, headline)] = _relation(url, history_sql)[1]
    assert (stage, headline) == ("rate_limit", "scale")
    assert why == (
        "prefill 1->3: forecast needs 7; change limit allows 3 | decode 1->3: forecast needs 7; change limit allows 3"
    )
    assert _relation(url, grants)[1] == [(True,)]

    downgrade(url, "0022")
    columns, [row] = _relation(url, "SELECT * FROM decision_history")
    assert "headline_reason" not in columns and "stage" not in _columns(url, "decisions")
    assert (
        row[columns.index("reason")] == "scale"
        and "change_rate (prefill): 1 -> 7 limited to 3" in row[columns.index("why")]
    )
    assert _relation(url, grants)[1] == [(True,)]
    comment = "SELECT obj_description('decision_history'::regclass, 'pg_class')"
    assert "with their numbers" in _relation(url, comment)[1][0][0]

    upgrade(url)
    [(reason, old_why, headline)] = _relation(url, history_sql)[1]
    assert (reason, headline) == ("scale", "scale") and old_why == row[columns.index("why")]


# The schema head of the version before this one. The project has no release tags yet: 0022 is the head the code had
# before 2026-12-07, when 0023 (decision summaries) was added. Move it to the last release's head at each release.
PREVIOUS_RELEASE_HEAD = "0022"


def test_upgrade_from_the_previous_release_replays_its_ticks_identically(
    empty_database_url, tmp_path, azure_conv_trace, profile_dir
) -> None:
    """The upgrade path (docs/install.md, "Upgrading"): a database holding a realistic run (both loops, executions
    acknowledged by the virtual connector) stored as the previous release stores it, at PREVIOUS_RELEASE_HEAD (the
    run is recorded at head and taken down to it, the way the round-trip tests above check gives that revision's
    form), is migrated forward to head; every tick then replays identically under its recorded config, and the
    decisions and their execution states are those recorded."""
    from planner_core.runtime.replay import replay
    from planner_core.runtime.store.migrate import SchemaOutOfDate, check_schema_current
    from tests.runtime.recording import record_simulated_run

    url = empty_database_url
    upgrade(url)
    config = write_config(tmp_path, load_predictor="kalman")
    times = record_simulated_run(url, config, azure_conv_trace, "upgraded", num_windows=6)
    decisions_sql = (
        "SELECT decided_at, target_prefill, target_decode, status FROM decision_history "
        "WHERE deployment = 'upgraded' ORDER BY decided_at"
    )
    recorded = _relation(url, decisions_sql)[1]
    num_ticks = _relation(url, "SELECT count(*) FROM ticks")[1][0][0]
    assert num_ticks == 6 * 3 and len(recorded) >= 2  # 6 throughput ticks, 2 load ticks between each; some decided
    get_engine(url).dispose()

    downgrade(url, PREVIOUS_RELEASE_HEAD)
    [(version,)] = _relation(url, "SELECT version_num FROM alembic_version")[1]
    assert version == PREVIOUS_RELEASE_HEAD and "stage" not in _columns(url, "decisions")
    with pytest.raises(SchemaOutOfDate, match=f"database schema is at {PREVIOUS_RELEASE_HEAD}"):
        check_schema_current(url)  # the new code refuses the old schema until it is upgraded

    upgrade(url)
    check_schema_current(url)
    assert _relation(url, decisions_sql)[1] == recorded
    start, end = times[0] - dt.timedelta(hours=1), times[-1] + dt.timedelta(seconds=1)
    summary = replay(url, "upgraded", start, end)
    assert (summary.num_ticks, summary.num_identical, summary.num_differing, summary.num_skipped) == (
        num_ticks, num_ticks, 0, 0
    )  # fmt: skip


def test_migration_0024_config_revisions(empty_database_url, tmp_path, profile_dir) -> None:
    """0024: every deployment recorded before it gets revision 1 (source file: the config it runs), its ticks name no
    revision and still replay; a tick after it records revision 1. The operator role may insert revisions and read,
    nothing else; the writer may not change a revision. 0024 -> 0023 drops the table and the columns, keeps the
    ticks."""
    from planner_core.runtime.replay import replay

    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "revised", write_config(tmp_path))
    traffic = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert run_tick(ctx, Loop.THROUGHPUT, at, traffic).tick_id is not None
    get_engine(url).dispose()

    downgrade(url, "0023")
    assert "config_revision" not in _columns(url, "ticks") and "config_revisions" not in _tables(url)
    assert _relation(url, "SELECT count(*) FROM ticks")[1] == [(1,)]

    upgrade(url)
    [(revision, source, config_hash, author)] = _relation(
        url, "SELECT revision, source, config_hash, author FROM config_revisions"
    )[1]
    assert (revision, source, config_hash) == (1, "file", ctx.file_config_hash) and author == _relation(
        url, "SELECT current_user"
    )[1][0][0]
    assert _relation(url, "SELECT config_revision FROM deployments")[1] == [(1,)]
    ctx = load_context(url, "revised", ctx.config_path)
    assert run_tick(ctx, Loop.THROUGHPUT, at + dt.timedelta(minutes=1), traffic).tick_id is not None
    assert _relation(url, "SELECT config_revision FROM ticks ORDER BY id")[1] == [(None,), (1,)]
    summary = replay(url, "revised", at, at + dt.timedelta(minutes=2))
    assert (summary.num_ticks, summary.num_identical, summary.revisions) == (2, 2, (1,))
    privileges = _relation(
        url,
        "SELECT has_table_privilege('planner_operator', 'config_revisions', 'INSERT'), "
        "has_table_privilege('planner_operator', 'planner_configs', 'INSERT'), "
        "has_table_privilege('planner_operator', 'ticks', 'INSERT'), "
        "has_table_privilege('planner_operator', 'deployments', 'UPDATE'), "
        "has_table_privilege('planner_writer', 'config_revisions', 'INSERT'), "
        "has_table_privilege('planner_writer', 'config_revisions', 'UPDATE'), "
        "has_table_privilege('planner_writer', 'config_revisions', 'DELETE')",
    )[1]
    assert privileges == [(True, True, False, False, True, False, False)]
    get_engine(url).dispose()
