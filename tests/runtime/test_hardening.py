"""Bounded input and clean failure (issue 21): config and trace limits, one-line errors, nothing half-written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from planner_core.config import MAX_CONFIG_DEPTH, MAX_REPLICAS, ConfigError, load_config, parse_config
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.traces import MAX_REQUEST_TOKENS, MAX_TRACE_SPAN_S, TraceError, load_trace
from tests.conftest import REPO_ROOT, write_config


def planner(*args: str, env: dict[str, str] | None = None, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


# ---------------------------------------------------------------------------------------------------------
# Config: sane maxima, floors against the budget, no booleans or text taken for numbers
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field", "fragment"),
    [
        ({"min_endpoint": 2**40}, "min_endpoint", f"must be <= {MAX_REPLICAS}"),
        ({"min_endpoint": 1_000_000, "max_gpu_budget": -1}, "min_endpoint", f"must be <= {MAX_REPLICAS}"),
        ({"min_endpoint": 5}, "min_endpoint", "need 10 GPUs > max_gpu_budget (8)"),
        ({"decode_min_endpoint": 3, "decode_engine_num_gpu": 4}, "decode_min_endpoint", "need 13 GPUs"),
        ({"mode": "agg", "min_endpoint": 3, "decode_engine_num_gpu": 4}, "min_endpoint", "need 12 GPUs"),
        ({"max_gpu_budget": 2**40}, "max_gpu_budget", "must be <="),
        ({"max_throughput_scaling_replicas": 10**9}, "max_throughput_scaling_replicas", "must be <="),
        ({"itl_ms": True}, "itl_ms", "must be a number"),
        ({"ttft": "500"}, "ttft_ms", "must be a number"),
        ({"ttft_ms": 1e308}, "ttft_ms", "must be <="),
        ({"min_endpoint": False}, "min_endpoint", "must be an integer"),
        ({"max_num_fpm_samples": 10**12}, "max_num_fpm_samples", "must be <="),
        ({"scheduling": {"tick_max_duration_seconds": 1e300}}, "scheduling.tick_max_duration_seconds", "must be <="),
        ({"execution_interval_seconds": True}, "execution_interval_seconds", "must be a number"),
    ],
    ids=lambda v: str(v)[:40] if isinstance(v, dict) else None,
)
def test_config_values_are_bounded_and_typed(data: dict, field: str, fragment: str) -> None:
    """Each bad value is one line naming the source, the field, the value and the bound."""
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "bad.yaml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("bad.yaml: field ")
    assert caught.value.field == field
    assert fragment in message


@pytest.mark.parametrize(
    "data",
    [
        {"min_endpoint": 4},  # 4P + 4D = 8 GPUs: exactly the default budget
        {"min_endpoint": MAX_REPLICAS, "max_gpu_budget": -1},
        {"load_adjustment_interval_seconds": 60.0, "throughput_adjustment_interval_seconds": 180},  # whole floats
        {"mode": "prefill", "prefill_min_endpoint": 8},  # only the managed pool counts
        {"ttft_ms": 500},  # an integer is a number
    ],
)
def test_config_values_at_the_bounds_load(data: dict) -> None:
    parse_config(data, "ok.yaml")


def test_deep_or_aliased_configs_are_one_line(tmp_path: Path) -> None:
    """Nesting that exhausts the parser's stack, and an alias bomb that validation would expand, are refused."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("plugins: {settings: {x: " + "[" * 5000 + "]" * 5000 + "}}\n")
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_CONFIG_DEPTH}"):
        load_config(deep)
    lines = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for name, previous in zip("bcdefg", "abcdef", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="more than"):
        load_config(bomb)


def test_demo_with_a_floor_over_the_budget_writes_nothing(database_url: str, tmp_path: Path) -> None:
    """Floors the budget cannot hold are a config error before anything is written (no `deployments` row)."""
    config = write_config(tmp_path, min_endpoint=9)  # 9P + 9D = 18 GPUs > max_gpu_budget 16
    result = planner(
        "demo", "--config", str(config), "--deployment", "floors", "--max-windows", "1",
        env={"PLANNER_DATABASE_URL": database_url},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("planner: error:")]
    assert errors == [
        f"planner: error: {config}: field 'min_endpoint' = 9: the minimum endpoints need 18 GPUs > max_gpu_budget (16)"
    ]
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM deployments")]
    assert "floors" not in names


# ---------------------------------------------------------------------------------------------------------
# Traces: token counts and timestamps bounded
# ---------------------------------------------------------------------------------------------------------


def _mooncake(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"timestamp": 0, "input_length": 1e308, "output_length": 10}, "field 'input_length' = 1e+308 is over"),
        ({"timestamp": 0, "input_length": 10, "output_length": MAX_REQUEST_TOKENS + 1}, "field 'output_length'"),
        ({"timestamp": 1e308, "input_length": 10, "output_length": 10}, "field 'timestamp' = 1e+308 is over"),
        # issue 43: `true` was a 1-token request, "7" seven tokens
        ({"timestamp": 0, "input_length": True, "output_length": 10}, "field 'input_length' = true is not a number"),
        ({"timestamp": 0, "input_length": 10, "output_length": "7"}, "field 'output_length' = \"7\" is not a number"),
        ({"timestamp": None, "input_length": 10, "output_length": 7}, "field 'timestamp' = null is not a number"),
        ({"input_length": 10, "output_length": 7}, "field 'timestamp' is missing"),
    ],
)
def test_mooncake_values_are_bounded(tmp_path: Path, record: dict, fragment: str) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 5}, record])
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}: line 2 ")
    assert fragment in str(caught.value)


def _dynamo(received_ms: float, input_length: float, output_tokens: float) -> dict:
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": "request_end",
        "request": {
            "request_received_ms": received_ms,
            "output_tokens": output_tokens,
            "replay": {"input_length": input_length},
        },
    }


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        (_dynamo(1e308, 10, 10), "field 'request.request_received_ms' = 1e+308 is over"),
        (_dynamo(1_700_000_000_000, 10**300, 10), "field 'request.replay.input_length'"),
        (_dynamo(1_700_000_000_000 + MAX_TRACE_SPAN_S * 1000 + 1000, 10, 10), "a trace may span at most"),
    ],
)
def test_dynamo_values_are_bounded(tmp_path: Path, record: dict, fragment: str) -> None:
    path = _mooncake(tmp_path / "t.jsonl", [_dynamo(1_700_000_000_000, 5, 5), record])
    with pytest.raises(TraceError, match=re.escape(fragment)):
        load_trace(path)


def test_azure_values_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,10,10\n2024-05-10 00:00:01,1e308,10\n"
    )
    with pytest.raises(TraceError, match=r"row 3 field 'ContextTokens' = 1e\+308 is over 10000000 tokens"):
        load_trace(path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1970-01-01 00:00:00,10,10\n2024-05-10 00:00:01,1,1\n")
    with pytest.raises(TraceError, match="row 3 arrives .* a trace may span at most"):
        load_trace(path)


def test_azure_whole_second_timestamps_keep_their_duration(tmp_path: Path) -> None:
    """pandas parses whole-second stamps at microsecond resolution; the trace must still span 1 s, not 1 ms."""
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,10,10\n2024-05-10 00:00:01,1,1\n")
    trace = load_trace(path)
    assert trace.duration_s == 1.0
    assert trace.start_epoch_s == 1_715_299_200.0
