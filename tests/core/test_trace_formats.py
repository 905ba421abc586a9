"""Tests of the trace formats and trace sets of `planner_core.traces`: Dynamo request-trace v1 JSONL(.gz), format
sniffing, file / glob / folder specs merged on one global origin, and one-line errors (writes files to tmp_path)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from planner_core.data import TRACES_DIR
from planner_core.traces import (
    MOONCAKE_EPOCH_S,
    TraceError,
    TraceFormat,
    detect_format,
    load_trace,
    load_traces,
    resolve_trace_paths,
)

T0_MS = 1_777_312_800_000  # 2026-04-27T18:00:00Z, a Unix-ms instant like those Dynamo writes


def v1_record(received_ms: int, isl: int, osl: int, *, event_type: str = "request_end", wrap: bool = False) -> dict:
    """A Dynamo `dynamo.request.trace.v1` record shaped like the docs' context-free replay row."""
    event = {
        "schema": "dynamo.request.trace.v1",
        "event_type": event_type,
        "event_time_unix_ms": received_ms + 1_000,  # the END of the request: never the arrival
        "request": {
            "request_id": f"r{received_ms}",
            "request_received_ms": received_ms,
            "output_tokens": osl,
            "replay": {"trace_block_size": 64, "input_length": isl, "input_sequence_hashes": [1, 2]},
        },
    }
    return {"event": event} if wrap else event


def tool_end(at_ms: int) -> dict:
    """A harness tool event: part of the v1 stream, but not a request."""
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": "tool_end",
        "event_time_unix_ms": at_ms,
        "session_id": "s",
        "tool": {"tool_call_id": "c", "status": "succeeded", "duration_ms": 4.0},
    }


def write_jsonl(path: Path, records: list, *, gz: bool = False) -> Path:
    """Write records one JSON object a line, gzip-compressed when `gz`."""
    text = "".join(json.dumps(record) + "\n" for record in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


# Three requests (out of order in the file) and one tool event: arrivals 0 s, 1.5 s and 61.25 s after T0.
V1_RECORDS = [
    v1_record(T0_MS + 1_500, isl=128, osl=16),
    tool_end(T0_MS + 1_600),
    v1_record(T0_MS, isl=64, osl=4),
    v1_record(T0_MS + 61_250, isl=256, osl=32),
]


def assert_v1_trace(trace) -> None:
    """The trace of V1_RECORDS: sorted arrivals from T0, lengths from replay.input_length / output_tokens."""
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1.5, 61.25])
    np.testing.assert_array_equal(trace.isl, [64, 128, 256])
    np.testing.assert_array_equal(trace.osl, [4, 16, 32])
    assert trace.start_epoch_s == T0_MS / 1000.0
    assert trace.clock_offset_s == 0.0  # wall clock: windows count from the first request


# ---------------------------------------------------------------------------------------------------------
# Dynamo request-trace v1
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace.jsonl", "trace.jsonl.gz"])
def test_dynamo_v1_request_end_events_become_requests(tmp_path: Path, name: str) -> None:
    """request_end events give the requests (arrival = request_received_ms, not event_time); tool events are skipped."""
    path = write_jsonl(tmp_path / name, V1_RECORDS, gz=name.endswith(".gz"))
    trace = load_trace(path)
    assert_v1_trace(trace)
    assert trace.source == str(path)
    assert detect_format(path) is TraceFormat.DYNAMO_V1


def test_dynamo_v1_records_wrapped_in_event_are_read(tmp_path: Path) -> None:
    """A record may carry the event under an "event" key, as Dynamo's reader allows."""
    wrapped = [{"event": record} for record in V1_RECORDS]
    assert_v1_trace(load_trace(write_jsonl(tmp_path / "wrapped.jsonl", wrapped)))


def test_gz_and_plain_give_identical_traces(tmp_path: Path) -> None:
    """The same records compressed or not load to equal arrays and start."""
    plain = load_trace(write_jsonl(tmp_path / "a" / "t.jsonl", V1_RECORDS))
    packed = load_trace(write_jsonl(tmp_path / "b" / "t.jsonl.gz", V1_RECORDS, gz=True))
    for name in ("arrival_s", "isl", "osl"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(packed, name))
    assert plain.start_epoch_s == packed.start_epoch_s


