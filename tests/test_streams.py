"""Stream queues (x-queue-type: stream) over AMQP 0-9-1, as RabbitMQ 4.3 has them.

Error codes and texts were recorded against RabbitMQ 3.10 on this machine; where 4.3
differs, rabbit_stream_queue.erl / rabbit_amqqueue.erl / rabbit_channel.erl at v4.3.5 win
and the test says where.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aio_pika
import pika
import pytest
from amqp_raw import RawClient
from pamqp import commands
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from test_durability import free_port, start_server

from warren.broker.testkit import run_broker

STREAM = {"x-queue-type": "stream"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with run_broker(data_dir=str(tmp_path_factory.mktemp("streams"))) as running:
        yield running


@pytest.fixture
def conn(broker: Any) -> Iterator[BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    yield connection
    if connection.is_open:
        connection.close()


def declare(ch: BlockingChannel, name: str, **args: Any) -> None:
    ch.queue_declare(name, durable=True, arguments={**STREAM, **args})


def publish(ch: BlockingChannel, name: str, bodies: list[bytes], **props: Any) -> None:
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", name, body, pika.BasicProperties(**props))


def consume(
    ch: BlockingChannel,
    name: str,
    count: int,
    args: dict[str, Any] | None = None,
    prefetch: int = 100,
    timeout: float = 5.0,
    settle: str = "ack",
) -> list[tuple[int, bytes, dict[str, Any]]]:
    """Consume ``count`` messages (offset, body, headers), acking as it goes."""
    ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[int, bytes, dict[str, Any]]] = []

    def on_message(c: BlockingChannel, m: Any, p: Any, b: bytes) -> None:
        got.append((p.headers["x-stream-offset"], b, p.headers))
        if settle == "ack":
            c.basic_ack(m.delivery_tag)
        elif settle == "nack":
            c.basic_nack(m.delivery_tag, requeue=True)
        elif settle == "reject":
            c.basic_reject(m.delivery_tag, requeue=False)

    tag = ch.basic_consume(name, on_message, arguments=args or {})
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        ch.connection.process_data_events(0.05)
    ch.basic_cancel(tag)
    return got


def closed_with(conn: BlockingConnection, fn: Any) -> tuple[int, str]:
    ch = conn.channel()
    try:
        fn(ch)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    raise AssertionError("the broker accepted it")


# ---- declare, publish, consume ----


def test_declare_and_redeclare_counts_messages(conn: BlockingConnection, name: str) -> None:
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"a", b"b", b"c"])
    ok = ch.queue_declare(name, durable=True, arguments=STREAM).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    assert ch.queue_declare(name, passive=True).method.message_count == 3


@pytest.mark.parametrize(
    ("durable", "exclusive", "auto_delete", "prop"),
    [
        (False, False, False, "non-durable"),
        (True, True, False, "exclusive-owner"),
        (True, False, True, "auto-delete"),
    ],
)
def test_declare_refuses_what_a_stream_cannot_be(
    conn: BlockingConnection, name: str, durable: bool, exclusive: bool, auto_delete: bool,
    prop: str,
) -> None:  # fmt: skip
    code, text = closed_with(
        conn,
        lambda ch: ch.queue_declare(
            name, durable=durable, exclusive=exclusive, auto_delete=auto_delete, arguments=STREAM
        ),
    )
    assert (code, text) == (
        406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in vhost '/'"
    )  # fmt: skip


def test_consume_from_first_delivers_every_message_with_its_offset(
    conn: BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"m0", b"m1"])
    publish(ch, name, [b"m2"], headers={"a": 1}, content_type="text/plain")
    got = consume(ch, name, 3, {"x-stream-offset": "first"})
    assert [(o, b) for o, b, _ in got] == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
    assert got[2][2] == {"a": 1, "x-stream-offset": 2}
    # consuming removed nothing: a second reader sees all of it again
    again = consume(conn.channel(), name, 3, {"x-stream-offset": "first"})
    assert [b for _, b, _ in again] == [b"m0", b"m1", b"m2"]
    assert ch.queue_declare(name, passive=True).method.message_count == 3


def test_every_mix_of_properties_keeps_them_and_its_offset(tmp_path: Path, name: str) -> None:
    """Runs of one exchange, routing key and properties (which the log appends with one pack
    each), changing and alternating ones, headers, bodies of every size, through two
    exchanges: each delivery has the properties, exchange, key and body it was published
    with, plus its offset header; the same after a restart."""
    with run_broker(data_dir=str(tmp_path)) as broker:
        _publish_and_replay_a_mix(broker, name)


def _publish_and_replay_a_mix(broker: Any, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name)
    ch.queue_bind(name, "amq.direct", routing_key="rk-" + name)
    ch.confirm_delivery()
    sent: list[tuple[str, str, bytes, dict[str, Any]]] = []
    full = {"content_type": "text/plain", "delivery_mode": 2, "priority": 3, "message_id": "m"}
    runs: list[tuple[str, int, dict[str, Any]]] = [
        ("", 7, full),
        ("", 6, {}),
        ("amq.direct", 6, {"content_encoding": "gzip", "delivery_mode": 1}),
        ("", 5, {"content_type": "a", "content_encoding": "b", "correlation_id": "c"}),
        ("", 5, {"headers": {"h": 1}, "content_type": "x"}),
        ("", 5, full),
    ]
    for exchange, count, props in runs:
        for i in range(count):
            key = name if not exchange else "rk-" + name
            body = b"b" * (i * 37 % 300)
            sent.append((exchange, key, body, props))
    for i in range(8):  # alternating shapes
        sent.append(("", name, b"%d" % i, full if i % 2 else {"correlation_id": "z"}))
    for exchange, key, body, props in sent:
        ch.basic_publish(exchange, key, body, pika.BasicProperties(**props))
    conn.close()

    def replay() -> list[tuple[str, str, bytes, dict[str, Any]]]:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        got: list[tuple[str, str, bytes, dict[str, Any]]] = []

        def on_message(c: BlockingChannel, m: Any, p: Any, b: bytes) -> None:
            props = {k: v for k, v in vars(p).items() if v is not None}
            got.append((m.exchange, m.routing_key, b, props))
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(name, on_message, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + 5
        while len(got) < len(sent) and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        conn.close()
        return got

    expected = [
        (exchange, key, body,
         {**props, "headers": {**props.get("headers", {}), "x-stream-offset": offset}})
        for offset, (exchange, key, body, props) in enumerate(sent)
    ]  # fmt: skip
    assert replay() == expected
    broker.restart()
    assert replay() == expected


def test_publishes_fanned_out_to_several_streams_reach_each_one(
    conn: BlockingConnection, name: str
) -> None:
    """The store tells each stream of its own chunks once written: waiting consumers of
    every stream get each publish, confirms come, and a stream deleted in between is left
    out without holding the others up."""
    ch = conn.channel()
    ch.exchange_declare(name, "fanout")
    names = [f"{name}-{i}" for i in range(3)]
    got: dict[str, list[bytes]] = {n: [] for n in names}
    for n in names:
        declare(ch, n)
        ch.queue_bind(n, name)
        reader = conn.channel()
        reader.basic_qos(prefetch_count=100)

        def on_message(c: BlockingChannel, m: Any, p: Any, b: bytes, n: str = n) -> None:
            got[n].append(b)
            c.basic_ack(m.delivery_tag)

        reader.basic_consume(n, on_message, arguments={"x-stream-offset": "next"})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish(name, "", b"a%d" % i)
    ch.queue_delete(names[2])
    for i in range(10):
        ch.basic_publish(name, "", b"b%d" % i)
    deadline = time.monotonic() + 5
    while min(len(got[n]) for n in names[:2]) < 20 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    expected = [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
    assert got[names[0]] == got[names[1]] == expected
    assert got[names[2]] == expected[:10]


def test_offset_header_is_a_long(broker: Any, name: str) -> None:
    """The header's field type, as RabbitMQ sends it ('l', signed 64-bit)."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"x"])
    conn.close()
    with RawClient.connect(_addr(broker)) as client:
        client.call(1, commands.Basic.Qos(prefetch_count=1), commands.Basic.QosOk)
        client.consume(1, name, arguments={"x-stream-offset": "first"})
        delivery = client.read_delivery(1)
    assert b"\x0fx-stream-offsetl" + (0).to_bytes(8, "big") in delivery.header_payload
    assert delivery.body == b"x"


