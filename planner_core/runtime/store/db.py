"""Database connection: the configured Postgres URL, or an embedded real Postgres (pgserver) on disk.

Two roles: the schema's owner runs the migrations (`resolve_owner_database_url`), and the planner writes through
a role that owns nothing (`resolve_database_url`), a member of `planner_writer` (migration 0009), which can
neither disable the audit log's triggers nor drop a table. With an external Postgres the operator names both
(`PLANNER_MIGRATION_DATABASE_URL`, `PLANNER_DATABASE_URL`; one URL serves both when only the second is set). The
embedded server's superuser owns its schema, and the planner logs in there as `planner_app` (`EMBEDDED_WRITER`),
created here on first use.

The embedded server lives under `<data_dir>/pg` and keeps running after the process that started it exits, so
`psql` can connect to it (`planner db url`); `planner db stop` stops it.
"""

from __future__ import annotations

import os
import signal
import time
from functools import cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from planner_core.runtime.settings import RuntimeSettings

# The embedded server's login role for the planner (a member of `WRITER_ROLE`), and the role itself: migration
# 0009 grants it its privileges; it is created here too so the login can exist before the first migration.
EMBEDDED_WRITER = "planner_app"
WRITER_ROLE = "planner_writer"


def embedded_database_url(pg_dir: Path) -> str:
    """Start (or attach to) the embedded Postgres under `pg_dir` and return its superuser's SQLAlchemy URL (the
    schema owner's: migrations run through it)."""
    import pgserver  # heavy-ish; only needed when no external database is configured

    pg_dir.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pg_dir, cleanup_mode=None)
    return to_sqlalchemy_url(server.get_uri())


def embedded_writer_url(owner_url: str) -> str:
    """The embedded server's URL for `EMBEDDED_WRITER`, creating that login (and `WRITER_ROLE`) if missing.

    The server accepts local socket connections without a password, so the login has none."""
    import psycopg

    with psycopg.connect(to_libpq_uri(owner_url), autocommit=True) as conn:
        conn.execute(
            f"""DO $$ BEGIN
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{WRITER_ROLE}') THEN
                    CREATE ROLE {WRITER_ROLE} NOLOGIN;
                END IF;
                IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{EMBEDDED_WRITER}') THEN
                    CREATE ROLE {EMBEDDED_WRITER} LOGIN IN ROLE {WRITER_ROLE};
                END IF;
            END $$"""
        )
    return with_user(owner_url, EMBEDDED_WRITER)


def with_user(url: str, user: str) -> str:
    """`url` logging in as `user` (no password: the embedded server's local connections need none)."""
    scheme, rest = url.split("://", 1)
    host = rest.split("@", 1)[1] if "@" in rest.split("/", 1)[0] else rest
    return f"{scheme}://{user}@{host}"


def stop_embedded_database(pg_dir: Path) -> bool:
    """Stop the embedded server under `pg_dir` (fast shutdown). Returns False if none was running."""
    pid_file = pg_dir / "postmaster.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGINT)  # postgres "fast" shutdown
    except ProcessLookupError:
        return False
    for _ in range(100):
        if not pid_file.exists():
            break
        time.sleep(0.05)
    return True


def to_sqlalchemy_url(uri: str) -> str:
    """Give a libpq-style `postgresql://` URI the psycopg 3 driver SQLAlchemy needs."""
    if uri.startswith("postgresql://"):
        return "postgresql+psycopg://" + uri[len("postgresql://") :]
    if uri.startswith("postgres://"):
        return "postgresql+psycopg://" + uri[len("postgres://") :]
    return uri


def to_libpq_uri(url: str) -> str:
    """Inverse of `to_sqlalchemy_url`: the URI psql and LISTEN connections understand."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def resolve_database_url(settings: RuntimeSettings | None = None) -> str:
    """What the planner reads and writes through: `PLANNER_DATABASE_URL` if set, else the embedded server's
    `EMBEDDED_WRITER` (starting the server if needed)."""
    settings = settings or RuntimeSettings()
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    return embedded_writer_url(embedded_database_url(settings.embedded_pg_dir))


def resolve_owner_database_url(settings: RuntimeSettings | None = None) -> str:
    """What migrations run through: `PLANNER_MIGRATION_DATABASE_URL` if set, else `PLANNER_DATABASE_URL` (one
    role for both), else the embedded server's superuser."""
    settings = settings or RuntimeSettings()
    if settings.migration_database_url:
        return to_sqlalchemy_url(settings.migration_database_url)
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    return embedded_database_url(settings.embedded_pg_dir)


@cache
def get_engine(url: str) -> Engine:
    """One pooled engine per URL per process. Every connection works in UTC."""
    engine = create_engine(url, pool_pre_ping=True, future=True)

    @event.listens_for(engine, "connect")
    def _set_utc(dbapi_connection, _record):  # noqa: ANN001
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
        dbapi_connection.commit()

    return engine


def session_factory(url: str) -> sessionmaker[Session]:
    """Sessions that never autocommit; callers own `with factory.begin():`."""
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)
