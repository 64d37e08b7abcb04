"""Rank 0's intake: the journal is written outside the coordinator's lock, and a push can bring the
pusher's next task (one round trip per fragment), with every guarantee of the push kept."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from rlkube.coordinator import journal_log
from rlkube.coordinator.journal import AckJournal, PendingEntry
from rlkube.coordinator.state import STOP, Coordinator, PushOutcome
from rlkube.coordinator.tasks import TaskSpec
from rlkube.data.fragment import Fragment

from tests.engine.jobs import tiny_job
from tests.faults.test_acknowledged_is_durable import pushed_fragment

DEADLINE = 60.0


class HeldJournal(AckJournal):
    """A journal whose writes wait until the test lets them go (or fail, when told to)."""

    def __init__(self, directory: Path, *, incarnation: str) -> None:
        super().__init__(directory, incarnation=incarnation)
        self.writing = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def append(self, **kwargs: Any) -> PendingEntry:
        self.writing.set()
        assert self.release.wait(DEADLINE)
        if self.fail:
            raise OSError(28, "No space left on device")
        return super().append(**kwargs)


def held(tmp_path: Path) -> tuple[Coordinator, HeldJournal]:
    coordinator = Coordinator(tiny_job(), world_size=1)
    journal = HeldJournal(tmp_path, incarnation=coordinator.incarnation).open()
    coordinator.journal = journal
    return coordinator, journal


def member(coordinator: Coordinator, pod: str) -> str:
    return coordinator.register(pod_name=pod, node_name="n", replica_index=0, num_envs=4).worker_id


def push_in_thread(coordinator: Coordinator, task: TaskSpec, worker: str, fragment: Fragment) -> list[Any]:
    answers: list[Any] = []

    def push() -> None:
        try:
            answers.append(coordinator.push(task_id=task.task_id, worker_id=worker, fragment=fragment))
        except Exception as exc:
            answers.append(exc)

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    answers.append(thread)
    return answers


def test_other_workers_lease_and_push_while_a_fragment_is_being_journalled(tmp_path: Path) -> None:
    coordinator, journal = held(tmp_path)
    coordinator.open_epoch(epoch=0, version=0)
    slow, other = member(coordinator, "eval-0"), member(coordinator, "eval-1")
    first = coordinator.lease(slow, wait_seconds=0)
    assert isinstance(first, TaskSpec)
    answers = push_in_thread(coordinator, first, slow, pushed_fragment(1.0))
    assert journal.writing.wait(DEADLINE)
    # The journal write in progress holds no lock: another worker leases meanwhile.
    second = coordinator.lease(other, wait_seconds=0)
    assert isinstance(second, TaskSpec)
    assert len(coordinator.buffer) == 0  # not acknowledged, not in the buffer, before it is durable
    journal.release.set()
    answers[0].join(DEADLINE)
    assert answers[1] == PushOutcome(accepted=True)
    assert len(coordinator.buffer) == 1
    assert coordinator.push(task_id=second.task_id, worker_id=other, fragment=pushed_fragment(2.0)).accepted
    assert journal.acknowledged == 2


def test_a_retry_of_a_push_being_journalled_is_answered_once_it_is_durable(tmp_path: Path) -> None:
    coordinator, journal = held(tmp_path)
    coordinator.open_epoch(epoch=0, version=0)
    worker = member(coordinator, "eval-0")
    task = coordinator.lease(worker, wait_seconds=0)
    assert isinstance(task, TaskSpec)
    first = push_in_thread(coordinator, task, worker, pushed_fragment(1.0))
    assert journal.writing.wait(DEADLINE)
    retry = push_in_thread(coordinator, task, worker, pushed_fragment(1.0))
    retry[0].join(0.2)
    assert len(retry) == 1  # still waiting: "accepted" now would be a promise the disk has not kept
    journal.release.set()
    first[0].join(DEADLINE)
    retry[0].join(DEADLINE)
    assert first[1] == PushOutcome(accepted=True)
    assert retry[1] == PushOutcome(accepted=True, duplicate=True)
    assert len(coordinator.buffer) == 1
    assert journal.acknowledged == 1


def test_a_push_whose_journal_write_fails_is_not_acknowledged_and_its_task_is_collected_again(
    tmp_path: Path,
) -> None:
    coordinator, journal = held(tmp_path)
    journal.fail = True
    journal.release.set()
    coordinator.open_epoch(epoch=0, version=0)
    worker, other = member(coordinator, "eval-0"), member(coordinator, "eval-1")
    task = coordinator.lease(worker, wait_seconds=0)
    assert isinstance(task, TaskSpec)
    with pytest.raises(OSError, match="No space left"):
        coordinator.push(task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(1.0))
    assert coordinator.journal_error is not None  # the engine ends the run with it
    assert len(coordinator.buffer) == 0
    assert coordinator.board.acked_by(task.task_id) is None  # a retry is not told "duplicate, accepted"
    again = coordinator.lease(other, wait_seconds=0)
    assert isinstance(again, TaskSpec)
    assert again.task_id == task.task_id


def test_a_push_asking_for_its_next_task_gets_it_with_the_acknowledgement(tmp_path: Path) -> None:
    coordinator = Coordinator(tiny_job(), world_size=1)
    coordinator.journal = AckJournal(tmp_path, incarnation=coordinator.incarnation).open()
    coordinator.open_epoch(epoch=0, version=0)
    worker = member(coordinator, "eval-0")
    task = coordinator.lease(worker, wait_seconds=0)
    seen = set()
    while isinstance(task, TaskSpec):
        seen.add(task.task_id)
        outcome = coordinator.push(
            task_id=task.task_id, worker_id=worker, fragment=pushed_fragment(1.0), lease_next=True
        )
        assert outcome.accepted
        assert coordinator.board.holder(task.task_id) is None
        task = outcome.next  # leased to the pusher, as LeaseTask would have
        if isinstance(task, TaskSpec):
            assert coordinator.board.holder(task.task_id) == worker
    assert task is None  # the epoch's tasks are all out: nothing now (the worker long-polls LeaseTask)
    assert len(seen) == coordinator.fragments_per_epoch
    assert coordinator.push(task_id=next(iter(seen)), worker_id=worker, fragment=None).duplicate
    coordinator.finish()
    last = coordinator.push(task_id=next(iter(seen)), worker_id=worker, fragment=None, lease_next=True)
    assert last.next == STOP


def test_concurrent_journal_writes_each_land_once_and_the_count_covers_them(tmp_path: Path) -> None:
    journal = AckJournal(tmp_path, incarnation="inc").open()
    threads = [
        threading.Thread(
            target=lambda i=i: journal.record(epoch=3, fragment=pushed_fragment(float(i)), key=f"e3-f{i}.x")
        )
        for i in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    replayed = AckJournal(tmp_path, incarnation="next").open()
    rewards = sorted(float(f.data["reward"][0, 0]) for _, f in replayed.replay(epoch=3))
    assert rewards == [float(i) for i in range(16)]
    assert replayed.acknowledged_by_incarnation() == {"inc": 16, "next": 0}


def test_acknowledging_a_fragment_costs_one_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append("fdatasync"), real_fdatasync(fd))[1])
    journal = AckJournal(tmp_path, incarnation="inc").open()
    for i in range(5):
        journal.record(epoch=0, fragment=pushed_fragment(float(i)), key=f"e0-f{i}.x")
    # the entries, and the new segment's name once; no count file on the acknowledgement path
    assert syncs == ["fsync"] + ["fdatasync"] * 5
    assert journal.acknowledged_by_incarnation() == {"inc": 5}


def test_a_dead_incarnation_is_counted_exactly_after_checkpoints_deleted_its_entries(tmp_path: Path) -> None:
    """Its entries were deleted by its own checkpoint (one still being written then) and the next's."""
    first = AckJournal(tmp_path, incarnation="first").open()
    for epoch in (0, 0, 1):
        first.record(epoch=epoch, fragment=pushed_fragment(float(epoch)))
    entered, release = threading.Event(), threading.Event()
    real_sync = journal_log.sync

    def slow_sync(fd: int) -> None:  # the fourth entry's: written, not yet durable
        if not entered.is_set():
            entered.set()
            assert release.wait(DEADLINE)
        real_sync(fd)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal_log, "sync", slow_sync)
        writer = threading.Thread(target=lambda: first.record(epoch=1, fragment=pushed_fragment(9.0)))
        writer.start()
        assert entered.wait(DEADLINE)
        assert first.checkpointed(1) == 2  # epoch 0's two entries; the fourth is being written
        release.set()
        writer.join(DEADLINE)
    assert first.acknowledged == 4
    # rank 0 dies; the next one checkpoints past epoch 1 and deletes the rest of first's entries
    second = AckJournal(tmp_path, incarnation="second").open()
    second.record(epoch=2, fragment=pushed_fragment(2.0))
    assert second.acknowledged_by_incarnation() == {"first": 4, "second": 1}
    assert second.checkpointed(2) == 2
    assert second.pending(1) == []
    assert second.acknowledged_by_incarnation() == {"first": 4, "second": 1}
    assert AckJournal(tmp_path, incarnation="third").open().acknowledged_by_incarnation() == {
        "first": 4,
        "second": 1,
        "third": 0,
    }


def test_quarantined_entries_of_a_dead_incarnation_still_count_as_acknowledged(tmp_path: Path) -> None:
    first = AckJournal(tmp_path / "ck" / "acknowledged", incarnation="first").open()
    for i in range(3):
        first.record(epoch=0, fragment=pushed_fragment(float(i)))
    second = AckJournal(tmp_path / "ck" / "acknowledged", incarnation="second").open()
    key, _ = second.replay(epoch=0)[0]
    second.quarantine(key, reason="not finite")
    second.checkpointed(1)
    assert second.acknowledged_by_incarnation() == {"first": 3, "second": 0}
