"""Tests of `planner_core.perf.table` (perf tables read as a `ForwardPassModel`) and of writing them.

Pure: none of these needs aiconfigurator; they read hand-made tables and the committed H200 table.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.data import H200_PERF_TABLE
from planner_core.lab.aic import perf_table_text, write_perf_table
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.table import (
    PERF_TABLE_FORMAT,
    PerfTable,
    PerfTableError,
    TablePerfModel,
    load_perf_table,
    monotone_envelope,
    parse_perf_table,
)

COMMITTED_TABLE = H200_PERF_TABLE


def small_table_body() -> dict[str, Any]:
    """A hand-made table whose values follow power laws, so log-log interpolation is exact between points.

    prefill batch 1: 10 ms at 100 tokens, 40 ms at 400 (time proportional to tokens);
    decode: 2 ms (batch 1, ctx 100), 8 ms (batch 1, ctx 10000), 4 ms (batch 4, ctx 100), 32 ms (batch 4, ctx 10000).
    """
    return {
        "format": PERF_TABLE_FORMAT,
        "header": {
            "model": "org/model",
            "system": "h200_sxm",
            "backend": "vllm",
            "backend_version": "0.24.0",
            "tp": 1,
            "precision": {"gemm": "fp8", "kvcache": "bfloat16"},
            "aiconfigurator_version": "0.12.0",
        },
        "grid": {"isl": [100, 400], "prefill_batch": [1, 2], "decode_batch": [1, 4], "decode_ctx": [100, 10000]},
        "prefill_ms": [[10.0, 40.0], [19.0, 79.0]],
        "decode_ms": [[2.0, 8.0], [4.0, 32.0]],
        "decode_fits_memory": [[True, True], [True, False]],
    }


@pytest.fixture
def small_model() -> TablePerfModel:
    return TablePerfModel(parse_perf_table(small_table_body(), "small.json"))


# ---------------------------------------------------------------------------------------------------------
# Round trip and the committed table
# ---------------------------------------------------------------------------------------------------------


def test_round_trip_through_file(tmp_path: Path) -> None:
    table = parse_perf_table(small_table_body(), "small.json")
    path = tmp_path / "tables" / "small.json"
    write_perf_table(table, path)
    assert load_perf_table(path) == table
    assert parse_perf_table(table.to_json_dict()) == table
    assert json.loads(path.read_text()) == table.to_json_dict()
    assert [child.name for child in path.parent.iterdir()] == ["small.json"]  # no temporary file left behind
    assert dict(table.header.precision) == {"gemm": "fp8", "kvcache": "bfloat16"}
    assert table.num_points == 2 * 2 + 2 * 2


def test_write_failure_names_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"--out .*not-a-folder/t\.json: cannot write") as info:
        write_perf_table(parse_perf_table(small_table_body()), blocker / "t.json")
    assert "\n" not in str(info.value)
    assert blocker.read_text() == "x"


def test_committed_h200_table_loads_and_describes_the_h200_profile_model() -> None:
    table = load_perf_table(COMMITTED_TABLE)
    header = table.header
    assert (header.model, header.system, header.backend, header.tp) == (
        "nvidia/Llama-3.1-8B-Instruct-FP8",
        "h200_sxm",
        "vllm",
        1,
    )
    assert dict(header.precision)["gemm"] == "fp8"
    assert 50 <= table.num_points <= 150
    assert perf_table_text(table) == COMMITTED_TABLE.read_text()  # written by perf_table_text, unchanged since
    model: ForwardPassModel = TablePerfModel(table)
    assert model.is_ready()
    # Longer prompts and longer contexts cost more on this table (aiconfigurator's H200 kernels).
    assert model.prefill_wall_s(1024) < model.prefill_wall_s(4096) < model.prefill_wall_s(16384)
    assert model.decode_wall_s(64, 64 * 1024) < model.decode_wall_s(64, 64 * 8192)


# ---------------------------------------------------------------------------------------------------------
# Interpolation
# ---------------------------------------------------------------------------------------------------------


def test_grid_points_are_reproduced_exactly_where_the_table_is_monotone() -> None:
    table = load_perf_table(COMMITTED_TABLE)
    model = TablePerfModel(table)
    for isl, ms in zip(table.isl, table.prefill_ms[0], strict=True):
        assert model.prefill_wall_s(isl) * 1000 == pytest.approx(ms, rel=1e-12)
    envelope = monotone_envelope(table.decode_ms)
    num_lifted = 0
    for i, (batch, row) in enumerate(zip(table.decode_batch, table.decode_ms, strict=True)):
        for j, (ctx, ms) in enumerate(zip(table.decode_ctx, row, strict=True)):
            assert model.decode_wall_s(batch, batch * ctx) * 1000 == pytest.approx(envelope[i][j], rel=1e-12)
            if envelope[i][j] != ms:
                num_lifted += 1
                assert ms < envelope[i][j] <= ms * 1.025  # aiconfigurator's dips are small
    assert num_lifted == 11  # the figure the module docstring quotes


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([[1.0, 2.0], [3.0, 4.0]], ((1.0, 2.0), (3.0, 4.0))),  # already monotone: unchanged
        ([[2.0, 1.0], [1.0, 5.0]], ((2.0, 2.0), (2.0, 5.0))),  # dips lifted along the row, then the column
        ([[3.0, 3.5], [2.9, 3.0], [4.0, 3.9]], ((3.0, 3.5), (3.0, 3.5), (4.0, 4.0))),
    ],
)
def test_monotone_envelope(values: list[list[float]], expected: tuple) -> None:
    assert monotone_envelope(values) == expected


@pytest.mark.parametrize(
    ("query", "expected_ms"),
    [
        # prefill: log-log line through (100, 10 ms) and (400, 40 ms) is t = 0.1 ms x tokens
        (("prefill", 200), 20.0),
        (("prefill", 300), 30.0),
        (("prefill", 50), 10.0),  # clamped to the smallest ISL
        (("prefill", 1000), 40.0),  # clamped to the largest ISL
        (("prefill", 0), 0.0),  # no tokens, no iteration
        # decode at the middle of both log axes (batch 2, ctx 1000): geometric mean of the corners,
        # (2 x 8 x 4 x 32)^(1/4) = 2048^(1/4) = 6.7272 ms
        (("decode", 2, 2000), 2048**0.25),
        # batch 1, ctx 1000 (middle of the ctx axis): sqrt(2 x 8) = 4 ms
        (("decode", 1, 1000), 4.0),
        # batch 4, context 0 tokens per sequence: clamped to ctx 100 -> 4 ms
        (("decode", 4, 0), 4.0),
        # batch 8 (above the grid) and ctx 20000 (above): clamped to the corner (4, 10000) -> 32 ms
        (("decode", 8, 8 * 20000), 32.0),
        (("decode", 0, 0), 0.0),  # no requests, no step
        # mixed: prefill(100 + 1) = 10.1 ms, plus decode attention 8 - 2 = 6 ms (batch 1, ctx 10000 over ctx 100)
        (("mixed", 100, 1, 10000), 16.1),
        (("mixed", 0, 1, 10000), 8.0),  # no prefill: exactly the decode step
        (("mixed", 200, 0, 0), 20.0),  # no decode: exactly the prefill iteration
    ],
)
def test_interpolation_worked_examples(small_model: TablePerfModel, query: tuple, expected_ms: float) -> None:
    kind, *args = query
    wall_s = {"prefill": small_model.prefill_wall_s, "decode": small_model.decode_wall_s}.get(
        kind, small_model.mixed_wall_s
    )(*args)
    assert wall_s * 1000 == pytest.approx(expected_ms, rel=1e-9)


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.prefill_wall_s(-1),
        lambda m: m.prefill_wall_s(math.nan),
        lambda m: m.decode_wall_s(math.inf, 10),
        lambda m: m.decode_wall_s(2, -5),
        lambda m: m.mixed_wall_s(10, -1, 0),
    ],
    ids=["negative-tokens", "nan-tokens", "inf-requests", "negative-kv", "negative-requests"],
)
def test_bad_queries_raise(small_model: TablePerfModel, call) -> None:
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        call(small_model)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.floats(1, 100_000),
    more=st.floats(0, 100_000),
    batch=st.floats(0.5, 4000),
    more_batch=st.floats(0, 4000),
    ctx=st.floats(0, 50_000),
    more_ctx=st.floats(0, 50_000),
)
def test_never_faster_with_more_work_on_the_committed_table(
    tokens: float, more: float, batch: float, more_batch: float, ctx: float, more_ctx: float
) -> None:
    """The interpolant never drops when a query grows (the model interpolates the table's monotone envelope), up
    to floating-point rounding: two interpolation paths to equal values may differ in the last bits."""
    model = _committed_model()

    def not_less(larger_query_s: float, smaller_query_s: float) -> bool:
        return larger_query_s >= smaller_query_s * (1.0 - 1e-12)

    assert not_less(model.prefill_wall_s(tokens + more), model.prefill_wall_s(tokens))
    assert not_less(model.decode_wall_s(batch, batch * (ctx + more_ctx)), model.decode_wall_s(batch, batch * ctx))
    more_requests = batch + more_batch
    assert not_less(model.decode_wall_s(more_requests, more_requests * ctx), model.decode_wall_s(batch, batch * ctx))
    assert not_less(
        model.mixed_wall_s(tokens + more, batch, batch * ctx), model.mixed_wall_s(tokens, batch, batch * ctx)
    )


def _committed_model() -> TablePerfModel:
    return _load_committed()


@functools.cache
def _load_committed() -> TablePerfModel:
    return TablePerfModel(load_perf_table(COMMITTED_TABLE))


def test_single_point_axes_are_constant() -> None:
    body = small_table_body()
    body["grid"] = {"isl": [512], "prefill_batch": [1], "decode_batch": [8], "decode_ctx": [1024]}
    body["prefill_ms"], body["decode_ms"], body["decode_fits_memory"] = [[12.0]], [[5.0]], [[True]]
    model = TablePerfModel(parse_perf_table(body))
    assert model.prefill_wall_s(10) == model.prefill_wall_s(100_000) == pytest.approx(0.012)
    assert model.decode_wall_s(1, 10) == model.decode_wall_s(100, 1e7) == pytest.approx(0.005)


def test_model_is_a_frozen_value() -> None:
    table = parse_perf_table(small_table_body())
    assert TablePerfModel(table) == TablePerfModel(table)
    assert hash(TablePerfModel(table)) == hash(TablePerfModel(table))
    with pytest.raises(AttributeError):
        TablePerfModel(table).table = table  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------------------
# Malformed tables: one line naming the file, the field and the value
# ---------------------------------------------------------------------------------------------------------


def _set(path: str, value: Any):
    def edit(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = body
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if value is _DELETE:
            del target[last]
        elif isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return edit


_DELETE = object()


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (_set("format", "planner-perf-table/v9"), ["field 'format' = 'planner-perf-table/v9'", "must be"]),
        (_set("header.tp", 0), ["field 'header.tp' = 0", "whole number >= 1"]),
        (_set("header.tp", True), ["field 'header.tp' = True"]),
        (_set("header.model", ""), ["field 'header.model' = ''", "non-empty string"]),
        (_set("header.backend", _DELETE), ["field 'header.backend'", "missing"]),
        (_set("header.precision", {"gemm": 8}), ["field 'header.precision'", "object of strings"]),
        (_set("grid.isl", [400, 100]), ["field 'grid.isl[1]' = 100", "strictly increasing"]),
        (_set("grid.decode_ctx", []), ["field 'grid.decode_ctx' = []", "non-empty list"]),
        (_set("grid.prefill_batch", [2, 4]), ["field 'grid.prefill_batch[0]' = 2", "must be 1"]),
        (_set("grid.decode_batch", [1, "4"]), ["field 'grid.decode_batch[1]' = '4'", "finite number > 0"]),
        (_set("prefill_ms.0.1", -40.0), ["field 'prefill_ms[0][1]' = -40.0", "finite number > 0"]),
        (_set("decode_ms.1.0", None), ["field 'decode_ms[1][0]' = None"]),
        (_set("decode_ms.1", [4.0]), ["field 'decode_ms[1]'", "2 values (one per decode_ctx), got 1"]),
        (_set("prefill_ms", [[10.0, 40.0]]), ["field 'prefill_ms'", "2 rows (one per prefill_batch), got 1"]),
        (_set("decode_fits_memory.0.0", 1), ["field 'decode_fits_memory[0][0]' = 1", "true or false"]),
        (_set("decode_ms", _DELETE), ["field 'decode_ms'", "missing"]),
    ],
)
def test_malformed_table_raises_one_line_error(tmp_path: Path, edit, fragments: list[str]) -> None:
    body = copy.deepcopy(small_table_body())
    edit(body)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(PerfTableError) as info:
        load_perf_table(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    for fragment in fragments:
        assert fragment in message


def test_nan_in_json_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(small_table_body()).replace("19.0", "NaN"))
    with pytest.raises(PerfTableError, match=r"field 'prefill_ms\[1\]\[0\]' = nan: must be a finite number > 0"):
        load_perf_table(path)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(None, "unreadable (No such file or directory)"), ("{not json", "invalid JSON"), ("[1, 2]", "got list")],
    ids=["missing", "not-json", "not-an-object"],
)
def test_unreadable_table_raises_one_line_error(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "table.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(PerfTableError) as info:
        load_perf_table(path)
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_table_dataclass_is_frozen() -> None:
    table = parse_perf_table(small_table_body())
    assert isinstance(table, PerfTable)
    with pytest.raises(AttributeError):
        table.isl = (1.0,)  # type: ignore[misc]
