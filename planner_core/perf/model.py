"""`ProfilePerfModel`: the throughput loop's and the simulator's view of a profiled engine.

Wraps a loaded `EngineProfile` (interpolators built once) behind the queries the policy (`ThroughputPerfModel`)
and the simulator need. Queries are pure; the model never changes after loading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.profile import EngineProfile, load_profile
from planner_core.perf.profile_forward import ProfileForwardPassModel
from planner_core.perf.protocol import PhaseCapacity


@dataclass(frozen=True, slots=True)
class ProfilePerfModel:
    """Engine capacity and latency from pre-deployment profiling data."""

    profile: EngineProfile
    # The loops' bootstrap forward-pass model: a precomputed perf table if given to `load`, else the profile's.
    forward: ForwardPassModel | None = None

    @classmethod
    def load(
        cls, profile_dir: str | os.PathLike[str], *, perf_table: str | os.PathLike[str] | None = None
    ) -> ProfilePerfModel:
        profile = load_profile(profile_dir)
        if perf_table is not None:
            from planner_core.perf.table import TablePerfModel

            return cls(profile, TablePerfModel.load(perf_table))
        return cls(profile, ProfileForwardPassModel.from_engine_profile(profile))

    def forward_pass_model(self) -> ForwardPassModel | None:
        return self.forward

    def profiled_max_kv_tokens(self) -> int | None:
        return int(self.profile.decode.max_kv_tokens)

    @property
    def max_kv_tokens(self) -> float:
        return float(self.profile.decode.max_kv_tokens)

    def prefill_ttft_ms(self, isl: float) -> float:
        return self.profile.prefill_interpolator.ttft_ms(isl)

    def prefill_tokens_per_s_per_gpu(self, isl: float) -> float:
        return self.profile.prefill_interpolator.thpt_per_gpu(isl)

    def decode_itl_ms(self, concurrency: float, context_length: float) -> float:
        return self.profile.decode_interpolator.itl_ms(concurrency, context_length)

    def prefill_capacity(self, *, isl: float, ttft_ms: float) -> PhaseCapacity:
        """Prefill tokens/s/GPU at batch 1 for this ISL (the profile is measured at batch 1)."""
        latency_ms = self.prefill_ttft_ms(isl)
        return PhaseCapacity(
            tokens_per_s_per_gpu=self.prefill_tokens_per_s_per_gpu(isl),
            latency_ms=latency_ms,
            sla_met=latency_ms <= ttft_ms,
        )

    def decode_capacity(self, *, isl: float, osl: float, itl_ms: float) -> PhaseCapacity:
        """Best decode tokens/s/GPU whose ITL meets the target, at context ISL + OSL/2."""
        point = self.profile.decode_interpolator.find_best_throughput_per_gpu(itl_ms, isl + osl / 2.0)
        return PhaseCapacity(
            tokens_per_s_per_gpu=point.thpt_per_gpu, latency_ms=point.itl_ms, sla_met=point.itl_ms <= itl_ms
        )
