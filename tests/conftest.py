"""Shared fixtures: a real Postgres server per test session and a fresh migrated database per test.

Server: `TEST_DATABASE_URL` if set, else an embedded pgserver under a short temporary directory. Each test
that asks for `database_url` gets its own database cloned from a migrated template (~50 ms), so tests never
see each other's rows and nothing has to be cleaned up with DELETE.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings

from planner_core.data import AZURE_CONV_TRACE, H200_PROFILE_DIR
from planner_core.runtime.store.db import to_libpq_uri, to_sqlalchemy_url

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILE_DIR = H200_PROFILE_DIR
AZURE_CONV = AZURE_CONV_TRACE
TEMPLATE_DB = "planner_template"

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")  # no log shipping to a server that may be gone

# Property tests: `make test` draws the same examples on every run (`derandomize`), so a red run reproduces and a
# submission is judged on a fixed set; `make explore` draws fresh ones (and keeps what fails in .hypothesis/ to
# replay), which is how new counterexamples are found, to be pinned with `@example` once fixed.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("PLANNER_HYPOTHESIS_PROFILE", "fixed"))


# The test files that take longest (a minute or more each in CI's `--durations`), collected first: `make test` runs
# pytest on two workers that take a whole file at a time in collection order (`--dist loadfile
# --no-loadscope-reorder`), and starting with the longest keeps one worker from ending the run alone on a
# two-minute file while the other is idle. Longest first, roughly.
LONGEST_TEST_FILES = (
    "test_flows.py",
    "test_secrets.py",
    "test_chaos.py",
    "test_dynamo_policy.py",
    "test_hardening.py",
    "test_dynamo_engine.py",
    "test_install.py",
    "test_cli.py",
    "test_ttft_gap.py",
    "test_live_stack.py",
    "test_execution_listener.py",
    "test_workload_connector.py",
    "test_predictors.py",
    "test_recommended_policy.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests of LONGEST_TEST_FILES to the front, in that order; the rest keep their order."""
    rank = {name: k for k, name in enumerate(LONGEST_TEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def _with_database(url: str, name: str) -> str:
    """Replace the database name in a libpq URI (keeps the ?host=... socket query)."""
    base, _, query = url.partition("?")
    scheme_host = base.rsplit("/", 1)[0]
    return f"{scheme_host}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """libpq URI of the maintenance database of a real Postgres server."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield to_libpq_uri(to_sqlalchemy_url(external))
        return
    import pgserver

    pg_dir = tempfile.mkdtemp(prefix="pgt", dir="/tmp")  # short path: unix socket paths are limited
    server = pgserver.get_server(pg_dir, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def template_database(postgres_server_url: str) -> str:
    """A database migrated to head, used as the template of every test database."""
    from planner_core.runtime.store.migrate import upgrade

    with psycopg.connect(postgres_server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    template_url = _with_database(postgres_server_url, TEMPLATE_DB)
    upgrade(to_sqlalchemy_url(template_url))
    from planner_core.runtime.store.db import get_engine

    get_engine(to_sqlalchemy_url(template_url)).dispose()  # a template must have no open connections
    return TEMPLATE_DB


def create_database(server_url: str, template: str | None = None) -> str:
    """Create an empty (or templated) database and return its SQLAlchemy URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return to_sqlalchemy_url(_with_database(server_url, name))


def release_connections(url: str) -> None:
    """Close this process's pooled connections to a test's database: the engines are cached per URL for the
    process (`get_engine`), so without this every test database keeps its idle connections open until the session
    ends, and a long suite runs into the server's `max_connections`."""
    from planner_core.runtime.store.db import get_engine

    get_engine(url).dispose()


@pytest.fixture
def database_url(postgres_server_url: str, template_database: str) -> Iterator[str]:
    """SQLAlchemy URL of a fresh database at the newest migration."""
    url = create_database(postgres_server_url, template_database)
    yield url
    release_connections(url)


@pytest.fixture
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    """SQLAlchemy URL of a fresh database with no schema (for migration tests)."""
    url = create_database(postgres_server_url)
    yield url
    release_connections(url)


@pytest.fixture(scope="session")
def profile_dir() -> Path:
    return PROFILE_DIR


@pytest.fixture(scope="session")
def azure_conv_trace() -> Path:
    return AZURE_CONV


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on `sys.path` for installed test distributions (plugin packages, see
    tests/test_plugin_packages.py); modules imported from it are forgotten after the test."""
    directory = tmp_path / "site-packages"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if module_file.startswith(str(directory)):
            del sys.modules[name]


def write_config(directory: Path, **overrides: object) -> Path:
    """Write a PlannerConfig YAML for tests: SLA throughput scaling on the shipped profile, plus overrides."""
    import yaml

    body: dict[str, object] = {
        "optimization_target": "sla",
        "mode": "disagg",
        "environment": "virtual",
        "model_name": "test-model",
        "ttft_ms": 200,
        "itl_ms": 10,
        "enable_throughput_scaling": True,
        "enable_load_scaling": False,
        "throughput_adjustment_interval_seconds": 60,
        "load_predictor": "constant",
        "max_gpu_budget": 16,
        "profile_results_dir": str(PROFILE_DIR),
    }
    body.update(overrides)
    path = directory / f"planner-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def decision_outcome(at, num_prefill: int | None, num_decode: int | None):
    """A throughput tick's inputs at `at` (a datetime; 1 ready and expected worker per pool) and an outcome deciding
    the given targets: what `record_decision` records (and a bench that times the commit itself)."""
    from planner_core.domain import (
        Loop,
        PlannerState,
        ReasonCode,
        ScalingDecision,
        TickInputs,
        TickOutcome,
        WorkerCounts,
    )

    workers = WorkerCounts(ready_prefill=1, ready_decode=1, expected_prefill=1, expected_decode=1)
    inputs = TickInputs(now_s=at.timestamp(), loop=Loop.THROUGHPUT, workers=workers)
    outcome = TickOutcome(
        decision=ScalingDecision(num_prefill=num_prefill, num_decode=num_decode),
        next_state=PlannerState(),
        steps=(),
        reason=ReasonCode.SCALE,
    )
    return inputs, outcome


def record_decision(ctx, deployment_name: str, at, num_prefill: int | None, num_decode: int | None) -> int:
    """Record a throughput tick of `deployment_name` at `at` (a datetime) whose decision is the given targets, with
    the real repository (1 ready and expected worker per pool); returns the decision id."""
    from sqlalchemy import select

    from planner_core.runtime.store.models import DecisionRow

    inputs, outcome = decision_outcome(at, num_prefill, num_decode)
    with ctx.sessions.begin() as session:
        tick_id = record_outcome(session, deployment_name, inputs, outcome)
        return session.scalar(select(DecisionRow.id).where(DecisionRow.tick_id == tick_id))


def record_outcome(session, deployment_name: str, inputs, outcome, *, previous_tick_id: int | None = None):
    """Record a hand-made tick outcome for `deployment_name` at `inputs.now_s` with the real repository."""
    import datetime as dt

    from planner_core.runtime.store import repository as repo

    deployment = repo.find_deployment(session, deployment_name)
    record = repo.TickRecord(
        deployment_id=deployment.id,
        scheduled_at=dt.datetime.fromtimestamp(inputs.now_s, tz=dt.UTC),
        config_hash=deployment.config_hash,
        predictor="constant",
        previous_tick_id=previous_tick_id,
        decide_ms=0.0,
    )
    return repo.record_tick(session, record, inputs, outcome)


def create_login(url: str, group: str, password: str) -> tuple[str, str]:
    """A new login role in `group` with `password`, and the libpq URI of `url`'s database logging in as it
    (the password in the URI, as an operator's `PLANNER_DATABASE_URL` would carry it). Drop it with `drop_login`."""
    name = f"login_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE {group}")
    scheme, rest = to_libpq_uri(url).split("://", 1)
    host_and_db = rest.split("@", 1)[1] if "@" in rest.split("/", 1)[0] else rest
    return f"{scheme}://{name}:{password}@{host_and_db}", name


def drop_login(url: str, name: str) -> None:
    """Drop a role made by `create_login` (its privileges in `url`'s database first)."""
    with psycopg.connect(to_libpq_uri(url), autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


@pytest.fixture(scope="session")
def prefect_api_url(tmp_path_factory) -> str:
    """A real Prefect server (with its scheduler) for the session, with its own home and SQLite database. One for
    the whole session: Prefect's event worker is a process-wide service bound to the first API URL it saw, so a
    second server in the same session would miss the task runs of the tests that use it.

    Prefect's `prefect_test_harness` is not used because its server runs no scheduler, and the serve test needs
    scheduled runs.
    """
    home = tmp_path_factory.mktemp("prefect-home")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ.pop("PREFECT_API_URL", None)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.prefect_server import prefect_api

    with prefect_api(log_file=home / "server.log") as url, temporary_settings(updates={PREFECT_API_URL: url}):
        yield url
