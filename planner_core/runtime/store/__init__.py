"""Postgres persistence: ORM models, engine/session set-up, embedded server, repositories, migrations runner."""
