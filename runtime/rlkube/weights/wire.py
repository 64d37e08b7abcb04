"""gRPC settings of the weight plane and the hand-framed ``WeightChunk`` message.

Pure: no I/O. ``WeightChunk`` is the one bulk message; it is framed here by hand (exactly the
protobuf encoding of ``rlkube.v1.WeightChunk``, so any protobuf client can read it) because the
generated code would copy the payload twice more on each side: into and out of the protobuf
arena. Here the server copies a slot's bytes once into the message and the receiver reads the
payload as a zero-copy ``memoryview`` of the message (see :mod:`rlkube.weights.copies`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import grpc

from rlkube.weights.errors import IntegrityError

#: gRPC refuses messages above 4 MiB by default. Weight chunks are bulk data of up to
#: ``spec.policy.weightBuffer.chunkBytes`` (at most 256 MiB), so every weight channel and server
#: raises both limits to this, the largest chunk plus room for its framing.
MAX_MESSAGE_BYTES = (256 << 20) + (64 << 10)

#: Default bytes per chunk: 4 MiB measured best for one Python stream on these machines (larger
#: messages did not raise throughput; smaller ones cost more per-message overhead).
DEFAULT_CHUNK_BYTES = 4 << 20

#: Options for weight channels and servers. A local subchannel pool gives every channel its own
#: TCP connection, so that parallel range streams (Sharded) do not share one.
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.use_local_subchannel_pool", 1),
)
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
#: A WeightStore server only receives small requests (which version, which range): anything
#: bigger than this is refused by gRPC (RESOURCE_EXHAUSTED) before it is parsed.
MAX_WEIGHT_REQUEST_BYTES = 64 << 10
WEIGHT_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_WEIGHT_REQUEST_BYTES),
)

SERVICE = "rlkube.v1.WeightStore"
FETCH_METHOD = f"/{SERVICE}/FetchWeights"
WATCH_METHOD = f"/{SERVICE}/WatchWeights"
LAYOUT_METHOD = f"/{SERVICE}/GetLayout"
DATA_PORT_METHOD = f"/{SERVICE}/GetDataPort"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def chunk_framing(version: int, offset: int, nbytes: int, checksum: int) -> tuple[bytes, bytes]:
    """(prefix, suffix) around ``nbytes`` of payload: fields 1 version, 2 offset, 3 data, 4 checksum."""
    prefix = b"\x08" + _varint(version) + b"\x10" + _varint(offset) + b"\x1a" + _varint(nbytes)
    suffix = b"\x20" + _varint(checksum)
    return prefix, suffix


@dataclass(frozen=True)
class Chunk:
    version: int
    offset: int
    data: memoryview  # a view of the received message: no copy
    checksum: int


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise IntegrityError("malformed weight chunk: truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode_chunk(message: bytes | memoryview) -> Chunk:
    """Parse a serialized ``WeightChunk`` (any field order; unknown fields skipped)."""
    buf = memoryview(message)
    pos = 0
    version = offset = checksum = 0
    data = memoryview(b"")
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            if field == 1:
                version = value
            elif field == 2:
                offset = value
            elif field == 4:
                checksum = value
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise IntegrityError(
                    f"malformed weight chunk: field {field} claims {length} bytes, {len(buf) - pos} remain"
                )
            if field == 3:
                data = buf[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise IntegrityError(f"malformed weight chunk: wire type {wire} of field {field}")
    if pos != len(buf):
        raise IntegrityError("malformed weight chunk: trailing bytes")
    return Chunk(version, offset, data, checksum)


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """``context.abort`` as the type checker should see it: it raises, it never returns."""
    context.abort(code, details)
    raise AssertionError("unreachable: ServicerContext.abort raises")
