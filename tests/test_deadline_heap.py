"""DeadlineHeap (broker/engine/timers.py): the lazily-deleted heap behind TTL, consumer
timeouts and delayed retries, on a manual clock."""

from __future__ import annotations

import heapq

from warren.broker.engine.timers import DeadlineHeap, ManualTimers


def make_heap(
    clock: ManualTimers, dead: set[int], fired: list[list[int]]
) -> DeadlineHeap[tuple[float, int]]:
    def due() -> None:  # as a queue's timer callbacks do: pop what is due, then rearm
        now = clock.now()
        entries = heap.entries
        batch = []
        while entries and entries[0][0] <= now:
            _, n = heapq.heappop(entries)
            if n not in dead:
                batch.append(n)
        fired.append(batch)
        heap.rearm()

    heap: DeadlineHeap[tuple[float, int]] = DeadlineHeap(clock, due, lambda e: e[1] not in dead)
    return heap


def test_the_timer_follows_the_earliest_live_entry() -> None:
    clock = ManualTimers()
    dead: set[int] = set()
    fired: list[list[int]] = []
    heap = make_heap(clock, dead, fired)
    start = clock.now()
    heap.push((start + 3, 3), 3)
    heap.push((start + 1, 1), 3)
    heap.push((start + 2, 2), 3)
    dead.add(2)  # settled: never searched for, skipped when it reaches the top
    clock.advance(1)
    assert fired == [[1]]
    clock.advance(1.5)
    assert fired == [[1]]  # the dead entry due at 2 armed nothing
    clock.advance(0.5)
    assert fired == [[1], [3]]
    assert len(heap) == 0


def test_dead_entries_are_swept_once_they_outnumber_the_live() -> None:
    clock = ManualTimers()
    dead: set[int] = set()
    heap = make_heap(clock, dead, [])
    start = clock.now()
    for n in range(1000):
        heap.push((start + 60 + n, n), 1)
        dead.add(n - 1)  # one live entry at a time, as a queue of one that keeps turning over
    assert len(heap) <= 2 * 1 + 64 + 1
    assert 999 in [n for _, n in heap]
    heap.clear()
    assert len(heap) == 0 and clock.next_due() is None
