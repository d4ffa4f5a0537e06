"""Stream queues (``x-queue-type: stream``): the queue type over an append-only log.

A stream keeps every message until retention removes whole segments; each consumer reads
from an offset it chooses and removes nothing. This module is the queue type (RabbitMQ's
rabbit_stream_queue): its arguments and their checks, consumers' offsets and filters, and
delivery from a cursor; the log itself (files, chunks, index, retention) is
broker/streams/log.py.
"""

from __future__ import annotations

import atexit
import datetime
import os
import re
import shutil
import tempfile
import weakref
from typing import TYPE_CHECKING, Any

from warren.broker.engine.arguments import wire_type
from warren.broker.engine.message import GONE, UNACKED, Message
from warren.broker.engine.queue import Queue
from warren.broker.engine.timers import Deadline
from warren.broker.streams.log import (
    DEFAULT_SEGMENT_SIZE,
    MAX_SEGMENT_SIZE,
    PARSED_KEPT,
    ParsedRead,
    StreamLog,
    parse_chunks,
    record_names,
)
from warren.protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError, ConnectionError_
from warren.protocol.frames import content_frames

if TYPE_CHECKING:
    from warren.broker.engine.confirms import Confirms
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.limiter import Limiter
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.store import MessageStore

# arguments of other queue types: refused on a stream (rabbit_amqqueue:check_arguments_key)
OTHER_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-dead-letter-strategy",
    "x-max-length",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-version",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-consumer-timeout",
    "x-quorum-initial-group-size",
    "x-delayed-retry-type",
    "x-delayed-retry-min",
    "x-delayed-retry-max",
    "x-delayed-retry-multiplier",
    "x-delayed-retry-schedule",
)
CONSUMER_ARGUMENTS = ("x-stream-offset", "x-stream-filter", "x-stream-match-unfiltered")
OTHER_CONSUMER_ARGUMENTS = ("x-priority", "x-consumer-timeout")
_INTEGER_TYPES = ("long", "short", "signedint", "unsignedint", "unsignedbyte", "unsignedshort",
                  "byte")  # fmt: skip
_AGE_UNITS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
              "m": 60_000, "s": 1000}  # fmt: skip
_AGE = re.compile(r"^([0-9]+)(.*)$", re.S)


def parse_age(value: str) -> int | None:
    """``7D``, ``1h``... in ms (rabbit_amqqueue:check_max_age); None if invalid."""
    match = _AGE.match(value)
    if match is None or int(match.group(1)) <= 0 or match.group(2) not in _AGE_UNITS:
        return None
    return int(match.group(1)) * _AGE_UNITS[match.group(2)]


def _where(queue: str, vhost: str) -> str:
    return f"queue '{queue}' in vhost '{vhost}'"


def _invalid(arg: str, queue: str, vhost: str, reason: str) -> ChannelError:
    return ChannelError(
        PRECONDITION_FAILED, f"invalid arg '{arg}' for {_where(queue, vhost)}: {reason}"
    )


def _erlang(value: Any, kind: str) -> str:
    """A consume argument as RabbitMQ prints the {Type, Value} it could not use."""
    if isinstance(value, str):
        return f'{{{kind},<<"{value}">>}}'
    if isinstance(value, bool):
        return f"{{{kind},{'true' if value else 'false'}}}"
    return f"{{{kind},{value}}}"


