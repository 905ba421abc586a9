"""Live retune (migration 0024, `planner config set`): a changed `ttft_ms` is run by the next tick, which records its
revision; a stale revision and a login outside `planner_operator` are refused in one line, by the CLI and by the
database for SQL writers alike; a field that cannot change live is refused; replay of the ticks before and after
the change is identical. Real Postgres, real ticks (`run_tick`), real login roles."""

from __future__ import annotations

import datetime as dt
import json
import threading

import psycopg
import pytest

from planner_core.config import ConfigError, PlannerMode
from planner_core.domain import Loop, TrafficObservation
from planner_core.planner import refuse_what_cannot_work
from planner_core.runtime.replay import replay
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import session_factory, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.models import ReplayMode
from planner_core.runtime.store.revisions import RetuneRefused, history, parse_assignments, retune
from tests.conftest import write_config
from tests.runtime.databases import create_login, drop_login

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)
BUSY = TrafficObservation(duration_s=60, num_req=6000, isl=3000, osl=300)
NAME = "retune"


@pytest.fixture
def operator(database_url):
    """A login in `planner_operator` and its SQLAlchemy URL."""
    uri, name = create_login(database_url, "planner_operator", "op-secret-1")
    yield to_sqlalchemy_url(uri), name
    drop_login(database_url, name)


