"""The decision-core tests run on the pure core alone: no Postgres, no Prefect, no subprocess server, nothing
from the runtime, the lab, the flows or the CLI (the import contracts in pyproject.toml keep the core itself
pure; this keeps its tests so, which is what lets `make check` run them in seconds).

When a run collects only tests/core, the session fails at its end if any of those was imported on the way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CORE_TESTS = Path(__file__).resolve().parent
NOT_CORE = ("planner_core.runtime", "planner_core.lab", "flows", "planner_cli", "sqlalchemy", "psycopg", "prefect")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a core-only run that imported the runtime, the lab, the flows, the CLI or a database/orchestration
    package."""
    items = getattr(session, "items", [])
    if not items or not all(CORE_TESTS in item.path.parents for item in items):
        return
    imported = sorted(
        name for name in sys.modules if any(name == root or name.startswith(f"{root}.") for root in NOT_CORE)
    )
    if imported:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        names = ", ".join(imported[:8]) + (" ..." if len(imported) > 8 else "")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"tests/core imported what the decision core's tests must not need: {names}"
        reporter.write_line(message, red=True) if reporter else sys.stderr.write(message + "\n")
