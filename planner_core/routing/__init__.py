"""SLO-aware request routing: the decision core of a router that sends each request to the engine predicted to meet
its latency targets.

Pure and deterministic like the rest of the decision core (frozen dataclasses, no clock, no I/O):

- `profiling`: the profiling JSON formats (a TTFT file by prompt tokens, a TPOT file by decode batch size and
  tokens per request; only the p50 values are used), parsed from and written to plain mappings.
- `predictor`: the latency predictor: linear / bilinear interpolation over those tables, exact at the profiled
  points, with chunked-prefill modelling of an engine's queued prompt tokens.
- `scheduler`: the prefill and decode stages: the filters (failover, schedulability, staleness, and the metric
  filter `predicted > SLO x dispatch threshold`), the selector (lowest predicted latency) and the explicit
  `no available endpoint` outcome.

The simulator's router (`planner_core.lab.sim.des`, router `slo`) calls these; reading and writing the files is left
to the edges (`planner profile-json`, the bench).
"""
