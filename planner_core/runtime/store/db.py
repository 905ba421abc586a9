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
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from planner_core.runtime.settings import RuntimeSettings

# pgserver asks platformdirs for a runtime dir; without XDG_RUNTIME_DIR (usual in containers) platformdirs falls
# back to /tmp/runtime-<uid> and says so in two lines. The fallback works (every pgserver process shares its lock
# there), so only the notice is dropped, here, for every process that opens the embedded database: the CLI, and
# also each served tick's flow run (a subprocess) and the tests, which the CLI's own filter never reached.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

# The embedded server's login role for the planner (a member of `WRITER_ROLE`), and the role itself: migration
# 0009 grants it its privileges; it is created here too so the login can exist before the first migration.
EMBEDDED_WRITER = "planner_app"
WRITER_ROLE = "planner_writer"


class EmbeddedDatabaseError(RuntimeError):
    """The embedded Postgres cannot be started; the text is one line saying what to do."""


_INIT_PREFIX = "pg.init-"  # first initialisations in progress: <data_dir>/pg.init-<pid>


def embedded_database_url(pg_dir: Path, *, timeout_s: float | None = None) -> str:
    """Start (or attach to) the embedded Postgres under `pg_dir` and return its superuser's SQLAlchemy URL (the
    schema owner's: migrations run through it).

    The very first initialisation is atomic (`_initialise_atomically`): `pg_dir` appears only complete, so a kill
    during it leaves nothing that breaks the next run. Every wait is bounded by `timeout_s` (default: the
    `embedded_start_timeout_s` setting): the start itself, and pgserver's lock (`_pgserver_lock`).

    Raises:
        EmbeddedDatabaseError: the server under `pg_dir` does not start (one line naming the folder and its log).
    """
    import pgserver  # heavy-ish; only needed when no external database is configured

    if timeout_s is None:
        timeout_s = RuntimeSettings().embedded_start_timeout_s
    pg_dir = pg_dir.expanduser().resolve()
    pg_dir.parent.mkdir(parents=True, exist_ok=True)
    if not (pg_dir / "PG_VERSION").exists():
        _initialise_atomically(pg_dir, timeout_s)
    _forget_dead_server(pg_dir)
    try:
        if not _has_handle(pg_dir):  # a handle this process holds is handed out again without the lock
            if _postmaster_state(pg_dir) != "running":
                _start_in_child(pg_dir, timeout_s)
            with _pgserver_lock(pg_dir, timeout_s):
                _release_at_exit(pgserver.get_server(pg_dir, cleanup_mode=None))
        return to_sqlalchemy_url(pgserver.get_server(pg_dir, cleanup_mode=None).get_uri())
    except EmbeddedDatabaseError:
        raise
    except Exception as exc:  # pgserver fails with asserts and subprocess errors: one line instead
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise EmbeddedDatabaseError(
            f"the embedded database under {pg_dir} does not start ({type(exc).__name__}: {detail}); its log is "
            f"{pg_dir / 'log'}; if it holds nothing you need, remove that folder and run again to start afresh"
        ) from exc


# pgserver serialises every start, attach and handle release of every process of this user through one file lock
# (in the user's runtime dir) and waits for it without limit, at exit too; its start also polls, without limit, for
# a postmaster that may have died meanwhile. One stuck holder (or a kill -9 of Postgres during a start) would stall
# every planner command on the machine, at its start or at its exit. So: the lock is taken with a deadline before
# pgserver takes it again (a process may relock a lock it holds), a stopped server is started in a child process
# the deadline can kill, and at exit a handle is released only if the lock comes within `EXIT_LOCK_TIMEOUT_S`.
EXIT_LOCK_TIMEOUT_S = 5.0
_HANDLES_TO_RELEASE: dict[Path, object] = {}


@contextmanager
def _holding_pgserver_lock(timeout_s: float) -> Iterator[bool]:
    """Try to hold pgserver's lock for at most `timeout_s`; yields whether it is held. pgserver's own `with` inside
    relocks it and, on leaving, releases it."""
    from pgserver.postgres_server import PostgresServer

    lock = PostgresServer._lock  # the lock pgserver takes, so that its wait has a bound
    held = lock.acquire(timeout=timeout_s)
    try:
        yield held
    finally:
        if lock.acquired:  # pgserver's release inside closed the file, and with it this process's hold
            lock.release()


@contextmanager
def _pgserver_lock(pg_dir: Path, timeout_s: float) -> Iterator[None]:
    """Hold pgserver's lock, waiting at most `timeout_s`, else fail in one line naming it."""
    with _holding_pgserver_lock(timeout_s) as held:
        if not held:
            from pgserver.postgres_server import PostgresServer

            path = PostgresServer._lock.path
            raise EmbeddedDatabaseError(
                f"the embedded database under {pg_dir}: another process has held pgserver's lock {path} for over "
                f"{timeout_s:g} s (a stuck start?); `fuser {path}` names it"
            )
        yield


