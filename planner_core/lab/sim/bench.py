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
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from planner_core.config import PlannerConfig, PlannerMode, ThroughputAlgorithm, load_config, parse_config
from planner_core.data import POLICIES_DIR, RECOMMENDED_POLICY
from planner_core.domain import Component, Loop, PlannerState, TickInputs
from planner_core.lab.sim.des import ClusterSimulator, SimResult, SimSpec
from planner_core.lab.sim.dynamo_policy import (
    DYNAMO_PRESETS,
    DynamoPlannerPolicy,
    check_dynamo_python,
    dynamo_config,
    engine_capabilities,
    find_dynamo_python,
)
from planner_core.lab.sim.oracle import (
    OracleSettings,
    OracleWindow,
    attainable_mask,
    oracle_first_window,
    oracle_windows,
)
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.model import ProfilePerfModel
from planner_core.perf.protocol import ThroughputPerfModel
from planner_core.planner import Planner, build_planner
from planner_core.traces import RequestTrace, bucket_windows


class ScalingPolicy(Protocol):
    """A policy the benchmark can run: an initial size, a cadence, and a decision at each of its ticks."""

    name: str
    interval_s: float
    startup_s: float | None  # None: the benchmark's start-up time; the oracle scales instantly

    def initial(self) -> tuple[int, int]: ...

    def decide(self, now_s: float, sim: ClusterSimulator) -> tuple[int | None, int | None] | None: ...


@dataclass(slots=True)
class FixedPolicy:
    name: str
    num_prefill: int
    num_decode: int
    interval_s: float = math.inf
    startup_s: float | None = None

    def initial(self) -> tuple[int, int]:
        return self.num_prefill, self.num_decode

    def decide(self, now_s: float, sim: ClusterSimulator) -> None:  # noqa: ARG002
        return None


@dataclass(slots=True)
class OraclePolicy:
    """Instant scaling to each window's actual need (`planner_core.lab.sim.oracle`)."""

    sizes: Sequence[tuple[int, int]]  # per window, from the window starting at 0
    interval_s: float
    name: str = "oracle"
    startup_s: float | None = 0.0
    windows: Sequence[OracleWindow] = ()  # the search's answer per window, for reports
    search_s: float = 0.0  # wall time of the search (added to the oracle row's wall time)

    def initial(self) -> tuple[int, int]:
        return self.sizes[0]

    def decide(self, now_s: float, sim: ClusterSimulator) -> tuple[int, int] | None:  # noqa: ARG002
        index = int(round(now_s / self.interval_s))
        return self.sizes[index] if index < len(self.sizes) else None


@dataclass(slots=True)
class OracleAheadPolicy:
    """The oracle's sizes under the bench's start-up time: what knowing the future is worth when workers take
    `lead_s` to start. Each window's size is asked for `lead_s` before the window starts (its workers are ready as
    it starts), and a pool shrinks at a window's start only to the largest size of the windows starting within
    `lead_s` (a worker removed now would not be back in time for them; keeping it costs less than restarting it).
    Starting workers cost GPU-seconds in the simulator as for every other policy, so its GPU-hours over the oracle's
    are what the start-up time itself costs a policy that forecasts perfectly."""

    sizes: Sequence[tuple[int, int]]  # the oracle's, per window, from the window starting at 0
    window_s: float
    lead_s: float  # the start-up time the bench runs with
    name: str = "oracle-ahead"
    startup_s: float | None = None  # the bench's
    # `oracle-seen`: never more, per pool, than the largest size of the windows already over (at least the first
    # window's): perfect foresight that never provisions beyond what the traffic has needed so far. What it misses
    # is what no policy serves without holding engines for a need it has never seen.
    capped_at_seen: bool = False

    @property
    def interval_s(self) -> float:
        """Ticks at every window start and every window start less `lead_s`: their common divisor in whole
        seconds (60 s for 180 s windows and 120 s or 600 s start-ups); 1 s when either is fractional."""
        if float(self.window_s).is_integer() and float(self.lead_s).is_integer():
            return float(math.gcd(int(self.window_s), int(self.lead_s)) or int(self.window_s))
        return 1.0

    def target(self, now_s: float) -> tuple[int, int]:
        """Per pool, the largest size of the windows from the one holding `now_s` to the one starting by
        `now_s + lead_s` (a worker asked for now is ready then); with `capped_at_seen`, at most the largest size of
        the windows over by `now_s`."""
        first = int(math.floor(now_s / self.window_s + 1e-9))
        last = int(math.floor((now_s + self.lead_s) / self.window_s + 1e-9))
        ahead = self.sizes[min(first, len(self.sizes) - 1) : min(last, len(self.sizes) - 1) + 1]
        target = (max(p for p, _ in ahead), max(d for _, d in ahead))
        if not self.capped_at_seen:
            return target
        seen = self.sizes[: max(1, first)]  # the windows over by now (the first one: the deployment's starting size)
        return min(target[0], max(p for p, _ in seen)), min(target[1], max(d for _, d in seen))

    def initial(self) -> tuple[int, int]:
        return self.target(0.0)

    def decide(self, now_s: float, sim: ClusterSimulator) -> tuple[int, int]:  # noqa: ARG002
        return self.target(now_s)


