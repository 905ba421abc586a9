"""The report page (pure): header, summary table, charts and decisions table in one HTML page (`render_html`);
the same data give the same page (no clock, deterministic element ids)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence

from planner_core.runtime.report.charts import Chart, build_charts
from planner_core.runtime.report.data import MAX_DECISION_ROWS, ReportData
from planner_core.runtime.report.series import ReportSummary, _iso, summarise

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
