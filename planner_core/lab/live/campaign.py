"""`planner live` as a whole: the traffic written once, the planner's run and the fixed-size run on it, one after
the other, then their figures read back and printed side by side (and kept in a `--record` file when asked)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from planner_core.lab.live.frontier import next_fixed_size
from planner_core.lab.live.run import run_once
from planner_core.lab.live.scoring import live_record, live_table, size_name, summarize
from planner_core.lab.live.spec import RunSpec
from planner_core.lab.live.stack import REPO, find_tools
from planner_core.lab.live.traffic import write_day_trace, write_slowed_profile, write_trace
from planner_core.runtime.localhost import code_commit


@dataclass(frozen=True)
class LiveOptions:
    """What `planner live` was asked (its options, named as the command's flags)."""

    out: Path
    duration_s: float
    traffic: str  # a recorded trace's name (RECORDED_TRACES: conv, code, mooncake) or "day"
    peak_rps: float
    trough_ratio: float
    speedup: float
    keep_every: int
    trace_start_s: float
    max_isl: int
    max_osl: int
    slowdown: float
    ttft_ms: float
    itl_ms: float
    interval_s: float | None
    max_workers: int
    # the fixed-size runs' (prefill, decode) engines (mode agg: prefill 0, decode the aggregated pool's), in order
    fixed_sizes: tuple[tuple[int, int], ...]
    initial_size: int | None
    cooldown_s: float
    fixed_only: bool
    record: Path | None
    nice: int
    router: str
    argv: tuple[str, ...] = ()  # the command line after `planner`, kept in the runs' figures
    mode: str = "disagg"  # or "agg": one pool of aggregated engines
    initial_prefill: int | None = None  # disagg: prefill engines at the runs' start (None: the first fixed size's)
    fixed_search: int = 0  # fixed sizes run after `fixed_sizes` to find the frontier (`frontier.next_fixed_size`)


def parse_sizes(text: str, mode: str, flag: str) -> tuple[int, int]:
    """(prefill, decode) engines from a size option: `P:D` in mode disagg, `N` in mode agg (prefill 0).

    Raises:
        LiveError: the text is not that (names the flag, the value and the form wanted).
    """
    from planner_core.lab.live.stack import LiveError

    parts = text.split(":")
    wanted = "P:D (prefill:decode engines, e.g. 1:2)" if mode == "disagg" else "N (aggregated engines)"
    try:
        sizes = [int(part) for part in parts]
    except ValueError:
        sizes = []
    if len(sizes) != (2 if mode == "disagg" else 1) or min(sizes) < 0:
        raise LiveError(f"{flag} = {text!r}: with --mode {mode} give {wanted}, each >= 0")
    if mode == "disagg" and min(sizes) == 0 < max(sizes):  # one pool empty: no request could be served
        raise LiveError(f"{flag} = {text!r}: both pools need an engine (or 0:0 for none)")
    return (sizes[0], sizes[1]) if mode == "disagg" else (0, sizes[0])


def parse_size_list(text: str, mode: str, flag: str) -> tuple[tuple[int, int], ...]:
    """`parse_sizes` of each comma-separated size, in order, without the empty ones (0, 0:0: no run) and repeats.

    Raises:
        LiveError: a size is not of the mode's form (names the flag and the value).
    """
    sizes: list[tuple[int, int]] = []
    for part in text.split(","):
        size = parse_sizes(part.strip(), mode, flag)
        if size[1] and size not in sizes:
            sizes.append(size)
    return tuple(sizes)


def binding_sla(slowdown: float) -> tuple[float, float]:
    """The run's default SLA (TTFT ms, ITL ms): Dynamo's default targets (the planner config's own defaults, 500 ms
    and 50 ms) scaled by the engines' slowdown, so that it binds the slowed engines as it binds real ones."""
    from planner_core.config import PlannerConfig

    fields = PlannerConfig.model_fields
    return fields["ttft_ms"].default * slowdown, fields["itl_ms"].default * slowdown


def _runs_sla(out: Path) -> tuple[float, float]:
    """The SLA the runs in `out` were made under (kept in their figures)."""
    from planner_core.lab.live.stack import LiveError

    slas = {
        (figures.get("ttft_ms"), figures.get("itl_ms"))
        for figures in (json.loads(f.read_text()) for f in sorted(out.glob("*/figures.json")))
    }
    if len(slas) != 1 or None in next(iter(slas)):
        raise LiveError(
            f"--out {out}: its runs do not name one SLA ({sorted(map(str, slas))}): give --ttft-ms and --itl-ms"
        )
    return next(iter(slas))


def summarize_runs(out: Path, *, ttft_ms: float | None, itl_ms: float | None, record: Path | None) -> str:
    """The table of the runs already in `out` (and their `--record` file, when asked), scored against the given SLA,
    else the one the runs were made under."""
    if ttft_ms is None or itl_ms is None:
        runs_ttft_ms, runs_itl_ms = _runs_sla(out)
        ttft_ms = runs_ttft_ms if ttft_ms is None else ttft_ms
        itl_ms = runs_itl_ms if itl_ms is None else itl_ms
    spec = RunSpec(
        name="", adaptive=True, fixed_size=0, duration_s=0, ttft_ms=ttft_ms, itl_ms=itl_ms,
        interval_s=None, max_workers=0, trace=out, nice=0, profile_dir=out, cooldown_s=0,
    )  # fmt: skip
    runs = summarize(out.resolve(), spec)
    if record:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(live_record(runs, spec), indent=1, default=str) + "\n")
    return live_table(runs, ttft_ms=spec.ttft_ms, itl_ms=spec.itl_ms)