@dataclass(slots=True)
class PlannerPolicy:
    """The planner in the loop, ticking both loops on their intervals: a `Planner` built by `build_planner` (the
    one function served ticks, the demo and replay build theirs with), deciding through `Planner.decide` on what
    the simulator observes (`ClusterSimulator.observe`, with the planner's traffic features)."""

    name: str
    planner: Planner
    startup_s: float | None = None
    state: PlannerState = dataclasses.field(default_factory=PlannerState)
    initial_size: tuple[int, int] | None = None  # None: the minimum endpoints

    @property
    def config(self) -> PlannerConfig:
        return self.planner.config

    @property
    def interval_s(self) -> float:
        return self.config.scale_interval_seconds_effective

    def initial(self) -> tuple[int, int]:
        if self.initial_size is not None:
            return self.initial_size
        if self.config.mode is PlannerMode.AGG:  # one aggregated pool, counted as decode
            return 0, self.config.decode_min_endpoint_effective
        return self.config.prefill_min_endpoint_effective, self.config.decode_min_endpoint_effective

    def decide(self, now_s: float, sim: ClusterSimulator) -> tuple[int | None, int | None] | None:
        loops = []
        throughput_s = float(self.config.throughput_adjustment_interval_seconds)
        if self.config.throughput_scaling_active and _on_interval(now_s, throughput_s):
            loops.append(Loop.THROUGHPUT)
        if self.config.load_scaling_active and _on_interval(now_s, float(self.config.load_adjustment_interval_seconds)):
            loops.append(Loop.LOAD)
        for loop in loops:
            traffic = None
            if loop is Loop.THROUGHPUT:
                # with the router's hit rate, as Dynamo's planner gets it, and the planner's arrival curve
                traffic = sim.observe(max(0.0, now_s - throughput_s), now_s, planner=self.planner)
            unplaced = ()
            if loop is Loop.LOAD:  # what the router could not place since the previous load tick
                load_s = float(self.config.load_adjustment_interval_seconds)
                unplaced = sim.unplaced(max(0.0, now_s - load_s), now_s)
                if self.config.load_tail_latency_scaling:  # the frontend's TTFT tail and queue time, as a source has
                    traffic = sim.observe(max(0.0, now_s - load_s), now_s)
            inputs = TickInputs(
                now_s=now_s,
                loop=loop,
                workers=sim.worker_counts(),
                traffic=traffic,
                fpm=sim.latest_fpm() if loop is Loop.LOAD else (),
                unplaced=unplaced,
            )
            outcome = self.planner.decide(inputs, self.state)
            self.state = outcome.next_state
            decision = outcome.decision
            if not decision.is_empty and not decision.advisory:
                # an aggregated planner has no prefill pool: leave the simulator's (empty) one alone
                prefill = None if self.config.mode is PlannerMode.AGG else decision.num_prefill
                sim.set_targets(prefill, decision.num_decode)
        return None  # applied above, per loop, so a load tick sees the throughput tick's targets


