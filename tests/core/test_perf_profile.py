"""Tests of `planner_core.perf.profile`: Dynamo profile loading, interpolation and engine capacity (pure)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.data import H200_PROFILE_DIR
from planner_core.perf import (
    DecodeInterpolator,
    DecodeProfile,
    EngineProfile,
    PrefillInterpolator,
    PrefillProfile,
    ProfileError,
    estimate_engine_capacity,
    load_profile,
)

PROFILE_DIR = H200_PROFILE_DIR
PROFILE_ROOT = PROFILE_DIR.parent
PREFILL_NPZ = PROFILE_DIR / "selected_prefill_interpolation" / "raw_data.npz"
DECODE_NPZ = PROFILE_DIR / "selected_decode_interpolation" / "raw_data.npz"


def _npz_dict(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {name: npz[name].copy() for name in npz.files}


@pytest.fixture(scope="module")
def profile() -> EngineProfile:
    """The shipped H200 TP1 profile (Llama-3.1-8B-Instruct-FP8), loaded once."""
    return load_profile(PROFILE_DIR)


@pytest.fixture(scope="module")
def raw() -> dict[str, dict[str, np.ndarray]]:
    """The shipped NPZ arrays, keyed by phase."""
    return {"prefill": _npz_dict(PREFILL_NPZ), "decode": _npz_dict(DECODE_NPZ)}


# ---------------------------------------------------------------------------------------------------------
# Acceptance: Dynamo's documented interpolator example
# ---------------------------------------------------------------------------------------------------------

# Dynamo docs (`perf_interpolation.py --isl 3000 --osl 300 --ttft 200 --itl 10` on this profile):
#   prefill: TTFT 0.060 s (later printed as "60.00ms"), 49481.09 tokens/s/GPU -> 49481.09 / 3000 = 16.49 req/s
#   decode:  context 3000 + 300/2 = 3150 -> grid row round(3150 / (13585/99)) = 23 (3156 tokens);
#            highest kv cell with ITL <= 10 ms is cell 16 -> kv 16/99 = 16.16 %, ITL 9.73 ms,
#            4555.68 tokens/s/GPU -> 4555.68 / 300 = 15.19 req/s
#   "~15 request/s/gpu for both prefill and decode" = min(16.49, 15.19) = 15.19 req/s per GPU of each role.
DOC_PREFILL_TOKENS_PER_S = 49481.09
DOC_PREFILL_TTFT_MS = 60.0
DOC_DECODE_TOKENS_PER_S = 4555.68
DOC_DECODE_ITL_MS = 9.7
DOC_DECODE_KV_USAGE = 0.1616
DOC_REQUESTS_PER_S_PER_GPU = 15.19


@pytest.mark.parametrize("dynamo_literal", [False, True], ids=["monotone", "dynamo-literal"])
def test_acceptance_h200_isl3000_osl300(profile: EngineProfile, dynamo_literal: bool) -> None:
    """ISL 3000/OSL 300 under TTFT 200 ms/ITL 10 ms reproduces Dynamo's documented figures."""
    capacity = estimate_engine_capacity(
        profile, isl=3000, osl=300, ttft_ms=200, itl_ms=10, dynamo_literal=dynamo_literal
    )
    assert capacity.prefill_tokens_per_s_per_gpu == pytest.approx(DOC_PREFILL_TOKENS_PER_S, rel=1e-6)
    assert capacity.prefill_ttft_ms == pytest.approx(DOC_PREFILL_TTFT_MS, rel=0.02)  # 60.46 ms here
    assert capacity.decode_tokens_per_s_per_gpu == pytest.approx(DOC_DECODE_TOKENS_PER_S, rel=1e-6)
    assert capacity.decode_itl_ms == pytest.approx(DOC_DECODE_ITL_MS, rel=0.01)  # 9.734 ms here
    assert capacity.decode_kv_usage == pytest.approx(DOC_DECODE_KV_USAGE, abs=5e-4)  # 16/99
    assert capacity.requests_per_s_per_gpu == pytest.approx(DOC_REQUESTS_PER_S_PER_GPU, rel=1e-3)
    assert capacity.prefill_engine_rps == pytest.approx(DOC_PREFILL_TOKENS_PER_S / 3000, rel=1e-6)
    assert capacity.decode_engine_rps == pytest.approx(DOC_DECODE_TOKENS_PER_S / 300, rel=1e-6)
    assert capacity.prefill_sla_met and capacity.decode_sla_met
    assert capacity.to_json_dict() == {
        "prefill_tokens_per_s_per_gpu": capacity.prefill_tokens_per_s_per_gpu,
        "prefill_ttft_ms": capacity.prefill_ttft_ms,
        "decode_tokens_per_s_per_gpu": capacity.decode_tokens_per_s_per_gpu,
        "decode_itl_ms": capacity.decode_itl_ms,
        "requests_per_s_per_gpu": capacity.requests_per_s_per_gpu,
    }
    assert all(type(value) is float for value in capacity.to_json_dict().values())


