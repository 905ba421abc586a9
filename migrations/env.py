"""Alembic environment: migrates the database named by the caller (or PLANNER_DATABASE_URL / embedded)."""

from alembic import context
from sqlalchemy import pool

from planner_core.runtime.store.db import get_engine, resolve_database_url
from planner_core.runtime.store.models import Base
from planner_core.runtime.store.partitions import include_name, include_object

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    url = config.attributes.get("database_url") or resolve_database_url()
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            include_name=include_name,
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = get_engine(url)
    with engine.connect() as conn:
        context.configure(
            connection=conn,
            target_metadata=target_metadata,
            compare_type=True,
            include_name=include_name,
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
_ = pool  # pool imported for alembic templates that expect it
