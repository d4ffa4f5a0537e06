"""Message-lifecycle tracing: what happened to every message, as newline-delimited JSON.

The engine calls one :class:`Tracer` method per event, behind
``if (tracer := vhost.tracer) is not None``; ``vhost.tracer`` is None unless the vhost
traces, so with tracing off the message path pays one attribute test. With it on, a
method records plain values in memory and returns: nothing is formatted or parsed on
the event loop, and nothing there waits for the disk (every 20 ms one non-blocking pipe
write hands the recorded bytes over). A writer process does the rest
(:class:`TraceWriter`): JSON lines in files rotated by size and by age. What the buffers
cannot hold is dropped and counted, and the count goes into the trace
(``trace_dropped``) so that the report can say what is missing.

Every line has ``ts`` (microseconds since the epoch: the monotonic clock read on the
loop, shifted once to wall-clock time, so intervals are exact even if the system clock
is stepped), ``ev`` and ``vhost``; message events have ``msg``, the broker-assigned id
that fan-out copies and dead-lettered copies keep. The events and their fields:

==================  ==========================================================================
published           exchange, rk, size, mid, cid (when set), persistent, conn, ch, seq
                    (the publisher-confirm sequence number, 0 without confirms)
routed              exchange, rk, queues (empty: unroutable), mandatory, dead_letter
confirmed           conn, ch, first, seq (every publish first..seq), ack (false: a nack)
delivered           queue, consumer (null for basic.get), tag, redelivered, count
                    (x-delivery-count: failed deliveries so far), no_ack, conn, ch
acked               queue, consumer, tag (no-ack deliveries are acked when delivered)
nacked              queue, consumer, tag, requeue
requeued            queue, why: nack, channel_closed, connection_closed, connection_lost,
                    consumer_timeout
retry_scheduled     queue, attempt, delay_ms, why
expired             queue (its TTL ran out)
dead_lettered       queue, reason (expired, rejected, maxlen, delivery_limit), dlx, dlrk
dropped             queue, reason: what the queue discarded without a dead-letter exchange
                    (rejected, maxlen, delivery_limit, overflow, purged, queue_deleted)
adopted             queue, exchange, rk, size: first sight of a message published before
                    tracing was on (or recovered from disk), which gets its id here
consumer_added      queue, consumer, prefetch, no_ack, conn, ch
consumer_timed_out  queue, consumer, conn, ch, tags, msgs, timeout_ms, action (cancel or
                    channel_close)
consumer_cancelled  queue, consumer, why: client, channel_closed, connection_closed,
                    connection_lost, queue_deleted
queue_expired       queue (unused past x-expires; queue_deleted follows)
queue_deleted       queue, messages (ready ones dropped with it)
trace_started       (tracing turned on for the vhost)
trace_stopped       (turned off)
trace_dropped       dropped: events lost so far because the buffers were full (vhost null)
==================  ==========================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import marshal
import os
import select
import struct
import subprocess
import sys
import time
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any

import structlog

from warren.broker.firehose import TRACE_EXCHANGE
from warren.protocol.properties import TRACED_FLAGS_HI, TRACED_FLAGS_LO, split_properties

if TYPE_CHECKING:
    from warren.broker.channel import Channel
    from warren.broker.consumer import Consumer
    from warren.broker.exchange import Exchange
    from warren.broker.message import Message
    from warren.broker.queue import Queue
    from warren.broker.timers import Timers
    from warren.broker.vhost import VirtualHost
    from warren.config import Settings

FLUSH_INTERVAL = 0.02  # seconds between hand-overs: small buffers stay in the CPU caches
FLUSH_TIMEOUT = 5.0  # seconds a flush (tests, shutdown) waits for the writer process
DRAIN_CHUNK = 8192  # events the writer process formats per file write
MAX_NAMES = 50_000  # (exchange, routing key) pairs with an id; past this the ids start again
CHILD_NICENESS = 19  # the writer process runs on CPU the broker leaves: busy, it drops

_mono = time.monotonic_ns

# event kinds: the first item of every tuple, an index into _FORMATS
(
    PUBLISHED,
    ROUTED,
    CONFIRMED,
    DELIVERED,
    ACKED,
    NACKED,
    REQUEUED,
    RETRY,
    DEAD,
    ADOPTED,
    CONSUMER_ADDED,
    CONSUMER_TIMED_OUT,
    CONSUMER_CANCELLED,
    QUEUE_EXPIRED,
    QUEUE_DELETED,
    DELAYED,  # an x-delayed-message exchange took the message (broker/exchange_plugins.py)
    RELEASED,  # ... and routed it when its delay was over
    MARK,
    DROPPED,
    CHANNEL_CLOSED,  # not written: the writer process forgets the channel's deliveries
    ACKS,  # in the int stream only: tags acked on a channel, written as one "acked" each
    ACK_RANGE,  # the same for the tags first..last
    CONFIRMS,  # in the int stream only: a publisher confirm, written as "confirmed"
) = range(23)
_HEAD = struct.Struct("=II?")  # a batch: bytes of ints, bytes of marshalled side list, sync
PIPE_SIZE = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
# markers in the int stream: a side-list tuple follows; then, as side tuples: an object's
# id, a name's id, all names forgotten, an object's id forgotten
OBJ, DEFINE, DEFINE_NAME, FORGET, UNDEFINE = 100, 101, 102, 103, 104
# The int stream is native int64s (the child reads it as array("q")), packed by struct:
# array.extend() of a tuple converts and grows item by item, several times slower.
_ints = [struct.Struct(f"{n}q").pack for n in range(16)]  # by count of ints
_pack2, _pack5, _pack6, _pack7, _pack11 = _ints[2], _ints[5], _ints[6], _ints[7], _ints[11]


class Tracer:
    """One traced vhost's view of the shared writer: the methods the engine calls."""

    __slots__ = ("_ids", "_names", "_w", "firehose", "vhost")

    def __init__(self, writer: TraceWriter, vhost: str, firehose: Exchange) -> None:
        self._w = writer
        self._ids = writer.ids
        self._names = writer.names  # never replaced, only cleared
        self.vhost = vhost
        # amq.rabbitmq.trace: the engine builds firehose copies only while it has bindings
        self.firehose = firehose

    def _full(self, events: int = 1) -> bool:
        w = self._w
        if len(w.buf) < w.cap and len(w.side) < w.side_cap:
            return False
        w.dropped += events
        return True

    def _put(self, event: tuple[Any, ...]) -> None:
        """A rare event, as a tuple on the side list, marked in its place in the stream."""
        w = self._w
        w.buf += _pack2(OBJ, len(w.side))
        w.side.append(event)

    def _id(self, msg: Message, queue: str) -> int:
        """The message's id; one published before tracing was on is adopted here."""
        tid = msg.trace_id
        if tid:
            return tid
        msg.trace_id = tid = next(self._ids)
        if not self._full():
            self._put(
                (ADOPTED, _mono(), self.vhost, tid, queue, msg.exchange, msg.routing_key,
                 len(msg.body))
            )  # fmt: skip
        return tid

    # ---- publishing ----

    # published, delivered and acked run once per message at full load: they pack plain
    # ints (channels, consumers, queues and routes as ids defined once: TraceWriter.*_id)
    # and check the buffer inline. Channels, consumers and queues hold their id
    # (trace_ref, 0 until the writer gives one): an attribute costs a fifth of a dict
    # lookup. An id's definition goes into the stream while the arguments are evaluated,
    # before the event's own bytes: buf is extended in place.

    def published(
        self, channel: Channel, msg: Message, queues: list[Queue], mandatory: bool, seq: int
    ) -> None:
        """Published and routed, in one event (the writer writes both lines)."""
        msg.trace_id = tid = next(self._ids)  # before the queues copy the message
        w = self._w
        buf = w.buf
        if len(buf) >= w.cap:
            w.dropped += 2
            return
        props = msg.properties
        if props[0] & TRACED_FLAGS_HI or props[1] & TRACED_FLAGS_LO:
            extra = len(w.side) + 1
            w.side.append(props)
        else:
            extra = 0
        channel_id = channel.trace_ref or w.channel_id(channel)
        # the route's key: the routing key's hash is cached (the exchange looked it up)
        route = self._names.get((msg.exchange, msg.routing_key)) or w.route_id(msg)
        if len(queues) == 1:  # the usual case: a precompiled struct, no list of ids
            queue = queues[0]
            buf += _pack11(
                PUBLISHED, _mono(), tid, channel_id, route, len(msg.body), seq, mandatory,
                extra, 1, queue.trace_ref or w.queue_id(queue),
            )  # fmt: skip
            return
        targets = [q.trace_ref or w.queue_id(q) for q in queues]
        buf += struct.pack(
            f"{10 + len(targets)}q", PUBLISHED, _mono(), tid, channel_id, route, len(msg.body),
            seq, mandatory, extra, len(targets), *targets,
        )  # fmt: skip

    def published_by_api(self, msg: Message, queues: list[Queue]) -> None:
        """Published through the management API: no channel."""
        msg.trace_id = tid = next(self._ids)
        if self._full(2):
            return
        self._put(
            (PUBLISHED, _mono(), self.vhost, tid, msg.exchange, msg.routing_key, len(msg.body),
             msg.properties, None, 0, 0, tuple([q.name for q in queues]), False)
        )  # fmt: skip

    def delivered(self, channel: Channel, consumer: Consumer, msg: Message, tag: int) -> None:
        w = self._w
        buf = w.buf
        if len(buf) >= w.cap:
            w.dropped += 1
            return
        buf += _pack7(
            DELIVERED, _mono(), msg.trace_id or self._id(msg, consumer.queue.name),
            consumer.trace_ref or w.consumer_id(consumer), tag, msg.redelivered,
            msg.delivery_count,
        )  # fmt: skip

    def got(self, channel: Channel, queue: Queue, msg: Message, tag: int) -> None:
        """Delivered by basic.get (no consumer)."""
        if self._full():
            return
        self._put(
            (DELIVERED, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             None, tag, msg.redelivered, msg.delivery_count, False, channel.conn.peer, channel.id)
        )  # fmt: skip

    def acked(self, channel: Channel, msgs: list[Message]) -> None:
        """The deliveries with these tags on ``channel`` are acked (one basic.ack, or a commit).

        Only the tags, as a range when they have no gaps (a multiple ack, usually, or one
        tag): the writer process knows each tag's delivery. No-ack deliveries are acked
        there as they are delivered.
        """
        w = self._w
        buf = w.buf
        n = len(msgs)
        if len(buf) >= w.cap:
            w.dropped += n
            return
        if not n:
            return
        first, last = msgs[0].tag, msgs[-1].tag
        channel_id = channel.trace_ref or w.channel_id(channel)
        if last - first + 1 == n:  # tags ascend: no gaps
            buf += _pack5(ACK_RANGE, _mono(), channel_id, first, last)
            return
        tags = [m.tag for m in msgs]
        buf += struct.pack(f"{n + 4}q", ACKS, _mono(), channel_id, n, *tags)

    def dead_letter_routed(self, copy: Message, targets: list[Queue]) -> None:
        """The dead-lettered copy went through the dead-letter exchange to ``targets``."""
        if self._full():
            return
        names = tuple(q.name for q in targets)
        self._put(
            (ROUTED, _mono(), self.vhost, copy.trace_id, copy.exchange, copy.routing_key, names)
        )

    def confirmed(self, channel: Channel, first: int, last: int, ack: bool) -> None:
        # as often as a few publishes each under load: packed ints, as the three above
        w = self._w
        buf = w.buf
        if len(buf) >= w.cap:
            w.dropped += 1
            return
        buf += _pack6(
            CONFIRMS, _mono(), channel.trace_ref or w.channel_id(channel), first, last, ack
        )

    # ---- settling ----

    def nacked(
        self, queue: Queue, msgs: list[Message], requeue: bool, rejected: bool = False
    ) -> None:
        """basic.nack, or basic.reject (``rejected``: the trace writes both as nacked)."""
        if self._full(len(msgs)):
            return
        now, append, name = _mono(), self._put, queue.name
        for msg in msgs:
            consumer, channel = msg.consumer, msg.channel
            peer, ch = (channel.conn.peer, channel.id) if channel is not None else (None, 0)
            append(
                (NACKED, now, self.vhost, msg.trace_id or self._id(msg, name), name,
                 consumer.tag if consumer is not None else None, msg.tag, requeue, peer, ch)
            )  # fmt: skip

    def requeued(self, queue: Queue, msgs: list[Message], why: str) -> None:
        """Back in ``queue``; ``why`` is what returned them (Queue.return_unacked's caller)."""
        if self._full(len(msgs)):
            return
        now, append, name = _mono(), self._put, queue.name
        for msg in msgs:
            append((REQUEUED, now, self.vhost, msg.trace_id or self._id(msg, name), name, why))

    def retry_scheduled(self, queue: Queue, msg: Message, delay_ms: int, why: str) -> None:
        if self._full():
            return
        self._put(
            (RETRY, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             msg.retries, delay_ms, why)
        )  # fmt: skip

    def dead_lettered(self, queue: Queue, msg: Message, reason: str) -> None:
        """The message left ``queue`` abnormally: to the dead-letter exchange, or dropped."""
        if self._full():
            return
        self._put(
            (DEAD, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             reason, queue.dead_letter_exchange, queue.dead_letter_routing_key)
        )  # fmt: skip

    def dropped(self, queue: Queue, msg: Message, reason: str) -> None:
        if self._full():
            return
        self._put(
            (DEAD, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             reason, None, None)
        )  # fmt: skip

    def purged(self, queue: Queue) -> None:
        """Ready and delayed messages are about to go (purge, or the queue's deletion)."""
        from warren.broker.message import DELAYED, READY

        reason = "queue_deleted" if queue.deleted else "purged"
        for msg in queue.ready_messages():
            if msg.state == READY:
                self.dropped(queue, msg, reason)
        for _, _, msg in queue._delayed:
            if msg.state == DELAYED:
                self.dropped(queue, msg, reason)

    # ---- consumers and queues ----

    def consumer_added(self, consumer: Consumer) -> None:
        if self._full():
            return
        channel = consumer.channel
        self._put(
            (CONSUMER_ADDED, _mono(), self.vhost, consumer.queue.name, consumer.tag,
             consumer.prefetch, consumer.no_ack, channel.conn.peer, channel.id)
        )  # fmt: skip

    def consumer_timed_out(
        self, channel: Channel, consumer: Consumer | None, msgs: list[Message], timeout: int
    ) -> None:
        if self._full():
            return
        queue = msgs[0].queue
        qname = queue.name if queue is not None else ""
        # the channel's own rule (deliveries_timed_out): cancel if it can, else close
        registered = consumer is not None and channel.consumers.get(consumer.tag) is consumer
        notify = registered and channel.conn.capabilities.get("consumer_cancel_notify") is True
        self._put(
            (CONSUMER_TIMED_OUT, _mono(), self.vhost, qname,
             consumer.tag if consumer is not None else None, channel.conn.peer, channel.id,
             tuple(m.tag for m in msgs), tuple(self._id(m, qname) for m in msgs), timeout,
             "cancel" if notify else "channel_close")
        )  # fmt: skip

    def consumer_cancelled(self, consumer: Consumer, why: str) -> None:
        self._w.forget(consumer)
        if self._full():
            return
        self._put((CONSUMER_CANCELLED, _mono(), self.vhost, consumer.queue.name, consumer.tag, why))

    def channel_closed(self, channel: Channel) -> str:
        """The channel ends: say why, for its consumers; the reason the messages it returns
        are requeued with (Channel.close passes it on)."""
        why = close_why(channel)
        for consumer in channel.consumers.values():
            self.consumer_cancelled(consumer, why)
        self._w.forget(channel)
        self._put((CHANNEL_CLOSED, _mono(), self.vhost, channel.conn.peer, channel.id))
        return why

    def queue_expired(self, queue: Queue) -> None:
        if not self._full():
            self._put((QUEUE_EXPIRED, _mono(), self.vhost, queue.name))

    def queue_deleted(self, queue: Queue) -> None:
        for consumer in queue.consumers:
            self.consumer_cancelled(consumer, "queue_deleted")
        self._w.forget(queue)
        if not self._full():
            self._put((QUEUE_DELETED, _mono(), self.vhost, queue.name, queue.ready_count))

    def delayed(self, msg: Message, exchange: str, delay_ms: int) -> None:
        if not self._full():
            self._put((DELAYED, _mono(), self.vhost, msg.trace_id, exchange, delay_ms))

    def released(self, msg: Message, exchange: str, queues: list[Queue]) -> None:
        if not self._full():
            self._put(
                (RELEASED, _mono(), self.vhost, msg.trace_id or self._id(msg, ""), exchange,
                 tuple([q.name for q in queues]))
            )  # fmt: skip

    def mark(self, event: str) -> None:
        if not self._full():
            self._put((MARK, _mono(), self.vhost, event))


