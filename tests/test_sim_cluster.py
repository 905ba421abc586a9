"""Tests of `planner_core.sim.cluster`: worker start-up/removal, GPU accounting, latency model, observe/summarise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.domain import Component
from planner_core.perf.model import ProfilePerfModel
from planner_core.sim.cluster import MAX_TTFT_MS, ClusterSpec, SimulatedCluster, SliceStats, summarise
from planner_core.traces import RequestTrace, load_trace

SHARED_DIR = Path(__file__).resolve().parents[2] / "shared"
PROFILE_DIR = SHARED_DIR / "perf" / "dynamo-planner-test-profile" / "H200_TP1P_TP1D"
TRACES_DIR = SHARED_DIR / "traces"

pytestmark = pytest.mark.skipif(
    not PROFILE_DIR.is_dir(), reason=f"shared H200 profile missing: {PROFILE_DIR} (expected next to the repo)"
)

P, D = Component.PREFILL, Component.DECODE
SPEC = ClusterSpec(ttft_ms=500.0, itl_ms=20.0, startup_s=30.0, slice_s=10.0)


def _frozen(values: list[float] | np.ndarray) -> np.ndarray:
    array = np.array(values, dtype=float)
    array.setflags(write=False)
    return array


def make_trace(arrival_s: list[float], isl: float | list[float] = 1000.0, osl: float | list[float] = 200.0):
    """A small trace built directly: sorted arrivals from 0, constant or given lengths, read-only arrays."""
    n = len(arrival_s)
    return RequestTrace(
        source="synthetic",
        start_epoch_s=1_700_000_000.0,
        arrival_s=_frozen(arrival_s),
        isl=_frozen(np.broadcast_to(isl, n)),
        osl=_frozen(np.broadcast_to(osl, n)),
    )


# 20 requests in [0, 10), none in [10, 30), 20 in [30, 40), 5 in [40, 50).
BURSTY = make_trace([i * 0.5 for i in range(20)] + [30 + i * 0.5 for i in range(20)] + [40 + 2 * i for i in range(5)])


@pytest.fixture(scope="module")
def perf() -> ProfilePerfModel:
    """The shipped H200 TP1 profile, loaded once."""
    return ProfilePerfModel.load(PROFILE_DIR)


@pytest.fixture(scope="module", params=["AzureLLMInferenceTrace_conv.csv", "synthetic_trace.jsonl"])
def real_trace(request: pytest.FixtureRequest) -> RequestTrace:
    """A real trace (Azure conv or Mooncake), loaded once."""
    if not TRACES_DIR.is_dir():
        pytest.skip(f"shared trace files missing: {TRACES_DIR}")
    return load_trace(TRACES_DIR / request.param)


@pytest.fixture(scope="module")
def conv() -> RequestTrace:
    """The Azure 2023 conversation trace."""
    if not TRACES_DIR.is_dir():
        pytest.skip(f"shared trace files missing: {TRACES_DIR}")
    return load_trace(TRACES_DIR / "AzureLLMInferenceTrace_conv.csv")


def _counts(cluster: SimulatedCluster, component: Component) -> tuple[int, int]:
    return cluster.ready[component], cluster.expected(component)


# ---------------------------------------------------------------------------------------------------------
# Start-up and removal
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("startup_s", [10.0, 25.0, 120.0], ids=["10s", "25s-off-slice", "120s"])
def test_requested_worker_becomes_ready_exactly_after_startup(perf: ProfilePerfModel, startup_s: float) -> None:
    """A worker requested at t becomes ready at t + startup_s: not a millisecond earlier, and then at once."""
    spec = ClusterSpec(ttft_ms=500.0, itl_ms=20.0, startup_s=startup_s, slice_s=10.0)
    cluster = SimulatedCluster.start(BURSTY, perf, spec, num_prefill=1, num_decode=1)
    cluster.advance(20.0)
    cluster.apply_targets(2, 3)
    assert _counts(cluster, P) == (1, 2) and _counts(cluster, D) == (1, 3)
    cluster.advance(20.0 + startup_s - 1e-3)
    assert _counts(cluster, P) == (1, 2) and _counts(cluster, D) == (1, 3)
    cluster.advance(20.0 + startup_s)
    assert _counts(cluster, P) == (2, 2) and _counts(cluster, D) == (3, 3)
    assert cluster.pending == []
    after = cluster.advance(20.0 + startup_s + 10.0)
    assert [(s.ready_prefill, s.ready_decode) for s in after] == [(2, 3)]
    assert all((s.ready_prefill, s.ready_decode) == (1, 1) for s in cluster.slices if s.end_s <= 20.0 + startup_s)


def test_removal_cancels_most_recent_pending_starts_first(perf: ProfilePerfModel) -> None:
    """Scaling down while starts are pending cancels the newest starts and leaves ready workers alone."""
    cluster = SimulatedCluster.start(BURSTY, perf, SPEC, num_prefill=3, num_decode=1)
    cluster.apply_targets(5, 1)  # two starts, ready at 30
    cluster.advance(10.0)
    cluster.apply_targets(6, 1)  # one more, ready at 40
    assert _counts(cluster, P) == (3, 6)
    cluster.apply_targets(4, 1)  # cancels the start requested at 10, then one from 0
    assert _counts(cluster, P) == (3, 4)
    assert cluster.pending == [(30.0, P)]
    cluster.advance(30.0)
    assert _counts(cluster, P) == (4, 4)  # the survivor is the start from t=0


def test_removal_beyond_pending_removes_ready_workers_at_once(perf: ProfilePerfModel) -> None:
    """Once no start is pending, removed workers leave immediately; the next slice serves with fewer."""
    cluster = SimulatedCluster.start(BURSTY, perf, SPEC, num_prefill=2, num_decode=4)
    cluster.apply_targets(3, 4)
    cluster.advance(10.0)
    cluster.apply_targets(1, 1)  # prefill: cancel the start, then drop 1 ready; decode: drop 3 ready
    assert _counts(cluster, P) == (1, 1) and _counts(cluster, D) == (1, 1)
    assert cluster.pending == []
    (stats,) = cluster.advance(20.0)
    assert (stats.ready_prefill, stats.ready_decode) == (1, 1)
    cluster.apply_targets(0, 1)
    assert _counts(cluster, P) == (0, 0)
    cluster.advance(60.0)
    assert _counts(cluster, P) == (0, 0)  # nothing comes back by itself


def test_negative_target_is_rejected_or_clamped(perf: ProfilePerfModel) -> None:
    """A negative target never drives a pool below 0 workers or GPU-seconds below the remaining workers'."""
    cluster = SimulatedCluster.start(BURSTY, perf, SPEC, num_prefill=1, num_decode=1)
    try:
        cluster.apply_targets(-1, 1)
    except ValueError:
        return
    assert cluster.ready[P] >= 0
    (stats,) = cluster.advance(10.0)
    assert stats.gpu_s == 10.0


