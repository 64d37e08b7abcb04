"""GPU <-> shm slot: one DMA each way when the slot is page-locked, the staged copies otherwise.

I/O (CUDA copies). The trainer's :class:`DeviceToSlot` puts a state dict that lives on a GPU into
the slot being written: with the slot's mapping registered with CUDA
(:mod:`rlkube.weights.cuda_host`) every tensor is copied device -> slot on a side stream that
first waits for the trainer's queued work (the last optimizer step), and the host waits for those
copies once, before the version is committed (``send()`` returns a committed version, so the
copies cannot run past it). Where registration is unavailable it falls back to
:class:`~rlkube.weights.staging.PinnedStaging` (device -> pinned host buffer -> slot).

An eval policy on a GPU loads a slot with :func:`load_slot_into_device`: one slot -> device copy
on a side stream when the reader's mapping is registered, else a copy from pageable memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlkube.weights.copies import copy_device_into_slot, copy_slot_into_shadow
from rlkube.weights.cuda_host import HostRegistrations
from rlkube.weights.layout import Destinations, StateDict, WeightLayout
from rlkube.weights.staging import PinnedStaging


def mapping_of(array: np.ndarray) -> torch.Tensor:
    """A uint8 tensor over the whole mapping behind ``array`` (a slice of a slot's mapping)."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return torch.from_numpy(root)


class DeviceToSlot:
    """The trainer's copy of a GPU state dict into the slot it writes (module docstring)."""

    def __init__(self, *, registrations: HostRegistrations | None = None) -> None:
        self.registrations = registrations or HostRegistrations(read_only=False)
        self.staging = PinnedStaging()
        self._stream: Any = None  # torch.cuda.Stream, made on first use
        #: "dma" (one device -> slot copy) or "staged" (device -> pinned -> slot), for the last copy.
        self.last_path = ""

    def copy_(
        self,
        state_dict: StateDict,
        *,
        slot: int,
        slot_array: np.ndarray,
        layout: WeightLayout,
        destinations: Destinations,
    ) -> StateDict:
        """Copy ``state_dict`` towards the slot; returns what the slot pack copies from then.

        After a DMA the returned state dict *is* the slot's views (packing copies nothing); after
        the staged copy it is the pinned buffer's views (packing copies them into the slot).
        """
        if not self.registrations.ensure(slot, mapping_of(slot_array)):
            self.last_path = "staged"
            views = self.staging.snapshot_(state_dict)
            self.staging.fence_()
            self.staging.wait()
            return views
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())  # after the step that produced them
        tensors = [t for params in state_dict.values() for t in params.values()]
        with torch.cuda.stream(stream), torch.no_grad():
            for (dst, _), src in zip(destinations, tensors, strict=True):
                copy_device_into_slot(dst, src)
                if src.is_cuda:
                    src.record_stream(stream)
        done = torch.cuda.Event()
        done.record(stream)
        done.synchronize()  # the version must be complete in the slot before it is committed
        self.last_path = "dma"
        slot_views: dict[str, dict[str, torch.Tensor]] = {}
        for entry, (dst, _) in zip(layout.entries, destinations, strict=True):
            slot_views.setdefault(entry.module, {})[entry.param] = dst
        return slot_views

    def close(self) -> None:
        self.registrations.close()


def load_slot_into_device(
    shadow: torch.Tensor, buffer: torch.Tensor, *, slot: int, registrations: HostRegistrations
) -> str:
    """Eval, copy mode on a GPU: the slot's bytes (``buffer``) into ``shadow``; returns the path taken.

    ``buffer`` is a reader's uint8 view of the slot (its storage is the whole mapping). The host
    waits for the copy: the pin on the slot is released right after.
    """
    if shadow.device.type != "cuda":
        copy_slot_into_shadow(shadow, buffer)
        return "cpu"
    if not registrations.ensure(slot, buffer):
        copy_slot_into_shadow(shadow, buffer)
        torch.cuda.synchronize(shadow.device)
        return "pageable"
    stream = _load_stream(shadow.device)
    stream.wait_stream(torch.cuda.current_stream(shadow.device))  # rollouts done with this shadow
    with torch.cuda.stream(stream):
        copy_slot_into_shadow(shadow, buffer, non_blocking=True)
    stream.synchronize()
    return "dma"


_LOAD_STREAMS: dict[torch.device, Any] = {}


def _load_stream(device: torch.device) -> Any:
    """One side stream per device for slot loads (made once: creating streams is not free)."""
    stream = _LOAD_STREAMS.get(device)
    if stream is None:
        stream = _LOAD_STREAMS[device] = torch.cuda.Stream(device=device)
    return stream