def _addr(broker: Any) -> tuple[str, int]:
    parsed = urlparse(broker.url)
    return parsed.hostname or "127.0.0.1", parsed.port or 5672


def test_offset_specs(conn: BlockingConnection, name: str) -> None:
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"m0", b"m1", b"m2"])
    publish(ch, name, [b"m3"])  # a chunk of its own: confirms wait between the two

    def bodies(arg: Any, count: int = 4) -> list[bytes]:
        args = {} if arg is None else {"x-stream-offset": arg}
        return [b for _, b, _ in consume(conn.channel(), name, count, args, timeout=0.5)]

    assert bodies("first") == [b"m0", b"m1", b"m2", b"m3"]
    assert bodies("last") == [b"m3"]  # the start of the last chunk
    assert bodies(2) == [b"m2", b"m3"]
    assert bodies(-5) == [b"m0", b"m1", b"m2", b"m3"]  # before the start: the first message
    assert bodies(100) == []
    assert bodies("next") == []
    assert bodies(None) == []  # no argument: next
    an_hour_ago = datetime.datetime.now() - datetime.timedelta(hours=1)
    assert bodies(an_hour_ago) == [b"m0", b"m1", b"m2", b"m3"]
    assert bodies("1h") == [b"m0", b"m1", b"m2", b"m3"]
    in_an_hour = datetime.datetime.now() + datetime.timedelta(hours=1)
    assert bodies(in_an_hour) == []


