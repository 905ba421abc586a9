"""The planner's own Prometheus metrics, under Dynamo's `dynamo_planner_*` names, read from Postgres at each scrape.

`planner serve` runs every tick in a Prefect flow-run subprocess, so an in-memory registry updated after each
tick would live and die with that subprocess. Postgres already holds every recorded tick outcome, so the
exporter is a custom collector instead: each scrape reads the deployment's latest recorded ticks (from the
`tick_summary` view, as the report does) in one short read-only transaction (`load_metrics_snapshot`) and
`metric_families(snapshot)` (pure) turns that snapshot into metric families. The snapshot is kept for `cache_s`
(`PLANNER_METRICS_CACHE_S`, 5 s), so scrapes however frequent cost Postgres at most one read per `cache_s`; the
decision core is untouched, and a restarted exporter shows the same values. The server listens on
`PLANNER_METRICS_BIND` (127.0.0.1 unless set: the metrics are unauthenticated).

Exported (all gauges unless said): `num_prefill_replicas`, `num_decode_replicas` (ready workers the newest tick
saw); `observed_{ttft_ms,itl_ms,requests_per_second,input_sequence_tokens,output_sequence_tokens}` (the newest
throughput window); `predicted_{requests_per_second,input_sequence_tokens,output_sequence_tokens,
num_prefill_replicas,num_decode_replicas}` (its forecast and proposals); `gpu_hours` (since the deployment's first
tick); `sla_target_{ttft,itl}_ms`; `engine_{prefill,decode}_capacity_requests_per_second`; the state sets (Dynamo's
enums) `load_scaling_decision` and `throughput_scaling_decision`; per engine (`worker_id`, `dp_rank`)
`engine_queued_prefill_tokens`, `engine_queued_decode_kv_tokens`, `engine_inflight_decode_kv_tokens` (from the
newest recorded forward-pass metrics); `tick_lag_seconds`; per out-of-process plugin (`plugin_id`)
`plugin_circuit_state` (Dynamo's values: 0 closed, 0.5 half-open, 1 open, as of the newest tick's planner
state) and the counter `plugin_circuit_open_skips_total` (ticks that skipped it because its breaker was open);
per source signal (`signal`: traffic, latency, fpm, workers) `signal_age_seconds` (since a tick last had it) and
`signal_miss_streak` (ticks in a row that expected it and missed it: while > 0 no pool shrinks), as of the newest
tick's planner state;
and the histogram `tick_duration_seconds` (the pure decision time of every recorded tick). A value the planner
did not record (e.g. TTFT from a source without it) has no sample rather than an invented one.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from planner_core.config import CircuitBreakerConfig
from planner_core.domain import PluginSchedule, gpu_hours
from planner_core.pipeline.breaker import CIRCUIT_GAUGE, circuit_state
from planner_core.pipeline.types import BreakerSpec
from planner_core.runtime.store import repository as repo

PREFIX = "dynamo_planner_"

# Dynamo's decision enums, in their (append-only) order: the states of the two state-set metrics.
LOAD_DECISION_REASONS: tuple[str, ...] = (
    "unset",
    "disabled",
    "no_fpm_data",
    "scaling_in_progress",
    "worker_count_mismatch",
    "insufficient_data",
    "no_change",
    "scale_up",
    "scale_down",
    "scale_down_capped_by_throughput",
    "scale_down_refused_consolidation",
    "override_by_user_plugin",
    "reconcile_clamped_to_floor",
    "reconcile_clamped_to_ceiling",
    "held_over",
    "rejected_by_plugin",
    "gpu_budget_guard_hold",
    "gpu_budget_reconcile",
)
THROUGHPUT_DECISION_REASONS: tuple[str, ...] = (
    "unset",
    "disabled",
    "no_traffic_data",
    "predict_failed",
    "model_not_ready",
    "set_lower_bound",
    "scale",
    "override_by_user_plugin",
    "held_over",
    "circuit_open",
    "rejected_by_plugin",
    "gpu_budget_guard_hold",
    "no_change",
    "gpu_budget_reconcile",
    "partner_not_ready",
)
# Upper bounds (s) of the tick-duration histogram: the pure decision takes ~0.1-10 ms; ARIMA refits take longer.
TICK_DURATION_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineQueues:
    """One engine's queues in the newest recorded forward-pass metrics (tokens)."""

    component: str
    worker_id: str
    dp_rank: int
    queued_prefill_tokens: float | None = None
    queued_decode_kv_tokens: float | None = None
    inflight_decode_kv_tokens: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginCircuit:
    """One out-of-process plugin's circuit breaker as the newest tick left it, and how often it was skipped."""

    plugin_id: str
    state: float  # 0 closed, 0.5 half-open, 1 open
    open_skips: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalHealthRow:
    """One source signal as the newest tick left it (`planner_core.policy.signals`): seconds since a tick last
    had it (None: never) and the ticks in a row that expected it and missed it."""

    signal: str
    age_s: float | None
    num_misses: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSnapshot:
    """What the metrics show: the newest recorded ticks of one deployment (None = not recorded).

    Attributes:
        tick_duration_buckets: cumulative counts of ticks with decision time <= each bound of
            `TICK_DURATION_BUCKETS_S`, then the total (+Inf).
        tick_duration_sum_s: sum of all ticks' decision times (s).
    """

    num_prefill_replicas: int | None = None
    num_decode_replicas: int | None = None
    observed_ttft_ms: float | None = None
    observed_itl_ms: float | None = None
    observed_requests_per_second: float | None = None
    observed_input_sequence_tokens: float | None = None
    observed_output_sequence_tokens: float | None = None
    predicted_requests_per_second: float | None = None
    predicted_input_sequence_tokens: float | None = None
    predicted_output_sequence_tokens: float | None = None
    predicted_num_prefill_replicas: int | None = None
    predicted_num_decode_replicas: int | None = None
    gpu_hours: float = 0.0
    sla_target_ttft_ms: float | None = None
    sla_target_itl_ms: float | None = None
    engine_prefill_capacity_requests_per_second: float | None = None
    engine_decode_capacity_requests_per_second: float | None = None
    load_scaling_decision: str = "unset"
    throughput_scaling_decision: str = "unset"
    engine_queues: tuple[EngineQueues, ...] = ()
    tick_lag_seconds: float | None = None
    tick_duration_buckets: tuple[int, ...] = (0,) * (len(TICK_DURATION_BUCKETS_S) + 1)
    tick_duration_sum_s: float = 0.0
    plugin_circuits: tuple[PluginCircuit, ...] = ()
    signals: tuple[SignalHealthRow, ...] = ()