def _rows(url: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


def _set(url: str, expected: int, reason: str = "tighter TTFT for the launch", **updates):
    with session_factory(url).begin() as session:
        return retune(session, NAME, expected, updates, reason, check=refuse_what_cannot_work)


def _prefill(url: str, tick_id: int) -> tuple[float, int]:
    """The prefill engine's capacity the tick searched (requests/s within the SLA) and the prefill engines it
    proposed."""
    [(capacity,)] = _rows(
        url,
        "SELECT value FROM tick_steps WHERE tick_id = %s AND step = 'engine_capacity' AND component = 'prefill'",
        tick_id,
    )
    [(desired,)] = _rows(url, "SELECT desired FROM proposals WHERE tick_id = %s AND component = 'prefill'", tick_id)
    return capacity, desired


def test_a_ttft_change_is_run_by_the_next_tick_with_its_revision_and_replays_identically(
    database_url, tmp_path, operator
) -> None:
    """Two ticks under the file's revision 1 (TTFT 200 ms), a retune to 100 ms by an operator, two ticks: the ticks
    after it record revision 2 and its config hash, and size prefill for 100 ms (one engine serves fewer requests/s
    within it: 7 engines where 200 ms needed 6); the revision says who, why and what; replay of all four ticks is
    identical (each under the revision it ran)."""
    config = write_config(tmp_path, ttft_ms=200, throughput_algorithm="engine_capacity")
    ctx = load_context(database_url, NAME, config)
    before = [run_tick(ctx, Loop.THROUGHPUT, T0 + k * MINUTE, BUSY).tick_id for k in range(2)]
    operator_url, operator_name = operator
    written = _set(operator_url, 1, ttft_ms=100)
    assert (written.revision, written.source, written.author) == (2, "set", operator_name)
    assert dict(written.changes) == {"ttft_ms": [200.0, 100.0]}
    after = [run_tick(ctx, Loop.THROUGHPUT, T0 + k * MINUTE, BUSY).tick_id for k in range(2, 4)]

    ticks = _rows(database_url, "SELECT id, config_revision, config_hash FROM ticks ORDER BY id")
    [(hash_1,), (hash_2,)] = _rows(database_url, "SELECT config_hash FROM config_revisions ORDER BY revision")
    assert [(t[1], t[2]) for t in ticks] == [(1, hash_1), (1, hash_1), (2, hash_2), (2, hash_2)]
    targets = _rows(database_url, "SELECT ttft_target_ms FROM tick_summary ORDER BY tick_id")
    assert [t[0] for t in targets] == [200.0, 200.0, 100.0, 100.0]
    (capacity_200, engines_200), (capacity_100, engines_100) = (
        _prefill(database_url, before[-1]),
        _prefill(database_url, after[0]),
    )
    assert capacity_100 < capacity_200 and (engines_200, engines_100) == (6, 7)
    [(detail,)] = _rows(
        database_url, "SELECT detail FROM audit_log WHERE event = 'config_revision' AND detail->>'source' = 'set'"
    )
    assert detail["author"] == operator_name and detail["reason"] == "tighter TTFT for the launch"
    assert detail["changes"] == {"ttft_ms": [200.0, 100.0]}

    summary = replay(database_url, NAME, T0, T0 + 4 * MINUTE)
    assert (summary.num_ticks, summary.num_identical, summary.num_differing) == (4, 4, 0)
    assert summary.revisions == (1, 2)
    # each tick is replayed under its own revision: under revision 1 alone, the ticks after the retune differ
    what_if = write_config(tmp_path, ttft_ms=200, throughput_algorithm="engine_capacity")
    summary = replay(database_url, NAME, T0, T0 + 4 * MINUTE, config_path=what_if, mode=ReplayMode.RECORDED)
    assert [d.tick_id for d in summary.differences] == after


def test_a_stale_revision_is_refused_by_the_cli_path_and_by_the_database(database_url, tmp_path, operator) -> None:
    """After revision 2, a change made from revision 1 is refused in one line naming both, and an INSERT in SQL that
    skips the check is refused by the trigger with the same words; nothing is written."""
    ctx = load_context(database_url, NAME, write_config(tmp_path))
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    operator_url, _ = operator
    _set(operator_url, 1, ttft_ms=300)
    message = "deployment 'retune': stale config revision: expected revision 1, the current revision is 2"
    with pytest.raises(RetuneRefused, match=f"^{message}$"):
        _set(operator_url, 1, ttft_ms=250)
    [(deployment_id, config_hash)] = _rows(database_url, "SELECT id, config_hash FROM deployments")
    with psycopg.connect(to_libpq_uri(operator_url)) as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute(
            "INSERT INTO config_revisions (deployment_id, revision, config_hash, source, reason) "
            "VALUES (%s, 2, %s, 'set', 'from SQL')",
            (deployment_id, config_hash),
        )
    assert raised.value.sqlstate == "PR001" and str(raised.value).splitlines()[0] == message
    assert _rows(database_url, "SELECT max(revision) FROM config_revisions") == [(2,)]


def test_of_two_operators_racing_from_the_same_revision_the_second_is_refused_as_stale(
    database_url, tmp_path, operator
) -> None:
    """Both pass the command's check (revision 1 is current for both); the second's INSERT waits for the first's
    transaction on the deployment's row, then the trigger finds revision 2 current and refuses it."""
    ctx = load_context(database_url, NAME, write_config(tmp_path))
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    operator_url, _ = operator
    refused: list[str] = []

    def second() -> None:
        try:
            _set(operator_url, 1, max_gpu_budget=12, reason="second operator")
        except RetuneRefused as exc:
            refused.append(str(exc))

    with session_factory(operator_url).begin() as first:
        retune(first, NAME, 1, {"ttft_ms": 300}, "first operator", check=refuse_what_cannot_work)
        racer = threading.Thread(target=second)
        racer.start()
        racer.join(timeout=3.0)
        assert racer.is_alive()  # its INSERT waits on the row the first transaction holds
    racer.join(timeout=30.0)
    assert refused == ["deployment 'retune': stale config revision: expected revision 1, the current revision is 2"]
    assert _rows(database_url, "SELECT revision, reason FROM config_revisions ORDER BY revision") == [
        (1, f"config file {ctx.config_path.resolve()}"),
        (2, "first operator"),
    ]


def test_a_login_outside_planner_operator_is_refused(database_url, tmp_path) -> None:
    """The planner's own role (`planner_writer`) and an analyst may not retune: one line naming the login and why,
    from Python and from SQL; the writer may still record its file's revisions (the tick does)."""
    ctx = load_context(database_url, NAME, write_config(tmp_path))
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    writer_uri, writer = create_login(database_url, "planner_writer", "wr-secret-1")
    analyst_uri, analyst = create_login(database_url, "planner_analyst", "an-secret-1")
    try:
        with pytest.raises(
            RetuneRefused, match=f"^role {writer} may not retune deployment 'retune': not a member of planner_operator$"
        ):
            _set(to_sqlalchemy_url(writer_uri), 1, ttft_ms=300)
        with pytest.raises(
            RetuneRefused,
            match=f"^role {analyst} may not retune deployment 'retune': permission denied for table planner_configs$",
        ):
            _set(to_sqlalchemy_url(analyst_uri), 1, ttft_ms=300)
        [(deployment_id, config_hash)] = _rows(database_url, "SELECT id, config_hash FROM deployments")
        with psycopg.connect(writer_uri) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO config_revisions (deployment_id, revision, config_hash, source, reason) "
                "VALUES (%s, 2, %s, 'set', 'from SQL')",
                (deployment_id, config_hash),
            )
        assert _rows(database_url, "SELECT revision, source FROM config_revisions") == [(1, "file")]
        # the writer's ticks run under its login, and record the file's revisions
        writer_ctx = load_context(to_sqlalchemy_url(writer_uri), NAME, write_config(tmp_path, ttft_ms=300))
        run_tick(writer_ctx, Loop.THROUGHPUT, T0 + MINUTE, BUSY)
        assert _rows(database_url, "SELECT revision, source, author FROM config_revisions ORDER BY revision")[1] == (
            2,
            "file",
            writer,
        )
    finally:
        from planner_core.runtime.store.db import get_engine

        get_engine(to_sqlalchemy_url(writer_uri)).dispose()
        drop_login(database_url, writer)
        drop_login(database_url, analyst)


