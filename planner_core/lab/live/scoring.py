"""The live runs' figures: the database's (workers' GPU-seconds, decisions and their acknowledgements, ticks,
forward-pass samples), aiperf's (per-request TTFT and ITL against the SLA), replay's; the runs side by side as
`planner live` prints them, and the `--record` file the docs render."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from planner_core.lab.live.spec import RunSpec
from planner_core.lab.live.stack import DEPLOYMENT


def db_figures(
    database_url: str, started: dt.datetime, ended: dt.datetime, *, initial_size: int, initial_prefill: int = 0
) -> dict:
    """The run's figures in its database over the traffic's span [started, ended]: GPU-seconds, scale-ups and
    scale-downs in all and per pool (`initial_size` / `initial_prefill`: the decode and prefill engines started
    before any decision), decisions and their acknowledgements, forward-pass samples and drains."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        workers = session.execute(
            text("SELECT role, started_at, ready_at, ended_at, status FROM local_workers ORDER BY id")
        ).all()
        decisions = session.execute(
            text(
                "SELECT d.id, d.target_prefill, d.target_decode, d.status, d.reason, t.scheduled_at FROM decisions d "
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
        fpm_by_pool = dict(
            session.execute(
                text(
                    "SELECT component, count(DISTINCT worker_id) FROM fpm_samples WHERE received_at BETWEEN :a AND :b "
                    "GROUP BY component"
                ),
                {"a": started, "b": ended},
            ).all()
        )
        # every engine a scale-down removed (migration 0025): in flight when its drain started, and cut
        drains = session.execute(
            text(
                "SELECT count(*), coalesce(sum(num_in_flight_at_start), 0), coalesce(sum(num_cut), 0), "
                "count(*) FILTER (WHERE outcome = 'killed') FROM drains WHERE decision_id IS NOT NULL"
            )
        ).one()
    gpu_s, ups, downs, applied = _pool_figures(workers, decisions, started, ended, initial_prefill, initial_size)
    return {
        "num_workers_started": len(workers),
        "num_workers_died": sum(1 for w in workers if w[4] == "died"),
        "gpu_seconds": round(gpu_s["prefill"] + gpu_s["decode"], 1),
        "gpu_seconds_by_pool": {role: round(value, 1) for role, value in gpu_s.items() if value},
        "num_ticks": num_ticks,
        "num_decisions": len(decisions),
        "decision_statuses": {s: sum(1 for d in decisions if d[3] == s) for s in {d[3] for d in decisions}},
        "scale_ups": ups["prefill"] + ups["decode"],
        "scale_downs": downs["prefill"] + downs["decode"],
        "scale_ups_by_pool": ups,
        "scale_downs_by_pool": downs,
        "applied_decisions": len(applied),
        "acknowledged_decisions": sum(1 for s in applied if s == "acknowledged"),
        "executions": dict(executions),
        "fpm_samples": fpm[0],
        "fpm_engines": fpm[1],
        "fpm_engines_by_pool": fpm_by_pool,
        "fpm_busy_samples": fpm[2],
        "drains": drains[0],
        "drains_in_flight_at_start": drains[1],
        "drains_cut": drains[2],
        "drains_killed": drains[3],
    }


def _pool_figures(
    workers: list, decisions: list, started: dt.datetime, ended: dt.datetime, initial_prefill: int, initial_size: int
) -> tuple[dict[str, float], dict[str, int], dict[str, int], list[str]]:
    """Per pool: the engines' GPU-seconds over the traffic's span, the scale-ups and scale-downs of the applied
    decisions (from the engines started before any decision); and the applied decisions' statuses."""
    gpu_s = {"prefill": 0.0, "decode": 0.0}
    for role, start, _ready, end, _status in workers:
        a, b = max(start, started), min(end or ended, ended)
        gpu_s[role] += max(0.0, (b - a).total_seconds())  # one GPU per engine, over the traffic's span
    previous = {"prefill": initial_prefill, "decode": initial_size}  # the engines started before any decision
    ups = {"prefill": 0, "decode": 0}
    downs = {"prefill": 0, "decode": 0}
    applied = []
    for _id, target_prefill, target_decode, status, _reason, _at in decisions:
        if status not in ("applied", "acknowledged"):
            continue
        applied.append(status)
        for role, target in (("prefill", target_prefill), ("decode", target_decode)):
            if target is not None:
                ups[role] += target > previous[role]
                downs[role] += target < previous[role]
                previous[role] = target
    return gpu_s, ups, downs, applied


@dataclass(frozen=True, slots=True)
class ObservedWindow:
    """One throughput tick's view of the frontend's traffic: the requests started in (end - window_s, end] and their
    mean prompt tokens, as Prometheus' `increase` of the frontend's counters gave them."""

    end_s: float  # epoch seconds
    window_s: float
    num_req: float
    isl: float


@dataclass(frozen=True, slots=True)
class SentRequest:
    """One request aiperf sent: when (epoch seconds) and its prompt tokens as the server counted them."""

    start_s: float
    prompt_tokens: int


def observed_windows(database_url: str) -> list[ObservedWindow]:
    """Every throughput tick's traffic observation of the run (the windows the planner looked at)."""
    from sqlalchemy import text

    from planner_core.runtime.store.db import session_factory

    with session_factory(database_url).begin() as session:
        rows = session.execute(
            text(
                "SELECT extract(epoch FROM t.scheduled_at), o.window_s, o.num_req, o.isl FROM traffic_observations o "
                "JOIN ticks t ON t.id = o.tick_id AND t.scheduled_at = o.scheduled_at WHERE t.loop = 'throughput' "
                "ORDER BY t.scheduled_at"
            )
        ).all()
    return [ObservedWindow(float(end), float(w), float(n), float(isl)) for end, w, n, isl in rows]


def sent_requests(out_dir: Path) -> list[SentRequest]:
    """The requests of aiperf's record export (failed ones too: they reached the frontend)."""
    records = sorted(out_dir.rglob("profile_export.jsonl"))
    sent = []
    for line in records[0].read_text().splitlines() if records else []:
        record = json.loads(line)
        start_ns = (record.get("metadata") or {}).get("request_start_ns")
        if start_ns is not None:
            sent.append(SentRequest(start_ns / 1e9, int(_value(record.get("metrics") or {}, "usage_prompt_tokens"))))
    return sent


def view_agreement(windows: list[ObservedWindow], sent: list[SentRequest]) -> dict:
    """What the planner saw against what aiperf sent, over the windows the planner looked at (a tick that did not
    run saw nothing, and neither is it counted here): the requests aiperf started in each window and their prompt
    tokens, summed over the windows, against the windows' request counts and counts times mean prompt lengths;
    `*_diff` = (planner - aiperf) / aiperf. Requests sent outside every window are counted apart."""
    num_seen = prompt_seen = 0.0
    num_sent = prompt_sent = 0
    covered: set[int] = set()
    for window in windows:
        inside = [i for i, r in enumerate(sent) if window.end_s - window.window_s < r.start_s <= window.end_s]
        covered.update(inside)
        num_sent += len(inside)
        prompt_sent += sum(sent[i].prompt_tokens for i in inside)
        if math.isfinite(window.num_req) and window.num_req > 0:
            num_seen += window.num_req
            prompt_seen += window.num_req * window.isl if math.isfinite(window.isl) else 0.0
    return {
        "windows": len(windows),
        "requests_seen": round(num_seen, 1),
        "requests_sent": num_sent,
        "requests_outside_windows": len(sent) - len(covered),
        "requests_diff": round((num_seen - num_sent) / num_sent, 4) if num_sent else None,
        "prompt_tokens_diff": round((prompt_seen - prompt_sent) / prompt_sent, 4) if prompt_sent else None,
    }


def view_figures(database_url: str, out_dir: Path) -> dict:
    """`view_agreement` of the run's throughput ticks and aiperf's records."""
    return {"planner_view": view_agreement(observed_windows(database_url), sent_requests(out_dir))}


def aiperf_figures(out_dir: Path, spec: RunSpec) -> dict:
    """Per-request TTFT and mean ITL from aiperf's record export; attainment = both within the SLA, over every
    request sent (a failed one, e.g. timed out, missed it)."""
    records = sorted(out_dir.rglob("profile_export.jsonl"))
    if not records:
        return {"aiperf_records": 0}
    num = ok = num_ttft_ok = num_itl_ok = errors = prompt_tokens = output_tokens = 0
    ttfts: list[float] = []
    for line in records[0].read_text().splitlines():
        record = json.loads(line)
        metrics = record.get("metrics") or {}
        if record.get("error") or "time_to_first_token" not in metrics:
            errors += 1
            continue
        num += 1
        prompt_tokens += int(_value(metrics, "usage_prompt_tokens"))
        output_tokens += int(_value(metrics, "usage_completion_tokens"))
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
        # as the server counted them (its usage answer), for the comparison with what the planner saw
        "aiperf_prompt_tokens": prompt_tokens,
        "aiperf_output_tokens": output_tokens,
    }


def _value(metrics: dict, name: str) -> float:
    """A count of aiperf's record export (0 when the record lacks it: an answer without usage)."""
    metric = metrics.get(name)
    return float(metric.get("value", 0) if isinstance(metric, dict) else metric or 0)


def _ms(metric) -> float:
    """A metric of aiperf's record export in milliseconds."""
    value, unit = (metric.get("value"), metric.get("unit", "ms")) if isinstance(metric, dict) else (metric, "ms")
    return float(value) * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


SATURATED_IDLE = 0.10  # a machine with less idle CPU than this share ...
SATURATED_FOR_S = (
    60.0  # ... for longer than this was saturated: the run's latencies are the machine's, not the engines'
)


def longest_saturated_s(idle_samples: list[float], interval_s: float) -> float:
    """The longest stretch (s) of consecutive CPU idle samples under `SATURATED_IDLE`."""
    longest = current = 0
    for idle in idle_samples:
        current = current + 1 if idle < SATURATED_IDLE else 0
        longest = max(longest, current)
    return longest * interval_s


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
        ("mode", lambda r: r.get("mode", "agg")),
        ("GPU-seconds (1 GPU per engine)", lambda r: f"{r.get('gpu_seconds')}"),
        ("  prefill / decode", lambda r: _pools(r.get("gpu_seconds_by_pool"))),
        ("engines scraped at most, prefill / decode", lambda r: _pools(r.get("engines_scraped_by_pool"))),
        ("requests served by the engines, prefill / decode", lambda r: _pools(r.get("engine_requests_by_pool"))),
        ("workers started (died)", lambda r: f"{r.get('num_workers_started')} ({r.get('num_workers_died')})"),
        ("ticks / decisions", lambda r: f"{r.get('num_ticks')} / {r.get('num_decisions')}"),
        ("scale-ups / scale-downs", lambda r: f"{r.get('scale_ups')} / {r.get('scale_downs')}"),
        ("  prefill / decode", lambda r: _pool_pairs(r.get("scale_ups_by_pool"), r.get("scale_downs_by_pool"))),
        ("applied decisions acknowledged", lambda r: f"{r.get('acknowledged_decisions')} of {r.get('applied_decisions')}"),  # noqa: E501
        ("forward-pass samples stored (busy; engines)",
         lambda r: f"{r.get('fpm_samples')} ({r.get('fpm_busy_samples')}; {r.get('fpm_engines')})"),
        ("scale-down drains: in flight at start / cut (killed)",
         lambda r: f"{r.get('drains')}: {r.get('drains_in_flight_at_start')} / {r.get('drains_cut')} ({r.get('drains_killed')})"),  # noqa: E501
        ("components that exited during the traffic", lambda r: _exited(r.get("components_exited"))),
        ("planner saw vs aiperf sent in the ticks' windows: requests / prompt tokens",
         lambda r: _agreement(r.get("planner_view"))),
        ("CPU idle mean / min", lambda r: f"{_pct(r.get('cpu_idle_mean'))} / {_pct(r.get('cpu_idle_min'))}"),
        (f"CPU idle < {SATURATED_IDLE:.0%} for longest (s)", lambda r: _saturation(r.get("cpu_saturated_s"))),
        ("recorded ticks replay identical", lambda r: _replayed(r.get("replay"))),
        ("proxy: placed per worker / queued / overdue / rejected", lambda r: _proxied(r.get("route_proxy"))),
    ]  # fmt: skip
    header = "| | " + " | ".join(r["run"] for r in runs) + " |"
    lines = [header, "|---" * (len(runs) + 1) + "|"]
    lines += ["| " + label + " | " + " | ".join(get(r) for r in runs) + " |" for label, get in rows]
    return "\n".join([*lines, "", binding_line(binding_check(runs))])