def test_a_timestamp_offset_starts_at_the_first_chunk_at_or_after_it(
    tmp_path: Path, name: str
) -> None:
    """Chunk granularity, as rabbit_stream_queue hands a timestamp to osiris (the first
    chunk whose timestamp is at or after it); an AMQP timestamp has whole seconds."""
    with run_broker(data_dir=str(tmp_path), clock="manual") as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        declare(ch, name)
        publish(ch, name, [b"a0", b"a1"])
        running.clock.advance(10)
        publish(ch, name, [b"b0"])
        publish(ch, name, [b"b1"])  # a chunk of its own, in the same second
        running.clock.advance(10)
        publish(ch, name, [b"c0"])
        stamps = running.call(
            lambda: list(running.server.broker.vhosts["/"].queues[name].stream.segments[0]
                         .timestamps)
        )  # fmt: skip
        assert len(stamps) == 5  # a chunk per confirmed publish
        b_second = stamps[2] // 1000

        def bodies(second: int) -> list[bytes]:
            stamp = datetime.datetime.fromtimestamp(second, tz=datetime.UTC)
            args = {"x-stream-offset": stamp}
            return [b for _, b, _ in consume(conn.channel(), name, 5, args, timeout=0.5)]

        assert bodies(b_second) == [b"b0", b"b1", b"c0"]  # at or after: b0's chunk
        assert bodies(b_second + 1) == [b"c0"]  # after both chunks of that second
        assert bodies(b_second - 5) == [b"b0", b"b1", b"c0"]  # between a's and b's chunks
        assert bodies(stamps[0] // 1000) == [b"a0", b"a1", b"b0", b"b1", b"c0"]
        conn.close()


def test_next_gets_what_is_published_after(conn: BlockingConnection, name: str) -> None:
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"old"])
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
                     arguments={"x-stream-offset": "next"})  # fmt: skip
    other = conn.channel()
    publish(other, name, [b"new1", b"new2"])
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert got == [b"new1", b"new2"]


def test_prefetch_bounds_deliveries_and_acks_give_credit(
    conn: BlockingConnection, name: str
) -> None:
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"%d" % i for i in range(20)])
    ch.basic_qos(prefetch_count=5)
    got: list[Any] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(m), arguments={"x-stream-offset": 0})
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert len(got) == 5  # no acks: the prefetch is the limit
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    deadline = time.monotonic() + 5
    while len(got) < 10 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert len(got) == 10


def test_nack_and_reject_give_credit_and_remove_nothing(
    conn: BlockingConnection, name: str
) -> None:
    """RabbitMQ 4.3: rabbit_stream_queue:settle/5 treats every settle as credit ("all settle
    reasons will give credit"); 3.10 closed the connection with 540 instead."""
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"%d" % i for i in range(6)])
    got = consume(ch, name, 6, {"x-stream-offset": "first"}, prefetch=2, settle="nack")
    assert [b for _, b, _ in got] == [b"%d" % i for i in range(6)]  # never redelivered
    got = consume(conn.channel(), name, 6, {"x-stream-offset": "first"}, prefetch=2,
                  settle="reject")  # fmt: skip
    assert len(got) == 6
    assert ch.queue_declare(name, passive=True).method.message_count == 6


def test_consumers_read_independently(conn: BlockingConnection, name: str) -> None:
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"%d" % i for i in range(50)])
    slow = conn.channel()
    slow.basic_qos(prefetch_count=1)
    stuck: list[Any] = []
    slow.basic_consume(
        name, lambda c, m, p, b: stuck.append(b), arguments={"x-stream-offset": "first"}
    )
    fast = consume(conn.channel(), name, 50, {"x-stream-offset": "first"})
    assert len(fast) == 50  # the one that never acks holds nobody back
    publish(conn.channel(), name, [b"more"])
    assert stuck == [b"0"]


def test_a_reader_that_falls_behind_holds_one_read_at_most(broker: Any, name: str) -> None:
    """The broker keeps no messages of the log in memory: a stuck reader holds its last read
    (whole chunks, about 256 KB), however far behind the head it is."""
    from warren.broker.streams.log import READ_SIZE

    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name)
    ch.confirm_delivery()
    for i in range(3000):  # 3 MB in many chunks
        ch.basic_publish("", name, b"%06d" % i + b"x" * 994)
    reader = conn.channel()
    reader.basic_qos(prefetch_count=1)
    got: list[bytes] = []
    reader.basic_consume(name, lambda c, m, p, b: got.append(b), arguments={"x-stream-offset": 0})
    while not got:
        conn.process_data_events(0.05)
    publish(conn.channel(), name, [b"y" * 1000] * 100)  # the publisher is not held back

    def held() -> tuple[int, int]:
        queue = broker.server.broker.vhosts["/"].queues[name]
        cursor = next(iter(queue.cursors.values()))
        read = cursor.read
        return len(read.messages), sum(len(m[3]) for m in read.messages)

    count, size = broker.call(held)
    assert size <= READ_SIZE + 1000 and count < 3000
    assert got == [b"000000" + b"x" * 994]
    conn.close()


