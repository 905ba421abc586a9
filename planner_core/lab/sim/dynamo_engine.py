"""`planner bench --engine dynamo`: the bench's policies served by Dynamo 1.6.1's offline replay instead of our
simulator.

Role: a second grader. Dynamo's Rust replay (its mocker engines, router and worker lifecycle) serves the trace in
a subprocess run with Dynamo's virtualenv (`planner_core/lab/dynamo/run_replay.py`); the scaling policy sits in its
loop: at each tick Dynamo calls the policy with a snapshot of the cluster, and applies the absolute targets it
answers. By policy:

- `fixed:P:D`, `static-peak`, `static-mean`: no policy object (the pools keep their initial sizes);
- `dynamo-1.6.1`, `dynamo-1.6.1-load`: Dynamo's own `ReplayPlannerAdapter`, built inside the subprocess as
  `run_planner.py` builds it (Dynamo's replay as Dynamo runs it);
- the planner presets, config files and the oracle: the tick comes back to this process over the bridge's
  line-delimited JSON, where `ReplayView` gives the policy the simulator's interface (`worker_counts`,
  `latest_fpm`, `observe`, `set_targets`) over the snapshots, and the policy's `decide` (for a planner,
  `Planner.decide` through `PlannerPolicy`) is the same call as on our simulator.

What the planner observes each tick comes from `window_observation` (`planner_core.lab.sim.des`), the function our
simulator's `observe` also calls: request count, lengths, their percentiles and the prompt-arrival curve from the
trace's arrivals in the window (the same requests Dynamo replays, on the same clock), and the mean TTFT / ITL and
prefix-cache hit rate from Dynamo's per-tick traffic windows (merged over the window, weighted by Dynamo's own
sample counts). The differences from our simulator: Dynamo counts TTFT/ITL samples as its replay records them
(our simulator averages the requests whose first or last token came in the window); the forward-pass snapshots
are Dynamo's (its engines' scheduled and queued work), and the worker counts are Dynamo's active and
non-draining workers.

Scoring is `score` (`planner_core.lab.sim.bench`) on Dynamo's per-request records (TTFT, mean ITL, arrival plus
end-to-end latency as the finish); GPU-hours are Dynamo's own (`summary.gpu_hours`: worker-seconds from the scale
request to removal, times GPUs per worker); scaling events are its planner-caused lifecycle operations (one per
pool change).

The oracle (`replay_oracle_windows`) is the per-window search of `planner_core.lab.sim.oracle` replayed in
Dynamo's engine: each candidate size replays the window with its context, both pools together (Dynamo's engine
cannot run one pool alone), see that function.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from planner_core.lab.sim.bench import (
    FixedPolicy,
    OraclePolicy,
    PolicyRun,
    ScalingPolicy,
    baselines_from_windows,
    score,
)
from planner_core.lab.sim.des import RouterPolicy, SimResult, SimSpec
from planner_core.lab.sim.dynamo_policy import DynamoPlannerPolicy
from planner_core.lab.sim.dynamo_replay import (
    BLOCK_TOKENS,
    RUN_REPLAY_SCRIPT,
    ReplayBridge,
    ReplayView,
    fpm_from_snapshot,
    merged_latency,
    replay_result,
    write_replay_trace,
)
from planner_core.lab.sim.oracle import OracleSettings, OracleWindow, size_both_pools
from planner_core.traces import RequestTrace


@dataclasses.dataclass(slots=True)
class DynamoEngine:
    """The bench's engine for one trace: the bridge, the replayed trace file and the scenario."""

    trace: RequestTrace
    spec: SimSpec
    bridge: ReplayBridge
    workdir: Path
    profile_dir: Path | None = None
    trace_file: Path | None = None
    _runs: int = 0

    def job(self, *, trace_file: Path, size: tuple[int, int], startup_s: float, policy: dict[str, Any]) -> dict:
        self._runs += 1
        job: dict[str, Any] = {
            "trace": str(trace_file),
            "num_prefill": int(size[0]),
            "num_decode": int(size[1]),
            "startup_s": float(startup_s),
            "out": str(self.workdir / f"replay-{self._runs}.json"),
            "policy": policy,
            "engine": {"num_gpu_blocks": self.spec.decode_limits.max_kv_tokens // 64, "block_size": 64},
            "router": REPLAY_ROUTER.value,
        }
        if self.profile_dir is not None:
            job["profile"] = str(self.profile_dir)
        return job

    def full_trace(self) -> Path:
        if self.trace_file is None:
            self.trace_file = self.workdir / "trace.jsonl"
            write_replay_trace(self.trace, self.trace_file)
        return self.trace_file

    def run(self, policy: ScalingPolicy) -> SimResult:
        """Serve the whole trace under `policy` in Dynamo's replay."""
        startup_s = self.spec.startup_s if policy.startup_s is None else policy.startup_s
        size = policy.initial()
        if (
            isinstance(policy, FixedPolicy)
            or not math.isfinite(policy.interval_s)
            or self.trace.duration_s < policy.interval_s
        ):
            job = self.job(trace_file=self.full_trace(), size=size, startup_s=startup_s, policy={"kind": "fixed"})
            return replay_result(self.trace, self.bridge.run(job), initial=size)
        if isinstance(policy, DynamoPlannerPolicy):
            policy.close()  # `initial` started its own subprocess: Dynamo's planner runs inside the replay here
            spec = {"kind": "dynamo", "config": policy.config, "capabilities": policy.capabilities}
            job = self.job(trace_file=self.full_trace(), size=size, startup_s=startup_s, policy=spec)
            if policy.profile_dir is not None:
                job["profile"] = str(policy.profile_dir)
            return replay_result(self.trace, self.bridge.run(job), initial=size)
        view = ReplayView(self.trace)
        interval_s = policy.interval_s
        num_ticks = int(self.trace.duration_s // interval_s)

        def next_tick_ms(index: int) -> float | None:
            return index * interval_s * 1000.0 if index <= num_ticks else None

        def on_tick(snapshot: dict[str, Any]) -> dict[str, Any]:
            index = round(float(snapshot["now_ms"]) / 1000.0 / interval_s)
            now_s = index * interval_s  # the default engine's tick times exactly
            view.absorb(now_s, snapshot)
            targets = policy.decide(now_s, view)
            if targets is not None:
                view.set_targets(*targets)
            prefill, decode = view.targets()
            return {"target_prefill": prefill, "target_decode": decode, "next_tick_ms": next_tick_ms(index + 1)}

        job = self.job(trace_file=self.full_trace(), size=size, startup_s=startup_s, policy={"kind": "remote"})
        try:
            replayed = self.bridge.run(job, on_initial=lambda: next_tick_ms(1), on_tick=on_tick)
            return replay_result(self.trace, replayed, initial=size)
        finally:
            close = getattr(policy, "close", None)
            if close is not None:
                close()

    def window_masks(
        self,
        sub: RequestTrace,
        scored: slice,
        *,
        previous: tuple[int, int],
        size: tuple[int, int],
        switch_s: float,
        ttft_ms: float,
        itl_ms: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per request of `scored`, when `sub` is replayed at `previous` until `switch_s` and at `size` from then on
        (instant scaling: start-up 0): (within the TTFT target, within both targets)."""
        path = self.workdir / "window.jsonl"
        shift_s = write_replay_trace(sub, path)
        switch_ms = max(0.0, (switch_s - shift_s) * 1000.0)

        def on_tick(snapshot: dict[str, Any]) -> dict[str, Any]:  # noqa: ARG001
            return {"target_prefill": size[0], "target_decode": size[1], "next_tick_ms": None}

        switches = previous != size and switch_ms > 0
        job = self.job(trace_file=path, size=previous if switches else size, startup_s=0.0,
                       policy={"kind": "remote" if switches else "fixed"})  # fmt: skip
        replayed = self.bridge.run(job, on_initial=lambda: switch_ms, on_tick=on_tick)
        result = replay_result(sub, replayed, shift_s=shift_s)
        ttft_met = met_both(result, ttft_ms=ttft_ms, itl_ms=math.inf)[scored]
        return ttft_met, met_both(result, ttft_ms=ttft_ms, itl_ms=itl_ms)[scored]


def met_both(result: SimResult, *, ttft_ms: float, itl_ms: float) -> np.ndarray:
    """Per request: finished within both targets (`score`'s rule: ITL of a 1-token request is met)."""
    ttft_ok = np.isfinite(result.ttft_s) & (result.ttft_s * 1000.0 <= ttft_ms)
    itl_ok = np.isfinite(result.finish_s) & (~np.isfinite(result.itl_s) | (result.itl_s * 1000.0 <= itl_ms))
    return ttft_ok & itl_ok


def replay_attainable(engine: DynamoEngine, *, size: tuple[int, int], ttft_ms: float, itl_ms: float) -> np.ndarray:
    """Per request: within both targets in Dynamo's engine on a cluster of `size` workers already up (large
    enough that requests hardly share an engine): what "alone on an idle cluster" means on this engine."""
    job = engine.job(trace_file=engine.full_trace(), size=size, startup_s=0.0, policy={"kind": "fixed"})
    result = replay_result(engine.trace, engine.bridge.run(job))
    return met_both(result, ttft_ms=ttft_ms, itl_ms=itl_ms)


def replay_oracle_windows(
    engine: DynamoEngine,
    *,
    ttft_ms: float,
    itl_ms: float,
    window_s: float,
    settings: OracleSettings = OracleSettings(),  # noqa: B008 - frozen value
    gpus: tuple[int, int] = (1, 1),
    num_windows: int | None = None,
    on_window: Callable[[OracleWindow], None] | None = None,
    bracket: Sequence[OracleWindow] | None = None,
    attainable_mask: np.ndarray | None = None,
) -> list[OracleWindow]:
    """The oracle's per-window search (`planner_core.lab.sim.oracle`, steps 1, 3 and 5) replayed in Dynamo's
    engine. Steps 2 and 4 differ:

    - a window's attainable requests are those within both targets when the window and its context are replayed
      on `ATTAINABLE_SIZE` workers per pool (the window's own replay: a prefix cache starts cold at the context's
      start, as in every candidate's replay), and at most that many workers per pool are searched;
    - Dynamo's engine cannot run one pool alone, so every candidate replays both pools (the window with
      `context_s` before and after, the previous window's size until the window's start, instant scaling) and
      counts the window's requests meeting both targets: P is the fewest prefill workers meeting the target with a
      generous decode pool (twice the previous window's decode answer plus 2, at least 4), so that decode does
      not hide a prefill shortage; D(P) is the fewest decode workers meeting it with P, and the cheaper in GPUs
      of (P, D(P)) and (P + 1, D(P + 1)) is kept (fewer prefill workers on a tie).

    `num_windows` stops after that many windows.

    With `bracket` (our simulator's oracle windows of the same trace and settings: `oracle_windows`), the search is
    the cheaper approximation `planner bench --dynamo-oracle bracket` runs, whose error against this exact search
    is measured in docs/benchmarks.md: each pool's search starts from our simulator's answer for the window scaled
    by the ratio between the two engines' answers in the previous window (the guess then usually needs one
    replay above and one below), only (P, D(P)) is searched (not P + 1), and, on a trace without prefix blocks
    (nothing a cold cache could change) and given `attainable_mask` (the whole trace's replay on
    `ATTAINABLE_SIZE`), a window's attainable requests are read from that mask instead of a replay of their own."""
    trace = engine.trace
    total = int(trace.duration_s // window_s) + 1 if trace.num_requests else 0
    total = total if num_windows is None else min(total, num_windows)
    settings = dataclasses.replace(settings, max_replicas=min(settings.max_replicas, *ATTAINABLE_SIZE))
    guess = (settings.min_prefill, settings.min_decode)
    previous: tuple[int, int] | None = None
    windows: list[OracleWindow] = []
    for index in range(total):
        start_s, end_s = index * window_s, (index + 1) * window_s
        own = trace.window(start_s, end_s)
        window = OracleWindow(
            index=index, start_s=start_s, num_requests=own.stop - own.start, num_attainable=0, num_required=0,
            num_prefill=settings.min_prefill, num_decode=settings.min_decode, num_ttft_met=0, num_met=0,
            feasible=True, num_simulations=0,
        )  # fmt: skip
        if own.stop > own.start:
            span = trace.window(start_s - settings.context_s, end_s + settings.context_s)
            sub = _sub_trace(trace, span)
            scored = slice(own.start - span.start, own.stop - span.start)

            def met(size: tuple[int, int], *, sub=sub, scored=scored, previous=previous, start_s=start_s):
                ttft_met, both_met = engine.window_masks(
                    sub, scored, previous=previous or size, size=size, switch_s=start_s, ttft_ms=ttft_ms,
                    itl_ms=itl_ms,
                )  # fmt: skip
                return int(ttft_met.sum()), int(both_met.sum())

            from_mask = bracket is not None and attainable_mask is not None and not trace.has_hashes
            num_attainable = int(attainable_mask[own].sum()) if from_mask else met(ATTAINABLE_SIZE)[1]  # type: ignore[index]
            required = math.ceil(settings.target_attainment * num_attainable - 1e-9)
            window = dataclasses.replace(window, num_attainable=num_attainable, num_required=required)
            if required > 0:
                if bracket is not None:
                    guess = _bracket_guess(bracket, index, windows)
                window = _size_replay_window(
                    window, met, guess=guess, settings=settings, gpus=gpus, approximate=bracket is not None
                )
                window = dataclasses.replace(window, num_simulations=window.num_simulations + (not from_mask))
                guess = (window.num_prefill, window.num_decode)
        previous = (window.num_prefill, window.num_decode)
        windows.append(window)
        if on_window is not None:
            on_window(window)
    return windows


def _size_replay_window(
    window: OracleWindow,
    replay_met: Callable[[tuple[int, int]], tuple[int, int]],
    *,
    guess: tuple[int, int],
    settings: OracleSettings,
    gpus: tuple[int, int],
    approximate: bool = False,
) -> OracleWindow:
    """`replay_oracle_windows`' search for one window; `replay_met(size)` replays it at a size (each size once) and
    counts the window's requests within the TTFT target and within both. `approximate` (the bracket approximation):
    P is the fewest prefill workers meeting the TTFT target at the guessed decode size (not both targets with a
    generous decode pool: the replays at (P, guess) serve the decode search too), and only (P, D(P)) is searched,
    not (P + 1, D(P + 1))."""
    cache: dict[tuple[int, int], tuple[int, int]] = {}

    def met(size: tuple[int, int]) -> tuple[int, int]:
        if size not in cache:
            cache[size] = replay_met(size)
        return cache[size]

    required, cap = window.num_required, settings.max_replicas
    wide = min(cap, max(4, 2 * guess[1] + 2))
    num_prefill, num_decode, feasible = size_both_pools(
        (lambda n: met((n, guess[1]))[0]) if approximate else (lambda n: met((n, wide))[1]),
        lambda p, n: met((p, n))[1],
        required=required,
        guess=guess,
        settings=settings,
        gpus=gpus,
        one_prefill=approximate,
    )
    return dataclasses.replace(
        window, num_prefill=num_prefill, num_decode=num_decode, num_met=met((num_prefill, num_decode))[1],
        num_ttft_met=met((num_prefill, num_decode))[0], feasible=feasible, num_simulations=len(cache),
    )  # fmt: skip


def _bracket_guess(bracket: Sequence[OracleWindow], index: int, done: Sequence[OracleWindow]) -> tuple[int, int]:
    """The bracket approximation's starting size for window `index`: our simulator's answer for it, times the ratio
    of the two engines' answers in the previous window with requests (1 before any), per pool."""
    ours = bracket[index] if index < len(bracket) else bracket[-1]
    ratio = [1.0, 1.0]
    for previous in reversed(done):
        if previous.num_required > 0 and previous.index < len(bracket):
            sim = bracket[previous.index]
            ratio = [previous.num_prefill / max(sim.num_prefill, 1), previous.num_decode / max(sim.num_decode, 1)]
            break
    return (max(1, round(ours.num_prefill * ratio[0])), max(1, round(ours.num_decode * ratio[1])))


def _sub_trace(trace: RequestTrace, span: slice) -> RequestTrace:
    """The requests of `span`, on the trace's clock, with their prefix blocks."""
    hash_ids = hash_offsets = None
    if trace.has_hashes:
        assert trace.hash_offsets is not None and trace.hash_ids is not None
        lo, hi = int(trace.hash_offsets[span.start]), int(trace.hash_offsets[span.stop])
        hash_ids = trace.hash_ids[lo:hi]
        hash_offsets = trace.hash_offsets[span.start : span.stop + 1] - lo
    return dataclasses.replace(
        trace,
        arrival_s=np.asarray(trace.arrival_s[span], dtype=float),
        isl=np.asarray(trace.isl[span]),
        osl=np.asarray(trace.osl[span]),
        hash_ids=hash_ids,
        hash_offsets=hash_offsets,
    )


def run_engine_bench(
    policies: Sequence[ScalingPolicy],
    engine: DynamoEngine,
    *,
    ttft_ms: float,
    itl_ms: float,
    attainable: float,
    on_policy_done: Callable[[Any], None] | None = None,
    oracle_search_s: float = 0.0,
) -> list[PolicyRun]:
    """`run_bench` on Dynamo's engine: every policy on the same trace, scored by `score`, `gpu_hours_vs_oracle`
    filled when an `oracle` runs."""
    runs = []
    for policy in policies:
        started = time.perf_counter()
        result = engine.run(policy)
        wall_s = time.perf_counter() - started + (oracle_search_s if isinstance(policy, OraclePolicy) else 0.0)
        row = score(policy.name, engine.trace, result, ttft_ms=ttft_ms, itl_ms=itl_ms, wall_s=wall_s,
                    attainable=attainable)  # fmt: skip
        runs.append(PolicyRun(row=row, result=result))
        if on_policy_done is not None:
            on_policy_done(row)
    oracle = next((r for r in runs if r.row.policy == "oracle"), None)
    if oracle is not None and oracle.row.gpu_hours > 0:
        runs = [
            dataclasses.replace(
                r, row=dataclasses.replace(r.row, gpu_hours_vs_oracle=r.row.gpu_hours / oracle.row.gpu_hours)
            )
            for r in runs
        ]
    return runs


def dynamo_bench(
    names: Sequence[str],
    build: Callable[[Sequence[str]], list[ScalingPolicy]],
    trace: RequestTrace,
    spec: SimSpec,
    *,
    ttft_ms: float,
    itl_ms: float,
    window_s: float,
    settings: OracleSettings,
    initial: str,
    dynamo_python: str | None,
    profile_dir: Path | None,
    num_configs: int = 0,
    on_policies_built: Callable[[Sequence[ScalingPolicy]], None] | None = None,
    on_policy_done: Callable[[Any], None] | None = None,
    bracket: Callable[[int | None], Sequence[OracleWindow]] | None = None,
) -> tuple[list[ScalingPolicy], list[PolicyRun]]:
    """The bench on Dynamo's engine: `names` in order (the baselines from `replay_oracle_windows`, the others
    from `build`, which builds the named policies and then the `num_configs` config files as the default engine
    does), each served by Dynamo's replay. Planners start at the engine's oracle's first-window size with
    `initial="oracle"`, at their minimum endpoints with "min". With `bracket` (our simulator's oracle windows, computed
    when called with the number of windows searched, None for all; its time counts in the oracle's), the oracle is
    `replay_oracle_windows`' bracket approximation. Without a baseline row only the first window is searched (the
    planners' starting size), and nothing at all with `initial="min"`."""
    from planner_core.lab.sim.bench import BASELINE_NAMES

    if spec.aggregated:
        raise ValueError("--engine dynamo: the bench runs disaggregated pools only on Dynamo's engine")
    from planner_core.lab.sim.policies import REFERENCE_NAMES

    if refused := [name for name in names if name in REFERENCE_NAMES]:
        # their search simulates the whole trace at many sizes: our simulator's, not yet Dynamo's replay
        raise ValueError(f"--engine dynamo: {', '.join(refused)} run on --engine sim only")
    with tempfile.TemporaryDirectory(prefix="planner-bench-dynamo-") as folder:
        bridge = ReplayBridge(dynamo_python)
        try:
            engine = DynamoEngine(trace=trace, spec=spec, bridge=bridge, workdir=Path(folder), profile_dir=profile_dir)
            others = [name for name in names if name not in BASELINE_NAMES]
            built = build(others)  # refusals (unknown names, bad configs) before the replays
            gpus = (spec.prefill_limits.num_gpu, spec.decode_limits.num_gpu)
            attainable_mask = replay_attainable(engine, size=ATTAINABLE_SIZE, ttft_ms=ttft_ms, itl_ms=itl_ms)
            attainable = float(attainable_mask.mean()) if len(attainable_mask) else 1.0
            wants_baselines = any(name in BASELINE_NAMES for name in names)
            started = time.perf_counter()
            windows: list[OracleWindow] = []
            if wants_baselines or (initial == "oracle" and others):
                num_windows = None if wants_baselines else 1  # no baseline row: the planners' starting size only
                windows = replay_oracle_windows(
                    engine, ttft_ms=ttft_ms, itl_ms=itl_ms, window_s=window_s, settings=settings,
                    gpus=gpus, num_windows=num_windows,
                    bracket=bracket(num_windows) if bracket is not None else None, attainable_mask=attainable_mask,
                )  # fmt: skip
            search_s = time.perf_counter() - started
            baselines: dict[str, ScalingPolicy] = {
                policy.name: policy
                for policy in baselines_from_windows(
                    windows, window_s=window_s, startup_s=spec.startup_s, search_s=search_s,
                    floor=(settings.min_prefill, settings.min_decode),
                )
            }  # fmt: skip
            if initial == "oracle":
                for policy in built:
                    if hasattr(policy, "initial_size"):
                        policy.initial_size = baselines["oracle"].initial()  # type: ignore[attr-defined]
            named = dict(zip(others, built[: len(others)], strict=True))
            policies = [baselines[n] if n in BASELINE_NAMES else named[n] for n in names]
            policies += built[len(others) :][:num_configs] if num_configs else []
            if on_policies_built is not None:
                on_policies_built(policies)
            runs = run_engine_bench(
                policies, engine, ttft_ms=ttft_ms, itl_ms=itl_ms, attainable=attainable,
                on_policy_done=on_policy_done, oracle_search_s=search_s,
            )  # fmt: skip
        finally:
            bridge.close()
    return policies, runs


# "Alone on an idle cluster" on Dynamo's engine: this many prefill and decode workers, up from the start.
ATTAINABLE_SIZE = (32, 32)
# How Dynamo's replay routes (the Dynamo frontend's default `--router-mode`); the bench tells the planners so.
REPLAY_ROUTER = RouterPolicy.ROUND_ROBIN


__all__ = [
    "ATTAINABLE_SIZE",
    "REPLAY_ROUTER",
    "BLOCK_TOKENS",
    "DynamoEngine",
    "RUN_REPLAY_SCRIPT",
    "ReplayBridge",
    "ReplayView",
    "dynamo_bench",
    "fpm_from_snapshot",
    "merged_latency",
    "met_both",
    "replay_attainable",
    "replay_oracle_windows",
    "replay_result",
    "run_engine_bench",
    "write_replay_trace",
]