def test_unchanged_targets_do_nothing(perf: ProfilePerfModel) -> None:
    """Applying the current expected counts neither starts nor removes workers."""
    cluster = SimulatedCluster.start(BURSTY, perf, SPEC, num_prefill=2, num_decode=3)
    cluster.apply_targets(3, 3)
    cluster.apply_targets(3, 3)
    assert _counts(cluster, P) == (2, 3) and _counts(cluster, D) == (3, 3)
    assert len(cluster.pending) == 1


# ---------------------------------------------------------------------------------------------------------
# GPU accounting
# ---------------------------------------------------------------------------------------------------------


def test_gpu_seconds_count_ready_and_starting_workers(perf: ProfilePerfModel) -> None:
    """GPU-seconds = (ready + starting workers) x GPUs per engine x time, slice by slice."""
    spec = ClusterSpec(
        ttft_ms=500.0, itl_ms=20.0, startup_s=20.0, slice_s=10.0, prefill_gpus_per_engine=2, decode_gpus_per_engine=4
    )
    cluster = SimulatedCluster.start(BURSTY, perf, spec, num_prefill=1, num_decode=2)
    cluster.apply_targets(2, 3)  # +1 prefill, +1 decode, ready at 20
    cluster.advance(30.0)
    cluster.apply_targets(1, 1)  # -1 prefill, -2 decode, at once
    cluster.advance(40.0)
    # [0,10) and [10,20): ready 1P*2 + 2D*4 = 10 GPUs, starting 1P*2 + 1D*4 = 6 GPUs -> 16 GPUs * 10 s = 160 each
    # [20,30): ready 2P*2 + 3D*4 = 16 GPUs, nothing starting                      -> 16 GPUs * 10 s = 160
    # [30,40): ready 1P*2 + 1D*4 = 6 GPUs                                          ->  6 GPUs * 10 s =  60
    assert [s.gpu_s for s in cluster.slices] == [160.0, 160.0, 160.0, 60.0]
    assert summarise(cluster.slices).gpu_hours == pytest.approx(540.0 / 3600.0)


def test_gpu_seconds_scale_with_slice_length(perf: ProfilePerfModel) -> None:
    """A partial slice accrues GPU-seconds for its own length only."""
    cluster = SimulatedCluster.start(BURSTY, perf, SPEC, num_prefill=1, num_decode=1)
    stats = cluster.advance(12.5)
    assert [(s.start_s, s.end_s, s.gpu_s) for s in stats] == [(0.0, 10.0, 20.0), (10.0, 12.5, 5.0)]


