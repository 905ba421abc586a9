"""Secrets never reach the record: after runs with a password in the database URL and in the Prometheus URL,
neither password is in any table of the planner's database, in Prefect's database or in the logs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from planner_core.runtime.redact import redact_text, redact_value
from planner_core.runtime.store.db import to_libpq_uri, to_sqlalchemy_url
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.databases import create_login, drop_login

DB_SECRET = "Db5ecret-7f3a"
# an unencoded "@" in it (URL clients take it: the user-info ends at the last "@"), as in issue 43's leak
PROM_SECRET = "p@ss-Zq9Secret"

pytestmark = pytest.mark.prefect


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("http://user:secret@host:9090/api", "http://user:***@host:9090/api"),
        ("postgresql+psycopg://planner:p%40ss@db:5432/planner", "postgresql+psycopg://planner:***@db:5432/planner"),
        ("ConnectError: http://u:s3@h: [Errno 111]", "ConnectError: http://u:***@h: [Errno 111]"),
        ("host=db user=planner password=hunter2 dbname=x", "host=db user=planner password=*** dbname=x"),
        ("http://host:9090/api?x=1", "http://host:9090/api?x=1"),
        ("http://user@host/path", "http://user@host/path"),
        ("http://prom-user:p@ss-Zq9Secret@127.0.0.1:1", "http://prom-user:***@127.0.0.1:1"),
        ("http://u:pa/ss?x#y@h:1/api", "http://u:***@h:1/api"),
        ("prom-user:p@ss@127.0.0.1:9090: refused", "prom-user:***@127.0.0.1:9090: refused"),
        ("http://h:9090/api?query=up&token=T0k3n", "http://h:9090/api?query=up&token=***"),
        ("GET /x?access_token=abc&api-key=def&sig=ghi", "GET /x?access_token=***&api-key=***&sig=***"),
        ("host=db password='a b\\' c' dbname=x", "host=db password=*** dbname=x"),
        ("max_tokens=512 cache_key=k3 signal=9", "max_tokens=512 cache_key=k3 signal=9"),
    ],
)
def test_redact_text_masks_passwords_only(text: str, redacted: str) -> None:
    assert redact_text(text) == redacted


def test_redact_value_walks_json() -> None:
    value = {"problem": ["http://a:b@h", {"url": "x password=y"}], "n": 3, "token": "abc", "num_tokens": "12"}
    assert redact_value(value) == {
        "problem": ["http://a:***@h", {"url": "x password=***"}],
        "n": 3,
        "token": "***",
        "num_tokens": "12",
    }


def test_log_records_are_redacted_before_any_handler(caplog) -> None:
    """`install_log_redaction`: a message, its arguments and its traceback reach every handler masked."""
    import logging

    from planner_core.runtime.redact import install_log_redaction

    install_log_redaction()
    log = logging.getLogger("planner.test_secrets")
    with caplog.at_level(logging.WARNING, logger="planner.test_secrets"):
        log.warning("cannot reach %s", f"http://u:{PROM_SECRET}@h:1")
        try:
            raise ConnectionError(f"http://u:{PROM_SECRET}@h:1 refused")
        except ConnectionError:
            log.exception("failed")
    assert PROM_SECRET not in caplog.text and "http://u:***@h:1" in caplog.text
    assert "ConnectionError" in caplog.text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _table_text(url: str) -> dict[str, str]:
    """Every table of the planner's database as text, one string per table (read as the owner); planner states
    decompressed too (deltas and, since migration 0020, whole states are stored zlib-compressed)."""
    import json

    from planner_core.runtime.store.state_delta import decode_delta

    with psycopg.connect(to_libpq_uri(url)) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        text = {table: "\n".join(r[0] for r in conn.execute(f'SELECT t::text FROM "{table}" t')) for table in tables}
        deltas = conn.execute("SELECT delta FROM planner_states WHERE delta IS NOT NULL").fetchall()
        assert deltas  # the states the run stored: read back as text below
        text["planner_states"] += "".join("\n" + json.dumps(decode_delta(bytes(d))) for (d,) in deltas)
        return text


def _files_holding(folder: Path, secrets: tuple[str, ...]) -> list[str]:
    """Files under `folder` whose bytes contain any of `secrets` (Prefect's SQLite database, its WAL, logs)."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.name}: {secret}" for secret in secrets if secret.encode() in data]
    return found


def test_no_secret_reaches_tables_prefect_or_logs(database_url, prefect_api_url, tmp_path, azure_conv_trace) -> None:
    """`planner demo` and a Prometheus throughput tick, both as a password-holding login in planner_writer and
    with user:password in the Prometheus URL; both run their flows on the session's Prefect server and ship their
    logs there. Then grep every table, every file of that server's home (its SQLite database, WAL and logs) and
    the captured output for both passwords."""
    writer_url, login = create_login(database_url, "planner_writer", DB_SECRET)
    prefect_home = Path(os.environ["PREFECT_HOME"])  # the session server's home (tests/conftest.py)
    config = write_config(tmp_path, report_output_dir="reports")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PLANNER_"))}
    env |= {
        "PLANNER_DATABASE_URL": to_sqlalchemy_url(writer_url),
        "PLANNER_MIGRATION_DATABASE_URL": database_url,
        "PLANNER_PROMETHEUS_ENDPOINT": f"http://prom-user:{PROM_SECRET}@127.0.0.1:{_closed_port()}",
        "PLANNER_PROMETHEUS_TIMEOUT_S": "2",
        "PLANNER_DATA_DIR": str(tmp_path / "data"),
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_API_URL": prefect_api_url,
        "PREFECT_LOGGING_TO_API_ENABLED": "true",
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    try:
        demo = subprocess.run(
            [sys.executable, "-m", "planner_cli.main", "demo", "--trace", str(azure_conv_trace), "--config",
             str(config), "--deployment", "secrets-demo", "--max-windows", "3"],
            env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert demo.returncode == 0, demo.stderr[-3000:]
        tick = (
            "from flows.prefect_server import prefect_api\n"
            "with prefect_api():\n"
            "    from flows.ticks import throughput_tick\n"
            f"    print(throughput_tick(deployment='secrets-prom', config_path={str(config)!r}))\n"
        )
        prom = subprocess.run(
            [sys.executable, "-c", tick], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
        )
        assert prom.returncode == 0, prom.stderr[-3000:]
    finally:
        drop_login(database_url, login)
    tables = _table_text(database_url)
    # the runs did go through the paths that used to leak: ticks written by the login, the tick that could not
    # reach Prometheus audited with the endpoint (its password masked) and warned about in the log
    assert "ticks recorded 3" in demo.stdout
    assert "prom-user:***@127.0.0.1" in tables["audit_log"]
    assert "no traffic data" in prom.stdout + prom.stderr
    secrets = (DB_SECRET, PROM_SECRET)
    leaks = [f"table {name}: {s}" for name, body in tables.items() for s in secrets if s in body]
    leaks += [f"prefect {hit}" for hit in _files_holding(prefect_home, secrets)]
    leaks += [f"reports {hit}" for hit in _files_holding(tmp_path / "reports", secrets)]
    output = demo.stdout + demo.stderr + prom.stdout + prom.stderr
    leaks += [f"output: {s}" for s in secrets if s in output]
    assert leaks == []
    assert any(path.suffix == ".db" for path in prefect_home.rglob("*")), "the Prefect database was not found"


def test_an_audit_detail_is_stored_redacted(database_url) -> None:
    """Whatever a caller puts in an audit detail, the row holds no password (repository.audit redacts)."""
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        repo.audit(session, "secret_probe", {"problem": f"unreachable: http://u:{PROM_SECRET}@h:9090: refused"})
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        [(detail,)] = conn.execute("SELECT detail::text FROM audit_log WHERE event = 'secret_probe'").fetchall()
    assert PROM_SECRET not in detail and "http://u:***@h:9090" in detail


def test_traffic_unavailable_redacts_its_detail() -> None:
    """A source's error quoting its endpoint carries the endpoint without the password."""
    from planner_core.runtime.sources.base import NoTrafficDataKind, TrafficUnavailable

    exc = TrafficUnavailable(NoTrafficDataKind.UNREACHABLE, f"http://u:{PROM_SECRET}@h: ConnectError")
    assert PROM_SECRET not in exc.detail and PROM_SECRET not in str(exc)


def test_no_flow_or_task_takes_the_database_url() -> None:
    """Prefect keeps flow parameters: none of ours is a database URL in clear (the fleet's flow takes it as a
    `SecretStr`, which Prefect stores as `**********`; task parameters are not stored)."""
    import inspect
    import typing

    from prefect import Flow
    from pydantic import SecretStr

    from flows import demo, fleet, replay, report, serve, ticks

    for module in (demo, replay, report, serve, ticks):
        for name, value in vars(module).items():
            fn = getattr(value, "fn", None)  # a Prefect flow or task
            if fn is not None and callable(fn) and getattr(value, "__module__", "") == module.__name__:
                params = inspect.signature(fn).parameters
                assert "database_url" not in params and "url" not in params, f"{module.__name__}.{name}"
    flows = [value for value in vars(fleet).values() if isinstance(value, Flow)]
    assert flows
    for each in flows:
        hints = typing.get_type_hints(each.fn)
        for param in inspect.signature(each.fn).parameters:
            if "url" in param:
                assert SecretStr in typing.get_args(hints[param]), f"{each.name}: {param} is {hints[param]}"
    assert each.serialize_parameters({"database_url": SecretStr(f"postgresql://u:{DB_SECRET}@h/db")}) == {
        "database_url": "**********"
    }
