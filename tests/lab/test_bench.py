"""The planning benchmark: policies on the same requests, scoring, the oracle bound and `planner bench`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import planner_core.lab.sim.policies as policies_module
from planner_core.data import SERVEGEN_SHAPE
from planner_core.lab.sim.bench import (
    DEFAULT_POLICIES,
    FixedPolicy,
    OracleAheadPolicy,
    OraclePolicy,
    PlannerPolicy,
    UserPlannerConfig,
    build_policies,
    held_for_peak,
    policy_names,
    policy_path,
    run_bench,
    score,
)
from planner_core.lab.sim.des import SimResult, SimSpec
from planner_core.perf.model import ProfilePerfModel
from tests.conftest import PROFILE_DIR, REPO_ROOT
from tests.core.fakes import FWD, make_trace


@pytest.fixture(scope="module")
def profile_perf() -> ProfilePerfModel:
    return ProfilePerfModel.load(PROFILE_DIR)


def from_first_request(trace):
    """The same requests with offsets from the first one, as a loaded trace has them (`RequestTrace.arrival_s`)."""
    return make_trace((trace.arrival_s - trace.arrival_s[0]).tolist(), trace.isl.tolist(), trace.osl.tolist())


def busy_trace(num_requests: int = 1200, duration_s: float = 1200.0, seed: int = 3):
    """Requests whose rate doubles halfway through (a load step the policies must follow)."""
    rng = np.random.default_rng(seed)
    first = np.sort(rng.uniform(0, duration_s / 2, num_requests // 3))
    second = np.sort(rng.uniform(duration_s / 2, duration_s, num_requests - num_requests // 3))
    arrivals = np.concatenate([first, second]).tolist()
    return make_trace(
        arrivals, rng.integers(200, 3000, num_requests).tolist(), rng.integers(20, 300, num_requests).tolist()
    )


def test_score_counts_unfinished_requests_as_misses() -> None:
    trace = make_trace([0.0, 1.0, 2.0, 3.0], [100] * 4, [10] * 4)
    result = SimResult(
        ttft_s=np.array([0.1, 0.6, 0.1, np.nan]),  # the second misses TTFT 500 ms, the last never started
        itl_s=np.array([0.01, 0.01, 0.09, np.nan]),  # the third misses ITL 50 ms
        finish_s=np.array([1.0, 2.0, 3.0, np.nan]),
        gpu_s=7200.0,
        num_scaling_events=2,
        worker_timeline=((0.0, 1, 1),),
    )
    row = score("p", trace, result, ttft_ms=500, itl_ms=50, wall_s=0.0)
    assert (row.ttft_attainment, row.itl_attainment, row.sla_attainment) == (0.5, 0.5, 0.25)
    assert row.gpu_hours == 2.0
    assert row.goodput_rps == pytest.approx(1 / 3.0)  # one request met both over the 3 s trace


def test_oracle_is_the_cheapest_sizing_and_baselines_share_the_requests(profile_perf: ProfilePerfModel) -> None:
    """On the same requests: the oracle (instant, per-window need found in the simulator) spends no more GPU-hours
    than static provisioning for its peak, and every row counts every request."""
    trace = busy_trace()
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60}
    policies = build_policies(
        ["static-peak", "static-mean", "oracle", "fixed:1:1"], base, trace, profile_perf, FWD, SimSpec(), window_s=60
    )
    runs = run_bench(policies, trace, FWD, SimSpec(), ttft_ms=500, itl_ms=50)
    rows = {run.row.policy: run.row for run in runs}
    assert {row.requests for row in rows.values()} == {trace.num_requests}
    assert rows["oracle"].gpu_hours_vs_oracle == 1.0
    assert rows["oracle"].gpu_hours <= rows["static-peak"].gpu_hours
    assert rows["static-mean"].gpu_hours <= rows["static-peak"].gpu_hours
    assert rows["oracle"].sla_attainment >= 0.99
    # the oracle scales at the window edges where its size changes, and instantly
    oracle = next(p for p in policies if isinstance(p, OraclePolicy))
    sizes = list(oracle.sizes)
    assert rows["oracle"].scaling_events == sum(1 for a, b in zip(sizes, sizes[1:], strict=False) if a != b)


def test_planners_start_at_the_oracle_first_size_unless_asked(profile_perf: ProfilePerfModel) -> None:
    trace = busy_trace(600, 600.0)
    base = {"throughput_adjustment_interval_seconds": 60}
    (oracle, planner) = build_policies(["oracle", "planner"], base, trace, profile_perf, FWD, SimSpec(), window_s=60)
    assert isinstance(oracle, OraclePolicy) and isinstance(planner, PlannerPolicy)
    assert planner.initial() == oracle.sizes[0]
    (cold,) = build_policies(["planner"], base, trace, profile_perf, FWD, SimSpec(), window_s=60, initial="min")
    assert cold.initial() == (1, 1)
    with pytest.raises(ValueError, match="initial size"):
        build_policies(["planner"], base, trace, profile_perf, FWD, SimSpec(), window_s=60, initial="max")


def test_oracle_first_window_alone_equals_the_whole_search_first_window(profile_perf: ProfilePerfModel) -> None:
    """The first window searched on the trace's head gives the whole search's first answer, figures included
    (disaggregated and aggregated)."""
    from planner_core.lab.sim.oracle import OracleSettings, oracle_first_window, oracle_windows

    trace = from_first_request(busy_trace(900, 600.0))
    for spec in (SimSpec(), SimSpec(aggregated=True)):
        whole = oracle_windows(trace, FWD, spec, ttft_ms=500, itl_ms=50, window_s=60, settings=OracleSettings())
        first = oracle_first_window(trace, FWD, spec, ttft_ms=500, itl_ms=50, window_s=60, settings=OracleSettings())
        assert len(whole) > 1 and first == whole[0]


def test_planners_start_at_the_oracle_first_size_without_searching_the_whole_trace(
    profile_perf: ProfilePerfModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the oracle, static-peak or static-mean among the policies, `initial="oracle"` searches only the first
    window (plus its tail), and starts the planners at the size the whole search would have chosen."""
    import planner_core.lab.sim.oracle as oracle
    import planner_core.lab.sim.policies as policies

    trace = from_first_request(busy_trace(900, 600.0))
    base = {"throughput_adjustment_interval_seconds": 60}
    (oracle_policy, with_oracle) = build_policies(
        ["oracle", "planner"], base, trace, profile_perf, FWD, SimSpec(), window_s=60
    )
    searched: list[float] = []  # the last arrival of every trace the oracle searched

    def recording(search):  # a pass-through that notes what was searched
        def run(trace, *args, **kwargs):
            searched.append(float(trace.arrival_s[-1]))
            return search(trace, *args, **kwargs)

        return run

    monkeypatch.setattr(policies, "oracle_windows", recording(oracle.oracle_windows))
    monkeypatch.setattr(oracle, "oracle_windows", recording(oracle.oracle_windows))
    (alone,) = build_policies(["planner"], base, trace, profile_perf, FWD, SimSpec(), window_s=60)
    assert isinstance(oracle_policy, OraclePolicy) and isinstance(alone, PlannerPolicy)
    assert alone.initial() == with_oracle.initial() == oracle_policy.sizes[0]
    assert searched and max(searched) < 60 + oracle.OracleSettings().context_s  # the first window and its tail


