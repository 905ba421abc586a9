"""Our cluster simulator against Dynamo's mocker on the shared traces: mean and p90 TTFT and ITL side by side.

Run with the project's venv (the mocker runs in its own venv, through `dynamo/run_mocker.py` beside this file):

    .venv/bin/python -m planner_core.lab.compare_mocker [--dynamo-python PATH] \\
        [--runner planner_core/lab/dynamo/run_mocker.py] [--case conv:disagg:1:1:1 ...] [--json OUT.json] \\
        [--kv-allocation reserve|on_demand|both] [--kv-watermark F] [--recompute-after-handoffs] \\
        [--timing profile|regression|both] [--num-gpu-blocks N]

Both simulators serve the same requests: the Azure CSV traces are written as Mooncake JSONL with one fresh
512-token block id per prompt block (no prefix sharing, as the CSV has no content), the Mooncake trace is used as
it is (its `hash_ids` share prefixes); arrivals are compressed by the case's speed-up on both sides. Both use the
same profile and the same engine limits (the mocker's `max_num_seqs`, `max_num_batched_tokens`, block size, and
a KV capacity of the profile's `max_kv_tokens` rounded down to whole blocks), round-robin routing, prefix caching,
no KV transfer cost. Our simulator runs twice: with its own timing model (`ProfileForwardPassModel`, which
reproduces every profiled point) and with the mocker's (least-squares lines and planes through the profile's
points, as the mocker derives its tables from a profile), so a difference can be told apart as timing or
scheduling. ITL is per request (the mean gap after the first token; the mocker's `tpot`), averaged over requests.

`--kv-allocation` chooses how our decode and aggregated engines hold KV (`SimSpec.kv_allocation`: `reserve`, the
default, or `on_demand` with recompute preemption, or `both`, one column each); `--kv-watermark` is the headroom
fraction of `on_demand` admissions, and `--recompute-after-handoffs` has our decode engines admit transferred
requests before preempted ones (the mocker's order; `SimSpec.recompute_after_handoffs`). `--num-gpu-blocks N`
gives both simulators a smaller (or larger) cache than the profile's, e.g. to make KV bind; `--timing` keeps only
one of our two timing models.

A case is `TRACE:MODE:P:D:SPEEDUP` with TRACE one of conv, code, mooncake (or a path to a Mooncake JSONL file),
MODE disagg or agg (agg: D aggregated workers, P ignored).
"""

# ruff: noqa: T201 - a command-line script: printing is its output

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner_core.config import parse_config
from planner_core.data import AZURE_CODE_TRACE, AZURE_CONV_TRACE, H200_PROFILE_DIR, MOONCAKE_TRACE
from planner_core.domain import EngineLimits, OnlinePerfState
from planner_core.lab.sim.des import ClusterSimulator, KvAllocation, RouterPolicy, SimSpec
from planner_core.lab.sim.dynamo_policy import find_dynamo_python
from planner_core.perf.online import OnlineForwardPassModel, observe_fpm
from planner_core.perf.profile import EngineProfile, load_profile
from planner_core.perf.profile_forward import ProfileForwardPassModel, bootstrap_fpms
from planner_core.traces import RequestTrace, load_trace

DEFAULT_PROFILE = H200_PROFILE_DIR
TRACES = {"conv": AZURE_CONV_TRACE, "code": AZURE_CODE_TRACE, "mooncake": MOONCAKE_TRACE}
# Per trace: one prefill/decode pair at a light or moderate load, twice the GPUs at a higher rate, one pair close
# to saturation (TTFT in seconds), and aggregated engines.
DEFAULT_CASES = (
    "conv:disagg:1:1:1",
    "conv:disagg:2:2:8",
    "conv:disagg:1:1:5",
    "conv:agg:0:1:1",
    "conv:agg:0:2:4",
    "code:disagg:1:1:1",
    "code:disagg:2:2:2",
    "code:disagg:1:1:2",
    "code:agg:0:1:1",
    "mooncake:disagg:1:1:0.5",
    "mooncake:disagg:2:2:1",
    "mooncake:disagg:1:1:0.75",
    "mooncake:agg:0:2:0.5",
)
BLOCK_TOKENS = 512
METRICS = ("mean TTFT", "p90 TTFT", "mean ITL", "p90 ITL")


