"""Bounded input and clean failure (issue 21): config and trace limits, one-line errors, nothing half-written."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from planner_core.config import MAX_CONFIG_DEPTH, MAX_REPLICAS, ConfigError, load_config, parse_config
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.traces import MAX_REQUEST_TOKENS, MAX_TRACE_SPAN_S, TraceError, load_trace
from tests.conftest import REPO_ROOT, write_config


def planner(*args: str, env: dict[str, str] | None = None, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


# ---------------------------------------------------------------------------------------------------------
# Config: sane maxima, floors against the budget, no booleans or text taken for numbers
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        ({"min_endpoint": 2**40}, "min_endpoint", f"must be <= {MAX_REPLICAS}"),
        ({"min_endpoint": 1_000_000, "max_gpu_budget": -1}, "min_endpoint", f"must be <= {MAX_REPLICAS}"),
        ({"min_endpoint": 5}, "min_endpoint", "need 10 GPUs > max_gpu_budget (8)"),
        ({"decode_min_endpoint": 3, "decode_engine_num_gpu": 4}, "decode_min_endpoint", "need 13 GPUs"),
        ({"mode": "agg", "min_endpoint": 3, "decode_engine_num_gpu": 4}, "min_endpoint", "need 12 GPUs"),
        ({"max_gpu_budget": 2**40}, "max_gpu_budget", "must be <="),
        ({"max_throughput_scaling_replicas": 10**9}, "max_throughput_scaling_replicas", "must be <="),
        ({"itl_ms": True}, "itl_ms", "must be a number"),
        ({"ttft": "500"}, "ttft_ms", "must be a number"),
        ({"ttft_ms": 1e308}, "ttft_ms", "must be <="),
        ({"min_endpoint": False}, "min_endpoint", "must be an integer"),
        ({"max_num_fpm_samples": 10**12}, "max_num_fpm_samples", "must be <="),
        ({"scheduling": {"tick_max_duration_seconds": 1e300}}, "scheduling.tick_max_duration_seconds", "must be <="),
        ({"execution_interval_seconds": True}, "execution_interval_seconds", "must be a number"),
    ],
    ids=lambda v: str(v)[:40] if isinstance(v, dict) else None,
)
def test_config_values_are_bounded_and_typed(data: dict, field: str, fragment: str) -> None:
    """Each bad value is one line naming the source, the field, the value and the bound."""
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "bad.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("bad.yaml: field ")
    assert caught.value.field == field
    assert fragment in message


@pytest.mark.parametrize(
    "data",
    [
        {"min_endpoint": 4},  # 4P + 4D = 8 GPUs: exactly the default budget
        {"min_endpoint": MAX_REPLICAS, "max_gpu_budget": -1},
        {"load_adjustment_interval_seconds": 60.0, "throughput_adjustment_interval_seconds": 180},  # whole floats
        {"mode": "prefill", "prefill_min_endpoint": 8},  # only the managed pool counts
        {"ttft_ms": 500},  # an integer is a number
    ],
)
def test_config_values_at_the_bounds_load(data: dict) -> None:
    parse_config(data, "ok.yaml")


def test_deep_or_aliased_configs_are_one_line(tmp_path: Path) -> None:
    """Nesting that exhausts the parser's stack, and an alias bomb that validation would expand, are refused."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("plugins: {settings: {x: " + "[" * 5000 + "]" * 5000 + "}}\n")
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_CONFIG_DEPTH}"):
        load_config(deep)
    lines = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for name, previous in zip("bcdefg", "abcdef", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="more than"):
        load_config(bomb)


def test_demo_with_a_floor_over_the_budget_writes_nothing(database_url: str, tmp_path: Path) -> None:
    """Floors the budget cannot hold are a config error before anything is written (no `deployments` row)."""
    config = write_config(tmp_path, min_endpoint=9)  # 9P + 9D = 18 GPUs > max_gpu_budget 16
    result = planner(
        "demo", "--config", str(config), "--deployment", "floors", "--max-windows", "1",
        env={"PLANNER_DATABASE_URL": database_url},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("planner: error:")]
    assert errors == [
        f"planner: error: {config}: field 'min_endpoint' = 9: the minimum endpoints need 18 GPUs > max_gpu_budget (16)"
    ]
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM deployments")]
    assert "floors" not in names


