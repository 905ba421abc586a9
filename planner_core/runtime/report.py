"""Diagnostics reports: one Plotly HTML page per period (or on demand) built from Postgres.

The page has Dynamo's 13 diagnostics charts plus "forecast vs actual" and a timeline of decision reasons, with a
header of headline figures and a table of the decisions. Three layers:

- `load_report_data(session, ...)` reads the recorded ticks of one deployment over a time window (the only
  database code; the tick rows come from the `tick_summary` view, which the metrics exporter reads too);
- `build_charts(data)`, `summarise(data)` and `render_html(data, generated_at)` are pure: the same data give the
  same page (no clock, deterministic element ids);
- `generate_report(...)` ties them together and writes the page (and an optional JSONL.gz log of the tick rows)
  atomically: a reader never sees a half-written file. The page loads plotly.js from a copy written once beside
  it (`write_plotly_js`), so a report is a few hundred kB instead of about 5 MB and still opens offline.

Charts whose data the planner does not record yet (per-engine TTFT/ITL estimates; engine queues while no
forward-pass metrics are stored) are still drawn, with what exists (the SLA target) and a "no data recorded" note,
never with invented values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import html
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, bindparam, text
from sqlalchemy.orm import Session

from planner_core.domain import Component, Loop, ReasonCode
from planner_core.domain import cumulative_gpu_hours as domain_cumulative_gpu_hours
from planner_core.runtime.metrics import LOAD_DECISION_REASONS, THROUGHPUT_DECISION_REASONS

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


# --- data -------------------------------------------------------------------------------------------------------


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


# --- loading (the database edge) --------------------------------------------------------------------------------

_WINDOW = """dep.name = :deployment
      AND (CAST(:since AS timestamptz) IS NULL OR t.scheduled_at >= :since)
      AND (CAST(:until AS timestamptz) IS NULL OR t.scheduled_at < :until)"""

# The per-tick rows come from the `tick_summary` view (migration 0006), which the metrics exporter reads too; a
# decided tick's `why` from `decision_history` (migration 0008), as `planner history` shows it.
_TICKS_SQL = """
SELECT tick_id, loop, scheduled_at, lag_s, reason, decide_ms,
       window_s, observed_num_req, observed_isl, observed_osl, observed_ttft_ms, observed_itl_ms,
       predictor, predicted_num_req, predicted_isl, predicted_osl, prediction_reason,
       ready_prefill, ready_decode, expected_prefill, expected_decode, proposed_prefill, proposed_decode,
       prefill_engine_tokens_per_s, decode_engine_tokens_per_s,
       decision_id, target_prefill, target_decode, decision_status,
       ttft_target_ms, itl_target_ms, prefill_gpus_per_engine, decode_gpus_per_engine, throughput_interval_s,
       (SELECT h.why FROM decision_history h WHERE h.decision_id = tick_summary.decision_id) AS why
  FROM tick_summary
 WHERE deployment = :deployment
   AND (CAST(:since AS timestamptz) IS NULL OR scheduled_at >= :since)
   AND (CAST(:until AS timestamptz) IS NULL OR scheduled_at < :until)
 ORDER BY scheduled_at, tick_id
"""

_STEPS_SQL = f"""
SELECT s.tick_id, t.loop, t.scheduled_at, s.seq, s.step, s.component, s.reason, s.value, s.detail
  FROM tick_steps s
  JOIN ticks t ON t.id = s.tick_id
  JOIN deployments dep ON dep.id = t.deployment_id
 WHERE {_WINDOW} AND s.reason NOT IN :routine
 ORDER BY t.scheduled_at, s.tick_id, s.seq
"""

_FPM_SQL = f"""
SELECT t.scheduled_at, f.component, f.worker_id, f.dp_rank, f.metrics
  FROM fpm_snapshots f
  JOIN ticks t ON t.id = f.tick_id
  JOIN deployments dep ON dep.id = t.deployment_id
 WHERE {_WINDOW}
 ORDER BY t.scheduled_at, f.component, f.worker_id, f.dp_rank
"""

_EVENTS_SQL = """
SELECT x.decision_id, x.executed_at AS at, x.outcome AS event, x.detail, 0 AS rank
  FROM executions x
  JOIN decisions d ON d.id = x.decision_id
  JOIN deployments dep ON dep.id = d.deployment_id
 WHERE dep.name = :deployment
   AND (CAST(:since AS timestamptz) IS NULL OR x.executed_at >= :since)
   AND (CAST(:until AS timestamptz) IS NULL OR x.executed_at < :until)
UNION ALL
SELECT v.planner_decision_id, v.acknowledged_at, 'acknowledged', '', 1  -- acknowledged after applied at one time
  FROM virtual_decisions v
  JOIN deployments dep ON dep.id = v.deployment_id
 WHERE dep.name = :deployment AND v.acknowledged_at IS NOT NULL
   AND (CAST(:since AS timestamptz) IS NULL OR v.acknowledged_at >= :since)
   AND (CAST(:until AS timestamptz) IS NULL OR v.acknowledged_at < :until)
 ORDER BY 2, 5, 1
