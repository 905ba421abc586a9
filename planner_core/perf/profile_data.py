"""Pre-deployment engine profiles as validated, immutable data: `PrefillProfile` and `DecodeProfile` (Dynamo's
`selected_{prefill,decode}_interpolation/raw_data.npz` arrays or their JSON twins), the file-layout names and
`ProfileError`, the one-line error every bad profile raises.

Pure: validation only; `planner_core.perf.profile.load_profile` reads the files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

PREFILL_SUBDIR = "selected_prefill_interpolation"
DECODE_SUBDIR = "selected_decode_interpolation"
NPZ_NAME = "raw_data.npz"
PREFILL_JSON_NAME = "prefill_raw_data.json"
DECODE_JSON_NAME = "decode_raw_data.json"
DEFAULT_GRID_RESOLUTION = 100  # cells per decode grid axis, as in Dynamo 0.x

FloatArray = NDArray[np.float64]


class ProfileError(ValueError):
    """A profile file is missing, unreadable or holds a missing/malformed array.

    `str(error)` is one line: `<file>: <problem>`, e.g. `.../raw_data.npz: missing array 'prefill_ttft'`.

    Attributes:
        path: the file (or directory) at fault.
        problem: what is wrong with it, naming the array where there is one.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = " ".join(problem.split())  # keep the message on one line
        super().__init__(f"{self.path}: {self.problem}")


# --------------------------------------------------------------------------------------------------------
# Profiles (validated, immutable data)
# --------------------------------------------------------------------------------------------------------


