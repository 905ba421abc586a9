"""`planner profile --round-trip` against Dynamo's own frontend and mocker engine (file discovery, no GPU).

About two minutes on a 2-core machine, so it runs only with PLANNER_LIVE_TESTS=1 (`make test-live`); it needs the
Dynamo environment (`make dynamo-env`) and the tiny model folder (`make live-env`), and says which is missing.
A small sweep: the measured profile must match the mocker's own timing table (what the mocker really runs) at the
measured points, be readable by the planner's loader, and carry its plots and the SLO-router JSON files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner_core.lab.sim.dynamo_policy import find_dynamo_python
from planner_core.perf.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("PLANNER_LIVE_MODEL_DIR", REPO / ".planner" / "live-model"))

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("PLANNER_LIVE_TESTS"),
        reason="minutes with Dynamo's frontend and a mocker engine: run `make test-live` (PLANNER_LIVE_TESTS=1)",
    ),
    pytest.mark.skipif(
        find_dynamo_python() is None,
        reason="needs the Dynamo environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
    ),
    pytest.mark.skipif(
        not (MODEL_DIR / "config.json").is_file(), reason=f"no model folder {MODEL_DIR}: run `make live-env`"
    ),
]


def test_round_trip_measures_what_the_mocker_runs(tmp_path):
    env = {
        **os.environ,
        "DYNAMO_PYTHON": str(find_dynamo_python()),
        "PLANNER_LIVE_MODEL_DIR": str(MODEL_DIR),
        "PYTHONPATH": str(REPO),
    }
    command = [
        sys.executable, "-m", "planner_cli", "profile", "--round-trip", "--out", str(tmp_path),
        "--isls", "1117,3151", "--prefill-repeats", "1", "--batches", "1,8", "--contexts", "2997",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "roundtrip.json").read_text())
    mocker = record["roles"]["mocker_model"]
    assert mocker["prefill"]["num_points"] == 2 and mocker["decode"]["num_points"] == 2
    assert abs(mocker["prefill"]["worst_error"]) < 0.10, mocker
    assert abs(mocker["decode"]["worst_error"]) < 0.10, mocker
    measured = load_profile(tmp_path / "measured")
    assert measured.prefill.isl.tolist() == [1117, 3151]
    assert measured.decode.max_kv_tokens == 16384 * 64  # the mocker's KV capacity, read from the frontend
    for name in ("prefill_performance.png", "decode_performance.png", "profile.html"):
        assert (tmp_path / "measured" / name).stat().st_size > 1000
    for name in ("ttft_profiling.json", "tpot_profiling.json"):
        assert json.loads((tmp_path / "measured-descaled" / name).read_text())["results"]
    # nothing left running: the frontend and the engine were in this run's process groups
    alive = subprocess.run(["pgrep", "-f", str(tmp_path / "source-x")], capture_output=True, check=False)
    assert alive.returncode == 1, alive.stdout
