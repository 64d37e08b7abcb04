"""Name -> class registries (``@POLICIES.register("PPO")``) and importing user modules.

``import_modules`` is the only I/O here: it imports the dotted modules a job names so that their
registration decorators run before the registry is asked for a class.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named map of classes; registering a different class under a taken name is an error."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None, *, force: bool = False) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            key = name or getattr(obj, "__name__", None)
            if not key:
                raise ValueError(f"{self.kind} registry: cannot infer a name for {obj!r}")
            existing = self._entries.get(key)
            if (
                existing is not None
                and existing is not obj
                and not force
                and not _same_definition(existing, obj)
            ):
                raise KeyError(
                    f"{self.kind} {key!r} is already registered by "
                    f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}"
                )
            self._entries[key] = obj
            return obj

        return decorator

    def get(self, name: str, *, imported: Iterable[str] = ()) -> T:
        """The class registered as ``name``; ``imported`` (the job's modules) sharpens the error."""
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            known = ", ".join(sorted(self._entries)) or "none"
            raise KeyError(
                f"no {self.kind} named {name!r} is registered (registered: {known}){hint}. "
                + self._where_to_look(list(imported))
            ) from None

    def registered_by(self, module: str) -> list[str]:
        """Names registered by classes defined in ``module``."""
        return sorted(k for k, v in self._entries.items() if getattr(v, "__module__", None) == module)

    def _where_to_look(self, imported: list[str]) -> str:
        if not imported:
            return "If it lives in your own module, list that module in spec.imports or spec.policy.module."
        silent = [m for m in imported if not self.registered_by(m)]
        others = {m: self.registered_by(m) for m in imported if self.registered_by(m)}
        parts = []
        if silent:
            parts.append(
                f"{', '.join(map(repr, silent))} imported but registered no {self.kind}: decorate the class "
                f'with @POLICIES.register("Name"), POLICIES imported from rlkube.utils.registry '
                "(or rlkube.policy), in that module itself"
            )
        for module, names in others.items():
            parts.append(f"{module!r} registered {', '.join(map(repr, names))}")
        return "; ".join(parts) + "."

    def build(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.get(name)(*args, **kwargs)  # type: ignore[operator]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def _same_definition(a: Any, b: Any) -> bool:
    """A module imported twice (e.g. as a script and as a package) re-registers the same class."""
    return getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None) and (
        getattr(a, "__module__", "").rsplit(".", 1)[-1] == getattr(b, "__module__", "").rsplit(".", 1)[-1]
    )


#: Policy classes by name; ``spec.policy.type`` looks up here.
POLICIES: Registry[Any] = Registry("policy")


def import_modules(modules: Iterable[str]) -> None:
    """Import each dotted module; a failure names the module and the field that asked for it."""
    for module in modules:
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"cannot import {module!r} (from spec.imports / spec.policy.module): {exc}"
            ) from exc
