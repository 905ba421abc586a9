"""The Prometheus traffic source: PromQL, strict answers, a fake Prometheus for garbage, a real one for the rest.

Pure parts (queries, answer parsing, validation) are table-driven without a server. Transport faults (HTTP 500,
slow answers, TLS, bearer tokens) use a small real HTTP server that answers like Prometheus would, or wouldn't.
The real Prometheus (Debian's 2.42, installed with apt-get when missing) runs once per session, scraping the
simulator's exporter every second; the tests query windows of its recorded history. The prompt-arrival curve's
test runs one of its own, scraping every 0.5 s an exporter that replays the Azure conversation trace sped up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import math
import os
import shutil
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from flows.ticks import collect_traffic
from planner_core.arrivals import prompt_arrival_curve
from planner_core.config import Backend, ConfigError, ThroughputMetricsSource, load_config, parse_config
from planner_core.data import AZURE_CONV_TRACE, DEFAULT_CONFIG
from planner_core.domain import (
    PROMPT_ARRIVAL_INTERVALS_S,
    EngineLimits,
    Loop,
    PlannerState,
    ReasonCode,
    StepName,
    TickInputs,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.lab.sim.des import ClusterSimulator, SimResult, SimSpec
from planner_core.lab.sim.exporter import TraceMetricsExporter
from planner_core.perf.model import ProfilePerfModel
from planner_core.planner import build_planner
from planner_core.policy.throughput import prompt_cap
from planner_core.runtime.localhost import free_port
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.sources import NoTrafficDataKind, TrafficUnavailable
from planner_core.runtime.sources import collect_traffic as collect_from_source
from planner_core.runtime.sources.prometheus import (
    MAX_ANSWER_BYTES,
    PrometheusOptions,
    PrometheusTrafficSource,
    RawAnswers,
    StepGrid,
    TrafficQueries,
    arrivals_from_increments,
    histogram_from_buckets,
    label_selector,
    observation_from_answers,
    parse_bucket_answer,
    parse_instant_answer,
    parse_range_answer,
    range_of,
    step_increments,
)
from planner_core.runtime.store.models import AuditLogRow, DecisionRow
from planner_core.traces import RequestTrace, load_trace
from tests.conftest import PROFILE_DIR, write_config
from tests.runtime.fake_prometheus import (
    GOOD,
    T0,
    FakePrometheus,
    answers_by_series,
    collect_window,
    prometheus_source,
    vector,
)

# --- queries --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queries", "expected"),
    [
        (
            TrafficQueries(),
            # Dynamo's frontend exports no dynamo_namespace label: a series without it matches too
            'sum(increase(dynamo_frontend_requests_started_total{dynamo_namespace=~"dynamo|"}[60000ms]))',
        ),
        (
            TrafficQueries(namespace="prod-a", model_name="Llama-3.1"),
            # the model matches whole, case-insensitively; regex metacharacters are escaped
            'sum(increase(dynamo_frontend_requests_started_total{dynamo_namespace=~"prod\\\\-a|",'
            'model=~"(?i)Llama\\\\-3\\\\.1"}[60000ms]))',
        ),
        (
            TrafficQueries(source=ThroughputMetricsSource.ROUTER, namespace="prod-a", model_name="ignored"),
            # router series carry the namespace with underscores and no model label
            'sum(increase(dynamo_component_router_requests_started_total{dynamo_namespace="prod_a"}[60000ms]))',
        ),
    ],
    ids=["frontend", "frontend-model", "router"],
)
def test_request_count_query(queries: TrafficQueries, expected: str) -> None:
    """The request count is the increase of the started-requests counter over the window, per Dynamo."""
    assert queries.requests(range_of(60)) == expected


def test_mean_and_metadata_queries() -> None:
    """Means are sum(increase(_sum)) / sum(increase(_count)); KV hit rate always from the router series."""
    queries = TrafficQueries(namespace="a-b", backend=Backend.VLLM)
    assert queries.mean("dynamo_frontend_input_sequence_tokens", "5s") == (
        'sum(increase(dynamo_frontend_input_sequence_tokens_sum{dynamo_namespace=~"a\\\\-b|"}[5s])) / '
        'sum(increase(dynamo_frontend_input_sequence_tokens_count{dynamo_namespace=~"a\\\\-b|"}[5s]))'
    )
    assert 'dynamo_component_router_kv_hit_rate_sum{dynamo_namespace="a_b"}[5s]' in queries.kv_hit_rate("5s")
    assert queries.accept_length("5s").startswith("1 + (sum(rate(vllm:spec_decode_num_accepted_tokens_total{")
    assert "sglang:spec_accept_length" in replace(queries, backend=Backend.SGLANG).accept_length("5s")
    assert "trtllm_spec_decode_acceptance_length" in replace(queries, backend=Backend.TRTLLM).accept_length("5s")
    assert replace(queries, backend=Backend.MOCKER).accept_length("5s") is None


def test_label_values_are_quoted() -> None:
    """Quotes and backslashes in a namespace cannot break out of the PromQL string."""
    assert label_selector(dynamo_namespace='x"}or vector(1)#\\') == '{dynamo_namespace="x\\"}or vector(1)#\\\\"}'


def test_range_is_whole_milliseconds() -> None:
    """Windows are written in ms (at least 1 ms): 179.9996 s -> 180000 ms."""
    assert [range_of(179.9996), range_of(0.0001), range_of(60)] == ["180000ms", "1ms", "60000ms"]


# --- answers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, vector("12.5"), 12.5),
        (200, vector("NaN"), "nan"),  # 0/0 of an idle window: a value, judged by the caller
        (200, vector(), None),  # the series does not exist
        (500, b"internal error", NoTrafficDataKind.HTTP_ERROR),
        (502, b"<html>bad gateway</html>", NoTrafficDataKind.HTTP_ERROR),
        (422, b'{"status":"error","errorType":"execution","error":"boom"}', NoTrafficDataKind.QUERY_ERROR),
        (200, b"not json{", NoTrafficDataKind.MALFORMED),
        (200, b"[1, 2]", NoTrafficDataKind.MALFORMED),
        (200, b'{"status":"success"}', NoTrafficDataKind.MALFORMED),
        (
            200,
            b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
            NoTrafficDataKind.MALFORMED,
        ),
        (200, vector("1", "2"), NoTrafficDataKind.MALFORMED),  # a sum() never answers two samples
        (200, vector("abc"), NoTrafficDataKind.MALFORMED),
        (200, vector(3.0), NoTrafficDataKind.MALFORMED),  # the API writes values as strings
        (200, b'{"status":"success","data":{"resultType":"vector","result":[{"value":[1]}]}}', "malformed"),
    ],
    ids=[
        "number",
        "nan",
        "empty",
        "http-500",
        "http-502-html",
        "query-error",
        "not-json",
        "json-array",
        "no-data",
        "matrix",
        "two-samples",
        "not-a-number",
        "unquoted-number",
        "short-pair",
    ],
)
def test_parse_instant_answer(status: int, body: bytes, expected: object) -> None:
    """Only a JSON instant vector of at most one numeric-string sample is an answer; the rest say why not."""
    if isinstance(expected, str | NoTrafficDataKind) and expected != "nan":
        with pytest.raises(TrafficUnavailable) as info:
            parse_instant_answer(status, body, "q")
        assert info.value.kind == NoTrafficDataKind(expected)
    elif expected == "nan":
        assert math.isnan(parse_instant_answer(status, body, "q"))
    else:
        assert parse_instant_answer(status, body, "q") == expected


NAN = math.nan
BUSY = RawAnswers(duration_s=60, num_req=120, isl=3000, osl=300, ttft_s=0.2, itl_s=0.01, kv_hit_rate=0.3)


@pytest.mark.parametrize(
    ("answers", "problem"),
    [
        (replace(BUSY, num_req=NAN), "num_req = nan: not a finite number"),
        (replace(BUSY, num_req=-5.0), "num_req = -5.0: below 0"),
        (replace(BUSY, num_req=1e300), "num_req = 1e+300: above the plausible maximum 6e+07"),  # 1e6/s x 60 s
        (replace(BUSY, num_req=math.inf), "num_req = inf: not a finite number"),
        (replace(BUSY, isl=NAN), "isl = nan: no observations although 120 requests started"),
        (replace(BUSY, osl=-1.0), "osl = -1.0: below 0"),
        (replace(BUSY, isl=1e12), "isl = 1000000000000.0: above the plausible maximum 1e+07"),
        (replace(BUSY, ttft_s=-0.5), "ttft_s = -0.5: below 0"),
        (replace(BUSY, itl_s=7200.0), "itl_s = 7200.0: above the plausible maximum 3600"),
        (replace(BUSY, kv_hit_rate=1.5), "kv_hit_rate = 1.5: above the plausible maximum 1"),
        (replace(BUSY, accept_length=0.5), "accept_length = 0.5: below 1"),
        (replace(BUSY, isl=None), "no isl histogram series"),
    ],
    ids=[
        "req-nan",
        "req-negative",
        "req-huge",
        "req-inf",
        "isl-nan-busy",
        "osl-negative",
        "isl-huge",
        "ttft-negative",
        "itl-huge",
        "kv-over-1",
        "accept-under-1",
        "isl-missing",
    ],
)
def test_garbage_values_are_no_data(answers: RawAnswers, problem: str) -> None:
    """NaN where a number is needed, negative, infinite or implausibly large values: no observation, and why."""
    with pytest.raises(TrafficUnavailable) as info:
        observation_from_answers(answers)
    assert info.value.detail == problem
    expected_kind = NoTrafficDataKind.NO_SERIES if "series" in problem else NoTrafficDataKind.INVALID_VALUE
    assert info.value.kind == expected_kind


def test_idle_window_is_zero_traffic() -> None:
    """Counters that did not move: 0 requests, 0/0 lengths become 0, latencies and metadata unknown (None)."""
    idle = RawAnswers(
        duration_s=60, num_req=0.0, isl=NAN, osl=NAN, ttft_s=NAN, itl_s=NAN, kv_hit_rate=NAN, accept_length=NAN
    )
    assert observation_from_answers(idle) == TrafficObservation(duration_s=60, num_req=0.0, isl=0.0, osl=0.0)


def test_busy_window_converts_units() -> None:
    """TTFT and ITL arrive in seconds and are recorded in ms (0.2 s -> 200 ms, 0.01 s -> 10 ms)."""
    obs = observation_from_answers(replace(BUSY, accept_length=1.8))
    assert (obs.num_req, obs.isl, obs.osl, obs.kv_hit_rate, obs.accept_length) == (120, 3000, 300, 0.3, 1.8)
    assert obs.ttft_ms == pytest.approx(200.0) and obs.itl_ms == pytest.approx(10.0)
    assert obs.invalid_field() is None


# --- the arrival curve's range answers --------------------------------------------------------------------------


def _matrix(*series: list[tuple[float, str]]) -> bytes:
    result = [{"metric": {"instance": f"f{i}"}, "values": [list(p) for p in points]} for i, points in enumerate(series)]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


GRID = StepGrid(start_ms=100_000, step_ms=1000, num_steps=5)  # points at 100 .. 105 s, steps (100, 101] .. (104, 105]


def test_parse_bucket_answer_and_histogram() -> None:
    """`sum by (le)` buckets, in any order, become a latency histogram in ms with the +Inf bucket as its count; an
    extrapolated count below the one under it is raised to it; no +Inf bucket or no request is no histogram."""
    samples = [("+Inf", "10"), ("0.1", "4"), ("0.5", "9"), ("0.25", "3.9")]
    result = [{"metric": {"le": le}, "value": [1.0, v]} for le, v in samples]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    buckets = parse_bucket_answer(200, body, "q")
    assert buckets == ((0.1, 4.0), (0.25, 3.9), (0.5, 9.0), (math.inf, 10.0))
    histogram = histogram_from_buckets("ttft_buckets", buckets)
    assert histogram is not None
    assert histogram.bounds_ms == (100.0, 250.0, 500.0) and histogram.cumulative == (4.0, 4.0, 9.0)
    assert histogram.count == 10.0 and histogram.share_within(500.0) == pytest.approx(0.9)
    assert histogram_from_buckets("ttft_buckets", buckets[:-1]) is None
    assert histogram_from_buckets("ttft_buckets", ((0.1, 0.0), (math.inf, 0.0))) is None
    with pytest.raises(TrafficUnavailable) as info:
        histogram_from_buckets("ttft_buckets", ((0.1, -1.0), (math.inf, 2.0)))
    assert info.value.kind == NoTrafficDataKind.INVALID_VALUE
    no_label = json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "3"]}]}}
    ).encode()
    with pytest.raises(TrafficUnavailable, match="le label"):
        parse_bucket_answer(200, no_label, "q")


def test_parse_range_answer() -> None:
    """A matrix answer is every series' (time, value) points; an empty matrix is no series."""
    body = _matrix([(100, "1"), (101.5, "2.5")], [(101, "NaN")])
    assert parse_range_answer(200, body, "q")[0] == ((100.0, 1.0), (101.5, 2.5))
    assert math.isnan(parse_range_answer(200, body, "q")[1][0][1])
    assert parse_range_answer(200, _matrix(), "q") == ()


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (500, b"oops", NoTrafficDataKind.HTTP_ERROR),
        (400, b'{"status":"error","errorType":"bad_data","error":"too many points"}', NoTrafficDataKind.QUERY_ERROR),
        (200, vector("1"), NoTrafficDataKind.MALFORMED),  # an instant vector is not a range answer
        (200, b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{}}]}}', "malformed"),
        (200, _matrix([(100, 1.0)]), NoTrafficDataKind.MALFORMED),  # values are strings in the API
        (200, _matrix([(100, "x")]), NoTrafficDataKind.MALFORMED),
    ],
    ids=["http-500", "query-error", "vector", "no-values", "unquoted", "not-a-number"],
)
def test_parse_range_answer_garbage(status: int, body: bytes, kind: object) -> None:
    with pytest.raises(TrafficUnavailable) as info:
        parse_range_answer(status, body, "q")
    assert info.value.kind == NoTrafficDataKind(kind)


