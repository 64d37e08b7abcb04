"""TensorDicts on the wire without pickle: a manifest of (key, dtype, shape, offset, nbytes) plus raw bytes.

Pure: no I/O. :func:`encode` copies every leaf tensor once into one payload, each at an offset
aligned to :data:`ALIGNMENT` bytes; :func:`decode` builds tensors that *view* the payload
(``torch.frombuffer``, no copy), so the payload must outlive them. Nested keys are joined with
``/`` (``("next", "observation")`` <-> ``"next/observation"``). Any dtype torch can view as bytes
travels (float32/16, bfloat16, bool, integers, complex); non-tensor leaves are refused.

Tensors decoded from an immutable ``bytes`` payload share read-only memory: treat them as read
only, or pass a ``bytearray`` when the receiver wants to write in place.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_leaf_nontensor, is_non_tensor

#: Offsets are multiples of this (a cache line), so decoded views are aligned for any dtype.
ALIGNMENT = 64
KEY_SEPARATOR = "/"

_DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.complex64,
        torch.complex128,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


#: Bytes per element of every dtype above (computed once: decoding runs per pushed fragment).
_ITEMSIZE: dict[str, int] = {
    name: torch.empty((), dtype=dtype).element_size() for name, dtype in _DTYPES.items()
}


class WireError(ValueError):
    """A TensorDict that cannot be encoded, or a manifest/payload pair that does not fit together."""


#: Limits of a manifest from the wire (checked by :func:`validate_manifest` before any tensor is
#: built): leaves per batch, dimensions per leaf, characters per key, elements per leaf.
MAX_LEAVES = 256
MAX_DIMS = 8
MAX_KEY_CHARS = 256
MAX_ELEMENTS = 1 << 31


@dataclass(frozen=True)
class TensorMeta:
    """Where one leaf tensor lives in the payload."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "nbytes": self.nbytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorMeta:
        return cls(
            key=str(data["key"]),
            dtype=str(data["dtype"]),
            shape=tuple(int(d) for d in data["shape"]),
            offset=int(data["offset"]),
            nbytes=int(data["nbytes"]),
        )


@dataclass(frozen=True)
class Manifest:
    """What a receiver needs besides the bytes: the batch size and one :class:`TensorMeta` per leaf."""

    batch_size: tuple[int, ...]
    tensors: tuple[TensorMeta, ...]
    total_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": list(self.batch_size),
            "tensors": [meta.to_dict() for meta in self.tensors],
            "total_bytes": self.total_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        return cls(
            batch_size=tuple(int(d) for d in data["batch_size"]),
            tensors=tuple(TensorMeta.from_dict(item) for item in data["tensors"]),
            total_bytes=int(data["total_bytes"]),
        )


@dataclass(frozen=True)
class Received:
    """The wire form a TensorDict was decoded from: its tensors view ``payload``. Whoever must write
    ``data`` out again (rank 0's journal) writes these bytes instead of encoding it anew; valid only
    for that very TensorDict (:meth:`of`)."""

    manifest: Manifest
    payload: bytes | bytearray | memoryview
    data: TensorDictBase

    def of(self, data: TensorDictBase) -> bool:
        """Whether this is ``data``'s wire form (the same object, not a copy or a replacement)."""
        return data is self.data


def _align(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _dtype_name(dtype: torch.dtype, key: str) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise WireError(f"{key}: dtype {name} cannot be sent (supported: {', '.join(sorted(_DTYPES))})")
    return name


def _leaves(td: TensorDictBase) -> Iterable[tuple[str, torch.Tensor]]:
    for key in td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor):
        parts = (key,) if isinstance(key, str) else tuple(key)
        for part in parts:
            if KEY_SEPARATOR in part:
                raise WireError(f"key {parts!r}: names may not contain {KEY_SEPARATOR!r}")
        name = KEY_SEPARATOR.join(parts)
        value = td.get(key)
        if not isinstance(value, torch.Tensor) or is_non_tensor(value):
            raise WireError(f"{name}: only tensors travel, got {type(value).__name__}")
        yield name, value


def plan(td: TensorDictBase) -> Manifest:
    """The manifest :func:`encode` would produce, without copying anything."""
    metas: list[TensorMeta] = []
    offset = 0
    for key, tensor in _leaves(td):
        nbytes = tensor.numel() * tensor.element_size()
        offset = _align(offset)
        metas.append(TensorMeta(key, _dtype_name(tensor.dtype, key), tuple(tensor.shape), offset, nbytes))
        offset += nbytes
    return Manifest(batch_size=tuple(td.batch_size), tensors=tuple(metas), total_bytes=offset)


def encode(td: TensorDictBase) -> tuple[Manifest, bytearray]:
    """Copy every leaf of ``td`` into one payload; returns the manifest and the payload."""
    manifest = plan(td)
    payload = bytearray(manifest.total_bytes)
    if manifest.total_bytes:
        out = torch.frombuffer(payload, dtype=torch.uint8)
        for meta in manifest.tensors:
            if meta.nbytes:
                tensor = td.get(tuple(meta.key.split(KEY_SEPARATOR)))
                flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                out[meta.offset : meta.offset + meta.nbytes].copy_(flat)
    return manifest, payload


