"""The gRPC client of out-of-process plugins: the I/O edge of `scheduling.external_plugins`.

`connect_remote_plugins(planner)` swaps each `RecordedRemotePlugin` of a live planner for a `GrpcPlugin`, which
calls the plugin's process in its phase (the `dynamo.planner.plugin.v1` services of `plugin_proto/plugin.proto`)
with the entry's deadline, turns what came back into a `RemoteAnswer` and keeps it, then returns the same
`answer_result` the recorded plugin would. `run_tick` takes the kept answers after the tick
(`take_remote_answers`) and records them with the tick's inputs, so replay reads them instead of calling.

Every failure becomes an answer, never an exception: deadline exceeded -> PLUGIN_TIMEOUT, unreachable (refused,
killed, not started) -> PLUGIN_UNAVAILABLE, a reply that does not decode or breaks the contract (negative
replicas, unknown pool, non-finite numbers) -> PLUGIN_INVALID_RESULT, any other gRPC error -> PLUGIN_RAISED. The
pipeline then skips the plugin for this tick and counts the failure on its circuit breaker.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import grpc

from planner_core.config import ExternalPluginConfig
from planner_core.domain import (
    Component,
    ObservedValue,
    OverrideType,
    PartialPrediction,
    ReasonCode,
    RemoteAnswer,
    ReplicaOverride,
)
from planner_core.pipeline import ConfiguredPlugin, Phase, PipelineContext, Plugin, PluginResult, PluginSpec
from planner_core.pipeline.remote import RecordedRemotePlugin, answer_result
from planner_core.planner import Planner
from planner_core.runtime.plugin_proto import plugin_pb2 as pb
from planner_core.runtime.plugin_proto import plugin_pb2_grpc as pb_grpc

_MAX_DETAIL_CHARS = 300
# Reconnect quickly after a plugin process restarts (gRPC's default backoff grows to two minutes).
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
_OVERRIDE_KIND = {pb.SET: OverrideType.SET, pb.AT_LEAST: OverrideType.AT_LEAST, pb.AT_MOST: OverrideType.AT_MOST}
_WIRE_KIND = {kind: wire for wire, kind in _OVERRIDE_KIND.items()}


def _one_line(text: str) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= _MAX_DETAIL_CHARS else flat[: _MAX_DETAIL_CHARS - 3] + "..."


def grpc_target(endpoint: str) -> str:
    """The channel target of an endpoint: `grpc://host:port` -> `host:port`; `unix://...` as is."""
    return endpoint.removeprefix("grpc://")


class BadAnswer(ValueError):
    """A reply that decoded but breaks the contract."""


# --- the tick's context on the wire --------------------------------------------------------------------------


def _targets(values: Any, source: str) -> pb.ScalingProposal:
    return pb.ScalingProposal(
        targets=[pb.ComponentTarget(sub_component_type=c.value, replicas=n) for c, n in sorted(values.items())],
        source=source,
    )


def _override_result(overrides: tuple[ReplicaOverride, ...]) -> tuple[str, Any]:
    """One PROPOSE contribution as the wire's oneof (`accept` / `override` / `reject`)."""
    rejects = [o for o in overrides if o.kind is OverrideType.REJECT]
    if rejects:
        return "reject", pb.RejectResult(reason=rejects[0].reason)
    if not overrides:
        return "accept", pb.AcceptResult()
    targets = [
        pb.ComponentTarget(sub_component_type=o.component.value, replicas=o.replicas, type=_WIRE_KIND[o.kind])
        for o in overrides
        if o.component is not None and o.replicas is not None
    ]
    return "override", pb.OverrideResult(targets=targets, reason="; ".join(o.reason for o in overrides if o.reason))


def wire_context(context: PipelineContext) -> pb.PipelineContext:
    """What the plugin is told: the tick's traffic and workers, the OBSERVE values, the forecast so far and the
    merged targets going into its stage. Forward-pass metrics are not sent (Dynamo does not fill them either)."""
    inputs = context.inputs
    observations = pb.ObservationData(
        workers=pb.WorkerState(
            ready_prefill=inputs.workers.ready_prefill,
            ready_decode=inputs.workers.ready_decode,
            expected_prefill=inputs.workers.expected_prefill,
            expected_decode=inputs.workers.expected_decode,
        ),
        plugin_values={o.name: o.value for o in context.observations},
    )
    traffic = inputs.traffic
    if traffic is not None:
        observations.traffic.CopyFrom(
            pb.TrafficMetrics(duration_s=traffic.duration_s, num_req=traffic.num_req, isl=traffic.isl, osl=traffic.osl)
        )
        if traffic.kv_hit_rate is not None:
            observations.traffic.kv_hit_rate = traffic.kv_hit_rate
    wire = pb.PipelineContext(
        request_id=f"tick-{inputs.now_s:.3f}", observations=observations, tick_time_s=inputs.now_s
    )
    predictions = context.predictions
    for name, field in (("num_req", "predicted_num_req"), ("isl", "predicted_isl"), ("osl", "predicted_osl")):
        value = getattr(predictions, name)
        if value is not None:
            setattr(wire.predictions, field, value)
    if context.spec.phase in (Phase.PROPOSE, Phase.RECONCILE, Phase.CONSTRAIN):
        wire.proposal.CopyFrom(_targets(context.targets, "merged"))
    return wire


