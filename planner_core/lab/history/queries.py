# ruff: noqa: T201  (a benchmark script reports on stdout)
"""Benchmark (not a test): the history views and prune on ~1.8M generated ticks, with and without the 0003 indexes.

Generates, with generate_series in one SQL script, two deployments of 5 s load ticks and 180 s throughput ticks
(`bench`: 80 days, `other`: 20 days; ~1.78M ticks) with their worker observations, steps (1 per load tick, 14 per
throughput tick), traffic, predictions, proposals, decisions with executions and acknowledgements, and small
planner states (the views never read states; their real size matters for replay, see `replay_week.py`). Then it
runs each query `--repeat` times under EXPLAIN ANALYZE and prints the median execution time and the plan's index
use, puts the indexes back as they were before migration 0003 and measures again, and finally times `prune_history`.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python -m planner_core.lab.history.queries

`--days N` generates N days for `bench` (N/4 for `other`) instead; `--views-only` times the queries once, with the
indexes as they are, and skips prune; `--compare-revision REV` then downgrades to REV (e.g. 0020, before migration
0021's partition-pruning view definitions), times the queries again on the same rows and upgrades back; `--json
PATH` writes every median with the command, date and row counts.

Uses `--database-url` (a database it may fill and leave behind) or starts a throw-away pgserver under /tmp.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import tempfile
import time

import psycopg

from planner_core.runtime.store.db import get_engine, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.migrate import downgrade, upgrade
from planner_core.runtime.store.prune import drop_partitions, prune_history
from planner_core.runtime.store.repository import _BOUND, _STATE_CHAIN_SQL

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DEPLOYMENTS = {"bench": 80, "other": 20}  # days of history each

GENERATE = """
INSERT INTO planner_configs (config_hash, body) VALUES ('bench', '{"ttft_ms": 200, "itl_ms": 10,
  "throughput_adjustment_interval_seconds": 180, "load_adjustment_interval_seconds": 5,
  "prefill_engine_num_gpu": null, "decode_engine_num_gpu": null}');
INSERT INTO deployments (id, name, mode, environment, config_hash) VALUES
  (1, 'bench', 'disagg', 'virtual', 'bench'), (2, 'other', 'disagg', 'virtual', 'bench');

-- the tick tables' daily partitions (migration 0017), created as the planner would, ahead of the rows
SELECT planner_tick_partitions(((%(t0)s::timestamptz AT TIME ZONE 'UTC') + make_interval(days => d))::date)
  FROM generate_series(0, %(bench_days)s) AS d;