"""


def _query(session: Session, sql: str, params: dict[str, Any], *extra: Any) -> list[dict[str, Any]]:
    statement = text(sql).bindparams(
        bindparam("since", type_=DateTime(timezone=True)),
        bindparam("until", type_=DateTime(timezone=True)),
        *extra,
    )
    return [dict(row._mapping) for row in session.execute(statement, params)]


def _nested_number(metrics: dict[str, Any], section: str, key: str) -> float | None:
    value = (metrics.get(section) or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def load_report_data(
    session: Session, deployment: str, since: dt.datetime | None = None, until: dt.datetime | None = None
) -> ReportData:
    """Read what `deployment`'s ticks recorded with `since <= scheduled time < until` (either bound optional).

    Raises:
        UnknownDeployment: no deployment of that name was ever recorded.
    """
    known = [row["name"] for row in session.execute(text("SELECT name FROM deployments ORDER BY name")).mappings()]
    if deployment not in known:
        shown = ", ".join(known[:10]) or "none"
        raise UnknownDeployment(f"deployment {deployment!r}: not found in the database (known: {shown})")
    params = {"deployment": deployment, "since": since, "until": until}
    ticks = []
    for row in _query(session, _TICKS_SQL, params):
        scheduled_at = row.pop("scheduled_at")
        ticks.append(TickRow(**row | {"loop": Loop(row["loop"])}, at_s=scheduled_at.timestamp()))
    steps = tuple(
        StepRow(
            tick_id=row["tick_id"],
            loop=Loop(row["loop"]),
            at_s=row["scheduled_at"].timestamp(),
            seq=row["seq"],
            step=row["step"],
            component=row["component"],
            reason=row["reason"],
            value=row["value"],
            detail=row["detail"],
        )
        for row in _query(
            session,
            _STEPS_SQL,
            params | {"routine": tuple(sorted(ROUTINE_STEP_REASONS))},
            bindparam("routine", expanding=True),
        )
    )
    engine_loads = tuple(
        EngineLoadRow(
            at_s=row["scheduled_at"].timestamp(),
            component=row["component"],
            worker_id=row["worker_id"],
            dp_rank=row["dp_rank"],
            # the JSON form of `ForwardPassMetrics` (planner_core.domain): queued and scheduled sections
            queued_prefill_tokens=_nested_number(row["metrics"], "queued", "sum_prefill_tokens"),
            queued_decode_kv_tokens=_nested_number(row["metrics"], "queued", "sum_decode_kv_tokens"),
            inflight_decode_kv_tokens=_nested_number(row["metrics"], "scheduled", "sum_decode_kv_tokens"),
        )
        for row in _query(session, _FPM_SQL, params)
    )
    events = tuple(
        DecisionEvent(
            decision_id=row["decision_id"], at_s=row["at"].timestamp(), event=row["event"], detail=row["detail"]
        )
        for row in _query(session, _EVENTS_SQL, params)
    )
    return ReportData(
        deployment=deployment,
        since_s=since.timestamp() if since else None,
        until_s=until.timestamp() if until else None,
        ticks=tuple(ticks),
        steps=steps,
        engine_loads=engine_loads,
        decision_events=events,
    )


# --- derived series (pure) -------------------------------------------------------------------------------------


def _utc(epoch_s: float) -> dt.datetime:
    """Naive UTC datetime for plotly (plotly.js has no time zones; the axes say UTC)."""
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).replace(tzinfo=None)


def _iso(epoch_s: float | None) -> str:
    return "-" if epoch_s is None else dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def gpu_observations(ticks: Sequence[TickRow]) -> list[tuple[float, int]]:
    """(epoch s, ready GPUs) of every tick that observed the workers, in time order (one time: recording order)."""
    observed = sorted((t.at_s, t.tick_id, t.ready_gpus) for t in ticks if t.ready_gpus is not None)
    return [(at_s, gpus) for at_s, _, gpus in observed]


def cumulative_gpu_hours(ticks: Sequence[TickRow]) -> list[tuple[float, float]]:
    """GPU-hours accumulated between the first and each later tick, as (epoch s, GPU-hours) points.

    `planner_core.domain.cumulative_gpu_hours` over the ticks' worker observations: the ready workers a tick saw
    are taken to run until the next tick (of either loop):
    `sum_i (ready_prefill_i * gpus_per_prefill_engine + ready_decode_i * gpus_per_decode_engine) * (t_{i+1} - t_i)
    / 3600`. Ticks without a worker observation are skipped. The metrics exporter's `gpu_hours` and
    `planner demo`'s summary count the same way.
    """
    return domain_cumulative_gpu_hours(gpu_observations(ticks))


@dataclass(frozen=True, slots=True, kw_only=True)
class ForecastPair:
    """A forecast made at one throughput tick and the window it forecast, as observed by the next tick."""

    at_s: float  # end of the forecast window (the observing tick's scheduled time)
    predicted_num_req: float
    actual_num_req: float
    predicted_isl: float
    actual_isl: float
    predicted_osl: float
    actual_osl: float


def forecast_pairs(ticks: Sequence[TickRow]) -> list[ForecastPair]:
    """Pair each throughput forecast with the observation of the window it was for.

    A tick at t forecasts the window (t, t + interval]; the next throughput tick observes the window ending at its
    own time, which is that window when `next.at_s - next.window_s` is t (within 1 s).
    """
    throughput = [t for t in ticks if t.loop is Loop.THROUGHPUT]
    pairs = []
    for made, seen in zip(throughput, throughput[1:], strict=False):
        if made.predicted_num_req is None or seen.observed_num_req is None or seen.window_s is None:
            continue
        if abs(seen.at_s - seen.window_s - made.at_s) > 1.0:
            continue  # a missed tick: the next observation covers another window
        pairs.append(
            ForecastPair(
                at_s=seen.at_s,
                predicted_num_req=made.predicted_num_req,
                actual_num_req=seen.observed_num_req,
                predicted_isl=made.predicted_isl or 0.0,
                actual_isl=seen.observed_isl or 0.0,
                predicted_osl=made.predicted_osl or 0.0,
                actual_osl=seen.observed_osl or 0.0,
            )
        )
    return pairs


def mape(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Mean absolute percentage error over (forecast, actual) pairs whose actual is not 0; None if there are none."""
    errors = [abs(f - a) / a for f, a in pairs if a != 0]
    return 100.0 * sum(errors) / len(errors) if errors else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasonRun:
    """Consecutive ticks of one loop that recorded the same reason (drawn as one segment)."""

    label: str
    start_s: float
    end_s: float
    num_ticks: int
    detail: str


