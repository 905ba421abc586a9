"""Forward-pass metrics ingest: strict decoding (pure), a real ZMQ publisher into real Postgres, retention,
a database outage, the load tick's inputs, and `planner ingest` stopping cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text

from planner_core.config import load_config
from planner_core.domain import Component, ForwardPassMetrics, Loop, QueuedRequests, ScheduledRequests
from planner_core.runtime.ingest import (
    DYNAMO_FPM_TOPIC,
    DropReason,
    FpmDecodeError,
    FpmIngest,
    FpmPublisher,
    decode_dynamo_fpm_event,
    decode_fpm_message,
    discover_dynamo_fpm_publishers,
    encode_fpm_message,
    serve_until_signalled,
)
from planner_core.runtime.service import fpm_max_age_s, load_context, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import session_factory
from planner_core.runtime.store.fpm import FpmSample, insert_fpm_samples, latest_fpm
from planner_core.runtime.store.models import FpmSampleRow
from tests.conftest import REPO_ROOT, write_config

P, D = Component.PREFILL, Component.DECODE


def busy(component: Component, worker_id: str, counter_id: int, *, dp_rank: int = 0) -> ForwardPassMetrics:
    """A busy iteration whose numbers encode its identity (easy to check which sample was kept)."""
    return ForwardPassMetrics(
        component=component,
        worker_id=worker_id,
        dp_rank=dp_rank,
        counter_id=counter_id,
        wall_time_s=0.01 + counter_id / 1000,
        scheduled=ScheduledRequests(num_decode_requests=counter_id, sum_decode_kv_tokens=1000 * counter_id),
        queued=QueuedRequests(num_prefill_requests=1, sum_prefill_tokens=counter_id, var_prefill_length=2.5),
    )


def _payload(**fields: object) -> bytes:
    body = {"worker_id": "w", "wall_time": 0.02, **fields}
    return msgpack.packb({k: v for k, v in body.items() if v is not ...}, use_bin_type=True)


# --- decoding (pure) ------------------------------------------------------------------------------------------


def test_round_trip_and_dynamo_field_names() -> None:
    """Encoding writes Dynamo's field names (wall_time, scheduled_requests, ...); decoding gives the value back."""
    fpm = busy(P, "worker-a", 7, dp_rank=3)
    frames = encode_fpm_message(fpm, version=2)
    assert frames[0] == b"fpm.prefill"
    body = msgpack.unpackb(frames[1])
    assert set(body) == {
        "version",
        "worker_id",
        "dp_rank",
        "counter_id",
        "wall_time",
        "scheduled_requests",
        "queued_requests",
    }
    assert body["wall_time"] == fpm.wall_time_s and body["scheduled_requests"]["num_decode_requests"] == 7
    assert decode_fpm_message(frames) == (fpm, 2)


def test_missing_fields_take_dynamos_defaults_and_unknown_keys_are_ignored() -> None:
    """Only worker_id is required; a newer engine's extra keys do not make a message garbage."""
    fpm, version = decode_fpm_message([b"fpm.decode", _payload(future_field=[1, 2], wall_time=0.5)])
    assert version is None
    assert fpm == ForwardPassMetrics(component=D, worker_id="w", wall_time_s=0.5)


def test_idle_heartbeat_decodes_as_such() -> None:
    """wall_time 0 is Dynamo's idle heartbeat: valid, and flagged (stored, never a perf-model sample)."""
    fpm, _ = decode_fpm_message([b"fpm.decode", _payload(wall_time=0.0)])
    assert fpm.is_idle_heartbeat


