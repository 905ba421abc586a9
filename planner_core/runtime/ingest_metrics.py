"""The forward-pass ingest's own counters as Prometheus metrics (`planner ingest --metrics-port`).

The ingest's counters live in its process (`IngestStats`), not in Postgres, so this is a collector over the
running ingest: every scrape reads them as they are. Exported, all `planner_ingest_*`: the counters
`messages_received_total`, `samples_stored_total`, `messages_dropped_total{reason}` (undecodable messages, by
`DropReason`), `samples_lost_total` (decoded samples dropped because the queue was full while Postgres was behind,
or refused by Postgres for good: the overflow policy's count), `database_errors_total`, `samples_expired_total`,
and the gauge `samples_pending` (decoded, not yet stored, the batch being written included).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from planner_core.runtime.fpm_wire import DropReason

if TYPE_CHECKING:
    from planner_core.runtime.ingest import FpmIngest

PREFIX = "planner_ingest_"


class IngestCollector:
    """A prometheus_client collector reading a running `FpmIngest`'s counters at each scrape."""

    def __init__(self, ingest: FpmIngest) -> None:
        self.ingest = ingest

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.ingest.stats
        for name, doc, value in (
            ("messages_received", "Messages taken off the ZeroMQ socket.", stats.received),
            ("samples_stored", "Samples committed to Postgres.", stats.stored),
            ("samples_lost", "Decoded samples dropped: queue full while Postgres was behind, or refused.",
             stats.lost_pending),
            ("database_errors", "Failed writes and retention deletes.", stats.db_errors),
            ("samples_expired", "Samples deleted by retention.", stats.expired),
        ):  # fmt: skip
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        dropped = CounterMetricFamily(
            PREFIX + "messages_dropped", "Messages dropped undecoded, by reason.", labels=["reason"]
        )
        for reason in DropReason:
            dropped.add_metric([reason.value], stats.dropped.get(reason, 0))
        yield dropped
        yield GaugeMetricFamily(
            PREFIX + "samples_pending", "Decoded samples not yet stored (the batch being written included).",
            value=self.ingest.num_pending,
        )  # fmt: skip

    def describe(self) -> list[Any]:
        return []


def start_ingest_metrics_server(ingest: FpmIngest, port: int, *, addr: str = "127.0.0.1") -> tuple[Any, Any]:
    """Serve the ingest's `/metrics` on `addr:port` (loopback unless told: unauthenticated) in a daemon thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(IngestCollector(ingest))
    return start_http_server(port, addr=addr, registry=registry)
