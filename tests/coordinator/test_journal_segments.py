"""The journal's segments: group commit, whole records only, markers that outlive their segment,
a journal of a file per entry adopted, and segments deleted once a checkpoint holds them."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import pytest
import torch
from rlkube.coordinator import journal_log
from rlkube.coordinator.journal import AckJournal, _write_synced
from rlkube.coordinator.wire import fragment_to_proto
from rlkube.data.fragment import Fragment

from tests.faults.test_acknowledged_is_durable import pushed_fragment

DEADLINE = 60.0


def rewards(fragments: list[Fragment]) -> list[float]:
    return sorted(float(f.data["reward"][0, 0]) for f in fragments)


def segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("seg-*.log"))


def test_concurrent_acknowledgements_share_one_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writers = 16
    appended, syncs = threading.Semaphore(0), []
    real_append, real_sync = journal_log.Segment.append, journal_log.sync

    def counted_append(segment: journal_log.Segment, buffers: list[memoryview]) -> int:
        end = real_append(segment, buffers)
        appended.release()
        return end

    def sync_after_all_wrote(fd: int) -> None:
        if not syncs:  # the first sync starts once every entry is written: it covers them all
            for _ in range(writers):
                assert appended.acquire(timeout=DEADLINE)
        syncs.append(fd)
        real_sync(fd)

    monkeypatch.setattr(journal_log.Segment, "append", counted_append)
    monkeypatch.setattr(journal_log, "sync", sync_after_all_wrote)
    journal = AckJournal(tmp_path, incarnation="inc").open()
    threads = [
        threading.Thread(
            target=lambda i=i: journal.record(epoch=0, fragment=pushed_fragment(float(i)), key=f"t{i}.x")
        )
        for i in range(writers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    # the first sync covers what was written when it began; all written while it ran share the second
    assert len(syncs) <= 2
    assert journal.acknowledged == writers
    back = AckJournal(tmp_path, incarnation="next").open().pending(0)
    assert rewards(back) == [float(i) for i in range(writers)]


def test_a_record_cut_short_or_damaged_is_never_taken_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = AckJournal(tmp_path, incarnation="first").open()
    for i in range(3):
        journal.record(epoch=2, fragment=pushed_fragment(float(i)))
    [segment] = tmp_path.glob("seg-*.log")
    data = bytearray(segment.read_bytes())
    data[-5] ^= 0xFF  # the third entry's body, damaged
    segment.write_bytes(bytes(data) + data[:40])  # and a record cut short after it (a crash mid-write)
    with caplog.at_level(logging.WARNING):
        back = AckJournal(tmp_path, incarnation="second").open().pending(2)
    assert rewards(back) == [0.0, 1.0]
    assert "cut short" in caplog.text or "no whole record" in caplog.text
    assert "damaged" in caplog.text


def test_a_write_that_fails_midway_leaves_no_torn_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = AckJournal(tmp_path, incarnation="first").open()
    journal.record(epoch=0, fragment=pushed_fragment(1.0))
    real_writev = os.writev

    def disk_fills(fd: int, buffers: list[memoryview]) -> int:
        real_writev(fd, [memoryview(bytes(buffers[0]))[:7]])  # 7 bytes land, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", disk_fills)
    with pytest.raises(OSError, match="No space"):
        journal.record(epoch=0, fragment=pushed_fragment(2.0))
    monkeypatch.setattr(os, "writev", real_writev)
    journal.record(epoch=0, fragment=pushed_fragment(3.0))  # space again: later entries read back
    assert journal.acknowledged == 2
    assert rewards(AckJournal(tmp_path, incarnation="second").open().pending(0)) == [1.0, 3.0]


def test_a_taken_marker_outlives_the_segment_it_was_written_in(tmp_path: Path) -> None:
    """Async: entries acknowledged in one segment, taken by steps whose markers lie in a later
    one; a checkpoint deletes that later segment, and no entry goes back to "no step"."""
    first = AckJournal(tmp_path, incarnation="first").open()
    for i in range(3):
        first.record(epoch=None, fragment=pushed_fragment(float(i)), key=f"k{i}.x")
    first.checkpointed(0)  # later records go to a new segment
    first.taken(epoch=0, keys=["k0.x"])
    first.taken(epoch=1, keys=["k1.x"])
    first.checkpointed(1)  # holds step 0; the markers' segment has no entry of its own
    first.checkpointed(2)  # holds step 1 too: only k2 is left, acknowledged and taken by no step
    assert first.held() == {None: 1}
    second = AckJournal(tmp_path, incarnation="second").open()  # rank 0 restarted from step 2
    assert second.held() == {None: 1}
    assert rewards([f for _, f in second.replay(since=2)]) == [2.0]


def test_segments_go_once_a_checkpoint_holds_every_entry_in_them(tmp_path: Path) -> None:
    journal = AckJournal(tmp_path, incarnation="inc").open()
    for epoch in (0, 0, 1):
        journal.record(epoch=epoch, fragment=pushed_fragment(float(epoch)))
    [first] = segment_files(tmp_path)
    assert journal.checkpointed(1) == 2
    assert segment_files(tmp_path)[0] == first  # epoch 1's entry lives on
    journal.record(epoch=2, fragment=pushed_fragment(2.0))  # into the segment the checkpoint began
    assert journal.checkpointed(2) == 1
    assert first not in segment_files(tmp_path)
    assert len(segment_files(tmp_path)) == 2  # epoch 2's entry; the newest checkpoint's marker
    assert rewards(AckJournal(tmp_path, incarnation="next").open().pending(2)) == [2.0]
    assert AckJournal(tmp_path, incarnation="last").open().acknowledged_by_incarnation() == {
        "inc": 4,
        "last": 0,
    }


def test_a_journal_of_a_file_per_entry_is_adopted_with_its_steps_and_counts(tmp_path: Path) -> None:
    def old_entry(name: str, reward: float) -> None:
        message = fragment_to_proto(pushed_fragment(reward), task_id="t", worker_id="eval-0#1", epoch=3)
        _write_synced(tmp_path / name, message.SerializeToString())

    old_entry("e000003-old-000001.frag", 3.0)
    old_entry("q-old-000002.frag", 9.0)
    journal = AckJournal(tmp_path, incarnation="new").open()
    assert not list(tmp_path.glob("*.frag"))
    assert rewards(journal.pending(3)) == [3.0]
    assert rewards([f for _, f in journal.replay(since=4)]) == [9.0]
    assert journal.acknowledged_by_incarnation() == {"old": 2, "new": 0}


def test_a_steps_marker_is_synced_by_durable_not_on_the_learners_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = AckJournal(tmp_path, incarnation="inc").open()
    for i in range(3):
        journal.record(epoch=None, fragment=pushed_fragment(float(i)), key=f"k{i}.x")
    syncs: list[int] = []
    real_sync = journal_log.sync
    monkeypatch.setattr(journal_log, "sync", lambda fd: (syncs.append(fd), real_sync(fd))[1])
    journal.taken(epoch=0, keys=["k0.x", "k1.x"])
    assert syncs == []  # the step goes on training; the pushes' syncs cover the marker meanwhile
    journal.durable()  # before a checkpoint of step 0 is saved
    assert len(syncs) == 1
    journal.durable()
    assert len(syncs) == 1
    assert AckJournal(tmp_path, incarnation="next").open().held() == {0: 2, None: 1}


def test_a_large_entry_is_taken_back_viewing_the_bytes_read(tmp_path: Path) -> None:
    fragment = pushed_fragment(4.0)
    fragment.data["frames"] = torch.randint(0, 255, (*fragment.data.batch_size, 300_000), dtype=torch.uint8)
    AckJournal(tmp_path, incarnation="first").open().record(epoch=1, fragment=fragment)
    [back] = AckJournal(tmp_path, incarnation="second").open().pending(1)
    assert back.received is not None
    assert isinstance(back.received.payload, memoryview)  # read as a push is: protobuf copied nothing
    assert torch.equal(back.data["frames"], fragment.data["frames"])
