"""The engine in memory: no socket, no event loop, time that moves only by hand.

After uvicorn's MockTransport/MockLoop and h11's ConnectionPair: a real
:class:`Broker` whose two clocks are one :class:`ManualLoop`, and clients that
talk to it through the seam the asyncio server uses (``Connection.data_received``
and a transport), encoding frames with ``protocol/`` and decoding what the broker
wrote back into methods. Nothing runs until the test says so, so every ordering
(a timeout at its deadline and not a millisecond before, a nack overtaking acks
that wait for the disk, the reasons a socket is not read) is asserted exactly::

    engine = MemoryBroker()
    client = engine.connect()
    client.channel_open(1)
    client.call(1, commands.Queue.Declare(queue="q", arguments={"x-message-ttl": 500}))
    client.publish(1, "", "q", b"job")
    engine.advance(0.5)                      # fires what falls due, then runs the loop
    assert engine.broker.vhosts["/"].queues["q"].ready_count == 0

Heartbeats are off (the client tunes 0), so advancing an hour closes nothing.
Disk: with ``data_dir`` the real message store runs, writer thread included, but
what it reports (a batch is on disk) reaches the engine only at :meth:`MemoryBroker.sync`.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from struct import Struct
from typing import Any, cast

from pamqp import commands

from warren.broker.engine.broker import Broker
from warren.broker.engine.timers import ManualTimers, TimerHandle
from warren.broker.server.amqp_connection import Connection
from warren.broker.testkit.recorder import start_recording
from warren.config import Settings
from warren.protocol.constants import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
)
from warren.protocol.frames import content_frames
from warren.protocol.methods import decode_method, make, method_frame
from warren.protocol.properties import decode_field, split_properties

__all__ = [
    "Delivery",
    "ManualLoop",
    "MemoryBroker",
    "MemoryClient",
    "MemoryTransport",
    "publish_bytes",
]

SYNC_TIMEOUT = 10.0  # seconds the store's writer may take for a batch before it is a failure
_frame_head = Struct(">BHI")
_content_head = Struct(">HHQ")
_CONTENT_METHODS = ("Basic.Deliver", "Basic.GetOk", "Basic.Return")
# what the broker may send at any time, between a request and its reply
_ASYNC_METHODS = (
    "Basic.Ack", "Basic.Nack", "Basic.Cancel", "Channel.Flow", "Connection.Blocked",
    "Connection.Unblocked",
)  # fmt: skip


class _Soon:
    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoop(ManualTimers):
    """A broker's clock and its event loop in one, run by hand (uvicorn's MockLoop).

    ``call_soon`` callbacks wait in a queue until :meth:`run`; timers wait in
    ManualTimers' heap until :meth:`advance`. The broker uses it for both of its
    clocks (``broker.timers`` and ``broker.clock``), and the message store uses it as
    its loop: what the writer thread reports waits for :meth:`deliver_from_threads`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._now = 1000.0  # a fixed start: runs are alike to the last bit
        self._wall_offset = time.time() - self._now
        # the store asks its loop for call_soon/call_soon_threadsafe only: this object is that
        self._loop = cast(asyncio.AbstractEventLoop, self)
        self._ready: deque[_Soon] = deque()
        self._from_threads: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self.errors: list[BaseException] = []

    def time(self) -> float:
        return self._now

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> TimerHandle:
        handle = _Soon(callback, args)
        self._ready.append(handle)
        return handle

    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        self._from_threads.put((callback, args))

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self.errors.append(exc if isinstance(exc, BaseException) else RuntimeError(context))

    def run(self) -> int:
        """Run the ready callbacks, and those they schedule, until none is left."""
        ran = 0
        while self._ready:
            ran += self._call(len(self._ready))
        self.raise_errors()
        return ran

    def turn(self) -> int:
        """One loop turn: the callbacks ready now, not those they schedule."""
        ran = self._call(len(self._ready))
        self.raise_errors()
        return ran

    def _call(self, count: int) -> int:
        """The next ``count`` ready callbacks; an exception is kept, as the loop reports it."""
        ran = 0
        ready = self._ready
        for _ in range(count):
            handle = ready.popleft()
            if handle.cancelled:
                continue
            ran += 1
            try:
                handle.callback(*handle.args)
            except Exception as exc:  # as the loop does: report it, go on with the others
                self.errors.append(exc)
        return ran

    def raise_errors(self) -> None:
        """An exception in a callback is a test failure, not something to log and forget."""
        if self.errors:
            first = self.errors[0]
            self.errors.clear()
            raise first

    def advance(self, seconds: float) -> int:
        """Move time on by ``seconds``; each instant at which timers fall due is one loop
        turn (its timers, then what they scheduled), as on a real loop."""
        self.run()
        fired = super().advance(seconds)
        self.run()
        return fired

    def _turn_ended(self) -> None:
        self.run()

    def deliver_from_threads(self, until: Callable[[], bool], timeout: float) -> None:
        """Run what other threads handed to the loop until ``until()`` holds (blocking)."""
        self.run()
        while not until():
            try:
                callback, args = self._from_threads.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no report from the store's writer in {timeout} s") from None
            try:
                callback(*args)
            except Exception as exc:
                self.errors.append(exc)
            self.run()


