"""`planner doctor` against real dependencies: the demo's database (real Postgres) and the session's Prefect server
pass; a stopped database, a wrong Prometheus URL, a missing work pool and a ServiceAccount lacking one verb (on
the emulated Kubernetes API, tests/runtime/kube_api.py) each fail with their one line, and the exit status says so.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from planner_cli.main import main
from planner_core.config import load_config
from planner_core.runtime.connectors import kubernetes, workloads
from planner_core.runtime.localhost import free_port
from planner_core.runtime.sources.promql import TrafficQueries
from tests.conftest import REPO_ROOT, write_config
from tests.runtime.demo_runs import run_demo
from tests.runtime.kube_api import KubeApiServer
from tests.runtime.test_sources_prometheus import FakePrometheus

pytestmark = pytest.mark.prefect


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """Run `planner doctor --json` in-process: the exit status and {check: (status, detail)}; also checks that the
    plain output is one line per check."""
    status = main(["doctor", *args])
    out = capsys.readouterr().out
    plain = main(["doctor", *args, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert plain == status and report["ok"] is (status == 0)
    checks = {c["check"]: (c["status"], c["detail"]) for c in report["checks"]}
    assert len(out.splitlines()) == len(checks)  # one line each
    for check, (state, detail) in checks.items():
        assert f"{state.upper():4} {check}: {detail}" in out.splitlines()
        assert "\n" not in detail
    return status, checks


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("PLANNER_DATABASE_URL", "PLANNER_MIGRATION_DATABASE_URL", "PLANNER_PROMETHEUS_ENDPOINT",
                 "PLANNER_CONFIG", "PREFECT_API_URL", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLANNER_DATA_DIR", str(tmp_path / "data"))
    return monkeypatch


def test_the_demos_database_and_prefect_pass(
    clean_env: pytest.MonkeyPatch,
    database_url: str,
    prefect_api_url: str,
    tmp_path: Path,
    azure_conv_trace: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After a demo run: every check passes (Prometheus and Kubernetes do not apply to the demo's config, and
    say why); with a work pool a worker polls, that passes too; a pool nobody created fails, naming the fix."""
    config = write_config(tmp_path)
    run_demo(database_url, config, azure_conv_trace, "doctor-demo", max_windows=1)
    capsys.readouterr()  # the demo's progress line
    clean_env.setenv("PLANNER_DATABASE_URL", database_url)
    clean_env.setenv("PREFECT_API_URL", prefect_api_url)
    status, checks = _doctor(capsys, "--config", str(config))
    assert status == 0, checks
    assert {name: state for name, (state, _) in checks.items()} == {
        "config": "pass", "perf-model": "pass", "database": "pass", "prefect": "pass",
        "prometheus": "skip", "kubernetes": "skip",
    }  # fmt: skip
    assert checks["database"][1].endswith("reachable, schema at head 0027")
    assert checks["prefect"][1] == f"{prefect_api_url} healthy (no --work-pool to check)"

    pool = "doctor-pool"
    httpx.post(f"{prefect_api_url}/work_pools/", json={"name": pool, "type": "process"}).raise_for_status()
    status, checks = _doctor(capsys, "--config", str(config), "--work-pool", pool)
    assert status == 1 and checks["prefect"] == (
        "fail",
        f"work pool '{pool}' has no worker polling it (status NOT_READY): start one "
        f"(`prefect worker start --pool {pool}`)",
    )
    # what a worker does as it polls: a heartbeat, which makes the pool ready
    httpx.post(f"{prefect_api_url}/work_pools/{pool}/workers/heartbeat", json={"name": "w1"}).raise_for_status()
    status, checks = _doctor(capsys, "--config", str(config), "--work-pool", pool)
    assert status == 0 and checks["prefect"] == (
        "pass",
        f"{prefect_api_url} healthy; work pool '{pool}' (process) ready",
    )
    status, checks = _doctor(capsys, "--config", str(config), "--work-pool", "nobody-made-it")
    assert status == 1 and checks["prefect"][1].startswith(
        f"work pool 'nobody-made-it' does not exist on {prefect_api_url}: create it (`prefect work-pool create"
    )


