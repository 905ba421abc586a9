"""The simulator's metrics exporter: Dynamo's series names, counts and sums equal to the replayed trace prefix,
served over real HTTP in the text format Prometheus scrapes."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner_core.perf.model import ProfilePerfModel
from planner_core.sim.cluster import ClusterSpec, SimulatedCluster
from planner_core.sim.exporter import TraceMetricsExporter
from planner_core.traces import RequestTrace
from tests.conftest import PROFILE_DIR

pytestmark = pytest.mark.skipif(not PROFILE_DIR.is_dir(), reason=f"shared H200 profile missing: {PROFILE_DIR}")

T_START = 1_000.0


def _frozen(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    values.setflags(write=False)
    return values


def _trace() -> RequestTrace:
    """30 requests over 15 s with varied lengths."""
    rng = np.random.default_rng(7)
    return RequestTrace(
        source="varied",
        start_epoch_s=0.0,
        arrival_s=_frozen(np.sort(rng.uniform(0, 15, 30))),
        isl=_frozen(rng.integers(100, 8000, 30)),
        osl=_frozen(rng.integers(1, 600, 30)),
    )


@pytest.fixture(scope="module")
def perf() -> ProfilePerfModel:
    return ProfilePerfModel.load(PROFILE_DIR)


class Clock:
    def __init__(self) -> None:
        self.now_s = T_START

    def __call__(self) -> float:
        return self.now_s


def _exporter(perf: ProfilePerfModel, clock: Clock, **options: object) -> TraceMetricsExporter:
    cluster = SimulatedCluster.start(
        _trace(), perf, ClusterSpec(ttft_ms=200, itl_ms=10, slice_s=1.0), num_prefill=1, num_decode=1
    )
    return TraceMetricsExporter(cluster, model="m", namespace="ns-1", started_at_s=T_START, clock=clock, **options)


def _samples(exporter: TraceMetricsExporter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in exporter.collect() for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in samples.items() if n == name and all((k, x) in ls for k, x in labels.items())]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_counts_and_sums_equal_the_trace_prefix(perf: ProfilePerfModel) -> None:
    """At replay offset 7.5 s (speedup 1.5, 5 s of wall time) the series cover exactly the requests that
    arrived by then: counts, ISL/OSL sums, TTFT and token-weighted ITL from the simulated cluster."""
    clock = Clock()
    exporter = _exporter(perf, clock, speedup=1.5, kv_hit_rate=0.4, accept_length=1.5)
    clock.now_s = T_START + 5.0  # 5 s x 1.5 = offset 7.5 s
    samples = _samples(exporter)
    trace = exporter.trace
    num = int(np.searchsorted(trace.arrival_s, 7.5, side="right"))
    assert 0 < num < trace.num_requests
    isl, osl = trace.isl[:num], trace.osl[:num]
    ttft_ms, itl_ms = exporter._ttft_ms[:num], exporter._itl_ms[:num]
    frontend = {"model": "m", "dynamo_namespace": "ns-1"}
    assert _value(samples, "dynamo_frontend_requests_started_total", **frontend) == num
    assert _value(samples, "dynamo_frontend_requests_total", **frontend) == num
    assert _value(samples, "dynamo_component_router_requests_total", dynamo_namespace="ns_1") == num
    assert _value(samples, "dynamo_frontend_input_sequence_tokens_sum", **frontend) == pytest.approx(isl.sum())
    assert _value(samples, "dynamo_frontend_output_sequence_tokens_count", **frontend) == num
    assert _value(samples, "dynamo_frontend_time_to_first_token_seconds_sum", **frontend) == pytest.approx(
        ttft_ms.sum() / 1000
    )
    gaps = osl - 1  # ITL is observed once per token after the first
    assert _value(samples, "dynamo_frontend_inter_token_latency_seconds_count", **frontend) == gaps.sum()
    assert _value(samples, "dynamo_frontend_inter_token_latency_seconds_sum", **frontend) == pytest.approx(
        (itl_ms * gaps).sum() / 1000
    )
    assert _value(samples, "dynamo_component_router_kv_hit_rate_sum", dynamo_namespace="ns_1") == pytest.approx(
        0.4 * num
    )
    drafts = _value(samples, "vllm:spec_decode_num_drafts_total", **frontend)
    accepted = _value(samples, "vllm:spec_decode_num_accepted_tokens_total", **frontend)
    assert 1 + accepted / drafts == pytest.approx(1.5)  # what the planner's vLLM query computes
    # histogram buckets are cumulative and end at the count
    le_inf = _value(samples, "dynamo_frontend_input_sequence_tokens_bucket", le="+Inf", **frontend)
    le_4096 = _value(samples, "dynamo_frontend_input_sequence_tokens_bucket", le="4096.0", **frontend)
    assert (le_inf, le_4096) == (num, np.count_nonzero(isl <= 4096))


def test_incremental_scrapes_equal_one_scrape(perf: ProfilePerfModel) -> None:
    """Scraping every second gives the same totals as one scrape at the end (counters only grow)."""
    stepwise_clock, once_clock = Clock(), Clock()
    stepwise, once = _exporter(perf, stepwise_clock), _exporter(perf, once_clock)
    previous = {}
    for second in range(1, 21):
        stepwise_clock.now_s = T_START + second
        current = _samples(stepwise)
        assert all(current[key] >= value for key, value in previous.items())
        previous = current
    once_clock.now_s = T_START + 20
    assert previous == pytest.approx(_samples(once))
    assert stepwise.num_exported == stepwise.trace.num_requests  # the trace ended at 15 s


def test_served_over_http_in_text_format(perf: ProfilePerfModel) -> None:
    """`/metrics` answers the Prometheus text format with vLLM's colon names intact; other paths are 404."""
    exporter = _exporter(perf, Clock(), accept_length=2.0)
    port = exporter.serve()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            names = {family.name for family in text_string_to_metric_families(response.read().decode())}
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    finally:
        exporter.stop()
    assert {
        "dynamo_frontend_requests_started",
        "dynamo_frontend_requests",
        "dynamo_frontend_input_sequence_tokens",
        "dynamo_frontend_output_sequence_tokens",
        "dynamo_frontend_time_to_first_token_seconds",
        "dynamo_frontend_inter_token_latency_seconds",
        "dynamo_frontend_request_duration_seconds",
        "dynamo_component_router_requests",
        "dynamo_component_router_input_sequence_tokens",
        "vllm:spec_decode_num_drafts",
    } <= names


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speedup": 0.0}, "speedup must be > 0"),
        ({"kv_hit_rate": 1.2}, r"kv_hit_rate must be in \[0, 1\]"),
        ({"accept_length": 0.9}, "accept_length must be >= 1"),
    ],
    ids=["speedup", "kv-hit", "accept"],
)
def test_bad_options_are_refused(perf: ProfilePerfModel, options: dict, message: str) -> None:
    """Options outside their domain are one-line errors."""
    with pytest.raises(ValueError, match=message):
        _exporter(perf, Clock(), **options)


def test_needs_a_cluster_at_the_start(perf: ProfilePerfModel, tmp_path: Path) -> None:
    """A cluster that already simulated some time cannot be exported from the start of its trace."""
    cluster = SimulatedCluster.start(_trace(), perf, ClusterSpec(ttft_ms=200, itl_ms=10), num_prefill=1, num_decode=1)
    cluster.advance(10.0)
    with pytest.raises(ValueError, match="at the start of its trace"):
        TraceMetricsExporter(cluster, model="m")


def test_sim_exporter_command_serves_until_sigterm(azure_conv_trace: Path) -> None:
    """`planner sim-exporter` serves the replay on the port it announces and exits 0 on SIGTERM."""
    import os
    import re
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "planner_core.cli", "sim-exporter", "--trace", str(azure_conv_trace)]
    process = subprocess.Popen([*command, "--port", "0", "--speedup", "60"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        banner = process.stderr.readline()
        port = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", banner)
        assert port, banner
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert (
            'dynamo_frontend_requests_total{dynamo_namespace="dynamo",model="nvidia/Llama-3.1-8B-Instruct-FP8"}' in text
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