def close_why(channel: Channel) -> str:
    """Why a channel ends: connection_closed, connection_lost or channel_closed."""
    conn = channel.conn
    reason = conn.close_reason
    if conn.closing or (reason and reason != "missed heartbeats"):  # AMQP close, any side
        return "connection_closed"
    if conn.closed or conn.transport.is_closing():  # the socket went, or went quiet
        return "connection_lost"
    return "channel_closed"


# ---- the writer: a timer on the loop here, a process for the formatting ----


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
    ones to ``python -m warren.broker.tracing`` through a non-blocking pipe: the ints as they are
    (one ``writev``, no copy, no Python per event), the side list ``marshal``-encoded. No
    thread: one would take the GIL from the loop at every hand-over. The child decodes,
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
        self.cap = capacity * 64  # bytes: a frequent event is 6 to 12 ints
        self.side_cap = capacity
        self.buf = bytearray()
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

    # ---- ids for names, on the loop ----

    def _define(self, definition: tuple[Any, ...]) -> None:
        self.buf += _pack2(OBJ, len(self.side))
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
            [sys.executable, "-m", "warren.broker.tracing", self.directory, str(self.rotate_bytes),
             str(self.rotate_seconds), str(offset)],
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
            self.buf += _pack2(OBJ, len(self.side))
            self.side.append((DROPPED, _mono(), None, self.dropped))
        if not self.buf and not self.side and not sync:
            return
        buf, side = self.buf, marshal.dumps(self.side)
        self.buf = bytearray()
        self.side = []
        self._unsent += [_HEAD.pack(len(buf), len(side), sync), buf, side]
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


