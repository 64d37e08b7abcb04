"""The weight data port's framing: one request head, then typed frames.

Pure: no I/O. A receiver sends a request; the port answers with frames, and the connection
stays open for the next request once a range ended (``END`` or ``COMMIT``). An ``ERROR`` frame
ends the connection.

request   ``MAGIC`` | u8 wire version | u16 token length | u32 request length
          | token (UTF-8) | ``rlkube.v1.FetchWeightsRequest`` (protobuf)
frame     u8 kind | 3 pad | u64 version | u64 offset | u64 length | u64 checksum
          | ``length`` bytes (``DATA``: the chunk, ``ERROR``: the message)

``DATA``: the chunk at ``offset`` (``checksum`` its xxh3-64); ``COMMIT``: the end of a
``while_packing`` range, ``offset`` = the range's end, ``checksum`` = the version's root;
``END``: the end of a range of a committed version; ``ERROR``: ``offset`` holds the gRPC status
code (the same code FetchWeights would end with), the message follows.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import grpc

from rlkube.security.credential import MAX_TOKEN_CHARS
from rlkube.weights.wire import MAX_WEIGHT_REQUEST_BYTES

MAGIC = b"RLKW"
WIRE_VERSION = 1
REQUEST_HEAD = struct.Struct("<4sBHI")
FRAME_HEAD = struct.Struct("<B3xQQQQ")
#: The longest error message a port sends (and a receiver accepts).
MAX_ERROR_BYTES = 4096
#: Token bytes a request may carry (the credential's longest token; anything longer is refused).
MAX_TOKEN_BYTES = MAX_TOKEN_CHARS

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class FrameKind(IntEnum):
    DATA = 1
    COMMIT = 2
    END = 3
    ERROR = 4


class MalformedRequest(ValueError):
    """A request head that is not ours, or over the limits (the message says which)."""


@dataclass(frozen=True)
class RequestHead:
    token_length: int
    request_length: int


def encode_request(request_bytes: bytes, token: str) -> bytes:
    """One request: the head, the token and the serialized ``FetchWeightsRequest``."""
    raw_token = token.encode()
    head = REQUEST_HEAD.pack(MAGIC, WIRE_VERSION, len(raw_token), len(request_bytes))
    return head + raw_token + request_bytes


def decode_request_head(head: bytes) -> RequestHead:
    """The lengths a request head announces, checked against the limits before anything is read."""
    magic, wire_version, token_length, request_length = REQUEST_HEAD.unpack(head)
    if magic != MAGIC:
        raise MalformedRequest(f"not an rlkube weight data request (starts with {magic!r})")
    if wire_version != WIRE_VERSION:
        raise MalformedRequest(f"wire version {wire_version}; this port speaks {WIRE_VERSION}")
    if token_length > MAX_TOKEN_BYTES:
        raise MalformedRequest(f"a token of {token_length} bytes (at most {MAX_TOKEN_BYTES})")
    if request_length > MAX_WEIGHT_REQUEST_BYTES:
        raise MalformedRequest(f"a request of {request_length} bytes (at most {MAX_WEIGHT_REQUEST_BYTES})")
    return RequestHead(token_length, request_length)


def frame(kind: FrameKind, *, version: int = 0, offset: int = 0, length: int = 0, checksum: int = 0) -> bytes:
    """A frame head (the ``length`` bytes that follow it are written separately)."""
    return FRAME_HEAD.pack(kind, version, offset, length, checksum)


def error_frame(code: grpc.StatusCode, details: str) -> bytes:
    """A whole ``ERROR`` frame: head and message."""
    message = details.encode()[:MAX_ERROR_BYTES]
    return frame(FrameKind.ERROR, offset=code.value[0], length=len(message)) + message


@dataclass(frozen=True)
class Frame:
    kind: FrameKind
    version: int
    offset: int
    length: int
    checksum: int


def decode_frame(head: bytes) -> Frame:
    kind, version, offset, length, checksum = FRAME_HEAD.unpack(head)
    try:
        return Frame(FrameKind(kind), version, offset, length, checksum)
    except ValueError:
        raise MalformedRequest(f"a frame of unknown kind {kind}") from None


def status_code(value: int) -> grpc.StatusCode:
    """The gRPC status code an ``ERROR`` frame carries (UNKNOWN for a number gRPC does not know)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)