def test_publish_confirms_come_once_on_disk(broker: Any, name: str) -> None:
    """The confirm comes once the chunk is written to the segment file (handed to the
    operating system, so it survives kill -9), as osiris confirms a single-node stream:
    osiris_writer:handle_batch/2 notifies writers after osiris_log:write_chunk/6, which
    never syncs. The fdatasync follows on the store's syncer thread."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"x" * 1000)
    log = broker.call(lambda: broker.server.broker.vhosts["/"].queues[name].stream)
    assert log.committed == 1
    segment = log.segments[-1]
    assert os.path.getsize(segment.path) == segment.size > 1000
    conn.close()


def test_publish_confirms_wait_for_the_chunk_without_a_data_directory(name: str) -> None:
    """A broker without a data directory keeps streams in a private temporary store; a
    confirm still comes only once the chunk holding the publish is written there, so each
    confirmed message is already counted (and readable) when the next command arrives."""
    with run_broker(record=False) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        declare(ch, name)
        ch.confirm_delivery()
        counted = []
        for _ in range(50):
            ch.basic_publish("", name, b"x" * 10)
            counted.append(ch.queue_declare(name, passive=True).method.message_count)
        assert counted == list(range(1, 51))
        conn.close()


# ---- durability ----


def test_log_and_offsets_survive_a_restart(tmp_path: Path, name: str) -> None:
    with run_broker(data_dir=str(tmp_path)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        declare(ch, name)
        publish(ch, name, [b"%d" % i for i in range(10)], headers={"k": "v"})
        conn.close()
        running.restart()
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert ch.queue_declare(name, passive=True).method.message_count == 10
        publish(ch, name, [b"after"])
        got = consume(ch, name, 11, {"x-stream-offset": 5})
        assert [(o, b) for o, b, _ in got] == [(5 + i, b"%d" % (5 + i)) for i in range(5)] + [
            (10, b"after")
        ]
        assert got[0][2] == {"k": "v", "x-stream-offset": 5}
        conn.close()


def _publisher(url: str, queue: str, confirmed: list[int]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    i = 0
    try:
        while True:
            ch.basic_publish("", queue, b"%08d" % i)
            confirmed.append(i)
            i += 1
    except (pika.exceptions.AMQPError, OSError):
        pass


@pytest.mark.parametrize("round_", range(3))
def test_kill_9_keeps_every_confirmed_message_and_offset(tmp_path: Path, round_: int) -> None:
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(str(tmp_path), port)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    declare(conn.channel(), "crash.s")
    conn.close()
    confirmed: list[int] = []
    worker = threading.Thread(target=_publisher, args=(url, "crash.s", confirmed))
    worker.start()
    deadline = time.monotonic() + 5
    while len(confirmed) < 200 * (round_ + 1) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    worker.join(10)
    snapshot = list(confirmed)
    assert snapshot, "the publisher never got a confirm before the kill"
    proc = start_server(str(tmp_path), port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        count = ch.queue_declare("crash.s", passive=True).method.message_count
        assert count >= len(snapshot)
        got = consume(ch, "crash.s", count, {"x-stream-offset": "first"}, prefetch=500)
        assert [o for o, _, _ in got] == list(range(count))  # every offset, in order, once
        assert [int(b) for _, b, _ in got] == list(range(count))
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def _fanout_publisher(url: str, confirmed: list[int]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    i = 0
    try:
        while True:
            ch.basic_publish("crash.both", "", b"%08d" % i, pika.BasicProperties(delivery_mode=2))
            confirmed.append(i)
            i += 1
    except (pika.exceptions.AMQPError, OSError):
        pass


def test_kill_9_with_a_stream_and_a_classic_queue_in_the_same_batches(tmp_path: Path) -> None:
    """A fanout to a durable classic queue and a stream puts the store's records and the
    stream's chunk in one batch (one writer job, confirmed after the fsync), while another
    publisher's stream-only batches are confirmed once written; after kill -9 every
    confirmed message is in each queue, every offset once and in order."""
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(str(tmp_path), port)
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.exchange_declare("crash.both", "fanout", durable=True)
    for queue, args in (("crash.c", {}), ("crash.s", STREAM), ("crash.s2", STREAM)):
        ch.queue_declare(queue, durable=True, arguments=args)
    for queue in ("crash.c", "crash.s"):
        ch.queue_bind(queue, "crash.both")
    conn.close()
    both: list[int] = []
    alone: list[int] = []
    workers = [
        threading.Thread(target=_fanout_publisher, args=(url, both)),
        threading.Thread(target=_publisher, args=(url, "crash.s2", alone)),
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 10
    while (len(both) < 300 or len(alone) < 300) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for worker in workers:
        worker.join(10)
    assert both and alone, "a publisher never got a confirm before the kill"
    proc = start_server(str(tmp_path), port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        assert ch.queue_declare("crash.c", passive=True).method.message_count >= len(both)
        for queue, confirmed in (("crash.s", both), ("crash.s2", alone)):
            count = ch.queue_declare(queue, passive=True).method.message_count
            assert count >= len(confirmed)
            got = consume(ch, queue, count, {"x-stream-offset": "first"}, prefetch=500)
            assert [o for o, _, _ in got] == list(range(count))
            assert [int(b) for _, b, _ in got] == list(range(count))
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_aio_pika_replays_a_stream(broker: Any, name: str) -> None:
    async def run() -> list[tuple[int, bytes]]:
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(name, durable=True, arguments=STREAM)
            for i in range(5):
                await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), name)
            await channel.set_qos(prefetch_count=2)
            got: list[tuple[int, bytes]] = []
            async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
                async for message in it:
                    await message.ack()
                    got.append((message.headers["x-stream-offset"], message.body))
                    if len(got) == 5:
                        break
            return got

    got = asyncio.run(run())
    assert got == [(i, b"%d" % i) for i in range(5)]


# ---- refusals ----


@pytest.mark.parametrize(
    ("arg", "value", "reason"),
    [
        ("x-max-age", "1X", "invalid_max_age"),
        # RabbitMQ 4.3 rabbit_amqqueue:check_max_age/1 refuses it (3.10 crashed with 541)
        ("x-max-age", "bad", "invalid_max_age"),
        ("x-max-age", "0s", "invalid_max_age"),
        ("x-max-age", 5, "{unacceptable_type,signedint}"),
        ("x-max-length-bytes", -1, "{value_negative,-1}"),
        ("x-max-length-bytes", "a", '"expected integer, got longstr"'),
        ("x-stream-max-segment-size-bytes", -1, "{value_negative,-1}"),
        ("x-initial-cluster-size", 0, "{value_zero,0}"),
    ],
)
def test_invalid_stream_arguments(
    conn: BlockingConnection, name: str, arg: str, value: Any, reason: str
) -> None:
    code, text = closed_with(conn, lambda ch: declare(ch, name, **{arg: value}))
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/': {reason}"
    )


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("x-message-ttl", 1000),
        ("x-dead-letter-exchange", "dlx"),
        ("x-max-priority", 5),
        ("x-expires", 1000),
        ("x-max-length", 10),
        ("x-overflow", "reject-publish"),
        ("x-single-active-consumer", True),
        ("x-delivery-limit", 3),
        ("x-queue-mode", "lazy"),
        # RabbitMQ 4.3: not among rabbit_stream_queue:capabilities/0 queue_arguments
        # (3.10 accepted it)
        ("x-consumer-timeout", 1000),
    ],
)
def test_arguments_of_other_queue_types_are_refused(
    conn: BlockingConnection, name: str, arg: str, value: Any
) -> None:
    code, text = closed_with(conn, lambda ch: declare(ch, name, **{arg: value}))
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/' "
        "of queue type rabbit_stream_queue",
    )


def test_stream_limits_of_rabbitmq_4_3(conn: BlockingConnection, name: str) -> None:
    """rabbit_stream_queue:check_max_segment_size_bytes/1 and check_filter_size/1 (v4.3.5)."""
    code, text = closed_with(
        conn, lambda ch: declare(ch, name, **{"x-stream-max-segment-size-bytes": 3_000_000_001})
    )
    assert (code, text) == (
        406, "PRECONDITION_FAILED - Exceeded max value for x-stream-max-segment-size-bytes"
    )  # fmt: skip
    for size in (10, 300):
        code, text = closed_with(
            conn, lambda ch, size=size: declare(ch, name, **{"x-stream-filter-size-bytes": size})
        )
        assert (code, text) == (
            406, "PRECONDITION_FAILED - Invalid value for x-stream-filter-size-bytes"
        )  # fmt: skip
    ch = conn.channel()
    accepted = {
        "x-max-age": "7D",
        "x-max-length-bytes": 10**9,
        "x-stream-max-segment-size-bytes": 10**6,
        "x-stream-filter-size-bytes": 32,
        "x-initial-cluster-size": 3,
    }
    declare(ch, name, **accepted)


def test_redeclare_with_other_stream_arguments(conn: BlockingConnection, name: str) -> None:
    declare(conn.channel(), name)
    code, text = closed_with(conn, lambda ch: declare(ch, name, **{"x-max-age": "1h"}))
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-age' for queue '{name}' in vhost '/': "
        "received the value '1h' of type 'longstr' but current is none",
    )


def test_basic_get_and_purge_are_not_implemented(conn: BlockingConnection, name: str) -> None:
    declare(conn.channel(), name)
    assert closed_with(conn, lambda ch: ch.basic_get(name)) == (
        540,
        f"NOT_IMPLEMENTED - basic.get not supported by stream queues queue '{name}' in vhost '/'",
    )


def test_purge_is_not_implemented(broker: Any, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    declare(conn.channel(), name)
    assert closed_with(conn, lambda ch: ch.queue_purge(name)) == (
        540,
        f"NOT_IMPLEMENTED - queue.purge not supported by stream queues queue '{name}' in vhost '/'",
    )


def test_consume_needs_a_prefetch_and_manual_acks(broker: Any, name: str) -> None:
    """rabbit_stream_queue:consume/3 at v4.3.5: the texts say 'stream queue ...' (3.10 said
    "for 'queue ...'"); no-ack with a prefetch is 540 there."""
    where = f"queue '{name}' in vhost '/'"
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    declare(conn.channel(), name)

    def no_qos(ch: BlockingChannel) -> None:
        ch.basic_consume(name, lambda *a: None)

    def no_ack_without_qos(ch: BlockingChannel) -> None:
        ch.basic_consume(name, lambda *a: None, auto_ack=True)

    prefetch = f"PRECONDITION_FAILED - consumer prefetch count is not set for stream {where}"
    assert closed_with(conn, no_qos) == (406, prefetch)
    assert closed_with(conn, no_ack_without_qos) == (406, prefetch)

    def no_ack(ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(name, lambda *a: None, auto_ack=True)

    assert closed_with(conn, no_ack) == (
        540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream {where}"
    )  # fmt: skip


def test_global_qos_on_a_stream(broker: Any, name: str, tmp_path: Path) -> None:
    """4.3 denies global_qos by default and then applies global=true per consumer
    (rabbit_channel handle_method basic.qos), so a stream consumer is accepted; where the
    feature is permitted, rabbit_stream_queue:consume/3 refuses a channel-wide prefetch."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    declare(conn.channel(), name)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    ch.basic_consume(name, lambda *a: None)
    conn.close()

    permits = {"deprecated_features_permit": (("global_qos", True),)}
    with run_broker(data_dir=str(tmp_path), **permits) as permitted:
        conn = pika.BlockingConnection(pika.URLParameters(permitted.url))
        declare(conn.channel(), name)

        def global_qos(ch: BlockingChannel) -> None:
            ch.basic_qos(prefetch_count=10)
            ch.basic_qos(prefetch_count=10, global_qos=True)
            ch.basic_consume(name, lambda *a: None)

        where = f"queue '{name}' in vhost '/'"
        assert closed_with(conn, global_qos) == (
            540, f"NOT_IMPLEMENTED - {where} does not support global qos"
        )  # fmt: skip


