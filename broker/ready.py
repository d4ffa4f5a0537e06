"""Ready messages of a priority queue: one FIFO per priority level, highest level first.

It offers the few deque operations the queue uses (append, popleft, peek at
[0], iteration, clear), so a classic FIFO queue keeps its plain deque and pays
nothing for priorities.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from warren.broker.message import Message


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
    def __init__(self, max_priority: int) -> None:
        self.max_priority = max_priority
        self.levels: list[deque[Message]] = [deque() for _ in range(max_priority + 1)]

    def level_of(self, msg: Message) -> int:
        return min(msg.priority, self.max_priority)

    def append(self, msg: Message) -> None:
        self.levels[min(msg.priority, self.max_priority)].append(msg)

    def popleft(self) -> Message:
        for level in reversed(self.levels):
            if level:
                return level.popleft()
        raise IndexError("pop from an empty queue")

    def __getitem__(self, index: int) -> Message:
        if index != 0:
            raise IndexError("only the head can be looked at")
        for level in reversed(self.levels):
            if level:
                return level[0]
        raise IndexError("empty")

    def __bool__(self) -> bool:
        return any(self.levels)

    def __len__(self) -> int:
        return sum(len(level) for level in self.levels)

    def __iter__(self) -> Iterator[Message]:
        for level in reversed(self.levels):
            yield from level

    def clear(self) -> None:
        for level in self.levels:
            level.clear()

    def reinsert(self, back: list[Message]) -> None:
        """Requeued messages go back to their place within their own priority."""
        by_level: dict[int, list[Message]] = {}
        for msg in back:
            by_level.setdefault(self.level_of(msg), []).append(msg)
        for index, msgs in by_level.items():
            self.levels[index] = merge_in_order(self.levels[index], msgs)
