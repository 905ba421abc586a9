"""Planner services at the I/O edge: load what a tick needs, run the pure tick, record it in one transaction.

The Prefect flows in `flows/` are thin wrappers over these functions (so is the demo), which keeps the
orchestration layer free of business logic and lets tests call the same code without Prefect.

User plugins (`plugins.enabled`, found through the `llm_planner.plugins` entry-point group) are loaded once per
context (`load_context`) and run in every tick beside the builtin ones; an entry point that failed to load is
recorded as a `plugin_load_failed` step of every tick of that context. The live path hands `tick()` a monotonic
clock, so plugin timeouts and the tick deadline are enforced.

Out-of-process plugins (`scheduling.external_plugins`) are called over gRPC only in live contexts
(`load_context` connects them, `planner_core.runtime.plugin_client`); what they answered is recorded with the
tick's inputs (`TickInputs.remote`), and replay, which builds its context with `context_for_config` alone, reads
those answers and never calls a plugin.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from planner_core.config import (
    EnvironmentKind,
    PlannerConfig,
    PlannerFile,
    ServiceConfig,
    config_hash,
    live_changes,
    load_config,
    managed_components,
    resolve_config_relative,
)
from planner_core.data import DEFAULT_CONFIG
from planner_core.domain import (
    AppliedTargets,
    EventReason,
    Loop,
    PlannerState,
    TickEvent,
    TickInputs,
    TickOutcome,
    TrafficObservation,
    UnplacedRequests,
    WorkerCounts,
)
from planner_core.perf.model import ProfilePerfModel
from planner_core.pipeline import PluginLoadError
from planner_core.planner import Planner, build_planner, refuse_what_cannot_work
from planner_core.policy.events import tick_event
from planner_core.runtime.connectors.local import LocalConnector
from planner_core.runtime.connectors.virtual import VirtualConnector
from planner_core.runtime.ownership import outside_changes
from planner_core.runtime.plugin_client import connect_remote_plugins, take_remote_answers
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.db import session_factory
from planner_core.runtime.store.drains import followed_drains
from planner_core.runtime.store.execution import ExecutionSummary, execute_pending
from planner_core.runtime.store.fpm import latest_fpm
from planner_core.runtime.store.migrate import check_schema_current, upgrade
from planner_core.runtime.store.models import Deployment
from planner_core.runtime.store.partitions import ensure_partitions_ahead, partition_start
from planner_core.runtime.warmup import warm_history

if TYPE_CHECKING:  # the kubernetes client is imported only when a Kubernetes connector is used (~0.4 s)
    from planner_core.runtime.connectors.kubernetes import KubernetesConnector
    from planner_core.runtime.connectors.workloads import WorkloadConnector

log = logging.getLogger(__name__)

# The environments whose connector talks to a cluster: built and validated once, by `connect_cluster`.
CLUSTER_ENVIRONMENTS = (EnvironmentKind.KUBERNETES, EnvironmentKind.KUBERNETES_WORKLOADS)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerContext:
    """Everything a flow run needs that does not change during the run."""

    database_url: str
    deployment: str
    planner: Planner  # the policy with its models and plugins (`build_planner`); what `decide` runs
    service: ServiceConfig = ServiceConfig()  # the service settings of the file (defaults when replaying)
    warmup_trace: Path | None = None  # `load_predictor_warmup_trace`, relative paths taken from the config's folder
    # `environment: kubernetes` (DGD) or `kubernetes-workloads` (Deployments/StatefulSets): built by connect_cluster
    kubernetes: KubernetesConnector | WorkloadConnector | None = None
    local: LocalConnector | None = None  # `environment: local`: built by load_context
    # The newest state this context recorded, kept between its ticks (a cache the tick checks against the database)
    memo: repo.TickMemo = dataclasses.field(default_factory=repo.TickMemo, compare=False)
    config_path: Path | None = None  # the file the policy came from: relative paths in it are taken from its folder
    # The contexts of the live retunes this context's ticks ran (`at_revision`), by config hash: built once each
    revisions: dict[str, PlannerContext] = dataclasses.field(default_factory=dict, compare=False)
    file_config_hash: str = ""  # `config_hash` of the file's policy (`context_for_config` sets it; "" = not known)

    def file_policy_hash(self) -> str:
        """The hash of the config file's policy: what a tick runs unless a live retune is in force."""
        return self.file_config_hash or config_hash(self.config)

    @property
    def config(self) -> PlannerConfig:
        """The policy: what `tick` reads, hashed into every tick's `config_hash`."""
        return self.planner.config

    @property
    def perf(self) -> ProfilePerfModel | None:
        return self.planner.perf

    @property
    def plugin_load_errors(self) -> tuple[PluginLoadError, ...]:
        return self.planner.plugin_load_errors

    @property
    def sessions(self) -> sessionmaker[Session]:
        return session_factory(self.database_url)

    @property
    def connector(self) -> VirtualConnector | KubernetesConnector | WorkloadConnector | LocalConnector:
        """The connector the config's `environment` names.

        `global-planner` has no connector of its own yet and uses the virtual connector, as before.
        """
        environment = self.config.environment
        if environment in CLUSTER_ENVIRONMENTS:
            # each cluster connector's `name` is its environment's value: a mismatch is a wiring mistake
            if self.kubernetes is None or self.kubernetes.name != environment.value:
                raise RuntimeError(f"environment '{environment.value}' needs the connector connect_cluster builds")
            return self.kubernetes
        if environment is EnvironmentKind.LOCAL:
            if self.local is None:
                raise RuntimeError("environment 'local' needs the connector load_context builds")
            return self.local
        return VirtualConnector(timeout_s=self.service.virtual_connector_timeout_seconds)


