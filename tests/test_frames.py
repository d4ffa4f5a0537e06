"""Framing: size limits, frame-end octet, unknown methods, channel state, content assembly."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from amqp_raw import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    Janitor,
    RawClient,
    build,
    header_payload,
    method_payload,
)
from pamqp import commands


@pytest.fixture
def janitor(amqp_addr: tuple[str, int]) -> Iterator[Janitor]:
    j = Janitor(amqp_addr)
    yield j
    j.clean()


@pytest.fixture
def client(amqp_addr: tuple[str, int]) -> Iterator[RawClient]:
    c = RawClient.connect(amqp_addr)
    yield c
    c.close()


def publish_method(routing_key: str = "x", exchange: str = "") -> bytes:
    return method_payload(build(commands.Basic.Publish, exchange=exchange, routing_key=routing_key))


# -- frame size ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame_max", "payload_size"), [(8192, 8193), (8192, 20000), (131072, 131073)]
)
def test_body_frame_larger_than_frame_max(
    amqp_addr: tuple[str, int], frame_max: int, payload_size: int
) -> None:
    with RawClient.connect(amqp_addr, frame_max=frame_max) as c:
        c.send_frame(FRAME_METHOD, 1, publish_method())
        c.send_frame(FRAME_HEADER, 1, header_payload(payload_size))
        c.send_frame(FRAME_BODY, 1, b"x" * payload_size)
        assert c.expect_close() == (
            501,
            f"FRAME_ERROR - type 3, all octets = <<>>: "
            f"{{frame_too_large,{payload_size},{frame_max - 8}}}",
            0,
            0,
        )


def test_method_frame_larger_than_frame_max(amqp_addr: tuple[str, int]) -> None:
    with RawClient.connect(amqp_addr, frame_max=8192) as c:
        payload = method_payload(commands.Queue.Declare(queue="", arguments={"x-pad": "p" * 9000}))
        c.send_frame(FRAME_METHOD, 1, payload)
        assert c.expect_close() == (
            501,
            f"FRAME_ERROR - type 1, all octets = <<>>: {{frame_too_large,{len(payload)},8184}}",
            0,
            0,
        )


def test_frame_max_limit_tolerates_the_frame_overhead(
    amqp_addr: tuple[str, int], janitor: Janitor, name: str
) -> None:
    """RabbitMQ announces frame_max - 8 as the payload limit but only rejects
    payloads larger than frame_max itself."""
    q = janitor.queue(name)
    with RawClient.connect(amqp_addr, frame_max=8192) as c:
        c.declare_queue(1, q, durable=True)
        body = os.urandom(8192)
        c.publish(1, body, routing_key=q, frame_size=8192)
        c.consume(1, q, no_ack=True)
        d = c.read_delivery(1)
        assert d.body == body
        assert d.body_frame_sizes == [8184, 8]


def test_large_body_in_many_small_frames(
    amqp_addr: tuple[str, int], janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    body = os.urandom(100_000)
    with RawClient.connect(amqp_addr, frame_max=8192) as c:
        c.declare_queue(1, q, durable=True)
        c.publish(1, body, routing_key=q, frame_size=1000)  # 100 body frames
        c.publish(1, body, routing_key=q, frame_size=1)  # 100 000 body frames
        c.consume(1, q, no_ack=True)
        for _ in range(2):
            d = c.read_delivery(1)
            assert d.body == body
            assert d.body_size == len(body)
            # the broker re-frames to the negotiated frame_max
            assert max(d.body_frame_sizes) == 8184
            assert all(size == 8184 for size in d.body_frame_sizes[:-1])


def test_empty_body_has_no_body_frames(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    client.publish(1, b"", routing_key=q)
    client.consume(1, q, no_ack=True)
    d = client.read_delivery(1)
    assert d.body == b""
    assert d.body_size == 0
    assert d.body_frame_sizes == []
    # the next frame is the next delivery, not an empty body frame
    client.publish(1, b"next", routing_key=q)
    assert client.read_delivery(1).body == b"next"


def test_deliveries_carry_every_field_on_any_channel(
    amqp_addr: tuple[str, int], janitor: Janitor, name: str
) -> None:
    """A delivery's frames are encoded in one piece up to the body (protocol/methods.py
    delivery_head): channel ids past one octet and past 2**15, the redelivered flag, the
    properties, and bodies at and just past the one-frame limit all arrive intact."""
    q = janitor.queue(name)
    props = commands.Basic.Properties(
        content_type="text/plain", headers={"k": "v"}, message_id="m-1", priority=7
    )
    limit = 8192 - 8  # the largest body of one frame at frame_max 8192
    bodies = [b"", b"x", os.urandom(limit), os.urandom(limit + 1)]
    with RawClient.connect(amqp_addr, channel=None, frame_max=8192) as c:
        for channel in (300, 40000, 65535):
            c.channel_open(channel)
            c.declare_queue(channel, q, durable=True)
            for body in bodies:
                c.publish(channel, body, routing_key=q, properties=props)
            tag = c.consume(channel, q, consumer_tag=f"ctag-{channel}-é")
            for i, body in enumerate(bodies):
                d = c.read_delivery(channel)
                assert (d.method.consumer_tag, d.method.delivery_tag) == (tag, i + 1)
                assert (d.method.exchange, d.method.routing_key) == ("", q)
                assert d.method.redelivered is False
                assert d.body == body and d.body_size == len(body)
                frames = [limit, 1] if len(body) > limit else [len(body)] if body else []
                assert d.body_frame_sizes == frames
                assert d.properties.headers == {"k": "v"} and d.properties.priority == 7
                assert d.properties.message_id == "m-1"
            c.call(channel, commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk)
            c.send_method(channel, commands.Basic.Recover(requeue=True))
            c.expect_method(commands.Basic.RecoverOk, channel)
            tag = c.consume(channel, q, consumer_tag="again")
            for i, body in enumerate(bodies):
                d = c.read_delivery(channel)
                assert d.method.redelivered is True and d.body == body
                assert d.method.delivery_tag == len(bodies) + i + 1
                c.ack(channel, d.method.delivery_tag)
            c.call(channel, commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk)


# -- malformed frames ------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame_type", "channel", "payload", "end", "text"),
    [
        (
            FRAME_METHOD,
            2,
            b"\x00\x14\x00\x0a\x00",
            0x00,
            "FRAME_ERROR - type 1, all octets = <<0,20,0,10,0>>: {invalid_frame_end_marker,0}",
        ),
        (
            FRAME_HEARTBEAT,
            0,
            b"",
            0x00,
            "FRAME_ERROR - type 8, all octets = <<>>: {invalid_frame_end_marker,0}",
        ),
        (
            FRAME_BODY,
            1,
            b"abc",
            0x41,
            'FRAME_ERROR - type 3, all octets = <<"abc">>: {invalid_frame_end_marker,65}',
        ),
    ],
    ids=["method", "heartbeat", "body"],
)
def test_bad_frame_end_octet(
    client: RawClient, frame_type: int, channel: int, payload: bytes, end: int, text: str
) -> None:
    client.send_frame(frame_type, channel, payload, end=end)
    assert client.expect_close() == (501, text, 0, 0)


@pytest.mark.parametrize(
    ("frame_type", "channel", "payload", "reply"),
    [
        (5, 1, b"abc", (501, 'FRAME_ERROR - type 5, all octets = <<"abc">>: unknown_frame')),
        (7, 1, b"\x00\x01", (501, "FRAME_ERROR - type 7, all octets = <<0,1>>: unknown_frame")),
        (
            FRAME_HEARTBEAT,
            0,
            b"x",
            (501, 'FRAME_ERROR - type 8, all octets = <<"x">>: unknown_frame'),
        ),
        (FRAME_HEARTBEAT, 1, b"", (505, "UNEXPECTED_FRAME - type 8, all octets = <<>>")),
        (
            FRAME_HEADER,
            0,
            header_payload(1),
            (505, "UNEXPECTED_FRAME - type 2, all octets = <<0,60,0,0,0,0,0,0,0,0,0,1,0,0>>"),
        ),
        (FRAME_METHOD, 1, b"", (501, "FRAME_ERROR - type 1, all octets = <<>>: unknown_frame")),
        (
            FRAME_METHOD,
            1,
            b"\x00\x32",
            (501, "FRAME_ERROR - type 1, all octets = <<0,50>>: unknown_frame"),
        ),
    ],
    ids=[
        "type-5",
        "type-7",
        "heartbeat-with-payload",
        "heartbeat-on-channel-1",
        "header-on-channel-0",
        "empty-method",
        "method-without-method-id",
    ],
)
def test_malformed_frames(
    client: RawClient, frame_type: int, channel: int, payload: bytes, reply: tuple[int, str]
) -> None:
    client.send_frame(frame_type, channel, payload)
    assert client.expect_close() == (*reply, 0, 0)


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (b"", "FRAME_ERROR - cannot decode <<>>"),
        (b"\x00\x00\x00", "FRAME_ERROR - cannot decode <<0,0,0>>"),
        (
            b"\x00\x00\x00\x01x\x00junk",
            "FRAME_ERROR - cannot decode <<0,0,0,1,120,0,106,117,110,107>>",
        ),
    ],
    ids=["no-arguments", "truncated", "trailing-bytes"],
)
def test_undecodable_method_arguments(client: RawClient, args: bytes, text: str) -> None:
    client.send_method_raw(1, 60, 40, args)  # basic.publish
    assert client.expect_close() == (501, text, 60, 40)


@pytest.mark.parametrize(("class_id", "method_id"), [(60, 99), (99, 10), (20, 99), (10, 99)])
def test_unknown_class_or_method_is_not_implemented(
    client: RawClient, class_id: int, method_id: int
) -> None:
    """Warren answers 540 NOT_IMPLEMENTED, as the protocol asks (RabbitMQ 3.10 just drops
    the TCP connection without saying why)."""
    client.send_method_raw(1, class_id, method_id, b"")
    assert client.expect_close() == (
        540,
        f"NOT_IMPLEMENTED - unknown method (class {class_id}, method {method_id})",
        class_id,
        method_id,
    )


# -- channel state -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (commands.Queue.Declare(queue=""), (50, 10)),
        (commands.Basic.Ack(delivery_tag=1), (60, 80)),
        (commands.Channel.Close(reply_code=200, reply_text=""), (20, 40)),
    ],
    ids=["queue.declare", "basic.ack", "channel.close"],
)
def test_method_on_channel_that_is_not_open(
    client: RawClient, method: commands.Queue.Declare, ids: tuple[int, int]
) -> None:
    client.send_method(2, method)
    assert client.expect_close() == (504, "CHANNEL_ERROR - expected 'channel.open'", *ids)


def test_second_channel_open(client: RawClient) -> None:
    client.send_method(1, commands.Channel.Open())
    assert client.expect_close() == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_channel_open_on_a_channel_the_broker_is_closing(client: RawClient, name: str) -> None:
    """Everything else on a closing channel is ignored, but not channel.open (RabbitMQ)."""
    client.send_method(1, build(commands.Queue.Declare, queue=f"{name}.missing", passive=True))
    assert client.expect_channel_close(1, reply=False)[0] == 404
    client.send_method(1, commands.Channel.Open())
    assert client.expect_close() == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_channel_open_ok_has_an_empty_reserved_field(client: RawClient) -> None:
    client.send_method(2, commands.Channel.Open())
    reply = client.read_frame()
    assert (reply.channel, reply.payload) == (2, b"\0\x14\0\x0b\0\0\0\0")  # longstr ""


def test_channel_method_on_channel_zero(client: RawClient) -> None:
    client.send_method(0, commands.Queue.Declare(queue=""))
    assert client.expect_close() == (
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
        50,
        10,
    )


def test_access_request_from_old_clients_is_granted(client: RawClient) -> None:
    """AMQP 0-8's access.request (class 30): RabbitMQ answers access.request-ok, ticket 1."""
    client.send_method_raw(1, 30, 10, b"\x05/data\x1e")  # realm, then the five request bits
    reply = client.read_frame()
    assert (reply.type, reply.channel, reply.payload) == (FRAME_METHOD, 1, b"\0\x1e\0\x0b\0\x01")
    assert client.new_queue(1, exclusive=True).startswith("amq.gen-")
    client.send_method_raw(0, 30, 10, b"\x05/data\x00")
    assert client.expect_close() == (
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
        30,
        10,
    )