@pytest.mark.parametrize(("arg", "value"), [("x-priority", 3), ("x-consumer-timeout", 1000)])
def test_consumer_arguments_of_other_queue_types(
    conn: BlockingConnection, name: str, arg: str, value: Any
) -> None:
    declare(conn.channel(), name)

    def consume_with(ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(name, lambda *a: None, arguments={arg: value})

    assert closed_with(conn, consume_with) == (
        406,
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/' "
        "of queue type rabbit_stream_queue",
    )


def test_invalid_offset_argument(conn: BlockingConnection, name: str) -> None:
    """RabbitMQ 4.3 rabbit_amqqueue:check_stream_offset_arg/2 (3.10 crashed with 541)."""
    declare(conn.channel(), name)

    def consume_with(ch: BlockingChannel) -> None:
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(name, lambda *a: None, arguments={"x-stream-offset": "bogus"})

    assert closed_with(conn, consume_with) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{name}' in vhost '/': "
        '{invalid_stream_offset_arg,{longstr,<<"bogus">>}}',
    )


def test_exclusive_consumer_is_allowed(conn: BlockingConnection, name: str) -> None:
    """RabbitMQ accepts an exclusive consumer on a stream (checked on 3.10)."""
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"x"])
    ch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append(b), exclusive=True,
                     arguments={"x-stream-offset": "first"})  # fmt: skip
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert got == [b"x"]


