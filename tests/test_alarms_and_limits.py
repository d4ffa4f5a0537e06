"""Memory/disk alarms (connection.blocked) and per-vhost limits."""

from __future__ import annotations

from collections.abc import Iterator

import pika
import pytest
from pamqp import commands

from broker.testing import RunningBroker, run_broker
from tests.amqp_raw import RawClient, build


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
        publisher.declare_queue(1, "alarm.q")
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
            client.declare_queue(1, "limit.q1")
            client.send_method(1, build(commands.Queue.Declare, queue="limit.q2"))
            assert client.expect_channel_close(1)[:2] == (
                406,
                "PRECONDITION_FAILED - cannot declare queue 'limit.q2': queue limit in vhost "
                f"'/' ({existing + 1}) is reached",
            )
    finally:
        warren.call(lambda: vhost.limits.clear())