class MemoryTransport:
    """What the broker writes to, and what it pauses (uvicorn's MockTransport).

    ``written`` gathers the bytes not yet read by the client, ``writes`` counts the
    broker's writes; ``reading`` is False while the broker paused reading, and
    ``pauses`` counts how often it did.
    """

    def __init__(self) -> None:
        self.written = bytearray()
        self.writes = 0
        self.reading = True
        self.pauses = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.written += data  # after close() too: asyncio still sends what was written before

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        if self.reading:
            self.pauses += 1
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@dataclass
class Delivery:
    """A method that carries content (basic.deliver, get-ok, return) with it."""

    channel: int
    method: Any
    properties: bytes
    body: bytes

    @property
    def props(self) -> dict[str, Any]:
        """The basic properties, decoded (headers as a dict)."""
        return {k: decode_field(k, v) for k, v in split_properties(self.properties).items()}


Received = tuple[int, Any] | Delivery


class MemoryClient:
    """One client connection to a :class:`MemoryBroker`: frames out, methods back.

    Every call that sends runs the loop until it is idle, so the broker's answer is
    in :meth:`received` when it returns. The client's bytes reach the broker only
    while it reads (``transport.reading``), as with a socket; what waits is fed at
    the next resume.
    """

    def __init__(self, engine: MemoryBroker, peer: tuple[str, int]) -> None:
        self.engine = engine
        self.transport = MemoryTransport()
        self.connection = Connection(engine.broker, self.transport, peer)
        engine.broker.connections.add(self.connection)  # as the server does at accept
        self._unread = b""  # bytes the broker wrote that do not make a whole frame yet
        self._inbox: list[bytes] = []  # bytes sent while the broker does not read
        self._content: dict[int, tuple[Any, int, bytes, list[bytes]]] = {}
        self._received: list[Received] = []
        self.frame_max = 131072
        self.lost = False

    # ---- bytes ----

    def send_bytes(self, data: bytes) -> None:
        self._inbox.append(data)
        self.engine.run()

    def feed(self) -> bool:
        """Hand the broker what it may read now; True if it got anything."""
        if not self._inbox or not self.transport.reading or self.lost:
            return False
        data = b"".join(self._inbox)
        self._inbox.clear()
        self.connection.data_received(data)
        return True

    def drop(self) -> None:
        """The client's socket goes away without a close (connection_lost)."""
        if not self.lost:
            self.lost = True
            self.transport.closed = True
            self.connection.connection_lost()
            self.engine.run()

    def check_closed(self) -> bool:
        """The broker closed the transport: tell it the socket is gone (as asyncio would)."""
        if self.transport.closed and not self.lost:
            self.lost = True
            self.connection.connection_lost()
            return True
        return False

    # ---- methods ----

    def send(self, channel: int, method: Any) -> None:
        self.send_bytes(method_frame(channel, method))

    def call(self, channel: int, method: Any) -> Any:
        """Send a synchronous method and return its reply, the next method on the channel
        that is not a delivery, confirm or notice (those stay in :meth:`received`)."""
        self.send(channel, method)
        for i, got in enumerate(self._received_now()):
            if (
                isinstance(got, tuple)
                and got[0] == channel
                and getattr(got[1], "name", "") not in _ASYNC_METHODS
            ):
                del self._received[i]
                return got[1]
        raise AssertionError(f"no reply to {method.name} on channel {channel}: got {self.names()}")

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties | None = None,
        mandatory: bool = False,
    ) -> None:
        self.send_bytes(publish_bytes(channel, exchange, routing_key, body, properties, mandatory))

    def channel_open(self, channel: int) -> None:
        ok = self.call(channel, commands.Channel.Open())
        assert isinstance(ok, commands.Channel.OpenOk), ok

    def confirm_select(self, channel: int) -> None:
        ok = self.call(channel, commands.Confirm.Select())
        assert isinstance(ok, commands.Confirm.SelectOk), ok

    def pause_writing(self) -> None:
        """The transport's buffer is full (the client does not read): the server's signal."""
        self.connection.pause_writing()
        self.engine.run()

    def resume_writing(self) -> None:
        self.connection.resume_writing()
        self.engine.run()

    # ---- what came back ----

    def received(self) -> list[Received]:
        """Everything the broker sent since the last call, in order, as methods."""
        out = self._received_now()
        self._received = []
        return out

    def names(self) -> list[str]:
        """:meth:`received` in short: ``"1 Basic.Ack 3 multiple"``, ``"2 Basic.Deliver 1"``."""
        return [_describe(got) for got in self.received()]

    def _received_now(self) -> list[Received]:
        self.engine.run()
        data = self._unread + bytes(self.transport.written)
        self.transport.written.clear()
        off = 0
        while len(data) - off >= 8:
            kind, channel, size = _frame_head.unpack_from(data, off)
            end = off + 7 + size
            if len(data) < end + 1:
                break
            if data[end] != 0xCE:
                raise AssertionError(f"frame end octet {data[end]:#x}, not 0xce")
            self._frame(kind, channel, data[off + 7 : end])
            off = end + 1
        self._unread = data[off:]
        return list(self._received)

    def _frame(self, kind: int, channel: int, payload: bytes) -> None:
        if kind == FRAME_METHOD:
            method = decode_method(payload)
            if getattr(method, "name", "") in _CONTENT_METHODS:
                self._content[channel] = (method, -1, b"", [])
            else:
                self._received.append((channel, method))
        elif kind == FRAME_HEADER:
            method, _, _, _ = self._content[channel]
            _, _, size = _content_head.unpack_from(payload, 0)
            self._content[channel] = (method, size, payload[12:], [])
            if size == 0:
                self._complete(channel)
        elif kind == FRAME_BODY:
            method, size, _, parts = self._content[channel]
            parts.append(payload)
            if sum(map(len, parts)) >= size:
                self._complete(channel)
        elif kind != FRAME_HEARTBEAT:
            raise AssertionError(f"frame type {kind}")

    def _complete(self, channel: int) -> None:
        method, _, props, parts = self._content.pop(channel)
        self._received.append(Delivery(channel, method, props, b"".join(parts)))


