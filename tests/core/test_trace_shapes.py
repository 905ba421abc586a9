"""Prefix block ids in traces, time compression, and rate shapes (ServeGen) applied to a base trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.data import AZURE_CONV_TRACE, MOONCAKE_TRACE, SERVEGEN_SHAPE
from planner_core.traces import (
    RateShape,
    RequestTrace,
    TraceError,
    bucket_windows,
    load_servegen_shape,
    load_trace,
    shape_trace,
)

MOONCAKE = MOONCAKE_TRACE
SERVEGEN = SERVEGEN_SHAPE


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def uniform_trace(num_requests: int, gap_s: float, *, with_hashes: bool = False) -> RequestTrace:
    arrival = np.arange(num_requests) * gap_s
    lengths = np.arange(num_requests, dtype=float) + 1.0  # request i has ISL i + 1, so it can be recognised
    hashes = {}
    if with_hashes:
        hashes = {
            "hash_ids": np.arange(num_requests, dtype=np.int64) * 10,  # one block each: request i -> 10 i
            "hash_offsets": np.arange(num_requests + 1, dtype=np.int64),
        }
    return RequestTrace(source="uniform", start_epoch_s=0.0, arrival_s=arrival, isl=lengths, osl=lengths, **hashes)


# --- prefix block ids ----------------------------------------------------------------------------------------


def test_mooncake_trace_carries_its_block_ids() -> None:
    trace = load_trace(MOONCAKE)
    assert trace.has_hashes and trace.block_tokens == 512
    # the first record: 40160 tokens in blocks 0..78 (ceil(40160 / 512) = 79)
    assert trace.isl[0] == 40160
    assert trace.request_hashes(0).tolist() == list(range(79))
    assert int(trace.hash_offsets[-1]) == len(trace.hash_ids)


def test_block_ids_are_optional_per_record(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
            {"timestamp": 1, "input_length": 10, "output_length": 3},
        ],
    )
    trace = load_trace(path)
    # sorted by arrival: the record without ids comes first and has none
    assert trace.isl.tolist() == [10, 600]
    assert [trace.request_hashes(i).tolist() for i in range(2)] == [[], [7, 8]]
    without = load_trace(write_jsonl(tmp_path / "u.jsonl", [{"timestamp": 1, "input_length": 10, "output_length": 3}]))
    assert not without.has_hashes
    assert without.request_hashes(0).tolist() == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("7", "line 1 field 'hash_ids' = '7' is not a list of integers >= 0"),
        ([1, -2], "line 1 field 'hash_ids' holds -2, not an integer >= 0"),
        ([1, 2.5], "line 1 field 'hash_ids' holds 2.5, not an integer >= 0"),
    ],
)
def test_bad_block_ids_are_named(tmp_path: Path, value: object, message: str) -> None:
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": value}]
    )
    with pytest.raises(TraceError, match=message) as error:
        load_trace(path)
    assert str(error.value).startswith(str(path)) and "\n" not in str(error.value)


def test_scaled_copies_get_their_own_blocks() -> None:
    # 4 requests with one block each (ids 0, 10, 20, 30; span 31); x2 -> each twice, the copy's id shifted by 31.
    trace = uniform_trace(4, 1.0, with_hashes=True).scaled(2)
    assert trace.num_requests == 8
    for index in range(trace.num_requests):
        original = int(trace.isl[index]) - 1
        (block,) = trace.request_hashes(index).tolist()
        assert block in (10 * original, 10 * original + 31)
    assert len(set(trace.hash_ids.tolist())) == 8


def test_compressed_divides_arrivals() -> None:
    base = uniform_trace(5, 2.0, with_hashes=True)
    fast = base.compressed(4)
    assert fast.arrival_s.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert fast.isl.tolist() == base.isl.tolist() and fast.hash_ids is base.hash_ids
    assert base.compressed(1) is base
    with pytest.raises(ValueError, match="compression factor must be a finite number > 0"):
        base.compressed(0)


@settings(max_examples=50, deadline=None)
@given(factor=st.floats(0.1, 50.0), num_requests=st.integers(2, 40))
def test_compression_keeps_requests_and_scales_the_rate(factor: float, num_requests: int) -> None:
    base = uniform_trace(num_requests, 1.5)
    fast = base.compressed(factor)
    assert fast.num_requests == base.num_requests
    assert fast.duration_s == pytest.approx(base.duration_s / factor)
    assert fast.observe(0.0, fast.duration_s + 1e-9).num_req == base.num_requests


# --- rate shapes -------------------------------------------------------------------------------------------


def test_servegen_shape_sums_clients(tmp_path: Path) -> None:
    (tmp_path / "chunk-1-trace.csv").write_text("0,1.5,1,Gamma,1,1\n600,0,0,,0,0\n1200,2,1,Gamma,1,1\n")
    (tmp_path / "chunk-2-trace.csv").write_text("600,4,1,Weibull,1,1\n1200,1,1,Gamma,1,1\n")
    shape = load_servegen_shape(tmp_path)
    assert shape.window_s == 600.0
    assert shape.rates.tolist() == [1.5, 4.0, 3.0]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("abc,1\n", "row 1: expected 'window_start_s,rate,...'"),
        ("0,-1\n", "row 1 field 'rate' = '-1' is not a rate >= 0"),
        ("-600,1\n", "row 1 field 'window_start_s' = '-600' is not a time >= 0"),
    ],
)
def test_servegen_bad_rows_are_named(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "chunk-1-trace.csv"
    path.write_text(row)
    with pytest.raises(TraceError, match=message):
        load_servegen_shape(path)


def test_shipped_servegen_shape_is_fourteen_days() -> None:
    shape = load_servegen_shape(SERVEGEN)
    assert (shape.window_s, len(shape.rates)) == (600.0, 14 * 144)
    assert len(shape.daily().rates) == 144


def test_daily_shape_and_peak() -> None:
    # two days of two 12-hour windows: [1, 3], [3, 5] -> the mean day [2, 4]; peak 4 over mean 3
    shape = RateShape(source="s", window_s=43_200.0, rates=np.array([1.0, 3.0, 3.0, 5.0]))
    daily = shape.daily()
    assert daily.rates.tolist() == [2.0, 4.0]
    assert daily.peak_to_mean() == pytest.approx(4 / 3)
    # a span past the shape's end wraps around: from 12 h for 24 h -> [4, 2]
    edges, rates = daily.over(43_200.0, 86_400.0)
    assert edges.tolist() == [0.0, 43_200.0, 86_400.0] and rates.tolist() == [4.0, 2.0]


@pytest.mark.parametrize(
    ("rate_factor", "per_window"),
    [
        # base 1 req/s; shape [1, 3] over two 600 s windows has mean 2, so the windows get 0.5 and 1.5 times the
        # base rate: 300 and 900 requests
        (1.0, [300, 900]),
        # twice the mean rate: 600 and 1800
        (2.0, [600, 1800]),
    ],
)
def test_shape_trace_follows_the_shape(rate_factor: float, per_window: list[int]) -> None:
    base = uniform_trace(1201, 1.0, with_hashes=True)  # 0..1200 s
    shape = RateShape(source="s", window_s=600.0, rates=np.array([1.0, 3.0]))
    trace = shape_trace(base, shape, duration_s=1200.0, rate_factor=rate_factor)
    assert [int(w.num_req) for w in bucket_windows(trace, 600.0)] == per_window
    assert np.all(np.diff(trace.arrival_s) >= 0)
    # the base's repetitions keep their own prefix blocks
    assert len(set(trace.hash_ids.tolist())) == trace.num_requests


def test_shape_trace_makes_days_of_load_from_an_hour() -> None:
    # The conversation trace's hour (5.5 req/s) under ServeGen's mean day, for two days: each day holds a day of the
    # base rate, and the hourly counts follow the shape's hourly means up to the base trace's own minute-to-minute
    # swings (which the warp keeps: within 10 % here).
    base = load_trace(AZURE_CONV_TRACE)
    daily = load_servegen_shape(SERVEGEN).daily()
    trace = shape_trace(base, daily, duration_s=2 * 86_400.0)
    base_rate = base.num_requests / base.duration_s
    hourly = np.array([w.num_req for w in bucket_windows(trace, 3600.0)])
    assert hourly[:24].sum() == pytest.approx(base_rate * 86_400.0, rel=0.01)
    assert hourly[24:].sum() == pytest.approx(base_rate * 86_400.0, rel=0.01)
    shape_hourly = daily.rates.reshape(24, 6).mean(axis=1)
    expected = np.tile(shape_hourly / shape_hourly.mean(), 2) * base_rate * 3600.0
    assert np.max(np.abs(hourly / expected - 1.0)) < 0.10
    assert np.corrcoef(hourly, expected)[0, 1] > 0.95
