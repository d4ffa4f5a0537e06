"""Basic content properties, kept as the bytes the publisher sent.

The broker forwards a message's property bytes untouched; it only looks
inside when it must (expiration, headers for routing, the x-death headers
of a dead-lettered copy). ``split_properties`` cuts the bytes into one raw
field per property, ``join_properties`` puts them back, so an edit of one
property leaves every other byte as it was.
"""

from __future__ import annotations

from struct import Struct
from typing import Any, Final

from warren.protocol.errors import SURROGATES
from warren.protocol.tables import (
    FieldValue,
    TableError,
    decode_table,
    encode_value,
    join_entries,
    table_entries,
)

# (name, flag bit, wire type) in wire order
PROPERTIES: tuple[tuple[str, int, str], ...] = (
    ("content_type", 1 << 15, "shortstr"),
    ("content_encoding", 1 << 14, "shortstr"),
    ("headers", 1 << 13, "table"),
    ("delivery_mode", 1 << 12, "octet"),
    ("priority", 1 << 11, "octet"),
    ("correlation_id", 1 << 10, "shortstr"),
    ("reply_to", 1 << 9, "shortstr"),
    ("expiration", 1 << 8, "shortstr"),
    ("message_id", 1 << 7, "shortstr"),
    ("timestamp", 1 << 6, "timestamp"),
    ("type", 1 << 5, "shortstr"),
    ("user_id", 1 << 4, "shortstr"),
    ("app_id", 1 << 3, "shortstr"),
    ("cluster_id", 1 << 2, "shortstr"),
)
FLAG_CONTENT_TYPE: Final = 1 << 15
FLAG_CONTENT_ENCODING: Final = 1 << 14
FLAG_HEADERS: Final = 1 << 13
FLAG_DELIVERY_MODE: Final = 1 << 12
FLAG_PRIORITY: Final = 1 << 11
FLAG_CORRELATION_ID: Final = 1 << 10
FLAG_REPLY_TO: Final = 1 << 9
FLAG_EXPIRATION: Final = 1 << 8
FLAG_MESSAGE_ID: Final = 1 << 7
FLAG_TIMESTAMP: Final = 1 << 6
FLAG_USER_ID: Final = 1 << 4
FLAG_MORE: Final = 1  # another flag word follows (AMQP 0-9-1 defines none)
# the trace's message fields (delivery_mode, correlation_id, message_id) as a test of the two
# flag bytes, so the per-publish check needs no unpacking: raw[0] & HI or raw[1] & LO
TRACED_FLAGS_HI: Final = (FLAG_DELIVERY_MODE | FLAG_CORRELATION_ID) >> 8
TRACED_FLAGS_LO: Final = FLAG_MESSAGE_ID
_FLAGS: Final = {name: flag for name, flag, _ in PROPERTIES}

_u16: Final = Struct(">H")
_u32: Final = Struct(">I")


def is_persistent(raw: bytes) -> bool:
    """delivery_mode = 2, read without decoding the other properties."""
    flags = (raw[0] << 8) | raw[1]
    if not flags & FLAG_DELIVERY_MODE:
        return False
    off = 2
    if flags & FLAG_CONTENT_TYPE:
        off += 1 + raw[off]
    if flags & FLAG_CONTENT_ENCODING:
        off += 1 + raw[off]
    if flags & FLAG_HEADERS:
        off += 4 + int.from_bytes(raw[off : off + 4], "big")
    return off < len(raw) and raw[off] == 2


class PropertiesError(ValueError):
    """The content header's property list does not decode."""


