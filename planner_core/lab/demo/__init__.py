"""The demo room: what `planner demo` (the flow in flows/demo.py) simulates, reads back and scores. The flow walks
the trace window by window through the real throughput tick and execution; this room gives it the simulated
cluster (`scoring`: where it starts, re-run under the recorded scale events, scored with its comparison rows as
`planner bench` scores a policy) and the records (`records`: the scale events and ticks in Postgres, the simulated
orchestrator's side of the virtual connector, the run's summary)."""

from planner_core.lab.demo.records import (
    acknowledge_after_restart,
    follow_decisions,
    recorded_scale_events,
    recorded_tick_times,
    summary_dict,
)
from planner_core.lab.demo.scoring import (
    STARTING_WINDOW_S,
    ScaleEvent,
    comparison_rows,
    epoch,
    new_cluster,
    score_run,
    simulate_timeline,
    simulated_engines,
    starting_size,
)

__all__ = [
    "STARTING_WINDOW_S",
    "ScaleEvent",
    "acknowledge_after_restart",
    "comparison_rows",
    "epoch",
    "follow_decisions",
    "new_cluster",
    "recorded_scale_events",
    "recorded_tick_times",
    "score_run",
    "simulate_timeline",
    "simulated_engines",
    "starting_size",
    "summary_dict",
]
