"""``get_logger``, ``log_metric`` and ``setup_logger`` on Python's logging (see the package docstring)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "WARINING": logging.WARNING,
}
_LEVELS |= {"ERROR": logging.ERROR, "CRITICAL": logging.CRITICAL}


def get_logger(name: str) -> logging.Logger:
    """The standard logger ``name``: its records reach the run's console and the pod log."""
    return logging.getLogger(name)


def log_metric(
    payload: Mapping[str, Any], level: int = logging.INFO, step: int | None = None, prefix: str | None = None
) -> None:
    """Write ``payload`` (name -> figure) to the log as one line, tagged with ``prefix`` and ``step``."""
    if not isinstance(payload, Mapping):
        raise TypeError(f"log_metric takes a dict of name -> value, got {type(payload).__name__}")
    figures = ", ".join(f"{key}={_shown(value)}" for key, value in payload.items())
    tag = f"[{prefix}] " if prefix else ""
    at = f" (step {step})" if step is not None else ""
    logging.getLogger("rlkube.metrics.log").log(level, "%s%s%s", tag, figures, at)


def setup_logger(cfg: Any = None) -> None:
    """Set the root level from ``cfg.level`` (RLightning's LogConfig); handlers are rlkube's own.

    ``rlkube run`` and the pods set up logging before any policy code runs, so this only adjusts
    the level; backends (TensorBoard) are chosen in the RLJob's ``log`` section.
    """
    name = getattr(cfg, "level", None) if cfg is not None else None
    if name is None:
        return
    level = _LEVELS.get(str(name).upper())
    if level is None:
        raise ValueError(f"log level {name!r} is not one of {', '.join(sorted(_LEVELS))}")
    logging.getLogger().setLevel(level)


def _shown(value: Any) -> str:
    item = getattr(value, "item", None)
    if callable(item):
        try:
            value = item()
        except (RuntimeError, ValueError):  # a tensor of several elements
            return str(value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)
