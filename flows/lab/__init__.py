"""The flows' lab: experiments that need the flows themselves (a Prefect server, the `fleet-tick` flow, `planner
serve`'s execution listener), so they cannot live in `planner_core.lab` (which sits below the flows). No product
flow imports this package (an import-linter contract). Run by hand from the checkout:

- `fleet_bench`: `planner fleet bench --prefect`, every round a `fleet-tick` flow run on a Prefect server of its own;
- `python -m flows.lab.fleet_cost N ROUNDS [one]`: the fleet-tick flow's cost on a real Prefect server;
- `python -m flows.lab.fleet_profile MODE N DURATION_S OUT`: where a fleet round's CPU goes (cProfile);
- `python -m flows.lab.notify_latency MODE N`: a decision's commit to its execution's start, NOTIFY against polling.
"""
