"""`planner bench --engine dynamo`: the mapping of Dynamo's replay snapshots and reports (pure, no Dynamo needed),
the per-window oracle search on that engine, and, where Dynamo's virtualenv exists, the bench end to end through
`planner_core/lab/dynamo/run_replay.py` with our planner, Dynamo's planner and the oracle in Dynamo's replay loop."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from planner_core.domain import Component, EngineLimits, ForwardPassMetrics, QueuedRequests, ScheduledRequests
from planner_core.lab.sim.bench import FixedPolicy, OraclePolicy, PlannerPolicy, build_policies
from planner_core.lab.sim.des import ClusterSimulator, SimSpec, window_observation
from planner_core.lab.sim.dynamo_engine import (
    REPLAY_ROUTER,
    DynamoEngine,
    ReplayView,
    _bracket_guess,
    _size_replay_window,
    dynamo_bench,
    fpm_from_snapshot,
    merged_latency,
    replay_result,
    write_replay_trace,
)
from planner_core.lab.sim.dynamo_policy import find_dynamo_python, fpm_message
from planner_core.lab.sim.oracle import OracleSettings, OracleWindow, oracle_windows
from planner_core.perf.model import ProfilePerfModel
from tests.conftest import PROFILE_DIR
from tests.core.fakes import FWD, make_trace
from tests.lab.test_bench import busy_trace, write_small_azure_trace


def test_the_replayed_trace_starts_at_zero_and_gives_fresh_blocks_per_prompt(tmp_path: Path) -> None:
    trace = make_trace([10.0, 10.5, 12.0], [100, 1100, 600], [5, 1, 9])
    path = tmp_path / "t.jsonl"
    assert write_replay_trace(trace, path, slice(1, 3)) == 10.5
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["timestamp"] for r in records] == [0.0, 1500.0]
    assert [r["hash_ids"] for r in records] == [[0, 1, 2], [3, 4]]  # ceil(ISL / 512) blocks, none shared
    assert [(r["input_length"], r["output_length"]) for r in records] == [(1100, 1), (600, 9)]


def test_a_replay_report_becomes_a_result_indexed_like_the_trace() -> None:
    trace = make_trace([0.0, 1.0, 1.0, 2.0], [100] * 4, [1, 10, 10, 10])
    report = {
        "per_request": [  # Dynamo lists completions; the last request has no record (never finished)
            {"arrival_time_ms": 1000.0, "ttft_ms": 200.0, "itl_ms": 30.0, "e2e_latency_ms": 500.0},
            {"arrival_time_ms": 0.0, "ttft_ms": 100.0, "itl_ms": None, "e2e_latency_ms": 100.0},
            {"arrival_time_ms": 1000.0, "ttft_ms": 300.0, "itl_ms": 60.0, "e2e_latency_ms": 900.0},
        ],
        "summary": {"gpu_hours": 0.5},
        "lifecycle_operations": [
            {"operation_ordinal": 1, "at_ms": 3000.0, "pool": "decode", "cause": "worker_ready_event",
             "state_after_batch": {"active": [0, 1]}},
            {"operation_ordinal": 0, "at_ms": 1000.0, "pool": "decode", "cause": "planner_scale",
             "state_after_batch": {"active": [0]}},
        ],
    }  # fmt: skip
    result = replay_result(trace, report, shift_s=5.0, initial=(1, 1))
    np.testing.assert_allclose(result.ttft_s[:3], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(result.finish_s[:3], [5.1, 6.5, 6.9])  # arrival + shift + end-to-end
    assert np.isnan(result.itl_s[0]) and result.itl_s[2] == pytest.approx(0.06)  # 1-token requests have no ITL
    assert np.isnan(result.ttft_s[3]) and np.isnan(result.finish_s[3])
    assert result.gpu_s == 1800.0 and result.num_scaling_events == 1
    assert result.worker_timeline == ((5.0, 1, 1), (6.0, 1, 1), (8.0, 1, 2))


def test_dynamo_fpm_snapshots_read_back_as_our_forward_pass_metrics() -> None:
    fpm = ForwardPassMetrics(
        component=Component.DECODE, worker_id="3", wall_time_s=0.012,
        scheduled=ScheduledRequests(num_decode_requests=7, sum_decode_kv_tokens=9000, var_decode_kv_tokens=2.5),
        queued=QueuedRequests(num_decode_requests=2, sum_decode_kv_tokens=4000),
    )  # fmt: skip
    assert fpm_from_snapshot("decode", fpm_message(fpm)) == fpm


def test_merged_latency_weights_each_window_by_its_sample_counts() -> None:
    windows = [
        {"avg_ttft_ms": 100.0, "ttft_count": 3, "avg_itl_ms": 10.0, "itl_count": 1, "avg_kv_hit_rate": 0.0,
         "hit_rate_count": 0},
        {"avg_ttft_ms": 200.0, "ttft_count": 1, "avg_itl_ms": 20.0, "itl_count": 3, "avg_kv_hit_rate": 0.5,
         "hit_rate_count": 2},
    ]  # fmt: skip
    assert merged_latency(windows) == (125.0, 17.5, 0.5)
    assert merged_latency([{"avg_ttft_ms": 0.0, "ttft_count": 0}]) == (None, None, None)


def test_the_replay_view_observes_through_the_simulators_function() -> None:
    """One path: the view's observation is `window_observation` of the trace's window with Dynamo's merged
    latencies, and its arrivals and lengths are what our simulator observes of the same window."""
    trace = busy_trace(400, 240.0)
    view = ReplayView(trace)
    window = {"avg_ttft_ms": 80.0, "ttft_count": 10, "avg_itl_ms": 9.0, "itl_count": 10}
    snapshot = {"active_prefill_count": 2, "active_decode_count": 1, "non_draining_prefill_count": 3,
                "non_draining_decode_count": 1, "active_prefill_ids": [0, 1], "active_decode_ids": [0]}  # fmt: skip
    view.absorb(60.0, {**snapshot, "traffic": window})
    view.absorb(120.0, {**snapshot, "traffic": {**window, "avg_ttft_ms": 120.0}})
    observed = view.observe(60.0, 120.0)
    assert observed == window_observation(trace, 60.0, 120.0, ttft_ms=120.0, itl_ms=9.0, kv_hit_rate=None)
    assert view.observe(0.0, 120.0).ttft_ms == pytest.approx(100.0)
    sim = ClusterSimulator(trace, FWD, SimSpec(), num_prefill=1, num_decode=1)
    ours = sim.observe(60.0, 120.0)
    assert (observed.num_req, observed.isl, observed.osl, observed.isl_p99) == (
        ours.num_req, ours.isl, ours.osl, ours.isl_p99,
    )  # fmt: skip
    counts = view.worker_counts()
    assert (counts.ready_prefill, counts.expected_prefill, counts.ready_decode) == (2, 3, 1)
    view.set_targets(None, 4)
    assert view.worker_counts().expected_decode == 4 and view.targets() == (None, 4)


def test_a_load_loop_policy_decides_on_the_replay_view() -> None:
    """The threshold policy (load loop on) ticks on the view as on our simulator: its load tick asks for what the
    router could not place (nothing on Dynamo's replay) and the engines' forward-pass metrics; a conv-x12 bench on
    Dynamo's engine stopped at this policy when the view had no `unplaced` (2026-11-27)."""
    trace = busy_trace(400, 240.0)
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000))
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1}
    (policy,) = build_policies(["threshold"], base, trace, perf, fwd, spec, window_s=60, initial="min")
    assert isinstance(policy, PlannerPolicy) and policy.config.load_scaling_active
    view = ReplayView(trace)
    load_s = float(policy.config.load_adjustment_interval_seconds)
    snapshot = {"active_prefill_count": 1, "active_decode_count": 1, "non_draining_prefill_count": 1,
                "non_draining_decode_count": 1, "active_prefill_ids": [0], "active_decode_ids": [0]}  # fmt: skip
    view.absorb(load_s, snapshot)
    assert view.unplaced(0.0, load_s) == ()
    policy.decide(load_s, view)
    assert policy.state.num_load_ticks == 1


