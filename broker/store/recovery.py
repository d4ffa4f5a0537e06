"""The message log: append-only segment files, a writer thread, group commit.

The event loop only builds records and hands whole batches to the writer
thread, which writes them, fsyncs once per batch, and calls back on the loop
with the batch number. Publisher confirms of persistent messages wait for that
callback, so a confirm means "on disk", while many messages share one fsync.
A round of stream chunks alone (broker/streams/stream.py) is reported once written, as
RabbitMQ's streams confirm, and fdatasynced by a second thread meanwhile.

Segments are deleted oldest first, when nothing in them is live any more; a
mostly dead oldest segment is compacted by rewriting its live messages at the
head of the log. Deleting only from the old end keeps recovery simple: a
REMOVE record can only ever refer to a message in its own or an older segment.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from warren.broker.engine.message import READY, UNACKED, Message, page_out, unpage
from warren.broker.engine.stats import IOStats
from warren.broker.store import records
from warren.broker.store.paged import MESSAGE_MEMORY, REDELIVERED, PagedRun
from warren.broker.store.recovery_index import DECODED, Block, RecoveryIndex
from warren.broker.store.recovery_index import DELIVERED as DELIVERED_FLAG
from warren.broker.store.recovery_index import STATE as STATE_FLAG
from warren.broker.store.writer import Writer, segment_name

if TYPE_CHECKING:
    from warren.broker.engine.exchange_plugins import DelayedMessageExchange
    from warren.broker.engine.vhost import VirtualHost

SEGMENT_SIZE = 16 * 1024 * 1024
COMPACT_BELOW = 0.5  # live share under which the oldest segment is rewritten
PAGE_LIMIT = 64 * 1024 * 1024  # queue_body_memory_limit: memory a queue keeps its ready messages in
READ_AHEAD = 512 * 1024  # body bytes read back at once when the head of a queue is paged out
READ_AHEAD_MIN = 64 * 1024
READ_AHEAD_COUNT = 1024
READ_GAP = 64 * 1024  # other records between two bodies that one read still spans
_FADVISE = hasattr(os, "posix_fadvise")
MAX_READERS = 32  # segment files held open for reading bodies back
UNWRITTEN = 1 << 60  # store_offset of a message whose publish record is not written yet
# a delivered message whose confirm waits is written after GRACE more handoffs if its ack
# has not come by then; a handoff comes at most once per writer round (an fsync), at the end
# of a loop turn while the writer is idle, or KEEP_BACK seconds after the last one when
# nothing else waits to be written
GRACE = 4
KEEP_BACK = 0.0005


# a message read back at start-up, for its queue to take in again
StoredMessage = records.PublishRecord


class Damage:
    """What recovery found damaged: stretches of a segment that hold no intact record.

    A stretch that starts with a readable PUBLISH header names the message it held (its
    CRC failed); it counts as lost for its queue unless a later record removes it or a
    compacted copy of it is intact. Other stretches are counted apart (their queue
    cannot be known). The log says which, per queue, once recovery is done."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.ids: dict[int, int] = {}  # msg id -> queue id of the damaged publish records
        self.unknown = 0  # damaged stretches that name no message
        self.tail: int | None = None  # where a damaged tail of the current segment starts

    def found(self, data: bytes, start: int, end: int, path: str) -> None:
        named = records.damaged_publish(data, start, end)
        if named is not None:
            self.ids[named[0]] = named[1]
        else:
            self.unknown += 1
        if end == len(data):
            self.tail = start  # cut off: the log is appended to after it no more
        self.log.warning(
            "message store: damaged records skipped" if end < len(data)
            else "message store: dropped a torn or corrupt tail",
            segment=path, offset=start, dropped_bytes=end - start,
            message_id=named[0] if named else None,
        )  # fmt: skip

    def by_queue(self) -> dict[int, int]:
        """Queue id -> messages lost to damaged records (0: records that name none)."""
        lost: dict[int, int] = {}
        for queue_id in self.ids.values():
            lost[queue_id] = lost.get(queue_id, 0) + 1
        if self.unknown:
            lost[0] = self.unknown
        return lost


