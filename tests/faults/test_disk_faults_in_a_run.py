"""`rlkube run` on a faulty disk ends with one line of reason and a valid checkpoint, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.engine.checkpoint import CheckpointStore

from tests.faults.disks import fill, small_fs
from tests.runtime.cluster import LocalRun, write_job


def start(local_run: list[LocalRun], tmp_path: Path, run_dir: Path, **spec: object) -> LocalRun:
    run = LocalRun(write_job(tmp_path, **spec), run_dir)
    local_run.append(run)
    return run


def one_line_reason(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_read_only_checkpoint_directory_ends_the_run_before_it_starts(local_run, tmp_path) -> None:
    run_dir = tmp_path / "run"
    with small_fs(run_dir / "checkpoints", size_kib=256, read_only=True):
        run = start(local_run, tmp_path, run_dir)
        assert run.wait(timeout=120) == 1
        reason = one_line_reason(run.output[1])
    assert reason == (
        f"rlkube: disk fault: cannot write checkpoint directory {run_dir / 'checkpoints'}: "
        "[Errno 30] Read-only file system"
    )
    assert not (run_dir / "logs").exists()  # nothing was started


@pytest.mark.slow
@pytest.mark.parametrize(
    ("volume", "what"),
    [("checkpoints", "cannot write checkpoint"), ("tensorboard", "cannot write TensorBoard event file")],
)
def test_a_disk_that_fills_mid_run_ends_it_with_one_line_and_keeps_the_last_good_checkpoint(
    local_run, tmp_path, volume, what
) -> None:
    run_dir = tmp_path / "run"
    with small_fs(run_dir / volume, size_kib=16384) as disk:
        run = start(local_run, tmp_path, run_dir, train__maxEpochs=200, train__saveInterval=2)
        run.wait_until(lambda s: s.epoch >= 3, timeout=180, what="epoch 3 (a checkpoint saved)")
        fill(disk)
        assert run.wait(timeout=180) == 1
        reason = one_line_reason(run.output[1])
        assert reason.startswith("rlkube: small-train-0 stopped: disk fault: ")
        assert what in reason
        assert "No space left on device" in reason
        latest = CheckpointStore(run_dir / "checkpoints").latest()
        assert latest is not None
        assert latest.progress.epoch >= 2


@pytest.mark.slow
def test_a_run_whose_checkpoints_are_all_corrupt_finishes_with_a_valid_one_and_names_them(
    local_run, tmp_path
) -> None:
    run_dir = tmp_path / "run"
    first = start(local_run, tmp_path, run_dir, train__maxEpochs=4, train__saveInterval=2)
    assert first.wait(timeout=300) == 0, first.output[1]
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "COMPLETE.json").unlink()  # as if the job had not finished
    corrupted = sorted(p for p in checkpoints.iterdir() if p.name.startswith("ckpt-"))
    assert corrupted
    for checkpoint in corrupted:
        (checkpoint / "policy.pt").write_bytes(b"not a checkpoint any more")
    again = start(local_run, tmp_path, run_dir, train__maxEpochs=4, train__saveInterval=2)
    assert again.wait(timeout=300) == 0, again.output[1]
    latest = CheckpointStore(checkpoints).latest()
    assert latest is not None
    assert latest.progress.epoch == 4
    moved = [str(p.with_name(p.name + ".corrupt")) for p in corrupted]
    assert sorted(again.summary()["corrupt_checkpoints"]) == moved
    for name in moved:
        assert name in again.output[0]  # `rlkube run` names them