def _on_interval(now_s: float, interval_s: float) -> bool:
    ratio = now_s / interval_s
    return now_s > 0 and abs(ratio - round(ratio)) < 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One policy's figures (the `--json` row)."""

    policy: str
    requests: int
    ttft_attainment: float
    itl_attainment: float
    sla_attainment: float
    attainable: float  # fraction of requests that meet both targets alone on an idle cluster (the ceiling)
    goodput_rps: float
    gpu_hours: float
    gpu_hours_vs_oracle: float | None
    scaling_events: int
    ttft_ms_mean: float
    ttft_ms_p90: float
    itl_ms_mean: float
    itl_ms_p90: float
    wall_s: float
    # the router the run used, and with router `slo` what it could not place and how far its predictions were
    # from the measured latencies (`prediction_errors`); None with the other routers
    router: str = "least_loaded"
    unplaced: int | None = None
    rejected: int | None = None
    local_prefills: int | None = None
    overdue: int | None = None
    ttft_pred_err_p50: float | None = None
    ttft_pred_err_p90: float | None = None
    tpot_pred_err_p50: float | None = None
    tpot_pred_err_p90: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictionErrors:
    """Relative error |predicted - measured| / measured of the SLO-aware router's predictions, median and p90, over
    the requests it placed: TTFT predicted at the first stage's dispatch against the TTFT measured from that
    dispatch (the client's TTFT less its wait at the frontend; it includes the KV transfer and, with the first token
    from the decode engine, one decode iteration); TPOT predicted at the decode dispatch against the request's
    measured mean ITL. `bias` is the median of (predicted - measured) / measured (negative: predictions too low)."""

    ttft_p50: float | None
    ttft_p90: float | None
    ttft_bias: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_bias: float | None
    num_ttft: int
    num_tpot: int


def _relative_errors(
    predicted_ms: np.ndarray, measured_ms: np.ndarray
) -> tuple[float | None, float | None, float | None, int]:
    ok = np.isfinite(predicted_ms) & np.isfinite(measured_ms) & (measured_ms > 0)
    if not ok.any():
        return None, None, None, 0
    signed = (predicted_ms[ok] - measured_ms[ok]) / measured_ms[ok]
    error = np.abs(signed)
    return float(np.median(error)), float(np.percentile(error, 90)), float(np.median(signed)), int(ok.sum())


def prediction_errors(result: SimResult, trace: RequestTrace) -> PredictionErrors | None:
    """The router's prediction errors in one run (None when the run's router made no predictions)."""
    if result.predicted_ttft_ms is None or result.predicted_tpot_ms is None or result.dispatch_s is None:
        return None
    waited_s = result.dispatch_s - np.asarray(trace.arrival_s, dtype=float)
    ttft = _relative_errors(result.predicted_ttft_ms, 1000.0 * (result.ttft_s - waited_s))
    tpot = _relative_errors(result.predicted_tpot_ms, 1000.0 * result.itl_s)
    return PredictionErrors(
        ttft_p50=ttft[0], ttft_p90=ttft[1], ttft_bias=ttft[2], num_ttft=ttft[3],
        tpot_p50=tpot[0], tpot_p90=tpot[1], tpot_bias=tpot[2], num_tpot=tpot[3],
    )  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRun:
    row: BenchRow
    result: SimResult


def score(
    name: str,
    trace: RequestTrace,
    result: SimResult,
    *,
    ttft_ms: float,
    itl_ms: float,
    wall_s: float,
    attainable: float = 1.0,
) -> BenchRow:
    """Attainment and cost of one run. Unfinished requests count as misses; ITL of 1-token requests is met.
    `attainable` is reported as is (the fraction of requests that could meet both targets at all)."""
    ttft = result.ttft_s * 1000.0
    itl = result.itl_s * 1000.0
    finished = np.isfinite(result.finish_s)
    ttft_met = np.isfinite(ttft) & (ttft <= ttft_ms)
    itl_met = finished & (~np.isfinite(itl) | (itl <= itl_ms))
    both = ttft_met & itl_met
    duration_s = max(trace.duration_s, 1e-9)
    return BenchRow(
        policy=name,
        requests=trace.num_requests,
        ttft_attainment=float(ttft_met.mean()) if len(ttft) else 1.0,
        itl_attainment=float(itl_met.mean()) if len(itl) else 1.0,
        sla_attainment=float(both.mean()) if len(ttft) else 1.0,
        attainable=attainable,
        goodput_rps=float(both.sum() / duration_s),
        gpu_hours=result.gpu_s / 3600.0,
        gpu_hours_vs_oracle=None,
        scaling_events=result.num_scaling_events,
        ttft_ms_mean=float(np.nanmean(ttft)) if np.isfinite(ttft).any() else math.nan,
        ttft_ms_p90=float(np.nanpercentile(ttft, 90)) if np.isfinite(ttft).any() else math.nan,
        itl_ms_mean=float(np.nanmean(itl)) if np.isfinite(itl).any() else math.nan,
        itl_ms_p90=float(np.nanpercentile(itl, 90)) if np.isfinite(itl).any() else math.nan,
        wall_s=wall_s,
    )


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


