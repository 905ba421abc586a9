"""The local connector against Dynamo's own runtime: its frontend and mocker engines (file discovery, no GPU).

Under a minute on a 2-core machine, and part of `make test`, whose prerequisites build what it needs: the Dynamo
environment (`make dynamo-env`) and the tiny model folder (`make live-model`). Without them it fails, naming the
make target that builds what is missing (never a silent skip: CI cannot pass without having run it). The drain under
steady traffic (one to two minutes) runs only with PLANNER_LIVE_TESTS=1 (`make test-live`), and says so when skipped.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_core.lab.sim.dynamo_policy import find_dynamo_python
from planner_core.runtime.store.models import LocalWorkerStatus
from tests.runtime.test_local_connector import (  # noqa: F401 - make_ctx is a fixture
    NAME,
    T0,
    alive,
    counts,
    decision_status,
    make_ctx,
    settle,
    workers,
)

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("PLANNER_LIVE_MODEL_DIR", REPO / ".planner" / "live-model"))
PROFILE_DIR = REPO / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D"
STUBS_DIR = REPO / "planner_core" / "lab" / "dynamo" / "stubs"
R = LocalWorkerStatus.READY


@pytest.fixture(autouse=True)
def _live_environment() -> None:
    """Fail, naming the make target, when the Dynamo environment or the model folder is absent (`make test` builds
    both first)."""
    missing = []
    if find_dynamo_python() is None:
        missing.append("the Dynamo environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)")
    if not (MODEL_DIR / "config.json").is_file():
        missing.append(f"the model folder {MODEL_DIR}: run `make live-model`")
    if missing:
        pytest.fail("this test needs " + "; ".join(missing))


@pytest.fixture
def frontend(tmp_path):
    """Dynamo's frontend on file discovery; yields (its URL, the discovery folder)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kv = tmp_path / "kv"
    kv.mkdir()
    env = {**os.environ, "DYN_FILE_KV": str(kv), "PYTHONPATH": str(STUBS_DIR)}
    log = (tmp_path / "frontend.log").open("ab")
    process = subprocess.Popen(
        [find_dynamo_python(), "-m", "dynamo.frontend", "--http-port", str(port), "--discovery-backend", "file"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", kv
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _chat(url: str, timeout_s: float = 60.0) -> dict:
    """One chat completion, retried until `timeout_s` while the frontend's view of the engines lags the processes:
    it learns of a newly registered engine's model a moment after it registers (404), and it keeps routing to an
    engine that was killed or stopped until that engine's discovery entry expires (503, its TCP connection refused;
    round-robin then picks a live engine on a retry)."""
    import time
    import urllib.error

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _chat_once(url)
        except urllib.error.HTTPError as exc:
            if exc.code not in (404, 503) or time.monotonic() > deadline:
                raise
            time.sleep(1)


def _chat_once(url: str) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _mocker_ctx(make_ctx, kv: Path, monkeypatch, *, initial_decode: int | None = None):  # noqa: F811
    """A local-connector context whose workers are Dynamo's mocker (the default command) on discovery folder `kv`."""
    for name, value in {
        "DYNAMO_PYTHON": find_dynamo_python(),
        "PLANNER_LOCAL_MODEL_DIR": str(MODEL_DIR),
        "PLANNER_LOCAL_MODEL_NAME": "tiny",
        "PLANNER_LOCAL_PROFILE_DIR": str(PROFILE_DIR),
        "PYTHONPATH": str(STUBS_DIR),
    }.items():
        monkeypatch.setenv(name, value)
    return make_ctx(discovery_dir=kv, default_command=True, grace_s=20, initial_decode=initial_decode)


def test_mocker_engines_scale_up_down_and_a_killed_one_is_replaced(make_ctx, frontend, monkeypatch) -> None:  # noqa: F811
    url, kv = frontend
    ctx = _mocker_ctx(make_ctx, kv, monkeypatch)
    settle(ctx, lambda: len(workers(ctx, R)) == 1, timeout_s=120)  # the minimum endpoint, the mocker by default
    assert _chat(url)["choices"][0]["message"]["content"] is not None  # served through the frontend

    up = record(ctx, 0, 2)
    settle(ctx, lambda: decision_status(ctx, up) == "acknowledged", timeout_s=120)
    assert counts(ctx) == (2, 2) and all(alive(w) for w in workers(ctx, R))

    victim = workers(ctx, R)[0]
    os.kill(victim.pid, signal.SIGKILL)
    settle(ctx, lambda: len(workers(ctx, R)) == 2 and victim.id not in [w.id for w in workers(ctx, R)], timeout_s=120)
    assert [w.id for w in workers(ctx, LocalWorkerStatus.DIED)] == [victim.id]

    down = record(ctx, 1, 1)
    settle(ctx, lambda: decision_status(ctx, down) == "acknowledged", timeout_s=120)
    stopped = workers(ctx, LocalWorkerStatus.STOPPED, LocalWorkerStatus.KILLED)
    assert len(stopped) == 1 and not alive(stopped[0])
    assert counts(ctx) == (1, 1)
    assert _chat(url)["choices"][0]["message"]["content"] is not None  # the remaining engine still serves


def record(ctx, minute: int, num_decode: int) -> int:
    from tests.runtime.databases import record_decision

    return record_decision(ctx, NAME, T0 + dt.timedelta(minutes=minute), None, num_decode)


@contextlib.contextmanager
def _ingest_running(ctx, kv: Path, database_url: str) -> Iterator:
    """The forward-pass ingest of the test deployment, finding its engines in the discovery store `kv`, in a thread
    for the body of the `with`; yields the ingest (its stats)."""
    import threading

    from planner_core.runtime.ingest import FpmIngest
    from planner_core.runtime.store import repository as repo

    with ctx.sessions.begin() as session:
        deployment_id = repo.find_deployment(session, NAME).id
    ingest = FpmIngest(database_url, deployment_id, dynamo_discovery=kv, discovery_every_s=0.5, flush_interval_s=0.1)
    stop = threading.Event()
    thread = threading.Thread(target=ingest.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield ingest
    finally:
        stop.set()
        thread.join(timeout=10)


def test_the_ingest_stores_what_dynamos_engines_publish(make_ctx, frontend, monkeypatch, database_url) -> None:  # noqa: F811
    """A mocker engine started by the local connector publishes its forward-pass metrics on Dynamo's event plane;
    the ingest finds it in the discovery store and stores its heartbeats and, once it serves a request, its busy
    iterations, under the engine's worker id (the decimal of its instance id) and the decode pool (aggregated)."""
    import time

    from sqlalchemy import select

    from planner_core.runtime.store.db import session_factory
    from planner_core.runtime.store.models import FpmSampleRow

    url, kv = frontend
    ctx = _mocker_ctx(make_ctx, kv, monkeypatch)
    settle(ctx, lambda: len(workers(ctx, R)) == 1, timeout_s=120)
    with _ingest_running(ctx, kv, database_url) as ingest:
        _chat(url)
        deadline = time.monotonic() + 60
        while True:
            with session_factory(database_url).begin() as session:
                rows = session.execute(
                    select(FpmSampleRow.component, FpmSampleRow.worker_id, FpmSampleRow.wall_time_s)
                ).all()
            if any(wall > 0 for *_, wall in rows) and any(wall == 0 for *_, wall in rows):
                break
            assert time.monotonic() < deadline, (rows, ingest.stats.summary())
            _chat(url)
            time.sleep(0.5)
    instances = [p.name.rsplit("%2F", 1)[-1] for p in (kv / "v1" / "instances").iterdir() if "generate" in p.name]
    assert {(component, worker) for component, worker, _ in rows} == {("decode", str(int(instances[0], 16)))}
    assert ingest.stats.num_dropped == 0


# --- a scale-down during steady traffic ------------------------------------------------------------------------

OUTPUT_TOKENS = 600  # ~4 s per request on the mocker's H200 timing: several in flight on each engine at the drain


def _steady_traffic(url: str, *, rate_per_s: float, duration_s: float, at_s: float, action) -> list[tuple]:
    """Streamed chat requests at a steady rate for `duration_s`, `action()` run at `at_s` (in a thread, so the
    traffic keeps its pace); one (sent_at_s, status, num_chunks, done, error) per request."""
    import asyncio
    import threading
    import time

    import httpx

    body = {
        "model": "tiny", "messages": [{"role": "user", "content": "hello there " * 20}], "stream": True,
        "max_tokens": OUTPUT_TOKENS, "min_tokens": OUTPUT_TOKENS, "ignore_eos": True,
    }  # fmt: skip
    results: list[tuple] = []

    async def one(client: httpx.AsyncClient, sent_s: float) -> None:
        status, num_chunks, done, error = None, 0, False, None
        try:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                status = response.status_code
                async for line in response.aiter_lines():
                    if line.strip() == "data: [DONE]":
                        done = True
                    elif line.startswith("data:"):
                        chunk = json.loads(line[5:])
                        num_chunks += bool(chunk.get("choices"))
                        error = chunk.get("error") or error
        except httpx.HTTPError as exc:
            error = repr(exc)
        results.append((round(sent_s, 2), status, num_chunks, done, error))

    async def main() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            start = time.monotonic()
            tasks, acted = [], None
            while (now := time.monotonic() - start) < duration_s:
                if acted is None and now >= at_s:
                    acted = threading.Thread(target=action, daemon=True)
                    acted.start()
                tasks.append(asyncio.create_task(one(client, now)))
                await asyncio.sleep(1 / rate_per_s)
            await asyncio.gather(*tasks)
            if acted is not None:
                acted.join(timeout=120)

    asyncio.run(main())
    return sorted(results)


def _cut(results: list[tuple]) -> list[tuple]:
    """The requests that did not end whole: an error status, an error event, or fewer tokens than asked."""
    return [r for r in results if r[1] != 200 or not r[3] or r[4] is not None or r[2] < OUTPUT_TOKENS]


@pytest.mark.skipif(
    not os.environ.get("PLANNER_LIVE_TESTS"),
    reason="minutes of streamed traffic through Dynamo's frontend: run `make test-live` (PLANNER_LIVE_TESTS=1)",
)
def test_a_scale_down_during_steady_traffic_cuts_no_request(make_ctx, frontend, monkeypatch, database_url) -> None:  # noqa: F811
    """Two mocker engines behind Dynamo's frontend serve a steady stream of requests (4/s, each ~4 s long) while the
    ingest stores their forward-pass metrics; mid-stream the deployment is scaled to one. The engine removed is
    the least loaded, drained: no request is cut (each ends whole), and the drain is recorded with the requests it
    held at the start, none cut."""
    from tests.runtime.test_local_connector import drains

    url, kv = frontend
    ctx = _mocker_ctx(make_ctx, kv, monkeypatch, initial_decode=2)
    settle(ctx, lambda: len(workers(ctx, R)) == 2, timeout_s=180)
    with _ingest_running(ctx, kv, database_url):
        _chat(url)  # the frontend knows the model

        def scale_down() -> None:
            down = record(ctx, 0, 1)
            settle(ctx, lambda: decision_status(ctx, down) == "acknowledged", timeout_s=90)

        results = _steady_traffic(url, rate_per_s=4, duration_s=14, at_s=5, action=scale_down)
    ended = workers(ctx, LocalWorkerStatus.STOPPED, LocalWorkerStatus.KILLED)
    assert len(ended) == 1 and counts(ctx) == (1, 1)
    assert len(results) >= 40 and _cut(results) == [], f"{len(_cut(results))} of {len(results)} cut: {_cut(results)}"
    [drain] = drains(ctx)
    assert drain.local_worker_id == ended[0].id and drain.outcome == "stopped" and drain.num_cut == 0
    assert drain.num_in_flight_at_start is not None and drain.num_in_flight_at_start > 0  # it held requests
