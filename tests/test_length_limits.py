"""Length limits: x-max-length, x-max-length-bytes and the three x-overflow behaviours.

Every test passes against RabbitMQ 3.10 too (WARREN_TEST_URL), except where a
Warren-only detail is guarded with ``EXTERNAL``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Janitor, RawClient
from lifecycle import (
    EXTERNAL,
    death_entry,
    deaths,
    declare_refused,
    message_count,
    props,
    publish,
    queue_exists,
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
    """A fanout dead-letter exchange, its queue consumed (no-ack) on channel 2."""
    exchange = janitor.exchange(f"{name}.dlx")
    queue = janitor.queue(f"{name}.dlq")
    client.declare_exchange(1, exchange, "fanout")
    client.declare_queue(1, queue, durable=True)
    client.bind_queue(1, queue, exchange)
    client.channel_open(2)
    client.consume(2, queue, consumer_tag="dlq", no_ack=True)
    return exchange


def limited(c: RawClient, janitor: Janitor, name: str, **arguments: Any) -> str:
    return str(
        c.declare_queue(1, janitor.queue(name), arguments=dict(arguments), durable=True).queue
    )


# -- drop-head --------------------------------------------------------------------------------


@pytest.mark.parametrize("explicit", [False, True], ids=["default", "x-overflow"])
def test_drop_head_dead_letters_the_oldest(
    client: RawClient, janitor: Janitor, name: str, dlq: str, explicit: bool
) -> None:
    args: dict[str, Any] = {"x-max-length": 2, "x-dead-letter-exchange": dlq}
    if explicit:
        args["x-overflow"] = "drop-head"
    q = limited(client, janitor, name, **args)
    acks = publish(client, q, b"1", b"2", b"3", b"4")
    assert all(acks.values())  # drop-head never refuses a publish
    dropped = [client.read_delivery(2) for _ in range(2)]
    assert [d.body for d in dropped] == [b"1", b"2"]
    for d in dropped:
        (entry,) = deaths(d)
        assert without_time(entry) == death_entry(
            queue=q, reason="maxlen", exchange="", routing_keys=[q]
        )
    assert message_count(client, q) == 2
    assert client.drain(1, q) == [b"3", b"4"]


def test_max_length_bytes_counts_bodies_only(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = limited(client, janitor, name, **{"x-max-length-bytes": 10})
    big_headers = props(headers={"padding": "x" * 1000}, message_id="m" * 200)
    publish(client, q, b"aaaa", b"bbbb", properties=big_headers)  # 8 body bytes: both fit
    assert message_count(client, q) == 2
    publish(client, q, b"cccc", properties=big_headers)  # 12 > 10: the oldest goes
    assert client.drain(1, q) == [b"bbbb", b"cccc"]


def test_message_bigger_than_max_length_bytes_is_dropped(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = limited(client, janitor, name, **{"x-max-length-bytes": 10, "x-dead-letter-exchange": dlq})
    publish(client, q, b"small")
    publish(client, q, b"far too big")
    # the big one alone is over the limit: both go, oldest first
    assert [client.read_delivery(2).body for _ in range(2)] == [b"small", b"far too big"]
    assert message_count(client, q) == 0


def test_unacked_messages_do_not_count(client: RawClient, janitor: Janitor, name: str) -> None:
    q = limited(client, janitor, name, **{"x-max-length": 1})
    publish(client, q, b"held")
    held = client.get(1, q)
    assert held is not None
    publish(client, q, b"2", b"3")
    assert client.drain(1, q) == [b"3"]
    client.ack(1, held.method.delivery_tag)
    assert message_count(client, q) == 0  # the ack was fine: the held message was never dropped


def test_max_length_zero_goes_to_a_waiting_consumer(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    """RabbitMQ hands a message to a consumer that can take it before applying the limit."""
    q = limited(client, janitor, name, **{"x-max-length": 0, "x-dead-letter-exchange": dlq})
    publish(client, q, b"dropped")
    assert client.read_delivery(2).body == b"dropped"  # nobody to take it: dead-lettered at once
    client.channel_open(3)
    client.consume(3, q, consumer_tag="ready", no_ack=True)
    publish(client, q, b"taken")
    assert client.read_delivery(3).body == b"taken"
    client.assert_silent(0.1)


# -- reject-publish -----------------------------------------------------------------------------


def test_reject_publish_nacks_confirmed_publishes(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = limited(
        client,
        janitor,
        name,
        **{"x-max-length": 2, "x-overflow": "reject-publish", "x-dead-letter-exchange": dlq},
    )
    confirms = publish(client, q, b"1", b"2", b"3", b"4")
    assert confirms == {1: True, 2: True, 3: False, 4: False}
    client.assert_silent(0.1)  # refused, not dead-lettered
    assert client.drain(1, q) == [b"1", b"2"]
    assert publish(client, q, b"5") == {5: True}  # room again


def test_reject_publish_without_confirms_drops_silently(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = limited(client, janitor, name, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    for body in (b"1", b"2", b"3"):
        client.publish(1, body, routing_key=q, mandatory=True)
    assert message_count(client, q) == 1  # the channel is open, nothing was returned
    client.assert_silent(0.05)
    assert client.drain(1, q) == [b"1"]


def test_reject_publish_by_bytes(client: RawClient, janitor: Janitor, name: str) -> None:
    q = limited(client, janitor, name, **{"x-max-length-bytes": 8, "x-overflow": "reject-publish"})
    assert publish(client, q, b"1234", b"5678", b"9") == {1: True, 2: True, 3: False}


def test_reject_publish_nacks_when_any_queue_refuses(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    full = limited(
        client, janitor, f"{name}.full", **{"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    roomy = limited(client, janitor, f"{name}.roomy")
    fan = janitor.exchange(f"{name}.fan")
    client.declare_exchange(1, fan, "fanout")
    client.bind_queue(1, full, fan)
    client.bind_queue(1, roomy, fan)
    assert publish(client, "", b"m", exchange=fan) == {1: False}
    assert client.drain(1, roomy) == [b"m"]  # the other queue still has it


def test_reject_publish_with_zero_limit_refuses_even_with_a_consumer(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = limited(client, janitor, name, **{"x-max-length": 0, "x-overflow": "reject-publish"})
    client.channel_open(3)
    client.consume(3, q, consumer_tag="ready", no_ack=True)
    assert publish(client, q, b"m") == {1: False}
    client.assert_silent(0.05)


def test_reject_publish_dlx_nacks_and_dead_letters(
    client: RawClient, janitor: Janitor, name: str, dlq: str
) -> None:
    q = limited(
        client,
        janitor,
        name,
        **{"x-max-length": 1, "x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlq},
    )
    assert publish(client, q, b"kept", b"refused") == {1: True, 2: False}
    d = client.read_delivery(2)
    assert d.body == b"refused"
    (entry,) = deaths(d)
    assert without_time(entry) == death_entry(
        queue=q, reason="maxlen", exchange="", routing_keys=[q]
    )
    assert client.drain(1, q) == [b"kept"]


# -- validation ---------------------------------------------------------------------------------


def invalid_arg(arg: str, queue: str) -> str:
    return f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{queue}' in vhost '/': "


@pytest.mark.parametrize(
    ("args", "detail"),
    [
        ({"x-max-length": "ten"}, '"expected integer, got longstr"'),
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-max-length-bytes": -2}, "{value_negative,-2}"),
        ({"x-max-length-bytes": "1kb"}, '"expected integer, got longstr"'),
    ],
    ids=["length-string", "length-negative", "bytes-negative", "bytes-string"],
)
def test_limit_arguments_refused(
    client: RawClient, name: str, args: dict[str, Any], detail: str
) -> None:
    (arg,) = args
    assert declare_refused(client, name, args) == (406, invalid_arg(arg, name) + detail, 50, 10)
    assert not queue_exists(client, name)


def test_overflow_argument_refused(client: RawClient, name: str) -> None:
    code, text, class_id, method_id = declare_refused(client, name, {"x-overflow": "drop-tail"})
    assert (code, class_id, method_id) == (406, 50, 10)
    assert text.startswith(invalid_arg("x-overflow", name)), text
    if not EXTERNAL:  # RabbitMQ only says invalid_overflow; Warren names the value
        assert "drop-tail" in text, text
    assert not queue_exists(client, name)


def test_reject_publish_mandatory_is_not_returned(
    client: RawClient, janitor: Janitor, name: str
) -> None:
    q = limited(client, janitor, name, **{"x-max-length": 0, "x-overflow": "reject-publish"})
    client.confirm_select(1)
    client.publish(1, b"m", routing_key=q, mandatory=True)
    assert client.wait_for_confirms(1) == {1: False}
    assert not any(
        f.type == 1 and isinstance(f.method(), commands.Basic.Return) for f in client.pending
    )
