"""The report's charts (pure): Dynamo's 13 diagnostics charts plus forecast against actual, the closed loop's learned
engine speeds, GPU-hours and the reason timeline (`build_charts`). A chart whose data is not recorded is drawn with
what exists and a note."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from planner_core.domain import Component, Loop, StepName
from planner_core.runtime.metrics import LOAD_DECISION_REASONS, THROUGHPUT_DECISION_REASONS
from planner_core.runtime.report.data import NO_DATA, ReportData, StepRow, TickRow
from planner_core.runtime.report.series import (
    ReasonRun,
    _iso,
    _utc,
    cumulative_gpu_hours,
    forecast_pairs,
    mape,
    reason_runs,
)


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


def _step_values_trace(steps: list[StepRow], name: str) -> Any:
    """A step line of the steps' values over time, each step's reason and detail in its hover text."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[_utc(s.at_s) for s in steps],
        y=[s.value for s in steps],
        name=name,
        mode="lines+markers",
        line={"shape": "hv"},
        hovertext=[f"{_iso(s.at_s)}<br>{s.reason}<br>{html.escape(s.detail)}" for s in steps],
        hoverinfo="text",
    )


def _learned_speed_chart(data: ReportData) -> Chart:
    """The closed loop: each pool's learned engine speed (x the perf model's) after each throughput tick, with the
    window's measure and latency in the hover text (`capacity_feedback` steps)."""

    title = "Closed loop: learned engine speed (x the perf model)"
    fig = _figure(title, "speed")
    has = False
    for component in (Component.PREFILL, Component.DECODE):
        steps = [
            s for s in data.steps
            if s.step == StepName.CAPACITY_FEEDBACK.value and s.component == component.value and s.value is not None
        ]  # fmt: skip
        if not steps:
            continue
        has = True
        fig.add_trace(_step_values_trace(steps, f"{component.value} speed"))
    missing = None
    if has:
        fig.add_hline(y=1.0, line={"dash": "dash", "color": "#7f8c8d"}, annotation_text="the perf model")
    else:
        missing = "no closed-loop step in this window (throughput_capacity_feedback off, or no throughput tick)"
        _no_data(fig, missing)
    return Chart(key="learned_speed", title=title, figure=fig, missing=missing)


def _error_budget_chart(data: ReportData) -> Chart:
    """The SLA error budget: the posture after each throughput tick (0: the configured margins, 1: the lean ones),
    with the window's misses, the period's share within the targets and the burn rates in the hover text
    (`error_budget` steps)."""

    title = "SLA error budget: margins' posture (0 configured, 1 lean)"
    fig = _figure(title, "posture")
    steps = [s for s in data.steps if s.step == StepName.ERROR_BUDGET.value and s.value is not None]
    missing = None
    if steps:
        fig.add_trace(_step_values_trace(steps, "posture"))
    else:
        missing = "no error-budget step in this window (throughput_error_budget off, or no throughput tick)"
        _no_data(fig, missing)
    return Chart(key="error_budget", title=title, figure=fig, missing=missing)


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
    """Dynamo's 13 diagnostics charts in its order, then forecast vs actual, the closed loop's learned engine speeds,
    the SLA error budget's posture and the reason timeline."""
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
        _learned_speed_chart(data),
        _error_budget_chart(data),
        _reason_timeline_chart(data),
    ]
    for chart in charts:
        if chart.key != "forecast_vs_actual":  # the one chart whose x-axis is not time
            _time_range(chart.figure, data)
    return charts
