"""Serve a simulated frontend's metrics on `/metrics`, with Dynamo's names, for a real Prometheus to scrape.

The trace is replayed against the wall clock (optionally sped up): a request counts once its arrival offset is
behind `(now - started_at) * speedup`. Its TTFT and ITL come from the fluid `SimulatedCluster`, advanced in whole
slices as the replay goes (so a scrape never sees a partial slice). Exported series, labelled like Dynamo's:

- frontend (`model`, `dynamo_namespace`): `dynamo_frontend_requests_started_total`,
  `dynamo_frontend_requests_total`, histograms `dynamo_frontend_input_sequence_tokens`,
  `dynamo_frontend_output_sequence_tokens`, `dynamo_frontend_time_to_first_token_seconds`,
  `dynamo_frontend_inter_token_latency_seconds`, `dynamo_frontend_request_duration_seconds`;
- router (`dynamo_namespace` with dashes as underscores, `dynamo_component="router"`):
  `dynamo_component_router_requests_total` and the same four histograms under `dynamo_component_router_*`, and,
  when a hit rate is given, `dynamo_component_router_kv_hit_rate`;
- when an accept length is given, vLLM's `vllm:spec_decode_num_drafts_total` and
  `vllm:spec_decode_num_accepted_tokens_total` (`model`, `dynamo_namespace`).

Simplifications (a fluid model has no per-request timeline): a request is counted as started and completed, and
all its observations are made, at its arrival; ITL is observed once per generated token after the first (OSL - 1
observations of the request's ITL), as a frontend timing every token gap would; the KV hit rate and the accept
length are the given constants (the simulator has no prefix cache and no speculative decoding).
"""

from __future__ import annotations

import http.server
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from planner_core.sim.cluster import SimulatedCluster

