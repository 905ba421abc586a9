"""The lab: the discrete-event cluster simulator and the planning benchmark (`sim`), the forecast and perf-model
evaluations, aiconfigurator tables and agreement, speed benchmarks, and the scripts that drive Dynamo's own code
for side-by-side comparison.

The harnesses that start Postgres, Prefect, Dynamo or aiperf live here too, each in a room of its own: `live`
(`planner live`), `chaos` (`planner chaos`), `profile` (`planner profile`'s sweep and round trip), `demo` (what
`planner demo` simulates and scores), `fleet_bench` (`planner fleet bench`), and the benchmarks run by hand,
`history` and `startup` (`python -m planner_core.lab.<room>.<module>`).

It may import the runtime (`planner_core.runtime`) and the core; it never imports the flows or the CLI, and the
product (runtime and core) never imports it.
"""
