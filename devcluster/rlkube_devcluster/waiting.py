"""Polling for a condition with a deadline: what the dev cluster and its tests wait with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitingCannotHelp(RuntimeError):
    """What a check raises when the thing waited for can no longer happen (its process is gone)."""


class OperatorExited(WaitingCannotHelp):
    """The operator process is gone; waiting longer cannot help."""


def wait_for(check: Callable[[], T], *, timeout: float = 60.0, interval: float = 0.1, what: str = "") -> T:
    """Return the first truthy ``check()``; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except WaitingCannotHelp:
            raise
        except Exception as exc:  # a check may race with the object's creation
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}; last: {last!r}")
        time.sleep(interval)