def reason_runs(points: Sequence[tuple[int, float, str, str]]) -> list[ReasonRun]:
    """Merge (tick index in its loop, time, label, detail) points into runs of consecutive ticks with one label."""
    runs: list[ReasonRun] = []
    last_index: dict[str, int] = {}
    open_run: dict[str, int] = {}  # label -> position in `runs` of its run still open
    for index, at_s, label, detail in sorted(points, key=lambda p: (p[0], p[2])):
        position = open_run.get(label)
        if position is not None and last_index[label] == index - 1:
            run = runs[position]
            runs[position] = dataclasses.replace(run, end_s=at_s, num_ticks=run.num_ticks + 1)
        else:
            open_run[label] = len(runs)
            runs.append(ReasonRun(label=label, start_s=at_s, end_s=at_s, num_ticks=1, detail=detail))
        last_index[label] = index
    return runs


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportSummary:
    """The headline figures at the top of the page."""

    deployment: str
    first_tick_s: float | None
    last_tick_s: float | None
    num_ticks: dict[str, int]
    num_decisions: dict[str, int]  # by status
    num_replica_transitions: int  # ticks whose ready (prefill, decode) differ from the previous tick's
    gpu_hours: float
    ttft_target_ms: float | None
    itl_target_ms: float | None
    request_mape_pct: float | None
    num_forecasts_scored: int
    ttft_windows_within_target: tuple[int, int]  # (windows whose mean TTFT <= target, windows with a mean TTFT)
    itl_windows_within_target: tuple[int, int]


def summarise(data: ReportData) -> ReportSummary:
    ticks = data.ticks
    num_ticks = {loop.value: sum(t.loop is loop for t in ticks) for loop in Loop}
    statuses: dict[str, int] = {}
    for t in ticks:
        if t.decision_status is not None:
            statuses[t.decision_status] = statuses.get(t.decision_status, 0) + 1
    ready = [(t.ready_prefill, t.ready_decode) for t in ticks if t.ready_prefill is not None]
    transitions = sum(a != b for a, b in zip(ready, ready[1:], strict=False))
    gpu_points = cumulative_gpu_hours(ticks)
    pairs = forecast_pairs(ticks)
    latest = ticks[-1] if ticks else None

    def within(values: Iterable[tuple[float | None, float | None]]) -> tuple[int, int]:
        known = [(v, target) for v, target in values if v is not None and target is not None]
        return sum(v <= target for v, target in known), len(known)

    return ReportSummary(
        deployment=data.deployment,
        first_tick_s=ticks[0].at_s if ticks else None,
        last_tick_s=ticks[-1].at_s if ticks else None,
        num_ticks=num_ticks,
        num_decisions=dict(sorted(statuses.items())),
        num_replica_transitions=transitions,
        gpu_hours=gpu_points[-1][1] if gpu_points else 0.0,
        ttft_target_ms=latest.ttft_target_ms if latest else None,
        itl_target_ms=latest.itl_target_ms if latest else None,
        request_mape_pct=mape((p.predicted_num_req, p.actual_num_req) for p in pairs),
        num_forecasts_scored=len(pairs),
        ttft_windows_within_target=within((t.observed_ttft_ms, t.ttft_target_ms) for t in ticks),
        itl_windows_within_target=within((t.observed_itl_ms, t.itl_target_ms) for t in ticks),
    )


# --- figures (pure) --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    """One chart of the page. `missing` says why (part of) it has no data; None when everything was recorded."""

    key: str
    title: str
    figure: Any  # plotly.graph_objects.Figure
    missing: str | None = None


