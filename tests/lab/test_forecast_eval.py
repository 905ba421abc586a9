"""Tests of Dynamo-exact windowing (`bucket_windows`), the forecast evaluation (`planner_core.lab.forecast_eval`),
the `planner forecast` command and the warm start (`planner_core.runtime.warmup`). Reads the shipped traces, writes
to tmp_path."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from planner_cli.main import main
from planner_core.config import parse_config
from planner_core.data import MOONCAKE_TRACE
from planner_core.domain import LoadHistory, Prediction, TrafficObservation
from planner_core.lab.forecast_eval import (
    PREDICTOR_NAMES,
    evaluate,
    forecast_windows,
    log1p_error,
    minimum_points,
    predictor_config,
    window_loss,
    window_records,
)
from planner_core.predict import observe_window
from planner_core.runtime.warmup import history_from_windows, warm_history
from planner_core.traces import bucket_window_starts, bucket_windows, load_trace, load_traces

MOONCAKE = MOONCAKE_TRACE

JSON_KEYS = {"predictor", "loss", "mape_requests", "mape_isl", "mape_osl", "ms_per_step_p50", "ms_per_step_p99"}


def sla_config(**fields) -> object:
    """A validated PlannerConfig with the `sla` target and the given fields."""
    return parse_config({"optimization_target": "sla", **fields}).policy


# ---------------------------------------------------------------------------------------------------------
# Windowing
# ---------------------------------------------------------------------------------------------------------

# (timestamp ms, ISL, OSL). The trace's clock zero is 0 ms; nothing arrives before 25 s. At a 10 s interval the
# windows (Dynamo: timestamp_ms // 10000) are 2: [20, 30) s, 3: [30, 40), 4 and 5 empty, 6: [60, 70).
GAPPY = [
    (25_000, 100, 10),
    (27_000, 200, 20),
    (29_999, 300, 30),
    (30_000, 400, 40),  # exactly on a boundary: the later window, as Dynamo's floor division
    (61_000, 500, 50),
    (65_000, 700, 70),
]


def write_mooncake(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    """A Mooncake JSONL file of (timestamp ms, input_length, output_length) rows."""
    path.write_text(
        "".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n" for t, i, o in rows)
    )
    return path


@pytest.fixture
def gappy_path(tmp_path: Path) -> Path:
    return write_mooncake(tmp_path / "gappy.jsonl", GAPPY)


def test_windows_keep_middle_gaps_and_drop_leading_empties(gappy_path: Path) -> None:
    """Windows 0-1 (before the first request) are dropped, empty windows 4-5 are kept with zeros."""
    windows = bucket_windows(load_trace(gappy_path), 10)
    expected = [  # (num_req, mean ISL, mean OSL)
        (3, 200.0, 20.0),  # [20, 30) s: 100, 200, 300 -> 200; 10, 20, 30 -> 20
        (1, 400.0, 40.0),  # [30, 40) s: the request at exactly 30.000 s
        (0, 0.0, 0.0),  # [40, 50) s: idle, kept
        (0, 0.0, 0.0),  # [50, 60) s: idle, kept
        (2, 600.0, 60.0),  # [60, 70) s: 500, 700 -> 600; 50, 70 -> 60
    ]
    assert [(w.num_req, w.isl, w.osl) for w in windows] == expected
    assert all(w.duration_s == 10.0 for w in windows)
    assert bucket_window_starts(load_trace(gappy_path), 10) == [20, 30, 40, 50, 60]


def test_windows_carry_length_percentiles(gappy_path: Path) -> None:
    """Each busy window carries p50/p90/p99 of its lengths (numpy linear); idle windows carry none."""
    first, _, idle, _, _ = bucket_windows(load_trace(gappy_path), 10)
    # ISL 100, 200, 300: p50 = 200; p90 at rank 0.9*2 = 1.8 -> 200 + 0.8*100 = 280; p99 at 1.98 -> 298.
    assert (first.isl_p50, first.isl_p90, first.isl_p99) == pytest.approx((200.0, 280.0, 298.0))
    assert (first.osl_p50, first.osl_p90, first.osl_p99) == pytest.approx((20.0, 28.0, 29.8))
    assert idle.isl_p90 is None and idle.osl_p99 is None


def test_dump_records_have_dynamo_shape(gappy_path: Path) -> None:
    """`window_records` gives Dynamo's warm-up metrics: interval_start (s), request_count, avg_isl, avg_osl."""
    assert window_records(load_trace(gappy_path), 10) == [
        {"interval_start": 20, "request_count": 3, "avg_isl": 200.0, "avg_osl": 20.0},
        {"interval_start": 30, "request_count": 1, "avg_isl": 400.0, "avg_osl": 40.0},
        {"interval_start": 40, "request_count": 0, "avg_isl": 0, "avg_osl": 0},
        {"interval_start": 50, "request_count": 0, "avg_isl": 0, "avg_osl": 0},
        {"interval_start": 60, "request_count": 2, "avg_isl": 600.0, "avg_osl": 60.0},
    ]


