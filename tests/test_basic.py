"""basic.*: qos, consume/cancel, dispatch, get, acknowledgements, recover, returns,
content round-trips, flow."""

from __future__ import annotations

import datetime
import decimal
import os
import struct
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from amqp_raw import (
    Delivery,
    Janitor,
    RawClient,
    build,
    fv,
    raw_table,
    shortstr,
)
from pamqp import base, commands


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


@pytest.fixture(scope="module")
def global_qos_addr(amqp_addr: tuple[str, int]) -> Iterator[tuple[str, int]]:
    """A broker with RabbitMQ 3.x's global qos (deprecated_features.permit.global_qos = true):
    RabbitMQ 4.3 applies global=true per consumer (tests/test_deprecated_features.py)."""
    if os.environ.get("WARREN_TEST_URL"):  # RabbitMQ 3.10 has it anyway
        yield amqp_addr
        return
    from warren.broker.testkit import run_broker

    with run_broker(deprecated_features_permit=(("global_qos", True),)) as broker:
        yield broker.host, broker.port


@pytest.fixture
def client3(global_qos_addr: tuple[str, int]) -> Iterator[RawClient]:
    c = RawClient.connect(global_qos_addr)
    yield c
    c.close()


@pytest.fixture
def janitor3(global_qos_addr: tuple[str, int]) -> Iterator[Janitor]:
    j = Janitor(global_qos_addr)
    yield j
    j.clean()


@pytest.fixture
def queue(client: RawClient, janitor: Janitor, name: str) -> str:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    return q


def unknown_tag(tag: int) -> str:
    return f"PRECONDITION_FAILED - unknown delivery tag {tag}"


def fill(c: RawClient, queue: str, n: int, channel: int = 1, prefix: str = "") -> None:
    """Publish n messages (bodies prefix+"0".."n-1") and wait until they are queued."""
    if channel not in c.publish_seq:
        c.confirm_select(channel)
    for i in range(n):
        c.publish(channel, f"{prefix}{i}".encode(), routing_key=queue)
    c.wait_for_confirms(channel)


def tags_of(frames: list[Delivery]) -> Counter[str]:
    return Counter(d.method.consumer_tag for d in frames)


def deliveries_within(c: RawClient, seconds: float = 0.3) -> list[Delivery]:
    """Every complete delivery that arrives within ``seconds``."""
    out: list[Delivery] = []
    frames = c.frames_within(seconds)
    while frames:
        f = frames.pop(0)
        m = f.method()
        assert isinstance(m, commands.Basic.Deliver), f
        header = frames.pop(0)
        size = struct.unpack(">Q", header.payload[4:12])[0]
        body = b""
        while len(body) < size:
            body += frames.pop(0).payload
        out.append(Delivery(f.channel, m, header.payload, body))
    return out


# -- qos --------------------------------------------------------------------------


def test_qos_per_consumer(client: RawClient, janitor: Janitor, name: str) -> None:
    q1, q2 = janitor.queue(f"{name}.1"), janitor.queue(f"{name}.2")
    for q in (q1, q2):
        client.declare_queue(1, q, durable=True)
    client.channel_open(2)
    fill(client, q1, 5, channel=2)
    fill(client, q2, 5, channel=2)
    client.qos(1, 2)  # global=false: a limit for each new consumer
    client.consume(1, q1, "A")
    client.consume(1, q2, "B")
    got = deliveries_within(client)
    assert tags_of(got) == {"A": 2, "B": 2}
    # acking one frees one slot of that consumer only
    first_a = next(d for d in got if d.method.consumer_tag == "A")
    client.ack(1, first_a.method.delivery_tag)
    assert tags_of(deliveries_within(client)) == {"A": 1}


