"""The demo's simulated cluster and its scoring: the engines the config describes, where the cluster starts (the
oracle's size for the trace's first stretch, as `planner bench` starts its policies), the cluster re-run under the
recorded scale events, and the run scored with its comparison rows (a static pool at the run's peak, Dynamo's
planner with its defaults) as `planner bench` scores a policy."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from planner_core.lab.sim.bench import (
    BenchRow,
    FixedPolicy,
    PlannerPolicy,
    bench_config,
    policy_path,
    run_policy,
    score,
)
from planner_core.lab.sim.des import ClusterSimulator, SimSpec, spec_for_config
from planner_core.lab.sim.oracle import OracleSettings, oracle_first_window
from planner_core.perf.forward import ForwardPassModel
from planner_core.planner import build_planner
from planner_core.runtime.service import PlannerContext
from planner_core.runtime.store import repository as repo
from planner_core.traces import RequestTrace


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleEvent:
    """The simulated orchestrator reached new targets at `at_s` (offset into the trace)."""

    at_s: float
    num_prefill: int
    num_decode: int


def epoch(trace: RequestTrace, offset_s: float) -> dt.datetime:
    """The (simulated) wall-clock time `offset_s` into the trace."""
    return repo.epoch_to_datetime(trace.start_epoch_s + offset_s)


def simulated_engines(ctx: PlannerContext, startup_s: float) -> tuple[ForwardPassModel, SimSpec]:
    """The simulated engines of the config (`spec_for_config`), timed by the profile's forward-pass model: the
    cluster the demo runs, and the one its starting size and comparison rows are found on."""
    assert ctx.perf is not None
    fwd = ctx.perf.forward_pass_model()
    assert fwd is not None
    spec = spec_for_config(ctx.config, profiled_max_kv_tokens=ctx.perf.profiled_max_kv_tokens(), startup_s=startup_s)
    return fwd, spec


# The demo's cluster starts as `planner bench` starts every policy: at the oracle's size for this first stretch of
# the trace (the bench's default oracle window).
STARTING_WINDOW_S = 180.0


def starting_size(ctx: PlannerContext, trace: RequestTrace, startup_s: float) -> tuple[int, int]:
    """Where the demo's cluster starts: a deployment already serving the trace's traffic, at the oracle's size
    for the trace's first `STARTING_WINDOW_S` (the fewest engines that serve those requests within the SLA,
    searched in the simulator up to the GPU budget: `planner_core.lab.sim.oracle`), as `planner bench` starts its
    policies. The rows the
    run is compared with start there too. (0, A) for aggregated engines."""
    fwd, spec = simulated_engines(ctx, startup_s)
    # the search stops at what the GPU budget allows: a deployment does not start above its own ceiling (and an
    # SLA no size meets would otherwise search hundreds of engines)
    budget, gpus = ctx.config.max_gpu_budget, max(spec.prefill_limits.num_gpu, spec.decode_limits.num_gpu)
    settings = OracleSettings(max_replicas=max(1, budget // gpus)) if budget > 0 else OracleSettings()
    first = oracle_first_window(
        trace, fwd, spec, ttft_ms=ctx.config.ttft_ms, itl_ms=ctx.config.itl_ms, window_s=STARTING_WINDOW_S,
        settings=settings,
    )  # fmt: skip
    assert first is not None  # a loaded trace has requests
    return first.num_prefill, first.num_decode


def new_cluster(ctx: PlannerContext, trace: RequestTrace, startup_s: float, start: tuple[int, int]) -> ClusterSimulator:
    """The discrete-event cluster the config describes (`spec_for_config`), timed by the profile's forward-pass
    model, at `start` (`starting_size`)."""
    fwd, spec = simulated_engines(ctx, startup_s)
    num_prefill, num_decode = start
    return ClusterSimulator(trace, fwd, spec, num_prefill=num_prefill, num_decode=num_decode)


def score_run(
    ctx: PlannerContext, trace: RequestTrace, events: list[ScaleEvent], startup_s: float, start: tuple[int, int]
) -> BenchRow:
    """The demo's own figures, scored as `planner bench` scores a policy: the cluster re-run from the start under
    the recorded scale events, every request served to completion."""
    started = time.perf_counter()
    cluster = simulate_timeline(ctx, trace, events, trace.duration_s, startup_s, start)
    cluster.run_to_completion()
    wall_s = time.perf_counter() - started
    name = f"{ctx.deployment} (this run)"
    return score(name, trace, cluster.result(), ttft_ms=ctx.config.ttft_ms, itl_ms=ctx.config.itl_ms, wall_s=wall_s)


def comparison_rows(
    ctx: PlannerContext, trace: RequestTrace, events: list[ScaleEvent], startup_s: float, start: tuple[int, int]
) -> list[BenchRow]:
    """The same requests under a static size (the run's peak targets, held from the start: provisioning for the
    peak instead of scaling) and under Dynamo's planner with its defaults (`dynamo-defaults.yaml` at this SLA),
    in the simulator as `planner bench` runs them, from the same start (`starting_size`) and start-up time."""
    fwd, spec = simulated_engines(ctx, startup_s)
    peak_prefill = max([start[0], *(e.num_prefill for e in events)])
    peak_decode = max([start[1], *(e.num_decode for e in events)])
    static = FixedPolicy(
        name=f"static {peak_prefill}P/{peak_decode}D (the run's peak)", num_prefill=peak_prefill,
        num_decode=peak_decode,
    )  # fmt: skip
    scenario = {field: getattr(ctx.config, field) for field in ("ttft_ms", "itl_ms")} | {
        "prefill_engine_num_gpu": ctx.config.prefill_gpus_per_engine,
        "decode_engine_num_gpu": ctx.config.decode_gpus_per_engine,
    }
    path = policy_path("dynamo-defaults")
    dynamo = PlannerPolicy(
        name="Dynamo's defaults",
        planner=build_planner(bench_config(path, scenario), path, perf=ctx.perf),
        initial_size=start,
    )
    return [
        run_policy(policy, trace, fwd, spec, ttft_ms=ctx.config.ttft_ms, itl_ms=ctx.config.itl_ms).row
        for policy in (static, dynamo)
    ]


def simulate_timeline(
    ctx: PlannerContext,
    trace: RequestTrace,
    events: list[ScaleEvent],
    end_s: float,
    startup_s: float,
    start: tuple[int, int],
) -> ClusterSimulator:
    """Re-run the cluster from the start of the trace at `start`, applying each scale event at its time."""
    cluster = new_cluster(ctx, trace, startup_s, start)
    for event in events:
        if event.at_s > end_s:
            break
        cluster.run_until(event.at_s)
        cluster.set_targets(event.num_prefill, event.num_decode)
    cluster.run_until(end_s)
    return cluster
