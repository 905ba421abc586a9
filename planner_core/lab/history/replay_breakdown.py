# ruff: noqa: T201  (a benchmark script reports on stdout)
"""Where a replay's time goes: `planner replay`'s own run, with the wall time of its parts measured.

    PYTHONPATH=$PWD .venv/bin/python -m planner_core.lab.history.replay_breakdown --deployment demo \\
        --from 2023-11-16 --to 2023-11-17 [--repeat 3]

Runs `planner_core.runtime.replay.replay` as the command does (recorded configs, recorded states; a replay run is
recorded like any other) and prints, per run, the total and the time spent in: the config's context (the profile
and the plugins, built once), decoding each tick's stored inputs and recorded state, the tick itself (`decide`),
and inside it the predictors' statsmodels work (the first call of which imports statsmodels: the KPSS test of the
first order choice), and the comparison; each as wall time and as the process's CPU time (on a shared machine the
wall time counts the other jobs too). The parts are measured by wrapping those functions for the run (a profiler
would slow the pure-Python parts several times and distort the shares); nothing else changes, and the replay still
reports every tick identical or not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Before numpy loads, as every planner command does (planner_cli.main).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# (module, attribute, label): the functions whose time is counted, as `replay` reaches them (an attribute
# `Class.method` is the method of that class of the module).
_PARTS = (
    ("planner_core.runtime.replay", "context_for_config", "config context (profile, plugins)"),
    ("planner_core.runtime.replay", "inputs_from_stored", "stored inputs decoded"),
    ("planner_core.runtime.replay", "_Comparer._recorded_state", "recorded states decoded"),
    ("planner_core.runtime.store.step_packing", "StepUnpacker.__call__", "recorded steps unpacked"),
    ("planner_core.runtime.replay", "decide", "ticks decided (decide)"),
    ("planner_core.predict.arima", "differencing", "  of which KPSS tests (the first imports statsmodels)"),
    ("planner_core.predict.arima", "fit_order", "  of which ARIMA fits (statsmodels)"),
    ("planner_core.runtime.replay", "_Comparer._compare", "outcomes and states compared"),
)


@contextmanager
def _timed(spent: dict[str, float], cpu: dict[str, float], calls: dict[str, int]) -> Iterator[None]:
    """Count the wall time, CPU time (of the process: on a shared machine the wall time counts the other jobs too)
    and calls of each `_PARTS` function while the block runs; restore them after."""
    import importlib

    originals: list[tuple[Any, str, Callable]] = []
    for module_name, path, label in _PARTS:
        owner = importlib.import_module(module_name)
        *classes, attribute = path.split(".")
        for name in classes:
            owner = getattr(owner, name)
        original = getattr(owner, attribute)

        def wrapper(*args: Any, _original: Callable = original, _label: str = label, **kwargs: Any) -> Any:
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - started
                cpu[_label] += time.process_time() - cpu_started
                calls[_label] += 1

        setattr(owner, attribute, wrapper)
        originals.append((owner, attribute, original))
    try:
        yield
    finally:
        for module, attribute, original in originals:
            setattr(module, attribute, original)


def main(argv: list[str] | None = None) -> int:
    from planner_core.data import DEFAULT_CONFIG
    from planner_core.runtime.replay import replay
    from planner_core.runtime.store.db import dispose_engines, resolve_database_url
    from planner_core.runtime.times import parse_time

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployment", required=True)
    parser.add_argument("--from", dest="start", required=True, help="ISO 8601 (naive = UTC)")
    parser.add_argument("--to", dest="end", required=True, help="ISO 8601 (naive = UTC), excluded")
    parser.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG.parent, help="the recorded config's folder")
    parser.add_argument("--profile-dir", type=Path, default=None, help="profile folder instead of the configs' own")
    parser.add_argument("--repeat", type=int, default=1, help="runs, each in this process (the first pays imports)")
    args = parser.parse_args(argv)
    now = dt.datetime.now(dt.UTC)
    start, end = parse_time(args.start, now=now), parse_time(args.end, now=now)
    url = resolve_database_url()
    for run in range(1, args.repeat + 1):
        spent: dict[str, float] = defaultdict(float)
        cpu: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        started, cpu_started = time.perf_counter(), time.process_time()
        with _timed(spent, cpu, calls):
            # one process (`jobs` 1): the parts are counted in this one
            summary = replay(
                url, args.deployment, start, end, recorded_config_dir=args.config_dir, profile_dir=args.profile_dir
            )
        total_s, total_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        print(
            f"run {run}: {summary.num_ticks} ticks ({summary.num_identical} identical, {summary.num_differing} "
            f"differing) in {total_s:.2f} s ({total_cpu_s:.2f} s of CPU, load average {os.getloadavg()[0]:.1f})"
        )
        for _, _, label in _PARTS:
            print(
                f"  {label:<54} {spent[label]:6.2f} s {cpu[label]:6.2f} s CPU {calls[label]:6d} calls "
                f"{100 * cpu[label] / total_cpu_s:5.1f} % of CPU"
            )
    dispose_engines()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
