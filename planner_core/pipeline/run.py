"""One tick of the plugin pipeline: OBSERVE -> PREDICT -> PROPOSE -> RECONCILE -> CONSTRAIN -> EXECUTE.

`run_pipeline(plugins, inputs, state, config, *, clock=None)` is pure apart from the optional `clock` (a callable
returning monotonic seconds) used only for deadlines: without a clock, and with plugins that are themselves pure,
the outcome depends only on the arguments, so a recorded tick replays exactly. The clock never limits a plugin whose
spec says `wall_clock_limits=False` (the builtin plugins: the planner's own pure code), so with no user in-process
plugin a live tick decides as its replay does however slow the machine is. The caller collected `inputs`
(`schedule.observations_needed` tells it what the due plugins read); OBSERVE plugins then add named observations
(a chain like PREDICT: first writer wins per name), recorded as steps and seen by every later plugin.
`inputs.loop` is not used: which logic runs on a tick follows from the plugins' intervals, not from a loop name.

Per tick:

* Plugins are taken in phase order, then priority, then plugin id. A plugin seen for the first time is registered
  at `inputs.now_s`. One that is not due contributes its held result (HOLD_LAST) or nothing (ACCEPT_WHEN_IDLE).
  A due plugin whose `needs` were not observed or whose `requires_produced_fields` are missing is skipped without
  advancing its schedule, so it runs on the next tick where they exist.
* PREDICT is a chain: each plugin sees the fields written before it and only fills the empty ones; `final` ends
  the chain. The other phases are merged with `merge.merge_overrides`, each against the previous phase's result
  (PROPOSE against the expected worker counts). A REJECT stops the pipeline (EXECUTE = skip_short_circuit).
* A plugin that raises, returns something unusable or overruns its `timeout_s` (plugins with `wall_clock_limits`
  only) is recorded and skipped; the tick
  goes on. Its schedule is not advanced (it is retried on the next tick) and its held result is dropped. A
  `PluginFailure` it raises is recorded with its own reason (e.g. PLUGIN_TIMEOUT for a remote deadline). A plugin
  with a circuit breaker (`breaker.py`) counts the failure; while its breaker is open it is not called.
* Deadline: with a clock, the plugins with `wall_clock_limits` have `scheduling.tick_max_duration_seconds` in
  all (the builtin plugins' run times do not count: a loaded machine must not change a decision). Python cannot
  preempt a running plugin, so overruns are detected when the plugin returns: a plugin whose run takes the sum past
  the deadline has its result discarded, later plugins are not run and EXECUTE is skip_tick_timeout. The clock is
  read twice per plugin run (before and after).
* EXECUTE: if no override spoke about any pool (and no outside change is to be restored), skip_no_targets.
  Otherwise a pool whose count someone else changed takes the planner's own count under `outside_change_rule:
  restore` (`policy.ownership`), then the final invariants apply to every managed pool, whoever proposed it: the
  minimum endpoints, then the GPU budget (`policy.bounds`), then a count adopted under `adopt_and_hold` is held
  during its hold, and last the signal guard (`policy.signals`): with a signal the tick expected missing no pool
  shrinks, without worker counts none changes. Pools whose
  target equals the expected count are unchanged; if none changed, skip_no_targets, else apply (advisory when
  `config.advisory`: everything computed and recorded, nothing executed). Like `tick()`, the decision then carries
  every managed pool's target.

"Current" is the expected count (`WorkerCounts.expected`), not the ready count Dynamo uses: while a scale-up is in
flight, comparing with the ready count would turn "keep the target" into a cancellation of the scale-up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from planner_core.config import PlannerConfig, managed_components
from planner_core.domain import (
    Component,
    ExecuteAction,
    HeldResult,
    HoldPolicy,
    ObservedValue,
    PartialPrediction,
    PipelineState,
    PlannerState,
    PluginSchedule,
    ReasonCode,
    ReplicaOverride,
    ReplicaProposal,
    ScalingDecision,
    StepName,
    StepRecord,
    TickInputs,
)
from planner_core.pipeline.breaker import CircuitState, after_failure, after_success, circuit_state, reopens_at_s
from planner_core.pipeline.merge import merge_overrides, merge_predictions
from planner_core.pipeline.schedule import is_due, next_due_s
from planner_core.pipeline.types import (
    MAX_STEP_NAME_CHARS,
    Contribution,
    Observation,
    Phase,
    PipelineContext,
    PipelineOutcome,
    Plugin,
    PluginFailure,
    PluginResult,
    PluginRun,
    PluginSpec,
)
from planner_core.policy.bounds import bound_min_endpoint, fleet_ceiling, guard_config_budget, min_endpoints
from planner_core.policy.ownership import resolve_ownership
from planner_core.policy.signals import SignalHealth, guard_decision

Clock = Callable[[], float]
_MAX_ERROR_CHARS = 300
MAX_OBSERVATION_NAME_CHARS = 60  # an observation is recorded as the step "observation:<name>" (varchar(80))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Output:
    """A plugin's usable contribution this tick: a fresh result (`held_from_s` None) or a replayed one."""

    predictions: PartialPrediction | None = None
    overrides: tuple[ReplicaOverride, ...] = ()
    final: bool = False
    steps: tuple[StepRecord, ...] = ()
    held_from_s: float | None = None
    elapsed_s: float | None = None
    observations: tuple[ObservedValue, ...] = ()


