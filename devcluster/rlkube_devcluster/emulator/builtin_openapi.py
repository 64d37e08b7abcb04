"""The OpenAPI v3 schemas of the built-in kinds, from Kubernetes' own API definitions.

Not written by hand: the ``kubernetes-validate`` package ships Kubernetes' OpenAPI definitions
(every ``io.k8s.*`` type of a release, converted to JSON Schema: nullable types, ``#/$defs/``
references). :func:`components` turns them back into what an API server publishes under
``/openapi/v3`` (one ``type``, ``#/components/schemas/`` references, ``allOf`` around a described
reference), so ``kubectl explain sts.spec`` reads the real field documentation.

:func:`unknown_fields` and :func:`prune` are what the API server's decoding does with a built-in
object: the Go types know their fields, so with ``fieldValidation=Strict`` an unknown field is an
error naming its path, and otherwise it is dropped. A type without declared fields (``JSON``,
``RawExtension``, ``FieldsV1``) holds anything.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterable
from importlib import resources
from typing import Any

PACKAGE = "kubernetes_validate"
_DEFS_REF = "#/$defs/"
COMPONENTS_REF = "#/components/schemas/"
#: Keywords whose value is one schema, or a list of schemas.
_ONE = ("items", "additionalProperties", "not")
_MANY = ("allOf", "anyOf", "oneOf")


@functools.cache
def kubernetes_version() -> str:
    """The newest Kubernetes release the installed kubernetes-validate has definitions of (``1.37.0``)."""
    root = resources.files(PACKAGE).joinpath("kubernetes-json-schema")
    found = [m.group(1) for p in root.iterdir() if (m := re.fullmatch(r"v(\d+\.\d+\.\d+)-local", p.name))]
    return max(found, key=lambda v: tuple(int(n) for n in v.split(".")))


@functools.cache
def _definitions() -> dict[str, dict[str, Any]]:
    path = resources.files(PACKAGE).joinpath(
        "kubernetes-json-schema", f"v{kubernetes_version()}-local", "_definitions.json"
    )
    defs: dict[str, dict[str, Any]] = json.loads(path.read_text())["$defs"]
    return {name: _openapi(schema) for name, schema in defs.items()}


def _openapi(schema: Any) -> Any:
    """One JSON Schema node as OpenAPI v3 spells it: no null types, components references."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, list):
            kinds = [v for v in value if v != "null"]
            if len(kinds) == 1:
                out["type"] = kinds[0]
            elif kinds:
                out["type"] = kinds
        elif key == "$ref":
            out[key] = value.replace(_DEFS_REF, COMPONENTS_REF)
        elif key == "properties":
            out[key] = {name: _openapi(sub) for name, sub in value.items()}
        elif key in _ONE:
            out[key] = _openapi(value)
        elif key in _MANY:
            out[key] = [_openapi(sub) for sub in value]
        else:
            out[key] = value
    if "$ref" in out and len(out) > 1:
        # A described reference, as the API server publishes one: the reference inside allOf.
        out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    return out


def kind_name(group: str, version: str, kind: str) -> str | None:
    """The definition of a built-in kind (``io.k8s.api.apps.v1.StatefulSet``), None if there is none."""
    return _kinds().get((group, version, kind))


@functools.cache
def _kinds() -> dict[tuple[str, str, str], str]:
    found = {}
    for name, schema in _definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind", ()):
            if not name.endswith("List"):
                found[(gvk.get("group", ""), gvk["version"], gvk["kind"])] = name
    return found


