"""The flat layout of a state dict: manifest entries, one contiguous buffer, a layout digest.

Pure: no I/O. A state dict in ``get_trainable_parameters()``'s shape, ``{module: {param:
tensor}}``, maps to a :class:`WeightLayout` (one :class:`LayoutEntry` per tensor: module, param,
dtype, shape, aligned offset, nbytes) and a total size. :func:`pack_into_` copies every tensor
into a flat byte buffer (one copy per tensor, see :mod:`rlkube.weights.copies`) and
:func:`views_of` hands the tensors back as zero-copy views of such a buffer. Nothing is pickled:
the layout travels as the ``WeightLayout`` protobuf message and the bytes travel raw.

The digest names the layout (modules, params, dtypes, shapes, offsets, alignment): two buffers
with the same digest can be read with the same views.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlkube._proto import policy_group_pb2 as pb
from rlkube.weights.copies import copy_tensor_into_slot

#: Offsets are multiples of this: a cache line, and at least the size of every torch dtype.
DEFAULT_ALIGNMENT = 64

StateDict = Mapping[str, Mapping[str, torch.Tensor]]


class LayoutError(ValueError):
    """A state dict cannot be laid out, or does not match a layout; the message names the entry."""


@dataclass(frozen=True)
class LayoutEntry:
    module: str
    param: str
    dtype: str  # torch dtype name without "torch.": "float32", "bfloat16", ...
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def name(self) -> str:
        """``"<module>.<param>"``: the key of ``BasePolicy.get_param_fingerprint``."""
        return f"{self.module}.{self.param}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)


@dataclass(frozen=True)
class WeightLayout:
    entries: tuple[LayoutEntry, ...]
    total_bytes: int
    alignment: int
    digest: str  # 32 hex characters

    def modules(self) -> list[str]:
        """Module names in layout order."""
        return list(dict.fromkeys(e.module for e in self.entries))

    def to_proto(self) -> pb.WeightLayout:
        return pb.WeightLayout(
            digest=self.digest,
            total_bytes=self.total_bytes,
            alignment=self.alignment,
            entries=[
                pb.WeightEntry(
                    name=e.name,
                    module=e.module,
                    dtype=e.dtype,
                    shape=e.shape,
                    offset=e.offset,
                    nbytes=e.nbytes,
                )
                for e in self.entries
            ],
        )

    @classmethod
    def from_proto(cls, msg: pb.WeightLayout) -> WeightLayout:
        """Rebuild a layout from the wire; the digest is recomputed and must match."""
        entries = []
        for e in msg.entries:
            if not e.name.startswith(f"{e.module}."):
                raise LayoutError(f"layout entry {e.name!r} does not start with its module {e.module!r}")
            dtype_from_name(e.dtype)  # validates
            entries.append(
                LayoutEntry(
                    module=e.module,
                    param=e.name[len(e.module) + 1 :],
                    dtype=e.dtype,
                    shape=tuple(int(s) for s in e.shape),
                    offset=int(e.offset),
                    nbytes=int(e.nbytes),
                )
            )
        layout = _finish(tuple(entries), int(msg.total_bytes), int(msg.alignment))
        if layout.digest != msg.digest:
            raise LayoutError(
                f"layout digest mismatch: message says {msg.digest}, entries give {layout.digest}"
            )
        _check_geometry(layout)
        return layout


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LayoutError(f"unknown dtype {name!r}")
    return dtype


def _align(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _digest(entries: tuple[LayoutEntry, ...], total_bytes: int, alignment: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"rlkube-layout-1|{alignment}|{total_bytes}\n".encode())
    for e in entries:
        h.update(
            f"{len(e.module)}:{e.module}|{e.param}|{e.dtype}|{list(e.shape)}|{e.offset}|{e.nbytes}\n".encode()
        )
    return h.hexdigest()


def _finish(entries: tuple[LayoutEntry, ...], total_bytes: int, alignment: int) -> WeightLayout:
    return WeightLayout(entries, total_bytes, alignment, _digest(entries, total_bytes, alignment))


def _check_geometry(layout: WeightLayout) -> None:
    if layout.alignment <= 0 or layout.alignment & (layout.alignment - 1):
        raise LayoutError(f"alignment {layout.alignment} is not a power of two")
    end = 0
    for e in layout.entries:
        itemsize = dtype_from_name(e.dtype).itemsize
        numel = 1
        for s in e.shape:
            if s < 0:
                raise LayoutError(f"{e.name}: negative dimension in shape {e.shape}")
            numel *= s
        if e.nbytes != numel * itemsize:
            raise LayoutError(f"{e.name}: nbytes {e.nbytes} != {numel} elements x {itemsize} bytes")
        if e.offset % layout.alignment or e.offset < end:
            raise LayoutError(f"{e.name}: offset {e.offset} is unaligned or overlaps the previous entry")
        end = e.offset + e.nbytes
    if end > layout.total_bytes:
        raise LayoutError(f"entries end at {end}, past total_bytes {layout.total_bytes}")


def layout_of(state_dict: StateDict, *, alignment: int = DEFAULT_ALIGNMENT) -> WeightLayout:
    """The layout of ``{module: {param: tensor}}`` in iteration order, each tensor at an aligned offset."""
    if not isinstance(state_dict, Mapping):
        raise LayoutError(f"expected {{module: {{param: tensor}}}}, got {type(state_dict).__name__}")
    entries: list[LayoutEntry] = []
    offset = 0
    for module, params in state_dict.items():
        if not isinstance(module, str) or not module:
            raise LayoutError(f"module names must be non-empty strings, got {module!r}")
        if not isinstance(params, Mapping):
            raise LayoutError(
                f"state_dict[{module!r}] is a {type(params).__name__}, expected {{param: tensor}}"
            )
        for param, tensor in params.items():
            where = f"state_dict[{module!r}][{param!r}]"
            if not isinstance(tensor, torch.Tensor):
                raise LayoutError(
                    f"{where} is a {type(tensor).__name__}, not a tensor (extra state is not sent)"
                )
            if tensor.layout != torch.strided or tensor.is_quantized:
                raise LayoutError(f"{where} is a {tensor.layout} tensor; only dense tensors are sent")
            offset = _align(offset, alignment)
            nbytes = tensor.numel() * tensor.element_size()
            entries.append(
                LayoutEntry(module, str(param), dtype_name(tensor.dtype), tuple(tensor.shape), offset, nbytes)
            )
            offset += nbytes
    total = _align(offset, alignment)
    return _finish(tuple(entries), total, alignment)


def check_matches(state_dict: StateDict, layout: WeightLayout) -> None:
    """Raise :class:`LayoutError` naming the first tensor whose module, name, dtype or shape differs."""
    flat = [(m, p, t) for m, params in state_dict.items() for p, t in params.items()]
    if len(flat) != len(layout.entries):
        raise LayoutError(
            f"state dict has {len(flat)} tensors, layout {layout.digest} has {len(layout.entries)}"
        )
    for (module, param, tensor), e in zip(flat, layout.entries, strict=True):
        if module != e.module or param != e.param:
            raise LayoutError(f"expected {e.name}, found {module}.{param}")
        if not isinstance(tensor, torch.Tensor):
            raise LayoutError(f"{e.name} is a {type(tensor).__name__}, not a tensor")
        if dtype_name(tensor.dtype) != e.dtype or tuple(tensor.shape) != e.shape:
            raise LayoutError(
                f"{e.name}: {dtype_name(tensor.dtype)}{list(tensor.shape)} does not match the layout's "
                f"{e.dtype}{list(e.shape)}"
            )


def as_byte_tensor(buffer: Any) -> torch.Tensor:
    """A 1-D uint8 tensor over ``buffer`` (tensor, mmap, bytearray, memoryview) without copying."""
    if isinstance(buffer, torch.Tensor):
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise LayoutError("a flat buffer tensor must be 1-D contiguous uint8")
        return buffer
    with warnings.catch_warnings():
        # Read-only mappings are fine: readers never write through these views.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.frombuffer(buffer, dtype=torch.uint8)


def views_of(buffer: Any, layout: WeightLayout) -> dict[str, dict[str, torch.Tensor]]:
    """``{module: {param: view}}`` into ``buffer`` (at least ``layout.total_bytes`` long); no copy."""
    flat = as_byte_tensor(buffer)
    if flat.numel() < layout.total_bytes:
        raise LayoutError(
            f"buffer holds {flat.numel()} bytes, layout {layout.digest} needs {layout.total_bytes}"
        )
    out: dict[str, dict[str, torch.Tensor]] = {}
    for e in layout.entries:
        raw = flat[e.offset : e.offset + e.nbytes]
        out.setdefault(e.module, {})[e.param] = raw.view(e.torch_dtype).view(e.shape)
    return out


Destinations = list[tuple[torch.Tensor, np.ndarray]]


def destinations_of(buffer: Any, layout: WeightLayout) -> Destinations:
    """Per entry, in layout order: (typed view, raw byte view) of its place in ``buffer``."""
    flat = as_byte_tensor(buffer)
    views = views_of(flat, layout)
    raw = flat.numpy()
    return [(views[e.module][e.param], raw[e.offset : e.offset + e.nbytes]) for e in layout.entries]


def pack_into_(
    buffer: Any, state_dict: StateDict, layout: WeightLayout, *, destinations: Destinations | None = None
) -> None:
    """Copy every tensor of ``state_dict`` into ``buffer`` at its offset (one copy per tensor).

    ``destinations`` (from :func:`destinations_of` on the same buffer and layout) skips
    rebuilding the views; the state dict must then be the one the layout was made from.
    """
    if destinations is None:
        if buffer is None:
            raise ValueError("pack_into_ needs a buffer or its destinations")
        check_matches(state_dict, layout)
        destinations = destinations_of(buffer, layout)
    tensors = (tensor for params in state_dict.values() for tensor in params.values())
    for (dst, dst_bytes), tensor in zip(destinations, tensors, strict=True):
        copy_tensor_into_slot(dst, tensor, dst_bytes)