def resolve_report_dir(service: ServiceConfig, config_path: Path | None, data_dir: Path) -> Path:
    """Where reports go: `report_output_dir` when the config sets it (relative to the config file's folder),
    else `reports/` under the planner's data folder (`PLANNER_DATA_DIR`), never beside a shipped config file."""
    if "report_output_dir" in service.model_fields_set:
        return resolve_config_relative(service.report_output_dir, config_path)
    return data_dir / "reports"


def connect_kubernetes(config: PlannerConfig) -> tuple[KubernetesConnector, PlannerConfig]:
    """The Kubernetes connector for the DGD the environment names, validated, and the effective config.

    The effective config fills what the file leaves unset from the DGD (`model_name`, GPUs per engine).

    Raises:
        KubernetesConnectorError: one line naming the variable, the DGD field or the value at fault.
    """
    from planner_core.runtime.connectors.kubernetes import KubernetesConnector, effective_config

    connector = KubernetesConnector.connect(config)
    return connector, effective_config(config, connector.info)


def connect_cluster(
    loaded: PlannerFile,
) -> tuple[KubernetesConnector | WorkloadConnector | None, PlannerConfig]:
    """The one place a cluster connector is built: the connector the file's `environment` names, validated, and
    the effective config (unset model name and GPUs per engine filled from the cluster); (None, the policy) for
    environments without one.

    Raises:
        KubernetesConnectorError: one line naming the variable, the object, the field or the value at fault.
    """
    config = loaded.policy
    if config.environment is EnvironmentKind.KUBERNETES:
        return connect_kubernetes(config)
    if config.environment is EnvironmentKind.KUBERNETES_WORKLOADS:
        from planner_core.runtime.connectors.workloads import WorkloadConnector

        workloads = loaded.service.kubernetes_workloads
        assert workloads is not None  # PlannerFile's rule: required with this environment
        connector = WorkloadConnector.connect(config, workloads)
        return connector, connector.effective_config(config)
    return None, config


def served_config(config_path: Path | None, settings: RuntimeSettings) -> tuple[str, PlannerFile]:
    """The config `planner serve` runs (the argument, else `PLANNER_CONFIG`, else the recommended policy) as an
    absolute path, loaded and checked: a bad file, or a DGD that cannot be scaled as configured, fails here in one
    line, before the command starts a Prefect server.

    Raises:
        ConfigError, KubernetesConnectorError: one line naming the file (or the DGD), the field and the value.
    """
    path = str((config_path or settings.config or DEFAULT_CONFIG).resolve())
    loaded = load_config(path)
    refuse_what_cannot_work(loaded.policy, Path(path))  # a missing profile, an unreachable SLA: one line, now
    connect_cluster(loaded)
    return path, loaded


