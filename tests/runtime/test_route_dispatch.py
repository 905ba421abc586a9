"""The routing proxy's bookkeeping and choice (planner_core.routing.dispatch) and its pure edges (discovery names,
prompt size, the no-endpoint policy) without a network: fast, in `make test`. The live proxy against Dynamo's
frontend is tests/lab/test_live_route_proxy.py (`make test-live`)."""

from __future__ import annotations

import asyncio
import time
import urllib.parse

import pytest

from planner_core.routing.dispatch import DispatchState, NoEndpointPolicy, choose, estimate_prompt_tokens
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.profiling import parse_tpot_profile, parse_ttft_profile
from planner_core.routing.scheduler import InstanceStatus, RouteOutcome, SloTargets
from planner_core.runtime.route_proxy import ProxySettings, RouteProxy, instance_ids, prompt_chars
from tests.core.test_routing import TPOT_JSON, TTFT_JSON

# TTFT table: 128 -> 42 ms, 512 -> 70 ms, 1024 -> 100 ms (linear between)
LOOSE = SloTargets(ttft_ms=1000.0, tpot_ms=1000.0)


@pytest.fixture
def predictor() -> LatencyPredictor:
    return LatencyPredictor(parse_ttft_profile(TTFT_JSON), parse_tpot_profile(TPOT_JSON))


def test_a_request_waits_for_prefill_then_decodes_then_leaves() -> None:
    state = DispatchState().with_workers(["b", "a"])
    assert [w.worker_id for w in state.workers] == ["a", "b"]  # sorted: the selector's tie-break order
    state = state.admit("a", "r1", 300).admit("a", "r2", 100)
    assert state.worker("a").status(None) == InstanceStatus(instance_id="a", queued_prefill_tokens=400)
    state = state.first_token("a", "r1")
    assert state.worker("a").status(8192) == InstanceStatus(
        instance_id="a", queued_prefill_tokens=100, decode_batch_size=1, decode_kv_tokens=300, chunk_tokens=8192
    )
    assert state.first_token("a", "r1") == state  # a second first chunk changes nothing
    state = state.finish("a", "r1").finish("a", "r2")
    assert state.worker("a").status(None) == InstanceStatus(instance_id="a")
    assert state.num_in_flight() == 0


def test_gone_workers_are_dropped_with_their_requests_and_new_ones_start_idle() -> None:
    state = DispatchState().with_workers(["a", "b"]).admit("a", "r1", 10).admit("b", "r2", 20)
    state = state.with_workers(["b", "c"])
    assert [w.worker_id for w in state.workers] == ["b", "c"]
    assert state.worker("b").prefilling == (("r2", 20),) and state.worker("c").prefilling == ()
    assert state.finish("a", "r1") == state and state.first_token("a", "r1") == state  # its late events: no-ops
    assert state.admit("a", "r3", 5) == state  # a worker not registered is never loaded


def test_choice_takes_the_lowest_predicted_ttft_given_the_proxy_load(predictor: LatencyPredictor) -> None:
    state = DispatchState().with_workers(["a", "b"])
    first = choose(state, predictor, LOOSE, 128, chunk_tokens=None)
    assert (first.worker_id, first.decision.predicted_ms) == ("a", 42.0)  # equal predictions: the first
    state = state.admit("a", "r1", 384)  # a now prefills 384 + 128 = 512 tokens before the new prompt's first token
    second = choose(state, predictor, LOOSE, 128, chunk_tokens=None)
    assert (second.worker_id, second.decision.predicted_ms) == ("b", 42.0)


def test_ttft_filter_and_no_endpoint_and_force(predictor: LatencyPredictor) -> None:
    tight = SloTargets(ttft_ms=60.0, tpot_ms=1000.0)
    state = DispatchState().with_workers(["a", "b"]).admit("a", "r1", 384)
    assert choose(state, predictor, tight, 128, chunk_tokens=None).worker_id == "b"  # a: 70 ms > 60 ms
    state = state.admit("b", "r2", 640)  # b: 768 tokens -> 85 ms
    none = choose(state, predictor, tight, 128, chunk_tokens=None)
    assert none.decision.outcome is RouteOutcome.NO_AVAILABLE_ENDPOINT and none.worker_id is None
    # with a threshold of 1.5 the limit is 90 ms: both pass, a is lower
    looser = SloTargets(ttft_ms=60.0, tpot_ms=1000.0, ttft_dispatch_threshold=1.5)
    assert choose(state, predictor, looser, 128, chunk_tokens=None).worker_id == "a"
    forced = choose(state, predictor, tight, 128, chunk_tokens=None, force=True)
    assert (forced.worker_id, forced.decision.predicted_ms) == ("a", 70.0)


