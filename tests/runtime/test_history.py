"""SQL over the decision history: the views, the read-only analyst role, `planner history` and `history_frame`,
and retention (`planner db prune`)."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid

import psycopg
import pytest

from planner_core.runtime.replay import replay
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.history import HISTORY_COLUMNS, history_frame, history_rows
from planner_core.runtime.store.migrate import downgrade, upgrade
from planner_core.runtime.store.models import ReplayMode
from planner_core.runtime.store.prune import prune_history
from planner_core.runtime.times import parse_time
from tests.cli.test_cli import planner
from tests.conftest import write_config
from tests.runtime.databases import create_database
from tests.runtime.recording import record_simulated_run

VIEWS = (
    "decision_history",
    "tick_history",
    "scaling_events",
    "sla_by_hour",
    "predictor_accuracy",
    "replay_comparison",
    "tick_summary",
)


def _rows(url: str, sql: str, *params):
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture(scope="module")
def history(postgres_server_url, template_database, tmp_path_factory, azure_conv_trace, profile_dir):
    """A recorded run: 20 throughput windows of 60 s, load ticks every 20 s (60 ticks), Kalman forecasts."""
    url = create_database(postgres_server_url, template_database)
    config = write_config(tmp_path_factory.mktemp("history"), load_predictor="kalman")
    times = record_simulated_run(url, config, azure_conv_trace, "hist", num_windows=20)
    return url, times


# --- views -------------------------------------------------------------------------------------------------


def test_scaling_events_has_one_row_per_decision_with_consistent_deltas(history) -> None:
    """Every decision appears once; deltas are target - expected before, direction and GPU delta follow from them."""
    url, _ = history
    events = _rows(
        url,
        "SELECT decision_id, prefill_from, prefill_to, decode_from, decode_to, prefill_delta, decode_delta, "
        "gpu_delta, direction, status, seconds_to_acknowledge FROM scaling_events WHERE deployment = 'hist'",
    )
    assert len(events) == _rows(url, "SELECT count(*) FROM decisions")[0][0] >= 3
    for _, p_from, p_to, d_from, d_to, p_delta, d_delta, gpus, direction, status, ack_s in events:
        assert (p_delta, d_delta) == (p_to - p_from, d_to - d_from)
        assert gpus == p_delta + d_delta  # one GPU per engine in the test config
        expected = "up" if min(p_delta, d_delta) >= 0 else "down" if max(p_delta, d_delta) <= 0 else "mixed"
        assert direction == expected
        assert status == "acknowledged" and ack_s == 0.0  # the simulated orchestrator acknowledges at once


def test_sla_by_hour_rolls_up_every_throughput_window(history) -> None:
    """Windows, requests and GPU-hours per hour add up to the throughput ticks' observations."""
    url, times = history
    rows = _rows(url, "SELECT hour, num_windows, num_req, num_windows_met, gpu_hours FROM sla_by_hour")
    assert sum(r[1] for r in rows) == 20
    [(total_req, gpu_hours)] = _rows(
        url,
        "SELECT sum(o.num_req), sum(o.window_s * (w.ready_prefill + w.ready_decode)) / 3600 FROM ticks t "
        "JOIN traffic_observations o ON o.tick_id = t.id JOIN worker_observations w ON w.tick_id = t.id",
    )
    assert sum(r[2] for r in rows) == pytest.approx(total_req)
    assert sum(r[4] for r in rows) == pytest.approx(gpu_hours)
    assert {r[0] for r in rows} == {t.replace(minute=0, second=0, microsecond=0) for t in times}
    assert all(0 <= r[3] <= r[1] for r in rows)


