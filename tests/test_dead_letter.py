"""Dead-lettering: reasons, the exact headers of the copy, routing, cycles, missing exchanges.

Every test passes against RabbitMQ 3.10 too (WARREN_TEST_URL). RabbitMQ 3.10
does not yet write the ``x-last-death-*`` headers (3.13 does, and Warren does):
those are checked only when the broker under test is Warren. Table key order
is not compared (AMQP tables are unordered; RabbitMQ itself sorts some and not
others); types and values are.
"""

from __future__ import annotations

import datetime
import struct
import time
from collections.abc import Iterator

import pytest
from amqp_raw import Janitor, RawClient, fv, raw_table, shortstr
from lifecycle import (
    EXTERNAL,
    assert_recent_time,
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


def fanout(c: RawClient, janitor: Janitor, name: str, *queues: str) -> str:
    exchange = janitor.exchange(name)
    c.declare_exchange(1, exchange, "fanout")
    for q in queues:
        c.bind_queue(1, q, exchange)
    return exchange


def plain_queue(c: RawClient, janitor: Janitor, name: str, **arguments: object) -> str:
    return str(
        c.declare_queue(1, janitor.queue(name), arguments=dict(arguments), durable=True).queue
    )


def watch(c: RawClient, queue: str, channel: int, tag: str = "") -> None:
    """Consume ``queue`` on a new channel, no-ack."""
    c.channel_open(channel)
    c.consume(channel, queue, consumer_tag=tag or f"watch-{channel}", no_ack=True)


def reject(c: RawClient, channel: int, tag: int) -> None:
    c.send_method(channel, commands.Basic.Reject(delivery_tag=tag, requeue=False))


def first(reason: str, queue: str, exchange: str) -> dict[str, tuple[str, str]]:
    return {
        "x-first-death-reason": ("S", reason),
        "x-first-death-queue": ("S", queue),
        "x-first-death-exchange": ("S", exchange),
    }


def last(reason: str, queue: str, exchange: str) -> dict[str, tuple[str, str]]:
    if EXTERNAL:  # RabbitMQ 3.10 has no x-last-death-* headers
        return {}
    return {
        "x-last-death-reason": ("S", reason),
        "x-last-death-queue": ("S", queue),
        "x-last-death-exchange": ("S", exchange),
    }


# -- the copy of a rejected message ------------------------------------------------------


def test_rejected_copy_carries_exact_headers(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    original = props(
        content_type="application/json",
        headers={"app": "billing", "attempt": 1},
        delivery_mode=2,
        priority=3,
        correlation_id="corr-1",
        reply_to="replies",
        expiration="60000",
        message_id="msg-1",
        timestamp=datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC),
        message_type="invoice",
        app_id="tests",
    )
    publish(client, q, b'{"n": 1}', properties=original)
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    watch(client, dlq, 2)
    d = client.read_delivery(2)

    assert d.body == b'{"n": 1}'
    assert (d.method.exchange, d.method.routing_key, d.method.redelivered) == (dlx, q, False)
    p = d.properties
    assert p.expiration is None  # removed, kept as original-expiration
    for field in (
        "content_type",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "message_id",
        "timestamp",
        "message_type",
        "app_id",
    ):
        assert getattr(p, field) == getattr(original, field), field
    headers = typed_headers(d)
    (entry,) = deaths(d)
    assert_recent_time(entry)
    assert without_time(entry) == death_entry(
        queue=q, reason="rejected", exchange="", routing_keys=[q], original_expiration="60000"
    )
    assert set(entry) == {
        "count", "reason", "queue", "time", "exchange", "routing-keys", "original-expiration"
    }  # fmt: skip
    rest = {k: v for k, v in headers.items() if k != "x-death"}
    assert rest == {
        "app": ("S", "billing"),
        "attempt": headers["attempt"],  # the publisher's own integer, whatever width it chose
        **first("rejected", q, ""),
        **last("rejected", q, ""),
    }


def test_copy_of_message_without_expiration_has_no_original_expiration(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    publish(client, q, b"m")
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    watch(client, dlq, 2)
    (entry,) = deaths(client.read_delivery(2))
    assert "original-expiration" not in entry
    assert without_time(entry) == death_entry(
        queue=q, reason="rejected", exchange="", routing_keys=[q]
    )


def test_original_exchange_and_routing_key_recorded(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    src = janitor.exchange(f"{name}.src")
    client.declare_exchange(1, src, "topic")
    client.bind_queue(1, q, src, "orders.#")
    publish(client, "orders.eu.new", b"m", exchange=src)
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    watch(client, dlq, 2)
    d = client.read_delivery(2)
    assert d.method.routing_key == "orders.eu.new"  # the original key, no dead-letter key set
    (entry,) = deaths(d)
    assert without_time(entry) == death_entry(
        queue=q, reason="rejected", exchange=src, routing_keys=["orders.eu.new"]
    )
    assert typed_headers(d)["x-first-death-exchange"] == ("S", src)


def test_dead_letter_routing_key(client: RawClient, janitor: Janitor, name: str) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = janitor.exchange(f"{name}.dlx")
    client.declare_exchange(1, dlx, "direct")
    client.bind_queue(1, dlq, dlx, "dead")
    q = plain_queue(
        client,
        janitor,
        name,
        **{"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"},
    )
    publish(client, q, b"m")
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    watch(client, dlq, 2)
    d = client.read_delivery(2)
    assert (d.method.exchange, d.method.routing_key) == (dlx, "dead")
    (entry,) = deaths(d)
    assert entry["routing-keys"] == ("A", [("S", q)])  # still the key it was published with


def test_default_exchange_as_dead_letter_exchange(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    q = plain_queue(
        client, janitor, name, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    )
    publish(client, q, b"m")
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    watch(client, dlq, 2)
    d = client.read_delivery(2)
    assert (d.body, d.method.exchange, d.method.routing_key) == (b"m", "", dlq)


def test_nack_multiple_dead_letters_in_order(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    publish(client, q, b"1", b"2", b"3")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    tags = [client.read_delivery(3).method.delivery_tag for _ in range(3)]
    client.send_method(3, commands.Basic.Nack(delivery_tag=tags[-1], multiple=True, requeue=False))
    watch(client, dlq, 2)
    assert [client.read_delivery(2).body for _ in range(3)] == [b"1", b"2", b"3"]
    assert message_count(client, q) == 0


def test_requeue_does_not_dead_letter_and_copy_is_not_redelivered(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    publish(client, q, b"m")
    first = client.get(1, q)
    assert first is not None
    client.send_method(
        1, commands.Basic.Reject(delivery_tag=first.method.delivery_tag, requeue=True)
    )
    again = client.get(1, q)
    assert again is not None and again.method.redelivered
    assert message_count(client, dlq) == 0
    reject(client, 1, again.method.delivery_tag)
    watch(client, dlq, 2)
    d = client.read_delivery(2)
    assert not d.method.redelivered  # a new message in the dead-letter queue


# -- several deaths ----------------------------------------------------------------------------


def test_two_deaths_newest_first(client: RawClient, janitor: Janitor, name: str) -> None:
    final = plain_queue(client, janitor, f"{name}.final")
    second_dlx = fanout(client, janitor, f"{name}.dlx2", final)
    parking = plain_queue(
        client,
        janitor,
        f"{name}.parking",
        **{"x-message-ttl": 20, "x-dead-letter-exchange": second_dlx},
    )
    first_dlx = fanout(client, janitor, f"{name}.dlx1", parking)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": first_dlx})
    publish(client, q, b"m", properties=props(expiration="60000"))
    watch(client, final, 2)
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    d = client.read_delivery(2)
    newest, oldest = deaths(d)
    assert without_time(newest) == death_entry(
        queue=parking, reason="expired", exchange=first_dlx, routing_keys=[q]
    )
    assert without_time(oldest) == death_entry(
        queue=q, reason="rejected", exchange="", routing_keys=[q], original_expiration="60000"
    )
    rest = {k: v for k, v in typed_headers(d).items() if k != "x-death"}
    assert rest == {
        **first("rejected", q, ""),
        **last("expired", parking, first_dlx),
    }


def test_repeated_death_increments_count_keeps_first_time_and_moves_to_front(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    """RabbitMQ keeps one entry per (queue, reason): count + 1, the rest as it was."""
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    earlier = 1_000_000_000  # 2001: a time the broker would never write itself
    history = fv(
        "A",
        [
            fv(
                "F",
                raw_table(
                    [
                        ("count", fv("l", 1)),
                        ("reason", fv("S", "expired")),
                        ("queue", fv("S", "elsewhere")),
                        ("time", fv("T", earlier)),
                        ("exchange", fv("S", "ex0")),
                        ("routing-keys", fv("A", [fv("S", "rk0")])),
                    ]
                ),
            ),
            fv(
                "F",
                raw_table(
                    [
                        ("count", fv("l", 3)),
                        ("reason", fv("S", "rejected")),
                        ("queue", fv("S", q)),
                        ("time", fv("T", earlier)),
                        ("exchange", fv("S", "ex1")),
                        ("routing-keys", fv("A", [fv("S", "rk1")])),
                    ]
                ),
            ),
        ],
    )
    table = raw_table([("x-death", history), ("x-first-death-reason", fv("S", "expired"))])
    if 1 not in client.publish_seq:
        client.confirm_select(1)
    client.publish(1, b"m", routing_key=q, raw_header=_header_with_table(1, table))
    client.wait_for_confirms(1)
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    watch(client, dlq, 2)
    d = client.read_delivery(2)
    newest, other = deaths(d)
    assert newest == {
        "count": ("l", 4),
        "reason": ("S", "rejected"),
        "queue": ("S", q),
        "time": ("T", earlier),  # the time of the first such death is kept
        "exchange": ("S", "ex1"),
        "routing-keys": ("A", [("S", "rk1")]),
    }
    assert other == {
        "count": ("l", 1),
        "reason": ("S", "expired"),
        "queue": ("S", "elsewhere"),
        "time": ("T", earlier),
        "exchange": ("S", "ex0"),
        "routing-keys": ("A", [("S", "rk0")]),
    }
    headers = typed_headers(d)
    assert headers["x-first-death-reason"] == ("S", "expired")  # never overwritten
    if not EXTERNAL:
        assert headers["x-last-death-reason"] == ("S", "rejected")


def _header_with_table(body_size: int, table: bytes) -> bytes:
    return struct.pack(">HHQH", 60, 0, body_size, 0x2000) + table


# -- missing exchange ---------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["rejected", "expired", "maxlen"])
def test_missing_dead_letter_exchange_drops_silently(
    client: RawClient, janitor: Janitor, name: str, reason: str
) -> None:
    args: dict[str, object] = {"x-dead-letter-exchange": f"{name}.missing"}
    if reason == "expired":
        args["x-message-ttl"] = 10
    if reason == "maxlen":
        args["x-max-length"] = 1
    q = plain_queue(client, janitor, name, **args)
    publish(client, q, b"1", b"2")
    if reason == "rejected":
        got = client.get(1, q)
        assert got is not None
        reject(client, 1, got.method.delivery_tag)
    else:
        time.sleep(0.05)
    expected = {"rejected": 1, "expired": 0, "maxlen": 1}[reason]
    assert message_count(client, q) == expected  # the channel is fine, no error either
    client.assert_silent(0.05)


def test_dead_letter_exchange_deleted_later(client: RawClient, janitor: Janitor, name: str) -> None:
    dlq = plain_queue(client, janitor, f"{name}.dlq")
    dlx = fanout(client, janitor, f"{name}.dlx", dlq)
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    publish(client, q, b"m")
    client.delete_exchange(1, dlx)
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    assert message_count(client, q) == 0
    assert message_count(client, dlq) == 0


def test_unroutable_dead_letter_is_dropped(client: RawClient, janitor: Janitor, name: str) -> None:
    dlx = janitor.exchange(f"{name}.dlx")
    client.declare_exchange(1, dlx, "direct")  # nothing bound
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": dlx})
    publish(client, q, b"m")
    got = client.get(1, q)
    assert got is not None
    reject(client, 1, got.method.delivery_tag)
    assert message_count(client, q) == 0
    client.assert_silent(0.05)


# -- cycles -------------------------------------------------------------------------------------


def test_expiry_cycle_through_itself_is_dropped(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    """q expires into an exchange that routes back to q (and to a watcher): q's copy is dropped."""
    watcher = plain_queue(client, janitor, f"{name}.watch")
    dlx = janitor.exchange(f"{name}.dlx")
    client.declare_exchange(1, dlx, "fanout")
    q = plain_queue(client, janitor, name, **{"x-message-ttl": 20, "x-dead-letter-exchange": dlx})
    client.bind_queue(1, q, dlx)
    client.bind_queue(1, watcher, dlx)
    watch(client, watcher, 2)
    publish(client, q, b"m")
    d = client.read_delivery(2)
    assert len(deaths(d)) == 1
    client.assert_silent(0.2)  # no second round: the copy for q itself was dropped
    assert message_count(client, q) == 0


def test_expiry_cycle_of_two_queues_is_dropped(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    watcher = plain_queue(client, janitor, f"{name}.watch")
    ex_a = janitor.exchange(f"{name}.a")
    ex_b = janitor.exchange(f"{name}.b")
    for ex in (ex_a, ex_b):
        client.declare_exchange(1, ex, "fanout")
    q1 = plain_queue(
        client, janitor, f"{name}.1", **{"x-message-ttl": 20, "x-dead-letter-exchange": ex_a}
    )
    q2 = plain_queue(
        client, janitor, f"{name}.2", **{"x-message-ttl": 20, "x-dead-letter-exchange": ex_b}
    )
    for ex, q in ((ex_a, q2), (ex_b, q1), (ex_a, watcher), (ex_b, watcher)):
        client.bind_queue(1, q, ex)
    watch(client, watcher, 2)
    publish(client, q1, b"m")
    first, second = client.read_delivery(2), client.read_delivery(2)
    assert [plain_queue_of(e) for e in deaths(first)] == [q1]
    assert [plain_queue_of(e) for e in deaths(second)] == [q2, q1]
    client.assert_silent(0.2)
    assert message_count(client, q1) == message_count(client, q2) == 0


def plain_queue_of(entry: dict[str, tuple[str, object]]) -> object:
    return entry["queue"][1]


def test_cycle_with_a_rejection_goes_on(client: RawClient, janitor: Janitor, name: str) -> None:
    """The retry pattern: rejected into a parking queue whose TTL sends it back."""
    ex_park = janitor.exchange(f"{name}.park")
    ex_back = janitor.exchange(f"{name}.back")
    for ex in (ex_park, ex_back):
        client.declare_exchange(1, ex, "fanout")
    q = plain_queue(client, janitor, name, **{"x-dead-letter-exchange": ex_park})
    parking = plain_queue(
        client,
        janitor,
        f"{name}.parking",
        **{"x-message-ttl": 20, "x-dead-letter-exchange": ex_back},
    )
    client.bind_queue(1, parking, ex_park)
    client.bind_queue(1, q, ex_back)
    client.channel_open(3)
    client.consume(3, q, consumer_tag="worker")
    publish(client, q, b"job")
    for attempt in range(1, 4):
        d = client.read_delivery(3)
        if attempt == 1:
            assert "x-death" not in typed_headers(d)
        else:
            newest, oldest = deaths(d)
            assert (newest["queue"], newest["reason"], newest["count"]) == (
                ("S", parking),
                ("S", "expired"),
                ("l", attempt - 1),
            )
            assert (oldest["queue"], oldest["reason"], oldest["count"]) == (
                ("S", q),
                ("S", "rejected"),
                ("l", attempt - 1),
            )
        reject(client, 3, d.method.delivery_tag)
    client.read_delivery(3)  # and so on while the consumer keeps rejecting


def test_maxlen_cycle_is_dropped(client: RawClient, janitor: Janitor, name: str) -> None:
    """drop-head into an exchange routing back to the same queue: dropped, no loop."""
    dlx = janitor.exchange(f"{name}.dlx")
    client.declare_exchange(1, dlx, "fanout")
    q = plain_queue(client, janitor, name, **{"x-max-length": 1, "x-dead-letter-exchange": dlx})
    client.bind_queue(1, q, dlx)
    publish(client, q, b"1", b"2")
    assert message_count(client, q) == 1
    d = client.get(1, q, no_ack=True)
    assert d is not None and d.body == b"2"


# -- validation ---------------------------------------------------------------------------------


def test_dead_letter_routing_key_without_exchange_refused(client: RawClient, name: str) -> None:
    assert declare_refused(client, name, {"x-dead-letter-routing-key": "k"}) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{name}' "
        "in vhost '/': routing_key_but_no_dlx_defined",
        50,
        10,
    )
    assert not queue_exists(client, name)


@pytest.mark.parametrize(
    ("value", "type_name"), [(fv("l", 5), "long"), (fv("t", 1), "bool")], ids=["long", "bool"]
)
def test_dead_letter_exchange_of_wrong_type_refused(
    client: RawClient, name: str, value: bytes, type_name: str
) -> None:
    table = raw_table([("x-dead-letter-exchange", value)])
    client.send_method_raw(1, 50, 10, b"\x00\x00" + shortstr(name) + b"\x00" + table)
    assert expect_close(client) == (
        406,
        f"PRECONDITION_FAILED - invalid type '{type_name}' for arg 'x-dead-letter-exchange' "
        f"in queue '{name}' in vhost '/'",
        50,
        10,
    )
    assert not queue_exists(client, name)
