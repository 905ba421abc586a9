"""Pre-deployment engine profiles and the capacity interpolators built from them (Dynamo 0.x legacy model).

Role in the planner: this is the perf model behind the throughput loop. A profile measured before
deployment (Dynamo's `selected_{prefill,decode}_interpolation/raw_data.npz`, or the JSON twins
`prefill_raw_data.json` / `decode_raw_data.json` that Dynamo mounts from a ConfigMap) is loaded once by
`load_profile`, validated, and turned into immutable interpolators. The planner then asks every tick what
one GPU serves under the TTFT/ITL targets at the forecast request shape (`estimate_engine_capacity`).

Interpolation follows Dynamo 0.x (`planner/utils/perf_interpolation.py`):

- prefill: 1-D cubic spline (not-a-knot, the spline `scipy.interpolate.interp1d(kind="cubic")` builds) over
  ISL for TTFT (ms) and throughput (tokens/s/GPU); the query ISL is clamped to the sampled range;
- decode: `scipy.interpolate.griddata(method="cubic")` of ITL (ms) and throughput (tokens/s/GPU) over the
  scattered samples (kv_usage, context_length), evaluated once on a 100 x 100 grid (kv_usage 0..1, context
  0..max sampled context, both in the samples' raw units, not rescaled), cells outside the samples' convex
  hull filled by `method="nearest"`; queries snap to the nearest grid cell.

Where this module departs from Dynamo, it says so: `DecodeInterpolator.find_best_throughput_per_gpu`
returns a throughput that never drops when the ITL target is loosened (Dynamo's scan does not guarantee
that; `dynamo_literal=True` gives Dynamo's exact answer), and degenerate decode profiles (one context length
or one kv usage, on which `griddata` cannot triangulate) are interpolated in 1-D instead of failing.

Pure: the only I/O is `load_profile`; no clock, no global state, no side effects at import. SciPy is
imported inside the constructors that need it, so importing this module stays cheap.

The parts: `planner_core.perf.profile_data` (the validated profiles, the file layout, `ProfileError`),
`planner_core.perf.profile_interpolators` (the interpolators); this module builds the `EngineProfile`, estimates
capacity and loads the files, and re-exports the other two modules' public names.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner_core.perf.profile_data import (
    DECODE_JSON_NAME,
    DECODE_SUBDIR,
    DEFAULT_GRID_RESOLUTION,
    NPZ_NAME,
    PREFILL_JSON_NAME,
    PREFILL_SUBDIR,
    DecodeProfile,
    PrefillProfile,
    ProfileError,
)
from planner_core.perf.profile_interpolators import DecodeInterpolator, DecodeOperatingPoint, PrefillInterpolator

__all__ = [
    "DECODE_JSON_NAME",
    "DECODE_SUBDIR",
    "DEFAULT_GRID_RESOLUTION",
    "NPZ_NAME",
    "PREFILL_JSON_NAME",
    "PREFILL_SUBDIR",
    "DecodeInterpolator",
    "DecodeOperatingPoint",
    "DecodeProfile",
    "EngineCapacity",
    "EngineProfile",
    "PrefillInterpolator",
    "PrefillProfile",
    "ProfileError",
    "estimate_engine_capacity",
    "load_profile",
]

# --------------------------------------------------------------------------------------------------------
# Engine profile and capacity
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineProfile:
    """A disaggregated engine's prefill and decode profile, with its interpolators built once.

    Constructing one builds both interpolators (the decode grid takes tens of milliseconds); the planner
    keeps the instance and queries it every tick. Equality compares the data and `source_dir`; the
    interpolators are derived and excluded.

    Attributes:
        prefill: prefill samples.
        decode: decode samples.
        source_dir: the profile directory (holding the `selected_*_interpolation/` folders or JSON twins).
        decode_grid_resolution: cells per decode grid axis (Dynamo: 100).
        prefill_interpolator: built from `prefill` at construction.
        decode_interpolator: built from `decode` at construction.
    """

    prefill: PrefillProfile
    decode: DecodeProfile
    source_dir: str = "<memory>"
    decode_grid_resolution: int = DEFAULT_GRID_RESOLUTION
    prefill_interpolator: PrefillInterpolator = field(init=False, repr=False, compare=False)
    decode_interpolator: DecodeInterpolator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_interpolator", PrefillInterpolator(self.prefill))
        object.__setattr__(
            self,
            "decode_interpolator",
            DecodeInterpolator(self.decode, resolution=self.decode_grid_resolution),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCapacity:
    """What the profiled engines serve at one request shape under TTFT/ITL targets.

    Attributes:
        prefill_tokens_per_s_per_gpu: interpolated prefill throughput at the ISL (tokens/s/GPU).
        prefill_ttft_ms: interpolated TTFT at the ISL (ms), batch 1, no queueing.
        decode_tokens_per_s_per_gpu: best decode throughput whose ITL meets the target (tokens/s/GPU).
        decode_itl_ms: interpolated ITL at that operating point (ms).
        decode_kv_usage: active KV-cache fraction at that operating point (0..1).
        requests_per_s_per_gpu: requests/s one prefill GPU and one decode GPU (a GPU pair) sustain
            together: `min(prefill_tokens_per_s_per_gpu / ISL, decode_tokens_per_s_per_gpu / OSL)`, the
            per-GPU rate of the slower phase. This is Dynamo's "~15 request/s/gpu for both prefill and
            decode" (ISL 3000/OSL 300: min(16.49, 15.19)). Per physical GPU of a 1P1D pair it is half that.
        prefill_engine_rps: requests/s one prefill engine serves: tokens/s/GPU * GPUs per engine / ISL.
        decode_engine_rps: requests/s one decode engine serves: tokens/s/GPU * GPUs per engine / OSL.
        prefill_sla_met: `prefill_ttft_ms <= ttft target`.
        decode_sla_met: `decode_itl_ms <= itl target`.
    """

    prefill_tokens_per_s_per_gpu: float
    prefill_ttft_ms: float
    decode_tokens_per_s_per_gpu: float
    decode_itl_ms: float
    decode_kv_usage: float
    requests_per_s_per_gpu: float
    prefill_engine_rps: float
    decode_engine_rps: float
    prefill_sla_met: bool
    decode_sla_met: bool

    def to_json_dict(self) -> dict[str, float]:
        """The headline figures, JSON-ready (plain floats)."""
        return {
            "prefill_tokens_per_s_per_gpu": float(self.prefill_tokens_per_s_per_gpu),
            "prefill_ttft_ms": float(self.prefill_ttft_ms),
            "decode_tokens_per_s_per_gpu": float(self.decode_tokens_per_s_per_gpu),
            "decode_itl_ms": float(self.decode_itl_ms),
            "requests_per_s_per_gpu": float(self.requests_per_s_per_gpu),
        }


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _gpu_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def estimate_engine_capacity(
    profile: EngineProfile,
    *,
    isl: float,
    osl: float,
    ttft_ms: float,
    itl_ms: float,
    prefill_gpus_per_engine: int = 1,
    decode_gpus_per_engine: int = 1,
    dynamo_literal: bool = False,
) -> EngineCapacity:
    """Per-GPU and per-engine capacity at one request shape under TTFT/ITL targets (Dynamo 0.x sizing).

    Prefill: throughput and TTFT interpolated at `isl` (clamped to the profiled ISLs); as in Dynamo the
    throughput is used whether or not the TTFT target is met (`prefill_sla_met` says which). Decode:
    `find_best_throughput_per_gpu(itl_ms, isl + osl / 2)`. See `EngineCapacity` for the derived rates.

    Args:
        profile: the engine profile (interpolators prebuilt).
        isl: mean input sequence length (tokens).
        osl: mean output sequence length (tokens).
        ttft_ms: TTFT target (ms).
        itl_ms: ITL target (ms).
        prefill_gpus_per_engine: GPUs in one prefill engine.
        decode_gpus_per_engine: GPUs in one decode engine.
        dynamo_literal: use Dynamo's exact (non-monotone) decode scan instead of the monotone one.

    Raises:
        ValueError: a length or target is not finite and > 0, or a GPU count is not an integer >= 1.
    """
    isl = _positive("isl", isl)
    osl = _positive("osl", osl)
    ttft_target_ms = _positive("ttft_ms", ttft_ms)
    itl_target_ms = _positive("itl_ms", itl_ms)
    prefill_gpus = _gpu_count("prefill_gpus_per_engine", prefill_gpus_per_engine)
    decode_gpus = _gpu_count("decode_gpus_per_engine", decode_gpus_per_engine)

    prefill = profile.prefill_interpolator
    prefill_tokens_per_s = prefill.thpt_per_gpu(isl)
    prefill_ttft_ms = prefill.ttft_ms(isl)
    point = profile.decode_interpolator.find_best_throughput_per_gpu(
        itl_target_ms, isl + osl / 2, dynamo_literal=dynamo_literal
    )
    return EngineCapacity(
        prefill_tokens_per_s_per_gpu=prefill_tokens_per_s,
        prefill_ttft_ms=prefill_ttft_ms,
        decode_tokens_per_s_per_gpu=point.thpt_per_gpu,
        decode_itl_ms=point.itl_ms,
        decode_kv_usage=point.kv_usage,
        requests_per_s_per_gpu=min(prefill_tokens_per_s / isl, point.thpt_per_gpu / osl),
        prefill_engine_rps=prefill_tokens_per_s * prefill_gpus / isl,
        decode_engine_rps=point.thpt_per_gpu * decode_gpus / osl,
        prefill_sla_met=prefill_ttft_ms <= ttft_target_ms,
        decode_sla_met=point.itl_ms <= itl_target_ms,
    )


# --------------------------------------------------------------------------------------------------------
# Loading (the only I/O)
# --------------------------------------------------------------------------------------------------------


def _looks_like_profile_dir(directory: Path) -> bool:
    return (
        (directory / PREFILL_SUBDIR).is_dir()
        or (directory / DECODE_SUBDIR).is_dir()
        or (directory / PREFILL_JSON_NAME).is_file()
        or (directory / DECODE_JSON_NAME).is_file()
    )


def _resolve_profile_dir(root: Path) -> Path:
    if not root.is_dir():
        raise ProfileError(root, "missing directory" if not root.exists() else "not a directory")
    if _looks_like_profile_dir(root):
        return root
    children = sorted(child for child in root.iterdir() if child.is_dir() and _looks_like_profile_dir(child))
    if len(children) == 1:
        return children[0]
    if not children:
        raise ProfileError(
            root,
            f"no profile: expected {PREFILL_SUBDIR}/{NPZ_NAME} or {PREFILL_JSON_NAME} here or in exactly one subfolder",
        )
    names = ", ".join(child.name for child in children)
    raise ProfileError(root, f"ambiguous profile: {len(children)} subfolders hold one ({names})")


def _find_source(profile_dir: Path, subdir: str, json_name: str) -> Path:
    """NPZ in the subfolder (Dynamo's first choice), else the JSON twin at the top (Dynamo's ConfigMap
    mount), else the JSON twin in the subfolder."""
    candidates = (profile_dir / subdir / NPZ_NAME, profile_dir / json_name, profile_dir / subdir / json_name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ProfileError(candidates[0], f"missing file (no JSON twin at {candidates[1]} or {candidates[2]} either)")


# A real profile is kilobytes (tens of points per array); this bounds what a corrupt or hostile file can make the
# loader hold in memory: the file on disk and, for an NPZ (a zip), its arrays once decompressed.
MAX_PROFILE_BYTES = 64 * 1024 * 1024


def _check_size(path: Path) -> None:
    """Refuse a profile file (or its decompressed NPZ members) over `MAX_PROFILE_BYTES`, before reading it."""
    try:
        size = path.stat().st_size
        if path.suffix == ".npz" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                size = max(size, sum(member.file_size for member in archive.infolist()))
    except (OSError, zipfile.BadZipFile) as exc:
        raise ProfileError(path, f"unreadable ({type(exc).__name__}: {exc})") from exc
    if size > MAX_PROFILE_BYTES:
        raise ProfileError(path, f"{size} bytes (decompressed), more than the {MAX_PROFILE_BYTES} a profile may hold")


def _read_arrays(path: Path) -> Mapping[str, Any]:
    """Every array of an NPZ file, or every key of a JSON object."""
    _check_size(path)
    if path.suffix == ".npz":
        try:
            loaded = np.load(path, allow_pickle=False)
            if not isinstance(loaded, Mapping):  # a bare .npy array saved under an .npz name
                raise ValueError("not an NPZ archive")
            with loaded as npz:
                return {name: npz[name] for name in npz.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ProfileError(path, f"unreadable NPZ ({type(exc).__name__}: {exc})") from exc
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ProfileError(path, f"unreadable JSON ({type(exc).__name__}: {' '.join(str(exc).split())})") from exc
    if not isinstance(data, dict):
        raise ProfileError(path, f"bad JSON: expected an object of arrays, got {type(data).__name__}")
    return data


def load_profile(
    profile_dir: str | os.PathLike[str], *, decode_grid_resolution: int = DEFAULT_GRID_RESOLUTION
) -> EngineProfile:
    """Load and validate a Dynamo pre-deployment profile and build its interpolators.

    Layouts accepted (per phase, first found wins):
    `<dir>/selected_prefill_interpolation/raw_data.npz`, then `<dir>/prefill_raw_data.json` (where Dynamo
    mounts its ConfigMap), then `<dir>/selected_prefill_interpolation/prefill_raw_data.json`; likewise
    `selected_decode_interpolation/raw_data.npz` / `decode_raw_data.json`. `profile_dir` may also be a folder
    whose single profile sits one level down (e.g. `dynamo-planner-test-profile/` holding `H200_TP1P_TP1D/`);
    with several such subfolders it is ambiguous and rejected.

    Args:
        profile_dir: the profile directory, or its parent as above.
        decode_grid_resolution: cells per decode grid axis (Dynamo: 100).

    Returns:
        The validated profile with interpolators built.

    Raises:
        ProfileError: one line naming the file and the missing/bad array (missing directory or file,
            unreadable file, missing key, wrong shape, length mismatch, non-finite or out-of-range value).
    """
    directory = _resolve_profile_dir(Path(profile_dir))
    prefill_path = _find_source(directory, PREFILL_SUBDIR, PREFILL_JSON_NAME)
    decode_path = _find_source(directory, DECODE_SUBDIR, DECODE_JSON_NAME)
    prefill = PrefillProfile.from_mapping(_read_arrays(prefill_path), source_file=str(prefill_path))
    decode = DecodeProfile.from_mapping(_read_arrays(decode_path), source_file=str(decode_path))
    return EngineProfile(
        prefill=prefill,
        decode=decode,
        source_dir=str(directory),
        decode_grid_resolution=decode_grid_resolution,
    )
