"""`ServiceConfig`, the service settings (how the service runs around the decision, never what it decides), their
sections (Kubernetes workloads, local workers, the fleet share), and `PlannerFile`, one file split into the policy
and the service settings.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner_core.config.enums import EnvironmentKind, PlannerMode, WorkloadKind
from planner_core.config.errors import Violation, _raise_rules, _rule
from planner_core.config.limits import _GPUS, _HOURS, _INTERVAL, _MAGNITUDE, _PORT, _PRIORITY, Number, Whole
from planner_core.config.policy import PlannerConfig
from planner_core.domain import Component

MAX_LOCAL_WORKERS = 256
"""Most local worker processes a pool starts with: each is a process on this one machine."""


class WorkloadRef(BaseModel):
    """One plain Kubernetes workload that serves a role: its kind, and its name or a label selector.

    Exactly one of `name` and `selector` is set (checked by `KubernetesWorkloadsConfig`, which knows the field's
    path for the error message); a selector must match exactly one workload of the kind when it is used.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: WorkloadKind = Field(description="Workload kind: Deployment or StatefulSet.")
    name: str | None = Field(default=None, min_length=1, description="Workload name; or set selector instead.")
    selector: dict[str, str] | None = Field(
        default=None, description="Labels the one workload carries (matchLabels); or set name instead."
    )
    namespace: str | None = Field(
        default=None, min_length=1, description="Namespace of the workload; None = kubernetes_workloads.namespace."
    )

    @property
    def label_selector(self) -> str | None:
        """The selector as the API's `labelSelector` query (`k=v,...`, sorted), or None when found by name."""
        if self.selector is None:
            return None
        return ",".join(f"{key}={value}" for key, value in sorted(self.selector.items()))


class KubernetesWorkloadsConfig(BaseModel):
    """The workloads `environment: kubernetes-workloads` scales, one per role the mode manages.

    `disagg` needs `prefill` and `decode`, `prefill` and `decode` modes the one pool they manage, `agg` the one
    `aggregated` workload (the planner's decode role). The namespace of a workload: its own `namespace`, else
    `namespace` here, else `PLANNER_K8S_NAMESPACE` / the pod's namespace.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    namespace: str | None = Field(
        default=None,
        min_length=1,
        description="Namespace of the workloads; None = PLANNER_K8S_NAMESPACE, else the pod's.",
    )
    prefill: WorkloadRef | None = Field(default=None, description="The prefill workload (modes disagg and prefill).")
    decode: WorkloadRef | None = Field(default=None, description="The decode workload (modes disagg and decode).")
    aggregated: WorkloadRef | None = Field(default=None, description="The aggregated workload (mode agg).")

    @model_validator(mode="after")
    def _name_or_selector(self) -> KubernetesWorkloadsConfig:
        violations: list[Violation] = []
        for role in ("prefill", "decode", "aggregated"):
            ref: WorkloadRef | None = getattr(self, role)
            if ref is None:
                continue
            where = f"kubernetes_workloads.{role}"
            if ref.name is None and ref.selector is None:
                violations.append(_rule(f"{where}.name", None, "set name or selector"))
            elif ref.name is not None and ref.selector is not None:
                violations.append(_rule(f"{where}.selector", ref.selector, "set name or selector, not both"))
            elif ref.selector is not None:
                if not ref.selector:
                    violations.append(_rule(f"{where}.selector", ref.selector, "needs at least one label"))
                for key, value in ref.selector.items():
                    # `,` and `=` would change the meaning of the labelSelector query built from them
                    if not key or any(c in key + value for c in ",=! "):
                        violations.append(
                            _rule(f"{where}.selector.{key}", value, "label keys and values cannot hold , = ! or spaces")
                        )
        _raise_rules(violations)
        return self

    def roles(self) -> tuple[tuple[Component, str, WorkloadRef], ...]:
        """(planner role, config key, workload) for each workload set; `aggregated` is the decode role."""
        keyed = ((Component.PREFILL, "prefill"), (Component.DECODE, "decode"), (Component.DECODE, "aggregated"))
        return tuple((role, key, getattr(self, key)) for role, key in keyed if getattr(self, key) is not None)


# Dynamo's mocker engine (`python -m dynamo.mocker`), the default worker command of `environment: local`: file
# discovery and the TCP request plane, so it needs no etcd or NATS; its timing comes from a planner profile.
MOCKER_COMMAND = (
    "${DYNAMO_PYTHON}", "-m", "dynamo.mocker",
    "--model-path", "${PLANNER_LOCAL_MODEL_DIR}", "--model-name", "${PLANNER_LOCAL_MODEL_NAME}",
    "--discovery-backend", "file", "--request-plane", "tcp",
    "--disaggregation-mode", "${DISAGGREGATION_MODE}",
    "--planner-profile-data", "${PLANNER_LOCAL_PROFILE_DIR}",
)  # fmt: skip


class FleetShareConfig(BaseModel):
    """This deployment's share of the fleet's GPU budget, for `planner deployments sync FOLDER` (which registers every
    config file of a folder; `planner deployments add` takes the same values as options)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="The managed deployment's name; None = the file's name without its suffix.",
    )
    min_gpus: Whole = Field(default=0, ge=0, **_GPUS, description="GPUs it always keeps, over budget or not.")
    max_gpus: Whole | None = Field(default=None, ge=0, **_GPUS, description="GPUs it may never exceed; None = no cap.")
    priority: Whole = Field(default=0, **_PRIORITY, description="Higher is served first when over budget.")
    weight: Number = Field(default=1.0, gt=0, **_MAGNITUDE, description="Its share within its priority.")

    @model_validator(mode="after")
    def _max_not_below_min(self) -> FleetShareConfig:
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")
        return self


