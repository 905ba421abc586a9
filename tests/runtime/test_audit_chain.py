"""Tamper evidence (migration 0009): the planner writes through `planner_writer`, a role that owns nothing, and
the audit log is hash-chained; `planner audit verify` finds the first broken link."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import threading

import psycopg
import pytest
from sqlalchemy import text

from planner_core.domain import Loop, TrafficObservation
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.audit_chain import GENESIS_HASH, verify_chain
from planner_core.runtime.store.db import get_engine, session_factory, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.migrate import downgrade, upgrade
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.databases import create_login, drop_login

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
TRAFFIC = TrafficObservation(duration_s=60, num_req=3000, isl=3000, osl=300)


@pytest.fixture
def writer_url(database_url):
    """A login in `planner_writer` (SQLAlchemy URL with its password), on the test's database."""
    url, name = create_login(database_url, "planner_writer", "writer-pw")
    yield to_sqlalchemy_url(url)
    get_engine(to_sqlalchemy_url(url)).dispose()
    drop_login(database_url, name)


def _record_ticks(url: str, tmp_path, num_ticks: int, deployment: str = "chain") -> None:
    ctx = load_context(url, deployment, write_config(tmp_path))
    for k in range(num_ticks):
        run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(minutes=k), TRAFFIC)


def _verify_cli(url: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PLANNER_DATABASE_URL=url)
    command = [sys.executable, "-m", "planner_cli.main", "audit", "verify"]
    return subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def _as_owner(url: str, *statements: str) -> None:
    """Run statements as the owner (the test server's superuser), around the append-only trigger."""
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
        for statement in statements:
            conn.execute(statement)
        conn.execute("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only")


