"""The trainer's own tensors kept in the writer's back slot, so that a publish only flips.

I/O-free bookkeeping over tensors; the slots are :class:`~rlkube.weights.shm.ShmWriter`'s.
:class:`ResidentTensors` holds the very tensor objects a policy trains (its parameters and
buffers, from ``state_dict(keep_vars=True)``) and re-points them (``tensor.data = view``) at
their places in a slot lease. While the lease is WRITING nobody reads it, so the trainer may
train in it; a publish commits that lease as it is (no copy before the flip: the state dict
it is given aliases the slot, :func:`rlkube.weights.copies.in_place`). The committed slot is
then read by eval policies, so the trainer must not write it again: :meth:`move_into_` copies
the tensors into the *next* lease (the other slot, once its readers left it) and re-points
them there. The publisher runs that move in the background, after the flip, while rollouts
run; the trainer waits for it only before its next update (``wait_writable``).

Optimizers, DDP and autograd keep working: they hold the same tensor objects, only their
storage moves. Tensors that cannot live in a shm slot (not on the CPU, sparse, two names
sharing memory) make :func:`why_not_resident` answer, and the publisher copies as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rlkube.weights.copies import copy_resident_into_slot
from rlkube.weights.layout import Destinations, StateDict, WeightLayout, layout_of


def why_not_resident(tensors: StateDict) -> str | None:
    """Why these tensors cannot live in a shm slot (None: they can). Pure."""
    seen: dict[int, str] = {}
    for module, params in tensors.items():
        for name, tensor in params.items():
            where = f"{module}.{name}"
            if not isinstance(tensor, torch.Tensor):
                return f"{where} is not a tensor"
            if tensor.device.type != "cpu":
                return f"{where} is on {tensor.device} (the pinned staging copy is used instead)"
            if tensor.layout != torch.strided or tensor.is_quantized:
                return f"{where} is not a dense tensor"
            if tensor.numel() == 0:
                continue
            pointer = tensor.untyped_storage().data_ptr()
            if pointer in seen:
                return f"{where} shares its memory with {seen[pointer]} (tied weights)"
            seen[pointer] = where
    return None


def aliases(state_dict: StateDict, tensors: StateDict) -> bool:
    """Whether every tensor of ``state_dict`` is a view of the same memory as its counterpart
    in ``tensors`` (what ``get_trainable_parameters`` returns for the models' own tensors). Pure."""
    if list(state_dict) != list(tensors):
        return False
    for module, params in state_dict.items():
        own = tensors[module]
        if list(params) != list(own):
            return False
        for name, tensor in params.items():
            mine = own[name]
            if tensor.shape != mine.shape or tensor.dtype != mine.dtype:
                return False
            if tensor.numel() and tensor.data_ptr() != mine.data_ptr():
                return False
    return True


class ResidentTensors:
    """The trainer's tensors and where they live now (see the module docstring)."""

    def __init__(self, tensors: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        reason = why_not_resident(tensors)
        if reason is not None:
            raise ValueError(reason)
        self.tensors = tensors
        self.layout: WeightLayout = layout_of(tensors)
        self._flat = [t for params in tensors.values() for t in params.values()]

    def move_into_(self, destinations: Destinations) -> int:
        """Copy every tensor into its place in ``destinations`` (a WRITING lease's) and re-point it
        there; returns the bytes copied. Called with no update running on these tensors."""
        copied = 0
        with torch.no_grad():
            for (view, raw), tensor in zip(destinations, self._flat, strict=True):
                if tensor.numel() and tensor.data_ptr() != view.data_ptr():
                    copy_resident_into_slot(raw, tensor.contiguous())
                    copied += raw.nbytes
                tensor.data = view
        return copied

    def lives_in(self, destinations: Destinations) -> bool:
        """Whether every tensor is the view ``destinations`` hold for it."""
        return all(
            t.numel() == 0 or t.data_ptr() == view.data_ptr()
            for (view, _), t in zip(destinations, self._flat, strict=True)
        )

    def evict_(self) -> None:
        """Give every tensor private memory again (a copy): the slots may be written by others."""
        with torch.no_grad():
            for tensor in self._flat:
                tensor.data = tensor.detach().clone()
