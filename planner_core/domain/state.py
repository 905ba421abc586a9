"""Cross-tick state of one managed deployment (`PlannerState`, stored as JSONB after every tick) and the loops'
own parts of it: the threshold load planner's interval, the throughput loop's recent needs, the measured start-up
times and the horizon windows. The perf models', predictors' and pipeline's state have modules of their own."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner_core.domain.actuation import AdoptedCount, SignalStatus
from planner_core.domain.components import Component
from planner_core.domain.forecast import LoadHistory
from planner_core.domain.observations import PromptBurstQuantiles
from planner_core.domain.perf_state import OnlinePerfState
from planner_core.domain.pipeline_state import PipelineState


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdPlannerState:
    """Cross-tick state of the 2025 threshold load planner (`load_policy: threshold_2025`).

    The planner samples every load tick and decides once per adjustment interval on the interval's averages, so
    it carries the samples of the interval in progress. An interval starts on the first stable tick (no scale in
    flight) and restarts after every adjustment, and whenever a scale is in flight (sampling is blocked then).

    Attributes:
        interval_start_s: scheduled time of the tick that opened the interval in progress; None = no interval open.
        interval_num_prefill, interval_num_decode: ready workers when the interval opened; an adjustment is skipped
            if they changed meanwhile (the averages would mix two fleet sizes).
        prefill_queue_samples: queued prefill requests summed over the prefill engines, one per sampled tick, oldest
            first (the first and last give the queue trend).
        decode_kv_samples: KV-cache utilisation (0..1, queued KV included) averaged over the decode engines, one
            per sampled tick, oldest first.
        decode_grace_intervals_left: adjustments that still may not remove a decode worker (set after adding one).
    """

    interval_start_s: float | None = None
    interval_num_prefill: int = 0
    interval_num_decode: int = 0
    prefill_queue_samples: tuple[float, ...] = ()
    decode_kv_samples: tuple[float, ...] = ()
    decode_grace_intervals_left: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SizedNeed:
    """What the throughput loop sized each pool for at one tick, before bounds (kept for the scale-down hold)."""

    at_s: float
    num_prefill: int
    num_decode: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingScaleUp:
    """A pool's scale-up the planner decided and is waiting to see ready (for the measured start-up time).

    `at_s` is the tick that raised the pool's target to `target` engines; `applied_at_s` when the execution flow
    applied a decision with at least that target through the connector (its acknowledgement), once a tick's
    `TickInputs.applied` has shown it. The start-up runs from `at_s` until a tick sees `target` engines ready."""

    component: Component
    at_s: float
    target: int
    applied_at_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartupSample:
    """One completed scale-up: `startup_s` from the tick that raised the target to the first tick that saw the new
    engines ready (an upper bound, to within one tick interval), observed at `at_s`; `apply_s`, of that time, from
    the raising tick to the connector's acknowledgement of the target (None where no acknowledgement was seen: the
    connector applied it within the deciding tick)."""

    component: Component
    at_s: float
    startup_s: float
    apply_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartupState:
    """The measured start-up times (ours): scale-ups in flight and the last completed ones, per pool."""

    pending: tuple[PendingScaleUp, ...] = ()
    samples: tuple[StartupSample, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HorizonWindow:
    """One throughput window for the learned horizon headroom (ours), per pool in engines before rounding up:
    `planned_*` is what the tick at `at_s` sized the pool for (its forecast: mean rate and prompt bursts), and
    `observed_*` what the window that ended at `at_s` needed (the same sizing on what was observed)."""

    at_s: float
    planned_prefill: float = 0.0
    observed_prefill: float = 0.0
    planned_decode: float = 0.0
    observed_decode: float = 0.0

    def planned(self, component: Component) -> float:
        return self.planned_prefill if component is Component.PREFILL else self.planned_decode

    def observed(self, component: Component) -> float:
        return self.observed_prefill if component is Component.PREFILL else self.observed_decode


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolFeedback:
    """What the closed loop (ours, `planner_core.policy.feedback`) learned of one pool's engines.

    Attributes:
        speed: the engines' speed in the pool's phase as a multiple of the perf model's (0.8: each iteration takes
            1 / 0.8 of the model's time), learned from the latency the pool served; 1.0 until learned.
        num_updates: windows that changed `speed`.
        last_ready: engines ready at the previous throughput tick (a window counts only when the pool held the same
            ready engines from its start to its end); -1 before the first.
        last_measured: the last window's measured speed, where one was measured.
    """

    speed: float = 1.0
    num_updates: int = 0
    last_ready: int = -1
    last_measured: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityFeedback:
    """The closed loop's learned engine speed per pool (ours; `planner_core.policy.feedback`)."""

    prefill: PoolFeedback = field(default_factory=PoolFeedback)
    decode: PoolFeedback = field(default_factory=PoolFeedback)

    def of(self, component: Component) -> PoolFeedback:
        return self.prefill if component is Component.PREFILL else self.decode


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBudgetState:
    """The SLA error budget the throughput loop keeps (ours; `planner_core.policy.error_budget`).

    Attributes:
        judged, missed: the requests judged against the targets and those that missed one, each window's counts
            decayed by `exp(-age / period)` (a sliding period without a ring of windows).
        recent_judged, recent_missed: the same over the fast-burn horizon (the burn-rate guard).
        posture: where the margins sit between the configured ones (0) and the lean ones (1).
        last_s: the tick that last updated the counts; None before the first.
    """

    judged: float = 0.0
    missed: float = 0.0
    recent_judged: float = 0.0
    recent_missed: float = 0.0
    posture: float = 0.0
    last_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptBurstWindow:
    """One throughput window's prompt-arrival distributions (`PromptBurstQuantiles` per interval), kept so the
    burst rule pools its percentile over more requests than one window holds (`planner_core.policy.burst_pool`)."""

    at_s: float
    points: tuple[PromptBurstQuantiles, ...] = ()

    @property
    def num_requests(self) -> int:
        return max((point.num_requests for point in self.points), default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerState:
    """Cross-tick state of one managed deployment; stored as JSONB after every tick."""

    load_history: LoadHistory = field(default_factory=LoadHistory)
    throughput_lower_bound_prefill: int = 1
    throughput_lower_bound_decode: int = 1
    num_throughput_ticks: int = 0
    num_load_ticks: int = 0
    # Last observed router KV hit rate and speculative accept length (last-value semantics; None = never seen).
    last_kv_hit_rate: float | None = None
    last_accept_length: float | None = None
    perf_models: OnlinePerfState = field(default_factory=OnlinePerfState)  # online FPM regressions per role
    pipeline: PipelineState = field(default_factory=PipelineState)  # plugin schedules (planner_core.pipeline)
    threshold_planner: ThresholdPlannerState = field(default_factory=ThresholdPlannerState)
    # Ours: the throughput loop's needs over the last `throughput_scale_down_hold_seconds`, oldest first.
    recent_throughput_needs: tuple[SizedNeed, ...] = ()
    # Ours: scale-ups in flight and completed, for each pool's measured start-up time (`planner_core.policy.horizon`).
    startup: StartupState = field(default_factory=StartupState)
    # Ours: the last windows' observed and forecast rates, whose closed horizons give the learned headroom.
    horizon_windows: tuple[HorizonWindow, ...] = ()
    # Ours: each pool's engine speed learned from the latency it served (`planner_core.policy.feedback`).
    capacity_feedback: CapacityFeedback = field(default_factory=CapacityFeedback)
    # Ours: the previous windows' prompt-arrival distributions the burst rule pools (`planner_core.policy.burst_pool`).
    recent_prompt_bursts: tuple[PromptBurstWindow, ...] = ()
    # Ours: counts someone else set that the planner adopted and holds (`planner_core.policy.ownership`).
    adopted_counts: tuple[AdoptedCount, ...] = ()
    # Ours: each source signal's freshness and miss streak (`planner_core.policy.signals`), in `Signal` order.
    signals: tuple[SignalStatus, ...] = ()
    # Ours: the SLA error budget read from the latency the pools served, and the margins' posture it sets
    # (`planner_core.policy.error_budget`).
    error_budget: ErrorBudgetState = field(default_factory=ErrorBudgetState)
    # Ours: when a tick last saw demand (epoch s; None before the first tick), for the idle hold of scale to zero
    # (`planner_core.policy.scale_to_zero`).
    last_demand_s: float | None = None