def test_wall_clock_traces_count_windows_from_the_first_request(tmp_path: Path) -> None:
    """Dynamo v1 (absolute ms) windows start at the first request: same requests, other windows than Mooncake."""
    t0_ms = 1_777_312_800_000 + 25_000
    records = [
        {
            "schema": "dynamo.request.trace.v1",
            "event_type": "request_end",
            "request": {"request_received_ms": t0_ms + t - 25_000, "output_tokens": o, "replay": {"input_length": i}},
        }
        for t, i, o in GAPPY
    ]
    path = tmp_path / "v1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    # Offsets from the first request 0, 2, 4.999, 5, 36, 40 s -> windows 0, 0, 0, 0, 3, 4.
    windows = bucket_windows(load_trace(path), 10)
    assert [w.num_req for w in windows] == [4, 0, 0, 1, 1]
    assert windows[0].isl == 250.0  # (100 + 200 + 300 + 400) / 4


def test_single_window_and_no_trailing_empties(gappy_path: Path) -> None:
    """A window longer than the trace gives one window; the last window always holds the last request."""
    trace = load_trace(gappy_path)
    assert [(w.num_req, w.isl) for w in bucket_windows(trace, 3600)] == [(6, 2200 / 6)]
    for interval_s in (1, 7, 10, 45):
        windows = bucket_windows(trace, interval_s)
        assert windows[0].num_req > 0 and windows[-1].num_req > 0
        assert sum(w.num_req for w in windows) == trace.num_requests


@pytest.mark.parametrize("interval_s", [0, -10, math.nan, math.inf, "sixty", True])
def test_bad_interval_is_refused(gappy_path: Path, interval_s: object) -> None:
    """The interval must be a finite number of seconds > 0."""
    with pytest.raises(ValueError, match="interval"):
        bucket_windows(load_trace(gappy_path), interval_s)  # type: ignore[arg-type]


