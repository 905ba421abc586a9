"""Out-of-process plugins, seen from the pure core: their specs, and their recorded answers as plugin results.

A plugin listed in `scheduling.external_plugins` runs in another process and is called over gRPC by the runtime
(`planner_core.runtime.plugin_client`). The core never calls it. What the core knows of it is:

* its `PluginSpec` (`external_plugin_spec`), built from the config entry, always with a circuit breaker;
* its answer in one phase of one tick, a `RemoteAnswer` (a domain record: the overrides, forecast fields or
  observations it returned, or why the call failed), turned into its `PluginResult` by `answer_result`, the one
  conversion live ticks and replay share.

`RecordedRemotePlugin` is the plugin the core runs for it: it reads its answer from the tick's inputs
(`TickInputs.remote`, recorded with the tick) and never calls anything, so a replayed tick decides exactly as the
recorded one without the plugin running. The runtime's live plugin calls the remote process, keeps the answer for
the record, and returns the same `answer_result`.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner_core.config import ExternalPluginConfig, PlannerConfig
from planner_core.domain import ReasonCode, RemoteAnswer
from planner_core.pipeline.types import (
    BreakerSpec,
    Observation,
    Phase,
    PipelineContext,
    PluginFailure,
    PluginResult,
    PluginSpec,
)

# The pipeline measures a remote plugin's run with its own clock too; the gRPC deadline (`timeout_seconds`) must be
# what fires, because only that outcome is recorded as the answer, so the pipeline's limit is set this much later.
REMOTE_TIMEOUT_GRACE_S = 1.0


def external_plugin_spec(entry: ExternalPluginConfig) -> PluginSpec:
    """The pipeline spec of one `scheduling.external_plugins` entry."""
    breaker = entry.circuit_breaker
    return PluginSpec(
        plugin_id=entry.plugin_id,
        phase=Phase(entry.plugin_type),
        priority=entry.priority,
        interval_s=entry.execution_interval_seconds or None,
        hold_policy=entry.hold_policy,
        needs=tuple(Observation(need) for need in entry.needs),
        requires_produced_fields=entry.requires_produced_fields,
        timeout_s=entry.timeout_seconds + REMOTE_TIMEOUT_GRACE_S,
        breaker=BreakerSpec(
            failure_threshold=breaker.failure_threshold,
            window_s=breaker.window_seconds,
            cooldown_s=breaker.cooldown_seconds,
        ),
    )


def answer_result(spec: PluginSpec, answer: RemoteAnswer | None) -> PluginResult:
    """A remote plugin's answer as its result this tick.

    Raises:
        PluginFailure: the call failed (the answer's reason: timeout, unavailable, error, garbage), or there is no
            answer (PLUGIN_ANSWER_MISSING: a replayed tick whose record lacks it).
    """
    if answer is None:
        raise PluginFailure(
            ReasonCode.PLUGIN_ANSWER_MISSING, f"no recorded answer of {spec.plugin_id} in {spec.phase.value}"
        )
    if answer.failed:
        raise PluginFailure(answer.reason, answer.detail)
    return PluginResult(
        observations=answer.observations,
        predictions=answer.predictions,
        overrides=answer.overrides,
        final=answer.final,
    )


@dataclass(frozen=True, slots=True)
class RecordedRemotePlugin:
    """An out-of-process plugin as the core runs it: its answer is read from the tick's recorded inputs."""

    spec: PluginSpec
    endpoint: str

    def run(self, context: PipelineContext) -> PluginResult:
        return answer_result(self.spec, context.inputs.remote_answer(self.spec.plugin_id, self.spec.phase.value))


def recorded_remote_plugins(config: PlannerConfig) -> tuple[RecordedRemotePlugin, ...]:
    """The configured out-of-process plugins, answering from the record (what replay runs)."""
    return tuple(
        RecordedRemotePlugin(spec=external_plugin_spec(entry), endpoint=entry.endpoint)
        for entry in config.scheduling.external_plugins
    )
