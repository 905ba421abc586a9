"""The KEDA external scaler: serves the planner's newest target per role, read from Postgres, to KEDA.

A ScaledObject with `type: external` names this server (`scalerAddress`) and, in its trigger metadata, the
managed deployment and the role (`prefill` or `decode`). KEDA then asks:

- `GetMetricSpec`: one metric, target size 1;
- `GetMetrics`: the metric's value = the role's target replicas, so the HPA KEDA drives computes
  desired = value / target size = the planner's target;
- `IsActive` / `StreamIsActive`: true when the target is > 0 (KEDA scales to zero only below that).

The target is the one the planner wrote through the virtual connector (`virtual_connector_state`), read afresh
on every call: a restarted planner or scaler changes nothing. The scaler is that connector's orchestrator: once
it has served a virtual decision's target for every role the decision sets (>= 0), it acknowledges the decision
(audit `by` says so). With a workload reader (`planner keda-scaler --watch-workloads`) it waits for more: the
trigger metadata names each role's workload (`workloadKind`: Deployment or StatefulSet, `workloadName`; the
ScaledObject's namespace), and the decision is acknowledged only when every role's workload has as many available
replicas as its target ("workloads reached their targets"). Without one, "served to KEDA", not "pods ready".

Staleness: when the deployment's newest tick is older than `max_age_s`, the scaler keeps serving the last target
(the safest thing to do with a planner that is down is to keep its last capacity) and logs a warning when the
deployment becomes stale and when it recovers.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
import psycopg

from planner_core.config import WorkloadKind
from planner_core.domain import Component
from planner_core.runtime.connectors.virtual import acknowledge
from planner_core.runtime.keda import DEFAULT_MAX_AGE_S
from planner_core.runtime.keda import externalscaler_pb2 as pb
from planner_core.runtime.keda import externalscaler_pb2_grpc as pb_grpc
from planner_core.runtime.store.db import to_libpq_uri

log = logging.getLogger(__name__)

DEPLOYMENT_KEY = "deployment"
ROLE_KEY = "role"
ACKNOWLEDGED_BY = "keda-scaler: targets served to KEDA (GetMetrics); replicas not observed"
ACKNOWLEDGED_REACHED_BY = "keda-scaler: every role's workload reached its target (available replicas)"
WORKLOAD_KIND_KEY = "workloadKind"
WORKLOAD_NAME_KEY = "workloadName"
# A role's workload as the trigger names it: (kind, namespace, name).
WorkloadLocation = tuple[WorkloadKind, str, str]
_KNOWN_SHOWN = 20  # deployment names listed in an error


class ScalerError(Exception):
    """A request the scaler refuses, with the gRPC status code KEDA receives."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleTarget:
    """One role's target as served, and how fresh the planner behind it is."""

    deployment: str
    deployment_id: int
    role: Component
    replicas: int
    virtual_decision_id: int
    last_tick_at: dt.datetime | None
    age_s: float | None  # since the deployment's newest tick; None when it has none
    stale: bool

    @property
    def metric_name(self) -> str:
        """`planner-<deployment>-<role>`, lower case, [a-z0-9-] only (KEDA prefixes it `sN-` in the HPA)."""
        return re.sub(r"[^a-z0-9-]+", "-", f"planner-{self.deployment}-{self.role.value}".lower())


_STATE_SQL = """
SELECT d.id, s.num_prefill_workers, s.num_decode_workers, s.decision_id, s.scaled_decision_id,
       (SELECT max(t.scheduled_at) FROM ticks t WHERE t.deployment_id = d.id)
FROM deployments d LEFT JOIN virtual_connector_state s ON s.deployment_id = d.id
WHERE d.name = %s
"""


