"""Consumer timeouts on quorum queues, as RabbitMQ 4.3 does them.

What a client sees (basic.cancel, or channel.close 406 without
consumer_cancel_notify; pika's cancel callback) is tested over a socket, each
test owning its queue on a module broker. The rest runs on the in-memory engine
(broker/testkit/memory.py) with a manual clock: deadlines to the millisecond,
and "nothing happens" asserted without waiting.
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
from warren.broker.engine.policy import Policy
from warren.broker.testkit import RunningBroker, run_broker
from warren.broker.testkit.memory import Delivery, MemoryBroker, MemoryClient
from warren.protocol.methods import make

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


# ---- on the in-memory engine: broker time moves only with advance() ----


@pytest.fixture
def engine() -> Iterator[MemoryBroker]:
    e = MemoryBroker()
    yield e
    e.close()


def mem_client(engine: MemoryBroker, cancel_notify: bool = True) -> MemoryClient:
    caps = DEFAULT_CAPABILITIES if cancel_notify else NO_CANCEL_NOTIFY
    client = engine.connect(capabilities=caps)
    client.channel_open(1)
    client.confirm_select(1)
    return client


def mem_declare(
    client: MemoryClient, queue: str, bodies: list[bytes], arguments: dict[str, Any] | None = None
) -> None:
    args = {**QUORUM, **(arguments or {})}
    ok = client.call(1, make(commands.Queue.Declare, queue=queue, durable=True, arguments=args))
    assert isinstance(ok, commands.Queue.DeclareOk), ok
    for body in bodies:
        client.publish(1, "", queue, body)
    assert all(name.startswith("1 Basic.Ack") for name in client.names())  # confirmed


def mem_consume(
    client: MemoryClient, channel: int, queue: str, tag: str, timeout: int | None = None
) -> None:
    args = {} if timeout is None else {"x-consumer-timeout": timeout}
    method = make(commands.Basic.Consume, queue=queue, consumer_tag=tag, arguments=args)
    assert isinstance(client.call(channel, method), commands.Basic.ConsumeOk)


def deliveries(client: MemoryClient, channel: int) -> list[Delivery]:
    """What arrived on ``channel``, checking that it was all deliveries (acks aside)."""
    got = [g for g in client.received() if not (isinstance(g, tuple) and g[0] == 1)]
    assert all(isinstance(g, Delivery) and g.channel == channel for g in got), got
    return [g for g in got if isinstance(g, Delivery)]


def channel_closed(client: MemoryClient, channel: int) -> tuple[int, str]:
    (close,) = [g for g in client.received() if isinstance(g, tuple) and g[0] == channel]
    assert isinstance(close[1], commands.Channel.Close), close
    client.send(channel, commands.Channel.CloseOk())
    return close[1].reply_code, close[1].reply_text


def test_only_expired_deliveries_return_and_consumer_recovers_after_settling(
    engine: MemoryBroker,
) -> None:
    client = mem_client(engine)
    mem_declare(client, "q", [b"first"])
    client.channel_open(2)
    mem_consume(client, 2, "q", "partial", 300)
    (first,) = deliveries(client, 2)
    engine.advance(0.15)  # a second delivery with a later deadline
    client.publish(1, "", "q", b"second")
    (second,) = deliveries(client, 2)
    engine.advance(0.15)
    assert client.names() == ["2 Basic.Cancel partial"]
    queue = engine.vhost.queues["q"]
    # 'second' is still ours; 'first' went back and waits for another consumer
    assert (queue.ready_count, queue.unacked_count) == (1, 1)
    client.send(2, make(commands.Basic.Ack, delivery_tag=second.method.delivery_tag))
    # in the timeout state: nothing new comes to this consumer, however long ...
    client.publish(1, "", "q", b"third")
    engine.advance(3600)
    assert deliveries(client, 2) == []
    # ... until the timed-out delivery is settled (RabbitMQ 4.3 lets it resume)
    client.send(2, make(commands.Basic.Ack, delivery_tag=first.method.delivery_tag))
    resumed = deliveries(client, 2)
    assert [(d.method.consumer_tag, d.body) for d in resumed] == [
        ("partial", b"first"),
        ("partial", b"third"),
    ]


def test_other_consumers_on_the_channel_keep_receiving(engine: MemoryBroker) -> None:
    client = mem_client(engine)
    mem_declare(client, "slow", [b"never-acked"])
    mem_declare(client, "fast", [])
    client.channel_open(2)
    mem_consume(client, 2, "slow", "slow", 150)
    mem_consume(client, 2, "fast", "fast")
    assert len(deliveries(client, 2)) == 1
    engine.advance(0.15)
    assert client.names() == ["2 Basic.Cancel slow"]
    client.publish(1, "", "fast", b"still-flowing")
    (d,) = deliveries(client, 2)
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
        (100, None, 60000, 60000),  # a consumer argument longer than the queue's wins
    ],
)
def test_effective_timeout_precedence(
    engine: MemoryBroker,
    queue_arg: int | None,
    policy_ms: int | None,
    consumer_arg: int | None,
    expected: int,
) -> None:
    if policy_ms is not None:
        engine.vhost.set_policy(
            Policy("/", "p", "^q$", {"consumer-timeout": policy_ms}, "queues", 5)
        )
    client = mem_client(engine, cancel_notify=False)
    mem_declare(client, "q", [b"p"], {} if queue_arg is None else {"x-consumer-timeout": queue_arg})
    client.channel_open(2)
    mem_consume(client, 2, "q", "c", consumer_arg)
    assert len(deliveries(client, 2)) == 1
    engine.advance(expected / 1000 - 0.001)
    assert client.received() == []
    engine.advance(0.001)
    assert channel_closed(client, 2) == (406, close_text(2, expected))


def test_policy_change_applies_to_running_consumers(engine: MemoryBroker) -> None:
    client = mem_client(engine)
    mem_declare(client, "q", [])
    client.channel_open(2)
    mem_consume(client, 2, "q", "c")
    engine.vhost.set_policy(Policy("/", "p", "^q$", {"consumer-timeout": 150}, "quorum_queues", 1))
    client.publish(1, "", "q", b"after-policy")
    assert len(deliveries(client, 2)) == 1
    engine.advance(0.15)
    assert client.names() == ["2 Basic.Cancel c"]


@pytest.mark.parametrize(("setting", "fires"), [(150, True), (None, False)])
def test_global_consumer_timeout_from_config_and_infinity(setting: int | None, fires: bool) -> None:
    engine = MemoryBroker(consumer_timeout=setting)
    try:
        client = mem_client(engine)
        mem_declare(client, "g", [b"x"])
        client.channel_open(2)
        mem_consume(client, 2, "g", "c")
        assert len(deliveries(client, 2)) == 1
        engine.advance(0.15 if fires else 10 * 365 * 86400)
        assert client.names() == (["2 Basic.Cancel c"] if fires else [])
    finally:
        engine.close()


def test_classic_queues_do_not_time_out(engine: MemoryBroker) -> None:
    client = mem_client(engine)
    args = {"x-consumer-timeout": 100}
    declare = make(commands.Queue.Declare, queue="q", durable=True, arguments=args)
    assert isinstance(client.call(1, declare), commands.Queue.DeclareOk)
    client.publish(1, "", "q", b"classic")
    client.channel_open(2)
    mem_consume(client, 2, "q", "c", 100)
    (d,) = deliveries(client, 2)
    engine.advance(3600)
    assert client.received() == []
    client.send(2, make(commands.Basic.Ack, delivery_tag=d.method.delivery_tag))
    # the argument is kept, so an identical redeclare is equivalent
    assert isinstance(client.call(1, declare), commands.Queue.DeclareOk)


def test_unacked_basic_get_times_out_with_channel_close(engine: MemoryBroker) -> None:
    """RabbitMQ 4.3: a basic.get delivery has the queue's timeout and closes the channel."""
    client = mem_client(engine)
    mem_declare(client, "q", [b"got"], {"x-consumer-timeout": 150})
    client.channel_open(2)
    client.send(2, make(commands.Basic.Get, queue="q"))
    assert client.names() == ["2 Basic.GetOk 1"]
    engine.advance(0.149)
    assert client.received() == []
    engine.advance(0.001)
    assert channel_closed(client, 2) == (406, close_text(2, 150))
    client.send(1, make(commands.Basic.Get, queue="q", no_ack=True))
    (again,) = [g for g in client.received() if isinstance(g, Delivery)]
    assert again.method.redelivered


