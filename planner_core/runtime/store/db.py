"""Database connection: the configured Postgres URL, or an embedded real Postgres (pgserver) on disk.

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


def embedded_database_url(pg_dir: Path) -> str:
    """Start (or attach to) the embedded Postgres under `pg_dir` and return its SQLAlchemy URL."""
    import pgserver  # heavy-ish; only needed when no external database is configured

    pg_dir.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pg_dir, cleanup_mode=None)
    return to_sqlalchemy_url(server.get_uri())


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
    """`PLANNER_DATABASE_URL` if set, else the embedded server's URL (starting it if needed)."""
    settings = settings or RuntimeSettings()
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    return embedded_database_url(settings.embedded_pg_dir)


@cache
def get_engine(url: str, *, lock_timeout_ms: int | None = None, statement_timeout_ms: int | None = None) -> Engine:
    """One pooled engine per URL (and timeouts) per process. Every connection works in UTC.

    `lock_timeout_ms` / `statement_timeout_ms` (Postgres' settings of those names, on every connection): a
    statement waiting longer for a lock, or running longer, fails instead of blocking its caller for as long as
    another session holds a lock (the forward-pass ingest sets them: its writes must never stall its receiving).
    """
    engine = create_engine(url, pool_pre_ping=True, future=True)
    settings = [("lock_timeout", lock_timeout_ms), ("statement_timeout", statement_timeout_ms)]

    @event.listens_for(engine, "connect")
    def _set_session(dbapi_connection, _record):  # noqa: ANN001
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
            for name, value_ms in settings:
                if value_ms is not None:
                    cursor.execute(f"SET {name} = {int(value_ms)}")  # an int: nothing to quote
        dbapi_connection.commit()

    return engine


def session_factory(
    url: str, *, lock_timeout_ms: int | None = None, statement_timeout_ms: int | None = None
) -> sessionmaker[Session]:
    """Sessions that never autocommit; callers own `with factory.begin():`. Timeouts as in `get_engine`."""
    engine = get_engine(url, lock_timeout_ms=lock_timeout_ms, statement_timeout_ms=statement_timeout_ms)
    return sessionmaker(bind=engine, expire_on_commit=False)