def _pools(r: dict | None) -> str:
    return "-" if not r else f"{r.get('prefill', 0)} / {r.get('decode', 0)}"


def _pool_pairs(ups: dict | None, downs: dict | None) -> str:
    if not ups or not downs:
        return "-"
    return f"{ups['prefill']}/{downs['prefill']} / {ups['decode']}/{downs['decode']}"


def _agreement(r: dict | None) -> str:
    if r is None:
        return "-"
    diffs = " / ".join("-" if r[k] is None else f"{100 * r[k]:+.1f} %" for k in ("requests_diff", "prompt_tokens_diff"))
    return (
        f"{r['requests_seen']:g} vs {r['requests_sent']} ({diffs}); {r['windows']} windows, "
        f"{r['requests_outside_windows']} sent outside them"
    )


def _saturation(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:g} (saturated: does not count)" if seconds > SATURATED_FOR_S else f"{seconds:g}"


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
        initial = {"initial_size": figures.get("initial_size", 1), "initial_prefill": figures.get("initial_prefill", 0)}
        figures.update(db_figures(database_url, started, ended, **initial))
        figures.update(aiperf_figures(run_dir / "aiperf", spec))
        figures.update(view_figures(database_url, run_dir / "aiperf"))
        stop_embedded_database(run_dir / "data" / "pg")
        runs.append(figures)
    return runs


