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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from planner_core.runtime.settings import RuntimeSettings

# The embedded server's login role for the planner (a member of `WRITER_ROLE`), and the role itself: migration
# 0009 grants it its privileges; it is created here too so the login can exist before the first migration.
EMBEDDED_WRITER = "planner_app"
WRITER_ROLE = "planner_writer"


class EmbeddedDatabaseError(RuntimeError):
    """The embedded Postgres cannot be started; the text is one line saying what to do."""


_INIT_PREFIX = "pg.init-"  # first initialisations in progress: <data_dir>/pg.init-<pid>


def embedded_database_url(pg_dir: Path) -> str:
    """Start (or attach to) the embedded Postgres under `pg_dir` and return its superuser's SQLAlchemy URL (the
    schema owner's: migrations run through it).

    The very first initialisation is atomic (`_initialise_atomically`): `pg_dir` appears only complete, so a kill
    during it leaves nothing that breaks the next run.

    Raises:
        EmbeddedDatabaseError: the server under `pg_dir` does not start (one line naming the folder and its log).
    """
    import pgserver  # heavy-ish; only needed when no external database is configured

    pg_dir = pg_dir.expanduser().resolve()
    pg_dir.parent.mkdir(parents=True, exist_ok=True)
    if not (pg_dir / "PG_VERSION").exists():
        _initialise_atomically(pg_dir)
    _forget_dead_server(pg_dir)
    try:
        server = pgserver.get_server(pg_dir, cleanup_mode=None)
        return to_sqlalchemy_url(server.get_uri())
    except Exception as exc:  # noqa: BLE001 - pgserver fails with asserts and subprocess errors: one line instead
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise EmbeddedDatabaseError(
            f"the embedded database under {pg_dir} does not start ({type(exc).__name__}: {detail}); its log is "
            f"{pg_dir / 'log'}; if it holds nothing you need, remove that folder and run again to start afresh"
        ) from exc


def _forget_dead_server(pg_dir: Path) -> None:
    """Drop pgserver's handle on `pg_dir` when its postmaster is gone (killed, crashed), so the next call starts
    the server again: pgserver hands out the handle it made first in this process without checking the server."""
    from pgserver.postgres_server import PostgresServer

    handle = PostgresServer._instances.get(pg_dir)
    if handle is None:
        return
    pid_file = pg_dir / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        del PostgresServer._instances[pg_dir]  # no pid file, or no such process: the server is down


def _initialise_atomically(pg_dir: Path) -> None:
    """Create the database cluster in `<parent>/pg.init-<pid>`, start and stop it once, then rename it to `pg_dir`.

    A kill at any moment before the rename leaves only a `pg.init-*` folder, which the next first initialisation
    stops and removes (the folders of live processes are left alone); a kill after it leaves a complete cluster.
    pgserver itself would initialise `pg_dir` in place, and a kill in that first second left a folder it later
    took for a cluster and failed on for good.
    """
    import shutil

    import pgserver

    _remove_abandoned_initialisations(pg_dir.parent)
    if pg_dir.exists() and not any(pg_dir.iterdir()):
        pg_dir.rmdir()  # an empty folder (made by hand, or by a pgserver killed before initdb): nothing to keep
    if pg_dir.exists():
        return  # holds something: let pgserver decide, and say so in one line if it cannot start it
    staging = pg_dir.parent / f"{_INIT_PREFIX}{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        server = pgserver.get_server(staging, cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 - as in embedded_database_url
        raise EmbeddedDatabaseError(
            f"cannot initialise the embedded database in {staging} ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); its log is {staging / 'log'}"
        ) from exc
    server.cleanup()  # the last handle: pgserver stops the server ("stop" mode keeps the folder)
    import atexit

    atexit.unregister(server._cleanup)  # noqa: SLF001 - done above; at exit it would look for the renamed folder
    _stop_servers_of(staging)  # already stopped, unless another process attached to it meanwhile
    try:
        staging.rename(pg_dir)
    except OSError:  # another process finished its first initialisation first: use its cluster, drop ours
        shutil.rmtree(staging, ignore_errors=True)


def _remove_abandoned_initialisations(parent: Path) -> None:
    """Stop and remove the `pg.init-<pid>` folders whose process is gone (killed during a first initialisation)."""
    import shutil

    for staging in parent.glob(f"{_INIT_PREFIX}*"):
        pid_text = staging.name.removeprefix(_INIT_PREFIX)
        if pid_text.isdigit() and int(pid_text) != os.getpid() and _process_alive(int(pid_text)):
            continue
        _stop_servers_of(staging)
        shutil.rmtree(staging, ignore_errors=True)


def _stop_servers_of(pg_dir: Path) -> None:
    """Stop the postgres processes serving `pg_dir`, found by their command line (a killed start-up can leave a
    postmaster.pid whose pid has been reused by an unrelated process, so that file is not trusted here)."""
    import psutil  # a pgserver dependency

    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(pg_dir) in " ".join(proc.info["cmdline"] or ()):
            try:
                proc.terminate()
                proc.wait(5)
            except psutil.TimeoutExpired:
                with suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
                    proc.kill()
                    proc.wait(10)  # gone before its folder is removed or reused
            except psutil.NoSuchProcess:
                pass


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


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
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):  # a half-written file of a server killed while starting
        return False
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


@contextmanager
def scratch_database(prefix: str, *, keep: bool = False) -> Iterator[str]:
    """A fresh, migrated database `<prefix>_<random>` on the planner's Postgres server (made through the owner's
    URL), for one benchmark run; dropped afterwards unless `keep`. Yields its SQLAlchemy URL."""
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    from planner_core.runtime.store.migrate import upgrade

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
    if lock_timeout_ms is None and statement_timeout_ms is None:
        engine = get_engine(url)  # the same cache entry as `get_engine(url)`, which callers dispose of
    else:
        engine = get_engine(url, lock_timeout_ms=lock_timeout_ms, statement_timeout_ms=statement_timeout_ms)
    return sessionmaker(bind=engine, expire_on_commit=False)
