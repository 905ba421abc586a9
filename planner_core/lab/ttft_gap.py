"""Where the TTFT goes: one window of a bench trace replayed at fixed sizes in Dynamo's engine and in our simulator.

Role: a lab measurement for `planner bench --engine dynamo` (issue 17): the recommended policy misses TTFT there at
prefill sizes that meet the target on our simulator. For one window of the bench's trace (with its context before
and after, as the oracle replays a window), every prefill size of `--prefill` is replayed with a fixed decode pool
and no start-up:

- in Dynamo 1.6.1's replay (`planner_core/lab/dynamo/run_replay.py`, Dynamo's virtualenv), with each router of
  `--dynamo-routers` (its replay's `round_robin`, what `--engine dynamo` runs, and `kv_router`); with its
  per-request report, each TTFT is cut into the wait for the prefill engine (arrival to admission into its running
  batch), the prefill (admission to the prompt's KV done), the hand-off (to admission on a decode engine) and the
  first decode iteration (to the first token);
- in our simulator (`ClusterSimulator`, the bench's engine limits and engine model) with each router of
  `--sim-routers` (`least_loaded`, the bench's default, and `round_robin`).

It prints, per engine, router and size, the window's TTFT attainment and percentiles, the decomposition (means over
the window's requests and over its misses) and how evenly the prefill engines were loaded, then the fewest prefill
workers meeting the target on each engine and router. With `--json PATH` the same figures are written there.

    DYNAMO_PYTHON=... .venv/bin/python -m planner_core.lab.ttft_gap --trace code --rate-scale 4 \\
        --ttft-ms 500 --itl-ms 50 --window 9 --prefill 4-9 --decode 1 [--json OUT.json]
"""

# ruff: noqa: T201 - a command-line script: printing is its output

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from planner_core.data import AZURE_CODE_TRACE, AZURE_CONV_TRACE, H200_PROFILE_DIR, MOONCAKE_TRACE
from planner_core.domain import EngineLimits
from planner_core.lab.sim.des import ClusterSimulator, RouterPolicy, SimSpec
from planner_core.lab.sim.dynamo_engine import ReplayBridge, _sub_trace, write_replay_trace
from planner_core.perf.forward import ForwardPassModel
from planner_core.perf.model import ProfilePerfModel
from planner_core.traces import RequestTrace, load_trace

TRACES = {"code": AZURE_CODE_TRACE, "conv": AZURE_CONV_TRACE, "mooncake": MOONCAKE_TRACE}
TTFT_PARTS = ("queue_ms", "prefill_ms", "handoff_ms", "first_step_ms")
FALLBACK_MAX_KV_TOKENS = 2_000_000
FLAT_OUT_DECODE = 32


def ttft_parts(record: Mapping[str, Any]) -> dict[str, float]:
    """One request of Dynamo's per-request report cut into its TTFT's parts (ms), which add up to its TTFT:
    waiting for the prefill engine (arrival to admission into its batch), the prefill (admission until the
    prompt's KV is held), the hand-off (until a decode engine admits it: KV transfer and decode queue) and the
    first decode iteration (until the first token). A missing stamp makes its part and the next NaN."""

    def stamp(key: str) -> float:
        value = record.get(key)
        return float(value) if value is not None else math.nan

    arrival, admit = stamp("arrival_time_ms"), stamp("prefill_admit_ms")
    held, decode, first = stamp("source_held_ms"), stamp("decode_admit_ms"), stamp("first_token_ms")
    return {
        "queue_ms": admit - arrival,
        "prefill_ms": held - admit,
        "handoff_ms": decode - held,
        "first_step_ms": first - decode,
    }


