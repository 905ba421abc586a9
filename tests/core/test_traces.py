"""Tests of `planner_core.traces`: loading Azure/Mooncake traces, windows, rate scaling, bad input (reads files)."""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.data import TRACES_DIR
from planner_core.traces import MOONCAKE_EPOCH_S, RequestTrace, TraceError, load_trace

AZURE_CONV = "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = "AzureLLMInferenceTrace_code.csv"
MOONCAKE = "synthetic_trace.jsonl"
TRACE_NAMES = [AZURE_CONV, AZURE_CODE, MOONCAKE]


# The conv file has 19,367 lines: the header and 19,366 requests. It has CRLF line ends and no newline after the
# last row, so `wc -l` prints 19,366 and "19,365 requests" (wc -l minus the header) is one short.
AZURE_CONV_REQUESTS = 19_366
AZURE_CONV_FIRST = datetime(2023, 11, 16, 18, 15, 46, 680590, tzinfo=UTC).timestamp()
AZURE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


def _data_rows(path: Path) -> list[str]:
    """The file's non-blank data lines (header dropped for CSV), read independently of the loader."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return lines[1:] if path.suffix == ".csv" else lines


def _azure_epoch(stamp: str) -> float:
    """UTC epoch seconds of an Azure TIMESTAMP such as '2023-11-16 18:15:46.6805900' (7 fraction digits)."""
    head, _, fraction = stamp.partition(".")
    return datetime.strptime(f"{head}.{fraction[:6]:0<6}", AZURE_TIME_FORMAT).replace(tzinfo=UTC).timestamp()


def _raw_requests(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(epoch or relative seconds, ISL, OSL) per data row, parsed with the standard library."""
    rows = _data_rows(path)
    if path.suffix == ".csv":
        records = list(csv.DictReader(rows, fieldnames=["TIMESTAMP", "ContextTokens", "GeneratedTokens"]))
        stamps = [_azure_epoch(r["TIMESTAMP"]) for r in records]
        return (
            np.array(stamps),
            np.array([float(r["ContextTokens"]) for r in records]),
            np.array([float(r["GeneratedTokens"]) for r in records]),
        )
    records = [json.loads(line) for line in rows]
    return (
        np.array([r["timestamp"] / 1000.0 for r in records]),
        np.array([float(r["input_length"]) for r in records]),
        np.array([float(r["output_length"]) for r in records]),
    )


@pytest.fixture(scope="module", params=TRACE_NAMES, ids=["azure-conv", "azure-code", "mooncake"])
def trace_path(request: pytest.FixtureRequest) -> Path:
    """Path of one shipped trace file."""
    return TRACES_DIR / request.param


@pytest.fixture(scope="module")
def trace(trace_path: Path) -> RequestTrace:
    """The loaded trace of `trace_path`, loaded once per file."""
    return load_trace(trace_path)


@pytest.fixture(scope="module")
def conv() -> RequestTrace:
    """The Azure 2023 conversation trace."""
    return load_trace(TRACES_DIR / AZURE_CONV)


def _mean_gap_s(trace: RequestTrace) -> float:
    return trace.duration_s / (trace.num_requests - 1)