def run_pipeline(
    plugins: Sequence[Plugin],
    inputs: TickInputs,
    state: PlannerState,
    config: PlannerConfig,
    *,
    clock: Clock | None = None,
    health: SignalHealth | None = None,
) -> PipelineOutcome:
    """Run one tick of the plugin pipeline.

    Args:
        plugins: the plugins of this deployment (builtin and user), any order; plugin ids must be unique.
        inputs: what the tick observed; `inputs.now_s` is the tick time every schedule is measured in.
        state: the planner state after the previous tick; `state.pipeline` holds the plugin schedules.
        config: the planner config (mode, min endpoints, GPU budget, advisory, tick deadline).
        clock: monotonic seconds, for the tick deadline and per-plugin timeouts; None disables both.
        health: the signals this tick expected and missed (`planner_core.policy.signals.observe_signals`, which
            `tick()` runs for its loop's builtin plugins): its steps open the tick's explanation, its statuses are
            the next state's, and EXECUTE guards the targets with it. None: no signal is checked.

    Returns:
        The EXECUTE decision, the targets, the next state and the explanation steps.

    Raises:
        ValueError: two plugins share a plugin id (a wiring error of the caller, not a plugin failure).
    """
    return _Tick(plugins, inputs, state, config, clock, health).run()


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_ERROR_CHARS else flat[: _MAX_ERROR_CHARS - 3] + "..."


def _format_fields(prediction: PartialPrediction, names: Sequence[str]) -> str:
    parts = []
    for name in names:
        value = getattr(prediction, name)
        parts.append(f"{name}={value:g}" if isinstance(value, float | int) else f"{name}={value}")
    return ", ".join(parts)


def _result_problem(spec: PluginSpec, result: object) -> str | None:
    """Why a plugin's return value cannot be used, or None."""
    if result is None:
        return None
    if not isinstance(result, PluginResult):
        return f"returned {type(result).__name__}, not a PluginResult"
    if result.predictions is not None and not isinstance(result.predictions, PartialPrediction):
        return f"predictions is {type(result.predictions).__name__}, not a PartialPrediction"
    if not isinstance(result.overrides, tuple | list):
        return f"overrides is {type(result.overrides).__name__}, not a tuple"
    if spec.phase in (Phase.OBSERVE, Phase.PREDICT) and result.overrides:
        return f"a {spec.phase.value.upper()} plugin returned overrides"
    if spec.phase is not Phase.PREDICT and result.predictions is not None:
        return f"a {spec.phase.value.upper()} plugin returned predictions"
    if not isinstance(result.observations, tuple | list):
        return f"observations is {type(result.observations).__name__}, not a tuple"
    if spec.phase is not Phase.OBSERVE and result.observations:
        return f"a {spec.phase.value.upper()} plugin returned observations"
    for observed in result.observations:
        if not isinstance(observed, ObservedValue) or not isinstance(observed.name, str):
            return f"an observation is not an ObservedValue: {observed!r}"
        if not observed.name or len(observed.name) > MAX_OBSERVATION_NAME_CHARS:
            return f"observation name {observed.name!r} is not 1 to {MAX_OBSERVATION_NAME_CHARS} characters"
        value = observed.value
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return f"observation {observed.name!r} = {value!r} is not a finite number"
    if not isinstance(result.final, bool):
        return f"final is {result.final!r}, not a bool"
    if not isinstance(result.steps, tuple | list):
        return f"steps is {type(result.steps).__name__}, not a tuple"
    for step in result.steps:
        if not isinstance(step, StepRecord) or not isinstance(step.reason, ReasonCode):
            return f"a step is not a StepRecord with a ReasonCode: {step!r}"
        if not isinstance(step.step, str) or len(step.step) > MAX_STEP_NAME_CHARS:
            return f"step name {step.step!r} is not a string of at most {MAX_STEP_NAME_CHARS} characters"
    if result.state is not None and not isinstance(result.state, PlannerState):
        return f"state is {type(result.state).__name__}, not a PlannerState"
    return None