def baseline_policies(
    trace: RequestTrace,
    fwd: ForwardPassModel,
    spec: SimSpec,
    *,
    ttft_ms: float,
    itl_ms: float,
    window_s: float,
    settings: OracleSettings = OracleSettings(),  # noqa: B008 - frozen value
) -> list[ScalingPolicy]:
    """The baselines (`baselines_from_windows`) on the oracle's windows searched in the simulator."""
    started = time.perf_counter()
    windows = oracle_windows(trace, fwd, spec, ttft_ms=ttft_ms, itl_ms=itl_ms, window_s=window_s, settings=settings)
    floor = (0 if spec.aggregated else settings.min_prefill, settings.min_decode)
    return baselines_from_windows(
        windows, window_s=window_s, startup_s=spec.startup_s, floor=floor, search_s=time.perf_counter() - started
    )


def baselines_from_windows(
    windows: Sequence[OracleWindow],
    *,
    window_s: float,
    startup_s: float,
    floor: tuple[int, int],
    search_s: float,
) -> list[ScalingPolicy]:
    """The baselines of one oracle search, in `BASELINE_NAMES` order: static provisioning for the oracle's peak and
    for its mean, per pool; the oracle; and the oracle's sizes asked for a start-up time ahead (`OracleAheadPolicy`),
    also capped at the sizes already needed (`oracle-seen`) and held for the largest burst until it comes
    (`oracle-peak`).
    `floor` stands in for the sizes when there is no window."""
    sizes = [(w.num_prefill, w.num_decode) for w in windows] or [floor]
    peak = (max(p for p, _ in sizes), max(d for _, d in sizes))
    mean = tuple(math.ceil(float(np.mean([size[i] for size in sizes])) - 1e-9) for i in (0, 1))
    return [
        FixedPolicy(name="static-peak", num_prefill=peak[0], num_decode=peak[1]),
        FixedPolicy(name="static-mean", num_prefill=mean[0], num_decode=mean[1]),
        OraclePolicy(sizes=sizes, interval_s=window_s, windows=tuple(windows), search_s=search_s),
        OracleAheadPolicy(sizes=sizes, window_s=window_s, lead_s=startup_s),
        OracleAheadPolicy(sizes=sizes, window_s=window_s, lead_s=startup_s, name="oracle-seen", capped_at_seen=True),
        OracleAheadPolicy(sizes=held_for_peak(sizes), window_s=window_s, lead_s=startup_s, name="oracle-peak"),
    ]


