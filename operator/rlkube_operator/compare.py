"""Comparing documents: which fields of a spec changed, and where a live child drifted from its rendering.

Pure: plain dicts and lists in, dotted field paths out (``spec.train.maxEpochs``,
``spec.template.spec.containers[0].image``).

* :func:`changed_fields` -- every leaf that differs between two documents (added, removed or
  changed), for the event that names what a spec change restarts.
* :func:`drift` -- where a live object no longer holds what the operator rendered. The API server
  adds fields (defaults, status, server metadata), so the rendering only has to be *contained* in
  the live object: every rendered key with the same value, every rendered list item matched in
  place. Only the parts the operator renders are compared (``spec``, ``data`` and the rendered
  labels and annotations).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The top-level parts of a child that drift is looked for in.
COMPARED = ("spec", "data")


def changed_fields(old: Any, new: Any, *, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves that differ between ``old`` and ``new``, in sorted order."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                out.append(path)
            else:
                out += changed_fields(old[key], new[key], prefix=path)
        return out
    return [] if old == new else [prefix or "."]


def drift(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Paths where ``live`` does not hold what ``rendered`` says (empty: no drift)."""
    out: list[str] = []
    for part in COMPARED:
        if part in rendered:
            out += _missing(rendered[part], live.get(part), part)
    meta, live_meta = rendered.get("metadata") or {}, live.get("metadata") or {}
    for part in ("labels", "annotations"):
        if part in meta:
            out += _missing(meta[part], live_meta.get(part) or {}, f"metadata.{part}")
    return out


def _missing(want: Any, have: Any, path: str) -> list[str]:
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            return [path]
        out: list[str] = []
        for key, value in want.items():
            out += _missing(value, have.get(key), f"{path}.{key}") if key in have else [f"{path}.{key}"]
        return out
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return [path]
        out = []
        for index, (w, h) in enumerate(zip(want, have, strict=True)):
            out += _missing(w, h, f"{path}[{index}]")
        return out
    return [] if want == have else [path]
