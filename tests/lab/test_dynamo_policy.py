"""Dynamo 1.6.1's own planner as a bench policy: the mapping to `planner_core/lab/dynamo/run_planner.py`'s protocol
(pure, no Dynamo needed) and, where Dynamo's virtualenv exists, Dynamo's planner deciding in the simulator."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from planner_core.domain import (
    Component,
    EngineLimits,
    ForwardPassMetrics,
    QueuedRequests,
    ScheduledRequests,
    TrafficObservation,
    WorkerCounts,
)
from planner_core.lab.sim import dynamo_policy
from planner_core.lab.sim.bench import build_policies, run_bench
from planner_core.lab.sim.des import SimSpec, window_kv_hit_rate
from planner_core.lab.sim.dynamo_policy import (
    DYNAMO_PRESETS,
    RUN_PLANNER_SCRIPT,
    DynamoPlannerError,
    DynamoPlannerPolicy,
    check_dynamo_python,
    dynamo_config,
    engine_capabilities,
    find_dynamo_python,
    fpm_message,
    parse_tick,
    scale_interval_s,
    tick_request,
    traffic_message,
)
from planner_core.perf.model import ProfilePerfModel
from tests.conftest import PROFILE_DIR
from tests.lab.test_bench import busy_trace


def _script_module():
    """The script's module, loaded without running it (its top level imports nothing from Dynamo)."""
    spec = importlib.util.spec_from_file_location("run_planner", RUN_PLANNER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BASE = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": 16, "throughput_adjustment_interval_seconds": 180,
        "max_throughput_scaling_replicas": 8, "load_predictor": "ensemble"}  # fmt: skip


def test_dynamo_config_takes_the_shared_fields_and_leaves_the_rest_to_dynamo() -> None:
    config = dynamo_config(BASE, "dynamo-1.6.1-load")
    # our load_predictor is not Dynamo's setting to take: Dynamo keeps its default (ARIMA)
    assert config == {
        "mode": "disagg", "optimization_target": "sla", "ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": 16,
        "throughput_adjustment_interval_seconds": 180, "max_throughput_scaling_replicas": 8,
        "enable_throughput_scaling": True, "enable_load_scaling": True,
    }  # fmt: skip
    assert dynamo_config(BASE, "dynamo-1.6.1")["enable_load_scaling"] is False
    with pytest.raises(ValueError, match="unknown Dynamo preset 'dynamo-9'"):
        dynamo_config(BASE, "dynamo-9")


@pytest.mark.parametrize(
    ("config", "expected_s"),
    [
        ({}, 5.0),  # Dynamo's defaults: gcd(load 5, throughput 180) = 5
        ({"load_adjustment_interval_seconds": 20, "throughput_adjustment_interval_seconds": 180}, 20.0),  # gcd 20
        ({"load_adjustment_interval_seconds": 40, "throughput_adjustment_interval_seconds": 60}, 20.0),  # gcd 20
        ({"load_adjustment_interval_seconds": 40, "enable_throughput_scaling": False}, 40.0),  # the load loop alone
    ],
)
def test_scale_interval_is_the_gcd_of_the_active_loops(config: dict, expected_s: float) -> None:
    assert scale_interval_s(config) == expected_s


def test_engine_capabilities_are_the_simulated_limits() -> None:
    spec = SimSpec(
        prefill_limits=EngineLimits(max_num_batched_tokens=4096, max_num_seqs=64, max_kv_tokens=500_000),
        decode_limits=EngineLimits(num_gpu=2, max_kv_tokens=1_200_000, context_length=32_768),
    )
    caps = engine_capabilities(spec)
    assert caps["prefill"] == {"num_gpu": 1, "max_num_batched_tokens": 4096, "max_num_seqs": 64,
                               "max_kv_tokens": 500_000}  # fmt: skip
    assert caps["decode"] == {"num_gpu": 2, "max_num_batched_tokens": 8192, "max_num_seqs": 512,
                              "max_kv_tokens": 1_200_000, "context_length": 32_768}  # fmt: skip


FPM = ForwardPassMetrics(
    component=Component.DECODE,
    worker_id="decode-3",
    wall_time_s=0.012,
    scheduled=ScheduledRequests(num_decode_requests=40, sum_decode_kv_tokens=90_000, var_decode_kv_tokens=2.5),
    queued=QueuedRequests(num_decode_requests=2, sum_decode_kv_tokens=4_000),
)


