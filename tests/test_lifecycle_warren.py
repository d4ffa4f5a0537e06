"""Warren's own message-lifecycle behaviour, beyond RabbitMQ 3.10.

* expiry on time whatever the order of the deadlines (a timer heap, not a head scan);
* the default delivery limit of 20, -1 for none, and consumer-timeout returns (RabbitMQ 4.x);
* delayed retry with backoff (x-delayed-retry-*: RabbitMQ 4.3's keys, LavinMQ's multiplier,
  Warren's schedule);
* queue statistics, validation texts that name the bad value, policy validation.

These tests run against a Warren started for this module, whatever WARREN_TEST_URL says;
those about when a timer fires (retry delays, expiry behind a longer TTL) run on the
in-memory engine with a manual clock (broker/testkit/memory.py), to the millisecond.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Delivery, RawClient
from lifecycle import (
    deaths,
    declare_refused,
    eventually,
    message_count,
    props,
    publish,
    queue_exists,
    typed_headers,
)
from pamqp import commands

from warren.broker.engine.policy import Policy, PolicyError
from warren.broker.engine.queue import Queue
from warren.broker.testkit import RunningBroker, run_broker
from warren.broker.testkit.memory import Delivery as MemoryDelivery
from warren.broker.testkit.memory import MemoryBroker, MemoryClient
from warren.protocol.methods import make

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker() as running:
        yield running


@pytest.fixture
def qname() -> str:
    return f"lw.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(warren: RunningBroker) -> Iterator[RawClient]:
    c = RawClient.connect((warren.host, warren.port))
    yield c
    c.close()


@pytest.fixture
def dlq(client: RawClient, qname: str) -> str:
    """A fanout dead-letter exchange, its queue consumed (no-ack) on channel 2."""
    exchange = f"{qname}.dlx"
    client.declare_exchange(1, exchange, "fanout")
    client.declare_queue(1, f"{qname}.dlq", durable=True)
    client.bind_queue(1, f"{qname}.dlq", exchange)
    client.channel_open(2)
    client.consume(2, f"{qname}.dlq", consumer_tag="dlq", no_ack=True)
    return exchange


def queue(warren: RunningBroker, name: str) -> Queue:
    return warren.call(lambda: warren.server.broker.vhosts["/"].queues[name])


def counts(warren: RunningBroker, name: str) -> dict[str, Any]:
    """The queue's live counts and cumulative statistics, read on the broker loop."""

    def read() -> dict[str, Any]:
        q = warren.server.broker.vhosts["/"].queues[name]
        s = q.stats
        return {
            "ready": q.ready_count,
            "unacked": q.unacked_count,
            "delayed": q.delayed_count,
            "published": s.published,
            "delivered": s.delivered,
            "acked": s.acked,
            "redelivered": s.redelivered,
            "expired": s.expired,
            "dead_lettered": dict(s.dead_lettered),
            "retried": s.retried,
        }

    return warren.call(read)


def delivery_count(d: Delivery) -> int | None:
    value = typed_headers(d).get("x-delivery-count")
    return None if value is None else int(value[1])


def nack(c: RawClient, channel: int, d: Delivery, requeue: bool = True) -> None:
    c.send_method(channel, commands.Basic.Nack(delivery_tag=d.method.delivery_tag, requeue=requeue))


def reject(c: RawClient, channel: int, d: Delivery) -> None:
    """A counted failure on a quorum queue in 4.3 (rabbit_channel.erl basic.reject)."""
    c.send_method(channel, commands.Basic.Reject(delivery_tag=d.method.delivery_tag))


def named(text: str, arg: str, value: str) -> None:
    assert text.startswith(f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '"), (
        f"the text does not name {arg}: {text}"
    )
    assert value in text, f"the text does not name the value {value!r}: {text}"


# -- expiry on time -----------------------------------------------------------------------------


