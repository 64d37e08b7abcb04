"""Every byte copy and every checksum pass on the weight plane's hot path, one named function each.

Reading this module is how to count the copies a version costs end to end:

========================  ==========================================  =====================
function                  where                                       copies per version
========================  ==========================================  =====================
copy_device_into_slot     trainer, GPU, slot page-locked: device ->   1 (per tensor), side stream
                          the shm slot itself (one DMA)
copy_device_into_staging  trainer, GPU, no page-locked slot: device ->  1 (per tensor), side stream
                          pinned host buffer (then copy_tensor_into_slot)
copy_tensor_into_slot     trainer: state dict -> its node's shm slot  1 (per tensor), 0 resident
copy_piece_into_slot      the same, streaming: per tensor and chunk   (instead of the row above)
copy_resident_into_slot   trainer, after the flip: slot -> next slot  1, off the critical path
copy_slot_into_message    weight server: slot -> gRPC message         1 per fetching node
copy_message_into_slot    node receiver: gRPC message -> slot         1 per node
send_slot_to_socket       weight data port: slot -> socket (kernel)   1 per fetching node
receive_socket_into_slot  node receiver: socket -> slot (kernel)      1 per node
copy_slot_into_shadow     eval, copy mode only (accelerators): slot   1 per eval policy
                          -> device (one DMA when page-locked)
copy_buffer_into_params   eval, strategy None only                    1 per eval policy
========================  ==========================================  =====================

Eval policies in view mode copy nothing: their parameters become views of the slot. A
trainer whose tensors are *resident* (they are views of the slot being written, see
:mod:`rlkube.weights.resident`) copies nothing before the flip either: :func:`in_place` tells
the two copies above that the source already is the destination, and they return at once.
(gRPC itself copies once more on each side, between its slices and Python ``bytes``; the raw
gRPC stream in ``rlkube bench weights`` pays the same. The weight data port replaces the two
gRPC rows with the two socket rows: the kernel copies between the slot and its socket buffers,
and nothing is copied in user space.) ``checksum_*`` are full passes over
the bytes, not copies, and are counted the same way.

Counters are per process; :data:`COPIES` is read by tests and the benchmark.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import torch
import xxhash


class CopyCounter:
    """Bytes and calls per named copy, per process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def add(self, name: str, nbytes: int) -> None:
        with self._lock:
            self.bytes[name] += nbytes
            self.calls[name] += 1

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """``name -> (calls, bytes)``."""
        with self._lock:
            return {k: (self.calls[k], self.bytes[k]) for k in self.calls}

    def reset(self) -> None:
        with self._lock:
            self.bytes.clear()
            self.calls.clear()


COPIES = CopyCounter()


def _raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    return tensor.reshape(-1).view(torch.uint8).numpy()


def in_place(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether ``src`` already is ``dst``'s memory (a resident tensor): nothing to copy."""
    return (
        src.numel() > 0
        and src.device == dst.device
        and src.dtype == dst.dtype
        and src.shape == dst.shape
        and src.data_ptr() == dst.data_ptr()
        and src.is_contiguous()
        and not (src.is_conj() or src.is_neg())
    )


def copy_tensor_into_slot(dst: torch.Tensor, src: torch.Tensor, dst_bytes: np.ndarray | None = None) -> None:
    """Trainer: one parameter (any device) into its place ``dst`` in the shm slot.

    CPU tensors are copied as raw bytes by numpy (into ``dst_bytes``, the same memory as
    ``dst``, when the caller has it): one thread, GIL released. torch's own copy fans out
    over its intra-op threads, which on a shared, busy machine ran 5-7x slower (threads
    waiting on each other) than a plain memcpy.
    """
    src = src.detach()
    if in_place(dst, src):
        return
    if src.device.type == "cpu" and src.is_contiguous() and not (src.is_conj() or src.is_neg()):
        np.copyto(_raw_bytes(dst) if dst_bytes is None else dst_bytes, _raw_bytes(src))
    else:
        dst.copy_(src)
    COPIES.add("copy_tensor_into_slot", dst.numel() * dst.element_size())


def copy_piece_into_slot(dst_bytes: np.ndarray, src: torch.Tensor, start: int, stop: int) -> None:
    """Trainer, streaming while packing: bytes ``[start, stop)`` of one parameter into their place.

    The same one copy as :func:`copy_tensor_into_slot`, cut on the chunk grid so that chunk k
    can be hashed and served before the rest is packed.
    """
    src = src.detach()
    if (
        src.device.type == "cpu"
        and src.is_contiguous()
        and src.data_ptr() + start == dst_bytes.ctypes.data
        and not (src.is_conj() or src.is_neg())
    ):
        return  # resident: these bytes already are the slot's
    if src.device.type == "cpu" and src.is_contiguous() and not (src.is_conj() or src.is_neg()):
        np.copyto(dst_bytes, _raw_bytes(src)[start:stop])
    else:
        torch.from_numpy(dst_bytes).copy_(
            src.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)[start:stop]
        )
    COPIES.add("copy_piece_into_slot", stop - start)


