"""Record what real clients send, as seeds for the fuzzers: ``python tests/fuzz_capture.py``.

A small recording proxy sits between pika / aio-pika and an in-process
Warren; every byte a client sends is written to ``tests/fuzz_seeds/<name>.amqp``.
The sessions cover the handshake, declarations with arguments, bindings,
publishes with nested header tables, confirms, transactions, consumers,
acks/nacks/rejects, several channels interleaved, channel and connection
close. Re-run it when a client library changes how it talks; the fuzz tests
check that every seed still replays without an error. Names of sessions as
arguments record only those.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

SEEDS = Path(__file__).resolve().parent / "fuzz_seeds"
sys.path.insert(0, str(SEEDS.parent.parent))

import aio_pika  # noqa: E402
import pika  # noqa: E402

from warren.broker.testkit import run_broker  # noqa: E402

HEADERS = {
    "trace": "abc",
    "n": 3,
    "big": 2**40,
    "neg": -7,
    "flag": True,
    "none": None,
    "when": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    "price": decimal.Decimal("12.34"),
    "raw": b"\x00\xff",
    "list": [1, "two", [3, {"deep": {"deeper": ["x"]}}]],
    "nested": {"ok": True, "inner": {"a": 1, "b": [None, False]}},
}

# pamqp (under aio-pika) encodes floats but not byte strings; pika the other way round
AIO_HEADERS = {**{k: v for k, v in HEADERS.items() if k != "raw"}, "f": 1.5}


class RecordingProxy:
    """Forwards 127.0.0.1:<port> to the broker, keeping what each client sent."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sent: list[bytearray] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        record = bytearray()
        self.sent.append(record)
        b_reader, b_writer = await asyncio.open_connection(*self.target)

        async def pump(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bytearray | None
        ) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    if keep is not None:
                        keep += data
                    writer.write(data)
                    await writer.drain()
            with contextlib.suppress(OSError):
                writer.close()

        await asyncio.gather(pump(c_reader, b_writer, record), pump(b_reader, c_writer, None))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def pika_session(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.exchange_declare("seed.topic", "topic", durable=False, auto_delete=True)
    ch.queue_declare(
        "seed.pika",
        arguments={"x-message-ttl": 60000, "x-max-length": 1000, "x-queue-mode": "default"},
    )
    ch.queue_bind("seed.pika", "seed.topic", "a.*.c")
    ch.queue_bind("seed.pika", "seed.topic", "#", arguments={"x-match": "all"})
    ch.basic_qos(prefetch_count=10)
    ch.confirm_delivery()
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers=HEADERS,
        delivery_mode=2,
        priority=3,
        correlation_id="corr-1",
        reply_to="replies",
        expiration="60000",
        message_id="m-1",
        timestamp=1700000000,
        type="kind",
        user_id="guest",
        app_id="seed",
    )
    ch.basic_publish("seed.topic", "a.b.c", b'{"hello": "world"}', props)
    ch.basic_publish("", "seed.pika", b"x" * 5000, pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("", "seed.pika", b"", None)
    for method, _props, _body in ch.consume("seed.pika", inactivity_timeout=0.5):
        if method is None:
            break
        if method.delivery_tag == 1:
            ch.basic_nack(method.delivery_tag, requeue=False)
        elif method.delivery_tag == 2:
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)
    ch.cancel()
    ch.basic_get("seed.pika", auto_ack=True)
    tx = conn.channel()
    tx.tx_select()
    tx.basic_publish("", "seed.pika", b"in tx")
    tx.tx_commit()
    tx.basic_publish("", "seed.pika", b"rolled back")
    tx.tx_rollback()
    tx.close()
    ch.queue_purge("seed.pika")
    ch.queue_unbind("seed.pika", "seed.topic", "a.*.c")
    ch.queue_delete("seed.pika")
    ch.exchange_delete("seed.topic")
    ch.close()
    conn.close()


