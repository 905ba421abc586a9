"""A Kubernetes API server for tests: kmock's stateful emulator over real HTTP, extended where it falls short.

kmock's `KubernetesEmulator` stores objects and serves GET, list, watch and merge-patch PATCH. The Kubernetes
connector relies on more, which this module adds by wrapping the emulator's request handler:

- `metadata.resourceVersion` (one counter for the server) and `metadata.generation` (bumped when `spec`
  changes) on every stored object, and optimistic concurrency: a write whose object carries a
  resourceVersion other than the stored one answers 409 Conflict, as the real API server does;
- PUT (replace; a custom resource needs a resourceVersion, else 422) and RFC 6902 JSON Patch
  (`application/json-patch+json`; a failed `test` answers 422); writes to the main resource never change
  `status` (the DGD and its adapters have a status subresource);
- the `scale` subresource of scaling adapters: an `autoscaling/v1` Scale view of `spec.replicas` and
  `status.replicas`, read with GET and written with PUT or merge PATCH;
- faults: the next N requests matching a method and path answer a given status (500, 503, ...), and
  "interference": a concurrent writer changes an object just before a matching request is handled, so the
  request's resourceVersion is stale and the 409 comes from the semantics above rather than being faked;
- `settle()`, a minimal operator: it copies adapter replicas into the DGD and reports every component ready;
- SelfSubjectAccessReviews (`planner doctor`), answered from the RBAC rules `grant()` set, as the API server
  answers for a ServiceAccount bound to a Role with those rules (none set: every review is allowed);
- core v1 Pods (the deletion cost set before a scale-down): LIST filtered by an equality `labelSelector`, and
  merge PATCH;
- apps/v1 Deployments and StatefulSets (for the workload connector): GET, LIST filtered by an equality
  `labelSelector`, the `scale` subresource (a write bumps `metadata.generation`, as the real server does), and
  `settle_workload()`, a miniature workload controller (status caught up, or a rollout left in progress).

The server runs in a background thread with its own event loop, so the synchronous `kubernetes` client (and
the planner code under test) talk to it over real HTTP on 127.0.0.1. Every request is logged with its
status (`requests`), for assertions such as "exactly one write".
"""

from __future__ import annotations

import asyncio
import copy
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock

GROUP = "nvidia.com"
DGD = "dynamographdeployments"
DGDSA = "dynamographdeploymentscalingadapters"
APPS = "apps"
DEPLOYMENTS = "deployments"
STATEFULSETS = "statefulsets"
APPS_PLURALS = frozenset({DEPLOYMENTS, STATEFULSETS})
HPAS = "horizontalpodautoscalers"  # autoscaling/v2: what `planner k8s-check` looks for beside the planner
SCALEDOBJECTS = "scaledobjects"  # keda.sh/v1alpha1
EVENTS = "events"  # core v1: the Events the planner posts on the scaled object
PODS = "pods"  # core v1: listed by labels and merge-patched (the deletion cost before a scale-down)
_OTHER_RESOURCES = {
    PODS: ("", "v1"),
    HPAS: ("autoscaling", "v2"),
    SCALEDOBJECTS: ("keda.sh", "v1alpha1"),
    EVENTS: ("", "v1"),
}


@dataclass
class Fault:
    """Answer the next `times` requests whose method and path match with `status`."""

    method: str
    path: re.Pattern[str]
    status: int
    times: int
    reason: str = "Injected"


@dataclass
class Interference:
    """Before the next `times` matching requests, a concurrent writer applies `mutate` to the object."""

    method: str
    path: re.Pattern[str]
    plural: str
    name: str
    mutate: Callable[[dict[str, Any]], None]
    times: int = 1


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    status: int
    body: Any = field(default=None, compare=False)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch (null deletes a key; non-objects replace)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _conflict(plural: str, name: str) -> kmock.KubernetesError:
    group = APPS if plural in APPS_PLURALS else GROUP
    return kmock.KubernetesError(
        status=409,
        reason="Conflict",
        message=(
            f'Operation cannot be fulfilled on {plural}.{group} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again"
        ),
    )


