"""Engine perf models for the planner's throughput loop.

`profile` loads Dynamo's pre-deployment profiles (NPZ or JSON twins) and answers, every tick, what one GPU
serves under TTFT/ITL targets (Dynamo 0.x interpolation). Pure: no I/O except `load_profile`.
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