@pytest.mark.parametrize(
    ("frames", "reason", "detail"),
    [
        ([b"fpm.decode"], DropReason.BAD_FRAMES, "1 frames, expected 2"),
        ([b"fpm.decode", b"x", b"y"], DropReason.BAD_FRAMES, "3 frames"),
        ([b"kv.decode", _payload()], DropReason.BAD_FRAMES, "does not start with"),
        ([b"fpm.encode", _payload()], DropReason.BAD_FRAMES, "unknown pool"),
        ([b"fpm.decode", b"\xc1garbage"], DropReason.NOT_MSGPACK, ""),
        ([b"fpm.decode", _payload() + b"\x01"], DropReason.NOT_MSGPACK, "ExtraData"),  # trailing bytes
        ([b"fpm.decode", msgpack.packb([1, 2, 3])], DropReason.BAD_SCHEMA, "message = [1, 2, 3]"),
        ([b"fpm.decode", _payload(worker_id=...)], DropReason.BAD_SCHEMA, "worker_id = ''"),
        ([b"fpm.decode", _payload(worker_id="")], DropReason.BAD_SCHEMA, "worker_id = ''"),
        ([b"fpm.decode", _payload(worker_id=12)], DropReason.BAD_SCHEMA, "worker_id = 12"),
        ([b"fpm.decode", _payload(worker_id="x" * 201)], DropReason.BAD_SCHEMA, "1..200 characters"),
        ([b"fpm.decode", _payload(worker_id="a\x00b")], DropReason.BAD_SCHEMA, "no NUL"),  # Postgres text has no NUL
        ([b"fpm.decode", _payload(dp_rank=True)], DropReason.BAD_SCHEMA, "dp_rank = True"),
        ([b"fpm.decode", _payload(dp_rank=-1)], DropReason.BAD_SCHEMA, "dp_rank = -1"),
        ([b"fpm.decode", _payload(counter_id=1.5)], DropReason.BAD_SCHEMA, "counter_id = 1.5"),
        ([b"fpm.decode", _payload(counter_id=2**63)], DropReason.BAD_SCHEMA, "counter_id"),
        ([b"fpm.decode", _payload(wall_time="0.1")], DropReason.BAD_SCHEMA, "wall_time = '0.1'"),
        ([b"fpm.decode", _payload(wall_time=math.nan)], DropReason.BAD_SCHEMA, "wall_time = nan"),
        ([b"fpm.decode", _payload(wall_time=-0.1)], DropReason.BAD_SCHEMA, "wall_time = -0.1"),
        ([b"fpm.decode", _payload(version="1")], DropReason.BAD_SCHEMA, "version = '1'"),
        ([b"fpm.decode", _payload(scheduled_requests=[0])], DropReason.BAD_SCHEMA, "scheduled_requests = [0]"),
        (
            [b"fpm.decode", _payload(scheduled_requests={"num_decode_requests": -4})],
            DropReason.BAD_SCHEMA,
            "scheduled_requests.num_decode_requests = -4",
        ),
        (
            [b"fpm.decode", _payload(queued_requests={"var_decode_kv_tokens": math.inf})],
            DropReason.BAD_SCHEMA,
            "queued_requests.var_decode_kv_tokens = inf",
        ),
        ([b"fpm.decode", _payload(worker_id="y" * 70_000)], DropReason.OVERSIZED, "limit 65536"),
    ],
    ids=lambda value: None if not isinstance(value, str) else value[:24],
)
def test_malformed_messages_are_classified(frames: list[bytes], reason: DropReason, detail: str) -> None:
    """Every kind of garbage is refused with its reason and where it is wrong."""
    with pytest.raises(FpmDecodeError) as info:
        decode_fpm_message(frames)
    assert info.value.reason == reason
    assert detail in info.value.detail


_counts = st.integers(min_value=0, max_value=2**31 - 1)
_sums = st.integers(min_value=0, max_value=2**63 - 1)
_reals = st.floats(min_value=0, max_value=1e12, allow_nan=False)
valid_fpm = st.builds(
    ForwardPassMetrics,
    component=st.sampled_from(Component),
    # A worker id arrives as UTF-8 bytes, which cannot hold a lone surrogate (category Cs).
    worker_id=st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1, max_size=200),
    dp_rank=_counts,
    counter_id=_sums,
    wall_time_s=_reals,
    scheduled=st.builds(
        ScheduledRequests,
        num_prefill_requests=_counts,
        sum_prefill_tokens=_sums,
        var_prefill_length=_reals,
        sum_prefill_kv_tokens=_sums,
        num_decode_requests=_counts,
        sum_decode_kv_tokens=_sums,
        var_decode_kv_tokens=_reals,
    ),
    queued=st.builds(
        QueuedRequests,
        num_prefill_requests=_counts,
        sum_prefill_tokens=_sums,
        var_prefill_length=_reals,
        num_decode_requests=_counts,
        sum_decode_kv_tokens=_sums,
        var_decode_kv_tokens=_reals,
    ),
)