def test_connection_method_on_a_channel(client: RawClient) -> None:
    client.send_method(
        1, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
    )
    assert client.expect_close() == (503, "COMMAND_INVALID - unimplemented method", 10, 50)


def test_channel_can_be_reopened_after_close(client: RawClient) -> None:
    client.channel_close(1)
    client.channel_open(1)
    assert client.new_queue(1, exclusive=True).startswith("amq.gen-")


# -- content assembly ------------------------------------------------------------


def test_content_header_without_publish(client: RawClient) -> None:
    client.send_frame(FRAME_HEADER, 1, header_payload(3))
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        0,
        0,
    )


def test_body_frame_when_method_expected(client: RawClient) -> None:
    client.send_frame(FRAME_BODY, 1, b"abc")
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        0,
        0,
    )


def test_body_frame_beyond_declared_body_size(client: RawClient) -> None:
    client.publish(1, b"abcdef", routing_key="x", raw_header=header_payload(3), frame_size=3)
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        0,
        0,
    )


@pytest.mark.parametrize(
    "follow_up",
    [
        (FRAME_BODY, b"abc"),
        (FRAME_METHOD, method_payload(commands.Basic.Qos(prefetch_count=1))),
    ],
    ids=["body", "method"],
)
def test_publish_not_followed_by_content_header(
    client: RawClient, follow_up: tuple[int, bytes]
) -> None:
    client.send_frame(FRAME_METHOD, 1, publish_method())
    client.send_frame(follow_up[0], 1, follow_up[1])
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, "
        "got non content header frame instead",
        60,
        40,
    )


