"""Message-lifecycle tracing: what happened to every message, in binary trace files.

This module is the part on the event loop: the engine calls one :class:`Tracer` method
per event, behind ``if (tracer := vhost.tracer) is not None``; ``vhost.tracer`` is None
unless the vhost traces, so with tracing off the message path pays one attribute test.
With it on, a method records plain values in memory and returns: nothing is formatted or
parsed on the event loop, and nothing there waits for the disk. :class:`Tracing` says
which vhosts trace. The rest lives in three rooms: the stream's layout
(broker/tracing/events.py), the hand-over (broker/tracing/handover.py: every 5-20 ms one
non-blocking pipe write to a writer process), and that process
(broker/tracing/format.py: the batches as they are, in files rotated by size and by age,
decoded into JSON lines by the report job and by ``trace_format decode``). What the
buffers cannot hold is dropped and counted, and the count goes into the trace
(``trace_dropped``) so that the report can say what is missing.

Decoded, every line has ``ts`` (microseconds since the epoch: the monotonic clock read on the
loop once per iteration (events.TraceClock), shifted once to wall-clock time, so intervals
are exact even if the system clock is stepped), ``ev`` and ``vhost``; message events have
``msg``, the broker-assigned id that fan-out copies and dead-lettered copies keep. The
events and their fields are declared once, in broker/tracing/schema.py.
"""

from __future__ import annotations

import os
import types
from typing import TYPE_CHECKING, Any, Final, cast

from librt.strings import BytesWriter, write_i64_le

from warren.broker.tracing.events import (
    ACK_RANGE,
    ACKS,
    ADOPTED,
    CHANNEL_CLOSED,
    CONFIRMS,
    CONSUMER_ADDED,
    CONSUMER_CANCELLED,
    CONSUMER_TIMED_OUT,
    DEAD,
    DELAYED,
    DELIVERED,
    MARK,
    NACKED,
    OBJ,
    PROPS,
    PUBLISHED,
    PUBLISHED1,
    QUEUE_DELETED,
    QUEUE_EXPIRED,
    REC_ACK_RANGE,
    REC_CONFIRMS,
    REC_DELIVERED,
    REC_PUBLISHED1,
    RELEASED,
    REQUEUED,
    RETRY,
    ROUTED,
    TraceClock,
    TraceIds,
    packer,
)
from warren.broker.tracing.firehose import TRACE_EXCHANGE
from warren.broker.tracing.handover import TraceWriter
from warren.protocol.properties import TRACED_FLAGS_HI, TRACED_FLAGS_LO

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.exchange import Exchange
    from warren.broker.engine.message import Message
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.timers import Timers
    from warren.broker.engine.vhost import VirtualHost
    from warren.config import Settings


