"""The simulator's metrics exporter: Dynamo's series names, each request exported along its simulated timeline
(started at arrival, TTFT at its first token, completed at its last), served over real HTTP in the text format
Prometheus scrapes. The cluster is the discrete-event simulator timed by the linear forward-pass model of
`tests/core/fakes.py`, so the expected values can be worked out by hand."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from planner_core.lab.sim.des import ClusterSimulator, SimSpec
from planner_core.lab.sim.exporter import TraceMetricsExporter
from planner_core.traces import RequestTrace
from tests.core.fakes import FWD, make_trace
from tests.lab.test_sim_engines import hashed_trace

T_START = 1_000.0
FRONTEND = {"model": "m", "dynamo_namespace": "ns-1"}
ROUTER = {"dynamo_namespace": "ns_1"}


def _varied_trace() -> RequestTrace:
    """30 requests over 15 s with varied lengths (some of OSL 1: no token gaps)."""
    rng = np.random.default_rng(7)
    arrival_s = np.sort(rng.uniform(0, 15, 30)).tolist()
    return make_trace(arrival_s, rng.integers(100, 8000, 30).tolist(), rng.integers(1, 600, 30).tolist())


class Clock:
    def __init__(self) -> None:
        self.now_s = T_START

    def __call__(self) -> float:
        return self.now_s

    def at_offset(self, offset_s: float, speedup: float = 1.0) -> None:
        self.now_s = T_START + offset_s / speedup


def _exporter(
    clock: Clock, trace: RequestTrace | None = None, spec: SimSpec | None = None, **options: object
) -> TraceMetricsExporter:
    sim = ClusterSimulator(trace or _varied_trace(), FWD, spec or SimSpec(), num_prefill=1, num_decode=1)
    return TraceMetricsExporter(sim, model="m", namespace="ns-1", started_at_s=T_START, clock=clock, **options)


def _samples(exporter: TraceMetricsExporter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in exporter.collect() for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    matches = [v for (n, ls), v in samples.items() if n == name and all((k, x) in ls for k, x in labels.items())]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


# One request (ISL 1000, OSL 100) on 1 prefill + 1 decode engine (see test_single_request_latencies): the prefill
# takes 0.010 + 1000e-5 = 0.020 s; the decode engine then runs 100 iterations of 0.005 + 1e-4 + 1050e-8 =
# 0.0051105 s, the first of which emits the first token: TTFT 0.0251105 s, last token at 0.020 + 100 x 0.0051105
# = 0.53105 s, 99 gaps summing to 0.53105 - 0.0251105 = 0.5059395 s.
ITER_S = 0.005 + 1e-4 + 1050e-8
FIRST_S, LAST_S = 0.020 + ITER_S, 0.020 + 100 * ITER_S


@pytest.mark.parametrize(
    ("offset_s", "started", "first_tokens", "completed"),
    [
        (0.0, 1, 0, 0),  # arrived: started (and routed), nothing else yet
        (0.021, 1, 0, 0),  # prefilled, first decode iteration under way
        (0.026, 1, 1, 0),  # first token at 0.0251105 s: TTFT and ISL observed
        (0.531, 1, 1, 0),  # the last token comes at 0.53105 s
        (0.532, 1, 1, 1),  # done: completed, OSL, duration, 99 gaps
    ],
)
def test_one_request_is_exported_along_its_timeline(
    offset_s: float, started: int, first_tokens: int, completed: int
) -> None:
    clock = Clock()
    exporter = _exporter(clock, make_trace([0.0], [1000], [100]))
    clock.at_offset(offset_s)
    samples = _samples(exporter)
    assert _value(samples, "dynamo_frontend_requests_started_total", **FRONTEND) == started
    assert _value(samples, "dynamo_component_router_requests_total", **ROUTER) == started
    assert _value(samples, "dynamo_frontend_time_to_first_token_seconds_count", **FRONTEND) == first_tokens
    assert _value(samples, "dynamo_frontend_time_to_first_token_seconds_sum", **FRONTEND) == pytest.approx(
        first_tokens * FIRST_S
    )
    assert _value(samples, "dynamo_frontend_input_sequence_tokens_sum", **FRONTEND) == first_tokens * 1000
    assert _value(samples, "dynamo_frontend_requests_total", **FRONTEND) == completed
    assert _value(samples, "dynamo_frontend_output_sequence_tokens_sum", **FRONTEND) == completed * 100
    assert _value(samples, "dynamo_frontend_request_duration_seconds_sum", **FRONTEND) == pytest.approx(
        completed * LAST_S
    )
    assert _value(samples, "dynamo_frontend_inter_token_latency_seconds_count", **FRONTEND) == completed * 99
    assert _value(samples, "dynamo_frontend_inter_token_latency_seconds_sum", **FRONTEND) == pytest.approx(
        completed * (LAST_S - FIRST_S)
    )


def test_counts_and_sums_follow_the_simulated_timeline() -> None:
    """At replay offset 7.05 s (speedup 1.5, 4.7 s of wall time) every series covers exactly the events by then of an
    independent run of the same simulator to completion: arrivals, first tokens and last tokens."""
    clock = Clock()
    exporter = _exporter(clock, speedup=1.5, kv_hit_rate=0.4, accept_length=1.5)
    clock.at_offset(7.05, speedup=1.5)
    samples = _samples(exporter)
    trace = exporter.trace
    reference = ClusterSimulator(trace, FWD, SimSpec(), num_prefill=1, num_decode=1)
    reference.run_to_completion()
    result = reference.result()
    arrival, isl, osl = trace.arrival_s, trace.isl, trace.osl
    first_s = arrival + result.ttft_s
    started, first, done = arrival <= 7.05, first_s <= 7.05, result.finish_s <= 7.05
    # 13 arrived by then (the 13th at 7.019 s), 12 had their first token (the 13th's comes at 7.098 s), 9 were done
    assert (started.sum(), first.sum(), done.sum()) == (13, 12, 9)
    assert _value(samples, "dynamo_frontend_requests_started_total", **FRONTEND) == started.sum()
    assert _value(samples, "dynamo_component_router_requests_total", **ROUTER) == started.sum()
    assert _value(samples, "dynamo_frontend_requests_total", **FRONTEND) == done.sum()
    assert _value(samples, "dynamo_frontend_input_sequence_tokens_sum", **FRONTEND) == isl[first].sum()
    assert _value(samples, "dynamo_frontend_time_to_first_token_seconds_sum", **FRONTEND) == pytest.approx(
        result.ttft_s[first].sum()
    )
    assert _value(samples, "dynamo_frontend_output_sequence_tokens_sum", **FRONTEND) == osl[done].sum()
    assert _value(samples, "dynamo_frontend_request_duration_seconds_sum", **FRONTEND) == pytest.approx(
        (result.finish_s - arrival)[done].sum()
    )
    gaps = osl[done] - 1  # ITL is observed once per token after the first; OSL-1 requests add none
    assert _value(samples, "dynamo_frontend_inter_token_latency_seconds_count", **FRONTEND) == gaps.sum()
    assert _value(samples, "dynamo_frontend_inter_token_latency_seconds_sum", **FRONTEND) == pytest.approx(
        np.nansum(result.itl_s[done] * gaps)
    )
    # the router's histograms are the frontend's; the hit-rate constant is observed with each first token
    assert _value(samples, "dynamo_component_router_input_sequence_tokens_sum", **ROUTER) == isl[first].sum()
    assert _value(samples, "dynamo_component_router_kv_hit_rate_sum", **ROUTER) == pytest.approx(0.4 * first.sum())
    drafts = _value(samples, "vllm:spec_decode_num_drafts_total", **FRONTEND)
    accepted = _value(samples, "vllm:spec_decode_num_accepted_tokens_total", **FRONTEND)
    assert 1 + accepted / drafts == pytest.approx(1.5)  # what the planner's vLLM query computes
    # histogram buckets are cumulative and end at the count
    le_inf = _value(samples, "dynamo_frontend_input_sequence_tokens_bucket", le="+Inf", **FRONTEND)
    le_4096 = _value(samples, "dynamo_frontend_input_sequence_tokens_bucket", le="4096.0", **FRONTEND)
    assert (le_inf, le_4096) == (first.sum(), np.count_nonzero(isl[first] <= 4096))


@pytest.mark.parametrize(
    ("blocks", "kv_hit_rate", "expected_sum"),
    [
        # the second prompt's 3 blocks are cached but its last token (1535 of 1536 tokens): 0 + 1535 / 1536
        ([[1, 2, 3], [1, 2, 3]], None, 1535 / 1536),
        # the first two blocks match: 0 + 1024 / 1536
        ([[1, 2, 3], [1, 2, 9]], None, 1024 / 1536),
        # a given rate overrides the simulated one: 2 x 0.25
        ([[1, 2, 3], [1, 2, 3]], 0.25, 0.5),
    ],
)
def test_router_hit_rate_is_the_simulated_prefix_cache_hit(
    blocks: list[list[int]], kv_hit_rate: float | None, expected_sum: float
) -> None:
    clock = Clock()
    exporter = _exporter(clock, hashed_trace([0.0, 1.0], [1536, 1536], blocks), kv_hit_rate=kv_hit_rate)
    clock.at_offset(5.0)
    samples = _samples(exporter)
    assert _value(samples, "dynamo_component_router_kv_hit_rate_count", **ROUTER) == 2
    assert _value(samples, "dynamo_component_router_kv_hit_rate_sum", **ROUTER) == pytest.approx(expected_sum)


def test_no_hit_rate_series_without_blocks_or_a_rate() -> None:
    """A trace without prefix blocks and no given rate: nothing to say about the hit rate, so no series."""
    clock = Clock()
    exporter = _exporter(clock)
    clock.at_offset(5.0)
    assert not any(name.startswith("dynamo_component_router_kv_hit_rate") for name, _ in _samples(exporter))


QUEUED_GAUGE = "dynamo_frontend_queued_requests"


def test_incremental_scrapes_equal_one_scrape() -> None:
    """Scraping every second gives the same totals as one scrape at the end (counters only grow; the queued-requests
    gauge goes up and down), and by 40 s every request of the 15 s trace has finished."""
    stepwise_clock, once_clock = Clock(), Clock()
    stepwise, once = _exporter(stepwise_clock), _exporter(once_clock)
    previous = {}
    for second in range(1, 41):
        stepwise_clock.at_offset(second)
        current = _samples(stepwise)
        assert all(current[key] >= value for key, value in previous.items() if key[0] != QUEUED_GAUGE)
        previous = current
    once_clock.at_offset(40)
    assert previous == pytest.approx(_samples(once))
    assert stepwise.num_started == stepwise.num_completed == stepwise.trace.num_requests


def test_scaling_the_live_cluster() -> None:
    """`set_targets` scales the simulated cluster at the replay offset now: a decode worker asked for at 10 s
    is ready after the start-up time (30 s here), at 40 s."""
    clock = Clock()
    exporter = _exporter(clock, spec=SimSpec(startup_s=30.0))
    clock.at_offset(10.0)
    exporter.set_targets(None, 2)
    assert exporter.sim.now_s == 10.0  # the cluster was brought to the replay offset first
    counts = exporter.worker_counts()
    assert (counts.ready_decode, counts.expected_decode) == (1, 2)
    clock.at_offset(40.0)
    counts = exporter.worker_counts()
    assert (counts.ready_decode, counts.expected_decode) == (2, 2)


def test_served_over_http_in_text_format() -> None:
    """`/metrics` answers the Prometheus text format with vLLM's colon names intact; other paths are 404."""
    exporter = _exporter(Clock(), accept_length=2.0)
    port = exporter.serve(advance_every_s=0.05)
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
def test_bad_options_are_refused(options: dict, message: str) -> None:
    """Options outside their domain are one-line errors."""
    with pytest.raises(ValueError, match=message):
        _exporter(Clock(), **options)


def test_needs_a_simulator_at_the_start() -> None:
    """A simulator that already ran some time cannot be exported from the start of its trace."""
    sim = ClusterSimulator(_varied_trace(), FWD, SimSpec(), num_prefill=1, num_decode=1)
    sim.run_until(10.0)
    with pytest.raises(ValueError, match="at the start of its trace"):
        TraceMetricsExporter(sim, model="m")


def test_sim_exporter_command_serves_until_sigterm(azure_conv_trace: Path) -> None:
    """`planner sim-exporter` serves the replay on the port it announces and exits 0 on SIGTERM."""
    import os
    import re
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "planner_cli.main", "sim-exporter", "--trace", str(azure_conv_trace)]
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