def test_step_increments_diff_and_sum_series() -> None:
    """Consecutive points are diffed per series and summed over series; a first point is only a baseline."""
    first = ((100, 10.0), (101, 12.0), (102, 12.0), (103, 15.0), (104, 15.0), (105, 20.0))
    late = ((103, 50.0), (104, 51.0), (105, 53.0))  # a frontend that appeared at 103 s: its 50 are before the range
    assert step_increments((first, late), GRID, "c").tolist() == [2.0, 0.0, 3.0, 1.0, 7.0]


def test_step_increments_counter_reset_restarts_from_zero() -> None:
    """A decrease is a restart: the step gets the new value, as Prometheus' `increase` reads a reset."""
    restarted = ((100, 10.0), (101, 12.0), (102, 3.0), (103, 5.0), (104, 5.0), (105, 0.0))
    assert step_increments((restarted,), GRID, "c").tolist() == [2.0, 3.0, 2.0, 0.0, 0.0]


def test_step_increments_spread_over_missing_points() -> None:
    """An increment across missing points (the target was down) is spread over the steps it spans."""
    gap = ((100, 0.0), (101, 4.0), (104, 10.0))
    assert step_increments((gap,), GRID, "c").tolist() == [4.0, 2.0, 2.0, 2.0, 0.0]