class _Files:
    """The child's side: JSON lines into files rotated by size and age."""

    def __init__(self, directory: str, rotate_bytes: int, rotate_seconds: float) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.file: IO[str] | None = None
        self.size = 0
        self.opened = 0.0
        self.seq = 0

    def write(self, text: str) -> None:
        if self.file is None or self.size >= self.rotate_bytes:
            self.close()
            self.seq += 1
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            name = f"warren-trace-{stamp}-{os.getppid()}-{self.seq:04d}.ndjson"
            self.file = open(os.path.join(self.directory, name), "a", encoding="utf-8")  # noqa: SIM115
            self.size = 0
            self.opened = time.monotonic()
        self.file.write(text)
        self.size += len(text)  # characters: close enough to bytes for rotation

    def tick(self) -> None:
        if self.file is not None:
            self.file.flush()
            if time.monotonic() - self.opened >= self.rotate_seconds:
                self.close()  # the next event starts a new file

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class _Decoder:
    """The writer process's side of the stream: ints and side tuples back into JSON lines.

    The frequent events (published, delivered, acked) are formatted here from pieces of
    JSON made once per channel, consumer, queue and route as they are defined; the rest
    go back into tuples for the ``_FORMATS``. It keeps each channel's unacked deliveries
    (tag -> message id and the consumer's pieces) to turn the broker's acks, which carry
    only tags, into one "acked" line per message.
    """

    def __init__(self) -> None:
        self.pieces: dict[int, tuple[Any, ...]] = {}  # def id -> its JSON pieces
        self.names: dict[int, tuple[str, str]] = {}
        self.routes: dict[int, str] = {}  # name id -> ',"exchange":..,"rk":..'
        # (peer, ch) -> tag -> (message id, ',"ev":"acked",...,"msg":', ',"queue":..,"tag":')
        self.unacked: dict[tuple[Any, int], dict[int, tuple[int, str, str]]] = {}

    def _define(self, n: int, definition: tuple[Any, ...]) -> None:
        vhost = _s(definition[0])
        if len(definition) == 2:  # a queue: (vhost, name)
            self.pieces[n] = (_s(definition[1]),)
        elif len(definition) == 3:  # a channel: (vhost, peer, ch)
            _, peer, ch = definition
            self.pieces[n] = (vhost, f',"conn":{_peer(peer)},"ch":{ch}', (peer, ch))
        else:  # a consumer: (vhost, queue, ctag, no_ack, peer, ch)
            _, queue, ctag, no_ack, peer, ch = definition
            self.pieces[n] = (
                f',"ev":"delivered","vhost":{vhost},"msg":',
                f',"queue":{_s(queue)},"consumer":{_s(ctag)},"tag":',
                f',"no_ack":{_B[no_ack]},"conn":{_peer(peer)},"ch":{ch}}}\n',
                f',"ev":"acked","vhost":{vhost},"msg":',
                no_ack,
                (peer, ch),
            )

    def _delivered(self, e: tuple[Any, ...], off: int) -> Iterator[str]:
        # basic.get: (DELIVERED, t, vhost, tid, queue, ctag, tag, redelivered, count, no_ack,
        # peer, ch)
        yield _delivered(e, off)
        ack = f',"ev":"acked","vhost":{_s(e[2])},"msg":'
        rest = f',"queue":{_s(e[4])},"consumer":{_s(e[5])},"tag":'
        if e[9]:  # no-ack: settled as it is delivered
            yield f'{{"ts":{(e[1] + off) // 1000}{ack}{e[3]}{rest}{e[6]}}}\n'
        else:
            self.unacked.setdefault((e[10], e[11]), {})[e[6]] = (e[3], ack, rest)

    def _settled(self, peer: Any, ch: int, tags: Iterable[int]) -> None:
        channel = self.unacked.get((peer, ch))
        if channel is not None:
            for tag in tags:
                channel.pop(tag, None)

    def _side(self, event: tuple[Any, ...], off: int) -> Iterator[str]:
        what = event[0]
        if what == DEFINE:
            self._define(event[1], event[2])
        elif what == DEFINE_NAME:
            exchange, key = self.names[event[1]] = event[2]
            self.routes[event[1]] = f',"exchange":{_s(exchange)},"rk":{_s(key)}'
        elif what == FORGET:
            self.names.clear()
            self.routes.clear()
        elif what == UNDEFINE:
            self.pieces.pop(event[1], None)
        elif what == DELIVERED:  # basic.get
            yield from self._delivered(event, off)
        elif what == CHANNEL_CLOSED:
            self.unacked.pop((event[3], event[4]), None)
        else:
            if what == NACKED:
                self._settled(event[8], event[9], (event[6],))
            elif what == CONSUMER_TIMED_OUT:
                self._settled(event[5], event[6], event[7])
            yield _FORMATS[what](event, off)

    def lines(self, ints: array[int], side: list[Any], off: int) -> Iterator[str]:
        pieces, unacked = self.pieces, self.unacked
        i, n = 0, len(ints)
        while i < n:
            kind = ints[i]
            if kind == DELIVERED:
                _, t, tid, consumer, tag, redelivered, count = ints[i : i + 7]
                i += 7
                head, mid, tail, ack, no_ack, channel = pieces[consumer]
                ts = (t + off) // 1000
                yield (
                    f'{{"ts":{ts}{head}{tid}{mid}{tag},"redelivered":{_BOOL[redelivered]},'
                    f'"count":{count}{tail}'
                )
                if no_ack:
                    yield f'{{"ts":{ts}{ack}{tid}{mid}{tag}}}\n'
                else:
                    open_tags = unacked.get(channel)
                    if open_tags is None:
                        open_tags = unacked[channel] = {}
                    open_tags[tag] = (tid, ack, mid)
            elif kind == PUBLISHED:
                _, t, tid, channel_id, route, size, seq, mandatory, extra, count = ints[i : i + 10]
                if count == 1:
                    queues = f"[{pieces[ints[i + 10]][0]}]"
                else:
                    queues = "[" + ",".join(pieces[q][0] for q in ints[i + 10 : i + 10 + count])
                    queues += "]"
                i += 10 + count
                vhost, conn, _ = pieces[channel_id]
                head = f'{{"ts":{(t + off) // 1000},"ev":"'
                common = f'","vhost":{vhost},"msg":{tid}{self.routes[route]}'
                props = _props(side[extra - 1]) if extra else ""
                yield (
                    f'{head}published{common},"size":{size}{props}{conn},"seq":{seq}}}\n'
                    f'{head}routed{common},"queues":{queues},"mandatory":{_BOOL[mandatory]},'
                    f'"dead_letter":false}}\n'
                )
            elif kind in (ACKS, ACK_RANGE):
                t, channel_id = ints[i + 1], ints[i + 2]
                tags: Iterable[int]
                if kind == ACK_RANGE:
                    tags = range(ints[i + 3], ints[i + 4] + 1)
                    i += 5
                else:
                    count = ints[i + 3]
                    tags = ints[i + 4 : i + 4 + count]
                    i += 4 + count
                open_tags = unacked.get(pieces[channel_id][2], {})
                stamp = f'{{"ts":{(t + off) // 1000}'
                for tag in tags:
                    delivery = open_tags.pop(tag, None)
                    if delivery is not None:  # else delivered before tracing began
                        tid, ack, mid = delivery
                        yield f"{stamp}{ack}{tid}{mid}{tag}}}\n"
            elif kind == CONFIRMS:
                _, t, channel_id, first, last, ack = ints[i : i + 6]
                i += 6
                vhost, conn, _ = pieces[channel_id]
                yield (
                    f'{{"ts":{(t + off) // 1000},"ev":"confirmed","vhost":{vhost}{conn},'
                    f'"first":{first},"seq":{last},"ack":{_BOOL[ack]}}}\n'
                )
            elif kind == OBJ:
                yield from self._side(side[ints[i + 1]], off)
                i += 2
            else:
                raise ValueError(f"unknown event kind {kind} in the trace stream")


