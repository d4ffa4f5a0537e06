"""A long durable queue's paged-out messages, packed: about 30 bytes each, no objects.

A persistent message of a classic FIFO queue past its memory limit leaves memory
whole once its publish record is on disk: what the queue keeps is where that record
is (segment, offset, length), its store id, its body's size and its redelivered flag,
in a few ``array`` columns shared by a run of consecutive messages. A run becomes
Message objects again a batch at a time, when it reaches the head of the queue, by
reading the records back (broker/store/paging.py: Pager.materialise).

Messages wait in a run's ``pending`` list, in memory, until their record is written:
the writer works in log order, so the written ones are always a prefix of it.
"""

from __future__ import annotations

from array import array
from collections import deque

from warren.broker.engine.message import Message, QueueBase

REDELIVERED = 1
# what a ready message costs in memory besides its body (the Message object, its ints, the
# store's index entry): counted towards a queue's memory limit, so that a backlog of small
# bodies pages out too
MESSAGE_MEMORY = 320
RUN_SIZE = 65536  # messages a run packs before the queue starts another one


class PagedRun:
    """Consecutive paged-out messages of one queue, oldest first (then its pending ones)."""

    __slots__ = (
        "bytes",
        "dead",
        "first_seq",
        "flags",
        "head",
        "ids",
        "lengths",
        "max_segment",
        "min_segment",
        "pending",
        "queue",
        "segments",
        "sizes",
        "starts",
    )

    def __init__(self, queue: QueueBase, first_seq: int) -> None:
        self.queue = queue
        self.first_seq = first_seq  # seq of ids[0]: a run's messages have consecutive seqs
        self.ids = array("Q")  # store ids
        self.segments = array("I")
        self.starts = array("Q")  # where the record starts in its segment
        self.lengths = array("I")  # the whole record, header to the body's end
        self.sizes = array("I")  # the body's
        self.flags = array("B")
        self.head = 0  # packed entries before it are materialised already
        self.bytes = 0  # body bytes of the packed entries from head on
        self.pending: deque[Message] = deque()  # in memory until their record is written
        self.min_segment = 1 << 32  # segments the packed entries may be in
        self.max_segment = 0
        self.dead = False  # purged or deleted: the store forgets it

    def __len__(self) -> int:
        return len(self.ids) - self.head + len(self.pending)

    @property
    def packed(self) -> int:
        return len(self.ids) - self.head

    @property
    def open(self) -> bool:
        """May take more messages (nothing published after it went elsewhere)."""
        return len(self.ids) + len(self.pending) < RUN_SIZE

    def add(
        self, store_id: int, segment: int, start: int, length: int, size: int, redelivered: bool
    ) -> None:
        """Pack one message whose record is on disk."""
        self.ids.append(store_id)
        self.segments.append(segment)
        self.starts.append(start)
        self.lengths.append(length)
        self.sizes.append(size)
        self.flags.append(REDELIVERED if redelivered else 0)
        self.bytes += size
        if segment < self.min_segment:
            self.min_segment = segment
        if segment > self.max_segment:
            self.max_segment = segment

    def drop_packed(self) -> None:
        """Free the columns once every packed entry is materialised."""
        if self.head and self.head == len(self.ids):
            self.first_seq += self.head
            for column in (self.ids, self.segments, self.starts, self.lengths, self.sizes):
                del column[:]
            del self.flags[:]
            self.head = 0
            self.min_segment, self.max_segment = 1 << 32, 0
