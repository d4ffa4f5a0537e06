"""Memory/disk alarms (connection.blocked) and per-vhost limits."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pika
import pytest
from pamqp import commands

from tests.amqp_raw import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    header_payload,
    method_payload,
    publish_frames,
)
from warren.broker.testkit import RunningBroker, run_broker


@pytest.fixture
def warren() -> Iterator[RunningBroker]:
    with run_broker() as running:
        yield running


def set_memory_limit(running: RunningBroker, limit: int) -> None:
    monitor = running.server.broker.monitor

    def apply() -> None:
        monitor.memory_limit = limit
        monitor.check()

    running.call(apply)


def queue_depth(running: RunningBroker, name: str) -> int:
    return int(running.call(lambda: running.server.broker.vhosts["/"].queues[name].ready_count))


def test_memory_alarm_blocks_publishers_and_lets_consumers_drain(warren: RunningBroker) -> None:
    addr = (warren.host, warren.port)
    with RawClient.connect(addr) as publisher, RawClient.connect(addr) as consumer:
        publisher.declare_queue(1, "alarm.q", durable=True)
        for i in range(3):
            publisher.publish(1, b"before-%d" % i, routing_key="alarm.q")
        publisher.declare_queue(1, "alarm.q", passive=True)  # the publishes are in
        set_memory_limit(warren, 1)  # any process is over one byte
        blocked = publisher.expect_method(commands.Connection.Blocked, 0)
        assert blocked.reason == "low on memory"
        publisher.publish(1, b"during", routing_key="alarm.q")
        # the consumer is not blocked: it drains what is there
        got = [consumer.get(1, "alarm.q", no_ack=True) for _ in range(3)]
        assert [d.body for d in got if d is not None] == [b"before-0", b"before-1", b"before-2"]
        assert consumer.get(1, "alarm.q", no_ack=True) is None  # 'during' was not read
        assert queue_depth(warren, "alarm.q") == 0
        set_memory_limit(warren, 1 << 50)
        publisher.expect_method(commands.Connection.Unblocked, 0)
        publisher.declare_queue(1, "alarm.q", passive=True)
        d = consumer.get(1, "alarm.q", no_ack=True)
        assert d is not None and d.body == b"during"


def test_alarm_is_visible_on_the_broker(warren: RunningBroker) -> None:
    set_memory_limit(warren, 1)
    assert warren.call(lambda: set(warren.server.broker.alarms)) == {"memory"}
    set_memory_limit(warren, 1 << 50)
    assert warren.call(lambda: set(warren.server.broker.alarms)) == set()


def test_disk_alarm_from_free_space(tmp_path: object) -> None:
    with run_broker(data_dir=str(tmp_path), disk_free_limit_absolute=1 << 60) as running:
        assert running.call(lambda: set(running.server.broker.alarms)) == {"disk"}
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        blocked: list[str] = []
        conn.add_on_connection_blocked_callback(
            lambda _c, frame: blocked.append(frame.method.reason)
        )
        channel = conn.channel()
        channel.basic_publish("", "nowhere", b"x")
        deadline = 50
        while not blocked and deadline:
            conn.process_data_events(time_limit=0.05)
            deadline -= 1
        assert blocked == ["low on disk"]
        # a blocked connection is not read (as in RabbitMQ): clear the alarm, then close
        monitor = running.server.broker.monitor

        def clear() -> None:
            monitor.disk_limit = 0
            monitor.check()

        running.call(clear)
        conn.close()


def test_vhost_connection_limit(warren: RunningBroker) -> None:
    vhost = warren.server.broker.vhosts["/"]
    warren.call(lambda: vhost.limits.update({"max-connections": 1}))
    try:
        with RawClient.connect((warren.host, warren.port)):
            second = RawClient((warren.host, warren.port))
            second.handshake(open_vhost=False)
            second.send_method(0, build(commands.Connection.Open, virtual_host="/"))
            code, text, class_id, method_id = second.expect_close()
            assert (code, class_id, method_id) == (530, 10, 40)
            assert text == (
                "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
                "connection limit (1) is reached"
            )
            second.sock.close()
    finally:
        warren.call(lambda: vhost.limits.clear())


def test_vhost_queue_limit(warren: RunningBroker) -> None:
    vhost = warren.server.broker.vhosts["/"]
    existing = warren.call(lambda: len(vhost.queues))
    warren.call(lambda: vhost.limits.update({"max-queues": existing + 1}))
    try:
        with RawClient.connect((warren.host, warren.port)) as client:
            client.declare_queue(1, "limit.q1", durable=True)
            client.send_method(1, build(commands.Queue.Declare, queue="limit.q2", durable=True))
            assert client.expect_channel_close(1)[:2] == (
                406,
                "PRECONDITION_FAILED - cannot declare queue 'limit.q2': queue limit in vhost "
                f"'/' ({existing + 1}) is reached",
            )
    finally:
        warren.call(lambda: vhost.limits.clear())


def unconfirmed_now(running: RunningBroker) -> tuple[int, int]:
    """The most publishes awaiting a confirm on any channel, and how often reading was held."""

    def look() -> tuple[int, int]:
        conns = running.server.broker.connections
        waiting = [ch.confirms.unconfirmed for c in conns for ch in c.channels.values()]
        return max(waiting, default=0), sum(c.holds for c in conns)

    return running.call(look)


def test_a_publisher_that_never_waits_for_confirms_is_held_at_the_limit(tmp_path: object) -> None:
    """Persistent publishes wait for the disk before their basic.ack. A client that sends far
    more than max_unconfirmed_per_channel without reading is not read past the limit until the
    confirms drain (TCP back pressure, as RabbitMQ's credit flow): no error, nothing lost,
    acks in order, and the other connections keep working meanwhile."""
    limit, count = 10, 20_000
    with run_broker(data_dir=str(tmp_path), max_unconfirmed_per_channel=limit) as running:
        addr = (running.host, running.port)
        with RawClient.connect(addr) as publisher, RawClient.connect(addr) as other:
            publisher.declare_queue(1, "flood.q", durable=True)
            other.declare_queue(1, "side.q", durable=True)
            publisher.confirm_select(1)
            one = publish_frames("flood.q", b"m" * 100, commands.Basic.Properties(delivery_mode=2))
            sender = threading.Thread(target=publisher.send, args=(one * count,))
            sender.start()
            peak = round_trips = 0
            while sender.is_alive() or round_trips < 3:
                waiting, _ = unconfirmed_now(running)
                peak = max(peak, waiting)
                other.publish(1, b"side", routing_key="side.q")
                got = other.get(1, "side.q", no_ack=True)
                assert got is not None and got.body == b"side"
                round_trips += 1
            sender.join()
            last = 0
            while last < count:
                ack = publisher.expect_method(commands.Basic.Ack, 1)
                assert ack.delivery_tag > last  # in order, each once
                last = ack.delivery_tag
            _, holds = unconfirmed_now(running)
            assert holds > 0  # the limit was reached, and the publisher held
            assert other.declare_queue(1, "flood.q", passive=True).message_count == count
        # at most one turn of publishes (EVENTS_PER_TURN) past the limit, sampled
        assert peak <= limit + 257, peak


def test_a_publisher_with_a_window_within_the_limit_is_never_held(tmp_path: object) -> None:
    limit = 10
    with (
        run_broker(data_dir=str(tmp_path), max_unconfirmed_per_channel=limit) as running,
        RawClient.connect((running.host, running.port)) as c,
    ):
        c.declare_queue(1, "window.q", durable=True)
        c.confirm_select(1)
        one = publish_frames("window.q", b"w", commands.Basic.Properties(delivery_mode=2))
        for _ in range(20):
            c.send(one * limit)
            c.publish_seq[1] += limit
            assert all(c.wait_for_confirms(1).values())
        assert unconfirmed_now(running) == (0, 0)  # nothing waits, and reading was never held


def test_a_nack_while_earlier_publishes_wait_for_the_disk_does_not_swallow_their_acks(
    tmp_path: object,
) -> None:
    """Seq 1 waits for the fsync, seq 2 is refused at once: RabbitMQ 3.10 sends nack 2, then
    ack 1 (neither multiple). Warren used to mark 1 as confirmed with the nack and never ack it."""
    with (
        run_broker(data_dir=str(tmp_path)) as running,
        RawClient.connect((running.host, running.port)) as c,
    ):
        c.declare_queue(1, "disk.q", durable=True)
        full = {"x-max-length": 0, "x-overflow": "reject-publish"}
        c.declare_queue(1, "full.q", arguments=full, durable=True)
        c.confirm_select(1)
        persistent = commands.Basic.Properties(delivery_mode=2)
        c.send(publish_frames("disk.q", b"a", persistent) + publish_frames("full.q", b"b", None))
        c.publish_seq[1] = 2
        assert c.wait_for_confirms(1) == {1: True, 2: False}
        c.publish(1, b"c", routing_key="disk.q", properties=persistent)
        c.publish(1, b"d", routing_key="disk.q", properties=persistent)
        assert c.wait_for_confirms(1) == {3: True, 4: True}


def test_an_unfinished_message_counts_as_publishing_for_the_alarms(warren: RunningBroker) -> None:
    """A client that only ever sends parts of bodies must be blocked too, or it could fill
    memory past the alarm (RabbitMQ blocks on the first content frame)."""
    addr = (warren.host, warren.port)
    with RawClient.connect(addr) as publisher, RawClient.connect(addr) as consumer:
        publisher.declare_queue(1, "partial.q", durable=True)
        publisher.channel_open(2)
        method = method_payload(build(commands.Basic.Publish, routing_key="partial.q"))
        publisher.send(
            frame_bytes(FRAME_METHOD, 1, method)
            + frame_bytes(FRAME_HEADER, 1, header_payload(2000))
            + frame_bytes(FRAME_BODY, 1, b"x" * 1000)
        )
        publisher.declare_queue(2, "partial.q", passive=True)  # the frames above were read
        set_memory_limit(warren, 1)
        assert publisher.expect_method(commands.Connection.Blocked, 0).reason == "low on memory"
        publisher.send(frame_bytes(FRAME_BODY, 1, b"y" * 1000))
        publisher.send_method(2, build(commands.Queue.Declare, queue="partial.q", passive=True))
        publisher.assert_silent(0.3)  # not read while blocked
        assert consumer.get(1, "partial.q", no_ack=True) is None
        set_memory_limit(warren, 1 << 50)
        publisher.expect_method(commands.Connection.Unblocked, 0)
        publisher.expect_method(commands.Queue.DeclareOk, 2)
        got = consumer.get(1, "partial.q", no_ack=True)
        assert got is not None and got.body == b"x" * 1000 + b"y" * 1000


# ---- read coalescing (warren.read_coalescing_interval; server/amqp_connection.py _coalesce) ----


def coalesced(running: RunningBroker) -> int:
    """Times a connection was held; only a broker that does not record holds any."""
    return int(running.call(lambda: sum(c.coalesced for c in running.server.broker.connections)))


@pytest.mark.parametrize("interval", [1, 0])
def test_a_fire_and_forget_stream_is_read_in_batches_and_arrives_whole(interval: int) -> None:
    """Each publish in its own segment, microseconds apart, nothing sent back: the socket
    is held between reads (with the default interval), and every message arrives in order.

    The broker holds a read only while it keeps up with the stream (reads within 0.1 ms
    of each other); on a busy machine a burst can pass without one, so bursts go on until
    one is held, up to ten, which is also what the case without coalescing sends."""
    count = 0
    with (
        run_broker(record=False, read_coalescing_interval=interval) as running,
        RawClient.connect((running.host, running.port)) as c,
    ):
        c.declare_queue(1, "stream.q")
        for _ in range(10):
            for i in range(count, count + 2000):
                c.send(publish_frames("stream.q", b"%d" % i, None))
            count += 2000
            assert c.declare_queue(1, "stream.q", passive=True).message_count == count
            if coalesced(running):
                break
        assert (coalesced(running) > 0) is (interval > 0)
        c.consume(1, "stream.q", no_ack=True)
        assert [d.body for d in c.deliveries(1, count)] == [b"%d" % i for i in range(count)]


def test_a_publisher_that_is_sent_confirms_is_never_held() -> None:
    count = 2000
    with (
        run_broker(record=False) as running,
        RawClient.connect((running.host, running.port)) as c,
    ):
        c.declare_queue(1, "confirmed.q")
        c.confirm_select(1)
        for i in range(count):
            c.send(publish_frames("confirmed.q", b"%d" % i, None))
        acked = 0
        while acked < count:
            acked = c.expect_method(commands.Basic.Ack, 1).delivery_tag
        assert coalesced(running) == 0


def test_a_recording_broker_has_read_every_publish_when_the_test_asks() -> None:
    """The test kit records: published() right after a fire-and-forget publish lists it."""
    with run_broker() as running, RawClient.connect((running.host, running.port)) as c:
        c.declare_queue(1, "recorded.q")
        for round_ in range(1, 21):
            for _ in range(3):
                c.send(publish_frames("recorded.q", b"r", None))
            assert len(running.published()) == 3 * round_
        assert coalesced(running) == 0
