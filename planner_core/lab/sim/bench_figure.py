"""The benchmark's table rows and its figure (sizes, load and attainment per policy over the trace)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner_core.lab.sim.scoring import PolicyRun
from planner_core.traces import RequestTrace, bucket_windows

# One colour per policy on every panel (plotly's qualitative palette, cycled); the load is drawn in grey.
POLICY_COLOURS = (
    "#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52",
)  # fmt: skip
TARGET_COLOUR = "#c0392b"


def bench_table_rows(runs: Sequence[PolicyRun]) -> list[list[str]]:
    """The results table of the page, one row per policy: policy, SLA ok, TTFT ok, ITL ok, GPU-h, x oracle,
    events (as `planner bench` prints them)."""
    rows = []
    for run in runs:
        r = run.row
        ratio = "-" if r.gpu_hours_vs_oracle is None else f"{r.gpu_hours_vs_oracle:.2f}"
        rows.append(
            [
                r.policy,
                f"{r.sla_attainment:.1%}",
                f"{r.ttft_attainment:.1%}",
                f"{r.itl_attainment:.1%}",
                f"{r.gpu_hours:.2f}",
                ratio,
                str(r.scaling_events),
            ]
        )
    return rows


BENCH_TABLE_HEADER = ("policy", "SLA ok", "TTFT ok", "ITL ok", "GPU-h", "x oracle", "events")


def bench_figure(
    runs: Sequence[PolicyRun],
    trace: RequestTrace,
    *,
    window_s: float = 60.0,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
):
    """A Plotly figure: the results table, then load, ready GPUs and per-window mean TTFT / ITL over time.

    Each policy has one colour and one legend entry for all its lines (a legend group: clicking it hides the
    policy on every panel); `ttft_ms` / `itl_ms` draw the SLA targets on the latency panels.
    """
    from plotly.subplots import make_subplots  # plotting is only needed for the HTML page

    figure = make_subplots(
        rows=5,
        cols=1,
        shared_xaxes=True,  # the time panels share one axis (the table has none)
        vertical_spacing=0.05,
        row_heights=[0.06 + 0.03 * len(runs), 0.2, 0.2, 0.2, 0.2],
        specs=[[{"type": "table"}], [{}], [{}], [{}], [{}]],
        subplot_titles=(
            "results",
            "requests/s",
            "ready GPUs (prefill + decode workers)",
            "mean TTFT (ms)",
            "mean ITL (ms)",
        ),
    )
    figure.add_table(
        header={"values": list(BENCH_TABLE_HEADER), "align": "left", "fill_color": "#f4f6f8"},
        cells={"values": [list(column) for column in zip(*bench_table_rows(runs), strict=True)] if runs else [],
               "align": "left"},
        row=1,
        col=1,
    )  # fmt: skip
    windows = bucket_windows(trace, window_s)
    starts_min = [i * window_s / 60.0 for i in range(len(windows))]
    figure.add_scatter(
        x=starts_min, y=[w.num_req / window_s for w in windows], name="load", line={"color": "#7f7f7f"}, row=2, col=1
    )
    edges = np.arange(len(windows) + 1) * window_s
    window_of = np.clip(np.searchsorted(edges, trace.arrival_s, side="right") - 1, 0, max(0, len(windows) - 1))
    for number, run in enumerate(runs):
        colour = POLICY_COLOURS[number % len(POLICY_COLOURS)]
        style = {"legendgroup": run.row.policy, "line": {"color": colour}}
        timeline = run.result.worker_timeline
        times = [t / 60.0 for t, _, _ in timeline] + [trace.duration_s / 60.0]
        workers = [p + d for _, p, d in timeline] + [timeline[-1][1] + timeline[-1][2]]
        figure.add_scatter(x=times, y=workers, name=run.row.policy, line_shape="hv", row=3, col=1, **style)
        for row, values in ((4, run.result.ttft_s * 1000.0), (5, run.result.itl_s * 1000.0)):
            sums = np.bincount(window_of, weights=np.nan_to_num(values), minlength=len(windows))
            counts = np.bincount(window_of, weights=np.isfinite(values), minlength=len(windows))
            with np.errstate(invalid="ignore", divide="ignore"):
                means = np.where(counts > 0, sums / counts, np.nan)
            figure.add_scatter(x=starts_min, y=means, name=run.row.policy, showlegend=False, row=row, col=1, **style)
    end_min = max(trace.duration_s / 60.0, starts_min[-1] if starts_min else 0.0)
    for row, target, label in ((4, ttft_ms, "TTFT"), (5, itl_ms, "ITL")):
        if target is None:
            continue
        # a line trace, not a shape: it has a legend entry and a hover value like the policies' lines
        figure.add_scatter(
            x=[0.0, end_min], y=[target, target], name=f"{label} target {target:g} ms", mode="lines",
            line={"color": TARGET_COLOUR, "dash": "dash"}, row=row, col=1,
        )  # fmt: skip
    figure.update_xaxes(title_text="minutes into the trace", row=5, col=1)
    figure.update_layout(height=1300 + 25 * len(runs), title=f"planner bench: {trace.source}")
    return figure
