"""Message-lifecycle tracing: what happened to every message, as newline-delimited JSON.

The engine calls one :class:`Tracer` method per event, behind
``if (tracer := vhost.tracer) is not None``; ``vhost.tracer`` is None unless the vhost
traces, so with tracing off the message path pays one attribute test. A method puts one
tuple of plain values on a bounded deque and returns: nothing is formatted, parsed or
written on the event loop. The tuples hold only immutable values (names, numbers, the
property bytes), so the writer thread can read them later while the engine moves on.
The thread drains the deque every ``FLUSH_INTERVAL``, turns each tuple into one JSON
line and appends it to a file rotated by size and by age. When the deque is full an
event is dropped and counted, and the writer puts the count in the trace
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
trace_dropped       dropped: events lost so far because the buffer was full (vhost null)
==================  ==========================================================================
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any

from protocol.properties import split_properties

if TYPE_CHECKING:
    from broker.channel import Channel
    from broker.consumer import Consumer
    from broker.message import Message
    from broker.queue import Queue
    from broker.vhost import VirtualHost
    from config import Settings

FLUSH_INTERVAL = 0.1  # seconds between drains: bounds the delay before an event is on disk
DRAIN_CHUNK = 8192  # events formatted per write: the thread yields the GIL between chunks

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
    MARK,
) = range(16)


class Tracer:
    """One traced vhost's view of the shared writer: the methods the engine calls."""

    __slots__ = ("_buf", "_cap", "_ids", "_writer", "cause", "vhost")

    def __init__(self, writer: TraceWriter, vhost: str) -> None:
        self._writer = writer
        self._buf = writer.buffer
        self._cap = writer.capacity
        self._ids = writer.ids
        self.vhost = vhost
        # why the unacked messages being returned right now come back: set by the channel
        # event that returns them (nack, close, timeout), read by the queue's requeue hooks
        # in the same call stack
        self.cause = "nack"

    def _full(self, events: int = 1) -> bool:
        if len(self._buf) < self._cap:
            return False
        self._writer.dropped += events
        return True

    def _id(self, msg: Message, queue: str) -> int:
        """The message's id; one published before tracing was on is adopted here."""
        tid = msg.trace_id
        if tid:
            return tid
        msg.trace_id = tid = next(self._ids)
        if not self._full():
            self._buf.append(
                (ADOPTED, _mono(), self.vhost, tid, queue, msg.exchange, msg.routing_key,
                 len(msg.body))
            )  # fmt: skip
        return tid

    # ---- publishing ----

    def published(
        self, channel: Channel | None, msg: Message, queues: list[Queue], mandatory: bool, seq: int
    ) -> None:
        """Published and routed, in one tuple (the writer writes both lines)."""
        msg.trace_id = tid = next(self._ids)  # before the queues copy the message
        if self._full(2):
            return
        names = queues[0].name if len(queues) == 1 else tuple(q.name for q in queues)
        if channel is None:  # the management API's publish
            peer, ch = None, 0
        else:
            peer, ch = channel.conn.peer, channel.id
        self._buf.append(
            (PUBLISHED, _mono(), self.vhost, tid, msg.exchange, msg.routing_key, len(msg.body),
             msg.properties, peer, ch, seq, names, mandatory)
        )  # fmt: skip

    def dead_letter_routed(self, copy: Message, targets: list[Queue]) -> None:
        """The dead-lettered copy went through the dead-letter exchange to ``targets``."""
        if self._full():
            return
        names = tuple(q.name for q in targets)
        self._buf.append(
            (ROUTED, _mono(), self.vhost, copy.trace_id, copy.exchange, copy.routing_key, names)
        )

    def confirmed(self, channel: Channel, first: int, last: int, ack: bool) -> None:
        if self._full():
            return
        self._buf.append(
            (CONFIRMED, _mono(), self.vhost, channel.conn.peer, channel.id, first, last, ack)
        )

    # ---- delivery and settling ----

    def delivered(
        self, channel: Channel, consumer: Consumer | None, msg: Message, tag: int
    ) -> None:
        if self._full():
            return
        queue = msg.queue
        qname = queue.name if queue is not None else ""
        tid = msg.trace_id or self._id(msg, qname)
        if consumer is None:
            ctag, no_ack = None, False
        else:
            ctag, no_ack = consumer.tag, consumer.no_ack
        self._buf.append(
            (DELIVERED, _mono(), self.vhost, tid, qname, ctag, tag, msg.redelivered,
             msg.delivery_count, no_ack, channel.conn.peer, channel.id)
        )  # fmt: skip

    def acked(self, queue: Queue, msg: Message) -> None:
        if self._full():
            return
        consumer = msg.consumer
        self._buf.append(
            (ACKED, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             consumer.tag if consumer is not None else None, msg.tag)
        )  # fmt: skip

    def nacked(self, queue: Queue, msgs: list[Message], requeue: bool) -> None:
        self.cause = "nack"
        if self._full(len(msgs)):
            return
        now, append, name = _mono(), self._buf.append, queue.name
        for msg in msgs:
            consumer = msg.consumer
            append(
                (NACKED, now, self.vhost, msg.trace_id or self._id(msg, name), name,
                 consumer.tag if consumer is not None else None, msg.tag, requeue)
            )  # fmt: skip

    def requeued(self, queue: Queue, msgs: list[Message]) -> None:
        if self._full(len(msgs)):
            return
        now, append, name, why = _mono(), self._buf.append, queue.name, self.cause
        for msg in msgs:
            append((REQUEUED, now, self.vhost, msg.trace_id or self._id(msg, name), name, why))

    def retry_scheduled(self, queue: Queue, msg: Message, delay_ms: int) -> None:
        if self._full():
            return
        self._buf.append(
            (RETRY, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             msg.retries, delay_ms, self.cause)
        )  # fmt: skip

    def dead_lettered(self, queue: Queue, msg: Message, reason: str) -> None:
        """The message left ``queue`` abnormally: to the dead-letter exchange, or dropped."""
        if self._full():
            return
        self._buf.append(
            (DEAD, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             reason, queue.dead_letter_exchange, queue.dead_letter_routing_key)
        )  # fmt: skip

    def dropped(self, queue: Queue, msg: Message, reason: str) -> None:
        if self._full():
            return
        self._buf.append(
            (DEAD, _mono(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             reason, None, None)
        )  # fmt: skip

    def purged(self, queue: Queue) -> None:
        """Ready and delayed messages are about to go (purge, or the queue's deletion)."""
        from broker.message import DELAYED, READY

        reason = "queue_deleted" if queue.deleted else "purged"
        for msg in queue.ready:
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
        self._buf.append(
            (CONSUMER_ADDED, _mono(), self.vhost, consumer.queue.name, consumer.tag,
             consumer.prefetch, consumer.no_ack, channel.conn.peer, channel.id)
        )  # fmt: skip

    def consumer_timed_out(
        self, channel: Channel, consumer: Consumer | None, msgs: list[Message], timeout: int
    ) -> None:
        self.cause = "consumer_timeout"
        if self._full():
            return
        queue = msgs[0].queue
        qname = queue.name if queue is not None else ""
        # the channel's own rule (deliveries_timed_out): cancel if it can, else close
        registered = consumer is not None and channel.consumers.get(consumer.tag) is consumer
        notify = registered and channel.conn.capabilities.get("consumer_cancel_notify") is True
        self._buf.append(
            (CONSUMER_TIMED_OUT, _mono(), self.vhost, qname,
             consumer.tag if consumer is not None else None, channel.conn.peer, channel.id,
             tuple(m.tag for m in msgs), tuple(self._id(m, qname) for m in msgs), timeout,
             "cancel" if notify else "channel_close")
        )  # fmt: skip

    def consumer_cancelled(self, consumer: Consumer, why: str) -> None:
        if self._full():
            return
        self._buf.append(
            (CONSUMER_CANCELLED, _mono(), self.vhost, consumer.queue.name, consumer.tag, why)
        )

    def channel_closed(self, channel: Channel) -> None:
        """The channel ends: say why, for its consumers and for the messages it returns."""
        conn = channel.conn
        if conn._close_reason or conn.closing:
            why = "connection_closed"
        elif conn.closed or conn.transport.is_closing():
            why = "connection_lost"
        else:
            why = "channel_closed"
        self.cause = why
        for consumer in channel.consumers.values():
            self.consumer_cancelled(consumer, why)

    def queue_expired(self, queue: Queue) -> None:
        if not self._full():
            self._buf.append((QUEUE_EXPIRED, _mono(), self.vhost, queue.name))

    def queue_deleted(self, queue: Queue) -> None:
        for consumer in queue.consumers:
            self.consumer_cancelled(consumer, "queue_deleted")
        if not self._full():
            self._buf.append((QUEUE_DELETED, _mono(), self.vhost, queue.name, queue.ready_count))

    def mark(self, event: str) -> None:
        if not self._full():
            self._buf.append((MARK, _mono(), self.vhost, event))


# ---- the writer thread ----


class TraceWriter:
    """Drains the shared buffer into ``warren-trace-*.ndjson`` files in ``directory``."""

    def __init__(
        self, directory: str, rotate_bytes: int, rotate_seconds: float, capacity: int
    ) -> None:
        self.directory = directory
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.capacity = capacity
        self.buffer: deque[tuple[Any, ...]] = deque()
        # ids grow from the start time in microseconds: unique across restarts
        self.ids = itertools.count(time.time_ns() // 1000)
        self.dropped = 0  # counted on the loop thread
        self.written = 0
        self.files: list[str] = []  # every file this writer opened, oldest first
        self._dropped_noted = 0
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._file: IO[str] | None = None
        self._file_bytes = 0
        self._file_opened = 0.0
        self._file_seq = 0
        self._lock = threading.Lock()  # one drain at a time: the thread's or flush()'s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warren-trace", daemon=True)

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL):
            self.drain()

    def drain(self) -> None:
        """Write what is buffered; rotate the file when it is too big or too old."""
        with self._lock:
            buf, off = self.buffer, self._offset_ns
            while buf:
                lines = []
                for _ in range(min(len(buf), DRAIN_CHUNK)):
                    event = buf.popleft()
                    lines.append(_FORMATS[event[0]](event, off))
                self._write("".join(lines), len(lines))
            dropped = self.dropped
            if dropped != self._dropped_noted:
                self._dropped_noted = dropped
                now = (time.monotonic_ns() + off) // 1000
                line = f'{{"ts":{now},"ev":"trace_dropped","vhost":null,"dropped":{dropped}}}\n'
                self._write(line, 1)
            if self._file is not None:
                self._file.flush()
                if time.monotonic() - self._file_opened >= self.rotate_seconds:
                    self._close_file()

    def _write(self, text: str, events: int) -> None:
        if self._file is None or self._file_bytes >= self.rotate_bytes:
            self._close_file()
            self._open_file()
        assert self._file is not None
        self._file.write(text)
        self._file_bytes += len(text)  # characters: close enough to bytes for rotation
        self.written += events

    def _open_file(self) -> None:
        self._file_seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"warren-trace-{stamp}-{os.getpid()}-{self._file_seq:04d}.ndjson"
        path = os.path.join(self.directory, name)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open across drains)
        self._file_bytes = 0
        self._file_opened = time.monotonic()
        self.files.append(path)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.drain()
        with self._lock:
            self._close_file()


