"""The PodGroup schemas of Volcano and scheduler-plugins (vendored YAML), as strict validators.

A CRD's structural schema does not say ``additionalProperties: false``: the API server prunes
unknown fields, or refuses them under ``fieldValidation=Strict`` (kubectl's default). The
validators here do what strict validation does: an unknown field anywhere is an error.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent / "schemas"
FILES = {
    "scheduling.volcano.sh/v1beta1": "volcano-podgroup-v1beta1.yaml",
    "scheduling.x-k8s.io/v1alpha1": "coscheduling-podgroup-v1alpha1.yaml",
}


def strict(node: Any) -> Any:
    """The schema with unknown fields refused wherever it lists properties and keeps no unknowns."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def validator(api_version: str) -> jsonschema.Draft7Validator:
    schema = yaml.safe_load((HERE / FILES[api_version]).read_text())
    return jsonschema.Draft7Validator(strict(copy.deepcopy(schema)))


def problems(obj: dict[str, Any]) -> list[str]:
    """Every schema violation of a PodGroup, as ``path: message``."""
    found = validator(obj["apiVersion"]).iter_errors(obj)
    return sorted(f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in found)
