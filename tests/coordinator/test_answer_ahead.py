"""Rank 0 reads a push stream at most ``ahead`` requests in front of its answers.

Pure asyncio, so every step is the loop's own: the requests are an async generator that records
how many were taken, each answer waits for the test to release it. Nothing outside the loop can
move it, so a loop left to run with nothing released shows that no request past the bound is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from rlkube.coordinator.answer_ahead import answered_ahead


class Pushes:
    """``count`` requests taken one at a time, each answered when the test releases it."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.taken = 0
        self.took: dict[int, asyncio.Event] = {n: asyncio.Event() for n in range(1, count + 1)}
        self.release: dict[int, asyncio.Event] = {n: asyncio.Event() for n in range(count)}
        self.fail_at: int | None = None

    async def requests(self) -> AsyncIterator[int]:
        for n in range(self.count):
            if self.fail_at == n:
                raise ConnectionResetError("the client went away")
            self.taken += 1
            self.took[self.taken].set()
            yield n

    async def answer(self, n: int) -> str:
        await self.release[n].wait()
        return f"ack {n}"


async def settle() -> None:
    """Let the loop run until nothing it holds can move without the test (a bounded number of turns:
    every step here is a callback on this loop, a few turns each)."""
    for _ in range(200):
        await asyncio.sleep(0)


async def collect(answers: AsyncIterator[str], into: list[str]) -> None:
    async for answer in answers:
        into.append(answer)


def test_no_request_is_read_past_the_bound_until_an_answer_is_sent() -> None:
    async def scenario() -> None:
        pushes = Pushes(12)
        sent: list[str] = []
        consumer = asyncio.ensure_future(
            collect(answered_ahead(pushes.requests(), pushes.answer, ahead=3), sent)
        )
        await pushes.took[3].wait()
        await settle()
        assert pushes.taken == 3
        assert sent == []

        pushes.release[1].set()  # answered out of order: the second push's sync came first
        await pushes.took[4].wait()
        await settle()
        assert sent == ["ack 1"]
        assert pushes.taken == 4

        for n in range(12):
            pushes.release[n].set()
        await consumer
        assert sorted(sent, key=lambda a: int(a.split()[1])) == [f"ack {n}" for n in range(12)]
        assert pushes.taken == 12

    asyncio.run(scenario())


def test_a_broken_request_stream_ends_it_after_the_answers_of_what_was_read() -> None:
    async def scenario() -> None:
        pushes = Pushes(5)
        pushes.fail_at = 2
        sent: list[str] = []
        consumer = asyncio.ensure_future(
            collect(answered_ahead(pushes.requests(), pushes.answer, ahead=8), sent)
        )
        await pushes.took[2].wait()
        await settle()
        pushes.release[0].set()
        pushes.release[1].set()
        with pytest.raises(ConnectionResetError):
            await consumer
        assert sorted(sent) == ["ack 0", "ack 1"]

    asyncio.run(scenario())


def test_a_failed_answer_ends_it_and_cancels_the_answers_still_running() -> None:
    async def scenario() -> None:
        started: list[asyncio.Future[None]] = []

        async def answer(n: int) -> str:
            if n == 1:
                raise OSError("journal sync failed")
            waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            started.append(waiting)
            await waiting
            return f"ack {n}"

        async def requests() -> AsyncIterator[int]:
            for n in range(3):
                yield n

        with pytest.raises(OSError, match="journal sync failed"):
            async for _ in answered_ahead(requests(), answer, ahead=8):
                pass
        assert started
        assert all(waiting.cancelled() for waiting in started)

    asyncio.run(scenario())


def test_the_bound_must_let_one_request_through() -> None:
    async def scenario() -> None:
        async def requests() -> AsyncIterator[int]:
            yield 0

        async def answer(n: int) -> int:
            return n

        with pytest.raises(ValueError, match="at least 1"):
            async for _ in answered_ahead(requests(), answer, ahead=0):
                pass

    asyncio.run(scenario())