class LocalWorkersConfig(BaseModel):
    """How `environment: local` runs engine processes on this machine: one command template per role.

    A template is an argument list; `${NAME}` in it is replaced by the worker's `ROLE` (prefill or decode),
    `DISAGGREGATION_MODE` (prefill, decode, or agg in mode agg), `WORKER_ID` (the row id), `METRICS_PORT` (with
    `metrics_targets_file`: the worker's metrics port), else by `env` here, else
    by the environment (a name found nowhere is an error naming the field).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    prefill_command: tuple[str, ...] = Field(
        default=MOCKER_COMMAND,
        min_length=1,
        description="Argument list starting a prefill worker (the mocker by default).",
    )
    decode_command: tuple[str, ...] = Field(
        default=MOCKER_COMMAND,
        min_length=1,
        description="Argument list starting a decode (in mode agg: aggregated) worker (the mocker by default).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables of every worker.")
    discovery_dir: str | None = Field(
        default=None,
        description=(
            "Dynamo's file discovery store (DYN_FILE_KV): a worker is ready once it registered there; "
            "None = DYN_FILE_KV, and when that is unset too a running worker counts as ready."
        ),
    )
    log_dir: str | None = Field(
        default=None, description="Folder of the workers' log files; None = local-workers/ in the data folder."
    )
    drain_grace_seconds: Number = Field(
        **_INTERVAL, default=30.0, ge=0, description="Seconds a draining worker has after SIGTERM before SIGKILL."
    )
    metrics_targets_file: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Prometheus file-discovery targets file listing the running workers' metrics ports (each worker gets a "
            "free port as DYN_SYSTEM_PORT and ${METRICS_PORT}; labels role and local_worker); relative to the "
            "config file's folder. None = workers get no metrics port."
        ),
    )
    nice: Whole = Field(default=0, ge=0, le=19, description="Niceness the workers run at (0 = as the planner).")
    initial_prefill: Whole | None = Field(
        default=None,
        ge=0,
        le=MAX_LOCAL_WORKERS,
        description=(
            "Prefill workers started before the first decision (the deployment as it runs when the planner takes "
            "over); None = the minimum endpoints."
        ),
    )
    initial_decode: Whole | None = Field(
        default=None,
        ge=0,
        le=MAX_LOCAL_WORKERS,
        description="Decode (in mode agg: aggregated) workers started before the first decision; None = the minimum.",
    )

    def command(self, role: Component) -> tuple[str, ...]:
        return self.prefill_command if role is Component.PREFILL else self.decode_command


# The workload keys each mode needs (the others must be unset: a workload the planner ignores is a slip).
_WORKLOAD_KEYS: dict[PlannerMode, tuple[str, ...]] = {
    PlannerMode.DISAGG: ("prefill", "decode"),
    PlannerMode.PREFILL: ("prefill",),
    PlannerMode.DECODE: ("decode",),
    PlannerMode.AGG: ("aggregated",),
}


class ServiceConfig(BaseModel):
    """How the service runs around the decision: metrics endpoints, ports, reports, execution cadence.

    Read only by `planner_core.runtime` and `flows`; never by `tick`. Not hashed: moving the report folder or a
    port leaves `config_hash` (the policy identity stored with every tick) unchanged. The fields sit at the top
    level of the same Dynamo-style file as the policy's (see `PlannerFile`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # --- Dynamo fields ---------------------------------------------------------------------------------
    log_dir: str | None = Field(
        default=None, description="Folder for log files (Dynamo field, kept for compatibility)."
    )
    # Dynamo reads PROMETHEUS_ENDPOINT / PLANNER_PROMETHEUS_PORT for these; here they are plain values.
    metric_pulling_prometheus_endpoint: str | None = Field(
        default=None, description="Prometheus URL traffic is read from; None = PLANNER_PROMETHEUS_ENDPOINT."
    )
    metric_reporting_prometheus_port: Whole = Field(
        default=0, **_PORT, description="TCP port the planner's own Prometheus metrics are served on; 0 = off."
    )
    control_api_port: Whole = Field(default=9086, **_PORT, description="TCP port of the control API; 0 = off.")
    report_interval_hours: Number | None = Field(
        **_HOURS, default=24.0, gt=0, description="Hours between two periodic reports; None = no periodic report."
    )
    report_output_dir: str = Field(
        default="./planner_reports",
        description="Folder reports are written to, relative to the config file; unset = reports/ in the data folder.",
    )
    report_filename: str | None = Field(default=None, description="File name of the periodic report; None = dated.")
    report_write_gzip_log: bool = Field(default=True, description="Write the gzipped tick log beside each report.")
    live_dashboard_port: Whole = Field(default=8080, **_PORT, description="TCP port of the live dashboard; 0 = off.")
    # Not supported yet: accepted as an opaque mapping only so that Dynamo configuration files load.
    plugin_registration: dict[str, Any] | None = Field(
        default=None, description="Dynamo's plugin-registration settings; accepted, not used."
    )

    # --- ours ------------------------------------------------------------------------------------------
    # Where decisions go, not what they are: a service setting, so naming the workloads leaves config_hash alone.
    kubernetes_workloads: KubernetesWorkloadsConfig | None = Field(
        default=None,
        description="For environment kubernetes-workloads: the Deployment/StatefulSet of each role (name or selector).",
    )
    local_workers: LocalWorkersConfig | None = Field(
        default=None,
        description="For environment local: the command of each role's engine process (the mocker by default).",
    )
    fleet: FleetShareConfig | None = Field(
        default=None,
        description="Its name and share of the GPU budget when a fleet registers it from a folder of config files.",
    )
    # 10 s matches the check interval of Dynamo's virtual connector (SCALING_CHECK_INTERVAL).
    execution_interval_seconds: Number = Field(
        **_INTERVAL,
        default=10.0,
        gt=0,
        description=(
            "Seconds between two execution runs while a decision is still pending after an attempt (blocked or "
            "failed), and, with environment local, between two reconciliations of the worker processes."
        ),
    )
    # A decision is executed when its tick's NOTIFY arrives; this poll only catches one that was missed (listener
    # restarted, connection lost), so it can be slow.
    execution_fallback_poll_seconds: Number = Field(
        **_INTERVAL,
        default=60.0,
        gt=0,
        description="Seconds between two execution runs when no notification arrives (the listener's safety net).",
    )
    # Dynamo's SCALING_MAX_WAIT_TIME.
    virtual_connector_timeout_seconds: Number = Field(
        **_INTERVAL,
        default=1800.0,
        gt=0,
        description="Seconds an unacknowledged virtual-connector decision blocks newer ones.",
    )
    # 1 s: the curve's intervals of 1 s and more are seen, and a 60 s window plus the 30 s look-back is ~90 points
    # per series. Finer than the frontend's scrape interval, a scrape's increment lands in one step and the short
    # intervals overstate the bursts (docs/operations.md, "The prompt-arrival curve").
    prometheus_arrival_resolution_seconds: Number = Field(
        **_INTERVAL,
        default=1.0,
        gt=0,
        description=(
            "Step (s) of the Prometheus range queries the prompt-arrival curve is rebuilt from; the curve's "
            "intervals shorter than it are left out. Keep the frontend's scrape interval at most this."
        ),
    )


