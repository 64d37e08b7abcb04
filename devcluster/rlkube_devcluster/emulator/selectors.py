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
        return _always
    tests: list[Matcher] = []
    for term in _split(selector):
        match = _SET_RE.match(term)
        if match:
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            tests.append(_label_in(key, values) if op == "in" else _negated(_label_in(key, values)))
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(_negated(_label_in(key, {value})))
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(_label_in(key, {value}))
        elif term.startswith("!"):
            tests.append(_negated(_has_label(term[1:].strip())))
        elif re.fullmatch(r"[A-Za-z0-9_./-]+", term):
            tests.append(_has_label(term))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return _all_of(tests)


def _always(item: Mapping[str, Any]) -> bool:
    return True


def _all_of(tests: list[Matcher]) -> Matcher:
    return lambda item: all(test(item) for test in tests)


def _negated(test: Matcher) -> Matcher:
    return lambda item: not test(item)


def _label_in(key: str, values: set[str]) -> Matcher:
    return lambda labels: labels.get(key) in values


def _has_label(key: str) -> Matcher:
    return lambda labels: key in labels


def _field_is(path: str, value: str) -> Matcher:
    return lambda obj: _dotted(obj, path) == value


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
        return _always
    tests: list[Matcher] = []
    for term in _split(selector):
        if "!=" in term:
            path, value = (s.strip() for s in term.split("!=", 1))
            tests.append(_negated(_field_is(path, value)))
        elif "=" in term:
            path, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(_field_is(path, value))
        else:
            raise SelectorError(f"invalid field selector: {term!r}")
    return _all_of(tests)


def object_matcher(label_selector: str | None, field_selector: str | None) -> Matcher:
    labels = label_matcher(label_selector)
    fields = field_matcher(field_selector)
    return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields(obj)


def selector_string(match_labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
