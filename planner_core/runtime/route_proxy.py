"""The SLO-aware routing proxy: an OpenAI-compatible HTTP endpoint in front of Dynamo's frontend in `direct` mode.

Dynamo's frontend started with `--router-mode direct` sends each request to the worker named in its
`nvext.backend_instance_id` (and answers 400 without one). This proxy makes that choice with the project's selector
(`planner_core.routing.dispatch.choose`): for each chat/completions or completions request it estimates the prompt
tokens, asks for the worker predicted to meet the TTFT and ITL targets given the load the proxy itself sent to each
worker (`DispatchState`), forwards the request with the worker's id set, streams the answer back and updates the
load at the first chunk and at the end. Other paths (`/v1/models`, ...) pass through unchanged; the proxy's own
counts are at `/metrics` (Prometheus text) and `/route/status` (JSON).

- Workers: the entries `<discovery_dir>/v1/instances/<namespace>%2F<component>%2Fgenerate%2F<hex id>` of Dynamo's
  file discovery store; the instance id the frontend expects is that hex number as an integer. Re-read every
  `discovery_interval_s`; a worker gone is dropped.
- No worker predicted to meet the SLO: `queue` holds the request at the proxy, re-asking at every change of load,
  until its wait reaches the TTFT target, then places it on the lowest predicted TTFT over every worker (`overdue`);
  `reject` answers 503 at once. With no worker registered at all, both answer 503.
- Prompt tokens: characters / `chars_per_token` (the proxy does not load the model's tokenizer); the figure is an
  estimate, documented in docs/routing.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from planner_core.routing.dispatch import (
    DispatchState,
    NoEndpointPolicy,
    choose,
    estimate_prompt_tokens,
)
from planner_core.routing.predictor import LatencyPredictor
from planner_core.routing.scheduler import SloTargets

GENERATE_SUFFIX = "/generate/"
ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions")
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def instance_ids(entry_names: list[str], namespace: str) -> list[str]:
    """Worker ids (decimal text of the u64 instance id) of the generate endpoints of `namespace` among the names of
    a discovery store's `v1/instances` entries; names that do not parse are skipped."""
    ids = []
    for name in entry_names:
        key = urllib.parse.unquote(name)
        if not key.startswith(f"{namespace}/") or GENERATE_SUFFIX not in key:
            continue
        hex_id = key.rsplit("/", 1)[-1]
        try:
            ids.append(str(int(hex_id, 16)))
        except ValueError:
            continue
    return sorted(set(ids))


def discovered_workers(discovery_dir: Path, namespace: str) -> list[str]:
    try:
        names = os.listdir(discovery_dir / "v1" / "instances")
    except OSError:
        return []
    return instance_ids(names, namespace)


def prompt_chars(path: str, body: dict[str, Any]) -> int:
    """Characters of a request's prompt: the chat messages' text, or the completion prompt."""
    if path.endswith("/chat/completions"):
        total = 0
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
        return total
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return sum(len(p) for p in prompt if isinstance(p, str))
    return len(prompt) if isinstance(prompt, str) else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    frontend_url: str
    discovery_dir: Path
    namespace: str
    targets: SloTargets
    chunk_tokens: int | None
    policy: NoEndpointPolicy
    chars_per_token: float
    discovery_interval_s: float = 1.0
    request_timeout_s: float = 300.0


