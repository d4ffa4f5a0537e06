"""Compaction: segments deleted once dead, a mostly dead oldest one rewritten (RabbitMQ's
rabbit_msg_store_gc).

Segments are deleted oldest first, when nothing in them is live any more; a mostly dead
oldest segment, or one that holds up dead segments behind it, is compacted by rewriting
its live messages at the head of the log, and deleted once the copies are written.
Deleting only from the old end keeps recovery simple: a REMOVE record can only ever
refer to a message in its own or an older segment.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from warren.broker.store import records
from warren.broker.store.paged import REDELIVERED, PagedRun
from warren.broker.store.writer import segment_name

if TYPE_CHECKING:
    from warren.broker.store.segments import MessageStore

COMPACT_BELOW = 0.5  # live share under which the oldest segment is rewritten


class Compactor:
    """When the store's segments go, and the rewriting of the oldest one."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.log = store.log
        self._compacting: dict[int, int] = {}  # segment being compacted -> batch of its copies
        # purged queues whose messages the reaper is still letting go of (broker/engine/reaper.py):
        # no compaction meanwhile, or it would copy records that are about to die
        self.reaping = 0
        # packed messages whose record compaction copied: where to read them until the copy
        # is written (by msg id), and which ids each compacted segment moved
        self.moved: dict[int, tuple[int, int]] = {}
        self._moved_from: dict[int, list[int]] = {}
        # compaction starts only with room for its copies (_room_to_compact): the broker's
        # disk alarm and disk_free_limit
        self.low_on_disk: Callable[[], bool] | None = None
        self.disk_free_limit = 0
        self._compact_refused_until = 0.0
        self._compact_refused = False

    def synced(self, batch: int) -> None:
        """Batches up to ``batch`` are on disk: a compacted segment whose copies they hold
        goes, and the dead segments it held up with it."""
        if self._compacting:
            for segment, copied in list(self._compacting.items()):
                if copied <= batch:  # the copies are on disk: the old segment can go
                    del self._compacting[segment]
                    for msg_id in self._moved_from.pop(segment, ()):
                        self.moved.pop(msg_id, None)
                    self._drop_segment(segment)
            if not self._compacting:
                self.collect()  # the dead segments it held up go at once

    def _drop_segment(self, segment: int) -> None:
        store = self.store
        store._live.pop(segment, None)
        store._total.pop(segment, None)
        store.pager.drop_segment(segment)
        assert store._writer is not None
        store._writer.jobs.put(("unlink", segment, b"", -1))

    def collect(self) -> None:
        """Delete dead segments from the old end; compact the oldest if mostly dead, or if
        it holds up dead segments behind it."""
        store = self.store
        live = store._live
        while live:
            oldest = min(live)
            if oldest >= store._segment or oldest in self._compacting:
                return
            if live[oldest] <= 0:
                self._drop_segment(oldest)
                continue
            if self.reaping:
                return
            if (
                live[oldest] < store._total[oldest] * COMPACT_BELOW or self._blocked()
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
        store = self.store
        if store.stalled or store.error is not None:
            reason = "the writer cannot write"
        elif self.low_on_disk is not None and self.low_on_disk():
            reason = "the disk alarm is on"
        else:
            try:
                size = os.path.getsize(os.path.join(store.directory, segment_name(segment)))
                free = shutil.disk_usage(store.directory).free
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
            self.collect()

    def _blocked(self) -> bool:
        """Dead segments wait behind a mostly live oldest one, and dead records outnumber
        live ones: rewriting the oldest (at most one segment of writes) lets them all go.

        Without this, a backlog that nobody consumes, sitting in the oldest segment, would
        keep every later segment on disk however dead (deletion works from the old end).
        """
        store = self.store
        live = dead_segments = 0
        for segment, count in store._live.items():
            live += count
            if count <= 0 and segment != store._segment:
                dead_segments += 1
        return dead_segments >= 2 and sum(store._total.values()) - live > live

    def _compact(self, segment: int) -> None:
        """Rewrite the live messages of ``segment`` at the head of the log."""
        store = self.store
        moved = [m for m in store.messages.values() if m.store_segment == segment]
        store._live[segment] = 0
        clock = store.clock
        for msg in moved:
            queue_ = msg.queue
            held = True
            if queue_ is not None:
                queue_id = queue_.store_id
            else:  # held by a delayed exchange, or by nothing
                holder = store.holders.get(msg.store_id)
                queue_id, held = (holder, True) if holder is not None else (0, False)
            # broker time (the queues' and delayed exchanges' clock) as the wall clock
            expires_wall = (
                clock.wall() + (msg.expires_at - clock.now())
                if msg.expires_at is not None and held else 0.0
            )  # fmt: skip
            # a paged-out body comes back for the copy (at most half a segment's worth) and
            # leaves again once the copy is written: nothing points into the old file then
            paged = msg.paged_size >= 0
            store._append_publish(queue_id, msg, expires_wall, msg.redelivered)
            if paged:
                store.pager.page_later(msg)
        packed = 0
        for run in store.pager.runs:
            if run.min_segment <= segment <= run.max_segment:
                packed += self._compact_run(run, segment)
        self._compacting[segment] = store.open_batch
        self.log.info(
            "message store: compacting segment", segment=segment, moved=len(moved) + packed
        )

    def _compact_run(self, run: PagedRun, segment: int) -> int:
        """Copy the records of ``run``'s packed messages in ``segment`` to the head of the log;
        they are read from the old place until the copies are written."""
        ids, segments, starts, lengths = run.ids, run.segments, run.starts, run.lengths
        queue_id = run.queue.store_id
        names: dict[bytes, str] = {}
        store = self.store
        read_body = store.pager.read_body
        moved = self._moved_from.setdefault(segment, [])
        count = 0
        for i in range(run.head, len(ids)):
            if segments[i] != segment:
                continue
            data = read_body(segment, starts[i], lengths[i])
            rec = records.decode_record(data, 0, lengths[i], names)
            assert rec.body is not None
            record = records.encode_publish(
                rec.msg_id, queue_id, rec.expires_wall, rec.delivery_count, rec.retries, 0.0,
                bool(run.flags[i] & REDELIVERED), rec.exchange.encode("utf-8", "surrogateescape"),
                rec.routing_key.encode("utf-8", "surrogateescape"), rec.properties, rec.body,
                rec.trace_id,
            )  # fmt: skip
            new = store._segment
            store._live[new] = store._live.get(new, 0) + 1
            store._total[new] = store._total.get(new, 0) + 1
            store._append(record)
            self.moved[rec.msg_id] = (segment, starts[i])
            moved.append(rec.msg_id)
            segments[i], starts[i] = new, store._segment_bytes - len(record)
            if new > run.max_segment:
                run.max_segment = new
            count += 1
        return count
