"""The deadlines of one queue: message TTLs, consumer timeouts, delayed retries, x-expires.

One owner per queue for every clock the queue runs, each a heap (or one timer) of
broker/engine/timers.py armed for its earliest entry. What happens when one is due is
the queue's (a message expires, comes back, is released) or, for a consumer timeout, the
channel's (Channel.deliveries_timed_out); which entries are still live is decided here.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, cast

from warren.broker.engine.message import DELAYED, READY, UNACKED, Message
from warren.broker.engine.retry import release_delayed
from warren.broker.engine.timers import Deadline, DeadlineHeap, Timers

if TYPE_CHECKING:
    from warren.broker.engine.channel import Channel
    from warren.broker.engine.consumer import Consumer
    from warren.broker.engine.queue import Queue


class QueueDeadlines:
    def __init__(self, queue: Queue, timers: Timers) -> None:
        # None once the queue is deleted (release()): no cycle keeps a deleted queue alive
        self.queue: Queue | None = queue
        self._now = timers.clock()
        # per-message TTLs: (expires_at, seq, message), earliest first
        self.expiry: DeadlineHeap[tuple[float, int, Message]] = DeadlineHeap(
            timers, self._expire_due, _may_expire
        )
        # consumer timeouts (quorum queues): (deadline, n, message, channel, tag, timeout),
        # earliest first
        self.locks: DeadlineHeap[tuple[float, int, Message, Channel, int, int]] = DeadlineHeap(
            timers, self._locks_due, _locked
        )
        self._lock_count = 0
        # delayed retries: (ready_at, seq, message), earliest first
        self.delayed: DeadlineHeap[tuple[float, int, Message]] = DeadlineHeap(
            timers, self._release_due, _still_delayed
        )
        # x-expires: the queue goes once unused that long
        self.unused = Deadline(timers, self._unused_due)
        self.last_used = self._now()

    # ---- TTL ----

    def track_expiry(self, msg: Message, waiting: int) -> None:
        """``waiting``: the queue's ready and delayed messages (the live entries at most)."""
        assert msg.expires_at is not None
        # delivered messages linger in the heap until their deadline; push sweeps them out
        self.expiry.push((msg.expires_at, msg.seq, msg), waiting)

    def _expire_due(self) -> None:
        now = self._now()
        queue = self.queue
        if queue is None:
            return
        heap = self.expiry.entries
        while heap and heap[0][0] <= now:
            _, _, msg = heapq.heappop(heap)
            if msg.expires_at is None or msg.expires_at > now:
                continue
            if msg.state == READY:
                queue.expire(msg)
            elif msg.state == DELAYED:  # its entry in the delay heap is skipped when due
                queue.delayed_count -= 1
                queue.expired(msg)
        self.expiry.rearm()  # drops the delivered ones that reached the top meanwhile

    # ---- consumer timeouts ----

    def lock(self, msg: Message, channel: Channel, tag: int, timeout_ms: int, unacked: int) -> None:
        """Start the clock on an unacked delivery: past its deadline it goes back to the queue
        (``unacked``: the queue's unacked messages, the live entries at most)."""
        self._lock_count += 1
        deadline = self._now() + timeout_ms / 1000
        entry = (deadline, self._lock_count, msg, channel, tag, timeout_ms)
        self.locks.push(entry, unacked)  # settled ones are swept out there

    def _locks_due(self) -> None:
        now = self._now()
        heap = self.locks.entries
        due: dict[tuple[Channel, Consumer | None], tuple[list[Message], int]] = {}
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if _locked(entry):
                msg = entry[2]
                consumer = cast("Consumer | None", msg.consumer)
                group = due.setdefault((entry[3], consumer), ([], entry[5]))
                group[0].append(msg)
        self.locks.rearm()
        for (channel, consumer), (msgs, timeout) in due.items():
            channel.deliveries_timed_out(consumer, msgs, timeout)

    # ---- delayed retry ----

    def delay(self, msg: Message, ready_at: float, delayed: int) -> None:
        """``delayed``: the queue's delayed messages, the live entries at most."""
        self.delayed.push((ready_at, msg.seq, msg), delayed)

    def _release_due(self) -> None:
        now = self._now()
        heap = self.delayed.entries
        due: list[Message] = []
        while heap and heap[0][0] <= now:
            _, _, msg = heapq.heappop(heap)
            if msg.state == DELAYED:
                due.append(msg)
        self.delayed.rearm()
        if due and self.queue is not None:
            release_delayed(self.queue, due, now)

    # ---- x-expires ----

    def touch(self, expires_ms: int | None, unused: bool) -> None:
        """A use: the x-expires clock restarts (and runs while the queue has no consumer)."""
        if expires_ms is None:
            return
        self.last_used = self._now()
        if unused:
            self.unused.cancel()
            self.unused.arm(self.last_used + expires_ms / 1000)

    def rearm_unused(self, expires_ms: int | None, unused: bool) -> None:
        """Another x-expires: counted from the last use."""
        self.unused.cancel()
        if expires_ms is not None and unused:
            self.unused.arm(self.last_used + expires_ms / 1000)

    def _unused_due(self) -> None:
        queue = self.queue
        if queue is None:
            return
        expires = queue.expires
        if queue.deleted or queue.consumers or expires is None:
            return
        due = self.last_used + expires / 1000
        if self._now() >= due:
            queue.unused_expired()
        else:
            self.unused.arm(due)

    def close(self) -> None:
        """The queue is deleted: no clock runs for it any more."""
        self.locks.clear()
        self.delayed.cancel()  # the queue's purge empties it and the expiry heap
        self.expiry.cancel()
        self.unused.cancel()

    def release(self) -> None:
        # the timers call the queue's methods: let go, so that the queue is freed at once
        for deadline in (self.locks, self.delayed, self.expiry, self.unused):
            deadline.release()
        self.queue = None


def _locked(entry: tuple[float, int, Message, Channel, int, int]) -> bool:
    """Is the delivery this heap entry timed still out with its consumer?"""
    msg = entry[2]
    return msg.state == UNACKED and msg.channel is entry[3] and msg.tag == entry[4]


def _may_expire(entry: tuple[float, int, Message]) -> bool:
    """Is the message this expiry entry times still in the queue, waiting?"""
    return entry[2].state in (READY, DELAYED)


def _still_delayed(entry: tuple[float, int, Message]) -> bool:
    return entry[2].state == DELAYED
