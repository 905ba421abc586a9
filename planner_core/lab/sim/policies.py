"""The scaling policies `planner bench` runs (`planner_core.lab.sim.bench` describes each): fixed sizes, the
oracle and its start-up-aware variants, the planner in the loop, and the catalogue that builds them by name
(`build_policies`: baselines, named policy files, Dynamo presets, `fixed:P:D`, user config files)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from planner_core.config import PlannerConfig, PlannerMode, ThroughputAlgorithm, load_config, parse_config
from planner_core.data import POLICIES_DIR, RECOMMENDED_POLICY
from planner_core.domain import Loop, PlannerState, TickInputs
from planner_core.lab.sim.des import ClusterSimulator, SimSpec
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
    oracle_first_window,
    oracle_windows,
)
from planner_core.lab.sim.references import BudgetChoice, StaticSearch, budget_sizes, static_best
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.model import ProfilePerfModel
from planner_core.planner import Planner, build_planner
from planner_core.traces import RequestTrace


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
class StaticBestPolicy:
    """`static-best`: the cheapest fixed size serving the target share of the attainable requests over the whole
    run, searched in hindsight (`planner_core.lab.sim.references.static_best`)."""

    search: StaticSearch
    name: str = "static-best"
    interval_s: float = math.inf
    startup_s: float | None = None

    @property
    def search_s(self) -> float:  # reported with its size (`planner bench` prints it)
        return self.search.search_s

    def initial(self) -> tuple[int, int]:
        return self.search.size

    def decide(self, now_s: float, sim: ClusterSimulator) -> None:  # noqa: ARG002
        return None


@dataclass(slots=True)
class OracleBudgetPolicy(OraclePolicy):
    """`oracle-budget`: per-window sizes meeting the target over the whole run at the fewest GPU-hours, chosen
    from the oracle's window simulations (`planner_core.lab.sim.references.budget_sizes`), run like the oracle's."""

    choice: BudgetChoice | None = None
    num_required: int = 0  # requests within both targets the whole run must have: ceil(target * attainable)


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
                # the engines' iterations: the load loop's signal, and the closed loop's measure of their speed
                fpm=sim.latest_fpm() if loop is Loop.LOAD or self.config.throughput_capacity_feedback else (),
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


BASELINE_NAMES = ("static-peak", "static-mean", "oracle", "oracle-ahead", "oracle-seen", "oracle-peak")
# Hindsight references, run when asked for (`planner_core.lab.sim.references`): they search on top of the oracle's
REFERENCE_NAMES = ("static-best", "oracle-budget")
# The recommended policy with its closed loops off (`throughput_capacity_feedback` and `throughput_error_budget`
# false): what the loops buy
OPEN_LOOP_POLICY = "planner-open-loop"
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
    unset. `aggregated` True runs a disaggregated file with `mode: agg` (a named policy in `--mode agg`), its closed
    loop off (it learns disaggregated pools only).

    Raises ConfigError (one line naming the file, field and value) for a bad file."""
    policy = load_config(path).policy
    unset = {key: value for key, value in base.items() if key not in SCENARIO_FIELDS}
    unset = {key: value for key, value in unset.items() if key not in policy.model_fields_set}
    scenario = {key: base[key] for key in SCENARIO_FIELDS if key in base}
    # the closed loop learns disaggregated pools only (`planner_core.policy.feedback`): off for aggregated engines
    mode = {"mode": PlannerMode.AGG.value, "throughput_capacity_feedback": False} if aggregated else {}
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
    known_policies = policy_names()
    search = _OracleSearch(
        trace=trace, fwd=fwd, spec=spec, ttft_ms=base_config.ttft_ms, itl_ms=base_config.itl_ms, window_s=window_s,
        settings=oracle, from_oracle=initial == "oracle",
        whole_trace=any(name in (*BASELINE_NAMES, *REFERENCE_NAMES) for name in names),
    )  # fmt: skip
    aggregated = spec.aggregated
    # Names, configs and refusals first, before the oracle's search spends minutes.
    _check_names(names, known_policies, aggregated=aggregated)
    configs = _checked_configs(names, base, known_policies, user_configs, aggregated=aggregated)

    def planner_policy(name: str, path: Path) -> PlannerPolicy:
        return PlannerPolicy(
            name=name,
            planner=build_planner(configs[name], path, perf=perf),
            initial_size=search.starting_size(None),  # None: the minimum endpoints
        )

    dynamo_checked: set[str | None] = set()
    policies: list[ScalingPolicy] = []
    for name in names:
        if name in BASELINE_NAMES:
            policies.append(search.baselines()[name])
        elif name in REFERENCE_NAMES:
            policies.append(search.reference(name))
        elif name in known_policies:
            policies.append(planner_policy(name, policy_path(name)))
        elif name == OPEN_LOOP_POLICY:
            policies.append(planner_policy(name, policy_path(RECOMMENDED_POLICY)))
        elif name in DYNAMO_PRESETS:
            policies.append(_dynamo_policy(name, base, perf, spec, search, dynamo_python, dynamo_checked))
        elif name.startswith("fixed:") and aggregated:
            policies.append(_fixed_agg(name))
        elif name.startswith("fixed:"):
            policies.append(_fixed_disagg(name))
        else:
            raise ValueError(_unknown_policy(name, known_policies, aggregated=aggregated))
    policies.extend(planner_policy(user.name, user.path) for user in user_configs)
    for quantile in horizon_quantiles:
        name = horizon_policy_name(quantile)
        recommended = bench_config(policy_path("planner"), base, aggregated=aggregated)
        configs[name] = recommended.model_copy(update={"throughput_horizon_quantile": quantile})
        policies.append(planner_policy(name, policy_path("planner")))
    return policies


