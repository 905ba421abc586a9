"""The decision-core tests run on the pure core alone: no Postgres, no Prefect, no subprocess server, nothing
from the runtime, the lab, the flows or the CLI (the import contracts in pyproject.toml keep the core itself
pure; this keeps its tests so, which is what lets `make check` run them in about a minute).

When a run collects only tests/core, the session fails at its end if any of those was imported on the way (in
each pytest-xdist worker too: a worker hands what it found to the controller, which fails the run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

CORE_TESTS = Path(__file__).resolve().parent
NOT_CORE = ("planner_core.runtime", "planner_core.lab", "flows", "planner_cli", "sqlalchemy", "psycopg", "prefect")
# The store's JSON codec is pure (the domain's dataclasses to and from JSON, no database): the core's tests check
# with it that each state they build survives being stored, so it and the packages it sits in may be imported.
STORE_CODEC = ("planner_core.runtime", "planner_core.runtime.store", "planner_core.runtime.store.codec")
_FROM_WORKERS: list[str] = []  # on the xdist controller: what the workers found


def _not_core_imports(session: pytest.Session) -> list[str]:
    """The modules of NOT_CORE imported in this process, if it ran tests/core alone (else nothing)."""
    items = getattr(session, "items", [])
    if not items or not all(CORE_TESTS in item.path.parents for item in items):
        return []
    return sorted(
        name
        for name in sys.modules
        if name not in STORE_CODEC and any(name == root or name.startswith(f"{root}.") for root in NOT_CORE)
    )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # pytest-xdist's hook: a worker is done
    _FROM_WORKERS.extend(getattr(node, "workeroutput", {}).get("not_core_imports", []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a core-only run that imported the runtime, the lab, the flows, the CLI or a database/orchestration
    package."""
    imported = sorted(set(_not_core_imports(session)) | set(_FROM_WORKERS))
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller reports it
        workeroutput["not_core_imports"] = imported
        return
    if imported:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        names = ", ".join(imported[:8]) + (" ..." if len(imported) > 8 else "")
        message = f"tests/core imported what the decision core's tests must not need: {names}"
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(message, red=True) if reporter else sys.stderr.write(message + "\n")
