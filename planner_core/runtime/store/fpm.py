"""Repository of raw forward-pass metrics samples (`fpm_samples`), inside a caller-owned transaction.

The ingest (`planner_core.runtime.ingest`) inserts decoded messages in batches and deletes expired ones; the load tick
reads the newest sample per engine. Like every repository here, these functions never commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Select, delete, select
from sqlalchemy.orm import Session

from planner_core.domain import Component, ForwardPassMetrics, QueuedRequests, ScheduledRequests
from planner_core.runtime.store.models import FpmSampleRow

_SCHEDULED_FIELDS = (
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "sum_prefill_kv_tokens",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
)
_QUEUED_FIELDS = (
    "num_prefill_requests",
    "sum_prefill_tokens",
    "var_prefill_length",
    "num_decode_requests",
    "sum_decode_kv_tokens",
    "var_decode_kv_tokens",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FpmSample:
    """A decoded forward-pass metrics message, when it arrived, and the schema version the engine wrote."""

    fpm: ForwardPassMetrics
    received_at: dt.datetime
    version: int | None = None


_COLUMNS = (
    "deployment_id",
    "received_at",
    "component",
    "worker_id",
    "dp_rank",
    "counter_id",
    "version",
    "wall_time_s",
    *(f"scheduled_{name}" for name in _SCHEDULED_FIELDS),
    *(f"queued_{name}" for name in _QUEUED_FIELDS),
)


def _row(deployment_id: int, sample: FpmSample) -> tuple[object, ...]:
    """One sample as a row in `_COLUMNS` order."""
    fpm = sample.fpm
    scheduled, queued = fpm.scheduled, fpm.queued
    return (
        deployment_id,
        sample.received_at,
        fpm.component.value,
        fpm.worker_id,
        fpm.dp_rank,
        fpm.counter_id,
        sample.version,
        fpm.wall_time_s,
        *(getattr(scheduled, name) for name in _SCHEDULED_FIELDS),
        *(getattr(queued, name) for name in _QUEUED_FIELDS),
    )


def insert_fpm_samples(session: Session, deployment_id: int, samples: Sequence[FpmSample]) -> int:
    """Insert samples with one COPY on the session's connection (inside its transaction); returns how many.

    COPY rather than a multi-row INSERT: the ingest writes thousands of samples per second and COPY costs a
    fraction of the per-row work (measured in the README).
    """
    if not samples:
        return 0
    connection = session.connection().connection.driver_connection  # the psycopg connection of this transaction
    with connection.cursor() as cursor, cursor.copy(f"COPY fpm_samples ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
        for sample in samples:
            copy.write_row(_row(deployment_id, sample))
    return len(samples)


def _to_fpm(row: FpmSampleRow) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        component=Component(row.component),
        worker_id=row.worker_id,
        dp_rank=row.dp_rank,
        counter_id=row.counter_id,
        wall_time_s=row.wall_time_s,
        scheduled=ScheduledRequests(**{name: getattr(row, f"scheduled_{name}") for name in _SCHEDULED_FIELDS}),
        queued=QueuedRequests(**{name: getattr(row, f"queued_{name}") for name in _QUEUED_FIELDS}),
    )


def _newest_per_engine(conditions: list) -> Select[tuple[FpmSampleRow]]:
    """The newest sample row per engine (component, worker_id, dp_rank) among those matching `conditions`."""
    return (
        select(FpmSampleRow)
        .where(*conditions)
        .distinct(FpmSampleRow.component, FpmSampleRow.worker_id, FpmSampleRow.dp_rank)
        .order_by(
            FpmSampleRow.component,
            FpmSampleRow.worker_id,
            FpmSampleRow.dp_rank,
            FpmSampleRow.received_at.desc(),
            FpmSampleRow.id.desc(),
        )
    )


def latest_fpm(
    session: Session, deployment_id: int, since: dt.datetime, *, until: dt.datetime | None = None
) -> tuple[ForwardPassMetrics, ...]:
    """The newest sample per engine (component, worker_id, dp_rank) received in [since, until].

    Ordered by component, worker and rank, so the same samples always give the same tick inputs. An engine that
    published nothing in the interval (idle, or gone) is absent. `until` (None = no bound) keeps a tick that
    runs late from seeing samples that arrived after its scheduled time.
    """
    conditions = [FpmSampleRow.deployment_id == deployment_id, FpmSampleRow.received_at >= since]
    if until is not None:
        conditions.append(FpmSampleRow.received_at <= until)
    return tuple(_to_fpm(row) for row in session.scalars(_newest_per_engine(conditions)))


def latest_samples_of(
    session: Session, deployment_id: int, worker_ids: Sequence[str], since: dt.datetime, until: dt.datetime
) -> tuple[FpmSample, ...]:
    """The newest sample of each data-parallel rank of the engines `worker_ids` received in [since, until], with
    when it arrived (a drain's end: what the engine last reported before it went)."""
    if not worker_ids:
        return ()
    conditions = [
        FpmSampleRow.deployment_id == deployment_id,
        FpmSampleRow.worker_id.in_(list(worker_ids)),
        FpmSampleRow.received_at >= since,
        FpmSampleRow.received_at <= until,
    ]
    rows = session.scalars(_newest_per_engine(conditions))
    return tuple(FpmSample(fpm=_to_fpm(row), received_at=row.received_at, version=row.version) for row in rows)


def delete_fpm_samples_before(
    session: Session, deployment_id: int, before: dt.datetime, *, batch_size: int = 10_000
) -> int:
    """Delete at most `batch_size` samples received before `before` (oldest first); returns how many.

    Call it in its own short transaction until it returns less than `batch_size`: one huge DELETE would hold
    its row locks and bloat the WAL for as long as it runs.
    """
    oldest = (
        select(FpmSampleRow.id)
        .where(FpmSampleRow.deployment_id == deployment_id, FpmSampleRow.received_at < before)
        .order_by(FpmSampleRow.received_at)
        .limit(batch_size)
    )
    result = session.execute(
        delete(FpmSampleRow).where(FpmSampleRow.id.in_(oldest)).execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)
