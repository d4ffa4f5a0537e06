"""The sans-IO protocol layer, driven with byte strings only."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands
from pamqp.header import ContentHeader

from warren.protocol import (
    NEED_DATA,
    ChannelError,
    ConnectionError_,
    ConnectionState,
    Content,
    ProtocolConnection,
    Sentinel,
)
from warren.protocol.constants import PROTOCOL_HEADER
from warren.protocol.frames import content_frames
from warren.protocol.methods import (
    BasicAck,
    BasicPublish,
    decode_method,
    deliver_frame,
    encode_method_payload,
    method_frame,
    shortstr,
)
from warren.protocol.properties import (
    is_persistent,
    join_properties,
    read_properties,
    split_properties,
)
from warren.protocol.tables import decode_table, encode_table, join_entries, table_entries


def frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def publish_payload(
    exchange: str, key: str, mandatory: bool = False, immediate: bool = False
) -> bytes:
    bits = int(mandatory) | (int(immediate) << 1)
    return b"\x00\x3c\x00\x28\x00\x00" + shortstr(exchange) + shortstr(key) + bytes((bits,))


def header_payload(size: int, props: bytes = b"\x00\x00") -> bytes:
    return struct.pack(">HHQ", 60, 0, size) + props


def method(channel: int, value: object) -> bytes:
    return frame(1, channel, encode_method_payload(value))


def handshaken(
    frame_max: int = 8192, max_message_size: int = 1 << 20, channel_max: int = 0
) -> ProtocolConnection[None]:
    """A connection through the handshake, the broker's part played with ``send``."""
    conn: ProtocolConnection[None] = ProtocolConnection(frame_max, max_message_size)
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.next_event() is Sentinel.PROTOCOL_HEADER
    conn.send(0, commands.Connection.Start())
    conn.receive_data(method(0, commands.Connection.StartOk(response="\0guest\0guest")))
    assert isinstance(conn.next_event()[1], commands.Connection.StartOk)  # type: ignore[index]
    conn.send(0, commands.Connection.Tune(channel_max, frame_max, 60))
    conn.receive_data(method(0, commands.Connection.TuneOk(channel_max, frame_max, 30)))
    assert isinstance(conn.next_event()[1], commands.Connection.TuneOk)  # type: ignore[index]
    conn.receive_data(method(0, commands.Connection.Open()))
    assert isinstance(conn.next_event()[1], commands.Connection.Open)  # type: ignore[index]
    conn.send(0, commands.Connection.OpenOk())
    assert conn.state is ConnectionState.OPEN
    return conn


def open_channel(conn: ProtocolConnection[None], channel: int) -> None:
    conn.receive_data(method(channel, commands.Channel.Open()))
    got, opened_ = conn.next_event()  # type: ignore[misc]
    assert got == channel and isinstance(opened_, commands.Channel.Open)
    conn.send(channel, commands.Channel.OpenOk())


def opened(frame_max: int = 8192, max_message_size: int = 1 << 20) -> ProtocolConnection[None]:
    conn = handshaken(frame_max, max_message_size)
    open_channel(conn, 1)
    return conn


def channel_close(code: int = 406) -> commands.Channel.Close:
    return commands.Channel.Close(code, "PRECONDITION_FAILED - x", 60, 40)


def events(conn: ProtocolConnection) -> list[object]:
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
    return out


def contents(conn: ProtocolConnection) -> list[Content]:
    """The events, every one a message (an event of its own, not a tuple)."""
    got = events(conn)
    assert all(isinstance(event, Content) for event in got), got
    return got  # type: ignore[return-value]


def test_protocol_header_byte_by_byte() -> None:
    conn = ProtocolConnection(4096, 1000)
    for byte in PROTOCOL_HEADER[:-1]:
        conn.receive_data(bytes((byte,)))
        assert conn.next_event() is NEED_DATA
    conn.receive_data(PROTOCOL_HEADER[-1:])
    assert conn.next_event() is Sentinel.PROTOCOL_HEADER


