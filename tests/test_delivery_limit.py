"""Quorum queues: delivery counts (x-delivery-count) and x-delivery-limit, as RabbitMQ does them.

Every test passes against RabbitMQ 3.10 too (WARREN_TEST_URL) except
test_nack_with_requeue_is_not_counted, a 4.x change (3.10 counts nacks). Warren's own
additions (the default limit of 20, -1, consumer-timeout returns, delayed retry
with backoff) are in test_lifecycle_warren.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Delivery, Janitor, RawClient
from lifecycle import (
    death_entry,
    deaths,
    declare_refused,
    message_count,
    props,
    publish,
    queue_exists,
    typed_headers,
    without_time,
)
from pamqp import commands

QUORUM = {"x-queue-type": "quorum"}


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


@pytest.fixture
def dlq(client: RawClient, janitor: Janitor, name: str) -> str:
    """A fanout dead-letter exchange, its queue consumed (no-ack) on channel 2."""
    exchange = janitor.exchange(f"{name}.dlx")
    queue = janitor.queue(f"{name}.dlq")
    client.declare_exchange(1, exchange, "fanout")
    client.declare_queue(1, queue, durable=True)
    client.bind_queue(1, queue, exchange)
    client.channel_open(2)
    client.consume(2, queue, consumer_tag="dlq", no_ack=True)
    return exchange


def quorum(c: RawClient, janitor: Janitor, name: str, **arguments: Any) -> str:
    args = {**QUORUM, **arguments}
    return str(c.declare_queue(1, janitor.queue(name), durable=True, arguments=args).queue)


def delivery_count(d: Delivery) -> int | None:
    value = typed_headers(d).get("x-delivery-count")
    return None if value is None else int(value[1])


def nack(c: RawClient, channel: int, d: Delivery, requeue: bool = True) -> None:
    c.send_method(channel, commands.Basic.Nack(delivery_tag=d.method.delivery_tag, requeue=requeue))


def reject(c: RawClient, channel: int, d: Delivery, requeue: bool = True) -> None:
    c.send_method(
        channel, commands.Basic.Reject(delivery_tag=d.method.delivery_tag, requeue=requeue)
    )


# -- declaring ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "prop"),
    [
        ({"durable": False}, "non-durable"),
        ({"durable": True, "exclusive": True}, "exclusive-owner"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
    ],
    ids=["non-durable", "exclusive", "auto-delete"],
)
def test_quorum_queue_properties_refused(
    client: RawClient, name: str, flags: dict[str, bool], prop: str
) -> None:
    assert declare_refused(client, name, QUORUM, **flags) == (
        406,
        f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in vhost '/'",
        50,
        10,
    )
    assert not queue_exists(client, name)


def test_unknown_queue_type_refused(client: RawClient, name: str) -> None:
    assert declare_refused(client, name, {"x-queue-type": "bogus"}, durable=True) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{name}' in vhost '/': "
        "\"unsupported queue type 'bogus'\"",
        50,
        10,
    )
    assert not queue_exists(client, name)


# -- delivery counts ----------------------------------------------------------------------------


def test_reject_with_requeue_is_counted(client: RawClient, janitor: Janitor, name: str) -> None:
    """RabbitMQ 4.3, rabbit_channel.erl handle_method basic.reject: requeue=true settles
    with settle(DeliveryFailed = true, _), which rabbit_fifo counts as a failed delivery."""
    q = quorum(client, janitor, name)
    publish(client, q, b"m", properties=props(headers={"app": "x"}))
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    seen = []
    for _ in range(3):
        d = client.read_delivery(3)
        seen.append((d.method.redelivered, delivery_count(d)))
        reject(client, 3, d)
    assert seen == [(False, None), (True, 1), (True, 2)]
    d = client.read_delivery(3)
    assert typed_headers(d)["app"] == ("S", "x")  # the publisher's headers are kept
    client.ack(3, d.method.delivery_tag)


def test_nack_with_requeue_is_not_counted(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    """RabbitMQ 4.3, rabbit_channel.erl handle_method basic.nack: requeue=true is the
    plain ``requeue`` settle op, which rabbit_fifo does not count toward delivery-limit
    (3.x counted it). With x-delivery-limit 1, three nacks keep the message."""
    q = quorum(client, janitor, name, **{"x-delivery-limit": 1, "x-dead-letter-exchange": dlq})
    publish(client, q, b"m")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    seen = []
    for _ in range(3):
        d = client.read_delivery(3)
        seen.append((d.method.redelivered, delivery_count(d)))
        nack(client, 3, d)
    d = client.read_delivery(3)
    assert seen == [(False, None), (True, None), (True, None)]
    assert d.body == b"m" and delivery_count(d) is None
    reject(client, 3, d)  # a reject counts: 1, still within the limit
    d = client.read_delivery(3)
    assert delivery_count(d) == 1
    reject(client, 3, d)  # 2 > 1: dead-lettered
    (entry,) = deaths(client.read_delivery(2))
    assert entry["reason"] == ("S", "delivery_limit")


def test_closed_channel_counts_as_a_failed_delivery(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = quorum(client, janitor, name)
    publish(client, q, b"m")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    client.read_delivery(3)
    client.channel_close(3)
    d = client.get(1, q)
    assert d is not None
    assert (d.method.redelivered, delivery_count(d)) == (True, 1)


def test_lost_connection_counts_as_a_failed_delivery(
    client: RawClient, janitor: Janitor, name: str, amqp_addr: tuple[str, int]
) -> None:
    q = quorum(client, janitor, name)
    publish(client, q, b"m")
    other = RawClient.connect(amqp_addr)
    other.consume(1, q, consumer_tag="c")
    other.read_delivery(1)
    other.abort()
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    d = client.read_delivery(3)
    assert (d.method.redelivered, delivery_count(d)) == (True, 1)


def test_classic_queue_redelivery_has_no_delivery_count(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = str(client.declare_queue(1, janitor.queue(name), durable=True).queue)
    publish(client, q, b"m")
    first = client.get(1, q)
    assert first is not None
    nack(client, 1, first)
    again = client.get(1, q, no_ack=True)
    assert again is not None and again.method.redelivered
    assert "x-delivery-count" not in typed_headers(again)


# -- the limit ----------------------------------------------------------------------------------


def test_past_the_limit_dead_lettered_with_reason_delivery_limit(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = quorum(client, janitor, name, **{"x-delivery-limit": 2, "x-dead-letter-exchange": dlq})
    publish(client, q, b"poison", properties=props(headers={"app": "x"}))
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    for _ in range(3):  # the first delivery and two redeliveries
        reject(client, 3, client.read_delivery(3))
    dead = client.read_delivery(2)
    assert dead.body == b"poison"
    (entry,) = deaths(dead)
    assert without_time(entry) == death_entry(
        queue=q, reason="delivery_limit", exchange="", routing_keys=[q]
    )
    headers = typed_headers(dead)
    assert headers["x-first-death-reason"] == ("S", "delivery_limit")
    # the count belonged to the quorum queue's deliveries, not to the dead-lettered copy
    assert "x-delivery-count" not in headers
    client.assert_silent(0.05)
    assert message_count(client, q) == 0


def test_past_the_limit_without_dead_letter_exchange_dropped(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = quorum(client, janitor, name, **{"x-delivery-limit": 1})
    publish(client, q, b"poison", b"fine")
    client.channel_open(3)
    client.qos(3, 1)  # one at a time: the poison message comes back before "fine" is sent
    client.consume(3, q, consumer_tag="c")
    deliveries = []
    while True:
        d = client.read_delivery(3)
        deliveries.append((d.body, delivery_count(d)))
        if d.body == b"fine":
            client.ack(3, d.method.delivery_tag)
            break
        reject(client, 3, d)
    assert (b"poison", 1) in deliveries and (b"poison", 2) not in deliveries
    client.assert_silent(0.1)
    assert message_count(client, q) == 0


def test_delivery_limit_zero(client: RawClient, janitor: Janitor, name: str, dlq: str) -> None:
    q = quorum(client, janitor, name, **{"x-delivery-limit": 0, "x-dead-letter-exchange": dlq})
    publish(client, q, b"once")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    reject(client, 3, client.read_delivery(3))
    (entry,) = deaths(client.read_delivery(2))
    assert entry["reason"] == ("S", "delivery_limit")


def test_reject_without_requeue_is_reason_rejected(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = quorum(client, janitor, name, **{"x-delivery-limit": 5, "x-dead-letter-exchange": dlq})
    publish(client, q, b"m")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    reject(client, 3, client.read_delivery(3))
    reject(client, 3, client.read_delivery(3), requeue=False)
    (entry,) = deaths(client.read_delivery(2))
    assert entry["reason"] == ("S", "rejected")


def test_ack_after_redeliveries_settles(client: RawClient, janitor: Janitor, name: str) -> None:
    q = quorum(client, janitor, name, **{"x-delivery-limit": 3})
    publish(client, q, b"m")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    for _ in range(3):
        reject(client, 3, client.read_delivery(3))
    last = client.read_delivery(3)
    assert delivery_count(last) == 3  # the limit itself is still delivered
    client.ack(3, last.method.delivery_tag)
    client.assert_silent(0.05)
    client.call(3, commands.Basic.Cancel(consumer_tag="c"), commands.Basic.CancelOk)
    assert message_count(client, q) == 0


def test_nacks_count_with_the_3x_key() -> None:
    """warren.delivery_limit.count_nacks = true: RabbitMQ 3.x's counting, where a nack with
    requeue is a failed delivery (tests/rabbitmq-3.x.conf sets it for the 3.10 suite)."""
    import pika

    from warren.broker.testkit import run_broker

    with run_broker(delivery_limit_counts_nacks=True) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("nc-dlq", durable=True)
        ch.queue_declare("nc-q", durable=True, arguments={
            "x-queue-type": "quorum", "x-delivery-limit": 1,
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "nc-dlq",
        })  # fmt: skip
        ch.confirm_delivery()
        ch.basic_publish("", "nc-q", b"m")
        for _ in range(2):  # the second nack is past the limit
            method, _, _ = ch.basic_get("nc-q")
            assert method is not None
            ch.basic_nack(method.delivery_tag, requeue=True)
        assert ch.basic_get("nc-q") == (None, None, None)
        method, props, body = ch.basic_get("nc-dlq", auto_ack=True)
        assert body == b"m"
        assert props.headers["x-death"][0]["reason"] == "delivery_limit"
        conn.close()
