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
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from planner_core.arrivals import LOOKBACK_S, RequestArrivals, arrivals_from_counts
from planner_core.config import Backend, PlannerConfig, ServiceConfig, ThroughputMetricsSource
from planner_core.domain import TrafficObservation
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources.base import NoTrafficDataKind, TrafficUnavailable

# Plausibility limits: beyond these a value is a broken exporter or query, not traffic.
MAX_REQUESTS_PER_S = 1_000_000.0  # a million requests per second through one deployment's frontends
MAX_SEQUENCE_TOKENS = 10_000_000.0  # longer than any model's context window
MAX_LATENCY_S = 3_600.0  # an hour to the first token or between tokens
MAX_ACCEPT_LENGTH = 64.0  # speculative decoding proposes far fewer tokens per step
MAX_ANSWER_BYTES = 1 << 20  # one sample per query: a megabyte is already absurd
# A range answer holds ~30 bytes per point: 8 MiB is ~90 series of a 60 s window at 1 s, many frontends.
MAX_RANGE_ANSWER_BYTES = 8 << 20
MAX_RANGE_POINTS = 11_000  # per series: Prometheus refuses more itself
KV_HIT_RATE_SLACK = 1e-9  # sum/count of values in [0, 1] may exceed 1 by rounding

KV_HIT_RATE_HISTOGRAM = "dynamo_component_router_kv_hit_rate"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficSeries:
    """Names of the series one metrics source exports (histograms without their `_sum`/`_count` suffix)."""

    requests_started: str  # counter of requests accepted (offered load)
    requests_total: str  # counter of requests completed (fallback when the started counter is missing)
    input_sequence_tokens: str  # histogram of ISL (tokens)
    output_sequence_tokens: str  # histogram of OSL (tokens)
    time_to_first_token_s: str  # histogram of TTFT (seconds)
    inter_token_latency_s: str  # histogram of ITL (seconds)
    queued_requests: str | None = None  # gauge of requests awaiting a first token (the frontend's only)