class Tracer:
    """One traced vhost's view of the shared writer: the methods the engine calls."""

    __slots__ = (
        "_ex", "_ids", "_records", "_rk", "_route", "_routes", "_tc", "_w", "firehose", "vhost"
    )  # fmt: skip

    def __init__(self, writer: TraceWriter, vhost: str, firehose: Exchange) -> None:
        self._w = writer
        self._records: BytesWriter = writer.records  # never replaced, only emptied
        self._ids: TraceIds = writer.ids  # shared with the other vhosts' tracers
        self._routes = writer.routes  # never replaced, only cleared
        self._tc: TraceClock = writer.clock  # every event's time
        # the last route's id: publishers mostly repeat their route, and the protocol
        # layer hands out the same string objects for a repeated one (BasicPublish.ex_rk)
        self._ex = self._rk = ""
        self._route = 0
        writer.tracers[self] = None  # the writer forgets the last route with its ids
        self.vhost = vhost
        # amq.rabbitmq.trace: the engine builds firehose copies only while it has bindings
        self.firehose = firehose

    def _forget_route(self) -> None:
        """The writer dropped every route's id (TraceWriter.route_id calls this)."""
        self._route = 0

    def _ts(self) -> int:
        """A rare event's time (TraceClock)."""
        return self._tc.ns()

    def _put(self, event: tuple[Any, ...]) -> None:
        """A rare event, as a tuple on the side list, marked in its place in the stream."""
        side = self._w.side
        b = self._records
        write_i64_le(b, OBJ)
        write_i64_le(b, len(side))
        side.append(event)

    def _id(self, msg: Message, queue: str) -> int:
        """The message's id; one published before tracing was on is adopted here."""
        tid = msg.trace_id
        if tid:
            return tid
        ids = self._ids
        msg.trace_id = tid = ids.last = ids.last + 1
        self._put(
            (ADOPTED, self._ts(), self.vhost, tid, queue, msg.exchange, msg.routing_key,
             len(msg.body))
        )  # fmt: skip
        return tid

    # ---- publishing ----

    # published, delivered and acked run once per message at full load: each writes one
    # fixed-size record (trace_events.REC_*) into the writer's buffer a field at a time;
    # compiled, a field is a store into the buffer, with no int or bytes object made (a
    # struct.pack took three times the instructions). Every step they take is counted
    # (tests/benchmarks/trace_path.py --callgrind). Channels, consumers and queues hold
    # their id (trace_ref, 0 until the writer gives one): an attribute costs a fifth of a
    # dict lookup. Every id is found before the record starts: a new one's definition goes
    # into the stream first.

    def _route_of(self, msg: Message) -> int:
        """The id of ``msg``'s exchange and routing key, remembered as the last route (the
        next publish by the same route reads it without a lookup)."""
        exchange, key = msg.exchange, msg.routing_key
        try:
            route = self._routes[exchange][key]
        except KeyError:  # the first message by this route
            route = self._w.route_id(msg)
        self._ex, self._rk, self._route = exchange, key, route
        return route

    def published(
        self, channel: Channel, msg: Message, queues: list[Queue], mandatory: bool, seq: int
    ) -> None:
        """Published and routed, in one event (the writer writes both lines)."""
        ids = self._ids
        msg.trace_id = tid = ids.last = ids.last + 1  # before the queues copy the message
        exchange, key = msg.exchange, msg.routing_key
        if key is self._rk and exchange is self._ex and self._route:
            route = self._route
        else:
            route = self._route_of(msg)
        props = msg.properties
        # message-id, correlation-id or persistence set: the decoder reads them (no
        # flag set: the flags' two bytes only; a set flag is followed by its field's bytes)
        if len(props) != 2 and (props[0] & TRACED_FLAGS_HI or props[1] & TRACED_FLAGS_LO):
            self._put((PROPS, tid, props))
        ch = channel.trace_ref or self._w.channel_id(channel)
        targets: list[int] | None = None
        if len(queues) == 1:  # the usual case: the queue's id in the record
            kind, queue = PUBLISHED1, queues[0]
            last = queue.trace_ref or self._w.queue_id(queue)
        else:  # a fan-out, or unroutable: the count, the queues' ids after the record
            kind, targets = PUBLISHED, [q.trace_ref or self._w.queue_id(q) for q in queues]
            last = len(targets)
        if not self._tc.fresh:
            self._tc.read()
        b = self._records
        write_i64_le(b, kind)
        write_i64_le(b, tid)
        write_i64_le(b, ch)
        write_i64_le(b, route)
        write_i64_le(b, len(msg.body))
        write_i64_le(b, seq)
        write_i64_le(b, last)
        b.append(1 if mandatory else 0)
        if targets is not None:
            for q in targets:
                write_i64_le(b, q)

    def published_by_api(self, msg: Message, queues: list[Queue]) -> None:
        """Published through the management API: no channel."""
        ids = self._ids
        msg.trace_id = tid = ids.last = ids.last + 1
        self._put(
            (PUBLISHED, self._ts(), self.vhost, tid, msg.exchange, msg.routing_key, len(msg.body),
             msg.properties, None, 0, 0, tuple([q.name for q in queues]), False)
        )  # fmt: skip

    def delivered(self, channel: Channel, consumer: Consumer, msg: Message, tag: int) -> None:
        tid = msg.trace_id or self._id(msg, consumer.queue.name)
        ref = consumer.trace_ref or self._w.consumer_id(consumer)
        if not self._tc.fresh:
            self._tc.read()
        b = self._records
        write_i64_le(b, DELIVERED)
        write_i64_le(b, tid)
        write_i64_le(b, ref)
        write_i64_le(b, tag)
        write_i64_le(b, msg.delivery_count)
        b.append(1 if msg.redelivered else 0)

    def got(self, channel: Channel, queue: Queue, msg: Message, tag: int) -> None:
        """Delivered by basic.get (no consumer)."""
        self._put(
            (DELIVERED, self._ts(), self.vhost, msg.trace_id or self._id(msg, queue.name),
             queue.name, None, tag, msg.redelivered, msg.delivery_count, False, channel.conn.peer,
             channel.id, channel.trace_ref or self._w.channel_id(channel))
        )  # fmt: skip

    def acked(self, channel: Channel, msgs: list[Message]) -> None:
        """The deliveries with these tags on ``channel`` are acked (one basic.ack, or a commit).

        Only the tags, as a range when they have no gaps (a multiple ack, usually, or one
        tag): the decoder knows each tag's delivery. No-ack deliveries are acked
        there as they are delivered.
        """
        n = len(msgs)
        if not n:
            return
        channel_id = channel.trace_ref or self._w.channel_id(channel)
        first, last = msgs[0].tag, msgs[-1].tag
        if not self._tc.fresh:
            self._tc.read()
        b = self._records
        if last - first + 1 == n:  # tags ascend: no gaps
            write_i64_le(b, ACK_RANGE)
            write_i64_le(b, channel_id)
            write_i64_le(b, first)
            write_i64_le(b, last)
            return
        write_i64_le(b, ACKS)
        write_i64_le(b, channel_id)
        write_i64_le(b, n)
        for m in msgs:
            write_i64_le(b, m.tag)

    def dead_letter_routed(self, copy: Message, targets: list[Queue]) -> None:
        """The dead-lettered copy went through the dead-letter exchange to ``targets``."""
        names = tuple(q.name for q in targets)
        self._put(
            (ROUTED, self._ts(), self.vhost, copy.trace_id, copy.exchange, copy.routing_key, names)
        )

    def confirmed(self, channel: Channel, first: int, last: int, ack: bool) -> None:
        # as often as a few publishes each under load: a record, as the three above
        channel_id = channel.trace_ref or self._w.channel_id(channel)
        if not self._tc.fresh:
            self._tc.read()
        b = self._records
        write_i64_le(b, CONFIRMS)
        write_i64_le(b, channel_id)
        write_i64_le(b, first)
        write_i64_le(b, last)
        b.append(1 if ack else 0)

    # ---- settling ----

    def nacked(
        self, queue: Queue, msgs: list[Message], requeue: bool, rejected: bool = False
    ) -> None:
        """basic.nack, or basic.reject (``rejected``: the trace writes both as nacked)."""
        now, append, name = self._ts(), self._put, queue.name
        for msg in msgs:
            consumer, channel = msg.consumer, cast("Channel | None", msg.channel)
            peer, ch = (channel.conn.peer, channel.id) if channel is not None else (None, 0)
            append(
                (NACKED, now, self.vhost, msg.trace_id or self._id(msg, name), name,
                 consumer.tag if consumer is not None else None, msg.tag, requeue, peer, ch)
            )  # fmt: skip

    def requeued(self, queue: Queue, msgs: list[Message], why: str) -> None:
        """Back in ``queue``; ``why`` is what returned them (Queue.return_unacked's caller)."""
        now, append, name = self._ts(), self._put, queue.name
        for msg in msgs:
            append((REQUEUED, now, self.vhost, msg.trace_id or self._id(msg, name), name, why))

    def retry_scheduled(self, queue: Queue, msg: Message, delay_ms: int, why: str) -> None:
        self._put(
            (RETRY, self._ts(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             msg.retries, delay_ms, why)
        )  # fmt: skip

    def dead_lettered(self, queue: Queue, msg: Message, reason: str) -> None:
        """The message left ``queue`` abnormally: to the dead-letter exchange, or dropped."""
        self._put(
            (DEAD, self._ts(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             reason, queue.dead_letter_exchange, queue.dead_letter_routing_key)
        )  # fmt: skip

    def dropped(self, queue: Queue, msg: Message, reason: str) -> None:
        self._put(
            (DEAD, self._ts(), self.vhost, msg.trace_id or self._id(msg, queue.name), queue.name,
             reason, None, None)
        )  # fmt: skip

    def purged(self, queue: Queue) -> None:
        """Ready and delayed messages are about to go (purge, or the queue's deletion)."""
        from warren.broker.engine.message import DELAYED, READY
        from warren.broker.engine.queue_backlog import ready_messages

        reason = "queue_deleted" if queue.deleted else "purged"
        for msg in ready_messages(queue):
            if msg.state == READY:
                self.dropped(queue, msg, reason)
        for _, _, msg in queue.deadlines.delayed:
            if msg.state == DELAYED:
                self.dropped(queue, msg, reason)

    # ---- consumers and queues ----

    def consumer_added(self, consumer: Consumer) -> None:
        channel = consumer.channel
        self._put(
            (CONSUMER_ADDED, self._ts(), self.vhost, consumer.queue.name, consumer.tag,
             consumer.prefetch, consumer.no_ack, channel.conn.peer, channel.id)
        )  # fmt: skip

    def consumer_timed_out(
        self, channel: Channel, consumer: Consumer | None, msgs: list[Message], timeout: int
    ) -> None:
        queue = msgs[0].queue
        qname = queue.name if queue is not None else ""
        # the channel's own rule (deliveries_timed_out): cancel if it can, else close
        registered = consumer is not None and channel.consumers.get(consumer.tag) is consumer
        notify = registered and channel.conn.capabilities.get("consumer_cancel_notify") is True
        self._put(
            (CONSUMER_TIMED_OUT, self._ts(), self.vhost, qname,
             consumer.tag if consumer is not None else None, channel.conn.peer, channel.id,
             tuple(m.tag for m in msgs), tuple(self._id(m, qname) for m in msgs), timeout,
             "cancel" if notify else "channel_close")
        )  # fmt: skip

    def consumer_cancelled(self, consumer: Consumer, why: str) -> None:
        self._w.forget(consumer)
        self._put(
            (CONSUMER_CANCELLED, self._ts(), self.vhost, consumer.queue.name, consumer.tag, why)
        )

    def channel_closed(self, channel: Channel) -> str:
        """The channel ends: say why, for its consumers; the reason the messages it returns
        are requeued with (Channel.close passes it on)."""
        why = close_why(channel)
        for consumer in channel.consumers.values():
            self.consumer_cancelled(consumer, why)
        self._w.forget(channel)
        self._put((CHANNEL_CLOSED, self._ts(), self.vhost, channel.conn.peer, channel.id))
        return why

    def queue_expired(self, queue: Queue) -> None:
        self._put((QUEUE_EXPIRED, self._ts(), self.vhost, queue.name))

    def queue_deleted(self, queue: Queue) -> None:
        for consumer in queue.consumers:
            self.consumer_cancelled(consumer, "queue_deleted")
        self._w.forget(queue)
        self._put((QUEUE_DELETED, self._ts(), self.vhost, queue.name, queue.ready_count))

    def delayed(self, msg: Message, exchange: str, delay_ms: int) -> None:
        self._put((DELAYED, self._ts(), self.vhost, msg.trace_id, exchange, delay_ms))

    def released(self, msg: Message, exchange: str, queues: list[Queue]) -> None:
        self._put(
            (RELEASED, self._ts(), self.vhost, msg.trace_id or self._id(msg, ""), exchange,
             tuple([q.name for q in queues]))
        )  # fmt: skip

    def mark(self, event: str) -> None:
        self._put((MARK, self._ts(), self.vhost, event))


class Relay(Tracer):
    """A tracer in front of a vhost's lifecycle tracer: it sees every event and hands each
    on to ``inner``, the lifecycle tracer while the vhost traces (None otherwise).

    Observers attach this way without the engine knowing them (the test kit's recorder is
    one): :class:`Tracing` starts and stops the lifecycle trace behind a relay. While
    ``inner`` is None the relay's ``firehose`` is ``idle_firehose``, an exchange nothing
    binds to, so the engine builds no firehose copies for it.
    """

    __slots__ = ("idle_firehose", "inner")

    def __init__(self, inner: Tracer | None, idle_firehose: Exchange) -> None:
        # no Tracer.__init__: a relay writes nothing of its own to the trace
        self.inner = inner
        self.idle_firehose = idle_firehose
        self.firehose = inner.firehose if inner is not None else idle_firehose


class InterpretedTracer(Tracer):
    """The same records, for the interpreted build: there one ``struct.pack`` and one
    write cost less than a call for each field (tests/benchmarks/trace_path.py --callgrind).
    The compiled build never uses it."""

    __slots__ = ()

    def published(
        self, channel: Channel, msg: Message, queues: list[Queue], mandatory: bool, seq: int
    ) -> None:
        if len(queues) != 1:
            super().published(channel, msg, queues, mandatory, seq)
            return
        # Tracer.published's first steps, repeated: a method of their own would cost the
        # interpreter a call per publish (800 instructions, trace_path.py --callgrind)
        ids = self._ids
        msg.trace_id = tid = ids.last = ids.last + 1
        exchange, key = msg.exchange, msg.routing_key
        if key is self._rk and exchange is self._ex and self._route:
            route = self._route
        else:
            route = self._route_of(msg)
        props = msg.properties
        # message-id, correlation-id or persistence set: the decoder reads them (no
        # flag set: the flags' two bytes only; a set flag is followed by its field's bytes)
        if len(props) != 2 and (props[0] & TRACED_FLAGS_HI or props[1] & TRACED_FLAGS_LO):
            self._put((PROPS, tid, props))
        queue = queues[0]
        ch = channel.trace_ref or self._w.channel_id(channel)
        q = queue.trace_ref or self._w.queue_id(queue)
        if not self._tc.fresh:
            self._tc.read()
        self._records.write(
            _published1(PUBLISHED1, tid, ch, route, len(msg.body), seq, q, mandatory)
        )

    def delivered(self, channel: Channel, consumer: Consumer, msg: Message, tag: int) -> None:
        tid = msg.trace_id or self._id(msg, consumer.queue.name)
        ref = consumer.trace_ref or self._w.consumer_id(consumer)
        if not self._tc.fresh:
            self._tc.read()
        self._records.write(
            _delivered(DELIVERED, tid, ref, tag, msg.delivery_count, msg.redelivered)
        )

    def acked(self, channel: Channel, msgs: list[Message]) -> None:
        n = len(msgs)
        if n and msgs[-1].tag - msgs[0].tag + 1 == n:
            ch = channel.trace_ref or self._w.channel_id(channel)
            if not self._tc.fresh:
                self._tc.read()
            self._records.write(_ack_range(ACK_RANGE, ch, msgs[0].tag, msgs[-1].tag))
            return
        super().acked(channel, msgs)

    def confirmed(self, channel: Channel, first: int, last: int, ack: bool) -> None:
        ch = channel.trace_ref or self._w.channel_id(channel)
        if not self._tc.fresh:
            self._tc.read()
        self._records.write(_confirms(CONFIRMS, ch, first, last, ack))


# the interpreted build's packing (InterpretedTracer)
_published1: Final = packer(REC_PUBLISHED1).pack
_delivered: Final = packer(REC_DELIVERED).pack
_ack_range: Final = packer(REC_ACK_RANGE).pack
_confirms: Final = packer(REC_CONFIRMS).pack


def close_why(channel: Channel) -> str:
    """Why a channel ends: connection_closed, connection_lost or channel_closed."""
    conn = channel.conn
    reason = conn.close_reason
    if conn.closing or (reason and reason != "missed heartbeats"):  # AMQP close, any side
        return "connection_closed"
    if conn.closed or conn.transport.is_closing():  # the socket went, or went quiet
        return "connection_lost"
    return "channel_closed"


# ---- which vhosts trace ----

# compiled, a function is not a Python function object
INTERPRETED: Final = isinstance(close_why, types.FunctionType)


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
        current = vhost.tracer
        # a relay (the test kit's recorder) stays in front and hands every event on
        relay = current if isinstance(current, Relay) else None
        if current is not None and (relay is None or relay.inner is not None):
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
        tracer = (InterpretedTracer if INTERPRETED else Tracer)(
            self.writer, vhost.name, vhost.exchanges[TRACE_EXCHANGE]
        )
        if relay is not None:
            relay.inner = tracer
            relay.firehose = tracer.firehose
        else:
            vhost.tracer = tracer
        tracer.mark("trace_started")
        self.traced[vhost.name] = vhost
        return True

    def disable(self, vhost: VirtualHost) -> bool:
        """Stop tracing ``vhost``; False if it did not trace."""
        tracer = vhost.tracer
        relay = tracer if isinstance(tracer, Relay) else None
        if relay is not None:
            tracer = relay.inner
        if tracer is None:
            return False
        tracer.mark("trace_stopped")
        if relay is not None:
            relay.inner = None
            relay.firehose = relay.idle_firehose
        else:
            vhost.tracer = None
        if self.writer is not None:
            self.writer.forget_vhost(vhost)
            self.writer.tracers.pop(tracer, None)
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
            "buffered_ints": writer.held() // 8 if writer is not None else 0,
            "files": writer.files() if writer is not None else [],
        }
