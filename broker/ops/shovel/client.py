"""A small AMQP 0-9-1 client for the shovel, on asyncio streams and Warren's sans-IO codec.

It speaks what a shovel needs and nothing more: the handshake (PLAIN), channels,
synchronous methods one at a time per channel, consuming (deliveries with their raw
property bytes, so a forwarded message keeps every byte its publisher sent), publishing,
publisher confirms, connection.blocked, heartbeats. The frames are read and written with
``warren.protocol`` (methods, content frames), the same code the broker uses.

Deliveries and confirms are handed to callbacks as they are read: no task or future per
message. ``closed`` resolves when the connection ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from typing import Any

from pamqp import commands

from warren.protocol.frames import HEARTBEAT_FRAME, content_frames
from warren.protocol.methods import (
    BasicAck,
    BasicNack,
    ack_frame,
    decode_method,
    make,
    method_frame,
    nack_frame,
    shortstr,
)

_HEAD = struct.Struct(">BHI")
_TAG = struct.Struct(">Q")
DELIVER = b"\x00\x3c\x00\x3c"  # basic.deliver: class 60, method 60
PUBLISH = b"\x00\x3c\x00\x28\x00\x00"  # basic.publish and its reserved short
READ_SIZE = 256 * 1024
_CONTENT = struct.Struct(">HHQ")  # class, weight, body size
FRAME_END = 0xCE
PRODUCT = "Warren shovel"


class ClientClosed(Exception):
    """The connection or channel is gone; ``code`` is the AMQP reply code if the peer sent one."""

    def __init__(self, text: str, code: int = 0) -> None:
        super().__init__(text)
        self.code = code


# (channel, method, raw properties, body)
DeliverCallback = Callable[[int, Any, bytes, bytes], None]
ConfirmCallback = Callable[[int, bool, bool], None]  # (tag, multiple, ack)


class Deliver:
    """basic.deliver, decoded by hand: it comes once per message."""

    __slots__ = ("consumer_tag", "delivery_tag", "exchange", "redelivered", "routing_key")

    def __init__(
        self, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str, key: str
    ) -> None:
        self.consumer_tag = consumer_tag
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = key

    @staticmethod
    def decode(payload: bytes) -> Deliver:
        off = 5 + payload[4]
        tag = payload[5:off].decode("utf-8", "surrogateescape")
        (delivery_tag,) = _TAG.unpack_from(payload, off)
        redelivered = bool(payload[off + 8] & 1)
        off += 9
        end = off + 1 + payload[off]
        exchange = payload[off + 1 : end].decode("utf-8", "surrogateescape")
        key = payload[end + 1 : end + 1 + payload[end]].decode("utf-8", "surrogateescape")
        return Deliver(tag, delivery_tag, redelivered, exchange, key)


def _closed_by_peer(method: Any) -> ClientClosed:
    """What a channel.close or connection.close from the peer says."""
    return ClientClosed(f"{method.reply_code} {method.reply_text}", method.reply_code or 0)


class Channel:
    def __init__(self, client: Client, number: int) -> None:
        self.client = client
        self.number = number
        self.waiter: asyncio.Future[Any] | None = None
        self.expect: tuple[type, ...] = ()
        self.closed: ClientClosed | None = None
        self.on_deliver: DeliverCallback | None = None
        self.on_confirm: ConfirmCallback | None = None
        self.on_cancel: Callable[[], None] | None = None
        self.next_seq = 1  # publish sequence number once confirms are on
        # the delivery being assembled: (method, raw properties, expected size, parts)
        self._content: tuple[Any, bytes, int, list[bytes]] | None = None

    async def call(self, method: Any, *expect: type) -> Any:
        """Send a synchronous method and wait for its reply (one at a time)."""
        self._check()
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.expect = expect
        self.client.write(method_frame(self.number, method))
        try:
            return await self.waiter
        finally:
            self.waiter = None

    def _check(self) -> None:
        if self.closed is not None:
            raise self.closed
        if self.client.error is not None:
            raise self.client.error

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> int:
        """Write one message; its confirm sequence number (meaningful once confirms are on)."""
        self._check()
        names = shortstr(exchange) + shortstr(routing_key)
        head = _HEAD.pack(1, self.number, 7 + len(names)) + PUBLISH
        frames = [head, names, b"\x00\xce"]
        frames += content_frames(self.number, properties, body, self.client.frame_max)
        self.client.write(b"".join(frames))
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def ack(self, tag: int, multiple: bool = False) -> None:
        if self.closed is None and self.client.error is None:
            self.client.write(ack_frame(self.number, tag, multiple))

    def nack(self, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        if self.closed is None and self.client.error is None:
            if requeue:
                self.client.write(nack_frame(self.number, tag, multiple))
            else:
                method = commands.Basic.Nack(tag, multiple, requeue)
                self.client.write(method_frame(self.number, method))

    async def close(self) -> None:
        if self.closed is None and self.client.error is None:
            with contextlib.suppress(ClientClosed):
                close = commands.Channel.Close(200, "Goodbye", 0, 0)
                await self.call(close, commands.Channel.CloseOk)
        self.closed = self.closed or ClientClosed("channel closed")
        self.client.channels.pop(self.number, None)

    # -- frames in ------------------------------------------------------------------------

    def method(self, method: Any) -> None:
        if isinstance(method, Deliver):
            self._content = (method, b"", -1, [])
        elif isinstance(method, BasicAck | BasicNack):
            if self.on_confirm is not None:
                self.on_confirm(method.delivery_tag, method.multiple, isinstance(method, BasicAck))
        elif isinstance(method, commands.Channel.Close):
            self.client.write(method_frame(self.number, commands.Channel.CloseOk()))
            self._gone(_closed_by_peer(method))
        elif isinstance(method, commands.Basic.Cancel):
            if self.on_cancel is not None:
                self.on_cancel()
        elif self.waiter is not None and not self.waiter.done():
            if isinstance(method, self.expect):
                self.waiter.set_result(method)
            else:
                self.waiter.set_exception(ClientClosed(f"unexpected {method.name}"))

    def header(self, payload: bytes) -> None:
        if self._content is None:
            return
        method = self._content[0]
        _, _, size = _CONTENT.unpack_from(payload, 0)
        self._content = (method, bytes(payload[12:]), size, [])
        if size == 0:
            self._deliver()

    def body(self, payload: bytes) -> None:
        content = self._content
        if content is None:
            return
        parts = content[3]
        parts.append(payload)
        if len(parts) == 1 and len(payload) >= content[2]:
            self._deliver()  # the usual case: one body frame
        elif sum(len(p) for p in parts) >= content[2]:
            self._deliver()

    def _deliver(self) -> None:
        assert self._content is not None
        method, properties, _, parts = self._content
        self._content = None
        if self.on_deliver is not None:
            self.on_deliver(self.number, method, properties, b"".join(parts))

    def _gone(self, error: ClientClosed) -> None:
        self.closed = error
        self.client.channels.pop(self.number, None)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)


class Client:
    """One AMQP connection; build it with :func:`connect`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.channels: dict[int, Channel] = {}
        self.frame_max = 131072
        self.heartbeat = 0
        self.error: ClientClosed | None = None
        self.closed: asyncio.Future[ClientClosed] = asyncio.get_running_loop().create_future()
        self.blocked = False
        self.on_blocked: Callable[[bool], None] | None = None
        self._handshake: asyncio.Queue[Any] = asyncio.Queue()
        self._next_channel = 1
        self._reader_task: asyncio.Task[None] | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._received = 0  # frames read since the last heartbeat check
        self._out: list[bytes] = []
        self._out_size = 0  # bytes in _out
        self._flush_scheduled = False
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        """Queue bytes; they go out together at the end of this loop turn (one send for all
        the frames a read produced)."""
        if self.error is not None:
            return
        self._out.append(data)
        self._out_size += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.error is None:
            self.writer.write(b"".join(self._out))
        self._out.clear()
        self._out_size = 0

    def write_buffer_size(self) -> int:
        return self.writer.transport.get_write_buffer_size() + self._out_size

    async def drain(self) -> None:
        self._flush()
        await self.writer.drain()

    def pause_reading(self) -> None:
        transport: Any = self.writer.transport
        with contextlib.suppress(Exception):
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport: Any = self.writer.transport
        with contextlib.suppress(Exception):
            transport.resume_reading()

    async def channel(self) -> Channel:
        number = self._next_channel
        self._next_channel += 1
        channel = Channel(self, number)
        self.channels[number] = channel
        await channel.call(commands.Channel.Open(), commands.Channel.OpenOk)
        return channel

    async def close(self) -> None:
        """connection.close, waiting briefly for close-ok; the socket is closed in any case."""
        if self.error is None:
            self.write(method_frame(0, commands.Connection.Close(200, "Goodbye", 0, 0)))
            self._flush()
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self.closed), 2.0)
        self._lost(ClientClosed("closed by the shovel"))

    def abort(self) -> None:
        self._lost(ClientClosed("closed by the shovel"))

    # -- reading --------------------------------------------------------------------------

    async def _read_frames(self) -> None:
        """Read what the socket has and handle every complete frame in it, then flush once."""
        reader = self.reader
        buf = bytearray()
        try:
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    raise ClientClosed("connection lost")
                buf += data
                off = 0
                size = len(buf)
                while size - off >= 7:
                    kind, number, length = _HEAD.unpack_from(buf, off)
                    end = off + 7 + length
                    if end >= size:
                        break
                    if buf[end] != FRAME_END:
                        raise ClientClosed("frame end octet missing")
                    self._received += 1
                    self._frame(kind, number, bytes(buf[off + 7 : end]))
                    off = end + 1
                del buf[:off]
        except (ConnectionError, OSError):
            self._lost(ClientClosed("connection lost"))
        except ClientClosed as exc:
            self._lost(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a frame the codec refused: the connection cannot go on
            self._lost(ClientClosed(f"protocol error: {exc}"))

    def _frame(self, kind: int, number: int, payload: bytes) -> None:
        if kind == 1:
            method = Deliver.decode(payload) if payload[:4] == DELIVER else decode_method(payload)
            if number == 0:
                self._connection_method(method)
            else:
                channel = self.channels.get(number)
                if channel is not None:
                    channel.method(method)
        elif kind == 2:
            channel = self.channels.get(number)
            if channel is not None:
                channel.header(payload)
        elif kind == 3:
            channel = self.channels.get(number)
            if channel is not None:
                channel.body(payload)
        # kind 8: a heartbeat; counted above

    def _connection_method(self, method: Any) -> None:
        if isinstance(method, commands.Connection.Close):
            self.write(method_frame(0, commands.Connection.CloseOk()))
            self._lost(_closed_by_peer(method))
        elif isinstance(method, commands.Connection.CloseOk):
            self._lost(ClientClosed("closed by the shovel"))
        elif isinstance(method, commands.Connection.Blocked | commands.Connection.Unblocked):
            self.blocked = isinstance(method, commands.Connection.Blocked)
            if self.on_blocked is not None:
                self.on_blocked(self.blocked)
        else:
            self._handshake.put_nowait(method)

    def _lost(self, error: ClientClosed) -> None:
        if self.error is not None:
            return
        self.error = error
        for channel in list(self.channels.values()):
            channel._gone(error)
        if not self.closed.done():
            self.closed.set_result(error)
        self._handshake.put_nowait(error)
        with contextlib.suppress(Exception):
            if self._out:
                self.writer.write(b"".join(self._out))
            self._out.clear()
            self.writer.close()
        current = asyncio.current_task()
        for task in (self._reader_task, self._beat_task):
            if task is not None and task is not current:
                task.cancel()

    async def _beat(self, interval: float) -> None:
        """Send a heartbeat every half interval; two intervals without a frame: the peer is gone."""
        silent = 0.0
        while True:
            await asyncio.sleep(interval / 2)
            self.write(HEARTBEAT_FRAME)
            if self._received:
                self._received = 0
                silent = 0.0
            else:
                silent += interval / 2
                if silent >= 2 * interval:
                    self._lost(ClientClosed("missed heartbeats from the peer"))
                    return

    async def _expect(self, kind: type) -> Any:
        item = await self._handshake.get()
        if isinstance(item, ClientClosed):
            raise item
        if not isinstance(item, kind):
            raise ClientClosed(f"unexpected {getattr(item, 'name', item)} in the handshake")
        return item


async def connect(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    user: str,
    password: str,
    vhost: str,
    heartbeat: int,
    connection_name: str,
) -> Client:
    """The handshake on an open stream; raises ClientClosed if the broker refuses it."""
    client = Client(reader, writer)
    client._reader_task = asyncio.get_running_loop().create_task(client._read_frames())
    try:
        writer.write(b"AMQP\x00\x00\x09\x01")
        await client._expect(commands.Connection.Start)
        properties = {
            "product": PRODUCT,
            "connection_name": connection_name,
            "capabilities": {
                "publisher_confirms": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "authentication_failure_close": True,
            },
        }
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        start_ok = make(
            commands.Connection.StartOk,
            client_properties=properties,
            mechanism="PLAIN",
            response=response,
            locale="en_US",
        )
        client.write(method_frame(0, start_ok))
        tune = await client._expect(commands.Connection.Tune)
        client.frame_max = tune.frame_max or client.frame_max
        beat = min(tune.heartbeat, heartbeat) if tune.heartbeat and heartbeat else 0
        client.heartbeat = beat
        channel_max = tune.channel_max or 2047
        tune_ok = commands.Connection.TuneOk(channel_max, client.frame_max, beat)
        client.write(method_frame(0, tune_ok))
        client.write(method_frame(0, commands.Connection.Open(virtual_host=vhost)))
        await client._expect(commands.Connection.OpenOk)
    except BaseException:
        client.abort()
        raise
    if beat:
        client._beat_task = asyncio.get_running_loop().create_task(client._beat(beat))
    return client
