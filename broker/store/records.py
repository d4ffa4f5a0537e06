"""The message log's record format, without I/O.

A record is ``length u32 | crc32 u32 | type u8 | payload``; length and CRC
cover type and payload, so a torn or garbled tail is detected, never trusted.
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
# id, queue, expires (wall), delivery count, retries, retry at, flags; PUBLISH adds the trace id
_publish_v1 = Struct(">QIdIIdB")
_publish = Struct(">QIdIIdBQ")
_id = Struct(">Q")
_state = Struct(">QIIdB")
_u32 = Struct(">I")

HEADER_SIZE = 8
MAX_RECORD = 1 << 30

FLAG_DELIVERED = 1


def _frame(kind: int, payload: bytes) -> bytes:
    body = bytes((kind,)) + payload
    return _u32.pack(len(body)) + _u32.pack(zlib.crc32(body)) + body


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
    # exchange, routing key and properties are empty here (MessageStore.read_record)
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


def read_records(data: bytes) -> Iterator[tuple[int, int, int]]:
    """Yield (offset just past the record, type, payload start) until the data ends or breaks.

    The payload is ``data[start:end]``, left for the decoders to read in place.
    The caller compares the last offset with ``len(data)`` to see whether a
    tail was torn or corrupt.
    """
    view = memoryview(data)
    off = 0
    size = len(data)
    crc32 = zlib.crc32
    while off + HEADER_SIZE <= size:
        length, crc = _head.unpack_from(data, off)
        if length == 0 or length > MAX_RECORD or off + HEADER_SIZE + length > size:
            return
        start = off + HEADER_SIZE
        off = start + length
        if crc32(view[start:off]) != crc:
            return
        yield off, data[start], start + 1