# --- metric families (pure) -------------------------------------------------------------------------------------

_GAUGES: tuple[tuple[str, str], ...] = (
    ("num_prefill_replicas", "Ready prefill workers the newest tick saw"),
    ("num_decode_replicas", "Ready decode workers the newest tick saw"),
    ("observed_ttft_ms", "Mean TTFT over the newest throughput window (ms)"),
    ("observed_itl_ms", "Mean ITL over the newest throughput window (ms)"),
    ("observed_requests_per_second", "Request rate over the newest throughput window"),
    ("observed_input_sequence_tokens", "Mean ISL over the newest throughput window (tokens)"),
    ("observed_output_sequence_tokens", "Mean OSL over the newest throughput window (tokens)"),
    ("predicted_requests_per_second", "Forecast request rate of the next throughput window"),
    ("predicted_input_sequence_tokens", "Forecast mean ISL of the next throughput window (tokens)"),
    ("predicted_output_sequence_tokens", "Forecast mean OSL of the next throughput window (tokens)"),
    ("predicted_num_prefill_replicas", "Prefill replicas the newest throughput tick proposed"),
    ("predicted_num_decode_replicas", "Decode replicas the newest throughput tick proposed"),
    ("gpu_hours", "GPU-hours of ready workers since the deployment's first tick"),
    ("sla_target_ttft_ms", "TTFT target of the config in force (ms)"),
    ("sla_target_itl_ms", "ITL target of the config in force (ms)"),
    (
        "engine_prefill_capacity_requests_per_second",
        "Requests/s one prefill engine serves under the TTFT target at the forecast ISL",
    ),
    (
        "engine_decode_capacity_requests_per_second",
        "Requests/s one decode engine serves under the ITL target at the forecast shape",
    ),
    ("tick_lag_seconds", "How long after its scheduled time the newest tick was recorded (s)"),
)
_ENGINE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("engine_queued_prefill_tokens", "queued_prefill_tokens", "Prompt tokens waiting in the engine's queue"),
    ("engine_queued_decode_kv_tokens", "queued_decode_kv_tokens", "KV tokens of decode requests waiting in queue"),
    ("engine_inflight_decode_kv_tokens", "inflight_decode_kv_tokens", "KV tokens of decode requests running"),
)