def held_for_peak(sizes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The window sizes with each pool raised to its largest size in every window up to the last one that needs it
    (`oracle-peak`): the engines for the trace's largest burst held from the start until it has come."""
    peaks = [max(size[pool] for size in sizes) for pool in (0, 1)]
    lasts = [max(i for i, size in enumerate(sizes) if size[pool] == peaks[pool]) for pool in (0, 1)]
    return [
        (peaks[0] if i <= lasts[0] else prefill, peaks[1] if i <= lasts[1] else decode)
        for i, (prefill, decode) in enumerate(sizes)
    ]


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


# One colour per policy on every panel (plotly's qualitative palette, cycled); the load is drawn in grey.
POLICY_COLOURS = (
    "#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52",
)  # fmt: skip
TARGET_COLOUR = "#c0392b"


def bench_table_rows(runs: Sequence[PolicyRun]) -> list[list[str]]:
    """The results table of the page, one row per policy: policy, SLA ok, TTFT ok, ITL ok, GPU-h, x oracle,
    events (as `planner bench` prints them)."""
    rows = []
    for run in runs:
        r = run.row
        ratio = "-" if r.gpu_hours_vs_oracle is None else f"{r.gpu_hours_vs_oracle:.2f}"
        rows.append(
            [
                r.policy,
                f"{r.sla_attainment:.1%}",
                f"{r.ttft_attainment:.1%}",
                f"{r.itl_attainment:.1%}",
                f"{r.gpu_hours:.2f}",
                ratio,
                str(r.scaling_events),
            ]
        )
    return rows


BENCH_TABLE_HEADER = ("policy", "SLA ok", "TTFT ok", "ITL ok", "GPU-h", "x oracle", "events")


def bench_figure(
    runs: Sequence[PolicyRun],
    trace: RequestTrace,
    *,
    window_s: float = 60.0,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
):
    """A Plotly figure: the results table, then load, ready GPUs and per-window mean TTFT / ITL over time.

    Each policy has one colour and one legend entry for all its lines (a legend group: clicking it hides the
    policy on every panel); `ttft_ms` / `itl_ms` draw the SLA targets on the latency panels.
    """
    from plotly.subplots import make_subplots  # plotting is only needed for the HTML page

    figure = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,  # the time panels share one axis (the table has none)
        vertical_spacing=0.05,
        row_heights=[0.06 + 0.03 * len(runs), 0.2, 0.2, 0.2, 0.2],
        specs=[[{"type": "table"}], [{}], [{}], [{}], [{}]],
        subplot_titles=(
            "results",
            "requests/s",
            "ready GPUs (prefill + decode workers)",
            "mean TTFT (ms)",
            "mean ITL (ms)",
        ),
    )
    figure.add_table(
        header={"values": list(BENCH_TABLE_HEADER), "align": "left", "fill_color": "#f4f6f8"},
        cells={"values": [list(column) for column in zip(*bench_table_rows(runs), strict=True)] if runs else [],
               "align": "left"},
        row=1,
        col=1,
    )  # fmt: skip
    windows = bucket_windows(trace, window_s)
    starts_min = [i * window_s / 60.0 for i in range(len(windows))]
    figure.add_scatter(
        x=starts_min, y=[w.num_req / window_s for w in windows], name="load", line={"color": "#7f7f7f"}, row=2, col=1
    )
    edges = np.arange(len(windows) + 1) * window_s
    window_of = np.clip(np.searchsorted(edges, trace.arrival_s, side="right") - 1, 0, max(0, len(windows) - 1))
    for number, run in enumerate(runs):
        colour = POLICY_COLOURS[number % len(POLICY_COLOURS)]
        style = {"legendgroup": run.row.policy, "line": {"color": colour}}
        timeline = run.result.worker_timeline
        times = [t / 60.0 for t, _, _ in timeline] + [trace.duration_s / 60.0]
        workers = [p + d for _, p, d in timeline] + [timeline[-1][1] + timeline[-1][2]]
        figure.add_scatter(x=times, y=workers, name=run.row.policy, line_shape="hv", row=3, col=1, **style)
        for row, values in ((4, run.result.ttft_s * 1000.0), (5, run.result.itl_s * 1000.0)):
            sums = np.bincount(window_of, weights=np.nan_to_num(values), minlength=len(windows))
            counts = np.bincount(window_of, weights=np.isfinite(values), minlength=len(windows))
            with np.errstate(invalid="ignore", divide="ignore"):
                means = np.where(counts > 0, sums / counts, np.nan)
            figure.add_scatter(x=starts_min, y=means, name=run.row.policy, showlegend=False, row=row, col=1, **style)
    end_min = max(trace.duration_s / 60.0, starts_min[-1] if starts_min else 0.0)
    for row, target, label in ((4, ttft_ms, "TTFT"), (5, itl_ms, "ITL")):
        if target is None:
            continue
        # a line trace, not a shape: it has a legend entry and a hover value like the policies' lines
        figure.add_scatter(
            x=[0.0, end_min], y=[target, target], name=f"{label} target {target:g} ms", mode="lines",
            line={"color": TARGET_COLOUR, "dash": "dash"}, row=row, col=1,
        )  # fmt: skip
    figure.update_xaxes(title_text="minutes into the trace", row=5, col=1)
    figure.update_layout(height=1300 + 25 * len(runs), title=f"planner bench: {trace.source}")
    return figure


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
    from planner_core.perf.capacity import decode_capacity, prefill_capacity

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
        prefill_interp = perf.prefill_capacity(isl=isl, ttft_ms=config.ttft_ms)
        decode_interp = perf.decode_capacity(isl=isl, osl=osl, itl_ms=config.itl_ms)
        # algorithm -> (prefill, decode) requests/s per engine, latency (ms) and whether it meets the target
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
        for algorithm, (
            (prefill_rps, prefill_latency_ms, prefill_met),
            (decode_rps, decode_latency_ms, decode_met),
        ) in per_engine.items():

            def need(rate: float, capacity: float) -> int:
                return math.ceil(rate / capacity - 1e-9) if capacity > 0 else 0

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
                    prefill_replicas_mean=need(mean_rps, prefill_rps),
                    decode_replicas_mean=need(mean_rps, decode_rps),
                    prefill_replicas_peak=need(peak_rps, prefill_rps),
                    decode_replicas_peak=need(peak_rps, decode_rps),
                    prefill_latency_ms=prefill_latency_ms,
                    decode_latency_ms=decode_latency_ms,
                    prefill_sla_met=prefill_met,
                    decode_sla_met=decode_met,
                )
            )
    return rows