FRONTEND_SERIES = TrafficSeries(
    requests_started="dynamo_frontend_requests_started_total",
    requests_total="dynamo_frontend_requests_total",
    input_sequence_tokens="dynamo_frontend_input_sequence_tokens",
    output_sequence_tokens="dynamo_frontend_output_sequence_tokens",
    time_to_first_token_s="dynamo_frontend_time_to_first_token_seconds",
    inter_token_latency_s="dynamo_frontend_inter_token_latency_seconds",
    queued_requests="dynamo_frontend_queued_requests",
)
ROUTER_SERIES = TrafficSeries(
    requests_started="dynamo_component_router_requests_started_total",
    requests_total="dynamo_component_router_requests_total",
    input_sequence_tokens="dynamo_component_router_input_sequence_tokens",
    output_sequence_tokens="dynamo_component_router_output_sequence_tokens",
    time_to_first_token_s="dynamo_component_router_time_to_first_token_seconds",
    inter_token_latency_s="dynamo_component_router_inter_token_latency_seconds",
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
    arrival_resolution_s: float = 1.0  # step of the arrival-curve range queries (`ServiceConfig`)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_resolution_s) and self.arrival_resolution_s > 0):
            raise ValueError(f"arrival_resolution_s = {self.arrival_resolution_s!r}: must be a finite number > 0")

    @classmethod
    def from_settings(
        cls, endpoint: str, settings: RuntimeSettings, service: ServiceConfig | None = None
    ) -> PrometheusOptions:
        """Connection settings from the environment; the arrival resolution from the config's service settings."""
        token = settings.prometheus_token
        service = service or ServiceConfig()
        return cls(
            endpoint=endpoint,
            bearer_token=token.get_secret_value() if token is not None else None,
            bearer_token_file=settings.prometheus_token_file,
            ca_bundle=settings.prometheus_ca_bundle,
            verify_tls=settings.prometheus_ssl_verify,
            timeout_s=settings.prometheus_timeout_s,
            arrival_resolution_s=service.prometheus_arrival_resolution_seconds,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficQueries:
    """Which deployment's series to read: source, namespace, model and backend from the planner config."""

    source: ThroughputMetricsSource = ThroughputMetricsSource.FRONTEND
    namespace: str = "dynamo"
    model_name: str | None = None
    backend: Backend | None = None

    @classmethod
    def from_config(cls, config: PlannerConfig) -> TrafficQueries:
        return cls(
            source=config.throughput_metrics_source,
            namespace=config.namespace,
            model_name=config.model_name,
            backend=config.backend,
        )

    @property
    def series(self) -> TrafficSeries:
        return ROUTER_SERIES if self.source is ThroughputMetricsSource.ROUTER else FRONTEND_SERIES

    @property
    def traffic_selector(self) -> str:
        """Label matchers of the traffic series."""
        if self.source is ThroughputMetricsSource.ROUTER:
            return label_selector(dynamo_namespace=router_namespace(self.namespace))
        return self.engine_selector

    @property
    def engine_selector(self) -> str:
        """Label matchers of frontend and engine series: namespace as written, model case-insensitive.

        Dynamo 1.6.1's frontend exports its `dynamo_frontend_*` series with `model` but without
        `dynamo_namespace` (seen on its `/metrics`; `planner live` scrapes it), so a series without the label
        matches as well; one with another namespace does not.
        """
        return label_selector(dynamo_namespace=self.namespace, model_regex=self.model_name, namespace_optional=True)

    def requests(self, window: str, *, started: bool = True) -> str:
        counter = self.series.requests_started if started else self.series.requests_total
        return f"sum(increase({counter}{self.traffic_selector}[{window}]))"

    def counter(self, name: str) -> str:
        """A raw counter (or histogram `_sum` / `_count`) of the traffic series, every matching series: what the
        arrival-curve range queries read (diffed client-side, so each series' resets are seen)."""
        return f"{name}{self.traffic_selector}"

    def mean(self, histogram: str, window: str, selector: str | None = None) -> str:
        selector = self.traffic_selector if selector is None else selector
        return (
            f"sum(increase({histogram}_sum{selector}[{window}])) / sum(increase({histogram}_count{selector}[{window}]))"
        )

    def quantile(self, histogram: str, quantile: float, window: str) -> str:
        """The `quantile` of a histogram's observations over the window (Prometheus interpolates in the buckets)."""
        return (
            f"histogram_quantile({quantile:g}, sum by (le) (increase({histogram}_bucket{self.traffic_selector}"
            f"[{window}])))"
        )

    def queue_s(self, window: str) -> str | None:
        """The mean time a request waited for its first token: the frontend's queued-requests gauge averaged over
        the window, divided by the window's request rate (Little's law); None when the series has no such gauge."""
        series = self.series
        if series.queued_requests is None:
            return None
        return (
            f"sum(avg_over_time({series.queued_requests}{self.traffic_selector}[{window}])) / "
            f"sum(rate({series.requests_started}{self.traffic_selector}[{window}]))"
        )

    def kv_hit_rate(self, window: str) -> str:
        """The router's predicted hit rate, whichever source the traffic comes from (Dynamo does the same)."""
        return self.mean(
            KV_HIT_RATE_HISTOGRAM, window, label_selector(dynamo_namespace=router_namespace(self.namespace))
        )

    def accept_length(self, window: str) -> str | None:
        """Mean tokens per decode step from the engines' speculative-decoding series; None for other backends."""
        selector = self.engine_selector
        if self.backend is Backend.VLLM:
            accepted = f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{selector}[{window}]))"
            drafts = f"sum(rate(vllm:spec_decode_num_drafts_total{selector}[{window}]))"
            return f"1 + ({accepted}) / ({drafts})"
        if self.backend is Backend.SGLANG:
            return f"avg(avg_over_time(sglang:spec_accept_length{selector}[{window}]))"
        if self.backend is Backend.TRTLLM:
            return f"avg(avg_over_time(trtllm_spec_decode_acceptance_length{selector}[{window}]))"
        return None


