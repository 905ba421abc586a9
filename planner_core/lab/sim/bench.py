"""The planning benchmark: scaling policies side by side on the same requests, in the discrete-event simulator.

Every policy serves the same trace on the same simulated cluster (`planner_core.lab.sim.des`); the figures per policy
are SLA attainment (TTFT, ITL, both), goodput, GPU-hours and scaling events, with GPU-hours relative to the oracle.

Policies:
- `oracle`: knows the future and scales instantly (start-up 0): at the start of each window it sets the fewest
  prefill and decode workers with which that window's requests meet the SLA attainment target in the simulator
  itself (`planner_core.lab.sim.oracle`, where the search is defined exactly). Its GPU-hours are the lower bound the
  other policies are compared with.
- `oracle-ahead`: the oracle's sizes under the bench's start-up time: each window's size asked for a start-up time
  before the window, a pool kept through a dip shorter than a start-up (`OracleAheadPolicy`). What knowing the future
  is worth when workers take minutes to start: the attainment and GPU-hours a forecasting policy can at best reach.
- `oracle-seen` (asked for by name): `oracle-ahead` never asking, per pool, for more than the largest size of the
  windows already over. The requests it misses need engines for a burst larger than any before it, ready before
  the burst shows: what a policy serves only by holding engines for a need it has never seen.
- `oracle-peak` (asked for by name): `oracle-ahead` that also holds each pool at the trace's largest window size
  from the start until the last window needing it (`held_for_peak`): ready for the largest burst without knowing
  when it comes, yet knowing when to stop. Its GPU-hours bound from below what being ready for that burst costs a
  policy that does not know its time.
- `static-best` / `oracle-budget` (asked for by name; `planner_core.lab.sim.references`): the cheapest fixed size,
  and the fewest GPU-hours over per-window sizes, meeting the target over the whole run rather than in every window
  (the oracle's per-window target is not a lower bound on the whole run's GPU-hours).
- `static-peak` / `static-mean`: a fixed size: per pool, the largest / the time-mean (rounded up) of the oracle's
  per-window sizes, i.e. provisioning for the busiest window's actual need or for the average need.
- `dynamo-1.6.1` / `dynamo-1.6.1-load`: Dynamo 1.6.1's own planner (throughput scaling, and throughput plus
  load scaling) deciding in a subprocess run with Dynamo's virtualenv (`planner_core.lab.sim.dynamo_policy`).
- the named planner policies (`policy_names()`: the config files in `planner_core/configs/policies/`, e.g.
  `threshold`, `dynamo-0x`, `dynamo-1x`, `planner`): the planner's decision core (`tick`) in the loop, with a
  config: each throughput interval it sees the window that just ended, each load interval the engines'
  forward-pass snapshots; its decisions apply at once (start-up delays still apply). `config:<name>`
  (`UserPlannerConfig`) is the same with a user's config file and plugins.
- `fixed:P:D`: a fixed size given on the command line.

Aggregated mode (`SimSpec.aggregated`, `planner bench --mode agg`): one pool of aggregated engines, counted as
the decode pool (sizes are (0, A)). The oracle searches A per window (`planner_core.lab.sim.oracle`); the planner
presets run with `mode: agg` except `dynamo-0x` (profile interpolation sizes prefill and decode pools only, so it
would hold every tick) and the Dynamo 1.6.1 policies (disaggregated only), which are refused; `fixed:N` is N
aggregated engines. The prompt-arrival curve counts each prompt up to an aggregated engine's share: its prompt
rate at the operating point the capacity search chooses for the observed window's shape
(`planner_core.perf.capacity.agg_operating_prompt_rate`, the rate the planner's agg burst sizing uses).

Every scaling policy starts at the oracle's size for the first window (a deployment already serving this traffic
when the trace begins; `initial="min"` starts the planners at their minimum endpoints instead); the planners'
predictors start cold. A request that cannot meet both targets even alone on an idle cluster (its prompt alone
takes longer than the TTFT target) is counted as a miss for every policy; `attainable` is the fraction that can.

The pieces: the policies and their catalogue (`planner_core.lab.sim.policies`), the scoring
(`planner_core.lab.sim.scoring`), the table and figure (`planner_core.lab.sim.bench_figure`) and the trace's sizing
(`planner_core.lab.sim.trace_sizing`); this module runs the policies and re-exports the pieces' public names.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from planner_core.lab.sim.bench_figure import (
    BENCH_TABLE_HEADER,
    POLICY_COLOURS,
    TARGET_COLOUR,
    bench_figure,
    bench_table_rows,
)
from planner_core.lab.sim.des import ClusterSimulator, SimSpec
from planner_core.lab.sim.oracle import attainable_mask
from planner_core.lab.sim.policies import (
    BASELINE_NAMES,
    DEFAULT_AGG_POLICIES,
    DEFAULT_POLICIES,
    DYNAMO_AGG_REFUSAL,
    SCENARIO_FIELDS,
    FixedPolicy,
    OracleAheadPolicy,
    OraclePolicy,
    PlannerPolicy,
    ScalingPolicy,
    UserPlannerConfig,
    agg_refusal,
    baseline_policies,
    baselines_from_windows,
    bench_config,
    build_policies,
    held_for_peak,
    horizon_policy_name,
    policy_names,
    policy_path,
)
from planner_core.lab.sim.scoring import BenchRow, PolicyRun, PredictionErrors, prediction_errors, score
from planner_core.lab.sim.trace_sizing import TraceSizingRow, trace_sizing
from planner_core.perf.forward import ForwardPassModel
from planner_core.traces import RequestTrace


def run_policy(
    policy: ScalingPolicy,
    trace: RequestTrace,
    fwd: ForwardPassModel,
    spec: SimSpec,
    *,
    ttft_ms: float,
    itl_ms: float,
    attainable: float = 1.0,
) -> PolicyRun:
    """Serve the trace under one policy and score it. The oracle's wall time includes its search."""
    started = time.perf_counter()
    if policy.startup_s is not None:
        spec = dataclasses.replace(spec, startup_s=policy.startup_s)
    num_prefill, num_decode = policy.initial()
    sim = ClusterSimulator(trace, fwd, spec, num_prefill=num_prefill, num_decode=num_decode)
    try:
        if math.isfinite(policy.interval_s):
            num_ticks = int(trace.duration_s // policy.interval_s)
            for index in range(1, num_ticks + 1):
                now_s = index * policy.interval_s
                sim.run_until(now_s)
                targets = policy.decide(now_s, sim)
                if targets is not None:
                    sim.set_targets(*targets)
    finally:
        close = getattr(policy, "close", None)  # a policy holding a resource (a subprocess) releases it
        if close is not None:
            close()
    sim.run_to_completion()
    result = sim.result()
    wall_s = time.perf_counter() - started + (policy.search_s if isinstance(policy, OraclePolicy) else 0.0)
    row = score(policy.name, trace, result, ttft_ms=ttft_ms, itl_ms=itl_ms, wall_s=wall_s, attainable=attainable)
    row = dataclasses.replace(row, router=spec.router.value)
    errors = prediction_errors(result, trace)
    if errors is not None:
        row = dataclasses.replace(
            row,
            unplaced=result.num_unplaced,
            rejected=result.num_rejected,
            local_prefills=result.num_local_prefills,
            overdue=result.num_overdue,
            ttft_pred_err_p50=errors.ttft_p50,
            ttft_pred_err_p90=errors.ttft_p90,
            tpot_pred_err_p50=errors.tpot_p50,
            tpot_pred_err_p90=errors.tpot_p90,
        )
    return PolicyRun(row=row, result=result)


def run_bench(
    policies: Sequence[ScalingPolicy],
    trace: RequestTrace,
    fwd: ForwardPassModel,
    spec: SimSpec,
    *,
    ttft_ms: float,
    itl_ms: float,
    on_policy_done: Callable[[BenchRow], None] | None = None,
) -> list[PolicyRun]:
    """Run every policy on the same trace; fill `gpu_hours_vs_oracle` when an `oracle` policy is among them."""
    attainable = float(attainable_mask(trace, fwd, spec, ttft_ms=ttft_ms, itl_ms=itl_ms).mean())
    runs = []
    for policy in policies:
        run = run_policy(policy, trace, fwd, spec, ttft_ms=ttft_ms, itl_ms=itl_ms, attainable=attainable)
        runs.append(run)
        if on_policy_done is not None:
            on_policy_done(run.row)
    oracle = next((r for r in runs if r.row.policy == "oracle"), None)
    if oracle is not None and oracle.row.gpu_hours > 0:
        runs = [
            dataclasses.replace(
                r, row=dataclasses.replace(r.row, gpu_hours_vs_oracle=r.row.gpu_hours / oracle.row.gpu_hours)
            )
            for r in runs
        ]
    return runs


__all__ = [
    "BASELINE_NAMES",
    "BENCH_TABLE_HEADER",
    "BenchRow",
    "DEFAULT_AGG_POLICIES",
    "DEFAULT_POLICIES",
    "DYNAMO_AGG_REFUSAL",
    "FixedPolicy",
    "OracleAheadPolicy",
    "OraclePolicy",
    "POLICY_COLOURS",
    "PlannerPolicy",
    "PolicyRun",
    "PredictionErrors",
    "SCENARIO_FIELDS",
    "ScalingPolicy",
    "TARGET_COLOUR",
    "TraceSizingRow",
    "UserPlannerConfig",
    "agg_refusal",
    "baseline_policies",
    "baselines_from_windows",
    "bench_config",
    "bench_figure",
    "bench_table_rows",
    "build_policies",
    "held_for_peak",
    "horizon_policy_name",
    "policy_names",
    "policy_path",
    "prediction_errors",
    "run_bench",
    "run_policy",
    "score",
    "trace_sizing",
]
