"""The files of a shared-memory weight buffer directory, and attaching to it.

I/O (files, mmap, flock). A directory (``/dev/shm/rlkube/...``, an emptyDir ``medium: Memory``
or a hostPath shared by a node's pods) holds:

==================  ================================================================
file                role
==================  ================================================================
header              4 KiB record, see :mod:`rlkube.weights.shm_header`
slot-0, slot-1      the two slots, preallocated and pre-faulted, reused across versions
pin-0, pin-1        readers hold LOCK_SH on a slot's pin while they use it; the writer
                    takes LOCK_EX before it overwrites that slot (with a deadline)
writer.lock         LOCK_EX by the one writer (the trainer, or the node's elected receiver)
trainer.lock        LOCK_EX by a trainer that writes this directory; receivers then stand by
attach.lock         LOCK_SH by every attached process; the last one out removes the files
layout-<digest>.pb  the ``WeightLayout`` protobuf of a slot's content
notify-*.sock       readers' wake-up sockets; the writer sends one datagram per publish
==================  ================================================================

The writer is in :mod:`rlkube.weights.shm`, readers in :mod:`rlkube.weights.shm_reader`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import secrets
import time
from pathlib import Path

import numpy as np

from rlkube.weights.locks import FileLock

logger = logging.getLogger(__name__)

HEADER = "header"
WRITER_LOCK = "writer.lock"
ATTACH_LOCK = "attach.lock"
TRAINER_LOCK = "trainer.lock"
NOTIFY_PREFIX = "notify-"
_MADV_POPULATE_READ = 22  # Linux 5.14+; Python's mmap module does not name them
_MADV_POPULATE_WRITE = 23
_SLOT_ROUNDING = 2 << 20  # slot files grow in 2 MiB steps
_UNIX_PATH_MAX = 107


def slot_path(directory: Path, index: int) -> Path:
    return directory / f"slot-{index}"


def pin_path(directory: Path, index: int) -> Path:
    return directory / f"pin-{index}"


def layout_path(directory: Path, digest: str) -> Path:
    return directory / f"layout-{digest}.pb"


def is_ours(name: str) -> bool:
    return (
        name in (HEADER, WRITER_LOCK, ATTACH_LOCK, TRAINER_LOCK)
        or name.startswith(("slot-", "pin-", "layout-", NOTIFY_PREFIX))
        or name.endswith(".tmp")
    )


def prefault(mm: mmap.mmap, *, write: bool) -> None:
    """Map every page now, so that neither copies nor rollouts pay first-touch faults later."""
    try:
        mm.madvise(_MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ)
    except (OSError, ValueError):
        pages = np.frombuffer(mm, dtype=np.uint8)[:: mmap.PAGESIZE]
        if write:
            pages[:] = pages  # touch for write without changing a byte
        else:
            int(pages.sum())
        del pages


# --------------------------------------------------------------------------- attach / detach
def attach(directory: Path, *, timeout: float = 10.0) -> FileLock:
    """Hold LOCK_SH on the directory's attach.lock (creating the directory as needed)."""
    deadline = time.monotonic() + timeout
    while True:
        directory.mkdir(parents=True, exist_ok=True)
        lock = FileLock(directory / ATTACH_LOCK)
        try:
            lock.acquire(fcntl.LOCK_SH, timeout=max(0.0, deadline - time.monotonic()), what="attach")
        except FileNotFoundError:
            lock.close()
            continue
        if lock.same_file():
            return lock
        lock.close()  # the last user removed the directory meanwhile; start again


def detach(lock: FileLock, directory: Path, *, remove: bool) -> bool:
    """Drop the attachment; the last process out removes the buffer's files. True if it removed them."""
    removed = False
    if remove and lock.try_acquire(fcntl.LOCK_EX) and lock.same_file():
        for name in sorted(os.listdir(directory), key=lambda n: n == ATTACH_LOCK):
            if is_ours(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
        with contextlib.suppress(OSError):
            directory.rmdir()  # fails harmlessly if something else lives there
        removed = True
    lock.close()
    return removed


def trainer_present(directory: Path) -> bool:
    """Whether a trainer holds this directory's trainer.lock (it then is, or is about to be, the writer)."""
    if not directory.is_dir():
        return False
    lock = FileLock(directory / TRAINER_LOCK)
    try:
        return not lock.try_acquire(fcntl.LOCK_SH)
    except FileNotFoundError:
        return False
    finally:
        lock.close()


def notify_socket_path(directory: Path) -> Path | None:
    """A fresh path for a reader's wake-up socket, or None if the directory's path is too long for one."""
    path = directory / f"{NOTIFY_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.sock"
    return path if len(str(path)) <= _UNIX_PATH_MAX else None
