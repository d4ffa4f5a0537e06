"""Look at a queue's ready messages without taking them, and take out one of them.

Browsing reads: a message held as an object is read where it is, a paged-out body and a
message packed in a paged run (broker/store/paged.py) are read from the store, and nothing
about the queue changes (no state, count, flag, memory use or position). Taking one out
(delete, move, send to the tail) happens in one turn of the loop, so no consumer can be
handed the message meanwhile. Not on the message path: nothing here is compiled.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warren.broker.engine.arrivals import arrival_of
from warren.broker.engine.message import READY, Message
from warren.broker.store.paged import REDELIVERED, PagedRun

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.streams.stream import StreamQueue


@dataclass(slots=True)
class Browsed:
    """One ready message as browse shows it."""

    position: int  # its place in delivery order (a stream: its offset)
    seq: int  # its arrival number in the queue, stable while it stays (0: a stream's)
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    redelivered: bool
    delivery_count: int
    paged_out: bool
    enqueued_at: float | None  # seconds since the epoch, or None (restored after a restart)


# An entry in delivery order: a Message held as an object, or a packed run and an index.
Entry = Message | tuple[PagedRun, int]


def _entries(queue: Queue, skip: int) -> Iterator[Entry]:
    """The ready messages from position ``skip`` on, in delivery order, touching nothing."""
    for msg in queue.ready:
        if msg.state != READY:
            continue  # expired or taken out, waiting to be dropped at the head
        if skip:
            skip -= 1
            continue
        yield msg
    for item in queue.tail:
        if item.__class__ is PagedRun:
            assert isinstance(item, PagedRun)
            packed = item.packed
            if skip >= packed:
                skip -= packed
            else:
                for k in range(item.head + skip, len(item.ids)):
                    yield item, k
                skip = 0
            for msg in item.pending:
                if msg.state != READY:
                    continue
                if skip:
                    skip -= 1
                    continue
                yield msg
        else:
            assert isinstance(item, Message)
            if item.state != READY:
                continue
            if skip:
                skip -= 1
                continue
            yield item


def _seq(entry: Entry) -> int:
    if isinstance(entry, Message):
        return entry.seq
    run, k = entry
    return run.first_seq + k


def _read(queue: Queue, entry: Entry, position: int, wall_offset: float) -> Browsed:
    if isinstance(entry, Message):
        msg = entry
        paged = msg.paged_size >= 0
        if paged:  # read from its segment without bringing it back (Message.body would)
            store = queue.message_store
            assert store is not None
            body = store.pager.read_body(msg.store_segment, msg.store_offset, msg.body_size())
        else:
            body = msg.body
        at = arrival_of(queue, msg.seq)
        return Browsed(
            position, msg.seq, msg.exchange, msg.routing_key, msg.properties, body,
            msg.redelivered, msg.delivery_count, paged,
            None if at is None else at + wall_offset,
        )  # fmt: skip
    run, k = entry
    store = queue.message_store
    assert store is not None
    record = store.pager.read_packed(run, k)
    seq = run.first_seq + k
    at = arrival_of(queue, seq)
    return Browsed(
        position, seq, record.exchange, record.routing_key, record.properties,
        record.body or b"", bool(run.flags[k] & REDELIVERED), record.delivery_count, True,
        None if at is None else at + wall_offset,
    )  # fmt: skip


def _wall_offset(queue: Queue) -> float:
    timers = queue.vhost.timers
    return timers.wall() - timers.now()


def browse(queue: Queue, offset: int, count: int, match: Matcher | None = None) -> list[Browsed]:
    """``count`` ready messages from position ``offset`` on; with ``match``, the first
    ``count`` matching ones from there (their positions say where they are)."""
    out: list[Browsed] = []
    if count <= 0:
        return out
    wall_offset = _wall_offset(queue)
    for position, entry in enumerate(_entries(queue, offset), offset):
        row = _read(queue, entry, position, wall_offset)
        if match is None or match(row):
            out.append(row)
            if len(out) >= count:
                break
    return out


class Matcher:
    """A search: ``text`` in the message id, the correlation id or a header's value."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, row: Browsed) -> bool:
        from warren.protocol.properties import decode_field, split_properties

        fields = split_properties(row.properties)
        for name in ("message_id", "correlation_id"):
            raw = fields.get(name)
            if raw is not None and self.text in str(decode_field(name, raw)):
                return True
        raw = fields.get("headers")
        if raw is not None:
            headers = decode_field("headers", raw)
            if isinstance(headers, dict):
                for value in headers.values():
                    if isinstance(value, bytes):
                        value = value.decode("utf-8", "replace")
                    if not isinstance(value, dict | list) and self.text in str(value):
                        return True
        return False