BASELINE_NAMES = ("static-peak", "static-mean", "oracle", "oracle-ahead", "oracle-seen", "oracle-peak")
# `oracle-seen` and `oracle-peak` run when asked for: they explain a start-up row's misses, they are not comparisons
DEFAULT_POLICIES = (*BASELINE_NAMES[:4], "threshold", "dynamo-0x", "dynamo-1x", RECOMMENDED_POLICY)
# The same in aggregated mode, without the policies `agg_refusal` refuses.
DEFAULT_AGG_POLICIES = tuple(name for name in DEFAULT_POLICIES if name != "dynamo-0x")
# What every policy is planned and scored for in a bench: it replaces a config file's own values.
SCENARIO_FIELDS = (
    "ttft_ms",
    "itl_ms",
    "prefill_engine_num_gpu",
    "decode_engine_num_gpu",
    "router",  # the simulated frontend's router and its thresholds: the planners size for the router in use
    "ttft_dispatch_threshold",
    "tpot_dispatch_threshold",
)


def policy_names() -> tuple[str, ...]:
    """The named planner policies: the config files in `POLICIES_DIR`, by stem."""
    return tuple(sorted(path.stem for path in POLICIES_DIR.glob("*.yaml")))


def policy_path(name: str) -> Path:
    """The config file of a named policy (`POLICIES_DIR/NAME.yaml`)."""
    return POLICIES_DIR / f"{name}.yaml"


def bench_config(path: Path, base: Mapping[str, object], *, aggregated: bool | None = None) -> PlannerConfig:
    """A planner config file as a bench runs it: the file's settings, with the bench's scenario
    (`SCENARIO_FIELDS` of `base`: the SLA targets the requests are scored against and the simulated engines' GPUs)
    in place of the file's, and the rest of `base` (budget, window, per-tick cap) where the file leaves a field
    unset. `aggregated` True runs a disaggregated file with `mode: agg` (a named policy in `--mode agg`).

    Raises ConfigError (one line naming the file, field and value) for a bad file."""
    policy = load_config(path).policy
    unset = {key: value for key, value in base.items() if key not in SCENARIO_FIELDS}
    unset = {key: value for key, value in unset.items() if key not in policy.model_fields_set}
    scenario = {key: base[key] for key in SCENARIO_FIELDS if key in base}
    mode = {"mode": PlannerMode.AGG.value} if aggregated else {}
    return parse_config({**unset, **policy.model_dump(exclude_unset=True), **scenario, **mode}, str(path)).policy


def agg_refusal(config: PlannerConfig) -> str | None:
    """Why a policy cannot size aggregated engines, or None: the profile interpolation algorithms size separate
    prefill and decode pools only (the throughput loop would hold every tick)."""
    if config.throughput_scaling_active and config.throughput_algorithm is not ThroughputAlgorithm.ENGINE_CAPACITY:
        algorithm = config.throughput_algorithm.value
        return (
            f"its throughput_algorithm {algorithm} sizes separate prefill and decode pools; aggregated engines "
            "need engine_capacity"
        )
    return None


