"""The emulator's object store: what the API server keeps, with the rules it keeps them by.

Objects live in kmock's ``ObjectsArray`` (so tests can read ``emulator.objects[...]`` and its
history); this module adds what stock kmock lacks: server-set ``uid``, ``resourceVersion``,
``generation`` and ``creationTimestamp``; ``generateName``; optimistic concurrency; the status
subresource rule (main writes keep status, status writes keep the rest); custom-resource
admission (prune, default, schema, CEL); finalizers; owner-reference garbage collection; and a
log of watch events by resourceVersion so a watch can resume where it left off.

Everything runs on the emulator's event loop; mutations are synchronous, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import copy
import random
import string
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kmock

from rlkube_devcluster.emulator import builtin_openapi, validation
from rlkube_devcluster.emulator import schema as crdschema
from rlkube_devcluster.emulator.resources import BUILTINS, ResourceType, from_crd

#: Versions of one object kept in kmock's history (tests look at recent ones; memory stays flat).
HISTORY_KEPT = 16
#: Watch events kept per resource type; a watch from an older resourceVersion gets 410 Gone.
EVENT_LOG_SIZE = 20000
#: Event objects kept (kopf and the operator post many); the oldest go first.
MAX_EVENTS = 5000


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=status, reason=reason, message=message, details=details or {"causes": []}
    )


def _undecodable(rtype: ResourceType, why: str) -> kmock.KubernetesError:
    """The API server's answer to a body it cannot decode into the kind."""
    return api_error(
        400,
        "BadRequest",
        f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: {why}',
    )


def _refuse_unknown(rtype: ResourceType, unknown: list[str]) -> None:
    """The API server's answer to unknown fields under ``fieldValidation=Strict``."""
    if unknown:
        quoted = ", ".join(f'unknown field "{path}"' for path in unknown)
        raise _undecodable(rtype, f"strict decoding error: {quoted}")


def invalid_error(rtype: ResourceType, obj: dict[str, Any], problems: list[str]) -> kmock.KubernetesError:
    """422 Invalid, worded as the API server words it, one cause per problem."""
    group = f".{rtype.group}" if rtype.group else ""
    name = obj.get("metadata", {}).get("name", "")
    causes = [
        {"reason": "FieldValueInvalid", "field": p.split(":", 1)[0], "message": p.split(": ", 1)[-1]}
        for p in problems
    ]
    message = f'{rtype.kind}{group} "{name}" is invalid: ' + (
        problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    )
    return kmock.KubernetesError(
        status=422,
        reason="Invalid",
        message=message,
        details={"name": name, "group": rtype.group, "kind": rtype.kind, "causes": causes},
    )


def not_found(rtype: ResourceType, name: str) -> kmock.KubernetesError:
    group = f".{rtype.group}" if rtype.group else ""
    return api_error(
        404,
        "NotFound",
        f'{rtype.plural}{group} "{name}" not found',
        name=name,
        group=rtype.group,
        kind=rtype.plural,
    )


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


