"""A bench that can lie to the planner: simulated engines faster or slower than the profile (`--engine-speed`) and a
change of speed mid-run (`--engine-speed-change`), `planner_core.lab.sim.des.speed`."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from planner_cli.bench import engine_record, engine_speed_options, engine_speed_text
from planner_core.lab.sim.benchmark import BenchRequest, benchmark
from planner_core.lab.sim.des import (
    ClusterSimulator,
    EngineSpeed,
    SimSpec,
    SpeedChange,
    engine_model,
    parse_engine_speed,
    parse_speed_change,
)
from planner_core.lab.sim.oracle import attainable_mask
from tests.conftest import PROFILE_DIR
from tests.core.fakes import FWD, make_trace
from tests.lab.test_bench import write_small_azure_trace

PREFILL_END = SimSpec(first_token_from_decode=False)


def run(trace, spec: SimSpec, *, num_prefill: int = 1, num_decode: int = 1):
    sim = ClusterSimulator(trace, FWD, spec, num_prefill=num_prefill, num_decode=num_decode)
    sim.run_to_completion()
    return sim.result()


# --- parsing ---------------------------------------------------------------------------------------------------


def test_parse_engine_speed_reads_either_role_or_both() -> None:
    assert parse_engine_speed("prefill=0.8,decode=0.9") == EngineSpeed(prefill=0.8, decode=0.9)
    assert parse_engine_speed(" decode = 1.5 ") == EngineSpeed(prefill=1.0, decode=1.5)
    assert parse_engine_speed("prefill=2", base=EngineSpeed(decode=0.5)) == EngineSpeed(prefill=2.0, decode=0.5)
    assert parse_engine_speed("prefill=1,decode=1").is_profile


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is not ROLE=SPEED"),
        ("prefill", "is not ROLE=SPEED"),
        ("prefill=0.8,", "is not ROLE=SPEED"),
        ("gpu=0.8", "unknown role 'gpu'"),
        ("prefill=0.8,prefill=0.9", "prefill is given twice"),
        ("prefill=fast", "prefill='fast' is not a number"),
        ("prefill=0", "prefill=0 is not a finite number > 0"),
        ("decode=-1", "decode=-1 is not a finite number > 0"),
        ("decode=nan", "decode=nan is not a finite number > 0"),
        ("decode=inf", "decode=inf is not a finite number > 0"),
    ],
)
def test_parse_engine_speed_refuses_in_one_line_naming_the_option(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="^--engine-speed: ") as error:
        parse_engine_speed(text)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_parse_speed_change_reads_seconds_or_minutes_and_keeps_the_roles_left_out() -> None:
    base = EngineSpeed(prefill=0.9, decode=0.8)
    assert parse_speed_change("20m:prefill=0.75", base=base) == SpeedChange(1200.0, EngineSpeed(0.75, 0.8))
    assert parse_speed_change("90s:decode=2") == SpeedChange(90.0, EngineSpeed(1.0, 2.0))
    assert parse_speed_change("90.5:decode=2").at_s == 90.5
    assert parse_speed_change("0:prefill=1,decode=0.5").text() == "0s:prefill=1,decode=0.5"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("prefill=0.75", "is not TIME:ROLE=SPEED"),
        (":prefill=0.75", "is not TIME:ROLE=SPEED"),
        ("20h:prefill=0.75", "time '20h' is not N, Ns or Nm"),
        ("-1:prefill=0.75", "time '-1' is not a finite time >= 0"),
        ("inf:prefill=0.75", "time 'inf' is not a finite time >= 0"),
        ("20m:prefill=0", "prefill=0 is not a finite number > 0"),
        ("20m:cpu=2", "unknown role 'cpu'"),
    ],
)
def test_parse_speed_change_refuses_in_one_line_naming_the_option(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="^--engine-speed-change: ") as error:
        parse_speed_change(text)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_cli_options_refuse_dynamo_and_name_the_speed_in_header_and_record() -> None:
    args = argparse.Namespace(engine_speed="prefill=0.8", engine_speed_change="10m:decode=0.5", engine="sim")
    speed, change = engine_speed_options(args)
    assert speed == EngineSpeed(0.8, 1.0) and change == SpeedChange(600.0, EngineSpeed(0.8, 0.5))
    request = BenchRequest(trace=PROFILE_DIR, profile=PROFILE_DIR, engine_speed=speed, speed_change=change)
    assert engine_record(request) == {
        "prefill": 0.8,
        "decode": 1.0,
        "change": {"at_s": 600.0, "speed": {"prefill": 0.8, "decode": 0.5}},
    }
    assert "prefill 0.8x / decode 1x the profile, from 600 s at prefill 0.8x / decode 0.5x" in engine_speed_text(
        request
    )
    plain = BenchRequest(trace=PROFILE_DIR, profile=PROFILE_DIR)
    assert engine_record(plain) is None and engine_speed_text(plain) == ""
    with pytest.raises(ValueError, match="^--engine dynamo: --engine-speed"):
        engine_speed_options(argparse.Namespace(engine_speed="prefill=0.8", engine_speed_change=None, engine="dynamo"))


# --- the simulator ---------------------------------------------------------------------------------------------


def test_profile_speed_runs_the_profile_model_itself() -> None:
    assert engine_model(FWD, EngineSpeed()) is FWD
    sim = ClusterSimulator(make_trace([0.0], [10], [2]), FWD, SimSpec(), num_prefill=1, num_decode=1)
    assert sim.fwd is FWD


def test_scaled_model_divides_each_phase_and_splits_a_mixed_iteration() -> None:
    scaled = engine_model(FWD, EngineSpeed(prefill=0.5, decode=0.25))
    assert scaled.prefill_wall_s(1000) == pytest.approx(FWD.prefill_wall_s(1000) / 0.5)
    assert scaled.decode_wall_s(4, 5000) == pytest.approx(FWD.decode_wall_s(4, 5000) / 0.25)
    # the linear model's mixed iteration is prefill + decode: each part at its own speed
    assert scaled.mixed_wall_s(1000, 4, 5000) == pytest.approx(
        FWD.prefill_wall_s(1000) / 0.5 + FWD.decode_wall_s(4, 5000) / 0.25
    )
    # nothing decoding: all of it at the prefill speed
    assert scaled.mixed_wall_s(1000, 0, 0) == pytest.approx(FWD.mixed_wall_s(1000, 0, 0) / 0.5)


def test_slower_prefill_raises_ttft_by_its_factor_and_leaves_itl() -> None:
    # requests far apart: no queueing, so each TTFT is its prefill alone (first token at prefill end)
    trace = make_trace([0.0, 5.0, 10.0, 15.0], [500, 3000, 12_000, 20_000], [50, 20, 80, 10])
    base = run(trace, PREFILL_END)
    slow = run(trace, dataclasses.replace(PREFILL_END, engine_speed=EngineSpeed(prefill=0.8)))
    assert slow.ttft_s == pytest.approx(base.ttft_s / 0.8)
    assert slow.itl_s == pytest.approx(base.itl_s)
    decode_slow = run(trace, dataclasses.replace(PREFILL_END, engine_speed=EngineSpeed(decode=0.5)))
    assert decode_slow.ttft_s == pytest.approx(base.ttft_s)
    assert decode_slow.itl_s == pytest.approx(base.itl_s / 0.5)


def test_speed_change_takes_effect_at_its_time() -> None:
    # prefill 1000 tokens = 0.020 s at the profile's speed; from t = 5 s prefill runs at half speed: 0.040 s
    trace = make_trace([0.0, 4.0, 6.0, 9.0], [1000] * 4, [2] * 4)
    change = SpeedChange(at_s=5.0, speed=EngineSpeed(prefill=0.5))
    result = run(trace, dataclasses.replace(PREFILL_END, speed_change=change))
    assert result.ttft_s == pytest.approx([0.020, 0.020, 0.040, 0.040])
    # a change to the speed already in force changes nothing, bit for bit
    same = dataclasses.replace(PREFILL_END, speed_change=SpeedChange(at_s=5.0, speed=EngineSpeed()))
    np.testing.assert_array_equal(run(trace, same).finish_s, run(trace, PREFILL_END).finish_s)


def test_speed_change_cuts_a_running_decode_segment_at_its_next_iteration() -> None:
    # One request: prefill 0.020 s, then its 1000 output tokens, one decode iteration each (the first token from
    # decode), in one segment at the midpoint KV 1000 + 1000 / 2. At t = 2 s decode slows to half speed: the
    # iterations begun by then end at the old speed, the rest run as a new segment (its own midpoint KV) taking
    # twice the profile's time.
    change = SpeedChange(at_s=2.0, speed=EngineSpeed(decode=0.5))
    result = run(make_trace([0.0], [1000], [1000]), SimSpec(speed_change=change))
    iter_s = 0.005 + 1e-4 + (1000 + 1000 / 2) * 1e-8
    done = int((2.0 - 0.020) // iter_s) + 1
    rest = 1000 - done
    later_s = (0.005 + 1e-4 + (1000 + done + rest / 2) * 1e-8) / 0.5
    assert result.finish_s[0] == pytest.approx(0.020 + done * iter_s + rest * later_s)
    assert result.ttft_s[0] == pytest.approx(0.020 + iter_s)  # the first token before the change


def test_attainable_uses_the_engines_speed_at_each_arrival() -> None:
    # prefill 0.020 s + one decode iteration (~5.1 ms) at the profile's speed: within 30 ms; at prefill 0.5 not
    trace = make_trace([0.0, 10.0], [1000, 1000], [2, 2])
    spec = SimSpec()
    assert attainable_mask(trace, FWD, spec, ttft_ms=30, itl_ms=50).tolist() == [True, True]
    slow = dataclasses.replace(spec, engine_speed=EngineSpeed(prefill=0.5))
    assert attainable_mask(trace, FWD, slow, ttft_ms=30, itl_ms=50).tolist() == [False, False]
    later = dataclasses.replace(spec, speed_change=SpeedChange(at_s=5.0, speed=EngineSpeed(prefill=0.5)))
    assert attainable_mask(trace, FWD, later, ttft_ms=30, itl_ms=50).tolist() == [True, False]


# --- the bench -------------------------------------------------------------------------------------------------


def _rows(request: BenchRequest) -> list[dict]:
    rows = [dataclasses.asdict(run.row) for run in benchmark(request).runs]
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]


def test_bench_at_speed_one_is_the_bench_without_the_option(tmp_path) -> None:
    trace = write_small_azure_trace(tmp_path / "small.csv", num_requests=200, duration_s=400.0)
    plain = BenchRequest(
        trace=trace, profile=PROFILE_DIR, policies=("oracle", "planner", "fixed:1:1"), throughput_interval_s=60
    )
    at_one = dataclasses.replace(
        plain, engine_speed=EngineSpeed(1.0, 1.0), speed_change=SpeedChange(at_s=100.0, speed=EngineSpeed(1.0, 1.0))
    )
    rows = _rows(plain)
    assert _rows(at_one) == rows
    # slower engines: the fixed size serves its prompts later, and the oracle (simulating the engines as they run)
    # holds at least as many GPUs
    slow = _rows(dataclasses.replace(plain, engine_speed=EngineSpeed(prefill=0.5, decode=0.5)))
    by_policy = {row["policy"]: row for row in rows}
    slow_by_policy = {row["policy"]: row for row in slow}
    assert slow_by_policy["fixed:1:1"]["ttft_ms_mean"] > by_policy["fixed:1:1"]["ttft_ms_mean"]
    assert slow_by_policy["oracle"]["gpu_hours"] >= by_policy["oracle"]["gpu_hours"]