def validate_stream_arguments(
    args: dict[str, Any], queue: str, vhost: str, *, durable: bool, exclusive: bool,
    auto_delete: bool,
) -> None:  # fmt: skip
    """RabbitMQ 4.3's checks of a stream declaration, in its order, with its texts."""
    for arg in ("x-max-length-bytes", "x-stream-max-segment-size-bytes",
                "x-stream-filter-size-bytes", "x-initial-cluster-size"):  # fmt: skip
        if arg not in args:
            continue
        value, kind = args[arg], wire_type(args, arg)
        if kind not in _INTEGER_TYPES or isinstance(value, bool):
            raise _invalid(arg, queue, vhost, f'"expected integer, got {kind}"')
        if value < 0:
            raise _invalid(arg, queue, vhost, f"{{value_negative,{value}}}")
        if value == 0 and arg == "x-initial-cluster-size":
            raise _invalid(arg, queue, vhost, "{value_zero,0}")
    if "x-max-age" in args:
        age = args["x-max-age"]
        if not isinstance(age, str):
            raise _invalid(
                "x-max-age", queue, vhost, f"{{unacceptable_type,{wire_type(args, 'x-max-age')}}}"
            )
        if parse_age(age) is None:
            raise _invalid("x-max-age", queue, vhost, "invalid_max_age")
    for arg in args:
        if arg in OTHER_ARGUMENTS:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg '{arg}' for {_where(queue, vhost)} of queue type rabbit_stream_queue",
            )
    # rabbit_stream_queue:declare/2: the queue's properties, then the stream's own limits
    for bad, name in ((auto_delete, "auto-delete"), (exclusive, "exclusive-owner"),
                      (not durable, "non-durable")):  # fmt: skip
        if bad:
            raise ChannelError(
                PRECONDITION_FAILED, f"invalid property '{name}' for {_where(queue, vhost)}"
            )
    segment = args.get("x-stream-max-segment-size-bytes")
    if segment is not None and segment > MAX_SEGMENT_SIZE:
        raise ChannelError(
            PRECONDITION_FAILED, "Exceeded max value for x-stream-max-segment-size-bytes"
        )
    filter_size = args.get("x-stream-filter-size-bytes")
    if filter_size is not None and not 16 <= filter_size <= 255:
        raise ChannelError(PRECONDITION_FAILED, "Invalid value for x-stream-filter-size-bytes")


def parse_offset(args: dict[str, Any], queue: str, vhost: str) -> tuple[str, int]:
    """The consumer's ``x-stream-offset``: (kind, value), kind one of first, last, next,
    offset, timestamp (ms since the epoch), age (ms before now); rabbit_stream_queue's
    parse_offset_arg/1."""
    if "x-stream-offset" not in args:
        return "next", 0
    value, kind = args["x-stream-offset"], wire_type(args, "x-stream-offset")
    if value in ("first", "last", "next"):
        return value, 0
    if isinstance(value, datetime.datetime):
        return "timestamp", int(value.timestamp()) * 1000
    if isinstance(value, str) and kind == "longstr":
        age = parse_age(value)
        if age is not None:
            return "age", age
    elif isinstance(value, int) and not isinstance(value, bool):
        return "offset", value
    raise _invalid(
        "x-stream-offset", queue, vhost, f"{{invalid_stream_offset_arg,{_erlang(value, kind)}}}"
    )


def check_consume(queue: Queue, args: dict[str, Any], no_ack: bool, limiter: Limiter) -> None:
    """basic.consume on a stream: RabbitMQ 4.3's argument checks, then its consume/3 clauses."""
    where = _where(queue.name, queue.vhost.name)
    for arg in args:
        if arg in OTHER_CONSUMER_ARGUMENTS:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg '{arg}' for {where} of queue type rabbit_stream_queue",
            )
    parse_offset(args, queue.name, queue.vhost.name)
    if not limiter.prefetch_count:
        raise ChannelError(
            PRECONDITION_FAILED, f"consumer prefetch count is not set for stream {where}"
        )
    if no_ack:
        raise ConnectionError_(
            NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream {where}", 60, 20
        )
    if limiter.prefetch_global:
        raise ConnectionError_(NOT_IMPLEMENTED, f"{where} does not support global qos", 60, 20)


def _filters(args: dict[str, Any]) -> tuple[frozenset[str] | None, bool]:
    """``x-stream-filter`` (a string or an array of strings) and ``x-stream-match-unfiltered``."""
    raw = args.get("x-stream-filter")
    if isinstance(raw, str):
        values: frozenset[str] | None = frozenset((raw,))
    elif isinstance(raw, list):
        values = frozenset(v for v in raw if isinstance(v, str))
    else:
        return None, False
    return values, args.get("x-stream-match-unfiltered") is True


