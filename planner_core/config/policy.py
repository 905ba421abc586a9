"""`PlannerConfig`, the policy: every field the decision reads, validated, frozen and hashed (see the package's
docstring for the split from the service settings), with its derived values as read-only properties.

The fields that involve one another are checked by the named rule groups of `planner_core.config.rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from planner_core.config.enums import (
    Backend,
    EnvironmentKind,
    LengthSizing,
    LoadNextRequest,
    LoadPolicy,
    LoadPredictorName,
    OptimizationTarget,
    OutsideChangeRule,
    PlannerMode,
    RouterKind,
    SweepingMode,
    ThroughputAlgorithm,
    ThroughputMetricsSource,
)
from planner_core.config.errors import _RULE_ERROR, _raise_rules, _show
from planner_core.config.limits import (
    _COUNT,
    _ENGINE_GPUS,
    _GPUS,
    _INTERVAL,
    _LATENCY,
    _MAGNITUDE,
    _POWER,
    _REPLICAS,
    _SPECULATIVE,
    _TOKENS,
    Number,
    Whole,
)
from planner_core.config.plugins import PluginsConfig, SchedulingConfig
from planner_core.config.rules import CROSS_FIELD_RULES, _gcd_seconds
from planner_core.domain import Component, EngineLimits, LengthQuantile


class EngineLimitsConfig(BaseModel):
    """Static limits of one pool's engines (ours; Dynamo reads them from the model card and the deployment).

    Unset limits take Dynamo's fallbacks: 8192 batched tokens, 512 sequences; KV tokens from the engine profile
    when one is loaded, else 2,000,000.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_num_batched_tokens: Whole = Field(
        **_TOKENS, default=8192, gt=0, description="Most tokens one engine iteration batches (tokens)."
    )
    max_num_seqs: Whole = Field(
        **_COUNT, default=512, gt=0, description="Most sequences one engine runs at once (count)."
    )
    max_kv_tokens: Whole | None = Field(
        **_TOKENS,
        default=None,
        gt=0,
        description="KV-cache capacity of one engine (tokens); None = the profile's, else 2,000,000.",
    )
    context_length: Whole | None = Field(
        **_TOKENS, default=None, gt=0, description="Longest sequence one engine accepts (tokens); None = unbounded."
    )


# Field name -> the other accepted spellings (Dynamo's aliases).
_ALIASES: dict[str, tuple[str, ...]] = {
    "ttft_ms": ("ttft",),
    "itl_ms": ("itl",),
    "throughput_adjustment_interval_seconds": ("throughput_adjustment_interval",),
    "load_adjustment_interval_seconds": ("load_adjustment_interval",),
}
_ALIAS_TO_FIELD = {alias: name for name, aliases in _ALIASES.items() for alias in aliases}


def _aliased(name: str) -> AliasChoices:
    """Accept a field under its own name or any of its Dynamo aliases."""
    return AliasChoices(name, *_ALIASES[name])


