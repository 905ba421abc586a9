"""The start-up horizon knob's frontier: SLA attainment against GPU-hours for each bench row (`planner bench
--horizon-quantiles ... --html`).

Every policy of the run is one point; the recommended policy's runs at the knob's settings (`planner@qVALUE`,
`planner_core.lab.sim.bench.horizon_policy_name`) are joined by a line in the order of the knob, so the page shows
what each step of `throughput_horizon_quantile` buys and costs, and where the line crosses the 99 % mark.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from planner_core.lab.sim.bench import PolicyRun

KNOB_NAME = re.compile(r"^planner@q(?P<quantile>[0-9.eE+-]+)$")
TARGET_ATTAINMENT = 0.99


def knob_points(runs: Sequence[PolicyRun]) -> list[tuple[float, float, float]]:
    """(quantile, GPU-hours, SLA attainment) of the runs at the knob's settings, by quantile."""
    points = []
    for run in runs:
        match = KNOB_NAME.match(run.row.policy)
        if match is not None:
            points.append((float(match["quantile"]), run.row.gpu_hours, run.row.sla_attainment))
    return sorted(points)


def frontier_figure(runs: Sequence[PolicyRun], *, title: str):  # noqa: ANN201 - plotly Figure (lazy import)
    """A Plotly figure: attainment (%) against GPU-hours, one marker per policy, the knob's runs as one line."""
    import plotly.graph_objects as go  # plotting is only needed for the HTML page

    figure = go.Figure()
    others = [run for run in runs if KNOB_NAME.match(run.row.policy) is None]
    figure.add_scatter(
        x=[run.row.gpu_hours for run in others],
        y=[100.0 * run.row.sla_attainment for run in others],
        text=[run.row.policy for run in others],
        mode="markers+text",
        textposition="top center",
        name="policies",
    )
    points = knob_points(runs)
    if points:
        figure.add_scatter(
            x=[gpu_hours for _, gpu_hours, _ in points],
            y=[100.0 * attainment for _, _, attainment in points],
            text=[f"q{quantile:g}" for quantile, _, _ in points],
            mode="lines+markers+text",
            textposition="bottom right",
            name="planner at throughput_horizon_quantile q",
        )
    figure.add_hline(y=100.0 * TARGET_ATTAINMENT, line_dash="dash", annotation_text="99 %")
    figure.update_layout(
        title=title, xaxis_title="GPU-hours", yaxis_title="requests within both targets (%)", height=600
    )
    return figure
