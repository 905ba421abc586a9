"""`planner doctor`: what a running planner depends on, checked one thing at a time, each in one line.

The checks, in order: the config loads (`load_config`); the perf model it names is readable and reaches the SLA
(`refuse_what_cannot_work`, the check every command that loads a config makes); the database is reachable and at
the newest migration (`check_schema_current`); the Prefect API answers and the work pool exists with a worker
polling it; Prometheus serves the series the policy reads, recently; the cluster connector's ServiceAccount may
make each request the connector makes (a SelfSubjectAccessReview per `ApiAccess` of `REQUIRED_ACCESS`).

A check passes, fails (what is wrong, then how to fix it) or is skipped (it does not apply to this config or
environment, and says why). Nothing is started or written: an embedded Postgres that is not running is reported,
not started. The CLI (`planner_cli.doctor`) prints the results and exits 0 only when none failed.
"""

from __future__ import annotations

import datetime as dt
import enum
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from planner_core.config import ConfigError, EnvironmentKind, PlannerFile, load_config
from planner_core.planner import refuse_what_cannot_work
from planner_core.runtime.connectors.k8s_api import ApiAccess, KubernetesConnectorError
from planner_core.runtime.redact import redact_text
from planner_core.runtime.settings import RuntimeSettings


class CheckStatus(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # does not apply here (no Prometheus configured, no cluster connector, ...)


class CheckName(enum.StrEnum):
    CONFIG = "config"
    PERF_MODEL = "perf-model"
    DATABASE = "database"
    PREFECT = "prefect"
    PROMETHEUS = "prometheus"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    name: CheckName
    status: CheckStatus
    detail: str  # one line: what was found, or what is wrong and how to fix it

    def line(self) -> str:
        return f"{self.status.value.upper():4} {self.name.value}: {self.detail}"

    def as_json(self) -> dict[str, str]:
        return {"check": self.name.value, "status": self.status.value, "detail": self.detail}


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorOptions:
    """What to check against (the CLI fills these from its flags and the environment)."""

    config_path: Path
    prefect_api_url: str | None = None  # None: not checked (the local commands start their own server)
    work_pool: str | None = None  # None: only the Prefect API is checked
    max_series_age_s: float = 300.0  # a series last sampled longer ago than this is stale
    timeout_s: float = 5.0  # each network request (Prefect, Prometheus)
    skip: frozenset[CheckName] = frozenset()


def _one_line(exc: BaseException) -> str:
    """An exception's first non-empty line (a driver's message spans several), without SQLAlchemy's SQL."""
    text = str(getattr(exc, "orig", None) or exc).split("\n[SQL:")[0]
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return redact_text(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


def _pass(name: CheckName, detail: str) -> CheckResult:
    return CheckResult(name=name, status=CheckStatus.PASS, detail=detail)


def _fail(name: CheckName, detail: str) -> CheckResult:
    return CheckResult(name=name, status=CheckStatus.FAIL, detail=redact_text(detail))


def _skip(name: CheckName, detail: str) -> CheckResult:
    return CheckResult(name=name, status=CheckStatus.SKIP, detail=detail)


# --------------------------------------------------------------------------------------------------------
# Config and perf model
# --------------------------------------------------------------------------------------------------------


def check_config(path: Path) -> tuple[CheckResult, PlannerFile | None]:
    try:
        loaded = load_config(path)
    except (ConfigError, OSError, ValueError) as exc:
        return _fail(CheckName.CONFIG, f"{exc} (fix the file, or name another with --config / PLANNER_CONFIG)"), None
    policy = loaded.policy
    detail = f"{path} loads (mode {policy.mode.value}, environment {policy.environment.value})"
    return _pass(CheckName.CONFIG, detail), loaded


def check_perf_model(loaded: PlannerFile, path: Path) -> CheckResult:
    """The perf model the policy sizes on, loaded and reaching the SLA: `refuse_what_cannot_work`'s checks."""
    try:
        planner = refuse_what_cannot_work(loaded.policy, path)
    except (ValueError, LookupError, OSError) as exc:  # ConfigError and ProfileError are ValueErrors
        return _fail(CheckName.PERF_MODEL, f"{exc} (point profile_results_dir / perf_table at a readable model)")
    if planner.perf is None:
        return _skip(CheckName.PERF_MODEL, "no engine profile needed (throughput scaling is off)")
    from planner_core.config import resolve_profile_dir

    table = f", perf table {loaded.policy.perf_table}" if loaded.policy.perf_table is not None else ""
    profile = resolve_profile_dir(loaded.policy, path).resolve()
    return _pass(
        CheckName.PERF_MODEL,
        f"profile {profile}{table} readable; TTFT {loaded.policy.ttft_ms:g} ms and ITL {loaded.policy.itl_ms:g} ms "
        "reachable",
    )


# --------------------------------------------------------------------------------------------------------
# Database
# --------------------------------------------------------------------------------------------------------


def check_database(settings: RuntimeSettings) -> CheckResult:
    """Reachable, and at the newest migration. Without PLANNER_DATABASE_URL the embedded server must be running
    already (the doctor starts nothing)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    from planner_core.runtime.store.db import postmaster_pid, resolve_database_url
    from planner_core.runtime.store.migrate import SchemaOutOfDate, check_schema_current

    if not settings.database_url and postmaster_pid(settings.embedded_pg_dir.expanduser().resolve()) is None:
        return _fail(
            CheckName.DATABASE,
            f"PLANNER_DATABASE_URL is not set and no embedded Postgres runs under {settings.embedded_pg_dir}: set "
            "PLANNER_DATABASE_URL, or start the embedded one (`planner db upgrade`)",
        )
    try:
        url = resolve_database_url(settings)
        shown = make_url(url).render_as_string(hide_password=True)
        check_schema_current(url)
    except SchemaOutOfDate as exc:
        return _fail(CheckName.DATABASE, str(exc))
    except (DBAPIError, OSError, ValueError) as exc:  # OperationalError: refused, no such socket, bad login
        where = "PLANNER_DATABASE_URL" if settings.database_url else f"the embedded Postgres ({settings.data_dir})"
        return _fail(
            CheckName.DATABASE,
            f"unreachable ({_one_line(exc)}): start the database, or fix {where}",
        )
    from planner_core.runtime.store.migrate import heads

    return _pass(CheckName.DATABASE, f"{shown} reachable, schema at head {', '.join(heads(url))}")


# --------------------------------------------------------------------------------------------------------
# Prefect
# --------------------------------------------------------------------------------------------------------


def _prefect_headers() -> dict[str, str]:
    """Prefect Cloud's API key, or a self-hosted server's basic-auth string, as Prefect's own client sends them."""
    import base64

    if key := os.environ.get("PREFECT_API_KEY"):
        return {"Authorization": f"Bearer {key}"}
    if auth := os.environ.get("PREFECT_API_AUTH_STRING"):
        return {"Authorization": f"Basic {base64.b64encode(auth.encode()).decode()}"}
    return {}


def check_prefect(api_url: str | None, work_pool: str | None, timeout_s: float) -> CheckResult:
    if not api_url:
        return _skip(
            CheckName.PREFECT,
            "PREFECT_API_URL is not set (`planner serve` and `planner demo` start their own server); set it, or "
            "--prefect-api-url, to check a shared one",
        )
    base = api_url.rstrip("/")
    try:
        with httpx.Client(timeout=timeout_s, headers=_prefect_headers(), follow_redirects=False) as client:
            health = client.get(f"{base}/health")
            if health.status_code != 200:
                return _fail(
                    CheckName.PREFECT,
                    f"{base}/health answered {health.status_code}: check the server's log, or PREFECT_API_URL",
                )
            if work_pool is None:
                return _pass(CheckName.PREFECT, f"{base} healthy (no --work-pool to check)")
            pool = client.get(f"{base}/work_pools/{work_pool}")
    except httpx.HTTPError as exc:
        return _fail(
            CheckName.PREFECT, f"{base}: unreachable ({_one_line(exc)}): start the server, or fix PREFECT_API_URL"
        )
    if pool.status_code == 404:
        return _fail(
            CheckName.PREFECT,
            f"work pool {work_pool!r} does not exist on {base}: create it (`prefect work-pool create {work_pool} "
            "--type kubernetes --base-job-template ...`, docs/install.md)",
        )
    if pool.status_code != 200:
        return _fail(CheckName.PREFECT, f"work pool {work_pool!r}: {base} answered {pool.status_code}")
    body = pool.json()
    status = str(body.get("status") or "").upper()
    if status == "PAUSED" or body.get("is_paused"):
        return _fail(CheckName.PREFECT, f"work pool {work_pool!r} is paused: `prefect work-pool resume {work_pool}`")
    if status != "READY":
        return _fail(
            CheckName.PREFECT,
            f"work pool {work_pool!r} has no worker polling it (status {status or 'unknown'}): start one "
            f"(`prefect worker start --pool {work_pool}`)",
        )
    return _pass(CheckName.PREFECT, f"{base} healthy; work pool {work_pool!r} ({body.get('type')}) ready")


# --------------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------------


def required_series(loaded: PlannerFile) -> tuple[tuple[str, ...], ...]:
    """The series the throughput loop cannot do without, each as alternatives (the first found is used): the
    request counter (started, else completed: the source's fallback) and the ISL and OSL histograms."""
    from planner_core.runtime.sources.promql import TrafficQueries

    series = TrafficQueries.from_config(loaded.policy).series
    return (
        (series.requests_started, series.requests_total),
        (f"{series.input_sequence_tokens}_count",),
        (f"{series.output_sequence_tokens}_count",),
    )


def check_prometheus(
    loaded: PlannerFile, settings: RuntimeSettings, *, max_age_s: float, timeout_s: float, now: dt.datetime
) -> CheckResult:
    """Each series the policy reads exists for its selector and was sampled within `max_age_s`."""
    from planner_core.runtime.sources.base import TrafficUnavailable
    from planner_core.runtime.sources.prometheus import PrometheusTrafficSource

    if not loaded.policy.throughput_scaling_active:
        return _skip(CheckName.PROMETHEUS, "throughput scaling is off: no traffic series are read")
    # the doctor's own per-request timeout, not the served ticks' (a probe must answer within its period)
    settings = settings.model_copy(update={"prometheus_timeout_s": timeout_s})
    source = PrometheusTrafficSource.from_config(loaded.policy, loaded.service, settings)
    if source is None:
        return _skip(
            CheckName.PROMETHEUS,
            "no Prometheus configured (metric_pulling_prometheus_endpoint, PLANNER_PROMETHEUS_ENDPOINT): traffic "
            "comes from a trace or the demo",
        )
    found: list[str] = []
    with source:
        endpoint, selector = source.options.endpoint, source.queries.traffic_selector
        for alternatives in required_series(loaded):
            age_s = None
            for name in alternatives:
                try:
                    newest = source.query(f"max(timestamp({name}{selector}))", now)
                except TrafficUnavailable as exc:
                    where = "" if endpoint in exc.detail else f"{endpoint}: "
                    return _fail(
                        CheckName.PROMETHEUS,
                        f"{exc.kind.value}: {where}{exc.detail} (fix metric_pulling_prometheus_endpoint in "
                        "the config, or PLANNER_PROMETHEUS_ENDPOINT)",
                    )
                if newest is not None:
                    age_s = now.timestamp() - newest
                    break
            if age_s is None:
                return _fail(
                    CheckName.PROMETHEUS,
                    f"{endpoint} has no {' or '.join(alternatives)}{selector}: check that it scrapes the frontend "
                    "and the config's namespace and model_name",
                )
            if age_s > max_age_s:
                return _fail(
                    CheckName.PROMETHEUS,
                    f"{name}{selector} is stale: last sample {age_s:.0f} s ago (> {max_age_s:g} s): check the "
                    "scrape target",
                )
            found.append(f"{name} {max(age_s, 0.0):.0f} s old")
    return _pass(CheckName.PROMETHEUS, f"{endpoint}: {', '.join(found)}")


# --------------------------------------------------------------------------------------------------------
# Kubernetes
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessQuestion:
    """One SelfSubjectAccessReview: may this ServiceAccount make `access` in `namespace` (on `name`)?"""

    namespace: str
    access: ApiAccess
    name: str = ""  # empty: any object of the resource in the namespace

    def label(self) -> str:
        where = self.access.rbac_resource + (f" {self.name!r}" if self.name else "")
        return f"{self.access.verb} {where} ({self.access.group or 'core'}, namespace {self.namespace})"


def access_questions(loaded: PlannerFile) -> tuple[tuple[AccessQuestion, ...], str] | None:
    """The questions for the config's connector and its Role's file, or None when it has no cluster connector.

    Raises:
        KubernetesConnectorError: a bad connector setting (one line naming the variable).
    """
    from planner_core.runtime.connectors import k8s_api

    environment = loaded.policy.environment
    settings = k8s_api.load_settings()
    namespace = k8s_api.resolve_namespace(settings)
    if environment is EnvironmentKind.KUBERNETES:
        from planner_core.runtime.connectors import kubernetes

        dgd = settings.parent_dgd_name or ""
        questions = tuple(
            # the DGD by name (a Role pinned with resourceNames allows it); the adapters' names come from the DGD
            AccessQuestion(
                namespace=namespace, access=access, name=dgd if access.resource == kubernetes.DGD_PLURAL else ""
            )
            for access in kubernetes.REQUIRED_ACCESS
        )
        return questions, kubernetes.RBAC_FILE
    if environment is EnvironmentKind.KUBERNETES_WORKLOADS:
        from planner_core.runtime.connectors import workloads

        config = loaded.service.kubernetes_workloads
        assert config is not None  # PlannerFile's rule: required with this environment
        asked: dict[tuple[str, ApiAccess], AccessQuestion] = {}
        for _role, _key, ref in config.roles():
            where = ref.namespace or config.namespace or namespace
            for access in workloads.required_access(ref.kind, by_selector=ref.selector is not None):
                asked.setdefault((where, access), AccessQuestion(namespace=where, access=access))
        return tuple(asked.values()), workloads.RBAC_FILE
    return None


def check_kubernetes(loaded: PlannerFile, review: Callable[[AccessQuestion], bool] | None = None) -> CheckResult:
    """Every request the connector makes, asked of the API server as the planner's own identity."""
    try:
        found = access_questions(loaded)
        if found is None:
            return _skip(
                CheckName.KUBERNETES,
                f"environment {loaded.policy.environment.value} has no cluster connector: nothing to authorize",
            )
        questions, rbac_file = found
        review = review or _self_subject_access_review()
        denied = [question for question in questions if not review(question)]
    except KubernetesConnectorError as exc:
        return _fail(CheckName.KUBERNETES, str(exc))
    except Exception as exc:  # the API server unreachable or refusing the review itself: one line, not a traceback
        return _fail(CheckName.KUBERNETES, f"SelfSubjectAccessReview failed ({_one_line(exc)}): check the credentials")
    if denied:
        return _fail(
            CheckName.KUBERNETES,
            f"the ServiceAccount may not {'; '.join(q.label() for q in denied)}: apply {rbac_file} (its Role grants "
            "every request the connector makes)",
        )
    return _pass(CheckName.KUBERNETES, f"all {len(questions)} requests the connector makes are allowed ({rbac_file})")


def _self_subject_access_review() -> Callable[[AccessQuestion], bool]:
    from kubernetes import client as k8s_client

    from planner_core.runtime.connectors.k8s_api import api_client_from_environment

    api = k8s_client.AuthorizationV1Api(api_client_from_environment())

    def review(question: AccessQuestion) -> bool:
        access = question.access
        attributes = k8s_client.V1ResourceAttributes(
            namespace=question.namespace,
            group=access.group,
            resource=access.resource,
            subresource=access.subresource or None,
            verb=access.verb,
            name=question.name or None,
        )
        body = k8s_client.V1SelfSubjectAccessReview(
            spec=k8s_client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
        )
        answer = api.create_self_subject_access_review(body=body, _request_timeout=10)
        return bool(answer.status and answer.status.allowed)

    return review


# --------------------------------------------------------------------------------------------------------
# All of them
# --------------------------------------------------------------------------------------------------------


def run_checks(options: DoctorOptions, settings: RuntimeSettings | None = None) -> tuple[CheckResult, ...]:
    """Every check not in `options.skip`, in order. A check that needs the config is skipped when it failed."""
    settings = settings or RuntimeSettings()
    results: list[CheckResult] = []
    loaded: PlannerFile | None = None

    def wanted(name: CheckName) -> bool:
        return name not in options.skip

    def needs_config(name: CheckName, check: Callable[[PlannerFile], CheckResult]) -> None:
        if not wanted(name):
            return
        if loaded is None:
            results.append(_skip(name, "the config did not load (see above)"))
        else:
            results.append(check(loaded))

    config_result, loaded = check_config(options.config_path)
    if wanted(CheckName.CONFIG):
        results.append(config_result)
    needs_config(CheckName.PERF_MODEL, lambda file: check_perf_model(file, options.config_path))
    if wanted(CheckName.DATABASE):
        results.append(check_database(settings))
    if wanted(CheckName.PREFECT):
        results.append(check_prefect(options.prefect_api_url, options.work_pool, options.timeout_s))
    now = dt.datetime.now(dt.UTC)
    needs_config(
        CheckName.PROMETHEUS,
        lambda file: check_prometheus(
            file, settings, max_age_s=options.max_series_age_s, timeout_s=options.timeout_s, now=now
        ),
    )
    needs_config(CheckName.KUBERNETES, check_kubernetes)
    return tuple(results)


def failed(results: Sequence[CheckResult]) -> bool:
    return any(result.status is CheckStatus.FAIL for result in results)