def test_fields_that_cannot_change_live_and_bad_values_are_refused_in_one_line(
    database_url, tmp_path, operator
) -> None:
    """`mode`, the connector's `environment`, an interval: refused naming the field; an unknown field, a bad value
    and an unreachable TTFT are the config loader's and `refuse_what_cannot_work`'s one-line errors."""
    ctx = load_context(database_url, NAME, write_config(tmp_path))
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    operator_url, _ = operator
    for updates, expected in (
        ({"mode": "agg"}, "field 'mode' = 'agg': cannot change live (it is 'disagg'"),
        ({"environment": "local"}, "field 'environment' = 'local': cannot change live"),
        ({"throughput_adjustment_interval_seconds": 30}, "field 'throughput_adjustment_interval_seconds' = 30"),
        ({"ttfx_ms": 3}, "field 'ttfx_ms' = 3: unknown field; did you mean 'ttft_ms'?"),
        ({"ttft_ms": -1}, "field 'ttft_ms' = -1: must be > 0"),
        ({"ttft_ms": 1}, "field 'ttft_ms' = 1: unreachable"),
    ):
        with pytest.raises(ConfigError) as raised:
            _set(operator_url, 1, **updates)
        assert expected in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(RetuneRefused, match="changes nothing"):
        _set(operator_url, 1, ttft_ms=200)
    with pytest.raises(RetuneRefused, match="--reason is empty"):
        _set(operator_url, 1, reason=" ", ttft_ms=300)
    assert _rows(database_url, "SELECT count(*) FROM config_revisions") == [(1,)]
    assert parse_assignments(["ttft=300", "max_gpu_budget=12", "prefill_min_endpoint=null"]) == {
        "ttft_ms": 300,
        "max_gpu_budget": 12,
        "prefill_min_endpoint": None,
    }
    with pytest.raises(RetuneRefused, match="expected FIELD=VALUE"):
        parse_assignments(["ttft_ms"])


