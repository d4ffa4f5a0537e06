"""Stream queues (``x-queue-type: stream``): an append-only log that consumers replay.

A stream keeps every message until retention removes whole segments; each
consumer reads from an offset it chooses and removes nothing. The log is a
directory of segment files of chunks (one chunk: the messages one loop turn
appended, with a header of first offset, count, timestamp and the filter values
in it). The files are written by the message store's writer thread in its
batches (broker/store/segments.py): a publisher confirm, and a consumer's sight of
the chunk (RabbitMQ's committed offset), wait until the chunk is written to its file,
as osiris confirms; the store's syncer thread fdatasyncs it right after. A batch
that also holds persistent messages of other queues waits for their fsync.

In memory there is, per segment, an index of its chunks (first offset, file
position, timestamp: 24 bytes a chunk), never the messages: each consumer has a
cursor that reads the next chunks with one ``os.pread`` and holds at most one
read's worth of them, so memory does not grow with the log or with a slow reader.
"""

from __future__ import annotations

import atexit
import binascii
import bisect
import datetime
import os
import re
import shutil
import struct
import tempfile
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.broker.engine.arguments import wire_type
from warren.broker.engine.message import GONE, UNACKED, Message
from warren.broker.engine.queue import Queue
from warren.broker.engine.timers import Deadline
from warren.broker.store.writer import private
from warren.protocol.constants import NOT_IMPLEMENTED, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError, ConnectionError_
from warren.protocol.frames import content_frames
from warren.protocol.properties import FLAG_HEADERS, decode_field, set_header, split_properties

if TYPE_CHECKING:
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.timers import Timers
    from warren.broker.engine.vhost import VirtualHost
    from warren.broker.store import MessageStore

# RabbitMQ's defaults and limits (rabbit_stream_queue.erl, rabbit.hrl)
DEFAULT_SEGMENT_SIZE = 500_000_000
MAX_SEGMENT_SIZE = 3_000_000_000
READ_SIZE = 256 * 1024  # bytes a cursor reads at once (whole chunks; a larger chunk is read whole)
PARSED_KEPT = 8  # reads kept parsed for other readers at the same place (memory: 8 reads)

# chunk: magic, first offset, count, timestamp (ms), filter section length, data length, crc32
_CHUNK = struct.Struct(">4sQIqIII")
_MAGIC = b"WSC1"
# record in a chunk: exchange+routing key (two short strings) length, filter value length,
# properties length, body length, trace id (broker/tracing/tracer.py); then those bytes
_RECORD = struct.Struct(">HHIIQ")
_U16 = struct.Struct(">H")
_LEAD = struct.Struct(">HHI")  # _RECORD's first three fields
_FILTER_KEY = b"x-stream-filter-value"
_OFFSET_ENTRY = b"\x0fx-stream-offsetl"  # the header's key and its field type, long
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
# a headers table of the offset header alone, without its 8-byte value
_OFFSET_TABLE = struct.pack(">I", len(_OFFSET_ENTRY) + 8) + _OFFSET_ENTRY
_OFFSET_TABLE_SIZE = len(_OFFSET_TABLE) + 8

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


def check_consume(
    queue: Queue, args: dict[str, Any], no_ack: bool, prefetch: int, global_qos: bool
) -> None:
    """basic.consume on a stream: RabbitMQ 4.3's argument checks, then its consume/3 clauses."""
    where = _where(queue.name, queue.vhost.name)
    for arg in args:
        if arg in OTHER_CONSUMER_ARGUMENTS:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg '{arg}' for {where} of queue type rabbit_stream_queue",
            )
    parse_offset(args, queue.name, queue.vhost.name)
    if not prefetch:
        raise ChannelError(
            PRECONDITION_FAILED, f"consumer prefetch count is not set for stream {where}"
        )
    if no_ack:
        raise ConnectionError_(
            NOT_IMPLEMENTED, f"automatic acknowledgement not supported by stream {where}", 60, 20
        )
    if global_qos:
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


# ---- the log ----


