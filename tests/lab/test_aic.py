"""`planner perf-table` (aiconfigurator in a worker process) and the agreement script's row mapping.

Only two tests run aiconfigurator itself (skipped where it is not installed: `pip install '.[aic]'`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from planner_core.lab.aic import PerfTableSpec, parse_grid
from planner_core.lab.aic_agreement import DEFAULT_PROFILE, DEFAULT_TABLE, estimate_call, table_vs_profile
from planner_core.perf.table import load_perf_table
from tests.conftest import REPO_ROOT

HAS_AIC = importlib.util.find_spec("aiconfigurator") is not None
needs_aic = pytest.mark.skipif(
    not HAS_AIC, reason="aiconfigurator not installed: run `make venv` (it installs the aic extra)"
)

TINY = ("--isl-grid", "256,1024", "--prefill-batch-grid", "1", "--batch-grid", "1,8", "--ctx-grid", "512,2048")
LLAMA = ("--model", "nvidia/Llama-3.1-8B-Instruct-FP8", "--aic-model", "meta-llama/Meta-Llama-3.1-8B")


def planner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("planner: error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------------------
# Grid and calls (pure)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1024,128, 512", (128, 512, 1024)), ("8,8,1", (1, 8)), ("4096", (4096,))],
)
def test_parse_grid_sorts_and_deduplicates(text: str, expected: tuple[int, ...]) -> None:
    assert parse_grid("--isl-grid", text) == expected


@pytest.mark.parametrize("text", ["", "1,,2", "0,4", "-8", "1.5", "x"])
def test_parse_grid_rejects_non_positive_whole_numbers(text: str) -> None:
    with pytest.raises(ValueError, match=r"^--ctx-grid '.*': '.*' is not a positive whole number$"):
        parse_grid("--ctx-grid", text)


def test_grid_points_map_to_static_aiconfigurator_modes() -> None:
    spec = PerfTableSpec(
        model="nvidia/Llama-3.1-8B-Instruct-FP8",
        aic_model="meta-llama/Meta-Llama-3.1-8B",
        system="h200_sxm",
        backend="vllm",
        tp=2,
        gemm_quant="fp8",
        isl_grid=(256, 1024),
        prefill_batch_grid=(1, 4),
        decode_batch_grid=(8,),
        ctx_grid=(512,),
    )
    calls = spec.calls()
    assert [label for label, _ in calls] == [
        "prefill batch=1 isl=256",
        "prefill batch=1 isl=1024",
        "prefill batch=4 isl=256",
        "prefill batch=4 isl=1024",
        "decode batch=8 ctx=512",
    ]
    common = {
        "model_path": "meta-llama/Meta-Llama-3.1-8B",
        "system_name": "h200_sxm",
        "backend_name": "vllm",
        "backend_version": None,
        "database_mode": "SILICON",
        "tp_size": 2,
        "gemm_quant_mode": "fp8",
    }
    # prefill: one context iteration (osl 1); decode: one generation step at context = isl (osl 2)
    assert calls[2][1] == {**common, "mode": "static_ctx", "batch_size": 4, "isl": 256, "osl": 1}
    assert calls[4][1] == {**common, "mode": "static_gen", "batch_size": 8, "isl": 512, "osl": 2}


# ---------------------------------------------------------------------------------------------------------
# The command: errors before anything runs, and one real run on a tiny grid
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (("--isl-grid", "128,abc"), "--isl-grid '128,abc': 'abc' is not a positive whole number"),
        (("--prefill-batch-grid", "2,4"), "--prefill-batch-grid (2, 4): must start at 1"),
        (("--tp", "0"), "argument --tp: 0 is not in [1, 1024]"),
        (("--aic-python", "/nonexistent/python"), "--aic-python /nonexistent/python: not an executable file"),
    ],
    ids=["bad-grid", "prefill-batch-without-1", "tp-0", "missing-interpreter"],
)
def test_perf_table_bad_input_fails_in_one_line_and_writes_nothing(
    tmp_path: Path, extra: tuple[str, ...], fragment: str
) -> None:
    out = tmp_path / "table.json"
    result = planner("perf-table", *LLAMA, "--system", "h200_sxm", *extra, "--out", str(out))
    assert fragment in _one_error_line(result)
    assert not out.exists()


def test_interpreter_without_aiconfigurator_is_a_one_line_error_with_the_install_hint(tmp_path: Path) -> None:
    bare = tmp_path / "bare-venv"
    venv.create(bare, with_pip=False)  # an interpreter with nothing installed
    out = tmp_path / "table.json"
    result = planner(
        "perf-table",
        *LLAMA,
        "--system",
        "h200_sxm",
        *TINY,
        "--aic-python",
        str(bare / "bin" / "python"),
        "--out",
        str(out),
    )
    line = _one_error_line(result)
    assert "cannot import aiconfigurator" in line
    assert "pip install 'llm-planner[aic]'" in line
    assert not out.exists()


@needs_aic
def test_perf_table_on_a_tiny_grid(tmp_path: Path) -> None:
    out = tmp_path / "tables" / "tiny.json"
    out.parent.mkdir()  # a missing output folder is refused before the estimates (`check_output_path`)
    result = planner(
        "perf-table",
        *LLAMA,
        "--gemm-quant",
        "fp8",
        "--system",
        "h200_sxm",
        "--backend",
        "vllm",
        *TINY,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "6 points from aiconfigurator" in result.stdout
    table = load_perf_table(out)
    header = table.header
    assert (header.model, header.aic_model, header.system, header.backend, header.tp) == (
        "nvidia/Llama-3.1-8B-Instruct-FP8",
        "meta-llama/Meta-Llama-3.1-8B",
        "h200_sxm",
        "vllm",
        1,
    )
    assert dict(header.precision)["gemm"] == "fp8"
    assert header.command is not None and "--isl-grid 256,1024" in header.command
    # The same points as the committed default-grid table (same aiconfigurator, database and model).
    committed = load_perf_table(DEFAULT_TABLE)
    if header.aiconfigurator_version == committed.header.aiconfigurator_version:
        assert table.prefill_ms[0][1] == pytest.approx(committed.prefill_ms[0][3], rel=1e-6)  # batch 1, ISL 1024
        assert table.decode_ms[1][1] == pytest.approx(committed.decode_ms[3][4], rel=1e-6)  # batch 8, ctx 2048
    assert table.prefill_ms[0][0] < table.prefill_ms[0][1]


@needs_aic
def test_aiconfigurator_failure_names_the_grid_point(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    result = planner("perf-table", *LLAMA, "--system", "no_such_gpu", *TINY, "--out", str(out))
    line = _one_error_line(result)
    assert "aiconfigurator failed at prefill batch=1 isl=256 for meta-llama/Meta-Llama-3.1-8B" in line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# Agreement script: row mapping and the profile comparison (no aiconfigurator)
# ---------------------------------------------------------------------------------------------------------

_AGG_ROW = {
    "model_path": "nvidia/Llama-3.1-8B-Instruct-FP8",
    "system": "h200_sxm",
    "backend": "vllm",
    "mode": "agg",
    "isl": "4000",
    "osl": "500",
    "gemm_quant_mode": "fp8",
    "moe_quant_mode": "",
    "batch_size": "96.0",
    "tp_size": "1.0",
    "pp_size": "1.0",
    "attention_dp_size": "1.0",
    "moe_tp_size": "0.0",
    "moe_ep_size": "",
}


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (
            _AGG_ROW,
            {
                "model_path": "meta-llama/Meta-Llama-3.1-8B",  # alias: no offline config for the FP8 checkpoint
                "system_name": "h200_sxm",
                "backend_name": "vllm",
                "mode": "agg",
                "isl": 4000,
                "osl": 500,
                "gemm_quant_mode": "fp8",
                "batch_size": 96,
                "tp_size": 1,
                "pp_size": 1,
                "attention_dp_size": 1,  # moe_tp_size 0 and an empty moe_ep_size are "not set"
            },
        ),
        ({**_AGG_ROW, "batch_size": ""}, None),  # no batch size: not estimable
        ({**_AGG_ROW, "mode": "disagg"}, None),  # disagg without the pools' batch and worker counts
    ],
    ids=["agg", "agg-without-batch", "disagg-incomplete"],
)
def test_silicon_row_to_estimate_call(row: dict[str, str], expected: dict | None) -> None:
    assert estimate_call(row) == expected


def test_table_vs_profile_uses_every_profile_point() -> None:
    report = table_vs_profile(DEFAULT_TABLE, DEFAULT_PROFILE)
    assert len(report["prefill"]) == 17 and len(report["decode"]) == 41
    # first decode sample: kv usage 0.0974044183 x 945029 = 92051 tokens at context 350 -> batch 263
    assert report["decode"][1]["batch"] == 263
    assert [summary.num_points for summary in report["summaries"]] == [17, 17, 41]
