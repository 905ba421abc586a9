# ruff: noqa: T201  (a benchmark script reports on stdout)
"""Benchmark (not a test): record a week of 5 s load ticks and 180 s throughput ticks, then time `planner replay`.

The history is recorded by the production code path: `planner_core.runtime.service.decide` on each tick and
`repository.record_tick` to write it (many ticks per transaction, the state carried in memory instead of read
back, which is what makes recording ~124k ticks take minutes rather than an hour). Traffic is a seeded diurnal
pattern with noise and length percentiles; load scaling is on, so every 5 s load tick stores the whole planner
state, load history included, exactly as a live deployment does.

    PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 .venv/bin/python -m planner_core.lab.history.replay_week \\
        [--days 7] [--predictor constant]

Then replays the week under the recorded config (`--repeat` times, median reported), and once under a what-if
config (TTFT 50 ms / ITL 5 ms, chained). Uses `--database-url` or a throw-away pgserver under /tmp.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
import yaml

from planner_core.data import H200_PROFILE_DIR
from planner_core.domain import Loop, TickInputs, TrafficObservation, WorkerCounts
from planner_core.runtime.replay import replay
from planner_core.runtime.service import context_for_config, decide, initial_state
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import get_engine, session_factory, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.migrate import upgrade

REPO_ROOT = Path(__file__).resolve().parents[3]
PROFILE_DIR = H200_PROFILE_DIR
T0 = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
THROUGHPUT_S, LOAD_S = 180, 5


def write_config(directory: Path, predictor: str, **overrides: object) -> Path:
    body = {
        "optimization_target": "sla",
        "mode": "disagg",
        "environment": "virtual",
        "model_name": "bench-model",
        "ttft_ms": 200,
        "itl_ms": 10,
        "enable_throughput_scaling": True,
        "enable_load_scaling": True,
        "throughput_adjustment_interval_seconds": THROUGHPUT_S,
        "load_adjustment_interval_seconds": LOAD_S,
        "load_predictor": predictor,
        "max_gpu_budget": 32,
        "profile_results_dir": str(PROFILE_DIR),
        **overrides,
    }
    path = directory / f"bench-{predictor}-{len(overrides)}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def traffic(window_end_s: float, rng: np.random.Generator) -> TrafficObservation:
    """A diurnal request rate (peak 3x the trough) with noise; lengths with percentiles."""
    day_phase = 2 * math.pi * window_end_s / 86400
    rate = 12.0 * (1 + 0.5 * math.sin(day_phase)) * float(rng.lognormal(0, 0.15))
    isl, osl = 3000 * float(rng.lognormal(0, 0.1)), 300 * float(rng.lognormal(0, 0.1))
    return TrafficObservation(
        duration_s=THROUGHPUT_S,
        num_req=float(round(rate * THROUGHPUT_S)),
        isl=isl,
        osl=osl,
        isl_p50=isl * 0.8,
        isl_p90=isl * 1.9,
        isl_p99=isl * 3.1,
        osl_p50=osl * 0.85,
        osl_p90=osl * 1.7,
        osl_p99=osl * 2.6,
    )


def record_week(url: str, config_path: Path, deployment: str, days: float, batch: int = 2000) -> int:
    """Record `days` of ticks with the production decide/record path; returns the number of ticks."""
    from planner_core.config import load_config

    config = load_config(config_path).policy
    ctx = context_for_config(url, deployment, config, config_path)
    sessions = session_factory(url)
    with sessions.begin() as session:
        deployment_row = repo.ensure_deployment(session, deployment, config)
        deployment_id, digest = deployment_row.id, deployment_row.config_hash
    rng = np.random.default_rng(7)
    workers = WorkerCounts(ready_prefill=4, ready_decode=4, expected_prefill=4, expected_decode=4)
    state, previous_id = initial_state(ctx), None
    num_slots = int(days * 86400 / LOAD_S)
    started, count = time.perf_counter(), 0
    session = sessions()
    session.begin()
    for slot in range(1, num_slots + 1):
        at_s = slot * LOAD_S
        loops = [Loop.LOAD] + ([Loop.THROUGHPUT] if at_s % THROUGHPUT_S == 0 else [])
        for loop in loops:
            now = T0 + dt.timedelta(seconds=at_s)
            window = traffic(at_s, rng) if loop is Loop.THROUGHPUT else None
            inputs = TickInputs(now_s=now.timestamp(), loop=loop, workers=workers, traffic=window)
            tick_started = time.perf_counter()
            outcome = decide(ctx, inputs, state)
            record = repo.TickRecord(
                deployment_id=deployment_id,
                scheduled_at=now,
                config_hash=digest,
                predictor=config.load_predictor.value,
                previous_tick_id=previous_id,
                decide_ms=(time.perf_counter() - tick_started) * 1000.0,
            )
            previous_id = repo.record_tick(session, record, inputs, outcome)
            state = outcome.next_state
            count += 1
            if count % batch == 0:
                session.commit()
                session.begin()
                rate = count / (time.perf_counter() - started)
                print(f"\r  recorded {count:,} ticks ({rate:,.0f}/s)", end="", flush=True)
    session.commit()
    session.close()
    print(f"\r  recorded {count:,} ticks in {time.perf_counter() - started:.0f} s")
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="a database to fill (default: a throw-away pgserver)")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--predictor", default="constant")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reuse", action="store_true", help="replay the week already recorded in --database-url")
    args = parser.parse_args()
    server = None
    if args.database_url is None:
        import pgserver

        server = pgserver.get_server(tempfile.mkdtemp(prefix="pgw", dir="/tmp"), cleanup_mode="delete")
        url = to_sqlalchemy_url(server.get_uri())
    else:
        url = to_sqlalchemy_url(args.database_url)
    folder = Path(tempfile.mkdtemp(prefix="replay-bench"))
    try:
        upgrade(url)
        config = write_config(folder, args.predictor)
        if args.reuse:
            with psycopg.connect(to_libpq_uri(url)) as conn:
                num_ticks = conn.execute("SELECT count(*) FROM ticks").fetchone()[0]
        else:
            print(f"recording {args.days:g} days, predictor {args.predictor}:")
            num_ticks = record_week(url, config, "week", args.days)
        with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            row = conn.execute(
                "SELECT pg_size_pretty(pg_total_relation_size('planner_states')), "
                "avg(pg_column_size(state))::int, avg(length(state::text))::int FROM planner_states"
            ).fetchone()
            print(f"  planner_states {row[0]} (state: {row[1]:,} bytes stored, {row[2]:,} bytes of JSON on average)")
        start, end = T0, T0 + dt.timedelta(days=args.days, seconds=1)
        times = []
        for attempt in range(args.repeat):
            summary = replay(url, "week", start, end)
            assert summary.num_ticks == num_ticks, summary
            times.append(summary.elapsed_s)
            print(
                f"  replay {attempt + 1} (recorded config): {summary.num_ticks:,} ticks, {summary.num_identical:,} "
                f"identical, {summary.num_differing} differing in {summary.elapsed_s:.1f} s "
                f"({summary.num_ticks / summary.elapsed_s:,.0f} ticks/s)"
            )
        median = statistics.median(times)
        print(f"median of {len(times)}: {median:.1f} s, {num_ticks / median:,.0f} ticks/s")
        what_if = write_config(folder, args.predictor, ttft_ms=50, itl_ms=5)
        summary = replay(url, "week", start, end, config_path=what_if)
        print(
            f"what-if TTFT 50 ms / ITL 5 ms (chained): {summary.num_differing:,} of {summary.num_ticks:,} ticks "
            f"differ, {summary.elapsed_s:.1f} s ({summary.num_ticks / summary.elapsed_s:,.0f} ticks/s)"
        )
    finally:
        get_engine(url).dispose()
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
