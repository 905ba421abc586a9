# ruff: noqa: T201  (a benchmark script reports on stdout)
"""Benchmark (not a test): the bench matrix at 120 s and 600 s start-up, as recorded in `docs/results/startup/`.

Runs `planner bench` once per matrix row and start-up time, every policy of the default set (the baselines with the
oracle's search, Dynamo-style presets, the recommended policy), `oracle-seen`, `oracle-peak`, and the recommended
policy at each setting of its start-up horizon knob (`--horizon-quantiles`), and writes one record per run
(`--record`, with its date, command and commit), which the docs render on "Benchmark results". The records name
the commit as `git describe --dirty` sees it: run from a clean checkout (a worktree), where the records this run
writes are the only change (mark them `git update-index --assume-unchanged docs/results/startup/*.json` first, or
the later runs' commit reads `-dirty`).

    PYTHONPATH=$PWD .venv/bin/python -m planner_core.lab.startup.matrix --jobs 2

On a 2-core machine with `--jobs 2` the twelve runs took 21 minutes (2026-11-27; the conv rows take 6-8 minutes each).
`--rows code-x4-500-50,...` and `--startups 120` run a part; `--html DIR` also writes each run's page with the
knob's frontier.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from planner_core.lab.sim.bench import DEFAULT_POLICIES

REPO_ROOT = Path(__file__).resolve().parents[3]
TRACES = REPO_ROOT / "planner_core" / "data" / "traces"
# name: (trace file, rate scale, TTFT target ms, ITL target ms), the matrix of the README's benchmark table
MATRIX = {
    "code-x4-200-20": ("AzureLLMInferenceTrace_code.csv", 4, 200, 20),
    "code-x4-500-50": ("AzureLLMInferenceTrace_code.csv", 4, 500, 50),
    "conv-x12-200-20": ("AzureLLMInferenceTrace_conv.csv", 12, 200, 20),
    "conv-x12-500-50": ("AzureLLMInferenceTrace_conv.csv", 12, 500, 50),
    "mooncake-x2-200-20": ("synthetic_trace.jsonl", 2, 200, 20),
    "mooncake-x2-500-50": ("synthetic_trace.jsonl", 2, 500, 50),
}
STARTUPS_S = (120, 600)
HORIZON_QUANTILES = "0,0.5,0.75,0.9,0.95"
POLICIES = ",".join([*DEFAULT_POLICIES, "oracle-seen", "oracle-peak"])


def bench_command(row: str, startup_s: int, out_dir: Path, html_dir: Path | None) -> list[str]:
    trace, rate_scale, ttft_ms, itl_ms = MATRIX[row]
    name = f"{row}-s{startup_s}"
    command = [
        sys.executable, "-m", "planner_cli", "bench",
        "--trace", str((TRACES / trace).relative_to(REPO_ROOT)), "--rate-scale", str(rate_scale),
        "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--startup-s", str(startup_s),
        "--policies", POLICIES, "--horizon-quantiles", HORIZON_QUANTILES,
        "--record", os.path.relpath(out_dir / f"{name}.json", REPO_ROOT),
    ]  # fmt: skip
    if html_dir is not None:
        command += ["--html", os.path.relpath(html_dir / f"{name}.html", REPO_ROOT)]
    return command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(MATRIX), help="comma-separated matrix rows (default: all)")
    parser.add_argument("--startups", default=",".join(map(str, STARTUPS_S)), help="start-up times (s)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (each one is single-threaded)")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "docs" / "results" / "startup")
    parser.add_argument("--html", type=Path, default=None, help="also write each run's page into this folder")
    args = parser.parse_args()
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    unknown = [row for row in rows if row not in MATRIX]
    if unknown:
        parser.error(f"--rows: unknown row {unknown[0]!r} (known: {', '.join(MATRIX)})")
    startups = [int(value) for value in args.startups.split(",")]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.html is not None:
        args.html.mkdir(parents=True, exist_ok=True)
    runs = [(row, startup_s) for row in rows for startup_s in startups]
    started = time.monotonic()

    def run(item: tuple[str, int]) -> tuple[str, int, float]:
        row, startup_s = item
        begun = time.monotonic()
        command = bench_command(row, startup_s, args.out_dir, args.html)
        done = subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise SystemExit(f"{row} at {startup_s} s start-up: planner bench exited {done.returncode}: {last[0]}")
        return row, startup_s, time.monotonic() - begun

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run, item) for item in runs]
        for number, future in enumerate(as_completed(futures), start=1):
            row, startup_s, wall_s = future.result()
            elapsed_min = (time.monotonic() - started) / 60.0
            print(f"[{number}/{len(runs)}] {row}-s{startup_s}: {wall_s:.0f} s (elapsed {elapsed_min:.1f} min)")


if __name__ == "__main__":
    main()