def test_engine_rps_scales_with_gpus_per_engine(profile: EngineProfile) -> None:
    """Per-engine rates scale with GPUs per engine; per-GPU figures do not."""
    one = estimate_engine_capacity(profile, isl=3000, osl=300, ttft_ms=200, itl_ms=10)
    two = estimate_engine_capacity(
        profile,
        isl=3000,
        osl=300,
        ttft_ms=200,
        itl_ms=10,
        prefill_gpus_per_engine=2,
        decode_gpus_per_engine=4,
    )
    assert two.prefill_engine_rps == pytest.approx(2 * one.prefill_engine_rps)
    assert two.decode_engine_rps == pytest.approx(4 * one.decode_engine_rps)
    assert two.requests_per_s_per_gpu == one.requests_per_s_per_gpu


def test_sla_flags_when_targets_are_unreachable(profile: EngineProfile) -> None:
    """Targets below batch-1 latency are flagged; decode falls back to the lowest-load cell."""
    capacity = estimate_engine_capacity(profile, isl=3000, osl=300, ttft_ms=50, itl_ms=1)
    assert not capacity.prefill_sla_met  # TTFT 60.5 ms > 50 ms
    assert not capacity.decode_sla_met
    assert capacity.decode_kv_usage == 0.0 and capacity.decode_itl_ms > 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"isl": 0},
        {"osl": -1},
        {"ttft_ms": math.nan},
        {"itl_ms": math.inf},
        {"prefill_gpus_per_engine": 0},
        {"decode_gpus_per_engine": 1.5},
    ],
    ids=["isl-zero", "osl-negative", "ttft-nan", "itl-inf", "prefill-gpus-zero", "decode-gpus-float"],
)
def test_estimate_rejects_bad_arguments(profile: EngineProfile, kwargs: dict[str, Any]) -> None:
    """Non-positive or non-finite lengths/targets and non-integer GPU counts raise ValueError."""
    arguments: dict[str, Any] = {"isl": 3000, "osl": 300, "ttft_ms": 200, "itl_ms": 10, **kwargs}
    with pytest.raises(ValueError):
        estimate_engine_capacity(profile, **arguments)


# ---------------------------------------------------------------------------------------------------------
# Prefill interpolation
# ---------------------------------------------------------------------------------------------------------