_private: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _private_store(vhost: VirtualHost) -> tuple[MessageStore, str]:
    """A broker without a data directory still keeps streams on disk, in a temporary one."""
    from warren.broker.store import MessageStore

    found = _private.get(vhost.timers)
    if found is None:
        directory = tempfile.mkdtemp(prefix="warren-streams-")
        atexit.register(shutil.rmtree, directory, True)
        store = MessageStore(
            os.path.join(directory, "messages"), vhost.log, clock=vhost.timers, sync=False
        )
        store.start(vhost.timers.loop)
        found = _private[vhost.timers] = (store, directory)
    return found


_ids = iter(range(1, 1 << 62))


class Cursor:
    """A consumer's place in the stream: the read it delivers from, and where in it."""

    __slots__ = ("filters", "index", "offset", "read", "unfiltered")

    def __init__(self, offset: int, filters: frozenset[str] | None, unfiltered: bool) -> None:
        self.offset = offset  # the next offset to read from the log
        self.read: ParsedRead | None = None
        self.index = 0  # the next message of ``read`` to deliver
        self.filters = filters
        self.unfiltered = unfiltered

    def next_offset(self) -> int:
        read = self.read
        if read is not None and self.index < len(read.messages):
            return read.messages[self.index][0]
        return self.offset


