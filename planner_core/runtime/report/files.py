"""The report's files (the filesystem edge): the page and its tick log written atomically, the plotly.js copy beside
the reports, periodic report names, and `generate_report`, which ties loading, charts and page together."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from planner_core.domain import Loop
from planner_core.runtime.report.charts import build_charts
from planner_core.runtime.report.data import ReportData
from planner_core.runtime.report.load import load_report_data
from planner_core.runtime.report.page import plotly_js_name, render_html
from planner_core.runtime.report.series import ReportSummary, summarise


def _atomic_write(path: Path, payload: bytes) -> None:
    """Write next to `path` and rename over it: readers see the old file or the new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.chmod(temporary, 0o644)  # mkstemp makes it private; a report is meant to be read (and served)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, Loop):
        return value.value
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def tick_log(data: ReportData) -> bytes:
    """The tick rows as gzipped JSON lines (one per tick), next to the page for offline analysis."""
    lines = []
    for row in data.ticks:
        record = {
            k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dataclasses.asdict(row).items()
        }
        lines.append(json.dumps(record, default=_json_default, sort_keys=True))
    return gzip.compress(("\n".join(lines) + "\n").encode() if lines else b"", mtime=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFile:
    """A written report."""

    path: Path
    log_path: Path | None
    summary: ReportSummary
    num_charts: int


def log_path_for(path: Path) -> Path:
    """`<report>.log.jsonl.gz` next to `<report>.html`."""
    return path.with_name(path.name.removesuffix(".html") + ".log.jsonl.gz")


def report_file_slug(deployment: str) -> str:
    """A managed deployment's name as it goes into a file name: letters, digits, `.`, `_` and `-`, anything else
    (slashes, spaces) one `-`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", deployment).strip(".-") or "deployment"


def periodic_report_path(output_dir: Path, until: dt.datetime, filename: str | None = None, *, deployment: str) -> Path:
    """Where a periodic report of `deployment` goes: `filename` if configured (replaced each period; a
    `{deployment}` in it becomes the deployment's name), else
    `planner_report_<deployment>_<YYYYmmdd_HHMMSS>_<NNN>.html` stamped with the window's end (UTC), NNN the first
    free number. The name (`report_file_slug`) keeps deployments sharing a folder from overwriting each other."""
    slug = report_file_slug(deployment)
    if filename:
        return output_dir / filename.replace("{deployment}", slug)
    stamp = until.astimezone(dt.UTC).strftime("%Y%m%d_%H%M%S")
    number = 0
    while (output_dir / f"planner_report_{slug}_{stamp}_{number:03d}.html").exists():
        number += 1
    return output_dir / f"planner_report_{slug}_{stamp}_{number:03d}.html"


def write_plotly_js(folder: Path) -> Path:
    """plotly.js beside the reports of `folder` (`plotly_js_name()`), written once: a copy already there is kept."""
    from plotly.offline import get_plotlyjs

    path = folder / plotly_js_name()
    if not path.is_file():
        _atomic_write(path, get_plotlyjs().encode())
    return path


def generate_report(
    session: Session,
    deployment: str,
    out_path: Path,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    generated_at: dt.datetime,
    write_log: bool = False,
    self_contained: bool = False,
) -> ReportFile:
    """Load `deployment`'s ticks in [since, until), write the page to `out_path` (and its tick log if asked).

    The page loads plotly.js from the copy beside it (`write_plotly_js`, written once per folder); with
    `self_contained` it carries plotly.js itself instead (one file to move around, about 4.8 MB more).
    """
    data = load_report_data(session, deployment, since, until)
    charts = build_charts(data)
    plotly_src = None
    if not self_contained:
        plotly_src = write_plotly_js(out_path.parent).name
    page = render_html(data, generated_at=generated_at, charts=charts, plotly_src=plotly_src)
    log_path = log_path_for(out_path) if write_log else None
    if log_path is not None:
        _atomic_write(log_path, tick_log(data))
    _atomic_write(out_path, page.encode())
    return ReportFile(path=out_path, log_path=log_path, summary=summarise(data), num_charts=len(charts))
