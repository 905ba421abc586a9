"""Forward-pass metrics ingest: engines' per-iteration metrics, from ZMQ into Postgres.

Engines (or a relay in front of them) publish on ZMQ PUB sockets that connect to the ingest's SUB socket
(`planner ingest` binds it; it can also connect out to publishers that bind). Each message is two frames:

- topic: `fpm.prefill` or `fpm.decode`, the pool the engine serves (the single pool of aggregated mode is
  `decode`), since the payload does not say;
- payload: one msgpack map with Dynamo's `ForwardPassMetrics` field names: `version`, `worker_id`, `dp_rank`,
  `counter_id`, `wall_time` (seconds), `scheduled_requests{num_prefill_requests, sum_prefill_tokens,
  var_prefill_length, sum_prefill_kv_tokens, num_decode_requests, sum_decode_kv_tokens, var_decode_kv_tokens}`,
  `queued_requests{num_prefill_requests, sum_prefill_tokens, var_prefill_length, num_decode_requests,
  sum_decode_kv_tokens, var_decode_kv_tokens}` (how Dynamo's msgspec structs encode).

Decoding is strict: a missing field takes Dynamo's default, but `worker_id` must be a non-empty string, counts
and token sums non-negative integers (not booleans, not floats), times and variances finite and non-negative;
unknown keys are ignored so a newer engine that adds fields is still read. Idle heartbeats (`wall_time` 0) are
counted and stored like any sample: they are an idle engine's only report, and the load loop needs every ready
engine's report to scale an idle pool down (the online perf models skip them). A message that is oversized, not
two frames with a known topic, not msgpack, or not the schema is counted under its `DropReason`, logged
(rate-limited) and dropped; nothing a publisher sends stops the ingest.

Memory is bounded end to end, whatever the publishers or the database do:

- at the socket, ZeroMQ refuses a frame larger than `ZMQ_MAX_MESSAGE_BYTES` from its size header, before receiving
  it (it disconnects that peer, which reconnects), and queues at most `RCVHWM` messages per connection (beyond it
  ZeroMQ drops what arrives): at most `RCVHWM x ZMQ_MAX_MESSAGE_BYTES` per publisher in the worst case, and in
  practice nearly nothing, since the receive loop never waits on the database;
- the receive loop (`run`'s thread) only takes messages off the socket, decodes them and queues the samples; a
  writer thread of its own inserts them in batches (every `batch_size` samples or `flush_interval_s`) and deletes
  the samples older than the retention period. A write blocked by a lock or a stalled server holds up only the
  writer (its session's `lock_timeout` and `statement_timeout` end it within seconds, and it retries with a
  back-off);
- between the two, the queue holds at most `max_pending` samples, the batch being written included. Overflow
  policy: drop the oldest waiting sample (the newest when all of them are in the batch being written), counted in
  `stats.lost_pending`, logged (rate-limited) and in the periodic and final counters line. A batch whose write
  failed goes back to the front of the queue, where it is the first to be dropped.

Authentication (optional, `CurveServer`): with ZeroMQ CURVE the ingest's socket is a CURVE server and hears only
publishers whose public certificate is in an allowed folder (checked by pyzmq's ZAP authenticator); the traffic is
encrypted. Without it, anyone who reaches the socket can publish samples: keep it on loopback or a private network.

The wire format (decoding, encoding, Dynamo's publishers' discovery, the test publisher) is
`planner_core.runtime.fpm_wire`; this module re-exports its public names.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import zmq
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError

from planner_core.domain import Component
from planner_core.runtime.fpm_wire import (
    DYNAMO_ENVELOPE_FORMAT,
    DYNAMO_FPM_TOPIC,
    MAX_MESSAGE_BYTES,
    SCHEMA_VERSION,
    TOPIC_PREFIX,
    DropReason,
    FpmDecodeError,
    FpmPublisher,
    decode_dynamo_fpm_event,
    decode_fpm_message,
    discover_dynamo_fpm_publishers,
    encode_fpm_message,
    synthetic_fpm,
)
from planner_core.runtime.store.db import session_factory
from planner_core.runtime.store.fpm import FpmSample, delete_fpm_samples_before, insert_fpm_samples

log = logging.getLogger("planner.ingest")

# ZMQ's cap on one frame (ZMQ_MAXMSGSIZE): a peer that sends a larger one is disconnected by ZMQ from the frame's
# size header, before the frame is received (not counted: it never reaches us). Our own limit plus room for
# Dynamo's event-plane envelope, so a frame just over our limit still arrives to be counted as `oversized`.
# Issue 43: at four times our limit, a flood of 256 KiB frames was received in full, then dropped.
ZMQ_MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES + 4096
# Messages ZMQ queues per connection while the receive loop is busy: ~250 KB of real (~250 byte) messages, at most
# ~66 MB of the largest frames ZMQ lets in; beyond it ZMQ drops what arrives. Was 10,000 (2.5 GiB of 256 KiB frames
# per publisher while a stuck database write held the loop).
RCVHWM = 1000
# The ingest's database session: a blocked write fails within these, and the loop goes back to the socket.
LOCK_TIMEOUT_S = 2.0
STATEMENT_TIMEOUT_S = 10.0


# Errors that retrying the same rows cannot fix (as opposed to a lost connection).
_PERMANENT_DB_ERRORS = (DataError, IntegrityError, psycopg.DataError, psycopg.IntegrityError)


# --- the ingest -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CurveServer:
    """The ingest's CURVE keys and the publishers it accepts (certificates as `zmq.auth.create_certificates` writes)."""

    public_key: bytes
    secret_key: bytes
    clients_dir: Path

    @classmethod
    def load(cls, secret_key_file: Path | None, clients_dir: Path | None) -> CurveServer:
        """Read the ingest's certificate; raises ValueError (one line) when either setting is missing or bad."""
        from zmq.auth import load_certificate

        if secret_key_file is None or clients_dir is None:
            raise ValueError(
                "CURVE needs both PLANNER_FPM_CURVE_SECRET_KEY_FILE and PLANNER_FPM_CURVE_CLIENTS_DIR to be set"
            )
        if not Path(clients_dir).is_dir():
            raise ValueError(f"PLANNER_FPM_CURVE_CLIENTS_DIR = {str(clients_dir)!r}: not a folder")
        try:
            public_key, secret_key = load_certificate(secret_key_file)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{secret_key_file}: not a ZeroMQ certificate ({' '.join(str(exc).split())})") from exc
        if secret_key is None:
            raise ValueError(f"{secret_key_file}: holds no secret key (give the .key_secret file)")
        return cls(public_key=public_key, secret_key=secret_key, clients_dir=Path(clients_dir))


