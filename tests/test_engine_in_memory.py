"""Orderings only the in-memory engine can pin down (broker/testkit/memory.py).

A socket test sees a timeout "after about 200 ms" and an fsync "at some point";
here time and the disk move only when the test says so, so each assert is about
an exact instant or an exact frame order. Every client here tunes heartbeat 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands

from warren.broker.server.amqp_connection import PUBLISH_EVENTS_PER_TURN
from warren.broker.server.flow import FlowControl
from warren.broker.testkit.memory import Delivery, MemoryBroker, MemoryClient, publish_bytes
from warren.protocol.methods import make

QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = commands.Basic.Properties(delivery_mode=2)


@pytest.fixture
def engine() -> Iterator[MemoryBroker]:
    e = MemoryBroker()
    yield e
    e.close()


def declare(client: MemoryClient, queue: str, **arguments: Any) -> None:
    ok = client.call(
        1, make(commands.Queue.Declare, queue=queue, durable=True, arguments=arguments)
    )
    assert isinstance(ok, commands.Queue.DeclareOk), ok


def consume(client: MemoryClient, channel: int, queue: str, tag: str, **arguments: Any) -> None:
    method = make(commands.Basic.Consume, queue=queue, consumer_tag=tag, arguments=arguments)
    assert isinstance(client.call(channel, method), commands.Basic.ConsumeOk)


def bodies(received: list[Any]) -> list[bytes]:
    return [got.body for got in received if isinstance(got, Delivery)]


# ---- consumer timeouts ----


def test_consumer_timeout_fires_at_its_deadline_not_a_millisecond_before(
    engine: MemoryBroker,
) -> None:
    client = engine.connect()
    client.channel_open(1)
    declare(client, "jobs", **QUORUM)
    client.publish(1, "", "jobs", b"slow")
    client.channel_open(2)
    consume(client, 2, "jobs", "worker", **{"x-consumer-timeout": 200})
    assert client.names() == ["2 Basic.Deliver 1"]
    engine.advance(0.199)
    assert client.names() == []
    engine.advance(0.001)
    assert client.names() == ["2 Basic.Cancel worker"]
    # the timed-out delivery is back in the queue at the same instant
    assert engine.vhost.queues["jobs"].ready_count == 1


def test_consumer_timeouts_of_two_deliveries_fire_at_their_own_deadlines(
    engine: MemoryBroker,
) -> None:
    """The second delivery's later deadline does not hold back the first's; after the
    first fires the consumer is cancelled, so the second's timer finds nothing to do."""
    client = engine.connect(capabilities={})  # no consumer_cancel_notify: channel.close 406
    client.channel_open(1)
    declare(client, "jobs", **QUORUM)
    client.channel_open(2)
    consume(client, 2, "jobs", "worker", **{"x-consumer-timeout": 300})
    client.publish(1, "", "jobs", b"first")
    engine.advance(0.1)
    client.publish(1, "", "jobs", b"second")
    assert client.names() == ["2 Basic.Deliver 1", "2 Basic.Deliver 2"]
    engine.advance(0.199)
    assert client.names() == []
    engine.advance(0.001)
    (close,) = client.received()
    assert isinstance(close, tuple) and isinstance(close[1], commands.Channel.Close)
    assert close[1].reply_code == 406
    assert "Timeout value used: 300 ms" in close[1].reply_text
    # both go back with the channel, in their order
    assert engine.vhost.queues["jobs"].ready_count == 2


# ---- TTL and dead-lettering ----


def test_messages_expire_in_deadline_order_and_are_dead_lettered_at_that_instant(
    engine: MemoryBroker,
) -> None:
    client = engine.connect()
    client.channel_open(1)
    client.call(1, make(commands.Exchange.Declare, exchange="dlx", exchange_type="fanout"))
    declare(client, "dlq")
    client.call(1, make(commands.Queue.Bind, queue="dlq", exchange="dlx", routing_key=""))
    declare(client, "work", **{"x-dead-letter-exchange": "dlx"})
    client.channel_open(2)
    consume(client, 2, "dlq", "dead")
    for body, ms in ((b"c", "300"), (b"a", "100"), (b"b", "200"), (b"a2", "100")):
        client.publish(1, "", "work", body, commands.Basic.Properties(expiration=ms))
    engine.advance(0.099)
    assert client.received() == []
    engine.advance(0.001)  # the two 100 ms messages, in publish order
    got = client.received()
    assert bodies(got) == [b"a", b"a2"]
    (death,) = got[0].props["headers"]["x-death"]  # type: ignore[union-attr]
    assert (death["reason"], death["queue"], death["original-expiration"]) == (
        "expired",
        "work",
        "100",
    )
    engine.advance(0.1)
    assert bodies(client.received()) == [b"b"]
    engine.advance(0.099)
    assert client.received() == []
    engine.advance(0.001)
    assert bodies(client.received()) == [b"c"]
    assert engine.vhost.queues["work"].ready_count == 0


