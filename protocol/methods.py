"""Method frames: decoding what clients send, encoding what the broker sends.

The hot methods (basic.publish, ack, nack, reject, deliver, the confirms) are
coded by hand: read with librt.strings' reads, which the compiled build turns into
loads, and a delivery's frames up to its body written into one librt BytesWriter (packed
with ``struct`` in the pure build); the rest go through pamqp's classes. Encoding
never runs pamqp's name validation: RabbitMQ accepts any UTF-8 short string
as a queue, exchange or consumer name, and the methods that echo names back
must carry them unchanged.
"""

from __future__ import annotations

import types
from struct import Struct
from struct import error as StructError
from typing import Any, Final, TypeAlias

from librt.strings import BytesWriter, read_i16_be, read_i64_be, write_i32_be, write_i64_be
from pamqp import base, commands, encode

from warren.protocol.constants import FRAME_ERROR, FRAME_METHOD, NOT_IMPLEMENTED
from warren.protocol.errors import SURROGATES, ConnectionError_, erlang_binary
from warren.protocol.tables import TableError, decode_table, encode_table

_HH: Final = Struct(">HH")
_frame_head: Final = Struct(">BHI")
_u16: Final = Struct(">H")
_u32: Final = Struct(">I")


class BasicPublish:
    __slots__ = ("ex_rk", "exchange", "immediate", "mandatory", "routing_key")
    name = "Basic.Publish"
    index = 0x003C0028

    def __init__(
        self, exchange: str, routing_key: str, mandatory: bool, immediate: bool, ex_rk: bytes = b""
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        # exchange and routing key as the two short strings received: what basic.deliver
        # and basic.return carry, so that they are never encoded again
        self.ex_rk = ex_rk


class BasicAck:
    __slots__ = ("delivery_tag", "multiple")
    name = "Basic.Ack"
    index = 0x003C0050

    def __init__(self, delivery_tag: int, multiple: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple


class BasicNack:
    __slots__ = ("delivery_tag", "multiple", "requeue")
    name = "Basic.Nack"
    index = 0x003C0078

    def __init__(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.multiple = multiple
        self.requeue = requeue


class BasicReject:
    __slots__ = ("delivery_tag", "requeue")
    name = "Basic.Reject"
    index = 0x003C005A

    def __init__(self, delivery_tag: int, requeue: bool) -> None:
        self.delivery_tag = delivery_tag
        self.requeue = requeue


class AccessRequest:
    """access.request: AMQP 0-8's, not in 0-9-1 (nor in pamqp), yet some old clients send
    it; RabbitMQ answers it with ticket 1."""

    __slots__ = ("realm",)
    name = "Access.Request"
    index = 0x001E000A

    def __init__(self, realm: str) -> None:
        self.realm = realm


def access_request_ok_frame(channel: int) -> bytes:
    return _frame_head.pack(FRAME_METHOD, channel, 6) + b"\x00\x1e\x00\x0b\x00\x01\xce"


# what decode_method returns: a pamqp command, or one of the hand-decoded classes above
Method: TypeAlias = base.Frame | BasicPublish | BasicAck | BasicNack | BasicReject | AccessRequest


def _shortstr(buf: bytes, off: int) -> tuple[str, int]:
    n = buf[off]
    end = off + 1 + n
    if end > len(buf):
        raise IndexError
    return bytes(buf[off + 1 : end]).decode("utf-8", "surrogateescape"), end


# A publisher mostly repeats a few exchange and routing key pairs: their strings, and the
# short strings as received (what basic.deliver carries), decoded once and shared by the
# messages (bounded: emptied when full, as routing keys may all differ).
_NAMES: Final[dict[bytes, tuple[str, str, bytes]]] = {}
_NAMES_MAX: Final = 4096


def _publish_names(payload: bytes, end: int) -> tuple[str, str, bytes]:
    exchange, off = _shortstr(payload, 6)
    routing_key, _ = _shortstr(payload, off)
    if len(_NAMES) >= _NAMES_MAX:
        _NAMES.clear()
    key = bytes(payload[6:end])
    names = _NAMES[key] = (exchange, routing_key, key)
    return names


def decode_method(payload: bytes) -> Method:
    """Decode a method frame's payload (at least 4 octets); bad ones close the connection."""
    class_id: int = read_i16_be(payload, 0)  # librt's reads: see _next_event
    class_id &= 0xFFFF
    method_id: int = read_i16_be(payload, 2)
    method_id &= 0xFFFF
    size = len(payload)
    try:
        if class_id == 60:
            if method_id == 40:
                off = 8 + payload[6]
                off += payload[off - 1]  # after the routing key: the bits
                if off + 1 != size:
                    raise IndexError
                # payload is bytes: its slice is too (bytes() would be a call, compiled)
                names = _NAMES.get(payload[6:off])
                if names is None:
                    names = _publish_names(payload, off)
                bits = payload[off]
                return BasicPublish(names[0], names[1], bool(bits & 1), bool(bits & 2), names[2])
            if method_id == 80 or method_id == 120 or method_id == 90:
                if size != 13:
                    raise IndexError
                tag: int = read_i64_be(payload, 4)
                if tag < 0:  # a tag past 2**63
                    tag += 1 << 64
                bits = payload[12]
                if method_id == 80:
                    return BasicAck(tag, bool(bits & 1))
                if method_id == 120:
                    return BasicNack(tag, bool(bits & 1), bool(bits & 2))
                return BasicReject(tag, bool(bits & 1))
        elif class_id == 30 and method_id == 10:
            realm, off = _shortstr(payload, 4)
            if off + 1 != size:  # then the exclusive, passive, active, write and read bits
                raise IndexError
            return AccessRequest(realm)
    except (IndexError, StructError):
        raise _malformed(payload, class_id, method_id) from None
    cls = commands.INDEX_MAPPING.get((class_id << 16) | method_id)
    if cls is None:
        raise ConnectionError_(
            NOT_IMPLEMENTED,
            f"unknown method (class {class_id}, method {method_id})",
            class_id,
            method_id,
        )
    method: base.Frame = object.__new__(cls)
    try:
        if _unmarshal(method, payload[4:]) != size - 4:
            raise IndexError  # trailing octets: RabbitMQ cannot decode this either
    except (IndexError, StructError, ValueError, TypeError, TableError):
        raise _malformed(payload, class_id, method_id) from None
    return method


def _malformed(payload: bytes, class_id: int, method_id: int) -> ConnectionError_:
    return ConnectionError_(
        FRAME_ERROR, f"cannot decode {erlang_binary(payload[4:])}", class_id, method_id
    )


_DECODERS: dict[str, Struct] = {
    "octet": Struct(">B"),
    "short": Struct(">H"),
    "long": Struct(">I"),
    "longlong": Struct(">Q"),
    "timestamp": Struct(">Q"),
}


def _unmarshal(method: Any, data: bytes) -> int:
    """pamqp's field walk with our field-table decoder; returns the octets used."""
    off = 0
    bit_index = 8
    bits = 0
    for attr in method.attributes():
        kind = method.amqp_type(attr)
        value: Any
        if kind == "bit":
            if bit_index == 8:
                bits = data[off]
                off += 1
                bit_index = 0
            setattr(method, attr, bool(bits & (1 << bit_index)))
            bit_index += 1
            continue
        bit_index = 8
        if kind == "shortstr":
            value, off = _shortstr(data, off)
        elif kind == "longstr":
            (n,) = _DECODERS["long"].unpack_from(data, off)
            off += 4
            if off + n > len(data):
                raise IndexError
            value = bytes(data[off : off + n])
            off += n
        elif kind == "table":
            value, off = decode_table(data, off, typed=True)
        else:
            decoder = _DECODERS[kind]
            (value,) = decoder.unpack_from(data, off)
            off += decoder.size
        setattr(method, attr, value)
    return off


def encode_method_payload(method: Any) -> bytes:
    """pamqp's field walk without its name validation."""
    out = [_HH.pack(method.index >> 16, method.index & 0xFFFF)]
    bit_index = -1
    byte = 0
    for attr in method.attributes():
        kind = method.amqp_type(attr)
        value: Any = getattr(method, attr, 0)
        if kind == "bit":
            if bit_index == -1:
                byte, bit_index = 0, 0
            if value:
                byte |= 1 << bit_index
            bit_index += 1
            if bit_index == 8:
                out.append(bytes((byte,)))
                bit_index = -1
            continue
        if bit_index != -1:
            out.append(bytes((byte,)))
            bit_index = -1
        if kind == "shortstr":
            raw = (value or "").encode("utf-8", "surrogateescape")
            out.append(bytes((len(raw),)) + raw)
        elif kind == "longstr":
            if not isinstance(value, bytes):
                value = str(value or "").encode("utf-8", SURROGATES)
            out.append(len(value).to_bytes(4, "big") + value)
        elif kind == "table":
            out.append(encode_table(value or {}))
        else:
            out.append(encode.by_type(value or 0, kind))
    if bit_index != -1:
        out.append(bytes((byte,)))
    return b"".join(out)


def make(cls: Any, **fields: Any) -> Any:
    """A pamqp method with these fields, skipping pamqp's name validation."""
    method = cls()
    for name, value in fields.items():
        setattr(method, name, value)
    return method


def method_frame(channel: int, method: Any) -> bytes:
    payload = encode_method_payload(method)
    return _frame_head.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


# ---- hand-coded server methods on the message path ----

_ack_frame: Final = Struct(">BHIHHQBB")  # frame head, class, method, tag, bits, frame end


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ack_frame.pack(1, channel, 13, 60, 80, delivery_tag, multiple, 0xCE)


def nack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ack_frame.pack(1, channel, 13, 60, 120, delivery_tag, multiple | 2, 0xCE)


def shortstr(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape")
    return bytes((len(raw),)) + raw


# True in the pure-Python build: delivery_head then packs with struct (tests/test_compiled.py)
INTERPRETED: Final = isinstance(shortstr, types.FunctionType)


_deliver_tail: Final = Struct(">QB")
_end_content_head: Final = Struct(">BBHIHHQ")  # a frame's end, then a content header's head
_end_frame_head: Final = Struct(">BBHI")  # a frame's end, then a frame's head
_head_writer: Final = BytesWriter()  # delivery_head's, emptied at each call


def deliver_frame(
    channel: int, ctag_enc: bytes, tag: int, redelivered: bool, ex_rk: bytes
) -> bytes:
    """basic.deliver; ``ctag_enc`` and ``ex_rk`` are pre-encoded short strings."""
    size = 4 + len(ctag_enc) + 9 + len(ex_rk)
    return b"".join(
        (
            _frame_head.pack(1, channel, size),
            b"\x00\x3c\x00\x3c",
            ctag_enc,
            _deliver_tail.pack(tag, redelivered),
            ex_rk,
            b"\xce",
        )
    )


class DeliveryPrefix:
    """A consumer's basic.deliver octets that only its exchange and routing key change:
    ``head``, the frame's head, the method's ids and the consumer tag (what precedes the
    delivery tag), and ``mid``, the exchange and routing key, the frame's end and the
    content header frame's type and channel (what follows the redelivered flag). Built
    for ``ex_rk`` at its second delivery in a row: a consumer fed many routing keys in turn
    builds none and has its deliveries written field by field."""

    __slots__ = (
        "body_head",
        "channel",
        "ctag_enc",
        "ex_rk",
        "head",
        "header",
        "header_for",
        "header_size",
        "mid",
        "seen",
    )

    def __init__(self, channel: int, ctag_enc: bytes) -> None:
        self.channel = channel
        self.ctag_enc = ctag_enc  # the consumer tag as a short string
        # a content header's end, then a body frame's type and channel
        self.body_head = b"\xce\x03" + _u16.pack(channel)
        self.ex_rk = b""  # what head and mid are for (b"": none yet; a real one has 2 octets)
        self.seen = b""  # the previous delivery's
        self.head = b""
        self.mid = b""
        # the content header frame's octets after its type and channel, and the body frame's
        # head, for the properties object and body size of the previous delivery of one body
        # frame: built at the second delivery in a row of both (b"": none yet)
        self.header_for = b""
        self.header_size = -1
        self.header = b""

    def build(self, ex_rk: bytes) -> None:
        ctag_enc = self.ctag_enc
        size = 4 + len(ctag_enc) + 9 + len(ex_rk)
        self.head = _frame_head.pack(1, self.channel, size) + b"\x00\x3c\x00\x3c" + ctag_enc
        self.mid = ex_rk + b"\xce\x02" + _u16.pack(self.channel)
        self.ex_rk = ex_rk


_content_size: Final = Struct(">IHHQ")  # a content header's frame size, class, weight, body size


def delivery_head(
    prefix: DeliveryPrefix,
    tag: int,
    redelivered: bool,
    ex_rk: bytes,
    properties: bytes,
    body_size: int,
    body_frame: bool,
    body: bytes = b"",
    packed: bool = INTERPRETED,
) -> bytes:
    """basic.deliver, the content header frame, and (``body_frame``: the body fits in one
    frame) the body frame's head: all that precedes the body, in one piece. With ``body``
    (a small body of one frame), the body and the frame's end too: the whole delivery.
    ``prefix``: the consumer's (its channel, its tag, the octets kept for ``ex_rk``).

    Compiled, the fields are written into one buffer, the prefix's pieces whole (a write
    costs about as much as a field); interpreted (``packed``), joined with struct's packs."""
    if ex_rk != prefix.ex_rk:  # the same object mostly (methods.py's _NAMES): no memcmp
        if ex_rk != prefix.seen:
            prefix.seen = ex_rk
            return delivery_head_fields(
                prefix.channel, prefix.ctag_enc, tag, redelivered, ex_rk, properties,
                body_size, body_frame, body, packed,
            )  # fmt: skip
        prefix.build(ex_rk)
    if packed:
        deliver = _deliver_tail.pack(tag, redelivered)
        header = _content_size.pack(12 + len(properties), 60, 0, body_size)
        if not body_frame:
            return b"".join((prefix.head, deliver, prefix.mid, header, properties, b"\xce"))
        size = _u32.pack(body_size)
        return b"".join(
            (prefix.head, deliver, prefix.mid, header, properties, prefix.body_head, size, body,
             b"\xce" if body else b"")
        )  # fmt: skip
    w = _head_writer  # one buffer for every delivery: no writer (and its buffer) to make
    w.truncate(0)
    w.write(prefix.head)
    write_i64_be(w, tag)
    w.append(1 if redelivered else 0)
    w.write(prefix.mid)
    # the same properties object (the reader hands on the previous header's when its octets
    # repeat) and size as the consumer's previous delivery: its content header kept whole
    if body_frame and properties is prefix.header_for and body_size == prefix.header_size:
        header = prefix.header
        if not len(header):
            header = prefix.header = (
                _content_size.pack(12 + len(properties), 60, 0, body_size)
                + properties + prefix.body_head + _u32.pack(body_size)
            )  # fmt: skip
        w.write(header)
    else:
        write_i32_be(w, 12 + len(properties))
        w.write(b"\x00\x3c\x00\x00")  # class 60, weight 0
        write_i64_be(w, body_size)
        w.write(properties)
        if not body_frame:
            w.append(0xCE)
            return w.getvalue()
        prefix.header_for = properties
        prefix.header_size = body_size
        prefix.header = b""
        w.write(prefix.body_head)
        write_i32_be(w, body_size)
    if len(body) != 0:  # compiled, a bytes' truth is a generic call; its length is not
        w.write(body)
        w.append(0xCE)
    return w.getvalue()


def delivery_head_fields(
    channel: int,
    ctag_enc: bytes,
    tag: int,
    redelivered: bool,
    ex_rk: bytes,
    properties: bytes,
    body_size: int,
    body_frame: bool,
    body: bytes = b"",
    packed: bool = INTERPRETED,
) -> bytes:
    """``delivery_head`` without a prefix: every field written (a consumer's first
    delivery of an exchange and routing key, or one fed many in turn).

    Compiled, each field is a store into one buffer (struct's packs cost more than the rest
    of a delivery there); channels and frame sizes fit the signed writes. Interpreted
    (``packed``, the pure build's default), a call per field costs more than a few packs."""
    if packed:
        return b"".join(
            (
                _frame_head.pack(1, channel, 4 + len(ctag_enc) + 9 + len(ex_rk)),
                b"\x00\x3c\x00\x3c",
                ctag_enc,
                _deliver_tail.pack(tag, redelivered),
                ex_rk,
                _end_content_head.pack(0xCE, 2, channel, 12 + len(properties), 60, 0, body_size),
                properties,
                _end_frame_head.pack(0xCE, 3, channel, body_size) if body_frame else b"\xce",
                body,
                b"\xce" if body else b"",
            )
        )
    w = _head_writer  # one buffer for every delivery: no writer (and its buffer) to make
    w.truncate(0)
    w.append(1)
    w.append(channel >> 8)
    w.append(channel & 0xFF)
    write_i32_be(w, 4 + len(ctag_enc) + 9 + len(ex_rk))
    w.write(b"\x00\x3c\x00\x3c")
    w.write(ctag_enc)
    write_i64_be(w, tag)
    w.append(1 if redelivered else 0)
    w.write(ex_rk)
    w.append(0xCE)
    w.append(2)
    w.append(channel >> 8)
    w.append(channel & 0xFF)
    write_i32_be(w, 12 + len(properties))
    w.write(b"\x00\x3c\x00\x00")  # class 60, weight 0
    write_i64_be(w, body_size)
    w.write(properties)
    w.append(0xCE)
    if body_frame:
        w.append(3)
        w.append(channel >> 8)
        w.append(channel & 0xFF)
        write_i32_be(w, body_size)
        if len(body) != 0:  # compiled, a bytes' truth is a generic call; its length is not
            w.write(body)
            w.append(0xCE)
    return w.getvalue()


_get_ok_tail: Final = Struct(">I")


def get_ok_frame(channel: int, tag: int, redelivered: bool, ex_rk: bytes, count: int) -> bytes:
    size = 4 + 9 + len(ex_rk) + 4
    return b"".join(
        (
            _frame_head.pack(1, channel, size),
            b"\x00\x3c\x00\x47",
            _deliver_tail.pack(tag, redelivered),
            ex_rk,
            _get_ok_tail.pack(count),
            b"\xce",
        )
    )


def return_frame(channel: int, code: int, text: str, ex_rk: bytes) -> bytes:
    body = b"\x00\x3c\x00\x32" + _u16.pack(code) + shortstr(text) + ex_rk
    return _frame_head.pack(1, channel, len(body)) + body + b"\xce"


def cancel_frame(channel: int, consumer_tag: str) -> bytes:
    """Server-sent basic.cancel (nowait), for consumer_cancel_notify clients."""
    body = b"\x00\x3c\x00\x1e" + shortstr(consumer_tag) + b"\x01"
    return _frame_head.pack(1, channel, len(body)) + body + b"\xce"
