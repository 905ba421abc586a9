"""`planner chaos`, small: a few kill -9s of the demo, Postgres and the Prefect server over short demo runs, then
every finished round compared with an uninterrupted one (the full run, 100+ kills, is in docs/operations.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.prefect


def test_a_small_chaos_run_loses_and_duplicates_nothing(tmp_path) -> None:
    """The four kinds of fault in turn (`--cycle`): every round ends identical to the uninterrupted run, with no
    duplicated, lost or changed tick or decision, and the audit chain holds."""
    report_path = tmp_path / "chaos.json"
    command = [
        sys.executable, "-m", "planner_cli.main", "chaos", "--kills", "4", "--windows", "3", "--seed", "6", "--cycle",
        "--data-dir", str(tmp_path / "run"), "--report", str(report_path),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANNER_", "PREFECT_"))}
    result = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["finished"] and report["num_kills"] == 4 == len(report["kills"])
    # one of each (a `demo-after-tick` that saw no new tick in time falls back to a plain kill, and says so)
    assert sum(report["kills_by_fault"].values()) == 4
    assert report["kills_by_fault"]["postgres"] == report["kills_by_fault"]["prefect"] == 1
    assert report["num_demo_attempts"] >= 4
    for figure in ("duplicate_ticks", "duplicate_decisions", "lost_ticks", "lost_decisions", "changed_ticks"):
        assert report[figure] == 0, figure
    assert report["num_rounds"] >= 1 and report["rounds_identical"] == report["num_rounds"]
    assert all(r["num_ticks"] == report["baseline_ticks"] == 3 for r in report["rounds"])
    assert report["audit_chain"]["ok"] and report["audit_chain"]["num_rows"] > 0
    assert json.loads(result.stdout)["num_kills"] == 4  # the summary printed on stdout


def test_chaos_refuses_an_unknown_fault(tmp_path) -> None:
    """A fault kind it does not know is one line and exit 2, before anything starts."""
    command = [sys.executable, "-m", "planner_cli.main", "chaos", "--faults", "postgres,disk", "--data-dir",
               str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "planner: error: --faults = postgres,disk: unknown disk "
        "(known: demo-random, demo-after-tick, postgres, prefect)"
    )
    assert not (tmp_path / "run").exists()


def test_diff_rows_tells_lost_extra_and_changed_apart() -> None:
    """A tick missing, one more, and one recorded with another reason: each counted once, in its own kind."""
    from planner_cli.chaos import diff_rows

    baseline = [(1, "t", "no_change"), (2, "t", "no_change"), (3, "t", "scale")]
    got = [(1, "t", "no_change"), (2, "t", "no_traffic_data"), (4, "t", "no_change")]
    assert diff_rows(baseline, got, key_fields=2) == {
        "lost": [(3, "t", "scale")],
        "extra": [(4, "t", "no_change")],
        "changed": [((2, "t", "no_change"), (2, "t", "no_traffic_data"))],
    }
    assert diff_rows(baseline, baseline, key_fields=2) == {"lost": [], "extra": [], "changed": []}
