"""`planner live`'s own parts that need no stack: the traffic it replays (the conv hour; one day's load cycle),
the slowed profile, aiperf's figures, the policy it runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner_cli.main import build_parser
from planner_core.config import load_config, parse_config
from planner_core.data import DEFAULT_CONFIG
from planner_core.lab.live import (
    AZURE_CONV,
    LiveError,
    LiveOptions,
    RunSpec,
    aiperf_figures,
    compressed_policy,
    day_shape,
    day_trace,
    live_table,
    write_day_trace,
    write_slowed_profile,
    write_trace,
)
from planner_core.perf.model import ProfilePerfModel
from planner_core.traces import load_trace

PROFILE_DIR = Path(__file__).resolve().parents[2] / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D"


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


@pytest.mark.parametrize("name", ["conv", "code", "mooncake"])
def test_a_recorded_trace_is_selected_by_name_and_cut_as_recorded(tmp_path, name) -> None:
    """Each recorded trace, cut at 300 s for 100 s of trace, 2 times faster, every 2nd request: the requests are the
    trace's own (lengths as recorded up to the caps, in order, at their offsets halved); Mooncake's keep their
    prefix blocks, cut to the capped prompt's."""
    from planner_core.lab.live.traffic import RECORDED_TRACES

    out = tmp_path / f"{name}.jsonl"
    num = write_trace(out, start_s=300, duration_s=50, speedup=2, keep_every=2, max_isl=4096, max_osl=512, name=name)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    trace = load_trace(RECORDED_TRACES[name])
    inside = [i for i, t in enumerate(trace.arrival_s) if 300 <= t < 400][::2]
    assert num == len(rows) == len(inside) > 10
    for row, i in zip(rows, inside, strict=True):
        assert row["timestamp"] == round((float(trace.arrival_s[i]) - 300) / 2 * 1000)
        assert row["input_length"] == min(int(trace.isl[i]), 4096)
        assert row["output_length"] == max(1, min(int(trace.osl[i]), 512))
        if name == "mooncake":
            assert row["hash_ids"] == trace.request_hashes(i)[: -(-row["input_length"] // 512)].tolist()
        else:
            assert "hash_ids" not in row


def test_a_run_longer_than_the_trace_or_an_unknown_trace_is_refused_in_one_line(tmp_path) -> None:
    out = tmp_path / "t.jsonl"
    with pytest.raises(LiveError, match=r"--duration-s 560 x --speedup 6 = 3360 s of the mooncake trace .* lasts"):
        write_trace(out, start_s=0, duration_s=560, speedup=6, keep_every=9, max_isl=2048, max_osl=256, name="mooncake")
    with pytest.raises(
        LiveError, match=r"--traffic = 'nope': not a recorded trace \(known: conv, code, mooncake, day\)"
    ):
        write_trace(out, start_s=0, duration_s=10, speedup=1, keep_every=1, max_isl=2048, max_osl=256, name="nope")
    assert not out.exists()  # nothing half-written


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
    figures = aiperf_figures(out, spec)
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


@pytest.mark.parametrize("adaptive", [True, False], ids=["planner", "fixed"])
@pytest.mark.parametrize(("router", "router_kind"), [("round-robin", "round_robin"), ("slo", "slo")])
def test_the_runs_config_loads_as_serve_loads_it(tmp_path, adaptive, router, router_kind) -> None:
    """The config a run writes for its `planner serve` passes every check serve makes (the closed loop, on in the
    recommended policy since aedd43b, needs disagg: on the stack's aggregated engines it made every run fail at
    start until it was turned off there), and names the router in front of the engines, which the planner sizes
    for."""
    from planner_core.lab.live.spec import write_config
    from planner_core.planner import refuse_what_cannot_work

    spec = RunSpec(
        name="planner" if adaptive else "fixed-2", adaptive=adaptive, fixed_size=2, duration_s=60, ttft_ms=2000,
        itl_ms=100, interval_s=None, max_workers=4, trace=tmp_path / "trace.jsonl", nice=0, profile_dir=PROFILE_DIR,
        cooldown_s=5, speedup=6.0, router=router,
    )  # fmt: skip
    path = write_config(spec, tmp_path, {}, "http://127.0.0.1:9090")
    config = load_config(path).policy
    refuse_what_cannot_work(config, path)
    assert config.mode.value == "agg" and not config.throughput_capacity_feedback
    assert config.router.value == router_kind
    assert config.max_gpu_budget == (4 if adaptive else 2)


@pytest.mark.parametrize("adaptive", [True, False], ids=["planner", "fixed"])
def test_the_disaggregated_runs_config_scales_both_pools_or_pins_each(tmp_path, adaptive) -> None:
    """Disaggregated: prefill and decode pools, the closed loop as the recommended policy has it, the engines'
    metrics listed for Prometheus; the fixed-size run pins each pool at its size (the minimum of each pool, the
    budget their sum), the planner's run starts from the initial sizes of both pools."""
    from planner_core.domain import Component
    from planner_core.lab.live.spec import WORKER_TARGETS_FILE, write_config
    from planner_core.planner import refuse_what_cannot_work

    spec = RunSpec(
        name="planner" if adaptive else "fixed-1p3d", adaptive=adaptive, fixed_size=3, fixed_prefill=1,
        duration_s=60, ttft_ms=2000, itl_ms=100, interval_s=None, max_workers=5, trace=tmp_path / "trace.jsonl",
        nice=0, profile_dir=PROFILE_DIR, cooldown_s=5, speedup=6.0, mode="disagg", initial_size=3, initial_prefill=2,
    )  # fmt: skip
    path = write_config(spec, tmp_path, {}, "http://127.0.0.1:9090")
    loaded = load_config(path)
    config = loaded.policy
    refuse_what_cannot_work(config, path)
    shipped = load_config(DEFAULT_CONFIG).policy
    assert config.mode.value == "disagg"
    assert config.throughput_capacity_feedback == shipped.throughput_capacity_feedback
    assert config.router.value == "round_robin"  # the frontend's own router, which the prefill sizing must know
    local = loaded.service.local_workers
    assert (local.initial_prefill, local.initial_decode) == (2, 3)
    assert local.metrics_targets_file == str(tmp_path / WORKER_TARGETS_FILE)
    assert local.command(Component.PREFILL) == local.command(Component.DECODE)  # one template: ${DISAGGREGATION_MODE}
    if adaptive:
        assert (config.prefill_min_endpoint_effective, config.decode_min_endpoint_effective) == (1, 1)
        assert config.max_gpu_budget == 5
    else:
        assert (config.prefill_min_endpoint_effective, config.decode_min_endpoint_effective) == (1, 3)
        assert config.max_gpu_budget == 4


def test_the_prometheus_config_scrapes_the_frontend_and_the_connectors_targets(tmp_path) -> None:
    import yaml

    from planner_core.lab.live.run import prometheus_config

    config = yaml.safe_load(prometheus_config(8000, tmp_path / "workers.json"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["frontend"]["static_configs"] == [{"targets": ["127.0.0.1:8000"]}]
    assert jobs["workers"]["file_sd_configs"][0]["files"] == [str(tmp_path / "workers.json")]
    assert config["global"]["scrape_interval"] == "1s"


@pytest.mark.parametrize(
    ("text", "mode", "sizes"), [("1:2", "disagg", (1, 2)), ("0:0", "disagg", (0, 0)), ("3", "agg", (0, 3))]
)
def test_sizes_are_prefill_decode_pairs_disaggregated_and_one_count_aggregated(text, mode, sizes) -> None:
    from planner_core.lab.live import parse_sizes

    assert parse_sizes(text, mode, "--fixed-size") == sizes


@pytest.mark.parametrize(("text", "mode"), [("2", "disagg"), ("1:2", "agg"), ("1:-1", "disagg"), ("a:b", "disagg")])
def test_a_size_of_the_wrong_form_is_refused_naming_the_flag_and_the_form(text, mode) -> None:
    from planner_core.lab.live import parse_sizes

    with pytest.raises(LiveError, match=f"--fixed-size = '{text}': with --mode {mode} give "):
        parse_sizes(text, mode, "--fixed-size")


def test_the_planner_view_is_compared_with_what_aiperf_sent_in_the_windows_it_looked_at() -> None:
    """Windows (90, 100] and (110, 120]: the requests aiperf started in each (the one at 105 s falls between them,
    a tick that did not run, and is counted apart) against the windows' counts and mean prompt lengths."""
    from planner_core.lab.live.scoring import ObservedWindow, SentRequest, longest_saturated_s, view_agreement

    windows = [ObservedWindow(100.0, 10.0, 2.0, 150.0), ObservedWindow(120.0, 10.0, 1.1, 200.0)]
    sent = [SentRequest(95.0, 100), SentRequest(100.0, 200), SentRequest(105.0, 999), SentRequest(111.0, 200)]
    assert view_agreement(windows, sent) == {
        "windows": 2, "requests_seen": 3.1, "requests_sent": 3, "requests_outside_windows": 1,
        "requests_diff": round(0.1 / 3, 4), "prompt_tokens_diff": round((300 + 220 - 500) / 500, 4),
    }  # fmt: skip
    idle = view_agreement([ObservedWindow(100.0, 10.0, float("nan"), float("nan"))], [])
    assert idle["requests_diff"] is None and idle["requests_seen"] == 0
    # 13 samples of 5 s under 10 % idle in a row: 65 s, more than a minute (saturated)
    assert longest_saturated_s([0.5] + [0.05] * 13 + [0.3, 0.02], 5.0) == 65.0


def test_the_day_is_a_cosine_from_the_mean_down_to_the_night_up_to_the_peak_and_back() -> None:
    shape = day_shape(560.0, 0.125)
    rates = shape.rates
    assert shape.window_s == 10.0 and len(rates) == 56
    assert rates.max() <= 1.0 and rates.min() >= 0.125
    # the night at a quarter of the span, the peak at three quarters, the mean at both ends
    assert int(np.argmin(rates)) in (13, 14) and int(np.argmax(rates)) in (41, 42)
    assert rates.max() / rates.min() == pytest.approx(8.0, rel=0.01)
    mean = (1 + 0.125) / 2
    assert rates[0] == pytest.approx(mean, abs=0.06) and rates[-1] == pytest.approx(mean, abs=0.06)
    assert rates[0] > rates[1] and rates[-2] > rates[-1]  # falling into the night, and from the day's peak
    assert np.array_equal(day_shape(560.0, 1.0).rates, np.ones(56))  # no cycle: a flat day
    for bad in ({"trough_ratio": 0.0}, {"trough_ratio": 1.5}):
        with pytest.raises(LiveError, match="--trough-ratio"):
            day_shape(560.0, **bad)
    with pytest.raises(LiveError, match="--duration-s"):
        day_shape(5.0, 0.5)


def test_the_day_traffic_follows_the_cycle_with_the_conv_hours_requests() -> None:
    trace = day_trace(duration_s=560.0, peak_rps=2.0, trough_ratio=0.125)
    again = day_trace(duration_s=560.0, peak_rps=2.0, trough_ratio=0.125)
    assert np.array_equal(trace.arrival_s, again.arrival_s) and np.array_equal(trace.isl, again.isl)  # no chance
    # the cycle's mean rate: the peak times the shape's mean over its maximum
    shape = day_shape(560.0, 0.125)
    assert trace.num_requests == pytest.approx(2.0 * shape.rates.mean() / shape.rates.max() * 560, rel=0.01)
    assert 0 <= trace.arrival_s[0] and trace.arrival_s[-1] < 560
    # the night's quarter (around 140 s) carries far fewer requests than the day's (around 420 s)
    night = np.count_nonzero((trace.arrival_s >= 70) & (trace.arrival_s < 210))
    day = np.count_nonzero((trace.arrival_s >= 350) & (trace.arrival_s < 490))
    assert day > 3 * night > 0
    # the requests are the hour's, from all of it (its lengths, in its order), not the first minutes only
    hour = load_trace(AZURE_CONV)
    assert set(zip(trace.isl.tolist(), trace.osl.tolist(), strict=True)) <= set(
        zip(hour.isl.tolist(), hour.osl.tolist(), strict=True)
    )
    tail = hour.arrival_s > hour.duration_s - 300  # the hour's last five minutes end the day
    last = set(zip(hour.isl[tail].tolist(), hour.osl[tail].tolist(), strict=True))
    assert set(zip(trace.isl[-10:].tolist(), trace.osl[-10:].tolist(), strict=True)) <= last
    with pytest.raises(LiveError, match="--peak-rps"):
        day_trace(duration_s=560.0, peak_rps=0.0, trough_ratio=0.5)


def test_the_day_trace_file_is_mooncake_with_capped_lengths(tmp_path) -> None:
    out = tmp_path / "day.jsonl"
    num = write_day_trace(out, duration_s=120.0, peak_rps=3.0, trough_ratio=0.25, max_isl=1024, max_osl=64)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert num == len(rows) > 0 and set(rows[0]) == {"timestamp", "input_length", "output_length"}
    stamps = [r["timestamp"] for r in rows]
    assert stamps == sorted(stamps) and stamps[-1] < 120_000
    assert max(r["input_length"] for r in rows) <= 1024 and max(r["output_length"] for r in rows) <= 64
    assert min(r["output_length"] for r in rows) >= 1


def test_make_live_runs_the_conversation_hour_disaggregated_by_default() -> None:
    from planner_cli.live import DEFAULT_FIXED

    args = build_parser().parse_args(["live"])
    assert (args.traffic, args.duration_s, args.keep_every, args.slowdown, args.mode) == ("conv", 900, 6, 16, "disagg")
    assert args.speedup is None  # the whole recorded hour in the run (`fitting_speedup`)
    assert args.fixed_size is None and DEFAULT_FIXED == {"agg": "2", "disagg": "2:1,1:1"}
    assert args.initial_size is None  # every run starts from the first fixed size


def test_the_default_compression_fits_the_rest_of_the_recorded_trace_into_the_run(tmp_path) -> None:
    """`--speedup` unset: the trace from `--trace-start-s` to its end in `--duration-s`, rounded down so the cut is
    never refused as longer than the trace; the day keeps 6; a start past the end is refused in one line."""
    from planner_core.lab.live import fitting_speedup
    from planner_core.lab.live.traffic import RECORDED_TRACES

    for name in ("conv", "code", "mooncake"):
        speedup = fitting_speedup(name, start_s=0, duration_s=900)
        hour_s = load_trace(RECORDED_TRACES[name]).duration_s
        assert hour_s - 0.01 * 900 < speedup * 900 <= hour_s, name
        write_trace(tmp_path / f"{name}.jsonl", start_s=0, duration_s=900, speedup=speedup, keep_every=50,
                    max_isl=2048, max_osl=256, name=name)  # fmt: skip
    assert fitting_speedup("conv", start_s=0, duration_s=900) == 3.89
    assert fitting_speedup("conv", start_s=1800, duration_s=900) < fitting_speedup("conv", start_s=0, duration_s=900)
    assert fitting_speedup("day", start_s=0, duration_s=900) == 6.0
    with pytest.raises(LiveError, match=r"--trace-start-s = 5000: past the end of the conv trace"):
        fitting_speedup("conv", start_s=5000, duration_s=900)


def test_the_table_says_what_traffic_each_run_had() -> None:
    traffic = "day: peak 2 req/s, night 0.125 of it; 629 requests in 560 s"
    table = live_table([{"run": "planner", "traffic": traffic}, {"run": "old"}], ttft_ms=2000, itl_ms=100)
    row = next(line for line in table.splitlines() if line.startswith("| traffic"))
    assert row == f"| traffic | {traffic} | - |"  # a record made before runs said their traffic: -


def test_the_default_sla_is_dynamos_scaled_by_the_slowdown() -> None:
    from planner_core.lab.live import binding_sla

    assert binding_sla(8.0) == (4000.0, 400.0) and binding_sla(1.0) == (500.0, 50.0)


def _fixed(prefill: int, decode: int, attainment: float, mode: str = "disagg") -> dict:
    return {"run": f"fixed-{prefill}p{decode}d", "adaptive": False, "mode": mode, "fixed_prefill": prefill,
            "fixed_size": decode, "attainment": attainment}  # fmt: skip


def test_the_sla_binds_when_one_engine_fewer_in_each_pool_misses_99() -> None:
    """Disaggregated: 2p3d is the cheapest pair meeting 99 %; the SLA binds when each pool's size one engine smaller
    (1p3d, 2p2d) misses 99 %."""
    from planner_core.lab.live.scoring import binding_check, binding_line

    planner = {"run": "planner", "adaptive": True, "mode": "disagg", "attainment": 0.999}
    runs = [planner, _fixed(2, 3, 0.995), _fixed(1, 3, 0.97), _fixed(2, 2, 0.95)]
    check = binding_check(runs)
    assert check["cheapest_meeting"] == "2p3d" and check["valid"] is True
    assert check["pools"]["prefill"] == {"smaller": "1p3d", "attainment": 0.97, "binding": True}
    assert check["pools"]["decode"] == {"smaller": "2p2d", "attainment": 0.95, "binding": True}
    assert binding_line(check).startswith("SLA binding (valid): cheapest fixed size meeting 99 % 2p3d; prefill: 1p3d")
    # one engine fewer decode also meets 99 %: 2p2d is then the cheapest, and its smaller sizes are not run
    loose = binding_check([planner, _fixed(2, 3, 0.995), _fixed(1, 3, 0.97), _fixed(2, 2, 0.992)])
    assert loose["cheapest_meeting"] == "2p2d" and loose["valid"] is None
    assert loose["pools"]["decode"] == {
        "smaller": "2p1d", "smaller_size": (2, 1), "binding": None, "why": "no run of fixed size 2p1d"
    }  # fmt: skip
    # a single prefill engine suffices: the prefill pool cannot bind, the comparison is not valid
    single = binding_check([_fixed(1, 2, 0.995), _fixed(1, 1, 0.9)])
    assert single["valid"] is False and single["pools"]["prefill"]["binding"] is False
    # nothing met 99 %, and records made before the figures kept their fixed sizes
    assert binding_check([_fixed(1, 1, 0.9)])["valid"] is None
    assert "predate" in binding_check([{"run": "fixed-2", "attainment": 1.0}])["why"]
    assert "no fixed-size run" in binding_check([{"run": "planner", "adaptive": True, "attainment": 1.0}])["why"]


def test_aggregated_the_one_pool_binds_when_one_engine_fewer_misses() -> None:
    from planner_core.lab.live.scoring import binding_check

    check = binding_check([_fixed(0, 2, 1.0, "agg"), _fixed(0, 1, 0.9428, "agg")])
    assert check == {
        "cheapest_meeting": "2", "valid": True,
        "pools": {"decode": {"smaller": "1", "attainment": 0.9428, "binding": True}},
    }  # fmt: skip


def _search(attainment, start: tuple[int, int], *, mode: str = "disagg", max_engines: int = 12) -> list[tuple]:
    """The sizes `--fixed-search` runs after `start`, each run's figures from `attainment(size)` -> (TTFT share,
    ITL share), until it stops."""
    from planner_core.lab.live.frontier import next_fixed_size

    def run(size):
        ttft, itl = attainment(size)
        return {**_fixed(*size, min(ttft, itl), mode), "ttft_attainment": ttft, "itl_attainment": itl}

    runs, order = [run(start)], [start]
    for _ in range(20):
        nxt = next_fixed_size(runs, disaggregated=mode == "disagg", max_engines=max_engines)
        if nxt.size is None:
            return order + [nxt.why]
        order.append(nxt.size)
        runs.append(run(nxt.size))
    raise AssertionError(f"the search did not stop: {order}")


def test_the_fixed_size_search_walks_to_the_cheapest_size_and_decides_whether_the_sla_binds() -> None:
    """A pool meets its target from 3 prefill and 2 decode engines on: from 1p1d the search grows the pool that
    missed more until 3p2d meets 99 %, then runs 2p2d and 3p1d (both miss: the SLA binds) and stops."""

    def attainment(size):
        return (1.0 if size[0] >= 3 else 0.90 - 0.1 * (3 - size[0]), 1.0 if size[1] >= 2 else 0.95)

    order = _search(attainment, (1, 1))
    assert order[:-1] == [(1, 1), (2, 1), (3, 1), (3, 2), (2, 2)]  # 3p1d already ran: not run twice
    assert "decided: cheapest meeting 3p2d, binding valid = True" in order[-1]
    # started above the frontier, it walks down while one engine fewer still meets 99 %, asking each new cheapest
    # size's prefill pool first (2p3d and 2p2d are run, not inferred from 2p4d: a live run is measured, not assumed)
    order = _search(attainment, (5, 4))
    assert order[:-1] == [(5, 4), (4, 4), (3, 4), (2, 4), (3, 3), (2, 3), (3, 2), (2, 2), (3, 1)]
    assert "cheapest meeting 3p2d, binding valid = True" in order[-1]
    # aggregated: one pool; and a budget it cannot meet within
    assert _search(lambda s: (1.0, 1.0 if s[1] >= 2 else 0.9), (0, 1), mode="agg")[:-1] == [(0, 1), (0, 2)]
    assert "within the budget of 4 engines" in _search(lambda _size: (0.5, 0.5), (1, 1), max_engines=4)[-1]


def test_the_slo_router_is_refused_in_front_of_disaggregated_pools(capsys) -> None:
    args = build_parser().parse_args(["live", "--router", "slo"])
    assert args.func(args) == 2
    assert "--router slo: needs --mode agg" in capsys.readouterr().err


def test_several_fixed_sizes_run_one_after_the_other_from_the_first_ones_deployment(tmp_path) -> None:
    """`--fixed-size 1:1,1:2,0:0,1:2`: the planner's run and one run per distinct non-empty size, in order, all
    starting from the first size (1p1d); a size with one pool empty is refused, naming the flag."""
    from planner_core.lab.live import parse_size_list, plan_runs

    args = build_parser().parse_args(["live", "--out", str(tmp_path), "--fixed-size", "1:1,1:2,0:0,1:2"])
    sizes = parse_size_list(args.fixed_size, "disagg", "--fixed-size")
    assert sizes == ((1, 1), (1, 2))
    fields = {name: getattr(args, name) for name in ("duration_s", "traffic", "peak_rps", "trough_ratio", "speedup",
              "keep_every", "trace_start_s", "max_isl", "max_osl", "slowdown", "interval_s", "max_workers",
              "cooldown_s", "fixed_only", "record", "nice", "router", "mode", "fixed_search")}  # fmt: skip
    options = LiveOptions(out=tmp_path, ttft_ms=4000, itl_ms=400, fixed_sizes=sizes, initial_size=None, **fields)
    specs = plan_runs(options, tmp_path, tmp_path / "trace.jsonl", "conv")
    assert [(s.name, s.adaptive, s.fixed_prefill, s.fixed_size) for s in specs] == [
        ("planner", True, 0, 1), ("fixed-1p1d", False, 1, 1), ("fixed-1p2d", False, 1, 2),
    ]  # fmt: skip
    assert {(s.initial_prefill, s.initial_size) for s in specs} == {(1, 1)}
    # the planner keeps deciding after the traffic; a pinned one has nothing to decide
    assert [s.cooldown_s for s in specs] == [options.cooldown_s, 0.0, 0.0] and options.cooldown_s > 0
    with pytest.raises(LiveError, match=r"--fixed-size = '0:2': both pools need an engine \(or 0:0 for none\)"):
        parse_size_list("1:1,0:2", "disagg", "--fixed-size")
