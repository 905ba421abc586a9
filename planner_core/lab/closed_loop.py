"""The closed loop's goal rows: the shipped policy (`planner`) and the same file with its loop off
(`planner-open-loop`) on engines faster and slower than the profile they read, against `oracle-ahead` and
`oracle-seen` on the same engines: on our simulator, and the matrix rows on Dynamo 1.6.1's replay engine (its mocker
engines run 5-10 % slower prefill than the profile and its router is round robin; the oracles there use the bracket
search, `--dynamo-oracle bracket`). Also the matrix rows on our simulator at 120 s and 600 s start-up (`matrix-*`)
and two 12-hour daily cycles (`day12h-*`: the shipped ServeGen shape over the conversation and code traces).

On our simulator every row also runs the two hindsight references, `static-best` (the cheapest fixed size meeting
the target over the whole run) and `oracle-budget` (the fewest GPU-hours over per-window sizes doing so), and the
record states the shipped policy's GPU-hours as a multiple of each.

    python -m planner_core.lab.closed_loop [--rows NAME[,NAME...]] [--out docs/results/closed-loop] [--jobs 2]

A row's goal: the shipped policy serves at least 99 % of the attainable requests, or, where lower, what
`oracle-seen` serves, at no more than 1.15x `oracle-ahead`'s GPU-hours. Each row writes `<name>.json` (dated, with
its command and commit: the figures, the judgment and, for a row whose engines change speed mid-run, each policy's
attainment per 60 s window), and `summary.md` is rebuilt from every record in the folder.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from planner_core.data import H200_PROFILE_DIR, TRACES_DIR
from planner_core.lab.sim.benchmark import BenchRequest, benchmark
from planner_core.lab.sim.des.speed import EngineSpeed, SpeedChange, parse_engine_speed, parse_speed_change
from planner_core.lab.sim.frontier import (
    HINDSIGHT,
    MAX_VS_ORACLE,
    TARGET_ATTAINMENT,
    FrontierPoint,
    goal_reference,
    meets_goal,
)
from planner_core.lab.sim.policies import OPEN_LOOP_POLICY
from planner_core.runtime.localhost import code_commit

__all__ = ["GOAL_ATTAINMENT", "GOAL_COST_RATIO", "ROWS", "GoalRow", "main", "run_row"]

GOAL_ATTAINMENT = TARGET_ATTAINMENT  # of the attainable requests (the bench's goal)
GOAL_COST_RATIO = MAX_VS_ORACLE  # x oracle-ahead's GPU-hours
WINDOW_S = 60.0  # the per-window attainment's windows (the planner's throughput interval); the oracles keep the
# bench's default window, as the matrix records do
POLICIES = ("planner", OPEN_LOOP_POLICY, "oracle-ahead", "oracle-seen")
HINDSIGHT_POLICIES = tuple(HINDSIGHT)  # on our simulator only (the bench runs them there)
OUT = Path("docs/results/closed-loop")


@dataclasses.dataclass(frozen=True, slots=True)
class GoalRow:
    """One row: a trace at a rate scale and SLA, on engines at `speed` (and from `change` on, at its speed)."""

    name: str
    trace: str  # file name under the shipped traces
    rate_scale: float
    speed: str = "prefill=1,decode=1"
    change: str | None = None
    ttft_ms: float = 500.0
    itl_ms: float = 50.0
    startup_s: float = 120.0
    engine: str = "sim"  # "sim": our simulator; "dynamo": Dynamo 1.6.1's replay (needs `make dynamo-env`)
    shape: str | None = None  # a ServeGen shape under the shipped traces: the requests follow its daily cycle
    shape_hours: float = 24.0
    shape_start_h: float = 0.0

    @property
    def policies(self) -> tuple[str, ...]:
        """What the row runs: the goal's policies, and on our simulator the hindsight references."""
        return POLICIES + (HINDSIGHT_POLICIES if self.engine == "sim" else ())

    def engine_speed(self) -> EngineSpeed:
        return parse_engine_speed(self.speed, option=f"row {self.name}: speed")

    def speed_change(self) -> SpeedChange | None:
        if self.change is None:
            return None
        return parse_speed_change(self.change, option=f"row {self.name}: change", base=self.engine_speed())