def _child_main(argv: list[str]) -> int:
    """``python -m warren.broker.tracing DIR ROTATE_BYTES ROTATE_SECONDS OFFSET_NS``: the writer."""
    directory, rotate_bytes, rotate_seconds, offset = argv
    # below the broker: on a saturated machine the broker keeps the CPU, this process falls
    # behind, the broker's buffers fill and events are dropped (and counted)
    os.nice(CHILD_NICENESS)
    files = _Files(directory, int(rotate_bytes), float(rotate_seconds))
    decoder = _Decoder()
    off = int(offset)
    source, reply = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = source.read(_HEAD.size)
        if len(head) < _HEAD.size:
            break  # the broker closed the pipe (or died): everything received is written
        n_ints, n_side, sync = _HEAD.unpack(head)
        ints = array("q")
        ints.frombytes(source.read(n_ints))
        side = marshal.loads(source.read(n_side))
        lines: list[str] = []
        for line in decoder.lines(ints, side, off):
            lines.append(line)
            if len(lines) >= DRAIN_CHUNK:
                files.write("".join(lines))
                lines = []
        if lines:
            files.write("".join(lines))
        files.tick()
        if sync:
            reply.write(b"\x01")
            reply.flush()
    files.close()
    return 0


# ---- which vhosts trace ----