def test_an_unedited_chain_verifies(writer_url, tmp_path) -> None:
    """Ticks recorded through the writer role chain every audit row; the CLI says so and exits 0."""
    _record_ticks(writer_url, tmp_path, 5)
    with session_factory(writer_url).begin() as session:
        report = verify_chain(session)
    assert report.ok and report.num_rows >= 10  # tick_recorded per tick, decision_created, deployment_created
    result = _verify_cli(writer_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"audit chain intact: {report.num_rows} rows, head {report.head_hash}" in result.stdout


def test_an_edited_row_is_reported_with_expected_and_found(database_url, tmp_path) -> None:
    """An owner edits one row's detail around the trigger: verify names that row and both hashes, exit 1."""
    _record_ticks(database_url, tmp_path, 4)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM audit_log ORDER BY id")]
        stored = conn.execute("SELECT row_hash FROM audit_log WHERE id = %s", (ids[3],)).fetchone()[0]
    _as_owner(database_url, f"""UPDATE audit_log SET detail = detail || '{{"reason": "forged"}}' WHERE id = {ids[3]}""")
    with session_factory(database_url).begin() as session:
        report = verify_chain(session)
    assert report.broken is not None
    assert (report.broken.row_id, report.broken.field, report.broken.found) == (ids[3], "row_hash", stored.hex())
    assert report.broken.expected != report.broken.found and report.num_rows == 3
    result = _verify_cli(database_url)
    assert result.returncode == 1
    assert f"audit_log row {ids[3]}: row_hash expected {report.broken.expected}, found {stored.hex()}" in result.stdout


def test_a_recomputed_row_hash_breaks_the_next_link(database_url, tmp_path) -> None:
    """An edit that also recomputes its own row's hash is caught at the next row's prev_hash."""
    _record_ticks(database_url, tmp_path, 3)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM audit_log ORDER BY id")]
    forged = (
        "sha256(prev_hash || convert_to(jsonb_build_array(id, to_char(at AT TIME ZONE 'UTC', "
        """'YYYY-MM-DD"T"HH24:MI:SS.US'), deployment_id, tick_id, decision_id, event, detail)::text, 'UTF8'))"""
    )
    _as_owner(
        database_url,
        f"UPDATE audit_log SET event = 'forged' WHERE id = {ids[1]}",
        f"UPDATE audit_log SET row_hash = {forged} WHERE id = {ids[1]}",
    )
    with session_factory(database_url).begin() as session:
        report = verify_chain(session)
    assert report.broken is not None and (report.broken.row_id, report.broken.field) == (ids[2], "prev_hash")


@pytest.mark.parametrize("which", ["middle", "last"])
def test_a_deleted_row_is_reported(database_url, tmp_path, which) -> None:
    """A row deleted from the middle breaks the next link; one cut from the end no longer matches the head."""
    _record_ticks(database_url, tmp_path, 3)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM audit_log ORDER BY id")]
    gone = ids[2] if which == "middle" else ids[-1]
    _as_owner(database_url, f"DELETE FROM audit_log WHERE id = {gone}")
    with session_factory(database_url).begin() as session:
        report = verify_chain(session)
    assert report.broken is not None
    if which == "middle":
        assert (report.broken.row_id, report.broken.field) == (ids[3], "prev_hash")
    else:
        assert (report.broken.row_id, report.broken.field) == (None, "head")


@pytest.mark.parametrize(
    "statement",
    [
        "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
        "ALTER TABLE audit_log DISABLE TRIGGER audit_log_chain",
        "SET session_replication_role = replica",
        "DROP TABLE audit_log",
        "UPDATE audit_log SET event = 'x'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
        "UPDATE audit_chain_head SET last_hash = '\\x00'",
        "CREATE TABLE scratch (x int)",
        "INSERT INTO alembic_version VALUES ('x')",
    ],
    ids=[
        "disable-append-only", "disable-chain", "replication-role", "drop", "update", "delete", "truncate",
        "head", "create", "alembic",
    ],
)  # fmt: skip
def test_the_writer_role_cannot_get_around_the_audit_log(writer_url, tmp_path, statement) -> None:
    """What the owner could do to the audit log, the planner's role cannot: the database refuses each."""
    _record_ticks(writer_url, tmp_path, 1)
    with psycopg.connect(to_libpq_uri(writer_url)) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_the_writer_role_owns_nothing(writer_url, database_url) -> None:
    """No table, sequence or function of the schema belongs to planner_writer or its login."""
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        owned = conn.execute(
            """SELECT c.relname FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner
                WHERE r.rolname = 'planner_writer' OR pg_has_role(r.oid, 'planner_writer', 'MEMBER')
                  AND NOT r.rolsuper"""
        ).fetchall()
        writer_privileges = conn.execute(
            "SELECT has_table_privilege('planner_writer', 'ticks', 'INSERT'), "
            "has_table_privilege('planner_writer', 'audit_log', 'INSERT'), "
            "has_table_privilege('planner_writer', 'audit_log', 'UPDATE'), "
            "has_table_privilege('planner_writer', 'audit_log', 'TRIGGER')"
        ).fetchone()
    assert owned == []
    assert writer_privileges == (True, True, False, False)


def test_concurrent_writers_chain_one_after_the_other(database_url, tmp_path) -> None:
    """Four threads audit at once, each in its own transactions: one chain, in id order, no fork."""
    _record_ticks(database_url, tmp_path, 1)
    sessions = session_factory(database_url)
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for k in range(25):
                with sessions.begin() as session:
                    repo.audit(session, "test_event", {"worker": worker, "k": k})
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with sessions.begin() as session:
        report = verify_chain(session)
        assert report.ok, report.broken
        assert repo.query_rows(session, "SELECT count(*) AS n FROM audit_log WHERE event = 'test_event'")[0]["n"] == 100


def test_migration_0009_chains_existing_rows_and_downgrades(empty_database_url, tmp_path) -> None:
    """Rows written before 0009 are chained by the upgrade; downgrade removes the chain; upgrade again chains."""
    url = empty_database_url
    upgrade(url, "0008")
    with psycopg.connect(to_libpq_uri(url)) as conn:  # 0008's audit rows (the code now needs 0009 to tick)
        for k in range(4):
            conn.execute("INSERT INTO audit_log (event, detail) VALUES ('before_0009', %s)", (f'{{"k": {k}}}',))
    upgrade(url)
    with session_factory(url).begin() as session:
        report = verify_chain(session)
    assert report.ok and report.num_rows >= 4
    with psycopg.connect(to_libpq_uri(url)) as conn:
        first = conn.execute("SELECT prev_hash FROM audit_log ORDER BY id LIMIT 1").fetchone()[0]
    assert bytes(first) == GENESIS_HASH
    get_engine(url).dispose()
    downgrade(url, "0008")
    with psycopg.connect(to_libpq_uri(url)) as conn:
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'audit_log' "
            "AND column_name IN ('prev_hash', 'row_hash')"
        ).fetchall()
        assert columns == []
        assert conn.execute("SELECT to_regclass('audit_chain_head')").fetchone()[0] is None
    upgrade(url)
    _record_ticks(url, tmp_path, 3)
    with session_factory(url).begin() as session:
        assert verify_chain(session).ok
    get_engine(url).dispose()


def test_verify_reads_one_snapshot_while_the_planner_appends(database_url, tmp_path) -> None:
    """A row another writer commits while a walk's transaction is open is not in the walk's snapshot (so the head
    cannot run past the rows walked); the next walk sees it, chained."""
    _record_ticks(database_url, tmp_path, 2)
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        first = verify_chain(session)
        with sessions.begin() as other:
            repo.audit(other, "appended_meanwhile", {})
        in_snapshot = session.execute(text("SELECT count(*) FROM audit_log")).scalar_one()
        head_id = session.execute(text("SELECT last_id FROM audit_chain_head")).scalar_one()
        last_id = session.execute(text("SELECT max(id) FROM audit_log")).scalar_one()
    assert first.ok and in_snapshot == first.num_rows and head_id == last_id
    with sessions.begin() as session:
        after = verify_chain(session)
    assert after.ok and after.num_rows == first.num_rows + 1