def record_config_warnings(database_url: str, deployment: str, warnings: tuple[str, ...]) -> None:
    """Append each start-up warning about the served config (`budget_warnings`) to the audit log as a
    `config_warning` row, so the record says the operator was told, not only the terminal. The deployment's row is
    not created here (its first tick does, under the config the cluster connection makes effective)."""
    if not warnings:
        return
    with session_factory(database_url).begin() as session:
        deployment_id = session.scalar(select(Deployment.id).where(Deployment.name == deployment))
        for warning in warnings:
            repo.audit(
                session, "config_warning", {"deployment": deployment, "warning": warning}, deployment_id=deployment_id
            )


def load_context(database_url: str, deployment: str, config_path: str | Path) -> PlannerContext:
    """Load the config, its profile and the user's plugins. A missing profile leaves `perf` None (the tick says
    model_not_ready).

    With `environment: kubernetes` the parent DGD, with `kubernetes-workloads` the configured workloads, are read
    and validated here (see `connect_cluster`).

    Raises:
        ConfigError: the config file is bad (one line naming file, field and value).
        PluginConfigError: the config's `plugins` section names a plugin that is not installed or does not fit.
        SchemaOutOfDate: the database needs `planner db upgrade`.
        KubernetesConnectorError: the DGD or the workloads cannot be scaled as configured (one line).
    """
    check_schema_current(database_url)
    config_path = Path(config_path)
    loaded = load_config(config_path)
    kubernetes, config = connect_cluster(loaded)
    ctx = context_for_config(
        database_url, deployment, config, config_path, kubernetes=kubernetes, service=loaded.service
    )
    if config.environment is EnvironmentKind.LOCAL:
        local = LocalConnector.from_config(
            config,
            loaded.service.local_workers,
            data_dir=RuntimeSettings().data_dir.resolve(),
            config_dir=config_path.resolve().parent,
        )
        ctx = dataclasses.replace(ctx, local=local)
    return dataclasses.replace(ctx, planner=connect_remote_plugins(ctx.planner))


def context_for_config(
    database_url: str,
    deployment: str,
    config: PlannerConfig,
    config_path: Path | None,
    *,
    profile_dir: Path | None = None,
    kubernetes: KubernetesConnector | WorkloadConnector | None = None,
    service: ServiceConfig | None = None,
) -> PlannerContext:
    """Everything `decide` needs besides inputs and state, built from a config; the planner by `build_planner`,
    the one place that loads models and plugins (the benchmark builds its planners with it too).

    Live ticks (`load_context`) and replay (`planner_core.runtime.replay`, for a recorded or a what-if config) both
    build their context here.

    Args:
        config: the policy.
        config_path: the file the config came from; relative paths in it are taken from its folder.
        profile_dir: use this profile folder instead of the config's `profile_results_dir` (replay only).
        kubernetes: the connected cluster connector (live ticks with `environment: kubernetes` or
            `kubernetes-workloads` only; see `connect_cluster`).
        service: the file's service settings (live ticks); None = the defaults (replay, which runs no service).
    """
    warmup = config.load_predictor_warmup_trace
    return PlannerContext(
        database_url=database_url,
        deployment=deployment,
        planner=build_planner(config, config_path, profile_dir=profile_dir),
        service=service if service is not None else ServiceConfig(),
        # relative paths and globs are anchored at the config file's folder
        warmup_trace=resolve_config_relative(warmup, config_path) if warmup else None,
        kubernetes=kubernetes,
        config_path=config_path,
        file_config_hash=config_hash(config),
    )


