"""Priority queues (x-max-priority), consumer priorities (x-priority), single active consumer.

Every test passes against RabbitMQ 3.10 too (WARREN_TEST_URL).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Janitor, RawClient, build, fv, raw_table, shortstr
from lifecycle import declare_refused, expect_close, props, publish, queue_exists
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


def invalid_arg(arg: str, queue: str, detail: str) -> str:
    return f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{queue}' in vhost '/': {detail}"


def declare(c: RawClient, janitor: Janitor, name: str, **arguments: Any) -> str:
    return str(
        c.declare_queue(1, janitor.queue(name), arguments=dict(arguments), durable=True).queue
    )


def publish_prioritised(c: RawClient, q: str, *messages: tuple[bytes, int | None]) -> None:
    for body, priority in messages:
        publish(c, q, body, properties=props(priority=priority))


# -- priority queues ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (256, "{max_value_exceeded,256}"),
        (-1, "{value_negative,-1}"),
        ("5", '"expected integer, got longstr"'),
    ],
    ids=["too-large", "negative", "string"],
)
def test_max_priority_refused(client: RawClient, name: str, value: Any, detail: str) -> None:
    assert declare_refused(client, name, {"x-max-priority": value}) == (
        406,
        invalid_arg("x-max-priority", name, detail),
        50,
        10,
    )
    assert not queue_exists(client, name)


def test_higher_priority_first_fifo_within_a_priority(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name, **{"x-max-priority": 10})
    publish_prioritised(
        client, q, (b"none", None), (b"p5-a", 5), (b"p9", 9), (b"p5-b", 5), (b"p0", 0), (b"p10", 10)
    )
    assert client.drain(1, q) == [b"p10", b"p9", b"p5-a", b"p5-b", b"none", b"p0"]


def test_priority_above_the_maximum_counts_as_the_maximum(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name, **{"x-max-priority": 5})
    publish_prioritised(client, q, (b"p9", 9), (b"p5", 5), (b"p255", 255), (b"p1", 1))
    assert client.drain(1, q) == [b"p9", b"p5", b"p255", b"p1"]


def test_max_priority_one(client: RawClient, janitor: Janitor, name: str) -> None:
    q = declare(client, janitor, name, **{"x-max-priority": 1})
    publish_prioritised(client, q, (b"low", 0), (b"high", 1), (b"higher", 200))
    assert client.drain(1, q) == [b"high", b"higher", b"low"]


def test_without_max_priority_the_property_is_ignored(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name)
    publish_prioritised(client, q, (b"a", 0), (b"b", 9), (b"c", 5))
    assert client.drain(1, q) == [b"a", b"b", b"c"]


def test_requeued_message_keeps_its_place_within_its_priority(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name, **{"x-max-priority": 5})
    publish_prioritised(client, q, (b"a", 5), (b"b", 5), (b"low", 1))
    first = client.get(1, q)
    assert first is not None and first.body == b"a"
    second = client.get(1, q)
    assert second is not None and second.body == b"b"
    client.send_method(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
    got = [client.get(1, q, no_ack=True) for _ in range(3)]
    assert [(d.body, d.method.redelivered) for d in got if d is not None] == [
        (b"a", True),
        (b"b", True),
        (b"low", False),
    ]


def test_consumer_receives_by_priority_once_it_has_capacity(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name, **{"x-max-priority": 9})
    client.channel_open(3)
    client.qos(3, 1)
    client.consume(3, q, consumer_tag="one-at-a-time")
    publish_prioritised(client, q, (b"first", 0), (b"low", 1), (b"high", 9), (b"mid", 5))
    order = []
    for _ in range(4):
        d = client.read_delivery(3)
        order.append(d.body)
        client.ack(3, d.method.delivery_tag)
    assert order == [b"first", b"high", b"mid", b"low"]


# -- consumer priorities -----------------------------------------------------------------------


def consumer(c: RawClient, channel: int, q: str, tag: str, prefetch: int, priority: int) -> None:
    c.channel_open(channel)
    c.qos(channel, prefetch)
    c.consume(channel, q, consumer_tag=tag, arguments={"x-priority": priority})


def tags_of(c: RawClient, n: int) -> list[tuple[str, bytes]]:
    out = []
    for _ in range(n):
        d = c.read_delivery()
        out.append((str(d.method.consumer_tag), d.body))
    return out


def test_higher_priority_consumer_first_while_it_has_capacity(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name)
    consumer(client, 3, q, "low", prefetch=10, priority=1)
    consumer(client, 4, q, "high", prefetch=2, priority=10)
    publish(client, q, b"1", b"2", b"3", b"4", b"5")
    got = tags_of(client, 5)
    assert [b for t, b in got if t == "high"] == [b"1", b"2"]
    assert [b for t, b in got if t == "low"] == [b"3", b"4", b"5"]
    client.ack(4, 2, multiple=True)  # the high consumer's two deliveries
    publish(client, q, b"6")
    assert tags_of(client, 1) == [("high", b"6")]  # capacity back: the high one again


def test_round_robin_within_the_highest_priority(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name)
    consumer(client, 3, q, "a", prefetch=10, priority=5)
    consumer(client, 4, q, "b", prefetch=10, priority=5)
    consumer(client, 5, q, "low", prefetch=10, priority=0)
    publish(client, q, *[str(i).encode() for i in range(6)])
    got = tags_of(client, 6)
    assert sorted(t for t, _ in got) == ["a", "a", "a", "b", "b", "b"]
    client.assert_silent(0.05)


def test_negative_priority_is_below_the_default(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = declare(client, janitor, name)
    consumer(client, 3, q, "negative", prefetch=10, priority=-5)
    client.channel_open(4)
    client.consume(4, q, consumer_tag="default")
    publish(client, q, b"1", b"2")
    assert tags_of(client, 2) == [("default", b"1"), ("default", b"2")]


@pytest.mark.parametrize(
    ("value", "detail"),
    [(fv("S", "high"), "longstr"), (fv("d", 1.5), "double")],
    ids=["string", "double"],
)
def test_consumer_priority_refused(
    client: RawClient, janitor: Janitor, name: str, value: bytes, detail: str
) -> None:
    q = declare(client, janitor, name)
    args = b"\x00\x00" + shortstr(q) + shortstr("") + b"\x00" + raw_table([("x-priority", value)])
    client.send_method_raw(1, 60, 20, args)
    assert expect_close(client) == (
        406,
        invalid_arg("x-priority", q, f'"expected integer, got {detail}"'),
        60,
        20,
    )


# -- single active consumer --------------------------------------------------------------------


def sac_queue(c: RawClient, janitor: Janitor, name: str) -> str:
    return declare(c, janitor, name, **{"x-single-active-consumer": True})


def test_only_the_first_consumer_gets_messages(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = sac_queue(client, janitor, name)
    for channel, tag in ((3, "first"), (4, "second")):
        client.channel_open(channel)
        client.consume(channel, q, consumer_tag=tag, no_ack=True)
    publish(client, q, b"1", b"2", b"3")
    assert tags_of(client, 3) == [("first", b"1"), ("first", b"2"), ("first", b"3")]
    client.assert_silent(0.05)


def test_next_registered_consumer_takes_over_with_the_unacked(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = sac_queue(client, janitor, name)
    for channel, tag in ((3, "first"), (4, "second"), (5, "third")):
        client.channel_open(channel)
        client.consume(channel, q, consumer_tag=tag)
    publish(client, q, b"1", b"2", b"3")
    assert [t for t, _ in tags_of(client, 3)] == ["first"] * 3
    client.ack(3, 1)
    # closing the channel returns 2 and 3 to the queue; the takeover may overtake close-ok
    client.send_method(3, commands.Channel.Close(reply_code=200, reply_text="bye"))
    taken = []
    closed = False
    while not closed or len(taken) < 2:
        ch, m = client.read_method()
        if isinstance(m, commands.Channel.CloseOk):
            assert ch == 3
            closed = True
        else:
            assert isinstance(m, commands.Basic.Deliver), m
            taken.append(client.read_content(ch, m))
    assert [(str(d.method.consumer_tag), d.body, d.method.redelivered) for d in taken] == [
        ("second", b"2", True),
        ("second", b"3", True),
    ]
    publish(client, q, b"4")
    assert tags_of(client, 1) == [("second", b"4")]


def test_cancelled_active_consumer_hands_over(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = sac_queue(client, janitor, name)
    for channel, tag in ((3, "first"), (4, "second")):
        client.channel_open(channel)
        client.consume(channel, q, consumer_tag=tag, no_ack=True)
    client.call(3, commands.Basic.Cancel(consumer_tag="first"), commands.Basic.CancelOk)
    publish(client, q, b"1")
    assert tags_of(client, 1) == [("second", b"1")]


def test_exclusive_consumer_on_single_active_consumer_queue_refused(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = sac_queue(client, janitor, name)
    client.send_method(1, build(commands.Basic.Consume, queue=q, exclusive=True))
    assert expect_close(client) == (
        403,
        f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use",
        60,
        20,
    )


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(fv("S", "true"), "longstr"), (fv("b", 1), "byte"), (fv("l", 1), "long")],
    ids=["string", "byte", "long"],
)
def test_single_active_consumer_argument_refused(
    client: RawClient, name: str, value: bytes, type_name: str
) -> None:
    table = raw_table([("x-single-active-consumer", value)])
    client.send_method_raw(1, 50, 10, b"\x00\x00" + shortstr(name) + b"\x00" + table)
    assert expect_close(client) == (
        406,
        invalid_arg("x-single-active-consumer", name, f"{{unacceptable_type,{type_name}}}"),
        50,
        10,
    )
    assert not queue_exists(client, name)


# -- with limits ------------------------------------------------------------------------


def test_drop_head_in_a_priority_queue_drops_the_head(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    """The head of a priority queue is its oldest highest-priority message."""
    q = declare(client, janitor, name, **{"x-max-priority": 5, "x-max-length": 2})
    publish_prioritised(client, q, (b"low-1", 1), (b"high", 5), (b"low-2", 1))
    assert client.drain(1, q) == [b"low-1", b"low-2"]
