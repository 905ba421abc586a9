"""The `replay-ticks` flow: `planner replay` as a Prefect deployment, run with parameters from the UI.

One task replays the range (`planner_core.runtime.replay.replay`) and keeps a progress artifact up to date, so the UI
shows how far it got; the result (counts and the first differences) is the flow's return value and a table
artifact. Results are also in `replay_runs` / `replay_ticks` (the run id is in the result).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from planner_core.runtime.replay import replay
from planner_core.runtime.store.db import resolve_database_url
from planner_core.runtime.store.models import ReplayMode
from planner_core.runtime.times import parse_time

MAX_DIFFERENCES_RETURNED = 100  # the full list is in replay_ticks


@task(name="replay-range", cache_policy=NO_CACHE)
def replay_range(
    deployment: str,
    start: dt.datetime,
    end: dt.datetime,
    config_path: str | None,
    config_dir: str | None,
    profile_dir: str | None,
    mode: ReplayMode | None,
) -> dict:
    """Replay the ticks in [start, end) and return the summary (see `ReplaySummary.to_json`).

    The database URL is resolved here, not passed in: a task's arguments may be kept by Prefect, and the URL may
    hold a password."""
    database_url = resolve_database_url()
    logger = get_run_logger()
    progress_id = create_progress_artifact(0.0, description=f"replay of {deployment}")
    reported = [0.0]

    def on_progress(done: int, total: int) -> None:
        percent = 100.0 * done / total if total else 100.0
        if percent - reported[0] >= 5.0 or done == total:  # an API call per 5 %, not per tick
            reported[0] = percent
            update_progress_artifact(progress_id, percent)
            logger.info("replayed %d of %d ticks", done, total)

    summary = replay(
        database_url,
        deployment,
        start,
        end,
        config_path=Path(config_path) if config_path else None,
        recorded_config_dir=Path(config_dir) if config_dir else None,
        profile_dir=Path(profile_dir) if profile_dir else None,
        mode=mode,
        on_progress=on_progress,
    )
    update_progress_artifact(progress_id, 100.0)
    result = summary.to_json()
    result["differences"] = result["differences"][:MAX_DIFFERENCES_RETURNED]
    create_table_artifact(
        [
            {
                "tick_id": d["tick_id"],
                "scheduled_at": d["scheduled_at"],
                "loop": d["loop"],
                "outcome": d["outcome"],
                "fields": ", ".join(f["field"] for f in d["fields"]) or d.get("detail", ""),
            }
            for d in result["differences"]
        ],
        description=(
            f"replay run {summary.run_id}: {summary.num_ticks} ticks, {summary.num_identical} identical, "
            f"{summary.num_differing} differing, {summary.num_skipped} skipped"
        ),
    )
    return result


@flow(name="replay-ticks", log_prints=False)
def replay_ticks(
    deployment: str,
    start: str,
    end: str = "0s",
    config_path: str | None = None,
    config_dir: str | None = None,
    profile_dir: str | None = None,
    mode: ReplayMode | None = None,
) -> dict:
    """Re-run a deployment's recorded ticks from their stored inputs and states; report what differs.

    Args:
        deployment: the managed deployment.
        start, end: scheduled-time range [start, end): ISO 8601 (naive = UTC) or a span back from now (`7d`).
        config_path: a what-if config file; empty replays each tick under its recorded config.
        config_dir: the folder the recorded config file was in (its relative paths are taken from there).
        profile_dir: a profile folder to use instead of the configs' `profile_results_dir`.
        mode: `recorded` (each tick from its recorded state) or `chained` (from the previous replayed tick);
            default recorded without a what-if config, chained with one.
    """
    now = dt.datetime.now(dt.UTC)
    return replay_range(
        deployment,
        parse_time(start, now=now, name="start"),
        parse_time(end, now=now, name="end"),
        config_path,
        config_dir,
        profile_dir,
        mode,
    )