class Tracing:
    """The broker's tracing switch: which vhosts trace and the writer they share."""

    def __init__(self, settings: Settings, timers: Timers) -> None:
        self.settings = settings
        self.timers = timers
        self.writer: TraceWriter | None = None
        # the configured set; None: every vhost (trace.vhosts = all)
        self._from_config: frozenset[str] | None = (
            None if settings.trace_vhosts is None else frozenset(settings.trace_vhosts)
        )
        self.traced: dict[str, VirtualHost] = {}

    def attach(self, vhost: VirtualHost) -> None:
        """A vhost was created: it traces if the configuration names it."""
        if self.settings.trace_enabled and (
            self._from_config is None or vhost.name in self._from_config
        ):
            self.enable(vhost)

    def enable(self, vhost: VirtualHost) -> bool:
        """Start tracing ``vhost``; False if it already traces."""
        from warren.broker.recorder import Recorder

        current = vhost.tracer
        # the test kit's recorder stays in front and hands every event on to the tracer
        recorder = current if isinstance(current, Recorder) else None
        if current is not None and (recorder is None or recorder.inner is not None):
            return False
        if self.writer is None:
            settings = self.settings
            self.writer = TraceWriter(
                settings.trace_dir,
                settings.trace_rotate_size,
                settings.trace_rotate_interval,
                settings.trace_buffer,
                self.timers.loop,
            )
            self.writer.start()
        tracer = Tracer(self.writer, vhost.name, vhost.exchanges[TRACE_EXCHANGE])
        if recorder is not None:
            recorder.inner = tracer
            recorder.firehose = tracer.firehose
        else:
            vhost.tracer = tracer
        tracer.mark("trace_started")
        self.traced[vhost.name] = vhost
        return True

    def disable(self, vhost: VirtualHost) -> bool:
        """Stop tracing ``vhost``; False if it did not trace."""
        from warren.broker.recorder import NO_FIREHOSE, Recorder

        tracer = vhost.tracer
        recorder = tracer if isinstance(tracer, Recorder) else None
        if recorder is not None:
            tracer = recorder.inner
        if tracer is None:
            return False
        tracer.mark("trace_stopped")
        if recorder is not None:
            recorder.inner = None
            recorder.firehose = NO_FIREHOSE
        else:
            vhost.tracer = None
        self.traced.pop(vhost.name, None)
        return True

    def flush(self) -> None:
        """Everything traced so far is in the files (tests, shutdown)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        for vhost in list(self.traced.values()):
            self.disable(vhost)
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def status(self) -> dict[str, Any]:
        writer = self.writer
        return {
            "vhosts": sorted(self.traced),
            "dir": os.path.abspath(self.settings.trace_dir),
            "events_dropped": writer.dropped if writer is not None else 0,
            "buffered_ints": len(writer.buf) // 8 if writer is not None else 0,
            "files": writer.files() if writer is not None else [],
        }


# ---- formatting (in the writer process) ----

_strings: dict[str, str] = {}  # names repeat: each is JSON-encoded once


def _s(value: str | None) -> str:
    if value is None:
        return "null"
    out = _strings.get(value)
    if out is None:
        out = json.dumps(value, ensure_ascii=False)
        if len(_strings) < 100_000:
            _strings[value] = out
    return out


def _list(values: Iterable[str]) -> str:
    return "[" + ",".join(_s(v) for v in values) + "]"


def _peer(peer: tuple[str, int] | None) -> str:
    return "null" if peer is None else _s(f"{peer[0]}:{peer[1]}")


_B = {True: "true", False: "false"}
_BOOL = ("false", "true")  # by a 0 or 1 from the int stream


def _props(raw: bytes) -> str:
    """message-id, correlation-id and persistence, read from the publisher's bytes."""
    if len(raw) < 2 or not (raw[0] & TRACED_FLAGS_HI or raw[1] & TRACED_FLAGS_LO):
        return ""
    try:
        fields = split_properties(raw)
    except ValueError:
        return ""
    out = ""
    for name, key in (("message_id", "mid"), ("correlation_id", "cid")):
        field = fields.get(name)
        if field is not None:
            out += f',"{key}":{json.dumps(field[1:].decode("utf-8", "replace"))}'
    mode = fields.get("delivery_mode")
    if mode is not None and mode[:1] == b"\x02":
        out += ',"persistent":true'
    return out


