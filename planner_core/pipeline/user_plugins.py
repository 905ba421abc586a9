"""The user's plugins of a config, loaded once and checked against the builtin plugins: the one way live ticks,
replay and the benchmark get them. Out-of-process plugins (`scheduling.external_plugins`) come as
`RecordedRemotePlugin`s answering from the tick's record; live ticks swap them for plugins that call
(`planner_core.runtime.plugin_client.connect_remote_plugins`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner_core.config import PlannerConfig
from planner_core.domain import Loop
from planner_core.pipeline.builtin import builtin_plugins
from planner_core.pipeline.loader import PluginLoadError, load_entry_point_plugins, resolve_plugins
from planner_core.pipeline.remote import recorded_remote_plugins
from planner_core.pipeline.types import Plugin

if TYPE_CHECKING:
    from planner_core.perf.model import ProfilePerfModel


def load_plugins(
    config: PlannerConfig, perf: ProfilePerfModel | None, *, source: str = "config"
) -> tuple[tuple[Plugin, ...], tuple[PluginLoadError, ...]]:
    """The user's plugins of `config.plugins.enabled`, with `plugins.overrides` applied, and the entry points that
    failed to load.

    The list is checked together with the builtin plugins of both loops, so a user plugin can never take a builtin
    plugin's id (which would stop every tick) and an override naming a builtin id is not mistaken for a typo.

    Raises:
        PluginConfigError: an enabled name is not installed, an override names no plugin, or ids collide (one line).
    """
    loaded, errors = load_entry_point_plugins(config, source=source)
    remote = recorded_remote_plugins(config)
    if not loaded and not remote and not config.plugins.overrides:
        return (), errors
    builtins = (*builtin_plugins(Loop.THROUGHPUT, perf, scale_to_zero=True), *builtin_plugins(Loop.LOAD, perf))
    builtin_ids = {plugin.spec.plugin_id for plugin in builtins}
    resolved = resolve_plugins((*builtins, *loaded, *remote), config, source=source)
    return tuple(plugin for plugin in resolved if plugin.spec.plugin_id not in builtin_ids), errors
