"""Why a tick did what it did: reason codes grouped by family, step names, and the step records a tick's
explanation is made of (stored in `ticks.reason`, `tick_steps.reason`, `tick_steps.step`: values never change)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from planner_core.domain.components import Component


class ReasonFamily(enum.StrEnum):
    """The part of the planner a `ReasonCode` comes from; the families the source groups the codes by."""

    HEADLINE = "headline"  # a loop's decision as a whole (Dynamo's throughput/load decision reasons)
    PIPELINE = "pipeline"  # the throughput loop's steps: observe, forecast, size, clamp
    PERF = "perf"  # online perf models and engine capacity
    PLUGIN = "plugin"  # what each plugin of the pipeline did this tick
    MERGE = "merge"  # overrides and how they were merged
    EXECUTE = "execute"  # the EXECUTE phase's action (Dynamo's execute actions)
    LOAD = "load"  # the load loop's decisions and steps (Dynamo 1.x and the 2025 threshold planner)
    SIZING = "sizing"  # the throughput loop's headroom, burst sizing and scale-down hold (ours)
    NEXT_REQUEST = "next_request"  # where the SLA load loop's "next request" comes from
    ACTUATION = "actuation"  # safe actuation (ours): who owns a pool's count, signal health
    SCALE_TO_ZERO = "scale_to_zero"  # scale to zero after an idle hold, and wake on demand (ours)


class ReasonCode(enum.StrEnum):
    """Why a step of a tick produced its value. Dynamo's enum names where Dynamo has one.

    One flat enum because the values are stored (`ticks.reason`, `tick_steps.reason`, ...) and compared by value;
    the members are grouped by `ReasonFamily` in the source, each group opening with a `# family:` comment, and
    `family` says which group a member is in. Add a member to its family's group; never change a value.
    """

    @property
    def family(self) -> ReasonFamily:
        """The part of the planner this reason comes from."""
        return _REASON_FAMILIES[self]

    # family: HEADLINE (Dynamo throughput/load decision reasons)
    UNSET = "unset"
    DISABLED = "disabled"
    NO_TRAFFIC_DATA = "no_traffic_data"
    PREDICT_FAILED = "predict_failed"
    MODEL_NOT_READY = "model_not_ready"
    PARTNER_NOT_READY = "partner_not_ready"
    SET_LOWER_BOUND = "set_lower_bound"
    SCALE = "scale"
    NO_CHANGE = "no_change"
    NO_FPM_DATA = "no_fpm_data"
    SCALING_IN_PROGRESS = "scaling_in_progress"
    GPU_BUDGET_GUARD_HOLD = "gpu_budget_guard_hold"
    GPU_BUDGET_RECONCILE = "gpu_budget_reconcile"
    # family: PIPELINE (steps of our own pipeline)
    OBSERVED = "observed"  # the observation was accepted as is
    IDLE_WINDOW = "idle_window"  # zero requests: lengths carried forward from the last busy window
    PREDICTED = "predicted"  # the configured predictor produced the forecast
    PREDICTOR_FALLBACK = "predictor_fallback"  # forecast came from the fallback (e.g. warm-up), not the model
    CAPACITY_FROM_PROFILE = "capacity_from_profile"  # engine capacity interpolated from profiling data
    SLA_UNREACHABLE = "sla_unreachable"  # even batch 1 misses the SLA; best rate used anyway
    DEMAND_SIZED = "demand_sized"  # replicas = ceil(demand / capacity)
    WITHIN_RANGE = "within_range"  # a clamp left the value unchanged
    MIN_ENDPOINT_FLOOR = "min_endpoint_floor"  # raised to the minimum endpoint count
    DELTA_CAPPED = "delta_capped"  # change limited by max_throughput_scaling_replicas
    GPU_BUDGET_CAPPED = "gpu_budget_capped"  # scaled down proportionally to fit max_gpu_budget
    FLEET_CEILING_CAPPED = "fleet_ceiling_capped"  # a fleet member's targets cut to what the fleet lets it grow to
    GPU_BUDGET_FLOORED = "gpu_budget_floored"  # scaled up proportionally to reach min_gpu_budget
    ADVISORY = "advisory"  # decision recorded but not to be executed
    SIZED_ON_MEAN = "sized_on_mean"  # capacity sized for the forecast mean ISL/OSL
    SIZED_ON_QUANTILE = "sized_on_quantile"  # capacity sized for the forecast ISL/OSL quantile
    QUANTILE_UNAVAILABLE = "quantile_unavailable"  # quantile sizing asked for, no quantile forecast: mean used
    CORRECTION_APPLIED = "correction_applied"  # 0.x correction factor from observed / interpolated latency
    CORRECTION_UNAVAILABLE = "correction_unavailable"  # no observed latency (or idle window): factor 1
    # family: PERF (online perf models and engine capacity, planner_core.perf)
    # Dynamo's name: too few usable FPM samples to fit the model, or the model (or an engine limit) cannot answer
    INSUFFICIENT_DATA = "insufficient_data"
    NEGATIVE_COEFFICIENT = "negative_coefficient"  # the fit says more load takes less time: rejected
    PERF_MODEL_READY = "perf_model_ready"  # the online model's fit is usable
    PERF_MODEL_BOOTSTRAP = "perf_model_bootstrap"  # online model not ready: the perf table or profile answers
    # ours: samples of engines starting or draining (or that cannot be told apart from them) kept out of the fits
    SAMPLES_EXCLUDED = "samples_excluded"
    CAPACITY_SEARCHED = "capacity_searched"  # engine capacity from the batch search; the SLA is met
    REQUEST_EXCEEDS_ENGINE = "request_exceeds_engine"  # one request does not fit the engine (e.g. KV cache)
    RUNTIME_METADATA_MISSING = "runtime_metadata_missing"  # KV hit rate / accept length unknown: neutral value
    SPECULATIVE_DECODING_OFF = "speculative_decoding_off"  # speculative_nextn = 0: accept length 1
    KV_HIT_RATE_CLAMPED = "kv_hit_rate_clamped"  # hit rate outside [0, 0.95] clamped for the prefill discount
    ACCEPT_LENGTH_CLAMPED = "accept_length_clamped"  # accept length outside [1, nextn + 1] clamped
    # family: PLUGIN (planner_core.pipeline: what each plugin did this tick)
    PLUGIN_NO_OPINION = "plugin_no_opinion"  # ran and returned nothing (Dynamo's ACCEPT)
    PLUGIN_OVERRIDES = "plugin_overrides"  # ran and returned replica overrides
    PLUGIN_NOT_DUE = "plugin_not_due"  # its interval has not elapsed; no opinion (ACCEPT_WHEN_IDLE or nothing held)
    PLUGIN_HELD_OVER = "plugin_held_over"  # not due; its last result was replayed (HOLD_LAST)
    REQUIRED_FIELDS_MISSING = "required_fields_missing"  # due, but a field it requires was not produced; retried
    PLUGIN_RAISED = "plugin_raised"  # raised an exception; result ignored, retried next tick
    PLUGIN_INVALID_RESULT = "plugin_invalid_result"  # returned something unusable; ignored, retried next tick
    PLUGIN_TIMEOUT = "plugin_timeout"  # finished after its own time limit; result discarded, retried next tick
    PLUGIN_LOAD_FAILED = "plugin_load_failed"  # an entry point could not be loaded; the plugin is not run
    PLUGIN_OBSERVED = "plugin_observed"  # an OBSERVE plugin ran and added observations
    PLUGIN_UNAVAILABLE = "plugin_unavailable"  # an out-of-process plugin could not be reached; retried next tick
    PLUGIN_ANSWER_MISSING = "plugin_answer_missing"  # replay: the tick's record holds no answer of this remote plugin
    PLUGIN_CIRCUIT_OPEN = "plugin_circuit_open"  # its circuit breaker is open: not called this tick
    PLUGIN_CIRCUIT_OPENED = "plugin_circuit_opened"  # this failure opened its circuit breaker
    PLUGIN_CIRCUIT_HALF_OPEN = "plugin_circuit_half_open"  # cool-down over: one trial call decides open or closed
    PLUGIN_CIRCUIT_CLOSED = "plugin_circuit_closed"  # the trial call succeeded: the breaker is closed again
    PREDICT_CHAIN_FINAL = "predict_chain_final"  # a PREDICT plugin said `final`: later PREDICT plugins not run
    # family: MERGE (plugin pipeline: overrides and how they were merged)
    OVERRIDE_SET = "override_set"  # a plugin recommends exactly this many replicas
    OVERRIDE_AT_LEAST = "override_at_least"  # a plugin sets a floor
    OVERRIDE_AT_MOST = "override_at_most"  # a plugin sets a ceiling
    OVERRIDE_REJECT = "override_reject"  # a plugin vetoes scaling this tick
    OVERRIDE_INVALID = "override_invalid"  # malformed override (e.g. SET without replicas); ignored
    UNMANAGED_COMPONENT = "unmanaged_component"  # override for a pool this planner's mode does not manage; ignored
    CONSTRAIN_SET_DROPPED = "constrain_set_dropped"  # CONSTRAIN may only bound: a SET there is dropped
    CONSTRAIN_FINAL_IGNORED = "constrain_final_ignored"  # CONSTRAIN cannot claim `final`; merged normally
    MERGE_FINAL = "merge_final"  # the smallest-priority `final` result was taken verbatim
    MERGE_FLOOR = "merge_floor"  # raised to the largest AT_LEAST
    MERGE_CEILING = "merge_ceiling"  # lowered to the smallest AT_MOST
    MERGE_FLOOR_OVER_CEILING = "merge_floor_over_ceiling"  # floor > ceiling: the floor wins
    # family: EXECUTE (plugin pipeline: the EXECUTE decision, Dynamo's execute actions)
    APPLY = "apply"  # targets differ from the current counts and are to be applied
    SKIP_NO_TARGETS = "skip_no_targets"  # no plugin had an opinion, or every target equals the current count
    SKIP_SHORT_CIRCUIT = "skip_short_circuit"  # a plugin rejected the tick
    SKIP_TICK_TIMEOUT = "skip_tick_timeout"  # the tick overran scheduling.tick_max_duration_seconds
    # family: LOAD (Dynamo's load-loop decision reasons, then the steps of our own load loop)
    SCALE_UP = "scale_up"  # the load signal (or the throughput floor) adds one replica
    SCALE_DOWN = "scale_down"  # the load signal removes one replica
    SCALE_DOWN_REFUSED_CONSOLIDATION = "scale_down_refused_consolidation"  # N-1 engines would miss the SLA budget
    SCALE_DOWN_CAPPED_BY_THROUGHPUT = "scale_down_capped_by_throughput"  # the throughput floor blocked a scale-down
    WORKER_COUNT_MISMATCH = "worker_count_mismatch"  # engines reporting metrics != ready workers (or uneven DP ranks)
    UNPLACED_REQUESTS = "unplaced_requests"  # the SLO-aware router could not place requests: one replica more (ours)
    # steps of our own load loop
    LATENCY_ESTIMATED = "latency_estimated"  # an engine's TTFT/ITL estimated from its queue through the model
    LOAD_MEASURED = "load_measured"  # an engine's threshold value (queue ratio, queued tokens, KV utilisation)
    CONSOLIDATION_SAFE = "consolidation_safe"  # this engine could absorb its share of one removed engine
    RAISED_TO_THROUGHPUT_FLOOR = "raised_to_throughput_floor"  # the load proposal was below the throughput floor
    TAIL_LATENCY_HIGH = "tail_latency_high"  # the frontend's p99/p95 TTFT or queue time is above the TTFT target: +1
    TAIL_LATENCY_REFUSED_DOWN = "tail_latency_refused_down"  # the TTFT tail is too close to the target to shrink
    TAIL_LATENCY_OK = "tail_latency_ok"  # the frontend's tail latency left the load signal as it was
    INTERVAL_COLLECTING = "interval_collecting"  # 2025 threshold planner: sampled; its interval is not over
    WORKERS_CHANGED_IN_INTERVAL = "workers_changed_in_interval"  # 2025: counts changed mid-interval, no adjustment
    DECODE_GRACE_PERIOD = "decode_grace_period"  # 2025: no decode scale-down shortly after adding a decode worker
    PREFILL_QUEUE_TREND = "prefill_queue_trend"  # 2025: the queue trend falls below the up threshold; no scale-up
    # family: SIZING (throughput loop: our headroom and burst sizing, planner_core.policy.throughput)
    HEADROOM_APPLIED = "headroom_applied"  # demand divided by the pool's target utilisation before sizing
    BURST_SIZED = "burst_sized"  # prefill raised so the observed prompt bursts drain within the TTFT target
    BURST_COVERED = "burst_covered"  # the mean-rate sizing already absorbs the observed prompt bursts
    BURST_UNAVAILABLE = "burst_unavailable"  # burst sizing asked for, no arrival curve observed: mean rate only
    SCALE_DOWN_HELD = "scale_down_held"  # kept at the largest need of the hold time: a smaller need must last first
    # the start-up-aware horizon (ours): the demand over [now, now + start-up + interval]
    HORIZON_HEADROOM = "horizon_headroom"  # need raised by the learned quantile of horizon shortfalls (engines)
    HORIZON_NO_HISTORY = "horizon_no_history"  # no horizon has closed yet: the forecast alone
    HORIZON_SHORT_HISTORY = "horizon_short_history"  # too few closed horizons for the quantile: their largest ratio
    STARTUP_MEASURED = "startup_measured"  # the pool's start-up time from its own scale-ups (decided -> ready)
    STARTUP_CONFIGURED = "startup_configured"  # no scale-up of the pool completed yet: the configured start-up
    # the closed loop (ours): each pool's engine speed learned from the latency it served (policy.feedback)
    FEEDBACK_LEARNED = "feedback_learned"  # the window's latency moved the pool's learned engine speed
    FEEDBACK_CONFIRMED = "feedback_confirmed"  # the window's latency agrees with the learned speed: kept
    FEEDBACK_NOT_AT_LOAD = "feedback_not_at_load"  # faster than learned, but at a load too light to trust: kept
    FEEDBACK_POOL_CHANGING = "feedback_pool_changing"  # engines started or left during the window: kept
    FEEDBACK_NO_LATENCY = "feedback_no_latency"  # the source gave no latency for the window: the last speed kept
    FEEDBACK_TOO_FEW_REQUESTS = "feedback_too_few_requests"  # too few requests in the window to measure: kept
    FEEDBACK_MISS_WAS_LOAD = "feedback_miss_was_load"  # TTFT missed, the window's own bursts outgrew the pool: kept
    # TTFT missed beyond the tail the window's own bursts make at the pool's size: the excess lowers the speed
    FEEDBACK_MISS_BEYOND_LOAD = "feedback_miss_beyond_load"
    # the SLA error budget (ours): the share of requests within the targets over a period (policy.error_budget)
    BUDGET_WARMING_UP = "budget_warming_up"  # too few requests judged yet: the configured margins
    BUDGET_HEALTHY = "budget_healthy"  # the period's misses well under the budget, none burning: leaner margins
    BUDGET_HOLDING = "budget_holding"  # within the budget, not far enough under it to go leaner: margins kept
    BUDGET_BURNING = "budget_burning"  # over the budget, or burning it fast: back to the configured margins
    BUDGET_UNAVAILABLE = "budget_unavailable"  # the source gave no latency histogram: the last posture kept
    # the learned decode margin (ours): the decode target utilization moved by the window (policy.decode_margin)
    DECODE_MARGIN_LEARNED = "decode_margin_learned"  # ITL and TTFT met with room: one step leaner
    DECODE_MARGIN_MISSED = "decode_margin_missed"  # ITL or TTFT missed, or a full decode batch queued: the floor
    DECODE_MARGIN_NO_LATENCY = "decode_margin_no_latency"  # the source gave no ITL: the last margin kept
    DECODE_MARGIN_NO_EVIDENCE = "decode_margin_no_evidence"  # pool changing, too few requests, met without room or
    # no TTFT tail: the last margin kept
    # a round-robin prefill router (ours): requests spread by count, not by load (policy.dispatch)
    BURST_BY_COUNT_SIZED = "burst_by_count_sized"  # prefill raised so a by-count dispatch meets the TTFT target
    BURST_BY_COUNT_COVERED = "burst_by_count_covered"  # the size already serves a by-count dispatch of the window
    BURST_BY_COUNT_UNAVAILABLE = "burst_by_count_unavailable"  # no per-request prompts recorded: not sized by count
    # family: NEXT_REQUEST (SLA load loop: where the "next request" of every estimate comes from)
    NEXT_REQUEST_ENGINE_AVERAGE = "next_request_engine_average"  # the engines' moving averages (Dynamo's)
    NEXT_REQUEST_TRAFFIC_WINDOW = "next_request_traffic_window"  # the last traffic window's mean lengths (ours)
    NEXT_REQUEST_UNKNOWN = "next_request_unknown"  # nothing reported yet: no next request is added
    # family: ACTUATION (safe actuation, ours: planner_core.policy.ownership and planner_core.policy.signals)
    OUTSIDE_CHANGE_ADOPTED = "outside_change_adopted"  # someone else changed the count: adopted and held
    OUTSIDE_CHANGE_HELD = "outside_change_held"  # a count adopted earlier is still held (its hold has not ended)
    OUTSIDE_CHANGE_RESTORED = "outside_change_restored"  # someone else changed the count: the planner's restored
    SIGNAL_MISSED = "signal_missed"  # a signal the tick expected is missing (value: the miss streak)
    SIGNAL_RECOVERED = "signal_recovered"  # a signal missed by the previous ticks is back
    STALE_SIGNAL_NO_SHRINK = "stale_signal_no_shrink"  # a signal is missing: the pool is kept from shrinking
    WORKER_COUNTS_UNAVAILABLE = "worker_counts_unavailable"  # the counts could not be read: no pool is changed
    # family: SCALE_TO_ZERO (ours: planner_core.policy.scale_to_zero, pools whose minimum endpoints is 0)
    SCALED_TO_ZERO = "scaled_to_zero"  # idle for scale_to_zero_idle_seconds: the pool goes to zero
    WOKEN = "woken"  # a pool at zero saw demand (a request held at the edge, arrived, or queued): at least one
    IDLE_HOLD = "idle_hold"  # demand within the idle hold: the pool keeps at least one replica
    AT_ZERO = "at_zero"  # at zero without demand: kept there until a request wakes it


# The first member of each family, in source order: a member belongs to the family of the last start before it.
_FAMILY_STARTS: dict[ReasonCode, ReasonFamily] = {
    ReasonCode.UNSET: ReasonFamily.HEADLINE,
    ReasonCode.OBSERVED: ReasonFamily.PIPELINE,
    ReasonCode.INSUFFICIENT_DATA: ReasonFamily.PERF,
    ReasonCode.PLUGIN_NO_OPINION: ReasonFamily.PLUGIN,
    ReasonCode.OVERRIDE_SET: ReasonFamily.MERGE,
    ReasonCode.APPLY: ReasonFamily.EXECUTE,
    ReasonCode.SCALE_UP: ReasonFamily.LOAD,
    ReasonCode.HEADROOM_APPLIED: ReasonFamily.SIZING,
    ReasonCode.NEXT_REQUEST_ENGINE_AVERAGE: ReasonFamily.NEXT_REQUEST,
    ReasonCode.OUTSIDE_CHANGE_ADOPTED: ReasonFamily.ACTUATION,
    ReasonCode.SCALED_TO_ZERO: ReasonFamily.SCALE_TO_ZERO,
}


def _families() -> dict[ReasonCode, ReasonFamily]:
    families: dict[ReasonCode, ReasonFamily] = {}
    family = ReasonFamily.HEADLINE
    for code in ReasonCode:
        family = _FAMILY_STARTS.get(code, family)
        families[code] = family
    return families


_REASON_FAMILIES = _families()


class StepName(enum.StrEnum):
    """The name of a step the planner itself records (`StepRecord.step`); the values are stored in `tick_steps`.

    Plugin steps are named at the plugin boundary instead (`planner_core.pipeline`): `<phase>:<plugin_id>`,
    `<phase>:merge`, `predict:<plugin_id>`, `plugin_load:<entry point>`, and whatever names a user plugin gives
    its own steps. Those stay plain strings because plugin ids and user step names are open-ended (user code
    chooses them); `StepRecord` turns a string that is one of these values into the member.
    """

    ACCEPT_LENGTH = "accept_length"
    AGG_SIGNAL = "agg_signal"
    BURST = "burst"
    CAPACITY = "capacity"
    CAPACITY_FEEDBACK = "capacity_feedback"  # the closed loop: a pool's engine speed learned from its latency
    CHANGE_RATE = "change_rate"
    CONSOLIDATION = "consolidation"
    CORRECTION = "correction"
    DECIDE = "decide"
    DECODE_GRACE = "decode_grace"
    DECODE_MARGIN = "decode_margin"  # the learned decode target utilization (ours)
    DEMAND = "demand"
    ENGINE_CAPACITY = "engine_capacity"
    ENGINE_LOAD = "engine_load"
    ERROR_BUDGET = "error_budget"  # the SLA error budget read and the margins it chose (ours)
    EXECUTE = "execute"
    FLEET = "fleet"
    FLEET_CEILING = "fleet_ceiling"
    FORWARD_PASS_MODEL = "forward_pass_model"
    GPU_BUDGET = "gpu_budget"
    HEADROOM = "headroom"
    INTERVAL = "interval"
    INTERVAL_AVERAGE = "interval_average"
    ITL_ESTIMATE = "itl_estimate"
    ITL_SIGNAL = "itl_signal"
    KV_HIT_RATE = "kv_hit_rate"
    LENGTH_SIZING = "length_sizing"
    LOAD = "load"
    LOAD_DECISION = "load_decision"
    MIN_ENDPOINT = "min_endpoint"
    MODEL = "model"
    NEXT_REQUEST = "next_request"
    OBSERVE = "observe"
    PERF_MODEL_AGG = "perf_model_agg"
    PERF_MODEL_DECODE = "perf_model_decode"
    PERF_MODEL_PREFILL = "perf_model_prefill"
    PLUGIN = "plugin"
    PREDICT = "predict"
    SAMPLE = "sample"
    SCALE_DOWN_HOLD = "scale_down_hold"
    HORIZON = "horizon"
    STARTUP = "startup"
    THRESHOLD_SIGNAL = "threshold_signal"
    THROUGHPUT = "throughput"
    THROUGHPUT_FLOOR = "throughput_floor"
    TTFT_ESTIMATE = "ttft_estimate"
    TTFT_SIGNAL = "ttft_signal"
    UNPLACED_SIGNAL = "unplaced_signal"  # the load loop: requests the router could not place
    OWNERSHIP = "ownership"  # a pool's count changed outside the planner, and the rule applied (ours)
    SIGNAL = "signal"  # a source signal missed or back (ours)
    SIGNAL_GUARD = "signal_guard"  # the final guard: no pool shrinks on a missing signal (ours)
    SCALE_TO_ZERO = "scale_to_zero"  # a zero-minimum pool's bound: idle hold, scale to zero, wake (ours)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One named step of a tick: its value and why. The list of these is the tick's explanation.

    `step` is a `StepName` for the planner's own steps, a plain string only for the plugin-scoped names described
    in `StepName` (a string equal to a `StepName` value is stored as that member, so a row read back compares the
    same way).
    """

    step: StepName | str
    reason: ReasonCode
    component: Component | None = None
    value: float | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.step, StepName) and self.step in _STEP_NAMES:
            object.__setattr__(self, "step", StepName(self.step))


_STEP_NAMES = frozenset(StepName)
