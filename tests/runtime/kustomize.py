"""The Kustomize install (infra/base, infra/overlays/*) rendered by `kubectl kustomize`, for the tests that check
what it installs (tests/runtime/test_install_manifests.py and the connectors' RBAC tests).

`kubectl` is required, not optional: without it these tests fail naming how to get it, never skip.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

import yaml

from tests.conftest import REPO_ROOT
from tests.runtime.kube_api import rules_by_resource

INSTALLS = ("base", "overlays/dgd", "overlays/workloads", "overlays/trial")
KUBECTL_MISSING = (
    "kubectl not found on PATH: the install's manifests are rendered with `kubectl kustomize` (kubectl >= 1.27, "
    "e.g. `curl -LO https://dl.k8s.io/release/v1.32.4/bin/linux/amd64/kubectl && install kubectl /usr/local/bin/`, "
    "or your distribution's kubernetes-client package)"
)


@functools.cache
def render(install: str) -> tuple[dict, ...]:
    """The objects `kubectl kustomize infra/<install>` renders, in its order."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, KUBECTL_MISSING
    done = subprocess.run(
        [kubectl, "kustomize", str(REPO_ROOT / "infra" / install)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"kubectl kustomize infra/{install}: {done.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def one(objects: tuple[dict, ...], kind: str, name: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def role_of_account(objects: tuple[dict, ...], account: str) -> dict:
    """The one Role bound (by a RoleBinding) to ServiceAccount `account`."""
    bindings = [
        o for o in objects
        if o["kind"] == "RoleBinding" and any(s["kind"] == "ServiceAccount" and s["name"] == account
                                              for s in o.get("subjects", []))
    ]  # fmt: skip
    [binding] = bindings
    assert binding["roleRef"]["kind"] == "Role"
    return one(objects, "Role", binding["roleRef"]["name"])


def planner_role(install: str) -> dict[tuple[str, str], set[str]]:
    """The rules (`rules_by_resource`) of the Role the rendered install binds to the account the planner runs as."""
    objects = render(install)
    account = one(objects, "Deployment", "planner")["spec"]["template"]["spec"]["serviceAccountName"]
    return rules_by_resource(role_of_account(objects, account)["rules"])
