"""The `planner` command line: one-line errors, nothing written on bad input, database URL."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from planner_core.runtime.store.db import to_libpq_uri
from tests.conftest import REPO_ROOT, write_config


def planner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "planner_cli.main", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("planner: error:")]


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"ttft_ms": -5}, ["field 'ttft_ms'", "-5", "must be > 0"]),
        ({"mode": "foo"}, ["field 'mode'", "'foo'", "disagg, prefill, decode, agg"]),
        ({"profile_results_dir": "/nonexistent/profile"}, ["/nonexistent/profile"]),
    ],
    ids=["negative-ttft", "unknown-mode", "missing-profile"],
)
def test_bad_config_fails_in_one_line_and_writes_nothing(database_url, tmp_path, overrides, fragments) -> None:
    """A bad config exits 2 with one line naming the file, field and value, and records nothing."""
    config = write_config(tmp_path, **overrides)
    result = planner("demo", "--config", str(config), env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 2
    [line] = _error_lines(result)
    for fragment in fragments:
        assert fragment in line
    if "profile" not in fragments[0]:
        assert str(config) in line
    with psycopg.connect(to_libpq_uri(database_url)) as conn:
        assert conn.execute("SELECT count(*) FROM ticks").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone()[0] == 0


def test_missing_trace_fails_in_one_line(tmp_path) -> None:
    """A trace that does not exist is named in a one-line error."""
    result = planner("demo", "--trace", str(tmp_path / "nope.csv"))
    assert result.returncode == 2
    assert _error_lines(result) == [f"planner: error: {tmp_path / 'nope.csv'}: no such file"]


def test_db_url_prints_the_configured_database(database_url) -> None:
    """`planner db url` prints the SQLAlchemy URL on stdout and a psql command on stderr."""
    result = planner("db", "url", env={"PLANNER_DATABASE_URL": database_url})
    assert result.returncode == 0
    assert result.stdout.strip() == database_url
    assert f'psql "{to_libpq_uri(database_url)}"' in result.stderr


def test_capacity_json_agrees_with_dynamo_documented_figures(profile_dir) -> None:
    """H200 at ISL 3000 / OSL 300 under 200 ms / 10 ms: ~49.5k prefill and ~4.6k decode tokens/s/GPU (Dynamo's doc)."""
    import json

    result = planner(
        "capacity", "--profile", str(profile_dir), "--isl", "3000", "--osl", "300", "--ttft-ms", "200",
        "--itl-ms", "10", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert set(figures) == {
        "prefill_tokens_per_s_per_gpu",
        "prefill_ttft_ms",
        "decode_tokens_per_s_per_gpu",
        "decode_itl_ms",
        "requests_per_s_per_gpu",
        "feasible",
        "unreachable",
    }
    assert figures["feasible"] is True and figures["unreachable"] == []
    assert figures["prefill_tokens_per_s_per_gpu"] == pytest.approx(49_500, rel=0.01)
    assert figures["prefill_ttft_ms"] == pytest.approx(60, rel=0.02)
    assert figures["decode_tokens_per_s_per_gpu"] == pytest.approx(4_600, rel=0.02)
    assert figures["decode_itl_ms"] == pytest.approx(9.7, rel=0.01)
    # 4,556 / 300 = 15.19 requests/s: decode is the slower phase (prefill 49,481 / 3,000 = 16.49)
    assert figures["requests_per_s_per_gpu"] == pytest.approx(15.19, abs=0.01)


@pytest.mark.parametrize(
    ("ttft_ms", "itl_ms", "fragments"),
    [
        ("1", "10", ["TTFT <= 1 ms is unreachable (the best is 60.5 ms at ISL 3000"]),
        ("200", "0.5", ["ITL <= 0.5 ms is unreachable (the best is 4.43 ms"]),
        ("1", "0.5", ["TTFT <= 1 ms is unreachable", "ITL <= 0.5 ms is unreachable"]),
    ],
    ids=["ttft", "itl", "both"],
)
def test_capacity_of_an_unreachable_sla_prints_no_sizes_and_fails(profile_dir, ttft_ms, itl_ms, fragments) -> None:
    """H200 at ISL 3000 cannot reach TTFT 1 ms (60.5 ms at batch 1) or ITL 0.5 ms: one line naming the missed
    target and the best latency, nothing on stdout, exit 1 (not 2: the input is valid, the answer is no)."""
    result = planner(
        "capacity", "--profile", str(profile_dir), "--isl", "3000", "--osl", "300", "--ttft-ms", ttft_ms,
        "--itl-ms", itl_ms,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = _error_lines(result)
    assert line.startswith("planner: error: no capacity meets the SLA: ")
    for fragment in fragments:
        assert fragment in line


def test_capacity_json_of_an_unreachable_sla_says_infeasible(profile_dir) -> None:
    """With --json an unreachable SLA exits 0 with `feasible: false`, the reason, no rate, and the best latency."""
    import json

    result = planner(
        "capacity", "--profile", str(profile_dir), "--isl", "3000", "--osl", "300", "--ttft-ms", "1",
        "--itl-ms", "10", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["feasible"] is False
    assert figures["requests_per_s_per_gpu"] is None
    assert figures["prefill_ttft_ms"] == pytest.approx(60.5, abs=0.1)  # the best TTFT the profile reaches
    [reason] = figures["unreachable"]
    assert reason.startswith("TTFT <= 1 ms is unreachable")


def test_capacity_with_a_missing_profile_fails_in_one_line(tmp_path) -> None:
    """A profile folder that does not exist is named in a one-line error."""
    result = planner(
        "capacity", "--profile", str(tmp_path / "none"), "--isl", "3000", "--osl", "300", "--ttft-ms", "200",
        "--itl-ms", "10",
    )  # fmt: skip
    assert result.returncode == 2
    [line] = _error_lines(result)
    assert str(tmp_path / "none") in line


def test_capacity_of_a_trace_at_mean_and_p90(profile_dir) -> None:
    """`--trace` sizes the Azure conv trace (x12) at its mean and p90 lengths with both algorithms."""
    import json

    from tests.conftest import AZURE_CONV

    result = planner(
        "capacity", "--profile", str(profile_dir), "--trace", str(AZURE_CONV),
        "--rate-scale", "12", "--ttft-ms", "500", "--itl-ms", "50", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {(row["sizing"], row["algorithm"]): row for row in json.loads(result.stdout)}
    assert set(rows) == {(s, a) for s in ("mean", "p90") for a in ("interpolation", "engine_capacity")}
    for algorithm in ("interpolation", "engine_capacity"):
        mean, tail = rows[("mean", algorithm)], rows[("p90", algorithm)]
        assert tail["isl"] > mean["isl"] and tail["osl"] > mean["osl"]
        # longer requests: fewer requests/s per engine, so at least as many replicas at the same rate
        assert tail["prefill_rps_per_engine"] < mean["prefill_rps_per_engine"]
        assert tail["decode_replicas_peak"] >= mean["decode_replicas_peak"]
        assert mean["peak_rps"] > mean["mean_rps"]
        assert mean["prefill_replicas_peak"] >= mean["prefill_replicas_mean"]
    assert all(row["feasible"] and row["unreachable"] == [] for row in rows.values())


def test_capacity_of_a_trace_under_an_unreachable_sla_gives_no_replicas(profile_dir) -> None:
    """TTFT 1 ms / ITL 0.5 ms is out of the H200 profile's reach at any length: no row gives replicas; the table
    names the missed targets per row and the command exits 1; --json exits 0 with `feasible: false` per row."""
    import json

    from tests.conftest import AZURE_CONV

    command = (
        "capacity", "--profile", str(profile_dir), "--trace", str(AZURE_CONV), "--ttft-ms", "1", "--itl-ms", "0.5"
    )  # fmt: skip
    result = planner(*command)
    assert result.returncode == 1
    [line] = _error_lines(result)
    assert "the SLA is unreachable for 4 of 4 sizings" in line and "TTFT <= 1 ms is unreachable" in line
    rows = [row for row in result.stdout.splitlines() if row.lstrip().startswith(("mean ", "p90 "))]
    assert len(rows) == 4
    for row in rows:
        assert "+" not in row  # no "P+D" replica pair
        assert "TTFT <= 1 ms is unreachable" in row and "ITL <= 0.5 ms is unreachable" in row

    result = planner(*command, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 4
    for row in rows:
        assert row["feasible"] is False and len(row["unreachable"]) == 2
        assert row["prefill_replicas_peak"] is None and row["decode_replicas_mean"] is None
        assert row["prefill_latency_ms"] > 1 and row["decode_latency_ms"] > 0.5


def test_capacity_needs_lengths_or_a_trace(profile_dir) -> None:
    result = planner("capacity", "--profile", str(profile_dir), "--ttft-ms", "200", "--itl-ms", "10")
    assert result.returncode == 2
    [line] = _error_lines(result)
    assert "--isl" in line and "--trace" in line