def test_stream_policy_keys(broker: Any, name: str) -> None:
    from warren.broker.engine.policy import Policy, PolicyError

    Policy("/", "p", ".*", {"max-age": "1h", "stream-max-segment-size-bytes": 1000,
                             "stream-filter-size-bytes": 16, "initial-cluster-size": 1},
           apply_to="streams")  # fmt: skip
    for key, value, text in [
        ("max-age", "1X", "'1X' is not a valid max age"),
        ("stream-max-segment-size-bytes", -1, "-1 is not a valid segment size"),
        ("stream-filter-size-bytes", 8, "8 is not a valid filter size. Valid range is 16-255"),
        ("initial-cluster-size", -1, "-1 is not a valid cluster size"),
    ]:
        with pytest.raises(PolicyError, match=text):
            Policy("/", "p", ".*", {key: value})


# ---- retention ----


def stream_log(broker: Any, name: str) -> Any:
    return broker.call(lambda: broker.server.broker.vhosts["/"].queues[name].stream)


def test_retention_by_size_removes_whole_old_segments(broker: Any, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name, **{"x-stream-max-segment-size-bytes": 4000, "x-max-length-bytes": 10000})
    for i in range(40):  # one chunk each (confirms wait in between), ~1 KB
        publish(ch, name, [b"%04d" % i + b"x" * 1000])
    log = stream_log(broker, name)
    files = sorted(os.listdir(log.directory))
    assert len(files) == len(log.segments) <= 4
    assert 0 < log.first_offset < 40  # the oldest segments went, whole
    assert log.first_offset == log.segments[0].first
    assert sum(os.path.getsize(os.path.join(log.directory, f)) for f in files) == log.bytes
    count = ch.queue_declare(name, passive=True).method.message_count
    assert count == 40 - log.first_offset
    got = consume(ch, name, count, {"x-stream-offset": "first"})
    assert [o for o, _, _ in got] == list(range(log.first_offset, 40))
    # an offset retention removed starts at the first one kept
    got = consume(ch, name, 1, {"x-stream-offset": 0})
    assert got[0][0] == log.first_offset
    conn.close()