# ---- which vhosts trace ----


class Tracing:
    """The broker's tracing switch: which vhosts trace and the writer they share."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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
        if vhost.tracer is not None:
            return False
        if self.writer is None:
            settings = self.settings
            self.writer = TraceWriter(
                settings.trace_dir,
                settings.trace_rotate_size,
                settings.trace_rotate_interval,
                settings.trace_buffer,
            )
            self.writer.start()
        vhost.tracer = Tracer(self.writer, vhost.name)
        vhost.tracer.mark("trace_started")
        self.traced[vhost.name] = vhost
        return True

    def disable(self, vhost: VirtualHost) -> bool:
        """Stop tracing ``vhost``; False if it did not trace."""
        tracer = vhost.tracer
        if tracer is None:
            return False
        tracer.mark("trace_stopped")
        vhost.tracer = None
        self.traced.pop(vhost.name, None)
        return True

    def flush(self) -> None:
        """Everything traced so far is in the files (tests, shutdown)."""
        if self.writer is not None:
            self.writer.drain()

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
            "events_written": writer.written if writer is not None else 0,
            "events_dropped": writer.dropped if writer is not None else 0,
            "buffered": len(writer.buffer) if writer is not None else 0,
            "files": list(writer.files) if writer is not None else [],
        }


# ---- formatting (on the writer thread) ----

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


def _props(raw: bytes) -> str:
    """message-id, correlation-id and persistence, read from the publisher's bytes."""
    if len(raw) < 2 or not (raw[0] & 0x14 or raw[1] & 0x80):
        return ""  # none of delivery_mode (1<<12), correlation_id (1<<10), message_id (1<<7)
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


def _mark(e: tuple[Any, ...], off: int) -> str:
    return f"{_head(e, off, e[3])}}}\n"


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
    _mark,
)
