"""The OpenAPI v3 documents the API server publishes, built from the types the emulator serves.

Pure. ``/openapi/v3`` lists one document per group-version; each document has the paths of
its resources (every PATCH and POST declares the ``fieldValidation`` query parameter, which is how
kubectl learns that the server validates fields itself, so ``kubectl apply`` needs no
``--validate=false`` and a typo is refused by the server's strict decoding) and one schema per
kind with its ``x-kubernetes-group-version-kind`` (what ``kubectl explain`` looks for). Custom
resources carry their CRD's schema; built-in kinds Kubernetes' own schemas and every type they
refer to (:mod:`rlkube_devcluster.emulator.builtin_openapi`), so ``kubectl explain sts.spec`` shows
the real field documentation.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from typing import Any

from rlkube_devcluster.emulator import builtin_openapi
from rlkube_devcluster.emulator.resources import ResourceType

#: The query parameters of a write, as the API server declares them.
WRITE_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation")
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def group_version_path(group: str, version: str) -> str:
    """The key of a group-version in ``/openapi/v3``: ``api/v1`` or ``apis/<group>/<version>``."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(rtype: ResourceType) -> str:
    """Component names as the API server spells them: the group reversed, then version and kind."""
    if not rtype.group:
        return f"io.k8s.api.core.{rtype.version}.{rtype.kind}"
    if "." not in rtype.group or rtype.group.endswith(".k8s.io"):
        short = rtype.group.removesuffix(".k8s.io").replace(".", "")
        return f"io.k8s.api.{short}.{rtype.version}.{rtype.kind}"
    return ".".join([*reversed(rtype.group.split(".")), rtype.version, rtype.kind])


def by_group_version(types: Iterable[ResourceType]) -> dict[str, list[ResourceType]]:
    grouped: dict[str, list[ResourceType]] = {}
    for rtype in types:
        grouped.setdefault(group_version_path(rtype.group, rtype.version), []).append(rtype)
    return grouped


def document(types: list[ResourceType]) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version."""
    paths: dict[str, Any] = {}
    builtins = {rtype: builtin_openapi.kind_name(rtype.group, rtype.version, rtype.kind) for rtype in types}
    named = [n for rtype, n in builtins.items() if n is not None and rtype.schema is None]
    schemas: dict[str, Any] = builtin_openapi.components([OBJECT_META, *named])
    for rtype in types:
        gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
        builtin = builtins[rtype]
        name = builtin if builtin is not None and rtype.schema is None else schema_name(rtype)
        if name not in schemas:
            schemas[name] = _kind_schema(rtype, gvk)
        ref = {"$ref": f"#/components/schemas/{name}"}
        base = f"/{group_version_path(rtype.group, rtype.version)}"
        collection = (
            f"{base}/namespaces/{{namespace}}/{rtype.plural}"
            if rtype.namespaced
            else (f"{base}/{rtype.plural}")
        )
        paths[collection] = {
            "get": _operation(f"list{rtype.kind}", gvk, "list", ()),
            "post": _operation(f"create{rtype.kind}", gvk, "post", WRITE_PARAMETERS, body=ref),
        }
        paths[f"{collection}/{{name}}"] = {
            "get": _operation(f"read{rtype.kind}", gvk, "get", ()),
            "put": _operation(f"replace{rtype.kind}", gvk, "put", WRITE_PARAMETERS, body=ref),
            "patch": _operation(f"patch{rtype.kind}", gvk, "patch", (*WRITE_PARAMETERS, "force")),
            "delete": _operation(f"delete{rtype.kind}", gvk, "delete", ("dryRun",)),
        }
        for sub in sorted(rtype.subresources & {"status", "scale"}):
            paths[f"{collection}/{{name}}/{sub}"] = {
                "get": _operation(f"read{rtype.kind}{sub.title()}", gvk, "get", ()),
                "patch": _operation(
                    f"patch{rtype.kind}{sub.title()}", gvk, "patch", (*WRITE_PARAMETERS, "force")
                ),
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0-rlkube-emulator"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def index(types: Iterable[ResourceType]) -> dict[str, Any]:
    """``/openapi/v3``: each group-version's document URL, with a hash of its content."""
    paths = {}
    for path, members in sorted(by_group_version(types).items()):
        digest = hashlib.sha256(json.dumps(document(members), sort_keys=True).encode()).hexdigest()[:32]
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest.upper()}"}
    return {"paths": paths}


def _operation(
    operation_id: str, gvk: dict[str, str], action: str, params: tuple[str, ...], *, body: Any = None
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": operation_id,
        "parameters": [
            {"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
            for name in params
        ],
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": dict(gvk),
    }
    if body is not None:
        op["requestBody"] = {"content": {"*/*": {"schema": body}}, "required": True}
    return op


def _kind_schema(rtype: ResourceType, gvk: dict[str, str]) -> dict[str, Any]:
    if rtype.schema is not None:
        schema = copy.deepcopy(rtype.schema)
        properties = schema.setdefault("properties", {})
        # As the API server publishes a CRD: standard metadata, apiVersion and kind described.
        properties["metadata"] = {
            "allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}],
            "description": "Standard object's metadata.",
        }
    else:
        schema = {
            "type": "object",
            "description": f"{rtype.kind} ({rtype.api_version}), as the emulator serves it.",
            "properties": {
                "metadata": {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}]},
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "x-kubernetes-preserve-unknown-fields": True,
        }
    properties = schema["properties"]
    properties.setdefault("apiVersion", {"type": "string"})
    properties.setdefault("kind", {"type": "string"})
    properties["apiVersion"].setdefault(
        "description", "APIVersion defines the versioned schema of this representation of an object."
    )
    properties["kind"].setdefault("description", "Kind is a string value representing the REST resource.")
    schema["x-kubernetes-group-version-kind"] = [gvk]
    return schema
