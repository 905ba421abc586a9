# ruff: noqa: T201  (a benchmark script reports on stdout)
"""Benchmark (not a test): one scrape of the metrics exporter (`load_metrics_snapshot`) over a long history.

Fills a database with `history_queries.py`'s generator (`--days` of 5 s load ticks and 180 s throughput ticks for
the deployment `bench`, a quarter of that for `other`), then times `--repeat` scrapes of `bench` and each of the
statements a scrape runs, and prints the medians.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python -m planner_core.lab.history.metrics_scrape --days 10

Uses `--database-url` (a database it may fill and leave behind) or starts a throw-away pgserver in a temporary
folder. `--json PATH` writes the medians with the command, date and row counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time

import psycopg
from sqlalchemy import event

from planner_core.lab.history.queries import generate_history
from planner_core.runtime.metrics import load_metrics_snapshot
from planner_core.runtime.store.db import get_engine, session_factory, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.migrate import upgrade


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="a database to fill (default: a throw-away pgserver)")
    parser.add_argument("--days", type=int, default=10, help="days of history of `bench`")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the medians to this file")
    args = parser.parse_args()
    days = {"bench": args.days, "other": max(1, args.days // 4)}
    server = None
    if args.database_url is None:
        import pgserver

        server = pgserver.get_server(tempfile.mkdtemp(prefix="pgscrape"), cleanup_mode="delete")
        url = to_sqlalchemy_url(server.get_uri())
    else:
        url = to_sqlalchemy_url(args.database_url)
    record: dict = {
        "command": " ".join(["python -m planner_core.lab.history.metrics_scrape", *sys.argv[1:]]),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "days": days,
        "repeat": args.repeat,
    }
    try:
        upgrade(url)
        started = time.perf_counter()
        with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
            generate_history(conn, days)
            record["num_ticks"] = conn.execute("SELECT count(*) FROM ticks").fetchone()[0]
        print(f"generated {record['num_ticks']:,} ticks in {time.perf_counter() - started:.1f} s")

        statement_ms: dict[str, list[float]] = {}
        began: dict[int, float] = {}

        def before(_conn, cursor, _statement, _parameters, _context, _executemany) -> None:
            began[id(cursor)] = time.perf_counter()

        def after(_conn, cursor, statement, _parameters, _context, _executemany) -> None:
            key = " ".join(statement.split())[:60]
            statement_ms.setdefault(key, []).append(1000.0 * (time.perf_counter() - began.pop(id(cursor))))

        engine = get_engine(url)
        event.listen(engine, "before_cursor_execute", before)
        event.listen(engine, "after_cursor_execute", after)
        scrape_ms = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            with session_factory(url).begin() as session:
                snapshot = load_metrics_snapshot(session, "bench")
            scrape_ms.append(1000.0 * (time.perf_counter() - t))
        record["scrape_ms_median"] = round(statistics.median(scrape_ms), 1)
        record["statement_ms_median"] = {key: round(statistics.median(v), 1) for key, v in statement_ms.items()}
        record["gpu_hours"] = snapshot.gpu_hours
        print(f"scrape: {record['scrape_ms_median']} ms (median of {args.repeat}); gpu_hours {snapshot.gpu_hours:.3f}")
        for key, ms in sorted(record["statement_ms_median"].items(), key=lambda item: -item[1]):
            print(f"  {ms:10.1f} ms  {key}")
        if args.json:
            with open(args.json, "w") as out:
                json.dump(record, out, indent=2)
                out.write("\n")
    finally:
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