class PlannerConfig(BaseModel):
    """Everything that shapes the planner's decisions, validated and immutable.

    Field names, aliases and defaults follow Dynamo 1.6.1's `PlannerConfig`; see the project's Dynamo
    reference (section 2) for each field's meaning. Units are in the names: `*_ms` milliseconds,
    `*_seconds` seconds, `*_hours` hours, `total_gpu_power_limit` watts, `decode_*_kv_rate` percent of the
    KV cache (0-100), `prefill_*_queue_tokens` tokens.

    Unlike Dynamo, validation never rewrites fields (Dynamo switches the loop flags for the easy targets
    and fills in the scale interval); the values actually in force are the read-only properties
    `throughput_scaling_active`, `load_scaling_active`, `prefill_min_endpoint_effective`,
    `decode_min_endpoint_effective`, `scale_interval_seconds_effective`, `prefill_gpus_per_engine` and
    `decode_gpus_per_engine`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # --- what to optimise, for which deployment -----------------------------------------------------
    optimization_target: OptimizationTarget = Field(
        default=OptimizationTarget.THROUGHPUT,
        description="What the planner optimises for: throughput, latency, load (thresholds) or sla (TTFT/ITL).",
    )
    mode: PlannerMode = Field(
        default=PlannerMode.DISAGG,
        description="Which worker pools this planner manages: disagg, prefill, decode or agg.",
    )
    environment: EnvironmentKind = Field(
        default=EnvironmentKind.KUBERNETES,
        description="Where decisions are sent: kubernetes, kubernetes-workloads, virtual or global-planner.",
    )
    backend: Backend = Field(
        default=Backend.VLLM, description="Inference engine the workers run (selects the perf table and metric names)."
    )
    # Dynamo reads DYN_NAMESPACE here (and leaves it out of dumps); we use a fixed default and keep it in.
    namespace: str = Field(
        default="dynamo", description="Dynamo namespace of the deployment (Prometheus labels, Kubernetes lookups)."
    )
    global_planner_namespace: str | None = Field(
        default=None, description="Namespace of the global planner; required when environment is global-planner."
    )  # required when environment is global-planner
    model_name: str | None = Field(
        default=None,
        description="Served model name; None = taken from the deployment (Kubernetes) or required (virtual).",
    )  # needed by the virtual connector

    # --- SLA targets (used by the `sla` target only) -----------------------------------------------
    ttft_ms: Number = Field(
        **_LATENCY,
        default=500.0,
        gt=0,
        validation_alias=_aliased("ttft_ms"),
        description="Time-to-first-token target (ms) of the sla target.",
    )
    itl_ms: Number = Field(
        **_LATENCY,
        default=50.0,
        gt=0,
        validation_alias=_aliased("itl_ms"),
        description="Inter-token-latency target (ms) of the sla target.",
    )

    # --- routing (ours): how the frontend places requests, which the throughput loop sizes for ---------
    router: RouterKind = Field(
        default=RouterKind.LEAST_LOADED,
        description="The frontend's request router: least_loaded, round_robin, or slo (SLO-aware: an engine is "
        "loaded only while it is predicted within SLO x dispatch threshold, so the throughput loop sizes each "
        "engine's capacity at those targets). Under round_robin each prefill engine is its own queue: the "
        "throughput loop also sizes the prefill pool for a by-count dispatch of the window's prompts.",
    )
    ttft_dispatch_threshold: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Router slo: an engine is sent a prompt only if its predicted TTFT <= ttft_ms x this.",
    )
    tpot_dispatch_threshold: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="Router slo: an engine is sent a request to decode only if its predicted TPOT <= itl_ms x this.",
    )

    # --- the two loops --------------------------------------------------------------------------------
    enable_throughput_scaling: bool = Field(
        default=True, description="Run the predictive throughput loop (sla target only)."
    )
    enable_load_scaling: bool = Field(
        default=False, description="Run the reactive load loop with the sla target (always on for the other targets)."
    )
    throughput_adjustment_interval_seconds: Whole = Field(
        **_INTERVAL,
        description="Seconds between two throughput-loop decisions (the traffic window).",
        default=180,
        gt=0,
        validation_alias=_aliased("throughput_adjustment_interval_seconds"),
    )
    load_adjustment_interval_seconds: Whole = Field(
        **_INTERVAL,
        description="Seconds between two load-loop ticks.",
        default=5,
        gt=0,
        validation_alias=_aliased("load_adjustment_interval_seconds"),
    )
    scheduling: SchedulingConfig = Field(
        default_factory=SchedulingConfig,
        description="Cadence of the tick pipeline: base tick period and tick deadline (s).",
    )

    # --- replica and GPU limits ---------------------------------------------------------------------
    max_throughput_scaling_replicas: Whole = Field(
        **_REPLICAS, default=8, gt=0, description="Most replicas per pool the throughput loop may ask for."
    )
    max_gpu_budget: Whole = Field(
        **_GPUS, default=8, ge=-1, description="Most GPUs over all managed pools; -1 = no ceiling."
    )  # -1 disables the ceiling
    min_gpu_budget: Whole = Field(
        **_GPUS, default=-1, ge=-1, description="Fewest GPUs over all managed pools; -1 = no floor."
    )  # -1 disables the floor
    min_endpoint: Whole = Field(
        **_REPLICAS, default=1, ge=0, description="Fewest replicas per pool; 0 allows scale-to-zero."
    )  # 0 allows scale-to-zero
    # Scale to zero (ours; None = off): a pool whose minimum is 0 goes to zero only once no demand was seen for this
    # long, and a request held at the edge wakes it (planner_core.policy.scale_to_zero).
    scale_to_zero_idle_seconds: Number | None = Field(
        **_INTERVAL,
        default=None,
        gt=0,
        description="Seconds without demand before a pool with minimum 0 goes to zero; a held request wakes it. "
        "None = off.",
    )
    prefill_min_endpoint: Whole | None = Field(
        **_REPLICAS, default=None, ge=1, description="Fewest prefill replicas; None = min_endpoint."
    )
    decode_min_endpoint: Whole | None = Field(
        **_REPLICAS, default=None, ge=1, description="Fewest decode (or aggregated) replicas; None = min_endpoint."
    )
    # Legacy per-engine GPU width; Dynamo now prefers the deployment status. None means 1.
    prefill_engine_num_gpu: Whole | None = Field(
        **_ENGINE_GPUS,
        default=None,
        ge=1,
        description="GPUs per prefill engine; None = 1 (or the deployment's value on Kubernetes).",
    )
    decode_engine_num_gpu: Whole | None = Field(
        **_ENGINE_GPUS,
        default=None,
        ge=1,
        description="GPUs per decode (or aggregated) engine; None = 1 (or the deployment's value).",
    )

    prefill_engine: EngineLimitsConfig = Field(
        default_factory=EngineLimitsConfig,
        description="Static limits of one prefill engine (batched tokens, sequences, KV tokens, context).",
    )  # ours
    decode_engine: EngineLimitsConfig = Field(
        default_factory=EngineLimitsConfig,
        description="Static limits of one decode (or aggregated) engine (batched tokens, sequences, KV tokens).",
    )  # ours; the agg pool too

    # --- traffic forecasting --------------------------------------------------------------------------
    load_predictor: LoadPredictorName = Field(
        default=LoadPredictorName.ARIMA,
        description="Traffic forecaster of the throughput loop: constant, arima, prophet, kalman or ensemble.",
    )
    load_predictor_log1p: bool = Field(
        default=False, description="Forecast log1p of the request rate instead of the rate itself."
    )
    prophet_window_size: Whole = Field(
        **_COUNT, default=50, gt=0, description="Windows Prophet is refitted on (count)."
    )
    kalman_q_level: Number = Field(
        **_MAGNITUDE, default=1.0, gt=0, description="Kalman process noise of the level (requests^2 per window)."
    )
    kalman_q_trend: Number = Field(
        **_MAGNITUDE, default=0.1, ge=0, description="Kalman process noise of the trend (requests^2 per window)."
    )
    kalman_r: Number = Field(**_MAGNITUDE, default=10.0, gt=0, description="Kalman measurement noise (requests^2).")
    kalman_min_points: Whole = Field(
        **_COUNT, default=5, gt=0, description="Windows observed before the Kalman filter forecasts (count)."
    )
    load_predictor_warmup_trace: str | None = Field(
        default=None,
        description="Request trace (file, glob or folder, relative to the config) the forecaster is warmed on.",
    )  # file, glob or directory of request traces
    # Ours, not Dynamo's: which percentile of ISL/OSL is forecast next to the mean (Prediction.isl_quantile /
    # osl_quantile), so capacity can be sized on the length distribution rather than its mean alone.
    load_predictor_length_quantile: LengthQuantile = Field(
        default=LengthQuantile.P90, description="Quantile of ISL/OSL forecast beside the mean: p50, p90 or p99."
    )
    # Ours: size on the mean request shape (Dynamo) or on the length quantile above.
    throughput_length_sizing: LengthSizing = Field(
        default=LengthSizing.MEAN, description="Request shape the throughput loop sizes for: mean or quantile."
    )
    # Ours: which sizing algorithm the throughput loop runs (see ThroughputAlgorithm).
    throughput_algorithm: ThroughputAlgorithm = Field(
        default=ThroughputAlgorithm.INTERPOLATION, description="How the throughput loop turns a forecast into replicas."
    )
    # Ours: a perf table precomputed with `planner perf-table` (may be relative to the config file): the
    # forward-pass model between the profile and live metrics in the bootstrap chain.
    perf_table: str | None = Field(
        default=None,
        description="Precomputed perf table file (relative to the config); None = profile and live metrics only.",
    )

    # --- load loop / perf-model tuning ----------------------------------------------------------------
    max_num_fpm_samples: Whole = Field(
        **_COUNT,
        default=64,
        gt=0,
        description="Forward-pass metric samples kept per engine for the moving averages (count).",
    )
    fpm_sample_bucket_size: Whole = Field(
        **_COUNT,
        default=16,
        gt=0,
        description="Buckets of the online perf model's sample grid (count, a perfect square).",
    )  # must be a perfect square
    load_min_observations: Whole = Field(
        **_COUNT, default=5, gt=0, description="Forward-pass observations needed before the load loop decides (count)."
    )
    load_scaling_down_sensitivity: Whole = Field(
        default=80, ge=0, le=100, description="How readily the load loop scales down (percent, 0-100)."
    )
    # Tail-latency signal of the SLA load loop (ours; off = Dynamo, which reads per-engine estimates only): where the
    # traffic source measures the frontend's p95/p99 TTFT and queue time, the pool that computes prompts adds an
    # engine when the p99 (else p95) TTFT or the mean wait for a first token is above the TTFT target, and does not
    # shrink while the tail is above the scale-down sensitivity's share of it (planner_core.policy.load).
    load_tail_latency_scaling: bool = Field(
        default=False, description="Load loop also scales prompt engines on frontend p95/p99 TTFT and queue time."
    )
    prefill_scale_up_queue_tokens: Whole | None = Field(
        **_TOKENS,
        default=None,
        ge=0,
        description="Queued prefill tokens per engine above which the load target adds a worker.",
    )
    prefill_scale_down_queue_tokens: Whole | None = Field(
        **_TOKENS,
        default=None,
        ge=0,
        description="Queued prefill tokens per engine below which the load target removes one.",
    )
    decode_scale_up_kv_rate: Number | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Decode KV-cache use (percent) above which the load target adds a worker.",
    )
    decode_scale_down_kv_rate: Number | None = Field(
        default=None, ge=0, le=100, description="Decode KV-cache use (percent) below which the load target removes one."
    )
    speculative_nextn: Whole = Field(
        **_SPECULATIVE,
        default=0,
        ge=0,
        description="Tokens proposed per step by speculative decoding (count); 0 = off.",
    )

    # --- profiling data -------------------------------------------------------------------------------
    pre_deployment_sweeping_mode: SweepingMode | None = Field(
        default=SweepingMode.RAPID,
        description="How the engine profile was made: none, rapid (simulated) or thorough (measured).",
    )
    profile_results_dir: str = Field(
        default="profiling_results", description="Folder of the engine profile (relative to the config file)."
    )

    # --- metrics --------------------------------------------------------------------------------------
    throughput_metrics_source: ThroughputMetricsSource = Field(
        default=ThroughputMetricsSource.FRONTEND,
        description="Prometheus series traffic is observed from: frontend or router.",
    )

    # --- operation --------------------------------------------------------------------------------------
    advisory: bool = Field(
        default=False, description="Decide and record, never execute."
    )  # decide and record, never execute
    enable_power_awareness: bool = Field(
        default=False, description="Keep the managed pools within total_gpu_power_limit."
    )
    total_gpu_power_limit: Whole | None = Field(
        **_POWER, default=None, ge=1, description="GPU power budget (W) when enable_power_awareness is on."
    )  # watts

    # --- not supported yet -------------------------------------------------------------------------
    # Accepted as opaque mappings only so that Dynamo configuration files load; nothing reads them.
    aic_interpolation: dict[str, Any] | None = Field(
        default=None, description="Dynamo's AI Configurator interpolation settings; accepted, not used."
    )
    ais_perf_model: dict[str, Any] | None = Field(
        default=None, description="Dynamo's AIS perf-model settings; accepted, not used."
    )

    # --- our extensions (not in Dynamo) -------------------------------------------------------------
    # User plugins of the decision pipeline: which entry points to load, their settings and scheduling overrides.
    plugins: PluginsConfig = Field(
        default_factory=PluginsConfig,
        description="User plugins of the decision pipeline: entry points, their settings, scheduling overrides.",
    )
    # Which algorithm the load loop runs: `per_engine` (Dynamo 1.x) or `threshold_2025` (Dynamo's 2025 load
    # planner). The fields below are read only by `threshold_2025`; their defaults are that planner's.
    load_policy: LoadPolicy = Field(
        default=LoadPolicy.PER_ENGINE,
        description="Load-loop algorithm: per_engine (Dynamo 1.x) or threshold_2025 (Dynamo's 2025 planner).",
    )
    # The SLA load loop's "next request" (`LoadNextRequest`): Dynamo's engine averages by default.
    load_next_request: LoadNextRequest = Field(
        default=LoadNextRequest.ENGINE_AVERAGE,
        description="The sla load loop's next request: engine_average or traffic_window.",
    )
    # Seconds between two decisions of `threshold_2025`; every load tick in between is one metrics sample (the
    # load interval plays the 2025 planner's `metric-pulling-interval`). 30 s is its documented default.
    threshold_2025_adjustment_interval_seconds: Whole = Field(
        **_INTERVAL, default=30, gt=0, description="Seconds between two threshold_2025 decisions."
    )
    # Interval-average KV-cache utilisation of the decode engines (fraction 0..1, queued KV included) above which a
    # decode worker is added / below which one is removed.
    decode_kv_scale_up_threshold: Number = Field(
        **_MAGNITUDE,
        default=0.9,
        ge=0,
        description="threshold_2025: decode KV use (fraction 0-1) above which a worker is added.",
    )
    decode_kv_scale_down_threshold: Number = Field(
        **_MAGNITUDE,
        default=0.5,
        ge=0,
        description="threshold_2025: decode KV use (fraction 0-1) below which one is removed.",
    )
    # Interval-average queued prefill requests (summed over the prefill engines) above which a prefill worker is
    # added / below which one is removed. 5.0 is the 2025 planner's code default (its docs said 0.5).
    prefill_queue_scale_up_threshold: Number = Field(
        **_MAGNITUDE,
        default=5.0,
        ge=0,
        description="threshold_2025: queued prefill requests above which a worker is added.",
    )
    prefill_queue_scale_down_threshold: Number = Field(
        **_MAGNITUDE,
        default=0.2,
        ge=0,
        description="threshold_2025: queued prefill requests below which one is removed.",
    )
    # Throughput-loop headroom (ours; 1.0 = Dynamo: size each pool to run at its searched capacity). Demand is
    # divided by this fraction before `ceil(demand / capacity)`, leaving room for queueing around the mean rate.
    throughput_prefill_target_utilization: Number = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Fraction (0-1] of searched prefill capacity the throughput loop sizes for.",
    )
    throughput_decode_target_utilization: Number = Field(
        default=1.0, gt=0, le=1, description="Fraction (0-1] of searched decode capacity the throughput loop sizes for."
    )
    # Burst-aware prefill sizing (ours; off = Dynamo). When the observed window carries its prompt-token arrival
    # curve (TrafficObservation.prompt_tokens_p99_*), prefill is also sized so that a p99 burst of every length,
    # scaled by the forecast's growth, drains within the TTFT target (planner_core.policy.throughput).
    throughput_prefill_burst_sizing: bool = Field(
        default=False, description="Also size prefill so a p99 prompt burst drains within the TTFT target."
    )
    # Pooled burst percentile (ours; 0 = each window's own p99). The burst sizing reads the p99 prompt-arrival
    # curve pooled over at least this many requests of the newest windows (planner_core.policy.burst_pool): a
    # window of a few hundred requests has a p99 that is nearly its largest value and swings from window to window.
    throughput_burst_pool_requests: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Requests the burst sizing pools its p99 prompt-arrival curve over (newest windows); 0 = off.",
    )
    throughput_burst_pool_windows: int = Field(
        default=10,
        ge=1,
        le=120,
        description="Most throughput windows (the newest, the current one included) the burst percentile pools.",
    )
    # Scale-down hold (ours; 0 = Dynamo): each pool is sized for the largest need the throughput loop found over
    # the last this many seconds, so capacity removed in a lull is not missing when the traffic returns before a
    # new worker could start (start-up takes minutes; removing one is instant).
    throughput_scale_down_hold_seconds: Number = Field(
        **_INTERVAL,
        default=0.0,
        ge=0,
        description="Seconds over which the largest need found holds a pool up; 0 = off.",
    )
    # Scale-down margin (ours; 0 = Dynamo): a pool shrinks to m engines only when its need before rounding up
    # (demand / one engine's capacity, and the burst need) is at most m x (1 - margin). A need that wanders around
    # an integer at steady load otherwise drops a pool by one engine and raises it again minutes later.
    throughput_scale_down_margin: Number = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Fraction of the smaller size a pool's unrounded need must stay under to scale down; 0 = off.",
    )

    # Start-up-aware horizon (ours; 0 = off, Dynamo sizes for the next window). Each pool's need before rounding up
    # is raised by the q quantile of its residuals "peak need observed over the start-up + interval after a tick -
    # the need that tick planned" (engines), learned from the deployment's own windows (planner_core.policy.horizon),
    # before the scale-down hold. The one knob that trades GPU-hours for SLA attainment: higher q, more engines held
    # for the bursts a start-up time ahead.
    throughput_horizon_quantile: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Quantile (0-1) of the horizon shortfalls (engines) each pool's need is raised by; 0 = off.",
    )
    # The start-up time the horizon assumes for a pool until one of its scale-ups has been seen through to ready;
    # from then on the pool's measured start-up (median of its last scale-ups) is used.
    throughput_startup_seconds: float = Field(
        **_INTERVAL, default=120.0, ge=0, description="Worker start-up time (s) assumed until one is measured."
    )
    # Closed loop (ours; off = Dynamo, which sizes on the perf model alone). Each throughput tick learns each pool's
    # engine speed relative to the perf model from the latency the pool served at the load it carried (prefill from
    # TTFT, decode from ITL; planner_core.policy.feedback) and sizes the pool with the learned speed. Disaggregated
    # pools on engine capacity only. The bounds keep one bad source from sizing the pools without limit.
    throughput_capacity_feedback: bool = Field(
        default=False, description="Learn each pool's engine speed from the latency it served, and size with it."
    )
    throughput_feedback_speed_min: float = Field(
        default=0.5, gt=0, le=1, description="Lowest engine speed (x the perf model's) the closed loop may learn."
    )
    throughput_feedback_speed_max: float = Field(
        default=1.5, ge=1, le=10, description="Highest engine speed (x the perf model's) the closed loop may learn."
    )
    # The learned decode margin (ours; off = the fixed throughput_decode_target_utilization). Each throughput tick
    # moves the decode target utilization by what the window served: a step leaner after a window whose ITL and
    # TTFT met the SLA with room, back to throughput_decode_target_utilization (the floor) at once after a miss, at
    # most the ceiling below (planner_core.policy.decode_margin).
    throughput_decode_learned_margin: bool = Field(
        default=False,
        description="Learn the decode target utilization from the ITL and TTFT each window served.",
    )
    throughput_decode_utilization_max: Number = Field(
        default=0.9, gt=0, le=1, description="Highest decode target utilization the learned margin may reach."
    )

    # SLA error budget (ours; off = Dynamo, which sizes every window alike). An SLA of "this share of requests
    # within TTFT and ITL" is kept over a period, not in every window: the throughput loop reads the share it
    # served from the frontend's latency histograms, keeps the period's misses against the budget, and moves the
    # margins between the configured ones and the lean ones below (planner_core.policy.error_budget): leaner
    # while the period's misses stay well under the budget, back to the configured ones at once when the budget
    # is spent or burns fast. The configured margins are the richest the budget uses; the lean ones the leanest.
    throughput_error_budget: bool = Field(
        default=False, description="Keep the SLA as an error budget over a period and size leaner while it is healthy."
    )
    error_budget_target: float = Field(
        default=0.99, gt=0, lt=1, description="Share (0-1) of requests within both targets the budget keeps."
    )
    error_budget_period_seconds: Number = Field(
        **_INTERVAL,
        default=86400.0,
        gt=0,
        description="The period (s) the budget is kept over (the misses decay with this time constant).",
    )
    error_budget_fast_burn_seconds: Number = Field(
        **_INTERVAL,
        default=600.0,
        gt=0,
        description="The horizon (s) of the burn-rate guard: misses over it faster than the budget allows go rich.",
    )
    error_budget_lean_decode_utilization: Number = Field(
        default=0.9, gt=0, le=1, description="Decode target utilization at the leanest posture."
    )
    error_budget_lean_burst_quantile: float = Field(
        default=0.99,
        ge=0.5,
        le=0.99,
        description="The prompt-burst percentile (of the pooled curve) the burst sizing reads at the leanest posture.",
    )

    # Safe actuation (ours). A pool's count changed by someone else (an HPA, `kubectl scale`, an operator) is
    # detected at the next tick and handled by this rule (planner_core.policy.ownership); Dynamo writes its own
    # count back without a word.
    outside_change_rule: OutsideChangeRule = Field(
        default=OutsideChangeRule.ADOPT_AND_HOLD,
        description="A count someone else set: adopt_and_hold (keep it for the hold) or restore (write ours back).",
    )
    outside_change_hold_seconds: Number = Field(
        **_INTERVAL,
        default=600.0,
        ge=0,
        description="How long (s) an adopted outside count is held before the planner sizes the pool again.",
    )

    # ------------------------------------------------------------------------------------------------
    # Validation (never mutates; raises the first violation and counts the rest)
    # ------------------------------------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _one_spelling_per_field(cls, data: Any) -> Any:
        """Reject a field given under two spellings (e.g. `ttft` and `ttft_ms`): which one wins is unclear."""
        if isinstance(data, Mapping):
            for alias, name in _ALIAS_TO_FIELD.items():
                if alias in data and name in data:
                    raise PydanticCustomError(
                        _RULE_ERROR,
                        "field '{field}' = {shown}: {requirement}",
                        {
                            "field": alias,
                            "shown": _show(data[alias]),
                            "requirement": f"'{name}' is also given; use only one of the two spellings",
                            "more": 0,
                        },
                    )
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PlannerConfig:
        """Check the rules that involve more than one field (`planner_core.config.rules`, in their order)."""
        _raise_rules([violation for rules in CROSS_FIELD_RULES for violation in rules(self)])
        return self

    # ------------------------------------------------------------------------------------------------
    # Derived values (read-only)
    # ------------------------------------------------------------------------------------------------

    @property
    def throughput_scaling_active(self) -> bool:
        """Whether the predictive throughput loop runs: only for the `sla` target, and only if enabled."""
        return self.optimization_target is OptimizationTarget.SLA and self.enable_throughput_scaling

    @property
    def load_scaling_active(self) -> bool:
        """Whether the reactive load loop runs: always for non-`sla` targets, else per the flag."""
        return self.optimization_target is not OptimizationTarget.SLA or self.enable_load_scaling

    @property
    def prefill_min_endpoint_effective(self) -> int:
        """Minimum prefill replicas: `prefill_min_endpoint` if set, else `min_endpoint`."""
        return self.min_endpoint if self.prefill_min_endpoint is None else self.prefill_min_endpoint

    @property
    def decode_min_endpoint_effective(self) -> int:
        """Minimum decode (or aggregated) replicas: `decode_min_endpoint` if set, else `min_endpoint`."""
        return self.min_endpoint if self.decode_min_endpoint is None else self.decode_min_endpoint

    @property
    def scale_interval_seconds_effective(self) -> float:
        """Base tick period (s).

        The explicit `scheduling.scale_interval_seconds` if set; otherwise the greatest common divisor, at
        millisecond resolution, of the load interval and (only when the throughput loop is active, i.e.
        target `sla`) the throughput interval. With Dynamo's defaults this is 5 s.
        """
        if self.scheduling.scale_interval_seconds is not None:
            return self.scheduling.scale_interval_seconds
        intervals = [float(self.load_adjustment_interval_seconds)]
        if self.throughput_scaling_active:
            intervals.append(float(self.throughput_adjustment_interval_seconds))
        return _gcd_seconds(intervals)

    @property
    def capacity_ttft_ms(self) -> float:
        """The TTFT an engine is sized for: `ttft_ms`, times `ttft_dispatch_threshold` under router `slo` (the
        router sends an engine no prompt it predicts past that, so that is the load the engine will carry)."""
        return self.ttft_ms * (self.ttft_dispatch_threshold if self.router is RouterKind.SLO else 1.0)

    @property
    def capacity_itl_ms(self) -> float:
        """The ITL an engine is sized for: `itl_ms`, times `tpot_dispatch_threshold` under router `slo`."""
        return self.itl_ms * (self.tpot_dispatch_threshold if self.router is RouterKind.SLO else 1.0)

    @property
    def prefill_gpus_per_engine(self) -> int:
        """GPUs per prefill engine: `prefill_engine_num_gpu`, or 1 when unset."""
        return 1 if self.prefill_engine_num_gpu is None else self.prefill_engine_num_gpu

    @property
    def decode_gpus_per_engine(self) -> int:
        """GPUs per decode (or aggregated) engine: `decode_engine_num_gpu`, or 1 when unset."""
        return 1 if self.decode_engine_num_gpu is None else self.decode_engine_num_gpu

    def engine_limits(self, component: Component, *, profiled_max_kv_tokens: int | None = None) -> EngineLimits:
        """The static limits of one engine of `component`'s pool, as the decision core uses them.

        `profiled_max_kv_tokens` (the engine profile's KV capacity) fills `max_kv_tokens` when the config leaves it
        unset; without either, Dynamo's fallback of 2,000,000 applies.
        """
        if component is Component.PREFILL:
            limits, num_gpu = self.prefill_engine, self.prefill_gpus_per_engine
        else:
            limits, num_gpu = self.decode_engine, self.decode_gpus_per_engine
        return EngineLimits(
            num_gpu=num_gpu,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            max_num_seqs=limits.max_num_seqs,
            max_kv_tokens=(
                limits.max_kv_tokens
                if limits.max_kv_tokens is not None
                else (profiled_max_kv_tokens if profiled_max_kv_tokens is not None else 2_000_000)
            ),
            context_length=limits.context_length,
            speculative_nextn=self.speculative_nextn,
        )