def write_traffic(options: LiveOptions, root: Path) -> tuple[Path, str]:
    """The runs' trace (`root/trace.jsonl`) and what it is, as the runs' figures name it."""
    trace = root / "trace.jsonl"
    if options.traffic == "day":
        num_requests = write_day_trace(
            trace,
            duration_s=options.duration_s,
            peak_rps=options.peak_rps,
            trough_ratio=options.trough_ratio,
            max_isl=options.max_isl,
            max_osl=options.max_osl,
        )
    else:
        num_requests = write_trace(
            trace,
            start_s=options.trace_start_s,
            duration_s=options.duration_s,
            speedup=options.speedup,
            keep_every=options.keep_every,
            max_isl=options.max_isl,
            max_osl=options.max_osl,
            name=options.traffic,
        )
    print(f"trace: {num_requests} requests over {options.duration_s:.0f} s -> {trace}", file=sys.stderr)
    if options.traffic == "day":
        traffic = f"day: peak {options.peak_rps:g} req/s, night {options.trough_ratio:g} of it"
    else:
        traffic = (
            f"{options.traffic}: from {options.trace_start_s:g} s, x{options.speedup:g}, every {options.keep_every}th"
        )
    return trace, f"{traffic}; {num_requests} requests in {options.duration_s:g} s"


def plan_runs(options: LiveOptions, root: Path, trace: Path, traffic: str) -> list[RunSpec]:
    """The planner's run (unless `fixed_only`) and a run at each fixed size, alike in all else (all start from the
    same deployment: `--initial-size`, else the first fixed size)."""
    common = _common_spec(options, root, trace, traffic)
    suffix = "" if options.router == "round-robin" else f"-{options.router}"
    specs = [RunSpec(name=f"planner{suffix}", adaptive=True, fixed_size=1, **common)] if not options.fixed_only else []
    return specs + [fixed_spec(options, common, size) for size in options.fixed_sizes]


def _common_spec(options: LiveOptions, root: Path, trace: Path, traffic: str) -> dict:
    """What every run of a campaign shares (RunSpec's fields but its name and size)."""
    disagg = options.mode == "disagg"
    first_prefill, first_decode = options.fixed_sizes[0] if options.fixed_sizes else (1, 1)
    initial_prefill = options.initial_prefill if options.initial_prefill is not None else first_prefill
    return {
        "duration_s": options.duration_s,
        "ttft_ms": options.ttft_ms,
        "itl_ms": options.itl_ms,
        "interval_s": options.interval_s,
        "max_workers": options.max_workers,
        "trace": trace,
        "nice": options.nice,
        "cooldown_s": options.cooldown_s,
        "profile_dir": write_slowed_profile(root / f"profile-x{options.slowdown:g}", options.slowdown),
        "speedup": options.speedup,
        "traffic": traffic,
        # both runs start from the same deployment: the planner takes over the fixed run's size
        "initial_size": options.initial_size or first_decode,
        "initial_prefill": (initial_prefill or 1) if disagg else 0,
        "mode": options.mode,
        "command": shlex.join(["planner", *options.argv]),
        "commit": code_commit(),
        "router": options.router,
    }


def fixed_spec(options: LiveOptions, common: dict, size: tuple[int, int]) -> RunSpec:
    """The run at fixed `size` (prefill, decode; prefill 0 when aggregated). No cool-down: the pinned planner has
    nothing to decide after the traffic (the decisions made until then are still waited for), and a minute less a
    run keeps `make live`'s three runs within the hour."""
    disagg = options.mode == "disagg"
    suffix = "" if options.router == "round-robin" else f"-{options.router}"
    prefill, decode = size
    return RunSpec(
        name=f"fixed-{size_name(prefill, decode, disagg)}{suffix}",
        adaptive=False,
        fixed_size=decode,
        fixed_prefill=prefill if disagg else 0,
        **{**common, "cooldown_s": 0.0},
    )


def _run(spec: RunSpec, root: Path, tools: dict[str, str]) -> dict:
    print(f"run {spec.name}: starting", file=sys.stderr)
    figures = run_once(spec, root, tools)
    print(f"run {spec.name}: {json.dumps(figures, default=str)}", file=sys.stderr)
    return figures


def run_live(options: LiveOptions) -> str:
    """Every run of `options`, one after the other, then their table (also in `out/summary.md`). Raises
    `LiveError` when the stack cannot run."""
    tools = find_tools()
    root = options.out.resolve()
    root.mkdir(parents=True, exist_ok=True)
    trace, traffic = write_traffic(options, root)
    done: list[dict] = []
    for spec in plan_runs(options, root, trace, traffic):
        done.append(_run(spec, root, tools))
    common = _common_spec(options, root, trace, traffic)
    for step in range(options.fixed_search):  # the frontier (`frontier.next_fixed_size`), a run at a time
        nxt = next_fixed_size(done, disaggregated=options.mode == "disagg", max_engines=options.max_workers)
        print(f"fixed-size search, step {step + 1} of {options.fixed_search}: {nxt.why}", file=sys.stderr)
        if nxt.size is None:
            break
        done.append(_run(fixed_spec(options, common, nxt.size), root, tools))
    # read back in a fresh process: this one has engines cached on the runs' stopped embedded servers
    table = subprocess.run(
        [sys.executable, "-m", "planner_cli", "live", "--summarize", "--out", str(root),
         "--ttft-ms", str(options.ttft_ms), "--itl-ms", str(options.itl_ms),
         *(["--record", str(options.record.resolve())] if options.record else [])],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout  # fmt: skip
    (root / "summary.md").write_text(table)
    return table
