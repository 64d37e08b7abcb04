"""Pushes handled on the coordinator server's event loop, their journal syncs grouped off it.

I/O (asyncio). A push is checked, decoded and written to the journal on the loop
(:meth:`Coordinator.stage_push`), then made durable by a sync (:class:`GroupSync`: one sync covers
every entry appended before it started), and the push is acknowledged
(:meth:`Coordinator.complete_push`) once its entry is durable. A sync that took less than
``inline_below`` runs on the loop, after the pushes ready then are appended; a slower one (a
network volume) runs on a thread while the loop takes the next pushes. So a loop thread does what
a pool of handler threads did, without their switches and their contention for the GIL, and pushes
that arrive together share a sync (measured: docs/performance.md).

Every guarantee of :meth:`Coordinator.push` holds: nothing is acknowledged before it is durable; a
retry of a push still being journalled is answered as that push is, once it is; a failed sync
ends the run's acknowledgements (``Coordinator.journal_error``). A push whose caller goes away
while its sync runs is still completed (shielded), so its task is not left half acknowledged: the
retry is answered as a duplicate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from concurrent.futures import Executor
from functools import partial

from rlkube.coordinator.journal import PendingEntry
from rlkube.coordinator.journal_log import Segment
from rlkube.coordinator.state import COMMITTING, Coordinator, PushOutcome, StagedPush

#: A sync faster than this runs on the loop: handing it to a thread and back costs the loop about as
#: much (on a local disk a sync takes ~0.1 ms, and inline cost rank 0 ~15% less CPU per fragment).
INLINE_SYNC_SECONDS = 0.0005

#: Waited between looks at a push journalled outside this loop (a thread calling ``push``).
_RECHECK_SECONDS = 0.002


class GroupSync:
    """Awaitable durability of journal entries: one sync at a time per segment, covering every entry
    appended before it began; on the loop while syncs take less than ``inline_below`` seconds, else
    on ``executor``. Use from one event loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        executor: Executor,
        *,
        inline_below: float = INLINE_SYNC_SECONDS,
    ) -> None:
        self._loop = loop
        self._executor = executor
        self.inline_below = inline_below
        self._waiting: dict[Segment, list[tuple[int, asyncio.Future[None]]]] = {}
        self._syncing: set[Segment] = set()
        self.syncs = 0  # how many syncs ran (entries / syncs: how well they were grouped)
        self.syncs_on_loop = 0
        self.last_sync_seconds = 0.0

    def durable(self, entry: PendingEntry) -> Awaitable[None]:
        """Done once ``entry`` is durable; the sync's OSError if it failed."""
        done: asyncio.Future[None] = self._loop.create_future()
        if entry.durable:
            done.set_result(None)
            return done
        self._waiting.setdefault(entry.segment, []).append((entry.end, done))
        if entry.segment not in self._syncing:
            self._start(entry.segment)
        return done

    def _start(self, segment: Segment) -> None:
        self._syncing.add(segment)
        self.syncs += 1
        if self.last_sync_seconds < self.inline_below:
            self._loop.call_soon(self._sync_on_loop, segment)  # after the pushes ready now
        else:
            running = self._loop.run_in_executor(self._executor, self._sync, segment)
            running.add_done_callback(partial(self._finished, segment))

    def _sync(self, segment: Segment) -> None:
        started = time.monotonic()
        try:
            segment.sync_through(segment.size)
        finally:
            self.last_sync_seconds = time.monotonic() - started

    def _sync_on_loop(self, segment: Segment) -> None:
        self.syncs_on_loop += 1
        done: asyncio.Future[None] = self._loop.create_future()
        try:
            self._sync(segment)
        except OSError as exc:
            done.set_exception(exc)
        else:
            done.set_result(None)
        self._finished(segment, done)

    def _finished(self, segment: Segment, running: asyncio.Future[None]) -> None:
        self._syncing.discard(segment)
        error = running.exception()
        left = []
        for end, done in self._waiting.pop(segment, []):
            if done.done():
                continue
            if error is not None:
                done.set_exception(error)
            elif segment.synced >= end:
                done.set_result(None)
            else:
                left.append((end, done))
        if left:  # appended after the sync began: the next one covers them
            self._waiting[segment] = left
            self._start(segment)


class AsyncIntake:
    """:meth:`Coordinator.push` for an event loop: it awaits the journal's sync instead of blocking."""

    def __init__(self, coordinator: Coordinator, group_sync: GroupSync) -> None:
        self.coordinator = coordinator
        self.group_sync = group_sync
        self._committing: dict[str, asyncio.Future[PushOutcome]] = {}  # task id -> done when acknowledged

    async def push(self, **arguments: object) -> PushOutcome:
        """``Coordinator.push(**arguments)``, awaited."""
        task_id = str(arguments["task_id"])
        while True:
            staged = self.coordinator.stage_push(**arguments, wait=False)  # type: ignore[arg-type]
            if staged is not COMMITTING:
                break
            earlier = self._committing.get(task_id)
            if earlier is None:  # journalled by a thread outside this loop
                await asyncio.sleep(_RECHECK_SECONDS)
            else:
                await asyncio.wait((earlier,))
        if not isinstance(staged, StagedPush):
            return staged
        if staged.entry is None:
            return self.coordinator.complete_push(staged)
        completion = asyncio.ensure_future(self._complete(staged, staged.entry))
        self._committing[task_id] = completion
        completion.add_done_callback(lambda _: self._committing.pop(task_id, None))
        return await asyncio.shield(completion)  # a caller that leaves does not leave it half done

    async def _complete(self, staged: StagedPush, entry: PendingEntry) -> PushOutcome:
        try:
            await self.group_sync.durable(entry)
        except OSError as exc:
            self.coordinator.abandon_push(staged, exc)
            raise
        return self.coordinator.complete_push(staged)