def test_retention_by_age(broker: Any, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name, **{"x-stream-max-segment-size-bytes": 3000, "x-max-age": "1s"})
    for _ in range(10):
        publish(ch, name, [b"x" * 1000])
    log = stream_log(broker, name)
    assert log.first_offset == 0
    segments = len(log.segments)
    assert segments >= 3
    # the broker's timer fires once the oldest segment's newest chunk is a second old
    deadline = time.monotonic() + 5
    while len(log.segments) > 1 and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    assert len(log.segments) == 1  # all but the one being written
    assert ch.queue_declare(name, passive=True).method.message_count == 10 - log.first_offset
    conn.close()


def test_retention_from_a_policy(broker: Any, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name, **{"x-stream-max-segment-size-bytes": 3000})
    for _ in range(12):
        publish(ch, name, [b"x" * 1000])
    log = stream_log(broker, name)
    assert log.first_offset == 0
    from warren.broker.engine.policy import Policy

    vhost = broker.server.broker.vhosts["/"]
    broker.call(
        vhost.set_policy,
        Policy("/", name, f"^{name}$", {"max-length-bytes": 5000}, apply_to="streams"),
    )
    assert log.first_offset > 0 and log.bytes <= 5000 + 3100
    broker.call(vhost.clear_policy, name)
    conn.close()


def test_a_consumer_reading_a_removed_segment_moves_on(broker: Any, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name, **{"x-stream-max-segment-size-bytes": 2000, "x-max-length-bytes": 4000})
    publish(ch, name, [b"first"])
    ch.basic_qos(prefetch_count=1)
    got: list[Any] = []
    ch.basic_consume(name, lambda c, m, p, b: got.append((m, p)), arguments={"x-stream-offset": 0})
    while not got:
        conn.process_data_events(0.05)
    other = conn.channel()
    for _ in range(20):
        publish(other, name, [b"y" * 1000])
    log = stream_log(broker, name)
    assert log.first_offset > 1
    ch.basic_ack(got[0][0].delivery_tag)
    while len(got) < 2:
        conn.process_data_events(0.05)
    assert got[1][1].headers["x-stream-offset"] >= log.first_offset - 1
    conn.close()


# ---- filtering ----


def test_filtering_is_exact(conn: BlockingConnection, name: str) -> None:
    """Warren filters each message on the server (RabbitMQ's Bloom filter may let unmatched
    ones through, so RabbitMQ's clients filter again; with Warren that finds nothing to drop)."""
    ch = conn.channel()
    declare(ch, name)
    publish(ch, name, [b"ca1"], headers={"x-stream-filter-value": "california"})
    publish(ch, name, [b"tx1"], headers={"x-stream-filter-value": "texas"})
    publish(ch, name, [b"none"])
    ch.confirm_delivery()
    for body, value in ((b"ca2", "california"), (b"ny", "new york"), (b"bare", None)):
        headers = {"x-stream-filter-value": value} if value else None
        ch.basic_publish("", name, body, pika.BasicProperties(headers=headers))

    def bodies(args: dict[str, Any], count: int) -> list[bytes]:
        args = {"x-stream-offset": "first", **args}
        return [b for _, b, _ in consume(conn.channel(), name, count, args, timeout=0.5)]

    assert bodies({"x-stream-filter": "california"}, 9) == [b"ca1", b"ca2"]
    assert bodies({"x-stream-filter": ["texas", "new york"]}, 9) == [b"tx1", b"ny"]
    assert bodies({"x-stream-filter": "california", "x-stream-match-unfiltered": True}, 9) == [
        b"ca1", b"none", b"ca2", b"bare"
    ]  # fmt: skip
    assert bodies({"x-stream-filter": "nowhere"}, 9) == []
    assert len(bodies({}, 6)) == 6  # no filter: everything


# ---- management API, definitions, Prometheus, warrenctl, tracing ----