# ---------------------------------------------------------------------------------------------------------
# Traces: token counts and timestamps bounded
# ---------------------------------------------------------------------------------------------------------


def _mooncake(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"timestamp": 0, "input_length": 1e308, "output_length": 10}, "field 'input_length' = 1e+308 is over"),
        ({"timestamp": 0, "input_length": 10, "output_length": MAX_REQUEST_TOKENS + 1}, "field 'output_length'"),
        ({"timestamp": 1e308, "input_length": 10, "output_length": 10}, "field 'timestamp' = 1e+308 is over"),
        # issue 43: `true` was a 1-token request, "7" seven tokens
        ({"timestamp": 0, "input_length": True, "output_length": 10}, "field 'input_length' = true is not a number"),
        ({"timestamp": 0, "input_length": 10, "output_length": "7"}, "field 'output_length' = \"7\" is not a number"),
        ({"timestamp": None, "input_length": 10, "output_length": 7}, "field 'timestamp' = null is not a number"),
        ({"input_length": 10, "output_length": 7}, "field 'timestamp' is missing"),
    ],
)
def test_mooncake_values_are_bounded(tmp_path: Path, record: dict, fragment: str) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 5}, record])
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}: line 2 ")
    assert fragment in str(caught.value)


def _dynamo(received_ms: float, input_length: float, output_tokens: float) -> dict:
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "request": {
            "request_received_ms": received_ms,
            "output_tokens": output_tokens,
            "replay": {"input_length": input_length},
        },
    }


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        (_dynamo(1e308, 10, 10), "field 'request.request_received_ms' = 1e+308 is over"),
        (_dynamo(1_700_000_000_000, 10**300, 10), "field 'request.replay.input_length'"),
        (_dynamo(1_700_000_000_000 + MAX_TRACE_SPAN_S * 1000 + 1000, 10, 10), "a trace may span at most"),
    ],
)
def test_dynamo_values_are_bounded(tmp_path: Path, record: dict, fragment: str) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [_dynamo(1_700_000_000_000, 5, 5), record])
    with pytest.raises(TraceError, match=re.escape(fragment)):
        load_trace(path)


def test_azure_values_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,10,10\n2024-05-10 00:00:01,1e308,10\n"
    )
    with pytest.raises(TraceError, match=r"row 3 field 'ContextTokens' = 1e\+308 is over 10000000 tokens"):
        load_trace(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:00,10,10\n2024-05-10 00:00:01,1,1\n")
    with pytest.raises(TraceError, match="row 3 arrives .* a trace may span at most"):
        load_trace(path)


def test_azure_whole_second_timestamps_keep_their_duration(tmp_path: Path) -> None:
    """pandas parses whole-second stamps at microsecond resolution; the trace must still span 1 s, not 1 ms."""
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,10,10\n2024-05-10 00:00:01,1,1\n")
    trace = load_trace(path)
    assert trace.duration_s == 1.0
    assert trace.start_epoch_s == 1_715_299_200.0


# ---------------------------------------------------------------------------------------------------------
# Prometheus: an overall deadline per query, against a real slow-dripping server
# ---------------------------------------------------------------------------------------------------------


class DrippingServer:
    """A real TCP server that answers an HTTP request one byte every `gap_s`: headers first (`drip_headers`) or a
    prompt header and then a body that never ends. Each gap is shorter than the client's read timeout."""

    def __init__(self, *, gap_s: float, drip_headers: bool) -> None:
        import socket
        import threading

        self.gap_s, self.drip_headers = gap_s, drip_headers
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        import threading

        self.listener.settimeout(0.1)
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by `close`
                break
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn) -> None:
        import time

        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        try:
            conn.recv(65536)
            if not self.drip_headers:
                conn.sendall(head)
            payload = head if self.drip_headers else b" " * 100000
            for byte in payload:
                if self.stopped.is_set():
                    break
                conn.sendall(bytes([byte]))
                time.sleep(self.gap_s)
        except OSError:
            pass  # the client cut the connection: what the deadline is for
        finally:
            conn.close()

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


