"""A fake Prometheus over real HTTP for the traffic source's tests: a server answering `/api/v1/query` from a
function of the query (`answers_by_series` for the usual one), with a delay, optionally over TLS, recording the
headers it was sent; and the source under test pointed at it (`prometheus_source`, `collect_window`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable

from planner_core.config import Backend
from planner_core.domain import TrafficObservation
from planner_core.runtime.sources.prometheus import PrometheusOptions, PrometheusTrafficSource, TrafficQueries

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def vector(*values: object) -> bytes:
    """An instant query's answer: one sample per value."""
    result = [{"metric": {}, "value": [1.0, v]} for v in values]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


Answer = tuple[int, bytes]


class FakePrometheus:
    """A real HTTP server answering `/api/v1/query` from `answer(query) -> (status, body)`; records headers."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        fake = self
        self.answer: Callable[[str], Answer] = lambda _query: (200, vector())
        self.delay_s = 0.0
        self.headers: list[dict[str, str]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("query", [""])[0]
                fake.headers.append(dict(self.headers))
                time.sleep(fake.delay_s)
                status, body = fake.answer(query)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client may have given up (timeout test)
                    self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answers_by_series(values: dict[str, object]) -> Callable[[str], Answer]:
    """Answer each query with the value of the first key found in it (None = empty vector); a histogram's
    buckets (`sum by (le)`) with an empty vector (no histogram), unless `values` has a `buckets` answer body."""

    def answer(query: str) -> Answer:
        if query.startswith("sum by (le)"):
            buckets = values.get("buckets")
            return (200, buckets if isinstance(buckets, bytes) else vector())
        for key, value in values.items():
            if key in query:
                return (200, vector() if value is None else vector(str(value)))
        return (200, vector())

    return answer


GOOD = {
    "requests_started_total": "120",
    "input_sequence_tokens": "3000",
    "output_sequence_tokens": "300",
    "time_to_first_token": "0.2",
    "inter_token_latency": "0.01",
    "kv_hit_rate": "0.3",
    "spec_decode": "1.8",
}


def prometheus_source(url: str, **options: object) -> PrometheusTrafficSource:
    """The traffic source on `url` (vLLM's metric names, a 2 s query timeout), with `options` of its own."""
    return PrometheusTrafficSource(
        PrometheusOptions(endpoint=url, timeout_s=2.0, **options), TrafficQueries(backend=Backend.VLLM)
    )


def collect_window(source: PrometheusTrafficSource) -> TrafficObservation:
    """The source's observation of the minute from `T0`."""
    with source:
        return source.collect(T0, T0 + dt.timedelta(seconds=60))
