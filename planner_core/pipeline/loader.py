"""Finding user plugins and applying the config's `plugins` section to the pipeline's plugin list.

A plugin package declares an entry point in the group `llm_planner.plugins`; the entry point names a factory,
`factory(settings) -> Plugin | Sequence[Plugin]`, called with the read-only mapping `plugins.settings[<name>]`
of the config (empty if absent). Only the entry points listed in `plugins.enabled` are loaded.

* `load_entry_point_plugins(config)` loads them. A name that no installed distribution offers is a config error
  (`PluginConfigError`, one line). An entry point that fails to import, whose factory raises or returns something
  that is not a plugin, or whose plugin id is already taken, is reported in the returned errors and skipped, so one
  broken package cannot stop the planner; `PluginLoadError.as_step()` records it with a tick.
* `resolve_plugins(plugins, config)` takes the full list (builtin and user plugins), applies
  `plugins.overrides` (keyed by plugin id) and checks the list: unique ids, no override for an unknown id, and
  intervals that are multiples of an explicit `scheduling.scale_interval_seconds`.

Loading imports code, so this module is used at the edges (CLI, flows), never inside `run_pipeline`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from planner_core.config import PlannerConfig
from planner_core.domain import ReasonCode, StepRecord
from planner_core.pipeline.types import ConfiguredPlugin, Plugin, PluginSpec

ENTRY_POINT_GROUP = "llm_planner.plugins"


class PluginConfigError(ValueError):
    """The `plugins` section names something that does not exist or does not fit; `str()` is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginLoadError:
    """An enabled entry point that could not be turned into plugins (skipped).

    Attributes:
        entry_point: the entry point's name.
        target: what it points at (`module:attribute`).
        message: what went wrong, one line.
    """

    entry_point: str
    target: str
    message: str

    def __str__(self) -> str:
        return f"plugin entry point {self.entry_point!r} ({self.target}): {self.message}"

    def as_step(self) -> StepRecord:
        """The failure as an explanation step, to record with the tick."""
        return StepRecord(
            step=f"plugin_load:{self.entry_point}"[:80], reason=ReasonCode.PLUGIN_LOAD_FAILED, detail=str(self)
        )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _as_plugins(made: object) -> list[object]:
    return list(made) if isinstance(made, list | tuple) else [made]


def _plugin_problem(item: object) -> str | None:
    """Why a factory's product is not a usable plugin, or None."""
    try:
        spec = item.spec  # type: ignore[attr-defined]
    except Exception as exc:
        return f"{type(item).__name__} has no usable spec ({type(exc).__name__}: {exc})"
    if not isinstance(spec, PluginSpec):
        return f"{type(item).__name__}.spec is {type(spec).__name__}, not a PluginSpec"
    if not callable(getattr(item, "run", None)):
        return f"{type(item).__name__} has no run(context) method"
    return None


def load_entry_point_plugins(
    config: PlannerConfig, *, source: str = "config"
) -> tuple[tuple[Plugin, ...], tuple[PluginLoadError, ...]]:
    """Load the plugins of the entry points named in `config.plugins.enabled`, in that order.

    Args:
        config: the planner config; `plugins.enabled` and `plugins.settings` are used.
        source: the config's file name, for error messages.

    Returns:
        The plugins, and the entry points that failed (each skipped).

    Raises:
        PluginConfigError: an enabled name is not an installed entry point of the group, or is offered by more
            than one distribution.
    """
    enabled = config.plugins.enabled
    if not enabled:
        return (), ()
    offered: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        offered.setdefault(entry_point.name, []).append(entry_point)
    for name in enabled:
        candidates = offered.get(name, [])
        if len(candidates) > 1 and len({ep.value for ep in candidates}) > 1:
            targets = ", ".join(sorted({ep.value for ep in candidates}))
            raise PluginConfigError(
                f"{source}: field 'plugins.enabled' = {name!r}: offered by more than one installed distribution "
                f"({targets})"
            )
        if not candidates:
            installed = ", ".join(sorted(offered)) or "none"
            raise PluginConfigError(
                f"{source}: field 'plugins.enabled' = {name!r}: no installed plugin of that name "
                f"(entry points in group '{ENTRY_POINT_GROUP}': {installed})"
            )

    plugins: list[Plugin] = []
    errors: list[PluginLoadError] = []
    ids: set[str] = set()
    for name in enabled:
        entry_point = offered[name][0]
        settings = MappingProxyType(dict(config.plugins.settings.get(name, {})))
        try:
            factory = entry_point.load()
            made = factory(settings)
        except Exception as exc:  # a broken package is reported and skipped, never fatal
            errors.append(
                PluginLoadError(
                    entry_point=name, target=entry_point.value, message=_one_line(f"{type(exc).__name__}: {exc}")
                )
            )
            continue
        for item in _as_plugins(made):
            problem = _plugin_problem(item)
            if problem is None and item.spec.plugin_id in ids:  # type: ignore[attr-defined]
                problem = f"plugin id {item.spec.plugin_id!r} is already taken"  # type: ignore[attr-defined]
            if problem is not None:
                errors.append(PluginLoadError(entry_point=name, target=entry_point.value, message=_one_line(problem)))
                continue
            ids.add(item.spec.plugin_id)  # type: ignore[attr-defined]
            plugins.append(item)  # type: ignore[arg-type]
    return tuple(plugins), tuple(errors)


