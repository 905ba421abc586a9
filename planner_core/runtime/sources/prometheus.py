"""Traffic from Prometheus: PromQL over the series a Dynamo frontend (or its KV router) exports.

For a window [start, end) of length W the source asks Prometheus, at time `end`, for:

- requests: `sum(increase(<requests_started_total>[W]))`, falling back to `<requests_total>` (completed requests)
  when the started counter is not exported;
- means of ISL, OSL, TTFT and ITL: `sum(increase(<histogram>_sum[W])) / sum(increase(<histogram>_count[W]))`,
  which weighs every request equally whichever frontend served it;
- the router's predicted KV-cache hit rate (`dynamo_component_router_kv_hit_rate`, same mean);
- the speculative-decoding accept length from the engines' own series (vLLM `1 + accepted / drafts`, SGLang
  `spec_accept_length`, TRT-LLM `spec_decode_acceptance_length`).

For the window's prompt-arrival curve (`arrivals`, `planner_core.arrivals`) it asks for raw counters over
[start - LOOKBACK_S, end], one range query each (`/api/v1/query_range`, step `prometheus_arrival_resolution_seconds`):
the started-requests counter (same fallback) and the ISL histogram's `_sum` and `_count`. Consecutive points of
each series are diffed into per-step increments (a decrease is a counter reset: the counter restarted from 0, as
Prometheus' `increase` reads it), summed over series, and each step's requests are spread evenly over it with the
step's mean ISL (the window's mean where the step has no ISL observation: the frontend observes the ISL at the
first token, not at arrival).

Series names, labels and formulas are Dynamo's (`throughput_metrics_source: frontend | router`), so a Prometheus
that serves a Dynamo deployment serves this planner unchanged. Frontend series are selected by
`dynamo_namespace` and, when the config names a model, by `model` (case-insensitive, as the frontend lowercases
it); router series by `dynamo_namespace` with dashes turned into underscores (how Dynamo labels them).

Answers are checked strictly: a transport failure, a non-2xx status, an error status, a body that is not a
Prometheus instant vector (a range matrix for the curve), a missing series, or a value that is NaN where a number
is needed, negative, infinite or implausibly large all raise `TrafficUnavailable`, never a guess. An idle window
(the counters exist and did not move) is zero traffic, with ISL and OSL 0.

Every query has an overall deadline of `timeout_s`, connection, headers and body together: httpx's timeouts bound
each read, so a server dripping a byte a second would otherwise hold a query for as long as it likes. At the
deadline the query's socket is shut down (`_QueryDeadline`) and the query is `unreachable`.

The queries are `planner_core.runtime.sources.promql`; checking the answers and turning them into an observation
and arrivals is `planner_core.runtime.sources.prometheus_answers` (pure); this module asks, and re-exports both
modules' public names.
"""

from __future__ import annotations