class StreamQueue(Queue):
    """A queue of type stream: the Queue interface the channel, management and metrics use,
    over a StreamLog. Nothing is ever removed by consumers."""

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        *,
        durable: bool = False,
        exclusive_owner: object | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        # Queue's parameters spelled out: compiled, **kwargs would reach it as one dict
        self.stream: StreamLog | None = None
        self.cursors: dict[Consumer, Cursor] = {}
        self._wake: list[Consumer] = []  # consumers whose acks gave credit back
        # the last reads parsed, by (offset, filter): readers replaying together parse once
        self._parsed: dict[tuple[int, Any, bool], ParsedRead] = {}
        self._age_timer: Deadline | None = None
        super().__init__(
            vhost,
            name,
            durable=durable,
            exclusive_owner=exclusive_owner,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        self.queue_type = "stream"
        self._age_timer = Deadline(vhost.timers, self.apply_retention)

    # ---- the log's place ----

    def open_log(self, store: MessageStore | None, directory: str | None) -> None:
        """Open (or recover) the log: in the data directory, else a private temporary one."""
        if store is None or directory is None:
            store, root = _private_store(self.vhost)
            directory = os.path.join(root, "streams", str(next(_ids)))
        self.stream = StreamLog(store, directory, self.vhost.log, self.vhost.timers)
        self.stream.on_commit = self._committed
        self.stream.on_roll = self.apply_retention
        self.apply_settings()
        self._sync_counts()

    @property
    def log(self) -> StreamLog:
        if self.stream is None:  # declared without persistence hooks (tests of the engine)
            self.open_log(None, None)
        assert self.stream is not None
        return self.stream

    # ---- settings ----

    def _apply_settings(self) -> None:
        super()._apply_settings()
        # classic settings from a policy do not apply to streams (RabbitMQ's unsupported_policies)
        self.message_ttl = self.expires = self.max_length = None
        self.dead_letter_exchange = self.dead_letter_routing_key = None
        self._limited = False
        self.delivery_limit = None
        self.counts_deliveries = False
        args = self.arguments
        definition = self.effective_definition()

        def pick(key: str) -> Any:
            arg = "x-" + key
            return args[arg] if arg in args else definition.get(key)

        age = pick("max-age")
        self.max_age_ms: int | None = parse_age(age) if isinstance(age, str) else None
        size = pick("stream-max-segment-size-bytes")
        if self.stream is not None:
            self.stream.max_segment_size = size if isinstance(size, int) else DEFAULT_SEGMENT_SIZE
            self.apply_retention()

    def consumer_timeout_for(self, consumer_arguments: dict[str, Any]) -> int | None:
        return None  # no consumer timeouts on streams

    # ---- counts the rest of the broker reads ----

    def _sync_counts(self) -> None:
        """Queue's ready_count and ready_bytes from the log: the messages readable (committed)
        and the size of the segment files. Plain attributes, not properties, so that the
        compiled Queue reads them as it reads any queue's."""
        log = self.stream
        self.ready_count = log.committed - log.first_offset if log is not None else 0
        self.ready_bytes = log.bytes if log is not None else 0

    # ---- in ----

    def publish(self, msg: Message, ttl: int | None, confirm: Confirms | None = None) -> bool:
        """Append (a stream takes every message; TTLs do not apply)."""
        log = self.stream
        if log is None:
            log = self.log
        log.append(msg)
        self.stats.published += 1
        store = log.store
        if store is self.message_store:  # written with the store's batch: a tx.commit-ok
            store.published += 1  # waits for it
        if confirm is not None:
            confirm.chunk(store)  # and so does a confirm, whichever store writes the chunk
        return True

    def _committed(self) -> None:
        self._sync_counts()
        if self.consumers:
            self._wake.clear()
            self.dispatch()

    # ---- out ----

    def add_consumer(self, consumer: Consumer) -> None:
        log = self.log
        kind, value = parse_offset(consumer.arguments, self.name, self.vhost.name)
        if kind == "first":
            start = log.first_offset
        elif kind == "last":
            start = log.last_chunk()
        elif kind == "offset":
            start = min(max(value, log.first_offset), log.next_offset)
        elif kind in ("timestamp", "age"):
            stamp = value if kind == "timestamp" else log.wall_ms() - value
            start = max(log.offset_at(stamp), log.first_offset)
        else:
            start = log.next_offset
        filters, unfiltered = _filters(consumer.arguments)
        self.cursors[consumer] = Cursor(start, filters, unfiltered)
        self.consumers.append(consumer)
        self.dispatcher.had_consumers = True
        self._deliver_to(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.cursors.pop(consumer, None) is not None:
            self.consumers.remove(consumer)

    def dispatch(self) -> None:
        """Consumers read independently: each gets what its credit allows."""
        wake = self._wake
        if wake:
            consumers, self._wake = wake, []
        else:
            consumers = self.consumers
        for consumer in consumers:
            self._deliver_to(consumer)

    def _deliver_to(self, consumer: Consumer) -> None:
        cursor = self.cursors.get(consumer)
        if cursor is None:
            return
        channel = consumer.channel
        log = self.log
        stats = self.stats
        read = cursor.read
        frames: list[bytes | None] = []
        while channel.can_deliver(consumer):
            i = cursor.index
            if read is None or i >= len(read.messages):
                if not self._fill(cursor, log):
                    return
                read = cursor.read
                assert read is not None
                frames = read.frames_for(channel.id, channel.conn.frame_max)
                continue
            if not frames:
                frames = read.frames_for(channel.id, channel.conn.frame_max)
            cursor.index = i + 1
            _, ex_rk, props, body, trace_id = read.messages[i]
            content = frames[i]
            if content is None:
                frames[i] = content = b"".join(
                    content_frames(channel.id, props, body, channel.conn.frame_max)
                )
            exchange, routing_key = record_names(ex_rk)
            msg = Message(exchange, routing_key, props, body)
            msg._ex_rk = ex_rk
            msg.trace_id = trace_id
            msg.queue = self
            msg.state = UNACKED  # not counted as unacked: RabbitMQ reports 0 for streams
            stats.delivered += 1
            channel.deliver(consumer, msg, content)

    def _fill(self, cursor: Cursor, log: StreamLog) -> bool:
        while True:
            if cursor.offset < log.first_offset:
                cursor.offset = log.first_offset  # retention removed what it had not read
            key = (cursor.offset, cursor.filters, cursor.unfiltered)
            parsed = self._parsed.get(key)
            if parsed is None:
                read = log.read(cursor.offset)
                if read is None:
                    return False
                _, data, end = read
                messages = parse_chunks(data, cursor.offset, cursor.filters, cursor.unfiltered)
                parsed = ParsedRead(messages, end)
                if len(self.cursors) > 1:
                    if len(self._parsed) >= PARSED_KEPT:
                        del self._parsed[next(iter(self._parsed))]
                    self._parsed[key] = parsed
            cursor.read = parsed
            cursor.index = 0
            cursor.offset = parsed.end
            if parsed.messages:
                return True

    def get(self) -> Message | None:
        raise ConnectionError_(
            NOT_IMPLEMENTED,
            f"basic.get not supported by stream queues {_where(self.name, self.vhost.name)}",
            60,
            70,
        )

    def purge(self) -> int:
        raise ConnectionError_(
            NOT_IMPLEMENTED,
            f"queue.purge not supported by stream queues {_where(self.name, self.vhost.name)}",
            50,
            30,
        )

    # ---- settling: every settle gives credit back (rabbit_stream_queue:settle/5, 4.3) ----

    def settled(self, msg: Message) -> None:
        if msg.state == UNACKED:
            msg.state = GONE
            self.stats.acked += 1
            self._credit(msg)

    def rejected(self, msg: Message) -> None:
        if msg.state == UNACKED:
            msg.state = GONE
            self._credit(msg)

    def return_unacked(
        self, msgs: list[Message], why: str, failed: bool = True, counted: bool = True
    ) -> None:
        for msg in msgs:
            self.rejected(msg)
        if not self.deleted:
            self.dispatch()

    def _credit(self, msg: Message) -> None:
        consumer = msg.consumer
        if consumer is not None and consumer in self.cursors and consumer not in self._wake:
            self._wake.append(consumer)

    def requeue(self, msgs: list[Message], why: str) -> None:
        self.return_unacked(msgs, why)

    # ---- retention ----

    def apply_retention(self) -> None:
        """Whole segments from the old end, never the one being written (osiris' retention)."""
        log = self.stream
        if log is None or self.deleted:
            return
        self._sync_counts()  # at the end too: a segment the log rolled is counted first
        definition = self.effective_definition()
        max_bytes = self.arguments.get("x-max-length-bytes", definition.get("max-length-bytes"))
        now_ms = log.wall_ms()
        segments = log.segments
        while len(segments) > 1:
            oldest = segments[0]
            over_size = isinstance(max_bytes, int) and log.bytes > max_bytes
            too_old = (
                self.max_age_ms is not None
                and bool(oldest.timestamps)
                and oldest.timestamps[-1] < now_ms - self.max_age_ms
            )
            if not over_size and not too_old:
                break
            log.drop_oldest()
            self._parsed.clear()
            self._sync_counts()
        if self._age_timer is None:
            return
        self._age_timer.cancel()
        if self.max_age_ms is not None and len(segments) > 1 and segments[0].timestamps:
            due_ms = segments[0].timestamps[-1] + self.max_age_ms
            self._age_timer.arm(self._now() + max(due_ms - now_ms, 0) / 1000 + 0.001)

    # ---- lifecycle ----

    def restore_messages(
        self, records: list[Any], now_wall: float, now_mono: float
    ) -> list[Message]:
        return []

    def close(self) -> None:
        self.deleted = True
        if self._age_timer is not None:
            self._age_timer.cancel()
        self.deadlines.unused.cancel()
        self.cursors.clear()
        if self.stream is not None:
            self.stream.close(delete=True)

    def consumer_offsets(self) -> list[tuple[Consumer, int]]:
        """Each consumer and the offset of the next message it gets."""
        out = []
        for consumer, cursor in self.cursors.items():
            out.append((consumer, cursor.next_offset()))
        return out

    def stream_info(self, node: str) -> dict[str, Any]:
        """The management API's stream fields (rabbit_stream_queue:i/2: ``readers`` is the
        count of readers per node, readers/1), and Warren's ``reader_offsets``: each
        consumer and the offset of the next message it gets."""
        log = self.log
        first = log.segments[0] if log.segments else None
        stamp = first.timestamps[0] if first is not None and first.timestamps else None
        return {
            "segments": len(log.segments),
            "committed_offset": log.committed - 1 if log.committed else None,
            "first_offset": log.first_offset,
            "first_timestamp": stamp,
            "stream_bytes": log.bytes,
            "readers": {node: len(self.cursors)},
            "reader_offsets": [
                {"consumer_tag": c.tag, "channel": c.channel.id, "offset": offset}
                for c, offset in self.consumer_offsets()
            ],
        }


def stream_directory(store: MessageStore, queue_id: int) -> str:
    """Where the log of the durable stream with store id ``queue_id`` lives."""
    return os.path.join(os.path.dirname(store.directory), "streams", str(queue_id))
