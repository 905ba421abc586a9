"""`planner live`'s own parts that need no stack: the trace it replays, the slowed profile, aiperf's figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner_cli.live import RunSpec, _aiperf_figures, compressed_policy, write_slowed_profile, write_trace
from planner_core.config import load_config, parse_config
from planner_core.data import DEFAULT_CONFIG
from planner_core.perf.model import ProfilePerfModel

PROFILE_DIR = Path(__file__).resolve().parents[1] / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D"


def test_trace_is_cut_compressed_thinned_and_capped(tmp_path) -> None:
    full = tmp_path / "full.jsonl"
    thin = tmp_path / "thin.jsonl"
    num_full = write_trace(full, start_s=480, duration_s=100, speedup=3, keep_every=1, max_isl=2048, max_osl=256)
    num_thin = write_trace(thin, start_s=480, duration_s=100, speedup=3, keep_every=3, max_isl=2048, max_osl=256)
    rows = [json.loads(line) for line in full.read_text().splitlines()]
    assert num_full == len(rows) and num_thin == len(thin.read_text().splitlines()) == -(-num_full // 3)
    stamps = [r["timestamp"] for r in rows]
    assert stamps == sorted(stamps) and 0 <= stamps[0] and stamps[-1] < 100_000  # 300 s of trace in 100 s
    assert max(r["input_length"] for r in rows) <= 2048 and 1 <= min(r["output_length"] for r in rows)
    assert max(r["output_length"] for r in rows) <= 256


def test_slowed_profile_slows_latency_and_capacity_alike(tmp_path) -> None:
    slowed = write_slowed_profile(tmp_path / "x8", 8.0)
    for part, keys in (
        ("selected_prefill_interpolation", ("prefill_ttft", "prefill_thpt_per_gpu")),
        ("selected_decode_interpolation", ("z_itl", "z_thpt_per_gpu")),
    ):
        with np.load(PROFILE_DIR / part / "raw_data.npz") as base, np.load(slowed / part / "raw_data.npz") as new:
            assert np.allclose(new[keys[0]], base[keys[0]] * 8) and np.allclose(new[keys[1]], base[keys[1]] / 8)
            assert all(np.array_equal(new[k], base[k]) for k in base.files if k not in keys)
    assert ProfilePerfModel.load(slowed) is not None  # the planner loads it like the shipped one


def _record(ttft_ms: float | None, itl_ms: float | None, error: bool = False) -> str:
    metrics = {}
    if ttft_ms is not None:
        metrics["time_to_first_token"] = {"value": ttft_ms, "unit": "ms"}
    if itl_ms is not None:
        metrics["inter_token_latency"] = {"value": itl_ms / 1000, "unit": "s"}
    return json.dumps({"metrics": metrics, "error": {"type": "TimeoutError"} if error else None})


def test_attainment_counts_both_targets_and_errors_apart(tmp_path) -> None:
    out = tmp_path / "aiperf"
    out.mkdir()
    lines = [_record(100, 10), _record(100, 30), _record(900, 10), _record(100, None), _record(None, None, True)]
    (out / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    spec = RunSpec(
        name="x", adaptive=True, fixed_size=1, duration_s=1, ttft_ms=500, itl_ms=20, interval_s=30, max_workers=2,
        trace=tmp_path, nice=0, profile_dir=tmp_path, cooldown_s=0,
    )  # fmt: skip
    figures = _aiperf_figures(out, spec)
    assert (figures["aiperf_records"], figures["aiperf_errors"]) == (4, 1)
    # (100, 10) and the one-token answer, of the five sent: the timed-out request missed the SLA
    assert figures["attainment"] == pytest.approx(2 / 5)
    assert (figures["ttft_attainment"], figures["itl_attainment"]) == (pytest.approx(3 / 5), pytest.approx(3 / 5))


def test_the_live_policy_is_the_recommended_one_with_its_time_constants_compressed() -> None:
    """Traffic replayed 6 times faster: the window, the scale-down hold and the assumed start-up are 6 times
    shorter (the window stays whole seconds); every other setting is the recommended policy's own."""
    shipped = load_config(DEFAULT_CONFIG).policy
    body = compressed_policy(DEFAULT_CONFIG, 6.0)
    body["profile_results_dir"] = str(PROFILE_DIR)
    live = parse_config(body, "live").policy
    assert live.throughput_adjustment_interval_seconds == round(shipped.throughput_adjustment_interval_seconds / 6)
    assert live.throughput_scale_down_hold_seconds == shipped.throughput_scale_down_hold_seconds / 6
    assert live.throughput_startup_seconds == shipped.throughput_startup_seconds / 6
    timed = {
        "throughput_adjustment_interval_seconds",
        "throughput_scale_down_hold_seconds",
        "throughput_startup_seconds",
    }
    same = {k for k in type(live).model_fields if k not in timed | {"profile_results_dir"}}
    assert {k: getattr(live, k) for k in same} == {k: getattr(shipped, k) for k in same}
