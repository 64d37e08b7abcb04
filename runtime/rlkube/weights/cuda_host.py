"""Shm slot mappings page-locked for CUDA (``cudaHostRegister``): the slot itself is the DMA target.

I/O (CUDA's runtime). A copy between a GPU and pageable memory runs through the driver's own
pinned bounce buffers (~10 GB/s on an H200 host); between a GPU and page-locked memory the copy
engines move it directly (~55 GB/s). Registering a slot's mapping makes it page-locked in place,
so a GPU trainer publishes with one device -> slot copy, and a GPU eval policy loads with one
slot -> device copy, with no staging buffer in between; other processes mapping the same file
see the bytes as usual (registration pins pages, it does not move them).

One :class:`HostRegistrations` per process side (the writer's mappings, or a reader's) keeps one
registration per slot. A slot whose mapping changes (a grown or reclaimed slot file) is
unregistered first; the registry holds a reference to each registered mapping, so the kernel
cannot unmap it before ``cudaHostUnregister`` ran. Registration failing (no CUDA, a kernel or
container limit on locked memory) is logged once per process, the thread's CUDA error is reset
(torch would otherwise raise it at the next kernel launch), and the caller copies the slow way.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)

#: cudaHostRegisterPortable: page-locked for every CUDA context of the process, not only the current one.
REGISTER_PORTABLE = 0x01
#: cudaHostRegisterReadOnly: the device only reads it (a reader's mapping is PROT_READ).
REGISTER_READ_ONLY = 0x08


class CudaRuntime(Protocol):
    """The two calls of CUDA's runtime API used here (``torch.cuda.cudart()`` has them)."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> Any: ...

    def cudaHostUnregister(self, ptr: int) -> Any: ...


@dataclass(frozen=True)
class _Registration:
    ptr: int
    size: int
    keep: Any  # the mapping's memory: it must outlive the registration


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(message: str) -> None:
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.warning("%s", message)


class HostRegistrations:
    """One ``cudaHostRegister`` per slot mapping (see the module docstring)."""

    def __init__(self, *, read_only: bool, runtime: CudaRuntime | None = None) -> None:
        self.flags = REGISTER_PORTABLE | (REGISTER_READ_ONLY if read_only else 0)
        self._runtime = runtime
        self._by_slot: dict[int, _Registration] = {}
        self._lock = threading.Lock()
        #: Why registering is off in this process (None while it works or was not tried).
        self.disabled: str | None = None

    def ensure(self, slot: int, region: torch.Tensor) -> bool:
        """Whether ``region`` (a CPU tensor over slot ``slot``'s whole mapping) is page-locked now.

        Registers it on first sight (and unregisters the slot's previous mapping); False when
        registration is unavailable, after one warning per process.
        """
        storage = region.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        with self._lock:
            current = self._by_slot.get(slot)
            if current is not None and current.ptr == ptr and current.size == size:
                return True
            if self.disabled is not None:
                return False
            if current is not None:
                self._unregister(self._by_slot.pop(slot))
            runtime = self._cudart()
            if runtime is None:
                return False
            error = int(runtime.cudaHostRegister(ptr, size, self.flags))
            if error != 0:
                _clear_last_error(runtime)
                self.disabled = f"cudaHostRegister of a {size}-byte shm slot failed with cudaError {error}"
                _warn_once(
                    f"{self.disabled}: GPU copies to and from shm slots go through pageable memory "
                    "(slower; check the memlock limit: ulimit -l)"
                )
                return False
            self._by_slot[slot] = _Registration(ptr, size, region)
            logger.debug("registered slot %d (%d bytes at %#x) with CUDA", slot, size, ptr)
            return True

    def registered(self) -> int:
        """How many slot mappings are page-locked now."""
        with self._lock:
            return len(self._by_slot)

    def close(self) -> None:
        """Unregister every mapping (before the mappings may go)."""
        with self._lock:
            while self._by_slot:
                self._unregister(self._by_slot.popitem()[1])

    def _unregister(self, registration: _Registration) -> None:
        runtime = self._cudart()
        if runtime is None:
            return
        error = int(runtime.cudaHostUnregister(registration.ptr))
        if error != 0:
            _clear_last_error(runtime)
            _warn_once(
                f"cudaHostUnregister of a {registration.size}-byte shm slot failed with cudaError {error}"
            )

    def _cudart(self) -> CudaRuntime | None:
        if self._runtime is None:
            try:
                self._runtime = torch.cuda.cudart()
            except (AssertionError, RuntimeError, AttributeError) as exc:  # no CUDA build, no device
                self.disabled = f"CUDA's runtime is unavailable ({exc})"
                _warn_once(f"{self.disabled}: GPU copies to and from shm slots go through pageable memory")
                return None
        return self._runtime


def _clear_last_error(runtime: Any) -> None:
    """Reset this thread's CUDA error after a refused call (``cudaGetLastError``).

    A refused ``cudaHostRegister`` leaves its error as the thread's last error, and torch checks
    that after every kernel launch: left there, the next kernel would raise it as its own. torch's
    ``cudart()`` does not bind ``cudaGetLastError``, so it is called in the CUDA runtime library
    torch loaded (found in ``/proc/self/maps``).
    """
    clear = getattr(runtime, "cudaGetLastError", None)
    if clear is None:
        library = _loaded_cudart()
        clear = getattr(library, "cudaGetLastError", None) if library is not None else None
    if clear is None:
        _warn_once("cannot reset CUDA's last error after a refused call (no libcudart found)")
        return
    clear()


def _loaded_cudart() -> ctypes.CDLL | None:
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith("libcudart.so"):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None
