"""Exchange types from RabbitMQ's plugins and 4.x core: consistent hash, modulus hash,
local random, delayed message (broker/engine/exchange_plugins.py, docs/plugin-exchanges.md)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.http_api import HttpApi, q
from tests.test_durability import free_port, start_server
from warren.broker.engine.erlang_hash import jump_consistent_hash, phash2
from warren.broker.testkit import RunningBroker, run_broker

Channel = pika.adapters.blocking_connection.BlockingChannel

# Computed with Erlang/OTP 25 (erl -eval 'erlang:phash2(...)', rand:seed_s(exs1024, ...)):
# key, phash2(key), phash2([key]), jump(phash2(key), 7), jump(phash2(key), 1000)
ERLANG_VECTORS = [
    (b"", 13708901, 38220213, 6, 161),
    (b"a", 112802447, 53691870, 6, 47),
    (b"abc", 98228475, 63525141, 5, 543),
    (b"hello world!", 25699699, 124688779, 6, 597),
    (b"0123456789abcdefXYZ", 106687168, 89469454, 3, 274),
    (b"order.42", 113463079, 28628389, 3, 366),
]

# Routed by RabbitMQ 3.10.8 with rabbitmq_consistent_hash_exchange, queues bound in the
# order a (weight 1), b (2), c (3); 4.x hashes the routing key the same way.
RABBITMQ_RING = {
    "": "a", "a": "b", "abc": "c", "hello world!": "a", "order.42": "c",
    "user-0": "b", "user-1": "b", "user-2": "c", "user-3": "c", "user-4": "b",
    "user-5": "c", "user-6": "c", "user-7": "b", "user-8": "b", "user-9": "c",
    "user-10": "c", "user-11": "b", "user-12": "c", "user-13": "b", "user-14": "b",
}  # fmt: skip
# the same broker and queues, hash-property message_id, message_id "id-<i>"
RABBITMQ_BY_MESSAGE_ID = ["b", "c", "b", "a", "a", "c", "b", "c", "b", "c"]


@pytest.fixture
def conn(amqp_url: str) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    yield connection
    if connection.is_open:
        connection.close()


def drain(ch: Channel, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def bind_queues(ch: Channel, exchange: str, prefix: str, keys: list[str]) -> list[str]:
    names = []
    for letter, key in zip("abcdefgh", keys, strict=False):
        queue = f"{prefix}.{letter}"
        ch.queue_declare(queue, auto_delete=False, exclusive=True)
        ch.queue_bind(queue, exchange, key)
        names.append(queue)
    return names


def where(ch: Channel, queues: list[str]) -> dict[str, str]:
    ch.queue_declare(queues[0], passive=True)  # the publishes before it are routed
    return {body.decode(): queue[-1] for queue in queues for body in drain(ch, queue)}


def closed_with(exc: pytest.ExceptionInfo[Any]) -> tuple[int, str]:
    return exc.value.args[0], exc.value.args[1]


# ---- Erlang's hash and RNG ----


def test_phash2_and_jump_hash_match_erlang_vectors() -> None:
    for key, hashed, hashed_list, jump7, jump1000 in ERLANG_VECTORS:
        assert phash2(key) == hashed
        assert phash2([key]) == hashed_list
        assert jump_consistent_hash(hashed, 7) == jump7
        assert jump_consistent_hash(hashed, 1000) == jump1000
    assert phash2(None) == 45914356  # erlang:phash2(undefined)
    assert phash2([b"a", b"b"]) == 3094894


# ---- x-consistent-hash ----


def test_consistent_hash_sends_each_key_where_rabbitmq_does(
    conn: pika.BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-consistent-hash", auto_delete=True)
    queues = bind_queues(ch, name, name, ["1", "2", "3"])
    for key in RABBITMQ_RING:
        ch.basic_publish(name, key, key.encode())
    assert where(ch, queues) == RABBITMQ_RING
    ch.queue_unbind(queues[2], name, "3")  # the ring shrinks to a, b, b: routes follow
    for key in RABBITMQ_RING:
        ch.basic_publish(name, key, key.encode())
    ring = "abb"
    assert where(ch, queues) == {
        key: ring[jump_consistent_hash(phash2(key.encode()), 3)] for key in RABBITMQ_RING
    }


def test_consistent_hash_on_a_property(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(
        name, "x-consistent-hash", auto_delete=True, arguments={"hash-property": "message_id"}
    )
    queues = bind_queues(ch, name, name, ["1", "2", "3"])
    for i in range(10):
        ch.basic_publish(name, "same", b"m%d" % i, pika.BasicProperties(message_id=f"id-{i}"))
    got = where(ch, queues)
    assert [got[f"m{i}"] for i in range(10)] == RABBITMQ_BY_MESSAGE_ID


def test_consistent_hash_on_a_header(conn: pika.BlockingConnection, name: str) -> None:
    """4.x hashes the header's value (3.10 hashed its {type, value} pair: 4.3 wins,
    rabbit_exchange_type_consistent_hash:value_to_hash/2); integers seed the RNG as they are."""
    ch = conn.channel()
    ch.exchange_declare(name, "x-consistent-hash", auto_delete=True, arguments={"hash-header": "k"})
    queues = bind_queues(ch, name, name, ["1", "2", "3"])
    ring = ["a", "b", "b", "c", "c", "c"]
    values: list[Any] = ["order.42", "abc", 7, 123456]
    for i, value in enumerate(values):
        ch.basic_publish(name, "ignored", b"%d" % i, pika.BasicProperties(headers={"k": value}))
    ch.basic_publish(name, "ignored", b"none")
    got = where(ch, queues)
    for i, value in enumerate(values):
        key = value if isinstance(value, int) else phash2(value.encode())
        assert got[str(i)] == ring[jump_consistent_hash(key, 6)]
    assert got["none"] == ring[jump_consistent_hash(phash2(None), 6)]


def test_consistent_hash_weights_are_proportional(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-consistent-hash", auto_delete=True)
    queues = bind_queues(ch, name, name, ["1", "3"])
    for i in range(2000):
        ch.basic_publish(name, f"k{i}", b"")
    light = ch.queue_declare(queues[0], passive=True).method.message_count
    heavy = ch.queue_declare(queues[1], passive=True).method.message_count
    assert light + heavy == 2000
    assert 0.2 < light / 2000 < 0.3


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("abc", 'PRECONDITION_FAILED - The binding key must be an integer: <<"abc">>'),
        ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
        ("-1", "PRECONDITION_FAILED - The binding key must be greater than 0"),
        # 4.x: rabbit_exchange_type_consistent_hash:validate_binding/2, MAX_BINDING_WEIGHT
        ("10001", "PRECONDITION_FAILED - The binding key must not exceed 10000"),
    ],
)
def test_consistent_hash_bad_weight(
    conn: pika.BlockingConnection, name: str, key: str, text: str
) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-consistent-hash", auto_delete=True)
    ch.queue_declare(name, exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_bind(name, name, key)
    assert closed_with(exc) == (406, text)


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"hash-header": "h", "hash-property": "message_id"},
         "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive"),
        ({"hash-property": "type"}, "PRECONDITION_FAILED - Unsupported property: type"),
    ],
)  # fmt: skip
def test_consistent_hash_bad_arguments(
    conn: pika.BlockingConnection, name: str, arguments: dict[str, Any], text: str
) -> None:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.exchange_declare(name, "x-consistent-hash", arguments=arguments)
    assert closed_with(exc) == (406, text)


# ---- x-modulus-hash (4.3: rabbit_exchange_type_modulus_hash) ----


def test_modulus_hash_over_sorted_destinations(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-modulus-hash", auto_delete=True)
    # bound in another order than their names sort: RabbitMQ sorts before it picks
    queues = []
    for letter in "cab":
        ch.queue_declare(f"{name}.{letter}", exclusive=True)
        ch.queue_bind(f"{name}.{letter}", name, "any-key")
        queues.append(f"{name}.{letter}")
    keys = [f"key-{i}" for i in range(30)]
    for key in keys:
        ch.basic_publish(name, key, key.encode())
    got = where(ch, queues)
    assert got == {key: "abc"[phash2([key.encode()]) % 3] for key in keys}


# ---- x-local-random (4.0: rabbit_exchange_type_local_random) ----


def test_local_random_picks_one_queue(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-local-random", auto_delete=True)
    queues = bind_queues(ch, name, name, ["", "", ""])
    for i in range(300):
        ch.basic_publish(name, "whatever", b"%d" % i)
    got = where(ch, queues)
    assert sorted(got) == sorted(str(i) for i in range(300))  # each exactly once
    assert set(got.values()) == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("queue_args", "key", "text"),
    [
        ({}, "k", "PRECONDITION_FAILED - Non empty binding 'k' key not permitted"),
        ({"x-queue-type": "quorum"}, "",
         "PRECONDITION_FAILED - Queue type rabbit_quorum_queue not valid for this exchange type"),
    ],
)  # fmt: skip
def test_local_random_binding_restrictions(
    conn: pika.BlockingConnection, name: str, queue_args: dict[str, Any], key: str, text: str
) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-local-random", auto_delete=True)
    ch.queue_declare(name, durable=True, arguments=queue_args)
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            ch.queue_bind(name, name, key)
        assert closed_with(exc) == (406, text)
    finally:
        conn.channel().queue_delete(name)


def test_local_random_can_be_disabled_by_configuration() -> None:
    with run_broker(local_random_exchange_enabled=False) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
            conn.channel().exchange_declare("lr.off", "x-local-random")
        text = "PRECONDITION_FAILED - x-local-random exchange is disabled by configuration"
        assert closed_with(exc) == (406, text)
        conn.close()


def test_local_random_takes_no_exchange(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    ch.exchange_declare(name, "x-local-random", auto_delete=True)
    ch.exchange_declare(name + ".dst", "fanout", auto_delete=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.exchange_bind(name + ".dst", name, "")
    assert closed_with(exc) == (406, "PRECONDITION_FAILED - Destination not found")


# ---- x-delayed-message: declaring ----


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing "
             "exchange type"),
        ({"x-delayed-type": 5}, "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must "
                                "be an existing exchange type"),
        ({"x-delayed-type": "x-delayed-message"},
         "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for "
         "'x-delayed-type'"),
    ],
)  # fmt: skip
def test_delayed_declare_needs_a_delayed_type(
    conn: pika.BlockingConnection, name: str, arguments: dict[str, Any], text: str
) -> None:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        conn.channel().exchange_declare(name, "x-delayed-message", arguments=arguments)
    assert closed_with(exc) == (406, text)


def test_delayed_declare_with_an_unknown_type_closes_the_connection(
    conn: pika.BlockingConnection, name: str
) -> None:
    # rabbit_exchange:check_type/1 on the x-delayed-type: a connection error, as for the type
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as exc:
        conn.channel().exchange_declare(
            name, "x-delayed-message", arguments={"x-delayed-type": "nope"}
        )
    assert closed_with(exc) == (503, "COMMAND_INVALID - unknown exchange type 'nope'")


def test_delayed_redeclare_is_checked(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    args = {"x-delayed-type": "direct"}
    ch.exchange_declare(name, "x-delayed-message", auto_delete=True, arguments=args)
    ch.exchange_declare(name, "x-delayed-message", auto_delete=True, arguments=args)
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "k")  # keep the auto-delete exchange
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.exchange_declare(name, "direct", auto_delete=True)
    assert closed_with(exc) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' in vhost '/': "
        "received 'direct' but current is 'x-delayed-message'",
    )


def test_delayed_bindings_are_checked_by_the_routing_type(
    conn: pika.BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    ch.queue_declare(name, exclusive=True)
    delayed_exchange(ch, name + ".ch", "x-consistent-hash", auto_delete=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_bind(name, name + ".ch", "heavy")
    assert closed_with(exc) == (
        406,
        'PRECONDITION_FAILED - The binding key must be an integer: <<"heavy">>',
    )
    ch = conn.channel()
    delayed_exchange(ch, name + ".h", "headers", auto_delete=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as exc:
        ch.queue_bind(name, name + ".h", "", arguments={"x-match": "some"})
    assert exc.value.args[0] == 406


def test_delayed_consistent_hash_routes_by_the_ring(
    conn: pika.BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    delayed_exchange(ch, name, "x-consistent-hash", auto_delete=True)
    queues = bind_queues(ch, name, name, ["1", "2", "3"])
    keys = list(RABBITMQ_RING)[:6]
    for key in keys:
        ch.basic_publish(name, key, key.encode(), pika.BasicProperties(headers={"x-delay": 50}))
    for queue in {RABBITMQ_RING[k] for k in keys}:
        wanted = [k for k in keys if RABBITMQ_RING[k] == queue]
        got = get_n(ch, f"{name}.{queue}", len(wanted), 5)
        assert sorted(body.decode() for _, body, _ in got) == sorted(wanted)
    assert all(drain(ch, q) == [] for q in queues)


# ---- x-delayed-message: publishing ----


def delayed_exchange(ch: Channel, name: str, kind: str = "direct", **kwargs: Any) -> None:
    ch.exchange_declare(name, "x-delayed-message", arguments={"x-delayed-type": kind}, **kwargs)


def get_n(ch: Channel, queue: str, n: int, within: float) -> list[tuple[Any, bytes, float]]:
    """Wait for ``n`` messages by consuming (an event, not a sleep), with arrival times."""
    got: list[tuple[Any, bytes, float]] = []
    for method, props, body in ch.consume(queue, inactivity_timeout=within):
        assert method is not None, f"{len(got)} of {n} arrived in {queue} within {within}s"
        ch.basic_ack(method.delivery_tag)
        got.append((props, body, time.monotonic()))
        if len(got) == n:
            break
    assert ch.cancel() == 0
    return got


def get_one(ch: Channel, queue: str, within: float) -> tuple[Any, bytes, float]:
    return get_n(ch, queue, 1, within)[0]


def test_delayed_message_arrives_after_its_delay(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    delayed_exchange(ch, name, auto_delete=True)
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "k")
    sent = time.monotonic()
    ch.basic_publish(name, "k", b"later", pika.BasicProperties(headers={"x-delay": 400}))
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    props, body, arrived = get_one(ch, name, 5)
    assert body == b"later"
    assert 0.39 <= arrived - sent < 1.5
    assert props.headers == {"x-delay": -400}  # the plugin hands it on with the delay negated


@pytest.mark.parametrize("headers", [None, {"x-delay": 0}, {"x-delay": -5}, {"x-delay": "x"}])
def test_no_or_non_positive_delay_routes_at_once(
    conn: pika.BlockingConnection, name: str, headers: dict[str, Any] | None
) -> None:
    ch = conn.channel()
    delayed_exchange(ch, name, "fanout", auto_delete=True)
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "")
    ch.basic_publish(name, "", b"now", pika.BasicProperties(headers=headers))
    assert drain(ch, name) == [b"now"]


def test_routing_happens_at_release_time(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    delayed_exchange(ch, name, "topic", auto_delete=True)
    for suffix in ("early", "late"):
        ch.queue_declare(f"{name}.{suffix}", exclusive=True)
    ch.queue_bind(f"{name}.early", name, "a.*")
    ch.basic_publish(name, "a.b", b"m", pika.BasicProperties(headers={"x-delay": 1000}))
    ch.queue_bind(f"{name}.late", name, "#")  # bound after the publish: still counts
    ch.queue_unbind(f"{name}.early", name, "a.*")  # unbound before the release: gets nothing
    _, body, _ = get_one(ch, f"{name}.late", 5)
    assert body == b"m"
    assert drain(ch, f"{name}.early") == []


def test_mandatory_delayed_message_is_returned_and_confirmed_at_once(
    conn: pika.BlockingConnection, name: str
) -> None:
    """The plugin's route/3 gives no queue for a delayed message: a mandatory one comes back
    as unroutable at once (its README: "the mandatory flag is not supported"), and the
    confirm comes on accept; the message is still released later."""
    ch = conn.channel()
    ch.confirm_delivery()
    delayed_exchange(ch, name, auto_delete=True)
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "k")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(
            name, "k", b"m", pika.BasicProperties(headers={"x-delay": 200}), mandatory=True
        )
    ch.basic_publish(name, "k", b"c", pika.BasicProperties(headers={"x-delay": 200}))  # acked
    assert {body for _, body, _ in get_n(ch, name, 2, 5)} == {b"m", b"c"}


def test_delays_release_in_due_order(conn: pika.BlockingConnection, name: str) -> None:
    ch = conn.channel()
    delayed_exchange(ch, name, auto_delete=True)
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "k")
    for delay in (600, 200, 400):
        ch.basic_publish(name, "k", b"%d" % delay, pika.BasicProperties(headers={"x-delay": delay}))
    assert [body for _, body, _ in get_n(ch, name, 3, 5)] == [b"200", b"400", b"600"]


async def test_aio_pika_delayed_publish_is_confirmed_then_released(
    amqp_url: str, name: str
) -> None:
    """The same with an asyncio client: the confirm comes on accept, the message later."""
    import asyncio

    import aio_pika
    import aiormq

    async with asyncio.timeout(10):
        connection = await aio_pika.connect(amqp_url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(
                name, "x-delayed-message", auto_delete=True, arguments={"x-delayed-type": "fanout"}
            )
            queue = await channel.declare_queue(name, exclusive=True)
            await queue.bind(exchange)
            # aio-pika publishes mandatory by default: held, so returned (as with the plugin)
            returned = await exchange.publish(
                aio_pika.Message(b"returned", headers={"x-delay": 300}), routing_key=""
            )
            assert not isinstance(returned, aiormq.spec.Basic.Ack)
            confirm = await exchange.publish(
                aio_pika.Message(b"soon", headers={"x-delay": 300}), routing_key="", mandatory=False
            )
            assert isinstance(confirm, aiormq.spec.Basic.Ack)
            assert await queue.get(no_ack=True, fail=False) is None  # held, not yet routed
            bodies = []
            async with queue.iterator() as messages:
                async for message in messages:
                    assert message.headers == {"x-delay": -300}
                    await message.ack()
                    bodies.append(message.body)
                    if len(bodies) == 2:
                        break
            assert sorted(bodies) == [b"returned", b"soon"]  # both released later


# ---- management: messages_delayed, types, deletion ----


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, prometheus_port=0) as running:
        yield running


def test_api_counts_held_messages_and_delete_drops_them(warren: RunningBroker, name: str) -> None:
    port = int(str(warren.management_url).rsplit(":", 1)[1])
    api = HttpApi(port)
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    delayed_exchange(ch, name)
    ch.queue_declare(name, exclusive=True)
    ch.queue_bind(name, name, "k")
    for _ in range(3):
        ch.basic_publish(name, "k", b"x", pika.BasicProperties(headers={"x-delay": 60_000}))
    ch.queue_declare(name, passive=True)
    reply = api.get(f"/api/exchanges/%2F/{q(name)}")
    assert reply.body["type"] == "x-delayed-message"
    assert reply.body["messages_delayed"] == 3
    listed = {e["name"]: e for e in api.get("/api/exchanges/%2F").body}
    assert listed[name]["messages_delayed"] == 3
    from tests.test_metrics import scrape

    totals, _ = scrape(warren)
    assert totals["warren_exchange_messages_delayed"] >= 3
    per_object, _ = scrape(warren, "/metrics/per-object")
    assert per_object[f'warren_exchange_messages_delayed{{vhost="/",exchange="{name}"}}'] == 3
    types = {t["name"] for t in api.get("/api/overview").body["exchange_types"]}
    assert {"x-delayed-message", "x-consistent-hash", "x-modulus-hash", "x-local-random"} <= types
    ch.exchange_delete(name)
    delayed_exchange(ch, name)
    assert api.get(f"/api/exchanges/%2F/{q(name)}").body["messages_delayed"] == 0
    ch.exchange_delete(name)
    conn.close()


def test_lifecycle_trace_records_delayed_and_released(tmp_path: Path) -> None:
    from tests.test_tracing import history, of, read_trace

    trace_dir = tmp_path / "trace"
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        delayed_exchange(ch, "tr.x")
        ch.queue_declare("tr.q", durable=True)
        ch.queue_bind("tr.q", "tr.x", "k")
        ch.basic_publish("tr.x", "k", b"m", pika.BasicProperties(headers={"x-delay": 100}))
        get_one(ch, "tr.q", 5)
        conn.close()
        events = read_trace(running, trace_dir)
    delayed = of(events, "delayed", exchange="tr.x")[0]
    assert delayed["delay_ms"] == 100
    assert of(events, "released", exchange="tr.x", msg=delayed["msg"])[0]["queues"] == ["tr.q"]
    steps = history(events, delayed["msg"])
    assert steps[steps.index("delayed:") :][:3] == ["delayed:", "released:", "delivered:tr.q"]


def test_definitions_round_trip_and_warrenctl(warren: RunningBroker, name: str) -> None:
    from tests.test_warrenctl import ok, rows

    api = HttpApi(int(str(warren.management_url).rsplit(":", 1)[1]))
    kinds = {
        "x-consistent-hash": {"hash-header": "h"},
        "x-modulus-hash": {},
        "x-local-random": {},
        "x-delayed-message": {"x-delayed-type": "topic"},
    }
    definitions = {
        "queues": [{"name": name, "vhost": "/", "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "exchanges": [
            {"name": f"{name}.{kind}", "vhost": "/", "type": kind, "durable": True,
             "auto_delete": False, "internal": False, "arguments": args}
            for kind, args in kinds.items()
        ],
        "bindings": [
            {"source": f"{name}.{kind}", "vhost": "/", "destination": name,
             "destination_type": "queue", "routing_key": key, "arguments": {}}
            for kind, key in (("x-consistent-hash", "5"), ("x-local-random", ""),
                              ("x-delayed-message", "a.#"))
        ],
    }  # fmt: skip
    assert api.post("/api/definitions", definitions).status == 204
    exported = api.get("/api/definitions").body
    mine = {e["name"]: e for e in exported["exchanges"] if e["name"].startswith(name)}
    assert {e["type"]: e["arguments"] for e in mine.values()} == kinds
    assert all("messages_delayed" not in e for e in mine.values())
    keys = {b["source"]: b["routing_key"] for b in exported["bindings"] if b["destination"] == name}
    assert keys[f"{name}.x-consistent-hash"] == "5"
    listed = rows(ok(warren, "list_exchanges", "name", "type", "messages_delayed"))
    assert [f"{name}.x-delayed-message", "x-delayed-message", "0"] in listed
    for kind in kinds:
        api.delete(f"/api/exchanges/%2F/{q(name + '.' + kind)}")
    api.delete(f"/api/queues/%2F/{q(name)}")


# ---- durability ----

PERSISTENT_DELAY = 4000  # ms: long enough to restart within it


def test_durable_delayed_messages_survive_a_restart_and_keep_their_due_time(
    tmp_path: Path,
) -> None:
    with run_broker(data_dir=str(tmp_path)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        delayed_exchange(ch, "dl.x", durable=True)
        ch.queue_declare("dl.q", durable=True)
        ch.queue_bind("dl.q", "dl.x", "k")
        sent = time.monotonic()
        for kind, mode in (("persistent", 2), ("transient", 1)):
            props = pika.BasicProperties(delivery_mode=mode, headers={"x-delay": PERSISTENT_DELAY})
            ch.basic_publish("dl.x", "k", kind.encode(), props)
        conn.close()
        running.restart()
        restarted = time.monotonic()
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        _, body, arrived = get_one(ch, "dl.q", 10)
        assert body == b"persistent"  # the transient one lived in memory only
        # released at its due time, not before; if the restart took longer, as soon as it ran
        due = sent + PERSISTENT_DELAY / 1000
        assert due - 0.05 <= arrived < max(due, restarted) + 1
        assert drain(ch, "dl.q") == []
        conn.close()
        running.restart()  # released: the log no longer holds it
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        assert drain(conn.channel(), "dl.q") == []
        conn.close()


def test_confirmed_delayed_messages_survive_kill_9(tmp_path: Path) -> None:
    data, port = str(tmp_path), free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        delayed_exchange(ch, "k9.x", durable=True)
        ch.queue_declare("k9.q", durable=True)
        ch.queue_bind("k9.q", "k9.x", "k")
        for i in range(50):
            props = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 300 + i})
            ch.basic_publish("k9.x", "k", b"%d" % i, props)  # returns once confirmed
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(0.4)  # the broker is down past every due time: released at once on start
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        bodies = sorted(int(body) for _, body, _ in get_n(ch, "k9.q", 50, 5))
        assert bodies == list(range(50))
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


@pytest.mark.parametrize("kind", ["x-consistent-hash", "x-modulus-hash", "x-delayed-message"])
def test_an_alternate_exchange_policy_applies_to_plugin_exchanges(
    warren: RunningBroker, name: str, kind: str
) -> None:
    """The one policy key RabbitMQ's core applies to exchanges: alternate-exchange, where an
    exchange's own argument wins (rabbit_policy:get_arg/3, read by rabbit_exchange at route)."""
    api = HttpApi(int(str(warren.management_url).rsplit(":", 1)[1]))
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    ch = conn.channel()
    args = {"x-delayed-type": "direct"} if kind == "x-delayed-message" else None
    ch.exchange_declare(name, kind, auto_delete=False, arguments=args)
    ch.exchange_declare(f"{name}.ae", "fanout")
    ch.queue_declare(f"{name}.unrouted", exclusive=True)
    ch.queue_bind(f"{name}.unrouted", f"{name}.ae", "")
    policy = {"pattern": f"^{re.escape(name)}$", "apply-to": "exchanges",
              "definition": {"alternate-exchange": f"{name}.ae"}}  # fmt: skip
    api.ok("PUT", f"/api/policies/%2F/{q(name)}", policy)
    assert api.ok("GET", f"/api/exchanges/%2F/{q(name)}")["policy"] == name
    ch.basic_publish(name, "no bindings", b"to the alternate")
    got = ch.basic_get(f"{name}.unrouted", auto_ack=True)
    assert got[2] == b"to the alternate"
    api.ok("DELETE", f"/api/policies/%2F/{q(name)}")
    ch.basic_publish(name, "no bindings", b"dropped")
    assert ch.queue_declare(f"{name}.unrouted", passive=True).method.message_count == 0
    assert "policy" not in api.ok("GET", f"/api/exchanges/%2F/{q(name)}")
    ch.exchange_delete(name)
    ch.exchange_delete(f"{name}.ae")
    conn.close()