def _head(e: tuple[Any, ...], off: int, name: str) -> str:
    return f'{{"ts":{(e[1] + off) // 1000},"ev":"{name}","vhost":{_s(e[2])}'


def _published(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, exchange, rk, size, props, peer, ch, seq, names, mandatory)
    head = f'{{"ts":{(e[1] + off) // 1000},"ev":"%s","vhost":{_s(e[2])},"msg":{e[3]}'
    ex_rk = f',"exchange":{_s(e[4])},"rk":{_s(e[5])}'
    names = e[11]
    queues = f"[{_s(names)}]" if isinstance(names, str) else _list(names)
    return (
        f'{head % "published"}{ex_rk},"size":{e[6]}{_props(e[7])},"conn":{_peer(e[8])},'
        f'"ch":{e[9]},"seq":{e[10]}}}\n'
        f'{head % "routed"}{ex_rk},"queues":{queues},"mandatory":{_B[e[12]]},'
        f'"dead_letter":false}}\n'
    )


def _routed(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, exchange, rk, names): a dead-lettered copy
    return (
        f'{_head(e, off, "routed")},"msg":{e[3]},"exchange":{_s(e[4])},"rk":{_s(e[5])},'
        f'"queues":{_list(e[6])},"mandatory":false,"dead_letter":true}}\n'
    )