def test_step_increments_empty_answer_and_garbage() -> None:
    """No series is no increment; NaN, negative or off-grid points raise, never count."""
    assert step_increments((), GRID, "c").tolist() == [0.0] * 5
    for bad, kind in (
        (((100, 1.0), (101, math.nan)), NoTrafficDataKind.INVALID_VALUE),
        (((100, -1.0),), NoTrafficDataKind.INVALID_VALUE),
        (((100, 1.0), (101.3, 2.0)), NoTrafficDataKind.MALFORMED),
        (((101, 1.0), (100, 2.0)), NoTrafficDataKind.MALFORMED),
        (((106, 1.0),), NoTrafficDataKind.MALFORMED),
    ):
        with pytest.raises(TrafficUnavailable) as info:
            step_increments((bad,), GRID, "c")
        assert info.value.kind == kind


def test_step_grid_ends_at_the_window_end() -> None:
    """The last point is the window's end (whole ms); the steps cover the window and the look-back."""
    grid = StepGrid.ending_at(1_000.0004, 90.0, 1.0)
    assert (grid.start_ms, grid.step_ms, grid.num_steps, grid.end_s) == (910_000, 1000, 90, 1000.0)
    assert StepGrid.ending_at(10.0, 2.5, 1.0).num_steps == 3  # a partial step still counts
    assert grid.step_end_s()[[0, -1]].tolist() == [911.0, 1000.0]


def test_arrivals_from_increments_mean_isl_per_step() -> None:
    """A step's requests get its mean ISL, or the window's mean where no ISL was observed in the step."""
    num_req = np.array([0.0, 2.0, 0.0, 3.0, 1.0])
    isl_sum = np.array([0.0, 2000.0, 0.0, 0.0, 500.0])
    isl_count = np.array([0.0, 2.0, 0.0, 0.0, 1.0])
    arrivals = arrivals_from_increments(GRID, num_req, isl_sum, isl_count, window_start_s=101.0)
    assert arrivals.resolution_s == 1.0
    # the steps ending after 101 s hold the window's 3 ISL observations: (2000 + 500) / 3 where a step has none
    assert arrivals.isl.tolist() == pytest.approx([1000.0, 1000.0, 2500 / 3, 2500 / 3, 2500 / 3, 500.0])
    assert arrivals.arrival_s.tolist() == [101.25, 101.75, 103 + 1 / 6, 103.5, 103 + 5 / 6, 104.5]


