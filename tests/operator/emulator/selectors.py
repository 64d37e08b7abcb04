"""Label and field selectors, as ``?labelSelector=`` and ``?fieldSelector=`` spell them.

Pure. Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``.
Field selectors: ``path=value`` and ``path!=value`` over dotted paths (``metadata.name``,
``involvedObject.uid``, ``status.phase``), which is all kubectl and kopf send.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


class SelectorError(ValueError):
    pass


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def label_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda labels: True
    tests: list[Matcher] = []
    for term in _split(selector):
        match = _SET_RE.match(term)
        if match:
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            tests.append(lambda labels, k=term[1:].strip(): k not in labels)
        elif re.fullmatch(r"[A-Za-z0-9_./-]+", term):
            tests.append(lambda labels, k=term: k in labels)
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return lambda labels: all(test(labels) for test in tests)


def _dotted(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    return str(node).lower() if isinstance(node, bool) else str(node)


def field_matcher(selector: str | None) -> Matcher:
    if not selector:
        return lambda obj: True
    tests: list[Matcher] = []
    for term in _split(selector):
        if "!=" in term:
            path, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda obj, p=path, v=value: _dotted(obj, p) != v)
        elif "=" in term:
            path, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda obj, p=path, v=value: _dotted(obj, p) == v)
        else:
            raise SelectorError(f"invalid field selector: {term!r}")
    return lambda obj: all(test(obj) for test in tests)


def object_matcher(label_selector: str | None, field_selector: str | None) -> Matcher:
    labels = label_matcher(label_selector)
    fields = field_matcher(field_selector)
    return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields(obj)


def selector_string(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
