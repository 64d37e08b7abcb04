"""A two-slot weight buffer in a shared-memory directory: the one writer (readers: ``shm_reader``).

I/O (files, mmap, flock, unix datagrams); the directory's files are listed in
:mod:`rlkube.weights.shm_files`.

Why a snapshot is never torn or mixed: the writer only writes the slot that is *not* latest,
and only while it holds that slot's pin exclusively; a reader pins a slot, then re-reads its
record and accepts it only if it is READY and still latest. While the pin is held nobody can
write the slot, so its bytes and record are stable: readers can use zero-copy views of it for
as long as they hold the pin. Locks are granted and dropped by the kernel (also when a process
dies), so there is no memory-ordering subtlety and no lock left behind by SIGKILL.

A writer killed mid-write leaves a WRITING slot that is not latest: readers keep the previous
version and the next writer marks the slot EMPTY and reuses it.

A reader that holds a pin past ``slot_wait_timeout`` (its process hung: SIGSTOP, a stuck GIL, a
dead NFS mount) loses the slot: the writer **reclaims** it by replacing the slot's files, never
its bytes. It creates a new pin file (locked exclusively before it is renamed into place) and a
new slot file (a new ``file_gen``) and writes the version there; the hung reader keeps its pin
on the old, unlinked pin file and its mapping of the old, unlinked slot file, whose bytes nobody
writes again, so its zero-copy views stay valid and unchanged (a consistent, older version)
until it lets go. The kernel frees those pages when the last mapping goes (the reader moves to a
newer version, or dies). Readers check, after pinning, that the pin file they locked is still the
one the path names (``FileLock.same_file``), so nobody pins a reclaimed slot by its old file.
``on_busy="raise"`` restores the old behaviour (:class:`SlotBusyError`) for callers that want it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from rlkube.weight_key import WeightKey
from rlkube.weights.errors import ShmError, SlotBusyError, WriterBusyError
from rlkube.weights.layout import WeightLayout
from rlkube.weights.locks import FileLock, LockTimeout, describe_pids, lock_holders
from rlkube.weights.shm_files import (
    HEADER,
    NOTIFY_PREFIX,
    WRITER_LOCK,
    attach,
    detach,
    layout_path,
    pin_path,
    prefault,
    slot_path,
)
from rlkube.weights.shm_header import (
    HEADER_BYTES,
    NUM_SLOTS,
    Header,
    HeaderError,
    SlotMeta,
    SlotState,
    bump_seq,
    check_header,
    init_header,
    read_header,
    read_slot,
    write_checksum,
    write_latest,
    write_slot,
    write_writer,
)

logger = logging.getLogger(__name__)

_SLOT_ROUNDING = 2 << 20  # slot files grow in 2 MiB steps


# --------------------------------------------------------------------------- writer
@dataclass
class _Mapping:
    file_gen: int
    capacity: int
    mm: mmap.mmap
    array: np.ndarray  # uint8 over the whole file


@dataclass(eq=False)
class SlotLease:
    """A slot the writer is filling: write ``array`` (or ``tensor``), then commit or abort."""

    index: int
    version: int
    incarnation: str
    layout: WeightLayout
    array: np.ndarray  # uint8, exactly layout.total_bytes long, writable

    @property
    def tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.array)


@dataclass(eq=False)
class PinnedSlot:
    """A READY slot pinned for reading inside the writer's process (the weight server uses it)."""

    meta: SlotMeta
    data: memoryview
    _pin: FileLock
    _wanted: threading.Event

    @property
    def superseded(self) -> bool:
        """The writer wants this slot for a newer version: readers of it should let go soon."""
        return self._wanted.is_set()

    def release(self) -> None:
        self.data = memoryview(b"")
        self._pin.close()


