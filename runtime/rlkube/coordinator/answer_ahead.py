"""Answering a stream's requests concurrently, a bounded number ahead of the answers sent.

I/O-free asyncio logic, used by rank 0's PushFragments stream (``service.PolicyGroupServicer``):
each request read is answered by its own task, answers are yielded in the order they finish (a push
whose sync came first is answered first), and at most ``ahead`` requests are read and not yet
answered. The next request is not read until an answer is sent, so a client that does not wait for
its answers waits in the transport's flow control instead of filling rank 0's memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

Request = TypeVar("Request")
Answer = TypeVar("Answer")


async def answered_ahead(
    requests: AsyncIterator[Request],
    answer: Callable[[Request], Awaitable[Answer]],
    *,
    ahead: int,
) -> AsyncGenerator[Answer, None]:
    """``answer(request)`` for each of ``requests``, yielded as they finish, at most ``ahead`` read
    and unanswered at once. An exception of ``requests`` ends the iteration with it once the answers
    of what was read are yielded; an answer's exception ends it at once (the answers still running
    are cancelled; what they shield goes on)."""
    if ahead < 1:
        raise ValueError(f"ahead must be at least 1, not {ahead}")
    room = asyncio.Semaphore(ahead)
    finished: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()  # answers, then the reader itself
    answering: set[asyncio.Future[Answer]] = set()

    async def read() -> None:
        while True:
            await room.acquire()  # before reading: the request past the bound stays unread
            try:
                request = await anext(requests)
            except StopAsyncIteration:
                return
            running = asyncio.ensure_future(answer(request))
            answering.add(running)
            running.add_done_callback(finished.put_nowait)

    reader = asyncio.ensure_future(read())
    reader.add_done_callback(finished.put_nowait)
    try:
        while not (reader.done() and not answering):
            done = await finished.get()
            if done is reader:
                continue
            answering.discard(done)  # type: ignore[arg-type]
            room.release()
            yield done.result()
        reader.result()
    finally:
        reader.cancel()
        for running in answering:
            running.cancel()
