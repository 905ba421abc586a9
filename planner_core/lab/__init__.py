"""The lab: the discrete-event cluster simulator and the planning benchmark (`sim`), the forecast and perf-model
evaluations, aiconfigurator tables and agreement, speed benchmarks, and the scripts that drive Dynamo's own code
for side-by-side comparison.

It may import the core; it never imports the runtime (`planner_core.runtime`), the flows or the CLI.
"""
