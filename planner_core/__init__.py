"""SLA-driven autoscaling planner for LLM serving.

`planner_core` holds a pure decision core (`domain`, `config`, `perf`, `predict`, `policy`, `tick`) and the I/O
around it (`store`, `connectors`, `sim`, `cli`). The pure packages never import the I/O ones.
"""