def test_arrivals_from_increments_garbage_and_idle() -> None:
    """Requests without any ISL observation, or implausibly many, raise; an idle range is no arrival."""
    zeros = np.zeros(5)
    assert arrivals_from_increments(GRID, zeros, zeros, zeros, 100.0).num_requests == 0
    with pytest.raises(TrafficUnavailable, match="no observations although 3 requests started"):
        arrivals_from_increments(GRID, np.array([0, 0, 3.0, 0, 0]), zeros, zeros, 100.0)
    with pytest.raises(TrafficUnavailable, match="requests per step = 2000000.0: above the plausible maximum 1e\\+06"):
        arrivals_from_increments(GRID, np.array([0, 0, 2e6, 0, 0]), zeros + 1, zeros + 1, 100.0)


def test_arrival_resolution_is_validated_and_bounded(tmp_path: Path) -> None:
    """The resolution is > 0 in the config and the options; one too fine for the window is a query error."""
    with pytest.raises(ConfigError, match="prometheus_arrival_resolution_seconds' = 0"):
        parse_config({"prometheus_arrival_resolution_seconds": 0})
    assert parse_config({}).service.prometheus_arrival_resolution_seconds == 1.0
    with pytest.raises(ValueError, match="arrival_resolution_s = 0"):
        PrometheusOptions(endpoint="http://p", arrival_resolution_s=0)
    loaded = load_config(write_config(tmp_path, prometheus_arrival_resolution_seconds=0.25))
    source = PrometheusTrafficSource.from_config(
        loaded.policy, loaded.service, RuntimeSettings(prometheus_endpoint="http://p")
    )
    assert source.options.arrival_resolution_s == 0.25
    source.close()
    # 60 s + 30 s look-back at 1 ms: 90,001 points per series, more than Prometheus serves (no request is sent)
    with PrometheusTrafficSource(
        PrometheusOptions(endpoint=f"http://127.0.0.1:{free_port()}", arrival_resolution_s=0.001), TrafficQueries()
    ) as fine:
        with pytest.raises(TrafficUnavailable, match="raise prometheus_arrival_resolution_seconds") as info:
            fine.arrivals(T0, T0 + dt.timedelta(seconds=60))
    assert info.value.kind == NoTrafficDataKind.QUERY_ERROR


# --- a fake Prometheus over real HTTP (tests/runtime/fake_prometheus.py) ----------------------------------------


@pytest.fixture
def fake_prometheus() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    yield server
    server.close()


def test_fake_prometheus_good_answer_and_bearer_token(fake_prometheus: FakePrometheus) -> None:
    """Every query carries the bearer token; a good set of answers becomes one observation."""
    fake_prometheus.answer = answers_by_series(GOOD)
    obs = collect_window(prometheus_source(fake_prometheus.url, bearer_token="s3cret"))
    assert (obs.num_req, obs.isl, obs.osl, obs.kv_hit_rate, obs.accept_length) == (120, 3000, 300, 0.3, 1.8)
    # requests, ISL, OSL, TTFT, ITL, KV hit rate, accept length, p95 and p99 TTFT, queue time, TTFT and ITL buckets
    assert len(fake_prometheus.headers) == 12
    assert {h.get("Authorization") for h in fake_prometheus.headers} == {"Bearer s3cret"}


def test_token_file_is_reread_every_collection(fake_prometheus: FakePrometheus, tmp_path: Path) -> None:
    """A rotated token file is picked up by the next collection (Kubernetes service-account tokens rotate)."""
    fake_prometheus.answer = answers_by_series(GOOD)
    token_file = tmp_path / "token"
    source = prometheus_source(fake_prometheus.url, bearer_token_file=token_file)
    token_file.write_text("first\n")
    source.collect(T0, T0 + dt.timedelta(seconds=60))
    token_file.write_text("second")
    source.collect(T0, T0 + dt.timedelta(seconds=60))
    source.close()
    assert [h["Authorization"] for h in fake_prometheus.headers[::12]] == ["Bearer first", "Bearer second"]


def test_fallback_to_completed_requests(fake_prometheus: FakePrometheus) -> None:
    """Without the started counter the completed-requests counter is used (Dynamo's fallback)."""
    fake_prometheus.answer = answers_by_series({**GOOD, "requests_started_total": None, "requests_total": "90"})
    assert collect_window(prometheus_source(fake_prometheus.url)).num_req == 90


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (lambda _q: (500, b"oops"), NoTrafficDataKind.HTTP_ERROR),
        (lambda _q: (200, b"{not json"), NoTrafficDataKind.MALFORMED),
        (lambda _q: (200, b" " * (MAX_ANSWER_BYTES + 1)), NoTrafficDataKind.MALFORMED),
        (lambda _q: (200, vector()), NoTrafficDataKind.NO_SERIES),
        (answers_by_series({**GOOD, "requests_started_total": "NaN"}), NoTrafficDataKind.INVALID_VALUE),
        (answers_by_series({**GOOD, "requests_started_total": "-3"}), NoTrafficDataKind.INVALID_VALUE),
        (answers_by_series({**GOOD, "input_sequence_tokens": "1e300"}), NoTrafficDataKind.INVALID_VALUE),
    ],
    ids=["http-500", "malformed-json", "oversized", "no-series", "nan", "negative", "huge"],
)
def test_fake_prometheus_garbage(fake_prometheus: FakePrometheus, answer, kind: NoTrafficDataKind) -> None:
    """Garbage over real HTTP is a typed no-data result, never an observation."""
    fake_prometheus.answer = answer
    with pytest.raises(TrafficUnavailable) as info:
        collect_window(prometheus_source(fake_prometheus.url))
    assert info.value.kind == kind


