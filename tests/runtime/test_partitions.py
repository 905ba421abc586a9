"""The tick tables partitioned by UTC day (migration 0017): partitions created ahead and on demand (also by two
recorders at once), delta chains that restart at a day boundary, retention that drops whole days, and the
migration's round trip with data. Real Postgres throughout."""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest
from sqlalchemy import text

from planner_core.domain import Loop, PlannerState, TrafficObservation
from planner_core.runtime.replay import replay
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.audit_chain import verify_chain
from planner_core.runtime.store.codec import from_jsonable
from planner_core.runtime.store.db import get_engine, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.migrate import downgrade, upgrade
from planner_core.runtime.store.partitions import (
    TICK_TABLES,
    ensure_partitions,
    ensure_partitions_ahead,
    forget_all,
    partition_days,
    partition_start,
    same_partition,
)
from planner_core.runtime.store.prune import drop_partitions
from planner_core.runtime.store.state_delta import encode_delta, state_delta
from tests.conftest import write_config
from tests.runtime.databases import create_login, decision_outcome, drop_login, record_outcome

UTC = dt.UTC
BUSY = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)


def _rows(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


def _partitions_of(url: str, table: str) -> list[str]:
    sql = "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass"
    return sorted(name for (name,) in _rows(url, sql, table))


def test_partition_helpers_split_at_utc_midnight() -> None:
    """`same_partition` is the UTC day, whatever the offset the times carry."""
    late = dt.datetime(2026, 1, 5, 23, 59, 59, tzinfo=UTC)
    assert partition_start(late) == dt.datetime(2026, 1, 5, tzinfo=UTC)
    assert not same_partition(late, late + dt.timedelta(seconds=1))
    east = dt.timezone(dt.timedelta(hours=9))
    assert same_partition(late, dt.datetime(2026, 1, 6, 8, 59, tzinfo=east))  # 23:59 UTC
    with pytest.raises(ValueError, match="naive datetime"):
        partition_start(dt.datetime(2026, 1, 5))


def test_partitions_are_created_ahead_and_on_demand_for_an_old_day(database_url, tmp_path) -> None:
    """Ahead: today and the next two days, once (a second call creates nothing). On demand: a tick of a day long
    past records (through `run_tick`, and through `record_tick` alone with nothing known in-process), each row in
    its day's partition; a login of the writer role, which owns nothing, records a tick of a new day too."""
    engine = get_engine(database_url)
    now = dt.datetime(2026, 11, 27, 5, 0, tzinfo=UTC)
    assert ensure_partitions_ahead(engine, now) == 3 * len(TICK_TABLES)
    forget_all()
    assert ensure_partitions_ahead(engine, now) == 0  # asked the database: all there
    assert _partitions_of(database_url, "ticks") == ["ticks_p20261127", "ticks_p20261128", "ticks_p20261129"]
    assert _partitions_of(database_url, "tick_step_lists")[0] == "tick_step_lists_p20261127"

    ctx = load_context(database_url, "old-day", write_config(tmp_path))
    old = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    tick_id = run_tick(ctx, Loop.THROUGHPUT, old, BUSY).tick_id
    for table in TICK_TABLES:
        key = "id" if table == "ticks" else "tick_id"
        found = _rows(
            database_url, f"SELECT tableoid::regclass::text, scheduled_at FROM {table} WHERE {key} = %s", tick_id
        )
        if table in ("predictions", "proposals") and not found:
            continue  # the tick may not forecast or propose
        assert {row for row in found} == {(f"{table}_p20260105", old)}, table

    forget_all()  # nothing known in-process: record_tick asks the database inside its own transaction
    inputs, outcome = decision_outcome(dt.datetime(2025, 6, 1, 3, 0, tzinfo=UTC), 2, 3)
    with ctx.sessions.begin() as session:
        assert record_outcome(session, "old-day", inputs, outcome) is not None
    assert "ticks_p20250601" in _partitions_of(database_url, "ticks")

    writer_url, login = create_login(database_url, "planner_writer", "pw-partitions")
    try:
        with psycopg.connect(writer_url, autocommit=True) as conn:
            assert conn.execute("SELECT planner_tick_partitions('2026-03-01')").fetchone() == (len(TICK_TABLES),)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    "CREATE TABLE ticks_p20260302 PARTITION OF ticks FOR VALUES FROM "
                    "('2026-03-02 00:00+00') TO ('2026-03-03 00:00+00')"
                )
        writer_ctx = load_context(to_sqlalchemy_url(writer_url), "old-day", write_config(tmp_path))
        assert run_tick(writer_ctx, Loop.THROUGHPUT, dt.datetime(2026, 3, 2, tzinfo=UTC), BUSY).tick_id is not None
        get_engine(writer_ctx.database_url).dispose()
    finally:
        drop_login(database_url, login)


