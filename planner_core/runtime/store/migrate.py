"""Run the Alembic migrations in `migrations/` (beside this module, shipped with the package) against a database
URL (used by the CLI, flows and tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

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

    from planner_core.runtime.store.db import get_engine

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