def test_requeue_after_the_ttl_ran_out_dead_letters_at_once(engine: MemoryBroker) -> None:
    """The deadline counts from the publish; a nack after it sends the message to the
    dead-letter exchange in the same turn, ahead of anything else."""
    client = engine.connect()
    client.channel_open(1)
    client.call(1, make(commands.Exchange.Declare, exchange="dlx", exchange_type="fanout"))
    declare(client, "dlq")
    client.call(1, make(commands.Queue.Bind, queue="dlq", exchange="dlx", routing_key=""))
    declare(client, "work", **{"x-dead-letter-exchange": "dlx", "x-message-ttl": 400})
    client.channel_open(2)
    consume(client, 2, "dlq", "dead")
    client.publish(1, "", "work", b"m")
    client.channel_open(3)
    consume(client, 3, "work", "holder")
    assert client.names() == ["3 Basic.Deliver 1"]
    engine.advance(0.4)  # held past its deadline: nothing happens while it is unacked
    assert client.names() == []
    client.send(3, make(commands.Basic.Nack, delivery_tag=1, multiple=False, requeue=True))
    got = client.received()
    assert [(g.channel, g.body) for g in got if isinstance(g, Delivery)] == [(2, b"m")]
    assert len(got) == 1


# ---- flow control ----


def flow(client: MemoryClient) -> FlowControl:
    return client.connection.flow


def test_a_writer_that_pauses_stops_deliveries_and_reading_until_it_resumes(
    engine: MemoryBroker,
) -> None:
    client = engine.connect()
    client.channel_open(1)
    declare(client, "q")
    consume(client, 1, "q", "c")
    client.pause_writing()
    assert flow(client).describe() == ["writer"]
    assert not client.transport.reading
    client.publish(1, "", "q", b"waits in the socket")
    assert client.received() == []
    assert engine.vhost.queues["q"].ready_count == 0  # not even read
    client.resume_writing()
    assert flow(client).describe() == []
    assert client.transport.reading
    assert bodies(client.received()) == [b"waits in the socket"]


def test_a_publisher_gets_its_share_of_a_turn_then_waits_for_the_next(
    engine: MemoryBroker,
) -> None:
    client = engine.connect()
    client.channel_open(1)
    declare(client, "q")
    client.publish(1, "", "q", b"0")  # a publisher from now on: the smaller share
    queue = engine.vhost.queues["q"]
    # one socket read with 100 publishes, handed over as the server would
    client.connection.data_received(publish_bytes(1, "", "q", b"m") * 100)
    assert queue.ready_count == 1 + PUBLISH_EVENTS_PER_TURN
    assert flow(client).describe() == ["turn"]
    assert not client.transport.reading
    engine.run()  # the next turns handle the rest, then the socket is read again
    assert queue.ready_count == 101
    assert flow(client).describe() == []
    assert client.transport.reading


def _publisher_and_consumer(engine: MemoryBroker) -> tuple[MemoryClient, MemoryClient]:
    """Two connections with channel 1 open, and the queue "q"."""
    publisher, consumer = engine.connect(), engine.connect()
    publisher.channel_open(1)
    declare(publisher, "q")
    consumer.channel_open(1)
    return publisher, consumer


def test_a_stream_of_deliveries_is_written_once_for_the_publishers_turns(
    engine: MemoryBroker,
) -> None:
    publisher, consumer = _publisher_and_consumer(engine)
    method = make(commands.Basic.Consume, queue="q", consumer_tag="c", no_ack=True)
    assert isinstance(consumer.call(1, method), commands.Basic.ConsumeOk)
    publisher.publish(1, "", "q", b"first")
    assert bodies(consumer.received()) == [b"first"]
    writes = consumer.transport.writes
    # ten turns of publishes in one read: their deliveries wait while the publisher has
    # events left for the next turn, then go out together, in order
    batch = b"".join(publish_bytes(1, "", "q", b"%d" % n) for n in range(10 * 64))
    publisher.connection.data_received(batch)
    engine.run()
    assert consumer.transport.writes == writes + 1
    assert bodies(consumer.received()) == [b"%d" % n for n in range(10 * 64)]


