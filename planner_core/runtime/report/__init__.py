"""Diagnostics reports: one Plotly HTML page per period (or on demand) built from Postgres.

The page has Dynamo's 13 diagnostics charts plus "forecast vs actual" and a timeline of decision reasons, with a
header of headline figures and a table of the decisions. Three layers:

- `load_report_data(session, ...)` (`load`) reads the recorded ticks of one deployment over a time window (the only
  database code; the tick rows come from the `tick_summary` view, which the metrics exporter reads too);
- `build_charts(data)` (`charts`), `summarise(data)` (`series`) and `render_html(data, generated_at)` (`page`) are
  pure: the same data (`data`) give the same page (no clock, deterministic element ids);
- `generate_report(...)` (`files`) ties them together and writes the page (and an optional JSONL.gz log of the tick
  rows) atomically: a reader never sees a half-written file. The page loads plotly.js from a copy written once beside
  it (`write_plotly_js`), so a report is a few hundred kB instead of about 5 MB and still opens offline.

Charts whose data the planner does not record yet (per-engine TTFT/ITL estimates; engine queues while no
forward-pass metrics are stored) are still drawn, with what exists (the SLA target) and a "no data recorded" note,
never with invented values.
"""

from planner_core.runtime.report.charts import Chart, build_charts
from planner_core.runtime.report.data import (
    MAX_DECISION_ROWS,
    NO_DATA,
    ROUTINE_STEP_REASONS,
    DecisionEvent,
    EngineLoadRow,
    ReportData,
    StepRow,
    TickRow,
    UnknownDeployment,
)
from planner_core.runtime.report.files import (
    ReportFile,
    generate_report,
    log_path_for,
    periodic_report_path,
    report_file_slug,
    tick_log,
    write_plotly_js,
)
from planner_core.runtime.report.load import load_report_data
from planner_core.runtime.report.page import plotly_js_name, render_html
from planner_core.runtime.report.series import (
    ForecastPair,
    ReasonRun,
    ReportSummary,
    cumulative_gpu_hours,
    forecast_pairs,
    gpu_observations,
    mape,
    reason_runs,
    summarise,
)

__all__ = [
    "Chart",
    "DecisionEvent",
    "EngineLoadRow",
    "ForecastPair",
    "MAX_DECISION_ROWS",
    "NO_DATA",
    "ROUTINE_STEP_REASONS",
    "ReasonRun",
    "ReportData",
    "ReportFile",
    "ReportSummary",
    "StepRow",
    "TickRow",
    "UnknownDeployment",
    "build_charts",
    "cumulative_gpu_hours",
    "forecast_pairs",
    "generate_report",
    "gpu_observations",
    "load_report_data",
    "log_path_for",
    "mape",
    "periodic_report_path",
    "plotly_js_name",
    "reason_runs",
    "render_html",
    "report_file_slug",
    "summarise",
    "tick_log",
    "write_plotly_js",
]
