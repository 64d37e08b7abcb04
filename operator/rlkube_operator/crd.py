"""The RLJob CustomResourceDefinition, generated from ``rlkube.spec`` (and the status models).

Pure: builds a dict. ``scripts/generate.py`` writes it to crds/rljob.yaml (and the chart's copy),
and a test fails when the committed file differs from what this module builds.

How pydantic's JSON schema becomes a structural OpenAPI v3 schema:

* ``$ref``/``$defs`` are inlined (structural schemas cannot refer); ``title`` is dropped.
* ``X | None`` becomes plain ``X``: without ``nullable`` the API server prunes a ``null``, so a
  null means "absent" and spec.py's default applies.
* free-form sections (``Config``, ``dict[str, Any]``) become ``x-kubernetes-preserve-unknown-fields``;
  ``additionalProperties: false`` is dropped (the API server prunes unknown fields instead).
* quantities (``int | float | str``) become ``x-kubernetes-int-or-string`` with the quantity pattern.
* ``exclusiveMinimum: N`` becomes ``minimum: N, exclusiveMinimum: true`` (OpenAPI 3.0 spelling).
* an optional object field defaults to the object its own properties' defaults make (what the API
  server makes of ``{}``): the API server checks a default against the schema and its CEL rules as
  it stands, without filling in the defaults nested in it, so ``default: {}`` would fail a rule that
  reads a defaulted field (``self.gang``) and the CRD would be rejected.
* :data:`rlkube.spec.CROSS_FIELD_RULES` become CEL ``x-kubernetes-validations`` on ``spec``.
* ``status.progress`` also lists the coordinator's ``JobStatus`` fields it shows as they are,
  from the proto descriptor (:mod:`rlkube_operator.progress_fields`).
"""

from __future__ import annotations

import copy
from typing import Any

from rlkube import spec as specmod
from rlkube.spec import RLJobSpec

from rlkube_operator.progress_fields import shown_schema
from rlkube_operator.status import RLJobStatus

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
    r"|(\.[0-9]+))))?$"
)

CRD_NAME = f"{specmod.PLURAL}.{specmod.API_GROUP}"
CATEGORIES = ("all", "rlkube")

#: ``kubectl get rlj`` columns. Paths are plain dotted paths (no filters), so every client renders them.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Job phase"},
    {
        "name": "Train",
        "type": "string",
        "jsonPath": ".status.train.ready",
        "description": "Train ranks ready",
    },
    {
        "name": "Eval",
        "type": "string",
        "jsonPath": ".status.eval.ready",
        "description": "Eval replicas ready",
    },
    {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch", "description": "Epoch"},
    {
        "name": "Published",
        "type": "integer",
        "jsonPath": ".status.progress.weightVersion",
        "description": "Newest published weight version",
    },
    {
        "name": "Loaded",
        "type": "integer",
        "jsonPath": ".status.progress.loadedVersion",
        "description": "Weight version loaded on every node (the minimum over nodes)",
    },
    {
        "name": "Return",
        "type": "number",
        "jsonPath": ".status.progress.lastReturn",
        "description": "Mean of the last 20 episode returns",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

SCALE = {
    "specReplicasPath": ".spec.evaluator.replicas",
    "statusReplicasPath": ".status.eval.replicas",
    "labelSelectorPath": ".status.eval.selector",
}

_DROP_KEYS = {"title", "$defs"}


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec_schema = structural(RLJobSpec.model_json_schema(by_alias=True, mode="validation"))
    spec_schema["x-kubernetes-validations"] = [
        {
            "rule": rule.cel,
            "message": f"{rule.path}: {rule.message}",
            "fieldPath": "." + rule.path.removeprefix("spec."),
            "reason": "FieldValueInvalid",
        }
        for rule in specmod.CROSS_FIELD_RULES
    ]
    status_schema = _without_defaults(
        structural(RLJobStatus.model_json_schema(by_alias=True, mode="serialization"))
    )
    # Status is written by the operator only; a field a newer operator adds must not be pruned
    # by an older CRD during an upgrade.
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    # The coordinator's figures copied as they are (progress_fields): listed from the proto.
    status_schema["properties"]["progress"]["properties"].update(shown_schema())
    root = {
        "type": "object",
        "description": "A reinforcement-learning job: DDP train ranks, elastic eval replicas, weight sync.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "maxLength": specmod.MAX_JOB_NAME_LENGTH,
                        "pattern": specmod.DNS_LABEL,
                    }
                },
            },
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "rlkube"}},
        "spec": {
            "group": specmod.API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": specmod.KIND,
                "listKind": f"{specmod.KIND}List",
                "plural": specmod.PLURAL,
                "singular": specmod.SINGULAR,
                "shortNames": list(specmod.SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": specmod.API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {"status": {}, "scale": dict(SCALE)},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                }
            ],
        },
    }


def structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON schema (with ``$defs``) into a structural OpenAPI v3 schema."""
    defs = schema.get("$defs", {})
    return _convert(schema, defs)


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    # X | None -> X (nulls are pruned); int | float | str -> quantity.
    if "anyOf" in node:
        branches = [_resolve(b, defs) for b in node["anyOf"]]
        non_null = [b for b in branches if b.get("type") != "null"]
        types = sorted(b.get("type", "") for b in non_null)
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if "default" in rest and rest["default"] is None:
            del rest["default"]
        if types == ["integer", "number", "string"] or types == ["integer", "string"]:
            return {
                **_annotations(rest),
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
                "pattern": QUANTITY_PATTERN,
            }
        if len(non_null) == 1:
            merged = {**non_null[0], **{k: v for k, v in rest.items() if k != "title"}}
            return _convert(merged, defs)
        raise ValueError(f"cannot express anyOf {types} in a structural schema")

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "properties":
            out["properties"] = {name: _property(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = _convert(value, defs)
            elif value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            # False: dropped; the API server prunes unknown fields
        elif key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum":
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        elif key == "const":
            out["enum"] = [value]
        else:
            out[key] = copy.deepcopy(value)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("x-kubernetes-preserve-unknown-fields") and "properties" not in out:
        out.pop("additionalProperties", None)
    return out


def _property(sub: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    converted = _convert(sub, defs)
    resolved = _resolve(sub, defs)
    # An optional sub-object (default_factory in pydantic) defaults to its properties' defaults
    # (each already filled in the same way, so this is the whole defaulted object).
    if (
        converted.get("type") == "object"
        and "default" not in converted
        and "properties" in converted
        and not resolved.get("required")
    ):
        converted["default"] = {
            name: copy.deepcopy(prop["default"])
            for name, prop in converted["properties"].items()
            if "default" in prop
        }
    return converted


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        target = dict(defs[name])
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _without_defaults(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def _annotations(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in node.items() if k in ("description", "default")}