def test_expiry_without_dead_letter_exchange_is_counted(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    client.declare_queue(1, qname, durable=True)
    client.confirm_select(1)
    for i in range(100):
        client.publish(1, b"x", routing_key=qname, properties=props(expiration=str(10 + i % 40)))
    client.wait_for_confirms(1)
    eventually(lambda: counts(warren, qname)["expired"] == 100, timeout=1.0, what="100 expired")
    c = counts(warren, qname)
    assert (c["ready"], c["dead_lettered"]) == (0, {})
    assert message_count(client, qname) == 0


def test_expired_message_in_a_priority_queue_is_never_delivered(
    client: RawClient, qname: str, dlq: str
) -> None:
    """RabbitMQ 3.10 hands this one out to basic.get: it sets no timer for a message that
    is not at the head when published, and its priority queue then skips the check."""
    client.declare_queue(
        1, qname, arguments={"x-max-priority": 9, "x-dead-letter-exchange": dlq}, durable=True
    )
    publish(client, qname, b"low", properties=props(priority=1))
    publish(client, qname, b"high-short-lived", properties=props(priority=9, expiration="20"))
    assert client.read_delivery(2).body == b"high-short-lived"  # on time, as dead letter
    assert client.drain(1, qname) == [b"low"]


def test_settled_messages_are_not_kept_for_their_ttl(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    """Messages that waited in the queue, then were delivered and acked, must not stay
    referenced by the expiry timers until their (here 1 h) deadline: memory is exact too."""
    client.declare_queue(1, qname, durable=True)
    client.confirm_select(1)
    for _ in range(2000):
        client.publish(1, b"x" * 1000, routing_key=qname, properties=props(expiration="3600000"))
    client.wait_for_confirms(1)
    client.channel_open(3)
    client.consume(3, qname, consumer_tag="c", no_ack=True)
    for _ in range(2000):
        client.read_delivery(3)

    def held() -> int:
        q = warren.server.broker.vhosts["/"].queues[qname]
        return len(q.deadlines.expiry)  # entries of the expiry heap, each holding its message

    assert counts(warren, qname)["ready"] == 0
    assert warren.call(held) < 100


# -- validation that names the value ------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "arg", "value"),
    [
        ({"x-overflow": "drop-tail"}, "x-overflow", "drop-tail"),
        ({"x-queue-type": "bogus"}, "x-queue-type", "bogus"),
        ({"x-delayed-retry-type": "sometimes"}, "x-delayed-retry-type", "sometimes"),
        ({"x-delayed-retry-schedule": "10s,soon"}, "x-delayed-retry-schedule", "soon"),
        ({"x-delayed-retry-schedule": 10}, "x-delayed-retry-schedule", "expected a string"),
        ({"x-delayed-retry-min": -5}, "x-delayed-retry-min", "-5"),
        ({"x-delayed-retry-max": "1s"}, "x-delayed-retry-max", "longstr"),
        ({"x-delayed-retry-multiplier": 0}, "x-delayed-retry-multiplier", "0"),
        ({"x-single-active-consumer": "yes"}, "x-single-active-consumer", "longstr"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_arguments_name_argument_and_value(
    client: RawClient, qname: str, arguments: dict[str, Any], arg: str, value: str
) -> None:
    code, text, class_id, method_id = declare_refused(client, qname, arguments, durable=True)
    assert (code, class_id, method_id) == (406, 50, 10)
    named(text, arg, value)
    assert not queue_exists(client, qname)  # nothing half-created


@pytest.mark.parametrize(
    ("value", "shown"), [("five", "longstr"), (True, "bool")], ids=["string", "bool"]
)
def test_delivery_limit_must_be_an_integer(
    client: RawClient, qname: str, value: Any, shown: str
) -> None:
    args = {**QUORUM, "x-delivery-limit": value}
    code, text, _, _ = declare_refused(client, qname, args, durable=True)
    assert code == 406
    named(text, "x-delivery-limit", shown)
    assert not queue_exists(client, qname)


@pytest.mark.parametrize(
    "definition",
    [
        {"message-ttl": -1},
        {"message-ttl": "1000"},
        {"expires": 0},
        {"max-length": -1},
        {"max-length-bytes": 1.5},
        {"overflow": "drop-tail"},
        {"dead-letter-exchange": 5},
        {"delivery-limit": -2},
        {"delayed-retry-type": "sometimes"},
        {"delayed-retry-schedule": "10s,soon"},
        {"delayed-retry-multiplier": 0},
    ],
    ids=lambda d: next(iter(d)),
)
def test_invalid_policy_values_refused(definition: dict[str, Any]) -> None:
    (key,) = definition
    with pytest.raises(PolicyError) as excinfo:
        Policy("/", "bad", ".*", definition, "queues", 0)
    assert key in str(excinfo.value)


# -- delivery limits (RabbitMQ 4.x) --------------------------------------------------------------


def fail_until_dead(c: RawClient, q: str, dlq_channel: int = 2) -> list[int | None]:
    """Consume ``q`` on channel 3 and reject every delivery until the copy reaches the DLQ."""
    c.channel_open(3)
    c.qos(3, 1)
    c.consume(3, q, consumer_tag="failing")
    counts_seen: list[int | None] = []
    while True:
        assert len(counts_seen) <= 30, f"not dead-lettered after {counts_seen}"
        ch, m = c.read_method()
        d = c.read_content(ch, m)
        if ch == dlq_channel:
            (entry,) = deaths(d)
            assert entry["reason"] == ("S", "delivery_limit")
            return counts_seen
        counts_seen.append(delivery_count(d))
        reject(c, 3, d)


def test_quorum_default_delivery_limit_is_20(client: RawClient, qname: str, dlq: str) -> None:
    client.declare_queue(
        1, qname, durable=True, arguments={**QUORUM, "x-dead-letter-exchange": dlq}
    )
    publish(client, qname, b"poison")
    seen = fail_until_dead(client, qname)
    assert seen == [None, *range(1, 21)]  # delivered 21 times: the 21st failure is past 20


def test_delivery_limit_minus_one_means_none(client: RawClient, qname: str) -> None:
    client.declare_queue(1, qname, durable=True, arguments={**QUORUM, "x-delivery-limit": -1})
    publish(client, qname, b"m")
    client.channel_open(3)
    client.consume(3, qname, consumer_tag="c")
    for _ in range(25):
        reject(client, 3, client.read_delivery(3))
    d = client.read_delivery(3)
    assert delivery_count(d) == 25
    client.ack(3, d.method.delivery_tag)


@pytest.mark.parametrize(
    ("argument", "policy", "limit"), [(3, -1, 3), (-1, 2, 2), (4, 2, 2)], ids=str
)
def test_delivery_limit_smaller_wins_and_minus_one_is_no_limit(
    warren: RunningBroker,
    client: RawClient,
    qname: str,
    dlq: str,
    argument: int,
    policy: int,
    limit: int,
) -> None:
    """RabbitMQ 4: min of argument and policy, where -1 (unlimited) loses to any limit."""
    vhost = warren.server.broker.vhosts["/"]
    warren.call(
        vhost.set_policy, Policy("/", qname, f"^{qname}$", {"delivery-limit": policy}, "queues", 0)
    )
    try:
        client.declare_queue(
            1,
            qname,
            durable=True,
            arguments={**QUORUM, "x-delivery-limit": argument, "x-dead-letter-exchange": dlq},
        )
        publish(client, qname, b"poison")
        assert fail_until_dead(client, qname) == [None, *range(1, limit + 1)]
    finally:
        warren.call(vhost.clear_policy, qname)


def test_consumer_timeout_return_is_not_a_failed_delivery(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    client.declare_queue(1, qname, durable=True, arguments=QUORUM)
    publish(client, qname, b"slow")
    client.channel_open(3)
    client.consume(3, qname, consumer_tag="slow", arguments={"x-consumer-timeout": 50})
    first = client.read_delivery(3)
    assert delivery_count(first) is None
    cancel = client.expect_method(commands.Basic.Cancel, 3)
    assert cancel.consumer_tag == "slow"
    again = client.get(1, qname)
    assert again is not None
    assert again.method.redelivered
    assert delivery_count(again) is None  # not counted: the consumer timed out, it did not fail
    reject(client, 1, again)
    third = client.get(1, qname, no_ack=True)
    assert third is not None and delivery_count(third) == 1


# -- delayed retry ------------------------------------------------------------------------------


def retry_queue(c: RawClient, name: str, quorum: bool = False, **arguments: Any) -> None:
    args = {**(QUORUM if quorum else {}), **arguments}
    c.declare_queue(1, name, durable=True, arguments=args)


def test_retry_waits_invisibly_then_joins_the_tail(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    retry_queue(client, qname, **{"x-delayed-retry-type": "all", "x-delayed-retry-min": 150})
    publish(client, qname, b"first")
    got = client.get(1, qname)
    assert got is not None
    nack(client, 1, got)
    assert client.get(1, qname) is None  # invisible while it waits
    assert message_count(client, qname) == 0  # not in messages_ready ...
    c = counts(warren, qname)
    assert (c["ready"], c["delayed"], c["retried"]) == (0, 1, 1)  # ... but counted as delayed
    publish(client, qname, b"second")
    client.channel_open(3)
    client.consume(3, qname, consumer_tag="c", no_ack=True)
    second = client.read_delivery(3)
    back = client.read_delivery(3)
    assert second.body == b"second"  # published during the delay, delivered first
    assert (back.body, back.method.redelivered, delivery_count(back)) == (b"first", True, 1)
    assert counts(warren, qname)["delayed"] == 0


@pytest.mark.parametrize("kind", ["failed", "returned"])
def test_retry_type_failed_or_returned(
    warren: RunningBroker, client: RawClient, qname: str, kind: str
) -> None:
    """A nack is a failed delivery; a consumer timeout return is not."""
    retry_queue(
        client,
        qname,
        quorum=True,
        **{"x-delayed-retry-type": kind, "x-delayed-retry-min": 200},
    )
    publish(client, qname, b"m")
    # 1. a nack
    got = client.get(1, qname)
    assert got is not None
    nack(client, 1, got)
    delayed_after_nack = counts(warren, qname)["delayed"]
    if delayed_after_nack:
        eventually(lambda: counts(warren, qname)["ready"] == 1, timeout=1.0)
    # 2. a consumer timeout
    client.channel_open(3)
    client.consume(3, qname, consumer_tag="slow", arguments={"x-consumer-timeout": 30})
    client.read_delivery(3)
    client.expect_method(commands.Basic.Cancel, 3)
    delayed_after_timeout = counts(warren, qname)["delayed"]
    assert (delayed_after_nack, delayed_after_timeout) == ((1, 0) if kind == "failed" else (0, 1))


def test_closed_channel_is_a_failed_delivery_for_retry(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    retry_queue(client, qname, **{"x-delayed-retry-type": "failed", "x-delayed-retry-min": 500})
    publish(client, qname, b"m")
    client.channel_open(3)
    client.consume(3, qname, consumer_tag="c")
    client.read_delivery(3)
    client.channel_close(3)
    assert counts(warren, qname)["delayed"] == 1


def test_delayed_messages_count_towards_max_length_reject_publish(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    retry_queue(
        client,
        qname,
        **{
            "x-delayed-retry-type": "all",
            "x-delayed-retry-min": 5000,
            "x-max-length": 1,
            "x-overflow": "reject-publish",
        },
    )
    publish(client, qname, b"m")
    got = client.get(1, qname)
    assert got is not None
    nack(client, 1, got)
    assert publish(client, qname, b"refused") == {2: False}  # the delayed one fills the queue
    c = counts(warren, qname)
    assert (c["ready"], c["delayed"]) == (0, 1)
    client.delete_queue(1, qname)


def test_delayed_messages_count_towards_max_length_drop_head(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    retry_queue(
        client,
        qname,
        **{"x-delayed-retry-type": "all", "x-delayed-retry-min": 5000, "x-max-length": 2},
    )
    publish(client, qname, b"m")
    got = client.get(1, qname)
    assert got is not None
    nack(client, 1, got)
    publish(client, qname, b"a", b"b")  # 1 delayed + 2 ready > 2: the oldest ready one goes
    c = counts(warren, qname)
    assert (c["ready"], c["delayed"]) == (1, 1), c
    assert client.drain(1, qname) == [b"b"]
    client.delete_queue(1, qname)


def test_retry_with_delivery_limit_dead_letters_past_the_limit(
    client: RawClient, qname: str, dlq: str
) -> None:
    retry_queue(
        client,
        qname,
        quorum=True,
        **{
            "x-delayed-retry-type": "all",
            "x-delayed-retry-min": 20,
            "x-delivery-limit": 2,
            "x-dead-letter-exchange": dlq,
        },
    )
    publish(client, qname, b"poison")
    assert fail_until_dead(client, qname) == [None, 1, 2]


# -- statistics ---------------------------------------------------------------------------------


def test_queue_statistics(warren: RunningBroker, client: RawClient, qname: str, dlq: str) -> None:
    retry_queue(
        client,
        qname,
        **{
            "x-dead-letter-exchange": dlq,
            "x-max-length": 4,
            "x-delayed-retry-type": "failed",
            "x-delayed-retry-min": 20,
        },
    )
    publish(client, qname, b"expires", properties=props(expiration="10"))
    assert client.read_delivery(2).body == b"expires"
    publish(client, qname, b"rejected", b"retried", b"kept", b"x", b"y", b"z")  # 2 over: maxlen
    assert [client.read_delivery(2).body for _ in range(2)] == [b"rejected", b"retried"]
    first = client.get(1, qname)
    assert first is not None and first.body == b"kept"
    client.send_method(
        1, commands.Basic.Reject(delivery_tag=first.method.delivery_tag, requeue=False)
    )
    assert client.read_delivery(2).body == b"kept"
    second = client.get(1, qname)
    assert second is not None and second.body == b"x"
    nack(client, 1, second)  # retried after 20 ms, at the tail
    third = client.get(1, qname)
    assert third is not None and third.body == b"y"
    c = counts(warren, qname)
    assert (c["ready"], c["unacked"], c["delayed"]) == (1, 1, 1)
    eventually(lambda: counts(warren, qname)["ready"] == 2, timeout=1.0)
    client.ack(1, third.method.delivery_tag)
    c = counts(warren, qname)
    assert c == {
        "ready": 2,
        "unacked": 0,
        "delayed": 0,
        "published": 7,
        "delivered": 3,
        "acked": 1,
        "redelivered": c["redelivered"],  # whether a retry counts as one is not pinned here
        "expired": 1,
        "dead_lettered": {"expired": 1, "maxlen": 2, "rejected": 1},
        "retried": 1,
    }


def test_requeue_counts_as_redelivered(
    warren: RunningBroker, client: RawClient, qname: str
) -> None:
    client.declare_queue(1, qname, durable=True)
    publish(client, qname, b"a", b"b")
    for _ in range(2):
        got = client.get(1, qname)
        assert got is not None
        nack(client, 1, got)
    assert counts(warren, qname)["redelivered"] == 2


# -- dead-letter cycles -------------------------------------------------------------------------


def test_rejection_outside_the_cycle_does_not_make_it_endless(
    client: RawClient, qname: str
) -> None:
    """Rejected from an entry queue into a two-queue expiry loop: one round, then dropped.

    Only a rejection within the cycle (the deaths since the message last left the
    queue it would go back to) lets it go round again. RabbitMQ 3.10 loops here
    too, but only because it reverses the older x-death entries at each death
    (fixed in 3.13), so this test is Warren's.
    """
    watcher = f"{qname}.watch"
    ex_in, ex_a, ex_b = f"{qname}.in", f"{qname}.a", f"{qname}.b"
    for ex in (ex_in, ex_a, ex_b):
        client.declare_exchange(1, ex, "fanout")
    entry, q1, q2 = f"{qname}.entry", f"{qname}.1", f"{qname}.2"
    client.declare_queue(1, watcher, durable=True)
    client.declare_queue(1, entry, arguments={"x-dead-letter-exchange": ex_in}, durable=True)
    for q, ex in ((q1, ex_a), (q2, ex_b)):
        client.declare_queue(
            1, q, arguments={"x-message-ttl": 20, "x-dead-letter-exchange": ex}, durable=True
        )
    for ex, q in ((ex_in, q1), (ex_a, q2), (ex_b, q1), (ex_a, watcher), (ex_b, watcher)):
        client.bind_queue(1, q, ex)
    client.channel_open(2)
    client.consume(2, watcher, consumer_tag="watch", no_ack=True)
    try:
        publish(client, entry, b"m")
        got = client.get(1, entry)
        assert got is not None
        client.send_method(
            1, commands.Basic.Reject(delivery_tag=got.method.delivery_tag, requeue=False)
        )
        first, second = client.read_delivery(2), client.read_delivery(2)
        assert [e["queue"][1] for e in deaths(first)] == [q1, entry]
        assert [e["queue"][1] for e in deaths(second)] == [q2, q1, entry]
        client.assert_silent(0.25)  # q1's copy was dropped: no third death
        assert message_count(client, q1) == message_count(client, q2) == 0
    finally:  # stop a loop, if there is one, for the tests that follow
        with RawClient.connect(client.addr) as other:
            for q in (q1, q2):
                other.delete_queue(1, q)


# -- timers on the in-memory engine: broker time moves only with advance() ----------------------


@pytest.fixture
def engine() -> Iterator[MemoryBroker]:
    e = MemoryBroker()
    yield e
    e.close()


def mem_queue(engine: MemoryBroker, name: str, **arguments: Any) -> MemoryClient:
    """A client with channel 1 open and ``name`` declared; a dead-letter exchange
    ``dlx`` (fanout) and its queue ``dlq``, consumed no-ack on channel 2."""
    client = engine.connect()
    client.channel_open(1)
    client.call(1, make(commands.Exchange.Declare, exchange="dlx", exchange_type="fanout"))
    for queue, args in (("dlq", {}), (name, arguments)):
        method = make(commands.Queue.Declare, queue=queue, durable=True, arguments=args)
        assert isinstance(client.call(1, method), commands.Queue.DeclareOk)
    client.call(1, make(commands.Queue.Bind, queue="dlq", exchange="dlx", routing_key=""))
    client.channel_open(2)
    consume = make(commands.Basic.Consume, queue="dlq", consumer_tag="dlq", no_ack=True)
    assert isinstance(client.call(2, consume), commands.Basic.ConsumeOk)
    return client


def mem_deliveries(client: MemoryClient, channel: int) -> list[MemoryDelivery]:
    return [d for d in client.received() if isinstance(d, MemoryDelivery) and d.channel == channel]


def mem_delivery_count(d: MemoryDelivery) -> int | None:
    value = d.props.get("headers", {}).get("x-delivery-count")
    return None if value is None else int(value)


def retry_delays(
    engine: MemoryBroker, client: MemoryClient, name: str, attempts: int
) -> tuple[list[int], list[MemoryDelivery]]:
    """Consume on channel 3 and nack each delivery; the milliseconds of broker time from
    each nack to the redelivery, found by advancing one millisecond at a time."""
    client.channel_open(3)
    consume = make(commands.Basic.Consume, queue=name, consumer_tag="retrying")
    assert isinstance(client.call(3, consume), commands.Basic.ConsumeOk)
    (d,) = mem_deliveries(client, 3)
    delays, deliveries = [], [d]
    for _ in range(attempts):
        client.send(3, make(commands.Basic.Nack, delivery_tag=d.method.delivery_tag, requeue=True))
        waited = 0
        while not (got := mem_deliveries(client, 3)):
            assert waited < 60_000, "no redelivery within a minute"
            engine.advance(0.001)
            waited += 1
        (d,) = got
        delays.append(waited)
        deliveries.append(d)
    return delays, deliveries


def test_short_ttl_behind_a_long_one_expires_on_time_and_leaves_the_count(
    engine: MemoryBroker,
) -> None:
    """RabbitMQ only drops expired messages at the head; Warren expires them where they are."""
    client = mem_queue(engine, "q", **{"x-dead-letter-exchange": "dlx"})
    client.publish(1, "", "q", b"long", commands.Basic.Properties(expiration="60000"))
    client.publish(1, "", "q", b"short", commands.Basic.Properties(expiration="30"))
    engine.advance(0.029)
    assert mem_deliveries(client, 2) == []
    engine.advance(0.001)
    assert [d.body for d in mem_deliveries(client, 2)] == [b"short"]
    q = engine.vhost.queues["q"]
    assert (q.ready_count, q.stats.expired) == (1, 1)
    client.send(1, make(commands.Basic.Get, queue="q", no_ack=True))
    assert [d.body for d in mem_deliveries(client, 1)] == [b"long"]


def test_linear_backoff_capped_by_max(engine: MemoryBroker) -> None:
    args = {"x-delayed-retry-type": "all", "x-delayed-retry-min": 30, "x-delayed-retry-max": 70}
    client = mem_queue(engine, "q", **args)
    client.publish(1, "", "q", b"m")
    delays, deliveries = retry_delays(engine, client, "q", 4)
    assert delays == [30, 60, 70, 70]  # min x attempt, capped
    assert [mem_delivery_count(d) for d in deliveries] == [None, 1, 2, 3, 4]


def test_exponential_backoff(engine: MemoryBroker) -> None:
    args = {
        "x-delayed-retry-type": "all",
        "x-delayed-retry-min": 20,
        "x-delayed-retry-multiplier": 2,
        "x-delayed-retry-max": 100,
    }
    client = mem_queue(engine, "q", **args)
    client.publish(1, "", "q", b"m")
    assert retry_delays(engine, client, "q", 4)[0] == [20, 40, 80, 100]


def test_multiplier_one_is_constant(engine: MemoryBroker) -> None:
    args = {
        "x-delayed-retry-type": "all",
        "x-delayed-retry-min": 40,
        "x-delayed-retry-multiplier": 1,
    }
    client = mem_queue(engine, "q", **args)
    client.publish(1, "", "q", b"m")
    assert retry_delays(engine, client, "q", 3)[0] == [40, 40, 40]


def test_schedule_takes_precedence_and_its_last_delay_repeats(engine: MemoryBroker) -> None:
    args = {
        "x-delayed-retry-type": "all",
        "x-delayed-retry-min": 5000,
        "x-delayed-retry-schedule": "20ms,60, 40ms",
    }
    client = mem_queue(engine, "q", **args)
    client.publish(1, "", "q", b"m")
    assert retry_delays(engine, client, "q", 4)[0] == [20, 60, 40, 40]


def test_rocketmq_schedule_starts_at_ten_seconds(engine: MemoryBroker) -> None:
    args = {"x-delayed-retry-type": "all", "x-delayed-retry-schedule": "rocketmq"}
    client = mem_queue(engine, "q", **args)
    client.publish(1, "", "q", b"m")
    assert retry_delays(engine, client, "q", 2)[0] == [10_000, 30_000]


def test_schedule_from_a_policy(engine: MemoryBroker) -> None:
    definition = {"delayed-retry-type": "all", "delayed-retry-schedule": "30,50"}
    engine.vhost.set_policy(Policy("/", "p", "^q$", definition, "queues", 0))
    client = mem_queue(engine, "q")
    client.publish(1, "", "q", b"m")
    assert retry_delays(engine, client, "q", 3)[0] == [30, 50, 50]


def test_retry_disabled_by_default(engine: MemoryBroker) -> None:
    client = mem_queue(engine, "q", **{"x-delayed-retry-min": 500})  # no type: disabled
    client.publish(1, "", "q", b"m")
    delays, deliveries = retry_delays(engine, client, "q", 1)
    assert delays == [0]  # back at once
    assert mem_delivery_count(deliveries[1]) is None  # a classic queue without retry counts nothing


def test_message_expiring_while_delayed_is_dead_lettered_on_time(engine: MemoryBroker) -> None:
    args = {
        "x-delayed-retry-type": "all",
        "x-delayed-retry-min": 1000,
        "x-dead-letter-exchange": "dlx",
    }
    client = mem_queue(engine, "q", **args)
    client.publish(1, "", "q", b"m", commands.Basic.Properties(expiration="100"))
    client.send(1, make(commands.Basic.Get, queue="q"))
    (got,) = mem_deliveries(client, 1)
    client.send(1, make(commands.Basic.Nack, delivery_tag=got.method.delivery_tag, requeue=True))
    engine.advance(0.099)
    assert mem_deliveries(client, 2) == []
    engine.advance(0.001)  # at its TTL, not when its 1 s retry delay ends
    (dead,) = mem_deliveries(client, 2)
    (entry,) = dead.props["headers"]["x-death"]
    assert entry["reason"] == "expired"
    q = engine.vhost.queues["q"]
    assert (q.ready_count, q.delayed_count, q.stats.expired) == (0, 0, 1)
    engine.advance(1)  # the retry's own timer finds nothing
    assert client.received() == []


def test_every_message_expires_at_its_deadline_whatever_the_order(engine: MemoryBroker) -> None:
    """300 messages with random TTLs (20-300 ms) published in random order: each one is
    dead-lettered at its deadline to the millisecond, earliest first (a timer per
    deadline, not a scan from the head)."""
    client = mem_queue(engine, "q", **{"x-dead-letter-exchange": "dlx"})
    rng = random.Random(4)
    ttls = [rng.randint(20, 300) for _ in range(300)]
    for i, ttl in enumerate(ttls):
        client.publish(1, "", "q", str(i).encode(), commands.Basic.Properties(expiration=str(ttl)))
    dead: list[tuple[int, int]] = []  # (ms, message number) in the order they came
    for ms in range(1, 301):
        engine.advance(0.001)
        dead += [(ms, int(d.body)) for d in mem_deliveries(client, 2)]
    assert dead == sorted((ttl, i) for i, ttl in enumerate(ttls))
    q = engine.vhost.queues["q"]
    assert (q.ready_count, q.stats.expired) == (0, 300)
    assert q.stats.dead_lettered == {"expired": 300}
