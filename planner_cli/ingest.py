"""Forward-pass metrics: `planner ingest` (ZMQ into Postgres) and `planner fpm-publish` (a synthetic publisher)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from planner_cli.common import add_deployment_argument, select_deployment
from planner_core.data import DEFAULT_CONFIG
from planner_core.runtime.settings import RuntimeSettings


def cmd_ingest(args: argparse.Namespace) -> int:
    """Receive forward-pass metrics over ZMQ into Postgres until SIGINT/SIGTERM."""
    import logging

    from planner_core.runtime.ingest import FpmIngest, resolve_deployment_id, serve_until_signalled
    from planner_core.runtime.store.db import resolve_database_url

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = RuntimeSettings()
    deployment = select_deployment(None, args.deployment, records=True)
    config = args.config or settings.config or DEFAULT_CONFIG
    url = resolve_database_url(settings)
    deployment_id = resolve_deployment_id(url, deployment, config)
    retention_minutes = settings.fpm_retention_minutes if args.retention_minutes is None else args.retention_minutes
    if retention_minutes <= 0:
        raise ValueError(f"--retention-minutes = {retention_minutes!r}: must be > 0")
    bind = args.bind or ([] if args.connect or args.dynamo_discovery else [settings.fpm_bind])
    curve = None
    if settings.fpm_curve_secret_key_file is not None or settings.fpm_curve_clients_dir is not None:
        from planner_core.runtime.ingest import CurveServer

        curve = CurveServer.load(settings.fpm_curve_secret_key_file, settings.fpm_curve_clients_dir)
    ingest = FpmIngest(
        url, deployment_id, bind=bind, connect=args.connect or (), retention_s=retention_minutes * 60, curve=curve,
        dynamo_discovery=args.dynamo_discovery,
    )  # fmt: skip
    if args.metrics_port is not None:
        from planner_core.runtime.ingest_metrics import start_ingest_metrics_server

        start_ingest_metrics_server(ingest, args.metrics_port, addr=settings.metrics_bind)
    print(
        f"ingesting forward-pass metrics for deployment '{deployment}' on {', '.join(ingest.endpoints) or '-'}"
        f"{'' if args.dynamo_discovery is None else f' and from the publishers in {args.dynamo_discovery}'} "
        f"(retention {retention_minutes:g} min); stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    stats = serve_until_signalled(ingest, stats_every_s=args.stats_every_s)
    print(f"stopped: {stats.summary()}", file=sys.stderr)
    return 0


def cmd_fpm_publish(args: argparse.Namespace) -> int:
    """Publish synthetic forward-pass metrics to an ingest (trials and throughput measurements)."""
    import random

    from planner_core.domain import Component
    from planner_core.runtime.ingest import FpmPublisher, synthetic_fpm

    if args.rate <= 0 or args.seconds <= 0 or args.workers <= 0:
        raise ValueError("--rate, --seconds and --workers must be > 0")
    rng = random.Random(args.seed)
    component = Component(args.component)
    with FpmPublisher(args.connect) as publisher:
        if not publisher.wait_for_subscriber(timeout_s=10.0):
            raise ValueError(f"--connect {args.connect}: no ingest subscribed within 10 s")
        started = time.perf_counter()
        total = int(args.rate * args.seconds)
        for i in range(total):
            worker = i % args.workers
            publisher.publish(synthetic_fpm(component, f"worker-{worker}", i // args.workers, rng))
            ahead_s = (i + 1) / args.rate - (time.perf_counter() - started)
            if ahead_s > 0:
                time.sleep(ahead_s)
        elapsed_s = time.perf_counter() - started
    print(f"published {total} messages from {args.workers} workers in {elapsed_s:.2f} s ({total / elapsed_s:.0f}/s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ingest command group's parsers."""
    ingest = sub.add_parser("ingest", help="receive engines' forward-pass metrics over ZMQ into Postgres")
    ingest.add_argument(
        "--bind", action="append", default=[], help="ZMQ endpoint to bind (repeatable; default PLANNER_FPM_BIND)"
    )
    ingest.add_argument("--connect", action="append", default=[], help="ZMQ endpoint of a publisher to connect to")
    ingest.add_argument(
        "--dynamo-discovery", type=Path, default=None, metavar="DIR",
        help="a Dynamo file discovery store (DYN_FILE_KV): read the forward-pass metrics its engines publish",
    )  # fmt: skip
    add_deployment_argument(ingest, records=True)
    ingest.add_argument("--config", type=Path, default=None, help="config used if the deployment does not exist yet")
    ingest.add_argument(
        "--retention-minutes",
        type=float,
        default=None,
        help="keep raw samples this long (default: PLANNER_FPM_RETENTION_MINUTES)",
    )
    ingest.add_argument("--stats-every-s", type=float, default=60.0, help="log the counters this often")
    ingest.add_argument(
        "--metrics-port", type=int, default=None,
        help="serve the ingest's counters (received, stored, dropped by reason, lost to a full queue) as Prometheus "
        "metrics on this port, at PLANNER_METRICS_BIND (127.0.0.1 unless set)",
    )  # fmt: skip
    ingest.set_defaults(func=cmd_ingest)

    publish = sub.add_parser("fpm-publish", help="publish synthetic forward-pass metrics to an ingest (trials)")
    publish.add_argument("--connect", default="tcp://127.0.0.1:20380", help="the ingest's ZMQ endpoint")
    publish.add_argument("--component", choices=["prefill", "decode"], default="decode", help="engines' role")
    publish.add_argument("--workers", type=int, default=2, help="engines to imitate")
    publish.add_argument("--rate", type=float, default=100.0, help="messages per second, all engines together")
    publish.add_argument("--seconds", type=float, default=10.0, help="how long to publish")
    publish.add_argument("--seed", type=int, default=0, help="random seed of the synthetic metrics")
    publish.set_defaults(func=cmd_fpm_publish)