def _confirmed(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, peer, ch, first, last, ack)
    return (
        f'{_head(e, off, "confirmed")},"conn":{_peer(e[3])},"ch":{e[4]},"first":{e[5]},'
        f'"seq":{e[6]},"ack":{_B[e[7]]}}}\n'
    )


def _delivered(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, ctag, tag, redelivered, count, no_ack, peer, ch)
    return (
        f'{{"ts":{(e[1] + off) // 1000},"ev":"delivered","vhost":{_s(e[2])},"msg":{e[3]},'
        f'"queue":{_s(e[4])},"consumer":{_s(e[5])},"tag":{e[6]},"redelivered":{_B[e[7]]},'
        f'"count":{e[8]},"no_ack":{_B[e[9]]},"conn":{_peer(e[10])},"ch":{e[11]}}}\n'
    )


def _acked(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, ctag, tag)
    return (
        f'{{"ts":{(e[1] + off) // 1000},"ev":"acked","vhost":{_s(e[2])},"msg":{e[3]},'
        f'"queue":{_s(e[4])},"consumer":{_s(e[5])},"tag":{e[6]}}}\n'
    )


def _nacked(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, ctag, tag, requeue)
    return (
        f'{_head(e, off, "nacked")},"msg":{e[3]},"queue":{_s(e[4])},"consumer":{_s(e[5])},'
        f'"tag":{e[6]},"requeue":{_B[e[7]]}}}\n'
    )


