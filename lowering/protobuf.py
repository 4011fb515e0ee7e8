"""Protocol buffers' wire format: a field reader and writer, for the few XLA messages the
project reads and writes (jaxlib ships no Python classes for XLA's protos)."""

from __future__ import annotations

from typing import Iterator

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    """An unsigned varint (an int64 as two's complement)."""
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64s as two's complement, as protobuf writes them
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at data[pos:] and the position after it."""
    value, shift = 0, 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field of a message: an int for varints and fixed-width
    fields, the bytes of a length-delimited one."""
    for number, value, _, _ in _spans(data):
        yield number, value


def without(data: bytes, numbers: set[int]) -> bytes:
    """A message with its fields of these numbers left out (the others as they were)."""
    return b"".join(data[start:end] for number, _, start, end in _spans(data)
                    if number not in numbers)


def _spans(data: bytes) -> Iterator[tuple[int, int | bytes, int, int]]:
    """(field number, value, start, end) of each field: its bytes are data[start:end]."""
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = read_varint(data, pos)
        elif wire_type == _BYTES:
            length, pos = read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire_type in (_FIXED64, _FIXED32):
            width = 8 if wire_type == _FIXED64 else 4
            value, pos = int.from_bytes(data[pos:pos + width], "little"), pos + width
        else:
            raise ValueError(f"protobuf wire type {wire_type} (groups) in field {number}")
        yield number, value, start, pos


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | _BYTES) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3 | _VARINT) + varint(value)
