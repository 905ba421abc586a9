"""The planner as users run it: a policy with its models and plugins, and the one way into the decision core.

`build_planner` is the one function that turns a policy (a `PlannerConfig`, usually from a file) into a `Planner`:
it loads the engine perf model the policy names (the profile, and the aiconfigurator table when `perf_table` is
set) and the user's plugins. `Planner.decide` is the one call that reaches `tick()`: served ticks, the demo and
replay (through `planner_core.runtime.service.decide`) and `planner bench` (`planner_core.lab.sim.bench`) all go
through it, so what the benchmark measures is what ships. The sources record their request arrivals with the
observation as they saw them (`planner_core.arrivals.with_arrivals`, no policy in it); the tick derives from them
the traffic features the policy reads (the prompt-arrival curve, counted at this planner's engine rate), and
`Planner.traffic_features` gives the same derivation to whoever stores or shows the observation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner_core.config import (
    ConfigError,
    PlannerConfig,
    managed_components,
    resolve_config_relative,
    resolve_profile_dir,
)
from planner_core.domain import Component, PlannerState, TickInputs, TickOutcome, TrafficObservation
from planner_core.perf.model import ProfilePerfModel
from planner_core.pipeline import Plugin, PluginLoadError
from planner_core.pipeline.user_plugins import load_plugins
from planner_core.policy.throughput import with_prompt_curve
from planner_core.tick import tick

__all__ = ["Planner", "RequestShape", "budget_warnings", "build_planner", "refuse_what_cannot_work"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Planner:
    """A policy ready to decide: its config, engine perf model and user plugins (`build_planner`)."""

    config: PlannerConfig
    perf: ProfilePerfModel | None  # None: no profile found (the tick says model_not_ready)
    plugins: tuple[Plugin, ...] = ()  # the user's plugins, loaded and resolved against the config
    plugin_load_errors: tuple[PluginLoadError, ...] = ()  # enabled entry points that failed to load (skipped)

    def decide(
        self, inputs: TickInputs, state: PlannerState, *, clock: Callable[[], float] | None = None
    ) -> TickOutcome:
        """The decision for one tick. Pure given the planner: `clock` (monotonic seconds, live ticks only) just
        enforces plugin and tick deadlines."""
        return tick(inputs, state, self.config, self.perf, self.plugins, clock=clock)

    def traffic_features(self, traffic: TrafficObservation) -> TrafficObservation:
        """`traffic` with the features this planner's tick derives from its recorded arrivals (the prompt-arrival
        curve, each prompt counted up to this planner's engine share: `with_prompt_curve`), as the tick reads it."""
        return with_prompt_curve(self.config, self.perf, traffic)


def build_planner(
    config: PlannerConfig,
    config_path: Path | None,
    *,
    profile_dir: Path | None = None,
    perf_table: Path | None = None,
    perf: ProfilePerfModel | None = None,
) -> Planner:
    """The planner a policy describes: the one place its models and plugins are loaded.

    Args:
        config: the policy.
        config_path: the file it came from; relative paths in it are taken from its folder.
        profile_dir: this profile folder instead of the config's `profile_results_dir` (replay; the benchmark,
            whose planners size for the simulated engines).
        perf_table: this aiconfigurator table instead of the config's `perf_table` (the benchmark).
        perf: an engine model already loaded from the same profile and table (the benchmark loads it once for
            every policy it runs).

    Raises:
        PluginConfigError: the config's `plugins` section names a plugin that is not installed or does not fit.
        ProfileError: the profile folder exists but is malformed.
    """
    if perf is None:
        profile_dir = profile_dir if profile_dir is not None else resolve_profile_dir(config, config_path)
        if perf_table is None and config.perf_table is not None:
            perf_table = resolve_config_relative(config.perf_table, config_path)
        perf = ProfilePerfModel.load(profile_dir, perf_table=perf_table) if profile_dir.exists() else None
    plugins, errors = load_plugins(config, perf, source=config_path.name if config_path is not None else "config")
    return Planner(config=config, perf=perf, plugins=plugins, plugin_load_errors=errors)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestShape:
    """A request's mean lengths (tokens) and where they come from (`the trace's mean`), for the SLA check."""

    isl: float
    osl: float
    source: str