@dataclass(frozen=True, slots=True)
class Case:
    trace: str
    mode: str
    num_prefill: int
    num_decode: int
    speedup: float

    @classmethod
    def parse(cls, text: str) -> Case:
        try:
            trace, mode, prefill, decode, speedup = text.rsplit(":", 4)
            case = cls(trace, mode, int(prefill), int(decode), float(speedup))
        except ValueError as exc:
            raise SystemExit(f"--case {text!r}: expected TRACE:MODE:P:D:SPEEDUP ({exc})") from exc
        if case.mode not in ("disagg", "agg") or case.speedup <= 0 or case.num_decode < 1:
            raise SystemExit(f"--case {text!r}: MODE must be disagg or agg, D >= 1, SPEEDUP > 0")
        if case.mode == "disagg" and case.num_prefill < 1:
            raise SystemExit(f"--case {text!r}: a disaggregated case needs P >= 1")
        return case

    @property
    def label(self) -> str:
        size = f"{self.num_decode} agg" if self.mode == "agg" else f"{self.num_prefill}P{self.num_decode}D"
        return f"{Path(self.trace).stem if '/' in self.trace else self.trace} {size} x{self.speedup:g}"


class RegressionTiming:
    """The mocker's timing model built from a profile: a least-squares line of prefill TTFT over ISL and a plane
    of decode ITL over (batch, KV tokens), fitted on the profile's points as forward-pass metrics (the planner's
    online regressions, warm-started). A mixed iteration is the decode plane plus the prefill line."""

    def __init__(self, profile: EngineProfile) -> None:
        fpms = bootstrap_fpms(profile)
        config = parse_config({"max_num_fpm_samples": max(64, len(fpms)), "optimization_target": "sla"}).policy
        state = observe_fpm(OnlinePerfState(), fpms, config)
        self._prefill = OnlineForwardPassModel(state.prefill)
        self._decode = OnlineForwardPassModel(state.decode)

    def is_ready(self) -> bool:
        return True

    def prefill_wall_s(self, prefill_tokens: float) -> float:
        return self._prefill.prefill_wall_s(prefill_tokens)

    def decode_wall_s(self, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self._decode.decode_wall_s(num_decode_requests, decode_kv_tokens)

    def mixed_wall_s(self, prefill_tokens: float, num_decode_requests: float, decode_kv_tokens: float) -> float:
        return self.decode_wall_s(num_decode_requests, decode_kv_tokens) + self.prefill_wall_s(prefill_tokens)


def write_hashed_jsonl(trace: RequestTrace, path: Path) -> None:
    """A trace as Mooncake JSONL; prompts without block ids get fresh ones (ceil(ISL / 512) each)."""
    next_id = 0
    with path.open("w", encoding="utf-8") as handle:
        for index in range(trace.num_requests):
            isl, osl = int(trace.isl[index]), int(trace.osl[index])
            if trace.has_hashes:
                blocks = trace.request_hashes(index).tolist()
            else:
                count = max(1, math.ceil(isl / BLOCK_TOKENS))
                blocks = list(range(next_id, next_id + count))
                next_id += count
            stamp_ms = round(float(trace.arrival_s[index]) * 1000.0, 3)
            record = {"timestamp": stamp_ms, "input_length": isl, "output_length": osl, "hash_ids": blocks}
            handle.write(json.dumps(record) + "\n")


def trace_file(name: str, workdir: Path) -> Path:
    source = TRACES.get(name, Path(name))
    if source.suffix == ".jsonl":
        return source
    target = workdir / f"{source.stem}_hashed.jsonl"
    if not target.exists():
        write_hashed_jsonl(load_trace(source), target)
    return target


def run_mocker(args: argparse.Namespace, cases: list[Case], files: dict[str, Path], workdir: Path) -> list[dict]:
    specs = [
        {
            "trace": str(files[case.trace]),
            "mode": case.mode,
            "num_prefill": case.num_prefill,
            "num_decode": case.num_decode,
            "speedup": case.speedup,
        }
        for case in cases
    ]
    cases_path, out_path = workdir / "cases.json", workdir / "mocker.json"
    cases_path.write_text(json.dumps(specs))
    command = [
        args.dynamo_python,
        str(args.runner),
        "--cases",
        str(cases_path),
        "--out",
        str(out_path),
        "--profile",
        str(args.profile),
        "--num-gpu-blocks",
        str(args.num_gpu_blocks),
        "--block-size",
        str(args.block_size),
    ]
    if args.stubs:
        command += ["--stubs", args.stubs]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        tail = "\n".join(completed.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"{args.runner}: exit status {completed.returncode}\n{tail}")
    return json.loads(out_path.read_text())


def our_figures(result_ttft_s: np.ndarray, result_itl_s: np.ndarray) -> dict[str, float]:
    ttft = result_ttft_s[np.isfinite(result_ttft_s)] * 1000.0
    itl = result_itl_s[np.isfinite(result_itl_s)] * 1000.0
    return {
        "mean TTFT": float(ttft.mean()),
        "p90 TTFT": float(np.percentile(ttft, 90)),
        "mean ITL": float(itl.mean()),
        "p90 ITL": float(np.percentile(itl, 90)),
    }


def run_ours(
    case: Case,
    trace: RequestTrace,
    fwd,
    limits: EngineLimits,
    allocation: KvAllocation = KvAllocation.RESERVE,
    watermark: float = 0.01,
    recompute_after_handoffs: bool = False,
) -> tuple[dict[str, float], float]:
    spec = SimSpec(
        prefill_limits=limits,
        decode_limits=limits,
        router=RouterPolicy.ROUND_ROBIN,
        aggregated=case.mode == "agg",
        startup_s=0.0,
        kv_allocation=allocation,
        kv_watermark=watermark,
        recompute_after_handoffs=recompute_after_handoffs,
    )
    started = time.perf_counter()
    num_prefill = 0 if case.mode == "agg" else case.num_prefill
    sim = ClusterSimulator(
        trace.compressed(case.speedup), fwd, spec, num_prefill=num_prefill, num_decode=case.num_decode
    )
    sim.run_to_completion(grace_s=24 * 3600.0)
    result = sim.result()
    figures = our_figures(result.ttft_s, result.itl_s)
    figures["preemptions"] = float(result.num_preemptions)
    return figures, time.perf_counter() - started


def mocker_figures(summary: dict) -> dict[str, float]:
    figures = {
        "mean TTFT": float(summary["mean_ttft_ms"]),
        "p90 TTFT": float(summary["p90_ttft_ms"]),
        "mean ITL": float(summary["mean_tpot_ms"]),
        "p90 ITL": float(summary["p90_tpot_ms"]),
    }
    for key in ("preemptions", "num_preemptions", "num_preemptions_total", "preemptions_total"):
        if key in summary:
            figures["preemptions"] = float(summary[key])
    return figures


def relative(ours: float, theirs: float) -> float:
    return (ours - theirs) / theirs if theirs else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dynamo-python", help="python of the venv holding ai-dynamo (default: $DYNAMO_PYTHON, else make dynamo-env's)"
    )
    parser.add_argument("--runner", type=Path, default=Path(__file__).parent / "dynamo" / "run_mocker.py")
    parser.add_argument("--stubs", default=None, help="folder with the aisimulate_core stub (runner default if unset)")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--block-size", type=int, default=64, help="the mocker's KV block size (tokens)")
    parser.add_argument("--case", action="append", help="TRACE:MODE:P:D:SPEEDUP (repeatable; default: a matrix)")
    parser.add_argument("--workdir", type=Path, help="where converted traces go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    parser.add_argument(
        "--kv-allocation", choices=("reserve", "on_demand", "both"), default="reserve", help="our engines' KV holding"
    )
    parser.add_argument("--kv-watermark", type=float, default=0.01, help="on_demand admission headroom (fraction)")
    parser.add_argument(
        "--recompute-after-handoffs",
        action="store_true",
        help="on_demand: decode engines admit transferred requests before preempted ones (the mocker's order)",
    )
    parser.add_argument("--timing", choices=("profile", "regression", "both"), default="both", help="our timing models")
    parser.add_argument(
        "--num-gpu-blocks", type=int, help="KV blocks per engine on both sides (default: the profile's)"
    )
    args = parser.parse_args(argv)
    args.dynamo_python = find_dynamo_python(args.dynamo_python)
    if args.dynamo_python is None:
        raise SystemExit("no Dynamo interpreter: run `make dynamo-env`, or pass --dynamo-python PATH")

    cases = [Case.parse(text) for text in (args.case or DEFAULT_CASES)]
    profile = load_profile(args.profile)
    if args.num_gpu_blocks is None:
        # KV capacity: the profile's, in whole mocker blocks, for both simulators.
        args.num_gpu_blocks = profile.decode.max_kv_tokens // args.block_size
    elif args.num_gpu_blocks < 1:
        raise SystemExit(f"--num-gpu-blocks: must be >= 1, got {args.num_gpu_blocks}")
    models = {"profile": ProfileForwardPassModel.from_engine_profile, "regression": RegressionTiming}
    timing = {name: build(profile) for name, build in models.items() if args.timing in (name, "both")}
    allocations = [a for a in KvAllocation if args.kv_allocation in (a.value, "both")]

    with tempfile.TemporaryDirectory(prefix="compare-mocker-") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        files = {case.trace: trace_file(case.trace, workdir) for case in cases}
        started = time.perf_counter()
        mocker = run_mocker(args, cases, files, workdir)
        mocker_wall_s = time.perf_counter() - started
        traces = {name: load_trace(path) for name, path in files.items()}

        rows = []
        for case, peer in zip(cases, mocker, strict=True):
            engine = peer["engine"]
            limits = EngineLimits(
                max_num_batched_tokens=int(engine["max_num_batched_tokens"]),
                max_num_seqs=int(engine["max_num_seqs"]),
                max_kv_tokens=int(engine["num_gpu_blocks"]) * int(engine["block_size"]),
            )
            row = {"case": case.label, "mocker": mocker_figures(peer["summary"]), "engine": engine, "runs": []}
            for name, fwd in timing.items():
                for allocation in allocations:
                    label = name if allocation is KvAllocation.RESERVE else f"{name} {allocation.value}"
                    figures, wall_s = run_ours(
                        case,
                        traces[case.trace],
                        fwd,
                        limits,
                        allocation,
                        args.kv_watermark,
                        args.recompute_after_handoffs,
                    )
                    row["runs"].append({"label": label, "figures": figures, "wall_s": wall_s})
            rows.append(row)
            print_row(row)

    print(f"\nmocker: {mocker_wall_s:.1f} s for all cases (with its start-up and profile conversion)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


# Column titles of our runs: "profile" is our own timing model, "regression" the mocker's.
TITLES = {"profile": "ours", "regression": "ours, mocker timing"}


def print_row(row: dict) -> None:
    walls = ", ".join(f"{run['label']} {run['wall_s']:.1f} s" for run in row["runs"])
    print(f"\n{row['case']}   (ours: {walls})")
    titles = []
    for run in row["runs"]:
        name, _, allocation = run["label"].partition(" ")
        titles.append(TITLES[name] + (f", {allocation}" if allocation else ""))
    print(f"  {'ms':<12}{'mocker':>9}" + "".join(f"{title:>{max(9, len(title) + 2)}}{'diff':>8}" for title in titles))
    for metric in (*METRICS, "preemptions"):
        theirs = row["mocker"].get(metric, math.nan)
        line = f"  {metric:<12}{theirs:>9.1f}"
        for title, run in zip(titles, row["runs"], strict=True):
            ours = run["figures"].get(metric, math.nan)
            line += f"{ours:>{max(9, len(title) + 2)}.1f}{relative(ours, theirs):>+8.0%}"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
