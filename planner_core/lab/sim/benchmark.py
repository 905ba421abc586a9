"""The `planner bench` use case: from a request (trace, engines, SLA targets, policy names, config files) to the
policies' runs in the simulator. The CLI parses arguments into a `BenchRequest`, calls `benchmark` and prints;
`planner_core.lab.sim.bench` holds the policies, the runner and the figures this module puts together."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from planner_core.config import load_config
from planner_core.domain import EngineLimits
from planner_core.lab.sim.bench import (
    DEFAULT_AGG_POLICIES,
    DEFAULT_POLICIES,
    BenchRow,
    PolicyRun,
    ScalingPolicy,
    UserPlannerConfig,
    build_policies,
    run_bench,
)
from planner_core.lab.sim.des import (
    PROFILE_SPEED,
    EngineSpeed,
    NoEndpointAction,
    RouterPolicy,
    SimSpec,
    SloRouting,
    SpeedChange,
)
from planner_core.lab.sim.oracle import OracleSettings, oracle_first_window, oracle_windows
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.model import ProfilePerfModel
from planner_core.perf.table import TablePerfModel
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.profiling import parse_tpot_profile, parse_ttft_profile
from planner_core.routing.scheduler import SloTargets
from planner_core.routing.tables import tables_from_forward_model
from planner_core.traces import RequestTrace, load_servegen_shape, load_trace, shape_trace

# Used when neither --max-kv-tokens nor the profile gives a decode engine's KV capacity (Dynamo's fallback).
FALLBACK_MAX_KV_TOKENS = 2_000_000
MAX_REPLICAS_PER_STEP = 8
ENGINE_SPEED_DYNAMO_REFUSAL = (
    "--engine dynamo: --engine-speed and --engine-speed-change apply to the default engine only (Dynamo's replay "
    "times its engines from the profile)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRequest:
    """Everything one `planner bench` run depends on (the command line's options)."""

    trace: Path
    profile: Path
    rate_scale: float = 1.0
    compress: float = 1.0
    shape: Path | None = None  # a ServeGen rate CSV or folder: the requests follow its mean daily cycle
    shape_hours: float = 24.0
    shape_start_h: float = 0.0
    perf_table: Path | None = None
    max_kv_tokens: int | None = None
    configs: tuple[Path, ...] = ()
    policies: tuple[str, ...] | None = None  # None: the default list of the mode
    aggregated: bool = False
    ttft_ms: float = 500.0
    itl_ms: float = 50.0
    startup_s: float = 120.0
    max_gpu_budget: int = -1
    throughput_interval_s: int = 180
    oracle_target: float = 0.99
    oracle_context_s: float = 60.0
    initial: str = "oracle"
    dynamo_python: str | None = None
    router: RouterPolicy = RouterPolicy.LEAST_LOADED
    # router `slo`: the profiling files (None: built from the simulated engines' model), thresholds, what happens to
    # a request with no available endpoint, adaptive disaggregation
    ttft_profile: Path | None = None
    tpot_profile: Path | None = None
    ttft_dispatch_threshold: float = 1.0
    tpot_dispatch_threshold: float = 1.0
    no_endpoint: NoEndpointAction = NoEndpointAction.QUEUE
    adaptive_pd: bool = True
    horizon_quantiles: tuple[float, ...] = ()  # the recommended policy again at each value of its horizon knob
    engine: str = "sim"  # "sim": our simulator; "dynamo": Dynamo 1.6.1's replay (`planner_core.lab.sim.dynamo_engine`)
    # on Dynamo's engine: the oracle's exact per-window search, or its bracket approximation (`replay_oracle_windows`)
    dynamo_oracle: str = "exact"
    # the simulated engines' speed as a multiple of the profile's, and its change mid-run (`--engine-speed`,
    # `--engine-speed-change`; `planner_core.lab.sim.des.speed`): the planners and the router still read the profile
    engine_speed: EngineSpeed = PROFILE_SPEED
    speed_change: SpeedChange | None = None

    @property
    def engine_lies(self) -> bool:
        """Whether the simulated engines run otherwise than the profile says (at some time of the run)."""
        return not self.engine_speed.is_profile or self.speed_change is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOutcome:
    """The runs of one bench, with what was run and the warnings met on the way (one line each)."""

    trace: RequestTrace
    policies: tuple[ScalingPolicy, ...]
    runs: tuple[PolicyRun, ...]
    warnings: tuple[str, ...]


def bench_trace(request: BenchRequest) -> RequestTrace:
    """The bench's requests: the trace, rate-scaled or shaped by a ServeGen daily cycle, then time-compressed."""
    trace = load_trace(request.trace)
    if request.shape is not None:
        shape = load_servegen_shape(request.shape).daily()
        trace = shape_trace(
            trace,
            shape,
            duration_s=request.shape_hours * 3600.0,
            rate_factor=request.rate_scale,
            start_s=request.shape_start_h * 3600.0,
        )
    elif request.rate_scale != 1.0:
        trace = trace.scaled(request.rate_scale)
    if request.compress != 1.0:
        trace = trace.compressed(request.compress)
    return trace


def slo_routing_for(request: BenchRequest, fwd: ForwardPassModel, limits: EngineLimits) -> SloRouting:
    """The SLO-aware router of a bench: the predictor from the request's profiling files, else from the simulated
    engines' own model (`tables_from_forward_model`), and the bench's SLA as its targets."""
    import json

    if (request.ttft_profile is None) != (request.tpot_profile is None):
        raise ValueError(
            "--ttft-profile and --tpot-profile go together (or neither: tables from the simulated engines)"
        )
    if request.ttft_profile is not None and request.tpot_profile is not None:
        ttft = parse_ttft_profile(
            json.loads(request.ttft_profile.read_text(encoding="utf-8")), source=str(request.ttft_profile)
        )
        tpot = parse_tpot_profile(
            json.loads(request.tpot_profile.read_text(encoding="utf-8")), source=str(request.tpot_profile)
        )
    else:
        ttft, tpot = tables_from_forward_model(
            fwd, chunk_tokens=limits.max_num_batched_tokens, metadata={"description": "simulated engines' model"}
        )
    return SloRouting(
        predictor=LatencyPredictor(ttft, tpot),
        targets=SloTargets(
            ttft_ms=request.ttft_ms,
            tpot_ms=request.itl_ms,
            ttft_dispatch_threshold=request.ttft_dispatch_threshold,
            tpot_dispatch_threshold=request.tpot_dispatch_threshold,
        ),
        no_endpoint=request.no_endpoint,
        adaptive_pd=request.adaptive_pd,
    )


def benchmark(
    request: BenchRequest,
    *,
    on_policies_built: Callable[[Sequence[ScalingPolicy]], None] | None = None,
    on_policy_done: Callable[[BenchRow], None] | None = None,
) -> BenchOutcome:
    """Build the named policies and the config files' planners, run each on the same requests, score them.

    Raises ValueError (one line) on an unknown policy, a config that cannot run in the bench's mode, or a Dynamo
    policy without a working Dynamo interpreter."""
    trace = bench_trace(request)
    perf = ProfilePerfModel.load(request.profile, perf_table=request.perf_table)
    fwd = perf.forward_pass_model()
    assert fwd is not None
    # a perf table describes engines of `tp` GPUs: the simulator's engines and the planners' sizing both use it
    gpus_per_engine = fwd.table.header.tp if isinstance(fwd, TablePerfModel) else 1
    base = _base_config(request, gpus_per_engine)
    names = list(request.policies or (DEFAULT_AGG_POLICIES if request.aggregated else DEFAULT_POLICIES))
    max_kv_tokens = request.max_kv_tokens or perf.profiled_max_kv_tokens() or FALLBACK_MAX_KV_TOKENS
    spec = SimSpec(
        prefill_limits=EngineLimits(num_gpu=gpus_per_engine),
        decode_limits=EngineLimits(num_gpu=gpus_per_engine, max_kv_tokens=max_kv_tokens),
        startup_s=request.startup_s,
        aggregated=request.aggregated,  # the aggregated engines are the decode pool: `decode_limits`, GPUs per engine
        # the engines' speed: the bench's runs and the oracle's search simulate it; the planners read the profile
        engine_speed=request.engine_speed,
        speed_change=request.speed_change,
    )
    # The oracle's search, and so the static sizes, run with the least-loaded router whatever the bench's router:
    # the sizes stay the same across routers, so the static rows show what routing alone does at equal capacity.
    sizing_spec = spec
    if request.router is not RouterPolicy.LEAST_LOADED:
        slo = None
        if request.router is RouterPolicy.SLO:
            limits = spec.decode_limits if spec.aggregated else spec.prefill_limits
            slo = slo_routing_for(request, fwd, limits)
        spec = dataclasses.replace(spec, router=request.router, slo_routing=slo)
    user_configs, warnings = _user_configs(request, names)
    oracle = OracleSettings(target_attainment=request.oracle_target, context_s=request.oracle_context_s)
    if request.engine == "dynamo" and request.engine_lies:
        raise ValueError(ENGINE_SPEED_DYNAMO_REFUSAL)
    if request.engine == "dynamo" and (request.router is not RouterPolicy.LEAST_LOADED or request.horizon_quantiles):
        # Dynamo's replay routes with its own router and runs the policies as given
        raise ValueError("--engine dynamo: --router and --horizon-quantiles apply to the default engine only")
    if request.engine == "dynamo":
        return _dynamo_benchmark(
            request, names, base, trace, perf, fwd, spec, oracle, user_configs, warnings, on_policies_built,
            on_policy_done,
        )  # fmt: skip
    if request.engine != "sim":
        raise ValueError(f"--engine: {request.engine!r} is neither 'sim' nor 'dynamo'")
    policies = build_policies(
        names, base, trace, perf, fwd, sizing_spec, window_s=request.throughput_interval_s, oracle=oracle,
        initial=request.initial, dynamo_python=request.dynamo_python, user_configs=user_configs,
        horizon_quantiles=request.horizon_quantiles,
    )  # fmt: skip
    warnings.extend(_plugin_warnings(policies))
    if on_policies_built is not None:
        on_policies_built(policies)
    runs = run_bench(
        policies, trace, fwd, spec, ttft_ms=request.ttft_ms, itl_ms=request.itl_ms, on_policy_done=on_policy_done
    )
    return BenchOutcome(trace=trace, policies=tuple(policies), runs=tuple(runs), warnings=tuple(warnings))


def _base_config(request: BenchRequest, gpus_per_engine: int) -> dict[str, object]:
    """The bench's scenario and defaults every planner policy runs under (`build_policies`' `base`)."""
    return {
        "ttft_ms": request.ttft_ms,
        "itl_ms": request.itl_ms,
        "max_gpu_budget": request.max_gpu_budget,
        "throughput_adjustment_interval_seconds": request.throughput_interval_s,
        "max_throughput_scaling_replicas": MAX_REPLICAS_PER_STEP,
        "prefill_engine_num_gpu": gpus_per_engine,
        "decode_engine_num_gpu": gpus_per_engine,
        # the planners know the router: under `slo` the throughput loop sizes engines at SLO x threshold
        "router": request.router.value,
        "ttft_dispatch_threshold": request.ttft_dispatch_threshold,
        "tpot_dispatch_threshold": request.tpot_dispatch_threshold,
    }


def _user_configs(request: BenchRequest, names: Sequence[str]) -> tuple[list[UserPlannerConfig], list[str]]:
    """The config files benched as policies, each named apart from the named policies, and a warning for each file
    whose SLA targets the bench overrides."""
    warnings: list[str] = []
    user_configs: list[UserPlannerConfig] = []
    for path in request.configs:
        config = load_config(path).policy
        if (config.ttft_ms, config.itl_ms) != (request.ttft_ms, request.itl_ms):
            warnings.append(
                f"{path} sets TTFT {config.ttft_ms:g} ms / ITL {config.itl_ms:g} ms; the bench plans and scores "
                f"every policy at --ttft-ms {request.ttft_ms:g} / --itl-ms {request.itl_ms:g}"
            )
        taken = {*names, *(user.name for user in user_configs)}
        name = f"config:{path.stem}" if f"config:{path.stem}" not in taken else f"config:{path}"
        user_configs.append(UserPlannerConfig(name=name, path=path))
    return user_configs, warnings


def _plugin_warnings(policies: Sequence[ScalingPolicy]) -> list[str]:
    """A warning for each plugin a planner policy could not load."""
    warnings: list[str] = []
    for policy in policies:
        planner = getattr(policy, "planner", None)  # a planner policy: its plugins that did not load
        warnings.extend(
            f"{policy.name}: plugin {error.entry_point} ({error.target}) not loaded: {error.message}"
            for error in (planner.plugin_load_errors if planner is not None else ())
        )
    return warnings


def _dynamo_benchmark(  # untyped: benchmark's locals, passed through
    request, names, base, trace, perf, fwd, spec, oracle, user_configs, warnings, on_built, on_done
):
    """`benchmark` on Dynamo's replay engine (`planner_core.lab.sim.dynamo_engine.dynamo_bench`): the same policies,
    built by `build_policies`, served by Dynamo's replay, with that engine's own oracle."""
    from planner_core.lab.sim.dynamo_engine import REPLAY_ROUTER, dynamo_bench

    # the planners know the router, as on our simulator (`_base_config`): the one Dynamo's replay routes with
    base = {**base, "router": REPLAY_ROUTER.value}

    def build(chosen):
        return build_policies(
            chosen, base, trace, perf, fwd, spec, window_s=request.throughput_interval_s, oracle=oracle,
            initial="min", dynamo_python=request.dynamo_python, user_configs=user_configs,
        )  # fmt: skip

    if request.dynamo_oracle not in ("exact", "bracket"):
        raise ValueError(f"--dynamo-oracle: {request.dynamo_oracle!r} is neither 'exact' nor 'bracket'")

    def bracket(num_windows: int | None):  # our simulator's oracle windows, the approximation's starting sizes
        if num_windows == 1:  # the planners' starting size alone (no baseline row): not the whole trace's search
            first = oracle_first_window(
                trace, fwd, spec, ttft_ms=request.ttft_ms, itl_ms=request.itl_ms,
                window_s=request.throughput_interval_s, settings=oracle,
            )  # fmt: skip
            return [] if first is None else [first]
        return oracle_windows(
            trace, fwd, spec, ttft_ms=request.ttft_ms, itl_ms=request.itl_ms,
            window_s=request.throughput_interval_s, settings=oracle,
        )  # fmt: skip

    source = getattr(getattr(perf, "profile", None), "source_dir", None)
    policies, runs = dynamo_bench(
        names, build, trace, spec, ttft_ms=request.ttft_ms, itl_ms=request.itl_ms,
        window_s=request.throughput_interval_s, settings=oracle, initial=request.initial,
        dynamo_python=request.dynamo_python, profile_dir=Path(source) if source and Path(source).is_dir() else None,
        num_configs=len(user_configs), on_policies_built=on_built, on_policy_done=on_done,
        bracket=bracket if request.dynamo_oracle == "bracket" else None,
    )  # fmt: skip
    return BenchOutcome(trace=trace, policies=tuple(policies), runs=tuple(runs), warnings=tuple(warnings))
