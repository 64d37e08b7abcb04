"""An eval worker's side of the trajectory plane: its next tasks, and its pushes on a sender thread.

I/O (gRPC calls through ``PolicyGroupClient``). Two round trips per fragment (LeaseTask, then
PushFragment, each waited for before the next rollout) made a worker's env idle for both, and made
rank 0 answer twice per fragment. Here:

* every push asks for the worker's next task (``Fragment.lease_next``), which comes back with the
  acknowledgement (``PushAck.next``): one round trip per fragment in steady state;
* pushes go out on sender threads while the worker rolls out its next fragment: at most
  ``credits`` pushes are in flight (:data:`PUSH_CREDITS`), so :meth:`TaskStream.push` waits only
  when that many are unanswered. They travel on the worker's one PushFragments stream
  (``coordinator.push_stream``), not a call each. Rank 0 journals concurrent pushes in parallel
  (their syncs share the file system's commits), so a second credit keeps a worker going while
  one push waits on the disk. Its next task is leased at once if no answer has brought one yet,
  so a worker holds at most ``credits`` tasks beyond the one it rolls out (released to the others
  like any lease if it leaves).

Guarantees are the coordinator's and unchanged: a push is acknowledged only once durable, retried
pushes are recognised as duplicates, and a task's ``min_version`` is honoured when it starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.client import CoordinatorError, PolicyGroupClient, PushRequest
from rlkube.coordinator.wire import EncodedFragment

logger = logging.getLogger(__name__)

#: How long a pushed fragment is retried while the coordinator is unreachable.
PUSH_RETRY_SECONDS = 120.0
#: After stop is set a push is retried this long at most: a coordinator that does not answer while
#: we drain is gone (stopped with us), and the task goes back to the queue when its lease expires.
DRAIN_PUSH_SECONDS = 5.0
#: Pushes one worker may have in flight: 2 covers a journal sync (~7 ms on the development disks)
#: behind a rollout of one fragment; more only hold more tasks per worker.
PUSH_CREDITS = 2

#: Called with each push's message and its answer (None: it could not be delivered).
OnAnswer = Callable[[PushRequest, pb.PushAck | None], None]


class TaskStream:
    """One worker's tasks and pushes (see the module docstring); one per registration, or rebound."""

    def __init__(
        self,
        client: PolicyGroupClient,
        *,
        stop: threading.Event,
        on_answer: OnAnswer | None = None,
        retry_for: float = PUSH_RETRY_SECONDS,
        credits: int = PUSH_CREDITS,
    ) -> None:
        self.client = client
        self.stop = stop
        self.on_answer = on_answer
        self.retry_for = retry_for
        self.worker_id = ""
        self._tasks: deque[pb.Task] = deque()  # brought by push answers, not started yet
        self._lock = threading.Condition()
        self.credits = max(1, credits)
        self._queued: deque[PushRequest] = deque()  # handed over, no sender has taken it yet
        self._in_flight = 0  # handed over and not answered yet
        self._closed = False
        self._senders = [
            threading.Thread(target=self._send_loop, name=f"fragment-sender-{i}", daemon=True)
            for i in range(self.credits)
        ]
        for sender in self._senders:
            sender.start()

    def bind(self, worker_id: str) -> None:
        """A new registration: tasks brought for the old one are dropped (the coordinator released them)."""
        with self._lock:
            self.worker_id = worker_id
            self._tasks.clear()

    def next_task(self, *, wait_seconds: float) -> pb.Task:
        """The next task: one a push's answer brought, else a LeaseTask (long poll). CoordinatorError."""
        with self._lock:
            if self._tasks:
                return self._tasks.popleft()
            worker_id = self.worker_id
        return self.client.lease(worker_id, wait_seconds=wait_seconds)

    def push(self, message: PushRequest) -> None:
        """Send ``message`` (asking for the next task) once fewer than ``credits`` pushes are in flight.

        An :class:`EncodedFragment` must have been encoded with ``lease_next=True`` (it is sealed).
        """
        if isinstance(message, EncodedFragment):
            if not message.lease_next:
                raise ValueError(f"{message.task_id}: encode the push with lease_next=True")
        else:
            message.lease_next = True
        with self._lock:
            while self._in_flight >= self.credits and not self._closed:
                self._lock.wait()
            self._in_flight += 1
            self._queued.append(message)
            self._lock.notify_all()

    def flush(self) -> None:
        """Wait until every push in flight is answered (or given up)."""
        with self._lock:
            while self._in_flight and not self._closed:
                self._lock.wait()

    def close(self) -> None:
        """Flush, then end the sender threads."""
        self.flush()
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        for sender in self._senders:
            sender.join(timeout=5.0)

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queued and not self._closed:
                    self._lock.wait()
                if not self._queued:
                    return
                message = self._queued.popleft()
            ack = self._send(message)
            with self._lock:
                brought = ack is not None and ack.HasField("next") and ack.next.kind != pb.Task.NONE
                if ack is not None and brought and message.worker_id == self.worker_id:
                    self._tasks.append(ack.next)  # (not for a registration since replaced)
                self._in_flight -= 1
                self._lock.notify_all()
            if self.on_answer is not None:
                self.on_answer(message, ack)

    def _send(self, message: PushRequest) -> pb.PushAck | None:
        started = time.monotonic()

        def draining_too_long() -> bool:
            return self.stop.is_set() and time.monotonic() - started > DRAIN_PUSH_SECONDS

        try:
            return self.client.push(message, retry_for=self.retry_for, should_stop=draining_too_long)
        except CoordinatorError as exc:
            logger.warning("could not push %s: %s", message.task_id, exc)
            return None
