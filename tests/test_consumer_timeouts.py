"""Consumer timeouts on quorum queues, as RabbitMQ 4.3 does them.

Each test owns its queue on a module broker; precedence tests that need the
global setting start their own broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pamqp import commands

from tests.amqp_raw import DEFAULT_CAPABILITIES, RawClient, build
from warren.broker.policy import Policy
from warren.broker.testkit import RunningBroker, run_broker

NO_CANCEL_NOTIFY = {k: v for k, v in DEFAULT_CAPABILITIES.items() if k != "consumer_cancel_notify"}
QUORUM = {"x-queue-type": "quorum"}


def close_text(channel: int, timeout_ms: int) -> str:
    return (
        f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. "
        f"Timeout value used: {timeout_ms} ms. This timeout value can be configured, "
        "see consumers doc guide to learn more"
    )


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker() as running:
        yield running


@pytest.fixture
def qname() -> str:
    return f"ct.{uuid.uuid4().hex[:10]}"


def connect(running: RunningBroker, **kw: Any) -> RawClient:
    return RawClient.connect((running.host, running.port), **kw)


def declare_and_publish(
    client: RawClient, queue: str, bodies: list[bytes], arguments: dict[str, Any] | None = None
) -> None:
    client.declare_queue(1, queue, durable=True, arguments={**QUORUM, **(arguments or {})})
    client.confirm_select(1)
    for body in bodies:
        client.publish(1, body, routing_key=queue)
    client.wait_for_confirms(1)


def expect_cancel(client: RawClient, channel: int, tag: str, timeout: float = 5) -> float:
    m = client.expect_method(commands.Basic.Cancel, channel, timeout)
    assert m.consumer_tag == tag
    return time.monotonic()


def test_cancel_notify_client_gets_basic_cancel_and_keeps_channel(
    warren: RunningBroker, qname: str
) -> None:
    with connect(warren) as client:
        declare_and_publish(client, qname, [b"slow"])
        client.channel_open(2)
        tag = client.consume(2, qname, "slow-worker", arguments={"x-consumer-timeout": 200})
        delivery = client.read_delivery(2)
        delivered_at = time.monotonic()
        cancelled_at = expect_cancel(client, 2, tag)
        assert 0.19 <= cancelled_at - delivered_at < 0.4
        # the channel lives: other work goes on, the message comes back redelivered
        client.channel_open(3)
        client.consume(3, qname, "rescuer")
        again = client.read_delivery(3)
        assert (again.body, again.method.redelivered) == (b"slow", True)
        # settling the timed-out tag is accepted without error, then the rescuer acks
        client.ack(2, delivery.method.delivery_tag)
        client.ack(3, again.method.delivery_tag)
        ok = client.call(2, commands.Basic.Qos(prefetch_count=5), commands.Basic.QosOk)
        assert isinstance(ok, commands.Basic.QosOk)


def test_client_without_cancel_notify_gets_channel_closed_406(
    warren: RunningBroker, qname: str
) -> None:
    with connect(warren, capabilities=NO_CANCEL_NOTIFY) as client:
        declare_and_publish(client, qname, [b"slow"])
        client.channel_open(2)
        client.consume(2, qname, "c", arguments={"x-consumer-timeout": 150})
        client.read_delivery(2)
        assert client.expect_channel_close(2) == (406, close_text(2, 150), 0, 0)
        delivery = client.get(1, qname, no_ack=True)
        assert delivery is not None and delivery.method.redelivered


def test_only_expired_deliveries_return_and_consumer_recovers_after_settling(
    warren: RunningBroker, qname: str
) -> None:
    with connect(warren) as client:
        declare_and_publish(client, qname, [b"first"])
        client.channel_open(2)
        tag = client.consume(2, qname, "partial", arguments={"x-consumer-timeout": 300})
        first = client.read_delivery(2)
        time.sleep(0.15)  # a second delivery with a later deadline
        client.publish(1, b"second", routing_key=qname)
        client.wait_for_confirms(1)
        second = client.read_delivery(2)
        expect_cancel(client, 2, tag)
        # 'second' is still ours; 'first' went back and waits for another consumer
        assert client.get(1, qname, no_ack=False) is not None  # that is 'first', redelivered
        client.send_method(1, commands.Basic.Recover(requeue=True))
        client.expect_method(commands.Basic.RecoverOk, 1)
        client.ack(2, second.method.delivery_tag)
        # in the timeout state: nothing new comes to this consumer ...
        client.publish(1, b"third", routing_key=qname)
        client.wait_for_confirms(1)
        assert client.frames_within(0.2) == []
        # ... until the timed-out delivery is settled (RabbitMQ 4.3 lets it resume)
        client.ack(2, first.method.delivery_tag)
        resumed = client.read_delivery(2)
        assert resumed.method.consumer_tag == tag
        assert resumed.body in (b"first", b"third")


def test_other_consumers_on_the_channel_keep_receiving(warren: RunningBroker, qname: str) -> None:
    with connect(warren) as client:
        slow_q, fast_q = f"{qname}.slow", f"{qname}.fast"
        declare_and_publish(client, slow_q, [b"never-acked"])
        client.declare_queue(1, fast_q, durable=True, arguments=QUORUM)
        client.channel_open(2)
        slow = client.consume(2, slow_q, "slow", arguments={"x-consumer-timeout": 150})
        client.consume(2, fast_q, "fast")
        client.read_delivery(2)
        expect_cancel(client, 2, slow)
        client.publish(1, b"still-flowing", routing_key=fast_q)
        client.wait_for_confirms(1)
        d = client.read_delivery(2)
        assert (d.method.consumer_tag, d.body) == ("fast", b"still-flowing")


@pytest.mark.parametrize(
    ("queue_arg", "policy_ms", "consumer_arg", "expected"),
    [
        (None, None, 150, 150),  # consumer argument alone
        (60000, None, 150, 150),  # consumer argument beats a longer queue argument
        (150, None, None, 150),  # queue argument alone
        (150, 60000, None, 150),  # min(queue argument, policy): the argument
        (60000, 150, None, 150),  # min(queue argument, policy): the policy
        (None, 150, None, 150),  # policy alone
    ],
)
def test_effective_timeout_precedence(
    warren: RunningBroker,
    qname: str,
    queue_arg: int | None,
    policy_ms: int | None,
    consumer_arg: int | None,
    expected: int,
) -> None:
    vhost = warren.server.broker.vhosts["/"]
    if policy_ms is not None:
        policy = Policy("/", qname, f"^{qname}$", {"consumer-timeout": policy_ms}, "queues", 5)
        warren.call(vhost.set_policy, policy)
    try:
        with connect(warren, capabilities=NO_CANCEL_NOTIFY) as client:
            args = {} if queue_arg is None else {"x-consumer-timeout": queue_arg}
            declare_and_publish(client, qname, [b"p"], args)
            client.channel_open(2)
            consume_args = {} if consumer_arg is None else {"x-consumer-timeout": consumer_arg}
            client.consume(2, qname, "c", arguments=consume_args)
            client.read_delivery(2)
            assert client.expect_channel_close(2)[1] == close_text(2, expected)
    finally:
        warren.call(vhost.clear_policy, qname)


def test_consumer_argument_longer_than_queue_argument_wins(
    warren: RunningBroker, qname: str
) -> None:
    with connect(warren) as client:
        declare_and_publish(client, qname, [b"p"], {"x-consumer-timeout": 100})
        client.channel_open(2)
        client.consume(2, qname, "c", arguments={"x-consumer-timeout": 60000})
        d = client.read_delivery(2)
        assert client.frames_within(0.4) == []
        client.ack(2, d.method.delivery_tag)


def test_policy_change_applies_to_running_consumers(warren: RunningBroker, qname: str) -> None:
    vhost = warren.server.broker.vhosts["/"]
    with connect(warren) as client:
        declare_and_publish(client, qname, [])
        client.channel_open(2)
        tag = client.consume(2, qname, "c")
        policy = Policy("/", qname, f"^{qname}$", {"consumer-timeout": 150}, "quorum_queues", 1)
        warren.call(vhost.set_policy, policy)
        try:
            client.publish(1, b"after-policy", routing_key=qname)
            client.wait_for_confirms(1)
            client.read_delivery(2)
            expect_cancel(client, 2, tag)
        finally:
            warren.call(vhost.clear_policy, qname)


def test_global_consumer_timeout_from_config_and_infinity() -> None:
    with run_broker(consumer_timeout=150) as running, connect(running) as client:
        declare_and_publish(client, "g", [b"x"])
        client.channel_open(2)
        tag = client.consume(2, "g", "c")
        client.read_delivery(2)
        expect_cancel(client, 2, tag)
    with run_broker(consumer_timeout=None) as running, connect(running) as client:
        declare_and_publish(client, "g", [b"x"])
        client.channel_open(2)
        client.consume(2, "g", "c")
        client.read_delivery(2)
        assert client.frames_within(0.4) == []


def test_classic_queues_do_not_time_out(warren: RunningBroker, qname: str) -> None:
    with connect(warren) as client:
        client.declare_queue(1, qname, arguments={"x-consumer-timeout": 100}, durable=True)
        client.publish(1, b"classic", routing_key=qname)
        client.channel_open(2)
        client.consume(2, qname, "c", arguments={"x-consumer-timeout": 100})
        d = client.read_delivery(2)
        assert client.frames_within(0.35) == []
        client.ack(2, d.method.delivery_tag)
        # the argument is kept, so an identical redeclare is equivalent
        assert client.declare_queue(1, qname, arguments={"x-consumer-timeout": 100}, durable=True)


@pytest.mark.parametrize(("value", "reason"), [(0, "{value_zero,0}"), ("abc", "expected integer")])
def test_invalid_timeout_values_refused(
    warren: RunningBroker, qname: str, value: Any, reason: str
) -> None:
    with connect(warren) as client:
        client.send_method(
            1,
            build(
                commands.Queue.Declare,
                queue=qname,
                durable=True,
                arguments={**QUORUM, "x-consumer-timeout": value},
            ),
        )
        code, text, _, _ = client.expect_channel_close(1)
        assert code == 406 and "x-consumer-timeout" in text and reason in text
        client.channel_open(1)
        client.declare_queue(1, qname, durable=True, arguments=QUORUM)
        client.send_method(
            1,
            build(commands.Basic.Consume, queue=qname, arguments={"x-consumer-timeout": value}),
        )
        code, text, _, _ = client.expect_channel_close(1)
        assert code == 406 and "x-consumer-timeout" in text and reason in text


def test_unacked_basic_get_times_out_with_channel_close(warren: RunningBroker, qname: str) -> None:
    """RabbitMQ 4.3: a basic.get delivery has the queue's timeout and closes the channel."""
    with connect(warren) as client:
        declare_and_publish(client, qname, [b"got"], {"x-consumer-timeout": 150})
        client.channel_open(2)
        assert client.get(2, qname) is not None
        assert client.expect_channel_close(2) == (406, close_text(2, 150), 0, 0)
        again = client.get(1, qname, no_ack=True)
        assert again is not None and again.method.redelivered