Listener = Callable[[ResourceType, WatchEvent], None]


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """What generation tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    meta = out.get("metadata", {})
    meta.pop("resourceVersion", None)
    for entry in meta.get("managedFields") or []:
        entry.pop("time", None)
    return out


class Store:
    def __init__(self, objects: kmock.ObjectsArray) -> None:
        self.objects = objects
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.rv = 0
        self.log: dict[tuple[str, str, str], deque[WatchEvent]] = {}
        self.log_floor: dict[tuple[str, str, str], int] = {}
        self.listeners: list[Listener] = []
        self.uids: dict[str, tuple[ResourceType, str | None, str]] = {}
        self.event_keys: deque[Any] = deque()
        #: type -> keys of its live objects, so a list does not visit every object of every type
        self.index: dict[tuple[str, str, str], dict[tuple[Any, str | None, str], None]] = {}
        self._changed: asyncio.Event | None = None
        for rtype in BUILTINS:
            self.register(rtype)

    # Types -------------------------------------------------------------------------------------

    def register(self, rtype: ResourceType) -> None:
        self.types[(rtype.group, rtype.version, rtype.plural)] = rtype

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.types.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return next((t for t in self.types.values() if t.api_version == api_version and t.kind == kind), None)

    # Reading -----------------------------------------------------------------------------------

    def _key(self, rtype: ResourceType, namespace: str | None, name: str) -> tuple[Any, str | None, str]:
        return (rtype.key, namespace if rtype.namespaced else None, name)

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self._key(rtype, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw

    def items(self, rtype: ResourceType, namespace: str | None = None) -> list[dict[str, Any]]:
        out = []
        for key in self.index.get((rtype.group, rtype.version, rtype.plural), {}):
            if namespace is None or key[1] == namespace:
                obj = self.objects[key]
                if not obj.deleted:
                    out.append(obj.raw)
        return out

    # Watch support -----------------------------------------------------------------------------

    @property
    def changed(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def wake(self) -> None:
        self.changed.set()
        self._changed = asyncio.Event()

    def events_after(self, rtype: ResourceType, rv: int) -> list[WatchEvent] | None:
        """Events of ``rtype`` newer than ``rv``, oldest first; None when ``rv`` is too old (410)."""
        ident = (rtype.group, rtype.version, rtype.plural)
        if rv < self.log_floor.get(ident, 0):
            return None
        log = self.log.get(ident, ())
        newer = []
        for event in reversed(log):
            if event.rv <= rv:
                break
            newer.append(event)
        newer.reverse()
        return newer

    # Writing -----------------------------------------------------------------------------------

    def _commit(
        self, rtype: ResourceType, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        key = self._key(rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if kind == "DELETED":
            if key in self.objects and not self.objects[key].deleted:
                self.objects[key].delete()
            self.uids.pop(obj["metadata"].get("uid", ""), None)
        elif key not in self.objects:
            self.objects[key] = obj
        else:
            self.objects[key].history.append(obj)
        if key in self.objects and len(self.objects[key].history) > HISTORY_KEPT:
            del self.objects[key].history[:-HISTORY_KEPT]
        ident = (rtype.group, rtype.version, rtype.plural)
        if kind == "DELETED":
            self.index.get(ident, {}).pop(key, None)
        else:
            self.index.setdefault(ident, {})[key] = None
        log = self.log.setdefault(ident, deque())
        log.append(WatchEvent(self.rv, kind, copy.deepcopy(obj), copy.deepcopy(old) if old else None))
        if len(log) > EVENT_LOG_SIZE:
            self.log_floor[ident] = log.popleft().rv
        if kind == "ADDED":
            self.uids[obj["metadata"]["uid"]] = (
                rtype,
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
            )
        self.wake()
        event = log[-1]
        for listener in list(self.listeners):
            listener(rtype, event)

    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        keep_status: bool = False,
        admit: bool = True,
        strict: bool = False,
    ) -> dict[str, Any]:
        """Create an object. ``admit=False`` stores it unchecked, as if written under an older,
        looser CRD; ``strict`` refuses unknown fields (``?fieldValidation=Strict``)."""
        if not isinstance(body, dict):
            raise api_error(400, "BadRequest", "the request body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if obj.get("kind") not in (None, rtype.kind) or obj.get("apiVersion") not in (
            None,
            rtype.api_version,
        ):
            raise api_error(
                400,
                "BadRequest",
                f"the body is a {obj.get('apiVersion')} {obj.get('kind')}, not a {rtype.kind}",
            )
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        if rtype.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise api_error(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace
            namespaces = self.find("", "v1", "namespaces")
            assert namespaces is not None
            if self.get(namespaces, None, namespace or "") is None:
                raise api_error(
                    404, "NotFound", f'namespaces "{namespace}" not found', name=namespace, kind="namespaces"
                )
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise api_error(
                    422, "Invalid", "metadata.name: Required value: name or generateName is required"
                )
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        if self.get(rtype, namespace, meta["name"]) is not None:
            group = f".{rtype.group}" if rtype.group else ""
            raise api_error(
                409,
                "AlreadyExists",
                f'{rtype.plural}{group} "{meta["name"]}" already exists',
                name=meta["name"],
                kind=rtype.plural,
            )
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        if "spec" in obj or rtype.schema is not None:
            meta["generation"] = 1
        if rtype.has_status and not keep_status:
            obj.pop("status", None)
        if admit:
            obj = self._admit(rtype, obj, strict=strict)
        if rtype.kind == "CustomResourceDefinition":
            obj["status"] = _crd_status(obj)
        self._commit(rtype, "ADDED", obj, None)
        if rtype.kind == "CustomResourceDefinition":
            for new_type in from_crd(obj):
                self.register(new_type)
        if rtype.kind == "Event":
            self._cap_events(rtype, obj)
        return obj

    def _admit(self, rtype: ResourceType, obj: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
        if rtype.schema is None:
            builtin = builtin_openapi.kind_name(rtype.group, rtype.version, rtype.kind)
            if builtin is not None:
                # Decoding into the kind's Go type: a value of the wrong type is an error; an unknown
                # field is one when strict, else dropped.
                wrong = builtin_openapi.decode_error(builtin, obj)
                if wrong:
                    raise _undecodable(rtype, wrong)
                if strict:
                    _refuse_unknown(rtype, builtin_openapi.unknown_fields(builtin, obj))
                obj = builtin_openapi.prune(builtin, obj)
        invalid = validation.problems(rtype.kind, obj)
        if invalid:
            raise invalid_error(rtype, obj, invalid)
        if rtype.schema is None:
            return obj
        unknown = crdschema.unknown_fields(rtype.schema, {k: v for k, v in obj.items() if k != "metadata"})
        if strict:
            _refuse_unknown(rtype, unknown)
        stored, problems = crdschema.admit(rtype.schema, obj)
        if problems:
            raise invalid_error(rtype, obj, problems)
        return stored

    def _admit_status(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """A status write validates the status only, as the API server's status strategy does."""
        status_schema = ((rtype.schema or {}).get("properties") or {}).get("status")
        if status_schema is None or "status" not in obj:
            return obj
        obj["status"] = crdschema.prune(status_schema, obj["status"])
        problems = crdschema.schema_errors(status_schema, obj["status"], root="status")
        if problems:
            name = obj["metadata"]["name"]
            raise api_error(
                422, "Invalid", f'{rtype.kind} "{name}" is invalid: ' + "; ".join(problems), name=name
            )
        return obj

    def update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        subresource: str | None = None,
        strict: bool = False,
    ) -> dict[str, Any]:
        live = self.get(rtype, namespace, name)
        if live is None:
            raise not_found(rtype, name)
        candidate = change(copy.deepcopy(live))
        if not isinstance(candidate, dict):
            raise api_error(400, "BadRequest", "the patched object is not a JSON object")
        meta = candidate.setdefault("metadata", {})
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv not in (None, "", live["metadata"]["resourceVersion"]):
            group = f".{rtype.group}" if rtype.group else ""
            raise api_error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rtype.plural}{group} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=name,
                kind=rtype.plural,
            )
        for key in ("uid", "creationTimestamp", "name", "namespace", "generation", "deletionTimestamp"):
            if key in live["metadata"]:
                meta[key] = live["metadata"][key]
            else:
                meta.pop(key, None)
        candidate["apiVersion"], candidate["kind"] = live["apiVersion"], live["kind"]
        if subresource == "status":
            new = copy.deepcopy(live)
            if "status" in candidate:
                new["status"] = candidate["status"]
            else:
                new.pop("status", None)
            candidate = new
        elif rtype.has_status:
            if "status" in live:
                candidate["status"] = copy.deepcopy(live["status"])
            else:
                candidate.pop("status", None)
        if subresource == "status":
            candidate = self._admit_status(rtype, candidate)
        elif _content(candidate) != _content(live):
            # Unchanged fields are not validated again (the API server's validation ratcheting), so an
            # object stored under a looser schema can still get annotations and status.
            candidate = self._admit(rtype, candidate, strict=strict)
        if _content(candidate) != _content(live) and "generation" in live["metadata"]:
            candidate["metadata"]["generation"] = int(live["metadata"]["generation"]) + 1
        if _comparable(candidate) == _comparable(live):
            return live  # nothing changed: no new resourceVersion, no watch event
        if candidate["metadata"].get("deletionTimestamp") and not candidate["metadata"].get("finalizers"):
            self._commit(rtype, "DELETED", candidate, live)
            self._collect(candidate["metadata"]["uid"], orphan=False)
            return candidate
        self._commit(rtype, "MODIFIED", candidate, live)
        if rtype.kind == "CustomResourceDefinition":
            for new_type in from_crd(candidate):
                self.register(new_type)
        return candidate

    def delete(
        self, rtype: ResourceType, namespace: str | None, name: str, *, propagation: str = "Background"
    ) -> dict[str, Any]:
        live = self.get(rtype, namespace, name)
        if live is None:
            raise not_found(rtype, name)
        if live["metadata"].get("finalizers"):
            if live["metadata"].get("deletionTimestamp"):
                return live
            new = copy.deepcopy(live)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if "generation" in new["metadata"]:
                new["metadata"]["generation"] = int(new["metadata"]["generation"]) + 1
            self._commit(rtype, "MODIFIED", new, live)
            return new
        final = copy.deepcopy(live)
        self._commit(rtype, "DELETED", final, live)
        if rtype.kind == "Namespace":
            for other in list(self.types.values()):
                if other.namespaced:
                    for item in self.items(other, name):
                        self.delete(other, name, item["metadata"]["name"])
        self._collect(live["metadata"]["uid"], orphan=propagation == "Orphan")
        return final

    # Garbage collection ------------------------------------------------------------------------

    def _collect(self, owner_uid: str, *, orphan: bool) -> None:
        """Dependents of a deleted owner: orphaned, or deleted once no live owner is left."""
        dependents = []
        for rtype in list(self.types.values()):
            for obj in self.items(rtype):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == owner_uid for ref in refs):
                    dependents.append((rtype, obj))
        for rtype, obj in dependents:
            meta = obj["metadata"]
            remaining = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != owner_uid]
            live_owner = any(r.get("uid") in self.uids for r in remaining)
            if orphan or live_owner:

                def drop(o: dict[str, Any], keep: list[dict[str, Any]] = remaining) -> dict[str, Any]:
                    if keep:
                        o["metadata"]["ownerReferences"] = keep
                    else:
                        o["metadata"].pop("ownerReferences", None)
                    return o

                self.update(rtype, meta.get("namespace"), meta["name"], drop)
            elif self.get(rtype, meta.get("namespace"), meta["name"]) is not None:
                self.delete(rtype, meta.get("namespace"), meta["name"])

    def collect_dangling(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        """An object created with owners that no longer exist goes, as the garbage collector does."""
        refs = obj["metadata"].get("ownerReferences") or []
        meta = obj["metadata"]
        dangling = refs and not any(r.get("uid") in self.uids for r in refs)
        if dangling and self.get(rtype, meta.get("namespace"), meta["name"]) is not None:
            self.delete(rtype, meta.get("namespace"), meta["name"])

    def _cap_events(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        self.event_keys.append(self._key(rtype, obj["metadata"]["namespace"], obj["metadata"]["name"]))
        while len(self.event_keys) > MAX_EVENTS:
            key = self.event_keys.popleft()
            self.index.get((rtype.group, rtype.version, rtype.plural), {}).pop(key, None)
            if key in self.objects:
                del self.objects[key]


def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    stamp = now_rfc3339()
    return {
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
        "conditions": [
            {"type": t, "status": "True", "reason": r, "message": "", "lastTransitionTime": stamp}
            for t, r in (("NamesAccepted", "NoConflicts"), ("Established", "InitialNamesAccepted"))
        ],
    }
