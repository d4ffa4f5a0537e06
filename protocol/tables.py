"""AMQP field tables and arrays (RabbitMQ's dialect of the 0-9-1 types).

Decoding gives plain Python values. Encoding picks the types RabbitMQ itself
writes (``l`` for integers, ``S`` for strings), which is what matters for the
headers the broker adds (x-death and friends). ``table_entries``/``join_entries``
edit a table without decoding the values the broker does not touch, so a
client's header types survive byte for byte.
"""

from __future__ import annotations

import datetime
import decimal
from struct import Struct
from typing import Any, Final

from warren.protocol.constants import SYNTAX_ERROR
from warren.protocol.errors import SURROGATES, ConnectionError_

MAX_DEPTH: Final = 64  # nesting of tables/arrays; deeper input is rejected, not recursed into

_u8: Final = Struct(">B")
_i8: Final = Struct(">b")
_i16: Final = Struct(">h")
_u16: Final = Struct(">H")
_i32: Final = Struct(">i")
_u32: Final = Struct(">I")
_i64: Final = Struct(">q")
_u64: Final = Struct(">Q")
_f32: Final = Struct(">f")
_f64: Final = Struct(">d")

FieldValue = Any


class TableError(ValueError):
    """Malformed field table."""


class TypedTable(dict[str, Any]):
    """A decoded table that remembers each top-level value's wire type, by RabbitMQ's name.

    RabbitMQ names the field type in some reply texts (inequivalent arguments),
    so method arguments keep it.
    """

    types: dict[str, str]


TYPE_NAMES: Final = {
    "S": "longstr",
    "I": "signedint",
    "i": "unsignedint",
    "l": "long",
    "L": "long",
    "t": "bool",
    "b": "byte",
    "B": "unsignedbyte",
    "s": "short",
    "u": "unsignedshort",
    "f": "float",
    "d": "double",
    "D": "decimal",
    "T": "timestamp",
    "F": "table",
    "A": "array",
    "x": "binary",
    "V": "void",
}


def _need(buf: bytes, offset: int, n: int) -> None:
    if offset + n > len(buf):
        raise TableError("field table truncated")


def _value(buf: bytes, off: int, depth: int) -> tuple[FieldValue, int]:
    _need(buf, off, 1)
    kind = buf[off]
    off += 1
    if kind == 0x53:  # 'S' long string: bytes on the wire, text when it decodes
        _need(buf, off, 4)
        (n,) = _u32.unpack_from(buf, off)
        off += 4
        _need(buf, off, n)
        raw = bytes(buf[off : off + n])
        try:
            return raw.decode(), off + n
        except UnicodeDecodeError:
            return raw, off + n
    if kind == 0x49:  # 'I'
        _need(buf, off, 4)
        return _i32.unpack_from(buf, off)[0], off + 4
    if kind in (0x6C, 0x4C):  # 'l', 'L'
        _need(buf, off, 8)
        return _i64.unpack_from(buf, off)[0], off + 8
    if kind == 0x74:  # 't'
        _need(buf, off, 1)
        return buf[off] != 0, off + 1
    if kind == 0x46:  # 'F'
        return _table(buf, off, depth + 1)
    if kind == 0x41:  # 'A'
        return _array(buf, off, depth + 1)
    if kind == 0x62:  # 'b'
        _need(buf, off, 1)
        return _i8.unpack_from(buf, off)[0], off + 1
    if kind == 0x42:  # 'B'
        _need(buf, off, 1)
        return buf[off], off + 1
    if kind == 0x73:  # 's' (RabbitMQ: short int)
        _need(buf, off, 2)
        return _i16.unpack_from(buf, off)[0], off + 2
    if kind == 0x75:  # 'u'
        _need(buf, off, 2)
        return _u16.unpack_from(buf, off)[0], off + 2
    if kind == 0x69:  # 'i'
        _need(buf, off, 4)
        return _u32.unpack_from(buf, off)[0], off + 4
    if kind == 0x66:  # 'f'
        _need(buf, off, 4)
        return _f32.unpack_from(buf, off)[0], off + 4
    if kind == 0x64:  # 'd'
        _need(buf, off, 8)
        return _f64.unpack_from(buf, off)[0], off + 8
    if kind == 0x44:  # 'D' decimal: scale octet, signed 32-bit value
        _need(buf, off, 5)
        scale = buf[off]
        (raw_int,) = _i32.unpack_from(buf, off + 1)
        return decimal.Decimal(raw_int).scaleb(-scale), off + 5
    if kind == 0x54:  # 'T'
        _need(buf, off, 8)
        (secs,) = _u64.unpack_from(buf, off)
        try:
            stamp = datetime.datetime.fromtimestamp(secs, tz=datetime.UTC)
        except (OverflowError, OSError, ValueError):
            return secs, off + 8
        return stamp, off + 8
    if kind == 0x78:  # 'x' byte array
        _need(buf, off, 4)
        (n,) = _u32.unpack_from(buf, off)
        off += 4
        _need(buf, off, n)
        return bytes(buf[off : off + n]), off + n
    if kind == 0x56:  # 'V'
        return None, off
    raise TableError(f"unknown field type {chr(kind)!r}")