def test_predictor_accuracy_pairs_each_forecast_with_the_next_window(history) -> None:
    """19 pairs for 20 windows; the loss is Dynamo's weighted log1p error, recomputed here for one row."""
    url, times = history
    rows = _rows(
        url,
        "SELECT predicted_at, window_end, predicted_num_req, actual_num_req, predicted_isl, actual_isl, "
        "predicted_osl, actual_osl, loss FROM predictor_accuracy WHERE deployment = 'hist' ORDER BY predicted_at",
    )
    assert len(rows) == 19
    assert [(r[0], r[1]) for r in rows] == list(zip(times, times[1:], strict=False))
    _, _, n_hat, n, isl_hat, isl, osl_hat, osl, loss = rows[-1]

    def e(a: float, b: float) -> float:
        return abs(math.log1p(a) - math.log1p(b))

    expected = 0.4 * e(n_hat * isl_hat, n * isl) + 0.4 * e(n_hat * osl_hat, n * osl)
    expected += 0.1 * e(isl_hat, isl) + 0.1 * e(osl_hat, osl)
    assert loss == pytest.approx(expected, rel=1e-12)


def test_views_are_documented(history) -> None:
    """Every view carries a COMMENT ON VIEW."""
    url, _ = history
    comments = dict(_rows(url, "SELECT relname, obj_description(oid, 'pg_class') FROM pg_class WHERE relkind = 'v'"))
    for view in VIEWS:
        assert comments.get(view), view


# --- analyst role --------------------------------------------------------------------------------------------


@pytest.fixture
def analyst_url(history):
    """A login user in `planner_analyst` (created as the README says), connected to the history database."""
    url, _ = history
    name = f"analyst_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'x' IN ROLE planner_analyst")
    base, _, query = to_libpq_uri(url).partition("?")
    yield base.replace("postgres:@", f"{name}:x@", 1) + "?" + query
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(f"DROP ROLE {name}")


def test_the_analyst_role_reads_every_view_and_table(analyst_url) -> None:
    """SELECT works on the views and the tables (replay tables included)."""
    with psycopg.connect(analyst_url) as conn:
        for relation in (*VIEWS, "ticks", "tick_steps", "planner_states", "audit_log", "replay_runs"):
            conn.execute(f"SELECT * FROM {relation} LIMIT 1").fetchall()
        assert conn.execute("SELECT count(*) FROM scaling_events").fetchone()[0] >= 3


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO deployments (name, mode, environment, config_hash) SELECT 'x', mode, environment, config_hash "
        "FROM deployments LIMIT 1",
        "UPDATE decisions SET status = 'failed'",
        "DELETE FROM tick_step_lists",
        "INSERT INTO replay_runs DEFAULT VALUES",
        "CREATE TABLE scratch (x int)",
    ],
    ids=["insert", "update", "delete", "insert-replay", "create"],
)
def test_the_analyst_role_cannot_write(analyst_url, statement) -> None:
    """Writes are refused by the database itself."""
    with psycopg.connect(analyst_url) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_migration_0003_downgrades_and_upgrades_again(empty_database_url) -> None:
    """0003 -> 0002 removes the views, replay tables and grants (the role stays if other databases use it);
    upgrading again restores them (creating the role is skipped when it exists)."""
    url = empty_database_url
    upgrade(url)
    downgrade(url, "0002")
    views = {r[0] for r in _rows(url, "SELECT viewname FROM pg_views WHERE schemaname = 'public'")}
    assert views == {"decision_history", "tick_history"}
    assert _rows(url, "SELECT to_regclass('replay_runs'), to_regclass('ix_ticks_deployment_id_scheduled_at')") == [
        (None, None)
    ]
    restored = (
        "SELECT to_regclass('ix_ticks_deployment_id') IS NOT NULL, "
        "to_regclass('ix_planner_states_deployment_id') IS NOT NULL"
    )
    assert _rows(url, restored) == [(True, True)]  # the indexes 0003 replaced are back
    grants = "SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = 'planner_analyst'"
    assert _rows(url, grants) == [(0,)]
    # the role is cluster-wide: kept exactly when another database (the test template, say) still grants to it
    [(exists, num_dependents)] = _rows(
        url,
        "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = 'planner_analyst'), "
        "(SELECT count(*) FROM pg_shdepend d JOIN pg_roles r ON d.refclassid = 'pg_authid'::regclass "
        "AND d.refobjid = r.oid WHERE r.rolname = 'planner_analyst')",
    )
    assert exists == (num_dependents > 0)
    upgrade(url)
    assert _rows(url, "SELECT has_table_privilege('planner_analyst', 'sla_by_hour', 'SELECT')") == [(True,)]
    assert _rows(url, "SELECT has_table_privilege('planner_analyst', 'ticks', 'INSERT')") == [(False,)]
    from planner_core.runtime.store.db import get_engine

    get_engine(url).dispose()


