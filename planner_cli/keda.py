"""`planner keda-scaler`: the KEDA external scaler serving the planner's targets over gRPC."""

from __future__ import annotations

import argparse
import sys

from planner_core.runtime.settings import RuntimeSettings


def cmd_keda_scaler(args: argparse.Namespace) -> int:
    """Serve KEDA's External Scaler API until SIGINT/SIGTERM."""
    import logging

    from planner_core.runtime.keda.scaler import KedaScaler, serve_until_signalled, start_server
    from planner_core.runtime.store.db import resolve_database_url
    from planner_core.runtime.store.migrate import check_schema_current

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = RuntimeSettings()
    url = resolve_database_url(settings)
    check_schema_current(url)  # one line with the fix, not a traceback on the first KEDA call
    deployment = args.deployment or settings.deployment
    if deployment:
        # a name that is not recorded would serve nothing, every KEDA poll: refused now, naming the ones that are
        from planner_cli.common import select_deployment

        deployment = select_deployment(url, args.deployment)  # the flag, else PLANNER_DEPLOYMENT, named as such
    ready_replicas = None
    if args.watch_workloads:
        # the workloads' available replicas, read with the pod's service account (or the kubeconfig)
        from planner_core.runtime.connectors.kubernetes import api_client_from_environment
        from planner_core.runtime.connectors.workloads import WorkloadConnector

        ready_replicas = WorkloadConnector(api_client=api_client_from_environment(), targets=()).available_replicas
    from planner_core.runtime.localhost import check_port_free

    check_port_free(args.port, args.host)
    scaler = KedaScaler(url, deployment=deployment, max_age_s=args.max_age_s, ready_replicas=ready_replicas)
    server, port = start_server(scaler, port=args.port, host=args.host, stream_interval_s=args.stream_interval_s)
    served = f"deployment '{deployment}'" if deployment else "the deployment each trigger's metadata names"
    print(
        f"KEDA external scaler on {args.host}:{port} serving {served} (max target age {args.max_age_s:g} s); "
        "stop with Ctrl-C or SIGTERM",
        file=sys.stderr,
        flush=True,
    )
    serve_until_signalled(server)
    print("planner keda-scaler: stopped", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the keda-scaler command's parser."""
    from planner_core.runtime.keda import DEFAULT_MAX_AGE_S  # not .scaler: grpc loads only when serving

    keda = sub.add_parser(
        "keda-scaler", help="serve the planner's targets to KEDA (External Scaler gRPC API, ScaledObject type external)"
    )
    keda.add_argument("--port", type=int, default=9090, help="gRPC port (0 picks a free one)")
    keda.add_argument(
        "--host", default="127.0.0.1",
        help="address to listen on; in a pod, 0.0.0.0 (or [::]) so that KEDA reaches it (infra/keda/keda-scaler.yaml)",
    )  # fmt: skip
    keda.add_argument(
        "--deployment", default=None, metavar="NAME",
        help="serve only this managed deployment; triggers may then omit metadata 'deployment' "
        "(default: PLANNER_DEPLOYMENT, else any deployment the trigger's metadata names)",
    )  # fmt: skip
    keda.add_argument(
        "--max-age-s", type=float, default=DEFAULT_MAX_AGE_S,
        help="a deployment whose newest tick is older than this is stale: its last target is still served, "
        "and a warning logged",
    )  # fmt: skip
    keda.add_argument(
        "--stream-interval-s", type=float, default=5.0, help="how often StreamIsActive re-reads the target"
    )
    keda.add_argument(
        "--watch-workloads", action="store_true",
        help="acknowledge a decision only when every role's workload (trigger metadata workloadKind and "
        "workloadName) has as many available replicas as its target; needs get on the workloads",
    )  # fmt: skip
    keda.set_defaults(func=cmd_keda_scaler)
