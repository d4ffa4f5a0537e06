"""Direct reply-to (amq.rabbitmq.reply-to): RPC replies without a reply queue."""

from __future__ import annotations

import time

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

REPLY_TO = "amq.rabbitmq.reply-to"


def rpc_round_trip(amqp_url: str, name: str) -> None:
    server_conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    client_conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        server = server_conn.channel()
        server.queue_declare(name, auto_delete=True, durable=True)
        client = client_conn.channel()
        replies: list[tuple[bytes, str]] = []

        def on_reply(
            ch: BlockingChannel, method: object, props: pika.BasicProperties, body: bytes
        ) -> None:
            replies.append((body, props.correlation_id))

        client.basic_consume(REPLY_TO, on_reply, auto_ack=True)
        client.basic_publish(
            "", name, b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c1")
        )
        method, props, body = next(server.consume(name, inactivity_timeout=5))
        assert body == b"ping"
        assert props.reply_to.startswith(REPLY_TO + ".")  # rewritten to this client's address
        server.basic_ack(method.delivery_tag)
        server.cancel()
        server.basic_publish("", props.reply_to, b"pong", pika.BasicProperties(correlation_id="c1"))
        deadline = time.monotonic() + 5
        while not replies and time.monotonic() < deadline:
            client_conn.process_data_events(time_limit=0.1)
        assert replies == [(b"pong", "c1")]
    finally:
        client_conn.close()
        server_conn.close()


def test_direct_reply_to_rpc(amqp_url: str, name: str) -> None:
    rpc_round_trip(amqp_url, name)


def test_reply_to_without_reply_consumer_is_refused(amqp_url: str, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.basic_publish("", name, b"x", pika.BasicProperties(reply_to=REPLY_TO))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(name, passive=True)
        assert info.value.reply_code == 406
        assert info.value.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    finally:
        conn.close()


def test_reply_consumer_must_be_no_ack(amqp_url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
        assert info.value.reply_code == 406
        assert info.value.reply_text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"
    finally:
        conn.close()


def test_reply_to_pseudo_queue_declare(amqp_url: str, durable=True) -> None:
    """amqplib's checkQueue: the pseudo-queue exists with one consumer; unknown addresses don't."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        ok = channel.queue_declare(REPLY_TO, passive=True)
        assert (ok.method.message_count, ok.method.consumer_count) == (0, 1)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(REPLY_TO + ".bogus", passive=True)
        assert info.value.reply_code == 404
    finally:
        conn.close()


@pytest.mark.parametrize("op", ["bind", "unbind"])
def test_binding_to_a_reply_address_is_refused(amqp_url: str, op: str) -> None:
    """RabbitMQ 4.3, rabbit_channel.erl binding_action_with_checks/10 ->
    reject_volatile_queue_as_binding_target/2: any amq.rabbitmq.reply-to.* destination,
    before permissions or existence are looked at."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        action = channel.queue_bind if op == "bind" else channel.queue_unbind
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            action(REPLY_TO + ".someone", "amq.direct", "k")
        assert (info.value.reply_code, info.value.reply_text) == (
            403,
            "ACCESS_REFUSED - cannot bind or unbind to a volatile (direct reply-to) queue",
        )
    finally:
        conn.close()


def test_mandatory_publish_to_a_reply_address_is_routed(amqp_url: str) -> None:
    """RabbitMQ 4.3: a reply address is a rabbit_volatile_queue the publish routes to, so a
    mandatory publish to one whose requester is gone is confirmed, never returned (pika's
    confirm mode raises UnroutableError on a basic.return)."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", REPLY_TO + ".gone", b"late reply", mandatory=True)
        assert channel.is_open
    finally:
        conn.close()
