"""The engine's clock and timers, injectable so tests can drive time.

Times are monotonic seconds (the event loop's clock). The engine arms at
most one timer per queue and purpose, always at the earliest deadline.

A broker has two: ``broker.timers`` is real time, for what keeps a connection alive
(heartbeats, the handshake timeout, the close-ok wait) and for resource checks;
``broker.clock`` (every ``vhost.timers``) is broker time, for everything a message or
a queue waits for (TTL and expiration, x-expires, consumer timeouts, delayed retries,
delivery limits). Both are one :class:`Timers` unless ``warren.clock = manual``: then
``broker.clock`` is a :class:`ManualTimers`, which stands still until ``advance()``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers:
    """Timers on an asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time() if self._loop is not None else time.monotonic()

    def wall(self) -> float:
        """Seconds since the epoch (timestamps a client sees: x-death's time)."""
        return time.time()

    def instant(self) -> float:
        """``now`` to the microsecond: uvloop's ``time`` moves in whole milliseconds."""
        return time.monotonic()

    def clock(self) -> Callable[[], float]:
        """``now`` as a callable for the message path to keep: the loop's own ``time`` once
        there is a loop (one C call under uvloop, where ``now`` is two interpreted frames)."""
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                return self.now
        return self._loop.time

    def soon(self) -> Callable[[Callable[[], None]], object]:
        """``call_soon`` as a callable for a connection to keep: the loop's own (one C call
        under uvloop, where ``call_soon`` is an interpreted frame more, at every turn)."""
        return self.loop.call_soon

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        return self.loop.call_at(when, callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.loop.call_later(delay, callback)

    def call_soon(self, callback: Callable[[], None]) -> TimerHandle:
        return self.loop.call_soon(callback)


class _ManualHandle:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


STAMP_EVERY = 1.0  # seconds: the precision of a message's time of arrival (arrivals.py)


class ManualTimers(Timers):
    """Broker time that stands still until :meth:`advance` (``warren.clock = manual``).

    Timers wait in a heap, not on the loop; ``call_soon`` still goes to the loop,
    since "now" needs no clock. Only the engine's loop may call these.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop)
        self._now = time.monotonic()  # a plausible start; only differences matter
        self._wall_offset = time.time() - self._now
        self._heap: list[tuple[float, int, _ManualHandle]] = []
        self._order = itertools.count()  # equal deadlines fire in the order they were set
        self.advanced = 0.0  # seconds advanced so far, over restarts too (fork)

    def now(self) -> float:
        return self._now

    def instant(self) -> float:
        return self._now

    def clock(self) -> Callable[[], float]:
        return self.now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        handle = _ManualHandle(callback)
        heapq.heappush(self._heap, (when, next(self._order), handle))
        return handle

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self._now + delay, callback)

    def fork(self) -> ManualTimers:
        """The same time, no timers: for a broker that takes over (the test kit's restart)."""
        other = ManualTimers()
        other._now, other._wall_offset = self._now, self._wall_offset
        other.advanced = self.advanced
        return other

    def next_due(self) -> float | None:
        """Seconds from now until the next timer falls due, None if none is set."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return max(heap[0][0] - self._now, 0.0) if heap else None

    def advance(self, seconds: float) -> int:
        """Move time on by ``seconds``, firing what falls due in deadline order; returns how
        many fired. Each fires with ``now()`` at its own deadline, so timers it sets are
        fired too if they fall due within the step."""
        if seconds < 0:
            raise ValueError("time does not go back: seconds must be >= 0")
        # to the nanosecond: advance(0.199) then advance(0.001) reaches a deadline set 0.2 s
        # ahead, which float sums (of the steps, and of now + delay) can miss by an ulp
        target = round(self._now + seconds, 9)
        self.advanced += seconds
        heap = self._heap
        fired = 0
        while heap and heap[0][0] <= target + 1e-9:
            when, _, handle = heapq.heappop(heap)
            if handle.cancelled:
                continue
            handle.cancelled = True
            self._now = max(self._now, when)
            fired += 1
            try:
                handle.callback()
            except Exception as exc:  # as the loop does: report it, go on with the others
                self.loop.call_exception_handler(
                    {"message": "exception in a manual-clock timer", "exception": exc}
                )
            if not heap or heap[0][0] > self._now:
                self._turn_ended()
        self._now = max(self._now, target)
        return fired

    def _turn_ended(self) -> None:
        """The timers due at one instant have fired (the in-memory harness runs its loop)."""


def _nothing() -> None:
    pass


class Deadline:
    """One rearmable timer that always fires at the earliest deadline asked for."""

    __slots__ = ("_at", "_callback", "_handle", "_timers")

    def __init__(self, timers: Timers, callback: Callable[[], None]) -> None:
        self._timers = timers
        self._callback = callback
        self._handle: TimerHandle | None = None
        self._at = 0.0

    def arm(self, when: float) -> None:
        if self._handle is not None:
            if when >= self._at:
                return
            self._handle.cancel()
        self._at = when
        self._handle = self._timers.call_at(when, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._callback()

    def release(self) -> None:
        """Its owner is gone: cancel, and let go of the owner's callback, so that the two
        do not hold each other (refcounting frees them, not the cyclic collector)."""
        self.cancel()
        self._callback = _nothing


E = TypeVar("E", bound=tuple[Any, ...])


class DeadlineHeap(Deadline, Generic[E]):
    """Entries ``(when, order, ...)`` earliest first, with one timer at the earliest.

    An entry that stops mattering (its message acked, expired or delivered) is not
    searched for: ``live(entry)`` says False, and it is dropped when it reaches the top
    or in one sweep once dead entries outnumber live ones (``push``, ``compact``), so
    each costs O(1) amortised. The owner pops what is due from ``entries`` itself,
    since what "due" does differs (expire, time out, release), then calls ``rearm``.
    """

    __slots__ = ("_live", "entries")

    def __init__(
        self, timers: Timers, callback: Callable[[], None], live: Callable[[E], bool]
    ) -> None:
        super().__init__(timers, callback)
        self.entries: list[E] = []
        self._live = live

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[E]:
        return iter(self.entries)

    def push(self, entry: E, live_count: int) -> None:
        """Add ``entry``; ``live_count`` bounds how many entries may still matter."""
        heap = self.entries
        heapq.heappush(heap, entry)
        if len(heap) > 2 * live_count + 64:
            self._sweep()
            if not heap:
                return
        # Deadline.arm inlined: a push is once a message on the TTL and consumer-timeout
        # paths, and a call of its own there would cost every such message
        when = heap[0][0]
        handle = self._handle
        if handle is not None:
            if when >= self._at:
                return
            handle.cancel()
        self._at = when
        self._handle = self._timers.call_at(when, self._fire)

    def compact(self, live_count: int) -> None:
        """Sweep the dead entries out once they are most of the heap."""
        if len(self.entries) > 2 * live_count + 64:
            self._sweep()

    def _sweep(self) -> None:
        heap = self.entries
        live = self._live
        heap[:] = [e for e in heap if live(e)]  # in place: a caller may hold the list
        heapq.heapify(heap)

    def rearm(self) -> None:
        """After the owner popped what was due: drop dead entries on top, arm for the next."""
        heap = self.entries
        live = self._live
        while heap and not live(heap[0]):
            heapq.heappop(heap)
        if heap:
            self.arm(heap[0][0])

    def clear(self) -> None:
        self.entries.clear()
        self.cancel()

    def take(self) -> list[E]:
        """Empty the heap, handing its entries over (for a purge's reaper to free)."""
        entries = self.entries
        self.entries = []
        self.cancel()
        return entries
