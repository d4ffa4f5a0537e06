"""When a queue's messages arrived, to the second, with no clock read or value per message:
the queue keeps the seq and broker time of the first arrival after each tick of
``vhost.ticks`` (``Ticks``), a bounded index the browse reads."""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.engine.timers import Timers

STAMPS_KEPT: Final = 4096


class Ticks:
    """A count that goes up a second after it is asked to (``arm``), then waits to be asked
    again: a queue stamps when messages arrived by comparing it with the count it last saw,
    so a publish reads an attribute rather than the clock, and an idle broker has no timer for
    it. Here, compiled, so that the publish reads ``count`` as a native attribute."""

    def __init__(self, timers: Timers, every: float) -> None:
        self.count = 0
        self.armed = False
        self._timers = timers
        self._every = every

    def arm(self) -> None:
        if not self.armed:
            self.armed = True
            self._timers.call_later(self._every, self._tick)

    def _tick(self) -> None:
        self.armed = False
        self.count += 1


def stamp_arrival(queue: Queue) -> None:
    """The first arrival since the last tick: stamp it (Queue.publish calls this)."""
    ticks = queue._ticks
    queue._stamped = ticks.count
    ticks.arm()
    seqs, times = queue.stamp_seqs, queue.stamp_times
    if len(seqs) >= STAMPS_KEPT:
        # the older half keeps every other stamp: old arrival times get coarser, and the
        # index stays bounded on a queue that is never empty
        half = len(seqs) // 2
        queue.stamp_seqs = seqs = seqs[:half:2] + seqs[half:]
        queue.stamp_times = times = times[:half:2] + times[half:]
    seqs.append(queue.next_seq)
    times.append(queue._now())


def arrival_of(queue: Queue, seq: int) -> float | None:
    """Broker time at or just before the arrival of message ``seq`` (less than STAMP_EVERY
    before, where no stamps were thinned out); None for one that came back from the store."""
    i = bisect_right(queue.stamp_seqs, seq) - 1
    return queue.stamp_times[i] if i >= 0 else None
