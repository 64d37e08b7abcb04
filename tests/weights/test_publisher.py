"""The train side: what send() leaves in the buffer and announces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlkube.weights.copies import COPIES, buffer_checksum
from rlkube.weights.publisher import PublisherConfig, WeightPublisher, split_evenly
from rlkube.weights.shm_reader import ShmReader

from tests.weights.tiny import tiny_policy


@pytest.mark.parametrize("threads", [1, 3])
def test_send_packs_every_tensor_once_and_records_the_announced_checksum(shm_dir: Path, threads: int) -> None:
    trainer = tiny_policy("train", hidden=64)
    trainer.init_train()
    state = trainer.get_trainable_parameters()
    with WeightPublisher(
        PublisherConfig(shm_dir=shm_dir, pack_threads=threads, chunk_bytes=4096)
    ) as publisher:
        COPIES.reset()
        version = publisher.send(state)
        calls, nbytes = COPIES.snapshot()["copy_tensor_into_slot"]
        assert calls == sum(len(p) for p in state.values())
        announced = publisher.latest()
        assert (announced.version, announced.incarnation) == (version, publisher.incarnation)
        with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
            grid = announced.chunk_bytes
            assert snap.meta.checksum == announced.checksum == buffer_checksum(snap.buffer.numpy(), grid)
            for module, params in state.items():
                for name, tensor in params.items():
                    assert torch.equal(snap.views[module][name], tensor)
        assert nbytes == sum(e.nbytes for e in snap.layout.entries)


def test_versions_count_up_unless_given(shm_dir: Path) -> None:
    state = {"m": {"w": torch.ones(3)}}
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, incarnation="fixed")) as publisher:
        assert [publisher.send(state), publisher.send(state), publisher.send(state, version=10)] == [1, 2, 10]
        assert publisher.send(state) == 11
        assert publisher.latest().incarnation == "fixed"


def test_a_state_dict_that_cannot_be_packed_leaves_the_published_version(shm_dir: Path) -> None:
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir)) as publisher:
        publisher.send({"m": {"w": torch.ones(3)}})
        with pytest.raises(ValueError, match="not a tensor"):
            publisher.send({"m": {"w": torch.ones(3), "x": 3}})
        assert publisher.writer.latest().version == 1
        assert publisher.send({"m": {"w": torch.ones(3)}}) == 2


@pytest.mark.parametrize(
    ("sizes", "parts", "expected"),
    [
        ([10, 10, 10, 10], 2, [(0, 2), (2, 4)]),
        ([100, 1, 1, 1], 2, [(0, 1), (1, 4)]),
        ([5], 4, [(0, 1)]),
        ([1, 2, 3], 1, [(0, 3)]),
        ([0, 0], 2, [(0, 2)]),
    ],
)
def test_split_evenly_makes_contiguous_groups_of_similar_size(
    sizes: list, parts: int, expected: list
) -> None:
    assert split_evenly(sizes, parts) == expected