-- ticks in time order (ids follow the recording order, as live ticks' do): a throughput tick every 36th slot
CREATE TEMP TABLE slots AS
SELECT d.id AS deployment_id, s.i, %(t0)s::timestamptz + make_interval(secs => 5 * s.i) AS at
  FROM (VALUES (1, %(bench_days)s), (2, %(other_days)s)) AS d(id, days),
       generate_series(0, d.days * 17280 - 1) AS s(i);
INSERT INTO ticks (id, deployment_id, loop, scheduled_at, config_hash, reason, inputs, previous_tick_id, decide_ms)
SELECT n, deployment_id, loop, at, 'bench',
       CASE WHEN loop = 'load' THEN 'no_fpm_data' WHEN i %% 360 = 0 THEN 'scale' ELSE 'no_change' END,
       json_build_object('workers', json_build_array(2, 3, 2, 3)),  -- 0020's form: now_s, loop from the row
       CASE WHEN first THEN NULL ELSE n - 1 END, 0.05
  FROM (SELECT *, row_number() OVER (ORDER BY deployment_id, at, loop) AS n,
               row_number() OVER (PARTITION BY deployment_id ORDER BY at, loop) = 1 AS first
          FROM (SELECT deployment_id, i, at, 'load' AS loop FROM slots
                UNION ALL SELECT deployment_id, i, at, 'throughput' FROM slots WHERE i %% 36 = 0) x) y;
SELECT setval(pg_get_serial_sequence('ticks', 'id'), (SELECT max(id) FROM ticks));

INSERT INTO worker_observations (tick_id, scheduled_at, ready_prefill, ready_decode, expected_prefill, expected_decode)
SELECT id, scheduled_at, 2, 3, 2, 3 FROM ticks;
INSERT INTO planner_states (tick_id, scheduled_at, deployment_id, state)
SELECT id, scheduled_at, deployment_id, jsonb_build_object('num_load_ticks', id) FROM ticks;
-- explanations as the planner stores them (migration 0018): shared templates, one packed line per tick
INSERT INTO step_templates (step, component, reason, template)
VALUES ('load', NULL, 'no_fpm_data', 'no forward-pass metrics observed');
INSERT INTO step_templates (step, component, reason, template)
SELECT 'step' || s.seq, CASE WHEN s.seq %% 2 = 0 THEN 'prefill' ELSE 'decode' END,
       CASE WHEN s.seq IN (0, 1, 13) THEN 'observed' ELSE 'within_range' END, 'generated'
  FROM generate_series(0, 13) AS s(seq);
INSERT INTO tick_step_lists (tick_id, scheduled_at, packed)
SELECT id, scheduled_at, (SELECT id FROM step_templates WHERE step = 'load') || ','
  FROM ticks WHERE loop = 'load';
INSERT INTO tick_step_lists (tick_id, scheduled_at, packed)
SELECT t.id, t.scheduled_at, p.line
  FROM ticks t, (SELECT string_agg(st.id || ',' || (s.seq * 1.5)::text, ';' ORDER BY s.seq) AS line
                   FROM generate_series(0, 13) AS s(seq) JOIN step_templates st ON st.step = 'step' || s.seq) p
 WHERE t.loop = 'throughput';
INSERT INTO traffic_observations (tick_id, scheduled_at, window_s, num_req, isl, osl, isl_p90, osl_p90, ttft_ms,
                                  itl_ms)
SELECT id, scheduled_at, 180, 3000 + 1500 * sin(extract(epoch FROM scheduled_at) / 86400 * 2 * pi()) + random() * 300,
       3000 + random() * 500, 300 + random() * 50, 5000, 600, 60 + random() * 300, 6 + random() * 6
  FROM ticks WHERE loop = 'throughput';
INSERT INTO predictions (tick_id, scheduled_at, predictor, num_req, isl, osl, reason, quantile, isl_quantile,
                         osl_quantile)
SELECT tick_id, scheduled_at, 'kalman', num_req * (0.9 + random() * 0.2), isl, osl, 'predicted', 'p90', isl_p90, osl_p90
  FROM traffic_observations;
INSERT INTO proposals (tick_id, scheduled_at, component, current, desired, reason)
SELECT id, scheduled_at, c, 2, 2, 'no_change'
  FROM ticks, unnest(ARRAY['prefill', 'decode']) AS c WHERE loop = 'throughput';
INSERT INTO decisions (tick_id, deployment_id, target_prefill, target_decode, reason, status, created_at,
                       status_changed_at)
SELECT id, deployment_id, 3, 4, 'scale', 'acknowledged', scheduled_at, scheduled_at FROM ticks WHERE reason = 'scale';
INSERT INTO executions (decision_id, attempt, connector, executed_at, outcome, detail)
SELECT d.id, a, 'virtual', d.created_at + make_interval(secs => 10 * a),
       CASE WHEN a = 3 THEN 'applied' ELSE 'blocked_unacknowledged' END, 'generated'
  FROM decisions d, generate_series(1, 3) AS a;
INSERT INTO virtual_decisions (deployment_id, decision_id, planner_decision_id, num_prefill_workers,
                               num_decode_workers, written_at, acknowledged_at)
SELECT deployment_id, row_number() OVER (PARTITION BY deployment_id ORDER BY id), id, 3, 4,
       created_at + interval '30 s', created_at + interval '150 s' FROM decisions;
"""

# (name, SQL with :end = the newest tick's time)
QUERIES = (
    (
        "decision_history, 7 days",
        "SELECT * FROM decision_history WHERE deployment = 'bench' AND decided_at >= %(end)s - interval '7 days' "
        "ORDER BY decided_at",
    ),
    (
        "tick_history, last hour",
        "SELECT * FROM tick_history WHERE deployment = 'bench' AND scheduled_at >= %(end)s - interval '1 hour' "
        "ORDER BY scheduled_at",
    ),
    (
        "tick_history reasons, 1 day",
        "SELECT reason, count(*) FROM tick_history WHERE deployment = 'bench' "
        "AND scheduled_at >= %(end)s - interval '1 day' GROUP BY reason",
    ),
    (
        "scaling_events, 30 days",
        "SELECT * FROM scaling_events WHERE deployment = 'bench' AND decided_at >= %(end)s - interval '30 days'",
    ),
    (
        "sla_by_hour, 7 days",
        "SELECT * FROM sla_by_hour WHERE deployment = 'bench' AND hour >= %(end)s - interval '7 days' ORDER BY hour",
    ),
    (
        "predictor_accuracy, 7 days (mean loss)",
        "SELECT predictor, count(*), avg(loss) FROM predictor_accuracy WHERE deployment = 'bench' "
        "AND predicted_at >= %(end)s - interval '7 days' GROUP BY predictor",
    ),
    (
        "latest state (every live tick)",
        "SELECT tick_id FROM planner_states WHERE deployment_id = 1 ORDER BY tick_id DESC LIMIT 1",
    ),
    (
        "latest state, the last two days only",
        "SELECT tick_id FROM planner_states WHERE deployment_id = 1 AND scheduled_at >= %(end)s - interval '1 day' "
        "ORDER BY tick_id DESC LIMIT 1",
    ),
    (
        "newest state's chain, bounded to its day",
        _STATE_CHAIN_SQL.format(bound=_BOUND.format(p=""), bound_p=_BOUND.format(p="p."))
        .replace(":tick_id", "%(tick)s")
        .replace(":lo", "date_trunc('day', %(end)s, 'UTC')")
        .replace(":hi", "date_trunc('day', %(end)s, 'UTC') + interval '1 day'"),
    ),
    (
        "newest state's chain, unbounded",
        _STATE_CHAIN_SQL.format(bound="", bound_p="").replace(":tick_id", "%(tick)s"),
    ),
    (
        "prune batch (5000 oldest load ticks)",
        "SELECT id, scheduled_at FROM ticks WHERE deployment_id = 1 AND loop = 'load' "
        "AND scheduled_at < %(end)s - interval '30 days' ORDER BY scheduled_at LIMIT 5000",
    ),
)

INDEXES_0003 = {
    "ix_ticks_deployment_id_scheduled_at": "CREATE INDEX ix_ticks_deployment_id_scheduled_at "
    "ON ticks (deployment_id, scheduled_at)",
    "ix_ticks_throughput_hour": "CREATE INDEX ix_ticks_throughput_hour ON ticks "
    "(deployment_id, date_trunc('hour', scheduled_at, 'UTC')) WHERE loop = 'throughput'",
    "ix_planner_states_deployment_id_tick_id": "CREATE INDEX ix_planner_states_deployment_id_tick_id "
    "ON planner_states (deployment_id, tick_id)",
}
# The single-column indexes 0003 replaced, restored for the "without" measurement.
INDEXES_0002 = {
    "ix_ticks_deployment_id": "CREATE INDEX ix_ticks_deployment_id ON ticks (deployment_id)",
    "ix_planner_states_deployment_id": "CREATE INDEX ix_planner_states_deployment_id ON planner_states (deployment_id)",
}


def measure(conn: psycopg.Connection, sql: str, params: dict, repeat: int) -> tuple[float, float, str]:
    """Median and max time (ms, planning plus execution) of `repeat` EXPLAIN ANALYZE runs (TIMING OFF: no clock
    read per plan node and row, which would weigh on a nested loop's many small lookups), and what the plan read:
    the days (partitions that ran) per table, the indexes and sequential scans (partitions as `_p*`)."""
    times, plan = [], ""
    for _ in range(repeat):
        rows = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, BUFFERS, SUMMARY ON) " + sql, params).fetchall()
        plan = "\n".join(r[0] for r in rows)
        # planning counts too: Postgres plans a query over N partitions in time growing with N
        times.append(sum(float(t) for t in re.findall(r"(?:Planning|Execution) Time: ([\d.]+) ms", plan)))
    # what was read: a partition's scan that ran (not pruned at run time) counts as one day of its table
    read = [line for line in plan.splitlines() if "never executed" not in line]
    days: dict[str, set[str]] = {}
    for table, day in re.findall(r"Scan(?: Backward)?(?: using \w+)? on (\w+?)_p(\d{8})\b", "\n".join(read)):
        days.setdefault(table, set()).add(day)
    partitions = ", ".join(f"{table} {len(d)}" for table, d in sorted(days.items()))
    indexes = sorted(
        {re.sub(r"_p\d{8}", "_p*", i) for i in re.findall(r"(?:Index|Index Only) Scan(?: Backward)? using (\w+)", plan)}
    )
    scans = sorted({re.sub(r"_p\d{8}", "_p*", i) for i in re.findall(r"Seq Scan on (\w+)", plan)})
    used = (
        f"days read: {partitions or '-'}; " + ", ".join(indexes) + (f"; seq scan: {', '.join(scans)}" if scans else "")
    )
    return statistics.median(times), max(times), used


def report(conn: psycopg.Connection, params: dict, repeat: int, label: str) -> dict[str, dict[str, float | str]]:
    """Time every query; returns {query: {"median_ms", "max_ms", "used"}} as printed."""
    print(f"\n{label}: median (max) of {repeat} EXPLAIN ANALYZE runs")
    results: dict[str, dict[str, float | str]] = {}
    for name, sql in QUERIES:
        median, worst, used = measure(conn, sql, params, repeat)
        print(f"  {name:<40} {median:9.2f} ms ({worst:8.2f})   {used}")
        results[name] = {"median_ms": round(median, 2), "max_ms": round(worst, 2), "used": used}
    return results


def generate_history(conn: psycopg.Connection, days: dict[str, int]) -> None:
    """Fill the (migrated) database with `days` of history per deployment (`GENERATE`), then VACUUM ANALYZE.
    `conn` is in autocommit mode: the script runs in a transaction of its own, the vacuum outside one."""
    params = {"t0": f"'{T0.isoformat()}'", **{f"{name}_days": d for name, d in days.items()}}
    with conn.transaction():
        conn.execute(GENERATE % params)  # one multi-statement script (simple protocol: no parameters)
    conn.execute("VACUUM ANALYZE")


def _table_sizes(conn: psycopg.Connection) -> dict[str, int]:
    """Print each history table's rows and size; their row counts."""
    rows = {}
    for table in ("ticks", "tick_step_lists", "worker_observations", "planner_states", "decisions", "executions"):
        count, size = conn.execute(
            f"SELECT count(*), pg_size_pretty(pg_total_relation_size('{table}')) FROM {table}"
        ).fetchone()
        print(f"  {table:<22} {count:>10,} rows {size:>10}")
        rows[table] = count
    return rows


def _without_the_0003_indexes(conn: psycopg.Connection, params: dict, repeat: int) -> None:
    """The queries timed with the 0002 indexes only, then the 0003 indexes created again (each timed)."""
    for name in INDEXES_0003:
        conn.execute(f"DROP INDEX {name}")
    for ddl in INDEXES_0002.values():
        conn.execute(ddl)
    conn.execute("ANALYZE ticks")
    conn.execute("ANALYZE planner_states")
    report(conn, params, repeat, "without them (0002 indexes only)")
    for name in INDEXES_0002:
        conn.execute(f"DROP INDEX {name}")
    for name, ddl in INDEXES_0003.items():
        started = time.perf_counter()
        conn.execute(ddl)
        print(f"  CREATE INDEX {name}: {time.perf_counter() - started:.1f} s")
    conn.execute("ANALYZE ticks")


def _time_prunes(url: str, end: dt.datetime) -> None:
    """The prune at 60 and 30 days, a prune with nothing new, and the oldest two days' partitions dropped."""
    for days in (60, 30):
        started = time.perf_counter()
        summary = prune_history(url, older_than_days=days, now=end + dt.timedelta(seconds=1), batch_size=5000)
        elapsed = time.perf_counter() - started
        print(
            f"\nprune --older-than {days} (from {end:%Y-%m-%d}): {summary.total.to_json()} in "
            f"{summary.num_batches} batches, {elapsed:.1f} s ({summary.total.num_ticks / elapsed:,.0f} ticks/s)"
        )
    started = time.perf_counter()
    again = prune_history(url, older_than_days=30, now=end + dt.timedelta(seconds=1))
    print(f"prune again (nothing new): {again.total.num_ticks} ticks in {time.perf_counter() - started:.2f} s")
    # Retention by partition (migration 0017): the oldest two days, each dropped in its own transaction.
    now = T0 + dt.timedelta(days=2 + 30)
    started = time.perf_counter()
    dropped = drop_partitions(url, older_than_days=30, now=now)
    elapsed = time.perf_counter() - started
    for day in dropped.dropped:
        print(f"drop partitions of {day.day}: {day.num_ticks:,} ticks, rows {day.rows}")
    print(f"drop-partitions-older-than 30 (2 days): {elapsed:.2f} s, {elapsed / len(dropped.dropped):.2f} s a day")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="a database to fill (default: a throw-away pgserver)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--days", type=int, default=DEPLOYMENTS["bench"], help="days of history of `bench`")
    parser.add_argument("--views-only", action="store_true", help="time the queries once; no index swap, no prune")
    parser.add_argument("--compare-revision", default=None, help="also time the queries downgraded to this revision")
    parser.add_argument("--json", default=None, help="write the medians to this file")
    args = parser.parse_args()
    days = {"bench": args.days, "other": max(1, args.days // 4)}
    record: dict = {
        "command": " ".join(["python -m planner_core.lab.history.queries", *sys.argv[1:]]),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "days": days,
        "repeat": args.repeat,
        "results": {},
    }
    server = None
    if args.database_url is None:
        import pgserver

        server = pgserver.get_server(tempfile.mkdtemp(prefix="pgb", dir="/tmp"), cleanup_mode="delete")
        url = to_sqlalchemy_url(server.get_uri())
    else:
        url = to_sqlalchemy_url(args.database_url)
    try:
        upgrade(url)
        started = time.perf_counter()
        with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
            generate_history(conn, days)
            print(f"generated in {time.perf_counter() - started:.1f} s:")
            record["rows"] = _table_sizes(conn)
            end = conn.execute("SELECT max(scheduled_at) FROM ticks WHERE deployment_id = 1").fetchone()[0]
            tick = conn.execute("SELECT max(id) FROM ticks WHERE deployment_id = 1").fetchone()[0]
            record["results"]["head"] = report(conn, {"end": end, "tick": tick}, args.repeat, "with the 0003 indexes")
            if args.compare_revision:
                downgrade(url, args.compare_revision)
                record["results"][args.compare_revision] = report(
                    conn, {"end": end, "tick": tick}, args.repeat, f"downgraded to {args.compare_revision}"
                )
                upgrade(url)
            if args.json:
                with open(args.json, "w") as out:
                    json.dump(record, out, indent=2)
                    out.write("\n")
                print(f"wrote {args.json}")
            if args.views_only:
                return
            _without_the_0003_indexes(conn, {"end": end, "tick": tick}, args.repeat)
        _time_prunes(url, end)
    finally:
        get_engine(url).dispose()
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
