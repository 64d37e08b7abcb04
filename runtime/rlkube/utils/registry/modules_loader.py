"""RLightning's ``load_modules_from_config``: import the modules a config lists under ``imports``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkube.policy.registry import import_modules


def load_modules_from_config(config: Any) -> None:
    """Import every dotted module in ``config.imports`` (or ``config["imports"]``); none listed is fine.

    The RLJob equivalent is ``spec.imports``, which rlkube imports in every process by itself.
    """
    listed = config.get("imports") if isinstance(config, Mapping) else getattr(config, "imports", None)
    if listed is None:
        return
    if isinstance(listed, str) or not all(isinstance(name, str) for name in listed):
        raise TypeError(f"config imports must be a list of dotted module names, got {listed!r}")
    import_modules(listed)