class KedaScaler:
    """Reads targets and acknowledges decisions; the gRPC servicer (`ExternalScalerServicer`) wraps it.

    Args:
        database_url: the planner database (SQLAlchemy or libpq URL).
        deployment: when set, the only deployment served; trigger metadata may then omit `deployment`.
        max_age_s: a deployment whose newest tick is older than this is stale (still served, and logged).
        clock: the current time (tests pass a fixed one; tick times are the ticks' scheduled times).
        ready_replicas: reads a workload's available replicas; when given, triggers must name their workload and a
            decision is acknowledged only once every role's workload has reached its target.
    """

    def __init__(
        self,
        database_url: str,
        *,
        deployment: str | None = None,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        ready_replicas: Callable[[WorkloadLocation], int] | None = None,
    ) -> None:
        if max_age_s <= 0:
            raise ValueError(f"max_age_s = {max_age_s!r}: must be > 0")
        self._uri = to_libpq_uri(database_url)
        self.deployment = deployment
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        # Per deployment id: the virtual decision being served and the roles served for it. In memory only: after
        # a restart KEDA's next polls serve the roles again, which is all an acknowledgement needs.
        self._served: dict[int, tuple[int, dict[Component, WorkloadLocation | None]]] = {}
        self._ready_replicas = ready_replicas
        self._stale: dict[int, bool] = {}

    def workload(self, metadata: dict[str, str], namespace: str) -> WorkloadLocation | None:
        """The workload the trigger names (None when the scaler does not watch workloads).

        Raises ScalerError (INVALID_ARGUMENT) when it watches them and the metadata does not name one."""
        if self._ready_replicas is None:
            return None
        kind_name, name = metadata.get(WORKLOAD_KIND_KEY, ""), metadata.get(WORKLOAD_NAME_KEY, "")
        try:
            kind = WorkloadKind(kind_name)
        except ValueError:
            raise ScalerError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scalerMetadata {WORKLOAD_KIND_KEY} = {kind_name!r}: must be one of "
                + ", ".join(k.value for k in WorkloadKind)
                + " (this scaler acknowledges a decision when the workloads reach it)",
            ) from None
        if not name or not namespace:
            raise ScalerError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scalerMetadata {WORKLOAD_NAME_KEY} = {name!r} in namespace {namespace!r}: the workload this "
                "trigger scales is needed (this scaler acknowledges a decision when the workloads reach it)",
            )
        return kind, namespace, name

    def target(self, metadata: dict[str, str]) -> RoleTarget:
        """The target the trigger metadata asks for. Raises ScalerError (INVALID_ARGUMENT, FAILED_PRECONDITION)."""
        name, role = self._parse(metadata)
        with psycopg.connect(self._uri) as conn:
            row = conn.execute(_STATE_SQL, (name,)).fetchone()
            if row is None:
                known = [r[0] for r in conn.execute("SELECT name FROM deployments ORDER BY name").fetchall()]
                shown = ", ".join(known[:_KNOWN_SHOWN]) or "none"
                raise ScalerError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"scalerMetadata {DEPLOYMENT_KEY} = {name!r}: no such deployment (known: {shown})",
                )
        deployment_id, num_prefill, num_decode, decision_id, _scaled, last_tick_at = row
        replicas = num_prefill if role is Component.PREFILL else num_decode
        if decision_id is None or decision_id < 0 or replicas is None or replicas < 0:
            raise ScalerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"deployment {name!r} has no {role.value} target yet (no decision written through the virtual "
                "connector: is the planner running with environment: virtual?)",
            )
        age_s = None if last_tick_at is None else (self._clock() - last_tick_at).total_seconds()
        stale = age_s is None or age_s > self.max_age_s
        self._note_staleness(name, deployment_id, stale, age_s)
        return RoleTarget(
            deployment=name,
            deployment_id=deployment_id,
            role=role,
            replicas=int(replicas),
            virtual_decision_id=int(decision_id),
            last_tick_at=last_tick_at,
            age_s=age_s,
            stale=stale,
        )

    def served(self, target: RoleTarget, workload: WorkloadLocation | None = None) -> bool:
        """Record that `target` was handed to KEDA (for `workload`, when the scaler watches workloads); acknowledge
        its decision once every role it sets was served and, when watching, every role's workload reached it.

        Returns True when this call acknowledged the decision.
        """
        with self._lock:
            decision_id, roles = self._served.get(target.deployment_id, (target.virtual_decision_id, {}))
            if decision_id != target.virtual_decision_id:
                roles = {}  # a newer decision: what was served for the older one no longer counts
            roles[target.role] = workload
            self._served[target.deployment_id] = (target.virtual_decision_id, roles)
            roles = dict(roles)
        with psycopg.connect(self._uri) as conn:
            row = conn.execute(
                "SELECT num_prefill_workers, num_decode_workers, decision_id, scaled_decision_id "
                "FROM virtual_connector_state WHERE deployment_id = %s",
                (target.deployment_id,),
            ).fetchone()
        if row is None or row[2] != target.virtual_decision_id or row[3] >= row[2]:
            return False  # superseded meanwhile, or already acknowledged
        needed = {
            role for role, count in zip((Component.PREFILL, Component.DECODE), row[:2], strict=True) if count >= 0
        }
        if not needed <= set(roles):
            return False
        by = ACKNOWLEDGED_BY
        if self._ready_replicas is not None:
            wanted = dict(zip((Component.PREFILL, Component.DECODE), row[:2], strict=True))
            for role in needed:
                location = roles[role]
                try:
                    reached = location is not None and self._ready_replicas(location) == wanted[role]
                except Exception as exc:  # the metric is still served; the next poll reads again
                    log.warning("deployment %r: cannot read %s %s/%s: %s", target.deployment, *location, exc)
                    return False
                if not reached:
                    return False  # not there yet: KEDA's next poll looks again
            by = ACKNOWLEDGED_REACHED_BY
        acknowledged = acknowledge(self._uri, target.deployment_id, target.virtual_decision_id, by=by)
        if acknowledged:
            log.info(
                "deployment %r: virtual decision %d acknowledged (targets served to KEDA)",
                target.deployment,
                target.virtual_decision_id,
            )
        return acknowledged

    def _parse(self, metadata: dict[str, str]) -> tuple[str, Component]:
        name = metadata.get(DEPLOYMENT_KEY) or self.deployment
        if not name:
            raise ScalerError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scalerMetadata needs {DEPLOYMENT_KEY!r} (the managed deployment): this scaler was started "
                "without --deployment",
            )
        if self.deployment is not None and name != self.deployment:
            raise ScalerError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scalerMetadata {DEPLOYMENT_KEY} = {name!r}: this scaler serves only {self.deployment!r}",
            )
        role_name = metadata.get(ROLE_KEY, "")
        try:
            role = Component(role_name)
        except ValueError:
            raise ScalerError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scalerMetadata {ROLE_KEY} = {role_name!r}: must be one of " + ", ".join(c.value for c in Component),
            ) from None
        return name, role

    def _note_staleness(self, name: str, deployment_id: int, stale: bool, age_s: float | None) -> None:
        """Log on the transitions only: KEDA polls every ScaledObject every 30 s and a log line each time is noise."""
        with self._lock:
            was_stale = self._stale.get(deployment_id, False)
            self._stale[deployment_id] = stale
        if stale and not was_stale:
            age = "no tick recorded" if age_s is None else f"newest tick {age_s:.0f} s old"
            log.warning(
                "deployment %r: target is stale (%s, max age %.0f s); serving the last target until the planner "
                "records a tick",
                name,
                age,
                self.max_age_s,
            )
        elif was_stale and not stale:
            log.info("deployment %r: target fresh again (newest tick %.0f s old)", name, age_s or 0.0)