def test_cancel_ok_from_client_removes_the_timed_out_consumer(
    warren: RunningBroker, qname: str
) -> None:
    with connect(warren) as client:
        declare_and_publish(client, qname, [b"x"])
        client.channel_open(2)
        tag = client.consume(2, qname, "c", arguments={"x-consumer-timeout": 100})
        client.read_delivery(2)
        expect_cancel(client, 2, tag)
        client.send_method(2, commands.Basic.CancelOk(consumer_tag=tag))
        ok = client.declare_queue(1, qname, durable=True, arguments=QUORUM)
        assert ok.consumer_count == 0


def test_pika_consumer_is_told_through_its_cancel_callback(warren: RunningBroker) -> None:
    """pika advertises consumer_cancel_notify: it sees basic.cancel, not a closed channel."""
    queue = f"ct.pika.{uuid.uuid4().hex[:8]}"
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, arguments=QUORUM)
        channel.basic_publish("", queue, b"work")
        cancelled: list[bool] = []
        received: list[bytes] = []
        channel.add_on_cancel_callback(lambda frame: cancelled.append(True))
        channel.basic_consume(
            queue,
            lambda ch, method, props, body: received.append(body),
            arguments={"x-consumer-timeout": 150},
        )
        deadline = time.monotonic() + 5
        while not cancelled and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert received == [b"work"] and cancelled == [True]
        assert channel.is_open
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"work" and method.redelivered
    finally:
        conn.close()