import datetime as dt
import math
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from planner_core.arrivals import LOOKBACK_S, RequestArrivals
from planner_core.config import PlannerConfig, ServiceConfig
from planner_core.domain import TrafficObservation
from planner_core.runtime.redact import register_secrets_of
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources.base import NoTrafficDataKind, TrafficUnavailable
from planner_core.runtime.sources.prometheus_answers import (
    KV_HIT_RATE_SLACK,
    MAX_ACCEPT_LENGTH,
    MAX_ANSWER_BYTES,
    MAX_LATENCY_S,
    MAX_RANGE_ANSWER_BYTES,
    MAX_RANGE_POINTS,
    MAX_REQUESTS_PER_S,
    MAX_SEQUENCE_TOKENS,
    RangeSeries,
    RawAnswers,
    StepGrid,
    arrivals_from_increments,
    histogram_from_buckets,
    observation_from_answers,
    parse_bucket_answer,
    parse_instant_answer,
    parse_range_answer,
    step_increments,
)
from planner_core.runtime.sources.promql import (
    FRONTEND_SERIES,
    KV_HIT_RATE_HISTOGRAM,
    ROUTER_SERIES,
    TrafficQueries,
    TrafficSeries,
    label_selector,
    range_of,
    router_namespace,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrometheusOptions:
    """How to reach Prometheus. `bearer_token_file` is re-read on every collection (rotated tokens)."""

    endpoint: str
    bearer_token: str | None = None
    bearer_token_file: Path | None = None
    ca_bundle: Path | None = None
    verify_tls: bool = True
    timeout_s: float = 10.0
    # all the queries of one window together (`collect` and `arrivals`): a dozen sequential queries at 10 s each
    # could hold a tick two minutes
    window_deadline_s: float = 30.0
    arrival_resolution_s: float = 1.0  # step of the arrival-curve range queries (`ServiceConfig`)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_deadline_s) and self.window_deadline_s > 0):
            raise ValueError(f"window_deadline_s = {self.window_deadline_s!r}: must be a finite number > 0")
        if not (math.isfinite(self.arrival_resolution_s) and self.arrival_resolution_s > 0):
            raise ValueError(f"arrival_resolution_s = {self.arrival_resolution_s!r}: must be a finite number > 0")

    @classmethod
    def from_settings(
        cls, endpoint: str, settings: RuntimeSettings, service: ServiceConfig | None = None
    ) -> PrometheusOptions:
        """Connection settings from the environment; the arrival resolution from the config's service settings."""
        token = settings.prometheus_token
        service = service or ServiceConfig()
        register_secrets_of(endpoint)  # the config file's endpoint is not among the settings' (registered there)
        return cls(
            endpoint=endpoint,
            bearer_token=token.get_secret_value() if token is not None else None,
            bearer_token_file=settings.prometheus_token_file,
            ca_bundle=settings.prometheus_ca_bundle,
            verify_tls=settings.prometheus_ssl_verify,
            timeout_s=settings.prometheus_timeout_s,
            window_deadline_s=settings.prometheus_window_deadline_s,
            arrival_resolution_s=service.prometheus_arrival_resolution_seconds,
        )


def _tls_verify(options: PrometheusOptions) -> ssl.SSLContext | bool:
    if not options.verify_tls:
        return False
    if options.ca_bundle is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(options.ca_bundle))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"Prometheus CA bundle {options.ca_bundle}: cannot be used ({exc})") from exc


class _QueryDeadline:
    """The overall deadline of one query: when it passes, the query's socket is shut down, which ends a blocked read
    at once (httpx's own timeouts restart at every byte received).

    The socket is learnt from httpcore's trace events as the connection is made (and again after the TLS
    handshake, which wraps it); a deadline passing before that cuts it as soon as it is known.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._expires_at = time.monotonic() + timeout_s
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._expired = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event_name: str, info: dict) -> None:
        """httpcore's trace hook: remember the connection's socket (plain, then TLS-wrapped)."""
        if event_name not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with self._lock:
            self._socket = sock
            expired = self._expired
        if expired and sock is not None:
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            sock = self._socket
        if sock is not None:
            _shut(sock)

    def check(self) -> None:
        """Raise `unreachable` once the deadline has passed."""
        if self._expired or time.monotonic() >= self._expires_at:
            raise TrafficUnavailable(
                NoTrafficDataKind.UNREACHABLE, f"no complete answer within the {self.timeout_s:g} s query deadline"
            )

    def cancel(self) -> None:
        self._timer.cancel()


class _WindowDeadline:
    """The deadline of all the queries of one window (`PrometheusOptions.window_deadline_s`), from its first query:
    each query gets the smaller of its own timeout and what is left of the window's."""

    def __init__(self, window: tuple[dt.datetime, dt.datetime], deadline_s: float) -> None:
        self.window, self.deadline_s = window, deadline_s
        self._expires_at = time.monotonic() + deadline_s

    def remaining_s(self) -> float:
        return self._expires_at - time.monotonic()

    def passed(self) -> TrafficUnavailable:
        return TrafficUnavailable(
            NoTrafficDataKind.WINDOW_DEADLINE, f"the window's queries ran past its {self.deadline_s:g} s deadline"
        )