def dynamo_mooncake_metrics(path: Path, interval_s: int) -> list[dict]:
    """Dynamo's `extract_metrics_from_trace` for a Mooncake file, restated from its algorithm (origin 0 ms)."""
    groups: dict[int, list[int]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        start = int(row["timestamp"] // (interval_s * 1000)) * interval_s
        group = groups.setdefault(start, [0, 0, 0])
        group[0] += 1
        group[1] += row["input_length"]
        group[2] += row["output_length"]
    metrics = []
    for start in range(min(groups), max(groups) + 1, interval_s):
        count, isl, osl = groups.get(start, (0, 0, 0))
        metrics.append(
            {
                "interval_start": start,
                "request_count": count,
                "avg_isl": isl / count if count else 0,
                "avg_osl": osl / count if count else 0,
            }
        )
    return metrics


@pytest.mark.parametrize("interval_s", [7, 60, 180])
def test_mooncake_windows_equal_dynamos_on_the_shared_trace(interval_s: int) -> None:
    """On the shared Mooncake trace the windows equal Dynamo's extraction exactly (counts and float means)."""
    assert window_records(load_traces(MOONCAKE), interval_s) == dynamo_mooncake_metrics(MOONCAKE, interval_s)


# ---------------------------------------------------------------------------------------------------------
# Loss and scoring
# ---------------------------------------------------------------------------------------------------------


def traffic(num_req: float, isl: float, osl: float) -> TrafficObservation:
    return TrafficObservation(duration_s=60.0, num_req=num_req, isl=isl, osl=osl)


LOSS_CASES = [
    # perfect forecast: every term is 0
    pytest.param(Prediction(num_req=20, isl=100, osl=10), traffic(20, 100, 10), 0.0, id="perfect"),
    # half the requests, right shape: N*ISL 1000 vs 2000 -> ln(2001/1001) = 0.692647; N*OSL 100 vs 200 ->
    # ln(201/101) = 0.688159; shape terms 0. Loss = 0.4 * (0.692647 + 0.688159) = 0.552322.
    pytest.param(
        Prediction(num_req=10, isl=100, osl=10),
        traffic(20, 100, 10),
        0.4 * (math.log(2001 / 1001) + math.log(201 / 101)),
        id="half-the-requests",
    ),
    # idle actual window (0, 0, 0); forecast 0 requests, ISL e^2 - 1, OSL e - 1: products are 0 both sides;
    # e(ISL) = log1p(e^2 - 1) = 2, e(OSL) = 1. Loss = 0.1 * 2 + 0.1 * 1 = 0.3.
    pytest.param(
        Prediction(num_req=0, isl=math.e**2 - 1, osl=math.e - 1), traffic(0, 0, 0), 0.3, id="idle-actual-window"
    ),
    # negative forecasts count as 0 (clamped after multiplying, as Dynamo): N̂ = 5, ISL̂ = OSL̂ = -1 -> products
    # -5 -> log1p(0) = 0, against N = 1, ISL = e^4 - 1 (log1p 4) and OSL = e^2 - 1 (log1p 2); shape terms 0 vs 4
    # and 0 vs 2. Loss = 0.4 * 4 + 0.4 * 2 + 0.1 * 4 + 0.1 * 2 = 1.6 + 0.8 + 0.4 + 0.2 = 3.0.
    pytest.param(
        Prediction(num_req=5, isl=-1, osl=-1),
        traffic(1, math.e**4 - 1, math.e**2 - 1),
        3.0,
        id="negative-forecast-clamped",
    ),
]


@pytest.mark.parametrize(("predicted", "actual", "expected"), LOSS_CASES)
def test_window_loss_by_hand(predicted: Prediction, actual: TrafficObservation, expected: float) -> None:
    """Dynamo's weighted loss 0.4 e(N·ISL) + 0.4 e(N·OSL) + 0.1 e(ISL) + 0.1 e(OSL) on hand-computed cases."""
    assert window_loss(predicted, actual) == pytest.approx(expected, abs=1e-12)


def test_log1p_error_is_symmetric_and_clamps() -> None:
    """e(a, b) = e(b, a); negative arguments count as 0."""
    assert log1p_error(3.0, 10.0) == log1p_error(10.0, 3.0) == pytest.approx(math.log(11 / 4))
    assert log1p_error(-7.0, 0.0) == 0.0


def test_constant_series_scores_zero_for_the_constant_predictor() -> None:
    """Ten identical windows: the constant predictor is exact from the second window on."""
    windows = [traffic(30, 500, 80)] * 10
    (score,), skip_first = evaluate(windows, {"constant": sla_config(load_predictor="constant")})
    assert skip_first == 1  # constant needs one point: window 0 (forecast from nothing) is not scored
    assert (score.loss, score.mape_requests, score.mape_isl, score.mape_osl) == (0.0, 0.0, 0.0, 0.0)
    assert (score.num_windows, score.num_scored) == (10, 9)
    assert score.ms_per_step_p50 >= 0 and score.ms_per_step_p99 >= score.ms_per_step_p50


def test_mape_skips_windows_whose_actual_is_zero() -> None:
    """An idle window is left out of each MAPE (its percentage is undefined) but stays in the loss."""
    windows = [traffic(10, 100, 10), traffic(0, 0, 0), traffic(20, 200, 20)]
    (score,), _ = evaluate(windows, {"constant": sla_config(load_predictor="constant")})
    # Window 1: forecast N 10 vs 0 -> skipped for every MAPE (ISL/OSL actuals are 0 too).
    # Window 2: forecast N = 0 (the idle window), ISL/OSL carried forward = 100 / 10; actual 20, 200, 20.
    assert score.mape_requests == pytest.approx(100.0)  # |0 - 20| / 20
    assert score.mape_isl == pytest.approx(50.0)  # |100 - 200| / 200
    assert score.mape_osl == pytest.approx(50.0)  # |10 - 20| / 20
    assert score.num_scored == 2


def test_all_predictors_are_scored_on_the_same_windows() -> None:
    """With several predictors, the first max(minimum points) windows are skipped for all of them."""
    config = sla_config(kalman_min_points=8)
    assert [minimum_points(predictor_config(config, n, 60)) for n in ("constant", "arima", "prophet", "kalman")] == [
        1,
        5,
        5,
        8,
    ]
    windows = [traffic(10 + k % 3, 100, 10) for k in range(12)]
    configs = {name: predictor_config(config, name, 60) for name in ("constant", "kalman")}
    scores, skip_first = evaluate(windows, configs)
    assert skip_first == 8
    assert [score.num_scored for score in scores] == [4, 4]


@pytest.mark.parametrize("name", ["constant", "kalman"])
def test_forecasts_never_look_ahead(name: str) -> None:
    """The forecast of window k is the same whether or not the windows after k exist."""
    windows = [traffic(10 + (k * 7) % 5, 100 + k, 10 + k % 2) for k in range(15)]
    config = predictor_config(sla_config(), name, 60)
    full = forecast_windows(windows, config)
    prefix = forecast_windows(windows[:9], config)
    assert [s.prediction for s in prefix] == [s.prediction for s in full[:9]]


# ---------------------------------------------------------------------------------------------------------
# The `planner forecast` command
# ---------------------------------------------------------------------------------------------------------


def test_cli_json_scores_every_predictor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--predictor all --json` prints a JSON list with one entry per predictor and the documented keys."""
    # 8 windows of 10 s with 3-6 requests each: all predictors skip the first 5 windows and score the last 3.
    rows_in = [(10_000 * k + 1_000 * j, 100 + 10 * j + k, 10 + j) for k in range(8) for j in range(3 + k % 4)]
    path = write_mooncake(tmp_path / "eight.jsonl", rows_in)
    code = main(["forecast", "--trace", str(path), "--interval", "10", "--predictor", "all", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["predictor"] for row in rows] == list(PREDICTOR_NAMES)
    for row in rows:
        assert JSON_KEYS <= row.keys()
        assert row["loss"] is not None and row["loss"] >= 0
        assert 0 <= row["ms_per_step_p50"] <= row["ms_per_step_p99"]
        assert (row["num_windows"], row["num_scored"]) == (8, 3)  # one common set of scored windows


def test_cli_dump_windows_writes_the_bucketed_windows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--dump-windows` writes one JSON line per window, the same windows the evaluation used."""
    dump = tmp_path / "windows.jsonl"
    argv = ["forecast", "--trace", str(MOONCAKE), "--interval", "60", "--predictor", "constant", "--json"]
    assert main([*argv, "--dump-windows", str(dump)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    dumped = [json.loads(line) for line in dump.read_text().splitlines()]
    assert dumped == window_records(load_traces(MOONCAKE), 60)
    assert len(dumped) == row["num_windows"] == 18  # 17.03 min of Mooncake: windows starting 0, 60, ..., 1020 s
    assert sum(record["request_count"] for record in dumped) == load_trace(MOONCAKE).num_requests


def test_cli_table_names_the_scoring_rule(gappy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json a table is printed, saying which windows were scored."""
    assert main(["forecast", "--trace", str(gappy_path), "--interval", "10", "--predictor", "constant"]) == 0
    out = capsys.readouterr().out
    assert "5 windows of 10 s (2 empty)" in out
    assert "the first 1 are not scored" in out
    assert out.count("\nconstant ") == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(["--interval", "0"], "--interval '0'", id="zero-interval"),
        pytest.param(["--interval", "1.5"], "whole number", id="fractional-interval"),
        pytest.param(["--interval", "soon"], "--interval 'soon'", id="text-interval"),
        pytest.param(["--interval", "60", "--predictor", "lstm"], "unknown predictor", id="unknown-predictor"),
        pytest.param(
            ["--interval", "60", "--predictor", "constant", "--trace", "/nonexistent/x.jsonl"],
            "no such file",
            id="missing-trace",
        ),
        pytest.param(
            ["--interval", "10", "--predictor", "constant", "--dump-windows", "/nonexistent/dir/w.jsonl"],
            "cannot write",
            id="unwritable-dump",
        ),
    ],
)
def test_cli_errors_exit_2_with_one_line(
    gappy_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    """Bad interval, predictor or trace: exit status 2 and one line on stderr."""
    argv = ["forecast", "--trace", str(gappy_path), *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("planner: error: ")
    assert fragment in err


def test_cli_bad_trace_line_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad record is reported as one line naming the file, the line and the field."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": -5, "input_length": 1}\n')
    assert main(["forecast", "--trace", str(path), "--interval", "60", "--predictor", "constant"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: line 2" in err


# ---------------------------------------------------------------------------------------------------------
# Warm start
# ---------------------------------------------------------------------------------------------------------


def test_warm_start_equals_observing_the_windows_one_by_one(gappy_path: Path) -> None:
    """`warm_history` = observe_window over the bucketed windows, then the leading-idle skip re-armed."""
    config = sla_config(
        load_predictor="constant",
        throughput_adjustment_interval_seconds=10,
        load_predictor_warmup_trace=str(gappy_path),
    )
    manual = LoadHistory()
    for window in bucket_windows(load_traces(gappy_path), 10):
        manual, _ = observe_window(manual, window, config)
    warm = warm_history(config)
    assert warm == dataclasses.replace(manual, seen_traffic=False)
    assert warm.num_req[-5:] == (3.0, 1.0, 0.0, 0.0, 2.0)
    assert warm_history(config, gappy_path) == warm  # an explicit spec gives the same
    assert history_from_windows(config, bucket_windows(load_trace(gappy_path), 10)) == warm


def test_warm_start_only_for_the_sla_target(gappy_path: Path) -> None:
    """Other targets (and no trace) start cold, and the trace is not even read."""
    missing = str(gappy_path.parent / "does-not-exist.jsonl")
    throughput = parse_config({"optimization_target": "throughput", "load_predictor_warmup_trace": missing}).policy
    assert warm_history(throughput) == LoadHistory()
    assert warm_history(sla_config()) == LoadHistory()


def test_warm_start_from_the_shared_mooncake_trace() -> None:
    """The shared Mooncake trace at 60 s warms one history point per window, holding every request."""
    config = sla_config(
        load_predictor="kalman", throughput_adjustment_interval_seconds=60, load_predictor_warmup_trace=str(MOONCAKE)
    )
    warm = warm_history(config)
    windows = bucket_windows(load_trace(MOONCAKE), 60)
    assert len(warm.num_req) == len(windows)
    assert sum(warm.num_req) == load_trace(MOONCAKE).num_requests
    assert np.isclose(warm.isl[-1], windows[-1].isl)
