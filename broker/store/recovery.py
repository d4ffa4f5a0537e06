"""Start-up: the message store reads its log back (RabbitMQ's rabbit_msg_store recovery).

Every segment is read oldest first, and each REMOVE, DELIVERED and STATE record is
applied to the message it names (broker/store/recovery_index.py holds where each live
record is meanwhile). A torn or corrupt tail is cut off, damaged records in between are
stepped over and counted per queue (``Damage``), and a segment written before records had
a magic is rewritten in the framed format first. What is live comes back in publish
order, for the queues to take in again (broker/engine/queue_restore.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from warren.broker.store import records
from warren.broker.store.paged import MESSAGE_MEMORY
from warren.broker.store.recovery_index import DECODED, Block, RecoveryIndex
from warren.broker.store.recovery_index import DELIVERED as DELIVERED_FLAG
from warren.broker.store.recovery_index import STATE as STATE_FLAG
from warren.broker.store.writer import segment_name

if TYPE_CHECKING:
    from warren.broker.store.segments import MessageStore


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


class Recovery:
    """One read of the store's log at start-up; ``run`` returns what is live."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.log = store.log
        self.index = RecoveryIndex()
        self.decoded: dict[int, records.PublishRecord] = {}
        # of packed ones: read again at the end
        self.states: dict[int, tuple[int, int, float]] = {}
        self.kept: dict[int, int] = {}  # queue id -> memory its in-memory messages take

    def run(self, packs: Callable[[int], bool] | None) -> Iterator[records.PublishRecord]:
        """Read every segment, oldest first; a torn or corrupt tail is cut off with a warning.
        Returns the live messages in publish order, as the queues take them back.

        Bodies are kept in memory up to ``page_limit`` a queue (counting each message's
        overhead, as a running queue does; the oldest first: the head of the queue); past
        it only their place in the file is. Of a queue that ``packs`` (its store id) and
        of a queue gone, a plain message past the limit is read no further than its place
        (its record has ``decoded`` False): the index holds 33 bytes for it, no object.
        """
        store = self.store
        segments = sorted(
            int(name[:-4]) for name in os.listdir(store.directory)
            if name.endswith(".seg") and name[:-4].isdigit()
        )  # fmt: skip
        index, decoded, kept = self.index, self.decoded, self.kept
        packing: dict[int, bool] = {}  # queue id -> packs
        live = store._live
        page_limit = store.pager.page_limit
        limit = page_limit if page_limit is not None else 1 << 62
        publish, publish_v1 = records.PUBLISH, records.PUBLISH_V1
        remove, delivered, state = records.REMOVE, records.DELIVERED, records.STATE
        was_delivered = records.FLAG_DELIVERED
        decode_publish, decode_id, queue_of, place = (
            records.decode_publish, records.decode_id, records.queue_of, records.publish_place
        )  # fmt: skip
        names: dict[bytes, str] = {}
        damage = Damage(self.log)
        for segment in segments:
            path = os.path.join(store.directory, segment_name(segment))
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
                        self._forget(old)
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
                        self._forget(found)
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
                            self.states[msg_id] = (count, retries, retry_at)
            if damage.tail is not None:
                with open(path, "r+b") as fh:
                    fh.truncate(damage.tail)
                damage.tail = None
        for segment in [segment for segment, count in live.items() if count <= 0]:
            del live[segment]
        store._total.update(live)
        top = index.max_live()
        if top:
            store._next_id = store.first_id = top + 1
        store._segment = (segments[-1] + 1) if segments else 1
        store.lost = damage.by_queue()
        return self._recovered()

    def _read_segment(self, path: str) -> bytes:
        """A segment's bytes at start-up; one written before records had a magic is
        rewritten in the framed format first (records.py)."""
        started = time.perf_counter()
        with open(path, "rb") as fh:
            data = fh.read()
        io = self.store.io
        io.read_ops += 1
        io.read_bytes += len(data)
        io.read_time += time.perf_counter() - started
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
        directory = os.open(self.store.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.log.info("message store: segment rewritten with framed records", segment=path,
                      records=len(parts))  # fmt: skip
        return new

    def _forget(self, entry: tuple[Block, int]) -> None:
        """A message read at start-up is removed (or a compacted copy replaces it)."""
        block, i = entry
        msg_id = block.ids[i]
        flags = block.flags[i]
        if flags & DECODED:
            old = self.decoded.pop(msg_id)
            if old.body is not None:
                self.kept[old.queue_id] -= old.body_size + MESSAGE_MEMORY
        elif flags & STATE_FLAG:
            del self.states[msg_id]
        self.store._live[block.segments[i]] -= 1
        self.index.drop(block, i)

    def _recovered(self) -> Iterator[records.PublishRecord]:
        decoded, states = self.decoded, self.states
        names: dict[bytes, str] = {}
        for block, i in self.index.entries():
            msg_id, flags = block.ids[i], block.flags[i]
            if flags & DECODED:
                yield decoded.pop(msg_id)
                continue
            segment, start, length, size = (
                block.segments[i], block.starts[i], block.lengths[i], block.sizes[i]
            )  # fmt: skip
            if flags & STATE_FLAG:  # no longer plain: the queue needs all of it
                record = self.store.pager.read_record(segment, start, length, names)
                record.body = None
                record.delivery_count, record.retries, record.retry_at_wall = states.pop(msg_id)
                record.delivered = bool(flags & DELIVERED_FLAG)
                yield record
                continue
            yield records.PublishRecord(
                msg_id, block.queues[i], 0.0, 0, 0, 0.0, bool(flags & DELIVERED_FLAG), "", "",
                b"", None, size, start + length - size, 0, segment, start, False,
            )  # fmt: skip