def _recompute_whole_chain(url: str, row_id: int) -> None:
    """What a superuser can do: edit a row, then recompute every link after it and the head, so that the chain
    holds again inside the database."""
    content = (
        "convert_to(jsonb_build_array(id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), "
        "deployment_id, tick_id, decision_id, event, detail)::text, 'UTF8')"
    )
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute("ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only")
        conn.execute(f"UPDATE audit_log SET event = 'forged' WHERE id = {row_id}")
        prev = bytes(GENESIS_HASH)
        for (each,) in conn.execute("SELECT id FROM audit_log ORDER BY id").fetchall():
            conn.execute(
                f"UPDATE audit_log SET prev_hash = %s, row_hash = sha256(%s || {content}) WHERE id = %s",
                (prev, prev, each),
            )
            prev = bytes(conn.execute("SELECT row_hash FROM audit_log WHERE id = %s", (each,)).fetchone()[0])
            last = each
        conn.execute("UPDATE audit_chain_head SET last_id = %s, last_hash = %s WHERE id = 1", (last, prev))
        conn.execute("ALTER TABLE audit_log ENABLE TRIGGER audit_log_append_only")


def _audit_cli(url: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PLANNER_DATABASE_URL=url)
    command = [sys.executable, "-m", "planner_cli.main", "audit", *args]
    return subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_a_head_kept_outside_catches_a_recomputed_chain(database_url, tmp_path) -> None:
    """`planner audit head` exports the head; rows appended later still verify against it; a superuser who edits
    an earlier row and recomputes the whole chain and its head passes plain `verify` (issue 43) but not
    `verify --head`, which names the anchored row."""
    import json

    _record_ticks(database_url, tmp_path, 3)
    exported = _audit_cli(database_url, "head")
    assert exported.returncode == 0, exported.stderr
    head = json.loads(exported.stdout)
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM audit_log ORDER BY id")]
        stored = bytes(conn.execute("SELECT row_hash FROM audit_log WHERE id = %s", (ids[-1],)).fetchone()[0])
    assert (head["row"], head["hash"]) == (ids[-1], stored.hex()) and head["at"].startswith("20")
    anchor = tmp_path / "audit-head.json"
    anchor.write_text(exported.stdout)
    _record_ticks(database_url, tmp_path, 2, deployment="later")  # the log grows past the anchor
    grown = _audit_cli(database_url, "verify", "--head", str(anchor))
    assert grown.returncode == 0, grown.stdout + grown.stderr
    assert f"anchored head holds: row {ids[-1]} has hash {stored.hex()}" in grown.stdout
    _recompute_whole_chain(database_url, ids[1])
    assert _audit_cli(database_url, "verify").returncode == 0  # the chain alone cannot tell
    caught = _audit_cli(database_url, "verify", "--head", str(anchor))
    assert caught.returncode == 1
    assert f"audit_log row {ids[-1]}: row_hash expected {stored.hex()} (the head kept outside the database)" in (
        caught.stdout
    )
    inline = _audit_cli(database_url, "verify", "--head", f"{ids[-1]}:{stored.hex()}")
    assert inline.returncode == 1


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("12:abc", "not a head"),
        ('{"row": "x", "hash": "00"}', "field 'row' = 'x'"),
        ('{"row": 3, "hash": "zz"}', "field 'hash' = 'zz'"),
    ],
)
def test_a_bad_head_is_one_line(tmp_path, value: str, fragment: str) -> None:
    from planner_core.runtime.store.audit_chain import ChainHead

    with pytest.raises(ValueError, match=fragment):
        ChainHead.parse(value, "head.json")
    missing = _audit_cli("postgresql+psycopg://nobody@127.0.0.1:1/none", "verify", "--head", str(tmp_path / "none"))
    assert missing.returncode == 2
    [line] = missing.stderr.splitlines()
    assert line.startswith(f"planner: error: --head {tmp_path / 'none'}: cannot be read")


def test_the_fleet_publishes_the_head_and_a_broken_chain_keeps_the_last_good_one(database_url, tmp_path) -> None:
    """`planner fleet serve --audit-head-file` (`flows.fleet.publish_audit_head`): the head as `planner audit head`
    prints it, written whole; `verify --head` holds against it; once the chain is broken, publishing leaves the
    last good head in place for the verification that catches it."""
    import json

    from flows.fleet import publish_audit_head

    _record_ticks(database_url, tmp_path, 2)
    path = tmp_path / "anchor" / "audit-head.json"
    path.parent.mkdir()
    publish_audit_head(database_url, path)
    exported = _audit_cli(database_url, "head")
    assert json.loads(path.read_text()) == json.loads(exported.stdout)
    assert [p.name for p in path.parent.iterdir()] == ["audit-head.json"]  # no partial file left behind
    assert _audit_cli(database_url, "verify", "--head", str(path)).returncode == 0
    published = path.read_text()
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        first = conn.execute("SELECT min(id) FROM audit_log").fetchone()[0]
    _as_owner(database_url, f"UPDATE audit_log SET event = 'forged' WHERE id = {first}")
    publish_audit_head(database_url, path)
    assert path.read_text() == published
    assert _audit_cli(database_url, "verify", "--head", str(path)).returncode == 1