# --- the plugin's reply as a RemoteAnswer -------------------------------------------------------------------


def _finite(name: str, value: float, *, low: float = 0.0) -> float:
    if not math.isfinite(value) or value < low:
        raise BadAnswer(f"{name} = {value!r}: must be a finite number >= {low:g}")
    return float(value)


def _observe_answer(reply: pb.ObserveStageResponse) -> dict[str, Any]:
    values = []
    for name in sorted(reply.values):  # a proto map has no order: sort, so the record is the same every time
        if not name:
            raise BadAnswer("an observation has an empty name")
        value = reply.values[name]
        if not math.isfinite(value):
            raise BadAnswer(f"observation {name!r} = {value!r}: must be finite")
        values.append(ObservedValue(name=name, value=float(value)))
    reason = ReasonCode.PLUGIN_OBSERVED if values else ReasonCode.PLUGIN_NO_OPINION
    return {"reason": reason, "observations": tuple(values), "detail": reply.reason}


def _predict_answer(reply: pb.PredictStageResponse) -> dict[str, Any]:
    fields = {}
    if reply.HasField("predictions"):
        data = reply.predictions
        for name, field in (("num_req", "predicted_num_req"), ("isl", "predicted_isl"), ("osl", "predicted_osl")):
            if data.HasField(field):
                fields[name] = _finite(field, getattr(data, field))
    predictions = PartialPrediction(**fields) if fields else None
    reason = ReasonCode.PREDICTED if fields else ReasonCode.PLUGIN_NO_OPINION
    return {"reason": reason, "predictions": predictions, "final": reply.final, "detail": reply.reason}


def _override_answer(reply: Any) -> dict[str, Any]:
    kind = reply.WhichOneof("result")
    if kind is None or kind == "accept":
        return {"reason": ReasonCode.PLUGIN_NO_OPINION, "final": reply.final}
    if kind == "reject":
        reason = reply.reject.reason or "rejected"
        override = ReplicaOverride(component=None, kind=OverrideType.REJECT, reason=_one_line(reason))
        return {"reason": ReasonCode.PLUGIN_OVERRIDES, "overrides": (override,), "final": reply.final}
    result = reply.override
    overrides = []
    for target in result.targets:
        try:
            component = Component(target.sub_component_type)
        except ValueError:
            raise BadAnswer(f"sub_component_type {target.sub_component_type!r}: must be prefill or decode") from None
        if not target.HasField("replicas"):
            continue  # no opinion about this pool
        if target.replicas < 0:
            raise BadAnswer(f"{component.value} replicas = {target.replicas}: must be >= 0")
        kind_value = _OVERRIDE_KIND.get(target.type)
        if kind_value is None:
            raise BadAnswer(f"{component.value} override type {target.type}: must be SET, AT_LEAST or AT_MOST")
        overrides.append(
            ReplicaOverride(
                component=component, kind=kind_value, replicas=target.replicas, reason=_one_line(result.reason)
            )
        )
    reason = ReasonCode.PLUGIN_OVERRIDES if overrides else ReasonCode.PLUGIN_NO_OPINION
    return {"reason": reason, "overrides": tuple(overrides), "final": reply.final, "detail": _one_line(result.reason)}


def _failure(error: grpc.RpcError) -> tuple[ReasonCode, str]:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    text = _one_line(f"{code.name if code is not None else 'UNKNOWN'}: {details}")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ReasonCode.PLUGIN_TIMEOUT, f"no answer within the deadline ({text})"
    if code is grpc.StatusCode.UNAVAILABLE:
        return ReasonCode.PLUGIN_UNAVAILABLE, f"unreachable ({text})"
    if code is grpc.StatusCode.INTERNAL and "deserializ" in (details or "").lower():
        return ReasonCode.PLUGIN_INVALID_RESULT, f"reply does not decode ({text})"
    return ReasonCode.PLUGIN_RAISED, f"the plugin answered with an error ({text})"


