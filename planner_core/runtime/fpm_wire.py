"""Forward-pass metrics on the wire: the `fpm.<pool>` message (msgpack, Dynamo's `ForwardPassMetrics` field names)
and Dynamo's own event envelope, decoded strictly (`decode_fpm_message`, `decode_dynamo_fpm_event`; a bad message
raises `FpmDecodeError` with its `DropReason`) and encoded (`encode_fpm_message`), the discovery of Dynamo's
publishers, and a publisher for tests and trials (`FpmPublisher`, `synthetic_fpm`). The ingest
(`planner_core.runtime.ingest`) stores what this decodes."""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import zmq

from planner_core.domain import Component, ForwardPassMetrics, QueuedRequests, ScheduledRequests

TOPIC_PREFIX = b"fpm."
# Dynamo's event plane (its engines' own publishers): the topic, and the envelope's format byte and header.
DYNAMO_FPM_TOPIC = b"forward-pass-metrics"
DYNAMO_ENVELOPE_FORMAT = 1
_ENVELOPE_HEADER = struct.Struct(">BI")
MAX_MESSAGE_BYTES = 64 * 1024  # a real message is ~250 bytes; anything near this is not forward-pass metrics


SCHEMA_VERSION = 1  # the version this code writes in `encode_fpm_message`


_MAX_INT32 = 2**31 - 1  # columns stored as INTEGER
_MAX_INT64 = 2**63 - 1  # columns stored as BIGINT
_MAX_WORKER_ID_CHARS = 200  # fpm_samples.worker_id

_SCHEDULED_INTS = {
    "num_prefill_requests": _MAX_INT32,
    "sum_prefill_tokens": _MAX_INT64,
    "sum_prefill_kv_tokens": _MAX_INT64,
    "num_decode_requests": _MAX_INT32,
    "sum_decode_kv_tokens": _MAX_INT64,
}
_SCHEDULED_FLOATS = ("var_prefill_length", "var_decode_kv_tokens")
_QUEUED_INTS = {
    "num_prefill_requests": _MAX_INT32,
    "sum_prefill_tokens": _MAX_INT64,
    "num_decode_requests": _MAX_INT32,
    "sum_decode_kv_tokens": _MAX_INT64,
}
_QUEUED_FLOATS = ("var_prefill_length", "var_decode_kv_tokens")


class DropReason(enum.StrEnum):
    """Why a message was dropped instead of stored."""

    OVERSIZED = "oversized"  # payload larger than the ingest's max_message_bytes
    BAD_FRAMES = "bad_frames"  # not [topic, payload], or a topic other than fpm.prefill / fpm.decode
    NOT_MSGPACK = "not_msgpack"  # the payload is not exactly one msgpack value
    BAD_SCHEMA = "bad_schema"  # msgpack, but not a ForwardPassMetrics (field missing, mistyped or out of range)
    UNKNOWN_PUBLISHER = "unknown_publisher"  # a Dynamo event from a publisher not (or no longer) in the discovery