class _Tick:
    """The mutable bookkeeping of one `run_pipeline` call (nothing survives the call)."""

    def __init__(
        self,
        plugins: Sequence[Plugin],
        inputs: TickInputs,
        state: PlannerState,
        config: PlannerConfig,
        clock: Clock | None,
        health: SignalHealth | None,
    ) -> None:
        self.inputs = inputs
        self.config = config
        self.clock = clock
        self.now_s = inputs.now_s
        self.state = state
        self.steps: list[StepRecord] = []
        self.runs: list[PluginRun] = []
        self.components = managed_components(config.mode)
        self.expected = {c: inputs.workers.expected(c) for c in self.components}
        # seconds the plugins held to the wall clock have run so far this tick (the tick deadline's budget)
        self.timed_spent_s = 0.0
        self.stop: ReasonCode | None = None  # SKIP_SHORT_CIRCUIT or SKIP_TICK_TIMEOUT once the pipeline stopped
        self.stop_detail = ""
        self.predictions = PartialPrediction()
        self.observations: list[ObservedValue] = []
        self.produced: set[str] = set()
        self.entries = self._entries(plugins)
        # Schedules of plugins absent from this tick (the other loop's builtin plugins) are carried forward untouched.
        self.schedules: dict[str, PluginSchedule] = {known.plugin_id: known for known in state.pipeline.plugins}
        for spec, _ in self.entries:
            known = state.pipeline.schedule(spec.plugin_id)
            self.schedules[spec.plugin_id] = known or PluginSchedule(
                plugin_id=spec.plugin_id, registered_at_s=self.now_s
            )
        # safe actuation (ours): the signals this tick misses (observed by the caller) and the rule for counts
        # changed outside the planner, decided before any plugin runs and applied in EXECUTE after every other
        # bound (no plugin escapes them)
        self.health = health or SignalHealth(statuses=state.signals, missing=(), steps=())
        self.steps.extend(self.health.steps)
        self.ownership = resolve_ownership(config, inputs, state.adopted_counts)

    def _entries(self, plugins: Sequence[Plugin]) -> list[tuple[PluginSpec, Plugin]]:
        entries: list[tuple[PluginSpec, Plugin]] = []
        seen: set[str] = set()
        for plugin in plugins:
            try:
                spec = plugin.spec
            except Exception as exc:  # a user plugin's spec property failed: record it, run the others
                self.steps.append(
                    StepRecord(
                        step=StepName.PLUGIN,
                        reason=ReasonCode.PLUGIN_RAISED,
                        detail=_one_line(f"{type(plugin).__name__}.spec raised {type(exc).__name__}: {exc}"),
                    )
                )
                continue
            if not isinstance(spec, PluginSpec):
                self.steps.append(
                    StepRecord(
                        step=StepName.PLUGIN,
                        reason=ReasonCode.PLUGIN_INVALID_RESULT,
                        detail=f"{type(plugin).__name__}.spec is {type(spec).__name__}, not a PluginSpec; not run",
                    )
                )
                continue
            if spec.plugin_id in seen:
                raise ValueError(f"run_pipeline: plugin id {spec.plugin_id!r} is used by two plugins")
            seen.add(spec.plugin_id)
            entries.append((spec, plugin))
        entries.sort(key=lambda entry: entry[0].order_key)
        return entries

    # --- recording ---------------------------------------------------------------------------------------------

    def _record(
        self,
        spec: PluginSpec,
        reason: ReasonCode,
        detail: str,
        *,
        ran: bool = False,
        elapsed_s: float | None = None,
    ) -> None:
        # Run times vary from run to run, so only an overrun (where the time is the reason) enters the explanation:
        # a replayed tick must explain itself exactly as the recorded one did.
        overran = reason in (ReasonCode.PLUGIN_TIMEOUT, ReasonCode.SKIP_TICK_TIMEOUT)
        self.steps.append(
            StepRecord(
                step=f"{spec.phase.value}:{spec.plugin_id}",
                reason=reason,
                value=elapsed_s if overran else None,
                detail=detail,
            )
        )
        self.runs.append(
            PluginRun(plugin_id=spec.plugin_id, phase=spec.phase, reason=reason, ran=ran, elapsed_s=elapsed_s)
        )

    def _failed(self, spec: PluginSpec, reason: ReasonCode, detail: str, elapsed_s: float | None = None) -> None:
        """A due plugin's run is unusable: record it, keep its schedule (retry next tick), drop its held result."""
        self._record(spec, reason, detail + "; retried next tick", elapsed_s=elapsed_s)
        schedule = dataclasses.replace(self.schedules[spec.plugin_id], held=None)
        if spec.breaker is not None:
            schedule, opened = after_failure(spec.breaker, schedule, self.now_s)
            if opened:
                self.steps.append(
                    StepRecord(
                        step=f"{spec.phase.value}:{spec.plugin_id}",
                        reason=ReasonCode.PLUGIN_CIRCUIT_OPENED,
                        detail=f"circuit opened: not called until t={reopens_at_s(spec.breaker, schedule):g}"
                        f" ({spec.breaker.failure_threshold} failures within {spec.breaker.window_s:g} s,"
                        f" cool-down {spec.breaker.cooldown_s:g} s)",
                    )
                )
        self.schedules[spec.plugin_id] = schedule

    # --- one plugin --------------------------------------------------------------------------------------------

    def _observed(self, need: Observation) -> bool:
        if need is Observation.TRAFFIC:
            return self.inputs.traffic is not None
        if need is Observation.FPM:
            return bool(self.inputs.fpm)
        return True  # worker counts are part of every tick's inputs

    def _turn(
        self,
        spec: PluginSpec,
        plugin: Plugin,
        proposals: tuple[Contribution, ...],
        targets: MappingProxyType[Component, int],
    ) -> _Output | None:
        """Give one plugin its turn: a fresh result, a replayed one, or None (skipped, no opinion or failed)."""
        schedule = self.schedules[spec.plugin_id]
        if self.stop is not None:
            self._record(spec, self.stop, f"not run: {self.stop_detail}")
            return None
        if not is_due(spec, schedule, self.now_s):
            return self._not_due(spec, schedule)
        if self._blocked(spec, schedule):
            return None
        # Only plugins with wall_clock_limits are held to time; the others (builtin, pure) are just measured.
        timed = self.clock is not None and spec.wall_clock_limits
        budget_s = self.config.scheduling.tick_max_duration_seconds
        if timed and self.timed_spent_s >= budget_s:
            self._stop(ReasonCode.SKIP_TICK_TIMEOUT, "the tick deadline passed")
            self._record(spec, ReasonCode.SKIP_TICK_TIMEOUT, "not run: the tick deadline passed")
            return None
        context = PipelineContext(
            inputs=self.inputs,
            state=self.state,
            config=self.config,
            spec=spec,
            predictions=self.predictions,
            proposals=proposals,
            targets=targets,
            produced=frozenset(self.produced),
            observations=tuple(self.observations),
        )
        started = self.clock() if self.clock is not None else None
        try:
            result = plugin.run(context)
        except PluginFailure as failure:  # a failure the plugin classified itself (e.g. a remote deadline)
            self._failed(spec, failure.reason, _one_line(failure.detail), self._spent(started, timed))
            return None
        except Exception as exc:  # a plugin's failure is recorded, never propagated: the tick goes on
            self._failed(
                spec, ReasonCode.PLUGIN_RAISED, _one_line(f"{type(exc).__name__}: {exc}"), self._spent(started, timed)
            )
            return None
        elapsed_s = self._spent(started, timed)
        if timed and elapsed_s is not None and self._overran(spec, elapsed_s, budget_s):
            return None
        problem = _result_problem(spec, result)
        if problem is not None:
            self._failed(spec, ReasonCode.PLUGIN_INVALID_RESULT, _one_line(problem), elapsed_s)
            return None
        return self._accepted(spec, schedule, result if isinstance(result, PluginResult) else PluginResult(), elapsed_s)

    def _not_due(self, spec: PluginSpec, schedule: PluginSchedule) -> _Output | None:
        """A plugin not due this tick: its held result replayed (`hold_last`), else a `plugin_not_due` step."""
        if spec.hold_policy is HoldPolicy.HOLD_LAST and schedule.held is not None:
            held = schedule.held
            return _Output(
                predictions=held.predictions,
                overrides=held.overrides,
                final=held.final,
                held_from_s=held.produced_at_s,
                observations=held.observations,
            )
        detail = f"not due until t={next_due_s(spec, schedule):g}"
        if spec.hold_policy is HoldPolicy.HOLD_LAST:
            detail += "; no result held yet"
        self._record(spec, ReasonCode.PLUGIN_NOT_DUE, detail)
        return None

    def _blocked(self, spec: PluginSpec, schedule: PluginSchedule) -> bool:
        """Whether a due plugin may not run this tick (recorded): an observation it needs or a field it requires is
        missing, or its circuit is open. A half-open circuit lets it run once, as a trial (recorded too)."""
        missing_needs = [need for need in spec.needs if not self._observed(need)]
        if missing_needs:
            reason = ReasonCode.NO_TRAFFIC_DATA if Observation.TRAFFIC in missing_needs else ReasonCode.NO_FPM_DATA
            names = ", ".join(need.value for need in missing_needs)
            self._record(spec, reason, f"needs {names}, not observed this tick; retried next tick")
            return True
        missing_fields = [name for name in spec.requires_produced_fields if name not in self.produced]
        if missing_fields:
            names = ", ".join(missing_fields)
            self._record(spec, ReasonCode.REQUIRED_FIELDS_MISSING, f"requires {names}, not produced; retried next tick")
            return True
        if spec.breaker is None:
            return False
        state = circuit_state(spec.breaker, schedule, self.now_s)
        if state is CircuitState.OPEN:
            detail = (
                f"not called: circuit open since t={schedule.circuit_opened_at_s:g},"
                f" trial call from t={reopens_at_s(spec.breaker, schedule):g}"
            )
            self._record(spec, ReasonCode.PLUGIN_CIRCUIT_OPEN, detail)
            self.schedules[spec.plugin_id] = dataclasses.replace(schedule, held=None)
            return True
        if state is CircuitState.HALF_OPEN:
            self.steps.append(
                StepRecord(
                    step=f"{spec.phase.value}:{spec.plugin_id}",
                    reason=ReasonCode.PLUGIN_CIRCUIT_HALF_OPEN,
                    detail=f"cool-down over (opened at t={schedule.circuit_opened_at_s:g}): one trial call",
                )
            )
        return False

    def _overran(self, spec: PluginSpec, elapsed_s: float, budget_s: float) -> bool:
        """Whether a timed plugin's result is discarded (recorded as a failure): it finished after the tick
        deadline (which also stops the tick) or took longer than its own timeout."""
        if self.timed_spent_s > budget_s:
            self._stop(ReasonCode.SKIP_TICK_TIMEOUT, f"the tick deadline passed while {spec.plugin_id} ran")
            self._failed(
                spec,
                ReasonCode.SKIP_TICK_TIMEOUT,
                f"finished after the tick deadline ({budget_s:g} s); result discarded",
                elapsed_s,
            )
            return True
        if elapsed_s > spec.effective_timeout_s:
            self._failed(
                spec,
                ReasonCode.PLUGIN_TIMEOUT,
                f"took {elapsed_s:.3f} s > timeout {spec.effective_timeout_s:g} s; result discarded",
                elapsed_s,
            )
            return True
        return False

    def _accepted(
        self, spec: PluginSpec, schedule: PluginSchedule, result: PluginResult, elapsed_s: float | None
    ) -> _Output:
        """A plugin's valid result taken: held for later ticks (`hold_last`), its run and a trial call's success
        recorded in its schedule, its state taken (the pipeline keeps the schedules), its output returned."""
        overrides = tuple(result.overrides)
        observations = tuple(result.observations)
        held = None
        if spec.hold_policy is HoldPolicy.HOLD_LAST:
            held = HeldResult(
                produced_at_s=self.now_s,
                predictions=result.predictions,
                overrides=overrides,
                final=result.final,
                observations=observations,
            )
        schedule = dataclasses.replace(schedule, last_run_at_s=self.now_s, held=held)
        if spec.breaker is not None:
            schedule, closed = after_success(spec.breaker, schedule, self.now_s)
            if closed:
                self.steps.append(
                    StepRecord(
                        step=f"{spec.phase.value}:{spec.plugin_id}",
                        reason=ReasonCode.PLUGIN_CIRCUIT_CLOSED,
                        detail="the trial call succeeded: circuit closed",
                    )
                )
        self.schedules[spec.plugin_id] = schedule
        if result.state is not None:
            # The pipeline owns the plugin schedules; a plugin's state never overwrites them.
            self.state = dataclasses.replace(result.state, pipeline=self.state.pipeline)
        return _Output(
            predictions=result.predictions,
            overrides=overrides,
            final=result.final,
            steps=tuple(result.steps),
            elapsed_s=elapsed_s,
            observations=observations,
        )

    def _stop(self, reason: ReasonCode, detail: str) -> None:
        if self.stop is None:
            self.stop, self.stop_detail = reason, detail

    # --- phases ------------------------------------------------------------------------------------------------

    def _phase_entries(self, phase: Phase) -> list[tuple[PluginSpec, Plugin]]:
        return [(spec, plugin) for spec, plugin in self.entries if spec.phase is phase]

    def _observe(self) -> None:
        """OBSERVE: each plugin's named observations, first writer (smallest priority) wins per name; every
        value taken is a step of the tick, so the record shows what later plugins saw."""
        for spec, plugin in self._phase_entries(Phase.OBSERVE):
            out = self._turn(spec, plugin, (), MappingProxyType(self.expected))
            if out is None:
                continue
            known = {observed.name for observed in self.observations}
            taken = [observed for observed in out.observations if observed.name not in known]
            shadowed = [observed.name for observed in out.observations if observed.name in known]
            self.observations.extend(taken)
            detail = ", ".join(f"{o.name}={o.value:g}" for o in taken) if taken else "no observation added"
            if shadowed:
                detail += "; already observed by an earlier plugin: " + ", ".join(shadowed)
            if out.held_from_s is not None:
                self._record(spec, ReasonCode.PLUGIN_HELD_OVER, f"replayed result of t={out.held_from_s:g}: {detail}")
            else:
                reason = ReasonCode.PLUGIN_OBSERVED if out.observations else ReasonCode.PLUGIN_NO_OPINION
                self._record(spec, reason, detail, ran=True, elapsed_s=out.elapsed_s)
            self.steps.extend(out.steps)
            for observed in taken:
                self.steps.append(
                    StepRecord(
                        step=f"observation:{observed.name}",
                        reason=ReasonCode.OBSERVED,
                        value=float(observed.value),
                        detail=f"from {spec.plugin_id}",
                    )
                )

    def _predict(self) -> None:
        chain = self._phase_entries(Phase.PREDICT)
        ended_by: str | None = None
        for position, (spec, plugin) in enumerate(chain):
            if ended_by is not None:
                self._record(spec, ReasonCode.PREDICT_CHAIN_FINAL, f"not run: {ended_by} ended the chain (final)")
                continue
            out = self._turn(spec, plugin, (), MappingProxyType(self.expected))
            if out is None:
                continue
            written = out.predictions or PartialPrediction()
            self.predictions, taken, shadowed = merge_predictions(self.predictions, written)
            # Later PREDICT plugins may require what this one wrote.
            self.produced.update(f"predictions.{name}" for name in taken)
            if self.predictions.complete() is not None:
                self.produced.add("predictions")
            detail = _format_fields(written, taken) if taken else "no field written"
            if shadowed:
                detail += "; already written by an earlier plugin: " + ", ".join(shadowed)
            if out.held_from_s is not None:
                self._record(spec, ReasonCode.PLUGIN_HELD_OVER, f"replayed result of t={out.held_from_s:g}: {detail}")
            else:
                reason = ReasonCode.PREDICTED if written.fields_set() else ReasonCode.PLUGIN_NO_OPINION
                self._record(spec, reason, detail, ran=True, elapsed_s=out.elapsed_s)
            self.steps.extend(out.steps)
            if out.final:
                ended_by = spec.plugin_id
                detail = "final: the PREDICT plugins after it are not run"
                if position > 0:
                    # Dynamo audits this: a final plugin that is not first lets earlier plugins' fields stand.
                    detail += "; warning: not the first plugin of the chain"
                self.steps.append(
                    StepRecord(step=f"predict:{spec.plugin_id}", reason=ReasonCode.PREDICT_CHAIN_FINAL, detail=detail)
                )

    def _override_phase(
        self, phase: Phase, proposals: tuple[Contribution, ...], targets: MappingProxyType[Component, int]
    ) -> tuple[Contribution, ...]:
        contributions: list[Contribution] = []
        for spec, plugin in self._phase_entries(phase):
            out = self._turn(spec, plugin, proposals, targets)
            if out is None:
                continue
            count = len(out.overrides)
            summary = "no overrides" if count == 0 else f"{count} override{'' if count == 1 else 's'}"
            if out.final:
                summary += ", final"
            if out.held_from_s is not None:
                self._record(spec, ReasonCode.PLUGIN_HELD_OVER, f"replayed result of t={out.held_from_s:g}: {summary}")
            else:
                reason = ReasonCode.PLUGIN_OVERRIDES if out.overrides else ReasonCode.PLUGIN_NO_OPINION
                self._record(spec, reason, summary, ran=True, elapsed_s=out.elapsed_s)
            self.steps.extend(out.steps)
            contributions.append(
                Contribution(
                    plugin_id=spec.plugin_id,
                    phase=phase,
                    priority=spec.priority,
                    overrides=out.overrides,
                    final=out.final,
                    held_from_s=out.held_from_s,
                )
            )
        return tuple(contributions)

    # --- the tick ----------------------------------------------------------------------------------------------

    def _spent(self, started: float | None, timed: bool) -> float | None:
        """Seconds since `started` (None without a clock), added to the tick deadline's budget when `timed`."""
        if self.clock is None or started is None:
            return None
        elapsed_s = self.clock() - started
        if timed:
            self.timed_spent_s += elapsed_s
        return elapsed_s

    def run(self) -> PipelineOutcome:
        self._observe()
        self._predict()

        targets = MappingProxyType(dict(self.expected))
        proposals: tuple[Contribution, ...] = ()
        touched: set[Component] = set()
        short_circuit_reason = ""
        for phase in (Phase.PROPOSE, Phase.RECONCILE, Phase.CONSTRAIN):
            contributions = self._override_phase(phase, proposals, targets)
            if self.stop is ReasonCode.SKIP_SHORT_CIRCUIT:
                continue  # plugins of the later phases are recorded as not run, nothing is merged
            merged = merge_overrides(phase, contributions, targets)
            self.steps.extend(merged.steps)
            if merged.rejected_by is not None:
                short_circuit_reason = merged.short_circuit_reason
                self._stop(ReasonCode.SKIP_SHORT_CIRCUIT, f"{phase.value} short-circuited ({short_circuit_reason})")
                continue
            targets = MappingProxyType(dict(merged.targets))
            touched |= merged.touched
            proposals += contributions
            if phase is Phase.PROPOSE and any(c.overrides for c in contributions):
                self.produced.add("proposals")
        return self._execute(targets, touched, short_circuit_reason)

    def _execute(
        self, targets: MappingProxyType[Component, int], touched: set[Component], short_circuit_reason: str
    ) -> PipelineOutcome:
        proposals: tuple[ReplicaProposal, ...] = ()
        decision = ScalingDecision()
        self.steps.extend(self.ownership.steps)
        if self.stop is ReasonCode.SKIP_SHORT_CIRCUIT:
            action, detail = ExecuteAction.SKIP_SHORT_CIRCUIT, short_circuit_reason
        elif self.stop is ReasonCode.SKIP_TICK_TIMEOUT:
            action, detail = ExecuteAction.SKIP_TICK_TIMEOUT, self.stop_detail
        elif not touched and not self.ownership.restore:
            action, detail = ExecuteAction.SKIP_NO_TARGETS, "no plugin had an opinion about replica counts"
        else:
            # outside_change_rule restore: the planner's own count is the pool's target, then the usual bounds
            targets = MappingProxyType({**targets, **self.ownership.restore})
            wanted = self._final_invariants(targets)
            # The proposals are what the planner wants (a fleet's arbitration reads them as the member's claim);
            # the decision is what the fleet's ceiling lets it have.
            final = self._fleet_ceiling(wanted)
            # an adopted outside count is held as it is (the operator's), and no signal missing lets a pool shrink
            final = {c: self.ownership.hold.get(c, value) for c, value in final.items()}
            final, guard_steps = guard_decision(self.health.missing, self.expected, final)
            self.steps.extend(guard_steps)
            changed = [c for c in self.components if final[c] != self.expected[c]]
            proposals = tuple(
                ReplicaProposal(
                    component=c,
                    current=self.expected[c],
                    desired=wanted[c],
                    reason=ReasonCode.SCALE if wanted[c] != self.expected[c] else ReasonCode.NO_CHANGE,
                )
                for c in self.components
            )
            detail = ", ".join(f"{c.value} {self.expected[c]} -> {final[c]}" for c in self.components)
            if not changed:
                action = ExecuteAction.SKIP_NO_TARGETS
                detail = "every target equals the expected count: " + detail
            else:
                action = ExecuteAction.ADVISORY if self.config.advisory else ExecuteAction.APPLY
                decision = ScalingDecision(
                    num_prefill=final.get(Component.PREFILL),
                    num_decode=final.get(Component.DECODE),
                    advisory=self.config.advisory,
                )
                if self.config.advisory:
                    detail = "advisory mode, not executed: " + detail
        self.steps.append(StepRecord(step=StepName.EXECUTE, reason=ReasonCode(action.value), detail=detail))
        pipeline = PipelineState(plugins=tuple(self.schedules[key] for key in sorted(self.schedules)))
        next_state = dataclasses.replace(
            self.state, pipeline=pipeline, signals=self.health.statuses, adopted_counts=self.ownership.adopted
        )
        return PipelineOutcome(
            action=action,
            decision=decision,
            proposals=proposals,
            next_state=next_state,
            steps=tuple(self.steps),
            predictions=self.predictions,
            runs=tuple(self.runs),
            short_circuit_reason=short_circuit_reason,
            observations=tuple(self.observations),
        )

    def _final_invariants(self, targets: MappingProxyType[Component, int]) -> dict[Component, int]:
        """Minimum endpoints, then the GPU budget guard (against the expected counts): hard limits whichever plugin
        proposed the targets."""
        floors = min_endpoints(self.config)
        final: dict[Component, int] = {}
        for component in self.components:
            final[component], step = bound_min_endpoint(component, targets[component], floors[component])
            self.steps.append(step)
        guarded, step = guard_config_budget(self.config, self.expected, final)
        self.steps.append(step)
        return guarded

    def _fleet_ceiling(self, wanted: dict[Component, int]) -> dict[Component, int]:
        """A fleet member's targets under its fleet ceiling (`TickInputs.gpu_ceiling`); unchanged outside a fleet."""
        if self.inputs.gpu_ceiling is None:
            return wanted
        final, step = fleet_ceiling(self.config, self.expected, wanted, self.inputs.gpu_ceiling)
        self.steps.append(step)
        return final
