"""SLA-driven autoscaling planner for LLM serving.

Three layers, each a folder:
- the decision core, pure and deterministic (no clock, no I/O beyond reading config and data files): `domain`,
  `config`, `tick`, `pipeline/`, `policy/`, `perf/`, `predict/`, `traces`, and the shipped `data/` and `configs/`;
- `runtime/`: the service around the core (database, traffic sources, connectors, ingest, replay, reports);
- `lab/`: the simulator, the benchmark and the evaluations.
Runtime and lab import the core and never each other; the Prefect flows (`flows`) and the CLI (`planner_cli`)
sit outside. import-linter enforces these layers (`pyproject.toml`).
"""
