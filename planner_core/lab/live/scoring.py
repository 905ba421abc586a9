"""The live runs' figures: the database's (workers' GPU-seconds, decisions and their acknowledgements, ticks,
forward-pass samples), aiperf's (per-request TTFT and ITL against the SLA), replay's; the runs side by side as
`planner live` prints them, and the `--record` file the docs render."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from planner_core.lab.live.spec import RunSpec
from planner_core.lab.live.stack import DEPLOYMENT


def db_figures(database_url: str, started: dt.datetime, ended: dt.datetime, *, initial_size: int) -> dict:
    """The run's figures in its database over the traffic's span [started, ended]."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        workers = session.execute(
            text("SELECT role, started_at, ready_at, ended_at, status FROM local_workers ORDER BY id")
        ).all()
        decisions = session.execute(
            text(
                "SELECT d.id, d.target_decode, d.status, d.reason, t.scheduled_at FROM decisions d "
                "JOIN ticks t ON t.id = d.tick_id ORDER BY d.id"
            )
        ).all()
        num_ticks = session.scalar(text("SELECT count(*) FROM ticks"))
        executions = session.execute(text("SELECT outcome, count(*) FROM executions GROUP BY outcome")).all()
        fpm = session.execute(
            text(
                "SELECT count(*), count(DISTINCT worker_id), count(*) FILTER (WHERE wall_time_s > 0) "
                "FROM fpm_samples WHERE received_at BETWEEN :a AND :b"
            ),
            {"a": started, "b": ended},
        ).one()
        # every engine a scale-down removed (migration 0025): in flight when its drain started, and cut
        drains = session.execute(
            text(
                "SELECT count(*), coalesce(sum(num_in_flight_at_start), 0), coalesce(sum(num_cut), 0), "
                "count(*) FILTER (WHERE outcome = 'killed') FROM drains WHERE decision_id IS NOT NULL"
            )
        ).one()
    gpu_s = 0.0
    for _role, start, _ready, end, _status in workers:
        a, b = max(start, started), min(end or ended, ended)
        gpu_s += max(0.0, (b - a).total_seconds())  # one GPU per engine, over the traffic's span
    previous = initial_size  # the engines started before any decision
    ups = downs = 0
    applied = []
    for _id, target, status, _reason, _at in decisions:
        if status in ("applied", "acknowledged") and target is not None:
            ups += target > previous
            downs += target < previous
            applied.append((target, status))
            previous = target
    return {
        "num_workers_started": len(workers),
        "num_workers_died": sum(1 for w in workers if w[4] == "died"),
        "gpu_seconds": round(gpu_s, 1),
        "num_ticks": num_ticks,
        "num_decisions": len(decisions),
        "decision_statuses": {s: sum(1 for d in decisions if d[2] == s) for s in {d[2] for d in decisions}},
        "scale_ups": ups,
        "scale_downs": downs,
        "applied_decisions": len(applied),
        "acknowledged_decisions": sum(1 for _t, s in applied if s == "acknowledged"),
        "executions": dict(executions),
        "fpm_samples": fpm[0],
        "fpm_engines": fpm[1],
        "fpm_busy_samples": fpm[2],
        "drains": drains[0],
        "drains_in_flight_at_start": drains[1],
        "drains_cut": drains[2],
        "drains_killed": drains[3],
    }