def _figure(title: str, y_title: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        template="plotly_white",
        height=360,
        margin={"l": 60, "r": 20, "t": 50, "b": 90},
        legend={"orientation": "h", "y": -0.32, "font": {"size": 11}},
        yaxis_title=y_title,
        hovermode="closest",
    )
    return fig


def _time_range(fig: Any, data: ReportData) -> None:
    """Give every time chart the report's window, so charts line up (and an empty one still shows the dates)."""
    start = data.since_s if data.since_s is not None else (data.ticks[0].at_s if data.ticks else None)
    end = data.until_s if data.until_s is not None else (data.ticks[-1].at_s if data.ticks else None)
    if start is not None and end is not None and end > start:
        fig.update_xaxes(type="date", range=[_utc(start), _utc(end)])


def _no_data(fig: Any, why: str) -> None:
    """Say on the chart that its data was not recorded, and why."""
    fig.add_annotation(
        text=f"<b>{NO_DATA}</b><br>{html.escape(why)}",
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.85,  # above the middle, where a target line (drawn even without data) usually is
        showarrow=False,
        font={"size": 13, "color": "#8a4b00"},
        bgcolor="rgba(255, 243, 224, 0.9)",
        bordercolor="#8a4b00",
        borderwidth=1,
    )


def _line(fig: Any, xs: Sequence[float], ys: Sequence[float | None], name: str, **kwargs: Any) -> bool:
    """Add a time series (points with a None value are gaps); returns whether it had any value."""
    import plotly.graph_objects as go

    if not any(y is not None for y in ys):
        return False
    kwargs.setdefault("mode", "lines+markers")
    fig.add_trace(go.Scatter(x=[_utc(x) for x in xs], y=list(ys), name=name, **kwargs))
    return True


def _target(fig: Any, ticks: Sequence[TickRow], attribute: str, name: str) -> None:
    _line(
        fig,
        [t.at_s for t in ticks],
        [getattr(t, attribute) for t in ticks],
        name,
        line={"dash": "dash", "color": "#c0392b", "shape": "hv"},
        mode="lines",
    )


def _replicas_chart(data: ReportData) -> Chart:
    fig = _figure("Replica counts", "replicas")
    ticks = [t for t in data.ticks if t.ready_prefill is not None]
    xs = [t.at_s for t in ticks]
    step = {"shape": "hv"}
    has = False
    for attribute, name, colour, dash in (
        ("ready_prefill", "prefill ready", "#1f77b4", "solid"),
        ("ready_decode", "decode ready", "#ff7f0e", "solid"),
        ("expected_prefill", "prefill expected", "#1f77b4", "dot"),
        ("expected_decode", "decode expected", "#ff7f0e", "dot"),
    ):
        line = step | {"color": colour, "dash": dash}
        has |= _line(fig, xs, [getattr(t, attribute) for t in ticks], name, line=line, marker={"size": 3})
    decided = [t for t in data.ticks if t.decision_id is not None]
    for attribute, name, colour in (
        ("target_prefill", "prefill decision", "#1f77b4"),
        ("target_decode", "decode decision", "#ff7f0e"),
    ):
        _line(
            fig,
            [t.at_s for t in decided],
            [getattr(t, attribute) for t in decided],
            name,
            mode="markers",
            marker={"symbol": "diamond-open", "size": 10, "color": colour},
            text=[f"decision {t.decision_id}: {t.decision_status}" for t in decided],
        )
    missing = None if has else "no worker observations in this window"
    if missing:
        _no_data(fig, missing)
    return Chart(key="replicas", title="Replica counts", figure=fig, missing=missing)


def _predicted_at(t: TickRow) -> float:
    """Where a forecast made at tick t is drawn: the end of the window it forecasts."""
    return t.at_s + (t.throughput_interval_s or t.window_s or 0.0)


def _request_rate_chart(data: ReportData) -> Chart:
    fig = _figure("Request rate: observed vs predicted", "requests/s")
    ticks = data.loop_ticks(Loop.THROUGHPUT)
    observed = [t for t in ticks if t.observed_num_req is not None and t.window_s]
    has = _line(fig, [t.at_s for t in observed], [t.observed_num_req / t.window_s for t in observed], "observed")
    predicted = [t for t in ticks if t.predicted_num_req is not None and (t.throughput_interval_s or t.window_s)]
    _line(
        fig,
        [_predicted_at(t) for t in predicted],
        [t.predicted_num_req / (t.throughput_interval_s or t.window_s) for t in predicted],
        "predicted (drawn at the end of the window it forecasts)",
        line={"dash": "dot"},
    )
    missing = None if has else "no traffic observations in this window"
    if missing:
        _no_data(fig, missing)
    return Chart(key="request_rate", title="Request rate", figure=fig, missing=missing)


