"""Realistic flows with unmodified client libraries (pika, aio-pika) and their defaults."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import aio_pika
import aio_pika.abc
import aiormq.exceptions
import pika
import pika.adapters.blocking_connection
import pika.exceptions
import pika.spec
import pytest

TIMEOUT = 10.0


# -- pika ----------------------------------------------------------------------------


@pytest.fixture
def pika_channel(
    amqp_url: str,
) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield conn.channel()
    finally:
        if conn.is_open:
            conn.close()


@pytest.fixture
def pika_cleanup(amqp_url: str) -> Iterator[list[str]]:
    """Queue names to delete after the test, on a fresh connection."""
    names: list[str] = []
    yield names
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        for q in names:
            ch.queue_delete(q)
    finally:
        conn.close()


def test_pika_declare_publish_get(
    pika_channel: pika.adapters.blocking_connection.BlockingChannel,
    pika_cleanup: list[str],
    name: str,
) -> None:
    ch = pika_channel
    pika_cleanup.append(name)
    ok = ch.queue_declare(name, durable=True)
    assert ok.method.queue == name
    props = pika.BasicProperties(
        content_type="application/json",
        headers={"trace": "abc", "n": 3, "nested": {"ok": True}},
        correlation_id="c-1",
        delivery_mode=pika.DeliveryMode.Persistent,
    )
    ch.confirm_delivery()
    ch.basic_publish("", name, b'{"hello": "world"}', props)
    method, got_props, body = ch.basic_get(name, auto_ack=True)
    assert isinstance(method, pika.spec.Basic.GetOk)
    assert body == b'{"hello": "world"}'
    assert (got_props.content_type, got_props.correlation_id) == ("application/json", "c-1")
    assert got_props.headers == {"trace": "abc", "n": 3, "nested": {"ok": True}}
    assert got_props.delivery_mode == 2
    assert ch.basic_get(name) == (None, None, None)


def test_pika_consume_with_process_data_events(
    amqp_url: str,
    pika_channel: pika.adapters.blocking_connection.BlockingChannel,
    pika_cleanup: list[str],
    name: str,
) -> None:
    ch = pika_channel
    pika_cleanup.append(name)
    ch.queue_declare(name, durable=True)
    ch.basic_qos(prefetch_count=2)
    received: list[tuple[bytes, bool]] = []

    def on_message(
        channel: pika.adapters.blocking_connection.BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        received.append((body, method.redelivered))
        if body == b"3" and not method.redelivered:
            channel.basic_nack(method.delivery_tag, requeue=True)
        else:
            channel.basic_ack(method.delivery_tag)

    tag = ch.basic_consume(name, on_message)
    assert tag.startswith("ctag")  # pika chooses its own tags
    for i in range(10):
        ch.basic_publish("", name, str(i).encode())
    deadline = time.monotonic() + TIMEOUT
    while len(received) < 11 and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.1)
    assert len(received) == 11
    assert sorted(body for body, _ in received) == sorted(
        [str(i).encode() for i in range(10)] + [b"3"]
    )
    assert (b"3", True) in received
    ch.basic_cancel(tag)
    assert ch.queue_declare(name, passive=True).method.message_count == 0


def test_pika_confirm_delivery_unroutable(
    pika_channel: pika.adapters.blocking_connection.BlockingChannel,
    pika_cleanup: list[str],
    name: str,
) -> None:
    ch = pika_channel
    pika_cleanup.append(name)
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"routed", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError) as err:
        ch.basic_publish("amq.direct", f"{name}.nowhere", b"lost", mandatory=True)
    (returned,) = err.value.messages
    assert returned.body == b"lost"
    assert returned.method.reply_code == 312
    # unroutable but not mandatory: confirmed silently
    ch.basic_publish("amq.direct", f"{name}.nowhere", b"dropped")
    assert ch.queue_declare(name, passive=True).method.message_count == 1


def test_pika_topic_exchange_and_bindings(
    pika_channel: pika.adapters.blocking_connection.BlockingChannel,
    pika_cleanup: list[str],
    name: str,
) -> None:
    ch = pika_channel
    ex = f"{name}.logs"
    ch.exchange_declare(ex, exchange_type="topic", auto_delete=True)
    result = ch.queue_declare("", exclusive=True)
    q = result.method.queue
    assert q.startswith("amq.gen-")
    ch.queue_bind(q, ex, routing_key="app.*.error")
    ch.queue_bind(q, ex, routing_key="audit.#")
    ch.confirm_delivery()
    for key in ("app.web.error", "app.web.info", "audit", "audit.login.ok", "app.error"):
        ch.basic_publish(ex, key, key.encode())
    bodies = []
    while True:
        method, _props, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    assert bodies == [b"app.web.error", b"audit", b"audit.login.ok"]
    ch.queue_unbind(q, ex, routing_key="app.*.error")
    ch.queue_unbind(q, ex, routing_key="audit.#")  # last binding: the exchange goes
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare(ex, passive=True)
    assert err.value.reply_code == 404
    assert err.value.reply_text == f"NOT_FOUND - no exchange '{ex}' in vhost '/'"


def test_pika_channel_error_and_recovery(amqp_url: str, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(name, passive=True)
        assert (err.value.reply_code, err.value.reply_text) == (
            404,
            f"NOT_FOUND - no queue '{name}' in vhost '/'",
        )
        assert ch.is_closed
        ch2 = conn.channel()
        assert ch2.queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    finally:
        conn.close()


def test_pika_large_message(
    pika_channel: pika.adapters.blocking_connection.BlockingChannel,
    pika_cleanup: list[str],
    name: str,
) -> None:
    ch = pika_channel
    pika_cleanup.append(name)
    ch.queue_declare(name, durable=True)
    body = bytes(range(256)) * 8192  # 2 MiB, many frames both ways
    ch.confirm_delivery()
    ch.basic_publish("", name, body)
    method, _props, got = ch.basic_get(name, auto_ack=True)
    assert method is not None
    assert got == body


# -- aio-pika ------------------------------------------------------------------------


@pytest.fixture
async def robust(amqp_url: str) -> AsyncIterator[aio_pika.abc.AbstractRobustConnection]:
    conn = await asyncio.wait_for(aio_pika.connect_robust(amqp_url), TIMEOUT)
    try:
        yield conn
    finally:
        await asyncio.wait_for(conn.close(), TIMEOUT)


async def test_aio_pika_queue_iterator(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        channel = await robust.channel()
        queue = await channel.declare_queue(name, durable=True)
        try:
            for i in range(10):
                await channel.default_exchange.publish(
                    aio_pika.Message(
                        f"msg {i}".encode(),
                        headers={"i": i, "tags": ["a", "b"]},
                        correlation_id=f"c{i}",
                        content_type="text/plain",
                    ),
                    routing_key=name,
                )
            got: list[tuple[bytes, object, str | None]] = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.headers["i"], message.correlation_id))
                    if len(got) == 10:
                        break
            assert got == [(f"msg {i}".encode(), i, f"c{i}") for i in range(10)]
            declared = await channel.declare_queue(name, passive=True)
            assert declared.declaration_result.message_count == 0
        finally:
            await queue.delete()


async def test_aio_pika_publisher_confirms_and_returns(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        channel = await robust.channel(on_return_raises=True)
        queue = await channel.declare_queue(name, durable=True)
        try:
            confirm = await channel.default_exchange.publish(
                aio_pika.Message(b"routed"), routing_key=name
            )
            assert isinstance(confirm, aiormq.spec.Basic.Ack)
            with pytest.raises(aio_pika.exceptions.PublishError):
                await channel.default_exchange.publish(
                    aio_pika.Message(b"lost"), routing_key=f"{name}.missing"
                )
            # without on_return_raises the returned message is handed back
            quiet = await robust.channel()
            result = await quiet.default_exchange.publish(
                aio_pika.Message(b"lost again"), routing_key=f"{name}.missing"
            )
            assert not isinstance(result, aiormq.spec.Basic.Ack)
            message = await queue.get(no_ack=True)
            assert message.body == b"routed"
        finally:
            await queue.delete()


async def test_aio_pika_transactions(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        tx_channel = await robust.channel(publisher_confirms=False)
        reader = await robust.channel()
        queue = await reader.declare_queue(name, durable=True)
        try:
            async with tx_channel.transaction():
                for body in (b"one", b"two"):
                    await tx_channel.default_exchange.publish(
                        aio_pika.Message(body), routing_key=name
                    )
                assert await queue.get(fail=False) is None  # not yet committed
            with pytest.raises(RuntimeError, match="abort"):
                async with tx_channel.transaction():
                    await tx_channel.default_exchange.publish(
                        aio_pika.Message(b"rolled back"), routing_key=name
                    )
                    raise RuntimeError("abort")
            bodies = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                bodies.append(message.body)
            assert bodies == [b"one", b"two"]
        finally:
            await queue.delete()


async def test_aio_pika_exchange_types(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        channel = await robust.channel()
        direct = await channel.declare_exchange(f"{name}.direct", aio_pika.ExchangeType.DIRECT)
        fanout = await channel.declare_exchange(f"{name}.fanout", aio_pika.ExchangeType.FANOUT)
        topic = await channel.declare_exchange(f"{name}.topic", aio_pika.ExchangeType.TOPIC)
        headers = await channel.declare_exchange(f"{name}.headers", aio_pika.ExchangeType.HEADERS)
        queues = [await channel.declare_queue(f"{name}.q{i}", durable=True) for i in range(4)]
        try:
            await queues[0].bind(direct, routing_key="k")
            await queues[1].bind(fanout)
            await queues[2].bind(topic, routing_key="*.important.#")
            await queues[3].bind(headers, arguments={"x-match": "any", "kind": "invoice"})
            await direct.publish(aio_pika.Message(b"direct"), routing_key="k")
            await direct.publish(aio_pika.Message(b"direct-miss"), routing_key="x", mandatory=False)
            await fanout.publish(aio_pika.Message(b"fanout"), routing_key="ignored")
            await topic.publish(aio_pika.Message(b"topic"), routing_key="mail.important.today")
            await topic.publish(
                aio_pika.Message(b"topic-miss"), routing_key="mail.spam", mandatory=False
            )
            await headers.publish(
                aio_pika.Message(b"headers", headers={"kind": "invoice"}), routing_key=""
            )
            await headers.publish(
                aio_pika.Message(b"headers-miss", headers={"kind": "receipt"}),
                routing_key="",
                mandatory=False,
            )
            got = []
            for q in queues:
                bodies = []
                while (message := await q.get(no_ack=True, fail=False)) is not None:
                    bodies.append(message.body)
                got.append(bodies)
            assert got == [[b"direct"], [b"fanout"], [b"topic"], [b"headers"]]
        finally:
            for q in queues:
                await q.delete()
            for ex in (direct, fanout, topic, headers):
                await ex.delete()


async def test_aio_pika_qos_and_requeue(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        channel = await robust.channel()
        await channel.set_qos(prefetch_count=1)
        queue = await channel.declare_queue(name, durable=True)
        try:
            for body in (b"a", b"b"):
                await channel.default_exchange.publish(aio_pika.Message(body), routing_key=name)
            seen: list[tuple[bytes, bool]] = []
            done = asyncio.Event()

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                seen.append((message.body, bool(message.redelivered)))
                if len(seen) == 1:
                    await message.reject(requeue=True)
                else:
                    await message.ack()
                if len(seen) == 3:
                    done.set()

            tag = await queue.consume(on_message)
            await done.wait()
            await queue.cancel(tag)
            # prefetch 1: the rejected message comes back first, before "b"
            assert seen == [(b"a", False), (b"a", True), (b"b", False)]
        finally:
            await queue.delete()


async def test_aio_pika_rpc_with_reply_queue(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        server_channel = await robust.channel()
        requests = await server_channel.declare_queue(name, durable=True)
        try:

            async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    assert message.reply_to is not None
                    await server_channel.default_exchange.publish(
                        aio_pika.Message(
                            message.body.upper(), correlation_id=message.correlation_id
                        ),
                        routing_key=message.reply_to,
                    )

            await requests.consume(serve)
            client_channel = await robust.channel()
            replies = await client_channel.declare_queue(exclusive=True)
            futures: dict[str, asyncio.Future[bytes]] = {}

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    assert message.correlation_id is not None
                    futures.pop(message.correlation_id).set_result(message.body)

            await replies.consume(on_reply)
            loop = asyncio.get_running_loop()
            calls = {}
            for word in ("alpha", "beta", "gamma"):
                cid = uuid.uuid4().hex
                futures[cid] = calls[word] = loop.create_future()
                await client_channel.default_exchange.publish(
                    aio_pika.Message(word.encode(), correlation_id=cid, reply_to=replies.name),
                    routing_key=name,
                )
            results = {word: await fut for word, fut in calls.items()}
            assert results == {"alpha": b"ALPHA", "beta": b"BETA", "gamma": b"GAMMA"}
        finally:
            await requests.delete(if_unused=False)


async def test_aio_pika_channel_error_and_reopen(
    robust: aio_pika.abc.AbstractRobustConnection, name: str
) -> None:
    async with asyncio.timeout(TIMEOUT):
        channel = await robust.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as err:
            await channel.declare_queue(name, passive=True)
        assert f"NOT_FOUND - no queue '{name}' in vhost '/'" in str(err.value)
        assert channel.is_closed
        await channel.reopen()
        queue = await channel.declare_queue(exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"again"), routing_key=queue.name)
        message = await queue.get(no_ack=True)
        assert message.body == b"again"
