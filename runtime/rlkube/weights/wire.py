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

from rlkube.data.protowire import LENGTH_DELIMITED, VARINT, MalformedMessage, fields, read_varint, varint
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


def chunk_framing(version: int, offset: int, nbytes: int, checksum: int) -> tuple[bytes, bytes]:
    """(prefix, suffix) around ``nbytes`` of payload: fields 1 version, 2 offset, 3 data, 4 checksum."""
    prefix = b"\x08" + varint(version) + b"\x10" + varint(offset) + b"\x1a" + varint(nbytes)
    suffix = b"\x20" + varint(checksum)
    return prefix, suffix


@dataclass(frozen=True)
class Chunk:
    version: int
    offset: int
    data: memoryview  # a view of the received message: no copy
    checksum: int


def decode_chunk(message: bytes | memoryview) -> Chunk:
    """Parse a serialized ``WeightChunk`` (any field order; unknown fields skipped)."""
    buf = memoryview(message)
    version = offset = checksum = 0
    data = memoryview(b"")
    try:
        for field in fields(buf):
            if field.wire_type == VARINT and field.number in (1, 2, 4):
                value, _ = read_varint(buf, field.value_at)
                if field.number == 1:
                    version = value
                elif field.number == 2:
                    offset = value
                else:
                    checksum = value
            elif field.wire_type == LENGTH_DELIMITED and field.number == 3:
                data = buf[field.value_at : field.end]
    except MalformedMessage as exc:
        raise IntegrityError(f"malformed weight chunk: {exc}") from None
    return Chunk(version, offset, data, checksum)


def abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """``context.abort`` as the type checker should see it: it raises, it never returns."""
    context.abort(code, details)
    raise AssertionError("unreachable: ServicerContext.abort raises")
