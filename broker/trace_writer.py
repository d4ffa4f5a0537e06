"""The hand-over: the loop's recorded events, shipped to the writer process every 20 ms.

The broker's side of the trace stream (broker/trace_events.py): ids for the names the
events mention, and a timer that writes the buffers to ``python -m warren.broker.trace_format``
through a non-blocking pipe. Nothing here formats an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import marshal
import os
import select
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from warren.broker.trace_events import (
    DEFINE,
    DEFINE_NAME,
    DROPPED,
    FORGET,
    HEAD,
    OBJ,
    UNDEFINE,
    pack2,
)

if TYPE_CHECKING:
    from warren.broker.channel import Channel
    from warren.broker.consumer import Consumer
    from warren.broker.message import Message
    from warren.broker.queue import Queue

FLUSH_INTERVAL = 0.02  # seconds between hand-overs: small buffers stay in the CPU caches
FLUSH_TIMEOUT = 5.0  # seconds a flush (tests, shutdown) waits for the writer process
MAX_NAMES = 50_000  # (exchange, routing key) pairs with an id; past this the ids start again
PIPE_SIZE = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
CHUNK = 1 << 20  # bytes of one recording buffer: a tick at full load fills a fifth of it
ROOM = 128  # bytes that every fixed-size record fits in (the largest is 88)

_mono = time.monotonic_ns


class TraceWriter:
    """Ships the recorded events to a child process that writes ``warren-trace-*.ndjson``.

    Turning an event into a JSON line costs about as much as the engine's whole handling
    of the message, and in the broker's process it would hold the GIL the event loop
    needs. So the broker's side only records ints: the frequent events (published,
    delivered, acked, confirmed) as runs of int64s packed into a ``bytearray``, with
    channels, consumers, queues and routes as small ids defined once in the stream
    (``channel_id``...; ``forget`` drops one when its object ends, so that the writer
    process does not keep every channel ever opened), the rare events as tuples on a side
    list, marked in their place in the int stream. Every ``FLUSH_INTERVAL`` a timer on
    the loop swaps in fresh buffers (small ones stay in the CPU caches) and writes the old
    ones to ``python -m warren.broker.trace_format`` through a non-blocking pipe: the ints
    as they are (one ``writev``, no copy, no Python per event), the side list
    ``marshal``-encoded. No thread: one would take the GIL from the loop at every
    hand-over. The child decodes,
    formats (the frequent events from JSON pieces made once per channel, consumer and
    route), writes and rotates on another core, at the lowest priority. If it falls
    behind, the pipe fills, what did not fit waits for the next tick, the buffers reach
    their bounds and events are dropped and counted: the broker never waits. Killed with
    the broker, the child still writes what it has received.
    """

    def __init__(
        self,
        directory: str,
        rotate_bytes: int,
        rotate_seconds: float,
        capacity: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.cap = capacity * 64  # bytes: a frequent event is 5 to 11 ints
        self.side_cap = capacity
        # The frequent events are packed into a buffer allocated once, at a running offset
        # (Struct.pack_into): no bytes object per event and no length test. A record that
        # does not fit (``overflow``), or a rare event past ``limit``, ``spill``s: the
        # buffer is put aside for the next hand-over and another started, unless ``cap``
        # is reached.
        self.buf = bytearray(min(CHUNK, self.cap))
        self.off = 0
        self.limit = len(self.buf) - ROOM
        self.full: list[memoryview] = []  # filled buffers waiting for the hand-over
        self.side: list[Any] = []
        # ids grow from the start time in microseconds: unique across restarts
        self.ids = itertools.count(time.time_ns() // 1000)
        self.names: dict[tuple[str, str], int] = {}  # (exchange, routing key) -> id
        # channels, consumers and queues holding an id (trace_ref) from this writer
        self.defined: weakref.WeakSet[Channel | Consumer | Queue] = weakref.WeakSet()
        self._next = itertools.count(1)
        self.dropped = 0
        self._dropped_noted = 0
        self._loop = loop
        self._child: subprocess.Popen[bytes] | None = None  # None once it stops reading
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1  # the child's stdin, non-blocking
        self._unsent: list[bytes | bytearray | memoryview] = []  # what the pipe did not take
        self._timer: asyncio.TimerHandle | None = None

    # ---- the buffers, on the loop ----

    def held(self) -> int:
        """Bytes recorded and not yet handed over."""
        return sum(len(b) for b in self.full) + self.off

    def spill(self) -> int:
        """The buffer is full: a fresh one, and the offset to write at (0); -1 when the
        recorded bytes have reached ``cap`` (the writer process is behind: drop)."""
        if self.held() + ROOM > self.cap:
            return -1
        self.full.append(memoryview(self.buf)[: self.off])
        self.buf = bytearray(len(self.buf))
        self.off = 0
        return 0

    def overflow(self, events: int, pack_into: Callable[..., None], *ints: int) -> None:
        """A record did not fit: into a fresh buffer, or dropped and counted."""
        if self.spill() < 0:
            self.dropped += events
            return
        pack_into(self.buf, 0, *ints)
        self.off = 8 * len(ints)

    def write(self, data: bytes) -> None:
        """Bytes of any length (rare events, long lists), past ``cap`` if need be: the
        callers test for room first (``Tracer._full``), these are a few more."""
        off, end = self.off, self.off + len(data)
        if end > len(self.buf):
            self.full.append(memoryview(self.buf)[:off])
            self.buf = bytearray(max(len(self.buf), len(data)))
            off, end = 0, len(data)
        self.buf[off:end] = data
        self.off = end

    # ---- ids for names, on the loop ----

    def _define(self, definition: tuple[Any, ...]) -> None:
        self.write(pack2(OBJ, len(self.side)))
        self.side.append(definition)

    def route_id(self, msg: Message) -> int:
        """An id for the message's exchange and routing key."""
        if len(self.names) >= MAX_NAMES:  # routing keys may all differ: start again
            self.names.clear()
            self._define((FORGET,))
        self.names[msg.exchange, msg.routing_key] = n = next(self._next)
        self._define((DEFINE_NAME, n, (msg.exchange, msg.routing_key)))
        return n

    def _ref(self, obj: Channel | Consumer | Queue, definition: tuple[Any, ...]) -> int:
        obj.trace_ref = n = next(self._next)
        self.defined.add(obj)
        self._define((DEFINE, n, definition))
        return n

    def queue_id(self, queue: Queue) -> int:
        return self._ref(queue, (queue.vhost.name, queue.name))

    def channel_id(self, channel: Channel) -> int:
        return self._ref(channel, (channel.vhost.name, channel.conn.peer, channel.id))

    def consumer_id(self, consumer: Consumer) -> int:
        channel, queue = consumer.channel, consumer.queue
        return self._ref(
            consumer,
            (queue.vhost.name, queue.name, consumer.tag, consumer.no_ack, channel.conn.peer,
             channel.id),
        )  # fmt: skip

    def forget(self, obj: Channel | Consumer | Queue) -> None:
        """A channel, consumer or queue ended: the writer process drops its definition (an
        event for it after all, a late confirm say, defines it again)."""
        if obj.trace_ref:
            self._define((UNDEFINE, obj.trace_ref))
            obj.trace_ref = 0
            self.defined.discard(obj)

    # ---- shipping, on the loop ----

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        offset = time.time_ns() - time.monotonic_ns()
        self._child = self._proc = child = subprocess.Popen(
            [sys.executable, "-m", "warren.broker.trace_format", self.directory,
             str(self.rotate_bytes), str(self.rotate_seconds), str(offset)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert child.stdin is not None
        self._fd = child.stdin.fileno()
        with contextlib.suppress(OSError):  # a bigger pipe rides out the child's pauses
            fcntl.fcntl(self._fd, PIPE_SIZE, PIPE_BYTES)
        os.set_blocking(self._fd, False)
        self._timer = self._loop.call_later(FLUSH_INTERVAL, self._tick)

    def _tick(self) -> None:
        self._ship(sync=False)
        self._timer = self._loop.call_later(FLUSH_INTERVAL, self._tick)

    def _ship(self, sync: bool) -> None:
        """Hand the buffers to the child, or keep filling them while the pipe is full."""
        if self._unsent and not self._write() and not sync:
            return  # the child is behind: the buffers fill up to their bounds, then drop
        if self.dropped != self._dropped_noted:
            self._dropped_noted = self.dropped
            self._define((DROPPED, _mono(), None, self.dropped))
        if not self.off and not self.full and not self.side and not sync:
            return
        parts = [*self.full, memoryview(self.buf)[: self.off]]
        side = marshal.dumps(self.side)
        self._unsent += [HEAD.pack(self.held(), len(side), sync), *parts, side]
        self.full = []
        self.side = []
        self.off = 0
        if not self._write():  # the pipe holds a view of the buffer: record into another
            self.buf = bytearray(len(self.buf))

    def _write(self) -> bool:
        """Write what the pipe takes now; True when nothing is left."""
        unsent = self._unsent
        if self._child is None:
            unsent.clear()  # the child is gone: nothing more is written
            return True
        try:
            written = os.writev(self._fd, unsent)
        except BlockingIOError:
            return False
        except OSError as exc:  # the writer process died: say so once, then discard
            self._child = None
            unsent.clear()
            structlog.get_logger("warren").error(
                "trace writer process gone: trace events are no longer written",
                directory=self.directory,
                error=str(exc),
            )
            return True
        while unsent and written >= len(unsent[0]):
            written -= len(unsent.pop(0))
        if unsent and written:
            unsent[0] = memoryview(unsent[0])[written:]
        return not unsent

    def flush(self) -> None:
        """On the loop: everything so far is in the files when this returns (tests,
        shutdown); it waits at most ``FLUSH_TIMEOUT`` for a writer that does not read."""
        child = self._child
        if child is None or child.stdout is None:
            return
        self._ship(sync=True)
        deadline = time.monotonic() + FLUSH_TIMEOUT
        while not self._write():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([], [self._fd], [], left)
        if self._child is not None:
            left = max(deadline - time.monotonic(), 0)
            if select.select([child.stdout], [], [], left)[0]:
                child.stdout.read(1)  # the child wrote and flushed everything

    def close(self) -> None:
        """On the loop: the last events out and the child ended."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        for obj in list(self.defined):  # their ids mean nothing to a later writer process
            obj.trace_ref = 0
        self.defined.clear()
        child, self._child, self._proc = self._proc, None, None  # reaped even if it died
        if child is not None:
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            if child.stdout is not None:
                child.stdout.close()

    def files(self) -> list[str]:
        return sorted(
            os.path.join(self.directory, name)
            for name in os.listdir(self.directory)
            if name.startswith("warren-trace-")
        )