def test_planner_policies_run_in_the_loop(profile_perf: ProfilePerfModel) -> None:
    """Every named planner policy ticks in the simulator, and some scale for the load step (~17 then ~33 requests/s)."""
    trace = busy_trace(30_000)
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60}
    names = [n for n in DEFAULT_POLICIES if n not in ("static-peak", "static-mean", "oracle")]
    policies = build_policies(names, base, trace, profile_perf, FWD, SimSpec(), window_s=60, initial="min")
    runs = run_bench(policies, trace, FWD, SimSpec(startup_s=30), ttft_ms=500, itl_ms=50)
    for run in runs:
        assert run.row.requests == trace.num_requests
        assert math.isfinite(run.row.gpu_hours) and run.row.gpu_hours > 0
        assert 0.0 <= run.row.sla_attainment <= 1.0
    assert any(run.row.scaling_events > 0 for run in runs)


def test_unknown_policy_is_refused(profile_perf: ProfilePerfModel, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = busy_trace(60, 60.0)
    with pytest.raises(ValueError, match="unknown policy 'magic'"):
        build_policies(["magic"], {}, trace, profile_perf, FWD, SimSpec(), window_s=60)
    with pytest.raises(ValueError, match="fixed:P:D"):
        build_policies(["fixed:2"], {}, trace, profile_perf, FWD, SimSpec(), window_s=60)
    # named after a planner (whose start needs the oracle's first-window search): refused before any search
    searched = []
    monkeypatch.setattr(
        policies_module._OracleSearch, "starting_size", lambda _self, size: searched.append(size) or (1, 1)
    )
    with pytest.raises(ValueError, match=r"'config:lean': a config file is benched with --config FILE"):
        build_policies(["planner", "config:lean"], {}, trace, profile_perf, FWD, SimSpec(), window_s=60)
    with pytest.raises(ValueError, match="unknown policy 'magic'"):
        build_policies(["planner", "magic"], {}, trace, profile_perf, FWD, SimSpec(), window_s=60)
    assert searched == []


def test_oracle_ahead_asks_for_each_size_a_start_up_before_its_window_and_holds_through_short_dips() -> None:
    """Windows of 180 s, start-up 120 s: the size of window k is asked for at 180 k - 120 s; a dip shorter than the
    start-up is held through (the workers would not be back in time), a longer one is taken."""
    sizes = [(1, 1), (3, 1), (1, 2), (1, 1), (1, 1), (2, 1)]
    policy = OracleAheadPolicy(sizes=sizes, window_s=180.0, lead_s=120.0)
    assert policy.interval_s == 60.0
    assert policy.initial() == (1, 1)  # window 1 starts beyond the first start-up
    assert [policy.decide(t, None) for t in (60.0, 120.0, 180.0, 240.0, 300.0, 360.0)] == [
        (3, 1), (3, 1), (3, 1), (3, 2), (3, 2), (1, 2)  # window 1 (180 s) asked for at 60 s, window 2 (360 s) at 240 s
    ]  # fmt: skip
    assert [policy.decide(t, None) for t in (540.0, 600.0, 660.0, 900.0, 1200.0)] == [
        (1, 1), (1, 1), (1, 1), (2, 1), (2, 1)  # window 5 (900 s) asked for at 780 s; the last size holds to the end
    ]  # fmt: skip
    assert policy.decide(780.0, None) == (2, 1)
    # a dip of one window (180 s) under a 600 s start-up is held through
    held = OracleAheadPolicy(sizes=[(3, 1), (1, 1), (3, 1)], window_s=180.0, lead_s=600.0)
    assert {held.decide(t, None) for t in (0.0, 180.0, 300.0)} == {(3, 1)}
    assert OracleAheadPolicy(sizes=sizes, window_s=180.0, lead_s=0.5).interval_s == 1.0
    # capped at what the windows already over needed (the first window's size before any is over): window 1's 4
    # prefill are never asked for ahead (nothing before needed 4); window 3's 3 prefill are (4 were needed), its 2
    # decode are not (decode never needed more than 1)
    seen = OracleAheadPolicy(sizes=[(2, 1), (4, 1), (1, 1), (3, 2)], window_s=180.0, lead_s=120.0, capped_at_seen=True)
    assert [seen.decide(t, None) for t in (60.0, 180.0, 360.0, 420.0)] == [(2, 1), (2, 1), (1, 1), (3, 1)]


def test_oracle_peak_holds_each_pool_at_its_largest_size_until_the_last_window_needing_it() -> None:
    """Prefill peaks at 5 in windows 1 and 3: held at 5 through window 3, its own sizes after; decode peaks at 2 in
    window 0 only: nothing held beyond it."""
    sizes = [(2, 2), (5, 1), (1, 1), (5, 1), (3, 1)]
    assert held_for_peak(sizes) == [(5, 2), (5, 1), (5, 1), (5, 1), (3, 1)]
    assert held_for_peak([(1, 1)]) == [(1, 1)]


SURGE = ((0.0, 300.0, 2.0), (300.0, 600.0, 30.0), (600.0, 900.0, 2.0))  # (start s, end s, requests per s)


def test_oracle_ahead_meets_the_oracle_attainment_with_start_up_for_more_gpu_hours(
    profile_perf: ProfilePerfModel,
) -> None:
    """The oracle's sizes asked for a start-up ahead serve the requests as the instant oracle does (each window has
    its workers ready as it starts), and pay for the start-up: more GPU-hours, never fewer."""
    rng = np.random.default_rng(5)  # 2 req/s, then 30 req/s of 6k-10k-token prompts for 300 s, then 2 req/s
    spans = [np.sort(rng.uniform(start, end, int((end - start) * rate))) for start, end, rate in SURGE]
    arrivals = np.concatenate(spans)
    trace = make_trace(
        arrivals.tolist(),
        rng.integers(6000, 10000, len(arrivals)).tolist(),
        rng.integers(20, 100, len(arrivals)).tolist(),
    )
    spec = SimSpec(startup_s=120.0)
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60}
    names = ["oracle", "oracle-ahead", "oracle-seen", "oracle-peak"]
    policies = build_policies(names, base, trace, profile_perf, FWD, spec, window_s=60)
    ahead = policies[1]
    assert isinstance(ahead, OracleAheadPolicy) and ahead.lead_s == 120.0
    rows = {run.row.policy: run.row for run in run_bench(policies, trace, FWD, spec, ttft_ms=500, itl_ms=50)}
    assert max(policies[0].sizes) > min(policies[0].sizes)  # the surge makes the oracle scale
    assert rows["oracle-ahead"].sla_attainment >= rows["oracle"].sla_attainment - 0.005
    assert rows["oracle-ahead"].gpu_hours > rows["oracle"].gpu_hours
    # the surge is larger than anything before it: capped at what was needed so far, it is met a window late
    assert rows["oracle-seen"].sla_attainment < rows["oracle-ahead"].sla_attainment - 0.01
    # ready for the surge from the start: its attainment, for the surge's engines over the first 300 s as well
    assert rows["oracle-peak"].sla_attainment >= rows["oracle-ahead"].sla_attainment - 0.005
    assert rows["oracle-peak"].gpu_hours > rows["oracle-ahead"].gpu_hours