class GrpcPlugin:
    """A live out-of-process plugin: each run is one gRPC call; the answers are kept for the tick's record."""

    def __init__(self, spec: PluginSpec, entry: ExternalPluginConfig) -> None:
        self.spec = spec
        self.entry = entry
        self.answers: list[RemoteAnswer] = []
        self._channel: grpc.Channel | None = None

    def _call(self, context: PipelineContext) -> Any:
        if self._channel is None:
            self._channel = grpc.insecure_channel(grpc_target(self.entry.endpoint), options=_CHANNEL_OPTIONS)
        wire = wire_context(context)
        timeout_s = self.entry.timeout_seconds
        phase = self.spec.phase
        if phase is Phase.OBSERVE:
            return pb_grpc.ObservePluginStub(self._channel).Observe(
                pb.ObserveStageRequest(context=wire), timeout=timeout_s
            )
        if phase is Phase.PREDICT:
            return pb_grpc.PredictPluginStub(self._channel).Predict(
                pb.PredictStageRequest(context=wire), timeout=timeout_s
            )
        if phase is Phase.PROPOSE:
            return pb_grpc.ProposePluginStub(self._channel).Propose(
                pb.ProposeStageRequest(context=wire), timeout=timeout_s
            )
        if phase is Phase.RECONCILE:
            proposals = []
            for contribution in context.proposals:
                kind, value = _override_result(contribution.overrides)
                result = pb.ProposeResult(plugin_id=contribution.plugin_id, priority=max(0, contribution.priority))
                getattr(result, kind).CopyFrom(value)
                proposals.append(result)
            return pb_grpc.ReconcilePluginStub(self._channel).Reconcile(
                pb.ReconcileStageRequest(context=wire, proposals=proposals), timeout=timeout_s
            )
        return pb_grpc.ConstrainPluginStub(self._channel).Constrain(
            pb.ConstrainStageRequest(context=wire), timeout=timeout_s
        )

    def ask(self, context: PipelineContext) -> RemoteAnswer:
        """Call the plugin once and say what it answered (a failure is an answer too)."""
        base = {"plugin_id": self.spec.plugin_id, "phase": self.spec.phase.value}
        try:
            reply = self._call(context)
        except grpc.RpcError as error:
            reason, detail = _failure(error)
            if reason is ReasonCode.PLUGIN_UNAVAILABLE:
                # A channel that failed to connect waits out a reconnect backoff and fails calls meanwhile: the
                # next call (e.g. the half-open trial after a restart) gets a fresh channel instead.
                self.close()
            return RemoteAnswer(**base, reason=reason, detail=detail)
        try:
            if self.spec.phase is Phase.OBSERVE:
                fields = _observe_answer(reply)
            elif self.spec.phase is Phase.PREDICT:
                fields = _predict_answer(reply)
            else:
                fields = _override_answer(reply)
        except BadAnswer as problem:
            return RemoteAnswer(**base, reason=ReasonCode.PLUGIN_INVALID_RESULT, detail=_one_line(str(problem)))
        fields["detail"] = _one_line(fields.get("detail", ""))
        return RemoteAnswer(**base, **fields)

    def run(self, context: PipelineContext) -> PluginResult:
        answer = self.ask(context)
        self.answers.append(answer)
        return answer_result(self.spec, answer)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _live(plugin: Plugin, entries: dict[str, ExternalPluginConfig]) -> Plugin:
    if isinstance(plugin, RecordedRemotePlugin):
        return GrpcPlugin(plugin.spec, entries[plugin.spec.plugin_id])
    if isinstance(plugin, ConfiguredPlugin) and isinstance(plugin.inner, RecordedRemotePlugin):
        # `plugins.overrides` changed its spec: keep the changed spec, call the process
        return ConfiguredPlugin(spec=plugin.spec, inner=GrpcPlugin(plugin.spec, entries[plugin.spec.plugin_id]))
    return plugin


def connect_remote_plugins(planner: Planner) -> Planner:
    """The planner with its out-of-process plugins called over gRPC (live ticks); unchanged without any."""
    entries = {entry.plugin_id: entry for entry in planner.config.scheduling.external_plugins}
    if not entries:
        return planner
    return dataclasses.replace(planner, plugins=tuple(_live(plugin, entries) for plugin in planner.plugins))


def _grpc_plugins(planner: Planner) -> list[GrpcPlugin]:
    found = []
    for plugin in planner.plugins:
        inner = plugin.inner if isinstance(plugin, ConfiguredPlugin) else plugin
        if isinstance(inner, GrpcPlugin):
            found.append(inner)
    return found


def take_remote_answers(planner: Planner) -> tuple[RemoteAnswer, ...]:
    """The answers the planner's gRPC plugins gave since the last call, in call order per plugin; cleared."""
    answers: list[RemoteAnswer] = []
    for plugin in _grpc_plugins(planner):
        answers.extend(plugin.answers)
        plugin.answers.clear()
    return tuple(answers)
