"""The message log's record format, without I/O.

A record is ``magic (4 bytes) | length u32 | crc32 u32 | type u8 | payload``; length
counts type and payload, and the CRC covers the length, the type and the payload. A
damaged record is detected, never trusted, and the magic lets a reader find the next
record after it: scan_records steps over the damage to the next place where the magic
starts a record whose length and CRC hold, so one flipped byte costs one record, not
the rest of its segment.

Segments written before the magic (``length | crc32 | type | payload``, CRC over type
and payload: LEGACY_HEADER_SIZE) are rewritten in this format when the store opens
(broker/store/recovery.py, by legacy_records).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from struct import Struct

PUBLISH_V1 = 1  # a persistent message entered a durable queue (before trace ids: read only)
REMOVE = 2  # acked, expired, purged, dead-lettered or dropped
DELIVERED = 3  # delivered at least once: it comes back with redelivered=true
STATE = 4  # delivery count and retry state after a return
PUBLISH = 5  # PUBLISH_V1 with the message's trace id (broker/tracing/tracer.py)

_head = Struct(">II")
_magic_head = Struct(">4sII")
# id, queue, expires (wall), delivery count, retries, retry at, flags; PUBLISH adds the trace id
_publish_v1 = Struct(">QIdIIdB")
_publish = Struct(">QIdIIdBQ")
_id = Struct(">Q")
_state = Struct(">QIIdB")
_u32 = Struct(">I")

MAGIC = b"\xf7WR1"  # never a legacy segment's first byte (a length under 1 GiB starts 0-0x40)
HEADER_SIZE = 12
LEGACY_HEADER_SIZE = 8
MAX_RECORD = 1 << 30
DAMAGED = 0  # scan_records: bytes that are no record

FLAG_DELIVERED = 1


def _frame(kind: int, payload: bytes) -> bytes:
    body = bytes((kind,)) + payload
    length = _u32.pack(len(body))
    return MAGIC + length + _u32.pack(zlib.crc32(body, zlib.crc32(length))) + body


def frame_body(body: bytes | memoryview) -> bytes:
    """A record of this format around ``body`` (type and payload), e.g. of a legacy record."""
    length = _u32.pack(len(body))
    return b"".join((MAGIC, length, _u32.pack(zlib.crc32(body, zlib.crc32(length))), body))


def encode_publish(
    msg_id: int,
    queue_id: int,
    expires_wall: float,
    delivery_count: int,
    retries: int,
    retry_at_wall: float,
    delivered: bool,
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    trace_id: int,
) -> bytes:
    payload = b"".join((
        _publish.pack(
            msg_id, queue_id, expires_wall, delivery_count, retries, retry_at_wall,
            FLAG_DELIVERED if delivered else 0, trace_id,
        ),
        bytes((len(exchange),)), exchange,
        bytes((len(routing_key),)), routing_key,
        _u32.pack(len(properties)), properties,
        body,
    ))  # fmt: skip
    return _frame(PUBLISH, payload)


def encode_remove(msg_id: int) -> bytes:
    return _frame(REMOVE, _id.pack(msg_id))


def encode_delivered(msg_id: int) -> bytes:
    return _frame(DELIVERED, _id.pack(msg_id))


def encode_state(msg_id: int, delivery_count: int, retries: int, retry_at_wall: float) -> bytes:
    return _frame(STATE, _state.pack(msg_id, delivery_count, retries, retry_at_wall, 0))


@dataclass(slots=True)
class PublishRecord:
    msg_id: int
    queue_id: int
    expires_wall: float
    delivery_count: int
    retries: int
    retry_at_wall: float
    delivered: bool
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes | None  # None: left on disk (past the queue's memory limit)
    body_size: int
    body_offset: int  # where the body starts: in the payload, then (the store) in the file
    trace_id: int
    segment: int = 0  # the segment file holding it (set by the store)
    record_start: int = 0  # where the whole record starts in that file (set by the store)
    # False: only its place was read (a packed message: no deadline, count or retry state);
    # exchange, routing key and properties are empty here (Pager.read_record)
    decoded: bool = True


def publish_header_size(exchange: int, routing_key: int, properties: int) -> int:
    """Bytes of a PUBLISH record before its body, for names and properties of these sizes."""
    return HEADER_SIZE + 1 + _publish.size + 1 + exchange + 1 + routing_key + 4 + properties


def decode_record(data: bytes, at: int, length: int, names: dict[bytes, str]) -> PublishRecord:
    """The PUBLISH record of ``length`` bytes at ``data[at:]``, written and checked before."""
    return decode_publish(
        data, at + HEADER_SIZE + 1, at + length, data[at + HEADER_SIZE], True, names
    )


def decode_publish(
    data: bytes, start: int, end: int, kind: int, keep_body: bool, names: dict[bytes, str]
) -> PublishRecord:
    """The PUBLISH (or older PUBLISH_V1) payload at ``data[start:end]``.

    The body is copied only if ``keep_body``; exchange and routing key strings
    are shared through ``names`` (a few distinct ones among millions of messages).
    """
    if kind == PUBLISH:
        fields = _publish.unpack_from(data, start)
        msg_id, queue_id, expires, count, retries, retry_at, flags, trace_id = fields
        off = start + _publish.size
    else:
        fields = _publish_v1.unpack_from(data, start)
        msg_id, queue_id, expires, count, retries, retry_at, flags = fields
        trace_id = 0
        off = start + _publish_v1.size
    n = data[off]
    raw = data[off : off + 1 + n]
    exchange = names.get(raw)
    if exchange is None:
        exchange = names[raw] = str(raw[1:], "utf-8", "surrogateescape")
    off += 1 + n
    n = data[off]
    raw = data[off : off + 1 + n]
    routing_key = names.get(raw)
    if routing_key is None:
        routing_key = names[raw] = str(raw[1:], "utf-8", "surrogateescape")
    off += 1 + n
    (plen,) = _u32.unpack_from(data, off)
    off += 4 + plen
    if off > end:
        raise ValueError("publish record truncated")
    return PublishRecord(
        msg_id, queue_id, expires, count, retries, retry_at, bool(flags & FLAG_DELIVERED),
        exchange, routing_key, data[off - plen : off], data[off:end] if keep_body else None,
        end - off, off, trace_id,
    )  # fmt: skip


def publish_place(data: bytes, start: int, end: int, kind: int) -> tuple[int, bool, int, int]:
    """(id, plain, flags, body start) of a PUBLISH or PUBLISH_V1 payload at ``data[start:end]``,
    without decoding its names and properties; plain: no deadline, delivery count, retries
    or retry time."""
    if kind == PUBLISH:
        msg_id, _, expires, count, retries, retry_at, flags, _ = _publish.unpack_from(data, start)
        off = start + _publish.size
    else:
        msg_id, _, expires, count, retries, retry_at, flags = _publish_v1.unpack_from(data, start)
        off = start + _publish_v1.size
    off += 1 + data[off]
    off += 1 + data[off]
    off += 4 + _u32.unpack_from(data, off)[0]
    if off > end:
        raise ValueError("publish record truncated")
    return msg_id, not (expires or count or retries or retry_at), flags, off


def queue_of(data: bytes, start: int) -> int:
    """The queue id of a PUBLISH or PUBLISH_V1 payload (both start with id, queue)."""
    return int(_u32.unpack_from(data, start + 8)[0])


def decode_id(data: bytes, start: int) -> int:
    return int(_id.unpack_from(data, start)[0])


def decode_state(data: bytes, start: int) -> tuple[int, int, int, float]:
    msg_id, count, retries, retry_at, _ = _state.unpack_from(data, start)
    return msg_id, count, retries, retry_at


def legacy_records(data: bytes) -> Iterator[tuple[int, int, int]]:
    """Yield (offset just past the record, payload start - 1, end) of a segment written
    before the magic, until its data ends or breaks (the caller sees where it stopped);
    ``data[start - 1:end]`` is the record's type and payload."""
    view = memoryview(data)
    off = 0
    size = len(data)
    crc32 = zlib.crc32
    while off + LEGACY_HEADER_SIZE <= size:
        length, crc = _head.unpack_from(data, off)
        if length == 0 or length > MAX_RECORD or off + LEGACY_HEADER_SIZE + length > size:
            return
        start = off + LEGACY_HEADER_SIZE
        off = start + length
        if crc32(view[start:off]) != crc:
            return
        yield off, start, off