@dataclass(slots=True, kw_only=True)
class _OracleSearch:
    """The oracle's search for `build_policies`, run at most once and only when needed: the whole trace when a
    baseline is asked for (`baselines`), else, for the planners' starting size, the first window alone."""

    trace: RequestTrace
    fwd: ForwardPassModel
    spec: SimSpec
    ttft_ms: float
    itl_ms: float
    window_s: float
    settings: OracleSettings
    from_oracle: bool  # `initial="oracle"`: the planners start at the oracle's first size
    whole_trace: bool  # a baseline is asked for, so the whole search runs anyway
    cache: dict[str, ScalingPolicy] = dataclasses.field(default_factory=dict)
    references: dict[str, ScalingPolicy] = dataclasses.field(default_factory=dict)  # `reference`'s, by name
    first_window: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # when the oracle is not run

    def baselines(self) -> dict[str, ScalingPolicy]:
        if not self.cache:
            policies = baseline_policies(
                self.trace, self.fwd, self.spec, ttft_ms=self.ttft_ms, itl_ms=self.itl_ms, window_s=self.window_s,
                settings=self.settings,
            )  # fmt: skip
            self.cache.update({p.name: p for p in policies})
        return self.cache

    def reference(self, name: str) -> ScalingPolicy:
        """`static-best` or `oracle-budget`, from the whole trace's oracle windows (searched once, kept)."""
        if name not in self.references:
            oracle_policy = self.baselines()["oracle"]
            assert isinstance(oracle_policy, OraclePolicy)
            windows = oracle_policy.windows
            if name == "static-best":
                found = static_best(
                    self.trace, self.fwd, self.spec, windows, ttft_ms=self.ttft_ms, itl_ms=self.itl_ms,
                    settings=self.settings,
                )  # fmt: skip
                self.references[name] = StaticBestPolicy(search=found)
            else:
                started = time.perf_counter()
                gpus = (self.spec.prefill_limits.num_gpu, self.spec.decode_limits.num_gpu)
                sizes, choice = budget_sizes(
                    windows, target_attainment=self.settings.target_attainment, gpus=gpus, window_s=self.window_s
                )
                self.references[name] = OracleBudgetPolicy(
                    sizes=sizes or list(oracle_policy.sizes), interval_s=self.window_s, name="oracle-budget",
                    windows=tuple(windows), search_s=time.perf_counter() - started, choice=choice,
                    num_required=math.ceil(
                        self.settings.target_attainment * sum(w.num_attainable for w in windows) - 1e-9
                    ),
                )  # fmt: skip
        return self.references[name]

    def starting_size(self, otherwise: tuple[int, int] | None) -> tuple[int, int] | None:
        if not self.from_oracle:
            return otherwise
        if self.whole_trace:  # take the whole search's first window
            oracle_policy = self.baselines()["oracle"]
            assert isinstance(oracle_policy, OraclePolicy)
            return oracle_policy.sizes[0]
        if not self.first_window:  # the first window alone (seconds, where the whole trace takes about a minute)
            window = oracle_first_window(
                self.trace, self.fwd, self.spec, ttft_ms=self.ttft_ms, itl_ms=self.itl_ms, window_s=self.window_s,
                settings=self.settings,
            )  # fmt: skip
            floor = (0 if self.spec.aggregated else self.settings.min_prefill, self.settings.min_decode)
            self.first_window.append(floor if window is None else (window.num_prefill, window.num_decode))
        return self.first_window[0]


