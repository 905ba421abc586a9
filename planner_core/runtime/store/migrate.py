"""Run the Alembic migrations against a database URL (used by the CLI, flows and tests): upgrade, downgrade, the
schema check commands make before reading, and a fresh migrated scratch database for a benchmark run
(`scratch_database`).

The migrations are the repository's top-level `migrations/`. The package carries them as `migrations/` beside this
module (in a checkout a link to the top-level folder, in a built wheel a copy: pyproject's package-data), so an
installed `planner` finds them from any folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.store.db import get_engine, resolve_owner_database_url, to_libpq_uri
from planner_core.runtime.store.partitions import forget_all

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(database_url: str) -> Config:
    """An Alembic config pointing at the project's migrations and the given database."""
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["database_url"] = database_url
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)
    forget_all()  # the tick tables' partitions this process knew may be gone (store/partitions.py)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)
    forget_all()


def heads(database_url: str = "") -> list[str]:
    return list(ScriptDirectory.from_config(alembic_config(database_url)).get_heads())


class SchemaOutOfDate(RuntimeError):
    """The database schema is not at the revision this code expects."""


def check_schema_current(database_url: str) -> None:
    """Raise `SchemaOutOfDate` (one line, with the fix) unless the database is at the newest migration."""
    from sqlalchemy import text
    from sqlalchemy.exc import ProgrammingError

    try:
        with get_engine(database_url).connect() as conn:
            current = set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
    except ProgrammingError:
        current = set()
    expected = set(heads(database_url))
    if current != expected:
        found = ", ".join(sorted(current)) or "no schema"
        raise SchemaOutOfDate(
            f"database schema is at {found}, this planner needs {', '.join(sorted(expected))}: run `planner db upgrade`"
        )


@contextmanager
def scratch_database(prefix: str, *, keep: bool = False) -> Iterator[str]:
    """A fresh, migrated database `<prefix>_<random>` on the planner's Postgres server (made through the owner's
    URL), for one benchmark run; dropped afterwards unless `keep`. Yields its SQLAlchemy URL."""
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    owner = resolve_owner_database_url(RuntimeSettings())
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = make_url(owner).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(to_libpq_uri(owner), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        upgrade(url)
        yield url
    finally:
        get_engine(url).dispose()
        if not keep:
            with psycopg.connect(to_libpq_uri(owner), autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
