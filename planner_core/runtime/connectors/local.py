"""The local connector (`environment: local`): engine processes on the planner's machine, started and stopped by it.

Each role's workers are started from a command template (`local_workers` in the config; Dynamo's mocker by
default) as detached processes (their own session: they outlive the short-lived flow run that started them) and
kept in `local_workers`, one row each, with the pid and the process start time read from `/proc` (a recycled pid
never matches it). Nothing is held in memory: a planner started later finds the rows, checks the processes and
adopts the ones still running.

- **Ready vs expected.** A worker is ready once it registered with the frontend: Dynamo's file discovery store
  (`DYN_FILE_KV`) holds an `instances` entry for its `generate` endpoint whose TCP port the worker's process
  listens on. Without a store a running worker counts as ready. Expected = the sizes in force
  (`local_connector_state`: the last applied decision's targets, or the minimum endpoints).
- **Scale-up** starts the missing workers; **scale-down** drains the surplus, not-yet-ready first, then the least
  loaded (its in-flight requests from its newest forward-pass sample, the engine found by the discovery entries
  of the ports its process listens on; unknown loads last, newest first among equals): SIGTERM to the worker's
  process group, which makes Dynamo's runtime deregister the engine (the frontend stops routing to it) and exit once
  its in-flight requests end; SIGKILL once `drain_grace_seconds` have passed. Each drain is a `drains` row: the
  requests in flight at the start (waited for) and those still in flight at a SIGKILL (cut).
- **Reconcile** (every execution run, `reconcile()`): a worker that exited while it should serve is marked
  `died`, reported and replaced; drains are finished; a decision whose targets are all ready and whose drains are
  done is acknowledged. What it did is an `executions` row (`reconciled`) of the decision in force, and every
  start, signal and death an `audit_log` row.

The pure parts (the plan of one pool, command templates) are module functions without I/O; the connector class
does the I/O. Finding the processes and their registrations (`/proc`, the discovery store) is `local_procs`; the
workers' Prometheus targets file (`local_workers.metrics_targets_file`) is `local_metrics`.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import string
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from planner_core.config import LocalWorkersConfig, PlannerConfig, PlannerMode, managed_components
from planner_core.domain import Component, WorkerCounts
from planner_core.runtime.connectors.local_metrics import (
    METRICS_PORT_ENV,
    ScrapeWorker,
    free_metrics_port,
    scrape_targets,
    write_scrape_targets,
)
from planner_core.runtime.connectors.local_procs import (
    discovery_instances,
    discovery_ports,
    listening_ports,
    process_start_ticks,
)
from planner_core.runtime.engine_load import engine_in_flight, in_flight_by_worker
from planner_core.runtime.store import repository as repo
from planner_core.runtime.store.drains import DrainStart, close_drain, open_drain, open_local_drain
from planner_core.runtime.store.models import (
    DecisionRow,
    DecisionStatus,
    DrainEndReason,
    DrainOutcome,
    ExecutionOutcome,
    ExecutionRow,
    LocalConnectorStateRow,
    LocalWorkerRow,
    LocalWorkerStatus,
)

LIVE_STATUSES = (LocalWorkerStatus.STARTING, LocalWorkerStatus.READY)  # serving, or about to
RUNNING_STATUSES = (*LIVE_STATUSES, LocalWorkerStatus.DRAINING)  # a process is expected to exist
# A role whose workers keep dying before they ever get ready (a bad command, a missing model folder) is restarted
# after 1, 2, 4, ... s, at most this long apart: a crash loop otherwise restarts it on every execution run
RESTART_BACKOFF_MAX_S = 60.0


class LocalConnectorError(ValueError):
    """A local worker cannot be started as configured (one line naming the field and the value)."""


# --------------------------------------------------------------------------------------------------------
# Pure parts
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerView:
    """What the plan needs of one worker: its id, whether it serves yet, whether it is still live, and its requests
    in flight (None: unknown)."""

    worker_id: int
    status: LocalWorkerStatus
    num_in_flight: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPlan:
    """How to bring one pool to its target: start `num_start` workers, drain the workers `drain` (ids)."""

    role: Component
    target: int
    num_live: int
    num_start: int = 0
    drain: tuple[int, ...] = ()

    @property
    def changes(self) -> bool:
        return self.num_start > 0 or bool(self.drain)


def plan_pool(role: Component, workers: Iterable[WorkerView], target: int) -> PoolPlan:
    """Start what is missing, or drain the surplus: workers not ready yet first (they serve nothing), then the least
    loaded (fewest requests in flight: the drain waits for fewer, and cuts fewer if the grace ends), those of unknown
    load last (they may be busy), the newest first among equals (the oldest have the warmest caches). Draining
    workers are not live: they never count towards the target, so a scale-up during a drain starts new workers
    rather than waiting for the old ones to go."""
    if target < 0:
        raise ValueError(f"target of {role.value} = {target}: must be >= 0")
    live = [w for w in workers if w.status in LIVE_STATUSES]
    if len(live) < target:
        return PoolPlan(role=role, target=target, num_live=len(live), num_start=target - len(live))
    surplus = len(live) - target
    order = sorted(
        live,
        key=lambda w: (
            w.status is LocalWorkerStatus.READY,
            w.num_in_flight is None,
            w.num_in_flight or 0,
            -w.worker_id,
        ),
    )
    return PoolPlan(role=role, target=target, num_live=len(live), drain=tuple(w.worker_id for w in order[:surplus]))


def restart_delay_s(num_failed_starts: int) -> float:
    """How long to wait before starting a role's next worker after `num_failed_starts` of its workers in a row died
    before ever getting ready: 0 after none, then 1, 2, 4, ... s, at most `RESTART_BACKOFF_MAX_S`."""
    if num_failed_starts <= 0:
        return 0.0
    return min(RESTART_BACKOFF_MAX_S, 2.0 ** min(num_failed_starts - 1, 32))


def failed_start_streak(ended_newest_first: Iterable[tuple[str, dt.datetime | None]]) -> int:
    """How many of a role's ended workers, newest first as (status, ready_at), died before ever getting ready
    without a worker in between that got ready or ended otherwise (stopped, killed by a drain)."""
    streak = 0
    for status, ready_at in ended_newest_first:
        if status != LocalWorkerStatus.DIED.value or ready_at is not None:
            break
        streak += 1
    return streak


def render_command(template: Sequence[str], variables: Mapping[str, str], *, field: str) -> list[str]:
    """The argument list of a worker: `${NAME}` replaced from `variables`.

    Raises:
        LocalConnectorError: an argument names a variable that is not set (names the field, index and variable).
    """
    argv: list[str] = []
    for index, argument in enumerate(template):
        try:
            argv.append(string.Template(argument).substitute(variables))
        except KeyError as exc:
            raise LocalConnectorError(
                f"{field}[{index}] = {argument!r}: variable {exc.args[0]} is not set (environment or local_workers.env)"
            ) from None
        except ValueError:
            raise LocalConnectorError(f"{field}[{index}] = {argument!r}: a '$' not followed by a name") from None
    return argv


def disaggregation_mode(mode: PlannerMode, role: Component) -> str:
    """The engine's `--disaggregation-mode`: the role in disaggregated modes, `agg` for the aggregated pool."""
    return "agg" if mode is PlannerMode.AGG else role.value


