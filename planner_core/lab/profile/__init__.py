"""The profile room: measuring a running engine over HTTP (`measure`, what `planner profile --endpoint` runs) and
the profiler's round trip against the live stack's mocker (`round_trip`, `planner profile --round-trip`). The
sweep's parts (the client, the files, the plots) are in `planner_core.lab.profiler`."""

from planner_core.lab.profile.round_trip import (
    CAPACITY_CHECK,
    CAPACITY_TOLERANCE,
    RoundTripTools,
    round_trip,
    round_trip_summary,
    round_trip_tools,
)
from planner_core.lab.profile.sweep import measure

__all__ = [
    "CAPACITY_CHECK",
    "CAPACITY_TOLERANCE",
    "RoundTripTools",
    "measure",
    "round_trip",
    "round_trip_summary",
    "round_trip_tools",
]
