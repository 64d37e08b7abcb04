"""Parameters on a GPU are snapshotted into one pinned host buffer before they go into the slot.

The snapshot runs on CPU tensors too (a plain copy), so its behaviour is checked here; the CUDA
test runs where a GPU is present.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlkube.weights.copies import COPIES
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.shm_reader import ShmReader
from rlkube.weights.staging import PinnedStaging, on_accelerator


def state(value: float) -> dict[str, dict[str, torch.Tensor]]:
    return {"net": {"w": torch.full((32, 8), value), "b": torch.full((8,), value, dtype=torch.bfloat16)}}


def test_a_snapshot_keeps_the_values_it_was_taken_with_while_the_trainer_goes_on() -> None:
    staging = PinnedStaging()
    trained = state(1.0)
    snap = staging.snapshot_(trained)
    staging.fence_()
    staging.wait()
    for tensor in trained["net"].values():
        tensor.add_(1)  # the next step
    assert bool((snap["net"]["w"] == 1.0).all())
    assert bool((snap["net"]["b"] == 1.0).all())


def test_the_staging_buffer_is_reused_for_the_same_layout_and_each_tensor_is_one_counted_copy() -> None:
    staging = PinnedStaging()
    COPIES.reset()
    first = staging.snapshot_(state(1.0))
    second = staging.snapshot_(state(2.0))
    assert first["net"]["w"].data_ptr() == second["net"]["w"].data_ptr()
    calls, nbytes = COPIES.snapshot()["copy_device_into_staging"]
    assert (calls, nbytes) == (4, 2 * (32 * 8 * 4 + 8 * 2))


def test_cpu_state_dicts_are_not_staged() -> None:
    assert not on_accelerator(state(1.0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_publish_of_gpu_parameters_reaches_readers_through_pinned_staging(shm_dir: Path) -> None:
    on_gpu = {m: {n: t.cuda() for n, t in ps.items()} for m, ps in state(3.0).items()}
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir)) as publisher:
        assert not publisher.keep_resident(on_gpu)  # GPU tensors cannot live in a shm slot
        publisher.send(on_gpu, version=1)
        with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
            assert torch.equal(snap.views["net"]["w"], on_gpu["net"]["w"].cpu())