def test_the_engine_oracle_searches_prefill_with_wide_decode_then_decode() -> None:
    """A window where a size meets the target when P >= 3 and D >= 2 (with P = 3) or D >= 1 (with P = 4): the
    search finds P = 3 with a wide decode pool, then D(3) = 2 and D(4) = 1; both cost 5 GPUs, and the tie goes to
    fewer prefill workers: (3, 2)."""
    replayed: list[tuple[int, int]] = []

    def met(size: tuple[int, int]) -> tuple[int, int]:
        replayed.append(size)
        prefill, decode = size
        return 100 if prefill >= 3 else 50, 100 if prefill >= 3 and decode >= (2 if prefill == 3 else 1) else 50

    window = OracleWindow(
        index=0, start_s=0.0, num_requests=100, num_attainable=100, num_required=99, num_prefill=1, num_decode=1,
        num_ttft_met=0, num_met=0, feasible=True, num_simulations=0,
    )  # fmt: skip
    sized = _size_replay_window(window, met, guess=(1, 1), settings=OracleSettings(), gpus=(1, 1))
    assert (sized.num_prefill, sized.num_decode, sized.feasible, sized.num_met) == (3, 2, True, 100)
    assert all(decode == 4 for prefill, decode in replayed[:3])  # the prefill search ran with max(4, 2 * 1 + 2)
    assert sized.num_simulations == len(set(replayed)) == len(replayed)  # each size replayed once