def _lock_holder_hint() -> str:
    """A hint naming pgserver's lock if another process holds it now, else ""."""
    from pgserver.postgres_server import PostgresServer

    lock = PostgresServer._lock
    if lock.acquire(blocking=False):
        lock.release()
        return ""
    return f"; another process holds pgserver's lock {lock.path} (`fuser {lock.path}` names it)"


def _has_handle(pg_dir: Path) -> bool:
    from pgserver.postgres_server import PostgresServer

    return pg_dir in PostgresServer._instances


def _postmaster_state(pg_dir: Path) -> str:
    """The postmaster's state: "running", "gone" (no postmaster.pid, or no such process) or "zombie" (killed, not
    yet reaped by its parent: `kill(pid, 0)` still succeeds, and Postgres refuses to start while it exists)."""
    import psutil  # a pgserver dependency

    pid = postmaster_pid(pg_dir)
    if pid is None:
        return "gone"
    try:
        status = psutil.Process(pid).status()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    return "zombie" if status == psutil.STATUS_ZOMBIE else "running"


def postmaster_pid(pg_dir: Path) -> int | None:
    """The pid in `pg_dir`'s postmaster.pid, or None."""
    try:
        return int((pg_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # no file, or a half-written one of a server killed while starting
        return None


# Run by `_start_in_child`: pgserver's start (pg_ctl, then its poll), in a process the deadline can kill.
_START_SCRIPT = """
import sys, warnings
warnings.filterwarnings("ignore")
import pgserver
pgserver.get_server(sys.argv[1], cleanup_mode=None)
"""


def _start_in_child(pg_dir: Path, timeout_s: float) -> None:
    """Start the stopped server under `pg_dir` in a child process, killed after `timeout_s` (module comment above).

    A postmaster killed but not yet reaped (a zombie) is waited for first, within the same deadline."""
    import subprocess
    import sys

    deadline = time.monotonic() + timeout_s
    while _postmaster_state(pg_dir) == "zombie":
        if time.monotonic() > deadline:
            raise EmbeddedDatabaseError(
                f"the embedded database under {pg_dir}: its killed server (pid {postmaster_pid(pg_dir)}) has not "
                f"been reaped by its parent process for {timeout_s:g} s, and Postgres cannot start while it exists"
            )
        time.sleep(0.1)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _START_SCRIPT, str(pg_dir)],
            capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise EmbeddedDatabaseError(
            f"the embedded database under {pg_dir} did not start within {timeout_s:g} s"
            + (_lock_holder_hint() or f"; its log is {pg_dir / 'log'}")
            + " (PLANNER_EMBEDDED_START_TIMEOUT_S sets the limit)"
        ) from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raise EmbeddedDatabaseError(
            f"the embedded database under {pg_dir} does not start ({lines[-1][:200] if lines else done.returncode}); "
            f"its log is {pg_dir / 'log'}; if it holds nothing you need, remove that folder and run again to start "
            "afresh"
        )


def _release_at_exit(server: object) -> None:
    """Replace pgserver's exit hook for `server` (it waits for the lock without limit) by `_release_handles`."""
    import atexit

    atexit.unregister(server._cleanup)  # type: ignore[attr-defined]
    if not _HANDLES_TO_RELEASE:
        atexit.register(_release_handles)
    _HANDLES_TO_RELEASE[server.pgdata] = server  # type: ignore[attr-defined]


def _release_handles() -> None:
    """At exit: drop this process from each server's list of handles, if pgserver's lock comes within
    `EXIT_LOCK_TIMEOUT_S`; else leave it (the list only decides which handle stops a server in pgserver's "stop"
    and "delete" modes, which the planner uses only for its pid-named staging folders)."""
    with _holding_pgserver_lock(EXIT_LOCK_TIMEOUT_S) as held:
        if not held:
            return
        for server in _HANDLES_TO_RELEASE.values():
            with suppress(Exception):  # a handle whose server was killed meanwhile: nothing left to release
                server._cleanup()  # type: ignore[attr-defined]  # mode None: list bookkeeping only


def _forget_dead_server(pg_dir: Path) -> None:
    """Drop pgserver's handle on `pg_dir` when its postmaster is gone (killed, crashed; a zombie counts as gone), so
    the next call starts the server again: pgserver hands out the handle it made first in this process without
    checking the server."""
    from pgserver.postgres_server import PostgresServer

    if _has_handle(pg_dir) and _postmaster_state(pg_dir) != "running":
        del PostgresServer._instances[pg_dir]


def _initialise_atomically(pg_dir: Path, timeout_s: float) -> None:
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
        with _pgserver_lock(staging, timeout_s):
            server = pgserver.get_server(staging, cleanup_mode="stop")
    except EmbeddedDatabaseError:
        raise
    except Exception as exc:  # as in embedded_database_url
        raise EmbeddedDatabaseError(
            f"cannot initialise the embedded database in {staging} ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); its log is {staging / 'log'}"
        ) from exc
    with _pgserver_lock(staging, timeout_s):
        server.cleanup()  # the last handle: pgserver stops the server ("stop" mode keeps the folder)
    import atexit

    atexit.unregister(server._cleanup)  # done above; at exit it would look for the renamed folder
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
        if pid_text.isdigit() and int(pid_text) != os.getpid() and process_alive(int(pid_text)):
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


def process_alive(pid: int) -> bool:
    """Whether a process `pid` exists (a zombie too; one owned by another user counts)."""
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
    pid = postmaster_pid(pg_dir)
    if pid is None:
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
    owner_url = embedded_database_url(settings.embedded_pg_dir)
    # The writer login is made once per server: a flow run resolves the URL every time (a served tick, each
    # fleet round run by a worker), and checking the roles costs a connection (a backend forked) and a DO block.
    # Keyed by the postmaster's pid too, so a server started afresh in a new folder is checked again.
    key = (owner_url, postmaster_pid(settings.embedded_pg_dir.expanduser().resolve()))
    url = _WRITER_URLS.get(key)
    if url is None:
        url = _WRITER_URLS[key] = embedded_writer_url(owner_url)
    return url


_WRITER_URLS: dict[tuple[str, int | None], str] = {}  # (owner URL, postmaster pid) -> the writer's URL


def resolve_owner_database_url(settings: RuntimeSettings | None = None) -> str:
    """What migrations run through: `PLANNER_MIGRATION_DATABASE_URL` if set, else `PLANNER_DATABASE_URL` (one
    role for both), else the embedded server's superuser."""
    settings = settings or RuntimeSettings()
    if settings.migration_database_url:
        return to_sqlalchemy_url(settings.migration_database_url)
    if settings.database_url:
        return to_sqlalchemy_url(settings.database_url)
    return embedded_database_url(settings.embedded_pg_dir)


_ENGINES: list[Engine] = []  # every engine `get_engine` made in this process, for `dispose_engines`


def dispose_engines() -> None:
    """Close the pooled connections of every engine of this process. A command calls it as it ends: connections
    left in a pool are otherwise closed by the garbage collector at exit, each with a ResourceWarning (`planner
    replay` printed two). The engines stay usable: a later query opens a new connection."""
    for engine in _ENGINES:
        engine.dispose()


@cache
def get_engine(url: str, *, lock_timeout_ms: int | None = None, statement_timeout_ms: int | None = None) -> Engine:
    """One pooled engine per URL (and timeouts) per process. Every connection works in UTC.

    `lock_timeout_ms` / `statement_timeout_ms` (Postgres' settings of those names, on every connection): a
    statement waiting longer for a lock, or running longer, fails instead of blocking its caller for as long as
    another session holds a lock (the forward-pass ingest sets them: its writes must never stall its receiving).
    """
    engine = create_engine(url, pool_pre_ping=True, future=True)
    _ENGINES.append(engine)
    settings = [("lock_timeout", lock_timeout_ms), ("statement_timeout", statement_timeout_ms)]

    @event.listens_for(engine, "connect")
    def _set_session(dbapi_connection, _record):
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
            for name, value_ms in settings:
                if value_ms is not None:
                    cursor.execute(f"SET {name} = {int(value_ms)}")  # an int: nothing to quote
        dbapi_connection.commit()

    return engine


class PlannerSession(Session):
    """The project's sessions (`session_factory` makes them). The store's session events listen on this class, not
    on SQLAlchemy's `Session`: a listener on `Session` runs for every session in the process, another library's
    (Prefect's own database sessions) included."""


def session_factory(
    url: str, *, lock_timeout_ms: int | None = None, statement_timeout_ms: int | None = None
) -> sessionmaker[PlannerSession]:
    """Sessions that never autocommit; callers own `with factory.begin():`. Timeouts as in `get_engine`."""
    if lock_timeout_ms is None and statement_timeout_ms is None:
        engine = get_engine(url)  # the same cache entry as `get_engine(url)`, which callers dispose of
    else:
        engine = get_engine(url, lock_timeout_ms=lock_timeout_ms, statement_timeout_ms=statement_timeout_ms)
    return sessionmaker(bind=engine, class_=PlannerSession, expire_on_commit=False)