def test_two_recorders_of_a_new_day_both_record(database_url, tmp_path) -> None:
    """Two deployments record their first tick of a day that has no partition, at the same moment, each inside
    its own tick transaction: one creates the day's partitions (under the advisory lock), the other waits for it
    and records; both ticks are there. The same through `ensure_partitions` in two threads: created once."""
    contexts = [load_context(database_url, name, write_config(tmp_path)) for name in ("one", "two")]
    for ctx in contexts:
        with ctx.sessions.begin() as session:
            repo.ensure_deployment(session, ctx.deployment, ctx.config)
    forget_all()
    at = dt.datetime(2026, 2, 14, 9, 0, tzinfo=UTC)
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def record(ctx) -> None:
        try:
            inputs, outcome = decision_outcome(at, 1, 1)
            with ctx.sessions.begin() as session:
                barrier.wait(timeout=30)
                results[ctx.deployment] = record_outcome(session, ctx.deployment, inputs, outcome)
                time.sleep(0.3)  # hold the transaction (and whatever it created) open a moment
        except Exception as exc:  # reported by the assertion below
            results[ctx.deployment] = exc

    threads = [threading.Thread(target=record, args=(ctx,)) for ctx in contexts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(isinstance(results[name], int) for name in ("one", "two")), results
    assert _rows(database_url, "SELECT count(*) FROM ticks_p20260214") == [(2,)]

    forget_all()
    engine = get_engine(database_url)
    day = dt.date(2026, 2, 15)
    created: list[int] = []
    barrier = threading.Barrier(2)

    def ensure() -> None:
        barrier.wait(timeout=30)
        created.append(ensure_partitions(engine, [day]))

    threads = [threading.Thread(target=ensure) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(created) == [0, len(TICK_TABLES)]


def _day_of_ticks(ctx, start: dt.datetime, num: int) -> list[int]:
    return [run_tick(ctx, Loop.THROUGHPUT, start + dt.timedelta(minutes=i), BUSY).tick_id for i in range(num)]


def test_a_state_delta_chain_restarts_at_a_day_boundary_and_replays_exactly(database_url, tmp_path) -> None:
    """Ticks across UTC midnight: the first tick of the new day stores its state whole (its previous tick is in
    yesterday's partition), the next ones are deltas against it; every state reads back as the tick produced
    it, and a replay of a range across the boundary is identical, tick for tick."""
    ctx = load_context(database_url, "midnight", write_config(tmp_path))
    start = dt.datetime(2026, 1, 5, 23, 57, tzinfo=UTC)
    produced = {}
    for i in range(6):
        result = run_tick(ctx, Loop.THROUGHPUT, start + dt.timedelta(minutes=i), BUSY)
        produced[result.tick_id] = result.outcome.next_state
    rows = _rows(
        database_url,
        "SELECT tick_id, scheduled_at, base_tick_id IS NULL, base_tick_id FROM planner_states ORDER BY tick_id",
    )
    ids = [row[0] for row in rows]
    assert [(row[2], row[3]) for row in rows] == [
        (True, None),
        (False, ids[0]),
        (False, ids[1]),
        (True, None),  # 00:00 on the 6th: whole
        (False, ids[3]),
        (False, ids[4]),
    ]
    assert rows[3][1] == dt.datetime(2026, 1, 6, tzinfo=UTC)
    with ctx.sessions.begin() as session:
        for tick_id, state in produced.items():
            assert from_jsonable(PlannerState, repo.state_json(session, tick_id)) == state
            at = session.scalar(text("SELECT scheduled_at FROM ticks WHERE id = :id"), {"id": tick_id})
            assert repo.state_json(session, tick_id, scheduled_at=at) == repo.state_json(session, tick_id)
    summary = replay(database_url, "midnight", start + dt.timedelta(minutes=1), start + dt.timedelta(minutes=6))
    assert (summary.num_ticks, summary.num_identical, summary.num_skipped) == (5, 5, 0)


def test_dropping_old_days_keeps_the_newest_and_the_audit_chain(database_url, tmp_path) -> None:
    """Three days of ticks for `live` and one old day for `gone`: dropping days older than 5 days, 6 days after the
    last one, first as a dry run (counts, nothing changed), then for real: the two oldest days' partitions are
    gone, oldest first, each with a `partitions_dropped` audit event counting its rows; the last day stays
    (it holds `live`'s newest ticks); no state left is a delta without its base; decisions and the audit log keep
    every row, the audit chain verifies; the next tick starts from the kept state."""
    live = load_context(database_url, "live", write_config(tmp_path))
    gone = load_context(database_url, "gone", write_config(tmp_path))
    days = [dt.datetime(2026, 1, d, 12, 0, tzinfo=UTC) for d in (5, 6, 7)]
    for day in days:
        _day_of_ticks(live, day, 3)
    _day_of_ticks(gone, days[1] - dt.timedelta(hours=1), 2)  # 2026-01-06 11:00, 11:01
    _day_of_ticks(gone, days[2] + dt.timedelta(hours=1), 1)  # its newest: 2026-01-07 13:00
    for at in (days[1], days[2]):  # a fleet's arbitration round on the 6th (it goes with the day) and on the 7th
        [(round_id,)] = _rows(
            database_url,
            "INSERT INTO arbitration_rounds (scheduled_at, budget_gpus, inputs) VALUES (%s, 8, '{}') RETURNING id",
            at,
        )
        _rows(
            database_url,
            "INSERT INTO arbitration_grants (round_id, deployment_id, decision_id, proposed_gpus, request_gpus, "
            "granted_gpus, reason) SELECT %s, d.id, (SELECT max(id) FROM decisions), 4, 4, 4, 'granted' "
            "FROM deployments d RETURNING 1",
            round_id,
        )
    counts_before = _rows(database_url, "SELECT count(*) FROM ticks")[0][0]
    decisions_before = _rows(database_url, "SELECT count(*) FROM decisions")
    audit_before = _rows(database_url, "SELECT count(*) FROM audit_log")[0][0]
    now = days[2] + dt.timedelta(days=6)

    dry = drop_partitions(database_url, older_than_days=5, now=now, dry_run=True)
    assert [d.day for d in dry.dropped] == [dt.date(2026, 1, 5), dt.date(2026, 1, 6)]
    assert dry.dropped[0].num_ticks == 3 and dry.dropped[1].num_ticks == 5
    assert dry.dropped[1].rows["planner_states"] == 5 and dry.dropped[1].rows["worker_observations"] == 5
    assert [(d.rows["arbitration_rounds"], d.rows["arbitration_grants"]) for d in dry.dropped] == [(0, 0), (1, 2)]
    assert _rows(database_url, "SELECT count(*) FROM arbitration_grants") == [(4,)]
    assert dry.kept == {dt.date(2026, 1, 7): "holds the newest throughput tick of gone"}
    assert _rows(database_url, "SELECT count(*) FROM ticks")[0][0] == counts_before
    assert len(_partitions_of(database_url, "ticks")) == 4

    summary = drop_partitions(database_url, older_than_days=5, now=now)
    assert [(d.day, d.num_ticks) for d in summary.dropped] == [(d.day, d.num_ticks) for d in dry.dropped]
    for table in TICK_TABLES:  # the 8th: created ahead by the ticks of the 7th
        assert _partitions_of(database_url, table) == [f"{table}_p20260107", f"{table}_p20260108"]
    assert _rows(database_url, "SELECT count(*) FROM ticks")[0][0] == counts_before - 8
    assert _rows(database_url, "SELECT min(scheduled_at) FROM ticks")[0][0] == days[2]
    stranded = (
        "SELECT count(*) FROM planner_states p WHERE p.base_tick_id IS NOT NULL "
        "AND NOT EXISTS (SELECT FROM planner_states b WHERE b.tick_id = p.base_tick_id)"
    )
    assert _rows(database_url, stranded) == [(0,)]
    assert _rows(database_url, "SELECT count(*) FROM decisions") == decisions_before  # not partitioned
    assert _rows(database_url, "SELECT scheduled_at FROM arbitration_rounds") == [(days[2],)]
    assert _rows(database_url, "SELECT count(*) FROM arbitration_grants") == [(2,)]  # the 7th's round's
    events = _rows(database_url, "SELECT detail FROM audit_log WHERE event = 'partitions_dropped' ORDER BY id")
    assert [e[0]["day"] for e in events] == ["2026-01-05", "2026-01-06"]
    assert events[1][0]["ticks"] == 5 and events[1][0]["rows"]["planner_states"] == 5
    assert events[1][0]["rows"]["arbitration_grants"] == 2
    assert _rows(database_url, "SELECT count(*) FROM audit_log")[0][0] == audit_before + 2
    with live.sessions.begin() as session:
        report = verify_chain(session)
    assert report.ok and report.num_rows == audit_before + 2
    with live.sessions.begin() as session:  # every state left reads back
        for (tick_id,) in session.execute(text("SELECT tick_id FROM planner_states")):
            assert repo.state_json(session, tick_id) is not None
    next_tick = run_tick(live, Loop.THROUGHPUT, days[2] + dt.timedelta(days=1), BUSY)
    assert next_tick.outcome.next_state.num_throughput_ticks == 10  # 9 before it, the dropped ones counted

    again = drop_partitions(database_url, older_than_days=5, now=now)
    assert again.dropped == [] and list(again.kept) == [dt.date(2026, 1, 7)]
    with pytest.raises(ValueError, match="must be >= 1 day"):
        drop_partitions(database_url, older_than_days=0.5, now=now)


def test_migration_0017_moves_rows_into_partitions_and_back(empty_database_url, tmp_path) -> None:
    """0017 -> 0016 gives unpartitioned tables with the same rows; a delta against the previous day's state (as
    0016 stored them) made there; 0016 -> 0017 puts every row in its day's partition, stores that cross-day delta
    whole (the same state), and the views read the same rows throughout."""
    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "migrated", write_config(tmp_path))
    start = dt.datetime(2026, 1, 5, 23, 58, tzinfo=UTC)
    ids = _day_of_ticks(ctx, start, 4)  # 23:58, 23:59, 00:00, 00:01
    with ctx.sessions.begin() as session:
        states = {tick_id: repo.state_json(session, tick_id) for tick_id in ids}
    # decision_history is compared by its decisions and targets only: 0023 gave it the one-line summaries (`reason`
    # is the deciding stage, `why` the summary), which a downgrade below 0023 drops with their columns
    views = {
        view: sorted(_rows(url, f"SELECT * FROM {view}"), key=repr)
        for view in ("tick_summary", "tick_steps", "tick_history")
    }
    decisions_sql = "SELECT decision_id, target_prefill, target_decode, status FROM decision_history"
    decisions = sorted(_rows(url, decisions_sql))
    table_rows = {table: _rows(url, f"SELECT count(*) FROM {table}")[0][0] for table in TICK_TABLES}
    get_engine(url).dispose()

    downgrade(url, "0016")
    assert _partitions_of(url, "ticks") == []
    assert "scheduled_at = t.scheduled_at" not in _rows(url, "SELECT pg_get_viewdef('tick_summary'::regclass)")[0][0]
    assert {table: _rows(url, f"SELECT count(*) FROM {table}")[0][0] for table in TICK_TABLES} == table_rows
    assert {view: sorted(_rows(url, f"SELECT * FROM {view}"), key=repr) for view in views} == views
    assert sorted(_rows(url, decisions_sql)) == decisions
    assert "scheduled_at" not in [
        name
        for (name,) in _rows(url, "SELECT column_name FROM information_schema.columns WHERE table_name = 'proposals'")
    ]
    # 0016's writer chained across midnight: the 00:00 tick's state as a delta against 23:59's
    delta = encode_delta(state_delta(states[ids[1]], states[ids[2]]))
    with psycopg.connect(to_libpq_uri(url)) as conn:
        conn.execute(
            "UPDATE planner_states SET state = NULL, delta = %s, base_tick_id = %s WHERE tick_id = %s",
            (delta, ids[1], ids[2]),
        )

    upgrade(url)
    assert _partitions_of(url, "ticks") == ["ticks_p20260105", "ticks_p20260106"]
    assert {table: _rows(url, f"SELECT count(*) FROM {table}")[0][0] for table in TICK_TABLES} == table_rows
    assert _rows(url, "SELECT count(*) FROM ONLY ticks_p20260106") == [(2,)]
    assert _rows(url, "SELECT base_tick_id IS NULL, base_tick_id FROM planner_states WHERE tick_id = %s", ids[2]) == [
        (True, None)
    ]
    with ctx.sessions.begin() as session:
        assert {tick_id: repo.state_json(session, tick_id) for tick_id in ids} == states
    assert {view: sorted(_rows(url, f"SELECT * FROM {view}"), key=repr) for view in views} == views
    assert sorted(_rows(url, decisions_sql)) == decisions
    summary_sql = _rows(url, "SELECT pg_get_viewdef('tick_summary'::regclass)")[0][0]
    # each tick's rows looked up on the partition key (LATERAL since migration 0021)
    assert "((x.tick_id = t.id) AND (x.scheduled_at = t.scheduled_at))) o ON (true)" in summary_sql
    grants = "SELECT has_table_privilege('planner_writer', 'proposals', 'INSERT')"
    assert _rows(url, grants) == [(True,)]
    assert run_tick(ctx, Loop.THROUGHPUT, start + dt.timedelta(minutes=4), BUSY).tick_id is not None
    get_engine(url).dispose()


def test_migration_0017_downgrade_refuses_when_a_decision_names_a_dropped_tick(empty_database_url, tmp_path) -> None:
    """After retention dropped a day whose tick made a decision, the old foreign key cannot hold: the downgrade
    refuses in one line and changes nothing."""
    url = empty_database_url
    upgrade(url)
    ctx = load_context(url, "refuse", write_config(tmp_path))
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, "refuse", ctx.config)
    inputs, outcome = decision_outcome(dt.datetime(2026, 1, 5, tzinfo=UTC), 2, 2)
    with ctx.sessions.begin() as session:
        record_outcome(session, "refuse", inputs, outcome)
    run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 9, tzinfo=UTC), BUSY)
    assert [
        d.day for d in drop_partitions(url, older_than_days=1, now=dt.datetime(2026, 1, 9, tzinfo=UTC)).dropped
    ] == [dt.date(2026, 1, 5)]
    get_engine(url).dispose()
    downgrade(url, "0017")  # the later revisions go down; 0017's own downgrade is the one that refuses
    with pytest.raises(RuntimeError, match=r"1 decisions.tick_id values name ticks whose partition was dropped"):
        downgrade(url, "0016")
    assert _rows(url, "SELECT version_num FROM alembic_version") == [("0017",)]
    assert _partitions_of(url, "ticks") == ["ticks_p20260109", "ticks_p20260110"]
    with ctx.sessions.begin() as session:
        assert partition_days(session) == [dt.date(2026, 1, 9), dt.date(2026, 1, 10)]