def test_prefill_clamps_outside_sampled_isl_range(profile: EngineProfile, raw: dict) -> None:
    """ISL below/above the sampled range (100..16372) gives the end samples' TTFT and throughput."""
    prefill = profile.prefill_interpolator
    isl, ttft, thpt = (raw["prefill"][k] for k in ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"))
    for below in (0, 1, 99.9):
        assert prefill.ttft_ms(below) == pytest.approx(ttft[0], rel=1e-12)
        assert prefill.thpt_per_gpu(below) == pytest.approx(thpt[0], rel=1e-12)
    for above in (isl[-1] + 0.1, 50_000, 1e9):
        assert prefill.ttft_ms(above) == pytest.approx(ttft[-1], rel=1e-12)
        assert prefill.thpt_per_gpu(above) == pytest.approx(thpt[-1], rel=1e-12)
    with pytest.raises(ValueError):
        prefill.ttft_ms(math.nan)


def test_prefill_matches_scipy_interp1d_cubic(profile: EngineProfile, raw: dict) -> None:
    """The prefill spline is the one Dynamo's `interp1d(kind="cubic")` builds."""
    from scipy.interpolate import interp1d

    data = raw["prefill"]
    ttft_ref = interp1d(data["prefill_isl"], data["prefill_ttft"], kind="cubic")
    thpt_ref = interp1d(data["prefill_isl"], data["prefill_thpt_per_gpu"], kind="cubic")
    for isl in np.linspace(100, 16372, 997):
        assert profile.prefill_interpolator.ttft_ms(isl) == pytest.approx(float(ttft_ref(isl)), rel=1e-9)
        assert profile.prefill_interpolator.thpt_per_gpu(isl) == pytest.approx(float(thpt_ref(isl)), rel=1e-9)


def test_prefill_with_few_points_degrades_to_line() -> None:
    """Two samples interpolate linearly (Dynamo's cubic interp1d would refuse fewer than four)."""
    prefill = PrefillInterpolator(PrefillProfile(isl=[1000, 3000], ttft_ms=[20, 60], thpt_per_gpu=[5e4, 5e4]))
    assert prefill.ttft_ms(2000) == pytest.approx(40)
    single = PrefillInterpolator(PrefillProfile(isl=[1000], ttft_ms=[20], thpt_per_gpu=[5e4]))
    assert single.ttft_ms(5) == single.ttft_ms(9999) == 20


# ---------------------------------------------------------------------------------------------------------
# Decode interpolation
# ---------------------------------------------------------------------------------------------------------


def _dynamo_reference_grids(decode: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dynamo 0.x's grid construction, restated: cubic griddata, NaNs filled by nearest."""
    from scipy.interpolate import griddata

    kv_axis = np.linspace(0, 1, 100)
    context_axis = np.linspace(0, decode["y_context_length"].max(), 100)
    mesh = np.meshgrid(kv_axis, context_axis)
    points = (decode["x_kv_usage"], decode["y_context_length"])
    grids = []
    for key in ("z_itl", "z_thpt_per_gpu"):
        grid = griddata(points, decode[key], tuple(mesh), method="cubic")
        nearest = griddata(points, decode[key], tuple(mesh), method="nearest")
        grid[np.isnan(grid)] = nearest[np.isnan(grid)]
        grids.append(grid)
    return grids[0], grids[1], kv_axis


def test_decode_grid_and_literal_scan_match_dynamo(profile: EngineProfile, raw: dict) -> None:
    """Grids equal Dynamo's construction and `dynamo_literal=True` equals its top-down linear scan."""
    itl_ref, thpt_ref, kv_axis = _dynamo_reference_grids(raw["decode"])
    decode = profile.decode_interpolator
    assert decode.mode == "griddata-cubic"
    np.testing.assert_array_equal(decode.itl_grid_ms, itl_ref)
    np.testing.assert_array_equal(decode.thpt_grid_per_gpu, thpt_ref)
    for row, context in enumerate(decode.context_axis):
        for target in np.arange(3.0, 50.0, 0.37):
            column = next((c for c in range(99, -1, -1) if itl_ref[row, c] <= target), 0)
            point = decode.find_best_throughput_per_gpu(target, context, dynamo_literal=True)
            assert (point.thpt_per_gpu, point.itl_ms, point.kv_usage) == (
                thpt_ref[row, column],
                itl_ref[row, column],
                kv_axis[column],
            )


def test_decode_point_queries_snap_to_grid(profile: EngineProfile) -> None:
    """itl_ms/thpt_per_gpu map concurrency*context/max_kv onto the nearest grid cell, clamped."""
    decode = profile.decode_interpolator
    concurrency = (16 / 99) * decode.max_kv_tokens / 3150  # kv usage 16.16 % at context 3150: cell (23, 16)
    assert decode.itl_ms(concurrency, 3150) == decode.itl_grid_ms[23, 16]
    assert decode.thpt_per_gpu(concurrency, 3150) == decode.thpt_grid_per_gpu[23, 16]
    assert decode.itl_ms(1e9, 1e9) == decode.itl_grid_ms[99, 99]
    assert decode.itl_ms(0, 0) == decode.itl_grid_ms[0, 0]
    with pytest.raises(ValueError):
        decode.itl_ms(-1, 3150)


def test_find_best_is_monotone_in_itl_target_on_every_row(profile: EngineProfile) -> None:
    """A looser ITL target never gives lower throughput, on every context row of the grid."""
    decode = profile.decode_interpolator
    targets = np.arange(0.0, 60.0, 0.05)
    for context in decode.context_axis:
        previous = -math.inf
        for target in targets:
            point = decode.find_best_throughput_per_gpu(target, context)
            assert point.thpt_per_gpu >= previous
            assert point.thpt_per_gpu > 0
            previous = point.thpt_per_gpu


@settings(max_examples=300, deadline=None)
@given(
    tight_ms=st.floats(min_value=0, max_value=80, allow_nan=False),
    slack_ms=st.floats(min_value=0, max_value=80, allow_nan=False),
    context=st.floats(min_value=0, max_value=20_000, allow_nan=False),
)
def test_find_best_monotone_property(profile: EngineProfile, tight_ms: float, slack_ms: float, context: float) -> None:
    """For any context and targets t <= t', throughput(t') >= throughput(t), and met targets stay met."""
    decode = profile.decode_interpolator
    tight = decode.find_best_throughput_per_gpu(tight_ms, context)
    loose = decode.find_best_throughput_per_gpu(tight_ms + slack_ms, context)
    assert loose.thpt_per_gpu >= tight.thpt_per_gpu
    if tight.itl_ms <= tight_ms:
        assert loose.itl_ms <= tight_ms + slack_ms


def test_dynamo_literal_scan_is_not_monotone(profile: EngineProfile) -> None:
    """Documents the quirk: on this profile Dynamo's scan can drop, even to negative throughput."""
    decode = profile.decode_interpolator
    context = float(decode.context_axis[30])  # ~4117 tokens: cubic undershoot at kv cell 1 (ITL 4.15 ms)
    tighter = decode.find_best_throughput_per_gpu(4.0, context, dynamo_literal=True)  # none meets: cell 0
    looser = decode.find_best_throughput_per_gpu(4.2, context, dynamo_literal=True)  # cell 1
    assert looser.thpt_per_gpu < 0 < tighter.thpt_per_gpu
    assert decode.find_best_throughput_per_gpu(4.2, context).thpt_per_gpu > 0


def test_decode_single_context_length_uses_1d_interpolation(raw: dict) -> None:
    """A profile with one context length (griddata cannot triangulate) interpolates along kv usage only."""
    from scipy.interpolate import CubicSpline

    data = raw["decode"]
    rows = data["y_context_length"] == 350
    decode = DecodeInterpolator(
        DecodeProfile(
            kv_usage=data["x_kv_usage"][rows],
            context_length=data["y_context_length"][rows],
            itl_ms=data["z_itl"][rows],
            thpt_per_gpu=data["z_thpt_per_gpu"][rows],
            max_kv_tokens=data["max_kv_tokens"],
        )
    )
    assert decode.mode == "1d-kv-usage"
    kv = data["x_kv_usage"][rows]
    expected = CubicSpline(kv, data["z_itl"][rows])(np.clip(decode.kv_usage_axis, kv.min(), kv.max()))
    for row in (0, 50, 99):  # context is ignored: every row is the same curve
        np.testing.assert_allclose(decode.itl_grid_ms[row], expected, rtol=1e-12)
    point = decode.find_best_throughput_per_gpu(20.0, 350)
    assert point.itl_ms <= 20.0 and point.thpt_per_gpu > 0


def test_decode_collinear_samples_raise_profile_error() -> None:
    """Samples on a slanted line cannot be triangulated and are reported as a profile error."""
    profile = DecodeProfile(
        kv_usage=[0.1, 0.2, 0.3],
        context_length=[1000, 2000, 3000],
        itl_ms=[5, 6, 7],
        thpt_per_gpu=[1e3, 2e3, 3e3],
        max_kv_tokens=100_000,
        source_file="decode.json",
    )
    with pytest.raises(ProfileError, match=r"^decode\.json: bad arrays 'x_kv_usage'/'y_context_length'"):
        DecodeInterpolator(profile)


# ---------------------------------------------------------------------------------------------------------
# Profiles: immutability, loaders, layouts
# ---------------------------------------------------------------------------------------------------------


def test_profiles_are_frozen_read_only_copies(raw: dict) -> None:
    """Profile arrays are read-only copies and the dataclasses reject assignment."""
    isl = raw["prefill"]["prefill_isl"].copy()
    prefill = PrefillProfile(isl=isl, ttft_ms=raw["prefill"]["prefill_ttft"], thpt_per_gpu=[1.0] * isl.size)
    isl[0] = 12345
    assert prefill.isl[0] == 100
    with pytest.raises(ValueError):
        prefill.isl[0] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        prefill.source_file = "x"  # type: ignore[misc]


def _write_json_twins(raw: dict, directory: Path) -> None:
    prefill = {key: value.tolist() for key, value in raw["prefill"].items()}
    decode = {key: value.tolist() for key, value in raw["decode"].items()}
    decode["max_kv_tokens"] = int(raw["decode"]["max_kv_tokens"][0])  # Dynamo's JSON stores a scalar
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prefill_raw_data.json").write_text(json.dumps(prefill))
    (directory / "decode_raw_data.json").write_text(json.dumps(decode))


@pytest.mark.parametrize("layout", ["top-level", "in-subfolders"])
def test_json_twins_load_like_npz(profile: EngineProfile, raw: dict, tmp_path: Path, layout: str) -> None:
    """JSON twins (top level as Dynamo mounts them, or inside the subfolders) give equal interpolators."""
    if layout == "top-level":
        _write_json_twins(raw, tmp_path)
    else:
        prefill_dir = tmp_path / "selected_prefill_interpolation"
        decode_dir = tmp_path / "selected_decode_interpolation"
        _write_json_twins(raw, prefill_dir)
        (prefill_dir / "decode_raw_data.json").rename(tmp_path / "tmp.json")
        decode_dir.mkdir()
        (tmp_path / "tmp.json").rename(decode_dir / "decode_raw_data.json")
    from_json = load_profile(tmp_path)
    assert from_json.prefill == profile.prefill and from_json.decode == profile.decode
    assert from_json.decode.source_file.endswith("decode_raw_data.json")
    np.testing.assert_array_equal(from_json.decode_interpolator.itl_grid_ms, profile.decode_interpolator.itl_grid_ms)
    np.testing.assert_array_equal(
        from_json.decode_interpolator.thpt_grid_per_gpu, profile.decode_interpolator.thpt_grid_per_gpu
    )
    for isl in (50, 777, 3000, 12_345, 20_000):
        assert from_json.prefill_interpolator.ttft_ms(isl) == profile.prefill_interpolator.ttft_ms(isl)
        assert from_json.prefill_interpolator.thpt_per_gpu(isl) == profile.prefill_interpolator.thpt_per_gpu(isl)
    shape = {"isl": 3000, "osl": 300, "ttft_ms": 200, "itl_ms": 10}
    assert estimate_engine_capacity(from_json, **shape) == estimate_engine_capacity(profile, **shape)


def test_parent_folder_with_one_profile_resolves_to_it(profile: EngineProfile) -> None:
    """Pointing at the folder that holds exactly one profile subfolder loads that profile."""
    loaded = load_profile(PROFILE_ROOT)
    assert Path(loaded.source_dir) == PROFILE_DIR
    assert loaded == profile


def test_parent_folder_with_two_profiles_is_ambiguous(tmp_path: Path) -> None:
    """A folder with several profile subfolders is rejected rather than guessed."""
    for name in ("A100_TP1", "H200_TP1"):
        (tmp_path / name / "selected_prefill_interpolation").mkdir(parents=True)
    with pytest.raises(ProfileError, match=r"ambiguous profile: 2 subfolders hold one \(A100_TP1, H200_TP1\)"):
        load_profile(tmp_path)


def test_folder_without_profile_is_rejected(tmp_path: Path) -> None:
    """A directory holding no profile, or a missing directory, raises ProfileError naming it."""
    with pytest.raises(ProfileError, match=r": no profile: expected"):
        load_profile(tmp_path)
    with pytest.raises(ProfileError, match=r"nowhere: missing directory$"):
        load_profile(tmp_path / "nowhere")


# ---------------------------------------------------------------------------------------------------------
# Malformed profiles
# ---------------------------------------------------------------------------------------------------------

PREFILL_FILE = "selected_prefill_interpolation/raw_data.npz"
DECODE_FILE = "selected_decode_interpolation/raw_data.npz"

Mutation = Callable[[dict[str, dict[str, Any]]], None]


def _set(phase: str, key: str, value: Any) -> Mutation:
    def mutate(data: dict[str, dict[str, Any]]) -> None:
        data[phase][key] = value

    return mutate


def _drop(phase: str, key: str) -> Mutation:
    def mutate(data: dict[str, dict[str, Any]]) -> None:
        del data[phase][key]

    return mutate


def _change(phase: str, key: str, edit: Callable[[np.ndarray], np.ndarray]) -> Mutation:
    def mutate(data: dict[str, dict[str, Any]]) -> None:
        data[phase][key] = edit(np.array(data[phase][key], dtype=np.float64))

    return mutate


def _with_value(index: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def edit(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array

    return edit


MALFORMED_CASES = [
    # (id, mutation or None, file to delete, expected file, expected message fragment)
    ("missing-prefill-file", None, PREFILL_FILE, PREFILL_FILE, "missing file"),
    ("missing-decode-file", None, DECODE_FILE, DECODE_FILE, "missing file"),
    (
        "missing-prefill_ttft",
        _drop("prefill", "prefill_ttft"),
        None,
        PREFILL_FILE,
        "missing array 'prefill_ttft'",
    ),
    (
        "missing-max_kv_tokens",
        _drop("decode", "max_kv_tokens"),
        None,
        DECODE_FILE,
        "missing array 'max_kv_tokens'",
    ),
    (
        "length-mismatch-z_itl",
        _change("decode", "z_itl", lambda a: a[:-1]),
        None,
        DECODE_FILE,
        "bad array 'z_itl': length 40 does not match 'x_kv_usage' length 41",
    ),
    (
        "length-mismatch-prefill_thpt",
        _change("prefill", "prefill_thpt_per_gpu", lambda a: np.append(a, 1.0)),
        None,
        PREFILL_FILE,
        "bad array 'prefill_thpt_per_gpu': length 18 does not match 'prefill_isl' length 17",
    ),
    (
        "nan-prefill_thpt",
        _change("prefill", "prefill_thpt_per_gpu", _with_value(3, math.nan)),
        None,
        PREFILL_FILE,
        "bad array 'prefill_thpt_per_gpu': non-finite value nan at index 3",
    ),
    (
        "nan-z_itl",
        _change("decode", "z_itl", _with_value(0, math.nan)),
        None,
        DECODE_FILE,
        "bad array 'z_itl': non-finite value nan at index 0",
    ),
    (
        "inf-x_kv_usage",
        _change("decode", "x_kv_usage", _with_value(5, math.inf)),
        None,
        DECODE_FILE,
        "bad array 'x_kv_usage': non-finite",
    ),
    (
        "zero-prefill_ttft",
        _change("prefill", "prefill_ttft", _with_value(2, 0.0)),
        None,
        PREFILL_FILE,
        "bad array 'prefill_ttft': non-positive value 0 at index 2",
    ),
    (
        "negative-kv_usage",
        _change("decode", "x_kv_usage", _with_value(1, -0.1)),
        None,
        DECODE_FILE,
        "bad array 'x_kv_usage': negative value",
    ),
    (
        "2d-prefill_isl",
        _change("prefill", "prefill_isl", lambda a: a.reshape(1, -1)),
        None,
        PREFILL_FILE,
        "bad array 'prefill_isl': expected a 1-D array, got shape (1, 17)",
    ),
    (
        "duplicate-prefill_isl",
        _change("prefill", "prefill_isl", _with_value(1, 100.0)),
        None,
        PREFILL_FILE,
        "bad array 'prefill_isl': duplicate value 100",
    ),
    (
        "empty-z_thpt",
        _set("decode", "z_thpt_per_gpu", np.array([], dtype=np.float64)),
        None,
        DECODE_FILE,
        "bad array 'z_thpt_per_gpu'",
    ),
    (
        "max_kv_tokens-two-values",
        _set("decode", "max_kv_tokens", np.array([945029, 1])),
        None,
        DECODE_FILE,
        "bad array 'max_kv_tokens': expected one value, got shape (2,)",
    ),
    (
        "max_kv_tokens-zero",
        _set("decode", "max_kv_tokens", np.array([0])),
        None,
        DECODE_FILE,
        "bad array 'max_kv_tokens': expected a positive whole number, got 0",
    ),
]


def _write_npz_profile(raw: dict, directory: Path, mutation: Mutation | None) -> None:
    data = {phase: dict(arrays) for phase, arrays in raw.items()}
    if mutation is not None:
        mutation(data)
    for phase, relative in (("prefill", PREFILL_FILE), ("decode", DECODE_FILE)):
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **data[phase])


@pytest.mark.parametrize(
    ("mutation", "delete", "expected_file", "fragment"),
    [case[1:] for case in MALFORMED_CASES],
    ids=[case[0] for case in MALFORMED_CASES],
)
def test_malformed_npz_profile_raises_one_line_error(
    raw: dict,
    tmp_path: Path,
    mutation: Mutation | None,
    delete: str | None,
    expected_file: str,
    fragment: str,
) -> None:
    """Each malformed NPZ profile raises ProfileError: one line, `<file>: <problem naming the array>`."""
    _write_npz_profile(raw, tmp_path, mutation)
    if delete is not None:
        (tmp_path / delete).unlink()
    with pytest.raises(ProfileError) as caught:
        load_profile(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / expected_file}: ")
    assert fragment in message
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"not a zip archive", "unreadable NPZ"),
        (b"", "unreadable NPZ"),
    ],
    ids=["garbage-bytes", "empty-file"],
)
def test_unreadable_npz_raises_profile_error(raw: dict, tmp_path: Path, content: bytes, fragment: str) -> None:
    """A corrupt NPZ file raises ProfileError naming it."""
    _write_npz_profile(raw, tmp_path, None)
    (tmp_path / DECODE_FILE).write_bytes(content)
    with pytest.raises(ProfileError) as caught:
        load_profile(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / DECODE_FILE}: {fragment}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "unreadable JSON"),
        ("[1, 2, 3]", "bad JSON: expected an object of arrays, got list"),
        (
            '{"prefill_isl": [1, 2], "prefill_ttft": [1, NaN], "prefill_thpt_per_gpu": [1, 2]}',
            "'prefill_ttft'",
        ),
        ('{"prefill_isl": [1, 2], "prefill_thpt_per_gpu": [1, 2]}', "missing array 'prefill_ttft'"),
        ('{"prefill_isl": [1, "x"], "prefill_ttft": [1, 2], "prefill_thpt_per_gpu": [1, 2]}', "not numeric"),
    ],
    ids=["syntax-error", "not-an-object", "nan", "missing-array", "non-numeric"],
)
def test_malformed_json_twin_raises_profile_error(raw: dict, tmp_path: Path, text: str, fragment: str) -> None:
    """Malformed JSON twins raise ProfileError naming the JSON file and the array."""
    _write_json_twins(raw, tmp_path)
    (tmp_path / "prefill_raw_data.json").write_text(text)
    with pytest.raises(ProfileError) as caught:
        load_profile(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'prefill_raw_data.json'}: ")
    assert fragment in message and "\n" not in message
