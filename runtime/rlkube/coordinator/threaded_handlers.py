"""Blocking gRPC handlers served by an asyncio server, seeing the call as a blocking server shows it.

I/O (asyncio, threads). ``grpc.aio`` runs a blocking handler on its thread pool, but the context
it hands it lacks ``is_active`` and does not run ``add_callback`` callbacks when the client goes
away, and it drops a streaming handler's generator unclosed. The WeightStore's handlers lean on
all three (a fetch waits for chunks while its client is there; a watch ends when its client
leaves), so rank 0's server wraps its extra handlers with :class:`OnLoop`: each call's behaviour
runs on ``executor`` with a :class:`ThreadContext`, each streamed message is taken on a thread,
and when the call ends (done, failed or cancelled) the context turns inactive, its callbacks run
and the generator is closed (its ``finally`` blocks run) on a thread once it is not running.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, NoReturn

import grpc
import grpc.aio

_END = object()


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class ThreadContext:
    """The blocking ``grpc.ServicerContext`` calls a handler running on a thread may make."""

    def __init__(self, call: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._call = call
        self._ended = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends; False if it has ended (not run then, as gRPC does)."""
        with self._lock:
            if self._ended.is_set():
                return False
            self._callbacks.append(callback)
            return True

    def peer(self) -> str:
        return self._call.peer()

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def invocation_metadata(self) -> Any:
        return self._call.invocation_metadata()

    def set_code(self, code: grpc.StatusCode) -> None:  # grpc_health's Check of an unknown service
        self._call.set_code(code)

    def set_details(self, details: str) -> None:
        self._call.set_details(details)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Aborted(code, details)

    def end(self) -> None:
        with self._lock:
            if self._ended.is_set():
                return
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class _Stepper:
    """A handler's response iterator, advanced and closed on threads, one step at a time."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator = iterator
        self._lock = threading.Lock()

    def next(self) -> Any:
        with self._lock:
            return next(self.iterator, _END)

    def close(self) -> None:
        with self._lock:  # after any step still running on another thread
            close = getattr(self.iterator, "close", None)
            if close is not None:
                close()


class OnLoop(grpc.GenericRpcHandler):
    """``handler``'s unary-request methods as ``async`` methods that run them on ``executor``."""

    def __init__(self, handler: grpc.GenericRpcHandler, executor: Executor) -> None:
        self.handler = handler
        self.executor = executor

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        found = self.handler.service(handler_call_details)
        if found is None or found.request_streaming:
            return found  # request streams are not wrapped (none of ours takes one)
        if found.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._streamed(found.unary_stream),
                request_deserializer=found.request_deserializer,
                response_serializer=found.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            self._answered(found.unary_unary),
            request_deserializer=found.request_deserializer,
            response_serializer=found.response_serializer,
        )

    def _answered(self, behaviour: Callable[[Any, Any], Any]) -> Callable[..., Any]:
        async def answered(request: Any, call: grpc.aio.ServicerContext[Any, Any]) -> Any:
            context = ThreadContext(call)
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self.executor, behaviour, request, context
                )
            except _Aborted as aborted:
                await call.abort(aborted.code, aborted.details)
                raise AssertionError("unreachable: ServicerContext.abort raises") from None
            finally:
                context.end()

        return answered

    def _streamed(self, behaviour: Callable[[Any, Any], Iterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def streamed(request: Any, call: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            loop = asyncio.get_running_loop()
            context = ThreadContext(call)
            stepper: _Stepper | None = None
            try:
                iterator = await loop.run_in_executor(self.executor, behaviour, request, context)
                stepper = _Stepper(iter(iterator))
                while (message := await loop.run_in_executor(self.executor, stepper.next)) is not _END:
                    yield message
            except _Aborted as aborted:
                await call.abort(aborted.code, aborted.details)
            finally:
                context.end()  # a step waiting on the client sees it gone (and its callbacks run)
                if stepper is not None:
                    self.executor.submit(stepper.close)

        return streamed
