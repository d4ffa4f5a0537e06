"""A message routed to several queues keeps its body in every one of them.

The first queue a fan-out reaches may drop or dead-letter the message at once (TTL 0
with no consumer, a length limit of 0, reject-publish-dlx); the other queues, and the
dead-lettered copy, still get the body the publisher sent. Every place that routes to
several queues is covered: channel publish, exchange-to-exchange, dead-lettering, the
firehose and the management API's publish. The AMQP tests pass against RabbitMQ 3.10
too (WARREN_TEST_URL).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from http_api import HttpApi
from pika.adapters.blocking_connection import BlockingChannel

from warren.broker.testkit import run_broker

BODY = b"full body"

# how the first queue of the fan-out gets rid of the message as soon as it arrives
DYING = {
    "ttl-0": {"x-message-ttl": 0},
    "max-length-0": {"x-max-length": 0},
    "max-length-bytes": {"x-max-length-bytes": 1},
    "reject-publish-dlx": {"x-max-length": 0, "x-overflow": "reject-publish-dlx"},
}


@pytest.fixture
def channel(amqp_url: str) -> Iterator[BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    yield conn.channel()
    conn.close()


def body_of(ch: BlockingChannel, queue: str) -> bytes | None:
    """The next message's body (RabbitMQ dead-letters asynchronously: wait up to 2 s)."""
    for _, _, body in ch.consume(queue, auto_ack=True, inactivity_timeout=2):
        ch.cancel()
        return body
    return None


def queues(ch: BlockingChannel, name: str, dying: dict[str, Any]) -> tuple[str, list[str], str]:
    """A dying queue (dead-lettering into ``<name>.dlq``), two plain queues and the DLQ."""
    dlq = f"{name}.dlq"
    ch.queue_declare(dlq, durable=True, auto_delete=True)
    args = {**dying, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    first = f"{name}.dies"
    ch.queue_declare(first, durable=True, auto_delete=True, arguments=args)
    others = [f"{name}.a", f"{name}.b"]
    for other in others:
        ch.queue_declare(other, durable=True, auto_delete=True)
    return first, others, dlq


@pytest.mark.parametrize("how", DYING)
def test_fanout_first_queue_dies_others_keep_body(
    channel: BlockingChannel, name: str, how: str
) -> None:
    first, others, dlq = queues(channel, name, DYING[how])
    channel.exchange_declare(name, "fanout", auto_delete=True)
    for queue in (first, *others):  # the dying queue is bound first, so it is routed to first
        channel.queue_bind(queue, name)
    channel.basic_publish(name, "", BODY)
    assert [body_of(channel, q) for q in others] == [BODY, BODY]
    assert body_of(channel, dlq) == BODY
    assert channel.basic_get(first, auto_ack=True) == (None, None, None)


def test_exchange_to_exchange_fanout_keeps_body(channel: BlockingChannel, name: str) -> None:
    first, others, dlq = queues(channel, name, DYING["ttl-0"])
    inner = f"{name}.inner"
    channel.exchange_declare(name, "fanout", auto_delete=True)
    channel.exchange_declare(inner, "fanout", auto_delete=True)
    channel.exchange_bind(inner, name)
    channel.queue_bind(first, inner)
    channel.queue_bind(others[0], inner)
    channel.queue_bind(others[1], name)
    channel.basic_publish(name, "", BODY)
    assert [body_of(channel, q) for q in others] == [BODY, BODY]
    assert body_of(channel, dlq) == BODY


def test_dead_letter_fanout_keeps_body(channel: BlockingChannel, name: str) -> None:
    """The dead-lettered copy fans out, and the first queue it reaches drops it at once."""
    first, others, dlq = queues(channel, name, DYING["max-length-0"])
    dlx = f"{name}.dlx"
    channel.exchange_declare(dlx, "fanout", auto_delete=True)
    for queue in (first, *others):
        channel.queue_bind(queue, dlx)
    source = f"{name}.source"
    channel.queue_declare(
        source,
        durable=True,
        auto_delete=True,
        arguments={"x-message-ttl": 0, "x-dead-letter-exchange": dlx},
    )
    channel.basic_publish("", source, BODY)
    assert [body_of(channel, q) for q in others] == [BODY, BODY]
    assert body_of(channel, dlq) == BODY


def test_firehose_copies_keep_body(tmp_path: Path) -> None:
    with run_broker(trace_enabled=True, trace_dir=str(tmp_path / "trace")) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        first, others, dlq = queues(ch, "fh", DYING["ttl-0"])
        for queue in (first, *others):
            ch.queue_bind(queue, "amq.rabbitmq.trace", "publish.#")
        ch.queue_declare("work", durable=True)
        ch.basic_publish("", "work", BODY)
        assert [body_of(ch, q) for q in others] == [BODY, BODY]
        assert body_of(ch, dlq) == BODY
        conn.close()


def test_management_publish_fanout_keeps_body() -> None:
    with run_broker(management_port=0) as broker:
        port = broker.server.management_port
        assert port is not None
        api = HttpApi(port)
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        first, others, dlq = queues(ch, "api", DYING["max-length-0"])
        ch.exchange_declare("api.fan", "fanout")
        for queue in (first, *others):
            ch.queue_bind(queue, "api.fan")
        reply = api.ok(
            "POST",
            "/api/exchanges/%2F/api.fan/publish",
            {
                "routing_key": "",
                "properties": {},
                "payload": "full body",
                "payload_encoding": "string",
            },
        )
        assert reply == {"routed": True}
        assert [body_of(ch, q) for q in others] == [BODY, BODY]
        assert body_of(ch, dlq) == BODY
        conn.close()
