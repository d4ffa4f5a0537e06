"""The message log: append-only segment files, a writer thread, group commit.

The event loop only builds records and hands whole batches to the writer
thread, which writes them, fsyncs once per batch, and calls back on the loop
with the batch number. Publisher confirms of persistent messages wait for that
callback, so a confirm means "on disk", while many messages share one fsync.

Segments are deleted oldest first, when nothing in them is live any more; a
mostly dead oldest segment is compacted by rewriting its live messages at the
head of the log. Deleting only from the old end keeps recovery simple: a
REMOVE record can only ever refer to a message in its own or an older segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.store import records

if TYPE_CHECKING:
    from broker.message import Message

SEGMENT_SIZE = 16 * 1024 * 1024
COMPACT_BELOW = 0.5  # live share under which the oldest segment is rewritten


@dataclass
class StoredMessage:
    """A message read back at start-up, for its queue to take in again."""

    msg_id: int
    queue_id: int
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    expires_wall: float
    delivery_count: int
    retries: int
    retry_at_wall: float
    delivered: bool


def _segment_name(number: int) -> str:
    return f"{number:010d}.seg"


class _Writer(threading.Thread):
    """Writes batches in order, one fsync per round of batches, then reports on the loop."""

    def __init__(
        self,
        directory: str,
        loop: asyncio.AbstractEventLoop,
        synced: Callable[[int], None],
        sync: bool,
    ) -> None:
        super().__init__(name="warren-store-writer", daemon=True)
        self.directory = directory
        self.loop = loop
        self.synced = synced
        self.sync = sync
        self.jobs: queue.SimpleQueue[tuple[str, int, bytes, int]] = queue.SimpleQueue()
        self.files: dict[int, Any] = {}
        self.error: BaseException | None = None

    def _file(self, segment: int) -> Any:
        handle = self.files.get(segment)
        if handle is None:
            path = os.path.join(self.directory, _segment_name(segment))
            handle = self.files[segment] = open(path, "ab", buffering=0)  # noqa: SIM115
        return handle

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by the store on the loop
            self.error = exc

    def _run(self) -> None:
        while True:
            jobs = [self.jobs.get()]
            while True:
                try:
                    jobs.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            written: set[int] = set()
            last_batch = -1
            unlinks: list[int] = []
            stop = False
            for kind, segment, data, batch in jobs:
                if kind == "write":
                    self._file(segment).write(data)
                    written.add(segment)
                    last_batch = max(last_batch, batch)
                elif kind == "unlink":
                    unlinks.append(segment)
                elif kind == "stop":
                    stop = True
            if self.sync:
                for segment in written:
                    os.fsync(self.files[segment].fileno())
            for segment in unlinks:
                handle = self.files.pop(segment, None)
                if handle is not None:
                    handle.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, _segment_name(segment)))
            # keep only the newest file open
            for segment in sorted(self.files)[:-1]:
                self.files.pop(segment).close()
            if last_batch >= 0:
                self.loop.call_soon_threadsafe(self.synced, last_batch)
            if stop:
                for handle in self.files.values():
                    handle.close()
                return


class MessageStore:
    def __init__(
        self, directory: str, log: Any, *, segment_size: int = SEGMENT_SIZE, sync: bool = True
    ) -> None:
        self.directory = directory
        self.log = log
        self.segment_size = segment_size
        self.sync = sync
        os.makedirs(directory, exist_ok=True)
        self._next_id = 1
        self.published = 0  # PUBLISH records appended: tells a channel its confirm must wait
        self.messages: dict[int, Message] = {}  # live persistent messages by id
        self._live: dict[int, int] = {}  # segment -> live messages published in it
        self._total: dict[int, int] = {}  # segment -> messages published in it
        self._segment = 1
        self._segment_bytes = 0
        self._buffer: list[bytes] = []
        self._handoff_scheduled = False
        self.open_batch = 0  # the batch that records appended now will belong to
        self.synced_batch = -1
        self.waiters: set[Any] = set()  # channels with confirms waiting for a batch
        self._writer: _Writer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._compacting: dict[int, int] = {}  # segment being compacted -> batch of its copies

    # ---- start-up ----

    def recover(self) -> list[StoredMessage]:
        """Read every segment, oldest first; a torn or corrupt tail is cut off with a warning."""
        segments = sorted(
            int(name[:-4]) for name in os.listdir(self.directory)
            if name.endswith(".seg") and name[:-4].isdigit()
        )  # fmt: skip
        found: dict[int, records.PublishRecord] = {}
        where: dict[int, int] = {}
        for segment in segments:
            path = os.path.join(self.directory, _segment_name(segment))
            with open(path, "rb") as fh:
                data = fh.read()
            end = 0
            for offset, kind, payload in records.read_records(data):
                end = offset
                if kind == records.PUBLISH:
                    record = records.decode_publish(payload)
                    found[record.msg_id] = record  # a compacted copy replaces the original
                    where[record.msg_id] = segment
                elif kind == records.REMOVE:
                    msg_id = records.decode_id(payload)
                    found.pop(msg_id, None)
                    where.pop(msg_id, None)
                elif kind == records.DELIVERED:
                    rec = found.get(records.decode_id(payload))
                    if rec is not None:
                        rec.delivered = True
                elif kind == records.STATE:
                    msg_id, count, retries, retry_at = records.decode_state(payload)
                    rec = found.get(msg_id)
                    if rec is not None:
                        rec.delivery_count, rec.retries, rec.retry_at_wall = (
                            count,
                            retries,
                            retry_at,
                        )
            if end < len(data):
                self.log.warning(
                    "message store: dropped a torn or corrupt tail",
                    segment=path,
                    kept_bytes=end,
                    dropped_bytes=len(data) - end,
                )
                with open(path, "r+b") as fh:
                    fh.truncate(end)
        for segment in where.values():
            self._live[segment] = self._live.get(segment, 0) + 1
            self._total[segment] = self._total.get(segment, 0) + 1
        if found:
            self._next_id = max(found) + 1
        self._segment = (segments[-1] + 1) if segments else 1
        self._where_recovered = where
        return [
            StoredMessage(
                r.msg_id,
                r.queue_id,
                r.exchange,
                r.routing_key,
                r.properties,
                r.body,
                r.expires_wall,
                r.delivery_count,
                r.retries,
                r.retry_at_wall,
                r.delivered,
            )
            for _, r in sorted(found.items())
        ]

    def adopt(self, msg_id: int, msg: Message) -> None:
        """A recovered message is live again in its queue."""
        msg.store_id = msg_id
        msg.store_segment = self._where_recovered.get(msg_id, 0)
        self.messages[msg_id] = msg

    def finish_recovery(self, live_ids: set[int]) -> None:
        """Messages whose queue is gone are dropped from the counts (their files age out)."""
        for msg_id, segment in list(self._where_recovered.items()):
            if msg_id not in live_ids:
                self._live[segment] -= 1
        self._where_recovered = {}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._writer = _Writer(self.directory, loop, self._on_synced, self.sync)
        self._writer.start()
        self._collect_garbage()  # what recovery found dead goes now that the writer runs

    # ---- the message path ----

    def _append(self, record: bytes) -> None:
        """Buffer a record; the buffer becomes one batch at the end of this loop turn."""
        self._buffer.append(record)
        self._segment_bytes += len(record)
        if not self._handoff_scheduled:
            self._handoff_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._handoff)

    def _handoff(self) -> None:
        self._handoff_scheduled = False
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        self._buffer.clear()
        writer = self._writer
        assert writer is not None
        if writer.error is not None:
            raise RuntimeError(f"message store writer failed: {writer.error!r}")
        writer.jobs.put(("write", self._segment, data, self.open_batch))
        self.open_batch += 1
        if self._segment_bytes >= self.segment_size:
            # roll only between batches, so a batch (and a confirm) never spans two files
            self._segment += 1
            self._segment_bytes = 0
            self._collect_garbage()

    def publish(self, queue_id: int, msg: Message, expires_wall: float) -> None:
        msg_id = self._next_id
        self._next_id += 1
        self.published += 1
        msg.store_id = msg_id
        msg.store_segment = self._segment
        self.messages[msg_id] = msg
        self._live[self._segment] = self._live.get(self._segment, 0) + 1
        self._total[self._segment] = self._total.get(self._segment, 0) + 1
        self._append(self._publish_record(queue_id, msg, expires_wall))

    def _publish_record(self, queue_id: int, msg: Message, expires_wall: float) -> bytes:
        return records.encode_publish(
            msg.store_id, queue_id, expires_wall, msg.delivery_count, msg.retries, 0.0,
            msg.redelivered, msg.exchange.encode("utf-8", "surrogateescape"),
            msg.routing_key.encode("utf-8", "surrogateescape"), msg.properties, msg.body,
        )  # fmt: skip

    def remove(self, msg: Message) -> None:
        msg_id = msg.store_id
        if not msg_id or self.messages.pop(msg_id, None) is None:
            return
        msg.store_id = 0
        self._append(records.encode_remove(msg_id))
        segment = msg.store_segment
        live = self._live[segment] = self._live[segment] - 1
        if live < self._total[segment] * COMPACT_BELOW and segment == min(self._live):
            self._collect_garbage()

    def forget(self, msg: Message) -> None:
        """The message's queue is gone: no record needed, it no longer counts as live."""
        msg_id = msg.store_id
        if msg_id and self.messages.pop(msg_id, None) is not None:
            msg.store_id = 0
            self._live[msg.store_segment] -= 1

    def delivered(self, msg: Message) -> None:
        if msg.store_id:
            self._append(records.encode_delivered(msg.store_id))

    def state(self, msg: Message, retry_at_wall: float) -> None:
        if msg.store_id:
            self._append(
                records.encode_state(msg.store_id, msg.delivery_count, msg.retries, retry_at_wall)
            )

    # ---- group commit ----

    def _on_synced(self, batch: int) -> None:
        self.synced_batch = batch
        if self.waiters:
            for channel in list(self.waiters):
                channel.store_synced(batch)
        for segment, copied in list(self._compacting.items()):
            if copied <= batch:  # the copies are on disk: the old segment can go
                del self._compacting[segment]
                self._drop_segment(segment)

    # ---- garbage collection and compaction ----

    def _drop_segment(self, segment: int) -> None:
        self._live.pop(segment, None)
        self._total.pop(segment, None)
        assert self._writer is not None
        self._writer.jobs.put(("unlink", segment, b"", -1))

    def _collect_garbage(self) -> None:
        """Delete dead segments from the old end; compact the oldest if mostly dead."""
        while self._live:
            oldest = min(self._live)
            if oldest >= self._segment or oldest in self._compacting:
                return
            if self._live[oldest] <= 0:
                self._drop_segment(oldest)
                continue
            if self._live[oldest] < self._total[oldest] * COMPACT_BELOW:
                self._compact(oldest)
            return

    def _compact(self, segment: int) -> None:
        """Rewrite the live messages of ``segment`` at the head of the log."""
        moved = [m for m in self.messages.values() if m.store_segment == segment]
        self._live[segment] = 0
        for msg in moved:
            queue_ = msg.queue
            queue_id = queue_.store_id if queue_ is not None else 0
            expires_wall = (
                time.time() + (msg.expires_at - queue_.vhost.timers.now())
                if msg.expires_at is not None and queue_ is not None else 0.0
            )  # fmt: skip
            msg.store_segment = self._segment
            self._live[self._segment] = self._live.get(self._segment, 0) + 1
            self._total[self._segment] = self._total.get(self._segment, 0) + 1
            self._append(self._publish_record(queue_id, msg, expires_wall))
        self._compacting[segment] = self.open_batch
        self.log.info("message store: compacting segment", segment=segment, moved=len(moved))

    def close(self) -> None:
        """Flush what is buffered and stop the writer (clean shutdown)."""
        if self._writer is None:
            return
        self._handoff()
        self._writer.jobs.put(("stop", 0, b"", -1))
        self._writer.join(10)
        self._writer = None
