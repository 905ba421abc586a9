"""The ingest's memory benchmark (planner_core/lab/ingest_memory.py), one short row: a real `planner ingest` flooded
while another session holds `fpm_samples` locked stays far under the bound the design promises."""

from __future__ import annotations

import os

from planner_core.lab.ingest_memory import DEPLOYMENT, measure
from planner_core.runtime.store.db import to_sqlalchemy_url

BOUND_MB = 300  # issue 43's bound for the locked table, any number of publishers


def test_a_flooded_ingest_with_its_table_locked_stays_bounded(database_url: str, tmp_path) -> None:
    """Two publishers, 4 s, a valid message and a 256 KiB frame in turn, the table locked throughout: the ingest
    kept receiving (valid messages counted), the 256 KiB frames never reached it (refused by ZeroMQ from their
    size header: no `oversized` drops), and its peak RSS stayed under the bound (before the bounded design it
    passed 1.4 GB in 20 s with one publisher)."""
    from planner_core.data import DEFAULT_CONFIG
    from planner_core.runtime.ingest import resolve_deployment_id

    url = to_sqlalchemy_url(database_url)
    resolve_deployment_id(url, DEPLOYMENT, DEFAULT_CONFIG)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PLANNER_")}
    env |= {"PLANNER_DATABASE_URL": url, "PLANNER_DATA_DIR": str(tmp_path / "data")}
    row = measure(2, True, 4.0, database_url, env)
    assert row["messages_sent"] > 1000, row
    assert "received 0," not in row["ingest"] and "oversized" not in row["ingest"], row
    assert row["peak_rss_mb"] < BOUND_MB, row