def test_fixed_policy_never_scales() -> None:
    trace = busy_trace(300, 300.0)
    (run,) = run_bench([FixedPolicy(name="f", num_prefill=2, num_decode=3)], trace, FWD, SimSpec(), ttft_ms=1, itl_ms=1)
    assert run.row.scaling_events == 0
    assert run.result.worker_timeline[0][1:] == (2, 3)


def test_bench_figure_one_colour_and_legend_entry_per_policy_targets_and_table() -> None:
    """The bench page: each policy has one colour and one legend entry (a legend group) on every panel, the TTFT
    and ITL panels carry their SLA targets, and the results table has a row per policy."""
    from planner_core.lab.sim.bench import BENCH_TABLE_HEADER, bench_figure

    trace = busy_trace(300, 300.0)
    fixed = [
        FixedPolicy(name="small", num_prefill=1, num_decode=1),
        FixedPolicy(name="big", num_prefill=2, num_decode=3),
    ]
    runs = run_bench(fixed, trace, FWD, SimSpec(), ttft_ms=500, itl_ms=50)
    figure = bench_figure(runs, trace, ttft_ms=500, itl_ms=50)
    scatters = [t for t in figure.data if t.type == "scatter"]
    for name in ("small", "big"):
        mine = [t for t in scatters if t.name == name]
        assert len(mine) == 3  # ready GPUs, TTFT, ITL
        assert len({t.line.color for t in mine}) == 1 and {t.legendgroup for t in mine} == {name}
        assert sum(t.showlegend is not False for t in mine) == 1
    assert len({t.line.color for t in scatters if t.name in ("small", "big")}) == 2
    ttft_axis = next(t.yaxis for t in scatters if t.name == "small" and t.showlegend is False)  # the TTFT panel
    targets = {t.name: (t.yaxis, set(t.y)) for t in scatters if "target" in (t.name or "")}
    assert targets["TTFT target 500 ms"] == (ttft_axis, {500.0})
    assert targets["ITL target 50 ms"][1] == {50.0} and targets["ITL target 50 ms"][0] != ttft_axis
    [table] = [t for t in figure.data if t.type == "table"]
    assert tuple(table.header.values) == BENCH_TABLE_HEADER
    columns = [list(c) for c in table.cells.values]
    assert columns[0] == ["small", "big"] and columns[6] == [str(r.row.scaling_events) for r in runs]
    assert columns[4] == [f"{r.row.gpu_hours:.2f}" for r in runs] and columns[5] == ["-", "-"]  # no oracle run


