"""Example planner plugin: keep a minimum number of replicas during business hours.

Between `start_hour` and `end_hour` (local time in `timezone`; weekdays only unless `weekends` is true) it returns
an AT_LEAST override for each configured pool, so no other plugin can scale below that floor while people work;
outside those hours it has no opinion. It reads the tick's time (`context.now_s`), never the wall clock, so a
recorded tick replays exactly.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from planner_core.domain import Component, OverrideType, ReplicaOverride
from planner_core.pipeline import Phase, PipelineContext, PluginResult, PluginSpec

_SETTINGS = {"prefill_floor", "decode_floor", "start_hour", "end_hour", "timezone", "weekends"}


class BusinessHoursFloor:
    """PROPOSE plugin: AT_LEAST `floors[pool]` replicas while the business is open."""

    def __init__(self, floors: Mapping[Component, int], start_hour: int, end_hour: int, timezone: str, weekends: bool):
        self.spec = PluginSpec(plugin_id="business_hours_floor", phase=Phase.PROPOSE, priority=50)
        self.floors = dict(floors)
        self.start_hour, self.end_hour = start_hour, end_hour
        self.zone = ZoneInfo(timezone)
        self.weekends = weekends

    def is_open(self, now_s: float) -> bool:
        local = dt.datetime.fromtimestamp(now_s, tz=self.zone)
        return self.start_hour <= local.hour < self.end_hour and (self.weekends or local.weekday() < 5)

    def run(self, context: PipelineContext) -> PluginResult | None:
        if not self.is_open(context.now_s):
            return None  # no opinion: the other plugins decide
        why = f"business hours {self.start_hour}:00-{self.end_hour}:00 {self.zone.key}"
        return PluginResult(
            overrides=tuple(
                ReplicaOverride(component=pool, kind=OverrideType.AT_LEAST, replicas=floor, reason=why)
                for pool, floor in self.floors.items()
            )
        )


def make_plugin(settings: Mapping[str, Any]) -> BusinessHoursFloor:
    """Entry point `business_hours_floor`: the plugin, from the config's `plugins.settings.business_hours_floor`."""
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}; known: {', '.join(sorted(_SETTINGS))}")
    floors = {pool: int(settings[f"{pool}_floor"]) for pool in Component if f"{pool}_floor" in settings}
    start_hour, end_hour = int(settings.get("start_hour", 9)), int(settings.get("end_hour", 17))
    if not 0 <= start_hour < end_hour <= 24:
        raise ValueError(f"start_hour {start_hour} / end_hour {end_hour}: need 0 <= start_hour < end_hour <= 24")
    timezone, weekends = str(settings.get("timezone", "UTC")), bool(settings.get("weekends", False))
    return BusinessHoursFloor(floors, start_hour, end_hour, timezone, weekends)
