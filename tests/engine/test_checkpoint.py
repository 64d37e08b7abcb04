"""Checkpoints are written atomically, verified, pruned, and a resumed run continues where it stopped."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from rlkube.engine.checkpoint import CheckpointError, CheckpointStore, TrainerProgress
from rlkube.engine.report import EpochRecord, RunStart, RunSummary
from rlkube.engine.run_paths import RunPaths
from rlkube.launch.in_process import InProcessRun
from rlkube.policy.builtin.ppo import PPO

from tests.engine.jobs import tiny_job
from tests.policy.toy import ToyPolicy, policy_spec


def same_state(a: Any, b: Any) -> bool:
    """Exact equality of nested optimizer states (tensors compared bit for bit)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def trained_toy(seed: int = 0) -> ToyPolicy:
    torch.manual_seed(seed)
    policy = ToyPolicy(policy_spec(), "train")
    policy.init_train(None)
    policy.net(torch.ones(3, 2)).sum().backward()
    policy.optimizer.step()
    return policy


def test_save_then_load_restores_weights_optimizer_and_rng(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    source = trained_toy()
    torch.manual_seed(123)
    path = store.save(source, TrainerProgress(epoch=4, env_steps=400, weight_version=4))
    expected_draw = torch.rand(3)
    assert path.name == "ckpt-000004"

    fresh = ToyPolicy(policy_spec(), "train")
    fresh.init_train(None)
    torch.manual_seed(999)
    progress = store.load(store.latest(), fresh)  # type: ignore[arg-type]
    assert progress.epoch == 4
    assert progress.env_steps == 400
    assert fresh.get_param_fingerprint() == source.get_param_fingerprint()
    assert same_state(fresh.optimizer.state_dict(), source.optimizer.state_dict())
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues as it would have


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    policy = trained_toy()
    for epoch in range(1, 5):
        store.save(policy, TrainerProgress(epoch=epoch))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000003", "ckpt-000004"]


def test_a_failed_save_leaves_nothing_behind_and_the_previous_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    policy = trained_toy()
    store.save(policy, TrainerProgress(epoch=1))
    real_save = torch.save

    def failing_save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith("trainer.pt"):
            Path(path).write_bytes(b"half a file")
            raise OSError("disk full")
        real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        store.save(policy, TrainerProgress(epoch=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000001"]
    latest = store.latest()
    assert latest is not None
    assert latest.progress.epoch == 1


def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    policy = trained_toy()
    store.save(policy, TrainerProgress(epoch=1))
    newest = store.save(policy, TrainerProgress(epoch=2))
    data = bytearray((newest / "policy.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "policy.pt").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        latest = store.latest()
    assert latest is not None
    assert latest.progress.epoch == 1
    assert "ckpt-000002: policy.pt is missing or does not match its digest" in caplog.text
    with pytest.raises(CheckpointError):
        store.read(newest)


def test_a_checkpoint_without_meta_is_not_a_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    newest = store.save(trained_toy(), TrainerProgress(epoch=1))
    (newest / "meta.json").unlink()
    assert store.latest() is None


def test_a_user_save_checkpoint_override_is_honoured(tmp_path: Path) -> None:
    class Annotated(ToyPolicy):
        def save_checkpoint(self, path: Any) -> None:
            torch.save({"net": self.net.state_dict(), "note": torch.tensor(42)}, path)

        def load_checkpoint(self, path: Any) -> None:
            state = torch.load(path, weights_only=True)
            self.net.load_state_dict(state["net"])
            self.note = int(state["note"])

    store = CheckpointStore(tmp_path)
    source = Annotated(policy_spec(), "train")
    source.init_train(None)
    store.save(source, TrainerProgress(epoch=1))
    fresh = Annotated(policy_spec(), "train")
    fresh.init_train(None)
    store.load(store.latest(), fresh)  # type: ignore[arg-type]
    assert fresh.note == 42
    assert fresh.get_param_fingerprint() == source.get_param_fingerprint()


class Capture:
    """An observer that snapshots the trainer's state when the run starts."""

    def __init__(self, engine: InProcessRun) -> None:
        self.engine = engine
        self.start: RunStart | None = None
        self.optimizer_state: dict[str, Any] = {}
        self.fingerprint: dict[str, float] = {}
        self.epochs: list[int] = []

    def on_start(self, start: RunStart) -> None:
        self.start = start
        self.optimizer_state = copy.deepcopy(self.engine.train_policy.optimizer.state_dict())
        self.fingerprint = self.engine.train_policy.get_param_fingerprint()

    def on_epoch(self, record: EpochRecord) -> None:
        self.epochs.append(record.epoch)

    def on_finish(self, summary: RunSummary) -> None:
        pass


def run_engine(job: Any, run_dir: Path) -> tuple[InProcessRun, Capture, RunSummary]:
    engine = InProcessRun(job, PPO, paths=RunPaths(run_dir).create())
    capture = Capture(engine)
    engine.observers = [capture]
    return engine, capture, engine.run()


def test_a_resumed_run_continues_from_the_saved_epoch_with_identical_optimizer_state(tmp_path: Path) -> None:
    first, _, summary = run_engine(tiny_job(maxEpochs=2, saveInterval=1), tmp_path)
    assert summary.epochs == 2
    saved_optimizer = first.train_policy.optimizer.state_dict()
    saved_weights = first.train_policy.get_param_fingerprint()
    (tmp_path / "checkpoints" / "COMPLETE.json").unlink()  # as if the process died after epoch 2

    _, capture, resumed = run_engine(tiny_job(maxEpochs=3, saveInterval=1), tmp_path)
    assert capture.start is not None
    assert capture.start.start_epoch == 2
    assert capture.start.env_steps == 64
    assert capture.optimizer_state["state"]  # Adam moments exist...
    assert same_state(capture.optimizer_state, saved_optimizer)  # ...and are the saved ones, bit for bit
    assert capture.fingerprint == saved_weights
    assert capture.epochs == [3]
    assert resumed.epochs == 3
    assert resumed.env_steps == 96
    assert resumed.weight_version == 3
    assert resumed.resumed_from_epoch == 2


def test_a_finished_job_does_not_train_again(tmp_path: Path) -> None:
    _, _, summary = run_engine(tiny_job(maxEpochs=1), tmp_path)
    marker = tmp_path / "checkpoints" / "COMPLETE.json"
    before = marker.stat().st_mtime_ns
    _, capture, again = run_engine(tiny_job(maxEpochs=1), tmp_path)
    assert again.already_complete
    assert again.stop_reason == summary.stop_reason
    assert again.env_steps == summary.env_steps
    assert capture.start is None  # nothing started
    assert marker.stat().st_mtime_ns == before


def test_resume_false_starts_over(tmp_path: Path) -> None:
    run_engine(tiny_job(maxEpochs=1), tmp_path)
    job = tiny_job(maxEpochs=1, spec={"checkpoint": {"resume": False}})
    _, capture, summary = run_engine(job, tmp_path)
    assert capture.start is not None
    assert capture.start.start_epoch == 0
    assert summary.epochs == 1
