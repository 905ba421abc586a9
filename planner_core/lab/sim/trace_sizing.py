"""What a trace needs under each sizing choice (`planner capacity`): per-engine capacity and replicas at the
trace's mean and peak window, at its mean lengths and at a length quantile, under both throughput algorithms."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner_core.config import PlannerConfig
from planner_core.domain import Component
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.protocol import ThroughputPerfModel
from planner_core.traces import RequestTrace, bucket_windows


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSizingRow:
    """What a trace needs under one sizing choice: per-engine capacity and replicas at its mean and peak window.

    The latencies are each phase's at the operating point sized on: TTFT for prefill, ITL for decode (ms). When a
    phase's `*_sla_met` is False no operating point meets its target and the latency is the best (lowest) the
    model reaches; the capacity and replicas are then those of that closest point, not a size that meets the SLA.
    """

    sizing: str  # "mean" or the length quantile, e.g. "p90"
    algorithm: str  # "interpolation" (Dynamo 0.x) or "engine_capacity" (Dynamo 1.x)
    isl: float
    osl: float
    prefill_rps_per_engine: float
    decode_rps_per_engine: float
    mean_rps: float
    peak_rps: float
    prefill_replicas_mean: int
    decode_replicas_mean: int
    prefill_replicas_peak: int
    decode_replicas_peak: int
    prefill_latency_ms: float
    decode_latency_ms: float
    prefill_sla_met: bool
    decode_sla_met: bool

    @property
    def feasible(self) -> bool:
        """Whether both phases meet their targets (only then are the replicas a size that serves the SLA)."""
        return self.prefill_sla_met and self.decode_sla_met


def trace_sizing(
    trace: RequestTrace, config: PlannerConfig, perf: ThroughputPerfModel, *, window_s: float, quantile: float = 90.0
) -> list[TraceSizingRow]:
    """Capacity and replicas for a trace at its mean lengths and at a length quantile, under both algorithms.

    The request rate is the trace's mean and its busiest `window_s` window; lengths are the whole trace's mean or
    its `quantile` percentile of ISL and OSL (sizing as if every request were that long).
    """
    windows = bucket_windows(trace, window_s)
    mean_rps = trace.num_requests / max(trace.duration_s, 1e-9)
    peak_rps = max(w.num_req for w in windows) / window_s
    shapes = {
        "mean": (float(np.mean(trace.isl)), float(np.mean(trace.osl))),
        f"p{quantile:g}": (float(np.percentile(trace.isl, quantile)), float(np.percentile(trace.osl, quantile))),
    }
    fwd = perf.forward_pass_model()
    rows = []
    for sizing, (isl, osl) in shapes.items():
        for algorithm, (
            (prefill_rps, prefill_latency_ms, prefill_met),
            (decode_rps, decode_latency_ms, decode_met),
        ) in _per_engine(perf, fwd, config, isl=isl, osl=osl).items():
            rows.append(
                TraceSizingRow(
                    sizing=sizing,
                    algorithm=algorithm,
                    isl=isl,
                    osl=osl,
                    prefill_rps_per_engine=prefill_rps,
                    decode_rps_per_engine=decode_rps,
                    mean_rps=mean_rps,
                    peak_rps=peak_rps,
                    prefill_replicas_mean=_replicas(mean_rps, prefill_rps),
                    decode_replicas_mean=_replicas(mean_rps, decode_rps),
                    prefill_replicas_peak=_replicas(peak_rps, prefill_rps),
                    decode_replicas_peak=_replicas(peak_rps, decode_rps),
                    prefill_latency_ms=prefill_latency_ms,
                    decode_latency_ms=decode_latency_ms,
                    prefill_sla_met=prefill_met,
                    decode_sla_met=decode_met,
                )
            )
    return rows


# per phase: requests/s per engine, latency (ms) at that operating point, and whether it meets the target
_PhaseCapacity = tuple[float, float, bool]


def _per_engine(
    perf: ThroughputPerfModel, fwd: ForwardPassModel | None, config: PlannerConfig, *, isl: float, osl: float
) -> dict[str, tuple[_PhaseCapacity, _PhaseCapacity]]:
    """Algorithm -> (prefill, decode) capacity per engine at one request shape: profile interpolation always,
    the engine-capacity search when the model has a forward-pass model."""
    from planner_core.perf.capacity import decode_capacity, prefill_capacity

    prefill_interp = perf.prefill_capacity(isl=isl, ttft_ms=config.ttft_ms)
    decode_interp = perf.decode_capacity(isl=isl, osl=osl, itl_ms=config.itl_ms)
    per_engine = {
        "interpolation": (
            (
                prefill_interp.tokens_per_s_per_gpu * config.prefill_gpus_per_engine / isl,
                prefill_interp.latency_ms,
                prefill_interp.sla_met,
            ),
            (
                decode_interp.tokens_per_s_per_gpu * config.decode_gpus_per_engine / osl,
                decode_interp.latency_ms,
                decode_interp.sla_met,
            ),
        )
    }
    if fwd is not None:
        kv = perf.profiled_max_kv_tokens()
        prefill = prefill_capacity(
            fwd,
            config.engine_limits(Component.PREFILL, profiled_max_kv_tokens=kv),
            isl=isl,
            ttft_ms=config.ttft_ms,
        )
        decode = decode_capacity(
            fwd,
            config.engine_limits(Component.DECODE, profiled_max_kv_tokens=kv),
            isl=isl,
            osl=max(1.0, osl),
            itl_ms=config.itl_ms,
        )
        per_engine["engine_capacity"] = (
            (prefill.requests_per_s, prefill.latency_ms, prefill.sla_met),
            (decode.requests_per_s, decode.latency_ms, decode.sla_met),
        )
    return per_engine


def _replicas(rate: float, capacity: float) -> int:
    """Engines needed to serve `rate` at `capacity` requests/s each (0 where the capacity is none)."""
    return math.ceil(rate / capacity - 1e-9) if capacity > 0 else 0