def test_management_metrics_definitions_and_warrenctl_show_streams(
    tmp_path: Path, name: str
) -> None:
    import json
    import subprocess
    import sys
    import urllib.request

    from http_api import HttpApi

    with run_broker(data_dir=str(tmp_path), management_port=0, prometheus_port=0) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        declare(ch, name, **{"x-max-age": "7D"})
        publish(ch, name, [b"a", b"b", b"c"])
        ch.basic_qos(prefetch_count=1)
        got: list[Any] = []
        ch.basic_consume(name, lambda c, m, p, b: got.append(m), consumer_tag="reader-1",
                         arguments={"x-stream-offset": 1})  # fmt: skip
        while not got:
            conn.process_data_events(0.05)
        api = HttpApi(running.server.management_port)
        queue = api.get(f"/api/queues/%2F/{name}").body
        assert queue["type"] == "stream"
        assert (queue["messages"], queue["messages_ready"], queue["messages_unacknowledged"]) == (
            3,
            3,
            0,
        )  # fmt: skip — rabbit_osiris_metrics: ready = messages, unacked 0
        assert queue["arguments"] == {"x-queue-type": "stream", "x-max-age": "7D"}
        assert queue["segments"] == 1 and queue["committed_offset"] == 2
        assert queue["first_offset"] == 0
        # rabbit_stream_queue:readers/1: {Node, Count}, which the API shows as an object
        assert queue["readers"] == {api.get("/api/overview").body["node"]: 1}
        assert queue["reader_offsets"] == [{"consumer_tag": "reader-1", "channel": 1, "offset": 2}]
        assert [c["consumer_tag"] for c in queue["consumer_details"]] == ["reader-1"]
        exported = api.get("/api/definitions").body
        mine = [q for q in exported["queues"] if q["name"] == name]
        assert mine and mine[0]["arguments"]["x-queue-type"] == "stream"
        port = running.server.prometheus_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/per-object") as resp:
            text = resp.read().decode()
        assert f'rabbitmq_queue_messages{{vhost="/",queue="{name}"}} 3' in text
        result = subprocess.run(
            [sys.executable, "-m", "warren.broker.tools.warrenctl", "--url",
             f"http://127.0.0.1:{running.server.management_port}", "list_queues", "name",
             "type", "messages", "--formatter", "json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        rows = [r for r in json.loads(result.stdout) if r["name"] == name]
        assert rows == [{"name": name, "type": "stream", "messages": 3}]
        conn.close()
        # definitions re-import as a stream
        api.request("DELETE", f"/api/queues/%2F/{name}")
        assert api.request("POST", "/api/definitions", {"queues": mine}).status in (200, 201, 204)
        assert api.get(f"/api/queues/%2F/{name}").body["type"] == "stream"


def test_tracing_records_stream_publishes_and_deliveries(tmp_path: Path, name: str) -> None:
    from test_tracing import history, of, read_trace

    trace_dir = tmp_path / "trace"
    with run_broker(trace_enabled=True, trace_dir=str(trace_dir)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        declare(ch, name)
        publish(ch, name, [b"x"])
        got = consume(ch, name, 1, {"x-stream-offset": "first"})
        got += consume(conn.channel(), name, 1, {"x-stream-offset": "first"})
        assert len(got) == 2
        conn.close()
        events = read_trace(running, trace_dir)
    msg = of(events, "published")[0]["msg"]
    assert history(events, msg) == [
        "published:", "routed:", f"delivered:{name}", f"acked:{name}", f"delivered:{name}",
        f"acked:{name}",
    ]  # fmt: skip


def test_management_purge_and_get_on_a_stream_are_refused(name: str) -> None:
    from http_api import HttpApi

    with run_broker(management_port=0) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        declare(conn.channel(), name)
        conn.close()
        api = HttpApi(running.server.management_port)
        reply = api.request("DELETE", f"/api/queues/%2F/{name}/contents")
        assert reply.status == 400
        assert "queue.purge not supported by stream queues" in reply.body["reason"]
        body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
        reply = api.request("POST", f"/api/queues/%2F/{name}/get", body)
        assert reply.status == 400
        assert "basic.get not supported by stream queues" in reply.body["reason"]


def test_deleting_streams_removes_their_files_and_leaks_no_descriptor(
    broker: Any, name: str
) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    declare(ch, name + "-warm")
    ch.queue_delete(name + "-warm")
    ch.basic_qos(prefetch_count=10)
    before = len(os.listdir("/proc/self/fd"))
    directories = []
    for i in range(20):
        stream = f"{name}-{i}"
        declare(ch, stream)
        directories.append(stream_log(broker, stream).directory)
        ch.basic_consume(stream, lambda *a: None, arguments={"x-stream-offset": "first"})
        ch.basic_publish("", stream, b"x")  # deleted in the same turn as this publish
        ch.queue_delete(stream)
    declare(ch, name)
    publish(ch, name, [b"still fine"])
    assert [b for _, b, _ in consume(ch, name, 1, {"x-stream-offset": "first"})] == [b"still fine"]
    assert not [d for d in directories if os.path.exists(d)]
    assert len(os.listdir("/proc/self/fd")) <= before + 3
    conn.close()


def test_segments_and_retention_survive_a_restart(tmp_path: Path, name: str) -> None:
    with run_broker(data_dir=str(tmp_path)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        args = {
            "x-stream-max-segment-size-bytes": 3000,
            "x-max-length-bytes": 8000,
            "x-max-age": "1h",
        }
        declare(ch, name, **args)
        for i in range(30):
            publish(ch, name, [b"%04d" % i + b"x" * 996])
        log = stream_log(running, name)
        first, segments = log.first_offset, len(log.segments)
        assert first > 0 and segments > 1
        conn.close()
        running.restart()
        log = stream_log(running, name)
        assert (log.first_offset, len(log.segments), log.next_offset) == (first, segments, 30)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert ch.queue_declare(name, passive=True).method.message_count == 30 - first
        got = consume(ch, name, 1, {"x-stream-offset": "last"})
        assert [o for o, _, _ in got] == [29]
        publish(ch, name, [b"after"])
        got = consume(ch, name, 31 - first, {"x-stream-offset": "first"})
        assert [o for o, _, _ in got] == list(range(first, 31))
        assert got[-1][1] == b"after"
        conn.close()