def test_decode_stage_blocks_a_worker_whose_batch_would_miss_the_itl(predictor: LatencyPredictor) -> None:
    state = DispatchState().with_workers(["a", "b"]).admit("b", "q", 384)  # b: TTFT 70 ms, no decode batch
    for i in range(15):  # a: 15 decoding requests of 100 tokens (TTFT 42 ms + one iteration of that batch)
        state = state.admit("a", f"r{i}", 100).first_token("a", f"r{i}")
    loose = choose(state, predictor, LOOSE, 128, chunk_tokens=None)
    assert loose.worker_id == "a" and loose.decision.predicted_ms < 70.0
    strict = choose(state, predictor, SloTargets(ttft_ms=1000.0, tpot_ms=15.0), 128, chunk_tokens=None)
    assert strict.decode_blocked == ("a",) and strict.worker_id == "b"


def test_prompt_size_and_discovery_names() -> None:
    assert estimate_prompt_tokens(400, 4.0) == 100 and estimate_prompt_tokens(0, 4.0) == 1
    chat = {"messages": [{"role": "user", "content": "abcd"}, {"content": [{"type": "text", "text": "xy"}]}]}
    assert prompt_chars("/v1/chat/completions", chat) == 6
    assert prompt_chars("/v1/completions", {"prompt": ["ab", "c"]}) == 3
    names = [
        urllib.parse.quote("dynamo/backend/generate/b41e595923c9174f", safe=""),
        urllib.parse.quote("dynamo/backend/worker_kv_query_source_3ad/5e629a097e136b5e", safe=""),
        urllib.parse.quote("other/backend/generate/10", safe=""),
        urllib.parse.quote("dynamo/backend/generate/not-hex", safe=""),
    ]
    assert instance_ids(names, "dynamo") == [str(0xB41E595923C9174F)]


def _proxy(tmp_path, predictor, policy: NoEndpointPolicy, ttft_ms: float) -> RouteProxy:
    folder = tmp_path / "v1" / "instances"
    folder.mkdir(parents=True)
    for hex_id in ("a", "b"):
        (folder / urllib.parse.quote(f"dynamo/backend/generate/{hex_id}", safe="")).write_text("{}")
    settings = ProxySettings(
        frontend_url="http://127.0.0.1:9",
        discovery_dir=tmp_path,
        namespace="dynamo",
        targets=SloTargets(ttft_ms=ttft_ms, tpot_ms=1000.0),
        chunk_tokens=None,
        policy=policy,
        chars_per_token=4.0,
    )
    proxy = RouteProxy(settings, predictor)
    proxy.refresh_workers()
    return proxy


def test_no_endpoint_reject_answers_at_once(tmp_path, predictor: LatencyPredictor) -> None:
    proxy = _proxy(tmp_path, predictor, NoEndpointPolicy.REJECT, ttft_ms=60.0)
    assert [w.worker_id for w in proxy.state.workers] == ["10", "11"]  # hex a, b
    assert asyncio.run(proxy.place(128)) == ("10", "selected")
    proxy.state = proxy.state.admit("10", "r1", 900).admit("11", "r2", 900)
    assert asyncio.run(proxy.place(128)) == (None, "rejected")


def test_no_endpoint_queue_waits_for_a_change_or_its_ttft_target(tmp_path, predictor: LatencyPredictor) -> None:
    proxy = _proxy(tmp_path, predictor, NoEndpointPolicy.QUEUE, ttft_ms=60.0)
    proxy.state = proxy.state.admit("10", "r1", 900).admit("11", "r2", 900)

    async def freed_meanwhile():
        waiting = asyncio.create_task(proxy.place(128))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # held at the proxy
        proxy._end("11", "r2")  # the end of a request, as the stream's close does it
        return await waiting

    assert asyncio.run(freed_meanwhile()) == ("11", "queued")
    proxy.state = proxy.state.admit("11", "r3", 900)
    started = time.monotonic()
    assert asyncio.run(proxy.place(128)) == ("10", "overdue")  # nothing changed: placed at 60 ms on the lowest
    assert time.monotonic() - started >= 0.06
    assert proxy.counts["queued"] == 2
