"""Engine perf models for the planner's throughput loop.

`profile` loads Dynamo's pre-deployment profiles (NPZ or JSON twins) and answers, every tick, what one GPU
serves under TTFT/ITL targets (Dynamo 0.x interpolation). Pure: no I/O except `load_profile`.

`forward` is the one question every SLA model answers (`ForwardPassModel`); `profile_forward` answers it from the
profile (and turns the profile into bootstrap forward-pass metrics), `online` from regressions fitted on the
engines' forward-pass metrics; `capacity` searches engine capacity under the SLA from any of them; `accuracy`
measures them against the profile.
"""

from planner_core.perf.profile import (
    DEFAULT_GRID_RESOLUTION,
    DecodeInterpolator,
    DecodeOperatingPoint,
    DecodeProfile,
    EngineCapacity,
    EngineProfile,
    PrefillInterpolator,
    PrefillProfile,
    ProfileError,
    estimate_engine_capacity,
    load_profile,
)

__all__ = [
    "DEFAULT_GRID_RESOLUTION",
    "DecodeInterpolator",
    "DecodeOperatingPoint",
    "DecodeProfile",
    "EngineCapacity",
    "EngineProfile",
    "PrefillInterpolator",
    "PrefillProfile",
    "ProfileError",
    "estimate_engine_capacity",
    "load_profile",
]
