"""What a worker was told is accepted survives a crash of rank 0 (the acknowledgement journal)."""

from __future__ import annotations

from pathlib import Path

import torch
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.state import Coordinator
from rlkube.coordinator.tasks import TaskSpec
from rlkube.data.fragment import Fragment
from tensordict import TensorDict

from tests.data.test_buffers import fragment
from tests.engine.jobs import tiny_job


def pushed_fragment(tag: float, *, num_envs: int = 4, steps: int = 8) -> Fragment:
    """A fragment the coordinator's edge accepts for ``tiny_job`` (its keys, its [numEnvs, T])."""
    n, t = num_envs, steps
    data = TensorDict(
        {
            "observation": torch.full((n, t, 4), tag),
            "reward": torch.full((n, t), tag),
            "terminated": torch.zeros(n, t, dtype=torch.bool),
            "truncated": torch.zeros(n, t, dtype=torch.bool),
            "next_observation": torch.full((n, t, 4), tag),
        },
        batch_size=[n, t],
    )
    return Fragment(data=data, episode_returns=(tag,), episode_lengths=(int(tag) + 1,), weight_version=0)


def coordinator_with_journal(directory: Path) -> Coordinator:
    coordinator = Coordinator(tiny_job(), world_size=1)
    coordinator.journal = AckJournal(directory, incarnation=coordinator.incarnation).open()
    return coordinator


def collect(coordinator: Coordinator, worker_id: str, count: int, *, tag: float) -> None:
    for i in range(count):
        task = coordinator.lease(worker_id, wait_seconds=0)
        assert isinstance(task, TaskSpec)
        assert coordinator.push(
            task_id=task.task_id, worker_id=worker_id, fragment=pushed_fragment(tag + i)
        ).accepted


def test_fragments_acknowledged_before_a_crash_are_trained_by_the_next_incarnation(tmp_path: Path) -> None:
    first = coordinator_with_journal(tmp_path)
    per_epoch = first.fragments_per_epoch
    assert per_epoch >= 2
    first.open_epoch(epoch=0, version=0)
    worker = first.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    collect(first, worker, per_epoch - 1, tag=1.0)  # then rank 0 dies: one task of epoch 0 missing

    second = coordinator_with_journal(tmp_path)  # the restarted rank 0, resumed from epoch 0
    second.open_epoch(epoch=0, version=0)
    worker = second.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    collect(second, worker, 1, tag=50.0)
    assert second.lease(worker, wait_seconds=0) is None  # only the missing task was queued
    batch = second.wait_batch(timeout=5)
    assert batch is not None
    rewards = sorted(float(f.data["reward"][0, 0]) for f in batch.fragments)
    assert rewards == [*(1.0 + i for i in range(per_epoch - 1)), 50.0]  # each exactly once
    assert second.replayed == per_epoch - 1
    assert second.journal is not None
    assert second.journal.acknowledged_by_incarnation() == {
        first.incarnation: per_epoch - 1,
        second.incarnation: 1,
    }


def test_a_checkpoint_makes_the_journal_of_its_epochs_redundant(tmp_path: Path) -> None:
    journal = AckJournal(tmp_path, incarnation="a").open()
    for epoch in (0, 0, 1, 2):
        journal.record(epoch=epoch, fragment=fragment(float(epoch)))
    assert journal.checkpointed(2) == 3  # a checkpoint of 2 trained epochs holds epochs 0 and 1
    assert journal.pending(0) == []
    assert [float(f.data["reward"][0, 0]) for f in journal.pending(2)] == [2.0]


def test_a_journalled_fragment_reads_back_bit_for_bit(tmp_path: Path) -> None:
    journal = AckJournal(tmp_path, incarnation="a").open()
    original = fragment(3.5)
    journal.record(epoch=4, fragment=original)
    (back,) = journal.pending(4)
    assert back.episode_returns == original.episode_returns
    assert back.episode_lengths == original.episode_lengths
    for key in original.data.keys():  # noqa: SIM118 (a TensorDict)
        assert torch.equal(back.data[key], original.data[key])


def async_coordinator_with_journal(directory: Path) -> Coordinator:
    coordinator = Coordinator(tiny_job(spec={"engine": "async"}), world_size=1)
    coordinator.journal = AckJournal(directory, incarnation=coordinator.incarnation).open()
    return coordinator


def rewards_of(batch: object) -> list[float]:
    return sorted(float(f.data["reward"][0, 0]) for f in batch.fragments)  # type: ignore[attr-defined]


def test_async_fragments_acknowledged_before_a_crash_come_first_after_it(tmp_path: Path) -> None:
    first = async_coordinator_with_journal(tmp_path)
    per_epoch = first.fragments_per_epoch
    first.open_stream(min_version=0, step=0)
    worker = first.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    collect(first, worker, 2 * per_epoch + 1, tag=1.0)
    step0 = first.wait_batch(timeout=5, step=0)  # trained by step 0, then a checkpoint of 1 step
    assert step0 is not None
    first.checkpointed(epoch=1)
    step1 = first.wait_batch(timeout=5, step=1)  # trained by step 1, lost with rank 0
    assert step1 is not None
    # rank 0 dies: step 1's fragments and one acknowledged, untaken fragment are not in the checkpoint

    second = async_coordinator_with_journal(tmp_path)  # resumed from the checkpoint of step 1
    second.open_stream(min_version=0, step=1)
    assert second.replayed == per_epoch + 1
    again = second.wait_batch(timeout=5, step=1)
    assert again is not None
    assert rewards_of(again) == rewards_of(step1)  # the lost step's fragments, first
    worker = second.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    collect(second, worker, per_epoch - 1, tag=100.0)
    rest = second.wait_batch(timeout=5, step=2)
    assert rest is not None
    assert rewards_of(rest) == [1.0 + 2 * per_epoch, *(100.0 + i for i in range(per_epoch - 1))]
    second.checkpointed(epoch=3)
    assert second.journal is not None
    assert second.journal.replay(since=0) == []  # all of it is in the checkpoint now
    assert second.journal.acknowledged_by_incarnation() == {
        first.incarnation: 2 * per_epoch + 1,
        second.incarnation: per_epoch - 1,
    }


def test_taken_back_fragments_hold_the_streams_capacity_until_trained(tmp_path: Path) -> None:
    first = async_coordinator_with_journal(tmp_path)
    first.open_stream(min_version=0, step=0)
    worker = first.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    capacity = first.buffer.capacity
    collect(first, worker, capacity, tag=1.0)
    assert first.lease(worker, wait_seconds=0) is None  # the buffer is full: back-pressure

    second = async_coordinator_with_journal(tmp_path)
    second.open_stream(min_version=0, step=0)
    worker = second.register(pod_name="eval-0", node_name="n", replica_index=0, num_envs=4).worker_id
    assert second.lease(worker, wait_seconds=0) is None  # the taken-back fragments fill it
    assert second.wait_batch(timeout=5, step=0) is not None
    assert isinstance(second.lease(worker, wait_seconds=0), TaskSpec)  # room again
