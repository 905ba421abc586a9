"""The fault suite's JSON report (`--report`): the kills by fault, the rounds against the baseline, the audit chain,
the ingest leg; and whether a finished run is clean."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from planner_core.lab.chaos.ingest_leg import INGEST_FAULTS, ingest_leg_clean
from planner_core.lab.chaos.options import FAULTS, ChaosOptions
from planner_core.lab.chaos.stack import ChaosRun


def write_report(options: ChaosOptions, report: dict[str, Any]) -> None:
    """The report to `options.report` (when given)."""
    if options.report:
        options.report.parent.mkdir(parents=True, exist_ok=True)
        options.report.write_text(json.dumps(report, indent=2, default=str) + "\n")


def build_report(
    options: ChaosOptions,
    run: ChaosRun,
    rounds: list[dict[str, Any]],
    baseline: dict[str, list],
    baseline_s: float,
    num_attempts: int,
    started_at: dt.datetime,
    chain: Any,
    ingest: dict[str, Any] | None,
) -> dict[str, Any]:
    """The JSON report; `chain` (the audit chain check) is None while the run is still going, `ingest` (the
    ingest leg's result) None when it did not run. `num_kills` and `kills_by_fault` count both legs."""
    by_fault = {fault: sum(1 for k in run.kills if k.fault == fault) for fault in FAULTS}
    by_fault |= {fault: 0 if ingest is None else ingest["kills_by_fault"][fault] for fault in INGEST_FAULTS}
    return {
        "command": " ".join(["planner", *options.argv]),
        "commit": run.commit,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished": chain is not None,
        "duration_s": round((dt.datetime.now(dt.UTC) - started_at).total_seconds(), 1),
        "seed": options.seed,
        "windows": options.windows,
        "baseline_s": round(baseline_s, 1),
        "num_kills": sum(by_fault.values()),
        "num_demo_kills": len(run.kills),
        "kills_by_fault": by_fault,
        "num_demo_attempts": num_attempts,
        "hung_demos_killed": sum(1 for k in run.kills if "hung" in k.note),
        "num_rounds": len(rounds),
        "duplicate_ticks": sum(r["duplicate_ticks"] for r in rounds),
        "duplicate_decisions": sum(r["duplicate_decisions"] for r in rounds),
        "lost_ticks": sum(r["lost_ticks"] for r in rounds),
        "lost_decisions": sum(r["lost_decisions"] for r in rounds),
        "extra_ticks": sum(r["extra_ticks"] for r in rounds),
        "extra_decisions": sum(r["extra_decisions"] for r in rounds),
        "changed_ticks": sum(r["changed_ticks"] for r in rounds),
        "changed_decisions": sum(r["changed_decisions"] for r in rounds),
        "rounds_identical": sum(1 for r in rounds if r["ticks_identical"] and r["decisions_identical"]),
        "baseline_ticks": len(baseline["ticks"]),
        "baseline_decisions": len(baseline["decisions"]),
        "audit_chain": None
        if chain is None
        else {"ok": chain.ok, "num_rows": chain.num_rows, "broken": chain.broken and chain.broken.line()},
        "ingest": ingest,
        "rounds": rounds,
        "kills": [k.__dict__ for k in run.kills],
    }  # no folder: a machine-local path, meaningless in a report kept elsewhere (printed at the start instead)


def ingest_summary(ingest: dict[str, Any]) -> dict[str, Any]:
    """The ingest leg's result without its per-fault list."""
    return {k: v for k, v in ingest.items() if k != "faults"}


def report_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its per-round and per-kill lists (what `planner chaos` prints)."""
    summary = {k: v for k, v in report.items() if k not in ("rounds", "kills", "ingest")}
    if report["ingest"] is not None:
        summary["ingest"] = ingest_summary(report["ingest"])
    return summary


def report_clean(report: dict[str, Any]) -> bool:
    """Nothing duplicated, lost, extra or changed; every round identical; the audit chain whole; the ingest leg
    clean."""
    return bool(
        report["duplicate_ticks"] == report["duplicate_decisions"] == 0
        and report["lost_ticks"] == report["lost_decisions"] == 0
        and report["extra_ticks"] == report["extra_decisions"] == 0
        and report["rounds_identical"] == report["num_rounds"]
        and report["audit_chain"]["ok"]
        and (report["ingest"] is None or ingest_leg_clean(report["ingest"]))
    )