class RouteProxy:
    """The proxy's state and handlers (one asyncio loop: the state changes between awaits only)."""

    def __init__(self, settings: ProxySettings, predictor: LatencyPredictor) -> None:
        self.settings = settings
        self.predictor = predictor
        self.state = DispatchState()
        self.placed: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()  # queued, rejected, overdue, no_worker, upstream_errors
        self._ids = itertools.count()
        self._changed = asyncio.Event()
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task | None = None

    # ---------------------------------------------------------------------------------------------------- life

    def refresh_workers(self) -> None:
        before = [w.worker_id for w in self.state.workers]
        self.state = self.state.with_workers(discovered_workers(self.settings.discovery_dir, self.settings.namespace))
        if [w.worker_id for w in self.state.workers] != before:
            self._notify()

    async def _watch(self) -> None:
        while True:
            self.refresh_workers()
            await asyncio.sleep(self.settings.discovery_interval_s)

    async def start(self) -> None:
        self._client = httpx.AsyncClient(
            base_url=self.settings.frontend_url,
            timeout=httpx.Timeout(self.settings.request_timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
        )
        self.refresh_workers()
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self._client:
            await self._client.aclose()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---------------------------------------------------------------------------------------------------- routing

    async def place(self, prompt_tokens: int) -> tuple[str | None, str]:
        """The worker for a request (None: rejected) and how it was placed: `selected`, `queued` (after a wait),
        `overdue` (its wait reached the TTFT target: lowest prediction), `rejected`, `no_worker`."""
        s = self.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + s.targets.ttft_ms / 1000.0
        waited = False
        while True:
            choice = choose(self.state, self.predictor, s.targets, prompt_tokens, chunk_tokens=s.chunk_tokens)
            if choice.placed:
                return choice.worker_id, "queued" if waited else "selected"
            if not self.state.workers:
                return None, "no_worker"
            if s.policy is NoEndpointPolicy.REJECT:
                return None, "rejected"
            if not waited:
                waited = True
                self.counts["queued"] += 1
            remaining = deadline - loop.time()
            if remaining <= 0:
                forced = choose(
                    self.state, self.predictor, s.targets, prompt_tokens, chunk_tokens=s.chunk_tokens, force=True
                )
                return forced.worker_id, "overdue"
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                pass

    # ---------------------------------------------------------------------------------------------------- HTTP

    async def handle_routed(self, path: str, raw: bytes, headers: dict[str, str]):
        from starlette.responses import JSONResponse, Response, StreamingResponse

        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            return JSONResponse({"error": {"message": f"request body is not a JSON object: {exc}"}}, status_code=400)
        prompt_tokens = estimate_prompt_tokens(prompt_chars(path, body), self.settings.chars_per_token)
        worker_id, how = await self.place(prompt_tokens)
        if worker_id is None:
            self.counts[how] += 1
            message = "no worker registered" if how == "no_worker" else "no worker predicted to meet the SLO"
            return JSONResponse({"error": {"message": message, "type": how}}, status_code=503)
        if how == "overdue":
            self.counts["overdue"] += 1
        self.placed[worker_id] += 1
        request_id = f"r{next(self._ids)}"
        self.state = self.state.admit(worker_id, request_id, prompt_tokens)
        nvext = body.get("nvext") if isinstance(body.get("nvext"), dict) else {}
        body["nvext"] = {**nvext, "backend_instance_id": int(worker_id)}
        assert self._client is not None
        try:
            upstream = await self._client.send(
                self._client.build_request("POST", path, json=body, headers=_forward_headers(headers)), stream=True
            )
        except httpx.HTTPError as exc:
            self._end(worker_id, request_id)
            self.counts["upstream_errors"] += 1
            return JSONResponse({"error": {"message": f"frontend unreachable: {exc}"}}, status_code=502)
        if upstream.status_code != 200 or not body.get("stream"):
            content = await upstream.aread()
            await upstream.aclose()
            self._end(worker_id, request_id)
            return Response(content, status_code=upstream.status_code, headers=_reply_headers(upstream.headers))

        async def stream():
            first = True
            try:
                async for chunk in upstream.aiter_raw():
                    if first and chunk:
                        first = False
                        self.state = self.state.first_token(worker_id, request_id)
                        self._notify()
                    yield chunk
            finally:
                await upstream.aclose()
                self._end(worker_id, request_id)

        return StreamingResponse(stream(), status_code=200, headers=_reply_headers(upstream.headers))

    def _end(self, worker_id: str, request_id: str) -> None:
        self.state = self.state.finish(worker_id, request_id)
        self._notify()

    async def handle_passthrough(self, method: str, path_qs: str, raw: bytes, headers: dict[str, str]):
        from starlette.responses import JSONResponse, Response

        assert self._client is not None
        try:
            upstream = await self._client.request(method, path_qs, content=raw, headers=_forward_headers(headers))
        except httpx.HTTPError as exc:
            return JSONResponse({"error": {"message": f"frontend unreachable: {exc}"}}, status_code=502)
        return Response(upstream.content, status_code=upstream.status_code, headers=_reply_headers(upstream.headers))

    def status(self) -> dict[str, Any]:
        return {
            "policy": self.settings.policy.value,
            "ttft_ms": self.settings.targets.ttft_ms,
            "itl_ms": self.settings.targets.tpot_ms,
            "workers": {
                w.worker_id: {
                    "placed": self.placed[w.worker_id],
                    "prefilling": len(w.prefilling),
                    "decoding": len(w.decoding),
                }
                for w in self.state.workers
            },
            "placed": dict(self.placed),
            "queued": self.counts["queued"],
            "overdue": self.counts["overdue"],
            "rejected": self.counts["rejected"],
            "no_worker": self.counts["no_worker"],
            "upstream_errors": self.counts["upstream_errors"],
        }

    def metrics_text(self) -> str:
        lines = [
            "# HELP planner_route_placed_total Requests the proxy sent to each worker.",
            "# TYPE planner_route_placed_total counter",
        ]
        lines += [f'planner_route_placed_total{{worker_id="{w}"}} {n}' for w, n in sorted(self.placed.items())]
        for name, help_text in (
            ("queued", "Requests held at the proxy: no worker predicted to meet the SLO on arrival."),
            ("overdue", "Queued requests placed on the lowest prediction once their wait reached the TTFT target."),
            ("rejected", "Requests answered 503: no worker predicted to meet the SLO (policy reject)."),
            ("no_worker", "Requests answered 503: no worker registered."),
        ):
            lines += [
                f"# HELP planner_route_{name}_total {help_text}",
                f"# TYPE planner_route_{name}_total counter",
                f"planner_route_{name}_total {self.counts[name]}",
            ]
        lines += [
            "# HELP planner_route_in_flight Requests in flight per worker.",
            "# TYPE planner_route_in_flight gauge",
        ]
        lines += [
            f'planner_route_in_flight{{worker_id="{w.worker_id}"}} {len(w.prefilling) + len(w.decoding)}'
            for w in self.state.workers
        ]
        return "\n".join(lines) + "\n"


def _forward_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}


def _reply_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}}


def build_app(proxy: RouteProxy):
    """The proxy as an ASGI (Starlette) application."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    async def routed(request: Request):
        return await proxy.handle_routed(request.url.path, await request.body(), dict(request.headers))

    async def passthrough(request: Request):
        path_qs = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return await proxy.handle_passthrough(request.method, path_qs, await request.body(), dict(request.headers))

    async def metrics(_: Request):
        return PlainTextResponse(proxy.metrics_text(), media_type="text/plain; version=0.0.4")

    async def status(_: Request):
        return JSONResponse(proxy.status())

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    routes = [Route(p, routed, methods=["POST"]) for p in ROUTED_PATHS]
    routes += [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/route/status", status, methods=["GET"]),
        Route("/{path:path}", passthrough, methods=methods),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
