"""The header of a shared-memory weight buffer: byte layout and (de)serialisation.

Pure: functions take the mapped bytes as an argument. One 4 KiB page, little endian:

=======  =====  ================================================================
offset   type   field
=======  =====  ================================================================
0        8s     magic ``RLKWBUF\\0``
8        u32    format version (:data:`FORMAT_VERSION`)
12       u32    header size (:data:`HEADER_BYTES`)
16       u64    seq: bumped after every publish (a cheap "anything new?" check)
24       i32    latest: index of the newest READY slot, -1 when none
28       u32    pid of the current writer (diagnostics)
32       16s    token of the current writer session
48       u64    publishes: versions published since the header was created
64+128i         slot i (i = 0, 1): state, checksum grid, version, length, checksum,
                capacity, file generation, publish time, incarnation, layout digest
=======  =====  ================================================================

A slot record (state, version, length, checksum, capacity, file generation, publish time,
incarnation, layout digest) is written only while its slot is *not* latest and its pin is held
exclusively by the writer; readers pin a slot before trusting its record (see ``shm.py``).
One exception: a slot committed with checksum 0 ("pending") gets its checksum filled in once,
after the flip, by :func:`write_checksum` (the trainer wakes local readers before hashing).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias

from rlkube.weight_key import WeightKey

#: What the header is read from and written to: the mapped file, or a copy in tests.
Readable: TypeAlias = memoryview | bytes | bytearray | mmap.mmap
Writable: TypeAlias = memoryview | bytearray | mmap.mmap

MAGIC = b"RLKWBUF\0"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
NUM_SLOTS = 2

_TOP = struct.Struct("<8sIIQiI16sQ")
_SLOT = struct.Struct("<IIQQQQQd32s32s")
_SLOT_BASE = 64
_SLOT_STRIDE = 128
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 16
_LATEST = struct.Struct("<i")
_LATEST_OFFSET = 24
assert _TOP.size <= _SLOT_BASE
assert _SLOT.size <= _SLOT_STRIDE


class HeaderError(RuntimeError):
    """The header is not an rlkube weight buffer of this format; the message says what differs."""


class SlotState(IntEnum):
    EMPTY = 0
    WRITING = 1
    READY = 2


@dataclass(frozen=True)
class SlotMeta:
    state: SlotState = SlotState.EMPTY
    version: int = 0
    length: int = 0
    checksum: int = 0  # hash-list root on a chunk_bytes grid (copies.buffer_checksum); 0: pending
    capacity: int = 0
    file_gen: int = 0  # random per (re)created slot file: a reader remaps when it changes
    published_at: float = 0.0
    incarnation: str = ""
    digest: str = ""
    chunk_bytes: int = 0  # grid of the checksum

    @property
    def key(self) -> WeightKey:
        """What a reader compares to know whether it has this snapshot."""
        return WeightKey(self.incarnation, self.version)


@dataclass(frozen=True)
class Header:
    seq: int
    latest: int
    writer_pid: int
    writer_token: bytes
    publishes: int
    slots: tuple[SlotMeta, ...]

    def latest_slot(self) -> SlotMeta | None:
        return self.slots[self.latest] if 0 <= self.latest < NUM_SLOTS else None


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("ascii", errors="replace")


def _field(value: str, what: str) -> bytes:
    raw = value.encode("ascii")
    if len(raw) > 32:
        raise ValueError(f"{what} {value!r} is longer than 32 ASCII characters")
    return raw


def init_header(buf: Writable) -> None:
    """Write an empty header (no slot ready) into ``buf``."""
    buf[:HEADER_BYTES] = bytes(HEADER_BYTES)
    _TOP.pack_into(buf, 0, MAGIC, FORMAT_VERSION, HEADER_BYTES, 0, -1, 0, bytes(16), 0)


def check_header(buf: Readable) -> None:
    magic, fmt, size = struct.unpack_from("<8sII", buf, 0)
    if magic != MAGIC:
        raise HeaderError(f"bad magic {magic!r}: not an rlkube weight buffer")
    if fmt != FORMAT_VERSION or size != HEADER_BYTES:
        raise HeaderError(
            f"weight buffer format {fmt} (header {size} bytes); this build reads format "
            f"{FORMAT_VERSION} ({HEADER_BYTES} bytes)"
        )


def read_header(buf: Readable) -> Header:
    raw = bytes(buf[: _SLOT_BASE + NUM_SLOTS * _SLOT_STRIDE])  # one snapshot of the bytes
    check_header(raw)
    _, _, _, seq, latest, pid, token, publishes = _TOP.unpack_from(raw, 0)
    return Header(seq, latest, pid, token, publishes, tuple(read_slot(raw, i) for i in range(NUM_SLOTS)))


def read_slot(buf: Readable, index: int) -> SlotMeta:
    state, grid, version, length, csum, cap, gen, at, inc, digest = _SLOT.unpack_from(
        buf, _SLOT_BASE + index * _SLOT_STRIDE
    )
    try:
        slot_state = SlotState(state)
    except ValueError:
        slot_state = SlotState.EMPTY
    return SlotMeta(slot_state, version, length, csum, cap, gen, at, _text(inc), _text(digest), grid)


def read_seq(buf: Readable) -> int:
    return _SEQ.unpack_from(buf, _SEQ_OFFSET)[0]


def write_slot(buf: Writable, index: int, meta: SlotMeta) -> None:
    _SLOT.pack_into(
        buf,
        _SLOT_BASE + index * _SLOT_STRIDE,
        int(meta.state),
        meta.chunk_bytes,
        meta.version,
        meta.length,
        meta.checksum,
        meta.capacity,
        meta.file_gen,
        meta.published_at,
        _field(meta.incarnation, "incarnation"),
        _field(meta.digest, "layout digest"),
    )


def write_checksum(buf: Writable, index: int, checksum: int) -> None:
    """Record the checksum of a READY slot published as pending (0); the only field written after commit."""
    struct.pack_into("<Q", buf, _SLOT_BASE + index * _SLOT_STRIDE + 24, checksum)


def write_writer(buf: Writable, pid: int, token: bytes) -> None:
    struct.pack_into("<I16s", buf, 28, pid, token)


def write_latest(buf: Writable, index: int) -> None:
    _LATEST.pack_into(buf, _LATEST_OFFSET, index)


def bump_seq(buf: Writable) -> int:
    """Advance seq and the publish counter (written last in a publish); returns the new seq."""
    seq = _SEQ.unpack_from(buf, _SEQ_OFFSET)[0]
    publishes = struct.unpack_from("<Q", buf, 48)[0]
    struct.pack_into("<Q", buf, 48, publishes + 1)
    _SEQ.pack_into(buf, _SEQ_OFFSET, seq + 1)
    return seq + 1