def payload_pieces(td: TensorDictBase, manifest: Manifest) -> list[memoryview | bytes]:
    """The payload :func:`encode` would build, as buffers in order (leaves and alignment padding).

    Nothing is copied: the pieces view ``td``'s tensors (moved to the CPU and made contiguous
    where they were not), so whoever joins them makes the one copy. ``manifest``: :func:`plan`'s.
    """
    pieces: list[memoryview | bytes] = []
    written = 0
    for meta in manifest.tensors:
        if not meta.nbytes:
            continue
        if meta.offset > written:
            pieces.append(bytes(meta.offset - written))
        tensor = td.get(tuple(meta.key.split(KEY_SEPARATOR)))
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        pieces.append(memoryview(flat.numpy()))
        written = meta.offset + meta.nbytes
    if manifest.total_bytes > written:  # an empty leaf's alignment at the end
        pieces.append(bytes(manifest.total_bytes - written))
    return pieces


def validate_manifest(manifest: Manifest, payload_size: int) -> None:
    """Refuse a manifest from the wire that cannot describe ``payload_size`` bytes; WireError names why.

    Checked: the number of leaves, key names (length, printable, unique, no empty part), known
    dtypes, dimensions (count, none negative), every leaf's shape starting with the batch size,
    its byte count matching its shape and dtype, and its bytes lying inside the payload.
    """
    batch = manifest.batch_size
    if len(batch) > MAX_DIMS or any(d < 0 for d in batch):
        raise WireError(f"batch size {batch}: at most {MAX_DIMS} dimensions, none negative")
    if len(manifest.tensors) > MAX_LEAVES:
        raise WireError(f"{len(manifest.tensors)} tensors: at most {MAX_LEAVES} travel in one batch")
    seen: set[str] = set()
    for meta in manifest.tensors:
        key = meta.key
        if not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
            raise WireError(f"key {key[:64]!r}: 1 to {MAX_KEY_CHARS} printable characters")
        if any(not part for part in key.split(KEY_SEPARATOR)) or key in seen:
            raise WireError(f"key {key!r}: empty part or repeated")
        seen.add(key)
        dtype = _DTYPES.get(meta.dtype)
        if dtype is None:
            raise WireError(f"{key}: unknown dtype {meta.dtype[:32]!r}")
        shape = meta.shape
        if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
            raise WireError(f"{key}: shape {shape}: at most {MAX_DIMS} dimensions, none negative")
        if tuple(shape[: len(batch)]) != tuple(batch):
            raise WireError(f"{key}: shape {shape} does not start with the batch size {batch}")
        count = 1
        for dim in shape:
            count *= dim
        if count > MAX_ELEMENTS:
            raise WireError(f"{key}: {count} elements; at most {MAX_ELEMENTS}")
        itemsize = _ITEMSIZE[meta.dtype]
        if count * itemsize != meta.nbytes or meta.offset < 0 or meta.offset + meta.nbytes > payload_size:
            raise WireError(
                f"{key}: shape {shape} of {meta.dtype} is {count * itemsize} bytes, "
                f"manifest says {meta.nbytes} at offset {meta.offset} (payload {payload_size} bytes)"
            )
        if count and meta.offset % itemsize:
            raise WireError(f"{key}: offset {meta.offset} is not aligned to its {itemsize}-byte items")


def decode(manifest: Manifest, payload: bytes | bytearray | memoryview) -> TensorDict:
    """Rebuild the TensorDict; its tensors view ``payload`` (zero copy). See :func:`validate_manifest`."""
    size = memoryview(payload).nbytes
    if size < manifest.total_bytes:
        raise WireError(f"payload has {size} bytes, the manifest needs {manifest.total_bytes}")
    validate_manifest(manifest, size)
    with warnings.catch_warnings():
        if memoryview(payload).readonly:  # views of received bytes; the module docstring says so
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
        leaves = _views(manifest, payload, size)
    return TensorDict(leaves, batch_size=manifest.batch_size)


def _views(manifest: Manifest, payload: bytes | bytearray | memoryview, size: int) -> dict[str, Any]:
    """Every leaf as a tensor viewing ``payload``, nested by key part."""
    leaves: dict[str, Any] = {}
    for meta in manifest.tensors:
        dtype = _DTYPES.get(meta.dtype)
        if dtype is None:
            raise WireError(f"{meta.key}: unknown dtype {meta.dtype!r}")
        count = 1
        for dim in meta.shape:
            count *= dim
        itemsize = _ITEMSIZE[meta.dtype]
        if count * itemsize != meta.nbytes or meta.offset + meta.nbytes > size:
            raise WireError(
                f"{meta.key}: shape {meta.shape} of {meta.dtype} is {count * itemsize} bytes, "
                f"manifest says {meta.nbytes} at offset {meta.offset} (payload {size} bytes)"
            )
        if count == 0:
            tensor = torch.empty(meta.shape, dtype=dtype)
        else:
            tensor = torch.frombuffer(payload, dtype=dtype, count=count, offset=meta.offset)
        *parents, name = meta.key.split(KEY_SEPARATOR)
        node = leaves
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise WireError(f"{meta.key}: {part} is both a tensor and a group of tensors")
            node = child
        if name in node:
            raise WireError(f"{meta.key}: {name} is both a tensor and a group of tensors")
        node[name] = tensor.view(meta.shape)
    return leaves