def _shut(sock: socket.socket) -> None:
    """End every blocked read and write on `sock` (close() from another thread would not wake a blocked recv)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


class PrometheusTrafficSource:
    """Frontend traffic of a window, read from Prometheus (see the module docstring for the queries).

    One HTTP client (connection pool) per source; close it with `close()` or use the source as a context manager.
    """

    def __init__(self, options: PrometheusOptions, queries: TrafficQueries) -> None:
        """Raises ValueError (one line) when the CA bundle cannot be loaded."""
        self.options = options
        self.queries = queries
        self._window: _WindowDeadline | None = None
        # what `collect` left out of its observation because the window deadline passed (`kind: detail`), else None
        self.partial_problem: str | None = None
        self._url = options.endpoint.rstrip("/") + "/api/v1/query"
        self._range_url = options.endpoint.rstrip("/") + "/api/v1/query_range"
        # No kept-alive connections: each query opens its own, so its deadline knows the one socket to cut (a few
        # queries per tick; the handshake is noise beside the tick interval).
        self._client = httpx.Client(
            verify=_tls_verify(options),
            timeout=httpx.Timeout(options.timeout_s),
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    @classmethod
    def from_config(
        cls, config: PlannerConfig, service: ServiceConfig, settings: RuntimeSettings | None = None
    ) -> PrometheusTrafficSource | None:
        """The source for a config: its `metric_pulling_prometheus_endpoint`, else `PLANNER_PROMETHEUS_ENDPOINT`.

        Returns None when neither names an endpoint.
        """
        settings = settings or RuntimeSettings()
        endpoint = service.metric_pulling_prometheus_endpoint or settings.prometheus_endpoint
        if not endpoint:
            return None
        return cls(PrometheusOptions.from_settings(endpoint, settings, service), TrafficQueries.from_config(config))

    def __enter__(self) -> PrometheusTrafficSource:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _headers(self) -> dict[str, str]:
        token = self.options.bearer_token
        if self.options.bearer_token_file is not None:
            try:
                token = self.options.bearer_token_file.read_text().strip()
            except OSError as exc:
                raise TrafficUnavailable(
                    NoTrafficDataKind.UNREACHABLE,
                    f"bearer token file {self.options.bearer_token_file}: cannot be read ({exc.strerror or exc})",
                ) from exc
        return {"Authorization": f"Bearer {token}"} if token else {}

    def query(self, promql: str, at: dt.datetime) -> float | None:
        """One instant query evaluated at `at`: its single value, or None for an empty vector.

        Raises:
            TrafficUnavailable: the query could not be answered (see `parse_instant_answer`).
        """
        return parse_instant_answer(*self._instant(promql, at), promql)

    def query_buckets(self, promql: str, at: dt.datetime) -> tuple[tuple[float, float], ...]:
        """One instant query of a histogram's buckets (`sum by (le) (...)`) at `at` (`parse_bucket_answer`).

        Raises:
            TrafficUnavailable: the query could not be answered.
        """
        return parse_bucket_answer(*self._instant(promql, at), promql)

    def _instant(self, promql: str, at: dt.datetime) -> tuple[int, bytes]:
        """One instant query's HTTP status and body."""
        params = {"query": promql, "time": f"{at.timestamp():.3f}"}
        return self._get(self._url, params, MAX_ANSWER_BYTES)

    def query_range(self, promql: str, grid: StepGrid) -> tuple[RangeSeries, ...]:
        """One range query evaluated at the grid's points: every matching series' points (empty when none).

        Raises:
            TrafficUnavailable: the query could not be answered (see `parse_range_answer`).
        """
        params = {
            "query": promql,
            "start": f"{grid.start_ms / 1000:.3f}",
            "end": f"{grid.end_s:.3f}",
            "step": f"{grid.step_ms / 1000:.3f}",
        }
        status_code, body = self._get(self._range_url, params, MAX_RANGE_ANSWER_BYTES)
        return parse_range_answer(status_code, body, promql)

    def _start_window(self, window_start: dt.datetime, window_end: dt.datetime) -> None:
        """The window deadline for the window's queries: a new one, unless `collect` already started this window's
        (then `arrivals` shares it)."""
        window = (window_start, window_end)
        if self._window is None or self._window.window != window:
            self._window = _WindowDeadline(window, self.options.window_deadline_s)

    def _get(self, url: str, params: dict[str, str], max_bytes: int) -> tuple[int, bytes]:
        """One GET with the bearer token: the status and the body, read up to `max_bytes`, all within `timeout_s`
        and what is left of the window deadline (a query outside `collect`/`arrivals` has only its own)."""
        timeout_s = self.options.timeout_s
        window = self._window
        if window is not None and window.remaining_s() < timeout_s:
            if window.remaining_s() <= 0:
                raise window.passed()
            try:
                return self._get_within(url, params, max_bytes, window.remaining_s())
            except TrafficUnavailable as exc:
                if window.remaining_s() <= 0:  # cut by the window's deadline, not the query's own
                    raise window.passed() from exc
                raise
        return self._get_within(url, params, max_bytes, timeout_s)

    def _get_within(self, url: str, params: dict[str, str], max_bytes: int, timeout_s: float) -> tuple[int, bytes]:
        headers = self._headers()
        deadline = _QueryDeadline(timeout_s)
        try:
            with self._client.stream(
                "GET", url, params=params, headers=headers, extensions={"trace": deadline.trace}
            ) as response:
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"answer larger than {max_bytes} bytes")
                    deadline.check()
                deadline.check()
                return response.status_code, bytes(body)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is not an HTTPError
            if not isinstance(exc, httpx.TimeoutException):
                deadline.check()  # a read the deadline cut short is a timeout, whatever httpx calls it
            raise TrafficUnavailable(
                NoTrafficDataKind.UNREACHABLE, f"{self.options.endpoint}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            deadline.cancel()

    def collect(self, window_start: dt.datetime, window_end: dt.datetime) -> TrafficObservation:
        """The traffic of [window_start, window_end) as Prometheus saw it at `window_end`.

        Raises:
            TrafficUnavailable: no usable answer (unreachable, refused, malformed, missing series, invalid values).
        """
        duration_s = (window_end - window_start).total_seconds()
        if duration_s <= 0:
            raise ValueError(f"window [{window_start}, {window_end}) is empty")
        window = range_of(duration_s)
        queries, series = self.queries, self.queries.series
        self._start_window(window_start, window_end)
        self.partial_problem = None
        num_req = self.query(queries.requests(window), window_end)
        if num_req is None:  # no started counter: count completed requests, as Dynamo falls back to
            num_req = self.query(queries.requests(window, started=False), window_end)
        if num_req is None:
            raise TrafficUnavailable(
                NoTrafficDataKind.NO_SERIES,
                f"neither {series.requests_started} nor {series.requests_total} exists for {queries.traffic_selector}",
            )
        isl = self.query(queries.mean(series.input_sequence_tokens, window), window_end)
        osl = self.query(queries.mean(series.output_sequence_tokens, window), window_end)
        # Past the window deadline the optional figures are left out: the observation keeps what was read, and
        # `partial_problem` names what is missing (the tick audits it as `traffic_partial`).
        optional = {
            "ttft_s": queries.mean(series.time_to_first_token_s, window),
            "itl_s": queries.mean(series.inter_token_latency_s, window),
            "kv_hit_rate": queries.kv_hit_rate(window),
            "accept_length": queries.accept_length(window),
            "ttft_p95_s": queries.quantile(series.time_to_first_token_s, 0.95, window),
            "ttft_p99_s": queries.quantile(series.time_to_first_token_s, 0.99, window),
            "queue_s": queries.queue_s(window),
        }
        left_out: list[tuple[str, TrafficUnavailable]] = []

        def optional_answer(name: str, read: Callable[[str, dt.datetime], Any], promql: str | None) -> Any:
            """`read(promql)`, or None without a query or past the window deadline (then named in `left_out`)."""
            if not promql:
                return None
            try:
                return read(promql, window_end)
            except TrafficUnavailable as exc:
                if exc.kind is not NoTrafficDataKind.WINDOW_DEADLINE:
                    raise
                left_out.append((name, exc))
                return None

        values = {name: optional_answer(name, self.query, promql) for name, promql in optional.items()}
        histograms = {
            "ttft_buckets": queries.buckets(series.time_to_first_token_s, window),
            "itl_buckets": queries.buckets(series.inter_token_latency_s, window),
        }
        buckets = {name: optional_answer(name, self.query_buckets, promql) for name, promql in histograms.items()}
        if left_out:
            cut = left_out[-1][1]
            names = ", ".join(name for name, _ in left_out)
            self.partial_problem = f"{cut.kind.value}: {cut.detail}; left out {names}"
        answers = RawAnswers(duration_s=duration_s, num_req=num_req, isl=isl, osl=osl, **values, **buckets)
        return observation_from_answers(answers)

    def arrivals(self, window_start: dt.datetime, window_end: dt.datetime) -> RequestArrivals:
        """The requests of [window_start - LOOKBACK_S, window_end], rebuilt from the counters at the arrival
        resolution (module docstring), on the epoch-seconds clock: what the window's observation records
        (`with_arrivals`, as the per-step counts) and the tick derives the prompt-arrival curve from.

        Raises:
            TrafficUnavailable: no usable answer (unreachable, refused, malformed, missing series, invalid values),
                or more points per series than Prometheus serves (QUERY_ERROR: a coarser resolution is needed).
        """
        start_s, end_s = window_start.timestamp(), window_end.timestamp()
        if end_s <= start_s:
            raise ValueError(f"window [{window_start}, {window_end}) is empty")
        grid = StepGrid.ending_at(end_s, end_s - start_s + LOOKBACK_S, self.options.arrival_resolution_s)
        if grid.num_steps + 1 > MAX_RANGE_POINTS:
            raise TrafficUnavailable(
                NoTrafficDataKind.QUERY_ERROR,
                f"{grid.num_steps + 1} points per series at a {grid.step_s:g} s resolution, more than "
                f"{MAX_RANGE_POINTS}: raise prometheus_arrival_resolution_seconds",
            )
        queries, series = self.queries, self.queries.series
        self._start_window(window_start, window_end)
        started = self.query_range(queries.counter(series.requests_started), grid)
        name = series.requests_started
        if not started:  # no started counter: completed requests, as `collect` falls back to
            started = self.query_range(queries.counter(series.requests_total), grid)
            name = series.requests_total
        if not started:
            raise TrafficUnavailable(
                NoTrafficDataKind.NO_SERIES,
                f"neither {series.requests_started} nor {series.requests_total} exists for {queries.traffic_selector}",
            )
        histogram = series.input_sequence_tokens
        isl_sum = self.query_range(queries.counter(f"{histogram}_sum"), grid)
        isl_count = self.query_range(queries.counter(f"{histogram}_count"), grid)
        if not (isl_sum and isl_count):
            raise TrafficUnavailable(NoTrafficDataKind.NO_SERIES, f"no {histogram} histogram series")
        return arrivals_from_increments(
            grid,
            step_increments(started, grid, name),
            step_increments(isl_sum, grid, f"{histogram}_sum"),
            step_increments(isl_count, grid, f"{histogram}_count"),
            start_s,
        )


__all__ = [
    "FRONTEND_SERIES",
    "KV_HIT_RATE_HISTOGRAM",
    "KV_HIT_RATE_SLACK",
    "MAX_ACCEPT_LENGTH",
    "MAX_ANSWER_BYTES",
    "MAX_LATENCY_S",
    "MAX_RANGE_ANSWER_BYTES",
    "MAX_RANGE_POINTS",
    "MAX_REQUESTS_PER_S",
    "MAX_SEQUENCE_TOKENS",
    "PrometheusOptions",
    "PrometheusTrafficSource",
    "ROUTER_SERIES",
    "RangeSeries",
    "RawAnswers",
    "StepGrid",
    "TrafficQueries",
    "TrafficSeries",
    "arrivals_from_increments",
    "histogram_from_buckets",
    "label_selector",
    "observation_from_answers",
    "parse_bucket_answer",
    "parse_instant_answer",
    "parse_range_answer",
    "range_of",
    "router_namespace",
    "step_increments",
]