def _latency_chart(data: ReportData, *, key: str, title: str, value: str, target: str, unit: str, why: str) -> Chart:
    fig = _figure(title, unit)
    ticks = data.loop_ticks(Loop.THROUGHPUT) or list(data.ticks)
    values = [getattr(t, value) for t in ticks] if value else []
    has = bool(values) and _line(fig, [t.at_s for t in ticks], values, "observed mean")
    _target(fig, ticks, target, "SLA target")
    positive = [v for v in [*values, *(getattr(t, target) for t in ticks)] if v is not None and v > 0]
    if has and positive and max(positive) > 100 * min(positive):
        fig.update_yaxes(type="log")  # a backlog's latencies dwarf the target on a linear axis
    missing = None if has else why
    if missing:
        _no_data(fig, missing)
    return Chart(key=key, title=title, figure=fig, missing=missing)


def _engine_load_chart(data: ReportData, *, key: str, title: str, component: Component) -> Chart:
    fig = _figure(title, "tokens")
    rows = [r for r in data.engine_loads if r.component == component.value]
    engines = sorted({(r.worker_id, r.dp_rank) for r in rows})
    has = False
    for worker_id, dp_rank in engines:
        mine = [r for r in rows if (r.worker_id, r.dp_rank) == (worker_id, dp_rank)]
        xs = [r.at_s for r in mine]
        if component is Component.PREFILL:
            has |= _line(fig, xs, [r.queued_prefill_tokens for r in mine], f"{worker_id}/{dp_rank} queued prefill")
        else:
            has |= _line(fig, xs, [r.queued_decode_kv_tokens for r in mine], f"{worker_id}/{dp_rank} queued KV")
            has |= _line(fig, xs, [r.inflight_decode_kv_tokens for r in mine], f"{worker_id}/{dp_rank} inflight KV")
    missing = None if has else "no forward-pass metrics (per-engine queues) were recorded in this window"
    if missing:
        _no_data(fig, missing)
    return Chart(key=key, title=title, figure=fig, missing=missing)


def _capacity_chart(data: ReportData) -> Chart:
    """One engine's request rate under the SLA: tokens/s per engine over the forecast ISL (prefill) or OSL (decode)."""
    fig = _figure("Engine capacity (requests/s per engine)", "requests/s")
    ticks = data.loop_ticks(Loop.THROUGHPUT)

    def rate(tokens_per_s: float | None, length: float | None) -> float | None:
        return tokens_per_s / length if tokens_per_s is not None and length else None

    xs = [t.at_s for t in ticks]
    has = _line(fig, xs, [rate(t.prefill_engine_tokens_per_s, t.predicted_isl) for t in ticks], "prefill engine")
    has |= _line(fig, xs, [rate(t.decode_engine_tokens_per_s, t.predicted_osl) for t in ticks], "decode engine")
    missing = None if has else "no capacity steps in this window (no profile loaded, or no sized throughput tick)"
    if missing:
        _no_data(fig, missing)
    return Chart(key="engine_capacity", title="Engine capacity", figure=fig, missing=missing)


def _lengths_chart(data: ReportData) -> Chart:
    fig = _figure("Sequence lengths: observed vs predicted", "tokens (mean)")
    ticks = data.loop_ticks(Loop.THROUGHPUT)
    xs = [t.at_s for t in ticks]
    has = _line(fig, xs, [t.observed_isl for t in ticks], "ISL observed", line={"color": "#1f77b4"})
    has |= _line(fig, xs, [t.observed_osl for t in ticks], "OSL observed", line={"color": "#ff7f0e"})
    predicted = [t for t in ticks if t.predicted_num_req is not None]
    px = [_predicted_at(t) for t in predicted]
    _line(fig, px, [t.predicted_isl for t in predicted], "ISL predicted", line={"color": "#1f77b4", "dash": "dot"})
    _line(fig, px, [t.predicted_osl for t in predicted], "OSL predicted", line={"color": "#ff7f0e", "dash": "dot"})
    missing = None if has else "no traffic observations in this window"
    if missing:
        _no_data(fig, missing)
    return Chart(key="sequence_lengths", title="Sequence lengths", figure=fig, missing=missing)


def _runs_trace(fig: Any, runs: Sequence[ReasonRun], name: str, colour: str) -> None:
    """Draw runs as horizontal segments on a categorical y-axis (one trace, segments split by gaps)."""
    import plotly.graph_objects as go

    xs: list[Any] = []
    ys: list[Any] = []
    texts: list[Any] = []
    for run in runs:
        hover = f"{run.label}: {run.num_ticks} tick(s) {_iso(run.start_s)} .. {_iso(run.end_s)}"
        if run.detail:
            hover += f"<br>{html.escape(run.detail[:200])}"
        xs += [_utc(run.start_s), _utc(run.end_s), None]
        ys += [run.label, run.label, None]
        texts += [hover, hover, None]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            name=name,
            mode="lines+markers",
            line={"width": 6, "color": colour},
            marker={"size": 7, "color": colour},
            hovertext=texts,
            hoverinfo="text",
            connectgaps=False,
        )
    )


def _ordered(labels: Iterable[str], order: Sequence[str]) -> list[str]:
    seen = set(labels)
    return [r for r in order if r in seen] + sorted(seen - set(order))