def decide(
    ctx: PlannerContext, inputs: TickInputs, state: PlannerState, *, clock: Callable[[], float] | None = None
) -> TickOutcome:
    """The planner's decision for one tick: the only function live ticks and replay call to decide.

    `Planner.decide`, the same call the benchmark makes. Pure given the context (no I/O; `clock`, passed by live
    ticks only, just enforces plugin and tick deadlines): `run_tick` records its outcome, `planner replay`
    compares it with what was recorded. Whatever the decision grows to use (more inputs, more models, plugins)
    belongs in `Planner` / `build_planner`, never in one caller only.
    """
    return ctx.planner.decide(inputs, state, clock=clock)


def initial_state(ctx: PlannerContext) -> PlannerState:
    """The state before a deployment's first tick: empty, or predictors warmed on `load_predictor_warmup_trace`."""
    if ctx.warmup_trace is None:
        return PlannerState()
    return dataclasses.replace(PlannerState(), load_history=warm_history(ctx.config, ctx.warmup_trace))


def prepare_database(database_url: str) -> None:
    """Bring the schema to the newest migration (idempotent); `database_url` is the schema owner's
    (`resolve_owner_database_url`)."""
    upgrade(database_url)


def default_workers(config: PlannerConfig) -> WorkerCounts:
    """Worker counts assumed before the orchestrator ever reported any: the minimum endpoints."""
    prefill, decode = config.prefill_min_endpoint_effective, config.decode_min_endpoint_effective
    return WorkerCounts(ready_prefill=prefill, ready_decode=decode, expected_prefill=prefill, expected_decode=decode)


# An engine publishes forward-pass metrics every iteration while busy; its newest sample older than this many load
# intervals is stale (the engine went idle or away), so the load tick does not act on it.
FPM_MAX_AGE_LOAD_INTERVALS = 3


def fpm_max_age_s(config: PlannerConfig) -> float:
    """How far back a load tick looks for each engine's newest forward-pass metrics (s)."""
    return FPM_MAX_AGE_LOAD_INTERVALS * config.load_adjustment_interval_seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class TickResult:
    """What a tick run did; `tick_id` None means the tick was already recorded and nothing was done."""

    tick_id: int | None
    outcome: TickOutcome | None
    inputs: TickInputs | None


def _post_event(ctx: PlannerContext, event: TickEvent | None, loop: Loop, at: dt.datetime) -> None:
    """Post a tick's Event on the DGD (`environment: kubernetes` only); a failure to post is logged, never raised."""
    post = getattr(ctx.kubernetes, "post_event", None)
    if event is None or post is None:
        return
    try:
        post(event, at, loop=loop.value)
    except Exception as exc:  # an Event is worth a log line, never a failed tick
        log.warning("could not post the %s Event on %s: %s", event.reason.value, ctx.deployment, exc)


def run_tick(
    ctx: PlannerContext,
    loop: Loop,
    scheduled_at: dt.datetime,
    traffic: TrafficObservation | None,
    *,
    flow_run_id: str | None = None,
    task_run_id: str | None = None,
    traffic_problem: str | None = None,
    curve_problem: str | None = None,
    partial_problem: str | None = None,
    gpu_ceiling: int | None = None,
    unplaced: tuple[UnplacedRequests, ...] = (),
) -> TickResult:
    """`record_tick` (its arguments), then the tick's one Event on the scaled object (`planner_core.policy.events`,
    Kubernetes only): a tick that raised posts `DecisionFailed` and raises, a recorded one what it did, if anything."""
    try:
        result = record_tick(
            ctx,
            loop,
            scheduled_at,
            traffic,
            flow_run_id=flow_run_id,
            task_run_id=task_run_id,
            traffic_problem=traffic_problem,
            curve_problem=curve_problem,
            partial_problem=partial_problem,
            gpu_ceiling=gpu_ceiling,
            unplaced=unplaced,
        )
    except Exception as exc:
        failed = TickEvent(reason=EventReason.DECISION_FAILED, message=f"{loop.value} tick: {exc}"[:1024], warning=True)
        _post_event(ctx, failed, loop, scheduled_at)
        raise
    if result.outcome is not None and result.inputs is not None:
        _post_event(ctx, tick_event(result.inputs, result.outcome), loop, scheduled_at)
    return result