def router_namespace(namespace: str) -> str:
    """Router series carry the namespace with dashes turned into underscores."""
    return namespace.replace("-", "_")


def _quote(value: str) -> str:
    """A PromQL double-quoted string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def label_selector(*, dynamo_namespace: str, model_regex: str | None = None, namespace_optional: bool = False) -> str:
    """`{dynamo_namespace="ns"[,model=~"(?i)name"]}`; the model matches whole and case-insensitively.

    With `namespace_optional` a series without the label matches too (`dynamo_namespace=~"ns|"`: Prometheus reads
    a missing label as the empty string).
    """
    if namespace_optional:
        matchers = [f"dynamo_namespace=~{_quote(re.escape(dynamo_namespace) + '|')}"]
    else:
        matchers = [f"dynamo_namespace={_quote(dynamo_namespace)}"]
    if model_regex:
        matchers.append(f"model=~{_quote('(?i)' + re.escape(model_regex))}")
    return "{" + ",".join(matchers) + "}"


def range_of(duration_s: float) -> str:
    """A PromQL range covering `duration_s`, in whole milliseconds (at least 1 ms)."""
    return f"{max(1, round(duration_s * 1000))}ms"


def _shown(query: str) -> str:
    return query if len(query) <= 120 else query[:117] + "..."


def _api_data(status_code: int, body: bytes, query: str) -> dict:
    """The `data` object of a successful Prometheus API answer.

    Raises:
        TrafficUnavailable: non-2xx status (HTTP_ERROR), status "error" (QUERY_ERROR), or a body that is not a
            JSON API answer (MALFORMED).
    """
    shown = _shown(query)
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        answer = None
    if isinstance(answer, dict) and answer.get("status") == "error":
        error = str(answer.get("error", ""))[:200]
        kind = NoTrafficDataKind.QUERY_ERROR
        raise TrafficUnavailable(kind, f"HTTP {status_code}, {answer.get('errorType', 'error')}: {error} ({shown})")
    if not 200 <= status_code < 300:
        raise TrafficUnavailable(NoTrafficDataKind.HTTP_ERROR, f"HTTP {status_code} for {shown}")
    if answer is None:
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"answer is not JSON: {body[:80]!r} ({shown})")
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(data, dict):
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"not a Prometheus API answer ({shown})")
    return data


def parse_instant_answer(status_code: int, body: bytes, query: str) -> float | None:
    """The single sample of a Prometheus instant-vector answer, or None when the vector is empty.

    Raises:
        TrafficUnavailable: non-2xx status (HTTP_ERROR), status "error" (QUERY_ERROR), or anything that is not
            a JSON instant vector of at most one sample with a numeric string value (MALFORMED).
    """
    shown = _shown(query)
    data = _api_data(status_code, body, query)
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        found = data.get("resultType")
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"expected an instant vector, got {found!r} ({shown})")
    if not result:
        return None
    if len(result) != 1:
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"expected one sample, got {len(result)} ({shown})")
    sample = result[0]
    value = sample.get("value") if isinstance(sample, dict) else None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)):
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"sample without a [time, value] pair ({shown})")
    return _sample_value(value[1], shown)


def _sample_value(text: str, shown: str) -> float:
    try:
        return float(text)  # Prometheus writes "NaN", "+Inf", "-Inf" for the special values
    except ValueError:
        raise TrafficUnavailable(
            NoTrafficDataKind.MALFORMED, f"sample value {text[:40]!r} is not a number ({shown})"
        ) from None


# A series of a range answer: its points as (time, value), time in epoch seconds.
RangeSeries = tuple[tuple[float, float], ...]


def parse_range_answer(status_code: int, body: bytes, query: str) -> tuple[RangeSeries, ...]:
    """Every series of a Prometheus range-matrix answer (`/api/v1/query_range`); empty when none matched.

    Raises:
        TrafficUnavailable: as `parse_instant_answer`, for anything that is not a JSON matrix of series whose
            `values` are [time, numeric string] pairs (MALFORMED).
    """
    shown = _shown(query)
    data = _api_data(status_code, body, query)
    result = data.get("result")
    if data.get("resultType") != "matrix" or not isinstance(result, list):
        found = data.get("resultType")
        raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"expected a range matrix, got {found!r} ({shown})")
    parsed = []
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(values, list):
            raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"series without a values list ({shown})")
        points = []
        for pair in values:
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and isinstance(pair[0], int | float)
                and not isinstance(pair[0], bool)
                and isinstance(pair[1], str)
            ):
                raise TrafficUnavailable(NoTrafficDataKind.MALFORMED, f"point without a [time, value] pair ({shown})")
            points.append((float(pair[0]), _sample_value(pair[1], shown)))
        parsed.append(tuple(points))
    return tuple(parsed)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepGrid:
    """The evaluation times of a range query: `start_ms + k * step_ms` for k in 0..num_steps (epoch ms).

    Step k (1..num_steps) is the interval (point k-1, point k]; increments are indexed k - 1."""

    start_ms: int
    step_ms: int
    num_steps: int

    @classmethod
    def ending_at(cls, end_s: float, span_s: float, step_s: float) -> StepGrid:
        """The grid of whole-millisecond steps of about `step_s` whose last point is `end_s` and which covers at
        least `span_s` before it."""
        step_ms = max(1, round(step_s * 1000))
        num_steps = max(1, math.ceil(span_s * 1000 / step_ms - 1e-9))
        end_ms = round(end_s * 1000)
        return cls(start_ms=end_ms - num_steps * step_ms, step_ms=step_ms, num_steps=num_steps)

    @property
    def step_s(self) -> float:
        return self.step_ms / 1000.0

    @property
    def start_s(self) -> float:
        return self.start_ms / 1000.0

    @property
    def end_s(self) -> float:
        return (self.start_ms + self.num_steps * self.step_ms) / 1000.0

    def step_end_s(self) -> np.ndarray:
        """End of every step (epoch s)."""
        return (self.start_ms + self.step_ms * np.arange(1, self.num_steps + 1)) / 1000.0


def step_increments(series: tuple[RangeSeries, ...], grid: StepGrid, name: str) -> np.ndarray:
    """Per-step increase of counters, summed over their series (length `grid.num_steps`).

    Each series' consecutive points are diffed; a decrease is a counter reset, the counter restarted from 0, so
    the step gets the new value (Prometheus' `increase` reads resets the same way). A series' first point is its
    baseline (a series that appears inside the range, a new frontend, counts from its second point, as `increase`
    does); an increment across missing points (the target was down) is spread evenly over the steps it spans.

    Raises:
        TrafficUnavailable: MALFORMED for a point off the grid or out of order; INVALID_VALUE for a value that is
            NaN, infinite or negative.
    """
    out = np.zeros(grid.num_steps)
    for points in series:
        previous: tuple[int, float] | None = None
        for time_s, value in points:
            k = round((time_s * 1000 - grid.start_ms) / grid.step_ms)
            on_grid = abs(time_s * 1000 - (grid.start_ms + k * grid.step_ms)) < 0.5
            if not (on_grid and 0 <= k <= grid.num_steps) or (previous is not None and k <= previous[0]):
                raise TrafficUnavailable(
                    NoTrafficDataKind.MALFORMED, f"{name}: point at {time_s!r} is off the query's steps or out of order"
                )
            if not math.isfinite(value) or value < 0:
                raise _invalid(name, value, "a counter must be a finite number >= 0")
            if previous is not None:
                last_k, last_value = previous
                increase = value - last_value if value >= last_value else value  # a reset restarts from 0
                out[last_k:k] += increase / (k - last_k)
            previous = (k, value)
    return out


def arrivals_from_increments(
    grid: StepGrid, num_req: np.ndarray, isl_sum: np.ndarray, isl_count: np.ndarray, window_start_s: float
) -> RequestArrivals:
    """Arrivals rebuilt from per-step increments of the started counter and the ISL histogram's `_sum` and
    `_count` (`arrivals_from_counts`): a step's requests get the step's mean ISL, or, where the step has no ISL
    observation, the window's mean (the steps ending after `window_start_s`), else the whole range's.

    Raises:
        TrafficUnavailable: INVALID_VALUE for more requests per step than `MAX_REQUESTS_PER_S` allows, a mean ISL
            above `MAX_SEQUENCE_TOKENS`, or requests in a range without a single ISL observation.
    """
    step_s = grid.step_s
    busiest = float(num_req.max()) if len(num_req) else 0.0
    if busiest > MAX_REQUESTS_PER_S * step_s:
        raise _invalid("requests per step", busiest, f"above the plausible maximum {MAX_REQUESTS_PER_S * step_s:g}")
    in_window = grid.step_end_s() > window_start_s
    fallback = None
    for part in (in_window, np.ones(grid.num_steps, dtype=bool)):
        if isl_count[part].sum() > 0:
            fallback = float(isl_sum[part].sum() / isl_count[part].sum())
            break
    if fallback is None:
        if num_req.sum() >= 0.5:
            raise _invalid("isl", math.nan, f"no observations although {num_req.sum():g} requests started")
        fallback = 0.0
    observed = isl_count > 0
    mean_isl = np.full(grid.num_steps, fallback)
    mean_isl[observed] = isl_sum[observed] / isl_count[observed]
    longest = float(mean_isl.max()) if len(mean_isl) else 0.0
    if longest > MAX_SEQUENCE_TOKENS:
        raise _invalid("isl", longest, f"above the plausible maximum {MAX_SEQUENCE_TOKENS:g}")
    return arrivals_from_counts(grid.step_end_s(), num_req, mean_isl, resolution_s=step_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class RawAnswers:
    """The values Prometheus returned for one window; None = the series does not exist, NaN = 0/0."""

    duration_s: float
    num_req: float
    isl: float | None
    osl: float | None
    ttft_s: float | None = None
    itl_s: float | None = None
    kv_hit_rate: float | None = None
    accept_length: float | None = None
    ttft_p95_s: float | None = None
    ttft_p99_s: float | None = None
    queue_s: float | None = None


def _invalid(field_name: str, value: float, why: str) -> TrafficUnavailable:
    return TrafficUnavailable(NoTrafficDataKind.INVALID_VALUE, f"{field_name} = {value!r}: {why}")


def _checked(field_name: str, value: float, low: float, high: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise _invalid(field_name, value, "not a finite number")
    if value < low:
        raise _invalid(field_name, value, f"below {low:g}")
    if value > high:
        raise _invalid(field_name, value, f"above the plausible maximum {high:g}")
    return value


def _optional(field_name: str, value: float | None, low: float, high: float) -> float | None:
    """An optional figure: absent or 0/0 (no observations in the window) is None, anything else is checked."""
    if value is None or math.isnan(value):
        return None
    return _checked(field_name, value, low, high)


def observation_from_answers(answers: RawAnswers) -> TrafficObservation:
    """Validate the answers of one window and build its observation.

    Idle (num_req 0): ISL and OSL are 0/0 in Prometheus and become 0. Busy: ISL and OSL must be finite; the
    optional figures (TTFT, ITL, KV hit rate, accept length) are None when absent or 0/0.

    Raises:
        TrafficUnavailable: NO_SERIES when the ISL/OSL histograms are missing; INVALID_VALUE for a NaN where a
            number is needed, a negative, infinite or implausibly large value.
    """
    duration_s = answers.duration_s
    num_req = _checked("num_req", answers.num_req, 0.0, MAX_REQUESTS_PER_S * max(duration_s, 1.0))
    lengths = {}
    for name, value in (("isl", answers.isl), ("osl", answers.osl)):
        if value is None:
            raise TrafficUnavailable(NoTrafficDataKind.NO_SERIES, f"no {name} histogram series")
        if num_req == 0 and math.isnan(value):
            lengths[name] = 0.0  # idle window: no requests, so no mean length (Dynamo normalises the same way)
        elif math.isnan(value):
            raise _invalid(name, value, f"no observations although {num_req:g} requests started")
        else:
            lengths[name] = _checked(name, value, 0.0, MAX_SEQUENCE_TOKENS)
    ttft_s = _optional("ttft_s", answers.ttft_s, 0.0, MAX_LATENCY_S)
    itl_s = _optional("itl_s", answers.itl_s, 0.0, MAX_LATENCY_S)
    tail_ms = {  # the observation's field: the answer's seconds, checked, in ms
        field_name: None if seconds is None else seconds * 1000.0
        for field_name, seconds in (
            ("ttft_ms_p95", _optional("ttft_p95_s", answers.ttft_p95_s, 0.0, MAX_LATENCY_S)),
            ("ttft_ms_p99", _optional("ttft_p99_s", answers.ttft_p99_s, 0.0, MAX_LATENCY_S)),
            ("queue_ms", _optional("queue_s", answers.queue_s, 0.0, MAX_LATENCY_S)),
        )
    }
    return TrafficObservation(
        duration_s=duration_s,
        num_req=num_req,
        isl=lengths["isl"],
        osl=lengths["osl"],
        ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
        itl_ms=None if itl_s is None else itl_s * 1000.0,
        **tail_ms,
        kv_hit_rate=_optional("kv_hit_rate", answers.kv_hit_rate, 0.0, 1.0 + KV_HIT_RATE_SLACK),
        accept_length=_optional("accept_length", answers.accept_length, 1.0, MAX_ACCEPT_LENGTH),
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
        params = {"query": promql, "time": f"{at.timestamp():.3f}"}
        status_code, body = self._get(self._url, params, MAX_ANSWER_BYTES)
        return parse_instant_answer(status_code, body, promql)

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

    def _get(self, url: str, params: dict[str, str], max_bytes: int) -> tuple[int, bytes]:
        """One GET with the bearer token: the status and the body, read up to `max_bytes`, all within `timeout_s`."""
        headers = self._headers()
        deadline = _QueryDeadline(self.options.timeout_s)
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
        num_req = self.query(queries.requests(window), window_end)
        if num_req is None:  # no started counter: count completed requests, as Dynamo falls back to
            num_req = self.query(queries.requests(window, started=False), window_end)
        if num_req is None:
            raise TrafficUnavailable(
                NoTrafficDataKind.NO_SERIES,
                f"neither {series.requests_started} nor {series.requests_total} exists for {queries.traffic_selector}",
            )
        accept_query = queries.accept_length(window)
        queue_query = queries.queue_s(window)
        answers = RawAnswers(
            duration_s=duration_s,
            num_req=num_req,
            isl=self.query(queries.mean(series.input_sequence_tokens, window), window_end),
            osl=self.query(queries.mean(series.output_sequence_tokens, window), window_end),
            ttft_s=self.query(queries.mean(series.time_to_first_token_s, window), window_end),
            itl_s=self.query(queries.mean(series.inter_token_latency_s, window), window_end),
            kv_hit_rate=self.query(queries.kv_hit_rate(window), window_end),
            accept_length=self.query(accept_query, window_end) if accept_query else None,
            ttft_p95_s=self.query(queries.quantile(series.time_to_first_token_s, 0.95, window), window_end),
            ttft_p99_s=self.query(queries.quantile(series.time_to_first_token_s, 0.99, window), window_end),
            queue_s=self.query(queue_query, window_end) if queue_query else None,
        )
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