def pika_large(url: str) -> None:
    """A body split over several frames, and a channel error the client recovers from."""
    conn = pika.BlockingConnection(pika.URLParameters(url + "?frame_max=8192"))
    ch = conn.channel()
    ch.queue_declare("seed.large", exclusive=True)
    ch.basic_publish("", "seed.large", bytes(range(256)) * 80)  # three body frames
    ch.basic_get("seed.large", auto_ack=True)
    with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare("seed.missing", passive=True)
    ch2 = conn.channel()
    ch2.queue_delete("seed.large")
    conn.close()


async def aio_pika_session(url: str) -> None:
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.set_qos(prefetch_count=5)
        ex = await ch.declare_exchange(
            "seed.direct", aio_pika.ExchangeType.DIRECT, auto_delete=True
        )
        hx = await ch.declare_exchange(
            "seed.headers", aio_pika.ExchangeType.HEADERS, auto_delete=True
        )
        q = await ch.declare_queue(
            "", exclusive=True, arguments={"x-max-priority": 5, "x-overflow": "reject-publish"}
        )
        await q.bind(ex, "rk")
        await q.bind(hx, arguments={"x-match": "any", "trace": "abc", "n": 3})
        for i in range(3):
            await ex.publish(
                aio_pika.Message(
                    f"msg {i}".encode(), headers=AIO_HEADERS, priority=i, correlation_id=str(i)
                ),
                "rk",
            )
        await hx.publish(aio_pika.Message(b"by headers", headers={"trace": "abc"}), "")
        await ch.default_exchange.publish(aio_pika.Message(b"unroutable"), "nowhere")
        seen = 0
        async with q.iterator() as it:
            async for message in it:
                seen += 1
                if seen == 1:
                    await message.reject(requeue=True)
                elif seen == 2:
                    await message.nack(requeue=False)
                else:
                    await message.ack()
                if seen >= 4:
                    break
        got = await q.get(no_ack=False, fail=False)
        if got is not None:
            await got.ack()
        await q.unbind(ex, "rk")
        await q.delete(if_unused=False, if_empty=False)
        await ex.delete()


async def aio_pika_interleaved(url: str) -> None:
    """Several channels publishing and consuming at once: their frames interleave."""
    conn = await aio_pika.connect(url)
    async with conn:
        channels = [await conn.channel(publisher_confirms=(i % 2 == 0)) for i in range(4)]
        queue = await channels[0].declare_queue("seed.shared", auto_delete=True)

        async def publish(ch: aio_pika.abc.AbstractChannel, n: int) -> None:
            for i in range(5):
                body = bytes([n]) * (100 + 3000 * (i % 2))
                await ch.default_exchange.publish(aio_pika.Message(body), "seed.shared")

        await asyncio.gather(*(publish(ch, n) for n, ch in enumerate(channels)))
        received = 0
        async with queue.iterator(no_ack=True) as it:
            async for _message in it:
                received += 1
                if received == 20:
                    break
        for ch in channels[1:]:
            await ch.close()


async def main() -> None:
    SEEDS.mkdir(exist_ok=True)
    async with run_broker(management_port=None) as broker:
        sessions: dict[str, Callable[[str], Awaitable[None]]] = {
            "pika_session": lambda url: asyncio.to_thread(pika_session, url),
            "pika_large": lambda url: asyncio.to_thread(pika_large, url),
            "aio_pika_session": aio_pika_session,
            "aio_pika_interleaved": aio_pika_interleaved,
        }
        for name, session in sessions.items():
            if sys.argv[1:] and name not in sys.argv[1:]:
                continue  # `python tests/fuzz_capture.py pika_large` records that one only
            proxy = RecordingProxy((broker.host, broker.port))
            port = await proxy.start()
            await session(f"amqp://guest:guest@127.0.0.1:{port}/")
            await asyncio.sleep(0.2)  # let the pumps see the end of the stream
            await proxy.stop()
            for i, record in enumerate(proxy.sent):
                path = SEEDS / (name + (f"_{i}" if i else "") + ".amqp")
                path.write_bytes(bytes(record))
                print(f"{path.relative_to(SEEDS.parent.parent)}: {len(record)} bytes")


if __name__ == "__main__":
    asyncio.run(main())
