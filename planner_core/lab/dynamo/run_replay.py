"""Serve one `planner bench --engine dynamo` run: Dynamo 1.6.1's offline replay with a scaling policy in its loop.

Runs with the Python of a separate virtualenv holding `ai-dynamo` (never the project's own: see README,
"Simulator fidelity"). The project's bench (`planner_core/lab/sim/dynamo_engine.py`) starts it once per policy run.
Dynamo's Rust replay (`dynamo._core.run_mocker_trace_replay`, the call behind `dynamo.replay.run_trace_replay`)
serves the trace on its mocker engines and calls the scaling policy object: `initial_tick_ms()` once, then
`on_tick(snapshot)` at each tick it asked for, which answers `{"target_prefill", "target_decode", "next_tick_ms"}`.

The policy, by the job's `policy.kind`:
- `fixed`: none (the pools keep their initial sizes);
- `dynamo`: Dynamo's own `ReplayPlannerAdapter`, built as `run_planner.py` builds it (beside this file);
- `remote`: the decisions come from the process that started this script, over line-delimited JSON on the
  script's standard output (out) and input (in): out `{"initial": true}`, in `{"next_tick_ms": t|null}`; then per
  tick out `{"tick": SNAPSHOT}` (the Rust replay's snapshot as it is, with its `now_ms`), in `{"target_prefill":
  n|null, "target_decode": n|null, "next_tick_ms": t|null}`.
The script serves one job after another: first line out `{"ready": true, "dynamo_version"}`, then per job one line
in, `{"run": JOB}`, answered by the policy's lines, if any, and at the end by `{"done": true, "out": PATH}`, PATH
holding `{"summary", "per_request", "lifecycle_operations", "engine", "wall_s"}`. Anything Dynamo prints goes to
standard error (the protocol keeps the original standard output to itself). Errors: one line on stderr starting
`run_replay:`, exit status 1.

Usage:
    DYNAMO_PY run_replay.py                   serve jobs from standard input until its end
    DYNAMO_PY run_replay.py --job JOB.json    one job

JOB: {"trace": Mooncake JSONL path, "num_prefill": n, "num_decode": n, "startup_s": s, "out": path,
"policy": {"kind": ..., "config": {...}, "capabilities": {...}} (config and capabilities for `dynamo`),
"profile": dir (optional), "engine": {"num_gpu_blocks": n, "block_size": n, ...} (optional mocker limits),
"router": "round_robin" | "kv_router" (optional), "report_jsonl": path (optional: Dynamo's per-request
timestamps, one JSON object a line)}.
"""

# ruff: noqa: T201 - a command-line script: its protocol is printed

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

_HERE = Path(__file__).resolve().parent
DEFAULT_PROFILE = str(_HERE.parents[1] / "data" / "profiles" / "H200_TP1P_TP1D")
DEFAULT_STUBS = str(_HERE / "stubs")
MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"
TRACE_BLOCK_TOKENS = 512  # Mooncake `hash_ids` blocks
_ENGINE_FLAGS = {
    "num_gpu_blocks": "--num-gpu-blocks-override",
    "block_size": "--block-size",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
}
_RECORD_FIELDS = ("arrival_time_ms", "input_length", "output_length", "ttft_ms", "itl_ms", "e2e_latency_ms")


