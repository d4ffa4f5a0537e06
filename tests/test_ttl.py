"""Message TTL (x-message-ttl, expiration) and queue expiry (x-expires), as RabbitMQ does them.

Every test here passes against RabbitMQ 3.10 too (WARREN_TEST_URL). Expiry is
observed through a consumer on a dead-letter queue, so tests wait for an event
rather than sleep; TTLs and expiries are tens of milliseconds. Warren's
"expires on time, whatever the order" behaviour is in test_lifecycle_warren.py.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Janitor, RawClient, fv, raw_table, shortstr
from lifecycle import (
    death_entry,
    deaths,
    declare_refused,
    expect_close,
    message_count,
    props,
    publish,
    queue_exists,
    typed_headers,
    without_time,
)
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
def dlq(client: RawClient, janitor: Janitor, name: str) -> str:
    """A fanout dead-letter exchange named ``<name>.dlx`` and a queue bound to it,
    consumed on channel 2 (no-ack): dead-lettered copies arrive as deliveries there."""
    exchange = janitor.exchange(f"{name}.dlx")
    queue = janitor.queue(f"{name}.dlq")
    client.declare_exchange(1, exchange, "fanout")
    client.declare_queue(1, queue, durable=True)
    client.bind_queue(1, queue, exchange)
    client.channel_open(2)
    client.consume(2, queue, consumer_tag="dlq", no_ack=True)
    return exchange


def ttl_queue(
    c: RawClient, janitor: Janitor, name: str, dlx: str | None = None, **arguments: Any
) -> str:
    args = dict(arguments)
    if dlx is not None:
        args["x-dead-letter-exchange"] = dlx
    return str(c.declare_queue(1, janitor.queue(name), arguments=args, durable=True).queue)


def invalid_arg(arg: str, queue: str, detail: str) -> str:
    return f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{queue}' in vhost '/': {detail}"


# -- x-message-ttl: validation ------------------------------------------------------------

INTEGER_TYPES = ["b", "B", "s", "u", "I", "i", "l"]


@pytest.mark.parametrize("tag", INTEGER_TYPES)
def test_ttl_argument_of_any_integer_type(
    client: RawClient, janitor: Janitor, name: str, dlq: str, tag: str
) -> None:
    q = janitor.queue(name)
    table = raw_table([("x-message-ttl", fv(tag, 20)), ("x-dead-letter-exchange", fv("S", dlq))])
    client.send_method_raw(1, 50, 10, b"\x00\x00" + shortstr(q) + b"\x02" + table)  # durable
    client.expect_method(commands.Queue.DeclareOk, 1)
    publish(client, q, b"short-lived")
    d = client.read_delivery(2)  # the integer was read as 20 ms: the message expired
    assert d.body == b"short-lived"
    assert message_count(client, q) == 0


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (fv("S", "5000"), '"expected integer, got longstr"'),
        (fv("d", 5000.0), '"expected integer, got double"'),
        (fv("f", 5000.0), '"expected integer, got float"'),
        (fv("t", 1), '"expected integer, got bool"'),
        (fv("T", 5000), '"expected integer, got timestamp"'),
        (fv("D", (0, 5000)), '"expected integer, got decimal"'),
        (fv("l", -1), "{value_negative,-1}"),
        (fv("b", -5), "{value_negative,-5}"),
    ],
    ids=["longstr", "double", "float", "bool", "timestamp", "decimal", "negative", "negative-byte"],
)
def test_ttl_argument_refused(client: RawClient, name: str, value: bytes, detail: str) -> None:
    table = raw_table([("x-message-ttl", value)])
    client.send_method_raw(1, 50, 10, b"\x00\x00" + shortstr(name) + b"\x00" + table)
    assert expect_close(client) == (406, invalid_arg("x-message-ttl", name, detail), 50, 10)
    assert not queue_exists(client, name)  # nothing half-created


TEN_YEARS_MS = 315_360_000_000  # RabbitMQ's ceiling for TTLs and queue expiry


@pytest.mark.parametrize("arg", ["x-message-ttl", "x-expires"])
def test_ttl_and_expires_ceiling_is_ten_years(
    client: RawClient, janitor: Janitor, name: str, arg: str
) -> None:
    q = janitor.queue(name)
    client.declare_queue(1, q, arguments={arg: TEN_YEARS_MS}, durable=True)
    client.delete_queue(1, q)
    too_long = TEN_YEARS_MS + 1
    assert declare_refused(client, q, {arg: too_long}) == (
        406,
        invalid_arg(arg, q, f"{{value_too_large,{too_long}}}"),
        50,
        10,
    )
    assert not queue_exists(client, q)


# -- expiration property: validation -----------------------------------------------------


def header_with_expiration(body_size: int, expiration: bytes) -> bytes:
    """A content header whose only property is ``expiration`` (raw bytes, even empty)."""
    return struct.pack(">HHQH", 60, 0, body_size, 0x0100) + shortstr(expiration)


@pytest.mark.parametrize(
    ("expiration", "detail"),
    [
        ("abc", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("1.5", '{leftover_string,".5"}'),
        ("10 ", '{leftover_string," "}'),
        (" 10", "no_integer"),
        ("0x10", '{leftover_string,"x10"}'),
        ("1e3", '{leftover_string,"e3"}'),
        ("", "no_integer"),
        ("315360000001", "{value_too_large,315360000001}"),
    ],
    ids=[
        "letters",
        "negative",
        "fraction",
        "trailing-space",
        "leading-space",
        "hex",
        "exp",
        "empty",
        "over-ten-years",
    ],
)
def test_invalid_expiration_refused_on_publish(
    client: RawClient, janitor: Janitor, name: str, expiration: str, detail: str
) -> None:
    q = ttl_queue(client, janitor, name)
    client.publish(
        1, b"x", routing_key=q, raw_header=header_with_expiration(1, expiration.encode())
    )
    assert expect_close(client) == (
        406,
        f"PRECONDITION_FAILED - invalid expiration '{expiration}': {detail}",
        60,
        40,
    )
    assert message_count(client, q) == 0


@pytest.mark.parametrize("expiration", ["+5000", "60000", "315360000000", "0000"])
def test_valid_expirations_accepted(
    client: RawClient, janitor: Janitor, name: str, expiration: str
) -> None:
    q = ttl_queue(client, janitor, name)
    client.publish(
        1, b"x", routing_key=q, raw_header=header_with_expiration(1, expiration.encode())
    )
    client.declare_queue(1, q, passive=True)  # the channel is still open
    if expiration != "0000":
        assert message_count(client, q) == 1


# -- expiry ------------------------------------------------------------------------------


def test_expired_messages_are_dead_lettered_and_no_longer_counted(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 30})
    publish(client, q, b"a", b"b", b"c")
    got = [client.read_delivery(2).body for _ in range(3)]
    assert got == [b"a", b"b", b"c"]
    assert message_count(client, q) == 0
    assert client.get(1, q) is None


def test_expired_message_never_reaches_a_late_consumer(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq)
    publish(client, q, b"stale", properties=props(expiration="20"))
    publish(client, q, b"fresh")
    assert client.read_delivery(2).body == b"stale"
    client.channel_open(3)
    client.consume(3, q, consumer_tag="late", no_ack=True)
    assert client.read_delivery(3).body == b"fresh"
    client.assert_silent(0.1)


def test_message_ttl_smaller_than_queue_ttl_wins(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 60000})
    start = time.monotonic()
    publish(client, q, b"m", properties=props(expiration="30"))
    d = client.read_delivery(2)
    assert time.monotonic() - start < 2.0
    (entry,) = deaths(d)
    assert without_time(entry) == death_entry(
        queue=q, reason="expired", exchange="", routing_keys=[q], original_expiration="30"
    )


def test_queue_ttl_smaller_than_message_ttl_wins(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 30})
    start = time.monotonic()
    publish(client, q, b"m", properties=props(expiration="60000"))
    d = client.read_delivery(2)
    assert time.monotonic() - start < 2.0
    assert d.properties.expiration is None  # removed from the dead-lettered copy
    (entry,) = deaths(d)
    assert without_time(entry) == death_entry(
        queue=q, reason="expired", exchange="", routing_keys=[q], original_expiration="60000"
    )


def test_unexpired_message_is_delivered(client: RawClient, janitor: Janitor, name: str) -> None:
    q = ttl_queue(client, janitor, name, **{"x-message-ttl": 60000})
    publish(client, q, b"m", properties=props(expiration="60000"))
    d = client.get(1, q, no_ack=True)
    assert d is not None and d.body == b"m"
    assert d.properties.expiration == "60000"  # the property reaches consumers unchanged


# -- TTL 0 --------------------------------------------------------------------------------


def test_ttl_zero_delivered_to_a_waiting_consumer(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 0})
    client.channel_open(3)
    client.consume(3, q, consumer_tag="ready")
    publish(client, q, b"now")
    d = client.read_delivery(3)
    assert d.body == b"now"
    client.ack(3, d.method.delivery_tag)
    client.assert_silent(0.1)  # and not dead-lettered


def test_ttl_zero_without_consumer_expires_at_once(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 0})
    publish(client, q, b"nobody")
    d = client.read_delivery(2)
    assert d.body == b"nobody"
    (entry,) = deaths(d)
    assert without_time(entry) == death_entry(
        queue=q, reason="expired", exchange="", routing_keys=[q]
    )
    assert message_count(client, q) == 0
    assert client.get(1, q) is None


def test_ttl_zero_with_consumer_at_its_prefetch_limit(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 0})
    client.channel_open(3)
    client.qos(3, 1)
    client.consume(3, q, consumer_tag="busy")
    publish(client, q, b"first", b"second")
    first = client.read_delivery(3)
    assert first.body == b"first"
    assert client.read_delivery(2).body == b"second"  # could not be taken at once: expired
    client.ack(3, first.method.delivery_tag)
    client.assert_silent(0.1)


def test_expiration_zero_property(client: RawClient, janitor: Janitor, name: str, dlq: str) -> None:
    q = ttl_queue(client, janitor, name, dlq)
    publish(client, q, b"gone", properties=props(expiration="0"))
    d = client.read_delivery(2)
    assert d.body == b"gone"
    (entry,) = deaths(d)
    assert entry["original-expiration"] == ("S", "0")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="ready", no_ack=True)
    publish(client, q, b"taken", properties=props(expiration="0"))
    assert client.read_delivery(3).body == b"taken"
    client.assert_silent(0.1)


# -- requeue ------------------------------------------------------------------------------


def test_requeued_message_keeps_its_original_expiry(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq)
    client.channel_open(3)
    client.consume(3, q, consumer_tag="holder")
    start = time.monotonic()
    publish(client, q, b"m", properties=props(expiration="400"))
    d = client.read_delivery(3)
    client.call(3, commands.Basic.Cancel(consumer_tag="holder"), commands.Basic.CancelOk)
    time.sleep(0.2)  # hold it for half its TTL
    client.send_method(3, commands.Basic.Nack(delivery_tag=d.method.delivery_tag, requeue=True))
    dead = client.read_delivery(2)
    elapsed = time.monotonic() - start
    assert dead.body == b"m"
    # expires 400 ms after publishing, not 400 ms after the requeue (that would be >= 600 ms)
    assert 0.38 <= elapsed < 0.58, elapsed


def test_message_that_expired_while_unacked_is_dead_lettered_on_requeue(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 30})
    client.channel_open(3)
    client.consume(3, q, consumer_tag="slow")
    publish(client, q, b"late")
    d = client.read_delivery(3)
    client.call(3, commands.Basic.Cancel(consumer_tag="slow"), commands.Basic.CancelOk)
    client.assert_silent(0.1)  # unacked messages do not expire
    client.send_method(3, commands.Basic.Reject(delivery_tag=d.method.delivery_tag, requeue=True))
    dead = client.read_delivery(2)
    assert dead.body == b"late"
    (entry,) = deaths(dead)
    assert entry["reason"] == ("S", "expired")
    assert client.get(1, q) is None


# -- x-expires ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (0, "{value_zero,0}"),
        (-1, "{value_negative,-1}"),
        ("1000", '"expected integer, got longstr"'),
    ],
    ids=["zero", "negative", "string"],
)
def test_expires_argument_refused(client: RawClient, name: str, value: Any, detail: str) -> None:
    assert declare_refused(client, name, {"x-expires": value}) == (
        406,
        invalid_arg("x-expires", name, detail),
        50,
        10,
    )
    assert not queue_exists(client, name)


def routable(c: RawClient, queue: str, channel: int = 4) -> bool:
    """Publish a mandatory message to ``queue``: is it still there? (Publishing is not a use.)"""
    if channel not in c.open_channels:
        c.channel_open(channel)
        c.confirm_select(channel)
    c.publish(channel, b"probe", routing_key=queue, mandatory=True)
    c.wait_for_confirms(channel)
    returned = False
    for f in list(c.pending):
        if f.channel == channel:
            c.pending.remove(f)
            if f.type == 1 and isinstance(f.method(), commands.Basic.Return):
                returned = True
    return not returned


def deleted_after(c: RawClient, queue: str, since: float, timeout: float = 3.0) -> float:
    """Seconds from ``since`` until ``queue`` is gone (polled with mandatory publishes)."""
    deadline = time.monotonic() + timeout
    while routable(c, queue):
        assert time.monotonic() < deadline, f"queue {queue} still there after {timeout} s"
        time.sleep(0.01)
    return time.monotonic() - since


def test_unused_queue_expires_with_its_messages_and_without_dead_lettering(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    start = time.monotonic()
    q = ttl_queue(client, janitor, name, dlq, **{"x-expires": 150})
    publish(client, q, b"lost-1", b"lost-2")
    elapsed = deleted_after(client, q, start)
    assert 0.14 <= elapsed < 1.0, elapsed
    assert not queue_exists(client, q)
    client.assert_silent(0.1)  # queue deletion does not dead-letter its messages


def test_consumer_keeps_queue_alive_until_cancelled(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = ttl_queue(client, janitor, name, **{"x-expires": 100})
    client.channel_open(3)
    client.consume(3, q, consumer_tag="keeper")
    time.sleep(0.3)  # three times x-expires with a consumer: still there
    assert routable(client, q)
    client.call(3, commands.Basic.Cancel(consumer_tag="keeper"), commands.Basic.CancelOk)
    cancelled = time.monotonic()
    assert 0.09 <= deleted_after(client, q, cancelled) < 1.0


@pytest.mark.parametrize("use", ["get", "redeclare", "passive-declare"])
def test_use_restarts_the_expiry_timer(
    client: RawClient, janitor: Janitor, name: str, use: str
) -> None:
    q = ttl_queue(client, janitor, name, **{"x-expires": 200})
    for _ in range(4):  # 400 ms in all, twice x-expires
        time.sleep(0.1)
        if use == "get":
            client.get(1, q)
        else:
            client.declare_queue(
                1, q, passive=use == "passive-declare", arguments={"x-expires": 200}
            )
    last_use = time.monotonic()
    assert routable(client, q)
    assert 0.19 <= deleted_after(client, q, last_use) < 1.0


def test_publishing_does_not_keep_a_queue_alive(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    start = time.monotonic()
    q = ttl_queue(client, janitor, name, **{"x-expires": 100})
    assert 0.09 <= deleted_after(client, q, start) < 1.0  # deleted_after publishes every 10 ms


def test_expired_queue_cancels_nothing_and_can_be_declared_again(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    start = time.monotonic()
    q = ttl_queue(client, janitor, name, **{"x-expires": 50})
    deleted_after(client, q, start)
    assert client.declare_queue(1, q, arguments={"x-expires": 50}, durable=True).message_count == 0


def test_get_skips_an_expired_head(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq)
    publish(client, q, b"old", properties=props(expiration="10"))
    publish(client, q, b"new")
    assert client.read_delivery(2).body == b"old"
    d = client.get(1, q, no_ack=True)
    assert d is not None and d.body == b"new"
    assert d.method.message_count == 0


def test_dead_lettered_copy_keeps_the_publisher_headers(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 10})
    publish(client, q, b"m", properties=props(headers={"app": "demo", "n": 7}, message_id="id-1"))
    d = client.read_delivery(2)
    headers = typed_headers(d)
    assert headers["app"] == ("S", "demo")
    assert d.properties.message_id == "id-1"


def test_declare_ok_counts_only_unexpired(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = ttl_queue(client, janitor, name, dlq, **{"x-message-ttl": 40})
    publish(client, q, b"1", b"2")
    for _ in range(2):
        client.read_delivery(2)
    ok = client.declare_queue(
        1, q, arguments={"x-message-ttl": 40, "x-dead-letter-exchange": dlq}, durable=True
    )
    assert ok.message_count == 0
