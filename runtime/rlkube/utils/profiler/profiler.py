"""Timing as RLightning's policies use it: ``@profiler.timer_wrap``, ``timer``, ``record_timing``.

Each measurement is added to a ``timing_raw`` dict (``{name: {"count", "total", "avg"}}``; on a
policy that is ``self.timing_raw``, which ``BasePolicy.print_timing_summary`` prints) and logged
as ``time_profile/<name>: <seconds>s`` at the chosen level. With ``log_to_metric=True`` on a
policy's method the seconds also go to ``self.log_metric("time_profile/<name>", ...)``, i.e. onto
the job's charts and into its summary (rlkube's metrics), instead of the log line.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from rlkube.utils.logger import get_logger, log_metric

logger = get_logger(__name__)

TimingRaw = MutableMapping[str, dict[str, Any]]
F = TypeVar("F", bound=Callable[..., Any])


def _level(level: str) -> int:
    return logging.INFO if level == "info" else logging.DEBUG


def record_timing(name: str, duration_s: float, timing_raw: TimingRaw, level: str = "info") -> None:
    """Add one duration to ``timing_raw[name]`` and log it; a non-number is ignored, as in RLightning."""
    if isinstance(duration_s, bool) or not isinstance(duration_s, int | float):
        return
    _add(timing_raw, name, float(duration_s))
    logger.log(_level(level), "time_profile/%s: %.4fs", name, float(duration_s))


@contextmanager
def timer(name: str, timing_raw: TimingRaw, level: str = "info", enable: bool = True) -> Iterator[None]:
    """Time the ``with`` block into ``timing_raw[name]`` (nothing happens when ``enable`` is False)."""
    if not enable:
        yield
        return
    started = time.perf_counter()
    yield
    record_timing(name, time.perf_counter() - started, timing_raw, level)


def timer_wrap(
    name: str | None = None, level: str = "info", log_to_metric: bool = False, enable: bool = True
) -> Callable[[F], F]:
    """Decorate a method so that each call is timed into ``self.timing_raw`` (``async def`` too)."""

    def decorator(func: F) -> F:
        label = name or func.__name__

        def book(owner: Any, seconds: float) -> None:
            timing_raw = getattr(owner, "timing_raw", None)
            if not isinstance(timing_raw, MutableMapping):
                timing_raw = {}
                owner.timing_raw = timing_raw
            count = _add(timing_raw, label, seconds)
            if not log_to_metric:
                logger.log(_level(level), "time_profile/%s: %.4fs", label, seconds)
            elif callable(getattr(owner, "log_metric", None)) and not isinstance(owner, type):
                owner.log_metric(f"time_profile/{label}", seconds)
            else:
                log_metric(
                    {f"time_profile/{label}": seconds}, level=_level(level), step=count, prefix="Performance"
                )

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not enable:
                    return await func(self, *args, **kwargs)
                started = time.perf_counter()
                try:
                    return await func(self, *args, **kwargs)
                finally:
                    book(self, time.perf_counter() - started)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not enable:
                return func(self, *args, **kwargs)
            started = time.perf_counter()
            try:
                return func(self, *args, **kwargs)
            finally:
                book(self, time.perf_counter() - started)

        return wrapper  # type: ignore[return-value]

    return decorator


def log_gpu_memory_usage(head: str, level: int = logging.INFO, rank: int = 0) -> None:
    """Log the CUDA memory in use (allocated, reserved, used of total, GB); zeros without CUDA."""
    if torch.cuda.is_available():
        gib = 1024**3
        free, total = torch.cuda.mem_get_info()
        allocated, reserved = torch.cuda.memory_allocated() / gib, torch.cuda.memory_reserved() / gib
        used, total_gb = (total - free) / gib, total / gib
    else:
        allocated = reserved = used = total_gb = 0.0
    logger.log(
        level,
        "[GPU Memory] %s (rank %d): allocated %.2f GB, reserved %.2f GB, device used/total %.2f/%.2f GB",
        head,
        rank,
        allocated,
        reserved,
        used,
        total_gb,
    )


def _add(timing_raw: TimingRaw, name: str, seconds: float) -> int:
    entry = timing_raw.setdefault(name, {"count": 0, "total": 0.0, "avg": 0.0})
    entry["count"] += 1
    entry["total"] += seconds
    entry["avg"] = entry["total"] / entry["count"]
    return int(entry["count"])