def test_fpm_message_carries_every_field_the_script_reads_and_survives_its_conversion() -> None:
    script = _script_module()
    message = fpm_message(FPM)
    assert set(message) == {"worker_id", "dp_rank", "wall_time", *script.FPM_FIELDS}
    snapshot = script._fpm_snapshot(json.loads(json.dumps(message)))
    assert snapshot == message  # the script passes our snapshot on to Dynamo's replay adapter unchanged
    assert (snapshot["wall_time"], snapshot["num_decode_requests"], snapshot["sum_queued_decode_kv_tokens"]) == (
        0.012, 40, 4_000,
    )  # fmt: skip


def test_traffic_message_reports_unknown_means_as_zero_with_zero_samples() -> None:
    full = TrafficObservation(duration_s=180.0, num_req=900.0, isl=2000.0, osl=150.0, ttft_ms=120.0, itl_ms=9.0)
    message = traffic_message(full, kv_hit_rate=0.25, kv_hit_count=800)
    assert message == {
        "duration_s": 180.0, "num_req": 900.0, "avg_isl": 2000.0, "avg_osl": 150.0, "shape_count": 900.0,
        "avg_ttft_ms": 120.0, "ttft_count": 900.0, "avg_itl_ms": 9.0, "itl_count": 900.0,
        "avg_kv_hit_rate": 0.25, "hit_rate_count": 800.0,
    }  # fmt: skip
    idle = traffic_message(
        TrafficObservation(duration_s=180.0, num_req=0.0, isl=0.0, osl=0.0), kv_hit_rate=None, kv_hit_count=0
    )
    assert (idle["avg_ttft_ms"], idle["ttft_count"], idle["avg_kv_hit_rate"], idle["hit_rate_count"]) == (0, 0, 0, 0)


def test_tick_request_lists_ready_engines_and_counts_starting_ones() -> None:
    prefill = ForwardPassMetrics(component=Component.PREFILL, worker_id="prefill-0")
    counts = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=3, expected_decode=1)
    request = tick_request(60.0, [prefill, FPM], counts, traffic=None)
    assert request["ready_prefill_ids"] == ["prefill-0"] and request["ready_decode_ids"] == ["decode-3"]
    assert (request["starting_prefill"], request["starting_decode"]) == (2, 0)  # expected 3 - ready 1; 1 - 1
    assert [m["worker_id"] for m in request["decode_fpm"]] == ["decode-3"]
    assert request["now_s"] == 60.0 and request["traffic"] is None


def test_parse_tick_reads_targets_and_the_next_tick_and_names_bad_fields() -> None:
    line = json.dumps(
        {"num_prefill": 3, "num_decode": None, "diagnostics": {"throughput_decision_reason": "scale"},
         "next_tick": {"at_s": 185.0, "need_traffic_metrics": True, "traffic_metrics_duration_s": 180.0}}
    )  # fmt: skip
    tick = parse_tick(line, source="t")
    assert (tick.num_prefill, tick.num_decode, tick.next_tick_s) == (3, None, 185.0)
    assert (tick.need_traffic, tick.traffic_window_s) == (True, 180.0)
    assert tick.diagnostics == {"throughput_decision_reason": "scale"}
    assert parse_tick('{"next_tick": null}', source="t").next_tick_s is None  # Dynamo stopped ticking
    with pytest.raises(DynamoPlannerError, match="t: not a JSON line"):
        parse_tick("Traceback (most recent call last):", source="t")
    with pytest.raises(DynamoPlannerError, match="t: num_decode: not a replica count: -1"):
        parse_tick('{"num_decode": -1}', source="t")


def test_window_kv_hit_rate_counts_served_requests_of_the_window() -> None:
    arrival = np.array([0.0, 10.0, 20.0, 30.0, 70.0])
    isl = np.array([1000, 2000, 1000, 4000, 1000])
    cached = np.array([500, 1000, 0, 0, 1000])
    ttft = np.array([0.1, 0.2, 0.3, np.nan, 0.1])  # the fourth has not been served yet
    # window [0, 60): requests 0-2 served: (500 + 1000 + 0) / (1000 + 2000 + 1000) = 0.375 over 3 requests
    assert window_kv_hit_rate(arrival, isl, cached, ttft, 0.0, 60.0) == (0.375, 3)
    assert window_kv_hit_rate(arrival, isl, cached, ttft, 30.0, 60.0) == (None, 0)  # nothing served