def components(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The schemas ``names`` and every schema they refer to, as a document's ``components.schemas``."""
    defs = _definitions()
    out: dict[str, dict[str, Any]] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out or name not in defs:
            continue
        schema = copy.deepcopy(defs[name])
        if schema.get("x-kubernetes-group-version-kind"):
            # The JSON Schema form pins apiVersion and kind and requires spec; the API server's does not.
            schema.pop("required", None)
            for key in ("apiVersion", "kind"):
                schema.get("properties", {}).get(key, {}).pop("enum", None)
        out[name] = schema
        todo += _references(schema)
    return out


def _references(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        found = []
        for key, value in schema.items():
            if key == "$ref" and isinstance(value, str):
                found.append(value.removeprefix(COMPONENTS_REF))
            elif key == "properties":
                for sub in value.values():
                    found += _references(sub)
            else:
                found += _references(value)
        return found
    if isinstance(schema, list):
        return [name for item in schema for name in _references(item)]
    return []


def _resolved(schema: dict[str, Any]) -> dict[str, Any]:
    """Follow a reference (bare, or the one inside allOf) to the schema it names."""
    defs = _definitions()
    while True:
        ref = schema.get("$ref")
        if ref is None and len(schema.get("allOf", ())) == 1:
            ref = schema["allOf"][0].get("$ref")
        if ref is None:
            return schema
        schema = defs.get(ref.removeprefix(COMPONENTS_REF), {})


def _fields(schema: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(declared fields, the schema of a map's values); (None, None): anything goes."""
    props = schema.get("properties")
    extra = schema.get("additionalProperties")
    return props, extra if isinstance(extra, dict) else None


def unknown_fields(name: str, value: Any) -> list[str]:
    """Paths of the fields of ``value`` that definition ``name`` does not declare."""
    return _unknown(_definitions().get(name, {}), value, "")


def _unknown(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    schema = _resolved(schema)
    found: list[str] = []
    if isinstance(value, dict):
        props, extra = _fields(schema)
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if props is not None and key in props:
                found += _unknown(props[key], item, here)
            elif extra is not None:
                found += _unknown(extra, item, here)
            elif props is not None:
                found.append(here)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _unknown(schema["items"], item, f"{path}[{index}]")
    return found


def prune(name: str, value: Any) -> Any:
    """``value`` without the fields definition ``name`` does not declare, and without nulls."""
    return _prune(_definitions().get(name, {}), value)


def _prune(schema: dict[str, Any], value: Any) -> Any:
    schema = _resolved(schema)
    if isinstance(value, dict):
        props, extra = _fields(schema)
        if props is None and extra is None:
            return value
        out = {}
        for key, item in value.items():
            if item is None:
                continue
            if props is not None and key in props:
                out[key] = _prune(props[key], item)
            elif extra is not None:
                out[key] = _prune(extra, item)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(schema["items"], item) for item in value if item is not None]
    return value


def decode_error(name: str, value: Any) -> str | None:
    """The JSON decoder's complaint about the first value of the wrong type, None if none is.

    In the Go decoder's words: ``json: cannot unmarshal string into Go struct field
    StatefulSetSpec.spec.replicas of type int32``. Quantities and int-or-strings take either.
    """
    return _decode(_definitions().get(name, {}), value, "", name.rsplit(".", 1)[-1])


_JSON_KINDS = {dict: "object", list: "array", str: "string", bool: "bool"}
_ACCEPTS = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def _ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref") or (schema.get("allOf") or [{}])[0].get("$ref")
    return ref.removeprefix(COMPONENTS_REF) if ref else None


def _go_type(schema: dict[str, Any]) -> str:
    ref = _ref_name(schema)
    if ref is not None:
        return ".".join(ref.rsplit(".", 2)[-2:])
    kind = schema.get("type")
    if kind == "integer":
        return str(schema.get("format") or "int")
    if kind == "number":
        return "float64"
    if kind == "boolean":
        return "bool"
    if kind == "array":
        return "[]" + _go_type(schema.get("items") or {})
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "map[string]" + _go_type(schema["additionalProperties"])
    return str(kind or "interface {}")


def _decode(schema: dict[str, Any], value: Any, path: str, struct: str) -> str | None:
    described = schema
    ref = _ref_name(schema)
    schema = _resolved(schema)
    if value is None or "oneOf" in schema:
        return None
    kind = schema.get("type")
    accepted = _ACCEPTS.get(kind) if isinstance(kind, str) else None
    if accepted is not None:
        wrong = not isinstance(value, accepted) or (kind in ("integer", "number") and isinstance(value, bool))
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            wrong = False
        if wrong:
            shown = _JSON_KINDS.get(type(value), "number")
            if kind == "integer" and isinstance(value, float):
                shown = f"number {value}"
            return (
                f"json: cannot unmarshal {shown} into Go struct field {struct}.{path} "
                f"of type {_go_type(described)}"
            )
    inner = ref.rsplit(".", 1)[-1] if ref else struct
    if isinstance(value, dict):
        props, extra = _fields(schema)
        for key, item in value.items():
            if props is not None and key in props:
                error = _decode(props[key], item, f"{path}.{key}" if path else key, inner)
            else:  # a map's value: Go names the map field
                error = None if extra is None else _decode(extra, item, path, inner)
            if error:
                return error
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            if error := _decode(schema["items"], item, path, inner):
                return error
    return None