@attrs.define(kw_only=True)
class ExtendedEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus resourceVersion/409, PUT, JSON Patch, the scale subresource and faults."""

    faults: list[Fault] = attrs.field(factory=list)
    interferences: list[Interference] = attrs.field(factory=list)
    log: list[LoggedRequest] = attrs.field(factory=list)
    version: str = "v1beta1"
    access_rules: list[dict[str, Any]] | None = None  # a Role's rules: what SelfSubjectAccessReviews allow
    _next_rv: int = 1000

    # --- object store helpers (call with self._lock held, or from the loop thread) ----------------------

    def resource(self, plural: str) -> kmock.resource:
        if plural in APPS_PLURALS:
            return kmock.resource(APPS, "v1", plural)
        if plural in _OTHER_RESOURCES:
            return kmock.resource(*_OTHER_RESOURCES[plural], plural)
        return kmock.resource(GROUP, self.version, plural)

    def bump(self) -> str:
        self._next_rv += 1
        return str(self._next_rv)

    def store(self, plural: str, namespace: str, name: str, body: dict[str, Any], *, previous: dict | None) -> dict:
        """Store a new version of an object: new resourceVersion; generation +1 when `spec` changed."""
        body = copy.deepcopy(body)
        metadata = body.setdefault("metadata", {})
        metadata.update(name=name, namespace=namespace, resourceVersion=self.bump())
        if previous is None:
            metadata.setdefault("generation", 1)
            metadata.setdefault("uid", f"uid-{plural}-{name}")
        else:
            generation = (previous.get("metadata") or {}).get("generation", 1)
            metadata["generation"] = generation + (1 if body.get("spec") != previous.get("spec") else 0)
        key = (self.resource(plural), namespace, name)
        if key in self.objects and not self.objects[key].deleted:
            self.objects[key].history.append(body)
        else:
            self.objects[key] = body
        return body

    def current(self, plural: str, namespace: str | None, name: str | None) -> dict[str, Any]:
        key = (self.resource(plural), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return copy.deepcopy(self.objects[key].raw)

    # --- request handling --------------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        method = str(getattr(request.method, "value", request.method))
        try:
            response = await self._extended(request)
        except kmock.KubernetesError as exc:
            self.log.append(LoggedRequest(method, request.url.path, exc.status, request.data))
            raise
        except Exception:
            self.log.append(LoggedRequest(method, request.url.path, 500, request.data))
            raise
        self.log.append(LoggedRequest(method, request.url.path, response.status, request.data))
        return response

    def _take(self, items: list, request: kmock.Request) -> Any:
        for item in items:
            if item.times > 0 and item.method == request.method and item.path.search(request.url.path):
                item.times -= 1
                return item
        return None

    async def _extended(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        fault = self._take(self.faults, request)
        if fault is not None:
            raise kmock.KubernetesError(status=fault.status, reason=fault.reason, message=f"injected {fault.status}")
        interference = self._take(self.interferences, request)
        if interference is not None:
            async with self._lock:
                obj = self.current(interference.plural, request.namespace, interference.name)
                changed = copy.deepcopy(obj)
                interference.mutate(changed)
                self.store(interference.plural, request.namespace, interference.name, changed, previous=obj)
        if request.method == "POST" and request.url.path.endswith("/selfsubjectaccessreviews"):
            return self._access_review(request.data or {})
        resource = request.resource
        if resource is not None and resource.group == APPS and resource.plural in APPS_PLURALS:
            return await self._apps(request, resource.plural)
        if resource is not None and resource.group == "" and resource.plural == PODS:
            if request.name is None and request.method == "GET":
                return await self._list(request, PODS)
            if request.method == "PATCH":
                return await self._write(request, PODS)
        if resource is None or resource.group != GROUP or request.name is None:
            return await super()._handle(request)
        plural = resource.plural
        if request.subresource == "scale":
            return await self._scale(request, plural)
        if request.subresource is None and request.method in ("PUT", "PATCH"):
            return await self._write(request, plural)
        return await super()._handle(request)

    def _access_review(self, review: dict[str, Any]) -> aiohttp.web.StreamResponse:
        """Allowed when a rule names the group, the resource (`plural/subresource`) and the verb, and names the object
        or no object (RBAC's matching; no wildcards: the project's Roles use none)."""
        attributes = (review.get("spec") or {}).get("resourceAttributes") or {}
        resource = attributes.get("resource", "")
        if attributes.get("subresource"):
            resource += "/" + attributes["subresource"]
        allowed = self.access_rules is None or any(
            attributes.get("group", "") in rule.get("apiGroups", [])
            and resource in rule.get("resources", [])
            and attributes.get("verb") in rule.get("verbs", [])
            and (not rule.get("resourceNames") or attributes.get("name") in rule["resourceNames"])
            for rule in self.access_rules
        )
        body = {**review, "status": {"allowed": allowed}}
        return aiohttp.web.json_response(body, status=201)

    async def _write(self, request: kmock.Request, plural: str) -> aiohttp.web.StreamResponse:
        async with self._lock:
            old = self.current(plural, request.namespace, request.name)
            old_rv = old["metadata"]["resourceVersion"]
            content_type = request.headers.get("Content-Type", "")
            if request.method == "PUT":
                new = copy.deepcopy(request.data)
                sent_rv = (new.get("metadata") or {}).get("resourceVersion")
                if not sent_rv:
                    raise kmock.KubernetesError(
                        status=422,
                        reason="Invalid",
                        message="metadata.resourceVersion: must be specified for an update",
                    )
            elif "json-patch" in content_type:
                try:
                    new = jsonpatch.apply_patch(old, request.data)
                except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                    raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
            else:
                new = _merge_patch(old, request.data)
            if (new.get("metadata") or {}).get("resourceVersion", old_rv) != old_rv:
                raise _conflict(plural, request.name)
            if "status" in old:
                new["status"] = old["status"]  # status is a subresource: main-resource writes never change it
            else:
                new.pop("status", None)
            stored = self.store(plural, request.namespace, request.name, new, previous=old)
        return aiohttp.web.json_response(stored)

    async def _apps(self, request: kmock.Request, plural: str) -> aiohttp.web.StreamResponse:
        if request.subresource == "scale":
            return await self._scale(request, plural)
        if request.name is None and request.method == "GET":
            return await self._list(request, plural)
        if request.subresource is None and request.method in ("PUT", "PATCH"):
            return await self._write(request, plural)
        return await super()._handle(request)

    async def _list(self, request: kmock.Request, plural: str) -> aiohttp.web.StreamResponse:
        """LIST in a namespace, filtered by an equality-only `labelSelector` (`k=v,k2=v2`)."""
        wanted: dict[str, str] = {}
        for term in filter(None, (request.params.get("labelSelector") or "").split(",")):
            key, sep, value = term.partition("=")
            if not sep or key.endswith("!"):
                raise kmock.KubernetesError(status=400, reason="BadRequest", message=f"unsupported selector {term}")
            wanted[key.strip()] = value.strip()
        async with self._lock:
            items = [
                copy.deepcopy(obj.raw)
                for (resource, namespace, _name), obj in self.objects.items()
                if resource == self.resource(plural) and namespace == request.namespace and not obj.deleted
            ]
        items = [
            item
            for item in items
            if all(((item.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]
        kind = {DEPLOYMENTS: "DeploymentList", STATEFULSETS: "StatefulSetList", PODS: "PodList"}[plural]
        return aiohttp.web.json_response(
            {
                "apiVersion": "v1" if plural == PODS else "apps/v1",
                "kind": kind,
                "metadata": {"resourceVersion": str(self._next_rv)},
                "items": items,
            }
        )

    def _scale_view(self, obj: dict[str, Any]) -> dict[str, Any]:
        metadata = obj["metadata"]
        if (obj.get("kind") or "") in ("Deployment", "StatefulSet"):
            labels = (((obj.get("spec") or {}).get("selector") or {}).get("matchLabels")) or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        else:
            selector = (obj.get("status") or {}).get("selector", "")
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "resourceVersion": metadata["resourceVersion"],
                "uid": metadata.get("uid"),
            },
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
            "status": {
                "replicas": (obj.get("status") or {}).get("replicas", 0),
                "selector": selector,
            },
        }

    async def _scale(self, request: kmock.Request, plural: str) -> aiohttp.web.StreamResponse:
        if plural != DGDSA and plural not in APPS_PLURALS:
            raise kmock.KubernetesNotFoundError(message=f"{plural} has no scale subresource here")
        async with self._lock:
            obj = self.current(plural, request.namespace, request.name)
            if request.method == "GET":
                return aiohttp.web.json_response(self._scale_view(obj))
            if request.method not in ("PUT", "PATCH"):
                raise kmock.KubernetesError(status=405, reason="MethodNotAllowed", message=request.method)
            body = request.data or {}
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != obj["metadata"]["resourceVersion"]:
                raise _conflict(plural, request.name)
            replicas = (body.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=f"spec.replicas = {replicas!r}")
            new = copy.deepcopy(obj)
            new.setdefault("spec", {})["replicas"] = replicas
            stored = self.store(plural, request.namespace, request.name, new, previous=obj)
        return aiohttp.web.json_response(self._scale_view(stored))


class KubeApiServer:
    """An `ExtendedEmulator` served over HTTP from a background thread; thread-safe helpers for tests."""

    def __init__(self, namespace: str = "planner-test", version: str = "v1beta1") -> None:
        self.namespace = namespace
        self.emulator = ExtendedEmulator(version=version)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-api", daemon=True)
        self.url = ""

    def _run(self) -> None:
        async def main() -> None:
            async with self.emulator, kmock.Server(self.emulator) as server:
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()

        asyncio.run(main())

    def __enter__(self) -> KubeApiServer:
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("the emulated API server did not start")
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's loop with the object lock held (no request sees a half-made change)."""
        assert self._loop is not None

        async def locked() -> Any:
            async with self.emulator._lock:
                return fn()

        return asyncio.run_coroutine_threadsafe(locked(), self._loop).result(timeout=10)

    # --- objects ---------------------------------------------------------------------------------------

    def put(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (as an operator or a user would), with a new resourceVersion."""
        name = body["metadata"]["name"]

        def put() -> dict[str, Any]:
            key = (self.emulator.resource(plural), self.namespace, name)
            exists = key in self.emulator.objects and not self.emulator.objects[key].deleted
            previous = self.emulator.current(plural, self.namespace, name) if exists else None
            return self.emulator.store(plural, self.namespace, name, body, previous=previous)

        return self._call(put)

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return self._call(lambda: self.emulator.current(plural, self.namespace, name))

    def update(self, plural: str, name: str, mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Change an object in place (status included), as its controller would."""

        def update() -> dict[str, Any]:
            obj = self.emulator.current(plural, self.namespace, name)
            new = copy.deepcopy(obj)
            mutate(new)
            return self.emulator.store(plural, self.namespace, name, new, previous=obj)

        return self._call(update)

    def delete(self, plural: str, name: str) -> None:
        def delete() -> None:
            self.emulator.objects[self.emulator.resource(plural), self.namespace, name].delete()

        self._call(delete)

    def grant(self, rules: list[dict[str, Any]]) -> None:
        """From now on SelfSubjectAccessReviews answer as for a ServiceAccount whose Role has `rules`."""
        self._call(lambda: setattr(self.emulator, "access_rules", [dict(rule) for rule in rules]))

    # --- faults ----------------------------------------------------------------------------------------

    def fail(self, method: str, path_pattern: str, status: int, times: int = 1) -> None:
        """The next `times` requests `method` on a path matching `path_pattern` answer `status`."""
        reason = {500: "Internal Server Error", 503: "Service Unavailable", 429: "Too Many Requests"}.get(status, "")
        fault = Fault(method, re.compile(path_pattern), status, times, reason or "Injected")
        self._call(lambda: self.emulator.faults.append(fault))

    def interfere(
        self, method: str, path_pattern: str, plural: str, name: str, mutate: Callable[[dict], None], times: int = 1
    ) -> None:
        """A concurrent writer changes `plural/name` just before the next matching request is handled."""
        item = Interference(method, re.compile(path_pattern), plural, name, mutate, times)
        self._call(lambda: self.emulator.interferences.append(item))

    # --- the operator, in miniature ---------------------------------------------------------------------

    def settle(self, dgd_name: str, *, ready: bool = True) -> None:
        """Act as Dynamo's operator: adapters' replicas into the DGD, then every component reported ready."""

        def settle() -> None:
            emulator = self.emulator
            dgd = emulator.current(DGD, self.namespace, dgd_name)
            new = copy.deepcopy(dgd)
            spec = new["spec"]
            for (resource, namespace, name), obj in list(emulator.objects.items()):
                if resource.plural != DGDSA or namespace != self.namespace or obj.deleted:
                    continue
                adapter = copy.deepcopy(obj.raw)
                ref = (adapter.get("spec") or {}).get("dgdRef") or {}
                if ref.get("name") != dgd_name:
                    continue
                replicas = adapter["spec"]["replicas"]
                component = ref.get("componentName") or ref.get("serviceName")
                if "components" in spec:
                    for entry in spec["components"]:
                        if entry["name"] == component:
                            entry["replicas"] = replicas
                else:
                    spec["services"][component]["replicas"] = replicas
                if adapter.get("status", {}).get("replicas") != replicas:
                    adapter["status"] = {"replicas": replicas, "selector": f"component={component}"}
                    emulator.store(DGDSA, namespace, name, adapter, previous=obj.raw)
            stored = emulator.store(DGD, self.namespace, dgd_name, new, previous=dgd)
            entries = (
                [(c["name"], c.get("replicas", 1)) for c in spec["components"]]
                if "components" in spec
                else [(n, s.get("replicas", 1)) for n, s in spec["services"].items()]
            )
            stored["status"] = {
                "observedGeneration": stored["metadata"]["generation"],
                "state": "successful" if ready else "pending",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "all_resources_are_ready" if ready else "pods_not_ready",
                        "message": "" if ready else "some pods are not ready",
                    }
                ],
                "components": {
                    name: {
                        "componentKind": "Deployment",
                        "replicas": replicas,
                        "updatedReplicas": replicas,
                        "readyReplicas": replicas if ready else 0,
                        "availableReplicas": replicas if ready else 0,
                    }
                    for name, replicas in entries
                },
            }
            emulator.store(DGD, self.namespace, dgd_name, stored, previous=stored)

        self._call(settle)

    def settle_workload(self, plural: str, name: str, *, ready: bool = True, rolling: bool = False) -> None:
        """Act as the Deployment/StatefulSet controller: status caught up with the spec's generation and replicas.

        `ready=False`: the pods exist but none is available; `rolling=True`: a template change half rolled out
        (one replica on the new template; a StatefulSet's revisions differ).
        """

        def settle() -> None:
            obj = self.emulator.current(plural, self.namespace, name)
            new = copy.deepcopy(obj)
            replicas = (new.get("spec") or {}).get("replicas", 1)
            updated = min(1, replicas) if rolling else replicas
            status: dict[str, Any] = {
                "observedGeneration": new["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": updated,
                "readyReplicas": replicas if ready else 0,
                "availableReplicas": replicas if ready else 0,
            }
            if plural == STATEFULSETS:
                status["currentRevision"] = f"{name}-1"
                status["updateRevision"] = f"{name}-2" if rolling else f"{name}-1"
            new["status"] = status
            self.emulator.store(plural, self.namespace, name, new, previous=obj)

        self._call(settle)

    # --- assertions ------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[LoggedRequest]:
        return self._call(lambda: list(self.emulator.log))

    def writes(self) -> list[LoggedRequest]:
        """Requests that tried to change something (PUT/PATCH/POST/DELETE), with their status."""
        return [r for r in self.requests if r.method in ("PUT", "PATCH", "POST", "DELETE")]

    def successful_writes(self) -> list[LoggedRequest]:
        return [r for r in self.writes() if 200 <= r.status < 300]


# --- RBAC, as the Role tests compare it --------------------------------------------------------------------


def rules_by_resource(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """A Role's rules as {(api group, resource as RBAC names it): verbs}."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def access_by_resource(accesses: Any) -> dict[tuple[str, str], set[str]]:
    """A connector's `REQUIRED_ACCESS` in the same form as `rules_by_resource`."""
    needed: dict[tuple[str, str], set[str]] = {}
    for access in accesses:
        needed.setdefault((access.group, access.rbac_resource), set()).add(access.verb)
    return needed
