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

from planner_core.config import PlannerConfig, resolve_config_relative, resolve_profile_dir
from planner_core.domain import PlannerState, TickInputs, TickOutcome, TrafficObservation
from planner_core.perf.model import ProfilePerfModel
from planner_core.pipeline import Plugin, PluginLoadError
from planner_core.pipeline.user_plugins import load_plugins
from planner_core.policy.throughput import with_prompt_curve
from planner_core.tick import tick

__all__ = ["Planner", "build_planner"]


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
