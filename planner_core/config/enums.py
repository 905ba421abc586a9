"""The configuration's choices: one `StrEnum` per field whose value is one of a fixed set, and the pools a mode manages.

The values are the spellings written in the configuration file (Dynamo's, where Dynamo has the field); the comments
say where each choice comes from (Dynamo 0.x, 1.x or ours).
"""

from __future__ import annotations

import enum

from planner_core.domain import Component


class OptimizationTarget(enum.StrEnum):
    """What the planner optimises for."""

    THROUGHPUT = "throughput"  # static queue/KV thresholds tuned for utilisation ("easy" target)
    LATENCY = "latency"  # static thresholds tuned for headroom ("easy" target)
    LOAD = "load"  # user-supplied queue-token and KV-rate thresholds
    SLA = "sla"  # perf-model driven: meet ttft_ms / itl_ms


class LoadPolicy(enum.StrEnum):
    """Which algorithm the load loop runs (ours; Dynamo 1.x has only the first, Dynamo 0.x only the second)."""

    # Dynamo 1.x: every load tick, on the latest forward-pass metrics of each engine. Target `sla`: per-engine
    # TTFT/ITL estimates through the forward-pass model; targets throughput/latency/load: per-engine thresholds.
    PER_ENGINE = "per_engine"
    # Dynamo's deprecated 2025 load planner: averages of the prefill queue and the decode KV utilisation over an
    # adjustment interval against fixed thresholds, with a decode grace period and a prefill queue-trend check.
    THRESHOLD_2025 = "threshold_2025"


class PlannerMode(enum.StrEnum):
    """Which worker pools this planner instance manages."""

    DISAGG = "disagg"  # separate prefill and decode pools
    PREFILL = "prefill"  # only the prefill pool
    DECODE = "decode"  # only the decode pool
    AGG = "agg"  # one aggregated pool (modelled as the decode role)


class EnvironmentKind(enum.StrEnum):
    """Where scaling decisions are sent (the connector)."""

    KUBERNETES = "kubernetes"  # a Dynamo DynamoGraphDeployment
    KUBERNETES_WORKLOADS = "kubernetes-workloads"  # plain Deployments/StatefulSets, one per role
    VIRTUAL = "virtual"
    GLOBAL_PLANNER = "global-planner"
    LOCAL = "local"  # engine processes on this machine, started and stopped by the planner (`local_workers`)


class WorkloadKind(enum.StrEnum):
    """The Kubernetes workload kinds `environment: kubernetes-workloads` scales (apps/v1, scale subresource)."""

    DEPLOYMENT = "Deployment"
    STATEFUL_SET = "StatefulSet"


class Backend(enum.StrEnum):
    """Inference engine the workers run."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    MOCKER = "mocker"


class LoadPredictorName(enum.StrEnum):
    """Family of the traffic forecaster used by the throughput loop."""

    CONSTANT = "constant"  # last observed window
    ARIMA = "arima"  # statsmodels ARIMA, order chosen by AIC and re-chosen periodically
    PROPHET = "prophet"  # Prophet refitted on the last prophet_window_size windows
    KALMAN = "kalman"  # local linear trend Kalman filter
    # Ours, not Dynamo's: follows whichever of constant / kalman / arima has the lowest recent loss, and never
    # forecasts below the last window right after a burst.
    ENSEMBLE = "ensemble"


class SweepingMode(enum.StrEnum):
    """How engine performance was profiled before deployment."""

    NONE = "none"  # no bootstrap data
    RAPID = "rapid"  # simulated (AI Configurator)
    THOROUGH = "thorough"  # measured on real GPUs


class ThroughputAlgorithm(enum.StrEnum):
    """How the throughput loop turns a forecast into replicas (ours: Dynamo has one per release)."""

    # Dynamo 0.x: tokens/s/GPU interpolated from the pre-deployment profile at the forecast shape.
    INTERPOLATION = "interpolation"
    # Dynamo 0.x with its correction factors: observed / interpolated TTFT and ITL rescale the load and the ITL
    # target each interval. Needs observed TTFT and ITL; without them the factors are 1 and the step says so.
    INTERPOLATION_CORRECTED = "interpolation_corrected"
    # Dynamo 1.x: requests/s one engine sustains under the SLA, searched over batch sizes on a forward-pass model
    # (planner_core.perf.capacity): the online model fitted on live forward-pass metrics once it is ready, before
    # that the precomputed perf table if one is configured, else the profile. Also sizes aggregated mode.
    ENGINE_CAPACITY = "engine_capacity"


class LoadNextRequest(enum.StrEnum):
    """What the SLA load loop assumes of the "next request" every TTFT/ITL estimate adds."""

    # Dynamo 1.x (1.0 to 1.6.1): the engines' own moving averages over the last `max_num_fpm_samples` reports,
    # whether or not the throughput loop runs: prompt tokens computed per prefill request in an iteration (a
    # chunk of a long prompt counts as its chunk; an iteration without prefill counts 0) and KV tokens per
    # decode request.
    ENGINE_AVERAGE = "engine_average"
    # Ours: the last traffic window's mean ISL and OSL (ISL + OSL/2 of KV for decode) when the throughput loop
    # observed one, else the engines' moving averages. The whole prompt, not its chunks or the idle iterations.
    TRAFFIC_WINDOW = "traffic_window"


class LengthSizing(enum.StrEnum):
    """Which request shape the throughput loop sizes for (ours, not Dynamo's)."""

    MEAN = "mean"  # the forecast mean ISL/OSL (Dynamo's behaviour)
    # The forecast `load_predictor_length_quantile` of ISL and OSL: as if every request were as long as the
    # tail, so that requests at that quantile still fit the capacity the SLA was sized for.
    QUANTILE = "quantile"


class ThroughputMetricsSource(enum.StrEnum):
    """Which Prometheus series the traffic observation is read from."""

    FRONTEND = "frontend"
    ROUTER = "router"


class RouterKind(enum.StrEnum):
    """The frontend's request router (ours; the simulator runs each)."""

    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    SLO = "slo"  # SLO-aware routing (planner_core.routing): lowest predicted latency within SLO x threshold


class OutsideChangeRule(enum.StrEnum):
    """What the planner does when someone else changed a pool's count (ours; Dynamo silently writes its own back)."""

    ADOPT_AND_HOLD = "adopt_and_hold"  # take the new count as the pool's and keep it for outside_change_hold_seconds
    RESTORE = "restore"  # write back the count the planner last applied


def managed_components(mode: PlannerMode) -> tuple[Component, ...]:
    """Pools the planner scales in a mode (aggregated mode's single pool is represented as DECODE)."""
    if mode is PlannerMode.PREFILL:
        return (Component.PREFILL,)
    if mode in (PlannerMode.DECODE, PlannerMode.AGG):
        return (Component.DECODE,)
    return (Component.PREFILL, Component.DECODE)