def record_tick(
    ctx: PlannerContext,
    loop: Loop,
    scheduled_at: dt.datetime,
    traffic: TrafficObservation | None,
    *,
    flow_run_id: str | None = None,
    task_run_id: str | None = None,
    traffic_problem: str | None = None,
    curve_problem: str | None = None,
    partial_problem: str | None = None,
    gpu_ceiling: int | None = None,
    unplaced: tuple[UnplacedRequests, ...] = (),
) -> TickResult:
    """Run and record one tick in a single transaction; a tick already recorded is skipped, not redone.

    A load tick reads the newest forward-pass metrics per engine from the ingested samples. `traffic_problem`
    (why the source had no observation) and `curve_problem` (why the observation has no prompt-arrival curve)
    and `partial_problem` (what the observation lacks: the window deadline passed before its optional figures were
    read) are written to the audit log with the tick (`traffic_unavailable`, `arrival_curve_unavailable`,
    `traffic_partial`).
    `gpu_ceiling`: a fleet member's ceiling (`TickInputs.gpu_ceiling`, from `planner_core.runtime.fleet`).
    `unplaced`: the requests the edge reported holding (`TickInputs.unplaced`: the wake tick's, from
    `planner_core.runtime.wake`); recorded with the inputs, so replay sees them.
    """
    # The tick's day's partitions and the next day's, each in its own short transaction before the tick's: a
    # dictionary lookup when known, so the tick's own transaction never waits on DDL (store/partitions.py).
    ensure_partitions_ahead(ctx.sessions.kw["bind"], scheduled_at, days_ahead=1)
    file_ctx = ctx
    with ctx.sessions.begin() as session:
        source_path = None if ctx.config_path is None else str(Path(ctx.config_path).resolve())
        locked = repo.lock_deployment_for_tick(
            session, ctx.deployment, ctx.config, loop.value, scheduled_at, ctx.memo, source_path=source_path
        )
        if locked.recorded:
            return TickResult(tick_id=None, outcome=None, inputs=None)
        # the newest revision, read under the deployment's lock: the file's policy, or a live retune of it
        ctx = at_revision(session, file_ctx, locked)
        deployment_id, config_hash = locked.deployment_id, locked.config_hash
        previous_tick_id, state, inputs, workers_problem = _tick_inputs(
            session, ctx, deployment_id, loop, scheduled_at, traffic, gpu_ceiling=gpu_ceiling
        )
        if unplaced:
            inputs = dataclasses.replace(inputs, unplaced=unplaced)
        take_remote_answers(ctx.planner)  # nothing left over from a tick that failed before being recorded
        started = time.perf_counter()
        # The monotonic clock only enforces plugin timeouts and the tick deadline; the tick's time is `now_s`.
        outcome = decide(ctx, inputs, state, clock=time.monotonic)
        decide_ms = (time.perf_counter() - started) * 1000.0
        # What the out-of-process plugins answered is part of what the tick saw: replay reads it from the record.
        # The observation is stored with the curve the tick derived from its recorded arrivals (the traffic
        # columns and reports read it); replay derives it again from the arrivals, under the config it replays.
        inputs = dataclasses.replace(
            inputs,
            remote=take_remote_answers(ctx.planner),
            traffic=None if traffic is None else ctx.planner.traffic_features(traffic),
        )
        if ctx.plugin_load_errors:
            # A plugin that could not be loaded did not run in this tick either: say so first in its explanation.
            load_steps = tuple(error.as_step() for error in ctx.plugin_load_errors)
            outcome = dataclasses.replace(outcome, steps=(*load_steps, *outcome.steps))
        tick_id = repo.record_tick(
            session,
            repo.TickRecord(
                deployment_id=deployment_id,
                scheduled_at=scheduled_at,
                config_hash=config_hash,
                predictor=ctx.config.load_predictor.value,
                previous_tick_id=previous_tick_id,
                decide_ms=decide_ms,
                flow_run_id=flow_run_id,
                task_run_id=task_run_id,
                config_revision=locked.revision,
            ),
            inputs,
            outcome,
        )
        if tick_id is not None:
            ctx.memo.remember(session, tick_id)
        for event, problem in (
            ("traffic_unavailable", traffic_problem),
            ("arrival_curve_unavailable", curve_problem),
            ("traffic_partial", partial_problem),
            ("worker_counts_unavailable", workers_problem),
        ):
            if problem is not None and tick_id is not None:
                detail = {"loop": loop.value, "problem": problem}
                repo.audit(session, event, detail, deployment_id=deployment_id, tick_id=tick_id)
    return TickResult(tick_id=tick_id, outcome=outcome, inputs=inputs)