@pytest.mark.parametrize(
    "header", [b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n", b"AMQP\x00\x00\x09\x02"]
)
def test_bad_protocol_header(header: bytes) -> None:
    conn = ProtocolConnection(4096, 1000)
    conn.receive_data(header)
    assert conn.next_event() is Sentinel.BAD_PROTOCOL_HEADER
    assert conn.next_event() is NEED_DATA


def test_publish_assembled_from_split_frames() -> None:
    conn = opened()
    body = bytes(range(256)) * 80  # 20480 octets: three body frames at frame_max 8192
    stream = frame(1, 1, publish_payload("ex", "rk", mandatory=True)) + frame(
        2, 1, header_payload(len(body), b"\x80\x00" + shortstr("text/plain"))
    )
    for start in range(0, len(body), 8184):
        stream += frame(3, 1, body[start : start + 8184])
    # feed in awkward pieces: the parser must wait for whole frames
    got: list[object] = []
    for i in range(0, len(stream), 777):
        conn.receive_data(stream[i : i + 777])
        got.extend(events(conn))
    assert len(got) == 1
    content = got[0]  # a message is an event of its own, not a (channel, method) tuple
    assert isinstance(content, Content) and content.channel == 1
    assert content.body == body
    assert content.method.exchange == "ex" and content.method.mandatory
    assert read_properties(content.properties) == {"content_type": "text/plain"}


def test_empty_body_needs_no_body_frame() -> None:
    conn = opened()
    conn.receive_data(frame(1, 1, publish_payload("", "q")) + frame(2, 1, header_payload(0)))
    (content,) = events(conn)
    assert isinstance(content, Content) and content.body == b""


def test_frame_larger_than_frame_max_is_frame_error() -> None:
    conn = opened(frame_max=8192)
    conn.receive_data(frame(3, 1, b"x" * 8193))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 501
    assert info.value.text == "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,8193,8184}"
    assert conn.next_event() is NEED_DATA  # nothing more is parsed after a connection error


def test_frame_of_exactly_frame_max_is_accepted() -> None:
    conn = opened(frame_max=8192)
    conn.receive_data(
        frame(1, 1, publish_payload("", "q"))
        + frame(2, 1, header_payload(8192))
        + frame(3, 1, b"y" * 8192)
    )
    (content,) = events(conn)
    assert isinstance(content, Content) and len(content.body) == 8192


def test_bad_frame_end_is_frame_error() -> None:
    conn = opened()
    conn.receive_data(frame(1, 1, encode_method_payload(commands.Basic.Qos()), end=0x00))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 501


def test_unknown_method_is_not_implemented() -> None:
    conn = opened()
    conn.receive_data(frame(1, 1, b"\x00\x3c\x03\xe7"))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 540


def test_method_on_unopened_channel_is_channel_error() -> None:
    conn = opened()
    conn.receive_data(frame(1, 7, encode_method_payload(commands.Basic.Qos())))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 504
    assert info.value.text == "CHANNEL_ERROR - expected 'channel.open'"


def test_header_without_publish_is_unexpected_frame() -> None:
    conn = opened()
    conn.receive_data(frame(2, 1, header_payload(3)))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 505


def test_method_while_content_expected_is_unexpected_frame() -> None:
    conn = opened()
    conn.receive_data(frame(1, 1, publish_payload("", "q")) + frame(1, 1, publish_payload("", "q")))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 505


def test_oversized_message_is_a_channel_error_and_its_frames_are_dropped() -> None:
    conn = opened(max_message_size=10)
    conn.receive_data(frame(1, 1, publish_payload("", "q")) + frame(2, 1, header_payload(11)))
    with pytest.raises(ChannelError) as info:
        conn.next_event()
    assert info.value.code == 406 and info.value.channel == 1
    conn.send(1, channel_close())  # what the broker does with the error
    conn.receive_data(
        frame(3, 1, b"x" * 11) + frame(1, 1, encode_method_payload(commands.Channel.CloseOk()))
    )
    ((channel, method),) = events(conn)
    assert channel == 1 and isinstance(method, commands.Channel.CloseOk)


def test_closing_channel_ignores_everything_but_close_ok() -> None:
    conn = opened()
    conn.send(1, channel_close())
    conn.receive_data(
        frame(1, 1, publish_payload("", "q"))
        + frame(2, 1, header_payload(1))
        + frame(3, 1, b"z")
        + frame(1, 1, encode_method_payload(commands.Basic.Qos()))
        + frame(1, 1, encode_method_payload(commands.Channel.CloseOk()))
    )
    got = events(conn)
    assert len(got) == 1
    channel, method = got[0]  # type: ignore[misc]
    assert channel == 1 and isinstance(method, commands.Channel.CloseOk)
    # the id is free again
    conn.receive_data(frame(1, 1, encode_method_payload(commands.Channel.Open())))
    (reopened,) = events(conn)
    assert isinstance(reopened[1], commands.Channel.Open)  # type: ignore[index]


def test_channel_max_counts_open_channels() -> None:
    conn = handshaken(channel_max=2)
    open_channel(conn, 1)
    conn.receive_data(frame(1, 9, encode_method_payload(commands.Channel.Open())))
    assert len(events(conn)) == 1
    conn.receive_data(frame(1, 3, encode_method_payload(commands.Channel.Open())))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 530
    assert (
        "number of channels opened (2) has reached the negotiated channel_max (2)"
        in info.value.text
    )


def test_hot_methods_decoded_by_hand() -> None:
    publish = decode_method(publish_payload("ex ch|*", "ключ", mandatory=True))
    assert isinstance(publish, BasicPublish)
    assert (publish.exchange, publish.routing_key, publish.mandatory) == ("ex ch|*", "ключ", True)
    ack = decode_method(b"\x00\x3c\x00\x50" + struct.pack(">QB", 42, 1))
    assert isinstance(ack, BasicAck) and ack.delivery_tag == 42 and ack.multiple


def test_names_outside_pamqp_pattern_are_encoded() -> None:
    # pamqp's marshal refuses these names; RabbitMQ accepts any UTF-8 short string
    ok = commands.Queue.DeclareOk(queue="q", message_count=1, consumer_count=2)
    ok.queue = "queue with spaces|*ü"
    payload = encode_method_payload(ok)
    decoded = decode_method(payload)
    assert decoded.queue == "queue with spaces|*ü"
    assert (decoded.message_count, decoded.consumer_count) == (1, 2)


def test_deliver_frame_matches_pamqp_encoding() -> None:
    ours = deliver_frame(5, shortstr("ctag"), 7, True, shortstr("ex") + shortstr("rk"))
    reference = method_frame(
        5,
        commands.Basic.Deliver(
            consumer_tag="ctag", delivery_tag=7, redelivered=True, exchange="ex", routing_key="rk"
        ),
    )
    assert ours == reference


def test_content_frames_split_at_frame_max() -> None:
    parts = b"".join(content_frames(1, b"\x00\x00", b"a" * 10000, 4096))
    sizes = []
    off = 0
    while off < len(parts):
        ftype, _, size = struct.unpack_from(">BHI", parts, off)
        sizes.append((ftype, size))
        off += 8 + size
    assert sizes == [(2, 14), (3, 4088), (3, 4088), (3, 1824)]


def test_field_table_round_trip_every_type() -> None:
    raw = (
        b"\x01tt\x01"
        + b"\x01bb\xff"
        + b"\x01BB\xff"
        + b"\x01ss\xff\xfe"
        + b"\x01uu\xff\xfe"
        + b"\x01II\xff\xff\xff\xfe"
        + b"\x01ii\xff\xff\xff\xfe"
        + b"\x01ll"
        + b"\xff" * 8
        + b"\x01ff\x3f\x80\x00\x00"
        + b"\x01dd"
        + struct.pack(">d", 1.5)
        + b"\x01DD\x02\x00\x00\x01\x00"
        + b"\x01SS\x00\x00\x00\x02hi"
        + b"\x01AA\x00\x00\x00\x02t\x00"
        + b"\x01TT"
        + struct.pack(">Q", 1700000000)
        + b"\x01FF\x00\x00\x00\x00"
        + b"\x01VV"
        + b"\x01xx\x00\x00\x00\x01\x00"
    )
    table_bytes = struct.pack(">I", len(raw)) + raw
    decoded, end = decode_table(table_bytes)
    assert end == len(table_bytes)
    assert (
        decoded["b"] == -1 and decoded["B"] == 255 and decoded["s"] == -2 and decoded["u"] == 65534
    )
    assert decoded["I"] == -2 and decoded["i"] == 4294967294 and decoded["l"] == -1
    assert str(decoded["D"]) == "2.56" and decoded["S"] == "hi" and decoded["A"] == [False]
    assert decoded["F"] == {} and decoded["V"] is None and decoded["x"] == b"\x00"
    # splitting and joining keeps every value's bytes, whatever its type
    entries, _ = table_entries(table_bytes)
    assert join_entries(entries) == table_bytes


def test_field_table_nesting_is_bounded() -> None:
    nested: dict[str, object] = {}
    for _ in range(200):
        nested = {"n": nested}
    with pytest.raises(ValueError):
        decode_table(encode_table(nested))


def test_properties_split_and_join_are_exact() -> None:
    props = (
        b"\xff\xfc"
        + shortstr("ct")
        + shortstr("ce")
        + encode_table({"h": 1})
        + b"\x02\x05"
        + shortstr("cid")
        + shortstr("rt")
        + shortstr("100")
        + shortstr("mid")
        + struct.pack(">Q", 5)
        + shortstr("t")
        + shortstr("u")
        + shortstr("app")
        + shortstr("cluster")
    )
    fields = split_properties(props)
    assert len(fields) == 14
    assert join_properties(fields) == props
    assert read_properties(props)["expiration"] == "100"


@pytest.mark.parametrize(
    ("props", "persistent"),
    [
        (commands.Basic.Properties(delivery_mode=2), True),
        (commands.Basic.Properties(delivery_mode=1), False),
        (commands.Basic.Properties(), False),
        # the fields before delivery_mode are skipped by their lengths, not decoded
        (
            commands.Basic.Properties(
                content_type="x/y",
                content_encoding="gzip",
                headers={"h": "v" * 300},
                delivery_mode=2,
            ),
            True,
        ),
        (commands.Basic.Properties(content_type="\x02", headers={"a": 2}), False),
    ],
)
def test_is_persistent_reads_delivery_mode_from_the_raw_bytes(
    props: commands.Basic.Properties, persistent: bool
) -> None:
    raw = ContentHeader(0, 0, props).marshal()[12:]  # after class id, weight and body size
    assert is_persistent(raw) is persistent


def test_publishes_that_repeat_one_another_are_read_as_sent() -> None:
    """The reader reuses the previous publish's method and the previous header's checked
    properties when their octets repeat (compared in place): every message still carries
    exactly what was sent, whatever length and position the difference has."""
    conn = opened()
    long = "abcdefghijklmnopq"  # 17 octets: read 8 at a time, the last 8 overlapping
    keys = ["q", "abc", "abcdefg", "abcdefgh", long, long[:-1] + "r", "b" + long[1:]]
    props = [
        b"\x00\x00",
        b"\x80\x00" + shortstr("text/plain"),
        b"\x80\x00" + shortstr("text/plaim"),
        b"\x80\x00" + shortstr("uext/plain"),
        b"\x80\x00" + shortstr("t"),
        b"\x80\x00" + shortstr("u"),
        b"\x10\x00\x02",
        b"\x10\x00\x01",
    ]
    sent = []
    for key in keys:
        for mandatory in (False, True):
            for prop in props:
                for _ in range(2):
                    sent.append((key, mandatory, prop))
    stream = b"".join(
        frame(1, 1, publish_payload("ex", key, mandatory))
        + frame(2, 1, header_payload(1, prop))
        + frame(3, 1, b"x")
        for key, mandatory, prop in sent
    )
    conn.receive_data(stream)
    got = contents(conn)
    assert [(c.method.routing_key, c.method.mandatory, c.properties) for c in got] == sent


def test_malformed_properties_after_good_ones_of_their_length_are_refused() -> None:
    """Properties the same length as the previous header's, and not the same octets, are
    checked: a broken headers table is a SYNTAX_ERROR."""
    good = b"\x20\x00\x00\x00\x00\x04\x01kt\x01"  # headers {"k": true}
    bad = b"\x20\x00\x00\x00\x00\x04\x01kZ\x01"  # no such field type as Z
    conn = opened()
    message = frame(1, 1, publish_payload("", "q")) + frame(2, 1, header_payload(1, good))
    conn.receive_data(message + frame(3, 1, b"x") + message + frame(3, 1, b"y"))
    assert [c.properties for c in contents(conn)] == [good, good]
    conn.receive_data(frame(1, 1, publish_payload("", "q")) + frame(2, 1, header_payload(1, bad)))
    with pytest.raises(ConnectionError_) as info:
        conn.next_event()
    assert info.value.code == 502
    assert info.value.text.startswith("SYNTAX_ERROR - content header properties")