def is_legacy(data: bytes) -> bool:
    """A segment written before records had a magic."""
    return bool(data) and not data.startswith(MAGIC)


def _valid_at(data: bytes, view: memoryview, off: int, size: int) -> int:
    """The end of the record at ``off`` if one is there whole and intact, else 0."""
    if off + HEADER_SIZE > size:
        return 0
    magic, length, crc = _magic_head.unpack_from(data, off)
    if magic != MAGIC or length == 0 or length > MAX_RECORD:
        return 0
    end: int = off + HEADER_SIZE + length
    if end > size:
        return 0
    if zlib.crc32(view[off + HEADER_SIZE : end], zlib.crc32(view[off + 4 : off + 8])) != crc:
        return 0
    return end


def scan_records(data: bytes) -> Iterator[tuple[int, int, int]]:
    """Yield (offset just past the record, type, payload start) for every intact record,
    and (end of the damage, DAMAGED, start of the damage) for each stretch of bytes that
    holds none: after a damaged record the scan goes on at the next magic that starts an
    intact one. The payload is ``data[start:end]``, left for the decoders to read in place.
    """
    view = memoryview(data)
    off = 0
    size = len(data)
    crc32 = zlib.crc32
    unpack = _magic_head.unpack_from
    while off < size:
        if off + HEADER_SIZE <= size:
            magic, length, crc = unpack(data, off)
            end = off + HEADER_SIZE + length
            if (
                magic == MAGIC and 0 < length <= MAX_RECORD and end <= size
                and crc32(view[off + HEADER_SIZE : end], crc32(view[off + 4 : off + 8])) == crc
            ):  # fmt: skip
                yield end, data[off + HEADER_SIZE], off + HEADER_SIZE + 1
                off = end
                continue
        damaged = off
        off = data.find(MAGIC, off + 1)
        while off >= 0 and not _valid_at(data, view, off, size):
            off = data.find(MAGIC, off + 1)
        if off < 0:
            off = size
        yield off, DAMAGED, damaged


def damaged_publish(data: bytes, off: int, end: int) -> tuple[int, int] | None:
    """(id, queue id) of the PUBLISH record that seems to start a damaged stretch at
    ``data[off:end]`` (its header and the first fields intact, its CRC not), for the log
    to say whose message was lost; None if nothing there can be read as one."""
    if end - off < HEADER_SIZE + 1 + 12 or data[off : off + 4] != MAGIC:
        return None
    if data[off + HEADER_SIZE] not in (PUBLISH, PUBLISH_V1):
        return None
    start = off + HEADER_SIZE + 1
    return decode_id(data, start), queue_of(data, start)
