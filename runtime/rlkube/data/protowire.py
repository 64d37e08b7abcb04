"""Protobuf's wire format by hand, for the messages the bulk paths frame themselves.

Pure: no I/O. A weight chunk (``weights.wire``) and a pushed fragment (``coordinator.wire``) are
framed and read without the generated code so that their payloads are never copied into or out
of protobuf's arena; both are still exactly protobuf's encoding, so any protobuf client reads
them. This module is the encoding's few rules they share: varints, field headers and a scan of a
message's fields.
"""

from __future__ import annotations

from typing import NamedTuple

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5


class MalformedMessage(ValueError):
    """Bytes that are not a protobuf message (the text says where)."""


class Field(NamedTuple):
    number: int
    wire_type: int
    start: int  # of the field's tag
    value_at: int  # of its value (a length-delimited field's bytes, after the length)
    end: int  # one past its last byte


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def field_header(number: int, wire_type: int, length: int | None = None) -> bytes:
    """A field's tag, and for a length-delimited one its length."""
    tag = varint(number << 3 | wire_type)
    return tag if length is None else tag + varint(length)


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(the varint at ``pos``, the position after it)."""
    value, shift = 0, 0
    while shift < 64 and pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise MalformedMessage(f"truncated or overlong varint before byte {pos}")


def fields(data: bytes | memoryview, start: int = 0, end: int | None = None) -> list[Field]:
    """The fields of the message in ``data[start:end]``, in order; groups are refused."""
    end = len(data) if end is None else end
    found, pos = [], start
    while pos < end:
        tag, value_at = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            _, field_end = read_varint(data, value_at)
        elif wire_type == FIXED64:
            field_end = value_at + 8
        elif wire_type == FIXED32:
            field_end = value_at + 4
        elif wire_type == LENGTH_DELIMITED:
            length, value_at = read_varint(data, value_at)
            field_end = value_at + length
        else:
            raise MalformedMessage(f"wire type {wire_type} of field {number}")
        if number == 0:
            raise MalformedMessage(f"field number 0 at byte {pos}")
        if field_end > end:
            raise MalformedMessage(
                f"field {number} claims {field_end - value_at} bytes, {end - value_at} remain"
            )
        found.append(Field(number, wire_type, pos, value_at, field_end))
        pos = field_end
    return found
