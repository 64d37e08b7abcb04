"""Shm slots are page-locked with CUDA once per mapping, unregistered before they go; a refusal falls back.

CUDA's runtime is replaced by a recorder on CPU machines (the two calls and their return codes are
all that the registry uses); the tests marked for CUDA run the real DMA paths where a GPU is present.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from rlkube.weights.copies import COPIES
from rlkube.weights.cuda_host import REGISTER_PORTABLE, REGISTER_READ_ONLY, HostRegistrations
from rlkube.weights.device_copy import DeviceToSlot, load_slot_into_device, mapping_of
from rlkube.weights.layout import destinations_of, layout_of
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.shm_reader import ShmReader

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class RecordingRuntime:
    """cudaHostRegister / cudaHostUnregister as calls on a list; ``refuse`` makes register fail."""

    def __init__(self, *, refuse: int = 0) -> None:
        self.calls: list[tuple[str, int, int, int]] = []
        self.refuse = refuse

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, size, flags))
        return self.refuse

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr, 0, 0))
        return 0

    def cudaGetLastError(self) -> int:
        self.calls.append(("clear", 0, 0, 0))
        return 0


def mapping(nbytes: int = 4096) -> torch.Tensor:
    return torch.zeros(nbytes, dtype=torch.uint8)


def test_a_slot_mapping_is_registered_once_and_its_successor_replaces_it() -> None:
    runtime = RecordingRuntime()
    registry = HostRegistrations(read_only=False, runtime=runtime)
    first, second = mapping(), mapping(8192)
    assert registry.ensure(0, first)
    assert registry.ensure(0, first[:100])  # a view of the same mapping: nothing new
    assert registry.ensure(0, second)  # the slot file grew: a new mapping
    assert [c[0] for c in runtime.calls] == ["register", "unregister", "register"]
    assert runtime.calls[0][1:] == (first.data_ptr(), 4096, REGISTER_PORTABLE)
    assert runtime.calls[1][1] == first.data_ptr()  # the old one goes before the new one is registered
    assert runtime.calls[2][1:3] == (second.data_ptr(), 8192)
    registry.close()
    assert runtime.calls[-1] == ("unregister", second.data_ptr(), 0, 0)
    assert registry.registered() == 0


def test_readers_register_their_mappings_read_only() -> None:
    runtime = RecordingRuntime()
    registry = HostRegistrations(read_only=True, runtime=runtime)
    assert registry.ensure(1, mapping())
    assert runtime.calls[0][3] == REGISTER_PORTABLE | REGISTER_READ_ONLY


def test_a_refused_registration_is_logged_once_and_never_retried(caplog: pytest.LogCaptureFixture) -> None:
    runtime = RecordingRuntime(refuse=2)  # cudaErrorMemoryAllocation
    registry = HostRegistrations(read_only=False, runtime=runtime)
    with caplog.at_level(logging.WARNING, logger="rlkube.weights.cuda_host"):
        assert not registry.ensure(0, mapping())
        assert not registry.ensure(1, mapping())
    assert [c[0] for c in runtime.calls] == ["register", "clear"]  # torch would raise it at the next kernel
    assert registry.disabled is not None
    assert "cudaError 2" in registry.disabled
    assert sum("ulimit -l" in r.message for r in caplog.records) == 1


def test_the_mapping_of_a_slot_slice_is_the_whole_mapping() -> None:
    whole = np.zeros(1 << 16, dtype=np.uint8)
    view = mapping_of(whole[:1000])
    assert view.data_ptr() == whole.ctypes.data
    assert view.numel() == whole.nbytes


def test_without_a_page_locked_slot_the_trainer_stages_through_pinned_memory() -> None:
    state = {"net": {"w": torch.arange(64, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}}
    layout = layout_of(state)
    slot = np.zeros(layout.total_bytes, dtype=np.uint8)
    copier = DeviceToSlot(
        registrations=HostRegistrations(read_only=False, runtime=RecordingRuntime(refuse=1))
    )
    COPIES.reset()
    out = copier.copy_(
        state, slot=0, slot_array=slot, layout=layout, destinations=destinations_of(slot, layout)
    )
    assert copier.last_path == "staged"
    assert torch.equal(out["net"]["w"], state["net"]["w"])
    assert COPIES.snapshot()["copy_device_into_staging"][0] == 2


def test_a_cpu_model_loads_a_slot_with_a_plain_copy() -> None:
    buffer, shadow = (
        torch.arange(256, dtype=torch.int32).view(torch.uint8),
        torch.empty(1024, dtype=torch.uint8),
    )
    registry = HostRegistrations(read_only=True, runtime=RecordingRuntime())
    assert load_slot_into_device(shadow, buffer, slot=0, registrations=registry) == "cpu"
    assert torch.equal(shadow, buffer)
    assert registry.registered() == 0


@needs_cuda
def test_a_gpu_publish_is_one_dma_into_the_slot_and_a_gpu_load_one_dma_out(shm_dir: Path) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    state = {"net": {"w": torch.randn(1 << 20, device=device), "b": torch.randn(7, device=device).bfloat16()}}
    COPIES.reset()
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir)) as publisher:
        publisher.send(state, version=1)
        assert publisher.device_copy_path == "dma"
        counted = COPIES.snapshot()
        assert counted["copy_device_into_slot"][0] == 2
        assert "copy_tensor_into_slot" not in counted
        assert "copy_device_into_staging" not in counted
        registry = HostRegistrations(read_only=True)
        with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
            shadow = torch.empty(snap.buffer.numel(), dtype=torch.uint8, device=device)
            path = load_slot_into_device(shadow, snap.buffer, slot=snap.slot, registrations=registry)
            assert torch.equal(shadow.cpu(), snap.buffer)
            assert torch.equal(snap.views["net"]["w"], state["net"]["w"].cpu())
        registry.close()
    assert path == "dma"


def test_the_cuda_runtime_torch_loaded_is_found_to_reset_a_refusal() -> None:
    from rlkube.weights.cuda_host import _loaded_cudart

    library = _loaded_cudart()
    if library is None:
        pytest.skip("this torch build loaded no CUDA runtime (a CPU wheel)")
    assert hasattr(library, "cudaGetLastError")
