"""What a kubelet fills in for a container: the downward API's env values, and its timestamps."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

_FIELD_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def now_rfc3339() -> str:
    """Now, as the API server writes times (seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_environment(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The env a container would get: values as written, downward-API ``fieldRef`` fields resolved."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        match = _FIELD_REF.match(ref)
        if match:
            env[item["name"]] = str((pod["metadata"].get(match.group(1)) or {}).get(match.group(2), ""))
        elif ref == "metadata.name":
            env[item["name"]] = pod["metadata"]["name"]
        elif ref == "metadata.namespace":
            env[item["name"]] = pod["metadata"].get("namespace", "")
        elif ref == "metadata.uid":
            env[item["name"]] = pod["metadata"].get("uid", "")
        elif ref == "spec.nodeName":
            env[item["name"]] = (pod.get("spec") or {}).get("nodeName", "")
        elif ref == "status.podIP":
            env[item["name"]] = (pod.get("status") or {}).get("podIP", "")
        elif ref:
            raise ValueError(f"unsupported downward API field {ref!r} in env {item['name']}")
    return env