def _known(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def metric_families(snapshot: MetricsSnapshot) -> Iterator[Any]:
    """The snapshot as Prometheus metric families (every family is always declared; unknown values have no sample)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        StateSetMetricFamily,
    )

    for name, doc in _GAUGES:
        family = GaugeMetricFamily(PREFIX + name, doc)
        value = getattr(snapshot, name)
        if _known(value):
            family.add_metric([], float(value))
        yield family
    for name, current, states in (
        ("load_scaling_decision", snapshot.load_scaling_decision, LOAD_DECISION_REASONS),
        ("throughput_scaling_decision", snapshot.throughput_scaling_decision, THROUGHPUT_DECISION_REASONS),
    ):
        # A reason newer than Dynamo's list is added as a state rather than hidden.
        all_states = states if current in states else (*states, current)
        yield StateSetMetricFamily(
            PREFIX + name,
            f"Reason of the newest {name.split('_')[0]} tick (Dynamo's decision enum)",
            {state: state == current for state in all_states},
        )
    for name, attribute, doc in _ENGINE_GAUGES:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=["worker_id", "dp_rank"])
        for engine in snapshot.engine_queues:
            value = getattr(engine, attribute)
            if _known(value):
                family.add_metric([engine.worker_id, str(engine.dp_rank)], float(value))
        yield family
    circuit = GaugeMetricFamily(
        PREFIX + "plugin_circuit_state",
        "Circuit breaker of an out-of-process plugin after the newest tick: 0 closed, 0.5 half-open, 1 open",
        labels=["plugin_id"],
    )
    skips = CounterMetricFamily(
        PREFIX + "plugin_circuit_open_skips",
        "Ticks that did not call an out-of-process plugin because its circuit breaker was open",
        labels=["plugin_id"],
    )
    for plugin in snapshot.plugin_circuits:
        circuit.add_metric([plugin.plugin_id], plugin.state)
        skips.add_metric([plugin.plugin_id], float(plugin.open_skips))
    yield circuit
    yield skips
    age = GaugeMetricFamily(
        PREFIX + "signal_age_seconds",
        "Seconds from the newest tick back to the last tick that had the signal (traffic, latency, fpm, workers)",
        labels=["signal"],
    )
    misses = GaugeMetricFamily(
        PREFIX + "signal_miss_streak",
        "Ticks in a row, up to the newest, that expected the signal and missed it (0: fresh; > 0: no pool shrinks)",
        labels=["signal"],
    )
    for signal in snapshot.signals:
        if _known(signal.age_s):
            age.add_metric([signal.signal], float(signal.age_s))
        misses.add_metric([signal.signal], float(signal.num_misses))
    yield age
    yield misses
    bounds = [*(repr(float(b)) for b in TICK_DURATION_BUCKETS_S), "+Inf"]
    yield HistogramMetricFamily(
        PREFIX + "tick_duration_seconds",
        "Decision time of the recorded ticks (the pure tick; s)",
        buckets=list(zip(bounds, (float(c) for c in snapshot.tick_duration_buckets), strict=True)),
        sum_value=snapshot.tick_duration_sum_s,
    )


def exported_metric_names() -> frozenset[str]:
    """Names of every metric family the exporter declares (histograms add `_bucket`, `_sum`, `_count` samples)."""
    return frozenset(family.name for family in metric_families(MetricsSnapshot()))


# --- loading (the database edge) --------------------------------------------------------------------------------

# The newest tick per loop, from the `tick_summary` view (migration 0006; the report reads the same view): each
# loop's newest tick found by one index probe on `ticks` (newest first, one row), then the view's row of that tick
# only. A DISTINCT ON over the view's rows of the deployment evaluated the view's lookups for every tick it ever
# recorded (3.9 s a scrape at 10 days of 5 s ticks, `planner_core/lab/history/metrics_scrape.py`; 11 ms this way).
_LATEST_SQL = """
SELECT s.loop, s.reason, s.lag_s, s.window_s,
       s.observed_num_req, s.observed_isl, s.observed_osl, s.observed_ttft_ms, s.observed_itl_ms,
       s.predicted_num_req, s.predicted_isl, s.predicted_osl, s.ready_prefill, s.ready_decode,
       s.proposed_prefill, s.proposed_decode, s.prefill_engine_requests_per_s, s.decode_engine_requests_per_s,
       s.ttft_target_ms, s.itl_target_ms, s.throughput_interval_s, s.scheduled_at, s.tick_id
  FROM deployments dep
 CROSS JOIN unnest(ARRAY['throughput', 'load']) AS l(loop)
 CROSS JOIN LATERAL (
       SELECT t.id, t.scheduled_at FROM ticks t
        WHERE t.deployment_id = dep.id AND t.loop = l.loop
        ORDER BY t.scheduled_at DESC, t.id DESC LIMIT 1) AS newest
 CROSS JOIN LATERAL (
       -- OFFSET 0 keeps the view a subquery of its own, evaluated for that one tick; joined to the view as a
       -- table, the planner merged the view into the query and merge-joined every tick's row (3 s at 10 days)
       SELECT * FROM tick_summary v
        WHERE v.tick_id = newest.id AND v.scheduled_at = newest.scheduled_at
       OFFSET 0) AS s
 WHERE dep.name = :deployment
"""

# The ticks' worker observations where the GPU count changed, and the last one: all `recorded_gpu_hours` needs
# (`planner_core.domain.cumulative_gpu_hours` integrates runs of equal counts as one interval). From the tables,
# joined once, not through `tick_summary`, whose lookups run once per tick.
_GPU_CHANGES_SQL = """
SELECT scheduled_at, gpus
  FROM (SELECT scheduled_at, tick_id, gpus,
               lag(gpus) OVER w AS previous_gpus,
               lead(tick_id) OVER w AS next_tick_id
          FROM (SELECT t.scheduled_at, t.id AS tick_id,
                       o.ready_prefill * COALESCE(c.prefill_gpus, 1) + o.ready_decode * COALESCE(c.decode_gpus, 1)
                       AS gpus
                  FROM ticks t
                  JOIN deployments dep ON dep.id = t.deployment_id
                  JOIN worker_observations o ON o.tick_id = t.id AND o.scheduled_at = t.scheduled_at
                  -- each config's GPUs per engine, not its body: the rows sorted below carry integers only
                  LEFT JOIN (SELECT config_hash,
                                    COALESCE((body ->> 'prefill_engine_num_gpu')::integer, 1) AS prefill_gpus,
                                    COALESCE((body ->> 'decode_engine_num_gpu')::integer, 1) AS decode_gpus
                               FROM planner_configs) c ON c.config_hash = t.config_hash
                 WHERE dep.name = :deployment
               ) observed
        WINDOW w AS (ORDER BY scheduled_at, tick_id)) runs
 WHERE previous_gpus IS DISTINCT FROM gpus OR next_tick_id IS NULL
 ORDER BY scheduled_at, tick_id
"""


# The newest tick's plugin schedules and the external plugins of the config it ran under; the skips per plugin.
_CIRCUITS_SQL = """
SELECT t.scheduled_at, s.tick_id AS state_tick_id,
       c.body -> 'scheduling' -> 'external_plugins' AS external
  FROM ticks t
  JOIN deployments d ON d.id = t.deployment_id
  JOIN planner_states s ON s.tick_id = t.id
  JOIN planner_configs c ON c.config_hash = t.config_hash
 WHERE d.name = :deployment
 ORDER BY t.scheduled_at DESC, t.id DESC
 LIMIT 1
"""
_CIRCUIT_SKIPS_SQL = """
SELECT substr(ts.step, strpos(ts.step, ':') + 1) AS plugin_id, count(*) AS n
  FROM tick_steps ts
  JOIN ticks t ON t.id = ts.tick_id
  JOIN deployments d ON d.id = t.deployment_id
 WHERE d.name = :deployment AND ts.reason = 'plugin_circuit_open'
 GROUP BY 1
"""


def _plugin_circuits(session: Session, deployment: str) -> tuple[PluginCircuit, ...]:
    """Every out-of-process plugin of the config in force, with its breaker as of the newest tick."""
    params = {"deployment": deployment}
    row = session.execute(text(_CIRCUITS_SQL), params).mappings().first()
    if row is None or not row["external"]:
        return ()
    skips = {r["plugin_id"]: int(r["n"]) for r in session.execute(text(_CIRCUIT_SKIPS_SQL), params).mappings()}
    state = repo.state_json(session, row["state_tick_id"]) or {}  # whole or rebuilt from deltas (migration 0016)
    schedules = {entry["plugin_id"]: entry for entry in state.get("pipeline", {}).get("plugins") or ()}
    now_s = row["scheduled_at"].timestamp()
    circuits = []
    for entry in row["external"]:
        breaker = CircuitBreakerConfig.model_validate(entry.get("circuit_breaker") or {})
        spec = BreakerSpec(
            failure_threshold=breaker.failure_threshold,
            window_s=breaker.window_seconds,
            cooldown_s=breaker.cooldown_seconds,
        )
        known = schedules.get(entry["plugin_id"], {})
        schedule = PluginSchedule(
            plugin_id=entry["plugin_id"], registered_at_s=now_s, circuit_opened_at_s=known.get("circuit_opened_at_s")
        )
        state = CIRCUIT_GAUGE[circuit_state(spec, schedule, now_s)]
        circuits.append(
            PluginCircuit(plugin_id=entry["plugin_id"], state=state, open_skips=skips.get(entry["plugin_id"], 0))
        )
    return tuple(circuits)


def recorded_gpu_hours(session: Session, deployment: str) -> float:
    """GPU-hours of `deployment`'s ready workers since its first tick, as the report counts them: each tick's
    observation held until the next tick (`planner_core.domain.gpu_hours`); 0 for an unknown deployment."""
    rows = session.execute(text(_GPU_CHANGES_SQL), {"deployment": deployment}).mappings()
    return gpu_hours((row["scheduled_at"].timestamp(), int(row["gpus"])) for row in rows)


_ENGINES_SQL = """
SELECT f.component, f.worker_id, f.dp_rank, f.metrics
  FROM fpm_snapshots f
 WHERE f.tick_id = (SELECT max(t.id) FROM ticks t
                      JOIN deployments dep ON dep.id = t.deployment_id
                     WHERE dep.name = :deployment AND json_array_length(COALESCE(t.inputs->'fpm', '[]')) > 0)
 ORDER BY f.component, f.worker_id, f.dp_rank
"""


def _durations_sql() -> str:
    counts = ", ".join(
        f"count(*) FILTER (WHERE t.decide_ms <= {1000.0 * bound!r}) AS b{i}"
        for i, bound in enumerate(TICK_DURATION_BUCKETS_S)
    )
    return f"""
SELECT {counts}, count(*) AS total, coalesce(sum(t.decide_ms), 0) / 1000.0 AS sum_s
  FROM ticks t JOIN deployments dep ON dep.id = t.deployment_id
 WHERE dep.name = :deployment
"""


def _nested(metrics: dict[str, Any], section: str, key: str) -> float | None:
    value = (metrics.get(section) or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


# The newest tick's planner state (either loop): each signal's health as that tick left it.
_NEWEST_STATE_SQL = """
SELECT t.scheduled_at, s.tick_id AS state_tick_id
  FROM ticks t
  JOIN deployments d ON d.id = t.deployment_id
  JOIN planner_states s ON s.tick_id = t.id
 WHERE d.name = :deployment
 ORDER BY t.scheduled_at DESC, t.id DESC
 LIMIT 1
"""


def _signals(session: Session, deployment: str) -> tuple[SignalHealthRow, ...]:
    """Each signal ever expected, as of the newest tick's state (the JSON form of `SignalStatus`)."""
    row = session.execute(text(_NEWEST_STATE_SQL), {"deployment": deployment}).mappings().first()
    if row is None:
        return ()
    state = repo.state_json(session, row["state_tick_id"]) or {}
    now_s = row["scheduled_at"].timestamp()
    return tuple(
        SignalHealthRow(
            signal=str(entry["signal"]),
            age_s=None if entry.get("last_seen_s") is None else max(0.0, now_s - float(entry["last_seen_s"])),
            num_misses=int(entry.get("num_misses", 0)),
        )
        for entry in state.get("signals") or ()
    )


def load_metrics_snapshot(session: Session, deployment: str) -> MetricsSnapshot:
    """The newest recorded state of `deployment` (an empty snapshot when it has recorded nothing yet)."""
    params = {"deployment": deployment}
    latest = {row["loop"]: dict(row) for row in session.execute(text(_LATEST_SQL), params).mappings()}
    throughput, load = latest.get("throughput"), latest.get("load")
    newest = max(
        (row for row in (throughput, load) if row is not None),
        key=lambda row: (row["scheduled_at"], row["tick_id"]),
        default=None,
    )
    with_workers = [row for row in (throughput, load) if row is not None and row["ready_prefill"] is not None]
    workers = max(with_workers, key=lambda row: (row["scheduled_at"], row["tick_id"]), default=None)
    durations = session.execute(text(_durations_sql()), params).mappings().one()
    engines = tuple(
        EngineQueues(
            component=row["component"],
            worker_id=row["worker_id"],
            dp_rank=row["dp_rank"],
            # the JSON form of `ForwardPassMetrics` (planner_core.domain)
            queued_prefill_tokens=_nested(row["metrics"], "queued", "sum_prefill_tokens"),
            queued_decode_kv_tokens=_nested(row["metrics"], "queued", "sum_decode_kv_tokens"),
            inflight_decode_kv_tokens=_nested(row["metrics"], "scheduled", "sum_decode_kv_tokens"),
        )
        for row in session.execute(text(_ENGINES_SQL), params).mappings()
    )
    t = throughput or {}
    n = newest or {}  # the config in force is the newest tick's (of either loop)
    interval_s = n.get("throughput_interval_s") or t.get("window_s")
    return MetricsSnapshot(
        num_prefill_replicas=workers["ready_prefill"] if workers else None,
        num_decode_replicas=workers["ready_decode"] if workers else None,
        observed_ttft_ms=t.get("observed_ttft_ms"),
        observed_itl_ms=t.get("observed_itl_ms"),
        observed_requests_per_second=_ratio(t.get("observed_num_req"), t.get("window_s")),
        observed_input_sequence_tokens=t.get("observed_isl"),
        observed_output_sequence_tokens=t.get("observed_osl"),
        predicted_requests_per_second=_ratio(t.get("predicted_num_req"), interval_s),
        predicted_input_sequence_tokens=t.get("predicted_isl"),
        predicted_output_sequence_tokens=t.get("predicted_osl"),
        predicted_num_prefill_replicas=t.get("proposed_prefill"),
        predicted_num_decode_replicas=t.get("proposed_decode"),
        gpu_hours=recorded_gpu_hours(session, deployment),
        sla_target_ttft_ms=n.get("ttft_target_ms"),
        sla_target_itl_ms=n.get("itl_target_ms"),
        # whichever capacity step sized the tick, in requests/s per engine (the view converts tokens/s)
        engine_prefill_capacity_requests_per_second=t.get("prefill_engine_requests_per_s"),
        engine_decode_capacity_requests_per_second=t.get("decode_engine_requests_per_s"),
        load_scaling_decision=load["reason"] if load else "unset",
        throughput_scaling_decision=throughput["reason"] if throughput else "unset",
        engine_queues=engines,
        tick_lag_seconds=float(newest["lag_s"]) if newest else None,
        tick_duration_buckets=(
            *(int(durations[f"b{i}"]) for i in range(len(TICK_DURATION_BUCKETS_S))),
            int(durations["total"]),
        ),
        tick_duration_sum_s=float(durations["sum_s"]),
        plugin_circuits=_plugin_circuits(session, deployment),
        signals=_signals(session, deployment),
    )


# --- the exporter -------------------------------------------------------------------------------------------------


class PlannerCollector:
    """A prometheus_client collector that reads one deployment's newest recorded ticks, at most once per `cache_s`
    (0 = at every scrape): scrapes in between, from any number of scrapers, get the same snapshot."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        deployment: str,
        *,
        cache_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sessions = sessions
        self._deployment = deployment
        self._cache_s = cache_s
        self._clock = clock
        self._lock = threading.Lock()  # prometheus_client serves scrapes on several threads
        self._snapshot: MetricsSnapshot | None = None
        self._read_at = -math.inf
        self.num_reads = 0  # database reads so far (the cache's effect, for tests and debugging)

    def snapshot(self) -> MetricsSnapshot:
        """The cached snapshot, read again from Postgres when older than `cache_s`."""
        with self._lock:
            now = self._clock()
            if self._snapshot is None or now - self._read_at >= self._cache_s:
                with self._sessions.begin() as session:
                    self._snapshot = load_metrics_snapshot(session, self._deployment)
                self._read_at = now
                self.num_reads += 1
            return self._snapshot

    def collect(self) -> Iterator[Any]:
        yield from metric_families(self.snapshot())

    def describe(self) -> list[Any]:
        return []  # no database read when the collector is registered


def start_metrics_server(
    port: int, database_url: str, deployment: str, *, addr: str = "127.0.0.1", cache_s: float = 5.0
) -> tuple[Any, Any]:
    """Serve `/metrics` for `deployment` on `addr:port` in a daemon thread; returns (server, thread).

    `addr` defaults to loopback: the metrics are unauthenticated, so listening on every interface
    (`PLANNER_METRICS_BIND=0.0.0.0`, e.g. for an in-cluster Prometheus) is a choice to make, not a default.
    The registry is private to this server (not prometheus_client's global one), so two exporters never mix.
    """
    from prometheus_client import CollectorRegistry, start_http_server

    from planner_core.runtime.store.db import session_factory

    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlannerCollector(session_factory(database_url), deployment, cache_s=cache_s))
    return start_http_server(port, addr=addr, registry=registry)
