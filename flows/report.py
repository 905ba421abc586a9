"""The `planner-report` flow: write the diagnostics report of the last period and link it as a Prefect artifact.

Served every `report_interval_hours` (see `flows/serve.py`) and runnable on demand from the UI; the demo flow
uses the same task and artifact at its end. The report itself is built by `planner_core.runtime.report`.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from uuid import UUID

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.ticks import DEFAULT_CONFIG
from planner_core.config import load_config
from planner_core.runtime.report import ReportFile, generate_report, periodic_report_path
from planner_core.runtime.service import resolve_report_dir
from planner_core.runtime.settings import RuntimeSettings
from planner_core.runtime.store.db import resolve_database_url, session_factory
from planner_core.runtime.store.migrate import check_schema_current
from planner_core.runtime.times import parse_time


@task(name="write-report", cache_policy=NO_CACHE)
def write_report(
    deployment: str,
    out_path: Path,
    since: dt.datetime | None,
    until: dt.datetime | None,
    write_log: bool,
) -> ReportFile:
    """Build the report of `deployment`'s ticks in [since, until) and write it (atomically) to `out_path`.

    The database is `resolve_database_url()`'s, read here rather than passed: a task's arguments may be kept by
    Prefect, and the URL may hold a password."""
    with session_factory(resolve_database_url()).begin() as session:
        return generate_report(
            session,
            deployment,
            out_path,
            since=since,
            until=until,
            generated_at=dt.datetime.now(dt.UTC),
            write_log=write_log,
        )


def artifact_key(deployment: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes: one key per deployment's reports."""
    slug = re.sub(r"[^a-z0-9-]+", "-", deployment.lower()).strip("-") or "deployment"
    return f"planner-report-{slug}"


def report_markdown(written: ReportFile) -> str:
    """The artifact's body: a link to the page and its headline figures."""
    summary = written.summary
    path = written.path.resolve()

    def when(epoch_s: float | None) -> str:
        return "-" if epoch_s is None else dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")

    rows = [
        ("ticks", ", ".join(f"{n} {loop}" for loop, n in summary.num_ticks.items())),
        ("first / last tick", f"{when(summary.first_tick_s)} / {when(summary.last_tick_s)}"),
        ("decisions", ", ".join(f"{n} {status}" for status, n in summary.num_decisions.items()) or "none"),
        ("GPU-hours", f"{summary.gpu_hours:.2f}"),
        (
            "request forecast MAPE",
            "-" if summary.request_mape_pct is None else f"{summary.request_mape_pct:.1f}%",
        ),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    log = f"\n\nTick log: `{written.log_path.resolve()}`" if written.log_path else ""
    return (
        f"### Planner report: {summary.deployment}\n\n"
        f"[{path.name}]({path.as_uri()}) ({written.num_charts} charts)\n\n"
        f"| | |\n|---|---|\n{table}\n\nFile: `{path}`{log}\n"
    )


def publish_report(written: ReportFile) -> UUID:
    """A markdown artifact (keyed per deployment, so the UI keeps its history) linking the written report."""
    return create_markdown_artifact(
        key=artifact_key(written.summary.deployment),
        markdown=report_markdown(written),
        description=f"Planner diagnostics report for {written.summary.deployment}: {written.path.resolve()}",
    )


def report_window(
    since: str | None, until: str | None, interval_hours: float | None, default_until: dt.datetime
) -> tuple[dt.datetime | None, dt.datetime]:
    """[since, until): given bounds win; else until = `default_until` and since = until - interval (None = all).

    A bound may be a span (`7d`), counted back from `default_until` (the run's scheduled time).
    """
    end = parse_time(until, now=default_until, name="until") if until else default_until
    start = parse_time(since, now=default_until, name="since") if since else None
    if start is None and interval_hours is not None:
        start = end - dt.timedelta(hours=interval_hours)
    return start, end


@flow(name="planner-report", log_prints=False)
def planner_report(
    deployment: str = "default",
    config_path: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> dict:
    """Write the report of the period ending at the run's scheduled time (or [since, until)) and link it."""
    settings = RuntimeSettings()
    database_url = resolve_database_url(settings)
    check_schema_current(database_url)
    path = config_path or (str(settings.config) if settings.config else DEFAULT_CONFIG)
    service = load_config(path).service
    scheduled = flow_run.scheduled_start_time
    start, end = report_window(
        since, until, service.report_interval_hours, dt.datetime.fromtimestamp(scheduled.timestamp(), tz=dt.UTC)
    )
    out_dir = resolve_report_dir(service, Path(path), settings.data_dir).resolve()
    out_path = periodic_report_path(out_dir, end, service.report_filename, deployment=deployment)
    written = write_report(deployment, out_path, start, end, service.report_write_gzip_log)
    publish_report(written)
    return {"path": str(written.path), "num_charts": written.num_charts, "gpu_hours": written.summary.gpu_hours}
