"""Parameters on a GPU: a snapshot into one pinned host buffer, on a side stream, before the slot.

I/O: device copies only. Tensors on an accelerator cannot live in a shm slot (see
:mod:`rlkube.weights.resident`), so a publish copies them: device -> pinned host buffer (full
PCIe speed, asynchronous) -> slot. :meth:`PinnedStaging.snapshot_` queues the device copies on
a side stream that first waits for the work already queued on the trainer's stream (the last
optimizer step), so the trainer's thread is free at once; :meth:`PinnedStaging.fence_` makes the
trainer's stream wait for the copies before anything queued later (the next optimizer step)
overwrites the parameters, so the next forward and backward overlap with the copy; and
:meth:`PinnedStaging.wait` blocks the host until the pinned bytes are complete, before they
go into the slot. Without CUDA the same calls make a plain synchronous copy (tested on CPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlkube.weights.copies import copy_device_into_staging
from rlkube.weights.layout import StateDict, WeightLayout, layout_of, views_of


def on_accelerator(state_dict: StateDict) -> bool:
    """Whether any tensor of ``state_dict`` is on a device other than the CPU. Pure."""
    return any(
        isinstance(t, torch.Tensor) and t.device.type != "cpu"
        for params in state_dict.values()
        if isinstance(params, Mapping)
        for t in params.values()
    )


class PinnedStaging:
    """One reusable pinned host buffer per layout, filled from device tensors (module docstring)."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._layout: WeightLayout | None = None
        self._stream: Any = None  # torch.cuda.Stream, made on first use
        self._done: Any = None  # torch.cuda.Event of the copies in flight

    def snapshot_(self, state_dict: StateDict) -> dict[str, dict[str, torch.Tensor]]:
        """Start copying ``state_dict`` into the staging buffer; its CPU views (complete after wait())."""
        layout = layout_of(state_dict)
        if self._buffer is None or self._layout is None or self._layout.digest != layout.digest:
            pin = torch.cuda.is_available()
            self._buffer = torch.empty(layout.total_bytes, dtype=torch.uint8, pin_memory=pin)
            self._layout = layout
        views = views_of(self._buffer, layout)
        pairs = [(views[e.module][e.param], state_dict[e.module][e.param]) for e in layout.entries]
        if any(src.is_cuda for _, src in pairs):
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            stream = self._stream
            stream.wait_stream(torch.cuda.current_stream())  # after the step that produced them
            with torch.cuda.stream(stream):
                for dst, src in pairs:
                    copy_device_into_staging(dst, src, non_blocking=src.is_cuda)
                    if src.is_cuda:
                        src.record_stream(stream)
            self._done = torch.cuda.Event()
            self._done.record(stream)
        else:
            for dst, src in pairs:
                copy_device_into_staging(dst, src, non_blocking=False)
        return views

    def fence_(self) -> None:
        """Make the trainer's stream wait for the copies in flight (no host wait)."""
        if self._done is not None:
            torch.cuda.current_stream().wait_event(self._done)

    def wait(self) -> None:
        """Block until the snapshot is complete in host memory."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