# ---------------------------------------------------------------------------------------------------------
# Format sniffing
# ---------------------------------------------------------------------------------------------------------

MOONCAKE_RECORDS = [
    {"timestamp": 2_000, "input_length": 40, "output_length": 6, "hash_ids": [0]},
    {"timestamp": 500, "input_length": 10, "output_length": 2, "hash_ids": [1]},
]


@pytest.mark.parametrize(
    ("name", "records", "expected"),
    [
        pytest.param("m.jsonl", MOONCAKE_RECORDS, TraceFormat.MOONCAKE, id="mooncake"),
        pytest.param("m.jsonl.gz", MOONCAKE_RECORDS, TraceFormat.MOONCAKE, id="mooncake-gz"),
        pytest.param("d.jsonl", V1_RECORDS, TraceFormat.DYNAMO_V1, id="dynamo"),
        pytest.param("d.jsonl.gz", V1_RECORDS, TraceFormat.DYNAMO_V1, id="dynamo-gz"),
        pytest.param("w.jsonl", [{"event": V1_RECORDS[0]}], TraceFormat.DYNAMO_V1, id="dynamo-wrapped"),
        pytest.param("t.jsonl", [tool_end(T0_MS), *V1_RECORDS], TraceFormat.DYNAMO_V1, id="dynamo-tool-first"),
    ],
)
def test_format_is_sniffed_from_the_first_record(tmp_path: Path, name: str, records: list, expected) -> None:
    """A `schema` field in the first record means Dynamo v1; otherwise Mooncake (`timestamp`, lengths)."""
    path = write_jsonl(tmp_path / name, [*records], gz=name.endswith(".gz"))
    assert detect_format(path) is expected


def test_mooncake_jsonl_gz_keeps_the_relative_clock(tmp_path: Path) -> None:
    """Mooncake .jsonl.gz loads like .jsonl: sorted, anchored at MOONCAKE_EPOCH_S, clock zero 0.5 s before."""
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl.gz", MOONCAKE_RECORDS, gz=True))
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 1.5])
    np.testing.assert_array_equal(trace.isl, [10, 40])
    assert trace.start_epoch_s == MOONCAKE_EPOCH_S + 0.5
    assert trace.clock_offset_s == 0.5  # first timestamp 500 ms after the trace's zero


def test_azure_csv_is_detected_by_suffix(tmp_path: Path) -> None:
    """`.csv` is the Azure format whatever its content."""
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert detect_format(path) is TraceFormat.AZURE_CSV


# ---------------------------------------------------------------------------------------------------------
# File, glob and folder specs: one global origin
# ---------------------------------------------------------------------------------------------------------


def shard_records() -> tuple[list, list]:
    """Two Dynamo shards whose requests interleave in time; shard B holds the earliest request (T0 - 2 s)."""
    shard_a = [v1_record(T0_MS, 100, 10), v1_record(T0_MS + 60_000, 300, 30)]
    shard_b = [v1_record(T0_MS - 2_000, 50, 5), tool_end(T0_MS), v1_record(T0_MS + 30_000, 200, 20)]
    return shard_a, shard_b


def assert_merged_shards(trace) -> None:
    """Both shards on one clock whose origin is the earliest request of either (shard B's)."""
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 2.0, 32.0, 62.0])
    np.testing.assert_array_equal(trace.isl, [50, 100, 200, 300])
    np.testing.assert_array_equal(trace.osl, [5, 10, 20, 30])
    assert trace.start_epoch_s == (T0_MS - 2_000) / 1000.0


def test_glob_merges_shards_on_a_global_origin(tmp_path: Path) -> None:
    """A glob over a plain and a gzipped shard merges them; offsets count from the earliest request of all."""
    shard_a, shard_b = shard_records()
    write_jsonl(tmp_path / "trace.000001.jsonl", shard_a)
    write_jsonl(tmp_path / "trace.000002.jsonl.gz", shard_b, gz=True)
    trace = load_traces(str(tmp_path / "trace.*"))
    assert_merged_shards(trace)
    assert trace.source == f"{tmp_path / 'trace.*'} (2 files)"


