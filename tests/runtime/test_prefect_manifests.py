"""prefect.yaml and the Prefect manifests in infra/k8s/prefect: valid for Kubernetes (kubernetes-validate, strict),
consistent with each other and with the code they name."""

from __future__ import annotations

import copy
import importlib
import inspect

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO_ROOT

PREFECT_DIR = REPO_ROOT / "infra" / "k8s" / "prefect"
K8S_VERSION = "1.30"


def _objects(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((PREFECT_DIR / name).read_text()) if doc]


def _prefect_yaml() -> dict:
    return yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())


@pytest.mark.parametrize("name", ["prefect-server.yaml", "prefect-worker.yaml"])
def test_every_object_is_valid_kubernetes(name: str) -> None:
    objects = _objects(name)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_job_template_renders_to_a_valid_job_with_the_database_from_a_secret() -> None:
    """The base job template's Job, with Prefect's placeholders filled as a worker fills them, is a valid Job; the
    planner's database URL comes from a Secret, not from a job variable Prefect would store."""
    template = yaml.safe_load((PREFECT_DIR / "fleet-job-template.yaml").read_text())
    job = copy.deepcopy(template["job_configuration"]["job_manifest"])
    job["metadata"]["generateName"] = "fleet-tick-abc-"
    job["metadata"]["labels"] = {"prefect.io/flow-run-id": "0"}
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["args"], container["env"]) == ("{{ image }}", "{{ command }}", "{{ env }}")
    api_url = {"name": "PREFECT_API_URL", "value": "http://prefect-server.planner.svc:4200/api"}
    container |= {"image": "planner:1", "args": ["prefect", "flow-run", "execute"], "env": [api_url]}
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert container["envFrom"] == [{"secretRef": {"name": "planner-database"}}]
    assert "required" in template["variables"] and template["variables"]["required"] == ["image"]


def test_the_worker_may_run_jobs_and_nothing_more() -> None:
    """A namespaced Role: Jobs (create, watch, delete), pods and their logs and events read-only; no wildcard."""
    role = next(o for o in _objects("prefect-worker.yaml") if o["kind"] == "Role")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}  # fmt: skip
    assert not any("*" in item for item in granted)
    writes = {(g, r, v) for g, r, v in granted if v in {"create", "update", "patch", "delete", "deletecollection"}}
    assert writes == {("batch", "jobs", "create"), ("batch", "jobs", "delete")}


def test_prefect_yaml_names_the_flow_its_parameters_and_the_pools_the_manifests_serve() -> None:
    """Each deployment's entrypoint is a Prefect flow of the code, its parameters are that flow's, and the
    Kubernetes deployment's pool is the one the worker manifest starts on."""
    deployments = {d["name"]: d for d in _prefect_yaml()["deployments"]}
    assert set(deployments) == {"fleet", "fleet-kubernetes"}
    for deployment in deployments.values():
        module_path, _, attr = deployment["entrypoint"].partition(":")
        module = importlib.import_module(module_path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, attr)
        assert flow.name == "fleet-tick"
        assert set(deployment.get("parameters", {})) <= set(inspect.signature(flow.fn).parameters)
        assert "PLANNER_DATABASE_URL" not in yaml.safe_dump(deployment)  # no secret among job variables
    worker = next(o for o in _objects("prefect-worker.yaml") if o["kind"] == "Deployment")
    command = worker["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--pool") + 1] == deployments["fleet-kubernetes"]["work_pool"]["name"]
    assert command[command.index("--type") + 1] == "kubernetes"
