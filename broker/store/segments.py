"""The message log: append-only segment files, a writer thread, group commit.

The event loop only builds records and hands whole batches to the writer
thread, which writes them, fsyncs once per batch, and calls back on the loop
with the batch number. Publisher confirms of persistent messages wait for that
callback, so a confirm means "on disk", while many messages share one fsync.
A round of stream chunks alone (broker/streams/stream.py) is reported once written, as
RabbitMQ's streams confirm, and fdatasynced by a second thread meanwhile.

Around it, each in a module of its own: the read of the log at start-up
(broker/store/recovery.py), paging bodies out of memory and back
(broker/store/paging.py, ``MessageStore.pager``), and deleting and compacting
segments (broker/store/compaction.py, ``MessageStore.compactor``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from warren.broker.engine.message import READY, UNACKED, Message
from warren.broker.engine.stats import IOStats
from warren.broker.store import records
from warren.broker.store.compaction import COMPACT_BELOW, Compactor
from warren.broker.store.paging import UNWRITTEN, Pager
from warren.broker.store.recovery import Recovery
from warren.broker.store.reports import ConfirmToken
from warren.broker.store.writer import Writer

if TYPE_CHECKING:
    from warren.broker.engine.timers import Timers

SEGMENT_SIZE = 16 * 1024 * 1024
# a delivered message whose confirm waits is written after GRACE more handoffs if its ack
# has not come by then; a handoff comes at most once per writer round (an fsync), at the end
# of a loop turn while the writer is idle, or KEEP_BACK seconds after the last one when
# nothing else waits to be written
GRACE = 4
KEEP_BACK = 0.0005


# a message read back at start-up, for its queue to take in again
StoredMessage = records.PublishRecord


class MessageStore:
    def __init__(
        self,
        directory: str,
        log: Any,
        *,
        clock: Timers,
        segment_size: int = SEGMENT_SIZE,
        sync: bool = True,
    ) -> None:
        self.directory = directory
        self.log = log
        self.clock = clock  # broker time, the messages' deadlines (Broker.clock)
        self.segment_size = segment_size
        self.sync = sync
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._next_id = 1
        self.published = 0  # PUBLISH records appended: tx.commit waits if its publishes did
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
        # publishers' confirms waiting for the disk: told of each batch synced, and of a failure
        self.waiters: set[ConfirmToken] = set()
        self._writer: Writer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._after_sync: deque[tuple[int, Callable[[bool], None]]] = deque()  # (batch, callback)
        # messages a delayed exchange holds (no queue yet): their holder, by msg id, for
        # compaction to copy their record with the exchange's id
        self.holders: dict[int, int] = {}
        # other logs (streams, broker/streams/stream.py) writing through this writer and its batches
        self._external: list[Any] = []  # with data for the open batch
        # (batch, the logs with a chunk in it), oldest first: told when their batch is written
        self._external_batches: deque[tuple[int, list[Any]]] = deque()
        # the writer thread's failure: nothing is written any more, confirms are nacked
        self.error: BaseException | None = None
        self.on_failure: Callable[[BaseException], None] | None = None  # the broker's alarm
        self.on_recovery: Callable[[], None] | None = None  # ... cleared: writing again
        self.lost: dict[int, int] = {}  # recovery: queue id -> messages lost to damage
        # the writer retries a round that failed with an OSError (a full disk, no descriptor
        # left): meanwhile ``error`` is that error, and it is None again once it writes
        self.stalled = False
        # Messages published since the last handoff, by id: [msg, queue id, expires (wall),
        # the publisher's confirms (the token it handed over) or None, its seq, handoffs left
        # to wait]. Their records are encoded at the handoff, so one removed before it (acked,
        # expired, purged) never reaches the disk, and its confirm needs no write: RabbitMQ's
        # msg_store skips a write whose remove came first and confirms the message
        # (rabbit_msg_store, "flying" writes; rabbit_variable_queue:msgs_written_to_disk/3
        # with `ignored`, remove_vhost_msgs_by_id/2).
        self._fresh: dict[int, list[Any]] = {}
        self.never_written = 0  # messages gone before their record was written
        # (confirms, seq, message) of the open batch's publishes, and of the batches handed over
        self._owners: list[tuple[ConfirmToken, int, Message]] = []
        self._settle: deque[tuple[int, list[tuple[ConfirmToken, int, Message]]]] = deque()
        self._handed = -1  # the last batch handed to the writer: none while it writes one
        self._flush_all = False  # the next handoff keeps nothing back (tx.commit)
        self._new_fresh = False  # messages published since the last handoff
        self.pager = Pager(self)  # bodies out of memory and back, reads of the log
        self.compactor = Compactor(self)  # which segments go, and compaction

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
        """Read the log back (broker/store/recovery.py): the live messages in publish order,
        as the queues take them back. Of a queue that ``packs`` (its store id) and of a
        queue gone, a message past the memory limit comes back as its place only."""
        return Recovery(self).run(packs)

    def recover_losses(self) -> dict[int, int]:
        """What recovery lost to damaged records: queue id -> messages (0: stretches that
        name no message, so no queue)."""
        return self.lost

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
        self.compactor.collect()  # what recovery found dead goes now that the writer runs

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
            self._owners.append((entry[3], entry[4], msg))

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
        self.pager.handed(self.open_batch, self._segment, self._segment_bytes)
        self.open_batch += 1
        if self._segment_bytes >= self.segment_size:
            # roll only between batches, so a batch (and a confirm) never spans two files
            self._segment += 1
            self._segment_bytes = 0
            self.compactor.collect()

    def publish(
        self, queue_id: int, msg: Message, expires_wall: float, confirm: ConfirmToken | None
    ) -> None:
        """Store ``msg``: its record is written with the open batch (see _fresh). ``confirm``:
        the token of the publish being routed, its publisher's confirms, which count this
        copy and hear when it is written or gone (broker/engine/confirms.py)."""
        msg_id = self._next_id
        self._next_id += 1
        self.published += 1
        msg.store_id = msg_id
        msg.store_segment = 0  # none yet: never a segment's to compact
        msg.store_offset = UNWRITTEN
        self.messages[msg_id] = msg
        self._new_fresh = True
        if confirm is not None:
            self._fresh[msg_id] = [msg, queue_id, expires_wall, confirm, confirm.stored(), GRACE]
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
            self.compactor.collect()

    def _elided(self, msg_id: int, msg: Message) -> bool:
        """``msg`` leaves before its record was written: it never will be, and its confirm
        (if one waits) needs no write."""
        entry = self._fresh.pop(msg_id, None)
        if entry is None:
            return False
        msg.store_offset = 0
        self.never_written += 1
        confirm: ConfirmToken | None = entry[3]
        if confirm is not None:
            confirm.on_gone(entry[4])
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

    def hold(self, msg: Message, holder: int) -> None:
        """``msg`` (stored) waits in a delayed exchange, ``holder`` its id in the store,
        instead of a queue."""
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
            seqs: dict[ConfirmToken, list[int]] = {}
            while settle and settle[0][0] <= batch:
                for owner, seq, _ in settle.popleft()[1]:
                    if owner in seqs:
                        seqs[owner].append(seq)
                    else:
                        seqs[owner] = [seq]
            for owner, settled in seqs.items():
                owner.on_written(settled)
        external = self._external_batches
        while external and external[0][0] <= batch:
            for log in external.popleft()[1]:
                log.synced(batch)
        if self.waiters:
            waiters = self.waiters
            for confirm in list(waiters):
                if not confirm.on_synced(batch):
                    waiters.discard(confirm)
        after = self._after_sync
        while after and after[0][0] <= batch:
            after.popleft()[1](True)
        self.pager.synced(batch)
        self.compactor.synced(batch)

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
        nacked = self._nacked_now()
        waiters = list(self.waiters)
        self.waiters.clear()
        for confirm in waiters:
            confirm.on_failed()
        for msg in nacked:  # after the nacks: gone unwritten, they must not settle as acks
            queue = msg.queue
            if msg.state == READY and msg.store_id and queue is not None:
                queue.expire(msg, withdrawn=True)
        after, self._after_sync = self._after_sync, deque()
        for _, callback in after:
            callback(False)
        if self.on_failure is not None:
            self.on_failure(error)

    def _nacked_now(self) -> list[Message]:
        """The stored copies whose publish waits for the disk, about to be nacked: a nack
        means the broker did not take the message, so those still ready leave their queue
        (``Queue.expire(msg, withdrawn=True)``; one delivered already stays with its
        consumer). One whose record the writer writes once it can is removed again by a
        later record, so a restart does not bring it back either."""
        waiters = self.waiters
        copies: list[Message] = []
        for entry in self._fresh.values():
            confirm: ConfirmToken | None = entry[3]
            if confirm is not None and confirm in waiters and confirm.waits(entry[4]):
                copies.append(entry[0])
        for _, owners in self._settle:
            copies.extend(m for c, seq, m in owners if c in waiters and c.waits(seq))
        copies.extend(m for c, seq, m in self._owners if c in waiters and c.waits(seq))
        return copies

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

    def close(self) -> None:
        """Flush what is buffered and stop the writer (clean shutdown)."""
        if self._writer is None:
            return
        self._flush_all = True
        self._handoff()
        self.pager.close()
        if self.stalled:
            self._writer.closing.set()  # a round it cannot write is given up, not waited for
        self._writer.jobs.put(("stop", 0, b"", -1))
        self._writer.join(10)
        self._writer = None