def copy_device_into_staging(dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool) -> None:
    """Trainer, parameters on an accelerator: one tensor into its place in the pinned staging buffer.

    With ``non_blocking`` (CUDA, pinned ``dst``) the copy is queued on the caller's stream and
    returns at once; :class:`rlkube.weights.staging.PinnedStaging` waits for it.
    """
    dst.copy_(src.detach(), non_blocking=non_blocking)
    COPIES.add("copy_device_into_staging", dst.numel() * dst.element_size())


def copy_device_into_slot(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Trainer, parameters on a GPU, slot page-locked (:mod:`rlkube.weights.cuda_host`): one tensor
    straight into its place in the slot, queued on the caller's stream (one DMA, no staging)."""
    dst.copy_(src.detach(), non_blocking=True)
    COPIES.add("copy_device_into_slot", dst.numel() * dst.element_size())


def copy_resident_into_slot(dst_bytes: np.ndarray, src: torch.Tensor) -> None:
    """Trainer, after a zero-copy flip: one resident tensor into its place in the next slot.

    Runs while rollouts run (see :mod:`rlkube.weights.resident`), never between "train step
    done" and "local readers have it". ``src`` is a contiguous CPU view of the committed slot.
    """
    np.copyto(dst_bytes, _raw_bytes(src.detach()))
    COPIES.add("copy_resident_into_slot", dst_bytes.nbytes)


def copy_slot_into_message(prefix: bytes, data: memoryview, suffix: bytes) -> bytes:
    """Weight server: a chunk of a slot, framed as one protobuf message (one copy)."""
    message = b"".join((prefix, data, suffix))
    COPIES.add("copy_slot_into_message", len(data))
    return message


def send_slot_to_socket(sock: Any, data: memoryview) -> None:
    """Weight data port: a chunk of a slot written to a socket (the kernel's copy; none in Python)."""
    sock.sendall(data)
    COPIES.add("send_slot_to_socket", len(data))


def recv_exactly_into(sock: Any, dst: memoryview, *, deadline: float) -> None:
    """Exactly ``len(dst)`` bytes from a socket into ``dst`` (``recv_into``, no copy of our own).

    Raises ``ConnectionError`` if the peer closes first and ``TimeoutError`` past ``deadline``
    (``time.monotonic()``). Not counted: the weight data port's frame heads and requests use it
    as is; a chunk's bytes go through :func:`receive_socket_into_slot`.
    """
    got, n = 0, len(dst)
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out with {got} of {n} bytes received")
        sock.settimeout(left)
        read = sock.recv_into(dst[got:], n - got)
        if read == 0:
            raise ConnectionError(f"the connection closed after {got} of {n} bytes")
        got += read


def receive_socket_into_slot(sock: Any, dst: memoryview, *, deadline: float) -> None:
    """Node receiver: a chunk's bytes from a socket straight into the slot (see recv_exactly_into)."""
    recv_exactly_into(sock, dst, deadline=deadline)
    COPIES.add("receive_socket_into_slot", len(dst))


def copy_message_into_slot(dst: np.ndarray, data: memoryview) -> None:
    """Node receiver: a chunk's bytes into the inactive slot (numpy releases the GIL for the copy)."""
    np.copyto(dst, np.frombuffer(data, dtype=np.uint8))
    COPIES.add("copy_message_into_slot", len(data))


def copy_slot_into_shadow(dst: torch.Tensor, src: torch.Tensor, *, non_blocking: bool = False) -> None:
    """Eval, copy mode: a whole slot into a shadow buffer on the model's device.

    ``non_blocking`` only where the slot is page-locked (the caller waits on its stream).
    """
    dst.copy_(src, non_blocking=non_blocking)
    COPIES.add("copy_slot_into_shadow", src.numel())


def copy_buffer_into_params(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Eval, strategy None: one tensor from the private receive buffer into the live parameter."""
    dst.copy_(src)
    COPIES.add("copy_buffer_into_params", src.numel() * src.element_size())


def checksum(data: Any) -> int:
    """xxh3-64 of a bytes-like object (one pass; releases the GIL)."""
    nbytes = memoryview(data).nbytes
    COPIES.add("checksum", nbytes)
    return xxhash.xxh3_64_intdigest(data)


def chunk_digests(data: Any, chunk_bytes: int) -> list[int]:
    """xxh3-64 of each consecutive ``chunk_bytes`` piece of ``data`` (one pass)."""
    view = memoryview(data).cast("B")
    COPIES.add("checksum", view.nbytes)
    return [xxhash.xxh3_64_intdigest(view[o : o + chunk_bytes]) for o in range(0, view.nbytes, chunk_bytes)]


def hash_list_root(digests: list[int]) -> int:
    """The whole-buffer checksum: xxh3-64 of the chunk digests as little-endian u64 (no pass over bytes)."""
    return xxhash.xxh3_64_intdigest(np.asarray(digests, dtype="<u8").tobytes())


def buffer_checksum(data: Any, chunk_bytes: int) -> int:
    """The hash-list root of ``data`` on a ``chunk_bytes`` grid (what WeightVersion.checksum holds)."""
    return hash_list_root(chunk_digests(data, chunk_bytes))
