"""What the API server checks in Pods and StatefulSets beyond their schema (pure).

The checks and their messages follow Kubernetes' own validation (pkg/apis/core/validation,
pkg/apis/apps/validation, apimachinery's label and quantity rules), for the parts rlkube's
objects exercise: label keys and values, resource quantities, requests not above limits, and a
StatefulSet whose selector matches its pod template.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|(?:[eE][+-]?[0-9]+))?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
QUANTITY_MESSAGE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def parse_quantity(value: Any) -> Decimal | None:
    """The amount of a quantity (``500m`` -> 0.5, ``1Gi`` -> 1073741824); None if it is none."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return None
    number, suffix = match.group(1), match.group(2) or ""
    try:
        amount = Decimal(number)
    except InvalidOperation:
        return None
    if suffix[:1] in ("e", "E"):
        return amount * Decimal(10) ** int(suffix[1:])
    return amount * _SUFFIX[suffix]


def label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
    if not name or len(name) > 63 or not re.fullmatch(_QUALIFIED_NAME, name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character (at most 63 characters)"
        )
    return None


def label_problems(labels: Any, path: str) -> list[str]:
    problems = []
    for key, value in dict(labels or {}).items():
        why = label_key_problem(str(key))
        if why:
            problems.append(f"{path}: Invalid value: {json.dumps(key)}: {why}")
        if not isinstance(value, str) or len(value) > 63 or not re.fullmatch(_LABEL_VALUE, value):
            problems.append(
                f"{path}: Invalid value: {json.dumps(value)}: a valid label must be an empty string or "
                "consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character (at most 63 characters; regex used for validation is "
                f"'{_LABEL_VALUE}')"
            )
    return problems


def container_problems(container: dict[str, Any], path: str) -> list[str]:
    problems: list[str] = []
    resources = container.get("resources") or {}
    amounts: dict[str, dict[str, Decimal]] = {}
    for kind in ("requests", "limits"):
        for name, value in dict(resources.get(kind) or {}).items():
            amount = parse_quantity(value)
            where = f"{path}.resources.{kind}[{name}]"
            if amount is None:
                problems.append(f"{where}: Invalid value: {json.dumps(str(value))}: {QUANTITY_MESSAGE}")
            elif amount < 0:
                shown = json.dumps(str(value))
                problems.append(f"{where}: Invalid value: {shown}: must be greater than or equal to 0")
            else:
                amounts.setdefault(kind, {})[name] = amount
    for name, request in amounts.get("requests", {}).items():
        limit = amounts.get("limits", {}).get(name)
        if limit is not None and request > limit:
            value = resources["requests"][name]
            problems.append(
                f"{path}.resources.requests: Invalid value: {json.dumps(str(value))}: must be less than "
                f"or equal to {name} limit of {resources['limits'][name]}"
            )
    return problems


def pod_spec_problems(spec: dict[str, Any], path: str) -> list[str]:
    problems: list[str] = []
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(kind) or []):
            problems += container_problems(container, f"{path}.{kind}[{index}]")
    return problems


def problems(kind: str, obj: dict[str, Any]) -> list[str]:
    """What the API server refuses in a Pod or StatefulSet (other kinds: only their labels)."""
    found = label_problems((obj.get("metadata") or {}).get("labels"), "metadata.labels")
    if kind == "Pod":
        found += pod_spec_problems(obj.get("spec") or {}, "spec")
    elif kind == "StatefulSet":
        spec = obj.get("spec") or {}
        template = spec.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        found += label_problems(labels, "spec.template.metadata.labels")
        found += pod_spec_problems(template.get("spec") or {}, "spec.template.spec")
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if any(labels.get(key) != value for key, value in selector.items()):
            found.append(
                f"spec.template.metadata.labels: Invalid value: {json.dumps(labels)}: `selector` does "
                "not match template `labels`"
            )
    return found