def at_revision(session: Session, ctx: PlannerContext, locked: repo.LockedDeployment) -> PlannerContext:
    """The context a tick runs under: `ctx` (its config file's) when the revision in force is that file's policy,
    else the same context deciding with the revision's policy (a live retune, built once per revision and kept in
    `ctx.revisions`: the engine model and the connectors are the file's, which no live field changes).

    Raises:
        ConfigError: the revision's stored policy does not parse, does not hash to its key, or changes a field that
            cannot change live (a revision written in SQL past `planner config set`'s checks); one line naming the
            deployment, the revision and the field. The tick fails and records nothing.
    """
    if locked.config_hash == ctx.file_policy_hash():
        return ctx
    cached = ctx.revisions.get(locked.config_hash)
    if cached is not None:
        return cached
    source = f"deployment {ctx.deployment!r}: config revision {locked.revision}"
    policy = repo.stored_policy(session, locked.config_hash, source)
    live_changes(ctx.config, policy, source)
    planner = connect_remote_plugins(build_planner(policy, ctx.config_path, perf=ctx.perf))
    run = dataclasses.replace(ctx, planner=planner)
    ctx.revisions[locked.config_hash] = run
    return run


def _tick_inputs(
    session: Session,
    ctx: PlannerContext,
    deployment_id: int,
    loop: Loop,
    scheduled_at: dt.datetime,
    traffic: TrafficObservation | None,
    *,
    gpu_ceiling: int | None,
) -> tuple[int | None, PlannerState, TickInputs, str | None]:
    """What a tick decides on, read in its transaction: the worker counts, a load tick's newest forward-pass
    metrics (a throughput tick's too under the closed loop), the previous tick's state (or a warm start), the
    decisions applied since and the pools someone else scaled; (the previous tick's id, the state, the inputs,
    why the worker counts could not be read or None)."""
    workers, workers_problem = _worker_counts(session, ctx, deployment_id)
    outside = ()
    if workers_problem is None and ctx.config.environment in CLUSTER_ENVIRONMENTS:
        outside = outside_changes(session, deployment_id, workers, managed_components(ctx.config.mode))
    fpm = ()
    if loop is Loop.LOAD or ctx.config.throughput_capacity_feedback:  # the closed loop measures engine speed on them
        since = scheduled_at - dt.timedelta(seconds=fpm_max_age_s(ctx.config))
        fpm = latest_fpm(session, deployment_id, since, until=scheduled_at)
    # the previous tick is normally today's or yesterday's: read those partitions first (store/repository.py)
    states_since = partition_start(scheduled_at) - dt.timedelta(days=1)
    previous_tick_id, state = repo.latest_state(session, deployment_id, since=states_since, memo=ctx.memo)
    if previous_tick_id is None and ctx.warmup_trace is not None:
        state = _warm_started(session, deployment_id, ctx)
    inputs = TickInputs(
        now_s=scheduled_at.timestamp(),
        loop=loop,
        workers=workers,
        traffic=traffic,
        fpm=fpm,
        gpu_ceiling=gpu_ceiling,
        applied=_applied_since_pending(session, deployment_id, state, scheduled_at),
        outside_changes=outside,
        workers_observed=workers_problem is None,
    )
    return previous_tick_id, state, inputs, workers_problem


