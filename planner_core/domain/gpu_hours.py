"""GPU-hours of recorded worker observations: the one definition the report, the metrics and the demo use."""

from __future__ import annotations

from collections.abc import Iterable


def cumulative_gpu_hours(observations: Iterable[tuple[float, int]]) -> list[tuple[float, float]]:
    """The GPU-hours of recorded worker observations, accumulated from the first to each later one.

    The one definition of "GPU-hours" that the report, the Prometheus metrics and `planner demo`'s summary use
    (the simulator's own `SimResult.gpu_s` is the exact integral of every worker it held, which an operator never
    observes): each observation `(at_s, gpus)` (epoch or offset seconds, in time order; GPUs of the ready
    workers then) holds until the next one, and nothing is counted before the first or after the last:
    `sum_i gpus_i * (at_{i+1} - at_i) / 3600`. Runs of equal counts are integrated as one interval, so the
    result depends only on where the count changed and on the last observation (the metrics exporter reads those
    rows alone and gets the report's figure exactly).

    Returns one (at_s, GPU-hours so far) point per observation, the first at 0.
    """
    points: list[tuple[float, float]] = []
    total_before_run_h = 0.0
    run_start_s = 0.0
    run_gpus = 0
    for at_s, gpus in observations:
        if not points:
            points.append((at_s, 0.0))
            run_start_s, run_gpus = at_s, gpus
            continue
        total_h = total_before_run_h + run_gpus * (at_s - run_start_s) / 3600.0
        points.append((at_s, total_h))
        if gpus != run_gpus:
            total_before_run_h, run_start_s, run_gpus = total_h, at_s, gpus
    return points


def gpu_hours(observations: Iterable[tuple[float, int]]) -> float:
    """The total of `cumulative_gpu_hours` (0 without at least two observations)."""
    points = cumulative_gpu_hours(observations)
    return points[-1][1] if points else 0.0
