"""Database helpers of the tests that use Postgres: fresh databases cloned from a migrated template, hand-made
ticks and decisions recorded with the real repository, and login roles with a password.

The server and the per-test database fixtures that use these are in tests/conftest.py (shared with the lab and
CLI tests); the decision-core tests (tests/core) never import this module.
"""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
from sqlalchemy import select

from planner_core.domain import Loop, PlannerState, ReasonCode, ScalingDecision, TickInputs, TickOutcome, WorkerCounts
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import get_engine, to_libpq_uri, to_sqlalchemy_url
from planner_core.runtime.store.models import DecisionRow

TEMPLATE_DB = "planner_template"


def _with_database(url: str, name: str) -> str:
    """Replace the database name in a libpq URI (keeps the ?host=... socket query)."""
    base, _, query = url.partition("?")
    scheme_host = base.rsplit("/", 1)[0]
    return f"{scheme_host}/{name}" + (f"?{query}" if query else "")


def create_template_database(server_url: str) -> str:
    """A database migrated to head, used as the template of every test database; returns its name."""
    from planner_core.runtime.store.migrate import upgrade

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    template_url = _with_database(server_url, TEMPLATE_DB)
    upgrade(to_sqlalchemy_url(template_url))
    get_engine(to_sqlalchemy_url(template_url)).dispose()  # a template must have no open connections
    return TEMPLATE_DB


def create_database(server_url: str, template: str | None = None) -> str:
    """Create an empty (or templated) database and return its SQLAlchemy URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return to_sqlalchemy_url(_with_database(server_url, name))


def release_connections(url: str) -> None:
    """Close this process's pooled connections to a test's database: the engines are cached per URL for the
    process (`get_engine`), so without this every test database keeps its idle connections open until the session
    ends, and a long suite runs into the server's `max_connections`."""
    get_engine(url).dispose()


def drop_database(server_url: str, url: str) -> None:
    """Release this process's connections to a test's database and drop it (a connection another process left
    open is ended: the test is over). Kept, the databases of a session filled each worker's server folder with
    0.2-1.2 GB, which the server's stop had to write out and delete at the session's end, one worker after the
    other (pgserver's cleanup holds a lock shared by every server on the machine): 24-37 s in CI's teardowns."""
    release_connections(url)
    name = to_libpq_uri(url).partition("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def decision_outcome(at, num_prefill: int | None, num_decode: int | None):
    """A throughput tick's inputs at `at` (a datetime; 1 ready and expected worker per pool) and an outcome deciding
    the given targets: what `record_decision` records (and a bench that times the commit itself)."""
    workers = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
    inputs = TickInputs(now_s=at.timestamp(), loop=Loop.THROUGHPUT, workers=workers)
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=num_prefill, num_decode=num_decode),
        next_state=PlannerState(),
        steps=(),
        reason=ReasonCode.SCALE,
    )
    return inputs, outcome


def record_decision(ctx, deployment_name: str, at, num_prefill: int | None, num_decode: int | None) -> int:
    """Record a throughput tick of `deployment_name` at `at` (a datetime) whose decision is the given targets, with
    the real repository (1 ready and expected worker per pool); returns the decision id."""
    inputs, outcome = decision_outcome(at, num_prefill, num_decode)
    with ctx.sessions.begin() as session:
        tick_id = record_outcome(session, deployment_name, inputs, outcome)
        return session.scalar(select(DecisionRow.id).where(DecisionRow.tick_id == tick_id))


def record_outcome(session, deployment_name: str, inputs, outcome, *, previous_tick_id: int | None = None):
    """Record a hand-made tick outcome for `deployment_name` at `inputs.now_s` with the real repository."""
    deployment = repo.find_deployment(session, deployment_name)
    record = repo.TickRecord(
        deployment_id=deployment.id,
        scheduled_at=dt.datetime.fromtimestamp(inputs.now_s, tz=dt.UTC),
        config_hash=deployment.config_hash,
        predictor="constant",
        previous_tick_id=previous_tick_id,
        decide_ms=0.0,
    )
    return repo.record_tick(session, record, inputs, outcome)


def create_login(url: str, group: str, password: str) -> tuple[str, str]:
    """A new login role in `group` with `password`, and the libpq URI of `url`'s database logging in as it
    (the password in the URI, as an operator's `PLANNER_DATABASE_URL` would carry it). Drop it with `drop_login`."""
    name = f"login_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE {group}")
    scheme, rest = to_libpq_uri(url).split("://", 1)
    host_and_db = rest.split("@", 1)[1] if "@" in rest.split("/", 1)[0] else rest
    return f"{scheme}://{name}:{password}@{host_and_db}", name


def drop_login(url: str, name: str) -> None:
    """Drop a role made by `create_login` (its privileges in `url`'s database first)."""
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")
