"""Record a realistic history for tests: the demo's loop (simulated cluster, virtual connector) without Prefect.

The cluster is the discrete-event simulator (`planner_core.lab.sim.des`) with the config's engine limits, timed by
the profile's forward-pass model, starting at 1 prefill + 1 decode worker. Every `window_s` it serves the window
and a throughput tick decides through `planner_core.runtime.service.run_tick`; the execution step applies the decision
and the simulated orchestrator acknowledges it. Load ticks run every `load_every_s` in between (either loop's
state chains into the other's).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from planner_core.domain import Loop
from planner_core.lab.sim.des import ClusterSimulator, spec_for_config
from planner_core.runtime.connectors.virtual import VirtualConnectorClient
from planner_core.runtime.service import load_context, run_execution, run_tick
from planner_core.runtime.store import repository as repo
from planner_core.traces import load_trace


def record_simulated_run(
    database_url: str,
    config_path: Path,
    trace_path: Path,
    deployment: str,
    *,
    num_windows: int,
    rate_scale: float = 12.0,
    load_every_s: float | None = 20.0,
    record_arrivals: bool = False,
) -> list[dt.datetime]:
    """Record `num_windows` throughput ticks (and the load ticks between them); returns the throughput times.
    With `record_arrivals`, each observation carries the window's request arrivals, as a served source's does
    (the tick derives the prompt-arrival curve from them)."""
    ctx = load_context(database_url, deployment, config_path)
    assert ctx.perf is not None
    trace = load_trace(trace_path).scaled(rate_scale)
    with ctx.sessions.begin() as session:
        repo.ensure_deployment(session, deployment, ctx.config)
    window_s = float(ctx.config.throughput_adjustment_interval_seconds)
    fwd = ctx.perf.forward_pass_model()
    assert fwd is not None
    spec = spec_for_config(ctx.config, profiled_max_kv_tokens=ctx.perf.profiled_max_kv_tokens(), startup_s=120.0)
    cluster = ClusterSimulator(trace, fwd, spec, num_prefill=1, num_decode=1)
    times = []
    with VirtualConnectorClient(database_url, deployment) as client:
        for k in range(1, num_windows + 1):
            end_s = k * window_s
            if load_every_s:
                at_s = end_s - window_s + load_every_s
                while at_s < end_s:
                    cluster.run_until(at_s)
                    _report(client, cluster)
                    run_tick(ctx, Loop.LOAD, repo.epoch_to_datetime(trace.start_epoch_s + at_s), None)
                    at_s += load_every_s
            now = repo.epoch_to_datetime(trace.start_epoch_s + end_s)
            cluster.run_until(end_s)
            _report(client, cluster)
            planner = ctx.planner if record_arrivals else None
            run_tick(ctx, Loop.THROUGHPUT, now, cluster.observe(end_s - window_s, end_s, planner=planner))
            run_execution(ctx, now)
            decision = client.wait(timeout_s=0.0)
            if decision is not None and decision.decision_id >= 0:
                cluster.set_targets(decision.num_prefill_workers, decision.num_decode_workers)
                client.complete(decision, at=now)
            times.append(now)
    return times


def _report(client: VirtualConnectorClient, cluster: ClusterSimulator) -> None:
    counts = cluster.worker_counts()
    client.report_workers(ready_prefill=counts.ready_prefill, ready_decode=counts.ready_decode)