# --- planner history and history_frame ---------------------------------------------------------------------


def test_history_cli_and_history_frame_return_the_same_rows(history) -> None:
    """`planner history --format json` and `history_frame` give the same rows, in the same order."""
    url, times = history
    since = times[5]
    result = planner(
        "history", "--deployment", "hist", "--since", since.isoformat(), "--format", "json",
        env={"PLANNER_DATABASE_URL": url},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    frame = history_frame(url, "hist", since)
    assert list(frame.columns) == list(HISTORY_COLUMNS)
    assert len(printed) == len(frame) == len(history_rows(url, "hist", since)) >= 1
    assert [row["decision_id"] for row in printed] == frame["decision_id"].tolist()
    assert [dt.datetime.fromisoformat(row["decided_at"]) for row in printed] == frame["decided_at"].tolist()
    assert all(dt.datetime.fromisoformat(row["decided_at"]) >= since for row in printed)
    assert [row["target_decode"] for row in printed] == frame["target_decode"].tolist()
    everything = history_frame(url, "hist")
    assert len(everything) == _rows(url, "SELECT count(*) FROM decisions")[0][0] > len(frame)


def test_history_cli_csv_has_a_header_and_one_line_per_decision(history) -> None:
    """CSV: the columns of HISTORY_COLUMNS, then one line per decision."""
    url, _ = history
    result = planner("history", "--deployment", "hist", "--format", "csv", env={"PLANNER_DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].split(",") == list(HISTORY_COLUMNS)
    assert len(lines) - 1 == _rows(url, "SELECT count(*) FROM decisions")[0][0]


def test_history_cli_table_shows_why_in_full_under_each_decision(history) -> None:
    """The table: a header, then each decision's line followed by its `why`, the deciding stage's numbers in one
    line (not cut to a cell, at most 160 characters)."""
    url, _ = history
    result = planner("history", "--deployment", "hist", env={"PLANNER_DATABASE_URL": url})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "why" not in lines[0].split() and "decision_id" in lines[0].split()
    rows = history_rows(url, "hist")
    expected = [f"    why: {row['why']}" for row in rows if row["why"]]
    assert [line for line in lines if line.startswith("    why: ")] == expected
    assert len(expected) == len(rows) and all(len(row["why"]) <= 160 for row in rows)
    assert all(row["why"].startswith(("prefill ", "decode ")) and "needs" in row["why"] for row in rows)
    assert len(lines) == 1 + len(rows) + len(expected)


def test_sla_by_hour_attainment_is_zero_for_an_hour_that_met_no_target(database_url, tmp_path, profile_dir) -> None:
    """An hour with latency data and no window within target: attainment 0, not NULL (migration 0008); an hour
    without latency data: NULL (unknown); an hour within target: 1."""
    from planner_core.domain import Loop, TrafficObservation
    from planner_core.runtime.service import load_context, run_tick
    from planner_core.runtime.store.db import get_engine

    ctx = load_context(database_url, "sla", write_config(tmp_path))  # TTFT target 200 ms, ITL 10 ms
    latencies = {0: (250.0, 9.0), 1: (None, None), 2: (150.0, 9.0)}  # hour -> (TTFT, ITL) of its windows (ms)
    for hour, (ttft_ms, itl_ms) in latencies.items():
        for minute in (0, 1):
            traffic = TrafficObservation(duration_s=60, num_req=600, isl=3000, osl=300, ttft_ms=ttft_ms, itl_ms=itl_ms)
            run_tick(ctx, Loop.THROUGHPUT, dt.datetime(2026, 1, 1, hour, minute, tzinfo=dt.UTC), traffic)
    get_engine(database_url).dispose()
    rows = _rows(
        database_url,
        "SELECT num_windows_with_latency, num_windows_met, request_weighted_attainment FROM sla_by_hour"
        " WHERE deployment = 'sla' ORDER BY hour",
    )
    assert rows == [(2, 0, 0.0), (0, 0, None), (2, 2, 1.0)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01", dt.datetime(2024, 5, 1, tzinfo=dt.UTC)),  # naive = UTC
        ("2024-05-01T14:00+02:00", dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)),
        ("90m", dt.datetime(2024, 6, 1, 10, 30, tzinfo=dt.UTC)),  # 12:00 - 1.5 h
        ("7d", dt.datetime(2024, 5, 25, 12, tzinfo=dt.UTC)),
        ("0s", dt.datetime(2024, 6, 1, 12, tzinfo=dt.UTC)),
    ],
)
def test_parse_time(text: str, expected: dt.datetime) -> None:
    """ISO 8601 (naive means UTC) or a span back from now."""
    assert parse_time(text, now=dt.datetime(2024, 6, 1, 12, tzinfo=dt.UTC)) == expected


def test_parse_time_names_the_option_and_value() -> None:
    with pytest.raises(ValueError, match=r"^--since = 'last week': expected an ISO 8601 time"):
        parse_time("last week", now=dt.datetime(2024, 6, 1, tzinfo=dt.UTC))


# --- retention -------------------------------------------------------------------------------------------------


@pytest.fixture
def prunable(postgres_server_url, template_database, tmp_path, azure_conv_trace, profile_dir):
    """A fresh run to prune: 12 throughput windows of 60 s with load ticks every 20 s (36 ticks)."""
    url = create_database(postgres_server_url, template_database)
    times = record_simulated_run(url, write_config(tmp_path), azure_conv_trace, "pruned", num_windows=12)
    return url, times


def _detail_counts(url: str, before: dt.datetime) -> dict[str, tuple[int, int]]:
    """(old, new) row counts of each tick's detail, split at `before`."""
    counts = {}
    for table in ("ticks", "tick_steps", "planner_states", "traffic_observations", "predictions", "decisions"):
        key = "id" if table == "ticks" else "tick_id"
        [(old, new)] = _rows(
            url,
            f"SELECT count(*) FILTER (WHERE t.scheduled_at < %s), count(*) FILTER (WHERE t.scheduled_at >= %s) "
            f"FROM {table} x JOIN ticks t ON t.id = x.{key}",
            before,
            before,
        )
        counts[table] = (old, new)
    return counts


def _all_states(url: str) -> dict[int, dict]:
    """Every stored planner state, rebuilt from its deltas, by tick id."""
    from sqlalchemy import text

    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import session_factory

    with session_factory(url).begin() as session:
        ids = session.scalars(text("SELECT tick_id FROM planner_states ORDER BY tick_id")).all()
        return {tick_id: repo.state_json(session, tick_id) for tick_id in ids}


def test_prune_deletes_only_the_old_load_tick_detail(prunable) -> None:
    """Before the cutoff: load ticks lose steps and states (bar the chain start); everything else stays."""
    url, times = prunable
    cutoff = times[6]  # before it: 6 throughput ticks and 14 load ticks (windows 1-7 have 2 load ticks each)
    now = cutoff + dt.timedelta(days=30)
    before = _detail_counts(url, cutoff)
    assert before["ticks"] == (20, 16) and before["planner_states"] == (20, 16)
    states_before = _all_states(url)
    assert _rows(url, "SELECT count(*) FROM planner_states WHERE base_tick_id IS NOT NULL")[0][0] == 34  # bar 1, 33

    dry = prune_history(url, older_than_days=30, now=now, dry_run=True)
    assert _detail_counts(url, cutoff) == before  # a dry run deletes nothing
    summary = prune_history(url, older_than_days=30, now=now, batch_size=5)
    assert summary.total.to_json() == dry.total.to_json()
    assert summary.total.num_ticks == 20 and summary.num_batches == 2 + 3  # 6 throughput + 14 load ticks, by 5
    after = _detail_counts(url, cutoff)
    # 14 old load ticks with 1 step and 1 state each; the newest of them (at 400 s) is the state the first tick
    # after the cutoff starts from: kept, so 13 of each go
    assert after["tick_steps"] == (before["tick_steps"][0] - 13, before["tick_steps"][1])
    assert after["planner_states"] == (7, 16)
    for table in ("ticks", "traffic_observations", "predictions", "decisions"):
        assert after[table] == before[table], table
    events = _rows(url, "SELECT (detail->>'tick_steps')::int FROM audit_log WHERE event = 'history_pruned'")
    assert len(events) == 5 and sum(n for (n,) in events) == 13
    # a state that stays but was a delta against a pruned one was first stored whole: every state that stays
    # reads back as before (migration 0016)
    states_after = _all_states(url)
    assert len(states_after) == 7 + 16
    assert states_after == {tick_id: states_before[tick_id] for tick_id in states_after}
    [(num_whole,)] = _rows(url, "SELECT count(*) FROM planner_states WHERE base_tick_id IS NULL")
    assert num_whole > 1

    again = prune_history(url, older_than_days=30, now=now)  # starts at the watermark: nothing left to examine
    assert again.total.num_ticks == 0 and again.num_batches == 0


@pytest.mark.parametrize(
    ("mode", "jobs"), [(ReplayMode.RECORDED, 1), (ReplayMode.CHAINED, 1), (ReplayMode.RECORDED, 4)]
)
def test_replay_after_prune_skips_what_was_pruned_and_is_exact_from_the_cutoff(
    prunable, mode, jobs, monkeypatch
) -> None:
    """Pruned load ticks are skipped; throughput ticks bridge from their replayed state; after the cutoff, exact.
    In parts replayed side by side (`jobs`), the same: a part never starts at a tick whose state before was pruned
    (a single process bridges it)."""
    import planner_core.runtime.replay as replay_module
    import planner_core.runtime.replay_parallel as replay_parallel

    monkeypatch.setattr(replay_parallel, "MIN_TICKS_PER_JOB", 2)  # 20 ticks in up to 4 parts
    parts: list[list] = []
    run_ranges = replay_module.run_ranges
    monkeypatch.setattr(replay_module, "run_ranges", lambda *a: parts.append(list(a[2])) or run_ranges(*a))
    url, times = prunable
    cutoff = times[6]
    prune_history(url, older_than_days=1, now=cutoff + dt.timedelta(days=1))
    old = replay(url, "pruned", times[0] - dt.timedelta(hours=1), cutoff, mode=mode, jobs=jobs)
    if jobs > 1:  # cut where the tick before has a state: 4 parts asked, fewer places to cut
        assert len(parts) == 1 and 1 < len(parts[0]) <= 4
        starts = [r.first_id for r in parts[0][1:]]
        kept = _rows(url, "SELECT count(*) FROM ticks t JOIN planner_states s ON s.tick_id = t.previous_tick_id "
                          "WHERE t.id = ANY(%s)", starts)  # fmt: skip
        assert kept == [(len(starts),)]
    # 13 load ticks without state; 6 throughput ticks and the kept load tick compare exactly
    assert (old.num_ticks, old.num_skipped, old.num_identical, old.num_differing) == (20, 13, 7, 0)
    assert {d.loop for d in old.differences} == {"load"}
    recent = replay(url, "pruned", cutoff, times[-1] + dt.timedelta(seconds=1), mode=mode)
    assert (recent.num_ticks, recent.num_identical) == (16, 16)


def test_prune_cli(prunable) -> None:
    """`planner db prune --older-than 0` prunes everything before now (the recorded run is from 2023)."""
    url, _ = prunable
    env = {"PLANNER_DATABASE_URL": url}
    dry = planner("db", "prune", "--older-than", "0", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    # 12 throughput and 24 load ticks; the newest tick is a throughput tick, so all 24 load states go
    assert "pruned: 36 ticks examined; would delete 24 tick_steps, 24 planner_states" in dry.stdout
    done = planner("db", "prune", "--older-than", "0", env=env)
    assert "pruned: 36 ticks examined; deleted 24 tick_steps, 24 planner_states" in done.stdout
    missing = planner("db", "prune", env=env)
    assert missing.returncode == 2 and "--older-than --drop-partitions-older-than is required" in missing.stderr
