"""Checkpoints on a faulty disk: full, read-only, or holding only corrupt checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from rlkube.engine.checkpoint import CheckpointStore, TrainerProgress
from rlkube.engine.disk import DiskFault

from tests.engine.test_checkpoint import trained_toy
from tests.faults.disks import fill, read_only, small_fs


def corrupt(checkpoint: Path) -> None:
    data = bytearray((checkpoint / "policy.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (checkpoint / "policy.pt").write_bytes(bytes(data))


def test_a_save_on_a_full_disk_is_a_one_line_disk_fault_and_keeps_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    with small_fs(tmp_path / "disk", size_kib=512) as disk:
        store = CheckpointStore(disk / "checkpoints", keep=3)
        policy = trained_toy()
        store.save(policy, TrainerProgress(epoch=1))
        fill(disk)
        with pytest.raises(DiskFault) as failure:
            store.save(policy, TrainerProgress(epoch=2))
        message = str(failure.value)
        assert "\n" not in message
        assert "No space left on device" in message
        assert "ckpt-000002" in message
        latest = store.latest()
        assert latest is not None
        assert latest.progress.epoch == 1
        assert sorted(p.name for p in store.directory.iterdir()) == ["ckpt-000001"]


def test_a_read_only_checkpoint_directory_is_found_before_training(tmp_path: Path) -> None:
    with small_fs(tmp_path / "disk", size_kib=256) as disk:
        (disk / "checkpoints").mkdir()
        read_only(disk)
        with pytest.raises(DiskFault) as failure:
            CheckpointStore(disk / "checkpoints").check_writable()
        assert str(failure.value) == (
            f"disk fault: cannot write checkpoint directory {disk / 'checkpoints'}: "
            "[Errno 30] Read-only file system"
        )


def test_corrupt_checkpoints_are_moved_aside_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    policy = trained_toy()
    good = store.save(policy, TrainerProgress(epoch=1))
    bad = store.save(policy, TrainerProgress(epoch=2))
    corrupt(bad)
    with caplog.at_level(logging.WARNING):
        latest = store.latest()
    assert latest is not None
    assert latest.path == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001", "ckpt-000002.corrupt"]
    assert store.moved_aside == [(bad, tmp_path / "ckpt-000002.corrupt")]
    assert "ckpt-000002.corrupt" in caplog.text


def test_pruning_never_deletes_the_newest_valid_checkpoint_when_newer_ones_are_corrupt(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path, keep=1)
    policy = trained_toy()
    for epoch in (7, 8, 9):  # a previous run's checkpoints, all of them now corrupt
        CheckpointStore(tmp_path, keep=3).save(policy, TrainerProgress(epoch=epoch))
        corrupt(tmp_path / f"ckpt-{epoch:06d}")
    fresh = store.save(policy, TrainerProgress(epoch=1))  # as a run that started over saves
    latest = store.latest()
    assert latest is not None
    assert latest.path == fresh
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000001",
        "ckpt-000007.corrupt",
        "ckpt-000008.corrupt",
        "ckpt-000009.corrupt",
    ]


def test_pruning_keeps_the_newest_valid_checkpoints_and_deletes_older_ones(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    policy = trained_toy()
    for epoch in (1, 2, 3):
        store.save(policy, TrainerProgress(epoch=epoch))
    corrupt(tmp_path / "ckpt-000003")
    restarted = CheckpointStore(tmp_path, keep=2)  # a new rank 0 trusts nothing it did not verify
    restarted.save(policy, TrainerProgress(epoch=4))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000002",
        "ckpt-000003.corrupt",
        "ckpt-000004",
    ]


def test_a_corrupt_checkpoint_moved_aside_twice_keeps_both_copies(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    policy = trained_toy()
    for _ in range(2):
        corrupt(store.save(policy, TrainerProgress(epoch=5)))
        assert store.latest() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000005.corrupt", "ckpt-000005.corrupt-2"]