class Segment:
    """One segment file and the index of its chunks."""

    __slots__ = ("chunks", "fd", "first", "path", "positions", "size", "timestamps")

    def __init__(self, path: str, first: int) -> None:
        self.path = path
        self.first = first  # the offset of its first message
        self.chunks = array("q")  # first offset of each chunk
        self.positions = array("q")  # where each chunk starts in the file
        self.timestamps = array("q")  # each chunk's timestamp, ms since the epoch
        self.size = 0
        self.fd = -1  # opened for reading on first use


_private: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _private_store(vhost: VirtualHost) -> tuple[MessageStore, str]:
    """A broker without a data directory still keeps streams on disk, in a temporary one."""
    from warren.broker.store import MessageStore

    found = _private.get(vhost.timers)
    if found is None:
        directory = tempfile.mkdtemp(prefix="warren-streams-")
        atexit.register(shutil.rmtree, directory, True)
        store = MessageStore(os.path.join(directory, "messages"), vhost.log, sync=False)
        store.start(vhost.timers.loop)
        found = _private[vhost.timers] = (store, directory)
    return found


_ids = iter(range(1, 1 << 62))


def _sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SHAPE_REPEATS = 4  # messages in a row of one shape before it gets its own Struct


class _Shape:
    """What the records of one exchange, routing key and header-less properties share: the
    record of such a message is one pack of its body size, trace id and offset.

    The record (see _RECORD): lengths, trace id, exchange and routing key, then the
    properties with the headers flag set and a table of the ``x-stream-offset`` header
    after content-type and content-encoding (``middle``, up to the offset's 8 bytes), then
    the rest of the properties (``tail``)."""

    __slots__ = ("exchange", "lead", "middle", "pack", "properties", "routing_key", "tail")

    def __init__(self, exchange: str, routing_key: str, ex_rk: bytes, properties: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        at = 2
        if properties:
            flags = properties[0]
            if flags & 0x80:
                at += 1 + properties[2]
            if flags & 0x40:
                at += 1 + properties[at]
            # exchange+routing key length, no filter value, properties length
            self.lead = _LEAD.pack(len(ex_rk), 0, len(properties) + _OFFSET_TABLE_SIZE)
            self.middle = ex_rk + bytes((flags | 0x20,)) + properties[1:at] + _OFFSET_TABLE
        else:  # _NO_SHAPE: matches no message (properties have two flag bytes at least)
            self.lead = self.middle = b""
        self.tail = properties[at:]
        # the record: lead, body length, trace id, middle, offset, tail (_RECORD's layout)
        self.pack: Callable[..., bytes] = struct.Struct(
            f">{len(self.lead)}sIQ{len(self.middle)}sq{len(self.tail)}s"
        ).pack


_NO_SHAPE = _Shape("", "", b"", b"")


class StreamLog:
    """The segment files of one stream; appends go through the store's writer in its batches."""

    def __init__(self, store: MessageStore, directory: str, log: Any, timers: Timers) -> None:
        self.store = store
        # wall-clock ms read through the broker's clock, so a test's manual clock drives ages
        self._wall_offset = time.time() - timers.now()
        self._timers = timers
        self.directory = directory
        self.log = log
        if not os.path.isdir(directory):
            # the broker's user's only, the streams directory too (makedirs' mode is the leaf's)
            os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
            os.mkdir(directory, mode=0o700)
            if store.sync:  # its name, and the streams directory's, survive a power loss
                _sync_directory(os.path.dirname(directory))
                _sync_directory(os.path.dirname(os.path.dirname(directory)))
        self.segments: list[Segment] = []
        self.next_offset = 0  # the offset the next message gets
        self.committed = 0  # messages below this offset are on disk and readable
        self.max_segment_size = DEFAULT_SEGMENT_SIZE
        self.bytes = 0  # size of the segment files
        self._pending: list[bytes] = []  # records of the chunk this loop turn builds
        self._pending_first = 0
        self._filter_values: set[bytes] = set()
        self._filtered = 0  # messages of the chunk with a filter value
        # the shape of the messages appended lately (StreamLog.append), and the one that
        # would replace it once SHAPE_REPEATS messages in a row have it
        self._shape = _NO_SHAPE
        self._candidate: tuple[str, str, bytes] | None = None
        self._repeats = 0
        self._ex_rk: dict[tuple[str, str], bytes] = {}  # encoded once per exchange and key
        self._handle: Any = None  # the newest segment, open for appending
        self._inflight: deque[tuple[int, int]] = deque()  # (batch, next offset once synced)
        self.on_commit: Any = None  # called when more of the log became readable
        self.on_roll: Any = None  # called when a segment was closed (retention runs)
        self._recover()

    # ---- start-up ----

    def _recover(self) -> None:
        names = sorted(n for n in os.listdir(self.directory) if n.endswith(".seg"))
        for i, name in enumerate(names):
            path = os.path.join(self.directory, name)
            segment = Segment(path, int(name[:-4]))
            self._scan(segment, last=i == len(names) - 1)
            self.segments.append(segment)
            self.bytes += segment.size
        if self.segments:
            last = self.segments[-1]
            self.next_offset = self.committed = self._end_of(last)
        if self.segments:
            self._open_last()
        else:
            self._open_new(self.next_offset)

    def _scan(self, segment: Segment, last: bool) -> None:
        """Index a segment by reading its chunk headers; a torn tail is cut off."""
        size = os.path.getsize(segment.path)
        with open(segment.path, "rb") as fh:
            pos = 0
            next_offset = segment.first
            while pos + _CHUNK.size <= size:
                fh.seek(pos)
                magic, first, count, stamp, flen, dlen, crc = _CHUNK.unpack(fh.read(_CHUNK.size))
                end = pos + _CHUNK.size + flen + dlen
                if magic != _MAGIC or end > size or first != next_offset:
                    break
                if (last and end == size) or end + _CHUNK.size > size:
                    # the newest chunk of the log: check it whole (a kill -9 tears only the tail)
                    fh.seek(pos + _CHUNK.size + flen)
                    if binascii.crc32(fh.read(dlen)) != crc:
                        break
                segment.chunks.append(first)
                segment.positions.append(pos)
                segment.timestamps.append(stamp)
                next_offset = first + count
                pos = end
        if pos < size:
            self.log.warning(
                "stream: dropped a torn or corrupt tail", segment=segment.path,
                kept_bytes=pos, dropped_bytes=size - pos,
            )  # fmt: skip
            with open(segment.path, "r+b") as fh:
                fh.truncate(pos)
        segment.size = pos

    def _end_of(self, segment: Segment) -> int:
        """The offset after the last message of ``segment`` (read from its last chunk)."""
        if not segment.chunks:
            return segment.first
        with open(segment.path, "rb") as fh:
            fh.seek(segment.positions[-1])
            _, first, count, *_ = _CHUNK.unpack(fh.read(_CHUNK.size))
        return int(first + count)

    def _open_last(self) -> None:
        last = self.segments[-1]
        if last.size >= self.max_segment_size:
            self._open_new(self.next_offset)
        else:
            self._handle = open(last.path, "ab", buffering=0)  # noqa: SIM115

    def _open_new(self, first: int) -> None:
        path = os.path.join(self.directory, f"{first:020d}.seg")
        self._handle = open(path, "ab", buffering=0, opener=private)  # noqa: SIM115
        self.segments.append(Segment(path, first))
        if self.store.sync:  # the new file's name is durable before any confirm depends on it
            _sync_directory(self.directory)

    # ---- appending ----

    def append(self, msg: Message) -> None:
        """Add a message as published to this turn's chunk, its ``x-stream-offset`` header
        spliced into its properties and its filter value read here.

        A message of the current shape (exchange, routing key and header-less properties of
        the messages before it) is one pack; anything else takes ``_append_other``."""
        offset = self.next_offset
        self.next_offset = offset + 1
        pending = self._pending
        if not pending:
            self._pending_first = offset
            self.store.external_pending(self)
        shape = self._shape
        if (
            msg.properties == shape.properties
            and msg.routing_key == shape.routing_key
            and msg.exchange == shape.exchange
        ):
            body = msg.body
            pending.append(
                shape.pack(shape.lead, len(body), msg.trace_id, shape.middle, offset, shape.tail)
            )
            pending.append(body)
        else:
            self._append_other(msg, offset)

    def _append_other(self, msg: Message, offset: int) -> None:
        properties = msg.properties
        body = msg.body
        ex_rk = msg._ex_rk
        if ex_rk is None:
            names = (msg.exchange, msg.routing_key)
            ex_rk = self._ex_rk.get(names)
            if ex_rk is None:
                if len(self._ex_rk) > 1024:
                    self._ex_rk.clear()
                ex_rk = self._ex_rk[names] = msg.ex_rk
        pending = self._pending
        if properties[0] & 0x20 or properties[1] & 1:  # a headers table (or a second flag word)
            fv = _filter_value(properties)
            if fv is not None:
                self._filter_values.add(fv)
                self._filtered += 1
            properties = with_offset(properties, offset)
            pending.append(
                _RECORD.pack(len(ex_rk), len(fv or b""), len(properties), len(body), msg.trace_id)
                + ex_rk + (fv or b"") + properties
            )  # fmt: skip
            pending.append(body)
            return
        # a shape is worth its Struct once messages repeat it: the next ones take append's pack
        key = (msg.exchange, msg.routing_key, properties)
        if key == self._candidate:
            self._repeats += 1
            if self._repeats >= SHAPE_REPEATS:
                shape = self._shape = _Shape(msg.exchange, msg.routing_key, ex_rk, properties)
                pending.append(
                    shape.pack(shape.lead, len(body), msg.trace_id, shape.middle, offset,
                               shape.tail)
                )  # fmt: skip
                pending.append(body)
                return
        else:
            self._candidate = key
            self._repeats = 1
        # the properties without headers: flags with the headers bit, the short strings
        # before the table (content-type, content-encoding), the table of the one header
        flags = properties[0]
        at = 2
        if flags & 0x80:
            at += 1 + properties[2]
        if flags & 0x40:
            at += 1 + properties[at]
        pending.append(
            b"".join((
                _RECORD.pack(len(ex_rk), 0, len(properties) + _OFFSET_TABLE_SIZE, len(body),
                             msg.trace_id),
                ex_rk, bytes((flags | 0x20,)), properties[1:at], _OFFSET_TABLE,
                _I64.pack(offset), properties[at:],
            ))
        )  # fmt: skip
        pending.append(body)

    def take_chunk(self, batch: int) -> tuple[Any, bytes, bool]:
        """The store's handoff: this turn's messages become one chunk of the open batch."""
        data = b"".join(self._pending)
        count = len(self._pending) // 2
        self._pending.clear()
        if self._filtered:
            filters = [_U16.pack(len(v)) + v for v in sorted(self._filter_values)]
            section = (b"\x01" if count > self._filtered else b"\x00") + b"".join(filters)
            self._filter_values.clear()
            self._filtered = 0
        else:
            section = b"\x01"  # every message of the chunk without a filter value
        stamp = self.wall_ms()
        # binascii's crc32 keeps the GIL (zlib's lets it go above 5 KB, and then waits for it
        # behind the writer threads: ten times the cost on this loop)
        header = _CHUNK.pack(
            _MAGIC, self._pending_first, count, stamp, len(section), len(data), binascii.crc32(data)
        )
        chunk = header + section + data
        segment = self.segments[-1]
        segment.chunks.append(self._pending_first)
        segment.positions.append(segment.size)
        segment.timestamps.append(stamp)
        segment.size += len(chunk)
        self.bytes += len(chunk)
        self._inflight.append((batch, self._pending_first + count))
        handle = self._handle
        roll = segment.size >= self.max_segment_size
        if roll:  # the next chunk starts a new file; the writer closes this one once synced
            self._open_new(self.next_offset)
            if self.on_roll is not None:
                self.store._loop.call_soon(self.on_roll)  # type: ignore[union-attr]
        return handle, chunk, roll

    def wall_ms(self) -> int:
        return int((self._timers.now() + self._wall_offset) * 1000)

    def synced(self, batch: int) -> None:
        """The store's writer made ``batch`` durable: its chunks are readable now."""
        inflight = self._inflight
        if not inflight or inflight[0][0] > batch:
            return
        while inflight and inflight[0][0] <= batch:
            self.committed = inflight.popleft()[1]
        if self.on_commit is not None:
            self.on_commit()

    # ---- reading ----

    @property
    def first_offset(self) -> int:
        return self.segments[0].first if self.segments else self.next_offset

    def last_chunk(self) -> int:
        """The first offset of the last committed chunk (RabbitMQ's ``last``)."""
        for segment in reversed(self.segments):
            i = bisect.bisect_left(segment.chunks, self.committed) - 1
            if i >= 0:
                return segment.chunks[i]
        return self.committed

    def offset_at(self, stamp_ms: int) -> int:
        """The first chunk with a timestamp at or after ``stamp_ms`` (chunk granularity)."""
        for segment in self.segments:
            if segment.timestamps and segment.timestamps[-1] >= stamp_ms:
                i = bisect.bisect_left(segment.timestamps, stamp_ms)
                return segment.chunks[i]
        return self.next_offset

    def read(self, offset: int) -> tuple[int, bytes, int] | None:
        """Whole committed chunks from the one holding ``offset``: (first offset, bytes, end
        offset), READ_SIZE bytes or one chunk; None when nothing is readable there yet."""
        segments = self.segments
        if offset >= self.committed or not segments:
            return None
        s = (
            bisect.bisect_right([seg.first for seg in segments], offset) - 1
            if len(segments) > 1
            else 0
        )
        segment = segments[max(s, 0)]
        chunks = segment.chunks
        i = bisect.bisect_right(chunks, offset) - 1
        if i < 0:
            return None
        start = segment.positions[i]
        j = i + 1
        n = len(chunks)
        while j < n and chunks[j] < self.committed and segment.positions[j] - start < READ_SIZE:
            j += 1
        if (j < n and chunks[j] >= self.committed) or j < n:
            end_pos, end_offset = segment.positions[j], chunks[j]
        else:  # the segment's last chunk: it ends where the next segment starts
            end_pos = segment.size
            k = segments.index(segment) + 1
            end_offset = segments[k].first if k < len(segments) else self.committed
        if segment.fd < 0:
            segment.fd = os.open(segment.path, os.O_RDONLY)
        data = os.pread(segment.fd, end_pos - start, start)
        return chunks[i], data, end_offset

    # ---- retention ----

    def drop_oldest(self) -> Segment:
        segment = self.segments.pop(0)
        self.bytes -= segment.size
        if segment.fd >= 0:
            os.close(segment.fd)
        os.unlink(segment.path)
        return segment

    def close(self, delete: bool) -> None:
        self._inflight.clear()  # nothing to tell once its chunks are written
        self.on_commit = None
        if self._pending:  # the stream is deleted before its last chunk was handed over
            self._pending.clear()
            self.store._external.remove(self)
        for segment in self.segments:
            if segment.fd >= 0:
                os.close(segment.fd)
                segment.fd = -1
        if delete:
            self.store.remove_tree(self.directory, self._handle)


def parse_chunks(
    data: bytes, start: int, filters: frozenset[str] | None, unfiltered: bool
) -> list[tuple[int, bytes, bytes, bytes, int]]:
    """The messages of whole chunks, from offset ``start`` on: (offset, ex_rk, props, body)."""
    out: list[tuple[int, bytes, bytes, bytes, int]] = []
    pos = 0
    size = len(data)
    unpack_chunk, unpack_record = _CHUNK.unpack_from, _RECORD.unpack_from
    rsize = _RECORD.size
    wanted = {f.encode() for f in filters} if filters is not None else None
    while pos < size:
        _, offset, count, _, flen, dlen, _ = unpack_chunk(data, pos)
        section = pos + _CHUNK.size
        pos = section + flen + dlen
        if wanted is not None and not _chunk_matches(data, section, flen, wanted, unfiltered):
            continue  # RabbitMQ's Bloom filter step, exact here: the chunk is not parsed
        at = section + flen
        for _ in range(count):
            exrk_len, fv_len, plen, blen, trace_id = unpack_record(data, at)
            at += rsize
            if offset >= start:
                if wanted is not None:
                    fv = data[at + exrk_len : at + exrk_len + fv_len] if fv_len else None
                    if (fv is None and not unfiltered) or (fv is not None and fv not in wanted):
                        at += exrk_len + fv_len + plen + blen
                        offset += 1
                        continue
                p = at + exrk_len + fv_len
                out.append((offset, data[at : at + exrk_len], data[p : p + plen],
                            data[p + plen : p + plen + blen], trace_id))  # fmt: skip
            at += exrk_len + fv_len + plen + blen
            offset += 1
    return out


def _chunk_matches(data: bytes, at: int, length: int, wanted: set[bytes], unfiltered: bool) -> bool:
    end = at + length
    if unfiltered and data[at]:
        return True
    at += 1
    while at < end:
        (n,) = _U16.unpack_from(data, at)
        if data[at + 2 : at + 2 + n] in wanted:
            return True
        at += 2 + n
    return False


class ParsedRead:
    """The messages of one read, and their content frames as each (channel, frame_max)
    needs them: readers at the same place share both."""

    __slots__ = ("end", "frames", "messages")

    def __init__(self, messages: list[tuple[int, bytes, bytes, bytes, int]], end: int) -> None:
        self.messages = messages
        self.end = end  # the offset after the read
        self.frames: dict[tuple[int, int], list[bytes | None]] = {}

    def frames_for(self, channel: int, frame_max: int) -> list[bytes | None]:
        found = self.frames.get((channel, frame_max))
        if found is None:
            found = self.frames[(channel, frame_max)] = [None] * len(self.messages)
        return found


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


_EX_RK_CACHE: dict[bytes, tuple[str, str]] = {}


def _names(ex_rk: bytes) -> tuple[str, str]:
    found = _EX_RK_CACHE.get(ex_rk)
    if found is None:
        n = ex_rk[0]
        found = (
            ex_rk[1 : 1 + n].decode("utf-8", "surrogateescape"),
            ex_rk[2 + n :].decode("utf-8", "surrogateescape"),
        )
        if len(_EX_RK_CACHE) > 4096:
            _EX_RK_CACHE.clear()
        _EX_RK_CACHE[ex_rk] = found
    return found


def with_offset(properties: bytes, offset: int) -> bytes:
    """The properties with the ``x-stream-offset`` header added at the end of the table.

    Spliced into the bytes (the common case costs no table decode); anything unusual (a
    second flag word, the header already there) takes the general path.
    """
    flags = (properties[0] << 8) | properties[1]
    if flags & 1 or _OFFSET_ENTRY[:16] in properties:
        return set_header(properties, "x-stream-offset", offset)
    at = 2
    if flags & 0x8000:  # content-type
        at += 1 + properties[at]
    if flags & 0x4000:  # content-encoding
        at += 1 + properties[at]
    entry = _OFFSET_ENTRY + _I64.pack(offset)
    if flags & FLAG_HEADERS:
        (size,) = _U32.unpack_from(properties, at)
        end = at + 4 + size
        return b"".join((properties[:at], _U32.pack(size + len(entry)),
                         properties[at + 4 : end], entry, properties[end:]))  # fmt: skip
    flags |= FLAG_HEADERS
    return b"".join((bytes((flags >> 8, flags & 0xFF)), properties[2:at],
                     _U32.pack(len(entry)), entry, properties[at:]))  # fmt: skip


def _filter_value(properties: bytes) -> bytes | None:
    """The ``x-stream-filter-value`` header, read only when the bytes mention it."""
    if _FILTER_KEY not in properties:
        return None
    raw = split_properties(properties).get("headers")
    headers = decode_field("headers", raw) if raw is not None else None
    value = headers.get("x-stream-filter-value") if isinstance(headers, dict) else None
    if isinstance(value, bytes):
        return value
    return value.encode("utf-8", "surrogateescape") if isinstance(value, str) else None


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
        definition = self.policy.definition if self.policy is not None else {}

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

    def publish(self, msg: Message, ttl: int | None) -> bool:
        """Append (a stream takes every message; TTLs do not apply)."""
        log = self.stream
        if log is None:
            log = self.log
        log.append(msg)
        self.stats.published += 1
        store = log.store
        if store is self.message_store:
            store.published += 1  # the channel's confirm waits for the batch's write
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
            exchange, routing_key = _names(ex_rk)
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
        definition = self.policy.definition if self.policy is not None else {}
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