def test_a_dynamo_policy_needs_an_interpreter_with_dynamo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without --dynamo-python, $DYNAMO_PYTHON or a built comparison environment, the error names the make target
    (whether or not this checkout has built `.dynamo-venv`: the test hides it)."""
    monkeypatch.delenv("DYNAMO_PYTHON", raising=False)
    monkeypatch.setattr(dynamo_policy, "DYNAMO_ENV_PYTHON", tmp_path / "no-dynamo-venv" / "python")
    assert find_dynamo_python() is None
    with pytest.raises(DynamoPlannerError, match="no Dynamo interpreter: run `make dynamo-env`"):
        check_dynamo_python(None)
    with pytest.raises(DynamoPlannerError, match="/no/such/python: No such file"):
        check_dynamo_python("/no/such/python")
    # The project's own interpreter must never have Dynamo: the script says what it could not import.
    with pytest.raises(DynamoPlannerError, match="cannot import Dynamo's planner: run_planner: .*dynamo"):
        check_dynamo_python(sys.executable)
    trace = busy_trace(60, 60.0)
    perf = ProfilePerfModel.load(PROFILE_DIR)
    with pytest.raises(ValueError, match="dynamo-1.6.1: no Dynamo interpreter"):
        build_policies(["dynamo-1.6.1"], BASE, trace, perf, perf.forward_pass_model(), SimSpec(), window_s=60)


def _dynamo_python() -> str | None:
    return find_dynamo_python()


@pytest.mark.skipif(
    find_dynamo_python() is None,
    reason="needs the Dynamo comparison environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
)
def test_dynamo_planner_decides_in_the_simulator_and_follows_a_load_step() -> None:
    """Dynamo's planner in the loop on 10 minutes whose request rate doubles at 300 s (~17 then ~33 requests/s,
    a prefill engine serving ~29 of these per second): its load loop adds prefill only after the step, and its
    throughput loop sizes engines with the capacity Dynamo computes from the profile-bootstrapped perf model."""
    trace = busy_trace(15_000, 600.0)
    perf = ProfilePerfModel.load(PROFILE_DIR)
    fwd = perf.forward_pass_model()
    spec = SimSpec(decode_limits=EngineLimits(max_kv_tokens=perf.profiled_max_kv_tokens() or 2_000_000), startup_s=30)
    base = {**BASE, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60}
    policies = build_policies(
        list(DYNAMO_PRESETS), base, trace, perf, fwd, spec, window_s=60, initial="min", dynamo_python=_dynamo_python()
    )
    runs = run_bench(policies, trace, fwd, spec, ttft_ms=500, itl_ms=50)
    throughput_only, with_load = policies
    assert isinstance(throughput_only, DynamoPlannerPolicy) and isinstance(with_load, DynamoPlannerPolicy)
    assert throughput_only._process is None and with_load._process is None  # closed at the end of the run
    assert with_load.profile_dir == Path(PROFILE_DIR)  # Dynamo's perf data: the bench's own profile
    for policy in policies:
        # one tick per 5 s scale interval, a throughput tick every 60 s, up to the last arrival (just before 600 s)
        assert len(policy.ticks) == int(trace.duration_s // 5) == 119
        throughput_ticks = [t for _, t in policy.ticks if "throughput_decision_reason" in t.diagnostics]
        assert len(throughput_ticks) == 9
        assert all(15 < t.diagnostics["engine_rps_prefill"] < 60 for t in throughput_ticks)
    scale_ups = [now for now, t in with_load.ticks if (t.num_prefill or 0) > 1]
    assert scale_ups and min(scale_ups) >= 300.0
    assert max(p for _, p, _ in runs[1].result.worker_timeline) >= 2


def test_bench_takes_the_dynamo_interpreter_from_the_option_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from planner_cli.main import build_parser

    monkeypatch.setenv("DYNAMO_PYTHON", "/opt/dynamo/bin/python")
    assert build_parser().parse_args(["bench", "--trace", "t.csv"]).dynamo_python == "/opt/dynamo/bin/python"
    args = build_parser().parse_args(["bench", "--trace", "t.csv", "--dynamo-python", "/other/python"])
    assert args.dynamo_python == "/other/python"
    monkeypatch.delenv("DYNAMO_PYTHON")
    assert build_parser().parse_args(["bench", "--trace", "t.csv"]).dynamo_python is None
