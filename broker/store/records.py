"""The message log's record format, without I/O.

A record is ``length u32 | crc32 u32 | type u8 | payload``; length and CRC
cover type and payload, so a torn or garbled tail is detected, never trusted.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from struct import Struct

PUBLISH = 1  # a persistent message entered a durable queue
REMOVE = 2  # acked, expired, purged, dead-lettered or dropped
DELIVERED = 3  # delivered at least once: it comes back with redelivered=true
STATE = 4  # delivery count and retry state after a return

_head = Struct(">IIB")
_publish = Struct(">QIdIIdB")  # id, queue, expires (wall), delivery count, retries, retry at, flags
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
) -> bytes:
    payload = b"".join((
        _publish.pack(
            msg_id, queue_id, expires_wall, delivery_count, retries, retry_at_wall,
            FLAG_DELIVERED if delivered else 0,
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


@dataclass
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
    body: bytes


Record = tuple[int, object]


def decode_publish(payload: bytes) -> PublishRecord:
    msg_id, queue_id, expires, count, retries, retry_at, flags = _publish.unpack_from(payload, 0)
    off = _publish.size
    n = payload[off]
    exchange = payload[off + 1 : off + 1 + n].decode("utf-8", "surrogateescape")
    off += 1 + n
    n = payload[off]
    routing_key = payload[off + 1 : off + 1 + n].decode("utf-8", "surrogateescape")
    off += 1 + n
    (plen,) = _u32.unpack_from(payload, off)
    off += 4
    properties = payload[off : off + plen]
    body = payload[off + plen :]
    if len(properties) != plen:
        raise ValueError("publish record truncated")
    return PublishRecord(
        msg_id, queue_id, expires, count, retries, retry_at, bool(flags & FLAG_DELIVERED),
        exchange, routing_key, properties, body,
    )  # fmt: skip


def decode_id(payload: bytes) -> int:
    return int(_id.unpack_from(payload, 0)[0])


def decode_state(payload: bytes) -> tuple[int, int, int, float]:
    msg_id, count, retries, retry_at, _ = _state.unpack_from(payload, 0)
    return msg_id, count, retries, retry_at


def read_records(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Yield (offset just past the record, type, payload) until the data ends or breaks.

    The caller compares the last offset with ``len(data)`` to see whether a tail
    was torn or corrupt.
    """
    off = 0
    size = len(data)
    while off + HEADER_SIZE <= size:
        length, crc = _head.unpack_from(data, off)[:2]
        if length == 0 or length > MAX_RECORD or off + HEADER_SIZE + length > size:
            return
        body = data[off + HEADER_SIZE : off + HEADER_SIZE + length]
        if zlib.crc32(body) != crc:
            return
        off += HEADER_SIZE + length
        yield off, body[0], body[1:]