def test_a_stopped_database_fails_with_its_line(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No PLANNER_DATABASE_URL and no embedded Postgres running: the doctor says so (and starts none). A Postgres
    server of its own, migrated: pass; the same server stopped: unreachable, naming the fix. Exit 1 when failing."""
    import pgserver

    from planner_core.runtime.store.db import to_sqlalchemy_url
    from planner_core.runtime.store.migrate import upgrade

    config = write_config(tmp_path)
    status, checks = _doctor(capsys, "--config", str(config))
    pg_dir = tmp_path / "data" / "pg"
    assert status == 1 and checks["database"] == (
        "fail",
        f"PLANNER_DATABASE_URL is not set and no embedded Postgres runs under {pg_dir}: set PLANNER_DATABASE_URL, or "
        "start the embedded one (`planner db upgrade`)",
    )
    assert not pg_dir.exists()  # nothing was started

    server = pgserver.get_server(tempfile.mkdtemp(prefix="pgd", dir="/tmp"), cleanup_mode="delete")  # short: socket
    url = to_sqlalchemy_url(server.get_uri())
    upgrade(url)
    clean_env.setenv("PLANNER_DATABASE_URL", url)
    status, checks = _doctor(capsys, "--config", str(config))
    assert status == 0 and checks["database"][0] == "pass", checks["database"]
    server.cleanup()  # stops the server (and removes its folder)
    status, checks = _doctor(capsys, "--config", str(config))
    state, detail = checks["database"]
    assert status == 1 and state == "fail"
    # psycopg's words vary with the connection's state ("connection failed", "connection is bad"); the socket's fate
    assert detail.startswith("unreachable (OperationalError: ") and "No such file or directory" in detail, detail
    assert detail.endswith("): start the database, or fix PLANNER_DATABASE_URL")
    assert [name for name, (state, _) in checks.items() if state == "fail"] == ["database"]


def test_prometheus_serving_the_series_passes_and_a_wrong_url_fails(
    clean_env: pytest.MonkeyPatch, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Prometheus answering every series the policy reads, sampled 12 s ago: pass, with each age. A series last
    sampled an hour ago: stale. A missing one: named. A URL where nothing listens: unreachable, one line."""
    clean_env.setenv("PLANNER_DATABASE_URL", database_url)
    config = write_config(tmp_path)
    selector = TrafficQueries.from_config(load_config(config).policy).traffic_selector
    fake = FakePrometheus()
    try:
        sampled = {"requests_started_total": 12.0, "input_sequence_tokens": 12.0, "output_sequence_tokens": 12.0}

        def answer(query: str) -> tuple[int, bytes]:
            # the series of the config's namespace and model: the selector the traffic source reads them with
            assert query.startswith("max(timestamp(dynamo_frontend_") and query.endswith(f"{selector}))"), query
            age_s = next((age for key, age in sampled.items() if key in query), None)
            result = [] if age_s is None else [{"metric": {}, "value": [time.time(), str(time.time() - age_s)]}]
            return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

        fake.answer = answer
        clean_env.setenv("PLANNER_PROMETHEUS_ENDPOINT", fake.url)
        status, checks = _doctor(capsys, "--config", str(config))
        assert status == 0, json.dumps(checks)
        assert checks["prometheus"] == (
            "pass",
            f"{fake.url}: dynamo_frontend_requests_started_total 12 s old, dynamo_frontend_input_sequence_tokens_count "
            "12 s old, dynamo_frontend_output_sequence_tokens_count 12 s old",
        )
        sampled["output_sequence_tokens"] = 3600.0
        status, checks = _doctor(capsys, "--config", str(config))
        assert (
            status == 1
            and checks["prometheus"][1].startswith("dynamo_frontend_output_sequence_tokens_count{")
            and "is stale: last sample 3600 s ago (> 300 s): check the scrape target" in checks["prometheus"][1]
        )
        del sampled["input_sequence_tokens"]
        status, checks = _doctor(capsys, "--config", str(config))
        assert status == 1 and checks["prometheus"][1].startswith(
            f"{fake.url} has no dynamo_frontend_input_sequence_tokens_count{{"
        )
    finally:
        fake.close()
    wrong = f"http://127.0.0.1:{free_port()}"
    clean_env.setenv("PLANNER_PROMETHEUS_ENDPOINT", wrong)
    status, checks = _doctor(capsys, "--config", str(config), "--timeout-s", "2")
    state, detail = checks["prometheus"]
    assert status == 1 and state == "fail"
    assert detail.startswith(f"unreachable: {wrong}: ConnectError: ") and detail.endswith(
        "(fix metric_pulling_prometheus_endpoint in the config, or PLANNER_PROMETHEUS_ENDPOINT)"
    ), detail
    assert [name for name, (state, _) in checks.items() if state == "fail"] == ["prometheus"]


def _role_rules(manifest: str) -> list[dict]:
    [role] = [d for d in yaml.safe_load_all((REPO_ROOT / manifest).read_text()) if d["kind"] == "Role"]
    return role["rules"]


def _without(rules: list[dict], resource: str, verb: str) -> list[dict]:
    return [
        {**rule, "verbs": [v for v in rule["verbs"] if not (resource in rule["resources"] and v == verb)]}
        for rule in rules
    ]


@pytest.fixture
def kube_env(clean_env: pytest.MonkeyPatch, tmp_path: Path, database_url: str) -> KubeApiServer:
    with KubeApiServer(namespace="ns") as kube:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulated", "cluster": {"server": kube.url}}],
                    "users": [{"name": "planner", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "planner"}}],
                    "current-context": "emulated",
                }
            )
        )
        clean_env.setenv("KUBECONFIG", str(kubeconfig))
        clean_env.setenv("PLANNER_K8S_NAMESPACE", "ns")
        clean_env.setenv("DYN_PARENT_DGD_K8S_NAME", "llm")
        clean_env.setenv("PLANNER_DATABASE_URL", database_url)
        yield kube


