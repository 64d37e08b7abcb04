"""What the API server does with a custom resource's schema: prune, default, validate, CEL, tables.

Pure functions over plain dicts, in the API server's order: drop nulls and unknown fields, fill
in defaults, check the OpenAPI v3 schema, then the CEL rules (``x-kubernetes-validations``).
Error texts follow the API server's ("spec.x: Invalid value: 3: spec.x in body should be ...").
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import celpy
import jsonschema


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Paths of fields the schema does not know (what ``fieldValidation=Strict`` refuses)."""
    found: list[str] = []
    if isinstance(value, dict) and schema.get("type") in ("object", None):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if key in props:
                found += unknown_fields(props[key], item, here)
            elif isinstance(extra, dict):
                found += unknown_fields(extra, item, here)
            elif not (schema.get("x-kubernetes-preserve-unknown-fields") or extra is True):
                found.append(here)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += unknown_fields(schema["items"], item, f"{path}[{index}]")
    return found


def prune(schema: dict[str, Any], value: Any) -> Any:
    """Drop nulls (no field here is nullable) and fields the schema does not know."""
    if isinstance(value, dict) and schema.get("type") in ("object", None):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
        out = {}
        for key, item in value.items():
            if item is None and not schema.get("nullable"):
                continue
            if key in props:
                out[key] = prune(props[key], item)
            elif isinstance(extra, dict):
                out[key] = prune(extra, item)
            elif keep_unknown or extra is True:
                out[key] = item
        return out
    if isinstance(value, list) and "items" in schema:
        return [prune(schema["items"], item) for item in value if item is not None]
    return value


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill in ``default`` for absent fields, depth first (an object default gets its own defaults)."""
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in list(value):
                if key not in schema.get("properties", {}):
                    value[key] = apply_defaults(extra, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def _path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return '"object"' if isinstance(value, dict) else '"array"'
    return json.dumps(value)


def schema_errors(schema: dict[str, Any], value: Any, *, root: str = "") -> list[str]:
    """Every schema violation, one line each, in the API server's words."""
    validator = jsonschema.Draft4Validator(schema)
    problems = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        parts = [root] if root else []
        parts += list(error.absolute_path)
        path = _path(parts)
        kind, detail = error.validator, error.validator_value
        if kind == "required":
            missing = error.message.split("'")[1]
            problems.append(f"{_path([*parts, missing])}: Required value")
        elif kind == "enum":
            options = ", ".join(json.dumps(o) for o in detail)
            problems.append(
                f"{path}: Unsupported value: {_show(error.instance)}: supported values: {options}"
            )
        elif kind == "type":
            problems.append(
                f"{path}: Invalid value: {_show(error.instance)}: {path} in body must be of type {detail}: "
                f"{_show(type(error.instance).__name__)}"
            )
        elif kind == "minimum":
            op = "greater than" if error.schema.get("exclusiveMinimum") else "greater than or equal to"
            problems.append(
                f"{path}: Invalid value: {_show(error.instance)}: {path} in body should be {op} {detail}"
            )
        elif kind == "maximum":
            op = "less than" if error.schema.get("exclusiveMaximum") else "less than or equal to"
            problems.append(
                f"{path}: Invalid value: {_show(error.instance)}: {path} in body should be {op} {detail}"
            )
        elif kind == "pattern":
            problems.append(
                f"{path}: Invalid value: {_show(error.instance)}: {path} in body should match '{detail}'"
            )
        elif kind in ("maxLength", "minLength"):
            word = "at most" if kind == "maxLength" else "at least"
            shown = _show(error.instance)
            problems.append(
                f"{path}: Invalid value: {shown}: {path} in body should be {word} {detail} chars long"
            )
        elif kind in ("maxItems", "minItems"):
            word = "at most" if kind == "maxItems" else "at least"
            problems.append(f"{path}: Too many: {len(error.instance)}: must have {word} {detail} items")
        elif kind == "anyOf":
            shown = _show(error.instance)
            problems.append(
                f"{path}: Invalid value: {shown}: {path} in body must be of type integer or string"
            )
        else:
            problems.append(f"{path}: Invalid value: {error.message}")
    return problems


def cel_errors(schema: dict[str, Any], value: Any, *, path: str = "") -> list[str]:
    """Evaluate every ``x-kubernetes-validations`` rule on the values present."""
    problems: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        if not _cel_holds(rule["rule"], value):
            field = path + rule.get("fieldPath", "")
            problems.append(f"{field}: Invalid value: {_show(value)}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                problems += cel_errors(sub, value[key], path=f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += cel_errors(schema["items"], item, path=f"{path}[{index}]")
    return problems


_CEL = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _cel_holds(rule: str, value: Any) -> bool:
    program = _PROGRAMS.get(rule)
    if program is None:
        program = _PROGRAMS[rule] = _CEL.program(_CEL.compile(rule))
    try:
        return bool(program.evaluate({"self": celpy.json_to_cel(value)}))
    except celpy.CELEvalError:
        return False


def admit(schema: dict[str, Any], obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Prune, default and validate a whole custom resource; returns the stored form and the problems."""
    stored = prune(schema, copy.deepcopy(obj))
    for key in ("metadata", "apiVersion", "kind"):
        if key in obj:
            stored[key] = obj[key]
    stored = apply_defaults(schema, stored)
    checked = {k: v for k, v in stored.items() if k not in ("metadata", "apiVersion", "kind")}
    subschema = {
        **schema,
        "properties": {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"},
    }
    name = obj.get("metadata", {}).get("name", "")
    name_schema = schema.get("properties", {}).get("metadata", {}).get("properties", {}).get("name")
    problems = schema_errors(subschema, checked)
    if name_schema and name:
        problems += schema_errors(name_schema, name, root="metadata.name")
    problems += cel_errors(subschema, checked)
    return stored, problems


# Printer columns ---------------------------------------------------------------------------------


def json_path(obj: Any, path: str) -> Any:
    """Plain dotted JSON paths (``.status.phase``), which is all our printer columns use."""
    node = obj
    for part in path.strip(".").split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def human_age(since: str | None, now: datetime | None = None) -> str:
    """kubectl's short durations: 45s, 3m12s, 17m, 5h, 3d."""
    if not since:
        return "<unknown>"
    start = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = max(0, int(((now or datetime.now(UTC)) - start).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    value = json_path(obj, column["jsonPath"])
    if column.get("type") == "date":
        return human_age(value)
    return value
