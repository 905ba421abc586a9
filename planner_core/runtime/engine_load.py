"""Each engine's load for a scale-down: its in-flight requests from its newest forward-pass sample, and the Dynamo
instance id (the samples' `worker_id`) of a Kubernetes pod.

Role: the connectors' read of which engines are least loaded (`drains` records it), and of what an engine still held
at its last report before it went (`last_in_flight`: what a Kubernetes drain cut). The samples are those the ingest
stored (`fpm_samples`); an engine with no sample in the last `FRESH_S` seconds has an unknown load (None), which the
connectors treat as possibly busy. The engines publish an idle heartbeat when they have nothing to do, so a live
engine does have a recent sample.

Dynamo's Kubernetes discovery names an engine by its pod: the instance id is Rust's `DefaultHasher` (SipHash-1-3
with zero keys) of the pod name, masked to 53 bits (`hash_pod_name` in Dynamo's runtime, `discovery/kube`).
`dynamo_pod_instance_id` computes the same number, checked in the tests against a value Rust printed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from planner_core.runtime.store.fpm import latest_fpm, latest_samples_of

FRESH_S = 10.0  # a sample older than this says nothing of the engine's load now (engines heartbeat every ~1 s)
INSTANCE_ID_MASK = 0x001F_FFFF_FFFF_FFFF  # Dynamo keeps 53 bits: the id survives a JSON number
_M64 = (1 << 64) - 1


def in_flight_by_worker(
    session: Session, deployment_id: int, now: dt.datetime, *, fresh_s: float = FRESH_S
) -> dict[str, int]:
    """worker_id -> requests in flight (summed over its data-parallel ranks) from each engine's newest sample
    received in the last `fresh_s` seconds up to `now`."""
    loads: dict[str, int] = {}
    for fpm in latest_fpm(session, deployment_id, now - dt.timedelta(seconds=fresh_s), until=now):
        loads[fpm.worker_id] = loads.get(fpm.worker_id, 0) + fpm.num_in_flight
    return loads


def engine_in_flight(loads: Mapping[str, int], worker_ids: Iterable[str]) -> int | None:
    """An engine's in-flight requests over its instance ids; None when none of them has a sample (unknown)."""
    known = [loads[w] for w in worker_ids if w in loads]
    return sum(known) if known else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LastLoad:
    """An engine's last report in a time span: its requests in flight (over its ranks) and when the newest arrived."""

    num_in_flight: int
    received_at: dt.datetime


def last_in_flight(
    session: Session, deployment_id: int, worker_ids: Sequence[str], since: dt.datetime, until: dt.datetime
) -> LastLoad | None:
    """The requests in flight of the engine `worker_ids` at its newest sample of each rank received in
    [since, until]; None when it reported nothing then."""
    samples = latest_samples_of(session, deployment_id, worker_ids, since, until)
    if not samples:
        return None
    return LastLoad(
        num_in_flight=sum(s.fpm.num_in_flight for s in samples), received_at=max(s.received_at for s in samples)
    )


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def _sip_round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _M64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 of `data` (Rust's `DefaultHasher`: one compression round, three finalization rounds)."""
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573
    tail_len = len(data) % 8
    for i in range(0, len(data) - tail_len, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0 ^= m
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[len(data) - tail_len :], "little")
    v3 ^= last
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def dynamo_pod_instance_id(pod_name: str) -> str:
    """The instance id (decimal, as `fpm_samples.worker_id` holds it) Dynamo's Kubernetes discovery gives the engine
    of pod `pod_name`: Rust's `str::hash` writes the bytes then 0xFF, into a zero-keyed SipHash-1-3."""
    return str(siphash13(pod_name.encode() + b"\xff") & INSTANCE_ID_MASK)
