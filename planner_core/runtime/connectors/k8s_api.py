"""The Kubernetes API edge the connectors share (`kubernetes` for a DynamoGraphDeployment, `workloads` for plain
workloads): settings from the environment, the API client, the errors, and retries with bounded exponential
backoff on conflicts, 429, 5xx and connection errors."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiAccess:
    """One kind of request a connector makes, as RBAC names it: the API group, the resource (and subresource) and
    the verb. Each connector lists the ones it makes (`REQUIRED_ACCESS`); its Role grants exactly these
    (tests/runtime/test_*_connector.py compare both with the requests the emulated API server logged) and
    `planner doctor` asks the API server whether the planner's ServiceAccount has each."""

    group: str
    resource: str
    verb: str
    subresource: str = ""

    @property
    def rbac_resource(self) -> str:
        """The resource as a Role's rule names it (`deployments/scale`)."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


class KubernetesConnectorError(ValueError):
    """A start-up or configuration problem; the message is one line naming the object, field and value."""


class KubernetesApiError(RuntimeError):
    """The API server refused a request or kept failing after the retries (one line, with every try)."""


# --------------------------------------------------------------------------------------------------------
# Settings (environment)
# --------------------------------------------------------------------------------------------------------


class KubernetesSettings(BaseSettings):
    """Where the connector finds the DGD and how hard it retries, from the environment."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    parent_dgd_name: str | None = Field(default=None, validation_alias="DYN_PARENT_DGD_K8S_NAME")
    namespace: str | None = Field(
        default=None, validation_alias=AliasChoices("PLANNER_K8S_NAMESPACE", "POD_NAMESPACE")
    )  # unset: the pod's service-account namespace, else "default"
    api_version: str = Field(default="v1beta1", validation_alias="PLANNER_K8S_API_VERSION")
    prefill_component: str | None = Field(default=None, validation_alias="PLANNER_K8S_PREFILL_COMPONENT")
    decode_component: str | None = Field(default=None, validation_alias="PLANNER_K8S_DECODE_COMPONENT")
    max_tries: int = Field(default=4, ge=1, le=20, validation_alias="PLANNER_K8S_MAX_TRIES")
    backoff_s: float = Field(default=0.5, ge=0, le=60, validation_alias="PLANNER_K8S_BACKOFF_S")
    max_backoff_s: float = Field(default=4.0, ge=0, le=300, validation_alias="PLANNER_K8S_MAX_BACKOFF_S")
    request_timeout_s: float = Field(default=10.0, gt=0, le=300, validation_alias="PLANNER_K8S_REQUEST_TIMEOUT_S")


def load_settings() -> KubernetesSettings:
    """Read `KubernetesSettings` from the environment; a bad value is one line naming the variable."""
    try:
        return KubernetesSettings()
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        alias = (
            KubernetesSettings.model_fields[field].validation_alias
            if field in KubernetesSettings.model_fields
            else None
        )
        names = alias.choices if isinstance(alias, AliasChoices) else [alias or field]
        raise KubernetesConnectorError(
            f"environment variable {'/'.join(str(n) for n in names)} = {error.get('input')!r}: {error['msg']}"
        ) from None


def resolve_namespace(settings: KubernetesSettings, service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str:
    """The DGD's namespace: the setting, else the pod's own namespace (in a cluster), else "default"."""
    if settings.namespace:
        return settings.namespace
    if service_account_file.is_file():
        return service_account_file.read_text().strip() or "default"
    return "default"


def api_client_from_environment() -> k8s_client.ApiClient:
    """An API client from the in-cluster service account, else from the kubeconfig (`KUBECONFIG`)."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except ConfigException as in_cluster_error:
        try:
            # KUBECONFIG is read now, not at import time (the client's default is frozen when it is imported)
            k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
        except (ConfigException, OSError) as kubeconfig_error:
            raise KubernetesConnectorError(
                f"no Kubernetes credentials: not in a cluster ({in_cluster_error}) and no usable kubeconfig "
                f"({kubeconfig_error})"
            ) from None
    # Our own loop retries with backoff and records each try; urllib3's silent retries would hide them.
    configuration.retries = 0
    return k8s_client.ApiClient(configuration)


# --------------------------------------------------------------------------------------------------------
# Retries
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Bounded exponential backoff: wait `backoff_s * 2**(n-1)` (at most `max_backoff_s`) after failure n.

    With the defaults (4 tries, 0.5 s, 4 s) a request that keeps failing waits 0.5 + 1 + 2 = 3.5 s in total.
    """

    max_tries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 4.0

    def delay_s(self, num_failures: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (num_failures - 1))


def _reason(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason or ''}".strip()


def transient_reason(exc: BaseException, *, conflict_statuses: frozenset[int] = frozenset({409})) -> str | None:
    """A short description if retrying may succeed (conflict, throttling, 5xx, connection), else None."""
    if isinstance(exc, ApiException):
        if exc.status in conflict_statuses or exc.status in TRANSIENT_STATUSES:
            return _reason(exc)
        if exc.status == 0:  # the client reports some transport failures with status 0
            return f"connection error ({exc.reason})"
        return None
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError):
        return f"connection error ({type(exc).__name__})"
    return None


def api_error_hint(exc: ApiException, rbac_file: str) -> str:
    """What a refused request most likely means, for the one-line error (403: the Role in `rbac_file`)."""
    if exc.status == 403:
        return f" (the planner's ServiceAccount lacks this permission: see {rbac_file})"
    if exc.status == 404:
        return " (not found)"
    return ""


def with_retries(
    what: str,
    attempt: Callable[[], T],
    trail: list[str],
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None],
    conflict_statuses: frozenset[int] = frozenset({409}),
    passthrough: tuple[type[BaseException], ...] = (),
    rbac_file: str = "infra/k8s/dgd/planner-rbac.yaml",
) -> T:
    """Run `attempt` (a read, or a read-compare-write) until it succeeds or the tries run out.

    Each failed try is appended to `trail` ("what: 409 Conflict"); the waits follow `retry`. Exceptions of a
    `passthrough` type are the caller's own signals and are re-raised at once.

    Raises:
        KubernetesApiError: a non-transient API error, or the tries ran out (one line listing every try).
    """
    num_failures = 0
    while True:
        try:
            return attempt()
        except passthrough:
            raise
        except Exception as exc:  # classified below; anything else is re-raised as is
            reason = transient_reason(exc, conflict_statuses=conflict_statuses)
            if reason is None:
                if isinstance(exc, ApiException):
                    raise KubernetesApiError(f"{what}: {_reason(exc)}{api_error_hint(exc, rbac_file)}") from None
                raise
            num_failures += 1
            trail.append(f"{what}: {reason}")
            if num_failures >= retry.max_tries:
                raise KubernetesApiError(
                    f"{what}: gave up after {num_failures} tries ({'; '.join(trail[-num_failures:])})"
                ) from None
            sleep(retry.delay_s(num_failures))
