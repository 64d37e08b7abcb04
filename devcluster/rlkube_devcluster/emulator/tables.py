"""Server-side tables (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``), as kubectl get asks.

Custom resources get their CRD's printer columns; a few built-ins get the columns kubectl users
know; everything else gets Name and Age.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlkube_devcluster.emulator import schema as crdschema
from rlkube_devcluster.emulator.resources import ResourceType

Column = tuple[str, str, Callable[[dict[str, Any]], Any]]


def _age(obj: dict[str, Any]) -> str:
    return crdschema.human_age(obj.get("metadata", {}).get("creationTimestamp"))


def _pod_ready(obj: dict[str, Any]) -> str:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    total = len((obj.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("spec") or {}


def _involved(obj: dict[str, Any]) -> str:
    ref = obj.get("involvedObject") or {}
    return f"{ref.get('kind', '').lower()}/{ref.get('name', '')}"


def _ports(obj: dict[str, Any]) -> str:
    ports = _spec(obj).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _restarts(obj: dict[str, Any]) -> int:
    return sum(
        int(s.get("restartCount", 0)) for s in (obj.get("status") or {}).get("containerStatuses") or []
    )


BUILTIN_COLUMNS: dict[str, list[Column]] = {
    "pods": [
        ("Ready", "string", _pod_ready),
        ("Status", "string", lambda o: (o.get("status") or {}).get("phase", "Pending")),
        ("Restarts", "integer", _restarts),
        ("Age", "string", _age),
        ("Node", "string", lambda o: (o.get("spec") or {}).get("nodeName", "<none>")),
    ],
    "statefulsets": [
        (
            "Ready",
            "string",
            lambda o: f"{(o.get('status') or {}).get('readyReplicas', 0)}/{_spec(o).get('replicas', 0)}",
        ),
        ("Age", "string", _age),
    ],
    "services": [
        ("Type", "string", lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
        ("Cluster-IP", "string", lambda o: (o.get("spec") or {}).get("clusterIP", "<none>")),
        ("Ports", "string", _ports),
        ("Age", "string", _age),
    ],
    "events": [
        ("Type", "string", lambda o: o.get("type", "")),
        ("Reason", "string", lambda o: o.get("reason", "")),
        ("Object", "string", _involved),
        ("Message", "string", lambda o: o.get("message", "")),
    ],
}


def _printer_cell(column: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda obj: crdschema.cell(obj, column)


def columns_of(rtype: ResourceType) -> list[Column]:
    if rtype.printer_columns:
        return [
            (c["name"], c.get("type", "string"), _printer_cell(c))
            for c in rtype.printer_columns
            if int(c.get("priority", 0)) == 0
        ]
    return BUILTIN_COLUMNS.get(rtype.plural, [("Age", "string", _age)])


def table(
    rtype: ResourceType, items: list[dict[str, Any]], *, include: str, resource_version: str
) -> dict[str, Any]:
    columns = columns_of(rtype)
    definitions = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    definitions += [
        {"name": n, "type": t, "format": "", "description": "", "priority": 0} for n, t, _ in columns
    ]
    rows = []
    for obj in items:
        if include == "Object":
            embedded = obj
        elif include == "None":
            embedded = None
        else:
            embedded = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        row: dict[str, Any] = {"cells": [obj["metadata"]["name"], *(fn(obj) for _, _, fn in columns)]}
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