def test_the_bracket_approximation_searches_ttft_at_the_guessed_decode_and_one_pair() -> None:
    """The same window, searched by the bracket approximation from the guess (4, 2): the prefill search replays at
    the guessed decode size (2) and counts TTFT only: (4, 2) and (3, 2) meet, the gallop's next step (1, 2) fails
    and the bisection's (2, 2) too, so P = 3; the decode search starts from (3, 2) (already replayed) and stops at
    (3, 1), which fails; no (P + 1) pair."""
    replayed: list[tuple[int, int]] = []

    def met(size: tuple[int, int]) -> tuple[int, int]:
        replayed.append(size)
        prefill, decode = size
        return 100 if prefill >= 3 else 50, 100 if prefill >= 3 and decode >= (2 if prefill == 3 else 1) else 50

    window = OracleWindow(
        index=0, start_s=0.0, num_requests=100, num_attainable=100, num_required=99, num_prefill=1, num_decode=1,
        num_ttft_met=0, num_met=0, feasible=True, num_simulations=0,
    )  # fmt: skip
    sized = _size_replay_window(window, met, guess=(4, 2), settings=OracleSettings(), gpus=(1, 1), approximate=True)
    assert (sized.num_prefill, sized.num_decode, sized.feasible, sized.num_met, sized.num_ttft_met) == (
        3,
        2,
        True,
        100,
        100,
    )
    assert replayed == [(4, 2), (3, 2), (1, 2), (2, 2), (3, 1)]
    assert sized.num_simulations == 5


def test_the_bracket_guess_scales_our_oracle_by_the_previous_windows_ratio() -> None:
    """Window 1's guess: our simulator's (10, 2) times Dynamo's / ours in window 0 ((6, 1) / (4, 1)): (15, 2); the
    first window starts from our simulator's answer as it is."""

    def window(index: int, size: tuple[int, int], required: int = 10) -> OracleWindow:
        return OracleWindow(
            index=index, start_s=180.0 * index, num_requests=10, num_attainable=10, num_required=required,
            num_prefill=size[0], num_decode=size[1], num_ttft_met=10, num_met=10, feasible=True, num_simulations=1,
        )  # fmt: skip

    ours = [window(0, (4, 1)), window(1, (10, 2))]
    assert _bracket_guess(ours, 0, []) == (4, 1)
    assert _bracket_guess(ours, 1, [window(0, (6, 1))]) == (15, 2)
    assert _bracket_guess(ours, 1, [window(0, (6, 1), required=0)]) == (10, 2)  # an empty window teaches nothing


