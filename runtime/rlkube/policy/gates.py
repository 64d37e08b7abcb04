"""The rollout gates: a weight commit never overlaps a rollout step.

Pure synchronisation, no I/O. :class:`IdleGate` serves ``rolloutMode: sync``: a rollout step and a
commit each hold one lock, so they exclude each other (RLightning used an Event that two threads
could both pass between ``wait()`` and ``clear()``). :class:`AdmissionGate` serves
``rolloutMode: async``: the updater closes admission, waits until the requests already admitted
have finished, commits, and reopens; the admission check and the in-flight count change under one
lock, so no request can slip in between the updater's close and its drain.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class IdleGate:
    """Mutual exclusion between sync rollout steps and weight commits (not re-entrant)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    def acquire(self) -> None:
        self._lock.acquire()
        self._idle.clear()

    def release(self) -> None:
        self._idle.set()
        self._lock.release()

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing holds the gate (True) or ``timeout`` passes (False)."""
        return self._idle.wait(timeout)

    def is_idle(self) -> bool:
        return self._idle.is_set()


class AdmissionGate:
    """Admission control for async rollout requests; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = True
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup = asyncio.Event()  # binds to the running loop on first wait
        self._wakeup.set()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    @property
    def is_open(self) -> bool:
        with self._cond:
            return self._open

    async def enter(self) -> None:
        """Wait until admission is open, then count this request as in flight."""
        self._loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._open:
                    self._in_flight += 1
                    return
                self._wakeup.clear()
            await self._wakeup.wait()

    def leave(self) -> None:
        with self._cond:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._cond.notify_all()

    def close_and_drain(self, timeout: float | None = None) -> bool:
        """Stop admitting and wait for the admitted requests to finish (False if ``timeout`` passed)."""
        with self._cond:
            self._open = False
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    def reopen(self) -> None:
        with self._cond:
            self._open = True
        loop = self._loop
        if loop is not None:
            try:
                # Wake waiters on their own loop; if it is not running, this runs when it next does.
                loop.call_soon_threadsafe(self._wakeup.set)
                return
            except RuntimeError:  # the loop is closed: nobody can be waiting on it
                pass
        self._wakeup.set()