def test_a_service_account_lacking_one_verb_fails_naming_it(
    kube_env: KubeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """environment: kubernetes. The Role of infra/k8s/dgd/planner-rbac.yaml: every review allowed, pass. The same Role
    without `patch` on the DGD: fail, naming the verb, the object and the manifest to apply."""
    config = write_config(tmp_path, environment="kubernetes")
    rules = _role_rules(kubernetes.RBAC_FILE)
    kube_env.grant(rules)
    status, checks = _doctor(capsys, "--config", str(config))
    assert status == 0 and checks["kubernetes"] == (
        "pass",
        f"all 7 requests the connector makes are allowed ({kubernetes.RBAC_FILE})",
    )
    reviews = [r for r in kube_env.requests if r.path.endswith("/selfsubjectaccessreviews")]
    asked = {
        (r.body["spec"]["resourceAttributes"]["resource"], r.body["spec"]["resourceAttributes"].get("subresource"),
         r.body["spec"]["resourceAttributes"]["verb"], r.body["spec"]["resourceAttributes"].get("name"))
        for r in reviews
    }  # fmt: skip
    assert asked == {
        ("dynamographdeployments", None, "get", "llm"),
        ("dynamographdeployments", None, "patch", "llm"),
        ("dynamographdeploymentscalingadapters", "scale", "get", None),
        ("dynamographdeploymentscalingadapters", "scale", "update", None),
        ("events", None, "create", None),
        ("pods", None, "list", None),
        ("pods", None, "patch", None),
    }

    kube_env.grant(_without(rules, "dynamographdeployments", "patch"))
    status, checks = _doctor(capsys, "--config", str(config))
    assert status == 1 and checks["kubernetes"] == (
        "fail",
        "the ServiceAccount may not patch dynamographdeployments 'llm' (nvidia.com, namespace ns): apply "
        f"{kubernetes.RBAC_FILE} (its Role grants every request the connector makes)",
    )
    assert [name for name, (state, _) in checks.items() if state == "fail"] == ["kubernetes"]


def test_workload_rights_follow_the_config(
    kube_env: KubeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """environment: kubernetes-workloads: `list` is asked only for a workload found by selector, in the workload's
    namespace; the workloads Role passes, and lacking `update` on deployments/scale fails."""
    config = write_config(
        tmp_path,
        environment="kubernetes-workloads",
        kubernetes_workloads={
            "prefill": {"kind": "Deployment", "name": "llm-prefill"},
            "decode": {"kind": "Deployment", "selector": {"app": "llm"}},
        },
    )
    rules = _role_rules(workloads.RBAC_FILE)
    kube_env.grant(rules)
    status, checks = _doctor(capsys, "--config", str(config))
    assert status == 0 and checks["kubernetes"][1].startswith("all 4 requests the connector makes are allowed")
    kube_env.grant(_without(rules, "deployments/scale", "update"))
    status, checks = _doctor(capsys, "--config", str(config))
    assert status == 1 and checks["kubernetes"][1].startswith(
        f"the ServiceAccount may not update deployments/scale (apps, namespace ns): apply {workloads.RBAC_FILE}"
    )


def test_skip_names_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    """`--skip` takes the checks' names (the CLI's list is the runtime's), and refuses another in one line."""
    from planner_cli.doctor import CHECKS
    from planner_core.runtime.doctor import CheckName

    assert CHECKS == tuple(name.value for name in CheckName)
    with pytest.raises(SystemExit) as exited:
        main(["doctor", "--skip", "database,prometheus,bogus"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "argument --skip: unknown check bogus (known: config, perf-model," in error
