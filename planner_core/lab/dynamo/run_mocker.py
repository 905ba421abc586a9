"""Run Dynamo's mocker (its offline trace replay) on traces at fixed pool sizes; print the summaries as JSON.

Runs with the Python of a separate virtualenv holding `ai-dynamo` (never the project's own: see README,
"Simulator fidelity"). Its only job is to drive the peer simulator for `planner_core/lab/compare_mocker.py`, which
runs with the project's venv and compares the figures with our simulator's.

Usage:
    DYNAMO_PY run_mocker.py TRACE.jsonl P D SPEEDUP TTFT_MS ITL_MS       one disaggregated case, summary on stdout
    DYNAMO_PY run_mocker.py --cases CASES.json [--out OUT.json]          several cases (below), one engine set-up

CASES.json is a list of objects: `trace` (Mooncake JSONL with `hash_ids`), `mode` ("disagg" or "agg"),
`num_prefill`, `num_decode` (agg: the number of aggregated workers), `speedup` (arrival compression),
optionally `per_request` (a path: per-request records are written there as JSONL). The output is a list of
`{"case": ..., "summary": ..., "engine": {...}}`, `engine` being the engine limits the mocker ran with.

Options: `--profile DIR` (a Dynamo profile directory; default the H200 Llama-3.1-8B-FP8 one), `--stubs DIR` (a
folder holding a stub `aisimulate_core` package, which the `ai-dynamo` wheel imports but which cannot be
installed here), `--num-gpu-blocks N` (KV blocks per engine; default: the mocker's own default),
`--block-size N`, `--max-num-seqs N`, `--max-num-batched-tokens N`, `--router round_robin|kv_router`.
"""

# ruff: noqa: T201 - a command-line script: printing is its output

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Found from this file, not imported: the script runs with the Dynamo environment's interpreter, which does not
# have this project installed. The shipped H200 profile and the stand-in `aisimulate_core` package.
_HERE = Path(__file__).resolve().parent
DEFAULT_PROFILE = str(_HERE.parents[1] / "data" / "profiles" / "H200_TP1P_TP1D")
DEFAULT_STUBS = str(_HERE / "stubs")
MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"
TRACE_BLOCK_TOKENS = 512  # Mooncake `hash_ids` blocks


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("legacy", nargs="*", help="TRACE P D SPEEDUP TTFT_MS ITL_MS (one disaggregated case)")
    parser.add_argument("--cases", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--stubs", default=DEFAULT_STUBS)
    parser.add_argument("--num-gpu-blocks", type=int)
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--router", default="round_robin", choices=("round_robin", "kv_router"))
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    sys.path.insert(0, args.stubs)
    import aisimulate_core  # noqa: F401 - the stub must be importable before dynamo is

    cases = _cases(args)
    if cases is None:
        print("usage: run_mocker.py TRACE P D SPEEDUP TTFT_MS ITL_MS | --cases FILE", file=sys.stderr)
        return 2
    keep_alive = []  # the converted profile lives in a temporary directory owned by these objects
    roles = {}
    if any(case["mode"] == "disagg" for case in cases):
        roles["prefill"], roles["decode"] = (
            _engine_args(args, "prefill", keep_alive),
            _engine_args(args, "decode", keep_alive),
        )
    if any(case["mode"] == "agg" for case in cases):
        roles["agg"] = _engine_args(args, "agg", keep_alive)
    results = [_run_case(args, case, roles) for case in cases]
    text = json.dumps(results if args.cases is not None else results[0]["summary"], default=str)
    if args.out is not None:
        args.out.write_text(text)
    else:
        print(text)
    return 0


def _cases(args: argparse.Namespace) -> list[dict] | None:
    """The cases to run: `--cases`, or the one disaggregated case of the positional arguments (None: malformed)."""
    if args.cases is not None:
        return json.loads(args.cases.read_text())
    if len(args.legacy) != 6:
        return None
    trace, p, d, speed, _ttft, _itl = args.legacy
    return [{"trace": trace, "mode": "disagg", "num_prefill": int(p), "num_decode": int(d), "speedup": float(speed)}]


def _engine_args(args: argparse.Namespace, mode: str, keep_alive: list) -> dict:
    """The mocker's engine arguments for one role (`prefill`, `decode` or `agg`) from the profile and the limits."""
    from dynamo.mocker.args import parse_args, resolve_planner_profile_data
    from dynamo.mocker.config import build_mocker_engine_args

    flags = ["--model-path", MODEL, "--disaggregation-mode", mode, "--planner-profile-data", args.profile]
    for flag, value in (
        ("--num-gpu-blocks-override", args.num_gpu_blocks),
        ("--block-size", args.block_size),
        ("--max-num-seqs", args.max_num_seqs),
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
    ):
        if value is not None:
            flags += [flag, str(value)]
    namespace = parse_args(flags)
    resolved = resolve_planner_profile_data(namespace.planner_profile_data)
    keep_alive.append(resolved)
    namespace.planner_profile_data = resolved.npz_path
    return build_mocker_engine_args(namespace)


def _run_case(args: argparse.Namespace, case: dict, roles: dict) -> dict:
    """Replay one case: its summary, the engine limits it ran with, and its per-request records if asked."""
    from dynamo.replay.api import run_trace_replay

    common = {
        "arrival_speedup_ratio": float(case["speedup"]),
        "trace_block_size": TRACE_BLOCK_TOKENS,
        "router_mode": args.router,
        "capture_per_request": bool(case.get("per_request")),
    }
    if case["mode"] == "disagg":
        report = run_trace_replay(
            [case["trace"]],
            num_prefill_workers=int(case["num_prefill"]),
            num_decode_workers=int(case["num_decode"]),
            prefill_engine_args=roles["prefill"],
            decode_engine_args=roles["decode"],
            **common,
        )
        engine = roles["decode"]["engine"]
    else:
        report = run_trace_replay(
            [case["trace"]], num_workers=int(case["num_decode"]), extra_engine_args=roles["agg"], **common
        )
        engine = roles["agg"]["engine"]
    summary = dict(report.summary)
    if case.get("per_request"):
        with open(case["per_request"], "w", encoding="utf-8") as handle:
            for record in report.per_request:
                keys = ("arrival_time_ms", "input_length", "output_length", "ttft_ms", "itl_ms", "e2e_latency_ms")
                extra = ("reused_input_tokens", "prefill_worker_idx", "decode_worker_idx", "decode_admit_ms")
                handle.write(json.dumps({k: record.get(k) for k in keys + extra}) + "\n")
    limits = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching")
    return {"case": case, "summary": summary, "engine": {k: engine.get(k) for k in limits}}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
