"""The four ways the API server changes an object: merge, JSON, strategic-merge and apply patches.

Pure functions over plain dicts. Strategic merge and server-side apply use the merge keys of the
built-in types (containers by name, env by name, ports by port, ...); lists elsewhere are atomic.
Server-side apply keeps, per field manager, the set of fields it last applied (in
``metadata.managedFields``, the API server's FieldsV1 shape), so a field a manager stops applying
is removed unless another manager also set it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

#: list field name -> the key(s) identifying its items, for strategic merge and apply.
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ownerReferences": ("uid",),
    "conditions": ("type",),
    "hostAliases": ("ip",),
    "containerStatuses": ("name",),
}
#: lists of scalars merged as sets.
SET_LISTS = frozenset({"finalizers"})


def _list_key(field: str, items: list[Any]) -> tuple[str, ...] | None:
    if field in MERGE_KEYS:
        return MERGE_KEYS[field]
    if field == "ports" and all(isinstance(i, dict) for i in items):
        # container ports are keyed by containerPort, Service ports by port
        return ("containerPort",) if any("containerPort" in i for i in items) else ("port",)
    return None


class PatchError(ValueError):
    """A patch that cannot apply; ``status`` is the HTTP code the API server answers with."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


# JSON merge patch (RFC 7386) -----------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# JSON patch (RFC 6902) -----------------------------------------------------------------------


def json_patch(target: dict[str, Any], operations: Any) -> dict[str, Any]:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", status=400)
    try:
        return jsonpatch.apply_patch(target, operations, in_place=False)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchError(f"the server rejected our request due to an error in our request: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchError(f"invalid JSON patch: {exc}") from exc


# Strategic merge patch -----------------------------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name, []) if v not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, key)
    return result


def _merge_list(field: str, live: Any, patch: list[Any]) -> list[Any]:
    live = live if isinstance(live, list) else []
    if field in SET_LISTS:
        return live + [v for v in patch if v not in live]
    keys = _list_key(field, patch)
    if keys is None:
        return [v for v in copy.deepcopy(patch) if not (isinstance(v, dict) and v.get("$patch"))]
    result = copy.deepcopy(live)
    for item in patch:
        if not isinstance(item, dict):
            continue
        ident = tuple(item.get(k) for k in keys)
        index = next((i for i, cur in enumerate(result) if tuple(cur.get(k) for k in keys) == ident), None)
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic_merge_patch(result[index], item, field)
    return result


# Server-side apply ---------------------------------------------------------------------------

FieldPath = tuple[str, ...]


def field_set(obj: Any, prefix: FieldPath = (), field: str = "") -> set[FieldPath]:
    """Leaf fields and keyed list items of an applied configuration, as paths."""
    paths: set[FieldPath] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not prefix and key in ("apiVersion", "kind"):
                continue
            if prefix == ("f:metadata",) and key in ("name", "namespace"):
                continue
            here = (*prefix, f"f:{key}")
            if isinstance(value, dict) and value:
                paths.add((*here, "."))
                paths |= field_set(value, here, key)
            elif isinstance(value, list) and value and _list_key(key, value) is not None:
                keys = _list_key(key, value)
                paths.add((*here, "."))
                for item in value:
                    ident = json.dumps({k: item.get(k) for k in keys or ()}, sort_keys=True)
                    item_path = (*here, f"k:{ident}")
                    paths.add((*item_path, "."))
                    paths |= field_set(item, item_path, key)
            elif isinstance(value, list) and key in SET_LISTS:
                for item in value:
                    paths.add((*here, f"v:{json.dumps(item)}"))
            else:
                paths.add(here)
    return paths


def to_fields_v1(paths: set[FieldPath]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for part in path:
            node = node.setdefault(part, {})
    return tree


def from_fields_v1(tree: dict[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    paths: set[FieldPath] = set()
    for key, sub in tree.items():
        here = (*prefix, key)
        if sub:
            paths |= from_fields_v1(sub, here)
        else:
            paths.add(here)
    return paths


def _apply_merge(live: Any, applied: Any, field: str = "") -> Any:
    if isinstance(applied, dict) and isinstance(live, dict):
        result = copy.deepcopy(live)
        for key, value in applied.items():
            if isinstance(value, list):
                keys = _list_key(key, value)
                if keys is not None and isinstance(result.get(key), list):
                    result[key] = _apply_list(result[key], value, keys)
                elif key in SET_LISTS and isinstance(result.get(key), list):
                    result[key] = result[key] + [v for v in value if v not in result[key]]
                else:
                    result[key] = copy.deepcopy(value)
            else:
                result[key] = _apply_merge(result.get(key), value, key)
        return result
    return copy.deepcopy(applied)


def _apply_list(live: list[Any], applied: list[Any], keys: tuple[str, ...]) -> list[Any]:
    # The applied order first, then live items the applier does not mention.
    live_by_id = {tuple(i.get(k) for k in keys): i for i in live if isinstance(i, dict)}
    out = []
    seen = set()
    for item in applied:
        ident = tuple(item.get(k) for k in keys)
        seen.add(ident)
        out.append(_apply_merge(live_by_id.get(ident, {}), item))
    out += [i for i in live if not (isinstance(i, dict) and tuple(i.get(k) for k in keys) in seen)]
    return out


def _remove(obj: Any, path: FieldPath) -> None:
    """Delete one field path from ``obj`` (a no-op when it is not there)."""
    node = obj
    for part in path[:-1]:
        node = _step(node, part)
        if node is None:
            return
    last = path[-1]
    if last == "." or node is None:
        return
    if last.startswith("f:") and isinstance(node, dict):
        node.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(node, list):
        ident = json.loads(last[2:])
        node[:] = [i for i in node if not all(i.get(k) == v for k, v in ident.items())]
    elif last.startswith("v:") and isinstance(node, list):
        value = json.loads(last[2:])
        node[:] = [i for i in node if i != value]


def _step(node: Any, part: str) -> Any:
    if part.startswith("f:") and isinstance(node, dict):
        return node.get(part[2:])
    if part.startswith("k:") and isinstance(node, list):
        ident = json.loads(part[2:])
        return next((i for i in node if all(i.get(k) == v for k, v in ident.items())), None)
    return None


def server_side_apply(
    live: dict[str, Any] | None, applied: dict[str, Any], *, manager: str, now: str
) -> dict[str, Any]:
    """Merge ``applied`` into ``live`` as ``manager``; drop what it applied before and no longer does."""
    managed = list((live or {}).get("metadata", {}).get("managedFields") or [])
    mine = next((m for m in managed if m.get("manager") == manager and m.get("operation") == "Apply"), None)
    old_fields = from_fields_v1(mine.get("fieldsV1", {})) if mine else set()
    others: set[FieldPath] = set()
    for entry in managed:
        if entry is not mine:
            others |= from_fields_v1(entry.get("fieldsV1", {}))
    clean = copy.deepcopy(applied)
    clean.get("metadata", {}).pop("managedFields", None)
    new_fields = field_set(clean)
    result = _apply_merge(copy.deepcopy(live or {}), clean)
    for path in sorted(old_fields - new_fields - others, key=len, reverse=True):
        if any(p[: len(path)] == path for p in new_fields):
            continue
        _remove(result, path)
    entry = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": applied.get("apiVersion", ""),
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(new_fields),
    }
    managed = [m for m in managed if m is not mine] + [entry]
    result.setdefault("metadata", {})["managedFields"] = managed
    return result