def test_slow_and_refused_are_unreachable(fake_prometheus: FakePrometheus) -> None:
    """An answer slower than the timeout (its read timeout or the query deadline), and a closed port, are both
    `unreachable`."""
    fake_prometheus.delay_s = 0.5
    with pytest.raises(TrafficUnavailable, match="ReadTimeout|query deadline") as info:
        with PrometheusTrafficSource(
            PrometheusOptions(endpoint=fake_prometheus.url, timeout_s=0.1), TrafficQueries()
        ) as source:
            source.collect(T0, T0 + dt.timedelta(seconds=60))
    assert info.value.kind == NoTrafficDataKind.UNREACHABLE
    with pytest.raises(TrafficUnavailable, match="ConnectError") as info:
        collect_window(prometheus_source(f"http://127.0.0.1:{free_port()}"))
    assert info.value.kind == NoTrafficDataKind.UNREACHABLE


def _self_signed(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA and a server certificate for 127.0.0.1 signed by it; returns the CA file and the server context."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate("test CA", ca_key, "test CA", ca_key, ca=True)
    server_cert = certificate("127.0.0.1", server_key, "test CA", ca_key, ca=False)
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


def test_tls_with_ca_bundle(tmp_path: Path) -> None:
    """HTTPS: verified with the CA bundle; refused (unreachable) without it; accepted with verification off."""
    ca_file, server_context = _self_signed(tmp_path)
    server = FakePrometheus(tls=server_context)
    server.answer = answers_by_series(GOOD)
    try:
        assert collect_window(prometheus_source(server.url, ca_bundle=ca_file)).num_req == 120
        with pytest.raises(TrafficUnavailable, match="CERTIFICATE_VERIFY_FAILED") as info:
            collect_window(prometheus_source(server.url))
        assert info.value.kind == NoTrafficDataKind.UNREACHABLE
        assert collect_window(prometheus_source(server.url, verify_tls=False)).num_req == 120
    finally:
        server.close()
    with pytest.raises(ValueError, match="CA bundle .*missing.pem: cannot be used"):
        prometheus_source(server.url, ca_bundle=tmp_path / "missing.pem")


def test_source_selection_from_config_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config's endpoint wins over the environment's; Dynamo's variable names work; none means no source."""
    bare = load_config(write_config(tmp_path))
    configured = load_config(write_config(tmp_path, metric_pulling_prometheus_endpoint="http://from-config:9090"))
    assert PrometheusTrafficSource.from_config(bare.policy, bare.service, RuntimeSettings()) is None
    monkeypatch.setenv("PROMETHEUS_ENDPOINT", "http://dynamo-name:9090")
    monkeypatch.setenv("PROMETHEUS_TOKEN", "t0ken")
    monkeypatch.setenv("DYN_PLANNER_PROMETHEUS_REQUEST_TIMEOUT_SECONDS", "3.5")
    from_env = PrometheusTrafficSource.from_config(bare.policy, bare.service, RuntimeSettings())
    assert (from_env.options.endpoint, from_env.options.bearer_token, from_env.options.timeout_s) == (
        "http://dynamo-name:9090",
        "t0ken",
        3.5,
    )
    monkeypatch.setenv("PLANNER_PROMETHEUS_ENDPOINT", "http://planner-name:9090")
    assert (
        PrometheusTrafficSource.from_config(bare.policy, bare.service, RuntimeSettings()).options.endpoint
        == "http://planner-name:9090"
    )
    assert PrometheusTrafficSource.from_config(
        configured.policy, configured.service, RuntimeSettings()
    ).options.endpoint == ("http://from-config:9090")
    assert from_env.options.verify_tls is True  # unlike Dynamo, certificates are verified unless switched off


def test_unreadable_ca_bundle_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that cannot be built still yields a reason, so the tick records why it held."""
    loaded = load_config(write_config(tmp_path, metric_pulling_prometheus_endpoint="https://p:9090"))
    monkeypatch.setenv("PLANNER_PROMETHEUS_CA_BUNDLE", str(tmp_path / "nope.pem"))
    collected = collect_from_source(loaded.policy, loaded.service, T0, T0 + dt.timedelta(seconds=60))
    assert collected.observation is None and "nope.pem: cannot be used" in collected.problem


def test_garbage_answer_makes_the_tick_hold(
    fake_prometheus: FakePrometheus, database_url: str, tmp_path: Path, profile_dir: Path
) -> None:
    """NaN requests from Prometheus: the tick (service.run_tick) records no_traffic_data, holds and audits why."""
    fake_prometheus.answer = answers_by_series({**GOOD, "requests_started_total": "NaN"})
    config_path = write_config(tmp_path, metric_pulling_prometheus_endpoint=fake_prometheus.url)
    ctx = load_context(database_url, "garbage", config_path)
    collected = collect_traffic.fn(
        ctx.config, ctx.service, T0, T0 + dt.timedelta(seconds=60)
    )  # the flow's task, no engine
    assert collected.observation is None and collected.problem_kind == NoTrafficDataKind.INVALID_VALUE
    result = run_tick(ctx, Loop.THROUGHPUT, T0 + dt.timedelta(seconds=60), None, traffic_problem=collected.problem)
    assert result.outcome.reason == ReasonCode.NO_TRAFFIC_DATA and result.outcome.decision.is_empty
    with ctx.sessions.begin() as session:
        audit = session.scalars(select(AuditLogRow).where(AuditLogRow.event == "traffic_unavailable")).one()
        assert audit.tick_id == result.tick_id
        assert audit.detail == {"loop": "throughput", "problem": "invalid_value: num_req = nan: not a finite number"}


# --- a real Prometheus scraping the simulator's exporter -------------------------------------------------------

SCRAPE_INTERVAL_S = 1.0
BUSY_S = 12.0  # the replayed trace sends requests for this long, then nothing
RATE_PER_S = 20.0
ISL, OSL = 2000.0, 200.0
KV_HIT_RATE, ACCEPT_LENGTH = 0.25, 2.0
MODEL = "test-model"


def prometheus_binary() -> str:
    """Debian's Prometheus, installed with apt-get on first use (CI machines are clean and run as root)."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("prometheus is not installed and installing it needs root (apt-get install prometheus)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=900)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"], check=True, env=env, timeout=900
    )
    found = shutil.which("prometheus")
    assert found, "apt-get installed prometheus but the binary is not on PATH"
    return found


