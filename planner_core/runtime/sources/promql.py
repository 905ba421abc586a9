"""The PromQL the Prometheus source asks: Dynamo's series names (frontend or router, `TrafficSeries`), label
selectors, and the queries of one window (`TrafficQueries`), so a Prometheus that serves a Dynamo deployment
serves this planner unchanged."""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner_core.config import Backend, PlannerConfig, ThroughputMetricsSource

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

    def buckets(self, histogram: str, window: str) -> str:
        """A histogram's buckets over the window, one sample per `le` (what the SLA error budget reads)."""
        return f"sum by (le) (increase({histogram}_bucket{self.traffic_selector}[{window}]))"

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