class FpmDecodeError(ValueError):
    """A message that is not a forward-pass metrics message; `reason` classifies it, the text says where."""

    def __init__(self, reason: DropReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


# --- wire format ---------------------------------------------------------------------------------------------


def _schema_error(where: str, value: Any, expected: str) -> FpmDecodeError:
    shown = repr(value)
    return FpmDecodeError(DropReason.BAD_SCHEMA, f"{where} = {shown[:60]}: expected {expected}")


def _int_field(obj: Mapping[str, Any], key: str, where: str, high: int, default: int = 0) -> int:
    value = obj.get(key, default)
    if type(value) is not int or not 0 <= value <= high:  # bool is an int subclass: refused on purpose
        raise _schema_error(f"{where}{key}", value, f"an integer in [0, {high}]")
    return value


def _float_field(obj: Mapping[str, Any], key: str, where: str) -> float:
    value = obj.get(key, 0.0)
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise _schema_error(f"{where}{key}", value, "a finite number >= 0")
    return float(value)


def _map_field(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key, {})
    if not isinstance(value, dict):
        raise _schema_error(key, value, "a map")
    return value


def decode_fpm_message(
    frames: Sequence[bytes], *, max_bytes: int = MAX_MESSAGE_BYTES
) -> tuple[ForwardPassMetrics, int | None]:
    """Decode one ZMQ message (topic and payload frames) strictly.

    Returns:
        The metrics (idle heartbeats included: `is_idle_heartbeat`) and the schema version the engine wrote
        (None when absent).

    Raises:
        FpmDecodeError: with the `DropReason` and where the message is wrong.
    """
    if len(frames) != 2:
        raise FpmDecodeError(DropReason.BAD_FRAMES, f"{len(frames)} frames, expected 2 (topic, payload)")
    topic, payload = frames
    if len(payload) > max_bytes:
        raise FpmDecodeError(DropReason.OVERSIZED, f"payload of {len(payload)} bytes, limit {max_bytes}")
    if not topic.startswith(TOPIC_PREFIX):
        raise FpmDecodeError(DropReason.BAD_FRAMES, f"topic {topic[:40]!r} does not start with {TOPIC_PREFIX!r}")
    try:
        component = Component(topic[len(TOPIC_PREFIX) :].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise FpmDecodeError(DropReason.BAD_FRAMES, f"unknown pool in topic {topic[:40]!r}") from None
    return _decode_metrics(component, _unpack(payload))


def _unpack(payload: bytes) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=True)  # the caller bounded its size
    except Exception as exc:  # msgpack raises many types (ExtraData, FormatError, StackError, ...): all mean garbage
        raise FpmDecodeError(DropReason.NOT_MSGPACK, f"{type(exc).__name__}: {str(exc)[:80]}") from None


def decode_dynamo_fpm_event(
    frames: Sequence[bytes], components: Mapping[int, Component], *, max_bytes: int = MAX_MESSAGE_BYTES
) -> tuple[ForwardPassMetrics, int | None]:
    """Decode one message of Dynamo's event plane on its `forward-pass-metrics` topic, as Dynamo 1.6.1's engines
    (and its mocker) publish them on the ZMQ socket each binds and registers in the discovery store.

    Four frames: the topic, the publisher's id (8 bytes, big-endian), the sequence number (8 bytes), and the
    envelope: a format byte (1), the length of what follows (4 bytes, big-endian) and a msgpack map
    `{publisher_id, sequence, published_at, topic, payload}` whose `payload` is the msgpack `ForwardPassMetrics`
    this module's own messages carry. Neither says which pool the engine serves: `components` maps each
    publisher id found in the discovery store (`discover_dynamo_fpm_publishers`) to its pool.

    Raises:
        FpmDecodeError: as `decode_fpm_message`; `UNKNOWN_PUBLISHER` for a publisher not in `components`.
    """
    if len(frames) != 4 or frames[0] != DYNAMO_FPM_TOPIC:
        raise FpmDecodeError(
            DropReason.BAD_FRAMES, f"{len(frames)} frames on topic {frames[0][:40]!r}, expected Dynamo's 4 on "
            f"{DYNAMO_FPM_TOPIC!r}" if frames else "no frames",
        )  # fmt: skip
    envelope = frames[3]
    if len(envelope) > max_bytes:
        raise FpmDecodeError(DropReason.OVERSIZED, f"envelope of {len(envelope)} bytes, limit {max_bytes}")
    if len(frames[1]) != 8 or len(frames[2]) != 8:
        raise FpmDecodeError(DropReason.BAD_FRAMES, "publisher id and sequence must be 8 bytes each")
    publisher_id = int.from_bytes(frames[1], "big")
    if len(envelope) < _ENVELOPE_HEADER.size:
        raise FpmDecodeError(DropReason.BAD_FRAMES, f"envelope of {len(envelope)} bytes: no header")
    envelope_format, length = _ENVELOPE_HEADER.unpack_from(envelope)
    if envelope_format != DYNAMO_ENVELOPE_FORMAT or length != len(envelope) - _ENVELOPE_HEADER.size:
        raise FpmDecodeError(
            DropReason.BAD_FRAMES, f"envelope format {envelope_format}, length {length} for "
            f"{len(envelope) - _ENVELOPE_HEADER.size} bytes (expected format {DYNAMO_ENVELOPE_FORMAT})",
        )  # fmt: skip
    outer = _unpack(envelope[_ENVELOPE_HEADER.size :])
    if not isinstance(outer, dict) or not isinstance(outer.get("payload"), bytes):
        raise _schema_error("envelope", outer, "a map with a binary payload")
    component = components.get(publisher_id)
    if component is None:
        raise FpmDecodeError(DropReason.UNKNOWN_PUBLISHER, f"publisher {publisher_id} is not in the discovery store")
    return _decode_metrics(component, _unpack(outer["payload"]))


def discover_dynamo_fpm_publishers(discovery_dir: Path) -> dict[str, tuple[int, Component]]:
    """The forward-pass metrics publishers registered in a Dynamo file discovery store (`DYN_FILE_KV`): their ZMQ
    endpoint -> (publisher id, pool). The pool is the registering endpoint's component: `prefill` for prefill
    engines, the decode pool otherwise (decode engines, and aggregated ones, whose one pool is counted as decode).
    Entries that cannot be read (being written, removed meanwhile) are skipped: the next scan sees them."""
    import json

    found: dict[str, tuple[int, Component]] = {}
    channels = discovery_dir / "v1" / "event_channels"
    try:
        entries = list(channels.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            channel = json.loads(entry.read_text(encoding="utf-8"))
            if channel.get("topic") != DYNAMO_FPM_TOPIC.decode() or channel["transport"]["kind"] != "Zmq":
                continue
            endpoint = channel["transport"]["config"]["endpoint"]
            component_name = channel["scope"]["endpoint"]["component"]
            publisher_id = int(channel["instance_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found[endpoint] = (publisher_id, Component.PREFILL if component_name == "prefill" else Component.DECODE)
    return found


def _decode_metrics(component: Component, body: Any) -> tuple[ForwardPassMetrics, int | None]:
    """The `ForwardPassMetrics` of a decoded msgpack body (strict: module docstring)."""
    if not isinstance(body, dict):
        raise _schema_error("message", body, "a map")
    worker_id = body.get("worker_id", "")
    if not isinstance(worker_id, str) or not 0 < len(worker_id) <= _MAX_WORKER_ID_CHARS or "\x00" in worker_id:
        # An empty worker id cannot be told apart from other engines' samples (Dynamo saw it after restores);
        # Postgres text cannot hold NUL, and one such row would make every flush of its batch fail.
        raise _schema_error("worker_id", worker_id, f"a string of 1..{_MAX_WORKER_ID_CHARS} characters, no NUL")
    version = body.get("version")
    if version is not None and (type(version) is not int or not 0 <= version <= _MAX_INT32):
        raise _schema_error("version", version, "an integer >= 0")
    scheduled = _map_field(body, "scheduled_requests")
    queued = _map_field(body, "queued_requests")
    fpm = ForwardPassMetrics(
        component=component,
        worker_id=worker_id,
        dp_rank=_int_field(body, "dp_rank", "", _MAX_INT32),
        counter_id=_int_field(body, "counter_id", "", _MAX_INT64),
        wall_time_s=_float_field(body, "wall_time", ""),
        scheduled=ScheduledRequests(
            **{k: _int_field(scheduled, k, "scheduled_requests.", high) for k, high in _SCHEDULED_INTS.items()},
            **{k: _float_field(scheduled, k, "scheduled_requests.") for k in _SCHEDULED_FLOATS},
        ),
        queued=QueuedRequests(
            **{k: _int_field(queued, k, "queued_requests.", high) for k, high in _QUEUED_INTS.items()},
            **{k: _float_field(queued, k, "queued_requests.") for k in _QUEUED_FLOATS},
        ),
    )
    return fpm, version


def encode_fpm_message(fpm: ForwardPassMetrics, *, version: int | None = SCHEMA_VERSION) -> list[bytes]:
    """The two frames an engine publishes for `fpm` (the inverse of `decode_fpm_message`)."""
    body: dict[str, Any] = {
        "worker_id": fpm.worker_id,
        "dp_rank": fpm.dp_rank,
        "counter_id": fpm.counter_id,
        "wall_time": fpm.wall_time_s,
        "scheduled_requests": dataclasses.asdict(fpm.scheduled),
        "queued_requests": dataclasses.asdict(fpm.queued),
    }
    if version is not None:
        body["version"] = version
    return [TOPIC_PREFIX + fpm.component.value.encode("ascii"), msgpack.packb(body, use_bin_type=True)]


def synthetic_fpm(
    component: Component, worker_id: str, counter_id: int, rng: random.Random, *, dp_rank: int = 0
) -> ForwardPassMetrics:
    """A plausible busy iteration of one engine (for the publisher helper and trials, not a performance model)."""
    num_decode = rng.randint(1, 64)
    num_prefill = rng.randint(0, 4) if component is Component.PREFILL else 0
    prefill_tokens = num_prefill * rng.randint(256, 4096)
    decode_kv = num_decode * rng.randint(500, 4000)
    wall_time_s = 0.004 + prefill_tokens * 2e-6 + decode_kv * 1e-8
    return ForwardPassMetrics(
        component=component,
        worker_id=worker_id,
        dp_rank=dp_rank,
        counter_id=counter_id,
        wall_time_s=wall_time_s,
        scheduled=ScheduledRequests(
            num_prefill_requests=num_prefill,
            sum_prefill_tokens=prefill_tokens,
            num_decode_requests=num_decode if component is Component.DECODE else 0,
            sum_decode_kv_tokens=decode_kv if component is Component.DECODE else 0,
        ),
        queued=QueuedRequests(num_prefill_requests=rng.randint(0, 3), sum_prefill_tokens=rng.randint(0, 8000)),
    )


# --- publisher (tests and trials) -----------------------------------------------------------------------------


class FpmPublisher:
    """Publishes forward-pass metrics the way an engine does: a PUB socket connected to the ingest.

    It is an XPUB socket, so `wait_for_subscriber` can block until the ingest's subscription has arrived
    (a PUB socket silently drops everything sent before that).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        context: zmq.Context | None = None,
        server_public_key: bytes | None = None,
        client_certificate: Path | None = None,
    ) -> None:
        """`server_public_key` and `client_certificate` (a secret key file): talk CURVE to an ingest that asks."""
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.XPUB)
        if server_public_key is not None and client_certificate is not None:
            from zmq.auth import load_certificate

            public_key, secret_key = load_certificate(client_certificate)
            self._socket.curve_serverkey = server_public_key
            self._socket.curve_publickey = public_key
            self._socket.curve_secretkey = secret_key
        self._socket.setsockopt(zmq.LINGER, 2000)
        self._socket.setsockopt(zmq.SNDHWM, 1_000_000)
        self._socket.connect(endpoint)
        self.num_sent = 0

    def wait_for_subscriber(self, timeout_s: float = 10.0) -> bool:
        """True once a subscriber has subscribed (the ingest subscribes to the `fpm.` prefix).

        ZMQ sends a SUB socket's subscription to a new peer only when its owner next uses the socket, so the
        ingest must be running (polling) for this to return True.
        """
        if self._socket.poll(int(timeout_s * 1000), zmq.POLLIN):
            self._socket.recv()  # the subscription message itself
            return True
        return False

    def publish(self, fpm: ForwardPassMetrics, *, version: int | None = SCHEMA_VERSION) -> None:
        self.send_frames(encode_fpm_message(fpm, version=version))

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Send arbitrary frames (tests send garbage this way)."""
        self._socket.send_multipart(list(frames))
        self.num_sent += 1

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> FpmPublisher:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