def _decisions_chart(data: ReportData, loop: Loop) -> Chart:
    order = THROUGHPUT_DECISION_REASONS if loop is Loop.THROUGHPUT else LOAD_DECISION_REASONS
    title = f"{loop.value.capitalize()} scaling decisions"
    fig = _figure(title, "decision reason")
    ticks = data.loop_ticks(loop)
    runs = reason_runs([(i, t.at_s, t.reason, "") for i, t in enumerate(ticks)])
    missing = None
    if runs:
        _runs_trace(fig, runs, f"{loop.value} loop", "#2c7fb8" if loop is Loop.THROUGHPUT else "#7b3294")
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=_ordered((r.label for r in runs), order))
    else:
        missing = f"no {loop.value} ticks in this window"
        _no_data(fig, missing)
    return Chart(key=f"{loop.value}_decisions", title=title, figure=fig, missing=missing)


def _gpu_hours_chart(data: ReportData) -> Chart:
    fig = _figure("Cumulative GPU hours", "GPU-hours")
    points = cumulative_gpu_hours(data.ticks)
    has = _line(fig, [p[0] for p in points], [p[1] for p in points], "ready workers x GPUs per engine")
    missing = None if has else "no worker observations in this window"
    if missing:
        _no_data(fig, missing)
    return Chart(key="gpu_hours", title="Cumulative GPU hours", figure=fig, missing=missing)


def _forecast_chart(data: ReportData) -> Chart:
    import plotly.graph_objects as go

    pairs = forecast_pairs(data.ticks)
    error = mape((p.predicted_num_req, p.actual_num_req) for p in pairs)
    title = "Forecast vs actual (requests per window)" + (f", MAPE {error:.1f}%" if error is not None else "")
    fig = _figure(title, "forecast requests")
    fig.update_layout(xaxis_title="actual requests")
    missing = None
    if pairs:
        top = max(max(p.predicted_num_req, p.actual_num_req) for p in pairs) * 1.05 or 1.0
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top], name="forecast = actual", mode="lines", line={"dash": "dash"}))
        fig.add_trace(
            go.Scatter(
                x=[p.actual_num_req for p in pairs],
                y=[p.predicted_num_req for p in pairs],
                name="window",
                mode="markers",
                hovertext=[
                    f"window ending {_iso(p.at_s)}<br>requests {p.predicted_num_req:.0f} forecast / "
                    f"{p.actual_num_req:.0f} actual<br>ISL {p.predicted_isl:.0f} / {p.actual_isl:.0f}, "
                    f"OSL {p.predicted_osl:.0f} / {p.actual_osl:.0f}"
                    for p in pairs
                ],
                hoverinfo="text",
            )
        )
    else:
        missing = "no forecast whose window was observed by the next throughput tick in this window"
        _no_data(fig, missing)
    return Chart(key="forecast_vs_actual", title="Forecast vs actual", figure=fig, missing=missing)


def _reason_timeline_chart(data: ReportData) -> Chart:
    """Every non-routine step (clamps, fallbacks, holds) and what happened to each decision, over time."""
    fig = _figure("Timeline of decision reasons", "")
    colours = {Loop.THROUGHPUT: "#2c7fb8", Loop.LOAD: "#7b3294"}
    labels: list[str] = []
    for loop in Loop:
        index = {t.tick_id: i for i, t in enumerate(data.loop_ticks(loop))}
        points = [
            (
                index[s.tick_id],
                s.at_s,
                f"{s.step}: {s.reason}" + (f" ({s.component})" if s.component else ""),
                s.detail,
            )
            for s in data.steps
            if s.loop is loop and s.tick_id in index
        ]
        runs = reason_runs(points)
        if runs:
            _runs_trace(fig, runs, f"{loop.value} steps", colours[loop])
            labels += [r.label for r in runs]
    if data.decision_events:
        import plotly.graph_objects as go

        events = data.decision_events
        fig.add_trace(
            go.Scatter(
                x=[_utc(e.at_s) for e in events],
                y=[f"decision {e.event}" for e in events],
                name="decision lifecycle",
                mode="markers",
                marker={"symbol": "triangle-right", "size": 9, "color": "#1a9850"},
                hovertext=[f"decision {e.decision_id}: {e.event} {html.escape(e.detail[:200])}" for e in events],
                hoverinfo="text",
            )
        )
        labels += [f"decision {e.event}" for e in events]
    missing = None
    if labels:
        fig.update_yaxes(type="category", categoryorder="array", categoryarray=sorted(set(labels)), automargin=True)
        fig.update_layout(height=max(340, 120 + 22 * len(set(labels))))
    else:
        missing = "no explanation steps or decision events in this window"
        _no_data(fig, missing)
    return Chart(key="reason_timeline", title="Timeline of decision reasons", figure=fig, missing=missing)


