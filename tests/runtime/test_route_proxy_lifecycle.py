"""`planner route-proxy` as its own process, stopped by Ctrl-C or SIGTERM while an answer streams through it, in
front of a stand-in frontend (a local HTTP server streaming a chat answer slowly): a few seconds, in `make test`.
The proxy against Dynamo's own frontend is tests/lab/test_live_route_proxy.py (`make test-live`)."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from planner_core.runtime.localhost import free_port
from tests.conftest import PROFILE_DIR, REPO_ROOT
from tests.runtime.lifecycle import STOP_SIGNAL_IDS, STOP_SIGNALS, start_command, stop_with

NUM_CHUNKS = 6
CHUNK_GAP_S = 0.5  # the answer streams for ~3 s: the signal comes in the middle of it


class _SlowFrontend(BaseHTTPRequestHandler):
    """Dynamo's frontend as the proxy sees it: a chat completion streamed as server-sent events, one chunk every
    `CHUNK_GAP_S`; it notes the worker the proxy chose."""

    chosen: list[object] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _SlowFrontend.chosen.append(body.get("nvext", {}).get("backend_instance_id"))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for index in range(NUM_CHUNKS):
            chunk = {"choices": [{"index": 0, "delta": {"content": f"t{index}"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(CHUNK_GAP_S)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *_: object) -> None:  # quiet
        pass


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/route/status", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=STOP_SIGNAL_IDS)
def test_route_proxy_finishes_the_answer_in_flight_and_exits_0(tmp_path, sig) -> None:
    """Ctrl-C and SIGTERM end the proxy alike: it stops taking requests, the answer streaming through it is
    delivered to its last chunk, it says it stopped and exits 0 (uvicorn raised the signal again once stopped: exit
    130 on Ctrl-C, killed by SIGTERM)."""
    frontend = ThreadingHTTPServer(("127.0.0.1", 0), _SlowFrontend)
    threading.Thread(target=frontend.serve_forever, daemon=True).start()
    instances = tmp_path / "kv" / "v1" / "instances"
    instances.mkdir(parents=True)
    (instances / urllib.parse.quote("dynamo/backend/generate/a", safe="")).write_text("{}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        "route-proxy", "--frontend", f"http://127.0.0.1:{frontend.server_address[1]}",
        "--discovery-dir", str(tmp_path / "kv"), "--profile", str(PROFILE_DIR), "--ttft-ms", "1000",
        "--itl-ms", "100", "--port", str(port),
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    chunks: list[str] = []
    first_chunk = threading.Event()

    def stream_one_answer() -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line.removeprefix("data: "))
                    first_chunk.set()

    try:
        with start_command(args, env=env, log_path=tmp_path / "proxy.log", ready=lambda _: _answers(url)) as command:
            client = threading.Thread(target=stream_one_answer)
            client.start()
            assert first_chunk.wait(30), command.log()[-3000:]
            returncode = stop_with(command, sig)
            client.join(30)
    finally:
        frontend.shutdown()
    log = command.log()
    assert returncode == 0, log[-3000:]
    assert len(chunks) == NUM_CHUNKS + 1 and chunks[-1] == "[DONE]", chunks  # the whole answer, after the signal
    assert _SlowFrontend.chosen[-1] == int("a", 16)  # routed: the proxy named the worker it chose
    assert "planner route-proxy: stopped" in log and "Traceback" not in log, log[-3000:]
    assert not _answers(url)  # nothing listens any more
