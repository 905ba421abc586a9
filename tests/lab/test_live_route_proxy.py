"""The SLO-aware routing proxy against Dynamo's own runtime: its frontend in `direct` mode and two mocker engines.

A minute or two on a 2-core machine, so it runs only with PLANNER_LIVE_TESTS=1 (`make test-live`); it needs the
Dynamo environment (`make dynamo-env`) and the tiny model folder (`make live-env`), and says which is missing
instead of passing. Each request's worker is read twice: from the proxy's own counts and from the mocker logs
(each mocker logs `request received` per request it serves); they must agree, request by request totals.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from planner_core.lab.sim.dynamo_policy import find_dynamo_python

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(os.environ.get("PLANNER_LIVE_MODEL_DIR", REPO / ".planner" / "live-model"))
PROFILE_DIR = REPO / "planner_core" / "data" / "profiles" / "H200_TP1P_TP1D"
STUBS_DIR = REPO / "planner_core" / "lab" / "dynamo" / "stubs"

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("PLANNER_LIVE_TESTS"),
        reason="minutes with Dynamo's frontend and mocker engines: run `make test-live` (PLANNER_LIVE_TESTS=1)",
    ),
    pytest.mark.skipif(
        find_dynamo_python() is None,
        reason="needs the Dynamo environment: run `make dynamo-env` (or set $DYNAMO_PYTHON)",
    ),
    pytest.mark.skipif(
        not (MODEL_DIR / "config.json").is_file(), reason=f"no model folder {MODEL_DIR}: run `make live-env`"
    ),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ids(kv: Path) -> set[int]:
    folder = kv / "v1" / "instances"
    if not folder.is_dir():
        return set()
    return {int(urllib.parse.unquote(n).rsplit("/", 1)[-1], 16) for n in os.listdir(folder) if "generate" in n}


def _wait(what: str, probe, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:  # our own local servers
        return r.read()


def _post(url: str, body: dict, timeout_s: float = 120) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _chat(max_tokens: int, stream: bool) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "tell me a story " * 100}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


@pytest.fixture
def stack(tmp_path):
    """Frontend (direct mode) and two mockers on file discovery; yields (frontend URL, kv, {worker id: log})."""
    kv = tmp_path / "kv"
    kv.mkdir()
    env = {**os.environ, "DYN_FILE_KV": str(kv), "PYTHONPATH": str(STUBS_DIR)}
    processes: list[subprocess.Popen] = []

    def start(argv: list[str], log: Path) -> subprocess.Popen:
        with log.open("ab") as out:
            p = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )  # fmt: skip
        processes.append(p)
        return p

    try:
        port = _port()
        python = find_dynamo_python()
        start([python, "-m", "dynamo.frontend", "--http-port", str(port), "--discovery-backend", "file",
               "--router-mode", "direct"], tmp_path / "frontend.log")  # fmt: skip
        logs: dict[int, Path] = {}
        for index in range(2):  # one at a time: the id that appears is this mocker's
            before = _ids(kv)
            log = tmp_path / f"mocker{index}.log"
            start([python, "-m", "dynamo.mocker", "--model-path", str(MODEL_DIR), "--model-name", "tiny",
                   "--discovery-backend", "file", "--request-plane", "tcp",
                   "--planner-profile-data", str(PROFILE_DIR)], log)  # fmt: skip
            _wait(f"mocker {index} registered", lambda b=before: len(_ids(kv) - b) == 1, 180)
            (new,) = _ids(kv) - before
            logs[new] = log
        url = f"http://127.0.0.1:{port}"
        _wait("the frontend serves tiny", lambda: b"tiny" in _get(f"{url}/v1/models"), 120)
        yield url, kv, logs
    finally:
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@contextlib.contextmanager
def proxy(frontend: str, kv: Path, log: Path, *options: str):
    port = _port()
    with log.open("ab") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "planner_cli", "route-proxy", "--frontend", frontend, "--discovery-dir", str(kv),
             "--profile", str(PROFILE_DIR), "--port", str(port), *options],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("the proxy sees both workers", lambda: len(json.loads(_get(f"{url}/route/status"))["workers"]) == 2, 60)
        yield url
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _served(logs: dict[int, Path]) -> dict[str, int]:
    return {str(i): log.read_text(errors="replace").count("request received") for i, log in logs.items()}


def test_proxy_places_each_request_on_the_selected_worker_and_queues_or_rejects(stack, tmp_path) -> None:
    frontend, kv, logs = stack
    # direct mode needs the worker named: without it the frontend refuses the request
    status, _ = _post(f"{frontend}/v1/chat/completions", _chat(4, False))
    assert status == 400

    with proxy(frontend, kv, tmp_path / "proxy.log", "--ttft-ms", "2000", "--itl-ms", "100") as url:
        assert b"tiny" in _get(f"{url}/v1/models")  # passed through
        status, body = _post(f"{url}/v1/chat/completions", _chat(4, False))
        assert status == 200, body
        assert json.loads(body)["choices"][0]["message"]["content"] is not None
        # idle workers predict the same TTFT: the first in order (the smaller id) is chosen
        assert _served(logs) == {str(min(logs)): 1, str(max(logs)): 0}
        # concurrent streams: the proxy counts the first one's prompt on its worker, so the next goes elsewhere
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: _post(f"{url}/v1/chat/completions", _chat(200, True)), range(6)))
        assert all(s == 200 and b"data:" in b for s, b in results)
        placed = json.loads(_get(f"{url}/route/status"))["placed"]
        _wait("the mocker logs", lambda: sum(_served(logs).values()) == 7, 10)
        served = _served(logs)
        assert {w: placed.get(w, 0) for w in served} == served  # each request went to the worker the proxy chose
        assert min(served.values()) >= 2, served  # and the selector spread the concurrent ones
        metrics = _get(f"{url}/metrics").decode()
        assert "planner_route_placed_total" in metrics

    # an SLO no worker can meet: reject answers 503 and sends nothing to a worker
    before = _served(logs)
    with proxy(frontend, kv, tmp_path / "reject.log", "--ttft-ms", "0.001", "--itl-ms", "100",
               "--no-endpoint", "reject") as url:  # fmt: skip
        status, body = _post(f"{url}/v1/chat/completions", _chat(4, False))
        assert status == 503 and b"no worker predicted" in body
        counts = json.loads(_get(f"{url}/route/status"))
        assert counts["rejected"] == 1 and counts["placed"] == {}
    time.sleep(1)
    assert _served(logs) == before

    # queue: held up to the TTFT target (here 300 ms), then placed anyway on the lowest prediction (overdue)
    with proxy(frontend, kv, tmp_path / "queue.log", "--ttft-ms", "300", "--itl-ms", "0.001",
               "--no-endpoint", "queue") as url:  # fmt: skip
        started = time.monotonic()
        status, _ = _post(f"{url}/v1/chat/completions", _chat(4, False))
        assert status == 200 and time.monotonic() - started >= 0.3
        counts = json.loads(_get(f"{url}/route/status"))
        assert counts["queued"] == 1 and counts["overdue"] == 1 and sum(counts["placed"].values()) == 1