_CONV, _MOONCAKE = "AzureLLMInferenceTrace_conv.csv", "synthetic_trace.jsonl"
ROWS = tuple(
    GoalRow(name=f"{label}-{tag}", trace=trace, rate_scale=scale, speed=speed)
    for label, trace, scale in (("conv-x12-500-50", _CONV, 12.0), ("mooncake-x2-500-50", _MOONCAKE, 2.0))
    for tag, speed in (
        ("slower", "prefill=0.8,decode=0.8"),
        ("faster", "prefill=1.2,decode=1.2"),
        ("prefill-slower", "prefill=0.8"),
        ("prefill-faster", "prefill=1.2"),
    )
) + (GoalRow(name="conv-x12-500-50-slowdown-20m", trace=_CONV, rate_scale=12.0, change="20m:prefill=0.75,decode=0.75"),)
_CODE = "AzureLLMInferenceTrace_code.csv"
DYNAMO_ROWS = tuple(
    GoalRow(
        name=f"dynamo-{label}-{ttft:g}-{itl:g}",
        trace=trace,
        rate_scale=scale,
        ttft_ms=ttft,
        itl_ms=itl,
        engine="dynamo",
    )
    for label, trace, scale in (("code-x4", _CODE, 4.0), ("mooncake-x2", _MOONCAKE, 2.0), ("conv-x12", _CONV, 12.0))
    for ttft, itl in ((500.0, 50.0), (200.0, 20.0))
)
_MATRIX = (("conv-x12", _CONV, 12.0), ("code-x4", _CODE, 4.0), ("mooncake-x2", _MOONCAKE, 2.0))
MATRIX_ROWS = tuple(
    GoalRow(
        name=f"matrix-{label}-{ttft:g}-{itl:g}-s{startup:g}",
        trace=trace,
        rate_scale=scale,
        ttft_ms=ttft,
        itl_ms=itl,
        startup_s=startup,
    )
    for startup in (120.0, 600.0)
    for label, trace, scale in _MATRIX
    for ttft, itl in ((500.0, 50.0), (200.0, 20.0))
)
# 12 hours of a daily cycle from its 3 a.m.: the night's trough (0.8x the day's mean rate), the morning's rise and
# the day's plateau (1.1x); mean load about a third of the one-hour matrix rows' (x4 conversation, x2 code), so a
# row's oracles finish in tens of minutes rather than hours.
_SHAPE = "servegen-m-large-shape.csv"
DAY_ROWS = tuple(
    GoalRow(
        name=f"day12h-{label}-500-50",
        trace=trace,
        rate_scale=scale,
        shape=_SHAPE,
        shape_hours=12.0,
        shape_start_h=3.0,
    )
    for label, trace, scale in (("conv-x4", _CONV, 4.0), ("code-x2", _CODE, 2.0))
)
ROWS = ROWS + DYNAMO_ROWS + MATRIX_ROWS + DAY_ROWS


def run_row(row: GoalRow, *, policies: Sequence[str] | None = None) -> dict[str, object]:
    """Bench one row (`row.policies` unless given) and judge it; the record `main` writes."""
    request = BenchRequest(
        trace=TRACES_DIR / row.trace,
        profile=H200_PROFILE_DIR,
        rate_scale=row.rate_scale,
        shape=TRACES_DIR / row.shape if row.shape is not None else None,
        shape_hours=row.shape_hours,
        shape_start_h=row.shape_start_h,
        policies=row.policies if policies is None else tuple(policies),
        ttft_ms=row.ttft_ms,
        itl_ms=row.itl_ms,
        startup_s=row.startup_s,
        engine_speed=row.engine_speed(),
        speed_change=row.speed_change(),
        engine=row.engine,
        dynamo_oracle="bracket",
    )
    outcome = benchmark(request)
    figures: dict[str, dict[str, float]] = {}
    windows: dict[str, list[float | None]] = {}
    for run in outcome.runs:
        attainable = run.row.attainable or 1.0
        figures[run.row.policy] = {
            "sla_attainment": run.row.sla_attainment,
            "of_attainable": run.row.sla_attainment / attainable,
            "gpu_hours": run.row.gpu_hours,
        }
        if row.change is not None:
            windows[run.row.policy] = window_attainment(outcome.trace.arrival_s, run.result, row, WINDOW_S)
    record: dict[str, object] = {
        "row": dataclasses.asdict(row),
        "policies": figures,
        "goal": judge(figures),
    }
    if windows:
        record["window_s"] = WINDOW_S
        record["window_attainment"] = windows
    return record


def judge(figures: dict[str, dict[str, float]]) -> dict[str, object]:
    """The goal (`planner_core.lab.sim.frontier.meets_goal`, the bench's) for `planner` and, for the ablation, for
    `planner-open-loop`; with the hindsight references in the run, its GPU-hours as a multiple of each
    (`cost_vs_static_best`, `cost_vs_oracle_budget`; None where the reference did not run)."""
    points = [FrontierPoint(name, figure["gpu_hours"], figure["of_attainable"]) for name, figure in figures.items()]
    reference, target = goal_reference(points)
    verdicts: dict[str, object] = {"attainment_target": target}
    for point in points:
        if point.policy not in ("planner", OPEN_LOOP_POLICY):
            continue
        met, ratio = meets_goal(point, reference, target)
        verdicts[point.policy] = {
            "cost_vs_oracle_ahead": ratio,
            "attainment_met": point.of_attainable >= target - 1e-12,
            "cost_met": ratio is not None and ratio <= GOAL_COST_RATIO,
            "met": bool(met),
            **{
                f"cost_vs_{name.replace('-', '_')}": _ratio(point.gpu_hours, figures.get(name))
                for name in HINDSIGHT_POLICIES
            },
        }
    return verdicts