def _table(
    buf: bytes, off: int, depth: int, typed: bool = False
) -> tuple[dict[str, FieldValue], int]:
    if depth > MAX_DEPTH:
        raise TableError("field table nested too deeply")
    _need(buf, off, 4)
    (size,) = _u32.unpack_from(buf, off)
    off += 4
    end = off + size
    _need(buf, off, size)
    result: dict[str, FieldValue] = TypedTable() if typed else {}
    types: dict[str, str] = {}
    while off < end:
        klen = buf[off]
        off += 1
        if off + klen > end:
            raise TableError("field table key truncated")
        key = bytes(buf[off : off + klen]).decode("utf-8", "replace")
        off += klen
        if typed and off < end:
            types[key] = TYPE_NAMES.get(chr(buf[off]), "unknown")
        result[key], off = _value(buf, off, depth)
        if off > end:
            raise TableError("field table value overruns the table")
    if isinstance(result, TypedTable):
        result.types = types
    return result, end


def _array(buf: bytes, off: int, depth: int) -> tuple[list[FieldValue], int]:
    if depth > MAX_DEPTH:
        raise TableError("field array nested too deeply")
    _need(buf, off, 4)
    (size,) = _u32.unpack_from(buf, off)
    off += 4
    end = off + size
    _need(buf, off, size)
    items: list[FieldValue] = []
    while off < end:
        value, off = _value(buf, off, depth)
        items.append(value)
    if off > end:
        raise TableError("field array value overruns the array")
    return items, end


def decode_table(
    buf: bytes, offset: int = 0, typed: bool = False
) -> tuple[dict[str, FieldValue], int]:
    """Decode the table at ``offset``; return it and the offset just past it.

    With ``typed`` the result is a ``TypedTable`` that knows its values' wire types.
    """
    return _table(buf, offset, 0, typed)


def decode_table_or_fail(buf: bytes, offset: int = 0) -> tuple[dict[str, FieldValue], int]:
    try:
        return _table(buf, offset, 0)
    except TableError as exc:
        raise ConnectionError_(SYNTAX_ERROR, f"malformed field table: {exc}") from None


def encode_value(value: FieldValue) -> bytes:
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return b"l" + _i64.pack(value)
        raise ValueError(f"integer out of range: {value}")
    if isinstance(value, str):
        # names from clients (x-death's queue, exchange, routing keys) may not be UTF-8
        raw = value.encode("utf-8", SURROGATES)
        return b"S" + _u32.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return b"x" + _u32.pack(len(raw)) + raw
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, list | tuple):
        body = b"".join(encode_value(v) for v in value)
        return b"A" + _u32.pack(len(body)) + body
    if isinstance(value, datetime.datetime):
        return b"T" + _u64.pack(int(value.timestamp()))
    if isinstance(value, float):
        return b"d" + _f64.pack(value)
    if isinstance(value, decimal.Decimal):
        exponent = value.as_tuple().exponent
        scale = -int(exponent) if isinstance(exponent, int) and exponent < 0 else 0
        unscaled = int(value.scaleb(scale))
        return b"D" + _u8.pack(scale) + _i32.pack(unscaled)
    if value is None:
        return b"V"
    raise ValueError(f"cannot encode {type(value).__name__} in a field table")


def encode_key(key: str) -> bytes:
    raw = key.encode("utf-8", SURROGATES)
    return _u8.pack(len(raw)) + raw


def encode_table(table: dict[str, FieldValue]) -> bytes:
    body = b"".join(encode_key(k) + encode_value(v) for k, v in table.items())
    return _u32.pack(len(body)) + body


def table_entries(buf: bytes, offset: int = 0) -> tuple[dict[str, bytes], int]:
    """Split a table into key -> encoded value (type octet included), values left undecoded."""
    _need(buf, offset, 4)
    (size,) = _u32.unpack_from(buf, offset)
    off = offset + 4
    end = off + size
    _need(buf, off, size)
    entries: dict[str, bytes] = {}
    while off < end:
        klen = buf[off]
        start = off + 1 + klen
        if start > end:
            raise TableError("field table key truncated")
        key = bytes(buf[off + 1 : start]).decode("utf-8", "replace")
        _, off = _value(buf, start, 0)
        if off > end:
            raise TableError("field table value overruns the table")
        entries[key] = bytes(buf[start:off])
    return entries, end


def array_longstrs(raw: bytes) -> list[str]:
    """The long strings of an encoded array value (type octet included); others skipped.

    Text that is not UTF-8 keeps its bytes as surrogates, as names from methods do.
    """
    items: list[str] = []
    off, end = 5, 5 + _u32.unpack_from(raw, 1)[0]
    while off < end:
        if raw[off] == 0x53:  # 'S'
            (n,) = _u32.unpack_from(raw, off + 1)
            items.append(raw[off + 5 : off + 5 + n].decode("utf-8", SURROGATES))
            off += 5 + n
        else:
            _, off = _value(raw, off, 0)
    return items


def join_entries(entries: dict[str, bytes]) -> bytes:
    body = b"".join(encode_key(k) + v for k, v in entries.items())
    return _u32.pack(len(body)) + body