def test_a_consumer_with_a_full_prefetch_window_is_written_at_once_during_a_backlog(
    engine: MemoryBroker,
) -> None:
    publisher, consumer = _publisher_and_consumer(engine)
    assert isinstance(
        consumer.call(1, make(commands.Basic.Qos, prefetch_count=10)), commands.Basic.QosOk
    )
    consume(consumer, 1, "q", "c")
    publisher.publish(1, "", "q", b"first")  # a publisher from now on: the smaller share
    assert len(bodies(consumer.received())) == 1
    writes = consumer.transport.writes
    batch = b"".join(publish_bytes(1, "", "q", b"m") for _ in range(10 * 64))
    publisher.connection.data_received(batch)
    engine.clock.turn()  # the next turn: the window's 9 other deliveries go out in it
    assert flow(publisher).describe() == ["turn"]  # while the publisher has more to do
    assert consumer.transport.writes == writes + 1
    assert len(bodies(consumer.received())) == 9


def test_reading_resumes_only_when_the_alarm_and_the_writer_are_both_gone(
    engine: MemoryBroker,
) -> None:
    client = engine.connect()
    client.channel_open(1)
    declare(client, "q")
    client.publish(1, "", "q", b"first")  # a publisher now: an alarm blocks it
    engine.broker.set_alarm("memory", True)
    engine.run()
    assert client.names() == ["0 Connection.Blocked"]
    assert flow(client).describe() == ["alarm"]
    client.pause_writing()
    assert flow(client).describe() == ["alarm", "writer"]
    client.publish(1, "", "q", b"second")
    engine.broker.set_alarm("memory", False)
    engine.run()
    assert client.names() == ["0 Connection.Unblocked"]
    assert flow(client).describe() == ["writer"]
    assert not client.transport.reading
    assert engine.vhost.queues["q"].ready_count == 1  # "second" still unread
    client.resume_writing()
    assert client.transport.reading
    assert engine.vhost.queues["q"].ready_count == 2


def test_unconfirmed_limit_pauses_reading_until_the_disk_catches_up(tmp_path: Path) -> None:
    engine = MemoryBroker(data_dir=str(tmp_path), max_unconfirmed_per_channel=2)
    try:
        client = engine.connect()
        client.channel_open(1)
        declare(client, "d")
        client.confirm_select(1)
        for body in (b"1", b"2", b"3"):
            client.publish(1, "", "d", body, PERSISTENT)
        assert flow(client).describe() == ["unconfirmed"]
        assert not client.transport.reading
        client.publish(1, "", "d", b"4", PERSISTENT)  # waits in the socket
        assert engine.vhost.queues["d"].ready_count == 3
        engine.sync()
        assert flow(client).describe() == []
        assert engine.vhost.queues["d"].ready_count == 4
        # 1 went to the idle writer alone; 2 and 3, which came while it wrote, share a batch
        assert client.names()[:2] == ["1 Basic.Ack 1", "1 Basic.Ack 3 multiple"]
    finally:
        engine.close()


# ---- read coalescing (warren.read_coalescing_interval; Connection._coalesce) ----


@pytest.fixture
def coalescing() -> Iterator[MemoryBroker]:
    e = MemoryBroker(read_coalescing_interval=2)
    yield e
    e.close()


def coalescing_publisher(engine: MemoryBroker) -> MemoryClient:
    client = engine.connect()
    client.channel_open(1)
    declare(client, "q")
    client.publish(1, "", "q", b"1")  # a publisher from now on; declare-ok was its answer
    assert flow(client).describe() == []
    return client


def test_a_publishers_second_quick_small_read_holds_the_next_for_the_interval(
    coalescing: MemoryBroker,
) -> None:
    client = coalescing_publisher(coalescing)
    queue = coalescing.vhost.queues["q"]
    client.publish(1, "", "q", b"2")  # the same instant, nothing sent back: quick
    assert queue.ready_count == 2
    assert flow(client).describe() == ["coalesce"]
    assert not client.transport.reading
    client.publish(1, "", "q", b"3")
    client.publish(1, "", "q", b"4")
    assert queue.ready_count == 2  # both wait in the socket
    coalescing.advance(0.0019)
    assert queue.ready_count == 2
    coalescing.advance(0.0001)  # one read takes both
    assert queue.ready_count == 4
    assert flow(client).describe() == []
    assert client.transport.reading
    coalescing.advance(0.001)
    client.publish(1, "", "q", b"5")  # 1 ms after the last read: not quick
    assert flow(client).describe() == []
    consume(client, 1, "q", "c")
    assert bodies(client.received()) == [b"1", b"2", b"3", b"4", b"5"]