def _ratio(gpu_hours: float, reference: dict[str, float] | None) -> float | None:
    if reference is None or reference["gpu_hours"] <= 0:
        return None
    return gpu_hours / reference["gpu_hours"]


def window_attainment(arrival_s: np.ndarray, result, row: GoalRow, window_s: float) -> list[float | None]:
    """Each window's share of its arriving requests served within both targets (None: no request arrived)."""
    ttft_ms, itl_ms = result.ttft_s * 1000.0, result.itl_s * 1000.0
    finished = np.isfinite(result.finish_s)
    met = (np.isfinite(ttft_ms) & (ttft_ms <= row.ttft_ms)) & finished & (~np.isfinite(itl_ms) | (itl_ms <= row.itl_ms))
    index = (np.asarray(arrival_s) // window_s).astype(int)
    shares: list[float | None] = []
    for k in range(int(index.max()) + 1 if len(index) else 0):
        in_window = index == k
        shares.append(float(met[in_window].mean()) if in_window.any() else None)
    return shares


def summary(folder: Path) -> str:
    """The markdown table of every record in `folder`, one line per row."""
    lines = [
        "| row | engines | planner: % of attainable, GPU-h, x oracle-ahead | open loop: same | oracle-ahead | "
        "oracle-seen | goal (planner / open loop) | planner x static-best, x oracle-budget | date, commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        row, goal = record["row"], record["goal"]
        verdict = " / ".join("met" if goal[name]["met"] else "missed" for name in ("planner", OPEN_LOOP_POLICY))
        policy_cells = " | ".join(_cell(record, name) for name in POLICIES)
        hindsight = ", ".join(
            "-" if (ratio := goal["planner"].get(f"cost_vs_{name.replace('-', '_')}")) is None else f"{ratio:.2f}x"
            for name in HINDSIGHT_POLICIES
        )
        lines.append(
            f"| {row['name']} | {_engines(row)} | {policy_cells} | {verdict} | {hindsight} | {record['date'][:10]}, "
            f"{record['commit'][:7]} |"
        )
    return "\n".join(lines) + "\n"


def _engines(row: dict) -> str:
    """A row's engines and traffic, as the summary's second column says them."""
    if row.get("engine", "sim") == "dynamo":
        return f"Dynamo's replay, {row['ttft_ms']:g}/{row['itl_ms']:g} ms"
    text = row["speed"] + (f", then {row['change']}" if row.get("change") else "")
    if row.get("startup_s", 120.0) != 120.0:
        text += f", start-up {row['startup_s']:g} s"
    if row.get("shape"):
        text += f", {row['shape_hours']:g} h of its daily cycle"
    return text


def _cell(record: dict, name: str) -> str:
    figure, goal = record["policies"][name], record["goal"]
    ratio = goal[name]["cost_vs_oracle_ahead"] if name in goal else None
    text = f"{figure['of_attainable']:.1%}, {figure['gpu_hours']:.2f}"
    return text + (f", {ratio:.2f}x" if ratio is not None else "")


def _run_and_write(row: GoalRow, out: Path, command: str) -> str:
    record = run_row(row)
    record = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "command": command,
              "commit": code_commit(), **record}  # fmt: skip
    (out / f"{row.name}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    goal = record["goal"]
    return f"{row.name}: planner {'met' if goal['planner']['met'] else 'missed'} ({goal['planner']})"


def recorded_command(argv: Sequence[str], out: Path) -> str:
    """The command as a record states it: an `--out` outside the repository (a scratch folder whose records are
    copied into the docs) is not named, so a record holds no path of the machine it ran on."""
    inside = not out.is_absolute() or out.resolve().is_relative_to(Path.cwd().resolve())
    words, skip = [], False
    for word in argv:
        if skip:
            words.append(str(word) if inside else "<a scratch folder; the records copied here>")
            skip = False
            continue
        if word == "--out":
            skip = True
        elif word.startswith("--out=") and not inside:
            word = "--out=<a scratch folder; the records copied here>"
        words.append(word)
    return " ".join(["python -m planner_core.lab.closed_loop", *words])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner_core.lab.closed_loop", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="all", help="comma-separated row names, or all")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    known = {row.name: row for row in ROWS}
    names = list(known) if args.rows == "all" else [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"--rows: unknown row {unknown[0]!r} (known: {', '.join(known)})")
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} is not >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    command = recorded_command(argv if argv is not None else sys.argv[1:], args.out)
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_run_and_write, known[name], args.out, command) for name in names]
        for future in concurrent.futures.as_completed(futures):
            print(future.result(), flush=True)  # noqa: T201 - the command's progress
    (args.out / "summary.md").write_text(summary(args.out), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