def publish_bytes(
    channel: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: commands.Basic.Properties | None = None,
    mandatory: bool = False,
    frame_max: int = 131072,
) -> bytes:
    """basic.publish with its content, as frames: for a test that hands the broker many
    at once (``connection.data_received``) to see what one read does."""
    props = properties.marshal() if properties is not None else b"\x00\x00"
    parts = [
        method_frame(
            channel,
            make(commands.Basic.Publish, exchange=exchange, routing_key=routing_key,
                 mandatory=mandatory),
        ),
        *content_frames(channel, props, body, frame_max),
    ]  # fmt: skip
    return b"".join(parts)


class MemoryBroker:
    """A broker with a manual clock and in-memory clients (see the module's docstring).

    ``settings`` are :class:`config.Settings` fields (``data_dir=...`` for the message
    store, ``max_unconfirmed_per_channel=...``); ``record`` turns the test kit's record
    on (``testkit.recorder.start_recording``).
    """

    def __init__(self, record: bool = False, **settings: Any) -> None:
        self.clock = ManualLoop()
        settings.setdefault("data_dir", None)
        settings.setdefault("management_port", None)
        # time stands still here, so every read would be "quick" and wait for advance()
        settings.setdefault("read_coalescing_interval", 0)
        self.broker = Broker(Settings(**settings), self.clock, self.clock)
        if record:
            start_recording(self.broker)
        self.broker.open_store()
        self.clients: list[MemoryClient] = []
        self._peers = 0

    @property
    def vhost(self) -> Any:
        return self.broker.vhosts[self.broker.settings.default_vhost]

    def run(self) -> None:
        """Loop turns until nothing is left to do: callbacks, and bytes clients may send."""
        loop = self.clock
        while True:
            loop.run()
            busy = False
            for client in self.clients:
                busy |= client.feed()
                busy |= client.check_closed()
            if not busy and not loop._ready:
                return

    def advance(self, seconds: float) -> int:
        """Move broker time on (``clock.advance``), then let clients' waiting bytes in."""
        fired = self.clock.advance(seconds)
        self.run()
        return fired

    def sync(self, timeout: float = SYNC_TIMEOUT) -> None:
        """Let the message store's writer report every batch handed to it (fsync done),
        and those the store held back while it wrote (not records kept back for an ack:
        :meth:`advance` the clock for those)."""
        persistence = self.broker.persistence
        assert persistence is not None, "sync needs a data_dir"
        store = persistence.messages
        self.run()
        self.clock.deliver_from_threads(
            lambda: (
                (store.synced_batch >= store.open_batch - 1 and store.all_handed)
                or store.error is not None
            ),
            timeout,
        )
        self.run()

    def connect(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        capabilities: dict[str, Any] | None = None,
    ) -> MemoryClient:
        """A client through the handshake (heartbeat 0), connection.open-ok read."""
        self._peers += 1
        client = MemoryClient(self, ("127.0.0.1", 40000 + self._peers))
        self.clients.append(client)
        caps: dict[str, Any] = {
            "publisher_confirms": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "authentication_failure_close": True,
        }
        if capabilities is not None:
            caps = capabilities
        client.send_bytes(PROTOCOL_HEADER)
        start = client.received()
        assert start and isinstance(start[0], tuple), start
        assert isinstance(start[0][1], commands.Connection.Start), start
        tune = client.call(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "memory", "capabilities": cast(Any, caps)},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
        )
        assert isinstance(tune, commands.Connection.Tune), tune
        client.send(
            0, commands.Connection.TuneOk(channel_max=2047, frame_max=client.frame_max, heartbeat=0)
        )
        ok = client.call(0, commands.Connection.Open(virtual_host=vhost))
        assert isinstance(ok, commands.Connection.OpenOk), ok
        return client

    def close(self) -> None:
        """Drop every client (as lost sockets) and close the store."""
        for client in self.clients:
            if not client.lost:
                client.lost = True
                client.connection.connection_lost()
        self.clock.run()
        self.broker.close_store()


def _describe(got: Received) -> str:
    channel, method = (got.channel, got.method) if isinstance(got, Delivery) else got
    name = getattr(method, "name", type(method).__name__)
    if name in ("Basic.Ack", "Basic.Nack"):
        return f"{channel} {name} {method.delivery_tag}" + (" multiple" if method.multiple else "")
    if name in ("Basic.Deliver", "Basic.GetOk"):
        return f"{channel} {name} {method.delivery_tag}"
    if name in ("Basic.Cancel", "Basic.CancelOk", "Basic.ConsumeOk"):
        return f"{channel} {name} {method.consumer_tag}"
    if name in ("Channel.Close", "Connection.Close"):
        return f"{channel} {name} {method.reply_code}"
    return f"{channel} {name}"