# ---------------------------------------------------------------------------------------------------------
# Latency model
# ---------------------------------------------------------------------------------------------------------


def _run(trace: RequestTrace, perf: ProfilePerfModel, num_prefill: int, num_decode: int, end_s: float):
    cluster = SimulatedCluster.start(trace, perf, SPEC, num_prefill=num_prefill, num_decode=num_decode)
    cluster.advance(end_s)
    return cluster


def test_more_workers_never_raise_latency_on_real_trace(real_trace: RequestTrace, perf: ProfilePerfModel) -> None:
    """Over each minute of a real trace (at 3x rate), more prefill workers never raise mean TTFT, nor decode ITL."""
    trace, end_s, counts = real_trace.scaled(3), 600.0, range(1, 5)
    clusters = {(p, d): _run(trace, perf, p, d, end_s) for p in counts for d in counts}
    for start_s in np.arange(0.0, end_s, 60.0):
        for fixed in counts:
            ttft = [clusters[p, fixed].observe(start_s, start_s + 60.0).ttft_ms for p in counts]
            itl = [clusters[fixed, d].observe(start_s, start_s + 60.0).itl_ms for d in counts]
            assert all(a >= b for a, b in zip(ttft, ttft[1:], strict=False)), (start_s, ttft)
            assert all(a >= b for a, b in zip(itl, itl[1:], strict=False)), (start_s, itl)
    overall = [summarise(clusters[p, 1].slices).mean_ttft_ms for p in counts]
    assert overall[0] > overall[-1]  # and the effect is real, not flat


@settings(max_examples=40, deadline=None)
@given(
    per_slice=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=8),
    isl=st.floats(min_value=100.0, max_value=20_000.0),
    num_prefill=st.integers(min_value=0, max_value=3),
    extra=st.integers(min_value=1, max_value=3),
)
def test_more_prefill_workers_never_raise_any_slice_ttft(
    perf: ProfilePerfModel, per_slice: list[int], isl: float, num_prefill: int, extra: int
) -> None:
    """On synthetic traffic, adding prefill workers never raises the TTFT sum of any slice (backlog included)."""
    arrivals = [10.0 * k + 10.0 * i / n for k, n in enumerate(per_slice) for i in range(n)]
    if not arrivals:
        return
    trace = make_trace([a - arrivals[0] for a in arrivals], isl=isl)
    end_s = 10.0 * len(per_slice) + 10.0
    fewer = _run(trace, perf, num_prefill, 1, end_s).slices
    more = _run(trace, perf, num_prefill + extra, 1, end_s).slices
    for a, b in zip(fewer, more, strict=True):
        assert a.num_req == b.num_req
        assert b.sum_ttft_ms <= a.sum_ttft_ms


def test_idle_slice_has_no_requests_and_zero_latency_sums(perf: ProfilePerfModel) -> None:
    """A slice without arrivals reports 0 requests, 0 met, zero TTFT/ITL sums, but still accrues GPU time."""
    cluster = _run(BURSTY, perf, 1, 1, 50.0)
    idle = [s for s in cluster.slices if 10.0 <= s.start_s < 30.0]
    assert len(idle) == 2
    for stats in idle:
        assert (stats.num_req, stats.num_sla_met, stats.sum_ttft_ms, stats.sum_itl_ms) == (0, 0, 0.0, 0.0)
        assert stats.gpu_s == 20.0
    observed = cluster.observe(10.0, 30.0)
    assert observed.num_req == 0 and observed.ttft_ms is None and observed.itl_ms is None


@pytest.mark.parametrize("pool", [P, D], ids=["prefill", "decode"])
def test_empty_pool_caps_latency_and_fails_every_request(perf: ProfilePerfModel, pool: Component) -> None:
    """With 0 workers in a pool every request gets the capped figure (MAX_TTFT_MS) and misses the SLA."""
    num_prefill, num_decode = (0, 2) if pool is P else (2, 0)
    cluster = _run(BURSTY, perf, num_prefill, num_decode, 50.0)
    busy = [s for s in cluster.slices if s.num_req]
    assert sum(s.num_req for s in busy) == BURSTY.num_requests
    for stats in busy:
        assert stats.num_sla_met == 0
        capped = stats.sum_ttft_ms if pool is P else stats.sum_itl_ms  # decode: ITL is set to MAX_TTFT_MS too
        assert capped == stats.num_req * MAX_TTFT_MS
    assert summarise(cluster.slices).sla_attainment == 0.0


