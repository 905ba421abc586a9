"""The demo flow run in-process for the runtime's tests, and the rows they compare (tests/runtime/test_flows.py,
tests/runtime/test_demo_recovery.py).

Every demo run starts its simulated cluster at the oracle's size for the trace's first three minutes
(`planner_core.lab.demo.starting_size`), a search of many simulated runs: about 60 % of a 6-window run's time
(cProfile, 2026-12-07). The tests run the demo again and again on the same trace and SLA (a run stopped and resumed,
the run it is compared with), so the runs in this process keep the oracle's answers (`kept_oracle_answers`): keyed on
the pickled inputs of the search, each distinct search is still made once, by the oracle itself, and a resumed run
finds the size exactly as before. The subprocess runs (`planner demo` in tests/runtime/test_demo_recovery.py,
tests/runtime/test_secrets.py, ...) search afresh, so the size found in another process is still compared with
the kept one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from collections.abc import Iterator

import psycopg

from planner_core.runtime.store.db import to_libpq_uri


def rows(url: str, sql: str, *params):
    with psycopg.connect(to_libpq_uri(url)) as conn:
        return conn.execute(sql, params).fetchall()


_ORACLE_ANSWERS: dict[str, object] = {}  # the first windows' oracle answers found in this process, by input digest


@contextlib.contextmanager
def kept_oracle_answers() -> Iterator[None]:
    """Within the block, the demo's starting size (`planner_core.lab.demo.scoring.oracle_first_window`) is searched
    once per distinct input in this process: a repeated search returns the answer the oracle gave the first time
    (the search is deterministic; its inputs, trace arrays and profile model included, are compared by their
    pickled bytes)."""
    from unittest import mock

    from planner_core.lab.demo import scoring

    search = scoring.oracle_first_window

    def kept(trace, *args, window_s, settings, **kwargs):  # as `starting_size` calls it
        # the search sees only the trace's head up to the window's end and its context (`oracle_first_window`)
        head = trace.head(window_s + settings.context_s)
        key = hashlib.sha256(pickle.dumps((head, args, window_s, settings, sorted(kwargs.items())), protocol=5))
        digest = key.hexdigest()
        if digest not in _ORACLE_ANSWERS:
            _ORACLE_ANSWERS[digest] = search(trace, *args, window_s=window_s, settings=settings, **kwargs)
        return _ORACLE_ANSWERS[digest]

    with mock.patch.object(scoring, "oracle_first_window", kept):
        yield


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
        with kept_oracle_answers():
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


def prefect_artifacts(key: str):
    """The artifacts with this key on the session's Prefect server (a report's link, a tick's table)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))

    return asyncio.run(read())


def has_ticks(url: str) -> bool:
    return bool(rows(url, "SELECT to_regclass('ticks') IS NOT NULL")[0][0])
