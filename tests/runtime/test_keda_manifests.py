"""The example manifests in infra/keda: valid for Kubernetes and KEDA, and pointing at what the scaler serves.

kubernetes-validate's schemas have no KEDA CRD, so a ScaledObject is checked in three parts: the whole object
against infra/keda/scaledobject.schema.json (jsonschema, strict), its metadata as a Kubernetes ObjectMeta and the
HPA KEDA makes of it (autoscaling/v2, with the behavior as written) with kubernetes-validate (strict). The scaler's
Deployment and Service are plain Kubernetes objects, validated as they are.
"""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from planner_core.domain import Component
from planner_core.runtime.keda import scaler
from tests.conftest import REPO_ROOT

KEDA_DIR = REPO_ROOT / "infra" / "keda"
K8S_VERSION = "1.30"
SCALED_OBJECTS = {"prefill": "scaledobject-prefill.yaml", "decode": "scaledobject-decode.yaml"}


def load_all(name: str) -> list[dict]:
    return list(yaml.safe_load_all((KEDA_DIR / name).read_text()))


def hpa_of(scaled_object: dict) -> dict:
    """The HorizontalPodAutoscaler KEDA creates for a ScaledObject (external trigger: an External metric whose
    target is the AverageValue GetMetricSpec returns, 1)."""
    spec = scaled_object["spec"]
    hpa_spec = {
        "scaleTargetRef": {k: spec["scaleTargetRef"][k] for k in ("apiVersion", "kind", "name")},
        "minReplicas": spec["minReplicaCount"],
        "maxReplicas": spec["maxReplicaCount"],
        "metrics": [
            {
                "type": "External",
                "external": {
                    "metric": {"name": "s0-planner-llm-role"},
                    "target": {"type": "AverageValue", "averageValue": "1"},
                },
            }
        ],
    }
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior is not None:
        hpa_spec["behavior"] = behavior
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"keda-hpa-{scaled_object['metadata']['name']}"},
        "spec": hpa_spec,
    }


@pytest.mark.parametrize("role", sorted(SCALED_OBJECTS))
def test_scaled_object_is_valid_and_names_what_the_scaler_serves(role: str) -> None:
    [scaled_object] = load_all(SCALED_OBJECTS[role])
    schema = json.loads((KEDA_DIR / "scaledobject.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(scaled_object, schema, cls=jsonschema.Draft202012Validator)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):  # why the CRD part needs our schema
        kubernetes_validate.validate(scaled_object, K8S_VERSION, strict=True)
    # metadata as Kubernetes sees any object's: wrapped in a ConfigMap, the smallest kind that has it
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": scaled_object["metadata"]}, K8S_VERSION, strict=True
    )
    kubernetes_validate.validate(hpa_of(scaled_object), K8S_VERSION, strict=True)
    [trigger] = scaled_object["spec"]["triggers"]
    assert trigger["type"] == "external"
    metadata = trigger["metadata"]
    assert Component(metadata[scaler.ROLE_KEY]) is Component(role)
    assert metadata[scaler.DEPLOYMENT_KEY] == "llm"
    assert metadata["scalerAddress"] == "planner-keda-scaler:9090"


def test_scaler_deployment_and_service_are_valid_and_match_the_scaled_objects() -> None:
    deployment, service = load_all("keda-scaler.yaml")
    for resource in (deployment, service):
        kubernetes_validate.validate(resource, K8S_VERSION, strict=True)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "keda-scaler"  # the image's entrypoint is `planner` (Containerfile)
    port = int(container["args"][container["args"].index("--port") + 1])
    assert service["spec"]["ports"][0]["port"] == port == 9090
    assert service["metadata"]["name"] == "planner-keda-scaler"


def test_the_checks_catch_mistakes() -> None:
    """A misspelt ScaledObject field and a bad HPA behavior both fail (the checks are not vacuous)."""
    [scaled_object] = load_all(SCALED_OBJECTS["decode"])
    schema = json.loads((KEDA_DIR / "scaledobject.schema.json").read_text())
    typo = {**scaled_object, "spec": {**scaled_object["spec"], "maxReplicas": 4}}
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.validate(typo, schema, cls=jsonschema.Draft202012Validator)
    bad_behavior = hpa_of(scaled_object)
    bad_behavior["spec"]["behavior"]["scaleDown"]["policies"][0]["value"] = "all"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad_behavior, K8S_VERSION, strict=True)
