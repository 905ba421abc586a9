"""The TTFT-gap measurement's pure helpers (planner_core/lab/ttft_gap.py): Dynamo's per-request report cut into
TTFT parts, the window's statistics, the fewest size meeting a target, the slowed engine model, and our
simulator's side of the flat-out measurement; with the Dynamo comparison environment, Dynamo's side on a short
burst (the command itself and its figures: docs/simulator-and-benchmark.md, "Where the TTFT goes")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner_core.data import H200_PROFILE_DIR
from planner_core.domain import EngineLimits
from planner_core.lab.sim.des import SimSpec
from planner_core.lab.sim.dynamo_engine import ReplayBridge
from planner_core.lab.sim.dynamo_policy import find_dynamo_python
from planner_core.lab.ttft_gap import (
    TTFT_PARTS,
    SlowerPrefill,
    burst_of,
    dynamo_window,
    fewest_meeting,
    flat_out,
    parse_sizes,
    parts_summary,
    spread,
    ttft_parts,
    ttft_stats,
)
from planner_core.perf.model import ProfilePerfModel
from planner_core.traces import RequestTrace


def _record(arrival: float, admit: float, held: float, decode: float, first: float) -> dict:
    return {"arrival_time_ms": arrival, "prefill_admit_ms": admit, "source_held_ms": held,
            "decode_admit_ms": decode, "first_token_ms": first, "ttft_ms": first - arrival}  # fmt: skip


def test_ttft_parts_add_up_to_the_ttft_and_name_each_stage() -> None:
    record = _record(1000.0, 1870.0, 2229.0, 2231.5, 2238.7)
    parts = ttft_parts(record)
    assert parts == pytest.approx({"queue_ms": 870.0, "prefill_ms": 359.0, "handoff_ms": 2.5, "first_step_ms": 7.2})
    assert sum(parts.values()) == pytest.approx(record["ttft_ms"])


def test_a_missing_stamp_leaves_its_parts_unknown_not_zero() -> None:
    record = _record(0.0, 5.0, 20.0, 22.0, 29.0)
    record["decode_admit_ms"] = None
    parts = ttft_parts(record)
    assert parts["queue_ms"] == 5.0 and parts["prefill_ms"] == 15.0
    assert math.isnan(parts["handoff_ms"]) and math.isnan(parts["first_step_ms"])


def test_ttft_stats_count_unfinished_requests_as_misses() -> None:
    stats = ttft_stats(np.array([100.0, 200.0, 600.0, np.nan]), 500.0)
    assert stats["num_requests"] == 4
    assert stats["met"] == pytest.approx(0.5)
    assert stats["p50_ms"] == pytest.approx(200.0)  # over the three finished ones
    assert stats["p99_ms"] == pytest.approx(np.percentile([100.0, 200.0, 600.0], 99))


def test_parts_summary_averages_all_requests_and_the_missed_ones() -> None:
    records = [_record(0, 0, 50, 53, 60), _record(0, 400, 600, 604, 612)]
    parts = [ttft_parts(r) for r in records]
    summary = parts_summary(parts, np.array([r["ttft_ms"] for r in records]), 500.0)
    assert summary["num_missed"] == 1
    assert summary["missed"]["queue_ms"] == pytest.approx(400.0)
    assert summary["all"]["queue_ms"] == pytest.approx(200.0)
    assert summary["all"]["first_step_ms"] == pytest.approx(7.5)


def test_fewest_meeting_needs_every_larger_size_to_meet_too() -> None:
    assert fewest_meeting({4: 0.90, 5: 0.991, 6: 0.995, 7: 1.0}, 0.99) == 5
    # round robin can make a larger pool worse: 13 meets by chance below a failing 14, so nothing counts
    assert fewest_meeting({12: 0.989, 13: 0.993, 14: 0.988}, 0.99) is None
    assert fewest_meeting({5: 0.97, 6: 0.999, 7: 0.998}, 0.99) == 6


def test_spread_and_parse_sizes() -> None:
    assert spread([10.0, 10.0, 10.0]) == pytest.approx(1.0)
    assert spread([30.0, 0.0, 0.0]) == pytest.approx(3.0)
    assert math.isnan(spread([0.0, 0.0]))
    assert parse_sizes("4-6,9") == [4, 5, 6, 9]
    with pytest.raises(ValueError, match="--prefill"):
        parse_sizes("0")


def test_slower_prefill_scales_prefill_iterations_only() -> None:
    fwd = ProfilePerfModel.load(H200_PROFILE_DIR).forward_pass_model()
    slow = SlowerPrefill(fwd, 1.25)
    assert slow.prefill_wall_s(8192) == pytest.approx(1.25 * fwd.prefill_wall_s(8192))
    assert slow.decode_wall_s(16, 100_000) == pytest.approx(fwd.decode_wall_s(16, 100_000))
    assert slow.mixed_wall_s(512, 8, 50_000) == pytest.approx(fwd.mixed_wall_s(512, 8, 50_000))


def test_flat_out_on_our_simulator_is_full_iterations_and_a_slower_model_is_proportionally_slower() -> None:
    perf = ProfilePerfModel.load(H200_PROFILE_DIR)
    fwd = perf.forward_pass_model()
    spec = SimSpec(prefill_limits=EngineLimits(), decode_limits=EngineLimits(max_kv_tokens=2_000_000), startup_s=0.0)
    count = 64
    trace = RequestTrace(source="test", start_epoch_s=0.0, arrival_s=np.linspace(0.0, 5.0, count),
                         isl=np.full(count, 2048), osl=np.full(count, 50))  # fmt: skip
    burst = burst_of(trace, slice(0, count))
    assert np.all(burst.arrival_s == 0.0) and np.all(burst.osl == 1) and np.all(burst.isl == 2048)
    fast = flat_out(burst, bridge=None, spec=spec, fwd=fwd, max_kv_tokens=2_000_000, workdir=None)["sim_tok_s"]
    # 64 prompts of 2048 tokens fill 16 iterations of 8192 tokens; one decode iteration follows the last
    full_s = 16 * fwd.prefill_wall_s(8192)
    assert count * 2048 / full_s * 0.95 < fast <= count * 2048 / full_s
    slow = flat_out(burst, bridge=None, spec=spec, fwd=SlowerPrefill(fwd, 1.1), max_kv_tokens=2_000_000,
                    workdir=None)["sim_tok_s"]  # fmt: skip
    assert slow == pytest.approx(fast / 1.1, rel=0.01)


@pytest.mark.skipif(
    find_dynamo_python() is None,
    reason="needs the Dynamo comparison environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
)
def test_dynamos_report_cuts_every_ttft_into_parts_and_its_prefill_is_measured_flat_out(tmp_path) -> None:
    """A 20 s burst on one prefill engine in Dynamo's replay: the parts of each request's TTFT from its report add
    up to the TTFT it reports, a larger pool queues less, and its flat-out prefill is within 15 % of ours (the
    mocker's timing comes from the same profile)."""
    count = 300
    rng = np.random.default_rng(7)
    trace = RequestTrace(source="test", start_epoch_s=0.0, arrival_s=np.sort(rng.uniform(0.0, 20.0, count)),
                         isl=rng.integers(500, 6000, count), osl=np.full(count, 4))  # fmt: skip
    own = slice(0, count)
    perf = ProfilePerfModel.load(H200_PROFILE_DIR)
    fwd = perf.forward_pass_model()
    max_kv = perf.profiled_max_kv_tokens() or 2_000_000
    spec = SimSpec(prefill_limits=EngineLimits(), decode_limits=EngineLimits(max_kv_tokens=max_kv), startup_s=0.0)
    bridge = ReplayBridge(None)
    try:
        rows = {
            p: dynamo_window(
                bridge,
                trace,
                own,
                size=(p, 1),
                router="round_robin",
                max_kv_tokens=max_kv,
                target_ms=500.0,
                workdir=tmp_path,
            )  # fmt: skip
            for p in (1, 3)
        }
        capacity = flat_out(burst_of(trace, own), bridge=bridge, spec=spec, fwd=fwd, max_kv_tokens=max_kv,
                            workdir=tmp_path)  # fmt: skip
    finally:
        bridge.close()
    for row in rows.values():
        assert row["num_requests"] == count
        summary = row["parts"]["all"]
        # the means of the parts add up to the mean TTFT, itself between the percentiles
        assert all(np.isfinite(summary[k]) and summary[k] >= 0 for k in TTFT_PARTS)
        mean_ttft = sum(summary.values())
        assert row["p50_ms"] * 0.3 < mean_ttft < row["p99_ms"]
    assert rows[3]["parts"]["all"]["queue_ms"] < rows[1]["parts"]["all"]["queue_ms"]
    assert rows[3]["met"] >= rows[1]["met"]
    assert 0.85 < capacity["dynamo_tok_s"] / capacity["sim_tok_s"] < 1.15
