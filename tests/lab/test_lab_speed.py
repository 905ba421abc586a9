"""The two speed measurements of the lab run end to end on a small input and print one line per run:
`planner_core.lab.predictor_speed` (per-step cost of each predictor) and `planner_core.lab.sim_speed` (the
simulator's wall time, alone and with the planner in the loop). Their figures are quoted in docs/decisions.md and
docs/simulator-and-benchmark.md; here only that they run, not how fast."""

from __future__ import annotations

import pytest

from planner_core.data import MOONCAKE_TRACE
from planner_core.lab import predictor_speed, sim_speed


def test_predictor_speed_prints_one_line_per_predictor(capsys: pytest.CaptureFixture[str]) -> None:
    assert predictor_speed.main(["constant", "kalman+log1p", "--history", "20", "--steps", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "20 windows of 1 s observed, then 5 timed" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["constant", "kalman+log1p"]
    assert all("median" in line and "p99" in line for line in lines[1:])


def test_sim_speed_times_a_fixed_cluster_and_the_planner(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--trace", str(MOONCAKE_TRACE), "--rate-scale", "0.02", "--prefill", "1", "--decode", "1"]
    assert sim_speed.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["fixed 1P1D", "planner"]
    assert all(" s wall, " in line and "served" in line for line in lines[1:])
