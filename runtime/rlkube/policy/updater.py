"""What an EVAL policy runs beside the user's methods: the rollout gate, the event loop of async
rollouts and the weight updater thread.

Synchronisation only (threads and an asyncio loop, no I/O of its own). :class:`BasePolicy
<rlkube.policy.base.BasePolicy>` keeps RLightning's method names (``notify_update_weights``,
``wait_for_weight_update_done``, ``update_weights``, ``check_idle``, ``get_num_requests``,
``_pre_update_weights_hook`` ...) as thin delegations to these:

* :class:`RolloutGate`: per ``rolloutMode``, the sync :class:`~rlkube.policy.gates.IdleGate` or
  the async :class:`~rlkube.policy.gates.AdmissionGate`, and the loop async rollouts run on.
* :class:`WeightUpdater`: the thread that waits for ``notify()``, runs one update cycle (the
  policy's stage-and-commit), and tells waiters when the cycle they asked for is done.
* :class:`InInferenceMode`: awaits an ``async def rollout_step`` with inference mode on only while
  it runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import torch

from rlkube.policy.gates import AdmissionGate, IdleGate


class RolloutGate:
    """The rollout gate of one EVAL policy: a weight commit never overlaps a rollout step.

    ``rolloutMode: sync``: :attr:`idle` (a step and a commit exclude each other). ``async``:
    :attr:`admission` (a commit closes admission and drains the requests in flight), and
    :attr:`loop`, the loop running when the gate was made, else one made for the rollouts.
    """

    def __init__(self, rollout_mode: str) -> None:
        self.idle: IdleGate | None = None
        self.admission: AdmissionGate | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._owns_loop = False
        if rollout_mode == "sync":
            self.idle = IdleGate()
        elif rollout_mode == "async":
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:  # the framework drives rollouts on this loop (run_until_complete)
                self.loop = asyncio.new_event_loop()
                self._owns_loop = True
            self.admission = AdmissionGate()
        else:
            raise ValueError(f"invalid rollout mode {rollout_mode!r}: expected 'sync' or 'async'")

    @property
    def in_flight(self) -> int:
        """Async rollout requests admitted and not yet finished."""
        return self.admission.in_flight if self.admission is not None else 0

    def close_for_commit(self) -> None:
        """Wait for the step in flight (sync) or stop admission and drain admitted requests (async)."""
        if self.idle is not None:
            self.idle.acquire()
        elif self.admission is not None:
            self.admission.close_and_drain()

    def reopen(self) -> None:
        if self.idle is not None:
            self.idle.release()
        elif self.admission is not None:
            self.admission.reopen()

    def close(self) -> None:
        """Close the loop made for the rollouts (never one that was running already)."""
        if self._owns_loop and self.loop is not None and not self.loop.is_running():
            self.loop.close()


class WeightUpdater:
    """The updater thread's bookkeeping: ``notify()`` asks for a cycle, ``wait_done()`` waits for it.

    ``target`` is what the thread runs (the policy's ``update_weights``, which calls :meth:`run`
    with its cycle), so a policy that overrides ``update_weights`` still runs on the thread.
    """

    def __init__(self, target: Callable[[], None], *, name: str) -> None:
        self._signal = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._lock = threading.Lock()
        self._requested = 0  # notify() calls so far
        self._stop = threading.Event()
        self.thread = threading.Thread(target=target, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def notify(self) -> None:
        with self._lock:
            # "done" is cleared before the signal is raised, and set again only by a cycle that
            # started after this call, so a waiter never sees an older cycle as this update.
            self._requested += 1
            self._done.clear()
            self._signal.set()

    def wait_done(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout=timeout)

    def run(self, cycle: Callable[[], object]) -> None:
        """The thread's loop: one ``cycle()`` per wake-up, until :meth:`stop`."""
        while not self._stop.is_set():
            if not self._signal.wait(timeout=0.5):
                continue
            with self._lock:
                self._signal.clear()
                serving = self._requested
            try:
                if not self._stop.is_set():
                    cycle()
            finally:
                with self._lock:
                    if serving == self._requested:
                        self._done.set()

    def stop(self, *, timeout: float = 5.0) -> None:
        self._stop.set()
        self._signal.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout)


class InInferenceMode:
    """Await a coroutine with inference mode on while it runs, and off while it is suspended.

    Inference mode is per thread; requests of several envs are in flight on one event loop, so a
    ``with torch.inference_mode():`` held across an ``await`` would be entered and left by
    interleaved requests in the wrong order and leave it switched on for the whole thread. Each
    step of the coroutine runs inside its own ``with`` instead.
    """

    def __init__(self, coro: Any) -> None:
        self.coro = coro

    def __await__(self) -> Any:
        coro = self.coro
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                with torch.inference_mode():
                    yielded = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = yield yielded
            except BaseException as exc:  # cancellation or a failed future: into the coroutine
                error = exc
