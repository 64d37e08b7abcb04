"""Pushes handled on rank 0's event loop: pushes that arrive during a journal sync share the next one,
and every guarantee of the blocking push holds (nothing acknowledged before it is durable, a retry
answered as its first push is, a failed sync acknowledges nothing and ends the run)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from rlkube.coordinator.intake import AsyncIntake, GroupSync
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.state import Coordinator, PushOutcome
from rlkube.coordinator.tasks import TaskSpec

from tests.coordinator.test_intake import member
from tests.engine.jobs import tiny_job
from tests.faults.test_acknowledged_is_durable import pushed_fragment

DEADLINE = 60.0


class HeldSyncs:
    """os.fdatasync that waits for the test's go-ahead (or fails when told to), counting calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started = threading.Semaphore(0)
        self.go = threading.Semaphore(0)
        self.calls = 0
        self.fail = False
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            self.calls += 1
            self.started.release()
            assert self.go.acquire(timeout=DEADLINE)
            if self.fail:
                raise OSError(5, "Input/output error")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", fdatasync)

    def wait_started(self) -> None:
        assert self.started.acquire(timeout=DEADLINE)


@asynccontextmanager
async def intake_on_loop(
    tmp_path: Path, *, inline_below: float = 0.0
) -> AsyncIterator[tuple[AsyncIntake, Coordinator]]:
    """An intake whose syncs run on a thread (``inline_below`` 0) unless told otherwise."""
    coordinator = Coordinator(tiny_job(stepsPerEpoch=64), world_size=1)  # four fragments an epoch
    coordinator.journal = AckJournal(tmp_path, incarnation=coordinator.incarnation).open()
    coordinator.open_epoch(epoch=0, version=0)
    with ThreadPoolExecutor(1) as syncer:
        group_sync = GroupSync(asyncio.get_running_loop(), syncer, inline_below=inline_below)
        yield AsyncIntake(coordinator, group_sync), coordinator


def leased(coordinator: Coordinator, pods: int) -> Iterator[tuple[str, TaskSpec]]:
    for index in range(pods):
        worker = member(coordinator, f"eval-{index}")
        task = coordinator.lease(worker, wait_seconds=0)
        assert isinstance(task, TaskSpec)
        yield worker, task


async def until(condition: object) -> None:
    for _ in range(int(DEADLINE / 0.01)):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met")


async def in_thread(call: object) -> None:
    await asyncio.get_running_loop().run_in_executor(None, call)  # type: ignore[arg-type]


def test_pushes_that_arrive_during_a_sync_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with intake_on_loop(tmp_path) as (intake, coordinator):
            syncs = HeldSyncs(monkeypatch)
            (first_worker, first), *others = list(leased(coordinator, 4))
            pushes = [
                asyncio.ensure_future(
                    intake.push(task_id=first.task_id, worker_id=first_worker, fragment=pushed_fragment(0.0))
                )
            ]
            await in_thread(syncs.wait_started)
            pushes += [
                asyncio.ensure_future(
                    intake.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(1.0))
                )
                for worker, task in others
            ]
            await until(lambda: coordinator.journal is not None and coordinator.journal._written == 4)
            assert len(coordinator.buffer) == 0  # written, none durable: none acknowledged
            syncs.go.release()  # the first push's sync
            await in_thread(syncs.wait_started)  # one more, for the three that came meanwhile
            assert len(coordinator.buffer) == 1
            syncs.go.release()
            outcomes = await asyncio.wait_for(asyncio.gather(*pushes), DEADLINE)
            assert outcomes == [PushOutcome(accepted=True)] * 4
            assert syncs.calls == 2
            assert intake.group_sync.syncs == 2
            assert len(coordinator.buffer) == 4

    asyncio.run(scenario())


