"""The stream log (osiris's job in RabbitMQ): segment files of chunks, their index, reads
from an offset, and retention.

The log is a directory of segment files of chunks (one chunk: the messages one loop turn
appended, with a header of first offset, count, timestamp and the filter values in it).
The files are written by the message store's writer thread in its batches
(broker/store/segments.py): a publisher confirm, and a consumer's sight of the chunk
(RabbitMQ's committed offset), wait until the chunk is written to its file, as osiris
confirms; the store's syncer thread fdatasyncs it right after. A batch that also holds
persistent messages of other queues waits for their fsync.

In memory there is, per segment, an index of its chunks (first offset, file position,
timestamp: 24 bytes a chunk), never the messages: each consumer has a cursor
(broker/streams/stream.py) that reads the next chunks with one ``os.pread`` and holds at
most one read's worth of them, so memory does not grow with the log or with a slow reader.
"""

from __future__ import annotations

import binascii
import bisect
import os
import struct
import time
from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from warren.broker.engine.message import Message
from warren.broker.store.writer import private
from warren.protocol.properties import (
    FLAG_HEADERS,
    FLAG_MORE,
    decode_field,
    has_flag,
    headers_at,
    set_header,
    split_properties,
)

if TYPE_CHECKING:
    from warren.broker.engine.timers import Timers
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
_HEADERS_BIT = FLAG_HEADERS >> 8  # in the first byte of the flag word
_U32 = struct.Struct(">I")
# a headers table of the offset header alone, without its 8-byte value
_OFFSET_TABLE = struct.pack(">I", len(_OFFSET_ENTRY) + 8) + _OFFSET_ENTRY
_OFFSET_TABLE_SIZE = len(_OFFSET_TABLE) + 8

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
            at = headers_at(properties)
            # exchange+routing key length, no filter value, properties length
            self.lead = _LEAD.pack(len(ex_rk), 0, len(properties) + _OFFSET_TABLE_SIZE)
            self.middle = (
                ex_rk + bytes((properties[0] | _HEADERS_BIT,)) + properties[1:at] + _OFFSET_TABLE
            )
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
        if has_flag(properties, FLAG_HEADERS | FLAG_MORE):  # a headers table (or more flags)
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
        at = headers_at(properties)
        pending.append(
            b"".join((
                _RECORD.pack(len(ex_rk), 0, len(properties) + _OFFSET_TABLE_SIZE, len(body),
                             msg.trace_id),
                ex_rk, bytes((properties[0] | _HEADERS_BIT,)), properties[1:at], _OFFSET_TABLE,
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


_EX_RK_CACHE: dict[bytes, tuple[str, str]] = {}


def record_names(ex_rk: bytes) -> tuple[str, str]:
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
    if has_flag(properties, FLAG_MORE) or _OFFSET_ENTRY[:16] in properties:
        return set_header(properties, "x-stream-offset", offset)
    at = headers_at(properties)
    entry = _OFFSET_ENTRY + _I64.pack(offset)
    if has_flag(properties, FLAG_HEADERS):
        (size,) = _U32.unpack_from(properties, at)
        end = at + 4 + size
        return b"".join((properties[:at], _U32.pack(size + len(entry)),
                         properties[at + 4 : end], entry, properties[end:]))  # fmt: skip
    return b"".join((bytes((properties[0] | _HEADERS_BIT, properties[1])), properties[2:at],
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