@settings(max_examples=200, deadline=None)
@given(fpm=valid_fpm, version=st.none() | st.integers(min_value=0, max_value=2**31 - 1))
def test_every_valid_message_round_trips(fpm: ForwardPassMetrics, version: int | None) -> None:
    """decode(encode(m)) == m for every message within the schema's ranges."""
    assert decode_fpm_message(encode_fpm_message(fpm, version=version)) == (fpm, version)


@settings(max_examples=300, deadline=None)
@given(topic=st.binary(max_size=16), payload=st.binary(max_size=512))
def test_arbitrary_bytes_never_escape_as_another_error(topic: bytes, payload: bytes) -> None:
    """Whatever a publisher sends, decoding returns a message or raises FpmDecodeError (nothing else)."""
    try:
        decode_fpm_message([topic, payload])
    except FpmDecodeError:
        pass


# --- a real ZMQ publisher into real Postgres -------------------------------------------------------------------


@pytest.fixture
def deployment(database_url: str, tmp_path: Path) -> tuple[str, int, Path]:
    """A deployment row to ingest for: (database URL, deployment id, its config file)."""
    config_path = write_config(tmp_path, enable_load_scaling=True, load_adjustment_interval_seconds=5)
    with session_factory(database_url).begin() as session:
        row = repo.ensure_deployment(session, "ingest", load_config(config_path).policy)
        return database_url, row.id, config_path


