"""`planner route-proxy`: the SLO-aware routing proxy in front of Dynamo's frontend in `direct` mode.

Serves the OpenAI-compatible API on `--port`, places each chat/completions and completions request on the worker
the project's selector predicts to meet `--ttft-ms` / `--itl-ms` (times the dispatch thresholds), with the latency
tables of `--profile` (the Dynamo profile the engines are timed by), and forwards it to `--frontend` with
`nvext.backend_instance_id` set; see `planner_core.runtime.route_proxy` and docs/routing.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path


def cmd_route_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    from planner_core.perf.profile import load_profile
    from planner_core.routing.dispatch import NoEndpointPolicy
    from planner_core.routing.predictor import LatencyPredictor
    from planner_core.routing.scheduler import SloTargets
    from planner_core.routing.tables import tables_from_dynamo_profile
    from planner_core.runtime.route_proxy import ProxySettings, RouteProxy, build_app

    for name in ("ttft_ms", "itl_ms", "ttft_threshold", "itl_threshold", "chars_per_token"):
        if getattr(args, name) <= 0:
            print(
                f"planner route-proxy: --{name.replace('_', '-')} = {getattr(args, name)}: must be > 0", file=sys.stderr
            )
            return 2
    try:
        profile = load_profile(args.profile)
    except (OSError, ValueError) as exc:
        print(f"planner route-proxy: --profile {args.profile}: {exc}", file=sys.stderr)
        return 2
    ttft, tpot = tables_from_dynamo_profile(profile, metadata={"source": str(args.profile)})
    wake = _wake_settings(args) if args.wake_deployment else None
    settings = ProxySettings(
        frontend_url=args.frontend.rstrip("/"),
        discovery_dir=args.discovery_dir,
        namespace=args.namespace,
        targets=SloTargets(
            ttft_ms=args.ttft_ms,
            tpot_ms=args.itl_ms,
            ttft_dispatch_threshold=args.ttft_threshold,
            tpot_dispatch_threshold=args.itl_threshold,
        ),
        chunk_tokens=args.chunk_tokens or None,
        policy=NoEndpointPolicy(args.no_endpoint),
        chars_per_token=args.chars_per_token,
        wake=wake,
    )
    app = build_app(RouteProxy(settings, LatencyPredictor(ttft=ttft, tpot=tpot)))
    from planner_core.runtime.localhost import check_port_free

    check_port_free(args.port, args.host)  # one line now, not uvicorn's traceback
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S
    )
    print(
        f"planner route-proxy on http://{args.host}:{args.port} in front of {settings.frontend_url}; "
        "stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    _server_class()(config).run()
    print("planner route-proxy: stopped", file=sys.stderr)
    return 0


def _wake_settings(args: argparse.Namespace):
    """The hold-and-wake settings of `--wake-deployment` (the planner's database from the usual settings:
    `PLANNER_DATABASE_URL`, else the embedded one); the numbers' ranges are checked by argparse (ranges.py)."""
    from planner_core.runtime.route_proxy import WakeSettings
    from planner_core.runtime.settings import RuntimeSettings
    from planner_core.runtime.store.db import resolve_database_url

    return WakeSettings(
        deployment=args.wake_deployment,
        database_url=resolve_database_url(RuntimeSettings()),
        max_held=args.wake_max_held,
        timeout_s=args.wake_timeout_s,
        renotify_s=args.wake_renotify_s,
    )


SHUTDOWN_GRACE_S = 30.0
"""How long a stopped proxy lets the requests in flight finish (a streamed answer runs for its output's length);
those still running then are cancelled."""


def _server_class():  # uvicorn loads only when the command runs
    import signal

    import uvicorn

    class StoppedBySignal(uvicorn.Server):
        """uvicorn's server, stopped by SIGINT and SIGTERM alike: it stops accepting, lets the requests in flight
        finish (for `SHUTDOWN_GRACE_S`), runs the app's shutdown and returns. uvicorn's own handling raises the
        signal again once stopped, so Ctrl-C ended the command with exit 130 and SIGTERM killed it (-15)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return StoppedBySignal


def register(sub: argparse._SubParsersAction) -> None:
    """Add the route-proxy command's parser."""
    p = sub.add_parser("route-proxy", help="SLO-aware routing proxy in front of Dynamo's frontend (direct mode)")
    p.add_argument("--frontend", required=True, help="Dynamo frontend URL (started with --router-mode direct)")
    p.add_argument("--discovery-dir", type=Path, required=True, help="the file discovery store (DYN_FILE_KV)")
    p.add_argument("--profile", type=Path, required=True, help="Dynamo profile folder the engines are timed by")
    p.add_argument("--ttft-ms", type=float, required=True, help="TTFT target (ms)")
    p.add_argument("--itl-ms", type=float, required=True, help="ITL target (ms)")
    p.add_argument("--ttft-threshold", type=float, default=1.0, help="TTFT dispatch threshold (x the target)")
    p.add_argument("--itl-threshold", type=float, default=1.0, help="ITL dispatch threshold (x the target)")
    p.add_argument(
        "--no-endpoint",
        choices=("queue", "reject"),
        default="queue",
        help="no worker predicted to meet the SLO: queue (up to the TTFT target) or reject (503)",
    )
    p.add_argument(
        "--chunk-tokens", type=int, default=8192, help="engines' prefill chunk (max_num_batched_tokens); 0: none"
    )
    p.add_argument("--chars-per-token", type=float, default=4.0, help="prompt characters per token (the estimate)")
    p.add_argument("--namespace", default="dynamo", help="Dynamo namespace of the workers")
    p.add_argument(
        "--wake-deployment",
        default=None,
        help="hold requests while no worker is registered and wake this planner deployment (NOTIFY planner_wake; "
        "its policy sets scale_to_zero_idle_seconds); default: answer 503 at once",
    )
    p.add_argument("--wake-max-held", type=int, default=256, help="most requests held at once (then 503)")
    p.add_argument("--wake-timeout-s", type=float, default=300.0, help="longest hold (s), then 504")
    p.add_argument("--wake-renotify-s", type=float, default=5.0, help="NOTIFY again this often while holding (s)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8800, help="port to listen on")
    p.set_defaults(func=cmd_route_proxy)
