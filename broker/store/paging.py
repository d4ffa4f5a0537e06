"""Paging: persistent bodies out of memory once on disk, and back (MessageStore.pager).

A queue over its memory limit hands the store messages to page out (``page_later``) or
a run to pack (``page_run_later``, broker/store/paged.py); each leaves memory once the
writer reports its record written and synced (``synced``), as a queue's messages may
only point into the log where the log is on disk. Bodies come back a batch at a time,
records next to each other in one segment with one read (``read_ahead``,
``materialise``), from a bounded set of open segment files (``read_body``), which
recovery and compaction read through too.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from warren.broker.engine.message import READY, Message, page_out, unpage
from warren.broker.store import records
from warren.broker.store.paged import REDELIVERED, PagedRun
from warren.broker.store.writer import segment_name

if TYPE_CHECKING:
    from warren.broker.store.segments import MessageStore

PAGE_LIMIT = 64 * 1024 * 1024  # queue_body_memory_limit: memory a queue keeps its ready messages in
READ_AHEAD = 512 * 1024  # body bytes read back at once when the head of a queue is paged out
READ_AHEAD_MIN = 64 * 1024
READ_AHEAD_COUNT = 1024
READ_GAP = 64 * 1024  # other records between two bodies that one read still spans
_FADVISE = hasattr(os, "posix_fadvise")
MAX_READERS = 32  # segment files held open for reading bodies back
UNWRITTEN = 1 << 60  # store_offset of a message whose publish record is not written yet


class Pager:
    """The store's bodies in and out of memory, and its reads of the log."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.io = store.io
        self.page_limit: int | None = PAGE_LIMIT  # None: bodies always stay in memory
        # messages waiting for their record to be written, in log order
        self._to_page: deque[Message] = deque()
        # packed paged-out messages (broker/store/paged.py): every live run, and those with
        # messages waiting for their record to be written
        self.runs: set[PagedRun] = set()
        self._pending_runs: dict[PagedRun, None] = {}
        self._batch_ends: deque[tuple[int, int, int]] = deque()  # (batch, segment, end offset)
        self._written = (0, 0)  # (segment, offset) up to which the log is on disk
        self._readers: dict[int, int] = {}  # segment -> file descriptor to read bodies back
        self._opened: set[int] = set()  # segments opened for reading at least once

    def handed(self, batch: int, segment: int, end: int) -> None:
        """``batch``, handed to the writer, ends at ``end`` in ``segment``: what waits to
        page out once written waits for it."""
        if self._to_page or self._pending_runs:
            self._batch_ends.append((batch, segment, end))

    def synced(self, batch: int) -> None:
        """Batches up to ``batch`` are on disk: what waited for them pages out."""
        ends = self._batch_ends
        if ends and ends[0][0] <= batch:
            while ends and ends[0][0] <= batch:
                _, segment, end = ends.popleft()
            self._written = (segment, end)
            self._page_out_written()

    def page_later(self, msg: Message) -> None:
        """``msg`` came to a queue over its memory limit: drop its body once it is on disk."""
        self._to_page.append(msg)

    def _page_out_written(self) -> None:
        """Page out the waiting messages whose publish record is now written (and synced)."""
        todo = self._to_page
        written_segment, written_end = self._written
        if self._pending_runs:
            for run in list(self._pending_runs):
                self._pack_written(run, written_segment, written_end)
        limit = self.page_limit
        if limit is None:
            todo.clear()
            return
        while todo:
            msg = todo[0]
            segment = msg.store_segment
            if (
                msg.store_offset == UNWRITTEN
                or segment > written_segment
                or (segment == written_segment and msg.store_offset >= written_end)
            ):
                return
            todo.popleft()
            queue = msg.queue
            # still waiting in its queue, in memory, and the queue still over its limit?
            if (
                msg.state == READY and msg.store_id and msg.paged_size < 0
                and queue is not None and queue.ready_bytes - queue.paged_bytes > limit
            ):  # fmt: skip
                queue.paged_bytes += page_out(msg)
                queue.paged_count += 1

    def page_run_later(self, run: PagedRun) -> None:
        """``run`` has pending messages: pack them as their records are written."""
        self.runs.add(run)
        self._pending_runs[run] = None

    def _pack_written(self, run: PagedRun, written_segment: int, written_end: int) -> None:
        pending = run.pending
        queue = run.queue
        messages = self.store.messages
        while pending:
            msg = pending[0]
            segment, offset = msg.store_segment, msg.store_offset
            if (
                offset == UNWRITTEN
                or segment > written_segment
                or (segment == written_segment and offset >= written_end)
            ):
                return
            pending.popleft()
            if not msg.store_id:
                continue  # withdrawn before its record was written (Queue.expire, withdrawn)
            body = msg.body
            header = records.publish_header_size(
                len(msg.exchange.encode("utf-8", "surrogateescape")),
                len(msg.routing_key.encode("utf-8", "surrogateescape")),
                len(msg.properties),
            )
            run.add(
                msg.store_id, segment, offset - header, header + len(body), len(body),
                msg.redelivered,
            )  # fmt: skip
            del messages[msg.store_id]
            queue.paged_count += 1
            queue.paged_bytes += len(body)
        del self._pending_runs[run]

    def materialise(self, run: PagedRun, ready: deque[Message]) -> None:
        """Read the next packed messages of ``run`` back into Message objects at the end of
        ``ready``: a batch of records next to each other in one segment is one read."""
        budget = min(READ_AHEAD, max((self.page_limit or 0) // 4, READ_AHEAD_MIN))
        ids, segments, starts, lengths, sizes = (
            run.ids, run.segments, run.starts, run.lengths, run.sizes
        )  # fmt: skip
        first = run.head
        stop = first
        end_all = len(ids)
        while stop < end_all and budget > 0 and stop - first < READ_AHEAD_COUNT:
            budget -= lengths[stop]
            stop += 1
        moved = self.store.compactor.moved
        names: dict[bytes, str] = {}
        queue = run.queue
        messages = self.store.messages
        flags = run.flags
        last_properties = b""
        taken = 0
        i = first
        while i < stop:
            # one read spans the records after this one in the same segment, small gaps included
            segment, begin = moved.get(ids[i]) or (segments[i], starts[i])
            end = begin + lengths[i]
            j = i + 1
            while j < stop and ids[j] not in moved and segments[j] == segment:
                at = starts[j]
                if at < begin or at > end + READ_GAP:
                    break
                end = max(end, at + lengths[j])
                j += 1
            data = self.read_body(segment, begin, end - begin)
            for k in range(i, j):
                at = starts[k] - begin if k > i else 0
                record = records.decode_record(data, at, lengths[k], names)
                properties = record.properties
                if properties == last_properties:
                    properties = last_properties
                last_properties = properties
                body = record.body
                assert body is not None
                msg = Message(record.exchange, record.routing_key, properties, body)
                msg.store_id = record.msg_id
                msg.store_segment = segments[k]
                msg.store_offset = starts[k] + lengths[k] - sizes[k]
                msg.trace_id = record.trace_id
                msg.seq = run.first_seq + k
                msg.queue = queue
                msg.redelivered = bool(flags[k] & REDELIVERED)
                msg.delivery_count = record.delivery_count
                msg.retries = record.retries
                messages[msg.store_id] = msg
                ready.append(msg)
                taken += sizes[k]
            if _FADVISE:
                os.posix_fadvise(self._reader(segment), end, 2 * READ_AHEAD, os.POSIX_FADV_WILLNEED)
            i = j
        run.head = stop
        run.bytes -= taken
        self.io.msg_store_reads += stop - first  # msg_store_read_total, as read_ahead counts
        queue.stats.disk_reads += stop - first
        queue.paged_count -= stop - first
        queue.paged_bytes -= taken
        run.drop_packed()

    def drop_run(self, run: PagedRun, deleted: bool, budget: int) -> int:
        """At most ``budget`` packed messages of ``run``, oldest first, leave the store
        (purge; ``deleted``: with their queue, no record needed); returns how many. Once the
        last has gone the store forgets the run (``run.dead``). Pending ones are the
        queue's to drop, as Messages. Until then the run stays a run whose packed entries
        start at ``run.head``, for compaction to move as any other."""
        store = self.store
        live = store._live
        ids, segments, sizes = run.ids, run.segments, run.sizes
        head = run.head
        stop = min(len(ids), head + budget)
        size = 0
        for i in range(head, stop):
            if not deleted:
                store._append(records.encode_remove(ids[i]))
            live[segments[i]] -= 1
            size += sizes[i]
        count = stop - head
        queue = run.queue
        queue.paged_count -= count
        queue.paged_bytes -= size
        queue.stats.persistent -= count  # queue_messages_persistent{,_bytes}
        queue.stats.persistent_bytes -= size
        run.head, run.bytes = stop, run.bytes - size
        if stop == len(ids):
            run.dead = True
            self.runs.discard(run)
            self._pending_runs.pop(run, None)
            run.drop_packed()
        if live:
            store.compactor.collect()
        return count

    def run_done(self, run: PagedRun) -> None:
        """Every message of ``run`` is back in its queue as a Message."""
        run.dead = True
        self.runs.discard(run)
        self._pending_runs.pop(run, None)

    def _reader(self, segment: int) -> int:
        fd = self._readers.get(segment)
        if fd is None:
            if len(self._readers) >= MAX_READERS:
                for other in list(self._readers)[: MAX_READERS // 2]:
                    os.close(self._readers.pop(other))
            path = os.path.join(self.store.directory, segment_name(segment))
            fd = self._readers[segment] = os.open(path, os.O_RDONLY)
            if segment in self._opened:
                self.io.reopen_ops += 1  # closed for the MAX_READERS bound, needed again
            self._opened.add(segment)
        return fd

    def read_body(self, segment: int, offset: int, size: int) -> bytes:
        io = self.io
        started = time.perf_counter()
        data = os.pread(self._reader(segment), size, offset)
        io.read_time += time.perf_counter() - started
        io.read_ops += 1
        io.read_bytes += len(data)
        if len(data) != size:
            raise OSError(f"message store: segment {segment} is shorter than a paged-out body")
        return data

    def page_in(self, msg: Message) -> bytes:
        """Read one paged-out body back (Message.body)."""
        body = self.read_body(msg.store_segment, msg.store_offset, msg.body_size())
        self.io.msg_store_reads += 1
        if msg.queue is not None:
            msg.queue.stats.disk_reads += 1
        unpage(msg, body)
        return body

    def read_ahead(self, ready: Iterable[Message]) -> None:
        """The head of a queue is paged out: read back the next paged bodies, a batch at once.

        Bodies next to each other in one segment (a queue's messages mostly are)
        come back with one read, so draining a long paged queue is sequential I/O
        in large reads; the budget bounds the memory and the time on the loop.
        """
        batch: list[Message] = []
        # a quarter of a small limit, but never one read per message
        budget = min(READ_AHEAD, max((self.page_limit or 0) // 4, READ_AHEAD_MIN))
        for msg in ready:
            if msg.paged_size >= 0 and msg.state == READY:
                batch.append(msg)
                budget -= msg.body_size()
                if budget <= 0 or len(batch) >= READ_AHEAD_COUNT:
                    break
        batch.sort(key=_location)
        start = 0
        while start < len(batch):
            first = batch[start]
            segment, begin = first.store_segment, first.store_offset
            end = begin + first.body_size()
            stop = start + 1
            while stop < len(batch):
                nxt = batch[stop]
                if nxt.store_segment != segment or nxt.store_offset > end + READ_GAP:
                    break
                end = max(end, nxt.store_offset + nxt.body_size())
                stop += 1
            data = self.read_body(segment, begin, end - begin)
            if _FADVISE:
                # a queue's next bodies mostly follow these: have the kernel read them in the
                # background, so the next batch is a page-cache copy, not a wait for the disk
                os.posix_fadvise(self._reader(segment), end, 2 * READ_AHEAD, os.POSIX_FADV_WILLNEED)
            self.io.msg_store_reads += stop - start
            for msg in batch[start:stop]:
                at = msg.store_offset - begin
                if msg.queue is not None:
                    msg.queue.stats.disk_reads += 1
                unpage(msg, data[at : at + msg.body_size()])
            start = stop

    def read_record(
        self, segment: int, start: int, length: int, names: dict[bytes, str] | None = None
    ) -> records.PublishRecord:
        """The whole publish record of ``length`` bytes at ``start`` in ``segment``."""
        record = records.decode_record(
            self.read_body(segment, start, length), 0, length, {} if names is None else names
        )
        record.segment, record.record_start = segment, start
        record.body_offset += start
        return record

    def read_packed(self, run: PagedRun, k: int) -> records.PublishRecord:
        """The publish record of ``run``'s packed entry ``k`` (compaction may have moved it),
        read without taking it out of the run: browsing a queue changes nothing."""
        moved = self.store.compactor.moved
        segment, start = moved.get(run.ids[k]) or (run.segments[k], run.starts[k])
        return self.read_record(segment, start, run.lengths[k])

    def drop_segment(self, segment: int) -> None:
        """``segment`` is deleted: its file is read no more."""
        self._opened.discard(segment)
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()


def _location(msg: Message) -> tuple[int, int]:
    return msg.store_segment, msg.store_offset