def write_small_azure_trace(path: Path, num_requests: int = 400, duration_s: float = 600.0) -> Path:
    """An Azure-format CSV of `num_requests` uniform arrivals over `duration_s` (< 1 h), ISL 100-2000, OSL 10-200."""
    rng = np.random.default_rng(5)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for offset_s, isl, osl in zip(
        np.sort(rng.uniform(0, duration_s, num_requests)),
        rng.integers(100, 2000, num_requests),
        rng.integers(10, 200, num_requests),
        strict=True,
    ):
        minutes, seconds = divmod(offset_s, 60)
        lines.append(f"2023-11-16 18:{int(minutes):02d}:{seconds:010.7f},{isl},{osl}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_bench_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "bench", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_cli_writes_json_and_html(tmp_path) -> None:
    """`planner bench` on a small Azure-format trace: the JSON rows have the documented keys, the page is written."""
    trace_path = write_small_azure_trace(tmp_path / "small.csv")
    out_json, out_html = tmp_path / "rows.json", tmp_path / "bench.html"
    result = subprocess.run(
        [sys.executable, "-m", "planner_cli.main", "bench", "--trace", str(trace_path), "--policies",
         "oracle,static-peak,fixed:1:1", "--throughput-interval-s", "60", "--json", str(out_json), "--html",
         str(out_html)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out_json.read_text())
    assert [row["policy"] for row in rows] == ["oracle", "static-peak", "fixed:1:1"]
    assert set(rows[0]) == {
        "policy", "requests", "ttft_attainment", "itl_attainment", "sla_attainment", "attainable", "goodput_rps",
        "gpu_hours",
        "gpu_hours_vs_oracle", "scaling_events", "ttft_ms_mean", "ttft_ms_p90", "itl_ms_mean", "itl_ms_p90", "wall_s",
        "router", "unplaced", "rejected", "local_prefills", "overdue", "ttft_pred_err_p50", "ttft_pred_err_p90",
        "tpot_pred_err_p50", "tpot_pred_err_p90",
    }  # fmt: skip
    assert rows[0]["router"] == "least_loaded" and rows[0]["unplaced"] is None  # no predictions: no router figures
    assert rows[0]["requests"] == 400
    assert out_html.stat().st_size > 1_000_000 and "plotly" in out_html.read_text()[:200_000].lower()
    assert "oracle" in result.stdout


def test_a_user_config_is_benched_with_its_own_settings(profile_perf: ProfilePerfModel, tmp_path: Path) -> None:
    """A config file's settings drive its policy: with both loops off it never scales, and it starts (min
    endpoints, `initial="min"`) at its own minimums 3 and 2, where the same bench's `planner` policy starts at 1/1."""
    trace = busy_trace(600, 600.0)
    frozen = tmp_path / "frozen.yaml"
    frozen.write_text(
        "ttft_ms: 500\nitl_ms: 50\nenable_throughput_scaling: false\nenable_load_scaling: false\n"
        "prefill_min_endpoint: 3\ndecode_min_endpoint: 2\n"
    )
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "throughput_adjustment_interval_seconds": 60}
    preset, user = build_policies(
        ["planner"], base, trace, profile_perf, FWD, SimSpec(), window_s=60, initial="min",
        user_configs=[UserPlannerConfig(name="config:frozen", path=frozen)],
    )  # fmt: skip
    assert (preset.name, preset.initial()) == ("planner", (1, 1))
    assert (user.name, user.initial()) == ("config:frozen", (3, 2))
    (run,) = run_bench([user], trace, FWD, SimSpec(), ttft_ms=500, itl_ms=50)
    assert run.row.scaling_events == 0


def test_cli_benches_config_files_and_shapes_the_trace(tmp_path) -> None:
    """`--config FILE` adds a `config:<stem>` row (and says when its SLA targets differ from the bench's);
    `--compress 2` serves the 400 requests of 600 s in 300 s; `--shape` makes `--shape-hours` of load from the
    trace's requests under ServeGen's daily cycle at `--rate-scale` times the base rate: 0.5 h of a 400-per-600 s
    trace at x2 is about 2 x 1,200 = 2,400 requests (the shape moves requests in time, not their mean count)."""
    trace_path = write_small_azure_trace(tmp_path / "small.csv")
    config_path = tmp_path / "mine.yaml"
    config_path.write_text("ttft_ms: 300\nitl_ms: 40\nenable_load_scaling: false\n")
    out_json = tmp_path / "rows.json"
    result = run_bench_cli(
        "--trace", str(trace_path), "--policies", "fixed:1:1", "--config", str(config_path), "--initial", "min",
        "--compress", "2", "--throughput-interval-s", "60", "--json", str(out_json),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out_json.read_text())
    assert [row["policy"] for row in rows] == ["fixed:1:1", "config:mine"]
    assert "sets TTFT 300 ms / ITL 40 ms; the bench plans and scores every policy at --ttft-ms 500" in result.stderr
    fixed = rows[0]
    # one prefill and one decode GPU for the compressed trace's span (just under 300 s) and its drain
    assert 2 * 290 / 3600 < fixed["gpu_hours"] < 2 * 400 / 3600
    shaped = run_bench_cli(
        "--trace", str(trace_path), "--policies", "fixed:2:2", "--shape", str(SERVEGEN_SHAPE), "--shape-hours", "0.5",
        "--rate-scale", "2", "--json", "-",
    )  # fmt: skip
    assert shaped.returncode == 0, shaped.stderr
    (row,) = json.loads(shaped.stdout)
    assert 2_000 < row["requests"] < 2_800


def test_cli_record_holds_the_rows_with_date_command_and_commit(tmp_path) -> None:
    """`--record` writes the `--json` rows inside an envelope naming when, how and from which commit they came."""
    trace_path = write_small_azure_trace(tmp_path / "small.csv", num_requests=100)
    rows_path, record_path = tmp_path / "rows.json", tmp_path / "record.json"
    result = run_bench_cli(
        "--trace", str(trace_path), "--policies", "fixed:1:1,fixed:2:2", "--throughput-interval-s", "60",
        "--json", str(rows_path), "--record", str(record_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    record = json.loads(record_path.read_text())
    assert set(record) == {"format", "date", "command", "commit", "rows"}
    assert record["format"] == "planner-bench-record/v1"
    assert record["command"].startswith("planner bench --trace ") and "--record" in record["command"]
    assert dt.datetime.fromisoformat(record["date"]).tzinfo is not None
    assert isinstance(record["commit"], str) and record["commit"]  # the tests run in a checkout
    assert record["rows"] == json.loads(rows_path.read_text())  # the same rows, written once each
    assert [row["policy"] for row in record["rows"]] == ["fixed:1:1", "fixed:2:2"]


def test_cli_engine_speed_is_in_the_header_and_the_record(tmp_path) -> None:
    """`--engine-speed` and `--engine-speed-change` reach the simulated engines; the header and the record name them;
    a bad value and `--engine dynamo` are refused in one line before anything runs."""
    trace_path = write_small_azure_trace(tmp_path / "small.csv", num_requests=100)
    record_path = tmp_path / "record.json"
    result = run_bench_cli(
        "--trace", str(trace_path), "--policies", "fixed:1:1", "--throughput-interval-s", "60",
        "--engine-speed", "prefill=0.8", "--engine-speed-change", "5m:decode=0.5", "--record", str(record_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "engines at prefill 0.8x / decode 1x the profile, from 300 s at prefill 0.8x / decode 0.5x" in result.stdout
    record = json.loads(record_path.read_text())
    assert record["engine_speed"] == {
        "prefill": 0.8, "decode": 1.0, "change": {"at_s": 300.0, "speed": {"prefill": 0.8, "decode": 0.5}}
    }  # fmt: skip
    for bad, says in (
        (["--engine-speed", "prefill=0"], "planner: error: --engine-speed: prefill=0 is not a finite number > 0"),
        (["--engine-speed", "prefill=0.8", "--engine", "dynamo"], "planner: error: --engine dynamo: --engine-speed"),
    ):
        result = run_bench_cli("--trace", str(trace_path), "--policies", "fixed:1:1", *bad)
        assert result.returncode == 2 and result.stderr.strip().startswith(says), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_cli_perf_table_sets_the_engines_gpus(tmp_path) -> None:
    """With `--perf-table` the simulated engines take the table's timing and its `tp` GPUs each: a table of tp 2
    doubles the GPU-hours of fixed:1:1 on the same trace."""
    from tests.lab.test_perf_table import small_table_body

    trace_path = write_small_azure_trace(tmp_path / "small.csv", num_requests=100)
    hours = {}
    for tp in (1, 2):
        body = small_table_body()
        body["header"]["tp"] = tp
        table_path = tmp_path / f"tp{tp}.json"
        table_path.write_text(json.dumps(body))
        result = run_bench_cli(
            "--trace", str(trace_path), "--policies", "fixed:1:1", "--perf-table", str(table_path), "--json", "-"
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (row,) = json.loads(result.stdout)
        hours[tp] = row["gpu_hours"]
    assert hours[2] == pytest.approx(2 * hours[1])


def test_cli_mode_agg_runs_aggregated_engines(tmp_path) -> None:
    """`--mode agg`: the oracle, static-peak, the planner preset and fixed:N on aggregated engines. The 400
    requests over ~600 s fit one engine, so the oracle holds one engine per window and fixed:2 pays twice its
    GPU-hours (two engines, one GPU each, until the last request finishes: within 0.1 %, as the last finish
    differs by milliseconds with one engine or two)."""
    trace_path = write_small_azure_trace(tmp_path / "small.csv")
    out_json = tmp_path / "rows.json"
    result = run_bench_cli(
        "--trace", str(trace_path), "--mode", "agg", "--policies", "oracle,static-peak,planner,fixed:2",
        "--throughput-interval-s", "60", "--json", str(out_json),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {row["policy"]: row for row in json.loads(out_json.read_text())}
    assert list(rows) == ["oracle", "static-peak", "planner", "fixed:2"]
    assert "aggregated engines per 60 s window" in result.stdout
    assert rows["oracle"]["sla_attainment"] >= 0.99 and rows["oracle"]["gpu_hours_vs_oracle"] == 1.0
    assert rows["static-peak"]["gpu_hours"] == pytest.approx(600 / 3600, rel=0.05)  # one engine, ~600 s
    assert rows["fixed:2"]["gpu_hours"] == pytest.approx(2 * rows["static-peak"]["gpu_hours"], rel=1e-3)
    assert rows["planner"]["requests"] == 400 and rows["planner"]["gpu_hours"] > 0


def test_agg_presets_run_in_mode_agg_and_the_others_are_refused(profile_perf: ProfilePerfModel, tmp_path: Path) -> None:
    """With aggregated engines the presets that can size them get `mode: agg` and start (minimum endpoints) with
    no prefill pool; `fixed:N` and `fixed:0:N` are N engines; dynamo-0x (interpolation), Dynamo 1.6.1's planner,
    a fixed prefill pool and a disaggregated user config are refused in one line each."""
    from planner_core.config import PlannerMode

    trace = busy_trace(60, 60.0)
    agg = SimSpec(aggregated=True)
    base = {"throughput_adjustment_interval_seconds": 60}
    names = ["planner", "dynamo-1x", "threshold", "fixed:3", "fixed:0:2"]
    policies = build_policies(names, base, trace, profile_perf, FWD, agg, window_s=60, initial="min")
    planners = [p for p in policies if isinstance(p, PlannerPolicy)]
    assert [p.config.mode for p in planners] == [PlannerMode.AGG] * 3
    assert planners[0].config.throughput_prefill_burst_sizing  # at the agg engine's prompt rate
    assert [p.initial() for p in policies] == [(0, 1), (0, 1), (0, 1), (0, 3), (0, 2)]
    refusals = {
        "dynamo-0x": "dynamo-0x cannot run with --mode agg: its throughput_algorithm interpolation_corrected",
        "dynamo-defaults": "dynamo-defaults cannot run with --mode agg: its throughput_algorithm interpolation ",
        "dynamo-1.6.1": "dynamo-1.6.1 cannot run with --mode agg",
        "fixed:1:2": "--mode agg has no prefill pool; write fixed:N",
        "fixed:2:x": "written fixed:N with --mode agg",
    }
    for name, message in refusals.items():
        with pytest.raises(ValueError, match=message) as caught:
            build_policies(["oracle", name], base, trace, profile_perf, FWD, agg, window_s=60)
        assert "\n" not in str(caught.value)
    disagg = UserPlannerConfig(name="config:d", path=tmp_path / "d.yaml")
    disagg.path.write_text("ttft_ms: 500\n")
    with pytest.raises(ValueError, match="d.yaml: mode 'disagg' cannot run with --mode agg"):
        build_policies([], base, trace, profile_perf, FWD, agg, window_s=60, user_configs=[disagg])


def test_planner_policies_see_the_router_kv_hit_rate_of_the_window(profile_perf: ProfilePerfModel) -> None:
    """On a trace with prefix blocks the planners' throughput window carries the prefix-cache hit rate, as the
    Dynamo policies' does; without blocks it stays unknown."""
    # 59 prompts of 1024 tokens, one a second, all the same two 512-token blocks, then one at 61 s (so the trace
    # reaches the 60 s tick). One prefill engine: the first prompt misses, the 58 others find both blocks (capped
    # at isl - 1 = 1023 tokens): hit rate over [0, 60) = 58 x 1023 / (59 x 1024) = 59,334 / 60,416.
    arrivals = [*map(float, range(59)), 61.0]
    plain = make_trace(arrivals, [1024] * 60, [20] * 60)
    blocks = dataclasses.replace(
        plain, hash_ids=np.array([1, 2] * 60, dtype=np.int64), hash_offsets=np.arange(0, 121, 2, dtype=np.int64)
    )
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60}
    for trace, expected in ((blocks, 59_334 / 60_416), (plain, None)):
        [policy] = build_policies(["dynamo-1x"], base, trace, profile_perf, FWD, SimSpec(), window_s=60, initial="min")
        assert isinstance(policy, PlannerPolicy)
        run_bench([policy], trace, FWD, SimSpec(), ttft_ms=500, itl_ms=50)
        assert policy.state.num_throughput_ticks == 1
        assert policy.state.last_kv_hit_rate == (pytest.approx(expected) if expected is not None else None)


def test_agg_planner_sizes_for_bursts_above_the_mean_rate(profile_perf: ProfilePerfModel, tmp_path: Path) -> None:
    """A bursty trace on aggregated engines: 2 requests/s of 500 prompt tokens, and every 60 s 40 prompts of 3,000
    tokens within 0.2 s (120,000 tokens). The mean rate (~2.7 requests/s, ~4,300 prompt tokens/s) fits one engine;
    a burst does not: at the agg engine's prompt rate under its decode batch (tens of thousands of tokens/s, times
    the 0.7 target utilisation) it needs several engines to drain within the 500 ms TTFT target. The `planner`
    preset (burst sizing on) scales above one engine and attains more than the same config with burst sizing off,
    which stays at the mean-rate size."""
    rng = np.random.default_rng(5)
    steady = np.sort(rng.uniform(0.0, 600.0, 1200))
    bursts = np.concatenate([30.0 + 60.0 * k + np.linspace(0.0, 0.2, 40) for k in range(10)])
    arrival = np.concatenate([steady, bursts])
    order = np.argsort(arrival, kind="stable")
    isl = np.concatenate([np.full(1200, 500), np.full(400, 3000)])[order]
    osl = np.concatenate([np.full(1200, 50), np.full(400, 50)])[order]
    trace = make_trace(arrival[order].tolist(), isl.tolist(), osl.tolist())
    agg = SimSpec(aggregated=True)
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 60}
    (burst,) = build_policies(["planner"], base, trace, profile_perf, FWD, agg, window_s=60, initial="min")
    assert isinstance(burst, PlannerPolicy) and burst.config.throughput_prefill_burst_sizing
    # agg mode: the closed loop (disaggregated pools only) off, as `bench_config` turns it off for agg
    settings = yaml.safe_load(policy_path("planner").read_text()) | {
        "mode": "agg",
        "throughput_capacity_feedback": False,
    }
    mean_only = UserPlannerConfig(name="config:mean-only", path=tmp_path / "mean-only.yaml")
    mean_only.path.write_text(yaml.safe_dump(settings | {"throughput_prefill_burst_sizing": False}))
    (plain,) = build_policies([], base, trace, profile_perf, FWD, agg, window_s=60, initial="min",
                              user_configs=[mean_only])  # fmt: skip
    runs = {run.row.policy: run for run in run_bench([burst, plain], trace, FWD, agg, ttft_ms=500, itl_ms=50)}
    most = {name: max(ready for _, _, ready in run.result.worker_timeline) for name, run in runs.items()}
    assert most["config:mean-only"] == 1
    assert most["planner"] > 1
    assert runs["planner"].row.sla_attainment > runs["config:mean-only"].row.sla_attainment


def test_a_named_policy_is_its_config_file(profile_perf: ProfilePerfModel) -> None:
    """`--policies planner` and `--config planner_core/configs/policies/planner.yaml` are one code path: on the same
    requests their rows are identical but for the name and the wall time. Every named policy is a file there."""
    trace = busy_trace(24_000, 900.0)  # ~9 then ~18 requests/s
    base = {"ttft_ms": 500.0, "itl_ms": 50.0, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": 180}
    assert set(policy_names()) >= {"planner", "dynamo-0x", "dynamo-1x", "threshold", "dynamo-defaults"}
    # the engines the profile describes: the closed loop measures them at its speed (on the fake engines it learns
    # they are faster, up to its bound, and holds one engine throughout)
    engines = profile_perf.forward_pass_model()
    named, from_file = build_policies(
        ["planner"], base, trace, profile_perf, engines, SimSpec(), window_s=60, initial="min",
        user_configs=[UserPlannerConfig(name="config:planner", path=policy_path("planner"))],
    )  # fmt: skip
    runs = run_bench([named, from_file], trace, engines, SimSpec(startup_s=30), ttft_ms=500, itl_ms=50)
    rows = [dataclasses.asdict(run.row) for run in runs]
    for row in rows:
        del row["policy"], row["wall_s"]
    assert rows[0] == rows[1]
    assert named.config == from_file.config
    assert named.config.throughput_adjustment_interval_seconds == 60  # the file's own window, not the bench's 180
    assert runs[0].row.scaling_events > 0  # the comparison is not of two idle planners


def test_cli_router_slo_reports_what_it_could_not_place(tmp_path) -> None:
    """`planner bench --router slo`: the rows name the router and carry its counts and the predictor's errors; the
    table says so; a lone profiling file is refused in one line."""
    trace_path = write_small_azure_trace(tmp_path / "small.csv")
    out_json = tmp_path / "rows.json"
    result = run_bench_cli(
        "--trace", str(trace_path), "--policies", "fixed:1:1,fixed:2:1", "--router", "slo", "--ttft-ms", "200",
        "--json", str(out_json),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(out_json.read_text())
    assert [row["router"] for row in rows] == ["slo", "slo"]
    for row in rows:
        assert row["unplaced"] >= row["rejected"] == 0  # default: queued at the frontend, never rejected
        assert 0 <= row["ttft_pred_err_p50"] <= row["ttft_pred_err_p90"]
        assert 0 <= row["tpot_pred_err_p50"] <= row["tpot_pred_err_p90"]
    assert "router slo: unplaced / rejected / prefilled on decode / placed overdue" in result.stdout
    lone = run_bench_cli("--trace", str(trace_path), "--router", "slo", "--ttft-profile", str(tmp_path / "t.json"))
    assert lone.returncode != 0
    assert "--ttft-profile and --tpot-profile go together" in lone.stderr
