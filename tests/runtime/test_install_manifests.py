"""The Kustomize install of the control plane (infra/base, infra/overlays/{dgd,workloads,trial}), rendered by
`kubectl kustomize` and checked offline: every object against the Kubernetes schemas (kubernetes-validate, strict)
or, for the one custom resource (the ServiceMonitor), against infra/k8s/control-plane/servicemonitor.schema.json
with its metadata as ObjectMeta; Secrets referenced and never inlined; every container with requests, a memory
limit and, in long-running pods, a readiness probe; the planner's config loading; the image's entrypoint respected.
Each Role of the connectors is compared with the calls the code makes in the connectors' RBAC tests
(tests/runtime/test_kubernetes_connector.py, test_workload_connector.py: `planner_role`).
"""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from planner_core.config import EnvironmentKind, parse_config
from tests.conftest import REPO_ROOT
from tests.runtime.kustomize import INSTALLS, one, render

K8S_VERSION = "1.32"  # kubectl's on the test machine; kubernetes-validate ships the schemas offline
SERVICE_MONITOR_SCHEMA = REPO_ROOT / "infra" / "k8s" / "control-plane" / "servicemonitor.schema.json"
SECRETS = {"planner-database", "prefect-database", "planner-postgres"}  # made by the user (docs/install.md)
OUR_IMAGE = "llm-planner:0.1.0"


def _pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
        return [obj["spec"]["template"]["spec"]]
    return []


def _secret_names(value: object) -> set[str]:
    """Every Secret a manifest names (secretKeyRef, secretRef, secret volumes), anywhere in it."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(item, dict):
                found.add(item["name"])
            elif key == "secret" and isinstance(item, dict) and "secretName" in item:
                found.add(item["secretName"])
            else:
                found |= _secret_names(item)
    elif isinstance(value, list):
        for item in value:
            found |= _secret_names(item)
    return found


def _validate(obj: dict) -> None:
    if obj["kind"] == "ServiceMonitor":
        schema = json.loads(SERVICE_MONITOR_SCHEMA.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.validate(obj, schema, cls=jsonschema.Draft202012Validator)
        metadata_only = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        kubernetes_validate.validate(metadata_only, K8S_VERSION, strict=True)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("install", INSTALLS)
def test_every_rendered_object_is_valid_and_complete(install: str) -> None:
    objects = render(install)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Job", "Service", "ServiceMonitor", "NetworkPolicy", "Role", "ConfigMap"} <= kinds
    assert "Secret" not in kinds  # referenced, never inlined
    for obj in objects:
        _validate(obj)
        assert obj["metadata"].get("namespace") == "planner", obj["metadata"]["name"]
        assert _secret_names(obj) <= SECRETS, obj["metadata"]["name"]
        for spec in _pod_specs(obj):
            assert spec["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                where = f"{obj['kind']} {obj['metadata']['name']}: {container['name']}"
                resources = container.get("resources", {})
                assert resources.get("requests") and "memory" in resources.get("limits", {}), where
                if obj["kind"] != "Job" and container in spec["containers"]:
                    assert "readinessProbe" in container, where
                if container["image"] == OUR_IMAGE:  # entrypoint `planner`: args are a planner command
                    assert container.get("args") or container.get("command"), where
                    assert not container.get("args", [""])[0].startswith("planner"), where


def test_the_checks_catch_mistakes() -> None:
    """A misspelt field fails each validator (the checks are not vacuous)."""
    objects = render("overlays/dgd")
    deployment = json.loads(json.dumps(one(objects, "Deployment", "planner")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)
    monitor = json.loads(json.dumps(one(objects, "ServiceMonitor", "planner")))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        _validate(monitor)
    assert _secret_names({"env": [{"valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}]}) == {"x"}


@pytest.mark.parametrize(
    ("install", "environment", "account"),
    [
        ("base", EnvironmentKind.VIRTUAL, "planner"),
        ("overlays/dgd", EnvironmentKind.KUBERNETES, "dynamo-planner"),
        ("overlays/workloads", EnvironmentKind.KUBERNETES_WORKLOADS, "planner-workloads"),
    ],
)
def test_the_planner_runs_its_overlays_config_as_its_connectors_account(
    install: str, environment: EnvironmentKind, account: str
) -> None:
    """The config in the planner's ConfigMap loads with the overlay's environment; the planner and the fleet's
    Jobs (PLANNER_SERVICE_ACCOUNT, read by prefect.yaml) run as the account the connector's Role is bound to; the
    planner is ready when `planner doctor` passes; its metrics port is the config's and the ServiceMonitor's."""
    objects = render(install)
    [config_map] = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("planner-config")
    ]
    loaded = parse_config(yaml.safe_load(config_map["data"]["planner.yaml"]))
    assert loaded.policy.environment is environment
    planner = one(objects, "Deployment", "planner")
    pod = planner["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    [container] = pod["containers"]
    assert container["args"] == ["serve"] and container["image"] == OUR_IMAGE
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PLANNER_CONFIG"] == "/etc/planner/planner.yaml"
    assert container["readinessProbe"]["exec"]["command"][:2] == ["planner", "doctor"]
    assert container["ports"][0]["containerPort"] == loaded.service.metric_reporting_prometheus_port
    assert one(objects, "ServiceMonitor", "planner")["spec"]["endpoints"][0]["port"] == container["ports"][0]["name"]
    register = one(objects, "Job", "planner-register-fleet")["spec"]["template"]["spec"]
    register_env = {e["name"]: e.get("value") for e in register["containers"][0]["env"]}
    assert register_env["PLANNER_SERVICE_ACCOUNT"] == account
    assert register["initContainers"][0]["args"][0] == "doctor"
    prefect_yaml = (REPO_ROOT / "prefect.yaml").read_text()
    assert '"{{ $PLANNER_SERVICE_ACCOUNT }}"' in prefect_yaml
    if environment is EnvironmentKind.KUBERNETES:
        assert env["DYN_PARENT_DGD_K8S_NAME"] == "llm"


def test_the_trial_adds_postgres_and_nothing_else() -> None:
    """The trial overlay is the workloads overlay plus the Postgres component (StatefulSet, Service, its init
    script, a NetworkPolicy), the database Secrets still referenced, not made."""
    trial = {(o["kind"], o["metadata"]["name"]) for o in render("overlays/trial")}
    workloads = {(o["kind"], o["metadata"]["name"]) for o in render("overlays/workloads")}
    added = {(kind, name.rsplit("-", 1)[0] if kind == "ConfigMap" else name) for kind, name in trial - workloads}
    assert added == {
        ("StatefulSet", "planner-postgres"),
        ("Service", "planner-postgres"),
        ("ConfigMap", "planner-postgres-init"),
        ("NetworkPolicy", "planner-postgres-from-planner"),
    }