def _worker_counts(session: Session, ctx: PlannerContext, deployment_id: int) -> tuple[WorkerCounts, str | None]:
    """The connector's worker counts, or, when a cluster's API cannot be read, the minimum endpoints as a stand-in
    and why (the tick then changes no pool: `TickInputs.workers_observed`, `planner_core.policy.signals`)."""
    default = default_workers(ctx.config)
    if ctx.config.environment not in CLUSTER_ENVIRONMENTS:
        return ctx.connector.worker_counts(session, deployment_id, default=default), None
    from planner_core.runtime.connectors.k8s_api import KubernetesApiError, KubernetesConnectorError

    try:
        return ctx.connector.worker_counts(session, deployment_id, default=default), None
    except (KubernetesApiError, KubernetesConnectorError) as exc:
        return default, str(exc)


def _applied_since_pending(
    session: Session, deployment_id: int, state: PlannerState, scheduled_at: dt.datetime
) -> tuple[AppliedTargets, ...]:
    """The decisions applied since the oldest scale-up the state waits to see ready (none pending: nothing)."""
    if not state.startup.pending:
        return ()
    oldest_s = min(scale_up.at_s for scale_up in state.startup.pending)
    return repo.applied_decisions(session, deployment_id, repo.epoch_to_datetime(oldest_s), scheduled_at)


def _warm_started(session: Session, deployment_id: int, ctx: PlannerContext) -> PlannerState:
    """The first tick of a deployment starts from predictors warmed on `load_predictor_warmup_trace` (audited)."""
    state = initial_state(ctx)
    repo.audit(
        session,
        "predictor_warm_start",
        {"trace": str(ctx.warmup_trace), "num_windows": len(state.load_history.num_req)},
        deployment_id=deployment_id,
    )
    return state


def run_execution(ctx: PlannerContext, now: dt.datetime) -> list[ExecutionSummary]:
    """Apply the deployment's newest pending decision through its connector (one transaction).

    The local connector first reconciles its processes with the sizes in force (dead workers replaced, drains
    finished, a reached decision acknowledged) and, before the deployment's first decision, starts the minimum
    endpoints. The Kubernetes connector first follows the pods its scale-downs handed over (`_follow_drains`).
    """
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, ctx.deployment)
        if deployment is None:
            if ctx.local is None:
                return []
            deployment = repo.ensure_deployment(session, ctx.deployment, ctx.config)
        connector = ctx.connector
        if isinstance(connector, LocalConnector):
            repo.lock_deployment(session, deployment.id)
            connector.ensure_started(session, deployment.id, default_workers(ctx.config), now)
            connector.reconcile(session, deployment.id, now)
        elif ctx.config.environment is EnvironmentKind.KUBERNETES:
            repo.lock_deployment(session, deployment.id)
            _follow_drains(session, ctx, deployment.id, now)
        return execute_pending(session, deployment.id, connector, now)


def _follow_drains(session: Session, ctx: PlannerContext, deployment_id: int, now: dt.datetime) -> None:
    """The Kubernetes connector's drains followed to their end (`KubernetesConnector.follow_drains`), each line
    logged. The pods cannot be listed: logged, and the drains stay as they were for the next execution run; a
    decision is applied all the same."""
    from planner_core.runtime.connectors.k8s_api import KubernetesApiError

    try:
        with session.begin_nested():
            notes = ctx.connector.follow_drains(session, deployment_id, now)
    except KubernetesApiError as exc:
        log.warning("deployment %s: cannot follow its drains this run: %s", ctx.deployment, exc)
        return
    for note in notes:
        log.info("deployment %s: drain of %s", ctx.deployment, note)


def drains_followed(ctx: PlannerContext) -> list[str]:
    """The engines whose drain the connector still follows (handed over, not ended): while there are any, the
    execution runs again at the retry cadence to see them end (`flows/serve.py`). Only the Kubernetes connector
    hands drains over."""
    if ctx.config.environment is not EnvironmentKind.KUBERNETES:
        return []
    with ctx.sessions.begin() as session:
        deployment = repo.find_deployment(session, ctx.deployment)
        if deployment is None:
            return []
        return [d.engine for d in followed_drains(session, deployment.id, ctx.connector.name, lock=False)]
