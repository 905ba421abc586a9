"""A plugin's circuit breaker: explicit state in the plugin's schedule, moved only by the tick's time.

A plugin with a `BreakerSpec` (every out-of-process plugin; in-process ones only if given one) is guarded:

* CLOSED: it is called when due. Each failure (raised, timed out, unreachable, unusable answer) is kept with its
  tick time; failures older than `window_s` are forgotten. `failure_threshold` failures inside the window open
  the breaker.
* OPEN: it is not called; the tick records `plugin_circuit_open`.
* HALF_OPEN: `cooldown_s` after opening, the next tick where the plugin is due makes one trial call. Success
  closes the breaker (failures forgotten), failure opens it again from that tick.

The state lives in `PluginSchedule.failures_at_s` / `circuit_opened_at_s`, part of the planner state stored with
every tick, and time is the tick's `now_s`: no clock, so a replayed tick opens, skips and closes exactly as the
recorded one did. Successes while closed do not erase earlier failures: N failures within the window open the
breaker whatever succeeded between them (a flapping plugin is cut off too).
"""

from __future__ import annotations

import dataclasses
import enum

from planner_core.domain import PluginSchedule
from planner_core.pipeline.types import BreakerSpec


class CircuitState(enum.StrEnum):
    """Where a plugin's breaker stands at a tick (Dynamo's `CircuitState` names)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


# Dynamo's gauge values for `plugin_circuit_state`.
CIRCUIT_GAUGE = {CircuitState.CLOSED: 0.0, CircuitState.HALF_OPEN: 0.5, CircuitState.OPEN: 1.0}


def circuit_state(breaker: BreakerSpec, schedule: PluginSchedule, now_s: float) -> CircuitState:
    """The breaker's state at tick time `now_s`."""
    opened = schedule.circuit_opened_at_s
    if opened is None:
        return CircuitState.CLOSED
    return CircuitState.HALF_OPEN if now_s >= opened + breaker.cooldown_s else CircuitState.OPEN


def reopens_at_s(breaker: BreakerSpec, schedule: PluginSchedule) -> float | None:
    """When an open breaker allows its trial call (None when closed)."""
    opened = schedule.circuit_opened_at_s
    return None if opened is None else opened + breaker.cooldown_s


def after_failure(breaker: BreakerSpec, schedule: PluginSchedule, now_s: float) -> tuple[PluginSchedule, bool]:
    """The schedule after a failed call at `now_s`, and whether this failure opened the breaker."""
    if schedule.circuit_opened_at_s is not None:
        # the half-open trial failed: open again from now
        return dataclasses.replace(schedule, failures_at_s=(), circuit_opened_at_s=now_s), True
    recent = tuple(t for t in schedule.failures_at_s if t > now_s - breaker.window_s) + (now_s,)
    if len(recent) >= breaker.failure_threshold:
        return dataclasses.replace(schedule, failures_at_s=(), circuit_opened_at_s=now_s), True
    return dataclasses.replace(schedule, failures_at_s=recent), False


def after_success(breaker: BreakerSpec, schedule: PluginSchedule, now_s: float) -> tuple[PluginSchedule, bool]:
    """The schedule after a successful call at `now_s`, and whether it closed the breaker (a half-open trial)."""
    if schedule.circuit_opened_at_s is not None:
        return dataclasses.replace(schedule, failures_at_s=(), circuit_opened_at_s=None), True
    recent = tuple(t for t in schedule.failures_at_s if t > now_s - breaker.window_s)
    return dataclasses.replace(schedule, failures_at_s=recent), False
