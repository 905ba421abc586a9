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
  `reject` answers 503 at once. With no worker registered at all, both answer 503, unless the proxy wakes a pool at
  zero (`wake`, `planner route-proxy --wake-deployment`): then the request is held (at most `max_held` at once,
  503 `held_overflow` past that) until a worker registers and the frontend lists a model, for at most `timeout_s`
  (504 `wake_timeout`), while the proxy sends `NOTIFY planner_wake` (`planner_core.runtime.wake`) at the first hold
  and every `renotify_s` while it holds any; the planner's wake tick scales the pool up.
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
class WakeSettings:
    """Holding requests for a pool at zero and waking the planner (`planner_core.runtime.wake`)."""

    deployment: str  # the planner's deployment the NOTIFY names
    database_url: str  # the planner's database (the NOTIFY's channel)
    max_held: int = 256  # requests held at once; more are answered 503 `held_overflow`
    timeout_s: float = 300.0  # the longest hold; then 504 `wake_timeout`
    renotify_s: float = 5.0  # NOTIFY again this often while requests are held (a notification is not stored)


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
    wake: WakeSettings | None = None  # None: no worker registered answers 503 at once


class RouteProxy:
    """The proxy's state and handlers (one asyncio loop: the state changes between awaits only)."""

    def __init__(self, settings: ProxySettings, predictor: LatencyPredictor) -> None:
        self.settings = settings
        self.predictor = predictor
        self.state = DispatchState()
        self.placed: Counter[str] = Counter()
        # queued, rejected, overdue, no_worker, upstream_errors; with wake: held, held_overflow, wake_timeout,
        # wakes_sent, wake_errors
        self.counts: Counter[str] = Counter()
        self.num_held = 0  # requests held now for a pool at zero
        self.wake_waits_s: list[float] = []  # each woken request's hold (s), newest last (the last 1000)
        self._last_wake_sent: float | None = None  # loop time of the last NOTIFY
        self._wake_sending = False
        self._wake_task: asyncio.Task | None = None
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
            if self.num_held and self._wake_due():
                # kept referenced until done (a bare task may be collected); its errors are counted, never raised
                self._wake_task = asyncio.create_task(self._send_wake())
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
                if s.wake is None:
                    return None, "no_worker"
                outcome = await self._hold_for_worker(s.wake)
                if outcome != "woken":
                    return None, outcome
                continue
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

    # ---------------------------------------------------------------------------------------------------- wake

    def _wake_due(self) -> bool:
        wake = self.settings.wake
        if wake is None or self._wake_sending:
            return False
        now = asyncio.get_running_loop().time()
        return self._last_wake_sent is None or now - self._last_wake_sent >= wake.renotify_s

    async def _send_wake(self) -> None:
        """NOTIFY the planner of the requests held now (off the event loop); a failure is counted and the next
        renotification tries again."""
        from planner_core.runtime.wake import send_wake

        wake = self.settings.wake
        assert wake is not None
        self._wake_sending = True
        self._last_wake_sent = asyncio.get_running_loop().time()
        try:
            await asyncio.to_thread(send_wake, wake.database_url, wake.deployment, self.num_held)
            self.counts["wakes_sent"] += 1
        except Exception:  # the database is unreachable: the hold goes on, the next renotification retries
            self.counts["wake_errors"] += 1
        finally:
            self._wake_sending = False

    async def _hold_for_worker(self, wake: WakeSettings) -> str:
        """Hold a request while no worker is registered: `woken` once one is and the frontend lists a model,
        `held_overflow` when `max_held` are held already, `wake_timeout` after `timeout_s`."""
        if self.num_held >= wake.max_held:
            self.counts["held_overflow"] += 1
            return "held_overflow"
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + wake.timeout_s
        self.num_held += 1
        self.counts["held"] += 1
        try:
            if self.num_held == 1 or self._wake_due():
                await self._send_wake()
            while not self.state.workers:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self.counts["wake_timeout"] += 1
                    return "wake_timeout"
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), timeout=remaining)
                except TimeoutError:
                    pass
            # the frontend watches the same discovery store: forward only once it serves a model too
            while not await self._frontend_lists_a_model():
                if loop.time() >= deadline:
                    self.counts["wake_timeout"] += 1
                    return "wake_timeout"
                await asyncio.sleep(0.2)
            self.wake_waits_s = [*self.wake_waits_s[-999:], loop.time() - started]
            return "woken"
        finally:
            self.num_held -= 1

    async def _frontend_lists_a_model(self) -> bool:
        assert self._client is not None
        try:
            reply = await self._client.get("/v1/models", timeout=5.0)
            return reply.status_code == 200 and bool(reply.json().get("data"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

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
            if how in ("no_worker", "rejected"):
                self.counts[how] += 1  # the hold counts its own refusals
            message, status = _REFUSALS[how]
            return JSONResponse({"error": {"message": message, "type": how}}, status_code=status)
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
            **(
                {}
                if self.settings.wake is None
                else {
                    "held_now": self.num_held,
                    **{
                        k: self.counts[k]
                        for k in ("held", "held_overflow", "wake_timeout", "wakes_sent", "wake_errors")
                    },
                    "wake_waits_s": self.wake_waits_s[-100:],
                }
            ),
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
            ("held", "Requests held for a pool at zero until a worker registered (wake)."),
            ("held_overflow", "Requests answered 503: the most requests were held already (wake)."),
            ("wake_timeout", "Held requests answered 504: no worker registered within the hold (wake)."),
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


# Why a request was not placed: its answer's message and status.
_REFUSALS = {
    "no_worker": ("no worker registered", 503),
    "rejected": ("no worker predicted to meet the SLO", 503),
    "held_overflow": ("no worker registered and the most requests are held already; retry later", 503),
    "wake_timeout": ("no worker registered within the wake hold", 504),
}


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
