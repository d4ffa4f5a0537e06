"""The hand-over: the loop's recorded events, shipped to the writer process every 5-20 ms.

The broker's side of the trace stream (broker/tracing/events.py): ids for the names the
events mention, the records waiting for the hand-over, and a timer that writes them to
``python -m warren.broker.tracing.format`` through a non-blocking pipe. Nothing here
formats an event.
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
from typing import TYPE_CHECKING, Any

import structlog
from librt.strings import BytesWriter

from warren.broker.tracing.events import (
    ACK_RANGE,
    ACKS,
    CHANNEL_CLOSED,
    DEFINE,
    DEFINE_NAME,
    DROPPED,
    FORGET,
    HEAD,
    OBJ,
    PROPS,
    PUBLISHED,
    PUBLISHED1,
    REC_ACK_RANGE,
    REC_ACKS,
    REC_OBJ,
    TIME,
    UNDEFINE,
    TraceClock,
    TraceIds,
    walk,
)

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.message import Message
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.tracing.tracer import Tracer

FLUSH_INTERVAL = 0.02  # seconds between hand-overs while events come slowly or not at all
# While they come fast, hand-overs come sooner: each stays a small part of the 1 MiB pipe
# (one of 20 ms at 45 MB/s nearly fills it, and events are dropped whenever the writer is
# late) and of the CPU's caches.
BUSY_FLUSH_INTERVAL = 0.005
BUSY_BYTES = 65536  # records at a tick that make the next one come sooner
FLUSH_TIMEOUT = 5.0  # seconds a flush (tests, shutdown) waits for the writer process
MAX_NAMES = 50_000  # (exchange, routing key) pairs with an id; past this the ids start again
PIPE_SIZE = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
# side-list entries that the writer process needs whatever is dropped: ids and their ends
_KEEP = frozenset((DEFINE, DEFINE_NAME, FORGET, UNDEFINE, CHANNEL_CLOSED, DROPPED))
_EVENTS = {PUBLISHED: 2, PROPS: 0}  # lines a side tuple stands for, when not 1

_mono = time.monotonic_ns


class TraceWriter:
    """Ships the recorded events to a child process that writes ``warren-trace-*.wtrace``.

    Turning an event into a JSON line costs about as much as the engine's whole handling
    of the message: in the broker's process it would hold the GIL the event loop needs,
    and in a writer process it would take a core the broker and its clients need. So the
    broker's side only records: the frequent events (published, delivered,
    acked, confirmed) as fixed-size binary records written into ``records``, with channels,
    consumers, queues and routes as small ids defined once in the stream
    (``channel_id``...; ``forget`` drops one when its object ends, so that the writer
    process does not keep every channel ever opened), the rare events as tuples on a side
    list, marked in their place in the record stream. Every ``FLUSH_INTERVAL`` (or
    ``BUSY_FLUSH_INTERVAL`` while events come fast) a timer on
    the loop takes the records and writes them to ``python -m warren.broker.tracing.format``
    through a non-blocking pipe, the side list ``marshal``-encoded. No thread: one would
    take the GIL from the loop at every hand-over. The child appends the batches as they
    are to the files and rotates them, at the lowest priority; the report job decodes
    and formats. If it falls behind, the pipe
    fills, what did not fit waits for the next tick, the records held reach their bound
    (``cap`` bytes, enforced at each tick) and the rest are dropped and counted: the
    broker never waits. Killed with the broker, the child still writes what it has
    received.
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
        self.cap = capacity * 64  # bytes held: a frequent event's record is 32 to 57
        # The records since the last hand-over; never replaced (the tracers hold it), only
        # emptied at each hand-over.
        self.records = BytesWriter()
        # while the writer process is behind, what _trim kept moves here, ahead of
        # ``records``: each tick checks (and copies) only the records new since the last
        self._held: list[bytes] = []
        self._held_size = 0
        self.side: list[Any] = []  # the same: never replaced
        # ids grow from the start time in microseconds: unique across restarts
        self.ids = TraceIds(time.time_ns() // 1000)
        # the tracers' time: a TIME record in ``records`` before the records it dates
        self.clock = TraceClock(loop, self.records)
        # exchange -> routing key -> id: two lookups by strings whose hash is cached,
        # cheaper than one by a tuple made for it
        self.routes: dict[str, dict[str, int]] = {}
        self.tracers: dict[Tracer, None] = {}  # the vhosts' tracers, which keep a route too
        self.n_routes = 0
        # channels holding an id (trace_ref) from this writer, to take it back when their
        # vhost stops tracing; consumers and queues are found through the vhost's queues
        self.channels: dict[int, Channel] = {}
        self._next = itertools.count(1)
        self.dropped = 0
        self._dropped_noted = 0
        self._loop = loop
        self._child: subprocess.Popen[bytes] | None = None  # None once it stops reading
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1  # the child's stdin, non-blocking
        self._unsent: list[bytes | memoryview] = []  # what the pipe did not take
        self._timer: asyncio.TimerHandle | None = None

    # ---- the records, on the loop ----

    def held(self) -> int:
        """Bytes recorded and not yet handed over."""
        return self._held_size + len(self.records)

    def _trim(self) -> None:
        """Hold at most ``cap`` bytes of records: drop and count the events past it, but
        keep what gives or takes back an id (later events name it)."""
        records = self.records
        room = self.cap - self._held_size
        if len(records) <= room:
            return  # the usual case
        data = records.getvalue()
        records.truncate(0)
        side = self.side
        keep = 0  # data[:keep] stays
        kept: list[bytes] = []  # and these records past it
        dropped = 0
        dropping = False
        for kind, start, end in walk(data, 0):
            if not dropping:
                if end <= room:
                    keep = end
                    continue
                dropping = True
            if kind == OBJ:
                index = REC_OBJ.unpack_from(data, start)[1]
                event = side[index]
                if event[0] in _KEEP:
                    kept.append(data[start:end])
                    continue
                side[index] = None  # its tuple is not sent either
                dropped += _EVENTS.get(event[0], 1)
            elif kind in (PUBLISHED1, PUBLISHED):
                dropped += 2
            elif kind == ACK_RANGE:
                _, _, first, last = REC_ACK_RANGE.unpack_from(data, start)
                dropped += last - first + 1
            elif kind == ACKS:
                dropped += REC_ACKS.unpack_from(data, start)[2]
            elif kind == TIME:
                continue
            else:
                dropped += 1
        if keep:
            kept.insert(0, data[:keep])
        self._held += kept
        self._held_size += sum(map(len, kept))
        self.dropped += dropped

    # ---- ids for names, on the loop ----

    def _define(self, definition: tuple[Any, ...]) -> None:
        self.records.write(REC_OBJ.pack(OBJ, len(self.side)))
        self.side.append(definition)

    def route_id(self, msg: Message) -> int:
        """An id for the message's exchange and routing key."""
        if self.n_routes >= MAX_NAMES:  # routing keys may all differ: start again
            self.routes.clear()
            self.n_routes = 0
            for tracer in self.tracers:
                tracer._forget_route()
            self._define((FORGET,))
        keys = self.routes.get(msg.exchange)
        if keys is None:
            keys = self.routes[msg.exchange] = {}
        keys[msg.routing_key] = n = next(self._next)
        self.n_routes += 1
        self._define((DEFINE_NAME, n, (msg.exchange, msg.routing_key)))
        return n

    def _ref(self, obj: Channel | Consumer | Queue, definition: tuple[Any, ...]) -> int:
        obj.trace_ref = n = next(self._next)
        self._define((DEFINE, n, definition))
        return n

    def queue_id(self, queue: Queue) -> int:
        return self._ref(queue, (queue.vhost.name, queue.name))

    def channel_id(self, channel: Channel) -> int:
        n = self._ref(channel, (channel.vhost.name, channel.conn.peer, channel.id))
        self.channels[n] = channel
        return n

    def consumer_id(self, consumer: Consumer) -> int:
        channel, queue = consumer.channel, consumer.queue
        return self._ref(
            consumer,
            (queue.vhost.name, queue.name, consumer.tag, consumer.no_ack, channel.conn.peer,
             channel.id, channel.trace_ref or self.channel_id(channel)),
        )  # fmt: skip

    def forget(self, obj: Channel | Consumer | Queue) -> None:
        """A channel, consumer or queue ended: the decoder drops its definition (an
        event for it after all, a late confirm say, defines it again)."""
        n = obj.trace_ref
        if n:
            self._define((UNDEFINE, n))
            obj.trace_ref = 0
            self.channels.pop(n, None)

    def forget_vhost(self, vhost: VirtualHost) -> None:
        """The vhost stops tracing: its channels, consumers and queues give their ids back
        (a later writer process's files would not define them)."""
        for channel in [c for c in self.channels.values() if c.vhost is vhost]:
            self.forget(channel)
            for consumer in channel.consumers.values():
                self.forget(consumer)
        for queue in vhost.queues.values():
            self.forget(queue)
            for consumer in queue.consumers:
                self.forget(consumer)

    # ---- shipping, on the loop ----

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        offset = time.time_ns() - time.monotonic_ns()
        self._child = self._proc = child = subprocess.Popen(
            [sys.executable, "-m", "warren.broker.tracing.format", self.directory,
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
        busy = len(self.records) >= BUSY_BYTES
        self._ship(sync=False)
        interval = BUSY_FLUSH_INTERVAL if busy else FLUSH_INTERVAL
        self._timer = self._loop.call_later(interval, self._tick)

    def _ship(self, sync: bool) -> None:
        """Hand the records to the child, or keep them while the pipe is full."""
        behind = bool(self._unsent) and not self._write()
        self._trim()
        # whatever happens to the records held now, the next one is dated anew: every batch,
        # and every file the writer process starts at one, has its TIME before its records
        self.clock.fresh = False
        if behind and not sync:
            return  # the child is behind: the records pile up to their bound, then drop
        if self.dropped != self._dropped_noted:
            self._dropped_noted = self.dropped
            self._define((DROPPED, _mono(), None, self.dropped))
        records, side, held = self.records, self.side, self._held
        if not len(records) and not held and not side and not sync:
            return
        data = b"".join([*held, records.getvalue()]) if held else records.getvalue()
        records.truncate(0)
        held.clear()
        self._held_size = 0
        packed = marshal.dumps(side)
        side.clear()
        self._unsent += [HEAD.pack(len(data), len(packed), sync), data, packed]
        self._write()

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