@pytest.mark.skipif(
    find_dynamo_python() is None,
    reason="needs the Dynamo comparison environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
)
def test_the_bench_runs_in_dynamos_replay_with_the_policies_in_its_loop() -> None:
    """Four minutes whose request rate doubles at 120 s, served by Dynamo's replay: a fixed size, the oracle
    searched in that engine (120 s windows), our planner (its ticks over the bridge reach `Planner.decide`) and
    Dynamo's own planner (its adapter inside the replay)."""
    trace = busy_trace(900, 240.0)
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000), startup_s=30)
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60,
            "max_throughput_scaling_replicas": 8}  # fmt: skip

    def build(names):
        return build_policies(names, base, trace, perf, fwd, spec, window_s=60, initial="min")

    names = ["fixed:1:1", "oracle", "planner", "dynamo-1.6.1"]
    policies, runs = dynamo_bench(
        names, build, trace, spec, ttft_ms=500.0, itl_ms=50.0, window_s=120.0, settings=OracleSettings(),
        initial="oracle", dynamo_python=None, profile_dir=Path(PROFILE_DIR),
    )  # fmt: skip
    rows = {run.row.policy: run for run in runs}
    assert list(rows) == names and all(run.row.requests == 900 for run in runs)
    fixed, oracle = rows["fixed:1:1"], rows["oracle"]
    assert isinstance(policies[0], FixedPolicy) and isinstance(policies[1], OraclePolicy)
    # every request of the fixed run has Dynamo's record; two workers cost from 0 to the last completion
    assert np.isfinite(fixed.result.ttft_s).all()
    assert fixed.result.gpu_s == pytest.approx(2 * np.nanmax(fixed.result.finish_s), rel=0.02)
    # the oracle: one size per window, searched in Dynamo's engine, and what it found holds in its own run
    oracle_policy = policies[1]
    assert len(oracle_policy.sizes) == 2 and all(w.num_simulations > 0 for w in oracle_policy.windows)
    assert all(w.num_met >= w.num_required for w in oracle_policy.windows if w.feasible)
    assert oracle.row.sla_attainment >= 0.95 * oracle.row.attainable
    # the planner starts at the oracle's first size and ticks on its intervals up to the last arrival
    planner_policy = policies[2]
    assert isinstance(planner_policy, PlannerPolicy) and planner_policy.initial_size == oracle_policy.sizes[0]
    config = planner_policy.config
    assert planner_policy.state.num_throughput_ticks == int(trace.duration_s // 60) == 3
    if config.load_scaling_active:
        assert planner_policy.state.num_load_ticks == int(trace.duration_s // config.load_adjustment_interval_seconds)
    assert math.isfinite(rows["dynamo-1.6.1"].row.gpu_hours) and rows["dynamo-1.6.1"].row.gpu_hours > 0


@pytest.mark.skipif(
    find_dynamo_python() is None,
    reason="needs the Dynamo comparison environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
)
def test_the_bracket_oracle_replays_from_our_simulators_answers_and_its_sizes_meet_the_target() -> None:
    """The bracket approximation in Dynamo's replay, on the same four minutes: our simulator's oracle is asked once,
    every window is searched in Dynamo's engine from it, and every size kept met its window's requirement there."""
    trace = busy_trace(900, 240.0)
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000), startup_s=30)
    asked: list[int] = []

    def bracket(num_windows: int | None):
        asked.append(num_windows)
        return oracle_windows(trace, fwd, spec, ttft_ms=500.0, itl_ms=50.0, window_s=120.0)

    policies, runs = dynamo_bench(
        ["oracle"], lambda _names: [], trace, spec, ttft_ms=500.0, itl_ms=50.0, window_s=120.0,
        settings=OracleSettings(), initial="min", dynamo_python=None, profile_dir=Path(PROFILE_DIR), bracket=bracket,
    )  # fmt: skip
    oracle_policy = policies[0]
    assert isinstance(oracle_policy, OraclePolicy) and asked == [None] and len(oracle_policy.sizes) == 2
    assert all(w.num_simulations > 0 for w in oracle_policy.windows)
    assert all(w.num_met >= w.num_required > 0 for w in oracle_policy.windows if w.feasible)
    assert runs[0].row.sla_attainment >= 0.95 * runs[0].row.attainable