def build_charts(data: ReportData) -> list[Chart]:
    """Dynamo's 13 diagnostics charts in its order, then forecast vs actual and the reason timeline."""
    estimate_why = "per-engine {} estimates (forward-pass metric models) are not recorded yet"
    charts = [
        _replicas_chart(data),
        _request_rate_chart(data),
        _latency_chart(
            data,
            key="observed_ttft",
            title="Observed TTFT vs SLA",
            value="observed_ttft_ms",
            target="ttft_target_ms",
            unit="ms",
            why="the traffic source reported no TTFT in this window",
        ),
        _latency_chart(
            data,
            key="observed_itl",
            title="Observed ITL vs SLA",
            value="observed_itl_ms",
            target="itl_target_ms",
            unit="ms",
            why="the traffic source reported no ITL in this window",
        ),
        _latency_chart(
            data,
            key="estimated_ttft",
            title="Estimated TTFT vs SLA",
            value="",
            target="ttft_target_ms",
            unit="ms",
            why=estimate_why.format("TTFT"),
        ),
        _latency_chart(
            data,
            key="estimated_itl",
            title="Estimated ITL vs SLA",
            value="",
            target="itl_target_ms",
            unit="ms",
            why=estimate_why.format("ITL"),
        ),
        _engine_load_chart(
            data, key="prefill_load", title="Prefill engine load (queued prefill tokens)", component=Component.PREFILL
        ),
        _engine_load_chart(
            data, key="decode_load", title="Decode engine load (queued + inflight KV)", component=Component.DECODE
        ),
        _capacity_chart(data),
        _lengths_chart(data),
        _decisions_chart(data, Loop.LOAD),
        _decisions_chart(data, Loop.THROUGHPUT),
        _gpu_hours_chart(data),
        _forecast_chart(data),
        _reason_timeline_chart(data),
    ]
    for chart in charts:
        if chart.key != "forecast_vs_actual":  # the one chart whose x-axis is not time
            _time_range(chart.figure, data)
    return charts


