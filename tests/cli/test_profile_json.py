"""`planner profile-json`: Dynamo's SLO-aware router profiling files written from a planner profile (the
profile's own measurements) or from its forward-pass model, read back by the routing library's predictor
(the routing library itself is tested in tests/core/test_routing.py)."""

from __future__ import annotations

import json

import pytest

from planner_cli.main import main
from planner_core.data import H200_PROFILE_DIR
from planner_core.perf.model import ProfilePerfModel
from planner_core.perf.profile import load_profile
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.profiling import parse_tpot_profile, parse_ttft_profile


@pytest.mark.parametrize("source", ["dynamo", "sim"])
def test_profile_json_writes_both_files_the_predictor_reads(tmp_path, source: str) -> None:
    out = tmp_path / "profiles"
    assert main(["profile-json", "--from", source, "--profile", str(H200_PROFILE_DIR), "--out-dir", str(out)]) == 0
    ttft = parse_ttft_profile(json.loads((out / "ttft_profiling.json").read_text()), source="ttft")
    tpot = parse_tpot_profile(json.loads((out / "tpot_profiling.json").read_text()), source="tpot")
    predictor = LatencyPredictor(ttft, tpot)
    assert sorted(p.name for p in out.iterdir()) == ["tpot_profiling.json", "ttft_profiling.json"]  # no temp left
    if source == "dynamo":
        profile = load_profile(H200_PROFILE_DIR)
        # the TTFT rows are the profile's own measurements
        assert [p.tokens_num for p in ttft.points] == sorted(round(v) for v in profile.prefill.isl)
        for isl, ms in zip(profile.prefill.isl, profile.prefill.ttft_ms, strict=True):
            assert predictor.ttft_table_ms(round(isl)) == pytest.approx(float(ms))
    else:
        fwd = ProfilePerfModel.load(H200_PROFILE_DIR).forward_pass_model()
        assert predictor.ttft_table_ms(1024) == pytest.approx(1000 * fwd.prefill_wall_s(1024))
        assert predictor.ttft_table_ms(16384) == pytest.approx(2000 * fwd.prefill_wall_s(8192))  # two chunks
        assert predictor.tpot_table_ms(16, 2048) == pytest.approx(1000 * fwd.decode_wall_s(16, 16 * 2048))
