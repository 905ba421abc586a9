"""Replay over several processes: a recorded-states replay cut into contiguous tick ranges, one per process.

In `recorded` mode every tick starts from the state recorded before it, so the ticks of one range need nothing
from another's and the ranges can be replayed at the same time (a week of 5 s load ticks is CPU-bound Python,
one core per process). `chained` mode is not cut: each tick starts from the previous replayed tick's state.

The cuts keep the answer the one a single process gives: a range starts only at a tick whose previous tick has a
stored state (where `planner db prune` removed it, one process bridges the gap with the replayed state of that
tick, which a range starting there would not have). Every process reads the same snapshot of the history, the one
the calling replay holds (`pg_export_snapshot`), and the caller merges the ranges' results in tick order.

Processes are forked (Linux): they inherit the decision contexts already built (profiles, perf models) and their
imports, so a short replay does not pay for them again. A forked process never touches the connections it
inherits (`run_ranges`' worker opens its own engine and leaves the parent's pool alone; it ends by `os._exit`,
as multiprocessing's forked workers do, so no finaliser closes a connection it shares with the parent).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

# Fewer ticks than this per process and a part costs more than it saves: each process pays its fork, its
# connection and its first use of the predictors' libraries (statsmodels, ~1.5 s of CPU here): the demo's 58 ticks
# took 8.4-9.3 s in two processes and 6.0-7.8 s in one (2026-12-07, load average ~10).
MIN_TICKS_PER_JOB = 1000

# The first tick of each range at or after the candidate (by row position) whose previous tick has a stored state
# (or has none: the deployment's first tick), within the replayed range.
_RANGE_START_SQL = """
SELECT t.id FROM ticks t
 WHERE t.deployment_id = :deployment_id AND t.scheduled_at >= :start AND t.scheduled_at < :end
   AND t.id >= (SELECT c.id FROM ticks c
                 WHERE c.deployment_id = :deployment_id AND c.scheduled_at >= :start AND c.scheduled_at < :end
                 ORDER BY c.id OFFSET :position LIMIT 1)
   AND (t.previous_tick_id IS NULL
        OR EXISTS (SELECT 1 FROM planner_states s WHERE s.tick_id = t.previous_tick_id))
 ORDER BY t.id LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class TickRange:
    """Ticks `first_id`..`last_id` (ids, both included) of the replayed range, replayed by one process."""

    first_id: int
    last_id: int


def num_processes(jobs: int, total: int) -> int:
    """How many processes a replay of `total` ticks uses when allowed `jobs`: at most one per
    `MIN_TICKS_PER_JOB` ticks, at least one."""
    return max(1, min(jobs, total // MIN_TICKS_PER_JOB))


def tick_ranges(
    reader: Connection, range_params: dict[str, Any], first_id: int, last_id: int, total: int, parts: int
) -> list[TickRange]:
    """The replayed ticks cut into up to `parts` contiguous ranges of about equal counts (fewer when a cut finds
    no tick whose previous tick's state is stored before the next cut)."""
    starts = [first_id]
    for part in range(1, parts):
        start = reader.scalar(text(_RANGE_START_SQL), {**range_params, "position": part * total // parts})
        if start is not None and start > starts[-1]:
            starts.append(start)
    ends = [start - 1 for start in starts[1:]] + [last_id]
    return [TickRange(first, last) for first, last in zip(starts, ends, strict=True)]


# What a forked worker inherits from `run_ranges` (set by the pool's initializer, in the worker only).
_inherited: dict[str, Any] = {}


def _init_worker(shared: Any, progress: Any) -> None:
    _inherited["shared"], _inherited["progress"] = shared, progress


def _run_one(work: tuple[Callable[[Any, TickRange, Callable[[int], None]], Any], TickRange]) -> Any:
    replay_range, tick_range = work
    progress = _inherited["progress"]
    return replay_range(_inherited["shared"], tick_range, progress.put)


def run_ranges(
    replay_range: Callable[[Any, TickRange, Callable[[int], None]], Any],
    shared: Any,
    ranges: Sequence[TickRange],
    on_progress: Callable[[int], None],
) -> list[Any]:
    """`replay_range(shared, range, report)` for every range, each in a forked process, their results in the
    ranges' order. `shared` is inherited by the processes, never pickled (the decision contexts); `report(n)`,
    called in a process for every n ticks it did, reaches `on_progress(n)` here. A process's exception is raised
    here once the others are stopped."""
    context = multiprocessing.get_context("fork")
    progress = context.SimpleQueue()
    with context.Pool(len(ranges), initializer=_init_worker, initargs=(shared, progress)) as pool:
        pending = pool.map_async(_run_one, [(replay_range, r) for r in ranges], chunksize=1)
        while not pending.ready():
            pending.wait(0.2)
            while not progress.empty():
                on_progress(progress.get())
        results = pending.get()  # re-raises a worker's exception; the pool is terminated on the way out
        pool.close()  # done: the processes end on their own (`os._exit`) and are waited for
        pool.join()
    while not progress.empty():
        on_progress(progress.get())
    return results