class PlannerFile(BaseModel):
    """One planner configuration file, split: the hashed `policy` and the unhashed `service` settings.

    Built only by `parse_config` / `load_config` from the flat Dynamo-style mapping; the split is by field name.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: PlannerConfig
    service: ServiceConfig = Field(default_factory=ServiceConfig)

    @model_validator(mode="after")
    def _workloads_match_environment_and_mode(self) -> PlannerFile:
        """`kubernetes_workloads` (a service setting) is required by, and only used with, that environment."""
        workloads = self.service.kubernetes_workloads
        environment, mode = self.policy.environment, self.policy.mode
        violations: list[Violation] = []
        if environment is EnvironmentKind.KUBERNETES_WORKLOADS:
            if workloads is None:
                violations.append(
                    _rule("kubernetes_workloads", None, "required when environment='kubernetes-workloads'")
                )
            else:
                needed = _WORKLOAD_KEYS[mode]
                for key in ("prefill", "decode", "aggregated"):
                    value = getattr(workloads, key)
                    if key in needed and value is None:
                        violations.append(
                            _rule(f"kubernetes_workloads.{key}", None, f"required when mode='{mode.value}'")
                        )
                    elif key not in needed and value is not None:
                        violations.append(
                            _rule(
                                f"kubernetes_workloads.{key}",
                                value.name or value.selector,
                                f"not used when mode='{mode.value}' (set {' and '.join(needed)})",
                            )
                        )
        elif workloads is not None:
            violations.append(
                _rule("environment", environment, "must be 'kubernetes-workloads' when kubernetes_workloads is set")
            )
        if self.service.local_workers is not None and environment is not EnvironmentKind.LOCAL:
            violations.append(_rule("environment", environment, "must be 'local' when local_workers is set"))
        _raise_rules(violations)
        return self