def _readonly_1d(
    source: str,
    name: str,
    value: Any,
    *,
    allow_zero: bool = False,
    expected_len: tuple[str, int] | None = None,
) -> FloatArray:
    """A validated read-only float64 copy of one profile array.

    Args:
        source: file the array came from (for error messages).
        name: the array's key in Dynamo's format, e.g. `prefill_ttft`.
        value: anything `np.asarray` accepts.
        allow_zero: accept 0 (kv usage); otherwise every value must be > 0.
        expected_len: `(other_name, length)` the array must match.

    Raises:
        ProfileError: not numeric, not 1-D, empty, wrong length, non-finite or out of range.
    """
    try:
        array = np.array(value, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise ProfileError(source, f"bad array {name!r}: not numeric ({exc})") from exc
    if array.ndim != 1:
        raise ProfileError(source, f"bad array {name!r}: expected a 1-D array, got shape {array.shape}")
    if array.size == 0:
        raise ProfileError(source, f"bad array {name!r}: empty")
    if expected_len is not None and array.size != expected_len[1]:
        other, length = expected_len
        raise ProfileError(source, f"bad array {name!r}: length {array.size} does not match {other!r} length {length}")
    finite = np.isfinite(array)
    if not finite.all():
        index = int(np.flatnonzero(~finite)[0])
        raise ProfileError(source, f"bad array {name!r}: non-finite value {array[index]} at index {index}")
    out_of_range = array < 0 if allow_zero else array <= 0
    if out_of_range.any():
        index = int(np.flatnonzero(out_of_range)[0])
        bound = "negative" if allow_zero else "non-positive"
        raise ProfileError(source, f"bad array {name!r}: {bound} value {array[index]:g} at index {index}")
    array.flags.writeable = False
    return array


def _positive_count(source: str, name: str, value: Any) -> int:
    """A positive whole number given as a scalar (JSON) or a 1-element array (NPZ stores `[n]`)."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProfileError(source, f"bad array {name!r}: not numeric ({exc})") from exc
    if array.size != 1 or array.ndim > 1:
        raise ProfileError(source, f"bad array {name!r}: expected one value, got shape {array.shape}")
    number = float(array.reshape(()))
    if not math.isfinite(number) or number <= 0 or number != round(number):
        raise ProfileError(source, f"bad array {name!r}: expected a positive whole number, got {number:g}")
    return int(number)


def _arrays_equal(left: tuple[FloatArray, ...], right: tuple[FloatArray, ...]) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(left, right, strict=True))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PrefillProfile:
    """Prefill measurements at batch 1: one row per sampled ISL.

    Arrays are validated (1-D, same length, finite, > 0) and stored as read-only float64 copies. Equality and
    hash compare the data only, not `source_file`.

    Attributes:
        isl: input sequence lengths (tokens); Dynamo key `prefill_isl`.
        ttft_ms: time to first token at that ISL (ms); `prefill_ttft`.
        thpt_per_gpu: prefill throughput (tokens/s/GPU); `prefill_thpt_per_gpu`.
        source_file: where the data came from, used in error messages.
    """

    isl: FloatArray
    ttft_ms: FloatArray
    thpt_per_gpu: FloatArray
    source_file: str = "<memory>"

    def __post_init__(self) -> None:
        src = self.source_file
        isl = _readonly_1d(src, "prefill_isl", self.isl)
        expected = ("prefill_isl", isl.size)
        ttft_ms = _readonly_1d(src, "prefill_ttft", self.ttft_ms, expected_len=expected)
        thpt = _readonly_1d(src, "prefill_thpt_per_gpu", self.thpt_per_gpu, expected_len=expected)
        unique_isl, counts = np.unique(isl, return_counts=True)
        if (counts > 1).any():
            duplicate = unique_isl[counts > 1][0]
            raise ProfileError(src, f"bad array 'prefill_isl': duplicate value {duplicate:g}")
        object.__setattr__(self, "isl", isl)
        object.__setattr__(self, "ttft_ms", ttft_ms)
        object.__setattr__(self, "thpt_per_gpu", thpt)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source_file: str = "<memory>") -> PrefillProfile:
        """Build from Dynamo's keys (`prefill_isl`, `prefill_ttft`, `prefill_thpt_per_gpu`).

        Raises:
            ProfileError: a key is missing or its array is malformed.
        """
        _require_keys(source_file, data, ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"))
        return cls(
            isl=data["prefill_isl"],
            ttft_ms=data["prefill_ttft"],
            thpt_per_gpu=data["prefill_thpt_per_gpu"],
            source_file=source_file,
        )

    def _data(self) -> tuple[FloatArray, ...]:
        return (self.isl, self.ttft_ms, self.thpt_per_gpu)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefillProfile):
            return NotImplemented
        return _arrays_equal(self._data(), other._data())

    def __hash__(self) -> int:
        return hash(tuple(a.tobytes() for a in self._data()))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DecodeProfile:
    """Decode measurements: scattered samples of (kv usage, context length) -> (ITL, throughput).

    Arrays are validated (1-D, same length, finite; kv usage >= 0, the others > 0) and stored as read-only
    float64 copies. Equality and hash compare the data only, not `source_file`.

    Attributes:
        kv_usage: active KV-cache fraction, `concurrency * context_length / max_kv_tokens`; `x_kv_usage`.
        context_length: tokens per request in the KV cache (ISL + OSL/2 when profiled); `y_context_length`.
        itl_ms: inter-token latency (ms); `z_itl`.
        thpt_per_gpu: decode throughput (tokens/s/GPU); `z_thpt_per_gpu`.
        max_kv_tokens: KV-cache capacity of one engine (tokens); `max_kv_tokens` (NPZ `[n]`, JSON `n`).
        source_file: where the data came from, used in error messages.
    """

    kv_usage: FloatArray
    context_length: FloatArray
    itl_ms: FloatArray
    thpt_per_gpu: FloatArray
    max_kv_tokens: int
    source_file: str = "<memory>"

    def __post_init__(self) -> None:
        src = self.source_file
        kv_usage = _readonly_1d(src, "x_kv_usage", self.kv_usage, allow_zero=True)
        expected = ("x_kv_usage", kv_usage.size)
        context = _readonly_1d(src, "y_context_length", self.context_length, expected_len=expected)
        itl_ms = _readonly_1d(src, "z_itl", self.itl_ms, expected_len=expected)
        thpt = _readonly_1d(src, "z_thpt_per_gpu", self.thpt_per_gpu, expected_len=expected)
        object.__setattr__(self, "kv_usage", kv_usage)
        object.__setattr__(self, "context_length", context)
        object.__setattr__(self, "itl_ms", itl_ms)
        object.__setattr__(self, "thpt_per_gpu", thpt)
        object.__setattr__(self, "max_kv_tokens", _positive_count(src, "max_kv_tokens", self.max_kv_tokens))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source_file: str = "<memory>") -> DecodeProfile:
        """Build from a mapping with Dynamo's decode keys.

        Keys: `x_kv_usage`, `y_context_length`, `z_itl`, `z_thpt_per_gpu`, `max_kv_tokens`.

        Raises:
            ProfileError: a key is missing or its array is malformed.
        """
        keys = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens")
        _require_keys(source_file, data, keys)
        return cls(
            kv_usage=data["x_kv_usage"],
            context_length=data["y_context_length"],
            itl_ms=data["z_itl"],
            thpt_per_gpu=data["z_thpt_per_gpu"],
            max_kv_tokens=data["max_kv_tokens"],
            source_file=source_file,
        )

    def _data(self) -> tuple[FloatArray, ...]:
        return (self.kv_usage, self.context_length, self.itl_ms, self.thpt_per_gpu)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DecodeProfile):
            return NotImplemented
        return self.max_kv_tokens == other.max_kv_tokens and _arrays_equal(self._data(), other._data())

    def __hash__(self) -> int:
        return hash((self.max_kv_tokens, *(a.tobytes() for a in self._data())))


def _require_keys(source: str, data: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in data:
            raise ProfileError(source, f"missing array {key!r}")