TOKEN_BUCKETS = tuple(float(2**k) for k in range(4, 18))  # 16 .. 131072 tokens
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HIT_RATE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# The classic text format every Prometheus reads (prometheus_client now labels its output version 1.0.0).
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class _Histogram:
    """Cumulative state of one histogram: per-bucket counts (last bucket is +Inf), sum and count."""

    bounds: tuple[float, ...]
    counts: np.ndarray = field(init=False)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)

    def observe(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add observations; `weights[i]` repeats `values[i]` that many times."""
        if not len(values):
            return
        index = np.searchsorted(np.asarray(self.bounds), values, side="left")  # le semantics: v <= bound
        self.counts += np.bincount(index, weights=weights, minlength=len(self.counts)).astype(np.int64)
        self.total += float(np.dot(values, weights) if weights is not None else values.sum())

    def family(self, name: str, documentation: str, labels: dict[str, str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=list(labels))
        cumulative = np.cumsum(self.counts)
        buckets = [(floatToGoString(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        family.add_metric(list(labels.values()), buckets=buckets, sum_value=self.total)
        return family


class TraceMetricsExporter:
    """A Prometheus collector of one simulated frontend replaying a trace; `serve()` puts it on HTTP.

    Args:
        cluster: the simulated cluster (its trace is replayed; it must be at the trace start, `now_s` 0).
        model: the `model` label (the served model's name).
        namespace: the `dynamo_namespace` label.
        speedup: trace seconds per wall-clock second.
        started_at_s: wall-clock epoch seconds of the trace's first request (default: construction time).
        kv_hit_rate: the router's predicted hit rate of every request, exported when given.
        accept_length: mean tokens per decode step under speculative decoding, exported when given (>= 1).
        clock: wall clock (epoch seconds).
    """

    def __init__(
        self,
        cluster: SimulatedCluster,
        *,
        model: str,
        namespace: str = "dynamo",
        speedup: float = 1.0,
        started_at_s: float | None = None,
        kv_hit_rate: float | None = None,
        accept_length: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup!r}")
        if kv_hit_rate is not None and not 0 <= kv_hit_rate <= 1:
            raise ValueError(f"kv_hit_rate must be in [0, 1], got {kv_hit_rate!r}")
        if accept_length is not None and not accept_length >= 1:
            raise ValueError(f"accept_length must be >= 1, got {accept_length!r}")
        if cluster.now_s != 0 or cluster.slices:
            raise ValueError("the exporter needs a cluster at the start of its trace")
        cluster.keep_request_latencies = True
        self.cluster = cluster
        self.trace = cluster.trace
        self.model = model
        self.namespace = namespace
        self.speedup = speedup
        self.clock = clock
        self.started_at_s = clock() if started_at_s is None else started_at_s
        self.kv_hit_rate = kv_hit_rate
        self.accept_length = accept_length
        self.num_exported = 0  # requests counted so far (a prefix of the trace)
        self._lock = threading.Lock()
        self._ttft_ms = np.zeros(0)
        self._itl_ms = np.zeros(0)
        self._isl = _Histogram(TOKEN_BUCKETS)
        self._osl = _Histogram(TOKEN_BUCKETS)
        self._ttft = _Histogram(LATENCY_BUCKETS_S)
        self._itl = _Histogram(LATENCY_BUCKETS_S)
        self._duration = _Histogram(DURATION_BUCKETS_S)
        self._hit = _Histogram(HIT_RATE_BUCKETS)
        self._num_drafts = 0.0
        self._num_accepted = 0.0
        self._server = None

    # -- replay --

    def replay_offset_s(self) -> float:
        """Trace offset the replay has reached now."""
        return max(0.0, (self.clock() - self.started_at_s) * self.speedup)

    def _latencies_through(self, num: int) -> None:
        """Simulate whole slices until the first `num` requests have latencies."""
        slice_s = self.cluster.spec.slice_s
        if num > len(self._ttft_ms):
            last_arrival_s = float(self.trace.arrival_s[num - 1])
            self.cluster.advance((math.floor(last_arrival_s / slice_s) + 1) * slice_s)  # a slice is [start, end)
            self._ttft_ms = np.concatenate([np.zeros(0), *self.cluster.request_ttft_ms])
            self._itl_ms = np.concatenate([np.zeros(0), *self.cluster.request_itl_ms])

    def update(self) -> int:
        """Count the requests that have arrived by now; returns how many are counted in total."""
        with self._lock:
            num = int(np.searchsorted(self.trace.arrival_s, self.replay_offset_s(), side="right"))
            if num <= self.num_exported:
                return self.num_exported
            self._latencies_through(num)
            new = slice(self.num_exported, num)
            isl, osl = self.trace.isl[new].astype(float), self.trace.osl[new].astype(float)
            ttft_s, itl_s = self._ttft_ms[new] / 1000.0, self._itl_ms[new] / 1000.0
            gaps = np.maximum(osl - 1.0, 0.0)  # token gaps after the first token
            self._isl.observe(isl)
            self._osl.observe(osl)
            self._ttft.observe(ttft_s)
            self._itl.observe(itl_s, weights=gaps)
            self._duration.observe(ttft_s + itl_s * gaps)
            if self.kv_hit_rate is not None:
                self._hit.observe(np.full(len(isl), self.kv_hit_rate))
            if self.accept_length is not None:
                steps = osl / self.accept_length  # decode steps, each one draft proposal
                self._num_drafts += float(steps.sum())
                self._num_accepted += float((osl - steps).sum())
            self.num_exported = num
            return num

    # -- Prometheus collector protocol --

    def describe(self) -> list[Metric]:
        return []  # no duplicate-name checks needed, and registering must not advance the replay

    def collect(self) -> Iterator[Metric]:
        num = self.update()
        frontend = {"model": self.model, "dynamo_namespace": self.namespace}
        router = {"dynamo_namespace": self.namespace.replace("-", "_"), "dynamo_component": "router"}
        for name, doc in (
            ("dynamo_frontend_requests_started", "Requests accepted by the frontend"),
            ("dynamo_frontend_requests", "Requests processed by the frontend"),
        ):
            counter = CounterMetricFamily(name, doc, labels=list(frontend))
            counter.add_metric(list(frontend.values()), float(num))
            yield counter
        counter = CounterMetricFamily("dynamo_component_router_requests", "Requests routed", labels=list(router))
        counter.add_metric(list(router.values()), float(num))
        yield counter
        for suffix, histogram, doc in (
            ("input_sequence_tokens", self._isl, "Input sequence length (tokens)"),
            ("output_sequence_tokens", self._osl, "Output sequence length (tokens)"),
            ("time_to_first_token_seconds", self._ttft, "Time to first token (s)"),
            ("inter_token_latency_seconds", self._itl, "Time between output tokens (s)"),
        ):
            yield histogram.family(f"dynamo_frontend_{suffix}", doc, frontend)
            yield histogram.family(f"dynamo_component_router_{suffix}", doc, router)
        yield self._duration.family("dynamo_frontend_request_duration_seconds", "Request duration (s)", frontend)
        if self.kv_hit_rate is not None:
            yield self._hit.family("dynamo_component_router_kv_hit_rate", "Predicted KV cache hit rate", router)
        if self.accept_length is not None:
            for name, value in (
                ("vllm:spec_decode_num_drafts", self._num_drafts),
                ("vllm:spec_decode_num_accepted_tokens", self._num_accepted),
            ):
                counter = CounterMetricFamily(name, "Speculative decoding (simulated)", labels=list(frontend))
                counter.add_metric(list(frontend.values()), value)
                yield counter

    # -- HTTP --

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> int:
        """Serve `/metrics` on `addr:port` (0 = a free port) in a background thread; returns the port.

        Always in the Prometheus text format 0.0.4: prometheus_client's OpenMetrics output (what Prometheus asks
        for first) turns the colons of vLLM's names into underscores, and the series would not be vLLM's.
        """
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", TEXT_FORMAT)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass  # one line per scrape would drown everything else

        server = http.server.ThreadingHTTPServer((addr, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._server = server
        return int(server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
