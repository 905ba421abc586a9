"""`planner sim-exporter`: the simulator as a Prometheus target with Dynamo's metric names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner_cli.common import DEFAULT_TRACE
from planner_core.data import DEFAULT_CONFIG


def cmd_sim_exporter(args: argparse.Namespace) -> int:
    """Serve the simulated frontend's Dynamo-named metrics of a trace replay on /metrics."""
    import signal
    import threading

    from planner_core.config import load_config, resolve_profile_dir
    from planner_core.lab.sim.des import ClusterSimulator, spec_for_config
    from planner_core.lab.sim.exporter import TraceMetricsExporter
    from planner_core.perf.model import ProfilePerfModel
    from planner_core.traces import load_trace

    config = load_config(args.config).policy
    profile_dir = resolve_profile_dir(config, args.config)
    perf = ProfilePerfModel.load(profile_dir)
    fwd = perf.forward_pass_model()
    if fwd is None:
        raise ValueError(f"{profile_dir}: the profile gives no forward-pass model to time the simulator with")
    trace = load_trace(args.trace).scaled(args.rate_scale)
    spec = spec_for_config(config, profiled_max_kv_tokens=perf.profiled_max_kv_tokens())
    num_prefill = 0 if spec.aggregated else args.prefill
    sim = ClusterSimulator(trace, fwd, spec, num_prefill=num_prefill, num_decode=args.decode)
    exporter = TraceMetricsExporter(
        sim,
        model=config.model_name or "model",
        namespace=config.namespace,
        speedup=args.speedup,
        kv_hit_rate=args.kv_hit_rate,
        accept_length=args.accept_length,
    )
    port = exporter.serve(args.port, args.addr)
    print(
        f"serving {trace.source} ({trace.num_requests} requests, {trace.duration_s / args.speedup:.0f} s of wall time) "
        f"at http://{args.addr}:{port}/metrics; stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    exporter.stop()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the sim command group's parsers."""
    exporter = sub.add_parser("sim-exporter", help="serve a simulated frontend's metrics (Dynamo names) on /metrics")
    exporter.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace replayed against the wall clock")
    exporter.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="PlannerConfig (profile, SLA, names)")
    exporter.add_argument("--port", type=int, default=9400, help="port of /metrics (0: any free port)")
    exporter.add_argument("--addr", default="127.0.0.1", help="address to listen on")
    exporter.add_argument("--speedup", type=float, default=1.0, help="trace seconds per wall-clock second")
    exporter.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's request rate")
    exporter.add_argument("--prefill", type=int, default=1, help="simulated prefill workers")
    exporter.add_argument("--decode", type=int, default=1, help="simulated decode (or aggregated) workers")
    exporter.add_argument(
        "--kv-hit-rate", type=float, default=None, help="export this router KV hit rate (default: the simulated one)"
    )
    exporter.add_argument("--accept-length", type=float, default=None, help="export vLLM spec-decode counters")
    exporter.set_defaults(func=cmd_sim_exporter)
