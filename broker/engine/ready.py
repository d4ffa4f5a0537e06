"""Ready messages of a priority queue: one FIFO per priority level, highest level first.

It offers the few deque operations the queue uses (append, popleft, peek at
[0], iteration, clear), so a classic FIFO queue keeps its plain deque and pays
nothing for priorities.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from warren.broker.engine.message import Message


def _seq(msg: Message) -> int:
    return msg.seq


def merge_in_order(ready: deque[Message], back: list[Message]) -> deque[Message]:
    """Put ``back`` (sorted by seq) into ``ready`` (ordered by seq); returns the deque to keep."""
    if not ready or back[-1].seq < ready[0].seq:
        ready.extendleft(reversed(back))
        return ready
    if back[0].seq > ready[-1].seq:
        ready.extend(back)
        return ready
    return deque(heapq.merge(ready, back, key=_seq))


class PriorityReady:
    """A bit per non-empty level (as RabbitMQ 4.3's rabbit_fifo_pq), so finding the head
    costs the same for 2 levels or 32."""

    def __init__(self, max_priority: int) -> None:
        self.max_priority = max_priority
        self.levels: list[deque[Message]] = [deque() for _ in range(max_priority + 1)]
        self.nonempty = 0  # bit n: levels[n] holds messages

    def level_of(self, msg: Message) -> int:
        return min(msg.priority, self.max_priority)

    def append(self, msg: Message) -> None:
        level = min(msg.priority, self.max_priority)
        self.levels[level].append(msg)
        self.nonempty |= 1 << level

    def popleft(self) -> Message:
        if not self.nonempty:
            raise IndexError("pop from an empty queue")
        top = self.nonempty.bit_length() - 1
        level = self.levels[top]
        msg = level.popleft()
        if not level:
            self.nonempty ^= 1 << top
        return msg

    def __getitem__(self, index: int) -> Message:
        if index != 0:
            raise IndexError("only the head can be looked at")
        if not self.nonempty:
            raise IndexError("empty")
        return self.levels[self.nonempty.bit_length() - 1][0]

    def __bool__(self) -> bool:
        return self.nonempty != 0

    def __len__(self) -> int:
        return sum(len(level) for level in self.levels)

    def __iter__(self) -> Iterator[Message]:
        for level in reversed(self.levels):
            yield from level

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self.nonempty = 0

    def reinsert(self, back: list[Message]) -> None:
        """Requeued messages go back to their place within their own priority."""
        by_level: dict[int, list[Message]] = {}
        for msg in back:
            by_level.setdefault(self.level_of(msg), []).append(msg)
        for index, msgs in by_level.items():
            self.levels[index] = merge_in_order(self.levels[index], msgs)
            self.nonempty |= 1 << index