def test_cancel_ok_from_client_removes_the_timed_out_consumer(engine: MemoryBroker) -> None:
    client = mem_client(engine)
    mem_declare(client, "q", [b"x"])
    client.channel_open(2)
    mem_consume(client, 2, "q", "c", 100)
    engine.advance(0.1)
    assert client.names()[-1] == "2 Basic.Cancel c"
    client.send(2, commands.Basic.CancelOk(consumer_tag="c"))
    ok = client.call(1, make(commands.Queue.Declare, queue="q", durable=True, arguments=QUORUM))
    assert ok.consumer_count == 0


def test_ack_multiple_zero_of_a_timed_out_consumer_settles_only_what_came_before(
    engine: MemoryBroker,
) -> None:
    """basic.ack multiple=true, tag 0, settles the timed-out tag: the consumer leaves its
    timeout state and gets messages again, and those are new deliveries, not acked by it
    (RabbitMQ 4.3 takes the channel's unacked as they are when the ack arrives,
    rabbit_channel.erl collect_acks/5; deliveries that follow come after)."""
    client = mem_client(engine)
    mem_declare(client, "q", [b"first"])
    client.channel_open(2)
    mem_consume(client, 2, "q", "c", 100)
    assert [d.method.delivery_tag for d in deliveries(client, 2)] == [1]
    engine.advance(0.1)
    assert client.names() == ["2 Basic.Cancel c"]
    client.publish(1, "", "q", b"second")
    assert deliveries(client, 2) == []  # in the timeout state
    client.send(2, make(commands.Basic.Ack, delivery_tag=0, multiple=True))
    again = deliveries(client, 2)
    assert [(d.body, d.method.delivery_tag) for d in again] == [(b"first", 2), (b"second", 3)]
    queue = engine.vhost.queues["q"]
    assert (queue.ready_count, queue.unacked_count) == (0, 2)
    client.send(2, make(commands.Basic.Ack, delivery_tag=3, multiple=True))
    assert client.received() == [] and queue.unacked_count == 0
