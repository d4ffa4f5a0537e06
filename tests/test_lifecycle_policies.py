"""Lifecycle policy keys and their precedence over queue arguments, as RabbitMQ applies them.

The module broker is RabbitMQ when WARREN_TEST_URL is set (policies through its
management API) and otherwise a Warren run in-process (policies set on its
vhost). Every test passes on both.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from amqp_raw import Janitor, RawClient
from lifecycle import (
    Policies,
    deaths,
    eventually,
    message_count,
    policy_broker,
    publish,
)
from pamqp import commands


@pytest.fixture(scope="module")
def policies() -> Iterator[Policies]:
    with policy_broker() as p:
        yield p


@pytest.fixture
def qname() -> str:
    return f"pol.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def janitor(policies: Policies) -> Iterator[Janitor]:
    j = Janitor(policies.addr)
    yield j
    j.clean()
    policies.clear_all()


@pytest.fixture
def client(policies: Policies) -> Iterator[RawClient]:
    c = RawClient.connect(policies.addr)
    yield c
    c.close()


@pytest.fixture
def dlq(client: RawClient, janitor: Janitor, qname: str) -> str:
    """A fanout dead-letter exchange, its queue consumed (no-ack) on channel 2."""
    exchange = janitor.exchange(f"{qname}.dlx")
    queue = janitor.queue(f"{qname}.dlq")
    client.declare_exchange(1, exchange, "fanout")
    client.declare_queue(1, queue, durable=True)
    client.bind_queue(1, queue, exchange)
    client.channel_open(2)
    client.consume(2, queue, consumer_tag="dlq", no_ack=True)
    return exchange


def declare(c: RawClient, janitor: Janitor, name: str, durable: bool = True, **args: Any) -> str:
    return str(c.declare_queue(1, janitor.queue(name), durable=durable, arguments=args).queue)


def only(name: str) -> str:
    return f"^{name.replace('.', '[.]')}$"


# -- message-ttl --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "policy"), [(None, 30), (60000, 30), (30, 60000)], ids=["policy", "p<a", "a<p"]
)
def test_message_ttl_smaller_of_argument_and_policy(
    policies: Policies,
    client: RawClient,
    janitor: Janitor,
    qname: str,
    dlq: str,
    argument: int | None,
    policy: int,
) -> None:
    policies.set(qname, only(qname), {"message-ttl": policy, "dead-letter-exchange": dlq})
    args = {} if argument is None else {"x-message-ttl": argument}
    q = declare(client, janitor, qname, **args)
    publish(client, q, b"m")
    (entry,) = deaths(client.read_delivery(2))  # expired after 30 ms, not 60 s
    assert entry["reason"] == ("S", "expired")


# -- length limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "policy"), [(None, 2), (5, 2), (2, 5)], ids=["policy", "p<a", "a<p"]
)
def test_max_length_smaller_of_argument_and_policy(
    policies: Policies,
    client: RawClient,
    janitor: Janitor,
    qname: str,
    argument: int | None,
    policy: int,
) -> None:
    policies.set(qname, only(qname), {"max-length": policy})
    args = {} if argument is None else {"x-max-length": argument}
    q = declare(client, janitor, qname, **args)
    publish(client, q, *[str(i).encode() for i in range(6)])
    assert client.drain(1, q) == [b"4", b"5"]


def test_max_length_bytes_policy(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    policies.set(qname, only(qname), {"max-length-bytes": 6})
    q = declare(client, janitor, qname, **{"x-max-length-bytes": 100})
    publish(client, q, b"aaa", b"bbb", b"ccc")
    assert client.drain(1, q) == [b"bbb", b"ccc"]


def test_overflow_argument_wins_over_policy(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    policies.set(qname, only(qname), {"max-length": 1, "overflow": "reject-publish"})
    q = declare(client, janitor, qname, **{"x-overflow": "drop-head"})
    assert publish(client, q, b"1", b"2") == {1: True, 2: True}
    assert client.drain(1, q) == [b"2"]


def test_overflow_policy(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    policies.set(qname, only(qname), {"max-length": 1, "overflow": "reject-publish"})
    q = declare(client, janitor, qname)
    assert publish(client, q, b"1", b"2") == {1: True, 2: False}
    assert client.drain(1, q) == [b"1"]


def test_max_length_policy_on_an_existing_queue_trims_it(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    q = declare(client, janitor, qname)
    publish(client, q, b"1", b"2", b"3", b"4")
    policies.set(qname, only(qname), {"max-length": 2})
    # RabbitMQ applies a policy to existing queues a moment later; Warren at once
    eventually(lambda: message_count(client, q) == 2, what="the queue trimmed to 2")
    assert client.drain(1, q) == [b"3", b"4"]


def test_cleared_policy_lifts_its_limit(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    policies.set(qname, only(qname), {"max-length": 1})
    q = declare(client, janitor, qname)
    publish(client, q, b"1", b"2")
    assert message_count(client, q) == 1
    policies.clear(qname)

    def grows() -> bool:
        before = message_count(client, q)
        publish(client, q, b"more")
        return message_count(client, q) > before

    eventually(grows, what="the limit lifted")


def test_highest_priority_policy_applies_alone(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    policies.set(f"{qname}.low", only(qname), {"max-length": 1}, priority=1)
    policies.set(f"{qname}.high", only(qname), {"max-length": 3}, priority=5)
    q = declare(client, janitor, qname)
    publish(client, q, *[str(i).encode() for i in range(5)])
    assert client.drain(1, q) == [b"2", b"3", b"4"]  # not combined: only the high one


def test_a_policy_change_moves_exactly_the_queues_it_concerns(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    # Warren re-evaluates only the queues the changed policy governed or now matches
    # (vhost._reapply_policies); each step checks a queue it should and one it should not move
    a = declare(client, janitor, f"{qname}.a")
    b = declare(client, janitor, f"{qname}.b")
    both = f"^{qname.replace('.', '[.]')}[.]"
    policies.set(f"{qname}.low", both, {"max-length": 1}, priority=1)
    policies.set(f"{qname}.high", only(a), {"max-length": 3}, priority=5)

    def holds(queue: str, limit: int) -> bool:
        publish(client, queue, *[b"m"] * 4)
        return message_count(client, queue) == limit

    eventually(lambda: holds(a, 3), what="a under the high policy")
    eventually(lambda: holds(b, 1), what="b under the low one")
    policies.clear(f"{qname}.high")  # the low one governs a again
    eventually(lambda: holds(a, 1), what="a back under the low policy")
    policies.set(f"{qname}.low", only(b), {"max-length": 2}, priority=1)  # moved off a
    eventually(lambda: holds(b, 2), what="b under the changed policy")

    def grows() -> bool:
        before = message_count(client, a)
        publish(client, a, b"m")
        return message_count(client, a) > before

    eventually(grows, what="a without a policy")


# -- dead-lettering -----------------------------------------------------------------------------


def test_dead_letter_exchange_and_routing_key_policy(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str
) -> None:
    target = declare(client, janitor, f"{qname}.target")
    policies.set(
        qname, only(qname), {"dead-letter-exchange": "", "dead-letter-routing-key": target}
    )
    q = declare(client, janitor, qname)
    publish(client, q, b"m")
    got = client.get(1, q)
    assert got is not None
    client.send_method(1, _reject(got.method.delivery_tag))
    client.channel_open(2)
    client.consume(2, target, consumer_tag="t", no_ack=True)
    d = client.read_delivery(2)
    assert (d.body, d.method.routing_key) == (b"m", target)


def test_dead_letter_exchange_argument_wins_over_policy(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str, dlq: str
) -> None:
    elsewhere = declare(client, janitor, f"{qname}.elsewhere")
    policies.set(
        qname, only(qname), {"dead-letter-exchange": "", "dead-letter-routing-key": elsewhere}
    )
    q = declare(client, janitor, qname, **{"x-dead-letter-exchange": dlq})
    publish(client, q, b"m")
    got = client.get(1, q)
    assert got is not None
    client.send_method(1, _reject(got.method.delivery_tag))
    assert client.read_delivery(2).body == b"m"
    assert message_count(client, elsewhere) == 0


def _reject(tag: int) -> Any:
    return commands.Basic.Reject(delivery_tag=tag, requeue=False)


# -- queue expiry -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "policy"), [(None, 100), (60000, 100), (100, 60000)], ids=["policy", "p<a", "a<p"]
)
def test_expires_smaller_of_argument_and_policy(
    policies: Policies,
    client: RawClient,
    janitor: Janitor,
    qname: str,
    argument: int | None,
    policy: int,
) -> None:
    policies.set(qname, only(qname), {"expires": policy})
    args = {} if argument is None else {"x-expires": argument}
    q = declare(client, janitor, qname, **args)
    start = time.monotonic()
    client.channel_open(4)
    client.confirm_select(4)
    while True:  # mandatory publishes until one comes back: the queue is gone
        client.publish(4, b"probe", routing_key=q, mandatory=True)
        client.wait_for_confirms(4)
        if client.pending:
            break
        assert time.monotonic() - start < 1.5, "the queue did not expire"
        time.sleep(0.01)
    assert time.monotonic() - start < 1.5


# -- delivery limit -----------------------------------------------------------------------------


@pytest.mark.parametrize(("argument", "policy"), [(5, 1), (1, 5)], ids=["p<a", "a<p"])
def test_delivery_limit_smaller_of_argument_and_policy(
    policies: Policies,
    client: RawClient,
    janitor: Janitor,
    qname: str,
    dlq: str,
    argument: int,
    policy: int,
) -> None:
    policies.set(qname, only(qname), {"delivery-limit": policy})
    q = declare(
        client,
        janitor,
        qname,
        durable=True,
        **{"x-queue-type": "quorum", "x-delivery-limit": argument, "x-dead-letter-exchange": dlq},
    )
    publish(client, q, b"poison")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    for _ in range(2):  # limit 1: the second failed delivery is past it
        d = client.read_delivery(3)
        # a reject counts, a nack does not (RabbitMQ 4.3, rabbit_channel.erl basic.reject)
        client.send_method(3, commands.Basic.Reject(delivery_tag=d.method.delivery_tag))
    (entry,) = deaths(client.read_delivery(2))
    assert entry["reason"] == ("S", "delivery_limit")


def test_policy_changes_delivery_limit_of_a_declared_queue(
    policies: Policies, client: RawClient, janitor: Janitor, qname: str, dlq: str
) -> None:
    """RabbitMQ 4.3, rabbit_quorum_queue.erl maybe_apply_policies/2: a policy whose
    delivery-limit differs from the running one is applied (policy_changed) at once."""
    q = declare(
        client, janitor, qname, durable=True,
        **{"x-queue-type": "quorum", "x-dead-letter-exchange": dlq},
    )  # fmt: skip
    publish(client, q, b"poison")
    client.channel_open(3)
    client.consume(3, q, consumer_tag="c")
    d = client.read_delivery(3)
    client.send_method(3, commands.Basic.Reject(delivery_tag=d.method.delivery_tag))
    d = client.read_delivery(3)  # count 1, within the default limit of 20
    policies.set(qname, only(qname), {"delivery-limit": 1})
    client.send_method(3, commands.Basic.Reject(delivery_tag=d.method.delivery_tag))
    (entry,) = deaths(client.read_delivery(2))  # count 2 > the policy's 1
    assert entry["reason"] == ("S", "delivery_limit")
