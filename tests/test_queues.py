"""Queues: declaration, exclusivity, auto-delete, counts, equivalence, purge, delete, bindings."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Janitor, RawClient, build, fv, raw_table, reply_text, shortstr
from pamqp import commands


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


@pytest.fixture
def other(amqp_addr: tuple[str, int]) -> Iterator[RawClient]:
    """A second, independent connection."""
    c = RawClient.connect(amqp_addr)
    yield c
    c.close()


def not_found(name: str) -> str:
    return f"NOT_FOUND - no queue '{name}' in vhost '/'"


def locked(name: str) -> str:
    # long enough with our queue names to show the 255-byte truncation
    return reply_text(
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost "
        "'/'. It could be originally declared on another connection or the exclusive property "
        "value does not match that of the original declaration."
    )


def inequivalent(arg: str, name: str, detail: str) -> str:
    return (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{name}' in vhost '/': {detail}"
    )


def publish_confirmed(c: RawClient, queue: str, *bodies: bytes) -> None:
    if 1 not in c.publish_seq:
        c.confirm_select(1)
    for body in bodies:
        c.publish(1, body, routing_key=queue)
    c.wait_for_confirms(1)


def eventually_counts(c: RawClient, queue: str, expected: tuple[int, int]) -> tuple[int, int]:
    """(message_count, consumer_count) from passive declares, polled for up to
    2 s: RabbitMQ updates these counts asynchronously after acks and closes."""
    deadline = time.monotonic() + 2.0
    while True:
        ok = c.declare_queue(1, queue, passive=True)
        counts = (int(ok.message_count or 0), int(ok.consumer_count or 0))
        if counts == expected or time.monotonic() > deadline:
            return counts
        c.assert_silent(0.02)


# -- declaration ---------------------------------------------------------------


def test_server_named_queue(client: RawClient) -> None:
    ok = client.declare_queue(1, "", durable=True)
    q = str(ok.queue)
    try:
        assert q.startswith("amq.gen-")
        assert len(q) > len("amq.gen-")
        assert (ok.message_count, ok.consumer_count) == (0, 0)
        again = client.new_queue(1)
        assert again != q
        client.delete_queue(1, again)
        # it is an ordinary queue reachable through the default exchange
        publish_confirmed(client, q, b"hello")
        d = client.get(1, q, no_ack=True)
        assert d is not None and d.body == b"hello"
    finally:
        client.delete_queue(1, q)


def test_declare_ok_echoes_name(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    assert client.declare_queue(1, q, durable=True).queue == q
    assert client.declare_queue(1, q, passive=True).queue == q


def test_passive_declare_of_missing_queue(client: RawClient, name: str) -> None:
    client.send_method(1, build(commands.Queue.Declare, queue=name, passive=True))
    assert client.expect_channel_close(1) == (404, not_found(name), 50, 10)


def test_passive_declare_ignores_other_flags(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    ok = client.declare_queue(1, q, passive=True, durable=True, auto_delete=True)
    assert ok.queue == q


def test_amq_prefix_reserved(client: RawClient, name: str) -> None:
    q = f"amq.{name}"
    client.send_method(1, build(commands.Queue.Declare, queue=q, durable=True))
    assert client.expect_channel_close(1) == (
        403,
        f"ACCESS_REFUSED - queue name '{q}' contains reserved prefix 'amq.*'",
        50,
        10,
    )
    client.channel_open(1)
    client.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
    assert client.expect_channel_close(1) == (404, not_found(q), 50, 10)


def test_declare_ok_counts(
    client: RawClient, other: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    publish_confirmed(client, q, b"1", b"2", b"3")
    ok = client.declare_queue(1, q, durable=True)
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    other.qos(1, 1)
    other.consume(1, q, "c1")
    other.read_delivery(1)
    other.channel_open(2)
    other.qos(2, 1)
    other.consume(2, q, "c2")
    other.read_delivery(2)
    # unacknowledged messages are not counted
    ok = client.declare_queue(1, q, passive=True)
    assert (ok.message_count, ok.consumer_count) == (1, 2)
    other.channel_close(2)  # its consumer goes away and its unacked message goes back
    assert eventually_counts(client, q, (2, 1)) == (2, 1)


# -- equivalence ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "received", "current"),
    # durable: the queue is the durable one, RabbitMQ 4.3 has no transient shared queues
    [("durable", "false", "true"), ("auto_delete", "true", "false")],
)
def test_inequivalent_flags(
    client: RawClient, janitor: Janitor, name: str, flag: str, received: str, current: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    flags = {"durable": True, flag: received == "true"}
    client.send_method(1, build(commands.Queue.Declare, queue=q, **flags))
    assert client.expect_channel_close(1) == (
        406,
        inequivalent(flag, q, f"received '{received}' but current is '{current}'"),
        50,
        10,
    )


def test_inequivalent_durable_the_other_way(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    client.send_method(1, build(commands.Queue.Declare, queue=q, durable=False))
    assert client.expect_channel_close(1) == (
        406,
        inequivalent("durable", q, "received 'false' but current is 'true'"),
        50,
        10,
    )


def test_exclusive_mismatch_is_resource_locked(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    client.send_method(1, build(commands.Queue.Declare, queue=q, exclusive=True))
    assert client.expect_channel_close(1) == (405, locked(q), 50, 10)
    client.channel_open(1)
    e = janitor.queue(f"{name}.excl")
    client.declare_queue(1, e, exclusive=True)
    client.send_method(1, build(commands.Queue.Declare, queue=e, exclusive=False))
    assert client.expect_channel_close(1) == (405, locked(e), 50, 10)


QUEUE_ARGS: dict[str, Any] = {
    "x-max-length": 10,
    "x-message-ttl": 5000,
    "x-dead-letter-exchange": "dlx",
    "x-expires": 100000,
}


@pytest.mark.parametrize(
    ("changes", "arg", "detail"),
    [
        ({"x-max-length": 20}, "x-max-length", "received '20' but current is '10'"),
        (
            {"x-dead-letter-exchange": "other"},
            "x-dead-letter-exchange",
            "received 'other' but current is 'dlx'",
        ),
        (
            {"x-expires": None},
            "x-expires",
            "received none but current is the value '100000' of type 'signedint'",
        ),
        (
            {"x-max-length-bytes": 10},
            "x-max-length-bytes",
            "received the value '10' of type 'byte' but current is none",
        ),
    ],
    ids=["changed-int", "changed-str", "missing", "added"],
)
def test_inequivalent_arguments(
    client: RawClient,
    janitor: Janitor,
    name: str,
    changes: dict[str, Any],
    arg: str,
    detail: str,
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, arguments=QUEUE_ARGS, durable=True)
    client.declare_queue(1, q, arguments=QUEUE_ARGS, durable=True)  # identical: fine
    args = {k: v for k, v in {**QUEUE_ARGS, **changes}.items() if v is not None}
    client.send_method(1, build(commands.Queue.Declare, queue=q, arguments=args, durable=True))
    assert client.expect_channel_close(1) == (406, inequivalent(arg, q, detail), 50, 10)


def test_equivalent_arguments_ignore_integer_width_and_unknown_keys(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, arguments={**QUEUE_ARGS, "x-custom": "a"})
    table = raw_table(
        [
            ("x-max-length", fv("l", 10)),
            ("x-message-ttl", fv("I", 5000)),
            ("x-dead-letter-exchange", fv("S", "dlx")),
            ("x-expires", fv("l", 100000)),
            ("x-custom", fv("S", "b")),  # not a queue argument RabbitMQ knows: not compared
        ]
    )
    client.send_method_raw(1, 50, 10, b"\x00\x00" + shortstr(q) + b"\x02" + table)  # durable
    ok = client.expect_method(commands.Queue.DeclareOk, 1)
    assert ok.queue == q


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        ({"x-max-length": "ten"}, '"expected integer, got longstr"'),
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-message-ttl": -1}, "{value_negative,-1}"),
    ],
    ids=["string-length", "negative-length", "negative-ttl"],
)
def test_invalid_arguments(client: RawClient, name: str, args: dict[str, Any], detail: str) -> None:
    client.send_method(1, build(commands.Queue.Declare, queue=name, arguments=args, durable=True))
    (arg,) = args
    assert client.expect_channel_close(1) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/': {detail}",
        50,
        10,
    )


# -- exclusive queues --------------------------------------------------------------


EXCLUSIVE_OPS: dict[str, tuple[Any, tuple[int, int]]] = {
    "declare": (lambda q: build(commands.Queue.Declare, queue=q, durable=True), (50, 10)),
    "declare-passive": (lambda q: build(commands.Queue.Declare, queue=q, passive=True), (50, 10)),
    "declare-exclusive": (
        lambda q: build(commands.Queue.Declare, queue=q, exclusive=True),
        (50, 10),
    ),
    "consume": (lambda q: build(commands.Basic.Consume, queue=q), (60, 20)),
    "get": (lambda q: build(commands.Basic.Get, queue=q), (60, 70)),
    "purge": (lambda q: build(commands.Queue.Purge, queue=q), (50, 30)),
    "delete": (lambda q: build(commands.Queue.Delete, queue=q), (50, 40)),
    "bind": (
        lambda q: build(commands.Queue.Bind, queue=q, exchange="amq.direct", routing_key="k"),
        (50, 20),
    ),
    "unbind-existing-binding": (
        lambda q: build(commands.Queue.Unbind, queue=q, exchange="amq.direct", routing_key=q),
        (50, 50),
    ),
}


@pytest.mark.parametrize("op", list(EXCLUSIVE_OPS))
def test_exclusive_queue_locked_for_other_connections(
    client: RawClient, other: RawClient, janitor: Janitor, name: str, op: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, exclusive=True)
    client.bind_queue(1, q, "amq.direct", q)
    make, ids = EXCLUSIVE_OPS[op]
    other.send_method(1, make(q))
    assert other.expect_channel_close(1) == (405, locked(q), *ids)
    # the owner is unaffected
    assert client.declare_queue(1, q, passive=True).queue == q


def test_exclusive_server_named_queue_from_other_connection(
    client: RawClient, other: RawClient
) -> None:
    q = client.new_queue(1, exclusive=True)
    other.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
    assert other.expect_channel_close(1) == (405, locked(q), 50, 10)
    # a non-passive declare trips over the reserved prefix first
    other.channel_open(1)
    other.send_method(1, build(commands.Queue.Declare, queue=q, exclusive=True))
    assert other.expect_channel_close(1) == (
        403,
        f"ACCESS_REFUSED - queue name '{q}' contains reserved prefix 'amq.*'",
        50,
        10,
    )


def test_exclusive_queue_other_connection_may_publish(
    client: RawClient, other: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, exclusive=True)
    other.confirm_select(1)
    other.publish(1, b"from other", routing_key=q)
    other.wait_for_confirms(1)
    d = client.get(1, q, no_ack=True)
    assert d is not None and d.body == b"from other"
    # unbinding a binding that does not exist succeeds before exclusivity is checked
    other.call(
        1,
        build(commands.Queue.Unbind, queue=q, exchange="amq.direct", routing_key=name),
        commands.Queue.UnbindOk,
    )


def test_exclusive_queue_usable_from_other_channel_of_same_connection(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, exclusive=True)
    client.channel_open(2)
    assert client.declare_queue(2, q, passive=True).queue == q
    assert client.declare_queue(2, q, exclusive=True).queue == q
    client.consume(2, q, "c")
    client.call(1, build(commands.Queue.Purge, queue=q), commands.Queue.PurgeOk)


@pytest.mark.parametrize("how", ["close", "abort"])
def test_exclusive_queue_deleted_with_its_connection(
    amqp_addr: tuple[str, int], client: RawClient, janitor: Janitor, name: str, how: str
) -> None:
    q = janitor.queue(name)
    owner = RawClient.connect(amqp_addr)
    owner.declare_queue(1, q, exclusive=True)
    owner.channel_close(1)  # closing the declaring channel is not enough
    client.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
    assert client.expect_channel_close(1) == (405, locked(q), 50, 10)
    if how == "close":
        owner.close()
    else:
        owner.abort()
    # after an abort the broker notices the loss asynchronously
    for _ in range(50):
        client.channel_open(1)
        client.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
        code, text, *_ = client.expect_channel_close(1)
        if code == 404:
            assert text == not_found(q)
            return
        assert (code, text) == (405, locked(q))
        client.assert_silent(0.05)
    pytest.fail("exclusive queue outlived its connection")


# -- auto-delete ----------------------------------------------------------------


def test_auto_delete_after_last_consumer_cancels(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, auto_delete=True, durable=True)
    client.channel_close(1)  # never consumed: survives its channel
    client.channel_open(1)
    client.consume(1, q, "a")
    client.consume(1, q, "b")
    client.call(1, build(commands.Basic.Cancel, consumer_tag="a"), commands.Basic.CancelOk)
    ok = client.declare_queue(1, q, passive=True)
    assert ok.consumer_count == 1
    client.call(1, build(commands.Basic.Cancel, consumer_tag="b"), commands.Basic.CancelOk)
    client.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
    assert client.expect_channel_close(1) == (404, not_found(q), 50, 10)


def test_auto_delete_when_consuming_channel_closes(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, auto_delete=True, durable=True)
    client.channel_open(2)
    client.consume(2, q, "c")
    client.channel_close(2)
    client.send_method(1, build(commands.Queue.Declare, queue=q, passive=True))
    assert client.expect_channel_close(1) == (404, not_found(q), 50, 10)


# -- purge and delete ------------------------------------------------------------


def test_purge_returns_count(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    publish_confirmed(client, q, b"a", b"b", b"c", b"d")
    d = client.get(1, q)  # unacked messages are not purged
    assert d is not None
    ok = client.call(1, build(commands.Queue.Purge, queue=q), commands.Queue.PurgeOk)
    assert ok.message_count == 3
    ok = client.call(1, build(commands.Queue.Purge, queue=q), commands.Queue.PurgeOk)
    assert ok.message_count == 0
    client.send_method(1, commands.Basic.Reject(delivery_tag=d.method.delivery_tag, requeue=True))
    back = client.get(1, q, no_ack=True)
    assert back is not None
    assert (back.body, back.method.redelivered, back.method.message_count) == (b"a", True, 0)


def test_purge_missing_queue(client: RawClient, name: str) -> None:
    client.send_method(1, build(commands.Queue.Purge, queue=name))
    assert client.expect_channel_close(1) == (404, not_found(name), 50, 30)


def test_delete_returns_message_count(client: RawClient, name: str) -> None:
    client.declare_queue(1, name, durable=True)
    publish_confirmed(client, name, b"1", b"2", b"3", b"4")
    ok = client.call(1, build(commands.Queue.Delete, queue=name), commands.Queue.DeleteOk)
    assert ok.message_count == 4
    client.send_method(1, build(commands.Queue.Declare, queue=name, passive=True))
    assert client.expect_channel_close(1) == (404, not_found(name), 50, 10)


def test_delete_missing_queue_succeeds(client: RawClient, name: str) -> None:
    ok = client.call(1, build(commands.Queue.Delete, queue=name), commands.Queue.DeleteOk)
    assert ok.message_count == 0


def test_delete_if_empty(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    publish_confirmed(client, q, b"x")
    client.send_method(1, build(commands.Queue.Delete, queue=q, if_empty=True))
    assert client.expect_channel_close(1) == (
        406,
        f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty",
        50,
        40,
    )
    client.channel_open(1)
    client.call(1, build(commands.Queue.Purge, queue=q), commands.Queue.PurgeOk)
    ok = client.call(
        1, build(commands.Queue.Delete, queue=q, if_empty=True), commands.Queue.DeleteOk
    )
    assert ok.message_count == 0


def test_delete_if_unused(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    client.channel_open(2)
    client.consume(2, q, "c")
    client.send_method(1, build(commands.Queue.Delete, queue=q, if_unused=True))
    assert client.expect_channel_close(1) == (
        406,
        f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use",
        50,
        40,
    )
    client.channel_open(1)
    client.call(2, build(commands.Basic.Cancel, consumer_tag="c"), commands.Basic.CancelOk)
    client.call(1, build(commands.Queue.Delete, queue=q, if_unused=True), commands.Queue.DeleteOk)


def test_delete_cancels_consumers(client: RawClient, name: str) -> None:
    client.declare_queue(1, name, durable=True)
    client.channel_open(2)
    client.consume(2, name, "doomed")
    client.call(1, build(commands.Queue.Delete, queue=name), commands.Queue.DeleteOk)
    # the consumer asked for consumer_cancel_notify
    cancel = client.expect_method(commands.Basic.Cancel, 2)
    assert cancel.consumer_tag == "doomed"


# -- bindings --------------------------------------------------------------------


def test_bind_missing_exchange_or_queue(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    missing_ex = f"{name}.missing-ex"
    missing_q = f"{name}.missing-q"
    client.send_method(1, build(commands.Queue.Bind, queue=q, exchange=missing_ex))
    assert client.expect_channel_close(1) == (
        404,
        f"NOT_FOUND - no exchange '{missing_ex}' in vhost '/'",
        50,
        20,
    )
    client.channel_open(1)
    client.send_method(1, build(commands.Queue.Bind, queue=missing_q, exchange="amq.direct"))
    assert client.expect_channel_close(1) == (404, not_found(missing_q), 50, 20)
    client.channel_open(1)
    # both missing: the exchange is reported
    client.send_method(1, build(commands.Queue.Bind, queue=missing_q, exchange=missing_ex))
    assert client.expect_channel_close(1) == (
        404,
        f"NOT_FOUND - no exchange '{missing_ex}' in vhost '/'",
        50,
        20,
    )


def test_unbind_is_idempotent(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    for queue, exchange, key in [
        (q, "amq.direct", "never-bound"),
        (q, f"{name}.missing-ex", "k"),
        (f"{name}.missing-q", "amq.direct", "k"),
    ]:
        client.call(
            1,
            build(commands.Queue.Unbind, queue=queue, exchange=exchange, routing_key=key),
            commands.Queue.UnbindOk,
        )


def test_bind_and_unbind_change_routing(client: RawClient, janitor: Janitor, name: str) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, durable=True)
    client.confirm_select(1)
    client.bind_queue(1, q, "amq.direct", name)
    client.publish(1, b"bound", exchange="amq.direct", routing_key=name)
    client.wait_for_confirms(1)
    client.call(
        1,
        build(commands.Queue.Unbind, queue=q, exchange="amq.direct", routing_key=name),
        commands.Queue.UnbindOk,
    )
    client.publish(1, b"unbound", exchange="amq.direct", routing_key=name)
    client.wait_for_confirms(1)
    assert client.drain(1, q) == [b"bound"]


# -- the channel's "current queue" ------------------------------------------------


def test_empty_queue_name_means_last_declared_queue(client: RawClient) -> None:
    q = client.new_queue(1, exclusive=True)
    client.bind_queue(1, "", "amq.direct", q)
    client.confirm_select(1)
    client.publish(1, b"via binding", exchange="amq.direct", routing_key=q)
    client.wait_for_confirms(1)
    d = client.get(1, "", no_ack=True)
    assert d is not None
    assert (d.body, d.method.routing_key) == (b"via binding", q)


@pytest.mark.parametrize(
    ("method", "ids"),
    [
        (build(commands.Basic.Get, queue=""), (60, 70)),
        (build(commands.Basic.Consume, queue=""), (60, 20)),
        (build(commands.Queue.Purge, queue=""), (50, 30)),
        (build(commands.Queue.Bind, queue="", exchange="amq.direct"), (50, 20)),
        (build(commands.Queue.Delete, queue=""), (50, 40)),
    ],
    ids=["get", "consume", "purge", "bind", "delete"],
)
def test_empty_queue_name_without_declared_queue(
    client: RawClient, method: Any, ids: tuple[int, int]
) -> None:
    client.send_method(1, method)
    assert client.expect_channel_close(1) == (
        404,
        "NOT_FOUND - no previously declared queue",
        *ids,
    )


@pytest.mark.parametrize(
    ("arg", "value", "ok"),
    [
        ("x-message-ttl", 134_217_728_000, True),  # Celery's delayed delivery uses TTLs this long
        ("x-expires", 134_217_728_000, True),
        ("x-message-ttl", 315_360_000_001, False),  # past RabbitMQ's ten-year ceiling
    ],
)
def test_ttl_ceiling_is_rabbitmqs_ten_years(
    client: RawClient, janitor: Janitor, name: str, arg: str, value: int, ok: bool
) -> None:
    q = janitor.queue(name)
    client.send_method(
        1, build(commands.Queue.Declare, queue=q, arguments={arg: value}, durable=True)
    )
    if ok:
        client.expect_method(commands.Queue.DeclareOk, 1)
    else:
        code, text, _, _ = client.expect_channel_close(1)
        assert (code, text) == (
            406,
            f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{q}' in vhost '/': "
            f"{{value_too_large,{value}}}",
        )


def test_a_deleted_queue_is_freed_without_the_cyclic_collector() -> None:
    """A queue's timers call its methods; once it is deleted they let go of it, so that
    refcounting frees it at once. warren-server runs the cyclic collector rarely
    (broker/server/main.py GC_THRESHOLDS): garbage cycles of every deleted queue (an RPC
    client's reply queue each call) would pile up until it did."""
    import gc

    import pika

    from warren.broker.testkit import run_broker

    with run_broker() as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        try:
            gc.collect()
            gc.disable()
            ch = conn.channel()
            for i in range(50):
                ch.queue_declare(f"gone-{i}", durable=True, arguments={"x-message-ttl": 60_000})
                reply = ch.queue_declare("", exclusive=True).method.queue
                ch.basic_publish("", f"gone-{i}", b"x")
                ch.basic_consume(reply, lambda *args: None)
                ch.queue_delete(f"gone-{i}")
                ch.queue_delete(reply)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            ours = [o for o in gc.garbage if type(o).__module__.startswith("warren.")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            conn.close()
    assert ours == []


def test_a_queue_declared_again_gets_the_default_exchanges_messages(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    """The default exchange keeps its answer for the queue it routed to last: a queue
    deleted and declared again under that name gets the next publish, not the old one."""
    q = janitor.queue(name)
    client.declare_queue(1, q)
    publish_confirmed(client, q, b"first")
    client.delete_queue(1, q)
    client.declare_queue(1, q)
    publish_confirmed(client, q, b"second")
    got = client.get(1, q, no_ack=True)
    assert got is not None and got.body == b"second"
    assert client.get(1, q, no_ack=True) is None
