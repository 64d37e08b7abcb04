"""A worker's pushes on one PushFragments stream: no call set up per fragment.

I/O (a gRPC bidirectional stream and its reader thread). Each push is sent on the open stream and
waited for by its task id; the answers come back as rank 0 makes pushes durable. Rank 0 answers
a push it refuses (a malformed fragment, a lease that is not the pusher's) with the status
PushFragment would end its call with, so :meth:`PushStream.push` raises the same
:class:`grpc.RpcError` a unary push raises and ``PolicyGroupClient.call`` treats both alike.

The stream is opened on first use and again after it breaks (rank 0 restarted: the pushes in
flight fail UNAVAILABLE and are retried on the new stream, where the coordinator recognises any
already acknowledged as duplicates), after a push got no answer in its time (the connection may
have died without a word: the stream is closed and the pushes on it retried), or once this
process's token changes (a rotated Secret: the
stream was authenticated with the old one). A coordinator without the method (an older rank 0)
answers UNIMPLEMENTED: :attr:`PushStream.supported` turns False and the caller pushes unary.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import grpc

from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.wire import EncodedFragment

logger = logging.getLogger(__name__)

#: What a push sends: a message, or one an eval worker serialized with one copy of its tensors.
PushRequest = pb.Fragment | EncodedFragment

#: Opens the stream: the stream-stream multicallable, called with the request iterator.
OpenStream = Callable[[Iterator[PushRequest]], Any]

_END = object()  # ends the request iterator


class RpcStatusError(grpc.RpcError):
    """A status that was not raised by gRPC itself (a push refused on a stream, an answer not
    received in time): ``code()`` and ``details()`` as gRPC's own errors give them."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class StreamUnsupported(Exception):
    """The coordinator does not serve PushFragments (UNIMPLEMENTED): push unary."""


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status of a ``PushAck.code`` (UNKNOWN for a number gRPC does not define)."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)


def refused(ack: pb.PushAck) -> RpcStatusError | None:
    """The refusal an answer carries (``code`` set), or None for an answer."""
    if not ack.code:
        return None
    return RpcStatusError(status_code(ack.code), ack.detail)


class _OpenStream:
    """One PushFragments call: its outgoing queue, its answers' waiters, and its reader thread."""

    def __init__(self, open_stream: OpenStream, token: str) -> None:
        self.token = token
        self.error: grpc.RpcError | None = None  # set once the call ended
        self.retired = False  # sends nothing more; the pushes in flight are still answered
        self._closed = False  # cancelled by us: the pushes in flight are to be pushed again
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[Future[pb.PushAck]]] = {}
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._call = open_stream(iter(self._outbox.get, _END))
        self._reader = threading.Thread(target=self._read, name="push-stream-reader", daemon=True)
        self._reader.start()

    def send(self, request: PushRequest) -> Future[pb.PushAck]:
        answer: Future[pb.PushAck] = Future()
        with self._lock:
            if self.error is not None or self.retired:
                answer.set_exception(
                    self.error or RpcStatusError(grpc.StatusCode.UNAVAILABLE, "the push stream was replaced")
                )
                return answer
            self._waiting.setdefault(request.task_id, deque()).append(answer)
        self._outbox.put(request)
        return answer

    def forget(self, task_id: str, answer: Future[pb.PushAck]) -> None:
        """A waiter that gave up (its push may still be answered: the answer is then dropped)."""
        with self._lock:
            waiting = self._waiting.get(task_id)
            if waiting is not None and answer in waiting:
                waiting.remove(answer)
                if not waiting:
                    del self._waiting[task_id]

    def _read(self) -> None:
        error: grpc.RpcError
        try:
            for ack in self._call:
                with self._lock:
                    waiting = self._waiting.get(ack.task_id)
                    answer = waiting.popleft() if waiting else None
                    if waiting is not None and not waiting:
                        del self._waiting[ack.task_id]
                if answer is not None:
                    answer.set_result(ack)
            error = RpcStatusError(grpc.StatusCode.UNAVAILABLE, "the coordinator ended the push stream")
        except grpc.RpcError as exc:
            error = exc
        with self._lock:
            if self._closed:  # not the coordinator's answer: what was in flight is retried elsewhere
                error = RpcStatusError(grpc.StatusCode.UNAVAILABLE, "the push stream was closed")
            self.error = error
            orphans = [answer for waiting in self._waiting.values() for answer in waiting]
            self._waiting.clear()
        for answer in orphans:
            answer.set_exception(error)

    def retire(self) -> None:
        """Send nothing more: rank 0 answers what it read, then ends the call."""
        with self._lock:
            if self.retired:
                return
            self.retired = True
        self._outbox.put(_END)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.retire()
        self._call.cancel()
        self._reader.join(timeout=5.0)


class PushStream:
    """Pushes on a PushFragments stream (see the module docstring); safe to use from several threads."""

    def __init__(self, open_stream: OpenStream, token: Callable[[], str]) -> None:
        self._open_stream = open_stream
        self._token = token
        self._lock = threading.Lock()
        self._stream: _OpenStream | None = None
        #: False once the coordinator answered UNIMPLEMENTED (it predates the stream).
        self.supported = True
        self.opened = 0  # streams opened so far (one per rank-0 incarnation and token, normally)

    def push(self, request: PushRequest, *, timeout: float) -> pb.PushAck:
        """The answer to ``request``; a refusal or a broken stream as :class:`grpc.RpcError`;
        :class:`StreamUnsupported` if the coordinator has no PushFragments."""
        if not self.supported:
            raise StreamUnsupported
        stream = self._current()
        answer = stream.send(request)
        try:
            ack = answer.result(timeout=timeout)
        except FutureTimeout:
            stream.forget(request.task_id, answer)
            self._drop(stream)  # a stream on a connection that died silently would never answer
            raise RpcStatusError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer to {request.task_id} within {timeout:.0f}s"
            ) from None
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False
                raise StreamUnsupported from None
            raise
        error = refused(ack)
        if error is not None:
            raise error
        return ack

    def _current(self) -> _OpenStream:
        token = self._token()
        with self._lock:
            stream = self._stream
            if stream is not None and stream.error is None and stream.token == token:
                return stream
            if stream is not None and stream.error is not None:
                stream.close()
            elif stream is not None:
                stream.retire()  # authenticated with a token this process no longer sends
            self._stream = _OpenStream(self._open_stream, token)
            self.opened += 1
            return self._stream

    def _drop(self, stream: _OpenStream) -> None:
        """Close ``stream`` (its pushes in flight fail UNAVAILABLE and are retried on a new one)."""
        with self._lock:
            if self._stream is stream:
                self._stream = None
        stream.close()

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
