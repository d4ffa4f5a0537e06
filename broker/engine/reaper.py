"""Letting go of a purged or deleted queue's messages, a slice per loop turn.

Emptying a queue costs something per message: its state, its store accounting (a removal
record for each persistent one, unless the queue itself is gone), and freeing it. For a
queue of a million messages that is 0.1 s (transient) to 0.8 s (persistent) of work, and
done inside one queue.purge or queue.delete it would hold up every connection of the
broker for as long. RabbitMQ does that work in the queue's own process, where nobody else
waits for it.

So a queue that empties hands what it held to the reaper (``purge_queue``): the queue is
empty at once (counts, purge-ok, delete-ok), and the reaper lets go of REAP_SLICE messages
a loop turn until nothing is left, in the order the queue held them. A clean shutdown lets
go of the rest before the store closes (``finish``), so that every removal record is
written; a crash before then brings back what was not let go of yet, as a crash before a
purge's removal records reach the disk always could.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from warren.broker.engine.message import unpage
from warren.broker.engine.ready import PriorityReady
from warren.broker.engine.timers import TimerHandle, Timers
from warren.broker.store.paged import PagedRun

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue

# Messages let go of per loop turn. One costs 0.1 µs (transient) to 1.8 µs (persistent and in
# memory: its store entry, a removal record) in the compiled build, so a turn takes 4 ms at
# most (8,192 held a purge's turns to 7-15 ms; tests/benchmarks/delete_stall.py).
REAP_SLICE = 2048
EVERYTHING = 1 << 60  # a budget that no queue exhausts


class Reaper:
    """The queues' messages waiting to be let go of, oldest first (one per broker)."""

    def __init__(self, timers: Timers) -> None:
        self._timers = timers
        self._work: deque[tuple[Queue, deque[Any]]] = deque()
        self._handle: TimerHandle | None = None
        # a queue that empties more than this hands them over; 0 holds all of them until
        # finish() (tests of a stop while the reaper has work)
        self.slice = REAP_SLICE

    def add(self, queue: Queue, held: deque[Any]) -> None:
        """``held``: the containers messages of ``queue`` were in (``let_go``)."""
        self._work.append((queue, held))
        if queue.message_store is not None:
            queue.message_store.compactor.reaping += 1
        if self._handle is None:
            self._handle = self._timers.call_soon(self._turn)

    def _turn(self) -> None:
        self._handle = None
        self._reap(self.slice)
        if self._work and self.slice:
            self._handle = self._timers.call_soon(self._turn)

    def _reap(self, budget: int) -> None:
        work = self._work
        while work and budget > 0:
            queue, held = work[0]
            budget = let_go(queue, held, budget)
            if not held:
                work.popleft()
                if queue.message_store is not None:
                    queue.message_store.compactor.reaped()

    def finish(self) -> None:
        """Let go of everything now (a clean shutdown, before the store closes)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._reap(EVERYTHING)


def purge_queue(queue: Queue) -> int:
    """``Queue.purge``: empty ``queue`` of its ready messages and those waiting for a retry
    (unacked ones stay) at once; a long one's messages are let go of a slice a loop turn."""
    count = queue.ready_count + queue.delayed_count
    if count and (tracer := queue.vhost.tracer) is not None:
        tracer.purged(queue)
    delayed = queue.deadlines.delayed
    for _, _, msg in delayed:
        queue.gone(msg)
    delayed.clear()
    queue.delayed_count = 0
    expiring = queue.deadlines.expiry.take()
    if queue.ready or queue.tail or expiring:
        held: deque[Any] = deque((queue.ready, queue.tail, expiring))
        queue.ready = PriorityReady(queue.max_priority) if queue.max_priority else deque()
        queue.tail = deque()
        reaper = queue.vhost.reaper
        if queue.ready_count > reaper.slice:
            reaper.add(queue, held)
        else:
            let_go(queue, held, EVERYTHING)
    queue.ready_count = 0
    queue.ready_bytes = 0
    return count


def let_go(queue: Queue, held: deque[Any], budget: int) -> int:
    """Let go of at most ``budget`` messages that left in a purge, oldest first;
    ``held`` is the containers they were in (``ready``, ``tail``, then the expiry heap's
    entries, which only need freeing), emptied as it goes. Returns the budget left."""
    while held and budget > 0:
        box = held[0]
        if not box:
            held.popleft()
            continue
        if box.__class__ is list:  # expiry heap entries
            keep = max(0, len(box) - budget)
            budget -= len(box) - keep
            del box[keep:]
            continue
        item = box.popleft()
        if isinstance(item, PagedRun):
            for msg in item.pending:
                queue.gone(msg)
            budget -= len(item.pending)
            item.pending.clear()
            assert queue.message_store is not None
            budget -= queue.message_store.pager.drop_run(item, queue.deleted, max(budget, 1))
            if not item.dead:
                box.appendleft(item)  # the rest of it next time
        else:
            queue.gone(item)
            if item.paged_size >= 0:
                unpage(item, b"")
            budget -= 1
    return budget
