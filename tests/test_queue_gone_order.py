"""The frame order when a queue with consumers goes away, as RabbitMQ sends it.

RabbitMQ tells a consumer its queue is gone with a basic.cancel that reaches each channel
as an asynchronous event: a channel busy with the queue.delete that caused it answers
delete-ok first; other channels get theirs when the queue is gone, racing that reply.
Checked against RabbitMQ 3.10 (WARREN_TEST_URL); 4.3 keeps the same model (rabbit_channel.erl
handles the queue's deletion event after the method in hand).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import kombu
import pytest
from amqp.exceptions import ConsumerCancelled
from amqp_raw import Frame, RawClient, build
from pamqp import commands

from warren.broker.testkit import run_broker


@pytest.fixture
def client(amqp_addr: tuple[str, int]) -> Iterator[RawClient]:
    c = RawClient.connect(amqp_addr)
    yield c
    c.close()


def methods(frames: list[Frame]) -> list[tuple[int, str]]:
    return [(f.channel, f.method().name) for f in frames]


def test_delete_ok_before_cancel_of_own_consumer(client: RawClient) -> None:
    q = client.new_queue(1)
    tag = client.consume(1, q)
    client.send_method(1, build(commands.Queue.Delete, queue=q))
    first = client.expect_method(commands.Queue.DeleteOk, 1)
    assert first.message_count == 0
    cancel = client.expect_method(commands.Basic.Cancel, 1)
    assert cancel.consumer_tag == tag
    client.assert_silent()


def test_other_channel_cancelled_own_after_delete_ok(client: RawClient) -> None:
    client.channel_open(2)
    q = client.new_queue(1)
    client.consume(1, q, consumer_tag="own")
    client.consume(2, q, consumer_tag="other")
    client.send_method(1, build(commands.Queue.Delete, queue=q))
    got = methods(client.frames_within(0.5))
    # channel 2's cancel races channel 1's reply in RabbitMQ: only channel 1's order is fixed
    assert [m for m in got if m[0] == 1] == [(1, "Queue.DeleteOk"), (1, "Basic.Cancel")]
    assert [m for m in got if m[0] == 2] == [(2, "Basic.Cancel")]


def test_delete_nowait_still_cancels_after(client: RawClient, name: str) -> None:
    q = name
    client.declare_queue(1, q, auto_delete=True)
    client.consume(1, q, consumer_tag="c1")
    client.send_method(1, build(commands.Queue.Delete, queue=q, nowait=True))
    client.expect_method(commands.Basic.Cancel, 1)
    # the channel is still usable: the cancel came on its own
    client.declare_queue(1, q, auto_delete=True)


def test_kombu_queue_delete_with_consumer_on_same_channel(amqp_url: str, name: str) -> None:
    """py-amqp waits for delete-ok; a cancel before it raised ConsumerCancelled out of it."""
    parsed = urlparse(amqp_url)
    with kombu.Connection(
        hostname=parsed.hostname,
        port=parsed.port,
        userid=parsed.username or "guest",
        password=parsed.password or "guest",
    ) as conn:
        channel = conn.channel()
        queue = kombu.Queue(name, channel=channel, exclusive=True)
        queue.declare()
        consumer = kombu.Consumer(channel, [queue], callbacks=[])
        consumer.consume()
        assert channel.queue_delete(queue.name) == 0
        # then the broker's basic.cancel; kombu's consumer has no on_cancel, so py-amqp raises
        with pytest.raises(ConsumerCancelled):
            conn.drain_events(timeout=2)


def test_vhost_deletion_cancels_consumers_before_closing() -> None:
    """RabbitMQ 4.3 deletes the vhost's queues, then closes its connections (rabbit_vhost.erl,
    delete_ignoring_protection); 3.10 (rabbitmqctl delete_vhost) sends the same frames."""
    with run_broker() as broker:
        broker.add_vhost("doomed")
        c = RawClient.connect((broker.host, broker.port), vhost="doomed")
        c.channel_open(2)
        q = c.new_queue(1)
        c.consume(1, q, consumer_tag="one")
        c.consume(2, q, consumer_tag="two")
        assert broker.delete_vhost("doomed")
        got = [(f.channel, f.method().name) for f in c.frames_within(0.5)]
        assert got == [(1, "Basic.Cancel"), (2, "Basic.Cancel"), (0, "Connection.Close")]
        c.abort()