def split_properties(raw: bytes) -> dict[str, bytes]:
    """Map each present property to its encoded field (length prefix included)."""
    if len(raw) < 2:
        raise PropertiesError("content header property flags truncated")
    (flags,) = _u16.unpack_from(raw, 0)
    if flags & 0b11:  # bit 0 would continue the flag word; 0-9-1 defines no more properties
        raise PropertiesError("reserved property flags set")
    off = 2
    fields: dict[str, bytes] = {}
    size = len(raw)
    for name, flag, kind in PROPERTIES:
        if not flags & flag:
            continue
        start = off
        if kind == "shortstr":
            if off >= size:
                raise PropertiesError(f"property {name} truncated")
            off += 1 + raw[off]
        elif kind == "octet":
            off += 1
        elif kind == "timestamp":
            off += 8
        else:  # table
            if off + 4 > size:
                raise PropertiesError(f"property {name} truncated")
            off += 4 + _u32.unpack_from(raw, off)[0]
        if off > size:
            raise PropertiesError(f"property {name} truncated")
        fields[name] = bytes(raw[start:off])
    return fields


def check_properties(raw: bytes) -> None:
    """Raise PropertiesError unless the broker can later read and edit every property.

    The broker reads properties lazily (routing on headers, priorities, dead
    lettering), long after the publish; a malformed list must be refused here.
    """
    if raw == b"\x00\x00":
        return
    headers = split_properties(raw).get("headers")
    if headers is not None:
        decode_field("headers", headers)  # a broken or too deeply nested table


def join_properties(fields: dict[str, bytes]) -> bytes:
    flags = 0
    parts = []
    for name, flag, _ in PROPERTIES:
        value = fields.get(name)
        if value is not None:
            flags |= flag
            parts.append(value)
    return _u16.pack(flags) + b"".join(parts)


def decode_field(name: str, raw: bytes) -> FieldValue:
    kind = next(k for n, _, k in PROPERTIES if n == name)
    if kind == "shortstr":
        return raw[1:].decode("utf-8", "replace")
    if kind == "octet":
        return raw[0]
    if kind == "timestamp":
        return int.from_bytes(raw, "big")
    try:
        return decode_table(raw)[0]
    except TableError as exc:
        raise PropertiesError(str(exc)) from None


def encode_shortstr(value: str) -> bytes:
    data = value.encode("utf-8", SURROGATES)
    if len(data) > 255:
        raise ValueError("short string longer than 255 octets")
    return bytes((len(data),)) + data


def set_header(raw: bytes, key: str, value: FieldValue) -> bytes:
    """The same properties with one header set; every other byte kept."""
    fields = split_properties(raw)
    entries: dict[str, bytes] = {}
    if "headers" in fields:
        entries, _ = table_entries(fields["headers"])
    entries[key] = encode_value(value)
    fields["headers"] = join_entries(entries)
    return join_properties(fields)


def read_properties(raw: bytes) -> dict[str, Any]:
    """All properties, decoded (for the management API and tests)."""
    return {name: decode_field(name, value) for name, value in split_properties(raw).items()}


def timestamp_of(raw: bytes) -> int | None:
    """The timestamp property (seconds), None without one."""
    if not has_flag(raw, FLAG_TIMESTAMP):
        return None
    field = split_properties(raw).get("timestamp")
    return int.from_bytes(field, "big") if field is not None else None


def priority_of(raw: bytes, default: int = 0) -> int:
    """The priority property, ``default`` without one (or with one that is not a number)."""
    if not has_flag(raw, FLAG_PRIORITY):
        return default
    field = split_properties(raw).get("priority")
    value = decode_field("priority", field) if field is not None else default
    return value if isinstance(value, int) else default


def headers_at(raw: bytes) -> int:
    """Where the headers table starts, or would go: after the flag word, content-type and
    content-encoding (properties of one flag word)."""
    at = 2
    if raw[0] & FLAG_CONTENT_TYPE >> 8:
        at += 1 + raw[at]
    if raw[0] & FLAG_CONTENT_ENCODING >> 8:
        at += 1 + raw[at]
    return at


def has_flag(raw: bytes, flag: int) -> bool:
    return len(raw) >= 2 and bool(_u16.unpack_from(raw, 0)[0] & flag)