def test_a_failed_sync_acknowledges_none_of_the_pushes_it_covered_and_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with intake_on_loop(tmp_path) as (intake, coordinator):
            syncs = HeldSyncs(monkeypatch)
            (worker, task), (other, lost) = list(leased(coordinator, 2))
            pushes = [
                asyncio.ensure_future(
                    intake.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(0.0))
                )
            ]
            await in_thread(syncs.wait_started)
            pushes.append(
                asyncio.ensure_future(
                    intake.push(task_id=lost.task_id, worker_id=other, fragment=pushed_fragment(1.0))
                )
            )
            await until(lambda: coordinator.journal is not None and coordinator.journal._written == 2)
            syncs.fail = True
            syncs.go.release()
            answers = await asyncio.wait_for(asyncio.gather(*pushes, return_exceptions=True), DEADLINE)
            assert all(isinstance(answer, OSError) for answer in answers), answers
            assert syncs.calls == 1  # the second push waited on the failed sync, and fails with it
            assert coordinator.journal_error is not None
            assert len(coordinator.buffer) == 0
            assert coordinator.board.acked_by(task.task_id) is None
            assert coordinator.board.acked_by(lost.task_id) is None
            assert coordinator.journal is not None
            assert coordinator.journal.acknowledged == 0

    asyncio.run(scenario())


def test_a_retry_during_the_sync_is_a_duplicate_even_if_the_first_caller_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with intake_on_loop(tmp_path) as (intake, coordinator):
            syncs = HeldSyncs(monkeypatch)
            ((worker, task),) = list(leased(coordinator, 1))
            first = asyncio.ensure_future(
                intake.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(0.0))
            )
            await in_thread(syncs.wait_started)
            first.cancel()  # its client went away (a deadline): the push is completed all the same
            retry = asyncio.ensure_future(
                intake.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(0.0))
            )
            await asyncio.sleep(0.05)
            assert not retry.done()  # not "duplicate, accepted" before the first is durable
            syncs.go.release()
            assert await asyncio.wait_for(retry, DEADLINE) == PushOutcome(accepted=True, duplicate=True)
            assert syncs.calls == 1
            assert len(coordinator.buffer) == 1
            assert coordinator.journal is not None
            assert coordinator.journal.acknowledged == 1

    asyncio.run(scenario())


def test_fast_syncs_run_on_the_loop_after_the_pushes_ready_then_and_slow_ones_on_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = {"seconds": 0.0}

    def fdatasync(fd: int) -> None:  # instant, or at least ``seconds`` whatever the machine
        if slow["seconds"]:
            time.sleep(slow["seconds"])

    monkeypatch.setattr(os, "fdatasync", fdatasync)

    async def scenario() -> None:
        async with intake_on_loop(tmp_path, inline_below=0.5) as (intake, coordinator):
            pairs = list(leased(coordinator, 4))

            def pushed(index: int) -> Awaitable[PushOutcome]:
                worker, task = pairs[index]
                return intake.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(1.0))

            assert await asyncio.gather(pushed(0), pushed(1)) == [PushOutcome(accepted=True)] * 2
            assert (intake.group_sync.syncs, intake.group_sync.syncs_on_loop) == (1, 1)  # both in one
            slow["seconds"] = 0.6
            assert await pushed(2) == PushOutcome(accepted=True)  # on the loop: it was fast before
            assert await pushed(3) == PushOutcome(accepted=True)  # on the thread: the last was slow
            assert (intake.group_sync.syncs, intake.group_sync.syncs_on_loop) == (3, 2)
            assert len(coordinator.buffer) == 4

    asyncio.run(scenario())


def test_a_failed_sync_on_the_loop_acknowledges_none_of_its_pushes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    async def scenario() -> None:
        async with intake_on_loop(tmp_path, inline_below=1.0) as (intake, coordinator):
            monkeypatch.setattr(os, "fdatasync", fdatasync)
            pushes = [
                intake.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(1.0))
                for worker, task in leased(coordinator, 2)
            ]
            answers = await asyncio.gather(*pushes, return_exceptions=True)
            assert all(isinstance(answer, OSError) for answer in answers), answers
            assert intake.group_sync.syncs_on_loop == 1
            assert coordinator.journal_error is not None
            assert len(coordinator.buffer) == 0

    asyncio.run(scenario())