@dataclass
class PrometheusServer:
    """A Prometheus process of our own (config, storage and port under a temporary folder), stoppable."""

    binary: str
    folder: Path
    target: str
    scrape_interval_s: float = SCRAPE_INTERVAL_S
    port: int = 0
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.port = free_port()
        self.folder.mkdir(parents=True, exist_ok=True)
        every = f"{round(self.scrape_interval_s * 1000)}ms"  # Prometheus durations are whole numbers of a unit
        (self.folder / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {every}\n  scrape_timeout: {every}\n"
            f"scrape_configs:\n  - job_name: frontend\n    static_configs:\n      - targets: ['{self.target}']\n"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.folder / "prometheus.log", "ab"),  # the process owns it
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            time.sleep(0.05)
        raise RuntimeError(f"Prometheus did not become ready; see {self.folder / 'prometheus.log'}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None

    def ensure_running(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()


@dataclass(frozen=True)
class LiveSetup:
    """A simulated frontend replaying a trace since `started_at_s`, scraped by `prometheus`; `served` is what the
    simulator serves every request (the same simulation run to completion on its own: it is deterministic)."""

    prometheus: PrometheusServer
    exporter: TraceMetricsExporter
    started_at_s: float
    served: SimResult

    def at(self, offset_s: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.started_at_s + offset_s, tz=dt.UTC)

    def wait_until(self, offset_s: float) -> None:
        time.sleep(max(0.0, self.started_at_s + offset_s - time.time()))


def _steady_trace() -> RequestTrace:
    """RATE_PER_S requests per second for BUSY_S seconds, all of ISL x OSL tokens (exact means)."""
    arrival = np.arange(0.0, BUSY_S, 1.0 / RATE_PER_S)
    arrays = [arrival, np.full(len(arrival), ISL), np.full(len(arrival), OSL)]
    for array in arrays:
        array.setflags(write=False)
    return RequestTrace(source="steady", start_epoch_s=0.0, arrival_s=arrays[0], isl=arrays[1], osl=arrays[2])


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSetup]:
    """One exporter and one Prometheus for the session; the trace starts when the exporter does."""
    binary = prometheus_binary()
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    assert fwd is not None
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000))
    reference = ClusterSimulator(_steady_trace(), fwd, spec, num_prefill=1, num_decode=1)
    reference.run_to_completion()
    sim = ClusterSimulator(_steady_trace(), fwd, spec, num_prefill=1, num_decode=1)
    started_at_s = time.time()
    exporter = TraceMetricsExporter(
        sim, model=MODEL, started_at_s=started_at_s, kv_hit_rate=KV_HIT_RATE, accept_length=ACCEPT_LENGTH
    )
    port = exporter.serve()
    prometheus = PrometheusServer(binary, tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{port}")
    prometheus.start()
    try:
        yield LiveSetup(prometheus=prometheus, exporter=exporter, started_at_s=started_at_s, served=reference.result())
    finally:
        prometheus.stop()
        exporter.stop()


@pytest.fixture
def live_prometheus(live: LiveSetup) -> LiveSetup:
    """The session's setup with Prometheus running (a test may have stopped it)."""
    live.prometheus.ensure_running()
    return live


def _live_config(tmp_path: Path, live: LiveSetup, **overrides: object) -> Path:
    body: dict[str, object] = {
        "metric_pulling_prometheus_endpoint": live.prometheus.url,
        "model_name": MODEL.upper(),  # the frontend lowercases model names: matched case-insensitively
        "backend": "vllm",
    }
    body.update(overrides)
    return write_config(tmp_path, **body)


# Scrapes start ~5 s after Prometheus. The trace stops sending at 12 s; on 1 prefill + 1 decode engine of the
# profile a request has its first token ~60 ms after arrival and then decodes 200 tokens ~10 ms apart (~2 s), so
# the last one is done at ~13.6 s (`LiveSetup.served`; checked below): the idle window starts after it.
BUSY_WINDOW = (7.0, 11.0)
IDLE_WINDOW = (14.5, 18.5)


@pytest.mark.parametrize("source", ["frontend", "router"])
def test_real_prometheus_busy_window(live_prometheus: LiveSetup, tmp_path: Path, source: str) -> None:
    """A busy window read back through a real Prometheus: the trace's rate and exact means."""
    live = live_prometheus
    loaded = load_config(_live_config(tmp_path, live, throughput_metrics_source=source))
    live.wait_until(BUSY_WINDOW[1] + 0.5)
    collected = collect_from_source(loaded.policy, loaded.service, live.at(BUSY_WINDOW[0]), live.at(BUSY_WINDOW[1]))
    obs = collected.observation
    assert obs is not None, collected.problem
    # 20 req/s x 4 s = 80 requests; increase() extrapolates from 1 s scrapes, so allow 15%
    assert obs.num_req == pytest.approx(RATE_PER_S * 4.0, rel=0.15)
    assert (obs.isl, obs.osl) == pytest.approx((ISL, OSL))  # sum/count: the extrapolation cancels
    assert obs.kv_hit_rate == pytest.approx(KV_HIT_RATE)
    assert obs.accept_length == pytest.approx(ACCEPT_LENGTH)  # 1 + (OSL - OSL/2) / (OSL/2)
    # What the simulator served: TTFT of the requests whose first token came in the window, ITL of those whose last
    # token did (every request has 199 gaps, so the token-weighted mean is the plain mean). Only scrapes inside
    # the window count, so allow 10%; the means sit far from what a wrong timeline gives (TTFT 0, or ~2 s if the
    # whole request were counted).
    served, arrival = live.served, live.exporter.trace.arrival_s
    first_s = arrival + served.ttft_s
    first = (first_s >= BUSY_WINDOW[0]) & (first_s < BUSY_WINDOW[1])
    done = (served.finish_s >= BUSY_WINDOW[0]) & (served.finish_s < BUSY_WINDOW[1])
    assert obs.ttft_ms == pytest.approx(1000 * float(np.mean(served.ttft_s[first])), rel=0.1)
    assert obs.itl_ms == pytest.approx(1000 * float(np.mean(served.itl_s[done])), rel=0.1)
    assert obs.invalid_field() is None
    # the TTFT histogram the error budget reads: as many requests as the window's first tokens, each bucket's
    # share as served (the exporter's buckets; 10 % for the extrapolation, as above)
    assert obs.ttft_histogram is not None and obs.itl_histogram is not None
    assert obs.ttft_histogram.count == pytest.approx(float(np.sum(first)), rel=0.15)
    for bound_ms in (50.0, 100.0, 250.0):
        served_share = float(np.mean(served.ttft_s[first] * 1000.0 <= bound_ms))
        assert obs.ttft_histogram.share_within(bound_ms) == pytest.approx(served_share, abs=0.1)
    assert obs.itl_histogram.share_within(50.0) == pytest.approx(float(np.mean(served.itl_s[done] <= 0.05)), abs=0.1)


def test_real_prometheus_idle_window_is_zero_traffic(live_prometheus: LiveSetup, tmp_path: Path) -> None:
    """After the trace stops, a window is zero traffic (0 requests, lengths 0), not a missing observation."""
    live = live_prometheus
    assert float(np.max(live.served.finish_s)) < IDLE_WINDOW[0]  # every request is done before the window
    loaded = load_config(_live_config(tmp_path, live))
    live.wait_until(IDLE_WINDOW[1] + 0.5)
    collected = collect_from_source(loaded.policy, loaded.service, live.at(IDLE_WINDOW[0]), live.at(IDLE_WINDOW[1]))
    assert collected.observation == TrafficObservation(duration_s=4.0, num_req=0.0, isl=0.0, osl=0.0)


def test_real_prometheus_unknown_model_has_no_series(live_prometheus: LiveSetup, tmp_path: Path) -> None:
    """Series of another model do not count as this deployment's traffic: no data, not zero."""
    live = live_prometheus
    loaded = load_config(_live_config(tmp_path, live, model_name="other-model"))
    live.wait_until(BUSY_WINDOW[1] + 0.5)
    collected = collect_from_source(loaded.policy, loaded.service, live.at(BUSY_WINDOW[0]), live.at(BUSY_WINDOW[1]))
    assert collected.observation is None and collected.problem_kind == NoTrafficDataKind.NO_SERIES


def test_prometheus_down_mid_run_holds(
    live_prometheus: LiveSetup, database_url: str, tmp_path: Path, profile_dir: Path
) -> None:
    """Prometheus stops between two ticks: the second tick records no_traffic_data, holds and audits why."""
    live = live_prometheus
    ctx = load_context(database_url, "prom-down", _live_config(tmp_path, live))
    live.wait_until(BUSY_WINDOW[1] + 0.5)
    first = collect_traffic.fn(ctx.config, ctx.service, live.at(BUSY_WINDOW[0]), live.at(BUSY_WINDOW[1]))
    assert first.observation is not None, first.problem
    tick_one = run_tick(ctx, Loop.THROUGHPUT, live.at(BUSY_WINDOW[1]), first.observation)
    assert tick_one.outcome.reason != ReasonCode.NO_TRAFFIC_DATA

    live.prometheus.stop()
    second = collect_traffic.fn(ctx.config, ctx.service, live.at(BUSY_WINDOW[1]), live.at(BUSY_WINDOW[1] + 4))
    assert second.observation is None and second.problem_kind == NoTrafficDataKind.UNREACHABLE
    tick_two = run_tick(ctx, Loop.THROUGHPUT, live.at(BUSY_WINDOW[1] + 4), None, traffic_problem=second.problem)
    assert tick_two.outcome.reason == ReasonCode.NO_TRAFFIC_DATA and tick_two.outcome.decision.is_empty
    assert tick_two.outcome.next_state.load_history == tick_one.outcome.next_state.load_history  # not fed
    with ctx.sessions.begin() as session:
        decisions = session.scalars(select(DecisionRow.tick_id)).all()
        assert tick_two.tick_id not in decisions  # holding never scales (down or up)
        audit = session.scalars(select(AuditLogRow).where(AuditLogRow.tick_id == tick_two.tick_id)).all()
        assert any(row.event == "traffic_unavailable" and "unreachable" in row.detail["problem"] for row in audit)


# --- the prompt-arrival curve from a real Prometheus ---------------------------------------------------------------

ARRIVAL_SCRAPE_S = 0.5  # at most the 1 s resolution, so every step sees its own increments
ARRIVAL_SPEEDUP = 10.0  # trace seconds per wall second: the recommended policy's 60 s window passes in 6 s
ARRIVAL_WINDOW = (6.0, 12.0)  # wall seconds after the replay started; scrapes begin ~5 s after Prometheus


@pytest.fixture
def bursty_replay(tmp_path: Path) -> Iterator[tuple[PrometheusServer, TraceMetricsExporter, RequestTrace]]:
    """The Azure conversation trace at twice its rate, ten times faster than real time, through the simulator's
    exporter, scraped every 0.5 s by a Prometheus of its own; the trace is yielded on the wall clock's scale."""
    binary = prometheus_binary()
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    assert fwd is not None
    trace = load_trace(AZURE_CONV_TRACE).scaled(2.0)
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000))
    sim = ClusterSimulator(trace, fwd, spec, num_prefill=4, num_decode=4)  # prefill keeps up: ISL not late
    exporter = TraceMetricsExporter(sim, model=RECOMMENDED_MODEL.lower(), speedup=ARRIVAL_SPEEDUP)
    port = exporter.serve(advance_every_s=0.1)
    prometheus = PrometheusServer(binary, tmp_path / "prometheus", f"127.0.0.1:{port}", ARRIVAL_SCRAPE_S)
    prometheus.start()
    try:
        yield prometheus, exporter, trace.compressed(ARRIVAL_SPEEDUP)
    finally:
        prometheus.stop()
        exporter.stop()


