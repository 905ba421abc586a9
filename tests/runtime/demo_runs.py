"""The demo flow run in-process for the runtime's tests, and the rows they compare (tests/runtime/test_flows.py,
tests/runtime/test_demo_recovery.py)."""

from __future__ import annotations

import os

import psycopg

from planner_core.runtime.store.db import to_libpq_uri


def rows(url: str, sql: str, *params):
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


def decisions(url: str, deployment: str):
    return rows(
        url,
        "SELECT decided_at, target_prefill, target_decode, status FROM decision_history "
        "WHERE deployment = %s ORDER BY decided_at",
        deployment,
    )


def run_demo(database_url, config, trace, deployment, max_windows, **parameters):
    """The demo flow on `database_url` (named by PLANNER_DATABASE_URL, as `planner demo` does: not a parameter);
    `parameters`: the flow's other parameters (report_dir, ...)."""
    from flows.demo import demo

    saved = os.environ.get("PLANNER_DATABASE_URL")
    os.environ["PLANNER_DATABASE_URL"] = database_url
    try:
        return demo(
            trace_path=str(trace),
            config_path=str(config),
            deployment=deployment,
            startup_s=120.0,
            rate_scale=12.0,
            max_windows=max_windows,
            **parameters,
        )
    finally:
        if saved is None:
            os.environ.pop("PLANNER_DATABASE_URL", None)
        else:
            os.environ["PLANNER_DATABASE_URL"] = saved


def has_ticks(url: str) -> bool:
    return bool(rows(url, "SELECT to_regclass('ticks') IS NOT NULL")[0][0])
