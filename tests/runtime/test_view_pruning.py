"""The history views over the day partitions (migration 0021): the same columns, types and rows as 0020's
definitions, and a time-filtered query reads only the days it names (checked on the plan, not on timings).

Real Postgres: ticks recorded with `run_tick` over several UTC days (throughput ticks that observe, forecast,
propose, decide and explain, load ticks), views read at 0021, then at 0020 (downgraded in place), then at 0021
again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import psycopg
import pytest

from planner_core.domain import Component, Loop, ReasonCode, StepName, StepRecord, TrafficObservation
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store.db import get_engine, to_libpq_uri
from planner_core.runtime.store.migrate import downgrade, upgrade
from tests.conftest import write_config
from tests.runtime.databases import create_database, decision_outcome, record_outcome, release_connections

UTC = dt.UTC
START = dt.datetime(2026, 3, 1, 21, 0, tzinfo=UTC)
NUM_DAYS = 4
# The views 0021 redefines, and the ones reading them; each row's key for a stable order.
VIEWS = {
    "tick_summary": "tick_id",
    "tick_history": "tick_id",
    "decision_history": "decision_id",
    "scaling_events": "decision_id",
}
TICK_TABLES = ("ticks", "traffic_observations", "predictions", "worker_observations", "proposals", "tick_step_lists")


# A decided tick's explanation: a capacity (read by tick_summary), what `why` keeps and what it leaves out.
DECIDED_STEPS = (
    StepRecord(
        step=StepName.CAPACITY,
        reason=ReasonCode.OBSERVED,
        component=Component.PREFILL,
        value=41000.5,
        detail="per engine",
    ),
    StepRecord(step=StepName.CAPACITY, reason=ReasonCode.OBSERVED, component=Component.DECODE, value=9000.0),
    StepRecord(
        step=StepName.CAPACITY, reason=ReasonCode.SCALE, component=Component.DECODE, value=3.0, detail="3 x 9000"
    ),
)


def _rows(url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture(scope="module")
def days_of_ticks(postgres_server_url, template_database, tmp_path_factory):
    """Two deployments ticking over four UTC days: per day, throughput ticks every 20 min from 21:00 to 23:40
    (`run_tick`, traffic varying), load ticks every 20 min from 21:10, and at 21:25, 22:45 and 23:45 a decided
    throughput tick with its explanation (recorded by hand: the planner holds without ready workers); `other`
    only on days two and three. Returns the database URL and the newest tick's time."""
    url = create_database(postgres_server_url, template_database)
    directory = tmp_path_factory.mktemp("view-pruning")
    contexts = {
        name: load_context(url, name, write_config(directory, enable_load_scaling=True)) for name in ("pruned", "other")
    }
    newest = START
    for day in range(NUM_DAYS):
        for i in range(9):
            at = START + dt.timedelta(days=day, minutes=20 * i)
            num_req = (500, 6000, 30000)[(i + day) % 3]
            traffic = TrafficObservation(duration_s=60, num_req=num_req, isl=3000, osl=300, ttft_ms=150, itl_ms=8)
            for name, ctx in contexts.items():
                if name == "other" and day not in (1, 2):
                    continue
                run_tick(ctx, Loop.THROUGHPUT, at, traffic)
                run_tick(ctx, Loop.LOAD, at + dt.timedelta(minutes=10), None)
                if i % 4 == 1:  # a decision with its explanation (the simulated run's throughput ticks hold)
                    inputs, outcome = decision_outcome(at + dt.timedelta(minutes=5), 1 + i % 3, 2 + day)
                    with ctx.sessions.begin() as session:
                        record_outcome(session, name, inputs, dataclasses.replace(outcome, steps=DECIDED_STEPS))
            newest = at + dt.timedelta(minutes=10)
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute("ANALYZE")
    release_connections(url)
    yield url, newest
    release_connections(url)


def _snapshot(url: str) -> dict[str, tuple[list[tuple[str, str]], list[tuple]]]:
    """Every view's columns (name, type as Postgres names it) and rows in key order."""
    snapshot = {}
    with psycopg.connect(to_libpq_uri(url)) as conn:
        for view, key in VIEWS.items():
            columns = conn.execute(
                "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (view,),
            ).fetchall()
            rows = conn.execute(f"SELECT * FROM {view} ORDER BY {key}").fetchall()
            snapshot[view] = (columns, rows)
    return snapshot


def _definitions(url: str) -> dict[str, str]:
    return {view: _rows(url, "SELECT pg_get_viewdef(%s::regclass)", view)[0][0] for view in VIEWS}