# --- the page (pure) -------------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
.meta { color: #555; font-size: 13px; margin-bottom: 12px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f6f8; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
.grid .wide { grid-column: 1 / -1; }
.chart { border: 1px solid #e3e3e3; border-radius: 4px; }
"""


def _fraction(pair: tuple[int, int]) -> str:
    within, total = pair
    return "no data" if total == 0 else f"{within}/{total} ({100.0 * within / total:.0f}%)"


def _summary_table(summary: ReportSummary) -> str:
    rows = [
        ("ticks recorded", ", ".join(f"{n} {loop}" for loop, n in summary.num_ticks.items())),
        ("first / last tick", f"{_iso(summary.first_tick_s)} / {_iso(summary.last_tick_s)}"),
        ("decisions", ", ".join(f"{n} {status}" for status, n in summary.num_decisions.items()) or "none"),
        ("replica transitions", str(summary.num_replica_transitions)),
        ("GPU-hours (ready workers between ticks)", f"{summary.gpu_hours:.2f}"),
        (
            "SLA targets",
            f"TTFT {summary.ttft_target_ms:g} ms, ITL {summary.itl_target_ms:g} ms"
            if summary.ttft_target_ms is not None and summary.itl_target_ms is not None
            else "-",
        ),
        ("windows with mean TTFT within target", _fraction(summary.ttft_windows_within_target)),
        ("windows with mean ITL within target", _fraction(summary.itl_windows_within_target)),
        (
            "request forecast MAPE",
            f"{summary.request_mape_pct:.1f}% over {summary.num_forecasts_scored} windows"
            if summary.request_mape_pct is not None
            else f"no data ({summary.num_forecasts_scored} windows scored)",
        ),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _decisions_table(data: ReportData) -> str:
    decided = [t for t in data.ticks if t.decision_id is not None][-MAX_DECISION_ROWS:]
    if not decided:
        return "<p>No decisions in this window.</p>"
    outcome: dict[int, str] = {}
    for e in data.decision_events:
        outcome[e.decision_id] = e.event  # events are in time order: the last one wins
    header = "<tr><th>decided at</th><th>before</th><th>target</th><th>reason</th><th>why</th><th>status</th></tr>"

    def pair(a: int | None, b: int | None) -> str:
        return f"{'-' if a is None else a}P / {'-' if b is None else b}D"

    rows = "".join(
        "<tr>"
        f"<td>{_iso(t.at_s)}</td><td>{pair(t.ready_prefill, t.ready_decode)}</td>"
        f"<td>{pair(t.target_prefill, t.target_decode)}</td><td>{html.escape(t.reason)}</td>"
        f"<td>{html.escape(t.why or '')}</td>"  # the numbers behind it, as `decision_history.why` renders them
        f"<td>{html.escape(t.decision_status or '-')}"
        + (f" (last event: {html.escape(outcome[t.decision_id])})" if t.decision_id in outcome else "")
        + "</td></tr>"
        for t in decided
    )
    return f"<table>{header}{rows}</table>"


def plotly_js_name() -> str:
    """The file name of the plotly.js copy written beside reports: versioned, so a copy never changes once written
    and reports made with another plotly version keep theirs."""
    import plotly

    return f"plotly-{plotly.__version__}.min.js"


def render_html(
    data: ReportData,
    *,
    generated_at: dt.datetime,
    charts: Sequence[Chart] | None = None,
    plotly_src: str | None = None,
) -> str:
    """The whole page: header, summary, charts, decisions table.

    plotly.js (about 4.8 MB, nearly all of a page) is inlined once when `plotly_src` is None: a self-contained
    page. Otherwise the page loads it from `plotly_src`, a path relative to the page (`generate_report` writes
    the copy beside it, once per folder), so a report is small and still opens offline. `charts` defaults to
    `build_charts(data)`.
    """
    summary = summarise(data)
    charts = build_charts(data) if charts is None else charts
    wide = {"reason_timeline"}
    parts = []
    for number, chart in enumerate(charts):
        div = chart.figure.to_html(
            full_html=False,
            # inlined: the first chart carries plotly.js for the whole page; else the page's <head> loads it
            include_plotlyjs=plotly_src is None and number == 0,
            div_id=f"chart-{chart.key}",
            config={"displaylogo": False, "responsive": True},
        )
        css = "chart wide" if chart.key in wide else "chart"
        parts.append(
            f'<div class="{css}" data-chart="{chart.key}" data-missing="{int(bool(chart.missing))}">{div}</div>'
        )
    window = f"{_iso(data.since_s)} .. {_iso(data.until_s)}" if data.since_s or data.until_s else "all recorded ticks"
    title = f"Planner report: {data.deployment}"
    script = "" if plotly_src is None else f'<script src="{html.escape(plotly_src)}" charset="utf-8"></script>'
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>{script}</head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<div class='meta'>window {html.escape(window)}; generated {html.escape(_iso(generated_at.timestamp()))}; "
        f"{len(charts)} charts</div>"
        f"{_summary_table(summary)}"
        f"<div class='grid'>{''.join(parts)}</div>"
        f"<h2>Decisions</h2>{_decisions_table(data)}"
        "</body></html>\n"
    )


# --- files (the filesystem edge) ------------------------------------------------------------------------------


def _atomic_write(path: Path, payload: bytes) -> None:
    """Write next to `path` and rename over it: readers see the old file or the new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; a report is meant to be read (and served)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, Loop):
        return value.value
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def tick_log(data: ReportData) -> bytes:
    """The tick rows as gzipped JSON lines (one per tick), next to the page for offline analysis."""
    lines = []
    for row in data.ticks:
        record = {
            k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dataclasses.asdict(row).items()
        }
        lines.append(json.dumps(record, default=_json_default, sort_keys=True))
    return gzip.compress(("\n".join(lines) + "\n").encode() if lines else b"", mtime=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFile:
    """A written report."""

    path: Path
    log_path: Path | None
    summary: ReportSummary
    num_charts: int


def log_path_for(path: Path) -> Path:
    """`<report>.log.jsonl.gz` next to `<report>.html`."""
    return path.with_name(path.name.removesuffix(".html") + ".log.jsonl.gz")


def report_file_slug(deployment: str) -> str:
    """A managed deployment's name as it goes into a file name: letters, digits, `.`, `_` and `-`, anything else
    (slashes, spaces) one `-`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", deployment).strip(".-") or "deployment"


def periodic_report_path(output_dir: Path, until: dt.datetime, filename: str | None = None, *, deployment: str) -> Path:
    """Where a periodic report of `deployment` goes: `filename` if configured (replaced each period; a
    `{deployment}` in it becomes the deployment's name), else
    `planner_report_<deployment>_<YYYYmmdd_HHMMSS>_<NNN>.html` stamped with the window's end (UTC), NNN the first
    free number. The name (`report_file_slug`) keeps deployments sharing a folder from overwriting each other."""
    slug = report_file_slug(deployment)
    if filename:
        return output_dir / filename.replace("{deployment}", slug)
    stamp = until.astimezone(dt.UTC).strftime("%Y%m%d_%H%M%S")
    number = 0
    while (output_dir / f"planner_report_{slug}_{stamp}_{number:03d}.html").exists():
        number += 1
    return output_dir / f"planner_report_{slug}_{stamp}_{number:03d}.html"


def write_plotly_js(folder: Path) -> Path:
    """plotly.js beside the reports of `folder` (`plotly_js_name()`), written once: a copy already there is kept."""
    from plotly.offline import get_plotlyjs

    path = folder / plotly_js_name()
    if not path.is_file():
        _atomic_write(path, get_plotlyjs().encode())
    return path


def generate_report(
    session: Session,
    deployment: str,
    out_path: Path,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    generated_at: dt.datetime,
    write_log: bool = False,
    self_contained: bool = False,
) -> ReportFile:
    """Load `deployment`'s ticks in [since, until), write the page to `out_path` (and its tick log if asked).

    The page loads plotly.js from the copy beside it (`write_plotly_js`, written once per folder); with
    `self_contained` it carries plotly.js itself instead (one file to move around, about 4.8 MB more).
    """
    data = load_report_data(session, deployment, since, until)
    charts = build_charts(data)
    plotly_src = None
    if not self_contained:
        plotly_src = write_plotly_js(out_path.parent).name
    page = render_html(data, generated_at=generated_at, charts=charts, plotly_src=plotly_src)
    log_path = log_path_for(out_path) if write_log else None
    if log_path is not None:
        _atomic_write(log_path, tick_log(data))
    _atomic_write(out_path, page.encode())
    return ReportFile(path=out_path, log_path=log_path, summary=summarise(data), num_charts=len(charts))
