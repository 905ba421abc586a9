"""Measuring tool: per-step cost of each predictor on a real request trace. Not used by the planner.

A step is what one throughput tick spends on forecasting: `observe_window` (append the window, advance the
predictor's state) plus `predict_next`. Each predictor first observes `--history` windows of the trace (2,000 by
default), then `--steps` further windows are timed one by one with `time.perf_counter`; the median, p99 and maximum
are printed with the reasons the steps recorded.

    .venv/bin/python -m planner_core.lab.predictor_speed                      # every predictor, Azure conv, 1 s windows
    .venv/bin/python -m planner_core.lab.predictor_speed arima kalman+log1p --steps 100

A `+log1p` suffix turns `load_predictor_log1p` on. Timings depend on the machine's load: on a shared 2-core machine
run it with `OPENBLAS_NUM_THREADS=1` as well, since OpenBLAS worker threads competing for the cores make statsmodels
fits several times slower.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from planner_core.config import LoadPredictorName, parse_config
from planner_core.data import AZURE_CONV_TRACE
from planner_core.domain import LoadHistory
from planner_core.predict import observe_window, predict_next

DEFAULT_TRACE = AZURE_CONV_TRACE


def _percentile(values: list[float], fraction: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of a non-empty list."""
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per predictor; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [p.value for p in LoadPredictorName]
    parser.add_argument("predictors", nargs="*", default=names, help=f"{names}, optionally with a +log1p suffix")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure CSV or Mooncake JSONL trace")
    parser.add_argument("--window-s", type=float, default=1.0, help="throughput window length (s)")
    parser.add_argument("--history", type=int, default=2000, help="windows observed before timing")
    parser.add_argument("--steps", type=int, default=200, help="windows timed")
    args = parser.parse_args(argv)

    from planner_core.traces import load_trace  # reads files: only when the tool runs

    trace = load_trace(args.trace)
    windows = [trace.observe(i * args.window_s, (i + 1) * args.window_s) for i in range(args.history + args.steps)]
    sys.stdout.write(
        f"{trace.source}: {args.history} windows of {args.window_s:g} s observed, then {args.steps} timed\n"
    )
    for name in args.predictors:
        predictor, _, option = name.partition("+")
        config = parse_config(
            {
                "load_predictor": predictor,
                "load_predictor_log1p": option == "log1p",
                "throughput_adjustment_interval_seconds": args.window_s,
            }
        ).policy
        history = LoadHistory()
        for window in windows[: args.history]:
            history, _ = observe_window(history, window, config)
        costs_ms: list[float] = []
        reasons: Counter[str] = Counter()
        for window in windows[args.history :]:
            start = time.perf_counter()
            history, _ = observe_window(history, window, config)
            _, step = predict_next(history, config)
            costs_ms.append((time.perf_counter() - start) * 1000.0)
            reasons[step.reason.value] += 1
        sys.stdout.write(
            f"{name:16s} median {statistics.median(costs_ms):8.2f} ms   p99 {_percentile(costs_ms, 0.99):8.2f} ms"
            f"   max {max(costs_ms):8.2f} ms   {dict(reasons)}\n"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