class ExternalScalerServicer(pb_grpc.ExternalScalerServicer):
    """KEDA's External Scaler API over a `KedaScaler`; refused requests end with their status and one line."""

    def __init__(self, scaler: KedaScaler, *, stream_interval_s: float = 5.0) -> None:
        self.scaler = scaler
        self.stream_interval_s = stream_interval_s

    def _target(self, ref: pb.ScaledObjectRef, context: grpc.ServicerContext) -> RoleTarget:
        try:
            return self.scaler.target(dict(ref.scalerMetadata))
        except ScalerError as exc:
            context.abort(exc.code, str(exc))  # raises
            raise  # unreachable: abort raises; keeps type checkers honest

    def _workload(self, ref: pb.ScaledObjectRef, context: grpc.ServicerContext) -> WorkloadLocation | None:
        try:
            return self.scaler.workload(dict(ref.scalerMetadata), ref.namespace)
        except ScalerError as exc:
            context.abort(exc.code, str(exc))  # raises
            raise

    def IsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.IsActiveResponse:
        return pb.IsActiveResponse(result=self._target(request, context).replicas > 0)

    def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.ServicerContext
    ) -> Iterator[pb.IsActiveResponse]:
        """The current answer at once, then every change, polling the database every `stream_interval_s`."""
        done = threading.Event()
        context.add_callback(done.set)
        previous: bool | None = None
        while context.is_active():
            active = self._target(request, context).replicas > 0
            if active != previous:
                yield pb.IsActiveResponse(result=active)
                previous = active
            if done.wait(self.stream_interval_s):
                return

    def GetMetricSpec(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.GetMetricSpecResponse:
        target = self._target(request, context)
        # Target size 1: HPA's desired replicas = metric value / 1 = the planner's target.
        return pb.GetMetricSpecResponse(
            metricSpecs=[pb.MetricSpec(metricName=target.metric_name, targetSize=1, targetSizeFloat=1.0)]
        )

    def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.ServicerContext) -> pb.GetMetricsResponse:
        target = self._target(request.scaledObjectRef, context)
        self.scaler.served(target, self._workload(request.scaledObjectRef, context))
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(
                    metricName=request.metricName or target.metric_name,
                    metricValue=target.replicas,
                    metricValueFloat=float(target.replicas),
                )
            ]
        )


def start_server(
    scaler: KedaScaler, *, port: int, host: str = "127.0.0.1", stream_interval_s: float = 5.0, max_workers: int = 8
) -> tuple[grpc.Server, int]:
    """Start serving (plaintext, as KEDA's external scalers usually are in-cluster); returns the server and port.

    Port 0 picks a free port. Each open StreamIsActive holds a worker thread, hence `max_workers`.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    pb_grpc.add_ExternalScalerServicer_to_server(
        ExternalScalerServicer(scaler, stream_interval_s=stream_interval_s), server
    )
    bound_port = server.add_insecure_port(f"{host}:{port}")
    if bound_port == 0:
        raise ValueError(f"cannot listen on {host}:{port}")
    server.start()
    return server, bound_port


def serve_until_signalled(server: grpc.Server, *, grace_s: float = 5.0) -> None:
    """Block until SIGINT or SIGTERM, then stop the server, letting calls in flight finish for `grace_s`."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop(grace_s).wait()