def _multiple_of(value: float, base: float) -> bool:
    ratio = value / base
    return round(ratio) >= 1 and math.isclose(ratio, round(ratio), rel_tol=1e-9, abs_tol=1e-9)


def configured(plugin: Plugin, config: PlannerConfig, *, source: str = "config") -> Plugin:
    """`plugin` with its `plugins.overrides` entry applied (wrapped in `ConfiguredPlugin`), or as it is."""
    plugin_id = plugin.spec.plugin_id
    override = config.plugins.overrides.get(plugin_id)
    if override is None:
        return plugin
    changes: dict[str, object] = {}
    if override.priority is not None:
        changes["priority"] = override.priority
    if override.interval_seconds is not None:
        changes["interval_s"] = override.interval_seconds
    if override.hold_policy is not None:
        changes["hold_policy"] = override.hold_policy
    if override.timeout_seconds is not None:
        if not plugin.spec.wall_clock_limits:
            raise PluginConfigError(
                f"{source}: field 'plugins.overrides.{plugin_id}.timeout_seconds' = {override.timeout_seconds!r}:"
                " this plugin is not held to the wall clock (builtin plugins are pure; their decisions must not"
                " depend on the machine's speed)"
            )
        changes["timeout_s"] = override.timeout_seconds
    try:
        spec = dataclasses.replace(plugin.spec, **changes)  # type: ignore[arg-type]
    except ValueError as exc:
        raise PluginConfigError(f"{source}: field 'plugins.overrides.{plugin_id}': {exc}") from exc
    return ConfiguredPlugin(spec, plugin)


def resolve_plugins(plugins: Sequence[Plugin], config: PlannerConfig, *, source: str = "config") -> tuple[Plugin, ...]:
    """Apply `config.plugins.overrides` to the pipeline's full plugin list and check it.

    Args:
        plugins: builtin and user plugins.
        config: the planner config.
        source: the config's file name, for error messages.

    Returns:
        The plugins in run order (phase, priority, plugin id); overridden ones wrapped in `ConfiguredPlugin`.

    Raises:
        PluginConfigError: two plugins share an id, an override names no plugin or makes a spec invalid, or an
            interval is not a multiple of an explicit `scheduling.scale_interval_seconds`.
    """
    by_id: dict[str, Plugin] = {}
    for plugin in plugins:
        plugin_id = plugin.spec.plugin_id
        if plugin_id in by_id:
            raise PluginConfigError(f"{source}: plugin id {plugin_id!r} is used by two plugins")
        by_id[plugin_id] = plugin
    overrides: Mapping[str, object] = config.plugins.overrides
    for plugin_id in overrides:
        if plugin_id not in by_id:
            known = ", ".join(sorted(by_id)) or "none"
            raise PluginConfigError(
                f"{source}: field 'plugins.overrides.{plugin_id}' = {plugin_id!r}: no plugin with that id "
                f"(plugins: {known})"
            )

    resolved = [configured(plugin, config, source=source) for plugin in by_id.values()]

    base = config.scheduling.scale_interval_seconds
    if base is not None:
        for plugin in resolved:
            interval = plugin.spec.interval_s
            if interval and not _multiple_of(interval, base):
                raise PluginConfigError(
                    f"{source}: plugin {plugin.spec.plugin_id!r}: interval {interval:g} s is not a multiple of "
                    f"scheduling.scale_interval_seconds ({base:g} s)"
                )
    resolved.sort(key=lambda plugin: plugin.spec.order_key)
    return tuple(resolved)