RECOMMENDED_MODEL = load_config(DEFAULT_CONFIG).policy.model_name or ""


def test_real_prometheus_arrival_curve_sizes_the_burst_step(bursty_replay, tmp_path: Path) -> None:
    """A throughput tick of the recommended policy on traffic read from a real Prometheus gets the prompt-arrival
    curve (intervals of 1 s and more, at the default resolution) and sizes prefill on it: `burst_sized` or
    `burst_covered`, never `burst_unavailable`."""
    prometheus, exporter, wall_trace = bursty_replay
    loaded = load_config(DEFAULT_CONFIG)
    planner = build_planner(loaded.policy, DEFAULT_CONFIG)
    service = loaded.service.model_copy(update={"metric_pulling_prometheus_endpoint": prometheus.url})
    start = dt.datetime.fromtimestamp(exporter.started_at_s + ARRIVAL_WINDOW[0], tz=dt.UTC)
    end = dt.datetime.fromtimestamp(exporter.started_at_s + ARRIVAL_WINDOW[1], tz=dt.UTC)
    time.sleep(max(0.0, end.timestamp() + 2 * ARRIVAL_SCRAPE_S - time.time()))  # the window's last scrape is in
    collected = collect_from_source(loaded.policy, service, start, end, RuntimeSettings(), planner=planner)
    assert collected is not None and collected.observation is not None, collected and collected.problem
    assert collected.curve_problem is None
    obs = planner.traffic_features(collected.observation)  # the curve the tick derives from the arrivals
    curve = dict(obs.prompt_arrival_curve())
    assert sorted(curve) == [1.0, 2.0, 5.0, 10.0, 30.0]  # 250 ms and 500 ms are finer than the 1 s resolution
    # The same curve from the trace's own timestamps and prompt lengths at the same resolution. Prometheus' counts
    # lag by up to a scrape, and a step's requests all get its mean ISL (of first tokens), which flattens the
    # peaks of single long prompts: the points agree within a factor, not exactly. Only the points whose
    # interval reaches no further back than the first scrapes are compared.
    offset_start_s, offset_end_s = (t - exporter.started_at_s for t in (start.timestamp(), end.timestamp()))
    exact = prompt_arrival_curve(
        replace(wall_trace.arrivals(offset_start_s, offset_end_s), resolution_s=1.0),
        offset_start_s,
        offset_end_s,
        cap=prompt_cap(planner.config, planner.perf, obs),
    )
    compared = {
        name: (curve.get(interval_s), exact.get(name)) for name, interval_s in PROMPT_ARRIVAL_INTERVALS_S.items()
    }
    for name in ("prompt_tokens_p99_1s", "prompt_tokens_p99_2s", "prompt_tokens_p99_5s"):
        rebuilt, true = compared[name]
        assert 0.5 * true <= rebuilt <= 1.5 * true, (name, rebuilt, true)

    workers = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
    outcome = planner.decide(
        TickInputs(now_s=end.timestamp(), loop=Loop.THROUGHPUT, workers=workers, traffic=obs), PlannerState()
    )
    burst = [step for step in outcome.steps if step.step == StepName.BURST]
    assert burst and {step.reason for step in burst} <= {ReasonCode.BURST_SIZED, ReasonCode.BURST_COVERED}, burst


