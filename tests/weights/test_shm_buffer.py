"""The shared-memory double buffer across real processes: snapshots, crashes, stale files, leaks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from rlkube.weights.errors import SlotBusyError, WriterBusyError
from rlkube.weights.layout import layout_of
from rlkube.weights.shm import ShmWriter
from rlkube.weights.shm_header import HEADER_BYTES, SlotState
from rlkube.weights.shm_reader import ShmReader

from tests.weights.conftest import Helper
from tests.weights.procs import filled_state_dict, publish, snapshot_problems


def test_concurrent_reader_processes_never_see_a_torn_or_mixed_snapshot(shm_dir: Path, helpers: list) -> None:
    flips, lockstep = 3000, 120
    with ShmWriter(shm_dir, slot_wait_timeout=30) as writer:
        publish(writer, 1)
        helpers.extend(Helper("reader-loop", shm_dir, flips, lockstep) for _ in range(3))
        for helper in helpers:
            assert helper.read()["ready"]
        # In step first: every reader pins the newest version while the next one is committed
        # (so the readers really raced the writer, however the machine schedules them)...
        for version in range(2, lockstep + 2):
            for helper in helpers:
                helper.send({"pin": True})
            for helper in helpers:
                assert helper.read()["pinned"] == version - 1
            publish(writer, version)
            for helper in helpers:
                helper.send({"check": True})
        # ...then free-running: the writer waits for pins, readers take whatever is newest.
        for version in range(lockstep + 2, flips + 1):
            publish(writer, version)
        results = [helper.read(timeout=120) for helper in helpers]
        for helper in helpers:
            assert helper.wait() == 0
    for result in results:
        assert result["problems"] == []
        assert result["snapshots"] > 100  # the readers really raced the writer
        assert result["versions"] > 50


def test_writer_killed_mid_write_leaves_readers_on_the_previous_version_and_the_next_writer_recovers(
    shm_dir: Path, helpers: list
) -> None:
    doomed = Helper("hanging-writer", shm_dir)
    helpers.append(doomed)
    half_written = doomed.read()["slot"]
    with ShmReader(shm_dir, verify=True) as reader:
        with reader.acquire() as snap:
            assert snap.version == 1
            assert snapshot_problems(snap.views, 1) == []
        doomed.kill()
        with reader.acquire() as snap:
            assert snap.version == 1
            assert snap.slot != half_written
            assert snapshot_problems(snap.views, 1) == []
        with ShmWriter(shm_dir) as writer:
            assert writer.header().slots[half_written].state == SlotState.EMPTY
            assert writer.latest().version == 1
            publish(writer, 1, incarnation="restarted")  # a new incarnation may start low again
            with reader.acquire(newer_than=("test", 1)) as snap:
                assert snap.key == ("restarted", 1)
                assert snapshot_problems(snap.views, 1) == []


def test_a_second_writer_is_refused_and_told_who_writes(shm_dir: Path) -> None:
    with ShmWriter(shm_dir):
        with pytest.raises(WriterBusyError, match=f"pid {os.getpid()}"):
            ShmWriter(shm_dir).open()
        assert not ShmWriter(shm_dir).try_open()


def test_the_writer_waits_for_readers_to_leave_a_slot_and_names_them_on_timeout(
    shm_dir: Path, helpers: list
) -> None:
    with ShmWriter(shm_dir, slot_wait_timeout=0.3, on_busy="raise") as writer:
        publish(writer, 1)
        slow = Helper("pinning-reader", shm_dir)
        helpers.append(slow)
        assert slow.read()["version"] == 1
        publish(writer, 2)  # the other slot is free
        with pytest.raises(SlotBusyError, match=f"pid {slow.proc.pid}"):
            publish(writer, 3)  # slot of version 1 is still pinned
        assert writer.latest().version == 2
        slow.send({"release": True})
        assert slow.read()["done"]
        publish(writer, 3)
        assert writer.latest().version == 3


def test_a_hung_reader_loses_its_slot_but_its_pinned_copy_stays_whole_and_unchanged(
    shm_dir: Path, helpers: list, caplog: pytest.LogCaptureFixture
) -> None:
    with ShmWriter(shm_dir, slot_wait_timeout=0.3) as writer:
        publish(writer, 1)
        hung = Helper("checking-pinner", shm_dir)
        helpers.append(hung)
        assert hung.read()["version"] == 1
        os.kill(hung.proc.pid, signal.SIGSTOP)
        try:
            for version in range(2, 6):  # version 3 needs the slot the stopped reader pins
                publish(writer, version)
        finally:
            os.kill(hung.proc.pid, signal.SIGCONT)
        assert writer.reclaimed == 1
        assert f"pid {hung.proc.pid}" in caplog.text
        with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
            assert snap.version == 5
            assert snapshot_problems(snap.views, 5) == []
        hung.send({})
        assert hung.read() == {"held": 1, "problems": [], "newest": 5, "newest_problems": []}
        assert hung.wait() == 0


def test_a_reader_with_nothing_newer_gets_none(shm_dir: Path) -> None:
    with ShmWriter(shm_dir) as writer, ShmReader(shm_dir) as reader:
        assert reader.acquire() is None
        publish(writer, 4)
        with reader.acquire() as snap:
            key = snap.key
        assert reader.acquire(newer_than=key) is None


def test_a_layout_change_grows_the_slots_and_readers_follow(shm_dir: Path) -> None:
    with ShmWriter(shm_dir) as writer, ShmReader(shm_dir, verify=True) as reader:
        publish(writer, 1)
        publish(writer, 2, scale=40)  # ~3.3 MB: past the first 2 MiB slot files
        publish(writer, 3, scale=40)
        with reader.acquire() as snap:
            assert snap.version == 3
            assert snap.views["body"]["w"].shape == (256 * 40, 64)
            assert snapshot_problems(snap.views, 3) == []
        publish(writer, 4)
        with reader.acquire() as snap:
            assert snap.views["body"]["w"].shape == (256, 64)
            assert snapshot_problems(snap.views, 4) == []
        assert len([n for n in os.listdir(shm_dir) if n.startswith("layout-")]) == 2


def test_a_foreign_or_older_format_header_is_replaced(shm_dir: Path) -> None:
    shm_dir.mkdir(parents=True)
    (shm_dir / "header").write_bytes(b"not a header" * 10)
    with ShmWriter(shm_dir) as writer:
        publish(writer, 1)
        assert (shm_dir / "header").stat().st_size == HEADER_BYTES
    shm_dir.mkdir(parents=True)
    (shm_dir / "header").write_bytes(b"X" * HEADER_BYTES)
    with ShmWriter(shm_dir) as writer, ShmReader(shm_dir) as reader:
        assert reader.acquire() is None
        publish(writer, 2)
        with reader.acquire() as snap:
            assert snap.version == 2


def test_the_last_process_out_removes_every_file(shm_dir: Path) -> None:
    writer = ShmWriter(shm_dir).open()
    reader = ShmReader(shm_dir).open()
    publish(writer, 1)
    snap = reader.acquire()
    writer.close()
    assert shm_dir.exists()  # the reader is still attached
    snap.release()
    reader.close()
    assert not shm_dir.exists()


def test_views_stay_valid_and_unchanged_while_pinned(shm_dir: Path) -> None:
    with ShmWriter(shm_dir) as writer, ShmReader(shm_dir) as reader:
        publish(writer, 1)
        snap = reader.acquire()
        publish(writer, 2)  # goes to the other slot
        assert torch.equal(snap.views["body"]["w"], filled_state_dict(1.0)["body"]["w"])
        snap.release()
        publish(writer, 3)
        with reader.acquire() as latest:
            assert latest.version == 3
            assert latest.slot == snap.slot
        assert layout_of(filled_state_dict(0.0)).digest == snap.layout.digest
