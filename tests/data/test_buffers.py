"""The rollout buffer counts a task once, pushes back when full, shards equally; the replay ring wraps."""

from __future__ import annotations

import threading

import pytest
import torch
from rlkube.data import AddResult, Fragment, ReplayBuffer, RolloutBuffer
from tensordict import TensorDict


def fragment(tag: float, *, num_envs: int = 4, length: int = 3) -> Fragment:
    rows = torch.arange(num_envs, dtype=torch.float32).unsqueeze(1).expand(num_envs, length)
    data = TensorDict(
        {"observation": rows.unsqueeze(-1) + 100 * tag, "reward": torch.full((num_envs, length), tag)},
        batch_size=[num_envs, length],
    )
    return Fragment(data=data, episode_returns=(tag,), episode_lengths=(int(tag) + 1,), weight_version=0)


def test_a_task_delivered_twice_is_a_duplicate_and_counted_once() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=2, capacity=4)
    assert buffer.add("e0-f0", fragment(1)) is AddResult.ACCEPTED
    assert buffer.add("e0-f0", fragment(1)) is AddResult.DUPLICATE
    assert len(buffer) == 1
    assert not buffer.ready()
    assert buffer.duplicates == 1


def test_a_task_acknowledged_in_an_earlier_epoch_stays_a_duplicate() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=1, capacity=2)
    buffer.add("t1", fragment(1))
    batch = buffer.take_epoch()
    assert batch.task_ids == ("t1",)
    assert buffer.add("t1", fragment(1)) is AddResult.DUPLICATE
    assert len(buffer) == 0


def test_a_full_buffer_refuses_without_remembering_the_task() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=2, capacity=2)
    buffer.add("a", fragment(1))
    buffer.add("b", fragment(2))
    assert buffer.add("c", fragment(3)) is AddResult.FULL
    assert not buffer.has_room()
    buffer.take_epoch()
    assert buffer.add("c", fragment(3)) is AddResult.ACCEPTED


def test_wait_for_room_wakes_when_an_epoch_is_taken() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=1, capacity=1)
    buffer.add("a", fragment(1))
    assert buffer.wait_for_room(timeout=0.01) is False
    woke = threading.Event()

    def waiter() -> None:
        if buffer.wait_for_room(timeout=10):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    buffer.take_epoch()
    thread.join(timeout=10)
    assert woke.is_set()


def test_wait_ready_wakes_when_the_last_fragment_arrives() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=3, capacity=3)
    threads = [threading.Thread(target=buffer.add, args=(f"t{i}", fragment(i))) for i in range(3)]
    for thread in threads:
        thread.start()
    assert buffer.wait_ready(timeout=10)
    for thread in threads:
        thread.join()
    assert len(buffer.take_epoch().fragments) == 3


def test_capacity_below_one_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"raise spec\.buffer\.capacity"):
        RolloutBuffer(fragments_per_epoch=4, capacity=3)


def test_taking_an_incomplete_epoch_is_an_error() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=2, capacity=2)
    buffer.add("a", fragment(1))
    with pytest.raises(RuntimeError, match="1 of 2"):
        buffer.take_epoch()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_are_disjoint_equal_sized_and_cover_the_epoch(world_size: int) -> None:
    buffer = RolloutBuffer(fragments_per_epoch=3, capacity=3)
    for i in range(3):
        buffer.add(f"t{i}", fragment(i))
    batch = buffer.take_epoch()
    shards = [batch.shard(rank, world_size) for rank in range(world_size)]
    sizes = {tuple(s.batch_size) for s in shards}
    assert sizes == {(12 // world_size, 3)}
    seen = torch.cat([s["observation"][:, 0, 0] for s in shards]).tolist()
    assert len(seen) == len(set(seen))  # every row is a different (fragment, env)
    assert batch.dropped_rows(world_size) == 12 - len(seen)
    assert batch.env_steps == 36
    assert batch.episode_returns == (0.0, 1.0, 2.0)


def test_more_ranks_than_rows_is_a_clear_error() -> None:
    buffer = RolloutBuffer(fragments_per_epoch=1, capacity=1)
    buffer.add("a", fragment(1, num_envs=2))
    with pytest.raises(ValueError, match="fewer than the 3 train ranks"):
        buffer.take_epoch().shard(0, 3)


def test_replay_ring_keeps_the_newest_transitions() -> None:
    ring = ReplayBuffer(capacity=5, seed=0)
    ring.extend(TensorDict({"x": torch.arange(3.0)}, batch_size=[3]))
    assert len(ring) == 3
    ring.extend(TensorDict({"x": torch.arange(3.0, 7.0)}, batch_size=[4]))
    assert len(ring) == 5
    values = set(ring.sample(200)["x"].tolist())
    assert values == {2.0, 3.0, 4.0, 5.0, 6.0}


def test_replay_flattens_fragments_into_transitions() -> None:
    ring = ReplayBuffer(capacity=100)
    assert ring.extend(fragment(1).data) == 12
    sample = ring.sample(8)
    assert sample.batch_size == torch.Size([8])
    assert sample["observation"].shape == (8, 1)


def test_replay_refuses_changed_keys_and_empty_sampling() -> None:
    ring = ReplayBuffer(capacity=4)
    with pytest.raises(ValueError, match="empty"):
        ring.sample(1)
    ring.extend(TensorDict({"x": torch.zeros(2)}, batch_size=[2]))
    with pytest.raises(ValueError, match="unexpected"):
        ring.extend(TensorDict({"x": torch.zeros(2), "y": torch.zeros(2)}, batch_size=[2]))
