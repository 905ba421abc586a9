"""Engines faster or slower than their profile: a bench that can lie to the planner (`planner bench --engine-speed`,
`--engine-speed-change`).

The planners, the SLO router's predictor and every capacity model read the profile (what the planner believes);
the simulated engines time their iterations with the profile's `ForwardPassModel` divided by a speed
(`SimSpec.engine_speed`, and from `SpeedChange.at_s` on `SpeedChange.speed`):

- `prefill=0.8`: every prefill iteration takes 1 / 0.8 of the profile's time; `decode=0.9`: every decode iteration
  likewise. The speeds are per phase, whatever engine runs it: a prefill engine's chunks, and a decode engine's
  recompute after a preemption or its local prefill (router `slo`), run at the prefill speed. A mixed iteration (a
  prompt chunk on a decode batch) is split as the profile times it: the decode step of its batch
  (`decode_wall_s(n, kv)`) at the decode speed, the rest of its time at the prefill speed.
- A change at `at_s` (simulated seconds from the first request): iterations already scheduled then (a prefill chunk
  or a mixed iteration in flight, the decode iteration in progress) end at the old speed; a running decode segment
  is cut at the end of its iteration in progress (as an arrival cuts it) and every later iteration runs at the new
  speed. Requests in flight are not restarted.
- At speed 1.0 with no change the simulator runs the profile's model itself: every figure is bit for bit what it is
  without the option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.scaled import speed_scaled

__all__ = [
    "PROFILE_SPEED",
    "EngineSpeed",
    "SpeedChange",
    "engine_model",
    "parse_engine_speed",
    "parse_speed_change",
]

_ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class EngineSpeed:
    """The simulated engines' speed per phase, as a multiple of the profile's (1.0: the profile's timing; 0.8: each
    iteration takes 1 / 0.8 of the profile's time)."""

    prefill: float = 1.0
    decode: float = 1.0

    def __post_init__(self) -> None:
        for role in _ROLES:
            value = getattr(self, role)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"engine speed: {role}={value!r} is not a finite number > 0")

    @property
    def is_profile(self) -> bool:
        """Whether the engines run exactly as profiled."""
        return self.prefill == 1.0 and self.decode == 1.0

    def text(self) -> str:
        """`prefill=0.8,decode=1` (the option's own syntax)."""
        return f"prefill={self.prefill:g},decode={self.decode:g}"

    def as_dict(self) -> dict[str, float]:
        return {"prefill": self.prefill, "decode": self.decode}


PROFILE_SPEED = EngineSpeed()


@dataclass(frozen=True, slots=True)
class SpeedChange:
    """From `at_s` (simulated seconds from the first request) on, the engines run at `speed`."""

    at_s: float
    speed: EngineSpeed

    def __post_init__(self) -> None:
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            raise ValueError(f"engine speed change: time {self.at_s!r} is not a finite number of seconds >= 0")

    def text(self) -> str:
        """`1200s:prefill=0.75,decode=1` (the option's own syntax)."""
        return f"{self.at_s:g}s:{self.speed.text()}"

    def as_dict(self) -> dict[str, object]:
        return {"at_s": self.at_s, "speed": self.speed.as_dict()}


def parse_engine_speed(text: str, *, option: str = "--engine-speed", base: EngineSpeed = PROFILE_SPEED) -> EngineSpeed:
    """`prefill=0.8,decode=0.9` (either role, or both; a role left out keeps its value in `base`). Raises ValueError
    (one line, naming `option` and the bad part) on an unknown role, a repeated role, or a value that is not a finite
    number > 0."""
    values: dict[str, float] = {}
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{option}: {text!r} is not ROLE=SPEED[,ROLE=SPEED] (roles: prefill, decode)")
    for part in parts:
        role, sep, raw = (s.strip() for s in part.partition("="))
        if not sep:
            raise ValueError(f"{option}: {part!r} is not ROLE=SPEED (e.g. prefill=0.8)")
        if role not in _ROLES:
            raise ValueError(f"{option}: unknown role {role!r} (roles: prefill, decode)")
        if role in values:
            raise ValueError(f"{option}: {role} is given twice")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{option}: {role}={raw!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{option}: {role}={raw} is not a finite number > 0")
        values[role] = value
    return EngineSpeed(prefill=values.get("prefill", base.prefill), decode=values.get("decode", base.decode))


def parse_speed_change(
    text: str, *, option: str = "--engine-speed-change", base: EngineSpeed = PROFILE_SPEED
) -> SpeedChange:
    """`TIME:ROLE=SPEED[,ROLE=SPEED]`, TIME in seconds (`1200`, `1200s`) or minutes (`20m`) of simulated time from
    the first request; a role left out keeps its speed in `base` (the speed before the change). Raises ValueError
    (one line, naming `option` and the bad part)."""
    when, sep, speeds = text.partition(":")
    when = when.strip()
    if not sep or not when:
        raise ValueError(f"{option}: {text!r} is not TIME:ROLE=SPEED[,ROLE=SPEED] (e.g. 20m:prefill=0.75)")
    scale = 1.0
    if when[-1] in "sm":
        scale = 60.0 if when[-1] == "m" else 1.0
        when = when[:-1]
    try:
        at = float(when)
    except ValueError:
        raise ValueError(f"{option}: time {text.partition(':')[0].strip()!r} is not N, Ns or Nm") from None
    if not (math.isfinite(at) and at >= 0):
        raise ValueError(f"{option}: time {text.partition(':')[0].strip()!r} is not a finite time >= 0")
    return SpeedChange(at_s=at * scale, speed=parse_engine_speed(speeds, option=option, base=base))


def engine_model(fwd: ForwardPassModel, speed: EngineSpeed) -> ForwardPassModel:
    """The model the simulated engines time their iterations with: the profile's own at speed 1.0 (the same
    arithmetic, bit for bit), else the profile's at `speed`."""
    return speed_scaled(fwd, prefill_speed=speed.prefill, decode_speed=speed.decode)