# --------------------------------------------------------------------------------------------------------
# The workers' processes (found by `local_procs`)
# --------------------------------------------------------------------------------------------------------


def is_running(worker: LocalWorkerRow) -> bool:
    """The worker's own process is still running (same pid and start time, not a zombie)."""
    return process_start_ticks(worker.pid) == worker.proc_start_ticks


def _signal_group(worker: LocalWorkerRow, sig: signal.Signals) -> bool:
    """Send `sig` to the worker's process group (it leads its own session); False when it is already gone."""
    if not is_running(worker):
        return False
    try:
        os.killpg(worker.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(worker.pid, sig)
    return True


# --------------------------------------------------------------------------------------------------------
# The connector
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyResult:
    outcome: ExecutionOutcome
    detail: str


class LocalConnector:
    """Scale engine processes on this machine; all its state is in Postgres (`local_workers`)."""

    name = "local"
    running_statuses = RUNNING_STATUSES

    def __init__(
        self,
        settings: LocalWorkersConfig,
        *,
        mode: PlannerMode,
        namespace: str,
        log_dir: Path,
        discovery_dir: Path | None,
        environ: Mapping[str, str] | None = None,
        metrics_targets_file: Path | None = None,
    ) -> None:
        self.settings = settings
        self.metrics_targets_file = metrics_targets_file
        self.mode = mode
        self.namespace = namespace
        self.log_dir = log_dir
        self.discovery_dir = discovery_dir
        self.environ = dict(os.environ if environ is None else environ)
        self.roles = managed_components(mode)

    @classmethod
    def from_config(
        cls, config: PlannerConfig, settings: LocalWorkersConfig | None, *, data_dir: Path, config_dir: Path | None
    ) -> LocalConnector:
        """The connector a config asks for; relative folders are taken from the config file's folder."""
        settings = settings or LocalWorkersConfig()
        base = config_dir or Path.cwd()
        log_dir = base / settings.log_dir if settings.log_dir else data_dir / "local-workers"
        discovery = settings.discovery_dir or os.environ.get("DYN_FILE_KV")
        return cls(
            settings,
            mode=config.mode,
            namespace=config.namespace,
            log_dir=log_dir.resolve(),
            discovery_dir=(base / discovery).resolve() if discovery else None,
            metrics_targets_file=(base / settings.metrics_targets_file).resolve()
            if settings.metrics_targets_file
            else None,
        )

    # --- reading ------------------------------------------------------------------------------------

    def workers(self, session: Session, deployment_id: int, *, statuses: Sequence[LocalWorkerStatus]) -> list:
        return list(
            session.scalars(
                select(LocalWorkerRow)
                .where(
                    LocalWorkerRow.deployment_id == deployment_id,
                    LocalWorkerRow.status.in_([s.value for s in statuses]),
                )
                .order_by(LocalWorkerRow.id)
            )
        )

    def _state(self, session: Session, deployment_id: int, *, lock: bool = False) -> LocalConnectorStateRow | None:
        query = select(LocalConnectorStateRow).where(LocalConnectorStateRow.deployment_id == deployment_id)
        if lock:
            query = query.with_for_update()
        return session.scalar(query.execution_options(populate_existing=True))

    def _registered(self, worker: LocalWorkerRow, ports: set[int] | None) -> bool:
        if ports is None:  # no discovery store: running is ready
            return True
        return bool(listening_ports(worker.pid) & ports)

    def _ports(self) -> set[int] | None:
        return None if self.discovery_dir is None else discovery_ports(self.discovery_dir, self.namespace)

    def worker_counts(self, session: Session, deployment_id: int, *, default: WorkerCounts) -> WorkerCounts:
        """Ready = running and registered with the frontend (looked at now); expected = the sizes in force."""
        ports = self._ports()
        ready = {role: 0 for role in Component}
        for worker in self.workers(session, deployment_id, statuses=LIVE_STATUSES):
            if is_running(worker) and self._registered(worker, ports):
                ready[Component(worker.role)] += 1
        state = self._state(session, deployment_id)
        expected_prefill = state.target_prefill if state else default.expected_prefill
        expected_decode = state.target_decode if state else default.expected_decode
        return WorkerCounts(
            ready_prefill=ready[Component.PREFILL] if Component.PREFILL in self.roles else default.ready_prefill,
            ready_decode=ready[Component.DECODE] if Component.DECODE in self.roles else default.ready_decode,
            expected_prefill=expected_prefill,
            expected_decode=expected_decode,
        )

    # --- actions ------------------------------------------------------------------------------------

    def _start(
        self, session: Session, deployment_id: int, role: Component, now: dt.datetime, decision_id: int | None
    ) -> LocalWorkerRow:
        """Start one worker of `role` and record it (its id is the row's, known before the process starts)."""
        field = f"local_workers.{role.value}_command"
        row = LocalWorkerRow(
            deployment_id=deployment_id,
            role=role.value,
            pid=0,
            proc_start_ticks=0,
            command=[],
            log_path="",
            status=LocalWorkerStatus.STARTING.value,
            decision_id=decision_id,
            started_at=now,
        )
        session.add(row)
        session.flush()  # the id names the log file and is the WORKER_ID variable
        variables = {
            **self.environ,
            **self.settings.env,
            "ROLE": role.value,
            "DISAGGREGATION_MODE": disaggregation_mode(self.mode, role),
            "WORKER_ID": str(row.id),
        }
        env = {**self.environ, **self.settings.env}
        if self.metrics_targets_file is not None:
            # free now, bound by the worker a moment later (another process could take it in between: the worker
            # then serves no metrics, and the scrape of its target fails, visibly in Prometheus' `up`)
            row.metrics_port = free_metrics_port()
            variables["METRICS_PORT"] = env[METRICS_PORT_ENV] = str(row.metrics_port)
        argv = render_command(self.settings.command(role), variables, field=field)
        if self.discovery_dir is not None:
            env.setdefault("DYN_FILE_KV", str(self.discovery_dir))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"worker-{deployment_id}-{row.id}-{role.value}.log"
        nice = self.settings.nice
        with log_path.open("ab") as log:
            try:
                process = subprocess.Popen(  # the operator's own command template
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # outlives the flow run; its group is signalled on drain
                    preexec_fn=(lambda: os.nice(nice)) if nice else None,  # only os.nice
                )
            except OSError as exc:
                raise LocalConnectorError(f"{field}[0] = {argv[0]!r}: cannot start: {exc.strerror}") from None
        start_ticks = process_start_ticks(process.pid)
        row.pid = process.pid
        row.proc_start_ticks = start_ticks if start_ticks is not None else -1  # exited at once: found dead next
        row.command = argv
        row.log_path = str(log_path)
        repo.audit(
            session,
            "local_worker_started",
            {"worker_id": row.id, "role": role.value, "pid": process.pid, "log": str(log_path)},
            deployment_id=deployment_id,
            decision_id=decision_id,
        )
        return row

    def _engine_ids(self, workers: Sequence[LocalWorkerRow]) -> dict[int, tuple[str, ...]]:
        """Worker row id -> the Dynamo instance ids its process registered (the discovery entries of the ports it
        listens on); empty without a discovery store or before it registered."""
        if self.discovery_dir is None:
            return {w.id: () for w in workers}
        instances = discovery_instances(self.discovery_dir, self.namespace)
        return {
            w.id: tuple(sorted({i for port in listening_ports(w.pid) for i in instances.get(port, ())}))
            for w in workers
        }

    def _loads(
        self, session: Session, deployment_id: int, workers: Sequence[LocalWorkerRow], now: dt.datetime
    ) -> tuple[dict[int, tuple[str, ...]], dict[int, int | None]]:
        """Each worker's instance ids and requests in flight (None: no fresh forward-pass sample of it)."""
        ids = self._engine_ids(workers)
        loads = in_flight_by_worker(session, deployment_id, now)
        return ids, {w.id: engine_in_flight(loads, ids[w.id]) for w in workers}

    def _drain(
        self,
        session: Session,
        worker: LocalWorkerRow,
        now: dt.datetime,
        decision_id: int | None,
        *,
        num_in_flight: int | None = None,
        worker_ids: Sequence[str] = (),
    ) -> str:
        """SIGTERM: Dynamo's runtime deregisters the engine (no new request reaches it) and exits once the requests
        it holds end; `_check_workers` finishes the drain. Recorded as a `drains` row and an audit row."""
        sent = _signal_group(worker, signal.SIGTERM)
        worker.status = LocalWorkerStatus.DRAINING.value
        worker.drain_started_at = now
        grace_s = float(self.settings.drain_grace_seconds)
        start = DrainStart(
            deployment_id=worker.deployment_id,
            decision_id=decision_id,
            connector=self.name,
            role=worker.role,
            engine=f"local worker {worker.id} (pid {worker.pid})",
            worker_ids=worker_ids,
            grace_s=grace_s,
            num_in_flight=num_in_flight,
            local_worker_id=worker.id,
        )
        open_drain(session, start, now)
        repo.audit(
            session,
            "local_worker_draining",
            {
                "worker_id": worker.id,
                "role": worker.role,
                "pid": worker.pid,
                "sigterm_sent": sent,
                "num_in_flight": num_in_flight,
                "grace_s": grace_s,
            },
            deployment_id=worker.deployment_id,
            decision_id=decision_id,
        )
        load = "load unknown" if num_in_flight is None else f"{num_in_flight} in flight"
        return f"drain {worker.role} worker {worker.id} (pid {worker.pid}, {load}, SIGTERM)"

    def _end_drain(self, session: Session, worker: LocalWorkerRow, outcome: DrainOutcome, now: dt.datetime) -> None:
        """Close the worker's drain record: cut = its requests in flight (newest sample) when SIGKILLed, 0 when it
        exited by itself (Dynamo's runtime exits once its requests ended)."""
        drain = open_local_drain(session, worker.id)
        if drain is None:
            return  # drained before drains were recorded (migration 0025)
        num_cut: int | None = 0
        reason = DrainEndReason.EXITED
        if outcome is DrainOutcome.KILLED:
            ids = drain.worker_ids.split(",") if drain.worker_ids else []
            num_cut = engine_in_flight(in_flight_by_worker(session, worker.deployment_id, now), ids)
            reason = DrainEndReason.GRACE_EXPIRED
        close_drain(session, drain, outcome, now, num_cut=num_cut, reason=reason)

    def _end(self, session: Session, worker: LocalWorkerRow, status: LocalWorkerStatus, now: dt.datetime, why: str):
        worker.status = status.value
        worker.ended_at = now
        worker.end_detail = why
        repo.audit(
            session,
            f"local_worker_{status.value}",
            {"worker_id": worker.id, "role": worker.role, "pid": worker.pid, "why": why},
            deployment_id=worker.deployment_id,
        )

    def _bring_to(
        self,
        session: Session,
        deployment_id: int,
        targets: Mapping[Component, int],
        now: dt.datetime,
        decision_id: int | None,
    ) -> list[str]:
        """Start or drain workers so that each managed pool has its target live workers; what was done."""
        live = self.workers(session, deployment_id, statuses=LIVE_STATUSES)
        actions: list[str] = []
        started: list[LocalWorkerRow] = []
        ids: dict[int, tuple[str, ...]] = {}
        loads: dict[int, int | None] = {}
        if any(sum(1 for w in live if w.role == role) > targets[role] for role in self.roles):
            ids, loads = self._loads(session, deployment_id, live, now)  # a scale-down: which engines are least loaded
        try:
            for role in self.roles:
                views = [
                    WorkerView(worker_id=w.id, status=LocalWorkerStatus(w.status), num_in_flight=loads.get(w.id))
                    for w in live
                    if w.role == role
                ]
                plan = plan_pool(role, views, targets[role])
                for _ in range(plan.num_start):
                    row = self._start(session, deployment_id, role, now, decision_id)
                    started.append(row)
                    actions.append(f"start {role.value} worker {row.id} (pid {row.pid})")
                by_id = {w.id: w for w in live}
                actions += [
                    self._drain(
                        session,
                        by_id[worker_id],
                        now,
                        decision_id,
                        num_in_flight=loads.get(worker_id),
                        worker_ids=ids.get(worker_id, ()),
                    )
                    for worker_id in plan.drain
                ]
        except BaseException:
            # The transaction that recorded these workers is rolled back with the error: their processes would
            # run unrecorded (nothing would drain or count them), so they go with it.
            for row in started:
                _signal_group(row, signal.SIGKILL)
            raise
        self._publish_targets(session, deployment_id)
        return actions

    def _publish_targets(self, session: Session, deployment_id: int) -> None:
        """Rewrite the Prometheus targets file (when configured) to the workers whose process should run now."""
        if self.metrics_targets_file is None:
            return
        session.flush()
        running = self.workers(session, deployment_id, statuses=RUNNING_STATUSES)
        workers = (ScrapeWorker(worker_id=w.id, role=w.role, metrics_port=w.metrics_port) for w in running)
        write_scrape_targets(self.metrics_targets_file, scrape_targets(workers))

    def ensure_started(self, session: Session, deployment_id: int, default: WorkerCounts, now: dt.datetime) -> list:
        """Before any decision: start the configured initial workers (`initial_prefill` / `initial_decode`), else
        the minimum endpoints (`default`'s expected counts), and keep them running."""
        if self._state(session, deployment_id, lock=True) is not None:
            return []  # sizes in force already: reconcile keeps them
        initial_prefill, initial_decode = self.settings.initial_prefill, self.settings.initial_decode
        state = LocalConnectorStateRow(
            deployment_id=deployment_id,
            target_prefill=default.expected_prefill if initial_prefill is None else initial_prefill,
            target_decode=default.expected_decode if initial_decode is None else initial_decode,
            decision_id=None,
            updated_at=now,
        )
        session.add(state)
        session.flush()
        return self._bring_to(session, deployment_id, self._targets(state), now, None)

    def _targets(self, state: LocalConnectorStateRow) -> dict[Component, int]:
        return {Component.PREFILL: state.target_prefill, Component.DECODE: state.target_decode}

    def apply(self, session: Session, decision: DecisionRow, now: dt.datetime) -> ApplyResult:
        """Make the decision's targets the sizes in force and start or drain workers to reach them."""
        state = self._state(session, decision.deployment_id, lock=True)
        if state is None:
            state = LocalConnectorStateRow(
                deployment_id=decision.deployment_id, target_prefill=0, target_decode=0, updated_at=now
            )
            session.add(state)
        if decision.target_prefill is not None:
            state.target_prefill = decision.target_prefill
        if decision.target_decode is not None:
            state.target_decode = decision.target_decode
        state.decision_id = decision.id
        state.updated_at = now
        session.flush()
        actions = self._bring_to(session, decision.deployment_id, self._targets(state), now, decision.id)
        sizes = ", ".join(f"{role.value} {self._targets(state)[role]}" for role in self.roles)
        if not actions:
            return ApplyResult(outcome=ExecutionOutcome.NOOP, detail=f"local workers already at the targets ({sizes})")
        return ApplyResult(outcome=ExecutionOutcome.APPLIED, detail=f"targets {sizes}: {'; '.join(actions)}")

    def reconcile(self, session: Session, deployment_id: int, now: dt.datetime) -> list[str]:
        """Check every worker that should have a process: report and replace the dead, finish drains (SIGKILL
        after the grace period), mark registered workers ready, acknowledge a decision whose targets are reached.
        Records what it did as a `reconciled` execution of the decision in force; returns it."""
        state = self._state(session, deployment_id, lock=True)
        if state is None:
            return []  # nothing started yet
        actions = self._check_workers(session, deployment_id, now)
        session.flush()
        targets, held = self._restart_holds(session, deployment_id, self._targets(state), now)
        actions += held
        replaced = self._bring_to(session, deployment_id, targets, now, state.decision_id)
        actions += [f"replace: {action}" for action in replaced]
        decision = session.get(DecisionRow, state.decision_id) if state.decision_id is not None else None
        if (
            decision is not None
            and decision.status == DecisionStatus.APPLIED.value
            and self._reached(session, deployment_id, state)
        ):
            repo.set_decision_status(
                session, decision, DecisionStatus.ACKNOWLEDGED, now, "local workers at the targets"
            )
            actions.append(f"decision {decision.id} acknowledged: every target worker ready, no drain left")
        if actions and decision is not None:
            attempt = 1 + len(
                list(session.scalars(select(ExecutionRow.id).where(ExecutionRow.decision_id == decision.id)))
            )
            session.add(
                ExecutionRow(
                    decision_id=decision.id,
                    attempt=attempt,
                    connector=self.name,
                    executed_at=now,
                    outcome=ExecutionOutcome.RECONCILED.value,
                    detail="; ".join(actions),
                )
            )
        elif actions:
            repo.audit(session, "local_reconciled", {"actions": actions}, deployment_id=deployment_id)
        return actions

    def _check_workers(self, session: Session, deployment_id: int, now: dt.datetime) -> list[str]:
        """Look at every worker that should have a process: the dead are marked `died`, finished drains
        `stopped`, drains past the grace period SIGKILLed, registered workers `ready`; what was found."""
        ports = self._ports()
        actions: list[str] = []
        grace = dt.timedelta(seconds=self.settings.drain_grace_seconds)
        for worker in self.workers(session, deployment_id, statuses=RUNNING_STATUSES):
            running = is_running(worker)
            status = LocalWorkerStatus(worker.status)
            if status is LocalWorkerStatus.DRAINING:
                if not running:
                    self._end(session, worker, LocalWorkerStatus.STOPPED, now, "exited after SIGTERM")
                    self._end_drain(session, worker, DrainOutcome.STOPPED, now)
                    actions.append(f"{worker.role} worker {worker.id} (pid {worker.pid}) stopped")
                elif worker.drain_started_at is not None and now - worker.drain_started_at >= grace:
                    _signal_group(worker, signal.SIGKILL)
                    self._end(
                        session, worker, LocalWorkerStatus.KILLED, now, f"SIGKILL after {grace.total_seconds():g} s"
                    )
                    self._end_drain(session, worker, DrainOutcome.KILLED, now)
                    actions.append(f"{worker.role} worker {worker.id} (pid {worker.pid}) killed after the grace period")
            elif not running:
                why = f"process {worker.pid} exited while {status.value}; log {worker.log_path}"
                self._end(session, worker, LocalWorkerStatus.DIED, now, why)
                actions.append(f"{worker.role} worker {worker.id} (pid {worker.pid}) died")
            elif status is LocalWorkerStatus.STARTING and self._registered(worker, ports):
                worker.status = LocalWorkerStatus.READY.value
                worker.ready_at = now
                actions.append(f"{worker.role} worker {worker.id} (pid {worker.pid}) ready")
        self._publish_targets(session, deployment_id)
        return actions

    def _restart_holds(
        self, session: Session, deployment_id: int, targets: dict[Component, int], now: dt.datetime
    ) -> tuple[dict[Component, int], list[str]]:
        """The targets a reconcile may start workers for now: a role in a crash loop (`failed_start_streak`) keeps
        its live count (no start; drains still happen) until `restart_delay_s` has passed since its last death;
        with what is held and why."""
        live = self.workers(session, deployment_id, statuses=LIVE_STATUSES)
        held: list[str] = []
        allowed = dict(targets)
        for role in self.roles:
            num_live = sum(1 for w in live if w.role == role.value)
            if targets[role] <= num_live:
                continue
            ended = session.execute(
                select(LocalWorkerRow.status, LocalWorkerRow.ready_at, LocalWorkerRow.ended_at, LocalWorkerRow.log_path)
                .where(LocalWorkerRow.deployment_id == deployment_id, LocalWorkerRow.role == role.value)
                .where(LocalWorkerRow.ended_at.is_not(None))
                .order_by(LocalWorkerRow.ended_at.desc(), LocalWorkerRow.id.desc())
                .limit(64)
            ).all()
            streak = failed_start_streak((row.status, row.ready_at) for row in ended)
            delay_s = restart_delay_s(streak)
            if streak and (now - ended[0].ended_at).total_seconds() < delay_s:
                allowed[role] = num_live
                held.append(
                    f"hold: {streak} {role.value} worker(s) in a row died before getting ready; next start "
                    f"{delay_s:g} s after the last death (log {ended[0].log_path})"
                )
        return allowed, held

    def finish_drains(self, session: Session, deployment_id: int, now: dt.datetime) -> list[str]:
        """`_check_workers` alone, with no replacement: for the shutdown after `stop_all`."""
        return self._check_workers(session, deployment_id, now)

    def _reached(self, session: Session, deployment_id: int, state: LocalConnectorStateRow) -> bool:
        workers = self.workers(session, deployment_id, statuses=RUNNING_STATUSES)
        if any(w.status == LocalWorkerStatus.DRAINING.value for w in workers):
            return False
        targets = self._targets(state)
        return all(
            sum(1 for w in workers if w.role == role and w.status == LocalWorkerStatus.READY.value) == targets[role]
            for role in self.roles
        )

    def stop_all(self, session: Session, deployment_id: int, now: dt.datetime) -> list[str]:
        """Drain every worker of the deployment (the live command's shutdown); `reconcile` finishes the drains."""
        live = self.workers(session, deployment_id, statuses=LIVE_STATUSES)
        ids, loads = self._loads(session, deployment_id, live, now)
        return [
            self._drain(session, worker, now, None, num_in_flight=loads[worker.id], worker_ids=ids[worker.id])
            for worker in live
        ]