def aiperf_figures(out_dir: Path, spec: RunSpec) -> dict:
    """Per-request TTFT and mean ITL from aiperf's record export; attainment = both within the SLA, over every
    request sent (a failed one, e.g. timed out, missed it)."""
    records = sorted(out_dir.rglob("profile_export.jsonl"))
    if not records:
        return {"aiperf_records": 0}
    num = ok = num_ttft_ok = num_itl_ok = errors = 0
    ttfts: list[float] = []
    for line in records[0].read_text().splitlines():
        record = json.loads(line)
        metrics = record.get("metrics") or {}
        if record.get("error") or "time_to_first_token" not in metrics:
            errors += 1
            continue
        num += 1
        ttft_ms = _ms(metrics["time_to_first_token"])
        itl = metrics.get("inter_token_latency")
        itl_ms = _ms(itl) if itl is not None else 0.0  # one output token: no inter-token latency
        ttfts.append(ttft_ms)
        num_ttft_ok += ttft_ms <= spec.ttft_ms
        num_itl_ok += itl_ms <= spec.itl_ms
        ok += ttft_ms <= spec.ttft_ms and itl_ms <= spec.itl_ms
    ttfts.sort()
    sent = num + errors
    return {
        "aiperf_records": num,
        "aiperf_errors": errors,
        "attainment": ok / sent if sent else None,
        "ttft_attainment": num_ttft_ok / sent if sent else None,
        "itl_attainment": num_itl_ok / sent if sent else None,
        "ttft_p50_ms": ttfts[len(ttfts) // 2] if ttfts else None,
        "ttft_p99_ms": ttfts[int(0.99 * (len(ttfts) - 1))] if ttfts else None,
    }


def _ms(metric) -> float:
    """A metric of aiperf's record export in milliseconds."""
    value, unit = (metric.get("value"), metric.get("unit", "ms")) if isinstance(metric, dict) else (metric, "ms")
    return float(value) * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def replay_figures(database_url: str, start: dt.datetime, end: dt.datetime) -> dict:
    """How many of the ticks recorded in [start, end] replay identical."""
    from planner_core.runtime.replay import replay

    summary = replay(database_url, DEPLOYMENT, start, end)
    return {"ticks": summary.num_ticks, "identical": summary.num_identical, "differing": summary.num_differing}


def live_table(runs: list[dict], *, ttft_ms: float, itl_ms: float) -> str:
    """The runs side by side (Markdown), as `planner live` prints them and the docs render its records."""
    rows = [
        ("traffic", lambda r: r.get("traffic") or "-"),
        ("router", lambda r: r.get("router", "round-robin")),
        ("aiperf requests (errors)", lambda r: f"{r.get('aiperf_records')} ({r.get('aiperf_errors')})"),
        (f"attainment TTFT<={ttft_ms:g} ms & ITL<={itl_ms:g} ms", lambda r: _pct(r.get("attainment"))),
        ("  TTFT attainment", lambda r: _pct(r.get("ttft_attainment"))),
        ("  ITL attainment", lambda r: _pct(r.get("itl_attainment"))),
        ("TTFT p50 / p99 (ms)", lambda r: f"{_num(r.get('ttft_p50_ms'))} / {_num(r.get('ttft_p99_ms'))}"),
        ("GPU-seconds (1 GPU per engine)", lambda r: f"{r.get('gpu_seconds')}"),
        ("workers started (died)", lambda r: f"{r.get('num_workers_started')} ({r.get('num_workers_died')})"),
        ("ticks / decisions", lambda r: f"{r.get('num_ticks')} / {r.get('num_decisions')}"),
        ("scale-ups / scale-downs", lambda r: f"{r.get('scale_ups')} / {r.get('scale_downs')}"),
        ("applied decisions acknowledged", lambda r: f"{r.get('acknowledged_decisions')} of {r.get('applied_decisions')}"),  # noqa: E501
        ("forward-pass samples stored (busy; engines)",
         lambda r: f"{r.get('fpm_samples')} ({r.get('fpm_busy_samples')}; {r.get('fpm_engines')})"),
        ("scale-down drains: in flight at start / cut (killed)",
         lambda r: f"{r.get('drains')}: {r.get('drains_in_flight_at_start')} / {r.get('drains_cut')} ({r.get('drains_killed')})"),  # noqa: E501
        ("components that exited during the traffic", lambda r: _exited(r.get("components_exited"))),
        ("CPU idle mean / min", lambda r: f"{_pct(r.get('cpu_idle_mean'))} / {_pct(r.get('cpu_idle_min'))}"),
        ("recorded ticks replay identical", lambda r: _replayed(r.get("replay"))),
        ("proxy: placed per worker / queued / overdue / rejected", lambda r: _proxied(r.get("route_proxy"))),
    ]  # fmt: skip
    header = "| | " + " | ".join(r["run"] for r in runs) + " |"
    lines = [header, "|---" * (len(runs) + 1) + "|"]
    lines += ["| " + label + " | " + " | ".join(get(r) for r in runs) + " |" for label, get in rows]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _proxied(r: dict | None) -> str:
    if r is None:
        return "-"
    placed = "+".join(str(n) for _, n in sorted(r["placed"].items()))
    return f"{placed or 0} / {r['queued']} / {r['overdue']} / {r['rejected']}"


def _exited(r: dict | None) -> str:
    return "-" if r is None else ", ".join(f"{name} (exit {code})" for name, code in r.items()) or "none"


def _replayed(r: dict | None) -> str:
    return "-" if r is None else f"{r['identical']} of {r['ticks']} ({r['differing']} differ)"


def summarize(root: Path, spec: RunSpec) -> list[dict]:
    """The figures of the runs under `root` read again from their databases and aiperf exports (keeping the CPU
    and replay figures measured during the run)."""
    from planner_core.runtime.settings import RuntimeSettings
    from planner_core.runtime.store.db import resolve_database_url, stop_embedded_database

    runs = []
    for figures_file in sorted(root.glob("*/figures.json"), key=lambda f: not f.parent.name.startswith("planner")):
        figures = json.loads(figures_file.read_text())
        run_dir = figures_file.parent
        os.environ["PLANNER_DATA_DIR"] = str(run_dir / "data")
        database_url = resolve_database_url(RuntimeSettings())
        started, ended = (dt.datetime.fromisoformat(figures[k]) for k in ("started", "ended"))
        figures.update(db_figures(database_url, started, ended, initial_size=figures.get("initial_size", 1)))
        figures.update(aiperf_figures(run_dir / "aiperf", spec))
        stop_embedded_database(run_dir / "data" / "pg")
        runs.append(figures)
    return runs


def live_record(runs: list[dict], spec: RunSpec) -> dict:
    """The `--record` file: every run's figures (each with the command and commit that made it) under the SLA they
    were scored against; the docs' live tables are generated from these."""
    return {
        "format": "planner-live-record/v1",
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "ttft_ms": spec.ttft_ms,
        "itl_ms": spec.itl_ms,
        "runs": [{k: v for k, v in run.items() if k not in ("started", "ended")} for run in runs],
    }