def test_unserved_prefill_backlog_delays_requests_after_workers_arrive(perf: ProfilePerfModel) -> None:
    """Prompts that arrived while the prefill pool was empty are carried over and delay later requests."""
    trace = make_trace([float(t) for t in range(0, 60)], isl=8000.0)
    no_history = _run(trace, perf, 1, 1, 60.0)
    cluster = SimulatedCluster.start(trace, perf, SPEC, num_prefill=0, num_decode=1)
    cluster.apply_targets(1, 1)  # ready at 30: [0, 30) piles up a backlog of 30 x 8000 tokens
    cluster.advance(60.0)
    assert cluster.slices[3].ready_prefill == 1
    assert cluster.slices[3].sum_ttft_ms > no_history.slices[3].sum_ttft_ms
    assert cluster.prefill_backlog_tokens >= 0.0


def test_same_targets_give_identical_slices(conv: RequestTrace, perf: ProfilePerfModel) -> None:
    """Two clusters driven by the same target timeline on the same trace produce identical slices."""
    timeline = [(60.0, (2, 2)), (180.0, (1, 3)), (300.0, (3, 1)), (420.0, (2, 2)), (600.0, (2, 2))]

    def drive() -> list[SliceStats]:
        cluster = SimulatedCluster.start(conv.scaled(2.5), perf, SPEC, num_prefill=1, num_decode=1)
        for at_s, (num_prefill, num_decode) in timeline:
            cluster.advance(at_s)
            cluster.apply_targets(num_prefill, num_decode)
        return cluster.slices

    first, second = drive(), drive()
    assert len(first) == 60
    assert first == second


# ---------------------------------------------------------------------------------------------------------
# observe() and summarise()
# ---------------------------------------------------------------------------------------------------------


def test_observe_is_trace_traffic_plus_simulated_latency(conv: RequestTrace, perf: ProfilePerfModel) -> None:
    """`observe` = the trace's traffic in the window plus mean TTFT/ITL over the slices inside it."""
    cluster = _run(conv, perf, 1, 1, 300.0)
    observed, traffic = cluster.observe(60.0, 180.0), conv.observe(60.0, 180.0)
    window = [s for s in cluster.slices if 60.0 <= s.start_s and s.end_s <= 180.0]
    assert len(window) == 12
    num_req = sum(s.num_req for s in window)
    assert num_req == traffic.num_req > 0
    for name in ("duration_s", "num_req", "isl", "osl", "isl_p90", "osl_p90"):
        assert getattr(observed, name) == getattr(traffic, name)
    assert observed.ttft_ms == pytest.approx(sum(s.sum_ttft_ms for s in window) / num_req)
    assert observed.itl_ms == pytest.approx(sum(s.sum_itl_ms for s in window) / num_req)
    assert observed.invalid_field() is None


def test_observe_beyond_simulated_time_has_no_latency(conv: RequestTrace, perf: ProfilePerfModel) -> None:
    """A window not simulated yet reports the trace's traffic without latency figures."""
    cluster = _run(conv, perf, 1, 1, 60.0)
    assert cluster.observe(120.0, 180.0) == conv.observe(120.0, 180.0)


def test_summarise_totals_are_consistent(conv: RequestTrace, perf: ProfilePerfModel) -> None:
    """Totals: requests = trace requests in [0, end), attainment = met / total, GPU-hours = sum(gpu_s) / 3600."""
    spec = ClusterSpec(ttft_ms=45.0, itl_ms=6.0, startup_s=30.0, slice_s=10.0)  # tight: some requests miss
    cluster = SimulatedCluster.start(conv.scaled(2), perf, spec, num_prefill=1, num_decode=1)
    cluster.advance(300.0)
    slices = cluster.slices
    summary = summarise(slices)
    assert summary.num_req == sum(s.num_req for s in slices) == conv.scaled(2).observe(0.0, 300.0).num_req
    assert summary.num_sla_met == sum(s.num_sla_met for s in slices)
    assert 0 < summary.num_sla_met < summary.num_req
    assert summary.sla_attainment == summary.num_sla_met / summary.num_req
    assert summary.gpu_hours == pytest.approx(sum(s.gpu_s for s in slices) / 3600.0)
    assert summary.gpu_hours == pytest.approx(2 * 300.0 / 3600.0)  # 1 prefill + 1 decode GPU for 300 s
    assert summary.mean_ttft_ms == pytest.approx(sum(s.sum_ttft_ms for s in slices) / summary.num_req)
    assert summary.mean_itl_ms == pytest.approx(sum(s.sum_itl_ms for s in slices) / summary.num_req)


def test_summarise_of_nothing() -> None:
    """No slices: zero requests, zero GPU-hours, attainment 1 (nothing was missed)."""
    summary = summarise([])
    assert (summary.num_req, summary.num_sla_met, summary.gpu_hours) == (0, 0, 0.0)
    assert summary.sla_attainment == 1.0
