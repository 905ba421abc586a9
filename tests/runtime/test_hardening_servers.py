"""The planner's servers and clients under hostile peers (issue 21): a Prometheus query's overall deadline against a
slow-dripping server, listening on loopback unless told, one database read per metrics cache period, a locked
ingest table that cannot stall the socket or grow memory, CURVE keeping unknown publishers out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import psycopg
import pytest

from planner_core.config import load_config
from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import write_config

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