def test_drop_partitions_cli(database_url, tmp_path) -> None:
    """`planner db prune --drop-partitions-older-than DAYS`: a dry run lists the old days with their counts and
    drops nothing; the run drops them and says how; a day holding the newest tick is reported kept;
    `--deployment` is refused in one line (a day's partitions hold every deployment)."""
    from tests.cli.test_cli import planner

    ctx = load_context(database_url, "cli", write_config(tmp_path))
    _day_of_ticks(ctx, dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC), 2)
    _day_of_ticks(ctx, dt.datetime(2026, 1, 6, 12, 0, tzinfo=UTC), 1)
    env = {"PLANNER_DATABASE_URL": database_url}
    dry = planner("db", "prune", "--drop-partitions-older-than", "1", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "2026-01-05: would drop 2 ticks (2 traffic_observations, 2 worker_observations" in dry.stdout
    assert "2026-01-06: kept, holds the newest throughput tick of cli" in dry.stdout
    assert "ticks_p20260105" in _partitions_of(database_url, "ticks")
    done = planner("db", "prune", "--drop-partitions-older-than", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert "2026-01-05: dropped 2 ticks" in done.stdout
    assert "2026-01-07: dropped 0 ticks" in done.stdout  # created ahead by the tick of the 6th, never used
    assert "2 days, each one transaction with its partitions_dropped audit event" in done.stdout
    assert "ticks_p20260105" not in _partitions_of(database_url, "ticks")
    refused = planner("db", "prune", "--drop-partitions-older-than", "1", "--deployment", "cli", env=env)
    assert refused.returncode == 2
    assert "a day's partitions hold every deployment" in refused.stderr


def test_a_tick_recorded_while_a_day_is_dropped_waits_and_records(database_url, tmp_path) -> None:
    """A tick transaction that read the states (a lock on `planner_states`), then records (a lock on `ticks`),
    while retention drops an old day (all seven tables, `ticks` first): the drop gives way (its lock timeout is
    shorter than Postgres' deadlock timeout) and tries again; the tick records and the day is dropped."""
    ctx = load_context(database_url, "busy", write_config(tmp_path))
    _day_of_ticks(ctx, dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC), 2)
    newest = _day_of_ticks(ctx, dt.datetime(2026, 1, 9, 12, 0, tzinfo=UTC), 1)[0]
    read_states = threading.Event()
    results: dict[str, object] = {}

    def tick() -> None:
        try:
            inputs, outcome = decision_outcome(dt.datetime(2026, 1, 9, 12, 5, tzinfo=UTC), 1, 1)
            with ctx.sessions.begin() as session:
                deployment = repo.find_deployment(session, "busy")
                previous, _ = repo.latest_state(session, deployment.id)
                read_states.set()
                time.sleep(1.5)  # the drop starts meanwhile and locks `ticks`
                results["tick"] = record_outcome(session, "busy", inputs, outcome, previous_tick_id=previous)
        except Exception as exc:  # reported by the assertion below
            results["tick"] = exc

    thread = threading.Thread(target=tick)
    thread.start()
    assert read_states.wait(timeout=30)
    summary = drop_partitions(database_url, older_than_days=1, now=dt.datetime(2026, 1, 9, tzinfo=UTC))
    thread.join(timeout=60)
    assert isinstance(results["tick"], int), results
    assert dt.date(2026, 1, 5) in [d.day for d in summary.dropped]
    assert _rows(database_url, "SELECT previous_tick_id FROM ticks WHERE id = %s", results["tick"]) == [(newest,)]
