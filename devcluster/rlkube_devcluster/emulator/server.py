"""A Kubernetes API emulator good enough for the real kopf operator and the real kubectl.

``Emulator`` subclasses kmock's ``KubernetesEmulator``; it keeps kmock's server, request log,
reaction DSL (a test can still inject ``emulator['patch', ...] << 500``) and ``objects`` view, and
replaces what kmock 0.8 gets wrong or lacks (see DESIGN.md, testing tier 3):

* request paths are parsed here (kmock's parser fails on ``/api/v1/namespaces[/x]``);
* the object rules live in :mod:`.store` (server-set fields, 201 on create, PUT, conflicts,
  status and scale subresources, admission of custom resources, finalizers, garbage collection);
* patches in :mod:`.patches` (merge, JSON, strategic merge, server-side apply creating objects);
* label and field selectors in :mod:`.selectors`; watches resume from a resourceVersion, end
  after ``timeoutSeconds`` and answer 410 Gone when the version is too old;
* discovery lists every CRD applied, with ``/status`` and ``/scale`` subresources;
* ``Accept: ...;as=Table`` gets server-side tables (printer columns) as kubectl asks for.

Controllers that a real cluster runs beside the API server (the StatefulSet controller and a
kubelet) are in :mod:`.controllers`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import dsl, enums, parsing, rendering

from rlkube_devcluster.emulator import openapi, patches
from rlkube_devcluster.emulator.resources import ResourceType
from rlkube_devcluster.emulator.selectors import SelectorError, object_matcher, selector_string
from rlkube_devcluster.emulator.store import Store, api_error, not_found, now_rfc3339
from rlkube_devcluster.emulator.tables import table

#: Longest watch when the client names no timeoutSeconds (the API server picks 30-60 minutes).
DEFAULT_WATCH_SECONDS = 1800


def _sees(view: Any, request: rendering.Request) -> bool:
    """Whether a kmock view would include ``request``, checking only this request."""
    if isinstance(view, dsl.Root):
        return True
    if type(view) is dsl.Filter:
        return bool(view.criteria(request)) and _sees(view._source, request)
    if type(view) in (dsl.Priority, dsl.Chained, dsl.Reaction):
        return _sees(view._source, request)
    return request in view  # slices, groups, exclusions: kmock's own (slow, rare) check


def _priority_key(payloads: list[Any]) -> Any:
    # As kmock: pad mixed-length priorities with zeroes, highest first.
    length = max((len(p.priorities) for p in payloads), default=0)
    return lambda p: tuple(-x for x in p.priorities) + (0,) * (length - len(p.priorities))


def parse_path(path: str) -> parsing.ParsedPath:
    """``/api/v1[/namespaces/NS]/PLURAL[/NAME[/SUB]]`` and ``/apis/G/V/...``, namespaces included."""
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return parsing.ParsedPath()
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return parsing.ParsedPath(group, version, plural, namespace, name, subresource)


async def parse_request(raw: aiohttp.web.BaseRequest, *, id: int) -> rendering.Request:
    body = await raw.read()
    text = body.decode("utf-8", "replace")
    data: Any = None
    if body:
        try:
            data = json.loads(text)
        except ValueError:
            try:
                data = yaml.safe_load(text)  # apply-patch+yaml
            except yaml.YAMLError:
                data = None
    k8s = parse_path(raw.path)
    resource = (
        None if k8s.group is None else kmock.resource(group=k8s.group, version=k8s.version, plural=k8s.plural)
    )
    method = enums.method(raw.method)
    return rendering.Request(
        id=id,
        raw_request=raw,
        url=raw.url,
        method=raw.method,
        params=dict(raw.query),
        headers=dict(raw.headers),
        cookies=dict(raw.cookies),
        data=data,
        body=body,
        text=text,
        action=parsing.guess_k8s(k8s, method, dict(raw.query)),
        resource=resource,
        namespace=k8s.namespace,
        name=k8s.name,
        subresource=k8s.subresource,
    )


class Answer(Exception):
    """A finished aiohttp response, carried past kmock's renderer to :meth:`Emulator.__call__`.

    kmock renders what a reaction returns, but a returned ``kmock.Response`` changes the status of
    the reaction itself for every later request; so the emulator answers by raising this.
    """

    def __init__(self, response: aiohttp.web.StreamResponse) -> None:
        super().__init__()
        self.response = response


def json_answer(payload: Any, status: int = 200) -> Answer:
    return Answer(aiohttp.web.json_response(payload, status=status))


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    #: (user, verb, group, resource[/subresource], namespace) of every resource request, for RBAC checks.
    audit: list[tuple[str, str, str, str, str | None]] = attrs.field(factory=list, init=False)
    store: Store = attrs.field(init=False)
    closing: bool = attrs.field(default=False, init=False)
    #: ``container_log(pod, previous=...) -> Path | None`` of a kubelet that runs containers (pods/log).
    pod_logs: Callable[..., Path | None] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        # kmock's scaffold: discovery endpoints (overridden below) and the 404 fallback; not the
        # emulator's own object handling, which this class replaces.
        kmock.KubernetesScaffold.__attrs_post_init__(self)
        self.store = Store(self._objects)
        self.fallback[self._is_resource_request] << self._serve
        self.fallback["get", "/openapi/v2"] << kmock.KubernetesNotFoundError
        self.fallback["get", re.compile(r"/openapi/v3(/.*)?")] << self._serve_openapi_v3
        for ns in ("default", "kube-system"):
            namespaces = self.store.find("", "v1", "namespaces")
            assert namespaces is not None
            self.store.create(namespaces, None, {"metadata": {"name": ns}})

    # Request intake ------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """As kmock's, with our path parser; API errors are answers, not test failures."""
        await raw_request.read()
        request = await parse_request(raw_request, id=len(self._requests))
        if len(self._requests) > 20000:
            del self._requests[:10000]  # a long session stays small (tests read recent requests)
        self._requests.append(request)
        try:
            return await self._handle(request)
        except Answer as answer:
            return answer.response
        except rendering.StreamingError as exc:
            if isinstance(exc.__cause__, Answer):
                return exc.__cause__.response
            return exc.args[0]
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        except Exception as exc:
            if self._errors:
                self._errors[-1].append(exc)
            return await self._render_error(exc)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """kmock's dispatch by priority, but a filter chain is tested on this request alone.

        kmock asks ``request in view``, which replays every request ever served through the
        view's filters: quadratic, and minutes per apply after a few thousand requests.
        """
        payloads = sorted(self._payloads, key=_priority_key(self._payloads))
        for payload in payloads:
            if not payload._disabled.is_set() and _sees(payload._source, request):
                try:
                    return await payload(request)
                except rendering.ReactionMismatchError:
                    payload._disabled.set()
                except NotImplementedError:
                    pass
        raise NotImplementedError("no reaction matches the request")

    @staticmethod
    def _is_resource_request(request: rendering.Request) -> bool:
        return request.resource is not None and request.resource.plural is not None

    def shutdown(self) -> None:
        """End every open watch so the server can stop at once."""
        self.closing = True
        self.store.wake()

    # Discovery -------------------------------------------------------------------------------------

    async def _serve_server_version(self, request: rendering.Request) -> dict[str, Any]:
        return {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.0-rlkube-emulator",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.23",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    async def _serve_api(self, request: rendering.Request) -> dict[str, Any]:
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rtype in self.store.types.values():
            if rtype.group and rtype.version not in groups.setdefault(rtype.group, []):
                groups[rtype.group].append(rtype.version)
        return groups

    @staticmethod
    def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": listed, "preferredVersion": listed[0]}

    async def _serve_apis(self, request: rendering.Request) -> dict[str, Any]:
        groups = [self._group_doc(g, vs) for g, vs in sorted(self._groups().items())]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    async def _serve_group(self, request: rendering.Request) -> dict[str, Any]:
        group = request.url.path.strip("/").split("/")[1]
        versions = self._groups().get(group)
        if not versions:
            raise api_error(404, "NotFound", f"the server could not find the requested resource ({group})")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group, versions)}

    async def _serve_version(self, request: rendering.Request) -> dict[str, Any]:
        parts = request.url.path.strip("/").split("/")
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        types = [t for t in self.store.types.values() if t.group == group and t.version == version]
        if not types:
            raise api_error(
                404, "NotFound", f"the server could not find the requested resource ({group}/{version})"
            )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for t in types for entry in t.discovery()],
        }

    async def _serve_openapi_v3(self, request: rendering.Request) -> dict[str, Any]:
        """``/openapi/v3`` (the index) and ``/openapi/v3/apis/<group>/<version>`` (one document)."""
        path = request.url.path.removeprefix("/openapi/v3").strip("/")
        types = list(self.store.types.values())
        if not path:
            return openapi.index(types)
        members = openapi.by_group_version(types).get(path)
        if not members:
            raise api_error(404, "NotFound", f"the server could not find the requested resource ({path})")
        return openapi.document(members)

    # Resources -------------------------------------------------------------------------------------

    async def _serve(self, request: rendering.Request) -> Any:
        if request.method == "GET" and request.params.get("watch") in ("true", "1"):
            rtype, ns = self._target(request)
            raise Answer(await self._stream_watch(request, rtype, ns))
        if request.method == "GET" and request.subresource == "log" and request.name:
            rtype, ns = self._target(request)
            raise Answer(await self._serve_log(request, rtype, ns))
        result = self._serve_sync(request)
        if isinstance(result, Answer):
            raise result
        raise json_answer(result)

    def _target(self, request: rendering.Request) -> tuple[ResourceType, str | None]:
        resource = request.resource
        assert resource is not None
        assert resource.plural is not None
        rtype = self.store.find(resource.group or "", resource.version or "", resource.plural)
        if rtype is None:
            raise api_error(
                404, "NotFound", f"the server could not find the requested resource ({resource.plural})"
            )
        self._record(request, rtype, str(request.method.value))
        return rtype, request.namespace if rtype.namespaced else None

    async def _stream_watch(
        self, request: rendering.Request, rtype: ResourceType, ns: str | None
    ) -> aiohttp.web.StreamResponse:
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request._raw_request)
        try:
            async for event in self._watch(request, rtype, ns):
                if event == b"":
                    continue
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        return response

    async def _serve_log(
        self, request: rendering.Request, rtype: ResourceType, ns: str | None
    ) -> aiohttp.web.StreamResponse:
        """``pods/log`` from the kubelet's log file: all or ``tailLines``, ``previous``, ``follow``."""
        assert request.name is not None
        pod = self.store.get(rtype, ns, request.name)
        if pod is None or "log" not in rtype.subresources:
            raise not_found(rtype, request.name)
        if self.pod_logs is None:
            raise api_error(
                400, "BadRequest", "this emulator's kubelet runs no containers, so there are no logs"
            )

        def flag(name: str) -> bool:
            return request.params.get(name) in ("true", "1")

        path = self.pod_logs(pod, previous=flag("previous"))
        if path is None:
            what = "previous terminated container" if flag("previous") else "container"
            raise api_error(400, "BadRequest", f'{what} of pod "{request.name}" not found (not started yet?)')
        data = path.read_bytes()
        if request.params.get("tailLines", "").isdigit():
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[len(lines) - int(request.params["tailLines"]) :]) if lines else b""
        if not flag("follow"):
            return aiohttp.web.Response(body=data, content_type="text/plain")
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await response.prepare(request._raw_request)
        offset = path.stat().st_size
        try:
            await response.write(data)
            while not self.closing:  # until the container this file belongs to is gone
                await asyncio.sleep(0.2)
                live = self.store.get(rtype, ns, request.name)
                current = self.pod_logs(live, previous=False) if live is not None else None
                with path.open("rb") as log:
                    log.seek(offset)
                    more = log.read()
                offset += len(more)
                if more:
                    await response.write(more)
                if current != path:
                    break
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        return response

    def _serve_sync(self, request: rendering.Request) -> Any:
        resource = request.resource
        assert resource is not None
        assert resource.plural is not None
        rtype = self.store.find(resource.group or "", resource.version or "", resource.plural)
        if rtype is None:
            raise api_error(
                404, "NotFound", f"the server could not find the requested resource ({resource.plural})"
            )
        if rtype.namespaced is False and request.namespace is not None:
            raise api_error(404, "NotFound", f"{rtype.plural} is not namespaced")
        method = str(request.method.value)
        sub = request.subresource
        self._record(request, rtype, method)
        if sub not in (None, *rtype.subresources):
            raise api_error(
                404, "NotFound", f"the server could not find the requested resource ({rtype.plural}/{sub})"
            )
        ns = request.namespace if rtype.namespaced else None

        if method == "GET" and request.name is None:
            return self._list(request, rtype, ns)
        if method == "GET":
            obj = self.store.get(rtype, ns, _named(request))
            if obj is None:
                raise not_found(rtype, _named(request))
            if sub == "scale":
                return self._scale_of(rtype, obj)
            return self._maybe_table(request, rtype, [obj], single=True)
        if method == "POST" and request.name is None:
            if rtype.namespaced and ns is None:
                raise api_error(405, "MethodNotAllowed", "create needs a namespace in the path")
            created = self.store.create(rtype, ns, request.data, strict=_strict(request))
            return json_answer(created, status=201)
        if method == "PUT" and request.name:
            return self._replace(request, rtype, ns)
        if method == "PATCH" and request.name:
            return self._patch(request, rtype, ns)
        if method == "DELETE" and request.name:
            options = request.data if isinstance(request.data, dict) else {}
            propagation = (
                options.get("propagationPolicy") or request.params.get("propagationPolicy") or "Background"
            )
            return self.store.delete(rtype, ns, request.name, propagation=propagation)
        if method == "DELETE":
            matcher = self._matcher(request)
            deleted = [
                self.store.delete(rtype, o["metadata"].get("namespace"), o["metadata"]["name"])
                for o in [copy.deepcopy(i) for i in self.store.items(rtype, ns)]
                if matcher(o)
            ]
            return {"apiVersion": "v1", "kind": f"{rtype.kind}List", "metadata": {}, "items": deleted}
        raise api_error(405, "MethodNotAllowed", f"{method} is not supported here")

    def _record(self, request: rendering.Request, rtype: ResourceType, method: str) -> None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip() or "anonymous"
        if method == "GET":
            verb = (
                "watch"
                if request.params.get("watch") in ("true", "1")
                else ("get" if request.name else "list")
            )
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
                method, method
            )
            if method == "DELETE" and not request.name:
                verb = "deletecollection"
        resource = rtype.plural + (f"/{request.subresource}" if request.subresource else "")
        self.audit.append((token, verb, rtype.group, resource, request.namespace))
        if len(self.audit) > 100000:
            del self.audit[:50000]

    def _matcher(self, request: rendering.Request) -> Any:
        try:
            return object_matcher(request.params.get("labelSelector"), request.params.get("fieldSelector"))
        except SelectorError as exc:
            raise api_error(400, "BadRequest", str(exc)) from exc

    def _list(self, request: rendering.Request, rtype: ResourceType, ns: str | None) -> dict[str, Any]:
        matcher = self._matcher(request)
        items = [o for o in self.store.items(rtype, ns) if matcher(o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return self._maybe_table(request, rtype, items, single=False)

    def _maybe_table(
        self, request: rendering.Request, rtype: ResourceType, items: list[dict[str, Any]], *, single: bool
    ) -> dict[str, Any]:
        if "as=Table" in request.headers.get("Accept", ""):
            include = request.params.get("includeObject", "Metadata")
            return table(rtype, items, include=include, resource_version=str(self.store.rv))
        if single:
            return items[0]
        return {
            "apiVersion": rtype.api_version,
            "kind": f"{rtype.kind}List",
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": items,
        }

    async def _watch(
        self, request: rendering.Request, rtype: ResourceType, ns: str | None
    ) -> AsyncIterator[Any]:
        matcher = self._matcher(request)
        name = request.name
        as_table = "as=Table" in request.headers.get("Accept", "")
        include = request.params.get("includeObject", "Metadata")

        def visible(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            meta = obj.get("metadata", {})
            if ns is not None and meta.get("namespace") != ns:
                return False
            if name is not None and meta.get("name") != name:
                return False
            return bool(matcher(obj))

        def shaped(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
            payload = (
                table(rtype, [obj], include=include, resource_version=obj["metadata"]["resourceVersion"])
                if as_table
                else obj
            )
            return {"type": kind, "object": payload}

        try:
            timeout = float(request.params.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        except ValueError:
            timeout = DEFAULT_WATCH_SECONDS
        deadline = time.monotonic() + timeout
        raw_rv = request.params.get("resourceVersion") or "0"
        yield b""  # send the headers now: a watch may stay silent for a long time
        if raw_rv == "0" or not raw_rv.isdigit():
            last = self.store.rv
            for obj in sorted(
                self.store.items(rtype, ns), key=lambda o: int(o["metadata"]["resourceVersion"])
            ):
                if visible(obj):
                    yield shaped("ADDED", obj)
        else:
            last = int(raw_rv)
        while not self.closing:
            changed = self.store.changed
            events = self.store.events_after(rtype, last)
            if events is None:
                yield {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f"too old resource version: {last} ({self.store.rv})",
                        "reason": "Expired",
                        "code": 410,
                    },
                }
                return
            for event in events:
                last = event.rv
                now_visible, was_visible = visible(event.obj), visible(event.old)
                if event.type == "DELETED" and (now_visible or was_visible):
                    yield shaped("DELETED", event.obj)
                elif now_visible:
                    yield shaped(
                        "ADDED" if event.type == "ADDED" or not was_visible else "MODIFIED", event.obj
                    )
                elif was_visible:
                    yield shaped("DELETED", event.obj)  # moved out of the selector
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=min(remaining, 5.0))
            except TimeoutError:
                if request.params.get("allowWatchBookmarks") in ("true", "1"):
                    bookmark = {
                        "kind": rtype.kind,
                        "apiVersion": rtype.api_version,
                        "metadata": {"resourceVersion": str(last)},
                    }
                    yield {"type": "BOOKMARK", "object": bookmark}

    # Writes ----------------------------------------------------------------------------------------

    def _replace(self, request: rendering.Request, rtype: ResourceType, ns: str | None) -> Any:
        body = request.data
        if not isinstance(body, dict):
            raise api_error(400, "BadRequest", "the request body must be a JSON object")
        if request.subresource == "scale":
            replicas = (body.get("spec") or {}).get("replicas")
            return self._set_replicas(rtype, ns, _named(request), replicas)
        return self.store.update(
            rtype,
            ns,
            _named(request),
            lambda live: copy.deepcopy(body),
            subresource=request.subresource,
            strict=_strict(request),
        )

    def _patch(self, request: rendering.Request, rtype: ResourceType, ns: str | None) -> Any:
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        body = request.data
        sub = request.subresource

        if content_type == "application/apply-patch+yaml":
            manager = request.params.get("fieldManager")
            if not manager:
                raise api_error(400, "BadRequest", "PATCH with apply requires a fieldManager")
            if not isinstance(body, dict):
                raise api_error(400, "BadRequest", "an apply patch must be an object")
            if self.store.get(rtype, ns, _named(request)) is None and sub is None:
                applied = patches.server_side_apply(None, body, manager=manager, now=now_rfc3339())
                applied.setdefault("metadata", {})["name"] = request.name
                return json_answer(self.store.create(rtype, ns, applied, strict=_strict(request)), status=201)
            return self.store.update(
                rtype,
                ns,
                _named(request),
                lambda live: patches.server_side_apply(live, body, manager=manager, now=now_rfc3339()),
                subresource=sub,
                strict=_strict(request),
            )

        apply_patch: Callable[[Any, Any], Any]
        if content_type == "application/merge-patch+json":
            apply_patch = patches.merge_patch
        elif content_type == "application/json-patch+json":
            apply_patch = patches.json_patch
        elif content_type == "application/strategic-merge-patch+json":
            if rtype.schema is not None:
                raise api_error(
                    415, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources"
                )
            apply_patch = patches.strategic_merge_patch
        else:
            raise api_error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {content_type}",
            )

        if sub == "scale":
            live = self.store.get(rtype, ns, _named(request))
            if live is None:
                raise not_found(rtype, _named(request))
            scale = self._guarded(apply_patch, self._scale_of(rtype, live), body)
            return self._set_replicas(rtype, ns, _named(request), (scale.get("spec") or {}).get("replicas"))
        return self.store.update(
            rtype,
            ns,
            _named(request),
            lambda live: self._guarded(apply_patch, live, body),
            subresource=sub,
            strict=_strict(request),
        )

    @staticmethod
    def _guarded(apply_patch: Any, live: Any, body: Any) -> Any:
        try:
            return apply_patch(live, body)
        except patches.PatchError as exc:
            raise api_error(exc.status, "Invalid" if exc.status == 422 else "BadRequest", str(exc)) from exc

    # Scale subresource -----------------------------------------------------------------------------

    def _scale_of(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        assert rtype.scale is not None
        meta = obj["metadata"]
        if rtype.scale.label_selector:
            selector = _get_path(obj, rtype.scale.label_selector) or ""
        else:
            selector = selector_string(
                ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            )
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": int(_get_path(obj, rtype.scale.spec_replicas) or 0)},
            "status": {
                "replicas": int(_get_path(obj, rtype.scale.status_replicas) or 0),
                "selector": selector,
            },
        }

    def _set_replicas(self, rtype: ResourceType, ns: str | None, name: str, replicas: Any) -> dict[str, Any]:
        if rtype.scale is None:
            raise api_error(404, "NotFound", f"{rtype.plural} has no scale subresource")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise api_error(
                422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}: must be a non-negative integer"
            )
        paths = rtype.scale

        def change(live: dict[str, Any]) -> dict[str, Any]:
            _set_path(live, paths.spec_replicas, replicas)
            return live

        updated = self.store.update(rtype, ns, name, change)
        return self._scale_of(rtype, updated)


def _named(request: rendering.Request) -> str:
    """The object a request names (the routes that call this match only requests that name one)."""
    if request.name is None:
        raise api_error(405, "MethodNotAllowed", "the request names no object")
    return request.name


def _strict(request: rendering.Request) -> bool:
    """``?fieldValidation=Strict`` (what kubectl sends by default): unknown fields are an error."""
    return request.params.get("fieldValidation") == "Strict"


def _get_path(obj: Any, path: str) -> Any:
    node = obj
    for part in path.strip(".").split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