class RunningIngest:
    """An FpmIngest running in a thread, bound to a free local port."""

    def __init__(self, database_url: str, deployment_id: int, **options: object) -> None:
        self.ingest = FpmIngest(
            database_url, deployment_id, bind=["tcp://127.0.0.1:*"], flush_interval_s=0.05, **options
        )
        self.endpoint = self.ingest.endpoints[0]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.ingest.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def wait_received(self, num: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.ingest.stats.received < num:
            assert time.monotonic() < deadline, f"received {self.ingest.stats.received} of {num}"
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def running_ingest(deployment) -> Iterator[RunningIngest]:
    url, deployment_id, _ = deployment
    runner = RunningIngest(url, deployment_id)
    yield runner
    runner.finish()


def _rows(database_url: str, deployment_id: int) -> int:
    with session_factory(database_url).begin() as session:
        return session.scalar(select(func.count()).where(FpmSampleRow.deployment_id == deployment_id))


def test_stream_with_garbage_is_counted_dropped_and_good_messages_land(
    running_ingest: RunningIngest, deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """Good, heartbeat, garbage, wrong-schema, oversized and bad-frame messages: garbage is counted and logged,
    the ingest keeps running, and the good messages before and after it are stored."""
    url, deployment_id, _ = deployment
    engines = [(P, "p-0", 0), (D, "d-0", 0), (D, "d-0", 1), (D, "d-1", 0)]
    caplog.set_level(logging.WARNING, logger="planner.ingest")
    with FpmPublisher(running_ingest.endpoint) as publisher:
        assert publisher.wait_for_subscriber(timeout_s=10)
        for counter in (1, 2):
            for component, worker, rank in engines:
                publisher.publish(busy(component, worker, counter, dp_rank=rank))
        publisher.publish(ForwardPassMetrics(component=D, worker_id="d-1", counter_id=99))  # idle heartbeat
        publisher.send_frames([b"fpm.decode", os.urandom(64) + b"\xc1"])  # garbage bytes
        publisher.send_frames([b"fpm.decode", _payload(dp_rank="zero")])  # wrong schema
        # oversized for us, not for ZeroMQ (which disconnects a peer sending a frame over ZMQ_MAX_MESSAGE_BYTES)
        publisher.send_frames([b"fpm.decode", _payload(worker_id="z" * 66_000)])
        publisher.send_frames([b"fpm.decode"])  # one frame (fpm. prefix, so it passes the subscription)
        publisher.send_frames([b"fpm.gpu", _payload()])  # unknown pool
        for component, worker, rank in engines:
            publisher.publish(busy(component, worker, 3, dp_rank=rank))
        running_ingest.wait_received(publisher.num_sent)
    running_ingest.finish()
    stats = running_ingest.ingest.stats
    assert stats.dropped == {
        DropReason.NOT_MSGPACK: 1,
        DropReason.BAD_SCHEMA: 1,
        DropReason.OVERSIZED: 1,
        DropReason.BAD_FRAMES: 2,
    }
    # 13 = 3 x 4 busy + the heartbeat (an idle engine's only report is kept)
    assert (stats.received, stats.heartbeats, stats.stored, stats.db_errors) == (18, 1, 13, 0)
    assert _rows(url, deployment_id) == 13
    assert "dropped a forward-pass metrics message: not_msgpack" in caplog.text
    with session_factory(url).begin() as session:
        latest = latest_fpm(session, deployment_id, since=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    # one per engine, the newest (counter 3), ordered by component, worker, rank
    assert latest == tuple(busy(c, w, 3, dp_rank=r) for c, w, r in sorted(engines, key=lambda e: (e[0].value, *e[1:])))


def test_load_tick_sees_the_newest_sample_per_engine(deployment, profile_dir: Path) -> None:
    """run_tick(LOAD) puts the newest fresh sample per engine into the inputs and records them in fpm_snapshots;
    stale samples and samples after the scheduled time are left out."""
    url, deployment_id, config_path = deployment
    ctx = load_context(url, "ingest", config_path)
    now = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
    max_age = dt.timedelta(seconds=fpm_max_age_s(ctx.config))  # 3 load intervals of 5 s = 15 s
    samples = [
        FpmSample(fpm=busy(D, "d-0", 1), received_at=now - dt.timedelta(seconds=4)),
        FpmSample(fpm=busy(D, "d-0", 2), received_at=now - dt.timedelta(seconds=1)),  # newest of d-0
        FpmSample(fpm=busy(D, "d-0", 3), received_at=now + dt.timedelta(seconds=1)),  # after the tick's time
        FpmSample(fpm=busy(P, "p-0", 5), received_at=now - max_age),  # exactly at the edge: kept
        FpmSample(fpm=busy(P, "p-1", 6), received_at=now - max_age - dt.timedelta(seconds=1)),  # stale
    ]
    with ctx.sessions.begin() as session:
        insert_fpm_samples(session, deployment_id, samples)
    result = run_tick(ctx, Loop.LOAD, now, None)
    assert result.inputs.fpm == (busy(D, "d-0", 2), busy(P, "p-0", 5))
    with ctx.sessions.begin() as session:
        snapshots = session.execute(  # the view over ticks.inputs (migration 0015)
            text("SELECT component, worker_id, metrics FROM fpm_snapshots WHERE tick_id = :id"), {"id": result.tick_id}
        ).all()
        assert sorted((s.component, s.worker_id, s.metrics["counter_id"]) for s in snapshots) == [
            ("decode", "d-0", 2),
            ("prefill", "p-0", 5),
        ]
    assert run_tick(ctx, Loop.THROUGHPUT, now, None).inputs.fpm == ()  # only load ticks read them


def test_retention_deletes_old_samples_in_batches(deployment) -> None:
    """Samples older than the retention period go, in batches; newer ones stay."""
    url, deployment_id, _ = deployment
    now = dt.datetime.now(dt.UTC)
    old = [FpmSample(fpm=busy(D, "d-0", i), received_at=now - dt.timedelta(hours=2)) for i in range(7)]
    new = [FpmSample(fpm=busy(D, "d-0", 100 + i), received_at=now - dt.timedelta(minutes=5)) for i in range(3)]
    with session_factory(url).begin() as session:
        insert_fpm_samples(session, deployment_id, old + new)
    ingest = FpmIngest(url, deployment_id, bind=["tcp://127.0.0.1:*"], retention_s=3600, retention_batch=3)
    try:
        assert ingest.expire(now) == 7  # batches of 3, 3, 1
    finally:
        ingest.close()
    assert ingest.stats.expired == 7 and _rows(url, deployment_id) == 3


def test_database_outage_keeps_the_batch_and_never_crashes(postgres_server_url: str, deployment) -> None:
    """A flush into an unreachable database fails, is counted, keeps the samples up to max_pending, and the
    ingest goes on; the oldest are dropped (and counted) beyond that."""
    from planner_core.runtime.store.db import to_sqlalchemy_url
    from tests.runtime.databases import _with_database

    _, deployment_id, _ = deployment
    missing = to_sqlalchemy_url(_with_database(postgres_server_url, "no_such_database"))
    ingest = FpmIngest(missing, deployment_id, bind=["tcp://127.0.0.1:*"], max_pending=2)
    try:
        received_at = dt.datetime.now(dt.UTC)
        for counter in (1, 2, 3):
            ingest.handle(encode_fpm_message(busy(D, "d-0", counter)), received_at)
        assert ingest.flush() is False
        assert (ingest.stats.db_errors, ingest.stats.lost_pending) == (1, 1)
        assert [s.fpm.counter_id for s in ingest.pending()] == [2, 3]
        assert ingest.expire(received_at) == 0 and ingest.stats.db_errors == 2
    finally:
        ingest.close()


def test_sigint_stops_the_ingest_cleanly(deployment) -> None:
    """SIGINT sets the stop flag: the loop flushes what it holds and returns its counters."""
    url, deployment_id, _ = deployment
    ingest = FpmIngest(url, deployment_id, bind=["tcp://127.0.0.1:*"], flush_interval_s=60)  # only the final flush

    def publish_then_interrupt() -> None:
        with FpmPublisher(ingest.endpoints[0]) as publisher:
            assert publisher.wait_for_subscriber()  # the subscription goes out once the ingest loop polls
            for counter in range(5):
                publisher.publish(busy(D, "d-0", counter + 1))
            deadline = time.monotonic() + 10
            while ingest.stats.received < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    # a shell's background job starts with SIGINT ignored; install Python's handler so the signal reaches the loop
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=publish_then_interrupt, daemon=True).start()
        stats = serve_until_signalled(ingest)  # handlers only work in the main thread: pytest runs tests there
        assert (stats.received, stats.stored) == (5, 5)
        assert _rows(url, deployment_id) == 5
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the previous handler is back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_planner_ingest_command_stops_on_sigterm(deployment, tmp_path: Path) -> None:
    """`planner ingest` as its own process: stores what is published, exits 0 on SIGTERM with its counters."""
    url, deployment_id, config_path = deployment
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    env = {**os.environ, "PLANNER_DATABASE_URL": url, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "planner_cli.main", "ingest", "--bind", endpoint, "--deployment", "ingest"]
    process = subprocess.Popen(
        [*command, "--config", str(config_path)], env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        for line in process.stderr:  # wait for the banner: the socket is bound by then
            if "ingesting forward-pass metrics for deployment 'ingest'" in line:
                break
        else:
            pytest.fail(f"planner ingest exited early with {process.wait()}")
        with FpmPublisher(endpoint) as publisher:
            assert publisher.wait_for_subscriber()
            for counter in range(3):
                publisher.publish(busy(P, "p-0", counter + 1))
            publisher.send_frames([b"fpm.prefill", b"junk"])
            deadline = time.monotonic() + 10
            while _rows(url, deployment_id) < 3:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "stopped: received 4, stored 3, heartbeats 0, dropped not_msgpack 1" in stderr
    assert "dropped a forward-pass metrics message: not_msgpack" in stderr


def test_ingest_refuses_to_start_without_endpoints(deployment) -> None:
    """No endpoint, or one ZMQ cannot bind, is a one-line error before anything runs."""
    url, deployment_id, _ = deployment
    with pytest.raises(ValueError, match="needs an endpoint to bind or connect to, or a Dynamo discovery store"):
        FpmIngest(url, deployment_id)
    with pytest.raises(ValueError, match="ZMQ endpoint nonsense://x"):
        FpmIngest(url, deployment_id, bind=["nonsense://x"])


def test_counts_and_lengths_of_the_samples_survive_the_database(deployment) -> None:
    """Every field written to fpm_samples is read back unchanged (BIGINT token sums included)."""
    url, deployment_id, _ = deployment
    big = dataclasses.replace(
        busy(D, "d-0", 1),
        scheduled=ScheduledRequests(sum_prefill_tokens=2**62, sum_decode_kv_tokens=2**40, var_decode_kv_tokens=0.5),
        queued=QueuedRequests(sum_decode_kv_tokens=2**35, num_decode_requests=2**31 - 1),
    )
    now = dt.datetime.now(dt.UTC)
    with session_factory(url).begin() as session:
        insert_fpm_samples(session, deployment_id, [FpmSample(fpm=big, received_at=now, version=4)])
    with session_factory(url).begin() as session:
        assert latest_fpm(session, deployment_id, now - dt.timedelta(seconds=1)) == (big,)
        assert session.scalar(select(FpmSampleRow.version)) == 4


def test_rows_postgres_refuses_are_dropped_not_retried_forever(deployment) -> None:
    """A batch Postgres refuses for good (here: an unknown deployment, a foreign-key violation) is dropped and
    counted; retrying it would block every later sample."""
    url, _, _ = deployment
    ingest = FpmIngest(url, 999_999, bind=["tcp://127.0.0.1:*"])
    try:
        now = dt.datetime.now(dt.UTC)
        ingest.handle(encode_fpm_message(busy(D, "d-0", 1)), now)
        ingest.handle(encode_fpm_message(busy(D, "d-0", 2)), now)
        assert ingest.flush() is False
        assert (ingest.stats.db_errors, ingest.stats.lost_pending, list(ingest.pending())) == (1, 2, [])
    finally:
        ingest.close()


# --- Dynamo's own publishers (event plane, discovery store) -----------------------------------------------------

# One message as a Dynamo 1.6.1 mocker started with --disaggregation-mode prefill published it (an idle heartbeat),
# captured on this project's development machine on 2026-11-26 from the ZMQ endpoint of its discovery entry.
MOCKER_PUBLISHER_ID = 5480502554058692
MOCKER_FRAMES = [bytes.fromhex(h) for h in (
    "666f72776172642d706173732d6d657472696373",
    "0013787cefecdfc4",
    "0000000000000026",
    "010000020885ac7075626c69736865725f6964cf0013787cefecdfc4a873657175656e636526ac7075626c69736865645f6174cf00"
    "0001a219f70474a5746f706963b4666f72776172642d706173732d6d657472696373a77061796c6f6164c501ab87a776657273696f"
    "6e01a9776f726b65725f6964b43133373835383538383031313438303433383335a764705f72616e6b00aa636f756e7465725f6964"
    "27a977616c6c5f74696d65cb0000000000000000b27363686564756c65645f726571756573747387b46e756d5f70726566696c6c5f"
    "726571756573747300b273756d5f70726566696c6c5f746f6b656e7300b27661725f70726566696c6c5f6c656e677468cb00000000"
    "00000000b573756d5f70726566696c6c5f6b765f746f6b656e7300b36e756d5f6465636f64655f726571756573747300b473756d5f"
    "6465636f64655f6b765f746f6b656e7300b47661725f6465636f64655f6b765f746f6b656e73cb0000000000000000af7175657565"
    "645f726571756573747386b46e756d5f70726566696c6c5f726571756573747300b273756d5f70726566696c6c5f746f6b656e7300"
    "b27661725f70726566696c6c5f6c656e677468cb0000000000000000b36e756d5f6465636f64655f726571756573747300b473756d"
    "5f6465636f64655f6b765f746f6b656e7300b47661725f6465636f64655f6b765f746f6b656e73cb0000000000000000",
)]  # fmt: skip


def dynamo_event(fpm: ForwardPassMetrics, publisher_id: int, sequence: int) -> list[bytes]:
    """The four frames Dynamo's event plane publishes for `fpm` (the layout of MOCKER_FRAMES)."""
    payload = encode_fpm_message(fpm)[1]
    envelope = msgpack.packb(
        {"publisher_id": publisher_id, "sequence": sequence, "published_at": 1795731873492,
         "topic": DYNAMO_FPM_TOPIC.decode(), "payload": payload},
        use_bin_type=True,
    )  # fmt: skip
    header = bytes([1]) + len(envelope).to_bytes(4, "big")
    return [DYNAMO_FPM_TOPIC, publisher_id.to_bytes(8, "big"), sequence.to_bytes(8, "big"), header + envelope]


def test_a_message_captured_from_dynamos_mocker_decodes_with_its_pool_from_the_discovery() -> None:
    fpm, version = decode_dynamo_fpm_event(MOCKER_FRAMES, {MOCKER_PUBLISHER_ID: P})
    assert (fpm.component, fpm.worker_id, fpm.counter_id, version) == (P, "13785858801148043835", 39, 1)
    assert fpm.is_idle_heartbeat
    built = dynamo_event(busy(D, "d-7", 5), publisher_id=42, sequence=3)
    assert decode_dynamo_fpm_event(built, {42: D}) == (busy(D, "d-7", 5), 1)


@pytest.mark.parametrize(
    ("mutate", "reason", "detail"),
    [
        (lambda f: f, DropReason.UNKNOWN_PUBLISHER, "publisher 5480502554058692 is not in the discovery store"),
        (lambda f: f[:3], DropReason.BAD_FRAMES, "3 frames"),
        (lambda f: [f[0], f[1][:4], f[2], f[3]], DropReason.BAD_FRAMES, "8 bytes each"),
        (lambda f: [*f[:3], bytes([2]) + f[3][1:]], DropReason.BAD_FRAMES, "envelope format 2"),
        (lambda f: [*f[:3], f[3][:-1]], DropReason.BAD_FRAMES, "length 520 for 519 bytes"),
        (lambda f: [*f[:3], f[3][:5] + b"\xc1" * 520], DropReason.NOT_MSGPACK, ""),
        (lambda f: [*f[:3], f[3] + b"x" * 70_000], DropReason.OVERSIZED, "envelope of"),
    ],
)
def test_malformed_dynamo_events_are_classified(mutate, reason: DropReason, detail: str) -> None:
    with pytest.raises(FpmDecodeError) as error:
        decode_dynamo_fpm_event(mutate(list(MOCKER_FRAMES)), {})
    assert error.value.reason is reason and detail in str(error.value)


def _register(discovery: Path, name: str, *, topic: str, component: str, instance_id: int, endpoint: str) -> Path:
    """An event-channel entry as Dynamo's file discovery writes it."""
    import json

    channels = discovery / "v1" / "event_channels"
    channels.mkdir(parents=True, exist_ok=True)
    entry = channels / name
    entry.write_text(json.dumps({
        "type": "EventChannel",
        "scope": {"kind": "endpoint", "endpoint": {"namespace": "dynamo", "component": component, "name": "generate"}},
        "topic": topic, "instance_id": instance_id, "transport": {"kind": "Zmq", "config": {"endpoint": endpoint}},
    }))  # fmt: skip
    return entry


def test_discovery_finds_each_publisher_and_its_pool(tmp_path: Path) -> None:
    """Prefill engines register as component `prefill`; decode and aggregated ones as another (decode pool); other
    topics and unreadable entries are skipped."""
    _register(tmp_path, "a", topic="forward-pass-metrics", component="prefill", instance_id=1, endpoint="tcp://h:1")
    _register(tmp_path, "b", topic="forward-pass-metrics", component="backend", instance_id=2, endpoint="tcp://h:2")
    _register(tmp_path, "c", topic="kv-events", component="backend", instance_id=3, endpoint="tcp://h:3")
    (tmp_path / "v1" / "event_channels" / "d").write_text("{not json")
    assert discover_dynamo_fpm_publishers(tmp_path) == {"tcp://h:1": (1, P), "tcp://h:2": (2, D)}
    assert discover_dynamo_fpm_publishers(tmp_path / "missing") == {}


def test_the_ingest_reads_publishers_it_finds_in_a_dynamo_discovery_store(deployment, tmp_path: Path) -> None:
    """Two engines that bind their own PUB sockets and register them as Dynamo's do: the ingest connects to both,
    stores their samples under the pool of each registration, and lets go of one whose entry is removed."""
    import zmq

    url, deployment_id, _ = deployment
    context = zmq.Context.instance()
    sockets, entries = {}, {}
    for publisher_id, component in ((11, "prefill"), (12, "backend")):
        sock = context.socket(zmq.PUB)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        sockets[publisher_id] = sock
        entries[publisher_id] = _register(
            tmp_path, f"fpm-{publisher_id}", topic="forward-pass-metrics", component=component,
            instance_id=publisher_id, endpoint=f"tcp://127.0.0.1:{port}",
        )  # fmt: skip
    ingest = FpmIngest(url, deployment_id, dynamo_discovery=tmp_path, discovery_every_s=0.1, flush_interval_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
    thread.start()
    try:
        sent = 0
        deadline = time.monotonic() + 15
        while ingest.stats.stored < 4:  # PUB drops what it sends before the ingest has connected: keep sending
            assert time.monotonic() < deadline, ingest.stats.summary()
            sent += 1
            sockets[11].send_multipart(dynamo_event(busy(P, "p-0", sent), 11, sent))
            sockets[12].send_multipart(dynamo_event(busy(D, "d-0", sent), 12, sent))
            time.sleep(0.05)
        entries[12].unlink()
        deadline = time.monotonic() + 10
        while len(ingest.endpoints) != 1:
            assert time.monotonic() < deadline, ingest.endpoints
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=10)
        for sock in sockets.values():
            sock.close(linger=0)
    with session_factory(url).begin() as session:
        stored = session.execute(select(FpmSampleRow.component, FpmSampleRow.worker_id).distinct()).all()
    assert sorted(stored) == [("decode", "d-0"), ("prefill", "p-0")]
    assert ingest.stats.dropped.get(DropReason.UNKNOWN_PUBLISHER, 0) == 0


def test_the_ingest_counters_are_prometheus_metrics() -> None:
    """`planner ingest --metrics-port`: every scrape reads the running ingest's counters, the queue's overflow
    (samples lost while Postgres is behind) and the drops by reason among them."""
    import urllib.request

    from planner_core.runtime.ingest_metrics import start_ingest_metrics_server
    from planner_core.runtime.localhost import free_port

    # the URL is never connected to: nothing is flushed, so the queue fills and overflows
    ingest = FpmIngest("postgresql+psycopg://nobody@127.0.0.1:1/none", 1, bind=["tcp://127.0.0.1:*"], max_pending=3)
    port = free_port()
    server, thread = start_ingest_metrics_server(ingest, port)
    try:
        now = dt.datetime.now(dt.UTC)
        for counter in range(5):
            ingest.handle(encode_fpm_message(busy(D, "d-0", counter)), now)
        ingest.handle([b"fpm.decode", b"\xc1"], now)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        ingest.close()
    assert "planner_ingest_messages_received_total 6.0" in text
    assert "planner_ingest_samples_lost_total 2.0" in text  # 5 decoded, 3 kept
    assert "planner_ingest_samples_pending 3.0" in text
    assert 'planner_ingest_messages_dropped_total{reason="not_msgpack"} 1.0' in text