def test_content_header_for_wrong_class(client: RawClient) -> None:
    client.send_frame(FRAME_METHOD, 1, publish_method())
    client.send_frame(FRAME_HEADER, 1, b"\x00\x32\x00\x00" + (3).to_bytes(8, "big") + b"\x00\x00")
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
        60,
        40,
    )


@pytest.mark.parametrize("weight", [1, 0x8000], ids=["1", "high-bit"])
def test_content_header_with_a_weight(client: RawClient, weight: int) -> None:
    """RabbitMQ 4.3, rabbit_common/src/rabbit_command_assembler.erl process/2: only a
    weight of 0 is a content header; anything else falls to the "non content header"
    clause, a connection-level 505."""
    client.send_frame(FRAME_METHOD, 1, publish_method())
    head = b"\x00\x3c" + weight.to_bytes(2, "big") + (3).to_bytes(8, "big") + b"\x00\x00"
    client.send_frame(FRAME_HEADER, 1, head)
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, "
        "got non content header frame instead",
        60,
        40,
    )


def test_method_in_the_middle_of_a_body(client: RawClient) -> None:
    client.send_frame(FRAME_METHOD, 1, publish_method())
    client.send_frame(FRAME_HEADER, 1, header_payload(10))
    client.send_frame(FRAME_BODY, 1, b"abc")
    client.send_method(1, commands.Basic.Qos(prefetch_count=1))
    assert client.expect_close() == (
        505,
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        60,
        40,
    )