DYNAMO_AGG_REFUSAL = "Dynamo 1.6.1's own planner is benched on disaggregated pools only"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserPlannerConfig:
    """A planner config file benched as a policy (`planner bench --config FILE`), under `name`."""

    name: str
    path: Path


def build_policies(
    names: Sequence[str],
    base: dict[str, object],
    trace: RequestTrace,
    perf: ProfilePerfModel,
    fwd: ForwardPassModel,
    spec: SimSpec,
    *,
    window_s: float,
    oracle: OracleSettings = OracleSettings(),  # noqa: B008 - frozen value
    initial: str = "oracle",
    dynamo_python: str | None = None,
    user_configs: Sequence[UserPlannerConfig] = (),
    horizon_quantiles: Sequence[float] = (),
) -> list[ScalingPolicy]:
    """Policies by name: the baselines, a named policy (`policy_names()`), `DYNAMO_PRESETS` or `fixed:P:D`. Raises
    ValueError on an unknown name, and when a Dynamo policy has no working Dynamo interpreter
    (`find_dynamo_python`).

    A named policy and a config file run the same way: `bench_config` (the file under the bench's scenario), then
    `build_planner` with the bench's engine model `perf` (the planners size for the simulated engines, whatever
    profile the file names). `base` holds the scenario and defaults (SLA targets in `ttft_ms` / `itl_ms`, engine
    GPUs, budget, window, per-tick cap). `user_configs` run after the named policies. `initial` is where the
    planners start: "oracle" (the oracle's first-window size) or "min" (minimum endpoints). The whole trace's oracle
    is searched once, only when a baseline (`oracle`, `static-peak`, `static-mean`) is asked for; otherwise
    `initial="oracle"` searches the first window alone (`oracle_first_window`, the same answer).

    With `spec.aggregated` a named policy runs with `mode: agg`, one `agg_refusal` refuses and the Dynamo policies
    and a fixed size with a prefill pool raise ValueError, `fixed:N` is N aggregated engines, and a config file
    must be in agg mode (and outside it, must not be).

    `horizon_quantiles` add the recommended policy once per value of its start-up horizon knob
    (`throughput_horizon_quantile`), named `planner@qVALUE`: the knob's frontier of attainment against GPU-hours.
    """
    if initial not in ("oracle", "min"):
        raise ValueError(f"initial size: {initial!r} is neither 'oracle' nor 'min'")
    base_config = parse_config({**base, "optimization_target": "sla"}, "bench base config").policy
    cache: dict[str, ScalingPolicy] = {}
    dynamo_checked: set[str | None] = set()
    known_policies = policy_names()

    def baselines() -> dict[str, ScalingPolicy]:
        if not cache:
            policies = baseline_policies(
                trace, fwd, spec, ttft_ms=base_config.ttft_ms, itl_ms=base_config.itl_ms, window_s=window_s,
                settings=oracle,
            )  # fmt: skip
            cache.update({p.name: p for p in policies})
        return cache

    first_window: list[tuple[int, int]] = []  # the oracle's first size, when the oracle itself is not run

    def starting_size(otherwise: tuple[int, int] | None) -> tuple[int, int] | None:
        if initial != "oracle":
            return otherwise
        if any(name in BASELINE_NAMES for name in names):  # the whole search runs anyway: take its first window
            oracle_policy = baselines()["oracle"]
            assert isinstance(oracle_policy, OraclePolicy)
            return oracle_policy.sizes[0]
        if not first_window:  # the first window alone (seconds, where the whole trace takes about a minute)
            window = oracle_first_window(
                trace, fwd, spec, ttft_ms=base_config.ttft_ms, itl_ms=base_config.itl_ms, window_s=window_s,
                settings=oracle,
            )  # fmt: skip
            floor = (0 if spec.aggregated else oracle.min_prefill, oracle.min_decode)
            first_window.append(floor if window is None else (window.num_prefill, window.num_decode))
        return first_window[0]

    aggregated = spec.aggregated
    # Configs and refusals first, before the oracle's search spends minutes.
    configs: dict[str, PlannerConfig] = {}
    for name in names:
        if name in known_policies:
            configs[name] = bench_config(policy_path(name), base, aggregated=aggregated)
            why = agg_refusal(configs[name]) if aggregated else None
            if why is not None:
                raise ValueError(f"--policies: {name} cannot run with --mode agg: {why}")
        elif aggregated and name in DYNAMO_PRESETS:
            raise ValueError(f"--policies: {name} cannot run with --mode agg: {DYNAMO_AGG_REFUSAL}")
        elif aggregated and name.startswith("fixed:"):
            _fixed_agg(name)
    for user in user_configs:
        configs[user.name] = config = bench_config(user.path, base)
        if (config.mode is PlannerMode.AGG) != aggregated:
            bench_mode = "agg" if aggregated else "disagg"
            raise ValueError(f"--config {user.path}: mode {config.mode.value!r} cannot run with --mode {bench_mode}")

    def planner_policy(name: str, path: Path) -> PlannerPolicy:
        return PlannerPolicy(
            name=name,
            planner=build_planner(configs[name], path, perf=perf),
            initial_size=starting_size(None),  # None: the minimum endpoints
        )

    policies: list[ScalingPolicy] = []
    for name in names:
        if name in BASELINE_NAMES:
            policies.append(baselines()[name])
        elif name in known_policies:
            policies.append(planner_policy(name, policy_path(name)))
        elif name in DYNAMO_PRESETS:
            python = find_dynamo_python(dynamo_python)
            if python not in dynamo_checked:  # one import check (~3 s) for both Dynamo presets
                check_dynamo_python(python)
                dynamo_checked.add(python)
            assert python is not None
            # Dynamo reads the same profile directory (its perf-data fallback) as the bench's engines.
            source = getattr(getattr(perf, "profile", None), "source_dir", None)
            start = starting_size((1, 1))  # else Dynamo's default min_endpoint per pool
            assert start is not None
            policies.append(
                DynamoPlannerPolicy(
                    name=name,
                    python=python,
                    config=dynamo_config(base, name),
                    capabilities=engine_capabilities(spec),
                    initial_size=start,
                    profile_dir=Path(source) if source and Path(source).is_dir() else None,
                )
            )
        elif name.startswith("fixed:") and aggregated:
            policies.append(_fixed_agg(name))
        elif name.startswith("fixed:"):
            parts = name.split(":")
            if len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
                raise ValueError(f"--policies: {name!r}: a fixed size is written fixed:P:D, e.g. fixed:2:4")
            policies.append(FixedPolicy(name=name, num_prefill=int(parts[1]), num_decode=int(parts[2])))
        else:
            if aggregated:
                known = ", ".join([*BASELINE_NAMES, *known_policies, "fixed:N"])
            else:
                known = ", ".join([*BASELINE_NAMES, *known_policies, *DYNAMO_PRESETS, "fixed:P:D"])
            raise ValueError(f"--policies: unknown policy {name!r} (known: {known})")
    policies.extend(planner_policy(user.name, user.path) for user in user_configs)
    for quantile in horizon_quantiles:
        name = horizon_policy_name(quantile)
        recommended = bench_config(policy_path("planner"), base, aggregated=aggregated)
        configs[name] = recommended.model_copy(update={"throughput_horizon_quantile": quantile})
        policies.append(planner_policy(name, policy_path("planner")))
    return policies


def horizon_policy_name(quantile: float) -> str:
    """The bench name of the recommended policy at one setting of its horizon knob (`--horizon-quantiles`)."""
    return f"planner@q{quantile:g}"


def _fixed_agg(name: str) -> FixedPolicy:
    """`fixed:N` in aggregated mode: N aggregated engines (`fixed:0:N` says the same; a prefill pool is refused)."""
    parts = name.split(":")
    if not all(p.isdigit() for p in parts[1:]) or len(parts) not in (2, 3):
        raise ValueError(f"--policies: {name!r}: a fixed size is written fixed:N with --mode agg, e.g. fixed:4")
    if len(parts) == 3 and int(parts[1]) > 0:
        raise ValueError(
            f"--policies: {name!r}: --mode agg has no prefill pool; write fixed:N for N aggregated engines"
        )
    return FixedPolicy(name=name, num_prefill=0, num_decode=int(parts[-1]))