@pytest.mark.parametrize("drip_headers", [False, True], ids=["dripping-body", "dripping-headers"])
def test_prometheus_query_has_an_overall_deadline(drip_headers: bool) -> None:
    """A server sending a byte every 0.2 s (each read well inside the 1 s timeout) cannot hold a query past its
    1 s deadline: the query ends as `unreachable` within ~1 s, not when the server stops."""
    import datetime as dt
    import time

    from planner_core.runtime.sources.base import NoTrafficDataKind, TrafficUnavailable
    from planner_core.runtime.sources.prometheus import PrometheusOptions, PrometheusTrafficSource, TrafficQueries

    server = DrippingServer(gap_s=0.2, drip_headers=drip_headers)
    try:
        at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        with PrometheusTrafficSource(PrometheusOptions(endpoint=server.url, timeout_s=1.0), TrafficQueries()) as source:
            started = time.monotonic()
            with pytest.raises(TrafficUnavailable, match="1 s query deadline") as info:
                source.query("up", at)
            elapsed_s = time.monotonic() - started
    finally:
        server.close()
    assert info.value.kind == NoTrafficDataKind.UNREACHABLE
    assert elapsed_s < 1.8, elapsed_s


# ---------------------------------------------------------------------------------------------------------
# /metrics: loopback by default, one Postgres read per cache period however often it is scraped
# ---------------------------------------------------------------------------------------------------------


def test_metrics_listen_on_loopback_unless_told(database_url: str) -> None:
    import socket

    from planner_core.runtime.metrics import start_metrics_server
    from planner_core.runtime.settings import RuntimeSettings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, thread = start_metrics_server(port, database_url, "nobody")
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert RuntimeSettings().metrics_bind == "127.0.0.1"  # what `planner serve` passes unless PLANNER_METRICS_BIND