# The shortest request the profile knows: the interpolators clamp a length to the profiled range, so a one-token
# prompt asks for the profile's fastest prefill and smallest decode context.
_SHORTEST = RequestShape(isl=1.0, osl=1.0, source="its shortest request")


def _lengths(shape: RequestShape) -> str:
    return "" if shape is _SHORTEST else f" (ISL {shape.isl:.0f}, OSL {shape.osl:.0f})"


def refuse_what_cannot_work(
    config: PlannerConfig, config_path: Path | None, *, shape: RequestShape | None = None
) -> Planner:
    """The planner of a config every command that loads one builds first, refusing in one line what cannot work
    (the budget against the minimums is a config rule already, checked as the file loads):

    - the throughput loop sizes on the engine profile: its folder (`profile_results_dir`, relative to the config
      file) must exist, else every tick would record `model_not_ready` forever;
    - the SLA must be reachable by the perf model at some batch: at batch 1 for the profile's shortest request,
      and for `shape` when the command knows its traffic (the demo's trace), else every window misses it.

    Raises:
        ConfigError: one line naming the file, the field and the value (the folder, or the target and the best
            latency the profile reaches).
        ProfileError: the profile folder exists but is malformed.
    """
    source = str(config_path) if config_path is not None else "config"
    planner = build_planner(config, config_path)
    if planner.perf is None:
        if config.throughput_scaling_active:
            folder = resolve_profile_dir(config, config_path)
            raise ConfigError(
                f"{source}: field 'profile_results_dir' = {config.profile_results_dir!r}: no such folder {folder} "
                "(the throughput loop sizes the pools on this engine profile)",
                source=source,
                field="profile_results_dir",
            )
        return planner
    for where in (_SHORTEST, shape) if shape is not None else (_SHORTEST,):
        prefill = planner.perf.prefill_capacity(isl=where.isl, ttft_ms=config.capacity_ttft_ms)
        if not prefill.sla_met:
            raise ConfigError(
                f"{source}: field 'ttft_ms' = {config.ttft_ms:g}: unreachable, the profile's best TTFT for "
                f"{where.source}{_lengths(where)} is {prefill.latency_ms:.1f} ms at batch 1",
                source=source,
                field="ttft_ms",
            )
        decode = planner.perf.decode_capacity(isl=where.isl, osl=where.osl, itl_ms=config.capacity_itl_ms)
        if not decode.sla_met:
            raise ConfigError(
                f"{source}: field 'itl_ms' = {config.itl_ms:g}: unreachable, the profile's best ITL for "
                f"{where.source}{_lengths(where)} is {decode.latency_ms:.2f} ms",
                source=source,
                field="itl_ms",
            )
    return planner


def budget_warnings(config: PlannerConfig, config_path: Path | None) -> tuple[str, ...]:
    """What the GPU budget will cap that is not an error: a pool whose first scale-up above its minimum the budget
    forbids (the GPUs left above the minimums are fewer than one more engine's). A valid config (the budget is
    the operator's choice, and a pool held at its minimum may be the intent), but every decision that would grow
    that pool will be set by the budget instead: the commands that run a config print these at start and record
    them (`config_warning` in the audit log) rather than let the first capped scale-up be the news.

    Returns one line per capped pool, naming the file, the field and the numbers; none without a budget."""
    if config.max_gpu_budget < 0 or not config.throughput_scaling_active and not config.load_scaling_active:
        return ()
    pools = {
        Component.PREFILL: (config.prefill_min_endpoint_effective, config.prefill_gpus_per_engine),
        Component.DECODE: (config.decode_min_endpoint_effective, config.decode_gpus_per_engine),
    }
    managed = [(component, *pools[component]) for component in managed_components(config.mode)]
    floor_gpus = sum(num * gpus for _, num, gpus in managed)
    headroom_gpus = config.max_gpu_budget - floor_gpus
    source = str(config_path) if config_path is not None else "config"
    return tuple(
        f"{source}: field 'max_gpu_budget' = {config.max_gpu_budget}: the {component.value} pool cannot scale up "
        f"from its minimum of {num} (an engine takes {gpus} GPU{'s' if gpus != 1 else ''}; the minimums take "
        f"{floor_gpus}, {headroom_gpus} left): every scale-up it needs will be capped"
        for component, num, gpus in managed
        if gpus > headroom_gpus
    )