def _requeued(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, why)
    return f'{_head(e, off, "requeued")},"msg":{e[3]},"queue":{_s(e[4])},"why":"{e[5]}"}}\n'


def _retry(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, attempt, delay_ms, why)
    return (
        f'{_head(e, off, "retry_scheduled")},"msg":{e[3]},"queue":{_s(e[4])},'
        f'"attempt":{e[5]},"delay_ms":{e[6]},"why":"{e[7]}"}}\n'
    )


def _dead(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, reason, dlx, dlrk)
    common = f',"msg":{e[3]},"queue":{_s(e[4])}'
    reason, dlx = e[5], e[6]
    out = ""
    if reason == "expired":
        out = f"{_head(e, off, 'expired')}{common}}}\n"
    if dlx is not None:
        out += (
            f'{_head(e, off, "dead_lettered")}{common},"reason":"{reason}","dlx":{_s(dlx)},'
            f'"dlrk":{_s(e[7])}}}\n'
        )
    elif reason != "expired":
        out += f'{_head(e, off, "dropped")}{common},"reason":"{reason}"}}\n'
    return out


def _adopted(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, queue, exchange, rk, size)
    return (
        f'{_head(e, off, "adopted")},"msg":{e[3]},"queue":{_s(e[4])},"exchange":{_s(e[5])},'
        f'"rk":{_s(e[6])},"size":{e[7]}}}\n'
    )


def _consumer_added(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, queue, ctag, prefetch, no_ack, peer, ch)
    return (
        f'{_head(e, off, "consumer_added")},"queue":{_s(e[3])},"consumer":{_s(e[4])},'
        f'"prefetch":{e[5]},"no_ack":{_B[e[6]]},"conn":{_peer(e[7])},"ch":{e[8]}}}\n'
    )


def _consumer_timed_out(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, queue, ctag, peer, ch, tags, tids, timeout, action)
    return (
        f'{_head(e, off, "consumer_timed_out")},"queue":{_s(e[3])},"consumer":{_s(e[4])},'
        f'"conn":{_peer(e[5])},"ch":{e[6]},"tags":[{",".join(map(str, e[7]))}],'
        f'"msgs":[{",".join(map(str, e[8]))}],"timeout_ms":{e[9]},"action":"{e[10]}"}}\n'
    )


def _consumer_cancelled(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, queue, ctag, why)
    return (
        f'{_head(e, off, "consumer_cancelled")},"queue":{_s(e[3])},"consumer":{_s(e[4])},'
        f'"why":"{e[5]}"}}\n'
    )


def _queue_expired(e: tuple[Any, ...], off: int) -> str:
    return f'{_head(e, off, "queue_expired")},"queue":{_s(e[3])}}}\n'


def _queue_deleted(e: tuple[Any, ...], off: int) -> str:
    return f'{_head(e, off, "queue_deleted")},"queue":{_s(e[3])},"messages":{e[4]}}}\n'


def _delayed(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, exchange, delay_ms)
    return f'{_head(e, off, "delayed")},"msg":{e[3]},"exchange":{_s(e[4])},"delay_ms":{e[5]}}}\n'


def _released(e: tuple[Any, ...], off: int) -> str:
    # (K, t, vhost, tid, exchange, queue names)
    queues = ",".join(_s(name) for name in e[5])
    return f'{_head(e, off, "released")},"msg":{e[3]},"exchange":{_s(e[4])},"queues":[{queues}]}}\n'


def _mark(e: tuple[Any, ...], off: int) -> str:
    return f"{_head(e, off, e[3])}}}\n"


def _dropped(e: tuple[Any, ...], off: int) -> str:
    return f'{_head(e, off, "trace_dropped")},"dropped":{e[3]}}}\n'


_FORMATS: tuple[Callable[[tuple[Any, ...], int], str], ...] = (
    _published,
    _routed,
    _confirmed,
    _delivered,
    _acked,
    _nacked,
    _requeued,
    _retry,
    _dead,
    _adopted,
    _consumer_added,
    _consumer_timed_out,
    _consumer_cancelled,
    _queue_expired,
    _queue_deleted,
    _delayed,
    _released,
    _mark,
    _dropped,
)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