@pytest.mark.skipif(
    find_dynamo_python() is None,
    reason="needs the Dynamo comparison environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
)
def test_without_an_oracle_row_the_bracket_oracle_searches_the_first_window_alone() -> None:
    """No baseline among the policies: the bracket approximation asks our simulator for the first window only (the
    planners' starting size), not for the whole trace's search, and with `initial="min"` asks nothing."""
    trace = busy_trace(900, 240.0)
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000), startup_s=30)
    asked: list[int | None] = []

    def bracket(num_windows: int | None):
        asked.append(num_windows)
        return oracle_windows(trace.head(120.0 + OracleSettings().context_s), fwd, spec, ttft_ms=500.0, itl_ms=50.0,
                              window_s=120.0)[:num_windows]  # fmt: skip

    fixed = FixedPolicy(name="fixed:2:2", num_prefill=2, num_decode=2)
    for initial, expected in (("oracle", [1]), ("min", [])):
        asked.clear()
        policies, runs = dynamo_bench(
            ["fixed:2:2"], lambda _names: [fixed], trace, spec, ttft_ms=500.0, itl_ms=50.0, window_s=120.0,
            settings=OracleSettings(), initial=initial, dynamo_python=None, profile_dir=Path(PROFILE_DIR),
            bracket=bracket,
        )  # fmt: skip
        assert asked == expected and [run.row.policy for run in runs] == [policies[0].name]


def test_the_engine_is_a_bench_option_and_a_missing_interpreter_is_one_line(tmp_path: Path) -> None:
    from planner_cli.main import build_parser
    from planner_core.lab.sim.dynamo_engine import ReplayBridge
    from planner_core.lab.sim.dynamo_policy import DynamoPlannerError

    assert build_parser().parse_args(["bench", "--trace", "t.csv"]).engine == "sim"
    assert build_parser().parse_args(["bench", "--trace", "t.csv", "--engine", "dynamo"]).engine == "dynamo"
    assert build_parser().parse_args(["bench", "--trace", "t.csv"]).dynamo_oracle == "exact"
    assert build_parser().parse_args(["bench", "--trace", "t.csv", "--dynamo-oracle", "bracket"]).dynamo_oracle == (
        "bracket"
    )
    missing = tmp_path / "no-python"
    with pytest.raises(DynamoPlannerError, match=f"--engine dynamo: --dynamo-python {missing}: No such file"):
        ReplayBridge(str(missing))
    spec = SimSpec(aggregated=True)
    with pytest.raises(ValueError, match="disaggregated pools only"):
        dynamo_bench(
            ["planner"], lambda _names: [], busy_trace(10, 10.0), spec, ttft_ms=500.0, itl_ms=50.0, window_s=60.0,
            settings=OracleSettings(), initial="min", dynamo_python=None, profile_dir=None,
        )  # fmt: skip


def test_the_planners_on_dynamos_engine_are_told_the_router_it_replays_with(tmp_path: Path, monkeypatch) -> None:
    """Dynamo's replay routes round robin: every job says so, and the planners' config declares it (as on our
    simulator, where `--router` reaches the planners), so they size the prefill pool for it."""
    import planner_core.lab.sim.dynamo_engine as engine_module
    from planner_core.config import RouterKind
    from planner_core.lab.sim.benchmark import BenchRequest, benchmark

    trace = make_trace([0.0, 1.0], [1000, 1000], [10, 10])
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=100_000))
    engine = DynamoEngine(trace=trace, spec=spec, bridge=None, workdir=tmp_path)  # type: ignore[arg-type]
    job = engine.job(trace_file=tmp_path / "t.jsonl", size=(1, 1), startup_s=0.0, policy={"kind": "fixed"})
    assert job["router"] == REPLAY_ROUTER.value == "round_robin"
    built = {}

    def fake_bench(names, build, *args, **kwargs):
        built["policies"] = build(list(names))
        return built["policies"], []

    monkeypatch.setattr(engine_module, "dynamo_bench", fake_bench)
    csv = write_small_azure_trace(tmp_path / "trace.csv")
    benchmark(BenchRequest(trace=csv, profile=PROFILE_DIR, engine="dynamo", policies=("planner",)))
    (planner,) = built["policies"]
    assert planner.config.router is RouterKind.ROUND_ROBIN
