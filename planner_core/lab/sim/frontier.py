"""The start-up horizon knob's frontier and the start-up goal: SLA attainment against GPU-hours for each bench row
(`planner bench --horizon-quantiles ... --html`, and the records the docs render).

Every policy of the run is one point; the recommended policy's runs at the knob's settings (`planner@qVALUE`,
`planner_core.lab.sim.bench.horizon_policy_name`) are joined by a line in the order of the knob, so the page shows
what each step of `throughput_horizon_quantile` buys and costs, and where the line crosses the 99 % mark.

Attainment here is counted over the attainable requests (those that meet both targets alone on an idle cluster,
`BenchRow.attainable`): the goal a start-up row is held to is a share of what any size could serve. The share can
pass 100 % where a prefix cache lets a request meet a target it could not meet computing its whole prompt (the
idle-cluster check computes every prompt in full).

The goal (`startup_goal`, the project's goal for every benchmark): the recommended policy serves at least
`TARGET_ATTAINMENT` of the attainable requests within both targets, or what `oracle-seen` serves where that is
lower (no policy without foresight does better on bursts larger than any before them), at no more than
`MAX_VS_ORACLE` times `oracle-ahead`'s GPU-hours, and no comparison policy (the static sizes, `fixed:`, the
Dynamo-style presets) is both cheaper and better. A run without `oracle-ahead` is held to the instant `oracle`'s
GPU-hours, and a run without `oracle-seen` to `TARGET_ATTAINMENT`. The oracles (`oracle`, instant,
`oracle-ahead`, which knows the future but pays the start-up, `oracle-seen`, the same never above the sizes
already needed, and `oracle-peak`, the same holding the largest burst's engines until it comes) and the hindsight
references (`static-best`, the cheapest fixed size meeting the target over the whole run, and `oracle-budget`, the
fewest GPU-hours over per-window sizes doing so: `HINDSIGHT`) are references, not competitors: they know the trace.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner_core.lab.sim.bench import PolicyRun

KNOB_NAME = re.compile(r"^planner@q(?P<quantile>[0-9.eE+-]+)$")
TARGET_ATTAINMENT = 0.99  # of the attainable requests
MAX_VS_ORACLE = 1.15  # GPU-hours over the oracle's
SHIPPED_POLICY = "planner"
# the foresight references, with what each one is in a report
FORESIGHT = {
    "oracle-ahead": "the future known, the start-up paid",
    "oracle-seen": "the same, never above the sizes already needed",
    "oracle-peak": "the same, ready for the largest burst from the start until it comes",
}
# the hindsight references (`planner_core.lab.sim.references`), asked for by name: what meeting the target over the
# whole run costs, with one fixed size and with per-window sizes. The oracle's 99 % in every window is not a lower
# bound on the whole run's GPU-hours: a fixed size, or misses spent where they are cheapest, can spend less.
HINDSIGHT = {
    "static-best": "the cheapest fixed size meeting the target over the whole run",
    "oracle-budget": "the fewest GPU-hours over per-window sizes meeting the target over the whole run",
}
REFERENCES = ("oracle", *FORESIGHT, *HINDSIGHT)  # know the trace: never a cheaper and better competitor
TARGET_TEXT = f"{100.0 * TARGET_ATTAINMENT:g} %"
GOAL_TEXT = (
    f"the recommended policy ({SHIPPED_POLICY}) serves >= {TARGET_TEXT} of the attainable requests within both "
    f"targets (or oracle-seen's share, where lower) at <= {MAX_VS_ORACLE:g}x oracle-ahead's GPU-hours (the "
    "oracle's, without oracle-ahead), and no comparison policy is both cheaper and better"
)


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """One policy of a bench run: its GPU-hours and the share of the attainable requests it served in both targets."""

    policy: str
    gpu_hours: float
    of_attainable: float


@dataclass(frozen=True, slots=True)
class KnobCrossing:
    """Where the knob's line first reaches the target: between two settings (the same one twice when the lowest
    setting already reaches it), at the GPU-hours interpolated linearly along the line."""

    quantile_below: float
    quantile_at: float
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class StartupGoal:
    """The start-up goal on one bench run (module docstring). `met` is None when the run has no oracle."""

    shipped: FrontierPoint | None
    vs_oracle: float | None
    cheaper_and_better: tuple[str, ...]
    met: bool | None
    reference: str = "oracle"  # the policy whose GPU-hours `vs_oracle` divides by
    attainment_target: float = TARGET_ATTAINMENT


def frontier_points(rows: Iterable[Mapping[str, Any]]) -> list[FrontierPoint]:
    """The points of bench rows (`dataclasses.asdict(BenchRow)` or a record's rows), in their order; a row without
    an attainable share counts over every request."""
    points = []
    for row in rows:
        attainable = row.get("attainable")
        share = attainable if isinstance(attainable, (int, float)) and attainable > 0 else 1.0
        points.append(FrontierPoint(str(row["policy"]), float(row["gpu_hours"]), float(row["sla_attainment"]) / share))
    return points


def run_points(runs: Sequence[PolicyRun]) -> list[FrontierPoint]:
    """`frontier_points` of a bench's runs."""
    return frontier_points(dataclasses.asdict(run.row) for run in runs)


def _named(points: Sequence[FrontierPoint], policy: str) -> FrontierPoint | None:
    return next((p for p in points if p.policy == policy), None)


def knob_points(points: Sequence[FrontierPoint]) -> list[tuple[float, FrontierPoint]]:
    """(quantile, point) of the runs at the knob's settings, by quantile."""
    found = [(float(m["quantile"]), p) for p in points if (m := KNOB_NAME.match(p.policy)) is not None]
    return sorted(found, key=lambda item: item[0])


def knob_crossing(points: Sequence[FrontierPoint], target: float = TARGET_ATTAINMENT) -> KnobCrossing | None:
    """Where the knob's line (`knob_points`) first reaches `target`, or None when no setting reaches it."""
    line = knob_points(points)
    for index, (quantile, point) in enumerate(line):
        if point.of_attainable < target:
            continue
        if index == 0:
            return KnobCrossing(quantile_below=quantile, quantile_at=quantile, gpu_hours=point.gpu_hours)
        below_q, below = line[index - 1]
        rise = point.of_attainable - below.of_attainable
        fraction = (target - below.of_attainable) / rise if rise > 0 else 1.0
        gpu_hours = below.gpu_hours + fraction * (point.gpu_hours - below.gpu_hours)
        return KnobCrossing(quantile_below=below_q, quantile_at=quantile, gpu_hours=gpu_hours)
    return None


def goal_reference(points: Sequence[FrontierPoint]) -> tuple[FrontierPoint | None, float]:
    """What the goal holds a run to: the cost reference (`oracle-ahead`, else the instant `oracle`; None when the
    run has neither) and the attainment target (`TARGET_ATTAINMENT`, or `oracle-seen`'s share where lower)."""
    reference = _named(points, "oracle-ahead") or _named(points, "oracle")
    seen = _named(points, "oracle-seen")
    target = min(TARGET_ATTAINMENT, seen.of_attainable) if seen is not None else TARGET_ATTAINMENT
    return reference, target


def meets_goal(
    point: FrontierPoint, reference: FrontierPoint | None, target: float
) -> tuple[bool | None, float | None]:
    """Whether `point` reaches the attainment target within `MAX_VS_ORACLE` x the reference's GPU-hours, and that
    ratio; (None, None) without a reference."""
    if reference is None or reference.gpu_hours <= 0:
        return None, None
    ratio = point.gpu_hours / reference.gpu_hours
    return point.of_attainable >= target - 1e-12 and ratio <= MAX_VS_ORACLE, ratio


def startup_goal(points: Sequence[FrontierPoint]) -> StartupGoal:
    """The goal (module docstring) on one run's points."""
    shipped = _named(points, SHIPPED_POLICY)
    reference, target = goal_reference(points)
    name = reference.policy if reference is not None else "oracle"
    if shipped is None:
        return StartupGoal(shipped=None, vs_oracle=None, cheaper_and_better=(), met=None)
    competitors = [
        p for p in points if p.policy != SHIPPED_POLICY and p.policy not in REFERENCES and not KNOB_NAME.match(p.policy)
    ]
    better = tuple(
        p.policy for p in competitors if p.gpu_hours < shipped.gpu_hours and p.of_attainable > shipped.of_attainable
    )
    met, vs_oracle = meets_goal(shipped, reference, target)
    return StartupGoal(
        shipped=shipped,
        vs_oracle=vs_oracle,
        cheaper_and_better=better,
        met=None if met is None else met and not better,
        reference=name,
        attainment_target=target,
    )


def describe_startup_goal(points: Sequence[FrontierPoint]) -> list[str]:
    """Lines for a report: the goal (`GOAL_TEXT`) on this run, the knob's crossing of the target, and the foresight
    reference."""
    goal = startup_goal(points)
    oracle, _ = goal_reference(points)

    def gpu_hours_text(gpu_hours: float) -> str:
        if oracle is None or oracle.gpu_hours <= 0:
            return f"{gpu_hours:.2f} GPU-h"
        name = "the oracle" if oracle.policy == "oracle" else oracle.policy
        return f"{gpu_hours:.2f} GPU-h ({gpu_hours / oracle.gpu_hours:.2f}x {name})"

    def at(point: FrontierPoint) -> str:
        return f"{100.0 * point.of_attainable:.1f} % of attainable at {gpu_hours_text(point.gpu_hours)}"

    lines = []
    if goal.shipped is not None:
        verdict = {True: "met", False: "not met", None: "not judged (no oracle in the run)"}[goal.met]
        others = f"; cheaper and better: {', '.join(goal.cheaper_and_better)}" if goal.cheaper_and_better else ""
        target = (
            ""
            if goal.attainment_target >= TARGET_ATTAINMENT
            else f" (target: oracle-seen's {100.0 * goal.attainment_target:.1f} %)"
        )
        lines.append(f"goal {verdict}: {SHIPPED_POLICY} {at(goal.shipped)}{target}{others}")
    line = knob_points(points)
    if line:
        crossing = knob_crossing(points)
        if crossing is None:
            best_q, best = max(line, key=lambda item: (item[1].of_attainable, -item[1].gpu_hours))
            lines.append(f"knob: no setting reaches {TARGET_TEXT}; the highest, q{best_q:g}: {at(best)}")
        else:
            where = (
                f"at q{crossing.quantile_at:g}"
                if crossing.quantile_below == crossing.quantile_at
                else f"between q{crossing.quantile_below:g} and q{crossing.quantile_at:g}"
            )
            lines.append(f"knob: reaches {TARGET_TEXT} {where}, at about {gpu_hours_text(crossing.gpu_hours)}")
    for name, what in {**FORESIGHT, **HINDSIGHT}.items():
        reference = _named(points, name)
        if reference is not None:
            lines.append(f"{name} ({what}): {at(reference)}")
    return lines


def frontier_figure(runs: Sequence[PolicyRun], *, title: str):  # plotly Figure (lazy import)
    """A Plotly figure: attainment (% of attainable) against GPU-hours, one marker per policy, the knob's runs as
    one line."""
    import plotly.graph_objects as go  # plotting is only needed for the HTML page

    points = run_points(runs)
    figure = go.Figure()
    others = [p for p in points if KNOB_NAME.match(p.policy) is None]
    figure.add_scatter(
        x=[p.gpu_hours for p in others],
        y=[100.0 * p.of_attainable for p in others],
        text=[p.policy for p in others],
        mode="markers+text",
        textposition="top center",
        name="policies",
    )
    line = knob_points(points)
    if line:
        figure.add_scatter(
            x=[p.gpu_hours for _, p in line],
            y=[100.0 * p.of_attainable for _, p in line],
            text=[f"q{quantile:g}" for quantile, _ in line],
            mode="lines+markers+text",
            textposition="bottom right",
            name="planner at throughput_horizon_quantile q",
        )
    figure.add_hline(y=100.0 * TARGET_ATTAINMENT, line_dash="dash", annotation_text=TARGET_TEXT)
    figure.update_layout(
        title=title, xaxis_title="GPU-hours", yaxis_title="attainable requests within both targets (%)", height=600
    )
    return figure