def test_qos_global_is_shared_by_the_channel(
    client3: RawClient, janitor3: Janitor, name: str
) -> None:
    client, janitor = client3, janitor3
    q1, q2 = janitor.queue(f"{name}.1"), janitor.queue(f"{name}.2")
    for q in (q1, q2):
        client.declare_queue(1, q, durable=True)
    client.channel_open(2)
    client.qos(1, 3, global_=True)
    client.consume(1, q1, "A")
    client.consume(1, q2, "B")
    fill(client, q1, 2, channel=2)
    fill(client, q2, 5, channel=2)
    got = deliveries_within(client)
    assert len(got) == 3
    assert tags_of(got)["A"] == 2
    client.ack(1, max(d.method.delivery_tag for d in got), multiple=True)
    assert tags_of(deliveries_within(client)) == {"B": 3}


def test_qos_change_does_not_affect_existing_consumers(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q1, q2 = janitor.queue(f"{name}.1"), janitor.queue(f"{name}.2")
    for q in (q1, q2):
        client.declare_queue(1, q, durable=True)
    client.channel_open(2)
    fill(client, q1, 8, channel=2)
    fill(client, q2, 8, channel=2)
    client.qos(1, 1)
    client.consume(1, q1, "A")
    client.qos(1, 5)
    client.consume(1, q2, "B")
    client.qos(1, 0)  # unlimited for consumers created from now on
    assert tags_of(deliveries_within(client)) == {"A": 1, "B": 5}


def test_qos_per_consumer_and_global_combined(
    client3: RawClient, janitor3: Janitor, name: str
) -> None:
    client, janitor = client3, janitor3
    q1, q2 = janitor.queue(f"{name}.1"), janitor.queue(f"{name}.2")
    for q in (q1, q2):
        client.declare_queue(1, q, durable=True)
    client.channel_open(2)
    fill(client, q1, 5, channel=2)
    fill(client, q2, 5, channel=2)
    client.qos(1, 2)
    client.qos(1, 3, global_=True)
    client.consume(1, q1, "A")
    client.consume(1, q2, "B")
    assert tags_of(deliveries_within(client)) == {"A": 2, "B": 1}


def test_raising_global_qos_applies_to_existing_consumers(
    client3: RawClient, janitor3: Janitor, name: str
) -> None:
    client, queue = client3, janitor3.queue(name)
    client.declare_queue(1, queue, durable=True)
    client.channel_open(2)
    fill(client, queue, 8, channel=2)
    client.qos(1, 3, global_=True)
    client.consume(1, queue, "A")
    assert len(deliveries_within(client)) == 3
    client.qos(1, 5, global_=True)
    assert len(deliveries_within(client)) == 2


def test_qos_prefetch_size_not_implemented(client: RawClient) -> None:
    client.send_method(1, commands.Basic.Qos(prefetch_size=1000, prefetch_count=0))
    assert client.expect_close() == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (1000)", 60, 10)


# -- consume / cancel --------------------------------------------------------------


def test_consume_with_server_generated_tag(client: RawClient, queue: str) -> None:
    tag = client.consume(1, queue)
    assert tag.startswith("amq.ctag-")
    assert len(tag) > len("amq.ctag-")
    fill(client, queue, 1)
    assert client.read_delivery(1).method.consumer_tag == tag
    other = client.consume(1, queue)
    assert other.startswith("amq.ctag-")
    assert other != tag


def test_consume_ok_echoes_client_tag(client: RawClient, queue: str) -> None:
    assert client.consume(1, queue, "my-tag") == "my-tag"


def test_duplicate_consumer_tag_is_a_connection_error(client: RawClient, queue: str) -> None:
    client.consume(1, queue, "dup")
    client.send_method(1, build(commands.Basic.Consume, queue=queue, consumer_tag="dup"))
    assert client.expect_close() == (
        530,
        "NOT_ALLOWED - attempt to reuse consumer tag 'dup'",
        60,
        20,
    )


def test_same_consumer_tag_on_different_channels(client: RawClient, queue: str) -> None:
    client.channel_open(2)
    client.consume(1, queue, "same")
    assert client.consume(2, queue, "same") == "same"


def test_exclusive_consumer(amqp_addr: tuple[str, int], client: RawClient, queue: str) -> None:
    text = f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use"
    client.consume(1, queue, "owner", exclusive=True)
    with RawClient.connect(amqp_addr) as other:
        other.send_method(1, build(commands.Basic.Consume, queue=queue))
        assert other.expect_channel_close(1) == (403, text, 60, 20)
    # even on the same channel
    client.send_method(1, build(commands.Basic.Consume, queue=queue, consumer_tag="second"))
    assert client.expect_channel_close(1) == (403, text, 60, 20)


def test_exclusive_consume_when_queue_has_consumers(client: RawClient, queue: str) -> None:
    client.channel_open(2)
    client.consume(2, queue, "plain")
    client.send_method(1, build(commands.Basic.Consume, queue=queue, exclusive=True))
    assert client.expect_channel_close(1) == (
        403,
        f"ACCESS_REFUSED - queue '{queue}' in vhost '/' in exclusive use",
        60,
        20,
    )


def test_consume_missing_queue(client: RawClient, name: str) -> None:
    client.send_method(1, build(commands.Basic.Consume, queue=name))
    assert client.expect_channel_close(1) == (
        404,
        f"NOT_FOUND - no queue '{name}' in vhost '/'",
        60,
        20,
    )


def test_no_ack_consumer(client: RawClient, queue: str) -> None:
    fill(client, queue, 3)
    client.consume(1, queue, "auto", no_ack=True)
    got = client.deliveries(1, 3)
    assert [d.body for d in got] == [b"0", b"1", b"2"]
    assert [d.method.delivery_tag for d in got] == [1, 2, 3]
    client.call(1, build(commands.Basic.Cancel, consumer_tag="auto"), commands.Basic.CancelOk)
    assert client.declare_queue(1, queue, passive=True).message_count == 0
    client.ack(1, 1)  # nothing to acknowledge
    assert client.expect_channel_close(1) == (406, unknown_tag(1), 60, 80)


def test_nowait_consume_and_cancel(client: RawClient, queue: str) -> None:
    client.send_method(
        1, build(commands.Basic.Consume, queue=queue, consumer_tag="nw", nowait=True)
    )
    fill(client, queue, 1)  # confirms first: no consume-ok must come before them
    d = client.read_delivery(1)
    assert (d.method.consumer_tag, d.body) == ("nw", b"0")
    client.send_method(1, build(commands.Basic.Cancel, consumer_tag="nw", nowait=True))
    client.publish(1, b"after cancel", routing_key=queue)
    frames = client.frames_within(0.3)
    assert [type(f.method()) for f in frames] == [commands.Basic.Ack], frames
    assert client.get(1, queue, no_ack=True) is not None


def test_round_robin_dispatch(client: RawClient, queue: str) -> None:
    client.channel_open(2)
    client.consume(1, queue, "A")
    client.consume(2, queue, "B")
    client.consume(1, queue, "C")
    client.channel_open(3)
    fill(client, queue, 9, channel=3)
    got = client.deliveries(None, 9)
    by_tag: dict[str, list[bytes]] = {}
    for d in got:
        by_tag.setdefault(d.method.consumer_tag, []).append(d.body)
    assert by_tag == {
        "A": [b"0", b"3", b"6"],
        "B": [b"1", b"4", b"7"],
        "C": [b"2", b"5", b"8"],
    }


def test_cancel_keeps_in_flight_messages_ackable(client: RawClient, queue: str) -> None:
    fill(client, queue, 3, channel=1)
    client.consume(1, queue, "c")
    got = client.deliveries(1, 3)
    ok = client.call(1, build(commands.Basic.Cancel, consumer_tag="c"), commands.Basic.CancelOk)
    assert ok.consumer_tag == "c"
    # not requeued by the cancel
    assert client.get(1, queue) is None
    client.ack(1, got[0].method.delivery_tag)
    client.send_method(
        1, commands.Basic.Nack(delivery_tag=got[1].method.delivery_tag, requeue=True)
    )
    client.send_method(
        1, commands.Basic.Reject(delivery_tag=got[2].method.delivery_tag, requeue=False)
    )
    back = client.get(1, queue, no_ack=True)
    assert back is not None
    assert (back.body, back.method.redelivered, back.method.delivery_tag) == (b"1", True, 4)
    assert client.get(1, queue) is None
    client.assert_silent(0.2)  # the cancelled consumer gets nothing more


def test_cancel_unknown_tag_is_ok(client: RawClient) -> None:
    ok = client.call(1, build(commands.Basic.Cancel, consumer_tag="nope"), commands.Basic.CancelOk)
    assert ok.consumer_tag == "nope"


def test_messages_published_before_consume_are_delivered_in_order(
    client: RawClient, queue: str
) -> None:
    fill(client, queue, 20)
    client.consume(1, queue, "late", no_ack=True)
    assert [d.body for d in client.deliveries(1, 20)] == [str(i).encode() for i in range(20)]


# -- publish / return ---------------------------------------------------------------


@pytest.mark.parametrize("exchange", ["", "amq.direct", "amq.topic"])
def test_mandatory_unroutable_is_returned(client: RawClient, name: str, exchange: str) -> None:
    props = commands.Basic.Properties(content_type="text/plain", message_id="m1")
    client.publish(
        1, b"nobody", exchange=exchange, routing_key=name, mandatory=True, properties=props
    )
    r = client.read_return(1)
    assert (r.method.reply_code, r.method.reply_text) == (312, "NO_ROUTE")
    assert (r.method.exchange, r.method.routing_key) == (exchange, name)
    assert r.body == b"nobody"
    assert r.properties == props


def test_non_mandatory_unroutable_is_dropped(client: RawClient, name: str) -> None:
    client.publish(1, b"nobody", exchange="amq.direct", routing_key=name)
    client.assert_silent(0.25)
    client.channel_open(2)  # the connection is still fine


def test_publish_with_foreign_user_id_refused(client: RawClient, queue: str) -> None:
    client.publish(
        1, b"x", routing_key=queue, properties=commands.Basic.Properties(user_id="mallory")
    )
    assert client.expect_channel_close(1) == (
        406,
        "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user "
        "was 'guest'",
        60,
        40,
    )


# -- get -------------------------------------------------------------------------


def test_get_ok_and_get_empty(client: RawClient, queue: str) -> None:
    assert client.get(1, queue) is None
    fill(client, queue, 3)
    got = [client.get(1, queue) for _ in range(3)]
    assert [(d.body, d.method.message_count, d.method.delivery_tag) for d in got if d] == [
        (b"0", 2, 1),
        (b"1", 1, 2),
        (b"2", 0, 3),
    ]
    for d in got:
        assert d is not None
        assert (d.method.exchange, d.method.routing_key, d.method.redelivered) == ("", queue, False)
    client.send_method(1, build(commands.Basic.Get, queue=queue))
    empty = client.expect_method(commands.Basic.GetEmpty, 1)
    assert empty.cluster_id == ""


def test_get_missing_queue(client: RawClient, name: str) -> None:
    client.send_method(1, build(commands.Basic.Get, queue=name))
    assert client.expect_channel_close(1) == (
        404,
        f"NOT_FOUND - no queue '{name}' in vhost '/'",
        60,
        70,
    )


def test_delivery_tags_are_per_channel_and_shared_by_get_and_deliver(
    client: RawClient, queue: str
) -> None:
    fill(client, queue, 4)
    client.channel_open(2)
    g = client.get(2, queue)
    assert g is not None and g.method.delivery_tag == 1
    client.consume(2, queue, "c")
    assert [d.method.delivery_tag for d in client.deliveries(2, 3)] == [2, 3, 4]
    client.channel_close(2)  # all four go back
    client.channel_open(3)
    d = client.get(3, queue)
    assert d is not None
    assert (d.method.delivery_tag, d.method.redelivered) == (1, True)


# -- acknowledgements ----------------------------------------------------------------


def test_ack_single_and_multiple(client: RawClient, queue: str) -> None:
    fill(client, queue, 5)
    client.consume(1, queue, "c")
    got = client.deliveries(1, 5)
    client.ack(1, got[1].method.delivery_tag)
    client.ack(1, got[3].method.delivery_tag, multiple=True)  # 1, 3 and 4
    client.call(1, build(commands.Basic.Cancel, consumer_tag="c"), commands.Basic.CancelOk)
    client.channel_close(1)  # requeues what is still unacked: only "4"
    client.channel_open(1)
    assert client.drain(1, queue) == [b"4"]


def test_ack_zero_multiple_acks_everything(client: RawClient, queue: str) -> None:
    fill(client, queue, 3)
    client.consume(1, queue, "c")
    client.deliveries(1, 3)
    client.ack(1, 0, multiple=True)
    client.channel_close(1)
    client.channel_open(1)
    assert client.get(1, queue) is None


def test_one_multiple_ack_across_queues_frees_each_consumer(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    """Each consumer (prefetch 1) holds one delivery from its own queue; one multiple ack
    settles them all, and every consumer gets its queue's next message, once."""
    queues = [janitor.queue(f"{name}-{i}") for i in range(40)]
    for q in queues:
        client.declare_queue(1, q, durable=True)
        fill(client, q, 2, prefix=f"{q}:")
    client.qos(1, 1)
    for i, q in enumerate(queues):
        client.consume(1, q, f"c{i}")
    first = client.deliveries(1, len(queues))
    assert sorted(d.body for d in first) == sorted(f"{q}:0".encode() for q in queues)
    client.ack(1, max(d.method.delivery_tag for d in first), multiple=True)
    second = client.deliveries(1, len(queues))
    assert sorted(d.body for d in second) == sorted(f"{q}:1".encode() for q in queues)
    assert {d.method.consumer_tag for d in second} == {f"c{i}" for i in range(len(queues))}


@pytest.mark.parametrize(
    ("make", "method_id"),
    [
        (lambda tag: commands.Basic.Ack(delivery_tag=tag), 80),
        (lambda tag: commands.Basic.Ack(delivery_tag=tag, multiple=True), 80),
        (lambda tag: commands.Basic.Reject(delivery_tag=tag), 90),
        (lambda tag: commands.Basic.Nack(delivery_tag=tag), 120),
        (lambda tag: commands.Basic.Nack(delivery_tag=tag, multiple=True), 120),
    ],
    ids=["ack", "ack-multiple", "reject", "nack", "nack-multiple"],
)
def test_unknown_delivery_tag(
    client: RawClient, queue: str, make: Callable[[int], base.Frame], method_id: int
) -> None:
    fill(client, queue, 2)
    client.consume(1, queue, "c")
    client.deliveries(1, 2)
    client.send_method(1, make(7))
    assert client.expect_channel_close(1) == (406, unknown_tag(7), 60, method_id)


def test_ack_zero_without_multiple(client: RawClient, queue: str) -> None:
    fill(client, queue, 1)
    client.consume(1, queue, "c")
    client.read_delivery(1)
    client.ack(1, 0)
    assert client.expect_channel_close(1) == (406, unknown_tag(0), 60, 80)


def test_double_ack(client: RawClient, queue: str) -> None:
    fill(client, queue, 2)
    client.consume(1, queue, "c")
    client.deliveries(1, 2)
    client.ack(1, 1)
    client.ack(1, 1)
    assert client.expect_channel_close(1) == (406, unknown_tag(1), 60, 80)


def test_ack_on_another_channel_is_unknown(client: RawClient, queue: str) -> None:
    fill(client, queue, 1)
    client.consume(1, queue, "c")
    client.read_delivery(1)
    client.channel_open(2)
    client.ack(2, 1)
    assert client.expect_channel_close(2) == (406, unknown_tag(1), 60, 80)


PASSING = 3000  # deliveries: more than the channel keeps slots for (broker/engine/unacked.py)


def hold_while_others_pass(c: RawClient, queue: str, held: set[int]) -> None:
    """Consume PASSING messages (bodies "0".."2999", tag = body + 1) with prefetch 20,
    acking each at once except those with a tag in ``held``."""
    fill(c, queue, PASSING)
    c.qos(1, 20)
    c.consume(1, queue, "c")
    for _ in range(PASSING):
        tag = c.read_delivery(1).method.delivery_tag
        if tag not in held:
            c.ack(1, tag)


def test_deliveries_held_while_thousands_pass_are_still_settled_by_tag(
    client: RawClient, queue: str
) -> None:
    """The oldest deliveries outlive thousands acked after them: a multiple ack still
    settles them, and then their tags are unknown (RabbitMQ 4.3, rabbit_channel.erl
    collect_acks/5: the unacked queue, oldest first, up to the tag; else
    precondition_failed "unknown delivery tag ~w")."""
    hold_while_others_pass(client, queue, {1, 2, 1500})
    client.send_method(1, commands.Basic.Nack(delivery_tag=2, requeue=False))
    client.ack(1, 1500, multiple=True)  # 1 and 1500
    client.ack(1, 1)
    assert client.expect_channel_close(1) == (406, unknown_tag(1), 60, 80)
    client.channel_open(1)
    assert client.get(1, queue) is None  # nothing left to requeue


def test_deliveries_held_while_thousands_pass_go_back_in_order_on_close(
    client: RawClient, queue: str
) -> None:
    hold_while_others_pass(client, queue, {1, 1500, PASSING})
    client.channel_close(1)
    client.channel_open(1)
    bodies = [(d.body, d.method.redelivered) for d in iter_get(client, queue)]
    assert bodies == [(b"0", True), (b"1499", True), (f"{PASSING - 1}".encode(), True)]


def test_reject_and_nack_without_requeue_discard(client: RawClient, queue: str) -> None:
    fill(client, queue, 4)
    got = [client.get(1, queue) for _ in range(4)]
    tags = [d.method.delivery_tag for d in got if d]
    client.send_method(1, commands.Basic.Reject(delivery_tag=tags[0], requeue=False))
    client.send_method(1, commands.Basic.Nack(delivery_tag=tags[2], multiple=True, requeue=False))
    client.send_method(1, commands.Basic.Nack(delivery_tag=tags[3], requeue=True))
    back = client.get(1, queue, no_ack=True)
    assert back is not None and (back.body, back.method.redelivered) == (b"3", True)
    assert client.get(1, queue) is None


def test_requeue_goes_back_to_original_position(client: RawClient, queue: str) -> None:
    fill(client, queue, 5)
    got = [client.get(1, queue) for _ in range(3)]  # 0, 1, 2 unacked; 3, 4 ready
    tags = [d.method.delivery_tag for d in got if d]
    client.send_method(1, commands.Basic.Reject(delivery_tag=tags[1], requeue=True))
    client.send_method(1, commands.Basic.Nack(delivery_tag=tags[0], requeue=True))
    fill(client, queue, 1, prefix="new")
    bodies = [(d.body, d.method.redelivered) for d in iter_get(client, queue)]
    assert bodies == [
        (b"0", True),
        (b"1", True),
        (b"3", False),
        (b"4", False),
        (b"new0", False),
    ]


def iter_get(c: RawClient, queue: str) -> Iterator[Delivery]:
    while (d := c.get(1, queue, no_ack=True)) is not None:
        yield d


def test_nack_multiple_requeue(client: RawClient, queue: str) -> None:
    fill(client, queue, 3)
    client.consume(1, queue, "c")
    got = client.deliveries(1, 3)
    client.send_method(
        1, commands.Basic.Nack(delivery_tag=got[-1].method.delivery_tag, multiple=True)
    )
    again = client.deliveries(1, 3)
    assert [(d.body, d.method.redelivered) for d in again] == [
        (b"0", True),
        (b"1", True),
        (b"2", True),
    ]
    assert [d.method.delivery_tag for d in again] == [4, 5, 6]


# -- recover ---------------------------------------------------------------------


def test_recover_requeues_unacked(client: RawClient, queue: str) -> None:
    fill(client, queue, 3)
    client.consume(1, queue, "c")
    got = client.deliveries(1, 3)
    client.ack(1, got[1].method.delivery_tag)
    client.call(1, commands.Basic.Recover(requeue=True), commands.Basic.RecoverOk)
    again = client.deliveries(1, 2)
    assert [(d.body, d.method.redelivered, d.method.delivery_tag) for d in again] == [
        (b"0", True, 4),
        (b"2", True, 5),
    ]


def test_recover_async(client: RawClient, queue: str) -> None:
    fill(client, queue, 2)
    client.consume(1, queue, "c")
    client.deliveries(1, 2)
    client.send_method(1, build(commands.Basic.RecoverAsync, requeue=True))
    again = client.deliveries(1, 2)
    assert [(d.body, d.method.redelivered) for d in again] == [(b"0", True), (b"1", True)]
    client.assert_silent(0.2)  # no recover-ok for the async variant


def test_recover_without_requeue_not_implemented(client: RawClient) -> None:
    client.send_method(1, commands.Basic.Recover(requeue=False))
    assert client.expect_close() == (540, "NOT_IMPLEMENTED - requeue=false", 60, 110)


@pytest.mark.parametrize("how", ["channel-close", "connection-close", "connection-lost"])
def test_unacked_requeued_as_redelivered(
    amqp_addr: tuple[str, int], client: RawClient, queue: str, how: str
) -> None:
    fill(client, queue, 3)
    consumer = RawClient.connect(amqp_addr)
    consumer.consume(1, queue, "c")
    got = consumer.deliveries(1, 3)
    assert not any(d.method.redelivered for d in got)
    consumer.ack(1, got[1].method.delivery_tag)
    if how == "channel-close":
        consumer.channel_close(1)
        consumer.close()
    elif how == "connection-close":
        consumer.close()
    else:
        consumer.abort()
    client.consume(1, queue, "next", no_ack=True)
    again = client.deliveries(1, 2)
    assert [(d.body, d.method.redelivered) for d in again] == [(b"0", True), (b"2", True)]


# -- content ---------------------------------------------------------------------


def every_field_type() -> bytes:
    return raw_table(
        [
            ("bool-true", fv("t", 1)),
            ("bool-false", fv("t", 0)),
            ("int8", fv("b", -5)),
            ("uint8", fv("B", 250)),
            ("int16", fv("s", -30000)),
            ("uint16", fv("u", 65000)),
            ("int32", fv("I", -2_000_000_000)),
            ("uint32", fv("i", 4_000_000_000)),
            ("int64", fv("l", -9_000_000_000_000_000_000)),
            ("float", fv("f", 1.5)),
            ("double", fv("d", -2.25)),
            ("decimal", fv("D", (3, 123456))),
            ("longstr", fv("S", "héllo wörld")),
            ("timestamp", fv("T", 1_700_000_000)),
            ("bytes", fv("x", b"\x00\xff\x10binary\x00")),
            ("void", fv("V")),
            (
                "array",
                fv(
                    "A",
                    [
                        fv("I", 1),
                        fv("S", "two"),
                        fv("V"),
                        fv("t", 1),
                        fv("F", raw_table([("n", fv("d", 0.5))])),
                        fv("A", [fv("b", 7), fv("A", [])]),
                    ],
                ),
            ),
            (
                "nested",
                fv(
                    "F",
                    raw_table(
                        [
                            ("inner", fv("F", raw_table([("deep", fv("S", "x"))]))),
                            ("empty", fv("F", raw_table([]))),
                            ("list", fv("A", [fv("T", 0), fv("D", (0, -1))])),
                        ]
                    ),
                ),
            ),
            ("", fv("S", "empty key")),
            ("ключ", fv("S", "значение")),
        ]
    )


def full_header(body_size: int) -> bytes:
    """All 14 basic properties, including every field-table value type."""
    props = (
        shortstr("application/json")  # content-type
        + shortstr("gzip")  # content-encoding
        + every_field_type()  # headers
        + bytes([2])  # delivery-mode
        + bytes([7])  # priority
        + shortstr("corr-1")  # correlation-id
        + shortstr("reply.queue")  # reply-to
        + shortstr("60000")  # expiration
        + shortstr("msg-1")  # message-id
        + struct.pack(">Q", 1_700_000_001)  # timestamp
        + shortstr("type-x")  # type
        + shortstr("guest")  # user-id (must be the authenticated user)
        + shortstr("app-1")  # app-id
        + shortstr("cluster-1")  # cluster-id (deprecated, passed through)
    )
    return struct.pack(">HHQH", 60, 0, body_size, 0xFFFC) + props


def test_properties_round_trip_byte_exact(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    # also through a headers exchange, which has to parse the headers table
    client.bind_queue_raw(
        1, q, "amq.headers", "", raw_table([("x-match", fv("S", "all")), ("int8", fv("b", -5))])
    )
    body = "body ✓".encode()
    header = full_header(len(body))
    client.confirm_select(1)
    client.publish(1, body, routing_key=q, raw_header=header)
    client.publish(1, body, exchange="amq.headers", raw_header=header)
    client.publish(1, body, routing_key=q, raw_header=header)
    assert client.wait_for_confirms(1) == {1: True, 2: True, 3: True}
    got = client.get(1, q)
    assert got is not None
    assert got.header_payload == header
    assert got.body == body
    client.consume(1, q, "c")
    delivered = client.deliveries(1, 2)
    for d in delivered:
        assert d.header_payload == header
        assert d.body == body
    props = delivered[0].properties
    assert props.headers is not None
    assert props.headers["nested"] == {
        "inner": {"deep": "x"},
        "empty": {},
        "list": [datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC), decimal.Decimal(-1)],
    }
    assert (props.delivery_mode, props.priority, props.app_id) == (2, 7, "app-1")
    # a requeued message keeps its exact header too
    client.send_method(1, commands.Basic.Nack(delivery_tag=0, multiple=True, requeue=True))
    for d in client.deliveries(1, 3):
        assert d.method.redelivered
        assert d.header_payload == header


def test_header_with_no_properties(client: RawClient, queue: str) -> None:
    client.confirm_select(1)
    header = struct.pack(">HHQH", 60, 0, 3, 0)
    client.publish(1, b"abc", routing_key=queue, raw_header=header)
    client.wait_for_confirms(1)
    d = client.get(1, queue, no_ack=True)
    assert d is not None
    assert d.header_payload == header


@pytest.mark.parametrize("size", [1 << 20, 10 << 20], ids=["1MiB", "10MiB"])
def test_large_bodies(client: RawClient, queue: str, size: int) -> None:
    body = os.urandom(size)
    client.publish(1, body, routing_key=queue)
    client.consume(1, queue, "big", no_ack=True)
    d = client.read_delivery(1, timeout=20)
    assert d.body_size == size
    assert d.body == body
    assert max(d.body_frame_sizes) == 131072 - 8


# -- flow ------------------------------------------------------------------------


def test_channel_flow_active_true(client: RawClient, queue: str) -> None:
    ok = client.call(1, commands.Channel.Flow(active=True), commands.Channel.FlowOk)
    assert ok.active is True
    fill(client, queue, 1)
    client.consume(1, queue, "c", no_ack=True)
    assert client.read_delivery(1).body == b"0"


def test_channel_flow_active_false_is_refused(client: RawClient, queue: str) -> None:
    """RabbitMQ 4.3 refuses it as a connection error (rabbit_channel.erl, handle_method
    channel.flow: protocol_error(not_implemented, "active=false")); 3.10 does the same."""
    client.consume(1, queue, "c", no_ack=True)
    client.send_method(1, commands.Channel.Flow(active=False))
    assert client.expect_close(wait_eof=True) == (
        540,
        "NOT_IMPLEMENTED - active=false",
        20,
        20,
    )
