"""What a tick sends to the database when nothing about its deployment changed: the statements are counted on the
real engine (a listener on its cursor), so work cut from the per-tick path (measured by `planner fleet bench`)
cannot come back unnoticed."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import event

from planner_core.domain import Loop
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import get_engine, session_factory
from tests.conftest import write_config


class _Statements:
    """Every statement the engine of `url` executes while in the `with` block."""

    def __init__(self, url: str) -> None:
        self.engine, self.sql = get_engine(url), []

    def _seen(self, _conn, _cursor, statement, _params, _context, _many) -> None:
        self.sql.append(statement)

    def __enter__(self) -> list[str]:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self.sql

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


def test_a_tick_of_an_unchanged_config_does_not_send_its_body_again(database_url, tmp_path, profile_dir) -> None:
    """The first tick stores the config body; later ticks of the same config do not touch `planner_configs`
    (they used to upsert the whole body every tick) nor insert the connector's row again; a changed config is
    stored and audited as a new config revision (migration 0024)."""
    config = write_config(tmp_path)
    ctx = load_context(database_url, "chat", config)
    slot = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    with _Statements(database_url) as first:
        run_tick(ctx, Loop.THROUGHPUT, slot, None)
    assert any("planner_configs" in sql for sql in first)
    with _Statements(database_url) as later:
        run_tick(ctx, Loop.THROUGHPUT, slot + dt.timedelta(seconds=60), None)
    assert [sql for sql in later if "planner_configs" in sql] == []
    # the virtual connector's row is made by the first tick and only read after it
    assert any("INSERT INTO virtual_connector_state" in sql for sql in first)
    assert [sql for sql in later if "INSERT INTO virtual_connector_state" in sql] == []
    assert any("INSERT INTO ticks" in sql for sql in later)  # the tick itself was recorded

    changed = ctx.config.model_copy(update={"ttft_ms": 300.0})
    with session_factory(database_url).begin() as session:
        deployment = repo.ensure_deployment(session, "chat", changed)
        assert deployment.config_hash == repo.config_hash(changed)
        session.flush()
        events = [row["event"] for row in repo.query_rows(session, "SELECT event FROM audit_log ORDER BY id")]
        stored = repo.query_rows(session, "SELECT count(*) AS n FROM planner_configs")[0]["n"]
    assert events.count("config_revision") == 2 and stored == 2


def test_a_rounds_arbitration_locks_and_reads_decisions_in_one_statement_each(
    database_url, tmp_path, profile_dir
) -> None:
    """The arbitration of a round locks every member and reads their pending decisions with one statement each,
    however many members (it used to send two per member); the grants are those of the members' claims."""
    from planner_core.runtime.fleet import add_member, arbitrate_round, set_budget
    from tests.runtime.databases import record_decision

    slot = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    sessions = session_factory(database_url)
    with sessions.begin() as session:
        members = [add_member(session, name, write_config(tmp_path), min_gpus=2) for name in ("a", "b", "c", "d")]
        set_budget(session, 12)
    contexts = {m.name: load_context(database_url, m.name, m.config_path) for m in members}
    for name in ("a", "b", "c"):
        record_decision(contexts[name], name, slot - dt.timedelta(seconds=60), 3, 3)
    with _Statements(database_url) as sql, sessions.begin() as session:
        grants = arbitrate_round(session, slot, members, contexts)
    assert len([s for s in sql if "FROM decisions" in s]) == 1
    assert len([s for s in sql if "FROM deployments" in s and "FOR UPDATE" in s]) == 1
    assert sorted((g.deployment, g.proposed_gpus) for g in grants) == [("a", 6), ("b", 6), ("c", 6), ("d", 2)]
    assert sum(g.granted_gpus for g in grants) <= 12


def test_a_context_remembers_its_newest_state_and_reads_it_again_after_another_planes_tick(
    database_url, tmp_path, profile_dir
) -> None:
    """A context's next tick starts from the state its previous tick wrote without reading the state's rows back
    (`TickMemo`); when another control plane recorded a newer tick meanwhile, the memo is not the newest and the
    state is read from the database. Either way the ticks replay identically from the stored states."""
    from planner_core.runtime.replay import replay

    config = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)
    plane_a = load_context(database_url, "chat", config)
    plane_b = load_context(database_url, "chat", config)
    slot = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    run_tick(plane_a, Loop.LOAD, slot, None)
    with _Statements(database_url) as remembered:
        run_tick(plane_a, Loop.LOAD, slot + dt.timedelta(seconds=5), None)
    assert not any("WITH RECURSIVE chain" in sql for sql in remembered)
    run_tick(plane_b, Loop.LOAD, slot + dt.timedelta(seconds=10), None)  # b reads a's state from the database
    with _Statements(database_url) as reread:
        result = run_tick(plane_a, Loop.LOAD, slot + dt.timedelta(seconds=15), None)
    assert any("WITH RECURSIVE chain" in sql for sql in reread)  # a's memo is tick 2, the newest is b's tick 3
    assert plane_a.memo.newest is not None and plane_a.memo.newest[0] == result.tick_id
    summary = replay(database_url, "chat", slot, slot + dt.timedelta(seconds=20))
    assert (summary.num_ticks, summary.num_identical) == (4, 4)