def test_content_is_assembled_per_channel(client: RawClient, janitor: Janitor, name: str) -> None:
    """Frames of other channels may come between the frames of one message."""
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    client.channel_open(2)
    client.confirm_select(1)
    client.send_frame(FRAME_METHOD, 1, publish_method(q))
    client.publish_seq[1] += 1
    client.send_frame(FRAME_HEADER, 1, header_payload(6))
    client.send_frame(FRAME_BODY, 1, b"abc")
    ok = client.call(
        2, build(commands.Queue.Declare, queue=q, passive=True), commands.Queue.DeclareOk
    )
    assert ok.queue == q
    client.publish(2, b"other", routing_key=q)
    client.send_frame(FRAME_BODY, 1, b"def")
    assert client.wait_for_confirms(1) == {1: True}
    got = [client.get(2, q, no_ack=True) for _ in range(2)]
    assert sorted(d.body for d in got if d is not None) == [b"abcdef", b"other"]


def test_immediate_publish_not_implemented(client: RawClient) -> None:
    client.publish(1, b"x", routing_key="x", immediate=True)
    assert client.expect_close() == (540, "NOT_IMPLEMENTED - immediate=true", 60, 40)


# -- after channel.close ----------------------------------------------------------


def test_frames_after_broker_channel_close_are_ignored_until_close_ok(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    missing = f"{name}.missing"
    client.declare_queue(1, q, durable=True)
    client.publish(1, b"first", exchange=missing)
    # The client has not seen channel.close yet and keeps going on channel 1.
    client.publish(1, b"second", exchange=missing)
    client.publish(1, b"third " * 10, routing_key=q, frame_size=7)
    client.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
    client.send_method(1, commands.Basic.Ack(delivery_tag=42))
    client.send_method(1, build(commands.Basic.Get, queue=q))
    frames = client.frames_within(0.4)
    assert len(frames) == 1, frames
    close = frames[0].method()
    assert isinstance(close, commands.Channel.Close)
    assert frames[0].channel == 1
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        404,
        f"NOT_FOUND - no exchange '{missing}' in vhost '/'",
        60,
        40,
    )
    client.send_method(1, commands.Channel.CloseOk())
    client.channel_open(1)
    # nothing published on the closing channel was routed
    ok = client.declare_queue(1, q, passive=True)
    assert ok.message_count == 0
    assert client.get(1, q) is None


def test_other_channels_unaffected_by_channel_error(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.channel_open(2)
    client.declare_queue(2, q, durable=True)
    client.send_method(1, build(commands.Queue.Declare, queue=f"{name}.missing", passive=True))
    assert client.expect_channel_close(1) == (
        404,
        f"NOT_FOUND - no queue '{name}.missing' in vhost '/'",
        50,
        10,
    )
    client.publish(2, b"still fine", routing_key=q)
    d = client.get(2, q, no_ack=True)
    assert d is not None and d.body == b"still fine"
