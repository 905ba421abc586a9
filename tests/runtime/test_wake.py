"""Scale to zero, and wake, at the runtime's edges, against the real Postgres of the test session: the routing proxy
holds requests while no worker is registered and NOTIFYs `planner_wake`; the wake listener hears it; the wake tick
records the held requests as its input and replays exactly; the hold's bounds (overflow, timeout) answer clearly.
A stand-in frontend (a local HTTP server) answers for Dynamo's; the live wake is planner_core/lab/live/wake.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from planner_core.domain import Component, Loop, ReasonCode, UnplacedRequests
from planner_core.routing.dispatch import NoEndpointPolicy
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.profiling import parse_tpot_profile, parse_ttft_profile
from planner_core.routing.scheduler import SloTargets
from planner_core.runtime.replay import replay
from planner_core.runtime.route_proxy import ProxySettings, RouteProxy, WakeSettings
from planner_core.runtime.service import load_context, run_tick
from planner_core.runtime.wake import WakeListener, parse_wake_payload, send_wake, wake_payload
from tests.conftest import write_config
from tests.core.test_routing import TPOT_JSON, TTFT_JSON

NAME = "woken"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class _Frontend(BaseHTTPRequestHandler):
    """Dynamo's frontend as the proxy sees it: `/v1/models` lists the model once a worker is in the discovery store
    (`discovery`), and a chat completion answers at once, noting the worker the proxy chose."""

    discovery: Path
    chosen: list[object] = []

    def do_GET(self) -> None:
        listed = any((self.discovery / "v1" / "instances").glob("*"))
        self._reply({"object": "list", "data": [{"id": "tiny"}] if listed else []})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Frontend.chosen.append(body.get("nvext", {}).get("backend_instance_id"))
        self._reply({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})

    def _reply(self, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_: object) -> None:  # quiet
        pass


@pytest.fixture
def frontend(tmp_path):
    _Frontend.discovery = tmp_path / "kv"
    _Frontend.chosen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Frontend)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _proxy(tmp_path: Path, frontend: str, wake: WakeSettings) -> RouteProxy:
    (tmp_path / "kv" / "v1" / "instances").mkdir(parents=True, exist_ok=True)
    settings = ProxySettings(
        frontend_url=frontend,
        discovery_dir=tmp_path / "kv",
        namespace="dynamo",
        targets=SloTargets(ttft_ms=1000.0, tpot_ms=1000.0),
        chunk_tokens=None,
        policy=NoEndpointPolicy.QUEUE,
        chars_per_token=4.0,
        discovery_interval_s=0.1,
        wake=wake,
    )
    return RouteProxy(settings, LatencyPredictor(parse_ttft_profile(TTFT_JSON), parse_tpot_profile(TPOT_JSON)))


def _chat(proxy: RouteProxy):
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}).encode()
    return proxy.handle_routed("/v1/chat/completions", body, {"content-type": "application/json"})


def test_payload_round_trip_and_foreign_payloads() -> None:
    assert parse_wake_payload(wake_payload("prod", 3)) == ("prod", 3)
    for foreign in ("prod", "{}", '{"deployment": "prod", "held": -1}', '{"deployment": 1, "held": 1}', "[1]"):
        assert parse_wake_payload(foreign) is None


def test_held_requests_wake_the_planner_and_are_all_served(tmp_path, frontend, database_url) -> None:
    """Three requests arrive while no worker is registered: each is held; the listener hears the NOTIFY (with the
    count held) and, standing in for the wake tick and the connector, registers a worker 0.5 s later; all three
    are then forwarded to it and answered 200, none lost."""
    heard: list[int] = []

    def start_a_worker(held: int) -> None:
        heard.append(held)
        time.sleep(0.5)  # the engine's start-up
        name = urllib.parse.quote("dynamo/backend/generate/a", safe="")
        (tmp_path / "kv" / "v1" / "instances" / name).write_text("{}")

    listener = WakeListener(database_url, NAME, start_a_worker, wait_slice_s=0.2)
    listener.start()
    try:
        assert listener.listening.wait(10)
        proxy = _proxy(tmp_path, frontend, WakeSettings(deployment=NAME, database_url=database_url, renotify_s=0.5))

        async def three_requests():
            await proxy.start()
            try:
                return await asyncio.gather(*(_chat(proxy) for _ in range(3)))
            finally:
                await proxy.stop()

        started = time.monotonic()
        responses = asyncio.run(three_requests())
        elapsed_s = time.monotonic() - started
    finally:
        listener.close()
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert _Frontend.chosen == [10, 10, 10]  # hex a
    assert heard and heard[0] >= 1  # the NOTIFY carried the held count
    assert proxy.counts["held"] == 3 and proxy.num_held == 0
    assert len(proxy.wake_waits_s) == 3 and all(0.5 <= w <= elapsed_s for w in proxy.wake_waits_s)
    assert proxy.status()["wakes_sent"] >= 1 and proxy.counts["wake_errors"] == 0


def test_after_a_wake_tick_the_renotifications_of_the_quiet_time_run_none(database_url) -> None:
    heard: list[int] = []
    listener = WakeListener(database_url, NAME, heard.append, wait_slice_s=0.1, quiet_s=0.6)
    listener.start()
    try:
        assert listener.listening.wait(10)
        send_wake(database_url, "another deployment", 9)  # not ours: ignored
        for held in (2, 3):  # the second within the quiet time
            send_wake(database_url, NAME, held)
            time.sleep(0.3)
        time.sleep(0.5)  # past the quiet time
        send_wake(database_url, NAME, 4)
        deadline = time.monotonic() + 5
        while len(heard) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        listener.close()
    assert heard == [2, 4]
    assert (listener.stats.num_wakes, listener.stats.num_quiet, listener.stats.num_notifies) == (2, 1, 3)


def test_the_hold_is_bounded_overflow_503_and_timeout_504(tmp_path, frontend, database_url) -> None:
    wake = WakeSettings(deployment=NAME, database_url=database_url, max_held=1, timeout_s=0.4, renotify_s=10.0)
    proxy = _proxy(tmp_path, frontend, wake)

    async def two_requests():
        await proxy.start()
        try:
            first = asyncio.create_task(_chat(proxy))
            await asyncio.sleep(0.05)  # the first is held
            second = await _chat(proxy)  # one held already: refused at once
            return await first, second
        finally:
            await proxy.stop()

    started = time.monotonic()
    first, second = asyncio.run(two_requests())
    assert time.monotonic() - started >= 0.4
    assert (first.status_code, json.loads(first.body)["error"]["type"]) == (504, "wake_timeout")
    assert (second.status_code, json.loads(second.body)["error"]["type"]) == (503, "held_overflow")
    assert (proxy.counts["wake_timeout"], proxy.counts["held_overflow"], proxy.counts["wakes_sent"]) == (1, 1, 1)
    assert "planner_route_wake_timeout_total 1" in proxy.metrics_text()


def test_the_wake_tick_records_the_held_requests_and_replays_exactly(tmp_path, database_url) -> None:
    config = write_config(tmp_path, mode="agg", min_endpoint=0, scale_to_zero_idle_seconds=60)
    ctx = load_context(database_url, NAME, config)
    quiet = run_tick(ctx, Loop.LOAD, T0, None)  # at zero (the virtual connector's counts start at the minimum)
    assert quiet.outcome is not None and quiet.outcome.decision.num_decode is None
    assert [s.reason for s in quiet.outcome.steps if s.step == "scale_to_zero"] == [ReasonCode.AT_ZERO]
    held = (UnplacedRequests(component=Component.DECODE, num_waiting=2),)
    woken = run_tick(ctx, Loop.LOAD, T0 + dt.timedelta(seconds=5), None, unplaced=held)
    assert woken.outcome is not None and woken.outcome.decision.num_decode == 1
    assert [s.reason for s in woken.outcome.steps if s.step == "scale_to_zero"] == [ReasonCode.WOKEN]
    assert woken.inputs is not None and woken.inputs.unplaced == held
    summary = replay(database_url, NAME, T0 - dt.timedelta(minutes=1), T0 + dt.timedelta(minutes=1))
    assert (summary.num_ticks, summary.num_identical) == (2, 2)