def _days_read(url: str, sql: str, *params: object) -> dict[str, set[str]]:
    """The day partitions a query's plan actually scanned, per table: every scan node on a `<table>_pYYYYMMDD`
    that ran at least once (a partition pruned at plan time is not in the plan; one pruned at run time has
    no loops)."""
    with psycopg.connect(to_libpq_uri(url)) as conn:
        [(plan,)] = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql, params).fetchall()
    days: dict[str, set[str]] = {}

    def visit(node: dict) -> None:
        relation = node.get("Relation Name", "")
        table, _, day = relation.rpartition("_p")
        if table in TICK_TABLES and day.isdigit() and node.get("Actual Loops", 0) > 0:
            days.setdefault(table, set()).add(day)
        for child in node.get("Plans", []):
            visit(child)

    visit((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    return days


LAST_HOUR = (
    "SELECT * FROM tick_history WHERE deployment = 'pruned' AND scheduled_at > %s - interval '1 hour' "
    "ORDER BY scheduled_at"
)
LAST_TWO_DAYS = (
    "SELECT * FROM decision_history WHERE deployment = 'pruned' AND decided_at >= %s - interval '2 days' "
    "ORDER BY decided_at"
)
TICK_SUMMARY_LAST_HOUR = (
    "SELECT * FROM tick_summary WHERE deployment = 'pruned' AND scheduled_at > %s - interval '1 hour' "
    "ORDER BY scheduled_at"
)


def _before(days: dict[str, set[str]], first: dt.datetime) -> dict[str, set[str]]:
    """The days read earlier than `first`'s day (which no row of a filter `scheduled_at > first` can be in), per
    table. Later days may be read: a filter with no upper bound names them (the partitions made ahead)."""
    early = {table: {day for day in read if day < f"{first:%Y%m%d}"} for table, read in days.items()}
    return {table: read for table, read in early.items() if read}


def test_the_views_return_the_same_columns_and_rows_as_0020s(days_of_ticks) -> None:
    """0021's definitions against 0020's on the same rows: every column (name and type) and every row the same;
    the rows exercise what the new definitions read differently (a capacity from the steps, a decision's `why`,
    worker counts, forecasts, proposals); 0020 -> 0021 gives 0021's definitions back."""
    url, _ = days_of_ticks
    downgrade(url, "0022")  # 0021's `decision_history` (0023 adds a column and shows the summary in `why`)
    new = _snapshot(url)
    new_definitions = _definitions(url)
    [(with_capacity, with_forecast, with_proposal, days)] = _rows(
        url,
        "SELECT count(prefill_engine_tokens_per_s), count(predicted_num_req), count(proposed_decode), "
        "count(DISTINCT date_trunc('day', scheduled_at, 'UTC')) FROM tick_summary",
    )
    assert with_capacity > 0 and with_forecast > 0 and with_proposal > 0 and days == NUM_DAYS
    [(num_decisions, num_why, num_before)] = _rows(
        url, "SELECT count(*), count(why), count(prefill_before) FROM decision_history"
    )
    assert num_decisions == num_why == num_before > 0
    get_engine(url).dispose()

    downgrade(url, "0020")
    try:
        old_definitions = _definitions(url)
        assert old_definitions != new_definitions
        assert _snapshot(url) == new
    finally:
        upgrade(url, "0022")
        get_engine(url).dispose()
    assert _definitions(url) == new_definitions
    upgrade(url)
    get_engine(url).dispose()


def test_0021_downgrades_to_exactly_0020s_definitions(empty_database_url, days_of_ticks) -> None:
    """The downgrade restores 0020's views as 0020 created them (compared with a database migrated to 0020 only),
    grants and comments included."""
    upgrade(empty_database_url, "0020")
    fresh = _definitions(empty_database_url)
    url, _ = days_of_ticks
    downgrade(url, "0020")
    try:
        assert _definitions(url) == fresh
    finally:
        upgrade(url)
        get_engine(url).dispose()
    privileges = (
        "SELECT has_table_privilege('planner_analyst', %s, 'SELECT'), obj_description(%s::regclass, 'pg_class')"
    )
    for view in VIEWS:
        analyst_reads, comment = _rows(url, privileges, view, view)[0]
        assert analyst_reads and comment, view


def test_a_time_filter_reads_only_its_days(days_of_ticks) -> None:
    """A last-hour `tick_history` (and `tick_summary`, every column) reads only the newest tick's day of every tick
    table, a two-day `decision_history` only those days; on 0020's definitions (downgraded in place) the same
    queries read other days (the check is able to fail)."""
    url, newest = days_of_ticks
    hour_ago, two_days_ago = newest - dt.timedelta(hours=1), newest - dt.timedelta(days=2)
    hour = _days_read(url, LAST_HOUR, newest)
    today = {f"{newest:%Y%m%d}"}
    assert hour["worker_observations"] == hour["traffic_observations"] == today, hour
    assert hour["predictions"] == hour["proposals"] == today and today <= hour["ticks"], hour
    assert _before(hour, hour_ago) == {}
    summary = _days_read(url, TICK_SUMMARY_LAST_HOUR, newest)  # every column: the capacities read the steps
    assert summary["tick_step_lists"] == today and _before(summary, hour_ago) == {}, summary
    decisions = _days_read(url, LAST_TWO_DAYS, newest)
    # the decisions of the last two days (21:25 to 23:45 each day) are on the last two days
    assert decisions["tick_step_lists"] == decisions["worker_observations"] == {"20260303", "20260304"}, decisions
    assert _before(decisions, two_days_ago) == {}, decisions
    get_engine(url).dispose()

    downgrade(url, "0020")
    try:
        assert _before(_days_read(url, LAST_HOUR, newest), hour_ago) != {}
        assert _before(_days_read(url, LAST_TWO_DAYS, newest), two_days_ago) != {}
    finally:
        upgrade(url)
        get_engine(url).dispose()
