"""`planner profile --aic`: a profile from aiconfigurator estimates, for the best parallel configuration per role.

Role: I/O around `planner_core.perf.profiling.rank_prefill` / `rank_decode`. For every tensor-parallel size of the
grid it asks aiconfigurator (through `planner_core.lab.aic.run_estimates`, the worker `planner perf-table` uses)
for the prefill TTFT at batch 1 over an ISL grid and the decode step time over a batch x context grid, then ranks
the configurations per role under the SLA at the target request shape (the most tokens/s/GPU meeting the target,
as Dynamo's profiler picks) and builds the chosen configurations' profile arrays.

Decode estimates are `static_gen` steps (one generation step of `batch` sequences holding `context` tokens), so
the decode ITL of a point is that step time; prefill estimates are `static_ctx` (one context pass of one prompt).
aiconfigurator reports no KV capacity: the profile's `max_kv_tokens` is the most `batch x context` among the
chosen decode configuration's points that aiconfigurator says fit in memory (a lower bound of the capacity).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner_core.lab.aic import AicError, AicEstimate, PerfTableSpec, run_estimates
from planner_core.perf.profile import DecodeProfile, PrefillProfile
from planner_core.perf.profiling import ConfigChoice, rank_decode, rank_prefill

__all__ = ["GPU_SYSTEMS", "AicProfileResult", "AicProfileSpec", "profile_from_aic"]

# The GPU names users type -> aiconfigurator's system names (those with data in aiconfigurator 0.12).
GPU_SYSTEMS = {
    "H100": "h100_sxm",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "B300": "b300_sxm",
    "GB200": "gb200",
    "GB300": "gb300",
    "A100": "a100_sxm",
    "L40S": "l40s",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AicProfileSpec:
    """What to estimate. `isl`/`osl` and the targets choose the configuration; the grids make the profile."""

    model: str
    gpu: str
    isl: int
    osl: int
    ttft_ms: float
    itl_ms: float
    backend: str = "vllm"
    aic_model: str | None = None
    gemm_quant: str | None = None
    kvcache_quant: str | None = None
    tp_grid: tuple[int, ...] = (1, 2, 4, 8)
    isl_grid: tuple[int, ...] = (128, 512, 1024, 2048, 4096, 8192)
    # the choice is made at the target context, so the batch grid is finer there than at the profile's other contexts
    choice_batch_grid: tuple[int, ...] = (1, 4, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    decode_batch_grid: tuple[int, ...] = (1, 4, 16, 64, 128, 256, 512)
    ctx_grid: tuple[int, ...] = (1024, 8192)

    @property
    def system(self) -> str:
        try:
            return GPU_SYSTEMS[self.gpu.upper()]
        except KeyError:
            known = ", ".join(GPU_SYSTEMS)
            raise AicError(f"--gpu {self.gpu}: not one aiconfigurator has data for ({known})") from None

    @property
    def target_context(self) -> int:
        return self.isl + self.osl // 2

    def calls(self) -> list[tuple[str, int, int, int, dict]]:
        """`(role, tp, batch, isl or context, cli_estimate keywords)` per estimate."""
        out = []
        isls = sorted({*self.isl_grid, self.isl})
        contexts = sorted({*self.ctx_grid, self.target_context})
        for tp in self.tp_grid:
            base = PerfTableSpec(
                model=self.model,
                system=self.system,
                backend=self.backend,
                tp=tp,
                aic_model=self.aic_model,
                gemm_quant=self.gemm_quant,
                kvcache_quant=self.kvcache_quant,
            ).base_call()
            out += [
                ("prefill", tp, 1, isl, {**base, "mode": "static_ctx", "batch_size": 1, "isl": isl, "osl": 1})
                for isl in isls
            ]
            out += [
                ("decode", tp, b, ctx, {**base, "mode": "static_gen", "batch_size": b, "isl": ctx, "osl": 2})
                for ctx in contexts
                for b in (self.choice_batch_grid if ctx == self.target_context else self.decode_batch_grid)
            ]
        return out


@dataclass(frozen=True, slots=True)
class AicProfileResult:
    prefill_ranking: tuple[ConfigChoice, ...]
    decode_ranking: tuple[ConfigChoice, ...]
    prefill: PrefillProfile
    decode: DecodeProfile
    aiconfigurator_version: str
    num_estimates: int
    num_failed: int


def _label(tp: int) -> str:
    return f"TP{tp}"


def profile_from_aic(
    spec: AicProfileSpec, *, aic_python: str, on_estimate: Callable[[AicEstimate], None] | None = None
) -> AicProfileResult:
    """Estimate, rank, and build the chosen configurations' profile.

    Raises:
        AicError: aiconfigurator failed, or no configuration has a usable estimate for a role.
    """
    calls = spec.calls()
    version, estimates = run_estimates([c[4] for c in calls], aic_python=aic_python, on_estimate=on_estimate)
    prefill_points: dict[int, dict[int, float]] = {}
    decode_points: dict[int, dict[tuple[int, int], tuple[float, bool]]] = {}
    failed = 0
    for (role, tp, batch, length, _), estimate in zip(calls, estimates, strict=True):
        if estimate.error is not None:
            failed += 1
            continue
        if role == "prefill" and estimate.ttft_ms:
            prefill_points.setdefault(tp, {})[length] = estimate.ttft_ms
        elif role == "decode" and estimate.tpot_ms:
            decode_points.setdefault(tp, {})[(batch, length)] = (estimate.tpot_ms, estimate.fits_memory is not False)
    at_isl = {(_label(tp), tp): pts[spec.isl] for tp, pts in prefill_points.items() if spec.isl in pts}
    at_ctx = {
        (_label(tp), tp): {b: v for (b, ctx), v in pts.items() if ctx == spec.target_context}
        for tp, pts in decode_points.items()
    }
    at_ctx = {key: value for key, value in at_ctx.items() if value}
    if not at_isl or not at_ctx:
        raise AicError(
            f"aiconfigurator gave no usable {'prefill' if not at_isl else 'decode'} estimate for {spec.model} on "
            f"{spec.system} ({failed} of {len(calls)} estimates failed)"
        )
    prefill_ranking = rank_prefill(at_isl, isl=spec.isl, ttft_target_ms=spec.ttft_ms)
    decode_ranking = rank_decode(at_ctx, itl_target_ms=spec.itl_ms)
    p_tp, d_tp = prefill_ranking[0].num_gpus, decode_ranking[0].num_gpus
    isls = sorted(prefill_points[p_tp])
    ttfts = [prefill_points[p_tp][isl] for isl in isls]
    prefill = PrefillProfile(
        isl=isls,
        ttft_ms=ttfts,
        thpt_per_gpu=[isl / (t / 1000.0) / p_tp for isl, t in zip(isls, ttfts, strict=True)],
        source_file=f"aiconfigurator {version} {_label(p_tp)}",
    )
    cells = sorted(
        ((b, ctx) for (b, ctx), (_, fits) in decode_points[d_tp].items() if fits), key=lambda bc: (bc[1], bc[0])
    )
    if not cells:
        raise AicError(f"aiconfigurator: no decode point of {_label(d_tp)} fits in memory")
    max_kv = max(b * ctx for b, ctx in cells)
    itls = [decode_points[d_tp][cell][0] for cell in cells]
    decode = DecodeProfile(
        kv_usage=[b * ctx / max_kv for b, ctx in cells],
        context_length=[ctx for _, ctx in cells],
        itl_ms=itls,
        thpt_per_gpu=[b / (i / 1000.0) / d_tp for (b, _), i in zip(cells, itls, strict=True)],
        max_kv_tokens=max_kv,
        source_file=f"aiconfigurator {version} {_label(d_tp)}",
    )
    return AicProfileResult(
        prefill_ranking=prefill_ranking,
        decode_ranking=decode_ranking,
        prefill=prefill,
        decode=decode,
        aiconfigurator_version=version,
        num_estimates=len(calls),
        num_failed=failed,
    )
