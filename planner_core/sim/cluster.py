"""A simple fluid simulator of a disaggregated prefill/decode cluster driven by a request trace.

Time advances in fixed slices. In each slice the ready workers of each pool serve the requests that arrive:
- prefill: the pool serves `ready * tokens/s/GPU(ISL) * GPUs` prompt tokens per second; work beyond that is
  carried to the next slice as a backlog. A request's TTFT is its profiled TTFT plus the M/D/1 queueing wait
  `rho * S / (2 * (1 - rho))` at utilisation `rho` and the time to drain the backlog ahead of it;
- decode: each worker holds `c` concurrent requests, found from Little's law `c = lambda_w * OSL * ITL(c)`;
  ITL comes from the decode profile at that concurrency and context `ISL + OSL / 2`; beyond the KV-cache
  capacity ITL stretches in proportion to the overload.
A new worker becomes ready `startup_s` after it is requested; a removed worker leaves at once (pending starts
are cancelled first). GPU-seconds accrue on ready and starting workers (a starting worker holds its GPUs).

This is the thin first version; it is deterministic for a given trace and target timeline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from planner_core.domain import Component, TrafficObservation
from planner_core.perf.model import ProfilePerfModel
from planner_core.traces import RequestTrace

MAX_TTFT_MS = 600_000.0  # a request stuck behind an unserved backlog is reported at 10 min, not infinity


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceStats:
    """What happened in one slice of simulated time."""

    start_s: float
    end_s: float
    ready_prefill: int
    ready_decode: int
    num_req: int
    num_sla_met: int
    sum_ttft_ms: float
    sum_itl_ms: float
    gpu_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    ttft_ms: float
    itl_ms: float
    startup_s: float = 120.0
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1
    slice_s: float = 10.0


@dataclass(slots=True)
class SimulatedCluster:
    """Mutable simulation of one cluster; `now_s` is the offset from the trace's first request."""

    trace: RequestTrace
    perf: ProfilePerfModel
    spec: ClusterSpec
    ready: dict[Component, int]
    now_s: float = 0.0
    prefill_backlog_tokens: float = 0.0
    pending: list[tuple[float, Component]] = field(default_factory=list)  # (ready at, pool), one per worker
    slices: list[SliceStats] = field(default_factory=list)
    # Per-request latencies, one array per simulated slice in arrival order, kept only when asked for (the
    # metrics exporter observes every request; the demo needs only the slice sums).
    keep_request_latencies: bool = False
    request_ttft_ms: list[np.ndarray] = field(default_factory=list)
    request_itl_ms: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        trace: RequestTrace,
        perf: ProfilePerfModel,
        spec: ClusterSpec,
        *,
        num_prefill: int,
        num_decode: int,
    ) -> SimulatedCluster:
        return cls(
            trace=trace,
            perf=perf,
            spec=spec,
            ready={Component.PREFILL: num_prefill, Component.DECODE: num_decode},
        )

    def expected(self, component: Component) -> int:
        return self.ready[component] + sum(1 for _, c in self.pending if c is component)

    def apply_targets(self, num_prefill: int, num_decode: int) -> None:
        """Move towards the targets at `now_s`: start workers (ready after start-up) or remove them."""
        if num_prefill < 0 or num_decode < 0:
            raise ValueError(f"worker targets must be >= 0, got prefill {num_prefill}, decode {num_decode}")
        for component, target in ((Component.PREFILL, num_prefill), (Component.DECODE, num_decode)):
            delta = target - self.expected(component)
            for _ in range(max(0, delta)):
                self.pending.append((self.now_s + self.spec.startup_s, component))
            for _ in range(max(0, -delta)):
                starting = [i for i, (_, c) in enumerate(self.pending) if c is component]
                if starting:
                    self.pending.pop(starting[-1])  # cancel the most recent start first
                else:
                    self.ready[component] -= 1

    def advance(self, to_s: float) -> list[SliceStats]:
        """Simulate up to `to_s`; returns the slices simulated."""
        new_slices = []
        while self.now_s < to_s - 1e-9:
            end_s = min(to_s, self.now_s + self.spec.slice_s)
            self._activate_started(self.now_s)
            new_slices.append(self._simulate_slice(self.now_s, end_s))
            self.now_s = end_s
        self._activate_started(self.now_s)
        self.slices.extend(new_slices)
        return new_slices

    def observe(self, start_s: float, end_s: float) -> TrafficObservation:
        """Frontend metrics over [start_s, end_s): the trace's traffic plus the simulated mean TTFT and ITL."""
        traffic = self.trace.observe(start_s, end_s)
        window = [s for s in self.slices if s.start_s >= start_s - 1e-9 and s.end_s <= end_s + 1e-9]
        num_req = sum(s.num_req for s in window)
        if num_req == 0:
            return traffic
        return dataclasses.replace(
            traffic,
            ttft_ms=sum(s.sum_ttft_ms for s in window) / num_req,
            itl_ms=sum(s.sum_itl_ms for s in window) / num_req,
        )

    def _activate_started(self, at_s: float) -> None:
        still_pending = []
        for ready_at_s, component in self.pending:
            if ready_at_s <= at_s + 1e-9:
                self.ready[component] += 1
            else:
                still_pending.append((ready_at_s, component))
        self.pending = still_pending

    def _simulate_slice(self, start_s: float, end_s: float) -> SliceStats:
        spec = self.spec
        duration_s = end_s - start_s
        num_prefill, num_decode = self.ready[Component.PREFILL], self.ready[Component.DECODE]
        num_starting_gpus = sum(
            spec.prefill_gpus_per_engine if c is Component.PREFILL else spec.decode_gpus_per_engine
            for _, c in self.pending
        )
        gpu_s = (
            num_prefill * spec.prefill_gpus_per_engine + num_decode * spec.decode_gpus_per_engine + num_starting_gpus
        ) * duration_s
        idx = self.trace.window(start_s, end_s)
        isl, osl = self.trace.isl[idx], self.trace.osl[idx]
        ttft_ms, itl_ms = (
            self._prefill(isl, duration_s, num_prefill),
            self._decode(isl, osl, duration_s, num_decode),
        )
        met = int(np.count_nonzero((ttft_ms <= spec.ttft_ms) & (itl_ms <= spec.itl_ms))) if len(isl) else 0
        if self.keep_request_latencies:
            self.request_ttft_ms.append(ttft_ms)
            self.request_itl_ms.append(itl_ms)
        return SliceStats(
            start_s=start_s,
            end_s=end_s,
            ready_prefill=num_prefill,
            ready_decode=num_decode,
            num_req=len(isl),
            num_sla_met=met,
            sum_ttft_ms=float(ttft_ms.sum()),
            sum_itl_ms=float(itl_ms.sum()),
            gpu_s=gpu_s,
        )

    def _prefill(self, isl: np.ndarray, duration_s: float, num_prefill: int) -> np.ndarray:
        """Per-request TTFT (ms) in this slice; updates the carried backlog."""
        tokens = float(isl.sum())
        if num_prefill <= 0:
            self.prefill_backlog_tokens += tokens
            return np.full(len(isl), MAX_TTFT_MS)
        mean_isl = float(isl.mean()) if len(isl) else 1000.0
        pool_tokens_per_s = (
            num_prefill * self.perf.prefill_tokens_per_s_per_gpu(mean_isl) * self.spec.prefill_gpus_per_engine
        )
        backlog_before = self.prefill_backlog_tokens
        self.prefill_backlog_tokens = max(0.0, backlog_before + tokens - pool_tokens_per_s * duration_s)
        if not len(isl):
            return np.zeros(0)
        rho = min(0.99, tokens / (pool_tokens_per_s * duration_s))
        service_ms = self.perf.prefill_ttft_ms(mean_isl)
        queue_wait_ms = rho * service_ms / (2.0 * (1.0 - rho))
        backlog_wait_ms = 1000.0 * (backlog_before + self.prefill_backlog_tokens) / 2.0 / pool_tokens_per_s
        base_ms = np.array([self.perf.prefill_ttft_ms(float(v)) for v in isl])
        return np.minimum(MAX_TTFT_MS, base_ms + queue_wait_ms + backlog_wait_ms)

    def _decode(self, isl: np.ndarray, osl: np.ndarray, duration_s: float, num_decode: int) -> np.ndarray:
        """ITL (ms) of the requests in this slice (one figure for the slice: the pool's steady state)."""
        if not len(isl):
            return np.zeros(0)
        if num_decode <= 0:
            return np.full(len(isl), MAX_TTFT_MS)
        context = float(isl.mean() + osl.mean() / 2.0)
        arrivals_per_s_per_worker = len(isl) / duration_s / num_decode
        max_concurrency = max(1.0, self.perf.max_kv_tokens / context)
        concurrency = 1.0
        for _ in range(50):  # damped fixed point of Little's law: c = lambda * OSL * ITL(c)
            itl_s = self.perf.decode_itl_ms(min(concurrency, max_concurrency), context) / 1000.0
            target = max(1.0, arrivals_per_s_per_worker * float(osl.mean()) * itl_s)
            if abs(target - concurrency) < 1e-3:
                break
            concurrency = 0.5 * concurrency + 0.5 * target
        itl_ms = self.perf.decode_itl_ms(min(concurrency, max_concurrency), context)
        if concurrency > max_concurrency:
            itl_ms *= concurrency / max_concurrency  # requests wait for KV space: tokens come out slower
        return np.full(len(isl), itl_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """Totals over a simulated run."""

    num_req: int
    num_sla_met: int
    gpu_hours: float
    mean_ttft_ms: float
    mean_itl_ms: float

    @property
    def sla_attainment(self) -> float:
        return self.num_sla_met / self.num_req if self.num_req else 1.0


def summarise(slices: list[SliceStats]) -> RunSummary:
    num_req = sum(s.num_req for s in slices)
    return RunSummary(
        num_req=num_req,
        num_sla_met=sum(s.num_sla_met for s in slices),
        gpu_hours=sum(s.gpu_s for s in slices) / 3600.0,
        mean_ttft_ms=sum(s.sum_ttft_ms for s in slices) / num_req if num_req else 0.0,
        mean_itl_ms=sum(s.sum_itl_ms for s in slices) / num_req if num_req else 0.0,
    )