def test_arrivals_failing_alone_keep_the_observation(
    live_prometheus: LiveSetup, database_url: str, tmp_path: Path, profile_dir: Path
) -> None:
    """The flow's collect-traffic task with the context's planner: the curve at the default resolution; when only
    the arrivals fail (a resolution Prometheus cannot serve for the window), the observation stays, without the
    curve, the burst step says `burst_unavailable` and the audit log says why."""
    live = live_prometheus
    live.wait_until(BUSY_WINDOW[1] + 0.5)
    window = (live.at(BUSY_WINDOW[0]), live.at(BUSY_WINDOW[1]))
    ctx = load_context(database_url, "curve", _live_config(tmp_path, live, throughput_prefill_burst_sizing=True))
    with_curve = collect_traffic.fn(ctx.config, ctx.service, *window, ctx.planner)
    assert with_curve.curve_problem is None
    assert ctx.planner.traffic_features(with_curve.observation).prompt_tokens_p99_1s is not None

    config_path = _live_config(
        tmp_path, live, throughput_prefill_burst_sizing=True, prometheus_arrival_resolution_seconds=0.001
    )
    ctx = load_context(database_url, "no-curve", config_path)
    collected = collect_traffic.fn(ctx.config, ctx.service, *window, ctx.planner)
    assert collected.problem is None and collected.observation is not None
    assert collected.observation.prompt_arrivals is None
    assert collected.curve_problem.startswith("query_error: 34001 points per series at a 0.001 s resolution")
    result = run_tick(ctx, Loop.THROUGHPUT, window[1], collected.observation, curve_problem=collected.curve_problem)
    assert result.outcome.reason != ReasonCode.NO_TRAFFIC_DATA
    [burst] = [step for step in result.outcome.steps if step.step == StepName.BURST]
    assert burst.reason == ReasonCode.BURST_UNAVAILABLE
    with ctx.sessions.begin() as session:
        rows = session.scalars(select(AuditLogRow).where(AuditLogRow.tick_id == result.tick_id)).all()
        problems = {row.event: row.detail.get("problem") for row in rows}
        assert problems["arrival_curve_unavailable"] == collected.curve_problem
        assert "traffic_unavailable" not in problems  # the traffic was there


def test_real_prometheus_other_namespace_has_no_series(live_prometheus: LiveSetup, tmp_path: Path) -> None:
    """A series without `dynamo_namespace` matches (Dynamo's frontend exports none), one of another namespace
    does not: the simulated frontend's series say namespace "dynamo"."""
    live = live_prometheus
    loaded = load_config(_live_config(tmp_path, live, namespace="other-ns"))
    live.wait_until(BUSY_WINDOW[1] + 0.5)
    collected = collect_from_source(loaded.policy, loaded.service, live.at(BUSY_WINDOW[0]), live.at(BUSY_WINDOW[1]))
    assert collected.observation is None and collected.problem_kind == NoTrafficDataKind.NO_SERIES