class ShmWriter:
    """The one writer of a buffer directory. ``open()`` elects it (or raises WriterBusyError)."""

    def __init__(
        self,
        directory: Path | str,
        *,
        slot_wait_timeout: float = 30.0,
        remove_on_close: bool = True,
        on_busy: Literal["reclaim", "raise"] = "reclaim",
    ) -> None:
        self.directory = Path(directory)
        #: Seconds a reader may keep the slot the writer needs pinned before it loses it.
        self.slot_wait_timeout = slot_wait_timeout
        self.remove_on_close = remove_on_close
        self.on_busy = on_busy
        #: Slots taken from readers that held their pin past ``slot_wait_timeout``.
        self.reclaimed = 0
        self._attach: FileLock | None = None
        self._writer_lock: FileLock | None = None
        self._header_mm: mmap.mmap | None = None
        self._maps: list[_Mapping | None] = [None] * NUM_SLOTS
        self._pins = [FileLock(pin_path(self.directory, i)) for i in range(NUM_SLOTS)]
        self._wanted = [threading.Event() for _ in range(NUM_SLOTS)]
        self._lock = threading.Lock()  # begin/commit/abort from one thread at a time
        self._notify_sock: socket.socket | None = None
        self.token = secrets.token_bytes(16)

    # -- life cycle
    def try_open(self) -> bool:
        """Become the writer if nobody is; False (and nothing held) if another process is."""
        try:
            self.open()
        except WriterBusyError:
            return False
        return True

    def open(self) -> ShmWriter:
        self._attach = attach(self.directory)
        lock = FileLock(self.directory / WRITER_LOCK)
        if not lock.try_acquire(fcntl.LOCK_EX):
            holders = lock_holders(lock.path)
            lock.close()
            detach(self._attach, self.directory, remove=False)
            self._attach = None
            raise WriterBusyError(f"{self.directory} already has a writer: {describe_pids(holders)}")
        self._writer_lock = lock
        self._header_mm = self._open_header()
        self._recover()
        write_writer(self._header_mm, os.getpid(), self.token)
        self._notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify_sock.setblocking(False)
        return self

    @property
    def is_open(self) -> bool:
        return self._header_mm is not None

    def close(self) -> None:
        if self._attach is None:
            return
        for pin in self._pins:
            pin.close()
        self._maps = [None] * NUM_SLOTS  # the mmaps close when no view references them
        if self._notify_sock is not None:
            self._notify_sock.close()
        self._header_mm = None
        if self._writer_lock is not None:
            self._writer_lock.close()
        detach(self._attach, self.directory, remove=self.remove_on_close)
        self._attach = None

    def __enter__(self) -> ShmWriter:
        return self.open() if not self.is_open else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_header(self) -> mmap.mmap:
        path = self.directory / HEADER
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size not in (0, HEADER_BYTES):
                logger.warning("%s: header of %d bytes is not ours; replacing the buffer files", path, size)
                os.close(fd)
                for name in os.listdir(self.directory):
                    if name.startswith(("slot-", "layout-")) or name == HEADER:
                        os.unlink(self.directory / name)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                size = 0
            if size == 0:
                os.ftruncate(fd, HEADER_BYTES)
            mm = mmap.mmap(fd, HEADER_BYTES)
        finally:
            os.close(fd)
        try:
            check_header(mm)
        except HeaderError as exc:
            if size:
                logger.warning("%s: %s; starting an empty buffer", path, exc)
            init_header(mm)
        return mm

    def _recover(self) -> None:
        """Make a header left by a dead writer usable: unfinished slots become EMPTY."""
        mm = self._header_mm
        assert mm is not None
        header = read_header(mm)
        for i, meta in enumerate(header.slots):
            path = slot_path(self.directory, i)
            file_ok = path.exists() and path.stat().st_size >= max(meta.capacity, 1)
            ready = (
                meta.state == SlotState.READY
                and file_ok
                and meta.length <= meta.capacity
                and layout_path(self.directory, meta.digest).exists()
            )
            if not ready and meta.state != SlotState.EMPTY:
                logger.info(
                    "%s: slot %d was %s (a writer died); marking it EMPTY", self.directory, i, meta.state.name
                )
            if not ready:
                write_slot(mm, i, SlotMeta(capacity=meta.capacity if file_ok else 0, file_gen=meta.file_gen))
        header = read_header(mm)
        latest = header.latest_slot()
        if latest is None or latest.state != SlotState.READY:
            write_latest(mm, -1)

    # -- reading the header
    def header(self) -> Header:
        assert self._header_mm is not None, "open() first"
        return read_header(self._header_mm)

    def latest(self) -> SlotMeta | None:
        return self.header().latest_slot()

    # -- writing a version
    def begin(self, *, version: int, incarnation: str, layout: WeightLayout) -> SlotLease:
        """Take the slot that is not latest (waiting up to ``slot_wait_timeout`` for readers to leave it)."""
        assert self._header_mm is not None, "open() first"
        self._lock.acquire()
        try:
            header = read_header(self._header_mm)
            index = 0 if header.latest < 0 else 1 - header.latest
            self._wanted[index].set()
            try:
                self._pins[index].acquire(
                    fcntl.LOCK_EX, timeout=self.slot_wait_timeout, what=f"writer waiting for slot {index}"
                )
            except LockTimeout as exc:
                if self.on_busy == "raise":
                    raise SlotBusyError(
                        f"{exc}; readers pin a slot while their models use it (view mode) and move off "
                        "when they load the next version"
                    ) from exc
                self._reclaim(index, header.slots[index], exc)
                header = read_header(self._header_mm)
            finally:
                self._wanted[index].clear()
            try:
                self._write_layout(layout)
                mapping = self._map_slot(index, header.slots[index], layout.total_bytes)
                write_slot(
                    self._header_mm,
                    index,
                    SlotMeta(
                        SlotState.WRITING,
                        version,
                        layout.total_bytes,
                        0,
                        mapping.capacity,
                        mapping.file_gen,
                        0.0,
                        incarnation,
                        layout.digest,
                    ),
                )
            except BaseException:
                self._pins[index].release()
                raise
            return SlotLease(index, version, incarnation, layout, mapping.array[: layout.total_bytes])
        except BaseException:
            self._lock.release()
            raise

    def commit(self, lease: SlotLease, *, checksum: int | None, chunk_bytes: int) -> SlotMeta:
        """Mark the slot READY, make it latest, release it and wake the readers.

        ``checksum`` is the hash-list root on a ``chunk_bytes`` grid (``copies.buffer_checksum``);
        ``None`` records it as pending (0), to be filled in with :meth:`record_checksum`.
        """
        return self._commit(lease, checksum=checksum, chunk_bytes=chunk_bytes, pin=False)[0]

    def commit_pinned(self, lease: SlotLease, *, checksum: int, chunk_bytes: int) -> PinnedSlot:
        """:meth:`commit`, handing the slot over pinned for reading in this process.

        The weight server streams a version while it is packed, from the lease's bytes; this
        pin keeps those bytes for its fetches still running after the commit. It is taken
        before this writer's lock is let go, so no later :meth:`begin` can take the slot back
        in between (only the writer ever pins a slot exclusively).
        """
        pinned = self._commit(lease, checksum=checksum, chunk_bytes=chunk_bytes, pin=True)[1]
        assert pinned is not None
        return pinned

    def _commit(
        self, lease: SlotLease, *, checksum: int | None, chunk_bytes: int, pin: bool
    ) -> tuple[SlotMeta, PinnedSlot | None]:
        mm = self._header_mm
        assert mm is not None
        pinned = None
        try:
            old = read_slot(mm, lease.index)
            meta = SlotMeta(
                SlotState.READY,
                lease.version,
                lease.layout.total_bytes,
                checksum or 0,
                old.capacity,
                old.file_gen,
                time.time(),
                lease.incarnation,
                lease.layout.digest,
                chunk_bytes,
            )
            write_slot(mm, lease.index, meta)
            write_latest(mm, lease.index)
            bump_seq(mm)
            self._pins[lease.index].release()
            if pin:
                shared = FileLock(pin_path(self.directory, lease.index))
                mapping = self._maps[lease.index]
                if mapping is None or not shared.try_acquire(fcntl.LOCK_SH):
                    shared.close()
                    raise ShmError(f"{self.directory}: slot {lease.index} could not be pinned after commit")
                data = memoryview(mapping.mm)[: meta.length]
                pinned = PinnedSlot(meta, data, shared, self._wanted[lease.index])
        finally:
            self._lock.release()
        self._drop_unused_layouts()
        self.notify_readers()
        return meta, pinned

    def record_checksum(self, index: int, key: WeightKey, checksum: int) -> None:
        """Fill in the checksum of a slot committed as pending, if it still holds ``key``."""
        assert self._header_mm is not None
        meta = read_slot(self._header_mm, index)
        if meta.state == SlotState.READY and meta.key == key and meta.checksum == 0:
            write_checksum(self._header_mm, index, checksum)

    def abort(self, lease: SlotLease) -> None:
        """Give the slot back unpublished (EMPTY); the latest version stays what it was."""
        mm = self._header_mm
        assert mm is not None
        try:
            old = read_slot(mm, lease.index)
            write_slot(mm, lease.index, SlotMeta(capacity=old.capacity, file_gen=old.file_gen))
            self._pins[lease.index].release()
        finally:
            self._lock.release()

    def _reclaim(self, index: int, meta: SlotMeta, why: LockTimeout) -> None:
        """Take slot ``index`` from a reader that kept it pinned too long (see the module docstring).

        Called with the slot not latest and this writer's lock held. Afterwards this writer holds
        the new pin file exclusively and the slot has a new, empty slot file.
        """
        assert self._header_mm is not None
        path = pin_path(self.directory, index)
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
        fresh = FileLock(tmp)
        if not fresh.try_acquire(fcntl.LOCK_EX):  # a new file nobody else has opened
            fresh.close()
            raise SlotBusyError(f"slot {index}: could not lock a fresh pin file") from why
        os.replace(tmp, path)
        fresh.path = path
        self._pins[index].close()
        self._pins[index] = fresh
        # The slot's bytes stay the hung reader's: the version goes to a new file (a new file_gen).
        write_slot(self._header_mm, index, SlotMeta(capacity=0, file_gen=meta.file_gen))
        mapping = self._create_slot_file(slot_path(self.directory, index), max(meta.capacity, 1))
        self._maps[index] = mapping
        write_slot(self._header_mm, index, SlotMeta(capacity=mapping.capacity, file_gen=mapping.file_gen))
        self.reclaimed += 1
        logger.warning(
            "%s; reclaimed slot %d: the reader keeps its pinned, unchanged copy (an older version) "
            "until it lets go, new readers get the new files",
            why,
            index,
        )

    def _write_layout(self, layout: WeightLayout) -> None:
        path = layout_path(self.directory, layout.digest)
        if path.exists():
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(layout.to_proto().SerializeToString())
        os.replace(tmp, path)

    def _drop_unused_layouts(self) -> None:
        assert self._header_mm is not None
        used = {s.digest for s in read_header(self._header_mm).slots if s.digest}
        for name in os.listdir(self.directory):
            if name.startswith("layout-") and name.endswith(".pb") and name[7:-3] not in used:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.directory / name)

    def _map_slot(self, index: int, meta: SlotMeta, need: int) -> _Mapping:
        cached = self._maps[index]
        if cached is not None and cached.file_gen == meta.file_gen and cached.capacity >= need:
            return cached
        path = slot_path(self.directory, index)
        if meta.file_gen and meta.capacity >= need and path.exists() and path.stat().st_size >= meta.capacity:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                mm = mmap.mmap(fd, meta.capacity)
            finally:
                os.close(fd)
            prefault(mm, write=False)  # the bytes may be a live version: touch without writing
            mapping = _Mapping(meta.file_gen, meta.capacity, mm, np.frombuffer(mm, dtype=np.uint8))
        else:
            mapping = self._create_slot_file(path, max(need, meta.capacity))
        self._maps[index] = mapping
        return mapping

    def _create_slot_file(self, path: Path, need: int) -> _Mapping:
        capacity = max(_SLOT_ROUNDING, -(-need // _SLOT_ROUNDING) * _SLOT_ROUNDING)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, capacity)
            try:
                os.posix_fallocate(fd, 0, capacity)
            except OSError as exc:
                os.unlink(tmp)
                raise ShmError(f"cannot allocate {capacity} bytes in {path.parent}: {exc}") from exc
            mm = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        prefault(mm, write=True)
        os.replace(tmp, path)
        return _Mapping(secrets.randbits(62) + 1, capacity, mm, np.frombuffer(mm, dtype=np.uint8))

    # -- serving committed versions from this process
    def pin_version(self, incarnation: str, version: int) -> PinnedSlot | None:
        """Pin the READY slot holding (incarnation, version) for reading, or None if no slot holds it."""
        assert self._header_mm is not None
        for index, meta in enumerate(read_header(self._header_mm).slots):
            if meta.state != SlotState.READY or meta.key != (incarnation, version):
                continue
            pin = FileLock(pin_path(self.directory, index))
            if not pin.try_acquire(fcntl.LOCK_SH) or not pin.same_file():
                pin.close()
                return None  # the writer is overwriting (or reclaimed) it
            meta = read_slot(self._header_mm, index)
            mapping = self._maps[index]
            if meta.state != SlotState.READY or meta.key != (incarnation, version) or mapping is None:
                pin.close()
                return None
            return PinnedSlot(meta, memoryview(mapping.mm)[: meta.length], pin, self._wanted[index])
        return None

    # -- waking readers
    def notify_readers(self) -> None:
        sock = self._notify_sock
        if sock is None:
            return
        for name in os.listdir(self.directory):
            if not (name.startswith(NOTIFY_PREFIX) and name.endswith(".sock")):
                continue
            path = self.directory / name
            try:
                sock.sendto(b"!", str(path))
            except ConnectionRefusedError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # its reader died without cleaning up
            except OSError:
                pass  # queue full (the reader has a wake-up pending) or a vanished file