def test_folder_is_searched_recursively_for_trace_files(tmp_path: Path) -> None:
    """A folder spec takes every .jsonl / .jsonl.gz / .csv below it (sub-folders too) and ignores other files."""
    shard_a, shard_b = shard_records()
    write_jsonl(tmp_path / "run" / "a.jsonl", shard_a)
    write_jsonl(tmp_path / "run" / "deeper" / "b.jsonl.gz", shard_b, gz=True)
    (tmp_path / "run" / "README.md").write_text("not a trace\n")
    assert [p.name for p in resolve_trace_paths(tmp_path / "run")] == ["a.jsonl", "b.jsonl.gz"]
    assert_merged_shards(load_traces(tmp_path / "run"))


def test_mooncake_shards_share_the_relative_clock(tmp_path: Path) -> None:
    """Mooncake shards are merged on their raw timestamps (one trace zero), not each from its own first request."""
    write_jsonl(tmp_path / "m1.jsonl", [{"timestamp": 10_000, "input_length": 1, "output_length": 1}])
    write_jsonl(tmp_path / "m2.jsonl", [{"timestamp": 4_000, "input_length": 2, "output_length": 2}])
    trace = load_traces(tmp_path)
    np.testing.assert_array_equal(trace.arrival_s, [0.0, 6.0])
    np.testing.assert_array_equal(trace.isl, [2, 1])
    assert trace.clock_offset_s == 4.0


def test_a_single_file_spec_equals_load_trace(tmp_path: Path) -> None:
    """`load_traces(file)` is `load_trace(file)`, source included."""
    path = write_jsonl(tmp_path / "d.jsonl", V1_RECORDS)
    single, spec = load_trace(path), load_traces(str(path))
    np.testing.assert_array_equal(single.arrival_s, spec.arrival_s)
    assert single.source == spec.source == str(path)


def test_glob_over_the_two_azure_traces_merges_by_wall_clock() -> None:
    """The Azure code and conv traces (same afternoon) merge into one trace starting at the earlier first request."""
    code = load_trace(TRACES_DIR / "AzureLLMInferenceTrace_code.csv")
    conv = load_trace(TRACES_DIR / "AzureLLMInferenceTrace_conv.csv")
    both = load_traces(str(TRACES_DIR / "AzureLLMInferenceTrace_*.csv"))
    assert both.num_requests == code.num_requests + conv.num_requests
    assert both.start_epoch_s == pytest.approx(min(code.start_epoch_s, conv.start_epoch_s), abs=1e-6)
    assert np.all(np.diff(both.arrival_s) >= 0)
    assert sorted(both.isl.tolist()) == sorted(code.isl.tolist() + conv.isl.tolist())