class RemotePolicy:
    """A scaling policy whose every decision is asked of the parent process."""

    def __init__(self, out: IO[str], into: IO[str]) -> None:
        self._out, self._in = out, into
        self.num_ticks = 0

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self._out.write(json.dumps(message, default=_plain) + "\n")
        self._out.flush()
        line = self._in.readline()
        if not line:
            raise RuntimeError("the bench closed the protocol mid-run")
        return json.loads(line)

    def initial_tick_ms(self) -> float | None:
        return self._ask({"initial": True}).get("next_tick_ms")

    def on_tick(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        self.num_ticks += 1
        answer = self._ask({"tick": snapshot})
        return {key: answer.get(key) for key in ("target_prefill", "target_decode", "next_tick_ms")}


def _plain(value: Any) -> Any:
    """What json cannot write natively, from the Rust snapshot (ids as strings, sequences as lists)."""
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def engine_args(mode: str, job: dict[str, Any], keep_alive: list[Any]) -> dict[str, Any]:
    """Mocker engine arguments for a role, from Dynamo's own argument parser (as `run_mocker.py` builds them)."""
    from dynamo.mocker.args import parse_args, resolve_planner_profile_data
    from dynamo.mocker.config import build_mocker_engine_args

    profile = job.get("profile") or DEFAULT_PROFILE
    flags = ["--model-path", MODEL, "--disaggregation-mode", mode, "--planner-profile-data", profile]
    if float(job.get("startup_s") or 0.0) > 0:
        flags += ["--startup-time", str(float(job["startup_s"]))]
    for name, flag in _ENGINE_FLAGS.items():
        value = (job.get("engine") or {}).get(name)
        if value is not None:
            flags += [flag, str(value)]
    namespace = parse_args(flags)
    resolved = resolve_planner_profile_data(namespace.planner_profile_data)
    keep_alive.append(resolved)  # the converted profile lives in a temporary directory this object owns
    namespace.planner_profile_data = resolved.npz_path
    return build_mocker_engine_args(namespace)


def run_job(job: dict[str, Any], protocol: IO[str], engines: dict[Any, tuple[dict, dict]]) -> dict[str, Any]:
    """One replay; its result file's content. `engines` caches the mocker engine arguments per set-up."""
    import run_planner  # beside this file: Dynamo's planner construction
    from dynamo._core import run_mocker_trace_replay

    key = (job.get("profile"), float(job.get("startup_s") or 0.0), json.dumps(job.get("engine") or {}, sort_keys=True))
    if key not in engines:
        keep_alive: list[Any] = []
        engines[key] = (engine_args("prefill", job, keep_alive), engine_args("decode", job, keep_alive), keep_alive)
    prefill_args, decode_args, _ = engines[key]
    kind = job["policy"]["kind"]
    server = None
    if kind == "fixed":
        policy: Any = None
    elif kind == "dynamo":
        server = run_planner.PlannerServer(
            job["policy"]["config"], job["policy"]["capabilities"], job.get("profile") or DEFAULT_PROFILE
        )
        policy = server._adapter  # Dynamo's ReplayPlannerAdapter, as its own replay drives it
    elif kind == "remote":
        policy = RemotePolicy(protocol, sys.stdin)
    else:
        raise ValueError(f"policy.kind: {kind!r} is none of fixed, dynamo, remote")
    started = time.perf_counter()
    try:
        native = run_mocker_trace_replay(
            [job["trace"]],
            prefill_engine_args=prefill_args,
            decode_engine_args=decode_args,
            num_prefill_workers=int(job["num_prefill"]),
            num_decode_workers=int(job["num_decode"]),
            router_mode=job.get("router", "round_robin"),
            arrival_speedup_ratio=1.0,
            trace_block_size=TRACE_BLOCK_TOKENS,
            trace_format="mooncake",
            capture_per_request=True,
            scaling_policy=policy,
            **({"report_jsonl_path": job["report_jsonl"]} if job.get("report_jsonl") else {}),
        )
    finally:
        if server is not None:
            server.close()
    engine = decode_args.get("engine", {})
    return {
        "summary": dict(native.summary),
        "per_request": [{k: record.get(k) for k in _RECORD_FIELDS} for record in native.per_request],
        "lifecycle_operations": list(getattr(native, "lifecycle_operations", None) or []),
        "engine": {k: engine.get(k) for k in ("block_size", "num_gpu_blocks", "max_num_seqs")},
        "wall_s": time.perf_counter() - started,
    }


def main(argv: list[str]) -> int:
    """Serve jobs: one `{"run": JOB}` line in at a time (each answered as the module docstring says, ending with
    its `done` line) until the end of input; or one job given with `--job FILE`."""
    if argv and (len(argv) != 2 or argv[0] != "--job"):
        print("usage: run_replay.py [--job JOB.json]", file=sys.stderr)
        return 2
    # The protocol keeps the original standard output; whatever Dynamo (Python or Rust) prints goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        sys.path.insert(0, DEFAULT_STUBS)
        sys.path.insert(0, str(_HERE))
        import aisimulate_core  # noqa: F401 - the stub must be importable before dynamo is
        import run_planner

        run_planner.install_perf_model_shim()
        from dynamo.planner import _version
        from dynamo.planner.offline import replay_adapter  # noqa: F401 - fail here, not mid-run
    except Exception as exc:  # one line for the caller, whatever failed
        print(f"run_replay: cannot import Dynamo: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    engines: dict[Any, tuple[dict, dict]] = {}
    jobs = [json.loads(Path(argv[1]).read_text(encoding="utf-8"))] if argv else None
    protocol.write(json.dumps({"ready": True, "dynamo_version": getattr(_version, "__version__", "unknown")}) + "\n")
    protocol.flush()
    while True:
        if jobs is not None:
            if not jobs:
                return 0
            job = jobs.pop()
        else:
            line = sys.stdin.readline()
            if not line:
                return 0
            if not line.strip():
                continue
            job = json.loads(line)["run"]
        try:
            result = run_job(job, protocol, engines)
            Path(job["out"]).write_text(json.dumps(result, default=_plain), encoding="utf-8")
        except Exception as exc:  # one line for the caller, whatever failed
            print(f"run_replay: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
            return 1
        protocol.write(json.dumps({"done": True, "out": job["out"]}) + "\n")
        protocol.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