class MessageStore:
    def __init__(
        self, directory: str, log: Any, *, segment_size: int = SEGMENT_SIZE, sync: bool = True
    ) -> None:
        self.directory = directory
        self.log = log
        self.segment_size = segment_size
        self.sync = sync
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._next_id = 1
        self.published = 0  # PUBLISH records appended: tells a channel its confirm must wait
        self.messages: dict[int, Message] = {}  # live persistent messages by id
        self.io = IOStats()  # Prometheus' io_* and msg_store_* (broker/ops/metrics.py)
        self.first_id = 1  # the first id this run gives: msg_store_write_total counts from it
        self._live: dict[int, int] = {}  # segment -> live messages published in it
        self._total: dict[int, int] = {}  # segment -> messages published in it
        self._segment = 1
        self._segment_bytes = 0
        self._buffer: list[bytes] = []
        self._handoff_scheduled = False
        self.open_batch = 0  # the batch that records appended now will belong to
        self.synced_batch = -1
        self.waiters: set[Any] = set()  # channels with confirms waiting for a batch
        self._writer: Writer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._compacting: dict[int, int] = {}  # segment being compacted -> batch of its copies
        # purged queues whose messages the reaper is still letting go of (broker/engine/reaper.py):
        # no compaction meanwhile, or it would copy records that are about to die
        self.reaping = 0
        self._after_sync: deque[tuple[int, Callable[[bool], None]]] = deque()  # (batch, callback)
        # paging bodies out: messages waiting for their record to be written, in log order
        self.page_limit: int | None = PAGE_LIMIT  # None: bodies always stay in memory
        self._to_page: deque[Message] = deque()
        # messages a delayed exchange holds (no queue yet): their holder, by msg id, for
        # compaction to copy their record with the exchange's id
        self.holders: dict[int, DelayedMessageExchange] = {}
        # packed paged-out messages (broker/store/paged.py): every live run, and those with messages
        # waiting for their record to be written
        self.runs: set[PagedRun] = set()
        self._pending_runs: dict[PagedRun, None] = {}
        # packed messages whose record compaction copied: where to read them until the copy
        # is written (by msg id), and which ids each compacted segment moved
        self._moved: dict[int, tuple[int, int]] = {}
        self._moved_from: dict[int, list[int]] = {}
        self._batch_ends: deque[tuple[int, int, int]] = deque()  # (batch, segment, end offset)
        self._written = (0, 0)  # (segment, offset) up to which the log is on disk
        self._readers: dict[int, int] = {}  # segment -> file descriptor to read bodies back
        self._opened: set[int] = set()  # segments opened for reading at least once
        # other logs (streams, broker/streams/stream.py) writing through this writer and its batches
        self._external: list[Any] = []  # with data for the open batch
        # (batch, the logs with a chunk in it), oldest first: told when their batch is written
        self._external_batches: deque[tuple[int, list[Any]]] = deque()
        # the writer thread's failure: nothing is written any more, confirms are nacked
        self.error: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None  # the broker's alarm
        self.on_recovery: Callable[[], None] | None = None  # ... cleared: writing again
        self.lost: dict[int, int] = {}  # recovery: queue id -> messages lost to damage
        # compaction starts only with room for its copies (_room_to_compact): the broker's
        # disk alarm and disk_free_limit
        self.low_on_disk: Callable[[], bool] | None = None
        self.disk_free_limit = 0
        self._compact_refused_until = 0.0
        self._compact_refused = False
        # the writer retries a round that failed with an OSError (a full disk, no descriptor
        # left): meanwhile ``error`` is that error, and it is None again once it writes
        self.stalled = False
        # Messages published since the last handoff, by id: [msg, queue id, expires (wall),
        # publishing channel or None, its confirm's seq, handoffs left to wait]. Their
        # records are encoded at the handoff, so one removed before it (acked, expired,
        # purged) never reaches the disk, and its confirm needs no write: RabbitMQ's
        # msg_store skips a write whose remove came first and confirms the message
        # (rabbit_msg_store, "flying" writes; rabbit_variable_queue:msgs_written_to_disk/3
        # with `ignored`, remove_vhost_msgs_by_id/2).
        self._fresh: dict[int, list[Any]] = {}
        self.confirm_owner: Any = None  # the channel routing a publish it must confirm
        self.confirm_seq = 0  # ... and that publish's seq
        self.fresh_owned = 0  # fresh messages published with an owner (so many confirms)
        self.fresh_elided = 0  # ... removed while their publish was still being routed
        self.never_written = 0  # messages gone before their record was written
        self._owners: list[tuple[Any, int]] = []  # (channel, seq) of the open batch's publishes
        self._settle: deque[tuple[int, list[tuple[Any, int]]]] = deque()  # (batch, owners)
        self._handed = -1  # the last batch handed to the writer: none while it writes one
        self._flush_all = False  # the next handoff keeps nothing back (tx.commit)
        self._new_fresh = False  # messages published since the last handoff

    @property
    def all_handed(self) -> bool:
        """Everything appended is with the writer, but the records kept back for an ack."""
        return not (self._buffer or self._external or self._new_fresh)

    @property
    def messages_written(self) -> int:
        """Publish records this run wrote (msg_store_write_total): one id each."""
        return self._next_id - self.first_id - self.never_written

    # ---- start-up ----

    def recover(self, packs: Callable[[int], bool] | None = None) -> Iterator[StoredMessage]:
        """Read every segment, oldest first; a torn or corrupt tail is cut off with a warning.
        Returns the live messages in publish order, as the queues take them back.

        Bodies are kept in memory up to ``page_limit`` a queue (counting each message's
        overhead, as a running queue does; the oldest first: the head of the queue); past
        it only their place in the file is. Of a queue that ``packs`` (its store id) and
        of a queue gone, a plain message past the limit is read no further than its place
        (its record has ``decoded`` False): the index holds 33 bytes for it, no object.
        """
        segments = sorted(
            int(name[:-4]) for name in os.listdir(self.directory)
            if name.endswith(".seg") and name[:-4].isdigit()
        )  # fmt: skip
        index = RecoveryIndex()
        decoded: dict[int, records.PublishRecord] = {}
        states: dict[int, tuple[int, int, float]] = {}  # of packed ones: read again at the end
        packing: dict[int, bool] = {}  # queue id -> packs
        kept: dict[int, int] = {}  # queue id -> memory its in-memory messages take
        live = self._live
        limit = self.page_limit if self.page_limit is not None else 1 << 62
        publish, publish_v1 = records.PUBLISH, records.PUBLISH_V1
        remove, delivered, state = records.REMOVE, records.DELIVERED, records.STATE
        was_delivered = records.FLAG_DELIVERED
        decode_publish, decode_id, queue_of, place = (
            records.decode_publish, records.decode_id, records.queue_of, records.publish_place
        )  # fmt: skip
        names: dict[bytes, str] = {}
        damage = Damage(self.log)
        for segment in segments:
            path = os.path.join(self.directory, segment_name(segment))
            data = self._read_segment(path)
            end = 0
            last_properties = b""
            for end, kind, start in records.scan_records(data):
                if kind == records.DAMAGED:
                    damage.found(data, start, end, path)
                    continue
                if kind in (publish, publish_v1):
                    queue_id = queue_of(data, start)
                    msg_id = decode_id(data, start)
                    if damage.ids:
                        damage.ids.pop(msg_id, None)  # a copy compaction made is intact
                    if msg_id <= index.top and (old := index.find(msg_id)) is not None:
                        self._forget_recovered(index, old, decoded, states, kept)
                    in_ram = kept.get(queue_id, 0)
                    record_start = start - records.HEADER_SIZE - 1
                    if in_ram >= limit:
                        packs_it = packing.get(queue_id)
                        if packs_it is None:
                            packs_it = packing[queue_id] = packs is not None and packs(queue_id)
                        if packs_it:
                            msg_id, plain, flags, body_at = place(data, start, end, kind)
                            if plain:
                                index.add(
                                    msg_id, queue_id, segment, record_start, end - record_start,
                                    end - body_at, DELIVERED_FLAG if flags & was_delivered else 0,
                                )  # fmt: skip
                                live[segment] = live.get(segment, 0) + 1
                                continue
                    record = decode_publish(data, start, end, kind, in_ram < limit, names)
                    if record.properties == last_properties:  # share runs of equal properties
                        record.properties = last_properties
                    last_properties = record.properties
                    record.segment = segment
                    record.body_offset = end - record.body_size
                    record.record_start = record_start
                    if record.body is not None:
                        kept[queue_id] = in_ram + record.body_size + MESSAGE_MEMORY
                    decoded[msg_id] = record
                    index.add(
                        msg_id, queue_id, segment, record_start, end - record_start,
                        record.body_size, DECODED,
                    )  # fmt: skip
                    live[segment] = live.get(segment, 0) + 1
                elif kind == remove:
                    found = index.find(decode_id(data, start))
                    if found is not None:
                        self._forget_recovered(index, found, decoded, states, kept)
                    elif damage.ids:
                        damage.ids.pop(decode_id(data, start), None)  # lost, but acked anyway
                elif kind == delivered:
                    found = index.find(decode_id(data, start))
                    if found is not None:
                        block, i = found
                        block.flags[i] |= DELIVERED_FLAG
                        if block.flags[i] & DECODED:
                            decoded[block.ids[i]].delivered = True
                elif kind == state:
                    msg_id, count, retries, retry_at = records.decode_state(data, start)
                    found = index.find(msg_id)
                    if found is not None:
                        block, i = found
                        if block.flags[i] & DECODED:
                            rec = decoded[msg_id]
                            rec.delivery_count, rec.retries, rec.retry_at_wall = (
                                count, retries, retry_at
                            )  # fmt: skip
                        else:
                            block.flags[i] |= STATE_FLAG
                            states[msg_id] = (count, retries, retry_at)
            if damage.tail is not None:
                with open(path, "r+b") as fh:
                    fh.truncate(damage.tail)
                damage.tail = None
        for segment in [segment for segment, count in live.items() if count <= 0]:
            del live[segment]
        self._total.update(live)
        top = index.max_live()
        if top:
            self._next_id = self.first_id = top + 1
        self._segment = (segments[-1] + 1) if segments else 1
        self.lost = damage.by_queue()
        return self._recovered(index, decoded, states)

    def recover_losses(self) -> dict[int, int]:
        """What recovery lost to damaged records: queue id -> messages (0: stretches that
        name no message, so no queue)."""
        return self.lost

    def _read_segment(self, path: str) -> bytes:
        """A segment's bytes at start-up; one written before records had a magic is
        rewritten in the framed format first (records.py)."""
        started = time.perf_counter()
        with open(path, "rb") as fh:
            data = fh.read()
        self.io.read_ops += 1
        self.io.read_bytes += len(data)
        self.io.read_time += time.perf_counter() - started
        if records.is_legacy(data):
            data = self._migrate_legacy(path, data)
        return data

    def _migrate_legacy(self, path: str, data: bytes) -> bytes:
        """Rewrite a legacy segment record by record, each with the magic and the new CRC:
        into a new file, synced, then renamed over the old one, so a crash meanwhile leaves
        the old file whole (and the next start does it again). Offsets change, but nothing
        points into the log before recovery."""
        view = memoryview(data)
        parts = []
        end = 0
        for end, start, _ in records.legacy_records(data):
            parts.append(records.frame_body(view[start:end]))
        if end < len(data):
            self.log.warning(
                "message store: dropped a torn or corrupt tail",
                segment=path, kept_bytes=end, dropped_bytes=len(data) - end,
            )  # fmt: skip
        new = b"".join(parts)
        temporary = path + ".migrating"
        with open(temporary, "wb") as fh:
            fh.write(new)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.log.info("message store: segment rewritten with framed records", segment=path,
                      records=len(parts))  # fmt: skip
        return new

    def _forget_recovered(
        self,
        index: RecoveryIndex,
        entry: tuple[Block, int],
        decoded: dict[int, records.PublishRecord],
        states: dict[int, tuple[int, int, float]],
        kept: dict[int, int],
    ) -> None:
        """A message read at start-up is removed (or a compacted copy replaces it)."""
        block, i = entry
        msg_id = block.ids[i]
        flags = block.flags[i]
        if flags & DECODED:
            old = decoded.pop(msg_id)
            if old.body is not None:
                kept[old.queue_id] -= old.body_size + MESSAGE_MEMORY
        elif flags & STATE_FLAG:
            del states[msg_id]
        self._live[block.segments[i]] -= 1
        index.drop(block, i)

    def _recovered(
        self,
        index: RecoveryIndex,
        decoded: dict[int, records.PublishRecord],
        states: dict[int, tuple[int, int, float]],
    ) -> Iterator[StoredMessage]:
        names: dict[bytes, str] = {}
        for block, i in index.entries():
            msg_id, flags = block.ids[i], block.flags[i]
            if flags & DECODED:
                yield decoded.pop(msg_id)
                continue
            segment, start, length, size = (
                block.segments[i], block.starts[i], block.lengths[i], block.sizes[i]
            )  # fmt: skip
            if flags & STATE_FLAG:  # no longer plain: the queue needs all of it
                record = self.read_record(segment, start, length, names)
                record.body = None
                record.delivery_count, record.retries, record.retry_at_wall = states.pop(msg_id)
                record.delivered = bool(flags & DELIVERED_FLAG)
                yield record
                continue
            yield records.PublishRecord(
                msg_id, block.queues[i], 0.0, 0, 0, 0.0, bool(flags & DELIVERED_FLAG), "", "",
                b"", None, size, start + length - size, 0, segment, start, False,
            )  # fmt: skip

    def read_record(
        self, segment: int, start: int, length: int, names: dict[bytes, str] | None = None
    ) -> StoredMessage:
        """The whole publish record of ``length`` bytes at ``start`` in ``segment``."""
        record = records.decode_record(
            self.read_body(segment, start, length), 0, length, {} if names is None else names
        )
        record.segment, record.record_start = segment, start
        record.body_offset += start
        return record

    def adopt(self, msgs: list[Message]) -> None:
        """Recovered messages are live again in their queue (which set their place in the log)."""
        self.messages.update({msg.store_id: msg for msg in msgs})

    def finish_recovery(self, orphans: dict[int, int]) -> None:
        """Messages whose queue is gone (so many a segment) are dropped from the counts (their
        files age out)."""
        for segment, count in orphans.items():
            self._live[segment] -= count

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._writer = Writer(
            self.directory, loop, self._on_synced, self.sync, self._writer_failed,
            self._writer_stalled,
        )  # fmt: skip
        self._writer.io = self.io
        self._writer.start()
        self._collect_garbage()  # what recovery found dead goes now that the writer runs

    # ---- the message path ----

    def _append(self, record: bytes) -> None:
        """Buffer a record for the open batch."""
        self._buffer.append(record)
        self._segment_bytes += len(record)
        if not self._handoff_scheduled:
            self._schedule()

    def _schedule(self) -> None:
        """Hand the open batch over at the end of this loop turn, or, while the writer
        writes one, once it is done (_on_synced): one wake-up of the writer per round,
        and the longer a record waits, the likelier its message is gone before it."""
        if not self._handoff_scheduled and self._handed <= self.synced_batch:
            self._handoff_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._handoff)

    def _emit(self, entry: list[Any]) -> None:
        """A fresh message's publish record joins the open batch."""
        msg: Message = entry[0]
        self._append_publish(entry[1], msg, entry[2], msg.redelivered or msg.state != READY)
        if entry[3] is not None:
            self._owners.append((entry[3], entry[4]))

    def _emit_fresh(self) -> bool:
        """Encode the fresh messages' records; one delivered with a confirm waiting for it is
        kept back GRACE handoffs (its ack will likely make the write needless), and those
        after it with it. True if one was kept back."""
        fresh = self._fresh
        if self._flush_all or self._writer is None:
            self._flush_all = False
            self._fresh = {}
            for entry in fresh.values():
                self._emit(entry)
            return False
        kept: dict[int, list[Any]] = {}
        for msg_id, entry in fresh.items():
            if entry[3] is None:
                self._emit(entry)
                continue
            if entry[5] and entry[0].state == UNACKED:
                entry[5] -= 1
                kept[msg_id] = entry
            elif kept:
                # the ones after a kept one wait too: ids then reach the log in ascending
                # order, which keeps recovery's index (RecoveryIndex) a few large blocks
                kept[msg_id] = entry
            else:
                self._emit(entry)
        self._fresh = kept
        return bool(kept)

    def _handoff(self) -> None:
        self._handoff_scheduled = False
        writer = self._writer
        if writer is None:
            return  # records made after close() are lost, as in a crash at that moment
        kept = False
        if self._fresh and writer.error is None:
            self._new_fresh = False
            kept = self._emit_fresh()
            if kept and not self._buffer and not self._external:
                # nothing to write now: look again shortly (the writer is idle)
                self._handoff_scheduled = True
                assert self._loop is not None
                self._loop.call_later(KEEP_BACK, self._handoff)
                return
        if not self._buffer and not self._external:
            return
        if writer.error is not None:
            # nothing is written any more; _writer_failed told those who wait
            self._buffer.clear()
            self._owners.clear()
            for log in self._external:
                log.take_chunk(self.open_batch)  # lost, as in a crash at this moment
            self._external.clear()
            return
        external = None
        self._handed = self.open_batch
        if self._owners:
            self._settle.append((self.open_batch, self._owners))
            self._owners = []
        if self._external:
            external = [log.take_chunk(self.open_batch) for log in self._external]
            self._external_batches.append((self.open_batch, self._external))
            self._external = []
            if not self._buffer:
                writer.jobs.put(("external", 0, external, self.open_batch))
                self.open_batch += 1
                return
        data = b"".join(self._buffer)
        self._buffer.clear()
        if external is None:
            writer.jobs.put(("write", self._segment, data, self.open_batch))
        else:  # one job: the writer never reports the batch with half of it written
            writer.jobs.put(("external", self._segment, (data, external), self.open_batch))
        if self._to_page or self._pending_runs:
            self._batch_ends.append((self.open_batch, self._segment, self._segment_bytes))
        self.open_batch += 1
        if self._segment_bytes >= self.segment_size:
            # roll only between batches, so a batch (and a confirm) never spans two files
            self._segment += 1
            self._segment_bytes = 0
            self._collect_garbage()

    def publish(self, queue_id: int, msg: Message, expires_wall: float) -> None:
        """Store ``msg``: its record is written with the open batch (see _fresh)."""
        msg_id = self._next_id
        self._next_id += 1
        self.published += 1
        msg.store_id = msg_id
        msg.store_segment = 0  # none yet: never a segment's to compact
        msg.store_offset = UNWRITTEN
        self.messages[msg_id] = msg
        self._new_fresh = True
        owner = self.confirm_owner
        if owner is not None:
            self.fresh_owned += 1
            self._fresh[msg_id] = [msg, queue_id, expires_wall, owner, self.confirm_seq, GRACE]
        else:
            self._fresh[msg_id] = [msg, queue_id, expires_wall, None, 0, 0]
        self._schedule()

    def _append_publish(
        self, queue_id: int, msg: Message, expires_wall: float, delivered: bool
    ) -> None:
        body = msg.body  # first: a paged-out body is read from where the message still is
        segment = msg.store_segment = self._segment
        self._live[segment] = self._live.get(segment, 0) + 1
        self._total[segment] = self._total.get(segment, 0) + 1
        record = records.encode_publish(
            msg.store_id, queue_id, expires_wall, msg.delivery_count, msg.retries, 0.0,
            delivered, msg.exchange.encode("utf-8", "surrogateescape"),
            msg.routing_key.encode("utf-8", "surrogateescape"), msg.properties, body,
            msg.trace_id,
        )  # fmt: skip
        self._append(record)
        msg.store_offset = self._segment_bytes - len(body)  # the body ends the record

    def remove(self, msg: Message) -> None:
        msg_id = msg.store_id
        if not msg_id or self.messages.pop(msg_id, None) is None:
            return
        msg.store_id = 0
        if self.holders:
            self.holders.pop(msg_id, None)
        if self._fresh and self._elided(msg_id, msg):
            return
        self._append(records.encode_remove(msg_id))
        segment = msg.store_segment
        live = self._live[segment] = self._live[segment] - 1
        if live < self._total[segment] * COMPACT_BELOW and segment == min(self._live):
            self._collect_garbage()

    def _elided(self, msg_id: int, msg: Message) -> bool:
        """``msg`` leaves before its record was written: it never will be, and its confirm
        (if one waits) needs no write."""
        entry = self._fresh.pop(msg_id, None)
        if entry is None:
            return False
        msg.store_offset = 0
        self.never_written += 1
        owner = entry[3]
        if owner is not None:
            if owner is self.confirm_owner and entry[4] == self.confirm_seq:
                self.fresh_elided += 1  # the channel still routes it: it counts these
            else:
                owner.store_settled(entry[4])
        return True

    def forget(self, msg: Message) -> None:
        """The message's queue is gone: no record needed, it no longer counts as live."""
        msg_id = msg.store_id
        if msg_id and self.messages.pop(msg_id, None) is not None:
            msg.store_id = 0
            if self.holders:
                self.holders.pop(msg_id, None)
            if not (self._fresh and self._elided(msg_id, msg)):
                self._live[msg.store_segment] -= 1

    def hold(self, msg: Message, holder: DelayedMessageExchange) -> None:
        """``msg`` (stored) waits in ``holder``, a delayed exchange, instead of a queue."""
        self.holders[msg.store_id] = holder

    def delivered(self, msg: Message) -> None:
        msg_id = msg.store_id
        if msg_id and msg_id not in self._fresh:  # a fresh one's record will say so
            self._append(records.encode_delivered(msg_id))

    def state(self, msg: Message, retry_at_wall: float) -> None:
        if msg.store_id:
            entry = self._fresh.pop(msg.store_id, None)
            if entry is not None:  # its publish record goes first
                self._emit(entry)
            self._append(
                records.encode_state(msg.store_id, msg.delivery_count, msg.retries, retry_at_wall)
            )

    def external_pending(self, log: Any) -> None:
        """``log`` has data for the open batch: ``log.take_chunk(batch)`` joins it."""
        self._external.append(log)
        self._schedule()

    def remove_tree(self, path: str, handle: Any = None) -> None:
        """Delete a directory once everything queued for the writer before is written;
        ``handle``, a file of it the writer appends to, is closed first, by the writer."""
        if self._writer is not None:
            if handle is not None:
                self._writer.jobs.put(("external", 0, [(handle, b"", True)], -1))
            self._writer.jobs.put(("rmtree", 0, path, -1))
        else:
            if handle is not None:
                handle.close()
            shutil.rmtree(path, ignore_errors=True)

    # ---- group commit ----

    def after_sync(self, callback: Callable[[bool], None]) -> None:
        """Call back once what has been appended so far is on disk (tx.commit-ok), with
        True; with False if it never will be (the writer failed).

        Callbacks run in the order they were registered.
        """
        if self.error is not None:
            callback(False)
            return
        if self._fresh:
            self._flush_all = True  # kept back for an ack no longer: the commit waits for it
            self._schedule()
        batch = (
            self.open_batch if self._buffer or self._external or self._fresh
            else self.open_batch - 1
        )  # fmt: skip
        if batch <= self.synced_batch and not self._after_sync:
            callback(True)
        else:
            self._after_sync.append((batch, callback))

    @property
    def commits_waiting(self) -> bool:
        return bool(self._after_sync)

    def _on_synced(self, batch: int) -> None:
        self.synced_batch = batch
        if (
            (self._buffer or self._fresh or self._external)
            and not self._handoff_scheduled and self._handed <= batch
        ):  # fmt: skip
            self._handoff()  # what came while the writer wrote: its next round
        settle = self._settle
        if settle and settle[0][0] <= batch:
            # each channel told once, so its acks for the batch go out as one frame
            seqs: dict[Any, list[int]] = {}
            while settle and settle[0][0] <= batch:
                for owner, seq in settle.popleft()[1]:
                    if owner in seqs:
                        seqs[owner].append(seq)
                    else:
                        seqs[owner] = [seq]
            for owner, settled in seqs.items():
                owner.store_settled_all(settled)
        external = self._external_batches
        while external and external[0][0] <= batch:
            for log in external.popleft()[1]:
                log.synced(batch)
        if self.waiters:
            for channel in list(self.waiters):
                channel.store_synced(batch)
        after = self._after_sync
        while after and after[0][0] <= batch:
            after.popleft()[1](True)
        ends = self._batch_ends
        if ends and ends[0][0] <= batch:
            while ends and ends[0][0] <= batch:
                _, segment, end = ends.popleft()
            self._written = (segment, end)
            self._page_out_written()
        if self._compacting:
            for segment, copied in list(self._compacting.items()):
                if copied <= batch:  # the copies are on disk: the old segment can go
                    del self._compacting[segment]
                    for msg_id in self._moved_from.pop(segment, ()):
                        self._moved.pop(msg_id, None)
                    self._drop_segment(segment)
            if not self._compacting:
                self._collect_garbage()  # the dead segments it held up go at once

    def _writer_failed(self, error: BaseException) -> None:
        """The writer thread died: what waits for the disk is told now, never later."""
        if self.error is not None:
            return
        self.error = error
        self.log.error(
            "message store writer failed: persistent messages are no longer written"
            + (" until it can write again" if self.stalled else ""),
            error=f"{error.__class__.__name__}: {error}",
            directory=self.directory,
        )
        waiters = list(self.waiters)
        self.waiters.clear()
        for channel in waiters:
            channel.store_failed()
        after, self._after_sync = self._after_sync, deque()
        for _, callback in after:
            callback(False)
        if self.on_failure is not None:
            self.on_failure(error)

    def _writer_stalled(self, error: OSError | None) -> None:
        """The writer failed to write a round and retries it (``error``), or wrote it
        (None). While it retries, publishes waiting for the disk are nacked, new ones too,
        and transactions fail, as when it dies; acks and every other record wait in order
        and are written once it can, so none is lost. The alarm clears by itself then."""
        if error is not None:
            if self.stalled or self.error is not None:
                return
            self.stalled = True
            self._writer_failed(error)
            return
        if not self.stalled:
            return
        self.stalled = False
        self.error = None
        self.log.warning("message store writes again", directory=self.directory)
        if self.on_recovery is not None:
            self.on_recovery()

    # ---- paging bodies out of memory ----

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
        messages = self.messages
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
        moved = self._moved
        names: dict[bytes, str] = {}
        queue = run.queue
        messages = self.messages
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
        live = self._live
        ids, segments, sizes = run.ids, run.segments, run.sizes
        head = run.head
        stop = min(len(ids), head + budget)
        size = 0
        for i in range(head, stop):
            if not deleted:
                self._append(records.encode_remove(ids[i]))
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
            self._collect_garbage()
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
            path = os.path.join(self.directory, segment_name(segment))
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

    # ---- garbage collection and compaction ----

    def _drop_segment(self, segment: int) -> None:
        self._live.pop(segment, None)
        self._opened.discard(segment)
        self._total.pop(segment, None)
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)
        assert self._writer is not None
        self._writer.jobs.put(("unlink", segment, b"", -1))

    def _collect_garbage(self) -> None:
        """Delete dead segments from the old end; compact the oldest if mostly dead, or if
        it holds up dead segments behind it."""
        while self._live:
            oldest = min(self._live)
            if oldest >= self._segment or oldest in self._compacting:
                return
            if self._live[oldest] <= 0:
                self._drop_segment(oldest)
                continue
            if self.reaping:
                return
            if (
                self._live[oldest] < self._total[oldest] * COMPACT_BELOW or self._blocked()
            ) and self._room_to_compact(oldest):
                self._compact(oldest)
            return

    def _room_to_compact(self, segment: int) -> bool:
        """Compaction writes up to a segment's worth of copies: it starts only if they can
        be written whole, so not while the writer retries a failed write, nor while the
        disk alarm is on, nor if the copies would leave less than ``disk_free_limit`` free.
        Refused, it is tried again at a later collection (at most once a second)."""
        now = time.monotonic()
        if now < self._compact_refused_until:
            return False
        reason = ""
        if self.stalled or self.error is not None:
            reason = "the writer cannot write"
        elif self.low_on_disk is not None and self.low_on_disk():
            reason = "the disk alarm is on"
        else:
            try:
                size = os.path.getsize(os.path.join(self.directory, segment_name(segment)))
                free = shutil.disk_usage(self.directory).free
            except OSError as exc:
                reason = f"free space unknown: {exc}"
            else:
                if free - size < self.disk_free_limit:
                    reason = f"{free} bytes free, the copies may take {size}"
        if not reason:
            self._compact_refused = False
            return True
        self._compact_refused_until = now + 1.0
        if not self._compact_refused:  # once a spell
            self._compact_refused = True
            self.log.warning("message store: compaction put off", segment=segment, reason=reason)
        return False

    def reaped(self) -> None:
        """The reaper has let go of one purged queue's messages: compaction may go on."""
        self.reaping -= 1
        if not self.reaping:
            self._collect_garbage()

    def _blocked(self) -> bool:
        """Dead segments wait behind a mostly live oldest one, and dead records outnumber
        live ones: rewriting the oldest (at most one segment of writes) lets them all go.

        Without this, a backlog that nobody consumes, sitting in the oldest segment, would
        keep every later segment on disk however dead (deletion works from the old end).
        """
        live = dead_segments = 0
        for segment, count in self._live.items():
            live += count
            if count <= 0 and segment != self._segment:
                dead_segments += 1
        return dead_segments >= 2 and sum(self._total.values()) - live > live

    def _compact(self, segment: int) -> None:
        """Rewrite the live messages of ``segment`` at the head of the log."""
        moved = [m for m in self.messages.values() if m.store_segment == segment]
        self._live[segment] = 0
        for msg in moved:
            queue_ = msg.queue
            vhost: VirtualHost | None = None
            if queue_ is not None:
                queue_id, vhost = queue_.store_id, queue_.vhost
            else:
                holder = self.holders.get(msg.store_id)
                queue_id, vhost = (holder.store_id, holder.vhost) if holder else (0, None)
            expires_wall = (
                vhost.timers.wall() + (msg.expires_at - vhost.timers.now())
                if msg.expires_at is not None and vhost is not None else 0.0
            )  # fmt: skip
            # a paged-out body comes back for the copy (at most half a segment's worth) and
            # leaves again once the copy is written: nothing points into the old file then
            paged = msg.paged_size >= 0
            self._append_publish(queue_id, msg, expires_wall, msg.redelivered)
            if paged:
                self.page_later(msg)
        packed = 0
        for run in self.runs:
            if run.min_segment <= segment <= run.max_segment:
                packed += self._compact_run(run, segment)
        self._compacting[segment] = self.open_batch
        self.log.info(
            "message store: compacting segment", segment=segment, moved=len(moved) + packed
        )

    def _compact_run(self, run: PagedRun, segment: int) -> int:
        """Copy the records of ``run``'s packed messages in ``segment`` to the head of the log;
        they are read from the old place until the copies are written."""
        ids, segments, starts, lengths = run.ids, run.segments, run.starts, run.lengths
        queue_id = run.queue.store_id
        names: dict[bytes, str] = {}
        moved = self._moved_from.setdefault(segment, [])
        count = 0
        for i in range(run.head, len(ids)):
            if segments[i] != segment:
                continue
            data = self.read_body(segment, starts[i], lengths[i])
            rec = records.decode_record(data, 0, lengths[i], names)
            assert rec.body is not None
            record = records.encode_publish(
                rec.msg_id, queue_id, rec.expires_wall, rec.delivery_count, rec.retries, 0.0,
                bool(run.flags[i] & REDELIVERED), rec.exchange.encode("utf-8", "surrogateescape"),
                rec.routing_key.encode("utf-8", "surrogateescape"), rec.properties, rec.body,
                rec.trace_id,
            )  # fmt: skip
            new = self._segment
            self._live[new] = self._live.get(new, 0) + 1
            self._total[new] = self._total.get(new, 0) + 1
            self._append(record)
            self._moved[rec.msg_id] = (segment, starts[i])
            moved.append(rec.msg_id)
            segments[i], starts[i] = new, self._segment_bytes - len(record)
            if new > run.max_segment:
                run.max_segment = new
            count += 1
        return count

    def close(self) -> None:
        """Flush what is buffered and stop the writer (clean shutdown)."""
        if self._writer is None:
            return
        self._flush_all = True
        self._handoff()
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        if self.stalled:
            self._writer.closing.set()  # a round it cannot write is given up, not waited for
        self._writer.jobs.put(("stop", 0, b"", -1))
        self._writer.join(10)
        self._writer = None


def _location(msg: Message) -> tuple[int, int]:
    return msg.store_segment, msg.store_offset
