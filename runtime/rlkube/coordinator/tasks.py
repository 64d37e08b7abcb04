"""The work board: which fragments an epoch needs, who is collecting which, which are in.

Pure state machine (no I/O, no clock of its own). Work is handed out as *tasks*: one task is
one fragment (every env of a worker, ``fragment_length`` steps) or one evaluation. A task is
leased to one worker at a time; when the worker leaves (deregisters, expires, is replaced by a
restarted pod) its leases go back to the front of the queue, so a vanished worker's share is
collected by the others. The first push of a task is acknowledged and counted; any later push
of the same task is a duplicate and counted nowhere, so an acknowledged fragment is never lost
or counted twice, whatever the retries and reassignments.

Sync mode: ``open_epoch`` queues exactly the fragments of one epoch, all to be produced with
the epoch's weight version. Async mode: ``open_stream`` lets tasks be minted on demand while
fewer than ``capacity`` fragments are leased or waiting to be trained on (back-pressure).
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class TaskKind(Enum):
    COLLECT = "collect"
    EVALUATE = "evaluate"


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    kind: TaskKind
    epoch: int
    min_version: int
    steps: int = 0
    episodes: int = 0


def _unguessable(prefix: str) -> str:
    """A task id: a readable prefix and a random part, so that nobody can push a task not leased to them."""
    return f"{prefix}.{secrets.token_urlsafe(9)}"


class AckResult(Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # already acknowledged; nothing added
    UNKNOWN = "unknown"  # not a task of the open epoch/stream (e.g. from before a restart)


@dataclass
class TaskBoard:
    """Leases and acknowledgements of collection and evaluation tasks."""

    fragment_length: int
    _queue: deque[TaskSpec] = field(default_factory=deque)
    _leases: dict[str, tuple[TaskSpec, str]] = field(default_factory=dict)  # task_id -> (task, worker)
    _acked: set[str] = field(default_factory=set)
    _acked_by: dict[str, str] = field(default_factory=dict)  # task_id -> the worker whose push was acked
    _open: dict[str, TaskSpec] = field(default_factory=dict)  # every task of the open epoch/stream
    _epoch: int = -1
    _epoch_fragments: int = 0
    _epoch_acked: int = 0
    _stream: bool = False
    _stream_capacity: int = 0
    _stream_min_version: int = 0
    _stream_waiting: int = 0  # acknowledged fragments not yet consumed by the trainer
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    # -------------------------------------------------------------- opening work
    def open_epoch(self, *, epoch: int, version: int, fragments: int) -> None:
        """Queue the fragments of a sync epoch; anything left of the previous epoch is dropped."""
        self._reset()
        self._epoch = epoch
        self._epoch_fragments = fragments
        for index in range(fragments):
            task = TaskSpec(
                _unguessable(f"e{epoch}-f{index}"),
                TaskKind.COLLECT,
                epoch,
                version,
                steps=self.fragment_length,
            )
            self._queue.append(task)
            self._open[task.task_id] = task

    def open_stream(self, *, capacity: int, min_version: int, waiting: int = 0) -> None:
        """Async mode: mint collection tasks on demand, at most ``capacity`` in flight or waiting.

        ``waiting``: fragments already there for the trainer (taken back after a restart).
        """
        self._reset()
        self._stream = True
        self._stream_capacity = capacity
        self._stream_min_version = min_version
        self._stream_waiting = waiting

    @property
    def streaming(self) -> bool:
        """Async mode: tasks belong to no epoch (a step takes their fragments later)."""
        return self._stream

    def set_stream_min_version(self, version: int) -> None:
        """Async mode: workers must have loaded at least this version to start a new task."""
        self._stream_min_version = max(0, version)

    def add_evaluation(self, *, epoch: int, version: int, episodes: int) -> str:
        """Queue one evaluation task ahead of collection work."""
        task = TaskSpec(
            _unguessable(f"eval-{epoch}-{next(self._ids)}"),
            TaskKind.EVALUATE,
            epoch,
            version,
            episodes=episodes,
        )
        self._queue.appendleft(task)
        self._open[task.task_id] = task
        return task.task_id

    def close(self) -> None:
        """No more work (the job finished); leases in flight are simply forgotten."""
        self._reset()

    def _reset(self) -> None:
        self._queue.clear()
        self._leases.clear()
        self._open.clear()
        self._acked.clear()
        self._acked_by.clear()
        self._epoch_fragments = 0
        self._epoch_acked = 0
        self._stream = False
        self._stream_waiting = 0

    # -------------------------------------------------------------- workers
    def lease(self, worker_id: str) -> TaskSpec | None:
        """The next task for ``worker_id``, or None when there is nothing to do right now."""
        if not self._queue and self._stream and self._stream_in_flight() < self._stream_capacity:
            epoch = next(self._ids)
            task = TaskSpec(
                _unguessable(f"s{epoch}"),
                TaskKind.COLLECT,
                epoch,
                self._stream_min_version,
                steps=self.fragment_length,
            )
            self._open[task.task_id] = task
            self._queue.append(task)
        if not self._queue:
            return None
        task = self._queue.popleft()
        self._leases[task.task_id] = (task, worker_id)
        return task

    def ack(self, task_id: str, worker_id: str = "") -> tuple[AckResult, TaskSpec | None]:
        """Acknowledge a pushed task. The first push wins; the task leaves the queue and the leases."""
        if task_id in self._acked:
            return AckResult.DUPLICATE, self._open.get(task_id)
        task = self._open.get(task_id)
        if task is None:
            return AckResult.UNKNOWN, None
        self._acked.add(task_id)
        self._acked_by[task_id] = worker_id
        self._leases.pop(task_id, None)
        try:
            self._queue.remove(task)  # it had been requeued after its worker was presumed gone
        except ValueError:
            pass
        if task.kind is TaskKind.COLLECT:
            if self._stream:
                self._stream_waiting += 1
            else:
                self._epoch_acked += 1
        return AckResult.ACCEPTED, task

    def withdraw(self, task_id: str) -> None:
        """Undo the acknowledgement of ``task_id`` (its fragment could not be made durable): the task
        goes back to the front of the queue, as if never pushed."""
        if task_id not in self._acked:
            return
        self._acked.discard(task_id)
        self._acked_by.pop(task_id, None)
        task = self._open.get(task_id)
        if task is None:
            return
        if task.kind is TaskKind.COLLECT:
            if self._stream:
                self._stream_waiting = max(0, self._stream_waiting - 1)
                del self._open[task_id]  # a stream task is simply minted again
                return
            self._epoch_acked = max(0, self._epoch_acked - 1)
        self._queue.appendleft(task)

    def release_worker(self, worker_id: str) -> list[str]:
        """Requeue (at the front) every task leased to ``worker_id``; returns their ids."""
        released = [task for task, holder in self._leases.values() if holder == worker_id]
        for task in reversed(released):
            del self._leases[task.task_id]
            if task.kind is TaskKind.COLLECT and self._stream:
                del self._open[task.task_id]  # a stream task is simply minted again
            else:
                self._queue.appendleft(task)
        return [task.task_id for task in released]

    def holder(self, task_id: str) -> str | None:
        """The worker the task is leased to now (None: not leased, e.g. requeued or acknowledged)."""
        lease = self._leases.get(task_id)
        return None if lease is None else lease[1]

    def acked_by(self, task_id: str) -> str | None:
        """The worker whose push of the task was acknowledged (None: not acknowledged)."""
        return self._acked_by.get(task_id) if task_id in self._acked else None

    def is_open(self, task_id: str) -> bool:
        return task_id in self._open

    def task(self, task_id: str) -> TaskSpec:
        """The open task ``task_id`` (KeyError when it is not open)."""
        return self._open[task_id]

    def requeue(self, task_id: str) -> None:
        """Take a task back from its holder (it pushed something unusable): someone collects it again."""
        lease = self._leases.pop(task_id, None)
        if lease is not None:
            self._queue.appendleft(lease[0])

    def consumed(self, count: int) -> None:
        """Async mode: the trainer took ``count`` acknowledged fragments (frees capacity)."""
        self._stream_waiting = max(0, self._stream_waiting - count)

    # -------------------------------------------------------------- progress
    @property
    def epoch(self) -> int:
        return self._epoch

    def epoch_complete(self) -> bool:
        return not self._stream and self._epoch_fragments > 0 and self._epoch_acked >= self._epoch_fragments

    def acked_fragments(self) -> int:
        return self._epoch_acked

    def leased(self) -> dict[str, str]:
        """task_id -> worker_id of the tasks out for collection."""
        return {task_id: worker for task_id, (_, worker) in self._leases.items()}

    def pending(self) -> int:
        return len(self._queue)

    def _stream_in_flight(self) -> int:
        return len(self._leases) + self._stream_waiting