def ttft_stats(ttft_ms: np.ndarray, target_ms: float) -> dict[str, float]:
    """Count, share within `target_ms` (an unfinished request, NaN, misses) and p50/p90/p99 of the finished."""
    ttft_ms = np.asarray(ttft_ms, dtype=float)
    done = ttft_ms[np.isfinite(ttft_ms)]
    met = float(np.mean(np.isfinite(ttft_ms) & (ttft_ms <= target_ms))) if len(ttft_ms) else math.nan

    def pct(q: float) -> float:
        return float(np.percentile(done, q)) if len(done) else math.nan

    return {"num_requests": int(len(ttft_ms)), "met": met, "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99)}


def parts_summary(parts: Sequence[Mapping[str, float]], ttft_ms: np.ndarray, target_ms: float) -> dict[str, Any]:
    """Mean of each TTFT part over all requests and over those missing `target_ms` (`ttft_parts` per request)."""
    missed = ~(np.asarray(ttft_ms, dtype=float) <= target_ms)

    def means(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
        rows = list(rows)
        return {k: float(np.nanmean([r[k] for r in rows])) if rows else math.nan for k in TTFT_PARTS}

    return {
        "all": means(parts),
        "missed": means(p for p, m in zip(parts, missed, strict=True) if m),
        "num_missed": int(missed.sum()),
    }


def fewest_meeting(met_by_size: Mapping[int, float], target: float) -> int | None:
    """The fewest workers whose attainment is at least `target`, provided every larger size measured meets it too
    (a size that meets it only by chance below a failing one does not count); None if the largest fails."""
    answer = None
    for size in sorted(met_by_size, reverse=True):
        if met_by_size[size] + 1e-12 < target:
            break
        answer = size
    return answer


def spread(values: Sequence[float]) -> float:
    """Largest over mean of per-engine totals (1.0: perfectly even); NaN without any."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else math.nan


def dynamo_window(
    bridge: ReplayBridge,
    sub: RequestTrace,
    own: slice,
    *,
    size: tuple[int, int],
    router: str,
    max_kv_tokens: int,
    target_ms: float,
    workdir: Path,
) -> dict[str, Any]:
    """`sub` replayed at `size` in Dynamo's engine with `router`; figures for the requests of `own` (indices of
    `sub`)."""
    path, report = workdir / "window.jsonl", workdir / f"report-{router}-{size[0]}-{size[1]}.jsonl"
    shift_s = write_replay_trace(sub, path)
    job = {
        "trace": str(path), "num_prefill": size[0], "num_decode": size[1], "startup_s": 0.0,
        "out": str(workdir / "out.json"), "policy": {"kind": "fixed"}, "router": router,
        "engine": {"num_gpu_blocks": max_kv_tokens // 64, "block_size": 64}, "report_jsonl": str(report),
    }  # fmt: skip
    started = time.perf_counter()
    bridge.run(job)
    wall_s = time.perf_counter() - started
    records = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines() if line.strip()]
    records.sort(key=lambda r: float(r["arrival_time_ms"]))
    start_ms = (float(sub.arrival_s[own.start]) - shift_s) * 1000.0
    end_ms = (float(sub.arrival_s[own.stop - 1]) - shift_s) * 1000.0
    window = [r for r in records if start_ms - 1e-6 <= float(r["arrival_time_ms"]) <= end_ms + 1e-6]
    ttft = np.array([float(r["ttft_ms"]) if r.get("ttft_ms") is not None else math.nan for r in window])
    parts = [ttft_parts(r) for r in window]
    tokens = np.zeros(size[0])
    for r in window:
        tokens[int(r["prefill_worker_idx"])] += int(r["input_length"])
    return {
        **ttft_stats(ttft, target_ms),
        "parts": parts_summary(parts, ttft, target_ms),
        "prefill_token_spread": spread(tokens.tolist()),
        "wall_s": wall_s,
    }


def sim_window(
    sub: RequestTrace,
    own: slice,
    *,
    size: tuple[int, int],
    router: RouterPolicy,
    spec: SimSpec,
    fwd: ForwardPassModel,
    target_ms: float,
) -> dict[str, Any]:
    """`sub` served at `size` by our simulator with `router`; figures for the requests of `own`."""
    started = time.perf_counter()
    sim = ClusterSimulator(sub, fwd, SimSpec(**{**_spec_fields(spec), "router": router}), num_prefill=size[0],
                           num_decode=size[1])  # fmt: skip
    sim.run_to_completion(grace_s=3600.0)
    ttft = sim.result().ttft_s[own] * 1000.0
    return {**ttft_stats(ttft, target_ms), "wall_s": time.perf_counter() - started}


class SlowerPrefill:
    """An engine model whose prefill iterations take `factor` times as long (decode unchanged): our simulator
    with Dynamo's measured prefill throughput, to tell a capacity difference from a scheduling one."""

    def __init__(self, fwd: ForwardPassModel, factor: float) -> None:
        self._fwd, self.factor = fwd, factor

    def is_ready(self) -> bool:
        return self._fwd.is_ready()

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return self.factor * self._fwd.prefill_wall_s(prefill_tokens)

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self._fwd.decode_wall_s(num_decode_requests, decode_kv_tokens)

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self._fwd.mixed_wall_s(prefill_tokens, num_decode_requests, decode_kv_tokens)


def burst_of(sub: RequestTrace, own: slice) -> RequestTrace:
    """The requests of `own` all arriving at once, each with one output token: what a prefill engine computes
    flat out on the window's own prompt mix."""
    count = own.stop - own.start
    return dataclasses.replace(
        _sub_trace(sub, own), arrival_s=np.zeros(count), osl=np.ones(count, dtype=np.asarray(sub.osl).dtype)
    )


def flat_out(
    burst: RequestTrace,
    *,
    bridge: ReplayBridge | None,
    spec: SimSpec,
    fwd: ForwardPassModel,
    max_kv_tokens: int,
    workdir: Path | None,
) -> dict[str, float]:
    """Prompt tokens per second one prefill engine computes on `burst` (everything queued at 0), in our simulator
    and (with a bridge) in Dynamo's engine; decode has `FLAT_OUT_DECODE` engines so that it never holds prefill
    back. Dynamo: tokens over the last prompt's KV being held; ours: over the last first token (one decode
    iteration later)."""
    tokens = float(np.sum(burst.isl))
    sim = ClusterSimulator(burst, fwd, spec, num_prefill=1, num_decode=FLAT_OUT_DECODE)
    sim.run_to_completion(grace_s=24 * 3600.0)
    out = {"sim_tok_s": tokens / float(np.nanmax(sim.result().ttft_s))}
    if bridge is not None and workdir is not None:
        path, report = workdir / "burst.jsonl", workdir / "burst-report.jsonl"
        write_replay_trace(burst, path)
        bridge.run({
            "trace": str(path), "num_prefill": 1, "num_decode": FLAT_OUT_DECODE, "startup_s": 0.0,
            "out": str(workdir / "out.json"), "policy": {"kind": "fixed"},
            "engine": {"num_gpu_blocks": max_kv_tokens // 64, "block_size": 64}, "report_jsonl": str(report),
        })  # fmt: skip
        held = [json.loads(line)["source_held_ms"] for line in report.read_text(encoding="utf-8").splitlines() if line]
        out["dynamo_tok_s"] = tokens / (max(float(h) for h in held if h is not None) / 1000.0)
    return out


def policy_runs(
    trace: RequestTrace,
    *,
    policy: str,
    ttft_ms: float,
    itl_ms: float,
    slowdown: float,
    window_s: float = 180.0,
    startup_s: float = 120.0,
) -> list[dict[str, Any]]:
    """`policy` over the whole trace on our simulator, as `planner bench` runs it (least-loaded router, our engine
    model), then with the router Dynamo's replay runs (round robin) and/or every prefill iteration `slowdown` times
    as long: the policy decides with our engine model throughout (as on Dynamo's engine); only the engines
    serving it change. Rows: router, slowdown, TTFT attainment, GPU-hours."""
    from planner_core.lab.sim.bench import build_policies, run_bench
    from planner_core.lab.sim.benchmark import MAX_REPLICAS_PER_STEP

    perf = ProfilePerfModel.load(H200_PROFILE_DIR)
    fwd = perf.forward_pass_model()
    max_kv_tokens = perf.profiled_max_kv_tokens() or FALLBACK_MAX_KV_TOKENS
    spec = SimSpec(prefill_limits=EngineLimits(), decode_limits=EngineLimits(max_kv_tokens=max_kv_tokens),
                   startup_s=startup_s)  # fmt: skip
    # the scenario `benchmark` gives the planners (planner_core.lab.sim.benchmark), for H200 engines of one GPU
    base = {
        "ttft_ms": ttft_ms, "itl_ms": itl_ms, "max_gpu_budget": -1, "throughput_adjustment_interval_seconds": window_s,
        "max_throughput_scaling_replicas": MAX_REPLICAS_PER_STEP, "prefill_engine_num_gpu": 1,
        "decode_engine_num_gpu": 1, "router": RouterPolicy.LEAST_LOADED.value,
        "ttft_dispatch_threshold": 1.0, "tpot_dispatch_threshold": 1.0,
    }  # fmt: skip
    rows = []
    for router in (RouterPolicy.LEAST_LOADED, RouterPolicy.ROUND_ROBIN):
        for factor in (1.0, slowdown):
            built = build_policies([policy], base, trace, perf, fwd, spec, window_s=window_s)
            engines = SimSpec(**{**_spec_fields(spec), "router": router})
            model = fwd if factor == 1.0 else SlowerPrefill(fwd, factor)
            run = run_bench(built, trace, model, engines, ttft_ms=ttft_ms, itl_ms=itl_ms)[0]
            rows.append({"router": router.value, "prefill_slowdown": factor, "ttft_met": run.row.ttft_attainment,
                         "sla_met": run.row.sla_attainment, "gpu_hours": run.row.gpu_hours})  # fmt: skip
            print(
                f"{policy} on our simulator, router {router.value:12} prefill x{factor:.3f}: TTFT met "
                f"{run.row.ttft_attainment:.2%}, SLA met {run.row.sla_attainment:.2%}, {run.row.gpu_hours:.2f} GPU-h"
            )
    return rows


def _spec_fields(spec: SimSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def parse_sizes(text: str) -> list[int]:
    """`4-9` or `5,7,9` as a sorted list of sizes."""
    sizes: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        sizes.update(range(int(low), int(high or low) + 1))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--prefill: {text!r} names no size >= 1")
    return sorted(sizes)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.prefill)

    trace = load_trace(Path(TRACES.get(args.trace, args.trace)))
    if args.rate_scale != 1.0:
        trace = trace.scaled(args.rate_scale)
    start_s, end_s = args.window * args.window_s, (args.window + 1) * args.window_s
    own = trace.window(start_s, end_s)
    if own.stop <= own.start:
        parser.error(f"--window {args.window}: no request in [{start_s:g}, {end_s:g}) s")
    span = trace.window(start_s - args.context_s, end_s + args.context_s)
    sub = _sub_trace(trace, span)
    mine = slice(own.start - span.start, own.stop - span.start)
    perf = ProfilePerfModel.load(H200_PROFILE_DIR)
    fwd = perf.forward_pass_model()
    max_kv_tokens = perf.profiled_max_kv_tokens() or FALLBACK_MAX_KV_TOKENS
    spec = SimSpec(prefill_limits=EngineLimits(), decode_limits=EngineLimits(max_kv_tokens=max_kv_tokens),
                   startup_s=0.0)  # fmt: skip
    window = _window_summary(args, trace, own, start_s, end_s, spec, fwd)
    runs: list[dict[str, Any]] = []
    dynamo_routers = [r for r in args.dynamo_routers.split(",") if r]
    bridge = ReplayBridge(args.dynamo_python) if dynamo_routers else None
    try:
        with tempfile.TemporaryDirectory(prefix="ttft-gap-") as folder:
            capacity = flat_out(burst_of(sub, mine), bridge=bridge, spec=spec, fwd=fwd, max_kv_tokens=max_kv_tokens,
                                workdir=Path(folder))  # fmt: skip
            window["flat_out_tok_s"] = capacity
            rates = [f"{k[:-6]} {v:.0f} tok/s = {v / window['isl_mean']:.1f} req/s" for k, v in capacity.items()]
            print("one prefill engine flat out on the window's prompts (all queued at once): " + ", ".join(rates))
            header = f"{'engine':9} {'router':12} {'P/D':>5} {'met':>7} {'p50':>6} {'p90':>6} {'p99':>6}"
            print(header + "   mean ms all: queue prefill handoff step | missed: queue prefill handoff step  spread")
            # our simulator as it is, then (with Dynamo measured) with its prefill iterations as slow as Dynamo's
            slowdowns = {"sim": 1.0}
            if "dynamo_tok_s" in capacity:
                slowdowns["sim-slow"] = capacity["sim_tok_s"] / capacity["dynamo_tok_s"]
                print(f"(sim-slow: our simulator with every prefill iteration x{slowdowns['sim-slow']:.3f})")
            for engine, factor in slowdowns.items():
                model = fwd if factor == 1.0 else SlowerPrefill(fwd, factor)
                for router in [r for r in args.sim_routers.split(",") if r]:
                    for p in sizes:
                        row = sim_window(sub, mine, size=(p, args.decode), router=RouterPolicy(router), spec=spec,
                                         fwd=model, target_ms=args.ttft_ms)  # fmt: skip
                        runs.append({"engine": engine, "router": router, "num_prefill": p, "num_decode": args.decode,
                                     "prefill_slowdown": factor, **row})  # fmt: skip
                        _print_row(runs[-1])
            for router in dynamo_routers:
                assert bridge is not None
                for p in sizes:
                    row = dynamo_window(bridge, sub, mine, size=(p, args.decode), router=router,
                                        max_kv_tokens=max_kv_tokens, target_ms=args.ttft_ms,
                                        workdir=Path(folder))  # fmt: skip
                    runs.append({"engine": "dynamo", "router": router, "num_prefill": p, "num_decode": args.decode,
                                 **row})  # fmt: skip
                    _print_row(runs[-1])
    finally:
        if bridge is not None:
            bridge.close()
    needed = _fewest_needed(runs, window, target=args.target, ttft_ms=args.ttft_ms)
    whole = []
    if args.policy:
        slowdown = capacity["sim_tok_s"] / capacity.get("dynamo_tok_s", capacity["sim_tok_s"])
        whole = policy_runs(trace, policy=args.policy, ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, slowdown=slowdown,
                            window_s=args.window_s)  # fmt: skip
    if args.json is not None:
        result = {"window": window, "runs": runs, "fewest_prefill": needed, "policy_runs": whole}
        args.json.write_text(json.dumps(result, indent=1) + "\n",
                             encoding="utf-8")  # fmt: skip
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m planner_core.lab.ttft_gap", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", default="code", help="code, conv, mooncake or a trace file")
    parser.add_argument("--rate-scale", type=float, default=4.0)
    parser.add_argument("--ttft-ms", type=float, default=500.0)
    parser.add_argument("--window", type=int, default=9, help="window index (windows of --window-s from 0)")
    parser.add_argument("--window-s", type=float, default=180.0)
    parser.add_argument("--context-s", type=float, default=60.0, help="replayed before and after the window")
    parser.add_argument("--prefill", default="4-9", help="prefill sizes: 4-9 or 5,7")
    parser.add_argument("--decode", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.99, help="attainment a size must reach")
    parser.add_argument("--dynamo-routers", default="round_robin,kv_router")
    parser.add_argument("--sim-routers", default="least_loaded,round_robin")
    parser.add_argument("--dynamo-python", default=None)
    parser.add_argument("--policy", default=None,
                        help="also run this bench policy (e.g. planner) over the whole trace on our simulator with "
                        "each router, at our prefill speed and at Dynamo's measured one")  # fmt: skip
    parser.add_argument("--itl-ms", type=float, default=50.0)
    parser.add_argument("--json", type=Path, default=None)
    return parser


def _window_summary(
    args: argparse.Namespace,
    trace: RequestTrace,
    own: slice,
    start_s: float,
    end_s: float,
    spec: SimSpec,
    fwd: ForwardPassModel,
) -> dict[str, Any]:
    """The window's figures (requests, rate, ISL, prompt tokens/s, our prefill engine flat out), printed."""
    isl = np.asarray(trace.isl[own], dtype=float)
    window = {
        "trace": args.trace, "rate_scale": args.rate_scale, "index": args.window, "start_s": start_s,
        "end_s": end_s, "num_requests": own.stop - own.start, "rate_rps": (own.stop - own.start) / args.window_s,
        "isl_mean": float(isl.mean()), "isl_p90": float(np.percentile(isl, 90)),
        "isl_p99": float(np.percentile(isl, 99)),
        "prompt_tok_s": float(isl.sum()) / args.window_s,
        # what one of our prefill engines computes flat out: full iterations of max_num_batched_tokens
        "sim_prefill_capacity_tok_s": spec.prefill_limits.max_num_batched_tokens
        / fwd.prefill_wall_s(spec.prefill_limits.max_num_batched_tokens),
    }  # fmt: skip
    print(f"window {args.window} [{start_s:g}, {end_s:g}) s: {window['num_requests']} requests, "
          f"{window['rate_rps']:.2f} req/s, ISL mean {window['isl_mean']:.0f} p90 {window['isl_p90']:.0f} p99 "
          f"{window['isl_p99']:.0f}, {window['prompt_tok_s']:.0f} prompt tok/s; our engine flat out "
          f"{window['sim_prefill_capacity_tok_s']:.0f} tok/s")  # fmt: skip
    return window


def _fewest_needed(
    runs: list[dict[str, Any]], window: Mapping[str, Any], *, target: float, ttft_ms: float
) -> dict[str, int | None]:
    """Per engine and router, the fewest prefill engines meeting `target` of the window within `ttft_ms`, printed."""
    needed = {}
    for engine, router in dict.fromkeys((r["engine"], r["router"]) for r in runs):
        met = {r["num_prefill"]: r["met"] for r in runs if (r["engine"], r["router"]) == (engine, router)}
        fewest = fewest_meeting(met, target)
        needed[f"{engine}/{router}"] = fewest
        rps = f"{window['rate_rps'] / fewest:.2f} req/s per engine at the window's mean rate" if fewest else "not met"
        print(f"fewest prefill meeting {target:.0%} of the window within {ttft_ms:g} ms: {engine}/{router}: "
              f"{fewest} ({rps})")  # fmt: skip
    return needed


def _print_row(row: Mapping[str, Any]) -> None:
    line = (f"{row['engine']:9} {row['router']:12} {row['num_prefill']:>2}/{row['num_decode']:<2} "
            f"{row['met'] * 100:6.2f}% {row['p50_ms']:6.0f} {row['p90_ms']:6.0f} {row['p99_ms']:6.0f}")  # fmt: skip
    parts = row.get("parts")
    if parts:
        line += "   " + " ".join(f"{parts['all'][k]:6.1f}" for k in TTFT_PARTS)
        line += " | " + " ".join(f"{parts['missed'][k]:6.1f}" for k in TTFT_PARTS)
        line += f"  {row['prefill_token_spread']:.2f}"
    print(line)


if __name__ == "__main__":
    raise SystemExit(main())
