"""Sender-selected distribution: the CC and BCC headers add routing keys (RabbitMQ's doc of
that name). RabbitMQ 4.3 reads them in rabbit_basic.erl (header_routes: arrays, their
longstr elements only, any other type refused) and drops BCC on arrival (mc_amqpl.erl,
init/1 strips it). Every test passes against RabbitMQ 3.10 too (WARREN_TEST_URL), except
where a comment says 4.3 differs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from http_api import HttpApi
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from warren.broker.testkit import run_broker

Props = pika.BasicProperties


@pytest.fixture
def conn(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(pika.URLParameters(amqp_url))
    yield c
    if c.is_open:
        c.close()


@pytest.fixture
def channel(conn: pika.BlockingConnection) -> BlockingChannel:
    return conn.channel()


def declare(ch: BlockingChannel, name: str, *suffixes: str, **arguments: Any) -> list[str]:
    names = [f"{name}.{s}" for s in suffixes]
    for queue in names:
        ch.queue_declare(queue, durable=True, auto_delete=True, arguments=arguments or None)
    return names


def drain(ch: BlockingChannel, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    """Every ready message of ``queue``: (body, headers)."""
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, dict(props.headers or {})))


def wait_one(ch: BlockingChannel, queue: str) -> tuple[bytes, dict[str, Any]]:
    """The next message of ``queue``; RabbitMQ dead-letters asynchronously, so wait for it."""
    for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=2):
        ch.cancel()
        assert method is not None, f"nothing reached {queue}"
        return body, dict(props.headers or {})
    raise AssertionError("unreachable")


def headers(cc: list[Any] | None = None, bcc: list[Any] | None = None, **more: Any) -> Props:
    table: dict[str, Any] = dict(more)
    if cc is not None:
        table["CC"] = cc
    if bcc is not None:
        table["BCC"] = bcc
    return Props(headers=table)


def test_direct_cc_and_bcc_route_and_bcc_is_removed(channel: BlockingChannel, name: str) -> None:
    a, b, c = declare(channel, name, "a", "b", "c")
    channel.exchange_declare(name, "direct", auto_delete=True)
    for queue in (a, b, c):
        channel.queue_bind(queue, name, queue)
    channel.basic_publish(name, a, b"m", headers(cc=[b], bcc=[c], keep="yes"))
    for queue in (a, b, c):
        assert drain(channel, queue) == [(b"m", {"keep": "yes", "CC": [b]})]


def test_queue_reached_by_several_keys_gets_one_copy(channel: BlockingChannel, name: str) -> None:
    (q,) = declare(channel, name, "q")
    channel.exchange_declare(name, "direct", auto_delete=True)
    for key in ("k1", "k2", "k3"):
        channel.queue_bind(q, name, key)
    channel.basic_publish(name, "k1", b"m", headers(cc=["k2", "k2"], bcc=["k3"]))
    assert [body for body, _ in drain(channel, q)] == [b"m"]


def test_default_exchange_cc_names_queues(channel: BlockingChannel, name: str) -> None:
    a, b = declare(channel, name, "a", "b")
    channel.basic_publish("", a, b"m", headers(bcc=[b, f"{name}.missing"]))
    assert drain(channel, a) == [(b"m", {})]
    assert drain(channel, b) == [(b"m", {})]


def test_topic_exchange_matches_each_key(channel: BlockingChannel, name: str) -> None:
    a, b = declare(channel, name, "a", "b")
    channel.exchange_declare(name, "topic", auto_delete=True)
    channel.queue_bind(a, name, "orders.*")
    channel.queue_bind(b, name, "#.audit")
    channel.basic_publish(name, "nothing", b"m", headers(cc=["orders.eu", "x.audit"]))
    assert len(drain(channel, a)) == 1
    assert len(drain(channel, b)) == 1


def test_fanout_and_headers_deliver_once(channel: BlockingChannel, name: str) -> None:
    a, b = declare(channel, name, "a", "b")
    channel.exchange_declare(f"{name}.f", "fanout", auto_delete=True)
    channel.queue_bind(a, f"{name}.f")
    channel.exchange_declare(f"{name}.h", "headers", auto_delete=True)
    channel.queue_bind(b, f"{name}.h", arguments={"x-match": "any", "keep": "yes"})
    for exchange in (f"{name}.f", f"{name}.h"):
        channel.basic_publish(exchange, "k", b"m", headers(cc=["x", "y"], bcc=["z"], keep="yes"))
    assert len(drain(channel, a)) == 1
    assert len(drain(channel, b)) == 1


def test_only_string_elements_are_keys(channel: BlockingChannel, name: str) -> None:
    a, b = declare(channel, name, "a", "b")
    channel.basic_publish("", a, b"m", headers(cc=[5, b, True, {"x": 1}]))
    assert len(drain(channel, a)) == 1
    assert len(drain(channel, b)) == 1


@pytest.mark.parametrize(
    ("table", "detail"),
    [
        ({"CC": "one-key"}, '{unacceptable_type_in_header,"CC",longstr}'),
        ({"CC": ["ok"], "BCC": 7}, '{unacceptable_type_in_header,"BCC",signedint}'),
        ({"BCC": {"a": 1}}, '{unacceptable_type_in_header,"BCC",table}'),
    ],
)
def test_non_array_header_is_refused(
    channel: BlockingChannel, name: str, table: dict[str, Any], detail: str
) -> None:
    (a,) = declare(channel, name, "a")
    channel.basic_publish("", a, b"m", Props(headers=table))
    with pytest.raises(ChannelClosedByBroker) as closed:
        channel.basic_get(a)
    assert (closed.value.reply_code, closed.value.reply_text) == (
        406,
        f"PRECONDITION_FAILED - invalid message: {detail}",
    )


def test_mandatory_and_confirms_count_every_key(channel: BlockingChannel, name: str) -> None:
    (a,) = declare(channel, name, "a")
    channel.confirm_delivery()
    channel.basic_publish("", "no-such", b"cc", headers(cc=[a]), mandatory=True)  # acked
    with pytest.raises(UnroutableError) as unroutable:
        channel.basic_publish("", "no-such", b"none", headers(cc=["x"], bcc=["y"]), mandatory=True)
    [returned] = unroutable.value.messages
    assert (returned.body, returned.properties.headers) == (b"none", {"CC": ["x"]})
    assert drain(channel, a) == [(b"cc", {"CC": [a]})]


def test_alternate_exchange_only_when_no_key_routes(channel: BlockingChannel, name: str) -> None:
    a, alt = declare(channel, name, "a", "alt")
    channel.exchange_declare(f"{name}.ae", "fanout", auto_delete=True)
    channel.queue_bind(alt, f"{name}.ae")
    channel.exchange_declare(
        name, "direct", auto_delete=True, arguments={"alternate-exchange": f"{name}.ae"}
    )
    channel.queue_bind(a, name, "k")
    channel.basic_publish(name, "x", b"cc-routes", headers(cc=["k"]))
    channel.basic_publish(name, "x", b"none-routes", headers(cc=["y"], bcc=["z"]))
    assert [body for body, _ in drain(channel, a)] == [b"cc-routes"]
    assert [body for body, _ in drain(channel, alt)] == [b"none-routes"]


def test_exchange_to_exchange_follows_every_key(channel: BlockingChannel, name: str) -> None:
    (a,) = declare(channel, name, "a")
    inner = f"{name}.inner"
    channel.exchange_declare(name, "direct", auto_delete=True)
    channel.exchange_declare(inner, "direct", auto_delete=True)
    channel.exchange_bind(inner, name, "via")
    channel.queue_bind(a, inner, "via")
    channel.basic_publish(name, "x", b"m", headers(bcc=["via"]))
    assert len(drain(channel, a)) == 1


def dead_letter_setup(ch: BlockingChannel, name: str, **dl: Any) -> tuple[str, list[str]]:
    targets = declare(ch, name, "k", "c", "b", "dlrk")
    dlx = f"{name}.dlx"
    ch.exchange_declare(dlx, "direct", auto_delete=True)
    for queue in targets:
        ch.queue_bind(queue, dlx, queue.rsplit(".", 1)[1])
    (source,) = declare(
        ch, name, "src", **{"x-message-ttl": 0, "x-dead-letter-exchange": dlx, **dl}
    )
    return source, targets


def test_dead_letter_routes_by_every_key_and_records_cc(
    channel: BlockingChannel, name: str
) -> None:
    """rabbit_dead_letter.erl (4.3): no dead-letter routing key, so the message's own routing
    keys, BCC's included; mc.erl record_death: x-death's routing-keys leave BCC out."""
    source, (k, c, b, dlrk) = dead_letter_setup(channel, name)
    channel.basic_publish("", source, b"m", headers(cc=["c"], bcc=["b"]))
    for queue in (c, b):
        body, got = wait_one(channel, queue)
        assert body == b"m"
        assert got["CC"] == ["c"] and "BCC" not in got
        assert got["x-death"][0]["routing-keys"] == [source, "c"]
    assert drain(channel, k) == [] and drain(channel, dlrk) == []


def test_dead_letter_routing_key_replaces_every_key(channel: BlockingChannel, name: str) -> None:
    source, (k, c, b, dlrk) = dead_letter_setup(
        channel, name, **{"x-dead-letter-routing-key": "dlrk"}
    )
    channel.basic_publish("", source, b"m", headers(cc=["c", "k"], bcc=["b"]))
    assert wait_one(channel, dlrk)[0] == b"m"
    assert drain(channel, k) == [] and drain(channel, c) == [] and drain(channel, b) == []


def test_messages_without_cc_pay_nothing_visible(channel: BlockingChannel, name: str) -> None:
    """A header that merely mentions CC (another key, a value) routes nothing extra."""
    a, b = declare(channel, name, "a", "b")
    channel.basic_publish("", a, b"m", headers(note="CC", ACC=[b], bcc_like=[b]))
    assert len(drain(channel, a)) == 1
    assert drain(channel, b) == []


def test_firehose_names_every_routing_key(tmp_path: Path) -> None:
    """rabbit_trace.erl (4.3): routing_keys is mc:routing_keys/1, CC's and BCC's included."""
    with run_broker(trace_enabled=True, trace_dir=str(tmp_path / "trace")) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("sink", durable=True)
        ch.queue_bind("sink", "amq.rabbitmq.trace", "publish.#")
        ch.basic_publish("", "rk", b"m", headers(cc=["c1", "c2"], bcc=["b1"]))
        _, props = wait_one(ch, "sink")
        assert props["routing_keys"] == ["rk", "c1", "c2", "b1"]
        assert props["properties"]["headers"] == {"CC": ["c1", "c2"]}
        conn.close()


def test_management_publish_routes_by_cc_and_bcc() -> None:
    with run_broker(management_port=0) as broker:
        assert broker.server.management_port is not None
        api = HttpApi(broker.server.management_port)
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        a, b, c = declare(ch, "api", "a", "b", "c")
        body = {"routing_key": a, "payload": "m", "payload_encoding": "string"}
        table = {"CC": [b], "BCC": [c]}
        assert api.ok(
            "POST",
            "/api/exchanges/%2F/amq.default/publish",
            {**body, "properties": {"headers": table}},
        ) == {"routed": True}
        for queue in (a, b, c):
            assert drain(ch, queue) == [(b"m", {"CC": [b]})]
        conn.close()
