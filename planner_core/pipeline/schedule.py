"""When plugins run: per-plugin intervals on one base cadence, all in tick time (`inputs.now_s`).

The pipeline is called once per base tick. A plugin without an interval runs on every tick; a plugin with one runs
when `interval_s` has passed since its last successful run, or, before its first run, since it was registered
(the first tick that saw it), so its first run is at `registered_at + interval`, never at the first tick. Times
are compared in whole milliseconds, the resolution of the base cadence, so float noise in tick times cannot make
a plugin miss its tick.

The base cadence is the explicit `scheduling.scale_interval_seconds`, or the greatest common divisor of the
planner's loop intervals (`PlannerConfig.scale_interval_seconds_effective`) and every plugin interval. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from planner_core.config import PlannerConfig, _gcd_seconds
from planner_core.domain import PlannerState, PluginSchedule
from planner_core.pipeline.types import Observation, Plugin, PluginSpec


def _ms(seconds: float) -> int:
    return round(seconds * 1000.0)


def next_due_s(spec: PluginSpec, schedule: PluginSchedule) -> float | None:
    """Tick time from which the plugin is due; None when it is due on every tick."""
    if spec.every_tick:
        return None
    anchor = schedule.registered_at_s if schedule.last_run_at_s is None else schedule.last_run_at_s
    return anchor + float(spec.interval_s or 0.0)


def is_due(spec: PluginSpec, schedule: PluginSchedule | None, now_s: float) -> bool:
    """Whether the plugin runs at tick time `now_s`. A plugin not registered yet is registered at `now_s`."""
    if spec.every_tick:
        return True
    if schedule is None:
        return False  # registered now: the first run is one interval later
    due_s = next_due_s(spec, schedule)
    return due_s is not None and _ms(now_s) >= _ms(due_s)


def base_cadence_s(config: PlannerConfig, specs: Iterable[PluginSpec]) -> float:
    """Period (s) at which the pipeline must be called so that every interval falls on a tick.

    The explicit `scheduling.scale_interval_seconds` when set (`resolve_plugins` checks that plugin intervals are
    multiples of it); otherwise the millisecond GCD of the active loop intervals and every plugin interval.
    """
    if config.scheduling.scale_interval_seconds is not None:
        return config.scheduling.scale_interval_seconds
    intervals = [config.scale_interval_seconds_effective]
    intervals.extend(float(spec.interval_s) for spec in specs if not spec.every_tick and spec.interval_s)
    return _gcd_seconds(intervals)


def observations_needed(plugins: Iterable[Plugin], state: PlannerState, now_s: float) -> frozenset[Observation]:
    """What the caller must observe for a tick at `now_s`: the `needs` of the plugins due then.

    Lets the I/O edge skip expensive collection (e.g. the traffic query) on ticks where no due plugin reads it.
    """
    needed: set[Observation] = set()
    for plugin in plugins:
        spec = plugin.spec
        if is_due(spec, state.pipeline.schedule(spec.plugin_id), now_s):
            needed.update(spec.needs)
    return frozenset(needed)
