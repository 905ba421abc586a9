"""`planner k8s-check`: the DynamoGraphDeployment the planner would scale, validated, and any HPA or ScaledObject
that scales the same objects (another owner of the replica count)."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner_core.data import DEFAULT_CONFIG


def cmd_k8s_check(args: argparse.Namespace) -> int:
    """Validate the parent DynamoGraphDeployment as the planner does at start-up; show what it would scale."""
    from planner_core.config import load_config
    from planner_core.runtime.connectors.kubernetes import KubernetesApiError, KubernetesConnector, readiness_problem
    from planner_core.runtime.service import default_workers

    config = load_config(args.config).policy
    connector = KubernetesConnector.connect(config)
    try:
        problem = readiness_problem(connector.read_dgd([]))
        counts = connector.worker_counts(None, 0, default=default_workers(config))
    except KubernetesApiError as exc:
        raise ValueError(str(exc)) from None
    info = connector.info
    print(f"{info.label} ({info.api_version}): {'ready' if problem is None else 'NOT READY: ' + problem}")
    print(f"  model: {info.model_name}")
    for role, component in info.roles:
        gpus = (
            "no GPU resources" if component.gpus_per_replica is None else f"{component.gpus_per_replica} GPU(s)/replica"
        )
        print(
            f"  {role.value}: {component.name} (type {component.component_type}), {gpus}, "
            f"{counts.ready(role)} ready of {counts.expected(role)} expected"
        )
    competing = connector.competing_autoscalers()
    if not competing:
        print("  other autoscalers: none (no HorizontalPodAutoscaler or ScaledObject scales the DGD or its adapters)")
    for line in competing:
        # each would fight the planner over the count; the planner detects its changes (outside_change_rule)
        print(f"  WARNING: {line}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the k8s command group's parsers."""
    k8s_check = sub.add_parser(
        "k8s-check", help="validate the parent DynamoGraphDeployment (DYN_PARENT_DGD_K8S_NAME) as at start-up"
    )
    k8s_check.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="PlannerConfig (mode, model_name)")
    k8s_check.set_defaults(func=cmd_k8s_check)
