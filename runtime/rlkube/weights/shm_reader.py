"""Readers of a shared-memory weight buffer: pin the newest READY slot and view it without copying.

I/O (mmap, flock). See :mod:`rlkube.weights.shm` for why a pinned snapshot is never torn and
:mod:`rlkube.weights.shm_files` for the directory's files.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rlkube._proto import policy_group_pb2 as pb
from rlkube.weight_key import WeightKey
from rlkube.weights.copies import buffer_checksum
from rlkube.weights.errors import IntegrityError
from rlkube.weights.layout import WeightLayout, as_byte_tensor, views_of
from rlkube.weights.locks import FileLock, LockTimeout
from rlkube.weights.shm_files import (
    HEADER,
    attach,
    detach,
    layout_path,
    notify_socket_path,
    pin_path,
    prefault,
    slot_path,
)
from rlkube.weights.shm_header import (
    HEADER_BYTES,
    Header,
    HeaderError,
    SlotMeta,
    SlotState,
    check_header,
    read_header,
    read_seq,
    read_slot,
)

__all__ = ["ShmReader", "Snapshot", "notify_socket_path"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- reader
@dataclass(eq=False)
class Snapshot:
    """A pinned READY slot: ``views`` stay valid and unchanged until :meth:`release`."""

    slot: int
    meta: SlotMeta
    layout: WeightLayout
    views: dict[str, dict[str, torch.Tensor]]
    buffer: torch.Tensor  # uint8 over the slot's bytes (read-only)
    _pin: FileLock = field(repr=False)

    @property
    def version(self) -> int:
        return self.meta.version

    @property
    def incarnation(self) -> str:
        return self.meta.incarnation

    @property
    def key(self) -> WeightKey:
        return self.meta.key

    def release(self) -> None:
        self._pin.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ShmReader:
    """Reads the newest READY snapshot of a buffer directory (any number per process or node)."""

    def __init__(self, directory: Path | str, *, verify: bool = False, remove_on_close: bool = True) -> None:
        self.directory = Path(directory)
        self.verify = verify
        self.remove_on_close = remove_on_close
        self._attach: FileLock | None = None
        self._header: tuple[int, mmap.mmap] | None = None  # (inode, mapping)
        self._maps: dict[int, tuple[int, mmap.mmap]] = {}  # slot -> (file_gen, mapping)
        self._layouts: dict[str, WeightLayout] = {}
        self._views: dict[tuple[int, int, str], dict[str, dict[str, torch.Tensor]]] = {}

    def open(self) -> ShmReader:
        self._attach = attach(self.directory)
        return self

    def close(self) -> None:
        if self._attach is None:
            return
        self._views.clear()
        self._maps.clear()
        self._header = None
        detach(self._attach, self.directory, remove=self.remove_on_close)
        self._attach = None

    def __enter__(self) -> ShmReader:
        return self.open() if self._attach is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _header_map(self) -> mmap.mmap | None:
        path = self.directory / HEADER
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            return None
        if self._header is not None and self._header[0] == inode:
            return self._header[1]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            if os.fstat(fd).st_size < HEADER_BYTES:
                return None  # a writer is creating it
            mm = mmap.mmap(fd, HEADER_BYTES, access=mmap.ACCESS_READ)
            self._header = (os.fstat(fd).st_ino, mm)
        finally:
            os.close(fd)
        return mm

    def seq(self) -> int | None:
        """The publish counter (None before any writer made the header): cheap change detection."""
        mm = self._header_map()
        if mm is None:
            return None
        try:
            check_header(mm)
        except HeaderError:
            return None
        return read_seq(mm)

    def peek(self) -> Header | None:
        """The header as it is now (unpinned: advisory only)."""
        mm = self._header_map()
        if mm is None:
            return None
        try:
            return read_header(mm)
        except HeaderError:
            return None

    def acquire(self, *, newer_than: WeightKey | None = None, timeout: float = 5.0) -> Snapshot | None:
        """Pin and return the newest snapshot, or None if there is none or it is ``newer_than`` itself."""
        deadline = time.monotonic() + timeout
        delay = 0.0001
        while True:
            mm = self._header_map()
            header = self.peek() if mm is not None else None
            if header is None or header.latest < 0:
                return None
            index = header.latest
            if header.slots[index].key == newer_than:
                return None
            pin = FileLock(pin_path(self.directory, index))
            # same_file: a writer that reclaimed the slot from a hung reader replaced the pin file.
            if pin.try_acquire(fcntl.LOCK_SH) and pin.same_file():
                assert mm is not None
                meta = read_slot(mm, index)
                if meta.state == SlotState.READY and read_header(mm).latest == index:
                    if meta.key == newer_than:
                        pin.close()
                        return None
                    try:
                        return self._snapshot(index, meta, pin)
                    except BaseException:
                        pin.close()
                        raise
            pin.close()
            if time.monotonic() > deadline:
                raise LockTimeout(f"{self.directory}: could not pin the newest slot within {timeout:.1f}s")
            time.sleep(delay)
            delay = min(delay * 2, 0.005)

    def _snapshot(self, index: int, meta: SlotMeta, pin: FileLock) -> Snapshot:
        mm = self._slot_map(index, meta)
        layout = self._layout(meta.digest)
        if meta.length != layout.total_bytes:
            raise IntegrityError(
                f"slot {index} holds {meta.length} bytes but layout {meta.digest} needs {layout.total_bytes}"
            )
        key = (index, meta.file_gen, meta.digest)
        views = self._views.get(key)
        if views is None:
            for stale in [k for k in self._views if k[0] == index]:
                del self._views[stale]
            views = self._views[key] = views_of(mm, layout)
        data = memoryview(mm)[: meta.length]
        if self.verify:
            self._verify(index, meta, data)
        return Snapshot(index, meta, layout, views, as_byte_tensor(mm)[: meta.length], pin)

    def _verify(self, index: int, meta: SlotMeta, data: memoryview) -> None:
        """Check the slot's bytes against its recorded checksum (waiting briefly if it is pending)."""
        computed = buffer_checksum(data, meta.chunk_bytes) if meta.chunk_bytes else None
        recorded = meta.checksum
        deadline = time.monotonic() + 2.0
        mm = self._header_map()
        while recorded == 0 and mm is not None and time.monotonic() < deadline:
            time.sleep(0.001)
            first, second = read_slot(mm, index).checksum, read_slot(mm, index).checksum
            recorded = first if first == second else 0
        if recorded == 0 or computed is None:
            logger.debug("slot %d version %d: checksum still pending, not verified", index, meta.version)
        elif computed != recorded:
            raise IntegrityError(f"slot {index} (version {meta.version}) does not match its checksum")

    def _slot_map(self, index: int, meta: SlotMeta) -> mmap.mmap:
        cached = self._maps.get(index)
        if cached is not None and cached[0] == meta.file_gen:
            return cached[1]
        fd = os.open(slot_path(self.directory, index), os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size < meta.capacity or size < meta.length:
                raise IntegrityError(f"slot file {index} has {size} bytes, its record says {meta.capacity}")
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        prefault(mm, write=False)
        self._maps[index] = (meta.file_gen, mm)
        return mm

    def _layout(self, digest: str) -> WeightLayout:
        layout = self._layouts.get(digest)
        if layout is None:
            msg = pb.WeightLayout.FromString(layout_path(self.directory, digest).read_bytes())
            layout = self._layouts[digest] = WeightLayout.from_proto(msg)
            if layout.digest != digest:
                raise IntegrityError(f"layout file {digest} describes layout {layout.digest}")
        return layout
