"""The acknowledgement journal's files: append-only segments of checksummed records.

I/O. A segment (``seg-<number>-<incarnation>.log``) is written by one incarnation of rank 0 and
read by the next ones; numbers grow across incarnations (one rank 0 runs at a time), so reading
segments in number order replays the journal's history in order. A record is a fixed header
(magic, kind, sequence number, body length, step, CRC-32 of the body) and its body. Appending
takes one ``writev``; :meth:`Segment.sync_through` makes a record durable, and concurrent
callers share one ``fdatasync`` (group commit): an acknowledgement costs a write into the page
cache and a share of a sync, where a file per entry cost a create, a sync and a rename (and
later a rename and an unlink), ~1 ms of kernel time each on this project's machines.

A record is trusted only whole: reading stops at the first header that is not one, or whose
body runs past the end of the file (a write cut short by a crash; it was never acknowledged,
since acknowledging waits for the sync). An entry's body is checked against its CRC when it is
read back; a marker's (small) when the segment is scanned.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

logger = logging.getLogger(__name__)

SEGMENT = re.compile(r"^seg-(\d{8,})-([0-9a-zA-Z]+)\.log$")
_HEADER = struct.Struct("<4sBqQqI")  # magic, kind, sequence, body length, step (-1: none), crc32(body)
_MAGIC = b"RLKJ"
_IOV_MAX = 1024  # buffers per writev (Linux's limit)
NO_STEP = -1


class Kind(IntEnum):
    ENTRY = 1  # an acknowledged fragment (body: a serialized pb.Fragment)
    TAKEN = 2  # entries (body: JSON [[incarnation, sequence], ...]) now belong to ``step``
    DROPPED = 3  # entries quarantined: never taken back again
    CHECKPOINT = 4  # a checkpoint holds every step below ``step`` (no body)


@dataclass(frozen=True)
class Record:
    """A record as scanned: where its body lies, and the body itself for markers."""

    kind: Kind
    sequence: int
    step: int | None
    offset: int  # of the body in the segment
    length: int
    crc: int
    body: bytes | None  # markers only (entries are read when taken back)


def segment_name(number: int, incarnation: str) -> str:
    return f"seg-{number:08d}-{incarnation}.log"


def segments(directory: Path) -> list[tuple[int, str, Path]]:
    """The segments in ``directory``: (number, incarnation, path), in number order."""
    found = []
    for path in directory.iterdir() if directory.is_dir() else ():
        match = SEGMENT.match(path.name)
        if match:
            found.append((int(match.group(1)), match.group(2), path))
    return sorted(found)


def encode_record(
    kind: Kind, *, sequence: int, step: int | None, body: Sequence[bytes | memoryview]
) -> list[memoryview]:
    """A record's buffers in order (header first); the body's buffers are viewed, not copied."""
    views = [memoryview(piece).cast("B") for piece in body if len(piece)]
    crc, length = 0, 0
    for view in views:
        crc = zlib.crc32(view, crc)
        length += view.nbytes
    header = _HEADER.pack(_MAGIC, kind, sequence, length, NO_STEP if step is None else step, crc)
    return [memoryview(header), *views]


def appended(buffers: Sequence[memoryview], end: int) -> Record:
    """The record :func:`encode_record` made of ``buffers``, appended so that it ends at ``end``."""
    _, kind, sequence, length, step, crc = _HEADER.unpack(buffers[0])
    return Record(Kind(kind), sequence, None if step == NO_STEP else step, end - length, length, crc, None)


def scan(path: Path) -> Iterator[Record]:
    """The whole records of a segment, in order (see the module docstring for what ends a scan)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        offset = 0
        while offset + _HEADER.size <= size:
            magic, kind, sequence, length, step, crc = _HEADER.unpack(handle.read(_HEADER.size))
            body_at = offset + _HEADER.size
            if magic != _MAGIC or kind not in Kind._value2member_map_ or body_at + length > size:
                logger.warning(
                    "journal segment %s: no whole record at byte %d; reading stops there", path, offset
                )
                return
            body = None
            if kind != Kind.ENTRY:
                body = handle.read(length)
                if zlib.crc32(body) != crc:
                    logger.warning(
                        "journal segment %s: damaged record at byte %d; reading stops there", path, offset
                    )
                    return
            else:
                handle.seek(length, os.SEEK_CUR)
            yield Record(Kind(kind), sequence, None if step == NO_STEP else step, body_at, length, crc, body)
            offset = body_at + length
        if offset != size:
            logger.warning(
                "journal segment %s: %d bytes of a record cut short at its end", path, size - offset
            )


def read_body(path: Path, record: Record) -> bytes:
    """An entry's body, checked against its CRC (OSError, ValueError when it cannot be read whole)."""
    with open(path, "rb") as handle:
        body = os.pread(handle.fileno(), record.length, record.offset)
    if len(body) != record.length or zlib.crc32(body) != record.crc:
        raise ValueError(f"journal entry at byte {record.offset} of {path.name} is damaged")
    return body


def write_all(fd: int, buffers: Sequence[bytes | memoryview]) -> None:
    """Write every buffer, in order (a short write continues where it stopped)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while written:  # drop what was written; a short write leaves the rest of a buffer
            if written >= views[0].nbytes:
                written -= views.pop(0).nbytes
            else:
                views[0], written = views[0][written:], 0


def sync(fd: int) -> None:
    """Make a segment's appended bytes durable (a module function: tests count and delay it)."""
    os.fdatasync(fd)


def sync_directory(directory: Path) -> None:
    """Make the names in ``directory`` durable (a new segment, a deleted one)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """The segment an incarnation appends to: its tail, and how much of it is durable."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o666)
        self.size = 0  # bytes written whole (a record counts once its writev is done)
        self.broken: OSError | None = None  # a failed write left a torn record: append no more
        self._synced = 0
        self._syncing = False
        self._sync_error: OSError | None = None
        self._cond = threading.Condition()

    def append(self, buffers: Sequence[memoryview]) -> int:
        """Write one record (callers serialize appends); its end offset, for :meth:`sync_through`."""
        if self.broken is not None:
            raise OSError(self.broken.errno, f"journal segment {self.path.name} is unusable: {self.broken}")
        start = self.size
        try:
            write_all(self.fd, buffers)
        except OSError as exc:
            try:  # leave no torn record behind (the scan would stop at it, hiding what follows)
                os.ftruncate(self.fd, start)
            except OSError:
                self.broken = exc
            raise
        self.size = start + sum(b.nbytes for b in buffers)
        return self.size

    def sync_through(self, end: int) -> None:
        """Return once the first ``end`` bytes are durable; concurrent callers share one sync."""
        with self._cond:
            while self._synced < end:
                if self._sync_error is not None:
                    raise OSError(self._sync_error.errno, f"journal sync failed: {self._sync_error}")
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing, target = True, self.size  # every record counted in ``size`` is written
                self._cond.release()
                error: OSError | None = None
                try:
                    sync(self.fd)
                except OSError as exc:
                    error = exc
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                if error is not None:
                    self._sync_error = error  # what the failed sync covered is of unknown durability
                    raise error
                self._synced = max(self._synced, target)

    @property
    def synced(self) -> int:
        """How many bytes are durable."""
        with self._cond:
            return self._synced

    def idle(self) -> bool:
        """Nothing is being synced or waiting to be (its descriptor may be closed)."""
        with self._cond:
            return not self._syncing and self._synced >= self.size

    def close(self) -> None:
        os.close(self.fd)