def find(
    queue: Queue,
    *,
    position: int | None = None,
    seq: int | None = None,
    message_id: str | None = None,
) -> int | None:
    """The seq of the ready message chosen by position, seq or message id (the oldest with
    it), or None when there is none (delivered, gone, or never there)."""
    if position is not None:
        for entry in _entries(queue, position):
            return _seq(entry)
        return None
    matcher = _IdMatcher(message_id) if message_id is not None else None
    for entry in _entries(queue, 0):
        if matcher is None:
            if _seq(entry) == seq:
                return seq
        elif matcher.matches(queue, entry):
            return _seq(entry)
    return None


class _IdMatcher:
    def __init__(self, message_id: str) -> None:
        self.message_id = message_id

    def matches(self, queue: Queue, entry: Entry) -> bool:
        from warren.protocol.properties import decode_field, split_properties

        if isinstance(entry, Message):
            properties = entry.properties
        else:
            store = queue.message_store
            assert store is not None
            properties = store.pager.read_packed(*entry).properties
        raw = split_properties(properties).get("message_id")
        return raw is not None and decode_field("message_id", raw) == self.message_id


def take_out(queue: Queue, seq: int, why: str) -> Message | None:
    """The ready message ``seq``, out of the queue (its store record removed), with its body
    in memory; None if it is not ready in the queue. Messages of the paged backlog before
    it come back into memory first, in order, as they would on their way to the head.
    ``why`` is the trace's reason (deleted, moved, to_tail)."""
    msg = held(queue, seq)
    if msg is None:
        return None
    if (tracer := queue.vhost.tracer) is not None:
        tracer.dropped(queue, msg, why)
    body = msg.body  # a paged-out one's body is read back before its record goes
    queue.ready_count -= 1
    queue.ready_bytes -= len(body)
    if queue.ready and queue.ready[0] is msg:
        queue.ready.popleft()
    queue.gone(msg)  # GONE where it sits: skipped when it reaches the head, as an expiry is
    if not queue.ready_count:
        queue.ready.clear()
    return msg


def held(queue: Queue, seq: int) -> Message | None:
    """The ready Message ``seq``, still in the queue, brought out of the paged backlog if
    it is packed there (nothing a client sees changes)."""
    for msg in queue.ready:
        if msg.seq == seq:
            return msg if msg.state == READY else None
    for item in queue.tail:
        if item.__class__ is PagedRun:
            assert isinstance(item, PagedRun)
            if item.first_seq + item.head <= seq < item.first_seq + len(item.ids):
                return _bring_forward(queue, seq)
            for msg in item.pending:
                if msg.seq == seq:
                    return _bring_forward(queue, seq) if msg.state == READY else None
        else:
            assert isinstance(item, Message)
            if item.seq == seq:
                return item if item.state == READY else None
    return None


def _bring_forward(queue: Queue, seq: int) -> Message | None:
    """Move the backlog up to message ``seq`` into ``ready`` (the queue's refill, without
    waiting for ``ready`` to run dry): a packed or pending message becomes a Message in
    place, ``ready`` stays in delivery order (all of it is earlier than the backlog)."""
    store = queue.message_store
    assert store is not None
    ready, tail = queue.ready, queue.tail
    while tail:
        item = tail[0]
        if item.__class__ is PagedRun:
            assert isinstance(item, PagedRun)
            if item.packed:
                store.pager.materialise(item, ready)
            else:
                for msg in item.pending:
                    if msg.state == READY:
                        ready.append(msg)
                item.pending.clear()
            if not len(item):
                tail.popleft()
                store.pager.run_done(item)
        else:
            assert isinstance(item, Message)
            tail.popleft()
            ready.append(item)
        if ready and ready[-1].seq >= seq:
            break
    for msg in reversed(ready):
        if msg.seq == seq:
            return msg if msg.state == READY else None
    return None


def stream_rows(queue: StreamQueue, offset: int, count: int) -> list[Browsed]:
    """``count`` messages of a stream from ``offset`` on (the first offset still in the log
    if ``offset`` is older), read from its segment files as a consumer reads them."""
    from warren.broker.streams.log import parse_chunks, record_names

    log = queue.log
    out: list[Browsed] = []
    at = max(offset, log.first_offset)
    while len(out) < count:
        read = log.read(at)
        if read is None:
            break
        _, data, end = read
        for position, ex_rk, props, body, _ in parse_chunks(data, at, None, True):
            exchange, routing_key = record_names(ex_rk)
            stamp = _chunk_time(queue, position)
            out.append(Browsed(
                position, 0, exchange, routing_key, props, body, False, 0, False, stamp
            ))  # fmt: skip
            if len(out) >= count:
                break
        at = end
    return out


def _chunk_time(queue: StreamQueue, offset: int) -> float | None:
    """The timestamp of the chunk holding ``offset`` (the time it was written), in seconds."""
    from bisect import bisect_right

    for segment in reversed(queue.log.segments):
        if segment.first <= offset:
            i = bisect_right(segment.chunks, offset) - 1
            return segment.timestamps[i] / 1000 if i >= 0 else None
    return None
