"""Free-form configuration sections with attribute access.

Pure: no I/O. ``policy.modelCfg``, ``policy.optimCfg`` and ``policy.algoCfg`` are whatever a
policy reads; RLightning policies read them as attributes (``optim_cfg.lr``), so they arrive
as :class:`Config`, a plain ``dict`` whose keys can also be read as attributes. Keys are kept
exactly as written in YAML; an attribute that is missing is an ``AttributeError`` naming the
section and the keys that do exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema


class Config(dict[str, Any]):
    """A dict whose keys read as attributes, recursively (lists of dicts included)."""

    def __init__(self, data: Mapping[str, Any] | None = None, /, *, path: str = "") -> None:
        super().__init__()
        object.__setattr__(self, "_path", path)
        for key, value in (data or {}).items():
            self[str(key)] = _wrap(value, f"{path}.{key}" if path else str(key))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy and pickle probe hooks (__setstate__, ...) before __init__ ran
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            where = self.__dict__.get("_path") or "config"
            known = ", ".join(sorted(self)) or "none"
            raise AttributeError(f"{where} has no key {name!r} (keys: {known})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = _wrap(value, f"{self._path}.{name}" if self._path else name)

    def get_path(self, dotted: str, default: Any = None) -> Any:
        """``cfg.get_path("a.b")`` is ``cfg["a"]["b"]`` or ``default`` when any step is missing."""
        node: Any = self
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    def to_dict(self) -> dict[str, Any]:
        return {key: _unwrap(value) for key, value in self.items()}

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.dict_schema(keys_schema=core_schema.str_schema()),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda v: _unwrap(v)),
        )


def _wrap(value: Any, path: str) -> Any:
    if isinstance(value, Config):
        return value
    if isinstance(value, Mapping):
        return Config(value, path=path)
    if isinstance(value, list):
        return [_wrap(item, f"{path}[{i}]") for i, item in enumerate(value)]
    return value


def _unwrap(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _unwrap(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unwrap(item) for item in value]
    return value