def test_a_revision_written_in_sql_past_the_checks_fails_the_tick_in_one_line(database_url, tmp_path, operator) -> None:
    """An operator who writes, in SQL, a revision changing `mode` gets no tick run under it: the tick refuses it in
    one line naming the revision and the field, and records nothing."""
    ctx = load_context(database_url, NAME, write_config(tmp_path))
    run_tick(ctx, Loop.THROUGHPUT, T0, BUSY)
    operator_url, _ = operator
    agg = ctx.config.model_copy(update={"mode": PlannerMode.AGG})
    with session_factory(operator_url).begin() as session:
        digest = repo.register_config(session, agg)
    [(deployment_id,)] = _rows(database_url, "SELECT id FROM deployments")
    with psycopg.connect(to_libpq_uri(operator_url)) as conn:
        conn.execute(
            "INSERT INTO config_revisions (deployment_id, revision, config_hash, source, reason) "
            "VALUES (%s, 2, %s, 'set', 'from SQL')",
            (deployment_id, digest),
        )
    with pytest.raises(ConfigError, match=r"^deployment 'retune': config revision 2: field 'mode' = 'agg': cannot"):
        run_tick(ctx, Loop.THROUGHPUT, T0 + MINUTE, BUSY)
    assert _rows(database_url, "SELECT count(*) FROM ticks") == [(1,)]


def test_an_edited_file_is_the_next_revision_and_revisions_are_append_only(database_url, tmp_path, operator) -> None:
    """A retune stays in force while the file is unchanged (a new context of the same file runs it); a changed file
    is the next revision (source file), which the ticks then run; UPDATE and DELETE of a revision are refused."""
    path = write_config(tmp_path, ttft_ms=200)
    run_tick(load_context(database_url, NAME, path), Loop.THROUGHPUT, T0, BUSY)
    operator_url, _ = operator
    _set(operator_url, 1, max_gpu_budget=12)
    run_tick(load_context(database_url, NAME, path), Loop.THROUGHPUT, T0 + MINUTE, BUSY)  # a restart, same file
    edited = write_config(tmp_path, ttft_ms=300)
    run_tick(load_context(database_url, NAME, edited), Loop.THROUGHPUT, T0 + 2 * MINUTE, BUSY)
    assert _rows(database_url, "SELECT config_revision FROM ticks ORDER BY id") == [(1,), (2,), (3,)]
    with session_factory(database_url).begin() as session:
        revisions = history(session, NAME)
    assert [(r.revision, r.source) for r in revisions] == [(1, "file"), (2, "set"), (3, "file")]
    assert revisions[2].changes == {"ttft_ms": [200.0, 300.0], "max_gpu_budget": [12, 16]}
    for statement in ("UPDATE config_revisions SET reason = 'x'", "DELETE FROM config_revisions"):
        with psycopg.connect(to_libpq_uri(database_url)) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_the_cli_sets_shows_and_lists_revisions_and_refuses_in_one_line(
    database_url, tmp_path, operator, monkeypatch, capsys
) -> None:
    """`planner config set` prints the revision it wrote; `show` and `history` print it back; a stale revision is
    one line on stderr and exit 2."""
    from planner_cli.main import main

    run_tick(load_context(database_url, NAME, write_config(tmp_path)), Loop.THROUGHPUT, T0, BUSY)
    operator_url, operator_name = operator
    monkeypatch.setenv("PLANNER_DATABASE_URL", operator_url)
    argv = ["config", "set", NAME, "--expect-revision", "1", "--set", "ttft_ms=400", "--reason", "launch"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == f"retune: config revision 2 by {operator_name}: ttft_ms 200.0 -> 400.0 (the next tick runs it)\n"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "planner: error: deployment 'retune': stale config revision: expected revision 1, the current revision is 2\n"
    )
    assert main(["config", "show", NAME, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["revision"], shown["config"]["ttft_ms"], shown["author"]) == (2, 400.0, operator_name)
    assert main(["config", "history", NAME]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["1", "2"] and "ttft_ms 200.0 -> 400.0" in lines[1]