def live_record(runs: list[dict], spec: RunSpec) -> dict:
    """The `--record` file: every run's figures (each with the command and commit that made it) under the SLA they
    were scored against, and whether that SLA binds the fixed sizes (`binding_check`); the docs' live tables are
    generated from these."""
    return {
        "format": "planner-live-record/v1",
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "ttft_ms": spec.ttft_ms,
        "itl_ms": spec.itl_ms,
        "binding": binding_check(runs),
        "runs": [{k: v for k, v in run.items() if k not in ("started", "ended")} for run in runs],
    }


ATTAINMENT_TARGET = 0.99  # the share of requests within the SLA a size must reach to meet it


def size_name(prefill: int, decode: int, disaggregated: bool) -> str:
    return f"{prefill}p{decode}d" if disaggregated else str(decode)


def binding_check(runs: list[dict], *, target: float = ATTAINMENT_TARGET) -> dict:
    """Whether the runs' SLA binds: the cheapest fixed size meeting `target` (fewest engines, then fewest prefill
    engines), and, in each pool the planner scales (prefill and decode disaggregated; the one pool aggregated), the
    fixed size one engine smaller in that pool must miss `target`. A comparison with the planner is valid only then:
    under an SLA that one engine fewer also meets, a fixed pool sized to it is not the cheapest, and the planner's
    savings against it are not savings. `valid` is None while a run it needs is missing (the record names which
    size to run); a pool whose cheapest size has a single engine cannot bind (one engine fewer serves nothing, and
    no planner goes below one), so the record says it is not valid. Runs without an attainment (aiperf failed) and
    the planner's own runs are not fixed sizes."""
    fixed: dict[tuple[int, int], float] = {}
    disaggregated = False
    for run in runs:
        if run.get("adaptive", True) or run.get("attainment") is None or "fixed_size" not in run:
            continue  # the planner's run, a run without figures from aiperf, or one recorded before the check
        fixed[(int(run.get("fixed_prefill", 0)), int(run["fixed_size"]))] = float(run["attainment"])
        disaggregated = disaggregated or run.get("mode") == "disagg"
    meeting = [size for size, attained in fixed.items() if attained >= target]
    if not any("adaptive" in run for run in runs):
        return {"valid": None, "why": "the runs predate the check: their figures keep no fixed sizes", "pools": {}}
    if not fixed:
        return {"valid": None, "why": "no fixed-size run: add them with --fixed-only --fixed-size", "pools": {}}
    if not meeting:
        return {"valid": None, "why": f"no fixed-size run met {100 * target:g} %: run larger fixed sizes", "pools": {}}
    cheapest = min(meeting, key=lambda size: (size[0] + size[1], size[0]))
    pools: dict[str, dict] = {}
    for pool, smaller in (("prefill", (cheapest[0] - 1, cheapest[1])), ("decode", (cheapest[0], cheapest[1] - 1))):
        if pool == "prefill" and not disaggregated:
            continue
        name = size_name(*smaller, disaggregated)
        if min(smaller) < (1 if disaggregated else 0) or smaller == (0, 0):
            pools[pool] = {"smaller": name, "binding": False, "why": "the cheapest size has one engine in this pool"}
        elif smaller not in fixed:
            pools[pool] = {"smaller": name, "smaller_size": smaller, "binding": None,
                           "why": f"no run of fixed size {name}"}  # fmt: skip
        else:
            attained = fixed[smaller]
            pools[pool] = {"smaller": name, "attainment": attained, "binding": attained < target}
    verdicts = [p["binding"] for p in pools.values()]
    valid = False if False in verdicts else None if None in verdicts else True
    return {"cheapest_meeting": size_name(*cheapest, disaggregated), "valid": valid, "pools": pools}


def binding_line(check: dict) -> str:
    """The binding check in one line, under the table."""
    if not check.get("pools"):
        return f"SLA binding: unknown ({check['why']})"
    verdict = {True: "valid", False: "NOT valid", None: "unknown"}[check["valid"]]
    parts = []
    for pool, p in check["pools"].items():
        attained = f" {100 * p['attainment']:.2f} %" if "attainment" in p else ""
        state = {True: "misses: binds", False: "does not bind", None: "not run"}[p["binding"]]
        parts.append(f"{pool}: {p['smaller']}{attained} {state}" + (f" ({p['why']})" if "why" in p else ""))
    target = f"{100 * ATTAINMENT_TARGET:g} %"
    head = f"SLA binding ({verdict}): cheapest fixed size meeting {target} {check['cheapest_meeting']}"
    return "; ".join([head, *parts])
