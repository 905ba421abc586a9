"""Serve a simulated frontend's metrics on `/metrics`, with Dynamo's names, for a real Prometheus to scrape.

The trace is replayed against the wall clock (optionally sped up) through the discrete-event simulator
(`planner_core.lab.sim.des.ClusterSimulator`): the simulator is run up to the replay offset `(now - started_at) *
speedup` (by a background thread while serving, and before every scrape), and every request is exported along its
simulated timeline, as a frontend sees it:

- at its arrival: `requests_started` (frontend) and `requests` (router: the request is routed);
- at its first token: time to first token, input sequence length (Dynamo's frontend observes the ISL with the
  first token), and the router's KV hit rate;
- at its last token: `requests` (frontend, completed), output sequence length, request duration (arrival to last
  token), OSL - 1 inter-token latency observations of the request's mean token gap (a frontend timing every gap
  after the first token; the simulator knows the mean only) and the speculative-decoding counters.

Exported series, labelled like Dynamo's:

- frontend (`model`, `dynamo_namespace`): `dynamo_frontend_requests_started_total`,
  `dynamo_frontend_requests_total`, the gauge `dynamo_frontend_queued_requests` (arrived, no first token yet),
  histograms `dynamo_frontend_input_sequence_tokens`,
  `dynamo_frontend_output_sequence_tokens`, `dynamo_frontend_time_to_first_token_seconds`,
  `dynamo_frontend_inter_token_latency_seconds`, `dynamo_frontend_request_duration_seconds`;
- router (`dynamo_namespace` with dashes as underscores, `dynamo_component="router"`):
  `dynamo_component_router_requests_total` and the same four histograms under `dynamo_component_router_*`, and
  `dynamo_component_router_kv_hit_rate`: the simulated prefix-cache hit (cached prompt tokens / ISL) when the
  trace has prefix blocks, or the constant given (which overrides it); absent when neither;
- when an accept length is given, vLLM's `vllm:spec_decode_num_drafts_total` and
  `vllm:spec_decode_num_accepted_tokens_total` (`model`, `dynamo_namespace`); the simulator has no speculative
  decoding, so the counters follow the constant.

`set_targets` and `worker_counts` scale and read the live simulated cluster at the current replay offset (an
orchestrator driving the exporter's cluster).
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from planner_core.domain import WorkerCounts
from planner_core.lab.sim.des import ClusterSimulator
from planner_core.lab.sim.des.spec import LATENCY_BUCKETS_S

TOKEN_BUCKETS = tuple(float(2**k) for k in range(4, 18))  # 16 .. 131072 tokens
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
        sim: the simulated cluster (its trace is replayed; it must be at the trace start, `now_s` 0).
        model: the `model` label (the served model's name).
        namespace: the `dynamo_namespace` label.
        speedup: trace seconds per wall-clock second.
        started_at_s: wall-clock epoch seconds of the trace's first request (default: construction time).
        kv_hit_rate: the router's hit rate of every request; default: the simulated prefix-cache hit when the
            trace has prefix blocks (and the simulator caches them), else no hit-rate series.
        accept_length: mean tokens per decode step under speculative decoding, exported when given (>= 1).
        clock: wall clock (epoch seconds).
    """

    def __init__(
        self,
        sim: ClusterSimulator,
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
        if sim.now_s != 0:
            raise ValueError(f"the exporter needs a simulator at the start of its trace, not at {sim.now_s} s")
        self.sim = sim
        self.trace = sim.trace
        self.model = model
        self.namespace = namespace
        self.speedup = speedup
        self.clock = clock
        self.started_at_s = clock() if started_at_s is None else started_at_s
        self.kv_hit_rate = kv_hit_rate
        self.simulated_hit_rate = kv_hit_rate is None and sim.spec.prefix_caching and self.trace.has_hashes
        self.accept_length = accept_length
        self.offset_s = 0.0  # replay offset exported so far (never goes back)
        self.num_started = 0  # requests arrived (a prefix of the trace)
        self.num_completed = 0  # requests whose last token came
        self._arrival_s = np.asarray(self.trace.arrival_s, dtype=float)
        self._isl = np.asarray(self.trace.isl, dtype=float)
        self._osl = np.maximum(np.asarray(self.trace.osl, dtype=float), 1.0)  # the simulator emits >= 1 token
        # Requests in flight, by what they wait for: scanning these (not the whole trace) keeps a scrape cheap.
        self._awaiting_first = np.zeros(0, dtype=np.int64)
        self._awaiting_last = np.zeros(0, dtype=np.int64)
        self._lock = threading.Lock()
        self._isl_hist = _Histogram(TOKEN_BUCKETS)
        self._osl_hist = _Histogram(TOKEN_BUCKETS)
        self._ttft = _Histogram(LATENCY_BUCKETS_S)
        self._itl = _Histogram(LATENCY_BUCKETS_S)
        self._duration = _Histogram(DURATION_BUCKETS_S)
        self._hit = _Histogram(HIT_RATE_BUCKETS)
        self._num_drafts = 0.0
        self._num_accepted = 0.0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._stop = threading.Event()
        self._advancer: threading.Thread | None = None

    # -- replay --

    def replay_offset_s(self) -> float:
        """Trace offset the replay has reached now."""
        return max(0.0, (self.clock() - self.started_at_s) * self.speedup)

    def update(self) -> int:
        """Simulate up to the replay offset now and export what happened; returns the requests started so far."""
        with self._lock:
            self._advance(self.replay_offset_s())
            return self.num_started

    def set_targets(self, num_prefill: int | None, num_decode: int | None) -> None:
        """Ask the simulated cluster for new worker counts at the replay offset now (None leaves a pool alone)."""
        with self._lock:
            self._advance(self.replay_offset_s())
            self.sim.set_targets(num_prefill, num_decode)

    def worker_counts(self) -> WorkerCounts:
        """Ready and expected workers of the simulated cluster at the replay offset now."""
        with self._lock:
            self._advance(self.replay_offset_s())
            return self.sim.worker_counts()

    def _advance(self, offset_s: float) -> None:
        """Run the simulator to `offset_s` and observe the arrivals, first tokens and last tokens up to it."""
        offset_s = max(offset_s, self.offset_s)
        self.sim.run_until(offset_s)
        self.offset_s = offset_s
        num = int(np.searchsorted(self._arrival_s, offset_s, side="right"))
        if num > self.num_started:
            arrived = np.arange(self.num_started, num, dtype=np.int64)
            self._awaiting_first = np.concatenate([self._awaiting_first, arrived])
            self.num_started = num
        if len(self._awaiting_first):
            first_s, _, cached_tokens = self.sim.request_times(self._awaiting_first)
            came = first_s <= offset_s  # NaN (not yet) compares False
            if came.any():
                requests = self._awaiting_first[came]
                self._observe_first_tokens(requests, first_s[came], cached_tokens[came])
                self._awaiting_first = self._awaiting_first[~came]
                self._awaiting_last = np.concatenate([self._awaiting_last, requests])
        if len(self._awaiting_last):
            first_s, finish_s, _ = self.sim.request_times(self._awaiting_last)
            done = finish_s <= offset_s
            if done.any():
                self._observe_last_tokens(self._awaiting_last[done], first_s[done], finish_s[done])
                self._awaiting_last = self._awaiting_last[~done]

    def _observe_first_tokens(self, requests: np.ndarray, first_s: np.ndarray, cached_tokens: np.ndarray) -> None:
        isl = self._isl[requests]
        self._ttft.observe(first_s - self._arrival_s[requests])
        self._isl_hist.observe(isl)
        if self.kv_hit_rate is not None:
            self._hit.observe(np.full(len(requests), self.kv_hit_rate))
        elif self.simulated_hit_rate:
            self._hit.observe(cached_tokens / np.maximum(isl, 1.0))

    def _observe_last_tokens(self, requests: np.ndarray, first_s: np.ndarray, finish_s: np.ndarray) -> None:
        osl = self._osl[requests]
        self.num_completed += len(requests)
        self._osl_hist.observe(osl)
        self._duration.observe(finish_s - self._arrival_s[requests])
        gaps = osl - 1.0  # token gaps after the first token
        decoded = gaps > 0
        self._itl.observe((finish_s[decoded] - first_s[decoded]) / gaps[decoded], weights=gaps[decoded])
        if self.accept_length is not None:
            steps = osl / self.accept_length  # decode steps, each one draft proposal
            self._num_drafts += float(steps.sum())
            self._num_accepted += float((osl - steps).sum())

    # -- Prometheus collector protocol --

    def describe(self) -> list[Metric]:
        return []  # no duplicate-name checks needed, and registering must not advance the replay

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._advance(self.replay_offset_s())
            families = list(self._families())  # a consistent snapshot, built before the lock is released
        return iter(families)

    def _families(self) -> Iterator[Metric]:
        frontend = {"model": self.model, "dynamo_namespace": self.namespace}
        router = {"dynamo_namespace": self.namespace.replace("-", "_"), "dynamo_component": "router"}
        for name, doc, value in (
            ("dynamo_frontend_requests_started", "Requests accepted by the frontend", self.num_started),
            ("dynamo_frontend_requests", "Requests processed by the frontend", self.num_completed),
        ):
            counter = CounterMetricFamily(name, doc, labels=list(frontend))
            counter.add_metric(list(frontend.values()), float(value))
            yield counter
        # requests that arrived and have no first token yet: a Prometheus `avg_over_time` of it over a window, divided
        # by the window's request rate, is the mean time a request waits for its first token (Little's law)
        queued = GaugeMetricFamily(
            "dynamo_frontend_queued_requests", "Requests awaiting a first token", labels=list(frontend)
        )
        queued.add_metric(list(frontend.values()), float(len(self._awaiting_first)))
        yield queued
        counter = CounterMetricFamily("dynamo_component_router_requests", "Requests routed", labels=list(router))
        counter.add_metric(list(router.values()), float(self.num_started))
        yield counter
        for suffix, histogram, doc in (
            ("input_sequence_tokens", self._isl_hist, "Input sequence length (tokens)"),
            ("output_sequence_tokens", self._osl_hist, "Output sequence length (tokens)"),
            ("time_to_first_token_seconds", self._ttft, "Time to first token (s)"),
            ("inter_token_latency_seconds", self._itl, "Time between output tokens (s)"),
        ):
            yield histogram.family(f"dynamo_frontend_{suffix}", doc, frontend)
            yield histogram.family(f"dynamo_component_router_{suffix}", doc, router)
        yield self._duration.family("dynamo_frontend_request_duration_seconds", "Request duration (s)", frontend)
        if self.kv_hit_rate is not None or self.simulated_hit_rate:
            yield self._hit.family("dynamo_component_router_kv_hit_rate", "KV cache hit rate", router)
        if self.accept_length is not None:
            for name, value in (
                ("vllm:spec_decode_num_drafts", self._num_drafts),
                ("vllm:spec_decode_num_accepted_tokens", self._num_accepted),
            ):
                counter = CounterMetricFamily(name, "Speculative decoding (simulated)", labels=list(frontend))
                counter.add_metric(list(frontend.values()), value)
                yield counter

    # -- HTTP --

    def serve(self, port: int = 0, addr: str = "127.0.0.1", *, advance_every_s: float | None = 1.0) -> int:
        """Serve `/metrics` on `addr:port` (0 = a free port) in a background thread; returns the port.

        Another thread advances the simulator every `advance_every_s` wall seconds (None: only scrapes do), so
        the simulation keeps pace with the clock and a scrape only simulates the time since the last step.
        Always in the Prometheus text format 0.0.4: prometheus_client's OpenMetrics output (what Prometheus asks
        for first) turns the colons of vLLM's names into underscores, and the series would not be vLLM's.
        """
        if advance_every_s is not None and not advance_every_s > 0:
            raise ValueError(f"advance_every_s must be > 0 or None, got {advance_every_s!r}")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
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
        if advance_every_s is not None:
            self._stop.clear()
            self._advancer = threading.Thread(target=self._advance_loop, args=(advance_every_s,), daemon=True)
            self._advancer.start()
        return int(server.server_port)

    def _advance_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.update()

    def stop(self) -> None:
        self._stop.set()
        if self._advancer is not None:
            self._advancer.join(timeout=30)
            self._advancer = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
