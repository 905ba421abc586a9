"""Pre-deployment profiling, the pure part: what to measure, and how measurements become a profile.

Role: `planner profile` measures a running engine (the HTTP client is in `planner_core.lab.profiler`); this module
plans the sweep, turns the per-request measurements into the arrays of Dynamo's profile layout (the ones
`planner_core.perf.profile.load_profile` reads), and compares a measured profile with another one at the measured
points. No clock, no I/O.

The sweep follows Dynamo's profiler:

- prefill: one request at a time per prompt length (no batching, no queueing), TTFT = the time to the first
  token; per ISL the median over the repeats, throughput = ISL / TTFT per GPU;
- decode: `batch` concurrent requests whose prompts hold `context - osl/2` tokens and which generate `osl`
  tokens each, so the mean context while decoding is `context` (Dynamo's `ISL + OSL/2`); ITL = the median gap
  between consecutive tokens while all `batch` requests decode (the prompts are sent once before, so the
  engine's prefix cache skips their prefill and the decode steps are not mixed with prefill chunks);
  kv usage = batch x context / the engine's KV capacity, throughput = batch / ITL per GPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from planner_core.perf.profile import DecodeProfile, EngineProfile, PrefillProfile

__all__ = [
    "ConfigChoice",
    "rank_decode",
    "rank_prefill",
    "DEFAULT_DECODE_BATCHES",
    "DEFAULT_DECODE_CONTEXTS",
    "DEFAULT_PREFILL_ISLS",
    "Measurement",
    "ProfileComparison",
    "ProfilingError",
    "Role",
    "SweepPoint",
    "SweepSpec",
    "aggregate_profile",
    "compare_profiles",
    "compare_with",
    "parse_sweep_values",
    "plan_sweep",
    "profile_arrays",
    "steady_itl_gaps_ms",
]

# Small enough for a 2-core machine talking to an engine over HTTP; a real GPU run passes wider grids.
DEFAULT_PREFILL_ISLS = (100, 1117, 2134, 3151, 4168, 5185, 6202, 7219)  # the H200 profile's first ISLs
DEFAULT_DECODE_BATCHES = (1, 16, 48)  # 48 at context 2997 is the H200 profile's 49-request point
DEFAULT_DECODE_CONTEXTS = (350, 2997, 5644)  # the H200 profile's first context lengths


class ProfilingError(ValueError):
    """Bad sweep values or unusable measurements (one line naming the option or point)."""


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


def parse_sweep_values(option: str, text: str) -> tuple[int, ...]:
    """A comma-separated list of positive whole numbers (sorted, without repeats).

    Raises:
        ProfilingError: naming the option and the bad item, e.g. `--isls '10,x': 'x' is not a positive whole number`.
    """
    values = set()
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) <= 0:
            raise ProfilingError(f"{option} {text!r}: {item!r} is not a positive whole number")
        values.add(int(item))
    return tuple(sorted(values))


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    """What `planner profile` measures.

    Attributes:
        prefill_isls: prompt lengths (tokens) of the prefill sweep.
        prefill_repeats: requests per prompt length (the median is kept).
        decode_batches: concurrent requests of the decode sweep.
        decode_contexts: mean context per request while decoding (tokens).
        decode_osl: tokens generated per decode request.
        decode_repeats: bursts per (batch, context).
    """

    prefill_isls: tuple[int, ...] = DEFAULT_PREFILL_ISLS
    prefill_repeats: int = 3
    decode_batches: tuple[int, ...] = DEFAULT_DECODE_BATCHES
    decode_contexts: tuple[int, ...] = DEFAULT_DECODE_CONTEXTS
    decode_osl: int = 32
    decode_repeats: int = 1

    def __post_init__(self) -> None:
        for name in ("prefill_repeats", "decode_osl", "decode_repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ProfilingError(f"--{name.replace('_', '-')} {value!r}: must be a whole number >= 1")
        if self.decode_osl < 4:
            raise ProfilingError(f"--decode-osl {self.decode_osl}: must be >= 4 (ITL needs several token gaps)")
        for name in ("prefill_isls", "decode_batches", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ProfilingError(f"--{name.replace('_', '-')} {values!r}: needs positive whole numbers")
        for context in self.decode_contexts:
            if context - self.decode_osl // 2 < 1:
                raise ProfilingError(
                    f"--decode-contexts {context}: shorter than half of --decode-osl {self.decode_osl} "
                    "(the prompt would be empty)"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepPoint:
    """One measurement unit: a prefill request, or a decode burst of `batch` requests.

    `key` names it in the measurements file (a rerun skips the keys it finds there).
    """

    role: Role
    prompt_tokens: int
    max_tokens: int
    batch: int
    context: int
    repeat: int

    @property
    def key(self) -> str:
        if self.role is Role.PREFILL:
            return f"prefill/isl={self.prompt_tokens}/r={self.repeat}"
        return f"decode/batch={self.batch}/ctx={self.context}/osl={self.max_tokens}/r={self.repeat}"


def plan_sweep(spec: SweepSpec) -> tuple[SweepPoint, ...]:
    """Every point of the sweep, prefill first (shortest first), then decode (smallest batch first)."""
    points = [
        SweepPoint(role=Role.PREFILL, prompt_tokens=isl, max_tokens=1, batch=1, context=isl, repeat=r)
        for isl in spec.prefill_isls
        for r in range(spec.prefill_repeats)
    ]
    points += [
        SweepPoint(
            role=Role.DECODE,
            prompt_tokens=context - spec.decode_osl // 2,
            max_tokens=spec.decode_osl,
            batch=batch,
            context=context,
            repeat=r,
        )
        for batch in spec.decode_batches
        for context in spec.decode_contexts
        for r in range(spec.decode_repeats)
    ]
    return tuple(points)


def steady_itl_gaps_ms(token_times_s: Sequence[Sequence[float]]) -> list[float]:
    """Inter-token gaps (ms) of a decode burst, only those while every stream of the burst had started decoding.

    `token_times_s[i]` are the arrival times of stream i's tokens (any common origin). A gap counts if it starts at
    or after the last stream's first token: before that, the engine may still be prefilling a late request and
    its steps are not pure decode steps at this batch. If no gap qualifies (a stream finished before the last
    one started), all gaps are returned, so a short burst still measures something; its error then shows in the
    comparison.
    """
    firsts = [times[0] for times in token_times_s if times]
    if not firsts:
        return []
    all_started_s = max(firsts)
    steady: list[float] = []
    every: list[float] = []
    for times in token_times_s:
        for earlier, later in zip(times, times[1:], strict=False):
            gap_ms = (later - earlier) * 1000.0
            every.append(gap_ms)
            if earlier >= all_started_s:
                steady.append(gap_ms)
    return steady if steady else every


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """What one sweep point measured (one line of the measurements file).

    Attributes:
        key: the point's key.
        role, batch, context: as planned.
        prompt_tokens: prompt tokens per request as the engine counted them (its usage report; else as sent).
        ttft_ms: prefill: the TTFT of the request; decode: the median TTFT of the burst.
        itl_ms: decode: the median steady inter-token gap of the burst (None for prefill).
        num_gaps: decode: how many gaps the median is over.
    """

    key: str
    role: Role
    batch: int
    context: int
    prompt_tokens: int
    ttft_ms: float
    itl_ms: float | None = None
    num_gaps: int = 0

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "role": self.role.value,
            "batch": self.batch,
            "context": self.context,
            "prompt_tokens": self.prompt_tokens,
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "num_gaps": self.num_gaps,
        }

    @classmethod
    def from_json(cls, data: dict, *, where: str) -> Measurement:
        """Parse one line of the measurements file.

        Raises:
            ProfilingError: `<where>: field <name>: <problem>`.
        """
        try:
            role = Role(data["role"])
            itl = data.get("itl_ms")
            out = cls(
                key=str(data["key"]),
                role=role,
                batch=int(data["batch"]),
                context=int(data["context"]),
                prompt_tokens=int(data["prompt_tokens"]),
                ttft_ms=float(data["ttft_ms"]),
                itl_ms=None if itl is None else float(itl),
                num_gaps=int(data.get("num_gaps", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfilingError(f"{where}: bad measurement ({type(exc).__name__}: {exc})") from exc
        if not (math.isfinite(out.ttft_ms) and out.ttft_ms > 0):
            raise ProfilingError(f"{where}: field ttft_ms: {out.ttft_ms!r} is not a positive number")
        if role is Role.DECODE and (out.itl_ms is None or not (math.isfinite(out.itl_ms) and out.itl_ms > 0)):
            raise ProfilingError(f"{where}: field itl_ms: {out.itl_ms!r} is not a positive number")
        return out


def aggregate_profile(
    measurements: Iterable[Measurement], *, max_kv_tokens: int, gpus_per_engine: int = 1, source: str = "<memory>"
) -> tuple[PrefillProfile, DecodeProfile]:
    """The profile arrays from the measurements: medians per prompt length and per (batch, context).

    Args:
        measurements: the points measured (any order; repeats are merged by their median).
        max_kv_tokens: the engine's KV-cache capacity (tokens), the denominator of kv usage.
        gpus_per_engine: GPUs of the measured engine (throughputs are per GPU).
        source: named in errors.

    Raises:
        ProfilingError: no prefill or no decode measurement, or a non-positive capacity.
    """
    if max_kv_tokens < 1 or gpus_per_engine < 1:
        raise ProfilingError(
            f"{source}: max_kv_tokens {max_kv_tokens} and gpus_per_engine {gpus_per_engine} must be >= 1"
        )
    prefill: dict[int, list[float]] = {}
    decode: dict[tuple[int, int], list[float]] = {}
    for m in measurements:
        if m.role is Role.PREFILL:
            prefill.setdefault(m.prompt_tokens, []).append(m.ttft_ms)
        elif m.itl_ms is not None:
            decode.setdefault((m.batch, m.context), []).append(m.itl_ms)
    if not prefill:
        raise ProfilingError(f"{source}: no prefill measurement")
    if not decode:
        raise ProfilingError(f"{source}: no decode measurement")
    isls = sorted(prefill)
    ttft = [statistics.median(prefill[isl]) for isl in isls]
    prefill_profile = PrefillProfile(
        isl=isls,
        ttft_ms=ttft,
        thpt_per_gpu=[isl / (t / 1000.0) / gpus_per_engine for isl, t in zip(isls, ttft, strict=True)],
        source_file=source,
    )
    cells = sorted(decode, key=lambda bc: (bc[1], bc[0]))  # Dynamo's order: by context, then by load
    itl = [statistics.median(decode[cell]) for cell in cells]
    decode_profile = DecodeProfile(
        kv_usage=[batch * context / max_kv_tokens for batch, context in cells],
        context_length=[context for _, context in cells],
        itl_ms=itl,
        thpt_per_gpu=[batch / (i / 1000.0) / gpus_per_engine for (batch, _), i in zip(cells, itl, strict=True)],
        max_kv_tokens=max_kv_tokens,
        source_file=source,
    )
    return prefill_profile, decode_profile


def profile_arrays(prefill: PrefillProfile, decode: DecodeProfile) -> tuple[dict, dict]:
    """Dynamo's keys and values (lists) for `prefill_raw_data` and `decode_raw_data` (NPZ and JSON alike)."""
    return (
        {
            "prefill_isl": prefill.isl.tolist(),
            "prefill_ttft": prefill.ttft_ms.tolist(),
            "prefill_thpt_per_gpu": prefill.thpt_per_gpu.tolist(),
        },
        {
            "x_kv_usage": decode.kv_usage.tolist(),
            "y_context_length": decode.context_length.tolist(),
            "z_itl": decode.itl_ms.tolist(),
            "z_thpt_per_gpu": decode.thpt_per_gpu.tolist(),
            "max_kv_tokens": decode.max_kv_tokens,
        },
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileComparison:
    """Measured vs reference at the measured points, per role: relative errors `measured / reference - 1`.

    `rows` holds one tuple per point: (role, x, y, measured_ms, reference_ms, relative_error), x = ISL (prefill)
    or batch (decode), y = ISL (prefill) or context (decode).
    """

    rows: tuple[tuple[str, float, float, float, float, float], ...]

    def errors(self, role: Role) -> list[float]:
        return [row[5] for row in self.rows if row[0] == role.value]

    def median_abs(self, role: Role) -> float:
        return statistics.median(abs(e) for e in self.errors(role))

    def worst(self, role: Role) -> float:
        """The error of largest magnitude (signed)."""
        return max(self.errors(role), key=abs)


def compare_with(
    measured: EngineProfile,
    ttft_ms_at: Callable[[float], float],
    itl_ms_at: Callable[[float, float], float],
) -> ProfileComparison:
    """Compare a measured profile with a timing model at the measured points: `ttft_ms_at(isl)` for each prefill
    point, `itl_ms_at(batch, context)` for each decode point."""
    rows: list[tuple[str, float, float, float, float, float]] = []
    for isl, ttft in zip(measured.prefill.isl, measured.prefill.ttft_ms, strict=True):
        ref = float(ttft_ms_at(float(isl)))
        rows.append((Role.PREFILL.value, float(isl), float(isl), float(ttft), ref, float(ttft) / ref - 1.0))
    dec = measured.decode
    batches = np.round(dec.kv_usage * dec.max_kv_tokens / dec.context_length)
    for batch, context, itl in zip(batches, dec.context_length, dec.itl_ms, strict=True):
        ref = float(itl_ms_at(float(batch), float(context)))
        rows.append((Role.DECODE.value, float(batch), float(context), float(itl), ref, float(itl) / ref - 1.0))
    return ProfileComparison(rows=tuple(rows))


def compare_profiles(
    measured: EngineProfile, reference: EngineProfile, *, time_scale: float = 1.0
) -> ProfileComparison:
    """Compare a measured profile with a reference profile at the measured points.

    Prefill: the reference's TTFT spline at each measured ISL. Decode: the reference's ITL linearly interpolated
    over its own samples at the measured (kv usage, context), kv usage in the reference's units (batch x context /
    its max_kv_tokens), so the two engines' KV capacities need not agree; outside the reference's samples the
    nearest sample. `time_scale` multiplies the reference's latencies (an engine run that much slower).
    """
    from scipy.interpolate import griddata

    ref_dec = reference.decode
    samples = np.column_stack([ref_dec.kv_usage, ref_dec.context_length])

    def itl_ms_at(batch: float, context: float) -> float:
        query = np.array([[batch * context / ref_dec.max_kv_tokens, context]])
        value = griddata(samples, ref_dec.itl_ms, query, method="linear")[0]
        if np.isnan(value):
            value = griddata(samples, ref_dec.itl_ms, query, method="nearest")[0]
        return float(value) * time_scale

    return compare_with(measured, lambda isl: reference.prefill_interpolator.ttft_ms(isl) * time_scale, itl_ms_at)


# --------------------------------------------------------------------------------------------------------
# Choosing a parallel configuration per role from estimates (`planner profile --aic`)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigChoice:
    """One parallel configuration of one role at the target request shape.

    Attributes:
        role: prefill or decode.
        config: its label, e.g. `TP2`.
        num_gpus: GPUs per engine.
        latency_ms: prefill: TTFT at the target ISL (batch 1); decode: ITL at the chosen batch.
        batch: decode: the largest batch of the grid meeting the ITL target and fitting in memory (else 1).
        thpt_per_gpu: tokens/s/GPU at that point (prefill: ISL / TTFT; decode: batch / ITL), per GPU.
        meets_sla: the latency meets the role's target.
        reason: why it cannot be chosen, or "" (e.g. `ttft_over_target`, `no_batch_meets_itl`).
    """

    role: Role
    config: str
    num_gpus: int
    latency_ms: float
    batch: int
    thpt_per_gpu: float
    meets_sla: bool
    reason: str = ""


def _ranked(choices: list[ConfigChoice]) -> tuple[ConfigChoice, ...]:
    # those meeting the SLA first, by throughput per GPU; then the others by latency (closest to the target)
    return tuple(sorted(choices, key=lambda c: (not c.meets_sla, -c.thpt_per_gpu if c.meets_sla else c.latency_ms)))


def rank_prefill(
    ttft_ms_by_config: dict[tuple[str, int], float], *, isl: int, ttft_target_ms: float
) -> tuple[ConfigChoice, ...]:
    """Prefill configurations at batch 1 and the target ISL, best first.

    Args:
        ttft_ms_by_config: `(label, num_gpus) -> TTFT (ms)` at `isl`.
    """
    choices = [
        ConfigChoice(
            role=Role.PREFILL,
            config=label,
            num_gpus=gpus,
            latency_ms=ttft,
            batch=1,
            thpt_per_gpu=isl / (ttft / 1000.0) / gpus,
            meets_sla=ttft <= ttft_target_ms,
            reason="" if ttft <= ttft_target_ms else "ttft_over_target",
        )
        for (label, gpus), ttft in ttft_ms_by_config.items()
    ]
    return _ranked(choices)


def rank_decode(
    itl_ms_by_config: dict[tuple[str, int], dict[int, tuple[float, bool]]], *, itl_target_ms: float
) -> tuple[ConfigChoice, ...]:
    """Decode configurations at the target context, best first.

    Args:
        itl_ms_by_config: `(label, num_gpus) -> {batch: (ITL ms, fits in memory)}` at the target context.
    """
    choices = []
    for (label, gpus), by_batch in itl_ms_by_config.items():
        fitting = {b: itl for b, (itl, fits) in by_batch.items() if fits}
        meeting = [b for b, itl in fitting.items() if itl <= itl_target_ms]
        if meeting:
            batch = max(meeting)
            reason = ""
        elif fitting:
            batch, reason = min(fitting), "no_batch_meets_itl"
        else:
            batch, reason = min(by_batch), "does_not_fit_memory"
        itl = by_batch[batch][0]
        choices.append(
            ConfigChoice(
                role=Role.DECODE,
                config=label,
                num_gpus=gpus,
                latency_ms=itl,
                batch=batch,
                thpt_per_gpu=batch / (itl / 1000.0) / gpus,
                meets_sla=not reason,
                reason=reason,
            )
        )
    return _ranked(choices)