@dataclass(slots=True)
class IngestStats:
    """Counters of one ingest run."""

    received: int = 0  # messages taken off the socket
    stored: int = 0  # samples committed to Postgres
    heartbeats: int = 0  # idle heartbeats (wall_time 0), stored too (an idle engine's only report)
    dropped: dict[DropReason, int] = field(default_factory=dict)  # messages dropped, by reason
    db_errors: int = 0  # failed flushes (the batch is kept and retried)
    lost_pending: int = 0  # decoded samples discarded because the database stayed unreachable too long
    expired: int = 0  # samples deleted by retention

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def summary(self) -> str:
        dropped = ", ".join(f"{reason.value} {n}" for reason, n in sorted(self.dropped.items())) or "none"
        return (
            f"received {self.received}, stored {self.stored}, heartbeats {self.heartbeats}, dropped {dropped}, "
            f"database errors {self.db_errors}, lost {self.lost_pending}, expired {self.expired}"
        )


class _LogLimiter:
    """At most one log line per key per `interval_s`, saying how many were suppressed in between."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -math.inf) < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        suppressed = self._suppressed.pop(key, 0)
        self._last[key] = now
        suffix = f" ({suppressed} more since the last report)" if suppressed else ""
        log.warning(message + suffix, *args)


class FpmIngest:
    """Receives forward-pass metrics on a ZMQ SUB socket and stores them for one deployment.

    Args:
        database_url: SQLAlchemy URL of the planner database (at the newest migration).
        deployment_id: the deployment the samples belong to.
        bind: endpoints to bind the SUB socket to (`tcp://127.0.0.1:*` picks a free port; see `endpoints`).
        connect: endpoints of publishers that bind, to connect to.
        batch_size: insert once this many samples are waiting ...
        flush_interval_s: ... or this long after the previous flush.
        retention_s: samples received longer ago than this are deleted ...
        retention_every_s: ... checked this often, in batches of `retention_batch` rows.
        max_pending: samples kept in memory, the batch being written included, while Postgres is slow,
            unreachable or blocked; beyond it the oldest are dropped and counted (`stats.lost_pending`).
        max_message_bytes: larger payloads are dropped as `oversized`.
        lock_timeout_s, statement_timeout_s: the database session's `lock_timeout` and `statement_timeout`.
        curve: authenticate publishers with ZeroMQ CURVE (module docstring); None = no authentication.
        dynamo_discovery: a Dynamo file discovery store (`DYN_FILE_KV`): the ingest connects to every forward-pass
            metrics publisher registered there (Dynamo's engines bind their own), checked every
            `discovery_every_s`, and reads their event-plane messages (`decode_dynamo_fpm_event`).
    """

    def __init__(
        self,
        database_url: str,
        deployment_id: int,
        *,
        bind: Sequence[str] = (),
        connect: Sequence[str] = (),
        batch_size: int = 1000,
        flush_interval_s: float = 0.5,
        retention_s: float = 1800.0,
        retention_every_s: float = 60.0,
        retention_batch: int = 10_000,
        max_pending: int = 100_000,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
        curve: CurveServer | None = None,
        context: zmq.Context | None = None,
        dynamo_discovery: Path | None = None,
        discovery_every_s: float = 2.0,
    ) -> None:
        if not bind and not connect and dynamo_discovery is None:
            raise ValueError("the ingest needs an endpoint to bind or connect to, or a Dynamo discovery store")
        self.dynamo_discovery = dynamo_discovery
        self.discovery_every_s = discovery_every_s
        self._dynamo_publishers: dict[str, tuple[int, Component]] = {}  # endpoint -> (publisher id, pool)
        self._publisher_pools: dict[int, Component] = {}
        self.deployment_id = deployment_id
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.retention_s = retention_s
        self.retention_every_s = retention_every_s
        self.retention_batch = retention_batch
        self.max_pending = max_pending
        self.max_message_bytes = max_message_bytes
        self.stats = IngestStats()
        self._sessions = session_factory(
            database_url,
            lock_timeout_ms=max(1, round(lock_timeout_s * 1000)),
            statement_timeout_ms=max(1, round(statement_timeout_s * 1000)),
        )
        # Shared by the receive loop and the writer thread, under `_lock`: the waiting samples and the batch the
        # writer is storing (taken off `_pending`, put back at its front when the write fails and may be retried).
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # notified when a batch is waiting
        self._pending: deque[FpmSample] = deque()
        self._in_flight: list[FpmSample] = []
        self._limiter = _LogLimiter()
        self._flush_backoff_s = 0.0
        self._authenticator = None
        if curve is not None:
            from zmq.auth.thread import ThreadAuthenticator

            # one authenticator per context: a context of its own unless the caller gave one
            context = context or zmq.Context()
            self._authenticator = ThreadAuthenticator(context)
            self._authenticator.start()
            self._authenticator.configure_curve(domain="*", location=str(curve.clients_dir))
        self._socket = (context or zmq.Context.instance()).socket(zmq.SUB)
        if curve is not None:
            self._socket.curve_secretkey = curve.secret_key
            self._socket.curve_publickey = curve.public_key
            self._socket.curve_server = True
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, RCVHWM)  # ZMQ drops silently beyond its high-water mark
        self._socket.setsockopt(zmq.MAXMSGSIZE, ZMQ_MAX_MESSAGE_BYTES)
        self._socket.setsockopt(zmq.SUBSCRIBE, TOPIC_PREFIX)
        if dynamo_discovery is not None:
            self._socket.setsockopt(zmq.SUBSCRIBE, DYNAMO_FPM_TOPIC)
        self.endpoints: list[str] = []
        try:
            for endpoint in bind:
                self._socket.bind(endpoint)
                self.endpoints.append(self._socket.getsockopt_string(zmq.LAST_ENDPOINT))
            for endpoint in connect:
                self._socket.connect(endpoint)
                self.endpoints.append(endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"ZMQ endpoint {endpoint}: {exc}") from exc

    # -- receiving --

    def handle(self, frames: Sequence[bytes], received_at: dt.datetime) -> None:
        """Decode one message and queue it for the next flush (counted as a heartbeat when idle), or count a drop."""
        self.stats.received += 1
        try:
            if self.dynamo_discovery is not None and frames and frames[0] == DYNAMO_FPM_TOPIC:
                fpm, version = decode_dynamo_fpm_event(frames, self._publisher_pools, max_bytes=self.max_message_bytes)
            else:
                fpm, version = decode_fpm_message(frames, max_bytes=self.max_message_bytes)
        except FpmDecodeError as exc:
            self.stats.dropped[exc.reason] = self.stats.dropped.get(exc.reason, 0) + 1
            self._limiter.warning(f"drop-{exc.reason}", "dropped a forward-pass metrics message: %s", exc)
            return
        if fpm.is_idle_heartbeat:
            # Stored all the same: without it an idle engine would vanish from the load ticks (no report in the
            # last load intervals), and a pool whose engines went quiet could never be scaled down.
            self.stats.heartbeats += 1
        sample = FpmSample(fpm=fpm, received_at=received_at, version=version)
        with self._lock:
            if len(self._pending) + len(self._in_flight) >= self.max_pending:  # the database is behind
                self.stats.lost_pending += 1
                self._limiter.warning(
                    "full", "forward-pass queue full (%d samples): dropping the oldest", self.max_pending
                )
                if not self._pending:  # every kept sample is in the batch being written: the new one goes
                    return
                self._pending.popleft()
            self._pending.append(sample)
            if len(self._pending) >= self.batch_size:
                self._ready.notify()

    def rescan_discovery(self) -> None:
        """Connect to the publishers newly registered in the Dynamo discovery store, and disconnect from those gone
        (an engine stopped or drained); their pools are what `decode_dynamo_fpm_event` tags samples with."""
        if self.dynamo_discovery is None:
            return
        found = discover_dynamo_fpm_publishers(self.dynamo_discovery)
        for endpoint in self._dynamo_publishers.keys() - found.keys():
            with contextlib.suppress(zmq.ZMQError):  # already gone
                self._socket.disconnect(endpoint)
            self.endpoints.remove(endpoint)
            log.info("forward-pass metrics publisher %s left the discovery store", endpoint)
        for endpoint in found.keys() - self._dynamo_publishers.keys():
            try:
                self._socket.connect(endpoint)
            except zmq.ZMQError as exc:
                self._limiter.warning(f"connect-{endpoint}", "cannot connect to publisher %s: %s", endpoint, exc)
                continue
            self.endpoints.append(endpoint)
            log.info("forward-pass metrics publisher %s (%s) in the discovery store", endpoint, found[endpoint][1])
        self._dynamo_publishers = {e: found[e] for e in found if e in self.endpoints}
        self._publisher_pools = {publisher_id: pool for publisher_id, pool in found.values()}

    def _drain(self) -> None:
        """Take what the socket holds now, up to one batch, without blocking."""
        for _ in range(self.batch_size):
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.handle(frames, dt.datetime.now(dt.UTC))

    # -- storing --

    def flush(self) -> bool:
        """Insert the waiting samples in one transaction (the writer thread's step; callable directly when no
        writer runs). False when the database refused: a retryable failure puts the batch back at the front of
        the queue, a permanent one (Postgres refuses these rows and always will) drops it, counted."""
        with self._lock:
            if not self._pending:
                return True
            batch = self._in_flight = list(self._pending)
            self._pending.clear()
        try:
            with self._sessions.begin() as session:
                insert_fpm_samples(session, self.deployment_id, batch)
        except (SQLAlchemyError, psycopg.Error) as exc:  # COPY runs on the driver connection: psycopg's own errors
            with self._lock:
                self._in_flight = []
                self.stats.db_errors += 1
                if isinstance(exc, _PERMANENT_DB_ERRORS):
                    self.stats.lost_pending += len(batch)
                else:  # back in front, oldest first: the next overflow drops them first
                    self._pending.extendleft(reversed(batch))
            if isinstance(exc, _PERMANENT_DB_ERRORS):
                log.error("dropped %d forward-pass samples Postgres refused: %s", len(batch), str(exc).splitlines()[0])
                return False
            self._flush_backoff_s = min(30.0, max(1.0, 2 * self._flush_backoff_s))
            self._limiter.warning(
                "db", "cannot store %d forward-pass samples (retrying): %s", len(batch), str(exc).splitlines()[0]
            )
            return False
        with self._lock:
            self._in_flight = []
            self.stats.stored += len(batch)
        self._flush_backoff_s = 0.0
        return True

    def expire(self, now: dt.datetime) -> int:
        """Delete samples older than the retention period, one short transaction per batch; returns how many."""
        cutoff = now - dt.timedelta(seconds=self.retention_s)
        deleted = 0
        try:
            while True:
                with self._sessions.begin() as session:
                    num = delete_fpm_samples_before(
                        session, self.deployment_id, cutoff, batch_size=self.retention_batch
                    )
                deleted += num
                if num < self.retention_batch:
                    break
        except (SQLAlchemyError, psycopg.Error) as exc:
            self.stats.db_errors += 1
            self._limiter.warning("retention", "retention of forward-pass samples failed: %s", str(exc).splitlines()[0])
        self.stats.expired += deleted
        return deleted

    # -- the loop --

    def _write_loop(self, stop_writing: threading.Event) -> None:
        """The writer thread: a flush when a batch is waiting or `flush_interval_s` has passed (after a failure, not
        before its back-off), and the retention deletes; until `stop_writing` is set."""
        next_expire = time.monotonic()
        while not stop_writing.is_set():
            if self._flush_backoff_s > 0:
                stop_writing.wait(self._flush_backoff_s)  # the database failed: no retry storm
            else:
                with self._ready:
                    self._ready.wait_for(
                        lambda: len(self._pending) >= self.batch_size or stop_writing.is_set(),
                        timeout=self.flush_interval_s,
                    )
            if stop_writing.is_set():
                return
            self.flush()
            if time.monotonic() >= next_expire:
                self.expire(dt.datetime.now(dt.UTC))
                next_expire = time.monotonic() + self.retention_every_s

    def run(self, stop: threading.Event, *, stats_every_s: float = 60.0) -> IngestStats:
        """Receive until `stop` is set while a writer thread stores (module docstring); then flush what is left
        and close the socket."""
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        stop_writing = threading.Event()
        writer = threading.Thread(target=self._write_loop, args=(stop_writing,), name="fpm-writer", daemon=True)
        writer.start()
        now = time.monotonic()
        next_stats, next_discovery = now + stats_every_s, now
        try:
            while not stop.is_set():
                if now >= next_discovery:
                    self.rescan_discovery()
                    next_discovery = now + self.discovery_every_s
                if poller.poll(timeout=100):  # wake at least every 100 ms to notice `stop`
                    self._drain()
                now = time.monotonic()
                if now >= next_stats:
                    log.info("forward-pass metrics: %s", self.stats.summary())
                    next_stats = now + stats_every_s
        finally:
            stop_writing.set()
            with self._ready:
                self._ready.notify()
            # a write in progress ends within the session's statement_timeout
            writer.join()
            try:
                self._drain()
                if not self.flush():
                    with self._lock:
                        num_left = len(self._pending)
                        self.stats.lost_pending += num_left
                        self._pending.clear()
                    log.warning("stopping with %d forward-pass samples not stored", num_left)
            finally:
                self.close()
        return self.stats

    def close(self) -> None:
        self._socket.close()
        # the engine with the ingest's timeouts is not the URL's usual one: close its idle connections here
        self._sessions.kw["bind"].dispose()
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None

    @property
    def num_pending(self) -> int:
        """How many decoded samples are not stored yet, the batch being written included (at most `max_pending`)."""
        with self._lock:
            return len(self._pending) + len(self._in_flight)

    def pending(self) -> Iterator[FpmSample]:
        """Samples decoded but not stored yet (the batch being written first, then the waiting ones, oldest first)."""
        with self._lock:
            return iter([*self._in_flight, *self._pending])


def resolve_deployment_id(database_url: str, name: str, config_path: str | Path) -> int:
    """The id of deployment `name`, creating it from the config file when no tick has created it yet.

    Raises:
        SchemaOutOfDate: the database needs `planner db upgrade`.
        ConfigError: the deployment is new and the config file is bad.
    """
    from planner_core.config import load_config
    from planner_core.runtime.store import repository as repo
    from planner_core.runtime.store.migrate import check_schema_current

    check_schema_current(database_url)
    with session_factory(database_url).begin() as session:
        deployment = repo.find_deployment(session, name)
        if deployment is None:  # never overwrite the config of an existing deployment from here
            deployment = repo.ensure_deployment(session, name, load_config(config_path).policy)
        return deployment.id


def serve_until_signalled(ingest: FpmIngest, *, stats_every_s: float = 60.0) -> IngestStats:
    """Run the ingest until SIGINT or SIGTERM, then flush, close and return the counters."""
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("received %s: flushing and stopping", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return ingest.run(stop, stats_every_s=stats_every_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = [
    "CurveServer",
    "DYNAMO_ENVELOPE_FORMAT",
    "DYNAMO_FPM_TOPIC",
    "DropReason",
    "FpmDecodeError",
    "FpmIngest",
    "FpmPublisher",
    "IngestStats",
    "LOCK_TIMEOUT_S",
    "MAX_MESSAGE_BYTES",
    "RCVHWM",
    "SCHEMA_VERSION",
    "STATEMENT_TIMEOUT_S",
    "TOPIC_PREFIX",
    "ZMQ_MAX_MESSAGE_BYTES",
    "decode_dynamo_fpm_event",
    "decode_fpm_message",
    "discover_dynamo_fpm_publishers",
    "encode_fpm_message",
    "resolve_deployment_id",
    "serve_until_signalled",
    "synthetic_fpm",
]