@pytest.mark.parametrize(
    ("files", "spec", "fragments"),
    [
        pytest.param({}, "missing.jsonl", ["no such file or directory"], id="missing"),
        pytest.param({"a.jsonl": V1_RECORDS}, "*.csv", ["no trace files matched"], id="glob-matches-nothing"),
        pytest.param({"notes.txt": []}, ".", ["no trace files matched"], id="folder-without-traces"),
        pytest.param(
            {"t.jsonl": V1_RECORDS, "t.jsonl.gz": V1_RECORDS}, ".", ["same shard", "t.jsonl"], id="plain-and-gz-copy"
        ),
        pytest.param(
            {"a.jsonl": V1_RECORDS, "b.jsonl": MOONCAKE_RECORDS}, ".", ["b.jsonl", "mooncake", "one format"], id="mixed"
        ),
    ],
)
def test_bad_trace_sets_raise_one_line_errors(tmp_path: Path, files: dict, spec: str, fragments: list[str]) -> None:
    """Specs matching nothing, the same shard twice, or two formats raise a one-line TraceError."""
    for name, records in files.items():
        write_jsonl(tmp_path / name, records, gz=name.endswith(".gz"))
    with pytest.raises(TraceError) as caught:
        load_traces(str(tmp_path / spec) if spec != "." else tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


# ---------------------------------------------------------------------------------------------------------
# Bad lines: one line naming the file, the line and the field
# ---------------------------------------------------------------------------------------------------------

GOOD = json.dumps(v1_record(T0_MS, 64, 4))


def v1_line(**changes) -> str:
    """A request_end record with dotted-path fields replaced (value None deletes the field)."""
    record = v1_record(T0_MS + 1, 64, 4)
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        target = record
        for parent in parents:
            target = target[parent]
        if value is None:
            del target[key]
        else:
            target[key] = value
    return json.dumps(record)


BAD_LINES = [
    pytest.param(v1_line(request__request_received_ms=None), 2, "request.request_received_ms", id="no-arrival"),
    pytest.param(v1_line(request__request_received_ms="soon"), 2, "request.request_received_ms", id="arrival-text"),
    pytest.param(v1_line(request__replay__input_length=-3), 2, "request.replay.input_length", id="negative-isl"),
    pytest.param(v1_line(request__replay__input_length=True), 2, "request.replay.input_length", id="bool-isl"),
    pytest.param(v1_line(request__output_tokens=4.5), 2, "request.output_tokens", id="fractional-osl"),
    pytest.param(v1_line(request__output_tokens=None), 2, "request.output_tokens", id="no-osl"),
    pytest.param(v1_line(request__replay=None), 2, "request.replay", id="no-replay"),
    pytest.param(v1_line(request__replay=[1]), 2, "request.replay", id="replay-not-object"),
    pytest.param(v1_line(request=None), 2, "request", id="no-request"),
    pytest.param(v1_line(schema="dynamo.request.trace.v2"), 2, "schema", id="other-schema"),
    pytest.param(json.dumps(MOONCAKE_RECORDS[0]), 2, "schema", id="mooncake-row-in-dynamo-file"),
    pytest.param('{"schema": "dynamo.request.trace.v1", "event_type": ', 2, "JSONDecodeError", id="bad-json"),
]


@pytest.mark.parametrize(("second_line", "line_no", "field"), BAD_LINES)
@pytest.mark.parametrize("gz", [False, True], ids=["jsonl", "jsonl.gz"])
def test_bad_dynamo_line_raises_one_line_error(
    tmp_path: Path, second_line: str, line_no: int, field: str, gz: bool
) -> None:
    """A bad record after a good one: TraceError `<file>: line N field '<dotted path>' ...`, on one line."""
    path = tmp_path / ("t.jsonl.gz" if gz else "t.jsonl")
    text = f"{GOOD}\n{second_line}\n"
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    with pytest.raises(TraceError) as caught:
        load_traces(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: line {line_no}")
    assert field in message


def test_blank_lines_count_in_line_numbers(tmp_path: Path) -> None:
    """Line numbers are the file's: blank lines are skipped but counted."""
    path = tmp_path / "t.jsonl"
    path.write_text(f"{GOOD}\n\n\n{v1_line(request__output_tokens=-1)}\n")
    with pytest.raises(TraceError, match=r": line 4 field 'request.output_tokens' = -1 is not an integer >= 0"):
        load_trace(path)


def test_dynamo_record_in_a_mooncake_file_is_refused(tmp_path: Path) -> None:
    """A file sniffed as Mooncake that later holds a Dynamo record names the line and the `schema` field."""
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(MOONCAKE_RECORDS[0]) + "\n" + GOOD + "\n")
    with pytest.raises(TraceError, match=r"m\.jsonl: line 2 field 'schema'"):
        load_trace(path)


def test_only_tool_events_means_no_requests(tmp_path: Path) -> None:
    """A v1 file without request_end events holds no requests."""
    path = write_jsonl(tmp_path / "tools.jsonl", [tool_end(T0_MS), tool_end(T0_MS + 5)])
    with pytest.raises(TraceError, match="no requests"):
        load_trace(path)


def test_corrupt_gzip_raises_one_line_error(tmp_path: Path) -> None:
    """A truncated or non-gzip .jsonl.gz raises TraceError naming the file, not an OSError traceback."""
    path = tmp_path / "broken.jsonl.gz"
    path.write_bytes(gzip.compress(((GOOD + "\n") * 50).encode())[:40])
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}: line ")
    assert "\n" not in str(caught.value)
