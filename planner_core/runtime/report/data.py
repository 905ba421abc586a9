"""The report's data: the recorded tick, step, engine-load and decision-event rows of one deployment over a
window (`ReportData`), and the constants the charts and the page share."""

from __future__ import annotations

from dataclasses import dataclass

from planner_core.domain import Loop, ReasonCode

# Step reasons every sized tick records; the reason timeline leaves them out so the exceptions stand out.
ROUTINE_STEP_REASONS = frozenset(
    {
        ReasonCode.OBSERVED.value,
        ReasonCode.WITHIN_RANGE.value,
        ReasonCode.PREDICTED.value,
        ReasonCode.CAPACITY_FROM_PROFILE.value,
        ReasonCode.DEMAND_SIZED.value,
    }
)
MAX_DECISION_ROWS = 200  # the decisions table shows the newest ones; the charts show all
NO_DATA = "no data recorded"


@dataclass(frozen=True, slots=True, kw_only=True)
class TickRow:
    """One recorded tick with what it observed, forecast, proposed and decided (None = not recorded).

    Attributes:
        at_s: the tick's scheduled time (epoch seconds); a throughput tick observed the window ending here.
        lag_s: recorded_at - scheduled_at (s).
        window_s: length of the observed traffic window (s).
        prefill_engine_tokens_per_s, decode_engine_tokens_per_s: one engine's capacity under the SLA at the
            forecast shape (the `capacity` step, or the `engine_capacity` step's requests/s times the forecast
            ISL / OSL; see the `tick_summary` view).
        ttft_target_ms .. throughput_interval_s: from the config the tick ran under.
        why: the decision's explanation with its numbers (`decision_history.why`); None without a decision.
    """

    tick_id: int
    loop: Loop
    at_s: float
    lag_s: float
    reason: str
    decide_ms: float
    window_s: float | None = None
    observed_num_req: float | None = None
    observed_isl: float | None = None
    observed_osl: float | None = None
    observed_ttft_ms: float | None = None
    observed_itl_ms: float | None = None
    predictor: str | None = None
    predicted_num_req: float | None = None
    predicted_isl: float | None = None
    predicted_osl: float | None = None
    prediction_reason: str | None = None
    ready_prefill: int | None = None
    ready_decode: int | None = None
    expected_prefill: int | None = None
    expected_decode: int | None = None
    proposed_prefill: int | None = None
    proposed_decode: int | None = None
    prefill_engine_tokens_per_s: float | None = None
    decode_engine_tokens_per_s: float | None = None
    decision_id: int | None = None
    target_prefill: int | None = None
    target_decode: int | None = None
    decision_status: str | None = None
    ttft_target_ms: float | None = None
    itl_target_ms: float | None = None
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1
    throughput_interval_s: float | None = None
    why: str | None = None

    @property
    def ready_gpus(self) -> int | None:
        if self.ready_prefill is None or self.ready_decode is None:
            return None
        return self.ready_prefill * self.prefill_gpus_per_engine + self.ready_decode * self.decode_gpus_per_engine


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """A non-routine explanation step of a tick (routine ones are not loaded)."""

    tick_id: int
    loop: Loop
    at_s: float
    seq: int
    step: str
    component: str | None
    reason: str
    value: float | None
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLoadRow:
    """One engine's queues as a tick saw them (from `fpm_snapshots`); tokens."""

    at_s: float
    component: str
    worker_id: str
    dp_rank: int
    queued_prefill_tokens: float | None
    queued_decode_kv_tokens: float | None
    inflight_decode_kv_tokens: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionEvent:
    """Something that happened to a decision after its tick: an execution attempt or an acknowledgement."""

    decision_id: int
    at_s: float
    event: str  # an execution outcome (`applied`, `blocked_unacknowledged`, ...) or `acknowledged`
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportData:
    """Everything one report shows, for one deployment over [since, until)."""

    deployment: str
    since_s: float | None
    until_s: float | None
    ticks: tuple[TickRow, ...]
    steps: tuple[StepRow, ...] = ()
    engine_loads: tuple[EngineLoadRow, ...] = ()
    decision_events: tuple[DecisionEvent, ...] = ()

    def loop_ticks(self, loop: Loop) -> list[TickRow]:
        return [t for t in self.ticks if t.loop is loop]


class UnknownDeployment(LookupError):
    """The deployment named for a report has never been recorded."""