def test_a_publisher_waiting_for_confirms_is_never_held(coalescing: MemoryBroker) -> None:
    client = coalescing.connect()
    client.channel_open(1)
    declare(client, "q")
    client.confirm_select(1)
    for body in (b"1", b"2", b"3", b"4"):
        client.publish(1, "", "q", body)  # each read is answered with its ack
        assert flow(client).describe() == []
    assert client.names() == [f"1 Basic.Ack {tag}" for tag in (1, 2, 3, 4)]
    assert coalescing.vhost.queues["q"].ready_count == 4


def test_a_large_read_is_not_held(coalescing: MemoryBroker) -> None:
    """A read of 64 KiB or more already carries many messages; TCP's window stays open."""
    client = coalescing_publisher(coalescing)
    client.publish(1, "", "q", b"x" * 65536)
    client.publish(1, "", "q", b"y" * 65536)
    assert flow(client).describe() == []
    assert coalescing.vhost.queues["q"].ready_count == 3


def test_anything_sent_to_a_held_publisher_lets_it_read_at_once(coalescing: MemoryBroker) -> None:
    """The client may be about to answer it: here a delivery it will ack."""
    client = coalescing.connect()
    client.channel_open(1)
    declare(client, "q")
    declare(client, "inbox")
    client.channel_open(2)
    consume(client, 2, "inbox", "c")
    client.publish(1, "", "q", b"1")
    client.publish(1, "", "q", b"2")
    assert flow(client).describe() == ["coalesce"]
    client.publish(1, "", "q", b"3")  # waits in the socket
    other = coalescing.connect()
    other.channel_open(1)
    other.publish(1, "", "inbox", b"for the held one")
    assert bodies(client.received()) == [b"for the held one"]
    assert flow(client).describe() == []  # at the same instant
    assert coalescing.vhost.queues["q"].ready_count == 3


# ---- confirms, the disk and nacks ----


def test_a_nack_overtakes_acks_that_wait_for_the_disk(tmp_path: Path) -> None:
    """rabbit_confirms: a refused publish is nacked at once; the acks of the publishes
    around it come when the disk has them, and step around the nacked tag."""
    engine = MemoryBroker(data_dir=str(tmp_path))
    try:
        client = engine.connect()
        client.channel_open(1)
        declare(client, "d")
        declare(client, "full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
        client.confirm_select(1)
        client.publish(1, "", "d", b"1", PERSISTENT)  # waits for the fsync
        client.publish(1, "", "full", b"2")  # refused
        client.publish(1, "", "d", b"3")  # transient, but its ack would cover 1
        assert client.names() == ["1 Basic.Nack 2"]
        engine.sync()
        assert client.names() == ["1 Basic.Ack 1", "1 Basic.Ack 3"]
        client.publish(1, "", "d", b"4", PERSISTENT)
        client.publish(1, "", "d", b"5", PERSISTENT)
        assert client.names() == []
        engine.sync()
        # 4 went to the idle writer alone, 5 in the batch after it
        assert client.names() == ["1 Basic.Ack 4", "1 Basic.Ack 5"]
    finally:
        engine.close()


# ---- connections that go away ----


def test_a_lost_connections_unacked_messages_go_to_the_next_consumer_in_order(
    engine: MemoryBroker,
) -> None:
    first, second = engine.connect(), engine.connect()
    for client in (first, second):
        client.channel_open(1)
    declare(first, "q")
    consume(first, 1, "q", "a")
    for body in (b"1", b"2", b"3"):
        first.publish(1, "", "q", body)
    assert bodies(first.received()) == [b"1", b"2", b"3"]
    consume(second, 1, "q", "b")
    assert second.received() == []  # nothing is ready
    first.drop()
    got = [g for g in second.received() if isinstance(g, Delivery)]
    assert [(g.body, g.method.redelivered) for g in got] == [
        (b"1", True),
        (b"2", True),
        (b"3", True),
    ]


# ---- no heartbeats ----


def test_an_hour_of_broker_time_sends_nothing_and_closes_nothing(engine: MemoryBroker) -> None:
    client = engine.connect()
    client.channel_open(1)
    declare(client, "q")
    engine.advance(3600)
    assert client.received() == []
    assert not client.transport.closed
    ok = client.call(1, make(commands.Queue.Declare, queue="q", durable=True, passive=True))
    assert isinstance(ok, commands.Queue.DeclareOk)