def _checked_configs(
    names: Sequence[str],
    base: Mapping[str, object],
    known_policies: Sequence[str],
    user_configs: Sequence[UserPlannerConfig],
    *,
    aggregated: bool,
) -> dict[str, PlannerConfig]:
    """The named policies' and user files' configs under the bench's scenario (`bench_config`); raises ValueError
    for what cannot run in the bench's mode (`agg_refusal`, the Dynamo presets and a prefill pool in agg mode, a
    user file in the other mode)."""
    configs: dict[str, PlannerConfig] = {}
    for name in names:
        if name == OPEN_LOOP_POLICY:
            recommended = bench_config(policy_path(RECOMMENDED_POLICY), base, aggregated=aggregated)
            # both loops off: the engine speeds learned and the SLA error budget (each feeds back what it observed)
            update = {"throughput_capacity_feedback": False, "throughput_error_budget": False}
            configs[name] = recommended.model_copy(update=update)
        elif name in known_policies:
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
    return configs


def _dynamo_policy(
    name: str,
    base: Mapping[str, object],
    perf: ProfilePerfModel,
    spec: SimSpec,
    search: _OracleSearch,
    dynamo_python: str | None,
    dynamo_checked: set[str | None],
) -> DynamoPlannerPolicy:
    """A Dynamo 1.6.1 preset, deciding in Dynamo's interpreter (checked once for both presets: ~3 s)."""
    python = find_dynamo_python(dynamo_python)
    if python not in dynamo_checked:
        check_dynamo_python(python)
        dynamo_checked.add(python)
    assert python is not None
    # Dynamo reads the same profile directory (its perf-data fallback) as the bench's engines.
    source = getattr(getattr(perf, "profile", None), "source_dir", None)
    start = search.starting_size((1, 1))  # else Dynamo's default min_endpoint per pool
    assert start is not None
    return DynamoPlannerPolicy(
        name=name,
        python=python,
        config=dynamo_config(base, name),
        capabilities=engine_capabilities(spec),
        initial_size=start,
        profile_dir=Path(source) if source and Path(source).is_dir() else None,
    )


def _fixed_disagg(name: str) -> FixedPolicy:
    """`fixed:P:D`: P prefill and D decode workers."""
    parts = name.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"--policies: {name!r}: a fixed size is written fixed:P:D, e.g. fixed:2:4")
    return FixedPolicy(name=name, num_prefill=int(parts[1]), num_decode=int(parts[2]))


def _check_names(names: Sequence[str], known_policies: Sequence[str], *, aggregated: bool) -> None:
    """Every name is a policy the bench knows and every fixed size is well written; raises ValueError (one line)
    on the first that is not."""
    named = {*BASELINE_NAMES, *REFERENCE_NAMES, *known_policies, OPEN_LOOP_POLICY, *DYNAMO_PRESETS}
    for name in names:
        if name in named:
            continue
        if name.startswith("fixed:"):
            (_fixed_agg if aggregated else _fixed_disagg)(name)
        elif name.startswith("config:"):
            raise ValueError(
                f"--policies: {name!r}: a config file is benched with --config FILE (it runs as config:<file stem>),"
                " not named in --policies"
            )
        else:
            raise ValueError(_unknown_policy(name, known_policies, aggregated=aggregated))


def _unknown_policy(name: str, known_policies: Sequence[str], *, aggregated: bool) -> str:
    if aggregated:
        known = ", ".join([*BASELINE_NAMES, *REFERENCE_NAMES, *known_policies, OPEN_LOOP_POLICY, "fixed:N"])
    else:
        known = ", ".join(
            [*BASELINE_NAMES, *REFERENCE_NAMES, *known_policies, OPEN_LOOP_POLICY, *DYNAMO_PRESETS, "fixed:P:D"]
        )
    return f"--policies: unknown policy {name!r} (known: {known})"


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