def test_every_server_listens_on_loopback_unless_told(database_url: str) -> None:
    """Each command-line option naming a listening address defaults to loopback (or to a setting that does), and
    `planner keda-scaler` started with no --host listens on 127.0.0.1 only (issue 43: it listened on every
    interface)."""
    from planner_cli.main import build_parser
    from planner_cli.parser import walk_parsers
    from planner_core.runtime.keda.scaler import KedaScaler, start_server
    from planner_core.runtime.settings import RuntimeSettings

    listening = {"--host", "--addr", "--bind"}
    defaults = {
        f"{parser.prog} {action.option_strings[-1]}": action.default
        for parser in walk_parsers(build_parser())
        for action in parser._actions
        if listening & set(action.option_strings)
    }
    assert {"planner keda-scaler --host", "planner route-proxy --host", "planner sim-exporter --addr"} <= set(defaults)
    settings = RuntimeSettings()
    for name, default in defaults.items():
        default = default or settings.fpm_bind  # `planner ingest --bind`: unset, PLANNER_FPM_BIND
        assert default in ("127.0.0.1", "tcp://127.0.0.1:20380"), (name, default)
    server, port = start_server(KedaScaler(database_url), port=0)
    try:
        assert _listening_addresses(port) == {"127.0.0.1"}
    finally:
        server.stop(grace=0)


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port`, from the kernel's tables (/proc/net/tcp, tcp6)."""
    import ipaddress

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address_hex, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address_hex)
                # the kernel prints each 32-bit word in host (little-endian) order
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(words)
                mapped = getattr(address, "ipv4_mapped", None)
                found.add(str(mapped or address))
    return found


def test_metrics_scrapes_share_one_database_read_per_cache_period(database_url: str) -> None:
    """30 scrapes within the cache period run the snapshot's SQL once; a read after the period runs it again."""
    import socket

    import httpx
    from sqlalchemy import event

    from planner_core.runtime.metrics import PlannerCollector, start_metrics_server
    from planner_core.runtime.store.db import get_engine, session_factory

    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        if "%(deployment)s" in statement:  # the snapshot's queries, not the pool's connection set-up and pings
            statements.append(statement)

    engine = get_engine(database_url)
    event.listen(engine, "before_cursor_execute", count)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server, thread = start_metrics_server(port, database_url, "nobody", cache_s=600.0)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
        per_read = len(statements)
        assert per_read > 0
        for _ in range(29):
            assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
        assert len(statements) == per_read
        # the period, on a clock the test moves
        now = [0.0]
        collector = PlannerCollector(session_factory(database_url), "nobody", cache_s=5.0, clock=lambda: now[0])
        for at_s in (0.0, 1.0, 4.9, 5.0, 9.9, 10.0):
            now[0] = at_s
            list(collector.collect())
        assert collector.num_reads == 3  # at 0, 5 and 10
        assert len(statements) == 4 * per_read
    finally:
        event.remove(engine, "before_cursor_execute", count)
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# ---------------------------------------------------------------------------------------------------------
# FPM ingest: a locked table cannot stall the socket or grow memory
# ---------------------------------------------------------------------------------------------------------


def test_fpm_ingest_with_its_table_locked_stays_bounded_and_counts_drops(database_url: str, tmp_path: Path) -> None:
    """Another session holds an exclusive lock on `fpm_samples` while 4000 messages arrive: the ingest's writes
    time out instead of blocking, it keeps draining the socket (every message received), at most `max_pending`
    samples wait in memory and the rest are counted as lost; once the lock goes, what waited is stored."""
    import threading
    import time

    from planner_core.domain import Component, ForwardPassMetrics, ScheduledRequests
    from planner_core.runtime.ingest import FpmIngest, FpmPublisher
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.db import session_factory

    config_path = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)
    with session_factory(database_url).begin() as session:
        deployment_id = repo.ensure_deployment(session, "locked", load_config(config_path).policy).id
    max_pending, num_sent = 500, 4000
    ingest = FpmIngest(
        database_url, deployment_id, bind=["tcp://127.0.0.1:*"], flush_interval_s=0.05, max_pending=max_pending,
        lock_timeout_s=0.2, statement_timeout_s=1.0,
    )  # fmt: skip
    stop = threading.Event()
    runner = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
    locker = psycopg.connect(to_libpq_uri(database_url))
    try:
        locker.execute("LOCK TABLE fpm_samples IN ACCESS EXCLUSIVE MODE")  # psycopg opened a transaction
        runner.start()
        most_pending = 0
        with FpmPublisher(ingest.endpoints[0]) as publisher:
            assert publisher.wait_for_subscriber()
            for counter in range(num_sent):
                publisher.publish(
                    ForwardPassMetrics(
                        component=Component.DECODE, worker_id="w", counter_id=counter, wall_time_s=0.01,
                        scheduled=ScheduledRequests(num_decode_requests=1),
                    )
                )  # fmt: skip
                if counter % 50 == 0:
                    most_pending = max(most_pending, ingest.num_pending)
                    time.sleep(0.005)
            deadline = time.monotonic() + 30
            while ingest.stats.received < num_sent and time.monotonic() < deadline:
                most_pending = max(most_pending, ingest.num_pending)
                time.sleep(0.01)
        assert ingest.stats.received == num_sent  # the socket kept being drained while the table was locked
        assert most_pending <= max_pending
        assert ingest.stats.db_errors > 0 and ingest.stats.stored == 0
        assert ingest.stats.lost_pending >= num_sent - max_pending  # every drop counted
        assert ingest.stats.lost_pending + ingest.num_pending == num_sent
    finally:
        locker.rollback()
        locker.close()
    deadline = time.monotonic() + 60
    while ingest.stats.stored + ingest.stats.lost_pending < num_sent and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    runner.join(timeout=30)
    assert not runner.is_alive()
    assert ingest.stats.stored + ingest.stats.lost_pending == num_sent
    assert 0 < ingest.stats.stored <= max_pending


# ---------------------------------------------------------------------------------------------------------
# The embedded database: a kill during the very first initialisation does not break it for good
# ---------------------------------------------------------------------------------------------------------

_START_EMBEDDED = """
import sys
from pathlib import Path
import psycopg
from planner_core.runtime.store.db import embedded_database_url, to_libpq_uri
url = embedded_database_url(Path(sys.argv[1]))
with psycopg.connect(to_libpq_uri(url)) as conn:
    print(conn.execute("SELECT 41 + 1").fetchone()[0])
"""


def _stop_test_servers(folder: Path) -> None:
    """Stop the postgres processes this test started (their command line names its folder)."""
    import psutil

    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(folder) in " ".join(proc.info["cmdline"] or ()):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


def _first(pattern: str, folder: Path) -> Path | None:
    return next(iter(folder.glob(pattern)), None)


@pytest.mark.parametrize(
    ("kill_point", "pattern", "delay_s"),
    [
        ("initdb-started", "*/PG_VERSION", 0.0),  # initdb writes PG_VERSION first, then the rest of the cluster
        ("initdb-running", "*/PG_VERSION", 0.3),
        ("first-start", "*/postmaster.pid", 0.0),
    ],
    ids=lambda value: value if isinstance(value, str) and "/" not in value else "",
)
def test_kill_during_first_initialisation_does_not_break_the_embedded_database(
    tmp_path: Path, kill_point: str, pattern: str, delay_s: float
) -> None:
    """kill -9 of the first command to start the embedded database and of its children (initdb, pg_ctl: the
    whole process group, as a container stop does), at a point of its first initialisation;
    the next start works and answers a query instead of failing for good."""
    import signal
    import time

    data_dir = tmp_path / "data"
    pg_dir = data_dir / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        first = subprocess.Popen(
            [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while data_dir.exists() is False or _first(pattern, data_dir) is None:
            assert time.monotonic() < deadline and first.poll() is None, f"{kill_point} never reached"
            time.sleep(0.005)
        time.sleep(delay_s)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        second = subprocess.run(
            [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        assert second.stdout.strip() == "42"
    finally:
        _stop_test_servers(tmp_path)


_RESTART_EMBEDDED = """
import os, signal, sys, time
from pathlib import Path
import psycopg
from planner_core.runtime.store.db import embedded_database_url, to_libpq_uri
pg_dir = Path(sys.argv[1])
embedded_database_url(pg_dir)
pid = int((pg_dir / "postmaster.pid").read_text().split()[0])
os.kill(pid, signal.SIGKILL)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
        time.sleep(0.05)
    except OSError:
        break
url = embedded_database_url(pg_dir)  # the same process asks again, as a long-running command does
with psycopg.connect(to_libpq_uri(url)) as conn:
    print(conn.execute("SELECT 41 + 1").fetchone()[0])
"""


def test_a_killed_embedded_server_is_started_again_by_the_same_process(tmp_path: Path) -> None:
    """kill -9 of the embedded Postgres under a process that started it: that process's next request for the
    database starts the server again (crash recovery) instead of handing out the dead server's address (found by a
    chaos run whose demo finished before it noticed the kill: the comparison then failed with "connection refused")."""
    pg_dir = tmp_path / "data" / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        run = subprocess.run(
            [sys.executable, "-c", _RESTART_EMBEDDED, str(pg_dir)], env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.strip() == "42"
    finally:
        _stop_test_servers(tmp_path)


# pgserver's machine-wide lock: a process holding it does not stall another command's exit or start for good.
# Every wait on it is bounded (found by a chaos run: a demo that had printed its summary did not exit while another
# process on the machine held that lock, and was counted hung).

_HOLD_PGSERVER_LOCK = """
import sys, time
from pgserver.postgres_server import PostgresServer
assert PostgresServer._lock.acquire(timeout=30)
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
"""

_ATTACH_THEN_EXIT_ON_INPUT = """
import sys
from pathlib import Path
from planner_core.runtime.store.db import embedded_database_url
embedded_database_url(Path(sys.argv[1]))
print("attached", flush=True)
sys.stdin.readline()
"""


def _hold_pgserver_lock(env: dict[str, str], seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_PGSERVER_LOCK, str(seconds)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    return holder


def test_exit_is_not_held_by_another_process_holding_pgservers_lock(tmp_path: Path) -> None:
    """A command attached to the embedded database exits within the exit bound while another process holds
    pgserver's lock (pgserver's own exit hook waits for that lock without limit)."""
    import time

    from planner_core.runtime.store.db import EXIT_LOCK_TIMEOUT_S

    pg_dir = tmp_path / "data" / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = subprocess.Popen(
        [sys.executable, "-c", _ATTACH_THEN_EXIT_ON_INPUT, str(pg_dir)], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    holder = None
    try:
        assert command.stdout is not None and command.stdout.readline().strip() == "attached"
        holder = _hold_pgserver_lock(env, 120)
        asked_at = time.monotonic()
        command.communicate("exit\n", timeout=EXIT_LOCK_TIMEOUT_S + 60)
        assert command.returncode == 0
        # the bound plus the interpreter's own exit; pgserver's hook would wait the holder's 120 s
        assert time.monotonic() - asked_at < EXIT_LOCK_TIMEOUT_S + 30
    finally:
        for process in (command, holder):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        _stop_test_servers(tmp_path)


def test_start_fails_in_one_line_when_pgservers_lock_stays_held(tmp_path: Path) -> None:
    """Starting a stopped embedded database while another process holds pgserver's lock past
    PLANNER_EMBEDDED_START_TIMEOUT_S ends in one line naming the lock, instead of waiting for as long as it is held."""
    pg_dir = tmp_path / "data" / "pg"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.run(
        [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env, capture_output=True, text=True, timeout=180
    )
    assert first.returncode == 0, first.stderr[-3000:]
    _stop_test_servers(tmp_path)
    holder = _hold_pgserver_lock(env, 120)
    try:
        second = subprocess.run(
            [sys.executable, "-c", _START_EMBEDDED, str(pg_dir)], env=env | {"PLANNER_EMBEDDED_START_TIMEOUT_S": "2"},
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert second.returncode != 0
        last = second.stderr.strip().splitlines()[-1]
        assert "EmbeddedDatabaseError" in last and "within 2 s; another process holds pgserver's lock" in last, last
    finally:
        holder.kill()
        holder.wait(timeout=30)
        _stop_test_servers(tmp_path)


def test_a_zombie_postmaster_counts_as_gone(tmp_path: Path) -> None:
    """A killed postmaster its parent has not reaped yet answers kill(pid, 0) but is dead: the process drops its
    handle and waits for it to go before starting a new one (Postgres refuses to start while that pid exists)."""
    from planner_core.runtime.store.db import _postmaster_state

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        import time

        import psutil

        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not waited for: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (tmp_path / "postmaster.pid").write_text(f"{child.pid}\n{tmp_path}\n")
        assert _postmaster_state(tmp_path) == "zombie"
        (tmp_path / "postmaster.pid").write_text(f"{os.getpid()}\n{tmp_path}\n")
        assert _postmaster_state(tmp_path) == "running"
    finally:
        child.wait(timeout=30)
    (tmp_path / "postmaster.pid").write_text(f"{child.pid}\n{tmp_path}\n")
    assert _postmaster_state(tmp_path) == "gone"  # reaped: no such process
    (tmp_path / "postmaster.pid").unlink()
    assert _postmaster_state(tmp_path) == "gone"


# ---------------------------------------------------------------------------------------------------------
# Prefect lost mid-run: `planner demo` ends in one line with a non-zero status, within the configured time
# ---------------------------------------------------------------------------------------------------------


def test_demo_ends_in_one_line_when_its_prefect_server_dies(database_url: str, tmp_path: Path) -> None:
    """kill -9 of the Prefect server the demo started, once the run is under way: the demo exits non-zero with one
    error line within PLANNER_PREFECT_LOST_S plus a margin, instead of retrying the dead server for minutes."""
    import queue
    import threading
    import time

    import psutil

    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env |= {
        "PLANNER_DATABASE_URL": database_url,
        "PLANNER_DATA_DIR": str(tmp_path / "data"),
        "PLANNER_PREFECT_LOST_S": "10",
    }
    demo = subprocess.Popen(
        [sys.executable, "-m", "planner_cli.main", "demo", "--deployment", "prefect-lost"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in demo.stderr], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("Prefect API:") for line in seen):
            assert time.monotonic() < deadline and demo.poll() is None, "".join(seen)[-3000:]
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        time.sleep(5)  # the flow run is under way
        assert demo.poll() is None, "the demo ended before its Prefect server could be killed"
        [server] = [
            child for child in psutil.Process(demo.pid).children(recursive=True)
            if "server" in child.cmdline() and "start" in child.cmdline()
        ]  # fmt: skip
        server.kill()
        killed_at = time.monotonic()
        try:
            status = demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo still runs 60 s after its Prefect server was killed")
        waited_s = time.monotonic() - killed_at
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    errors = [line for line in seen if line.startswith("planner: error:")]
    assert status == 3
    assert len(errors) == 1 and "Prefect server" in errors[0], "".join(seen)[-3000:]
    assert not any(line.startswith("Traceback") for line in seen)
    assert waited_s < 10 + 20


def test_sigterm_to_the_demo_stops_its_prefect_server(database_url: str, tmp_path: Path) -> None:
    """SIGTERM to `planner demo` alone (not its process group), once the run is under way: the demo ends with one
    line and the Prefect server it started is stopped too (issue 43: the server kept running)."""
    import queue
    import threading
    import time

    import psutil

    env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_")}
    env |= {"PLANNER_DATABASE_URL": database_url, "PLANNER_DATA_DIR": str(tmp_path / "data")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "planner_cli.main", "demo", "--deployment", "sigterm"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in demo.stderr], daemon=True)
    reader.start()
    seen: list[str] = []
    server = None
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("Prefect API:") for line in seen):
            assert time.monotonic() < deadline and demo.poll() is None, "".join(seen)[-3000:]
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        time.sleep(3)  # the flow run is under way
        [server] = [
            child for child in psutil.Process(demo.pid).children(recursive=True)
            if "server" in child.cmdline() and "start" in child.cmdline()
        ]  # fmt: skip
        demo.send_signal(signal.SIGTERM)
        status = demo.wait(timeout=60)
        server.wait(timeout=30)  # psutil.TimeoutExpired if the server outlives the demo
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if server is not None and server.is_running():
            server.kill()
    reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    assert status == 130
    assert seen[-1].strip() == "planner: interrupted", "".join(seen)[-3000:]
    assert not any(line.startswith("Traceback") for line in seen)


# ---------------------------------------------------------------------------------------------------------
# Postgres lost mid-run: one line, non-zero status, no traceback
# ---------------------------------------------------------------------------------------------------------


def _demo_ticks(url: str) -> int:
    """The ticks the demo's database holds (0 before its schema exists)."""
    with psycopg.connect(to_libpq_uri(url)) as conn:
        if conn.execute("SELECT to_regclass('ticks')").fetchone()[0] is None:
            return 0
        return int(conn.execute("SELECT count(*) FROM ticks").fetchone()[0])


def test_demo_ends_in_one_line_when_its_database_is_lost(tmp_path: Path) -> None:
    """The demo's embedded Postgres is stopped once the run is under way: the demo exits 1 with one error line
    naming the database, and prints no traceback (Prefect's console copy of the failure included)."""
    import time

    from planner_core.runtime.store.db import embedded_database_url, stop_embedded_database

    data_dir = tmp_path / "data"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "PLANNER_"))}
    env |= {"PLANNER_DATA_DIR": str(data_dir)}
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        demo = subprocess.Popen(
            [sys.executable, "-m", "planner_cli.main", "demo", "--deployment", "db-lost"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 240
            while "Prefect API:" not in err_path.read_text():
                assert time.monotonic() < deadline and demo.poll() is None, err_path.read_text()[-3000:]
                time.sleep(0.5)
            # The run is under way once it has recorded a tick. Stopped earlier, before the flow resolved its
            # database URL, the embedded server is started again and the demo runs to its end (seen under load).
            owner_url = embedded_database_url((data_dir / "pg").resolve())
            while not _demo_ticks(owner_url):
                assert time.monotonic() < deadline and demo.poll() is None, err_path.read_text()[-3000:]
                time.sleep(0.5)
            assert demo.poll() is None, "the demo ended before its database could be stopped"
            assert stop_embedded_database((data_dir / "pg").resolve())
            status = demo.wait(timeout=120)
        finally:
            if demo.poll() is None:  # its whole process group: the Prefect server it started too
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
            stop_embedded_database((data_dir / "pg").resolve())
    text = err_path.read_text()
    errors = [line for line in text.splitlines() if line.startswith("planner: error:")]
    assert status == 1, text[-3000:]
    assert len(errors) == 1 and "database unavailable" in errors[0], text[-3000:]
    assert "Traceback" not in text


def test_fpm_ingest_with_curve_hears_only_allowed_publishers(tmp_path: Path) -> None:
    """With CURVE, a publisher holding an allowed certificate is heard; one with an unknown certificate, and one
    without CURVE, are not (their handshake fails, nothing they send is received)."""
    import time

    import zmq.auth

    from planner_core.domain import Component, ForwardPassMetrics
    from planner_core.runtime.ingest import CurveServer, FpmIngest, FpmPublisher

    keys, allowed, others = tmp_path / "server", tmp_path / "allowed", tmp_path / "others"
    for folder in (keys, allowed, others):
        folder.mkdir()
    _, server_secret = zmq.auth.create_certificates(keys, "ingest")
    zmq.auth.create_certificates(allowed, "engine")
    zmq.auth.create_certificates(others, "intruder")
    for secret in allowed.glob("*.key_secret"):
        secret.rename(tmp_path / secret.name)  # the allowed folder holds public certificates only
    curve = CurveServer.load(Path(server_secret), allowed)
    # the URL is never connected to: received messages are only queued (the database is not what is tested)
    ingest = FpmIngest("postgresql+psycopg://nobody@127.0.0.1:1/none", 1, bind=["tcp://127.0.0.1:*"], curve=curve)
    sample = ForwardPassMetrics(component=Component.DECODE, worker_id="w", counter_id=1, wall_time_s=0.01)
    try:
        endpoint = ingest.endpoints[0]
        with (
            FpmPublisher(
                endpoint, server_public_key=curve.public_key, client_certificate=others / "intruder.key_secret"
            ) as intruder,
            FpmPublisher(endpoint) as plain,
            FpmPublisher(
                endpoint, server_public_key=curve.public_key, client_certificate=tmp_path / "engine.key_secret"
            ) as engine,
        ):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                ingest._drain()  # one thread: the loop's receiving step, by hand
                for publisher, worker_id in ((intruder, "intruder"), (plain, "plain"), (engine, "engine")):
                    publisher.publish(dataclasses.replace(sample, worker_id=worker_id))
                time.sleep(0.05)
            assert not intruder.wait_for_subscriber(0.1) and not plain.wait_for_subscriber(0.1)
        num_sent = engine.num_sent
        assert 0 < ingest.stats.received <= num_sent  # only the engine's (the first few precede its handshake)
        assert {s.fpm.worker_id for s in ingest.pending()} == {"engine"}
    finally:
        ingest.close()