def _per_minute(trace: RequestTrace, minutes: int) -> np.ndarray:
    return np.bincount((trace.arrival_s // 60).astype(int), minlength=minutes)[:minutes]


# ---------------------------------------------------------------------------------------------------------
# Loading the real files
# ---------------------------------------------------------------------------------------------------------


def test_request_count_equals_data_lines(trace_path: Path, trace: RequestTrace) -> None:
    """One request per data line of the file (header excluded); arrays are read-only and of equal length."""
    assert trace.num_requests == len(_data_rows(trace_path))
    assert len(trace.isl) == len(trace.osl) == trace.num_requests
    assert not (trace.arrival_s.flags.writeable or trace.isl.flags.writeable or trace.osl.flags.writeable)
    assert trace.source == str(trace_path)


def test_azure_conv_has_19366_requests(conv: RequestTrace) -> None:
    """The conv trace holds 19,366 requests (counted by hand: 19,367 lines including the header)."""
    assert conv.num_requests == AZURE_CONV_REQUESTS


def test_arrivals_sorted_from_zero_and_match_the_file(trace_path: Path, trace: RequestTrace) -> None:
    """Arrivals are sorted offsets from the first request, equal to the file's timestamps; lengths match the file."""
    stamps, isl, osl = _raw_requests(trace_path)
    assert trace.arrival_s[0] == 0.0
    assert np.all(np.diff(trace.arrival_s) >= 0)
    np.testing.assert_allclose(trace.arrival_s, np.sort(stamps) - stamps.min(), atol=2e-6)
    order = np.argsort(stamps, kind="stable")
    np.testing.assert_array_equal(trace.isl, isl[order])
    np.testing.assert_array_equal(trace.osl, osl[order])


def test_start_epoch_is_the_first_timestamp_or_the_mooncake_anchor(trace_path: Path, trace: RequestTrace) -> None:
    """Azure: `start_epoch_s` is the earliest TIMESTAMP (UTC); Mooncake: the fixed anchor plus the first offset."""
    stamps, _, _ = _raw_requests(trace_path)
    if trace_path.suffix == ".csv":
        assert trace.start_epoch_s == pytest.approx(stamps.min(), abs=2e-6)
    else:
        assert stamps.min() == 0.0
        assert trace.start_epoch_s == MOONCAKE_EPOCH_S


def test_azure_conv_starts_at_its_first_timestamp(conv: RequestTrace) -> None:
    """The conv trace starts at 2023-11-16 18:15:46.68059 UTC."""
    assert conv.start_epoch_s == pytest.approx(AZURE_CONV_FIRST, abs=1e-6)


@pytest.mark.parametrize(
    ("name", "low_min", "high_min"),
    [(AZURE_CONV, 58.0, 58.5), (AZURE_CODE, 57.0, 57.5), (MOONCAKE, 17.0, 17.1)],
    ids=["azure-conv-58min", "azure-code-57min", "mooncake-17min"],
)
def test_durations(name: str, low_min: float, high_min: float) -> None:
    """Durations: ~58 min (Azure conv, 58.36), ~57 min (Azure code, 57.27), ~17 min (Mooncake, 17.03)."""
    assert low_min <= load_trace(TRACES_DIR / name).duration_s / 60.0 <= high_min


def test_load_trace_accepts_str_and_path() -> None:
    """`load_trace` takes a str or a Path and gives equal arrays."""
    by_str, by_path = load_trace(str(TRACES_DIR / MOONCAKE)), load_trace(TRACES_DIR / MOONCAKE)
    np.testing.assert_array_equal(by_str.arrival_s, by_path.arrival_s)
    assert by_str.start_epoch_s == by_path.start_epoch_s


# ---------------------------------------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------------------------------------


def _expected_observation(trace: RequestTrace, start_s: float, end_s: float) -> tuple[int, np.ndarray, np.ndarray]:
    mask = (trace.arrival_s >= start_s) & (trace.arrival_s < end_s)
    return int(mask.sum()), trace.isl[mask], trace.osl[mask]


@settings(max_examples=60, deadline=None)
@given(start_frac=st.floats(min_value=-0.05, max_value=1.0), length_s=st.floats(min_value=0.0, max_value=900.0))
def test_observe_matches_numpy_on_the_same_slice(conv: RequestTrace, start_frac: float, length_s: float) -> None:
    """`observe` counts requests in [start, end); mean and p90 ISL/OSL equal numpy on the same requests."""
    start_s = start_frac * conv.duration_s
    end_s = start_s + length_s
    count, isl, osl = _expected_observation(conv, start_s, end_s)
    observed = conv.observe(start_s, end_s)
    assert observed.duration_s == pytest.approx(length_s)
    assert observed.num_req == count
    if count == 0:
        assert (observed.isl, observed.osl) == (0.0, 0.0)
        return
    assert observed.isl == pytest.approx(isl.mean(), rel=1e-12)
    assert observed.osl == pytest.approx(osl.mean(), rel=1e-12)
    assert observed.isl_p90 == pytest.approx(np.percentile(isl, 90), rel=1e-12)
    assert observed.osl_p90 == pytest.approx(np.percentile(osl, 90), rel=1e-12)
    assert observed.ttft_ms is None and observed.itl_ms is None


def test_observe_window_is_half_open(conv: RequestTrace) -> None:
    """A request at `start` is counted, one at `end` is not; moving either bound by epsilon flips that."""
    eps = 1e-6
    a, b = 100, 200  # request indices with distinct neighbours
    start_s, end_s = float(conv.arrival_s[a]), float(conv.arrival_s[b])
    assert conv.arrival_s[a - 1] < start_s - eps and conv.arrival_s[b + 1] > end_s + eps
    assert conv.observe(start_s, end_s).num_req == b - a
    assert conv.observe(start_s + eps, end_s).num_req == b - a - 1
    assert conv.observe(start_s - eps, end_s + eps).num_req == b - a + 1
    assert conv.observe(start_s, end_s - eps).num_req == b - a
    assert conv.window(start_s, end_s) == slice(a, b)


@pytest.mark.parametrize(
    "where", ["before-start", "after-end", "zero-length", "between-arrivals"], ids=lambda where: where
)
def test_empty_window_gives_zero_traffic(conv: RequestTrace, where: str) -> None:
    """A window with no arrivals reports num_req 0, ISL/OSL 0 and no percentiles."""
    gap_at = int(np.argmax(np.diff(conv.arrival_s)))  # the longest silence
    start_s, end_s = {
        "before-start": (-60.0, 0.0),
        "after-end": (conv.duration_s + 1.0, conv.duration_s + 61.0),
        "zero-length": (500.0, 500.0),
        "between-arrivals": (conv.arrival_s[gap_at] + 1e-3, conv.arrival_s[gap_at + 1] - 1e-3),
    }[where]
    observed = conv.observe(start_s, end_s)
    assert (observed.num_req, observed.isl, observed.osl) == (0.0, 0.0, 0.0)
    assert observed.isl_p90 is None and observed.osl_p90 is None
    assert observed.duration_s == pytest.approx(end_s - start_s)
    assert observed.invalid_field() is None


# ---------------------------------------------------------------------------------------------------------
# Rate scaling
# ---------------------------------------------------------------------------------------------------------

SCALE_FACTORS = [0.5, 1.5, 2, 2.5, 3]


def test_scaled_by_one_is_the_same_trace(trace: RequestTrace) -> None:
    """`scaled(1)` returns the trace itself."""
    assert trace.scaled(1) is trace
    assert trace.scaled(1.0) is trace


@pytest.mark.parametrize("factor", SCALE_FACTORS, ids=lambda f: f"x{f}")
def test_scaled_multiplies_count_and_keeps_duration_and_shape(trace: RequestTrace, factor: float) -> None:
    """Count x f (within 1), duration within one mean gap, per-minute shape kept (corr > 0.99), same start."""
    scaled = trace.scaled(factor)
    assert abs(scaled.num_requests - factor * trace.num_requests) <= 1
    assert abs(scaled.duration_s - trace.duration_s) <= _mean_gap_s(trace)
    minutes = math.ceil(trace.duration_s / 60.0)
    correlation = np.corrcoef(_per_minute(trace, minutes), _per_minute(scaled, minutes))[0, 1]
    assert correlation > 0.99
    assert scaled.start_epoch_s == trace.start_epoch_s
    assert scaled.arrival_s[0] == 0.0 and np.all(np.diff(scaled.arrival_s) >= 0)
    assert not scaled.arrival_s.flags.writeable
    assert scaled.source == f"{trace.source} x{factor:g}"


@pytest.mark.parametrize("factor", [2, 3], ids=lambda f: f"x{f}")
def test_integer_scaling_repeats_every_request(trace: RequestTrace, factor: int) -> None:
    """An integer factor holds exactly `f` copies of each request's lengths."""
    scaled = trace.scaled(factor)
    np.testing.assert_array_equal(np.sort(scaled.isl), np.sort(np.tile(trace.isl, factor)))
    np.testing.assert_array_equal(np.sort(scaled.osl), np.sort(np.tile(trace.osl, factor)))


@pytest.mark.parametrize("factor", [0.3, 2.5], ids=lambda f: f"x{f}")
def test_scaled_is_deterministic(trace: RequestTrace, factor: float) -> None:
    """Scaling twice by the same factor gives identical arrays."""
    first, second = trace.scaled(factor), trace.scaled(factor)
    for name in ("arrival_s", "isl", "osl"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))
    assert first.start_epoch_s == second.start_epoch_s


@pytest.mark.parametrize(
    ("name", "factor"),
    [
        pytest.param(AZURE_CONV, 0.25, id="azure-conv-x0.25"),  # 4,844 requests, expected 4,841.5
        pytest.param(AZURE_CODE, 3.7, id="azure-code-x3.7"),  # 32,629 requests, expected 32,630.3
    ],
)
def test_scaled_count_within_one_request_for_any_fraction(name: str, factor: float) -> None:
    """Fractional factors keep the count within 1 request of f x n."""
    original = load_trace(TRACES_DIR / name)
    assert abs(original.scaled(factor).num_requests - factor * original.num_requests) <= 1


def test_scaled_down_keeps_duration(conv: RequestTrace) -> None:
    """A factor below 1 keeps the duration within one mean inter-arrival gap."""
    assert abs(conv.scaled(0.1).duration_s - conv.duration_s) <= _mean_gap_s(conv)


@pytest.mark.parametrize(
    "factor", [0.0, -1.0, -0.5, math.nan, math.inf], ids=["zero", "minus-one", "minus-half", "nan", "inf"]
)
def test_scaled_rejects_non_positive_factor(conv: RequestTrace, factor: float) -> None:
    """A factor that is not a finite number > 0 raises ValueError naming the trace."""
    with pytest.raises(ValueError, match="rate factor must be a finite number > 0") as caught:
        conv.scaled(factor)
    assert conv.source in str(caught.value)


def test_scaled_refuses_more_requests_than_a_run_carries(conv: RequestTrace) -> None:
    """A factor that would make the trace more than MAX_SCALED_REQUESTS requests is refused before any is made
    (issue 43: `--rate-scale 100000` grew to 4.4 GB); the largest one allowed scales."""
    from planner_core.traces.trace import MAX_SCALED_REQUESTS

    largest = MAX_SCALED_REQUESTS // conv.num_requests
    assert len(conv.scaled(largest).arrival_s) <= MAX_SCALED_REQUESTS
    with pytest.raises(ValueError, match=f"more than a run carries \\({MAX_SCALED_REQUESTS}\\)") as caught:
        conv.scaled(100_000)
    assert "\n" not in str(caught.value) and conv.source in str(caught.value)


# ---------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 40, "output_length": 6}\n'

# (file name, content or None for no file, fragments the one-line message must hold besides the path)
BAD_INPUT = [
    pytest.param("trace.txt", "whatever\n", ["unknown trace format", "'.txt'"], id="unknown-suffix"),
    pytest.param("trace", "whatever\n", ["unknown trace format", "''"], id="no-suffix"),
    pytest.param("missing.jsonl", None, ["no such file"], id="missing-file"),
    pytest.param(
        "bad.jsonl",
        MOONCAKE_ROW + "\n" + '{"timestamp": 5, "input_length": 1\n',
        ["line 3", "JSONDecodeError"],
        id="mooncake-bad-json-after-blank-line",
    ),
    pytest.param(
        "nokey.jsonl",
        MOONCAKE_ROW + '{"timestamp": 5, "output_length": 2}\n',
        ["line 2", "field 'input_length' is missing"],
        id="mooncake-missing-key",
    ),
    pytest.param(
        "badvalue.jsonl",
        '{"timestamp": "soon", "input_length": 1, "output_length": 2}\n',
        ["line 1", "field 'timestamp' = \"soon\" is not a number"],
        id="mooncake-unparsable-value",
    ),
    pytest.param("notobject.jsonl", "[1, 2, 3]\n", ["line 1", "not a JSON object"], id="mooncake-line-not-an-object"),
    pytest.param("empty.jsonl", "\n\n", ["no requests"], id="mooncake-empty"),
    pytest.param(
        "nocol.csv",
        "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,374\n",
        ["missing column 'GeneratedTokens'"],
        id="azure-missing-column",
    ),
    pytest.param(
        "badts.csv",
        AZURE_HEADER + AZURE_ROW + AZURE_ROW + "not-a-time,10,3\n",
        ["row 4", "'TIMESTAMP'", "'not-a-time'"],
        id="azure-unparsable-timestamp",
    ),
    pytest.param("empty.csv", "", ["cannot parse CSV"], id="azure-empty-file"),
    pytest.param(
        "headeronly.csv",
        AZURE_HEADER,
        ["no requests"],
        id="azure-header-only",
    ),
    pytest.param(
        "badtokens.csv",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:47.00,abc,3\n",
        ["row 3", "'ContextTokens'", "'abc'"],
        id="azure-non-numeric-tokens",
    ),
    pytest.param(
        "blanktokens.csv",
        AZURE_HEADER + AZURE_ROW + "2023-11-16 18:15:47.00,,3\n",
        ["row 3", "'ContextTokens'"],
        id="azure-empty-token-field",
    ),
    pytest.param(
        "nan.jsonl",
        MOONCAKE_ROW + '{"timestamp": NaN, "input_length": 1, "output_length": 2}\n',
        ["line 2", "timestamp"],
        id="mooncake-nan-timestamp",
    ),
]


@pytest.mark.parametrize(("name", "content", "fragments"), BAD_INPUT)
def test_bad_input_raises_one_line_trace_error(
    tmp_path: Path, name: str, content: str | None, fragments: list[str]
) -> None:
    """Bad files raise TraceError: one line naming the file and the line/row/field and the value at fault."""
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    for fragment in fragments:
        assert fragment in message


def test_trace_error_is_a_value_error() -> None:
    """Callers that catch ValueError also catch TraceError."""
    assert issubclass(TraceError, ValueError)
