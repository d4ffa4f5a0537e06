"""Where every live publish record is, while the store reads its log at start-up.

Recovery reads the segments oldest first and must apply each REMOVE, DELIVERED and
STATE record to the message it names, so it needs every live message by id until
the last segment is read. A message a queue will keep packed (broker/store/paged.py) needs
no more than its place, so that is all this index holds for it: a few array columns
(33 bytes a record), not an object, and the recovery of a long backlog peaks near
the packed backlog's own size. Messages that come back as objects (bodies kept in
memory, deadlines, retry state, queues that cannot pack) keep their decoded record
beside it (Recovery, broker/store/recovery.py).

Records are appended in log order into blocks of ascending ids (a new block starts
when an id is not above the last one: compaction copies old messages to the head of
the log), so a lookup by id is a binary search in the few blocks whose range holds it.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections.abc import Iterator

DELIVERED = 1  # delivered before the restart: it comes back redelivered
DECODED = 2  # its decoded record is in RecoveryIndex.decoded
STATE = 4  # a STATE record came for it: its record is read again at the end


class Block:
    """Records of ascending ids, in log order; a removed one has length 0."""

    __slots__ = ("flags", "ids", "lengths", "live", "queues", "segments", "sizes", "starts")

    def __init__(self) -> None:
        self.ids = array("Q")
        self.queues = array("I")
        self.segments = array("I")
        self.starts = array("Q")  # where the record starts in its segment
        self.lengths = array("I")  # the whole record; 0: removed
        self.sizes = array("I")  # the body's
        self.flags = array("B")
        self.live = 0


class RecoveryIndex:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.top = 0  # the highest id appended: one above it cannot be in the index

    def add(
        self, msg_id: int, queue_id: int, segment: int, start: int, length: int, size: int,
        flags: int,
    ) -> None:  # fmt: skip
        blocks = self.blocks
        if not blocks or msg_id <= blocks[-1].ids[-1]:
            blocks.append(Block())
        block = blocks[-1]
        block.ids.append(msg_id)
        block.queues.append(queue_id)
        block.segments.append(segment)
        block.starts.append(start)
        block.lengths.append(length)
        block.sizes.append(size)
        block.flags.append(flags)
        block.live += 1
        if msg_id > self.top:
            self.top = msg_id

    def find(self, msg_id: int) -> tuple[Block, int] | None:
        """The live entry of ``msg_id``, if any."""
        if msg_id > self.top:
            return None
        for block in reversed(self.blocks):
            ids = block.ids
            if ids[0] <= msg_id <= ids[-1]:
                i = bisect_left(ids, msg_id)
                if ids[i] == msg_id and block.lengths[i]:
                    return block, i
        return None

    def drop(self, block: Block, i: int) -> None:
        block.lengths[i] = 0
        block.live -= 1
        if not block.live and block is not self.blocks[-1]:
            self.blocks.remove(block)  # the last one stays: it tells where a new block starts

    def max_live(self) -> int:
        best = 0
        for block in self.blocks:
            lengths, ids = block.lengths, block.ids
            for i in range(len(ids) - 1, -1, -1):
                if lengths[i]:
                    best = max(best, ids[i])
                    break
        return best

    def entries(self) -> Iterator[tuple[Block, int]]:
        """The live entries in id order (publish order)."""
        blocks = [block for block in self.blocks if block.live]
        if len(blocks) == 1:
            yield from _live(blocks[0])
            return
        yield from heapq.merge(*(_live(block) for block in blocks), key=_id_of)


def _id_of(entry: tuple[Block, int]) -> int:
    return entry[0].ids[entry[1]]


def _live(block: Block) -> Iterator[tuple[Block, int]]:
    lengths = block.lengths
    for i in range(len(lengths)):
        if lengths[i]:
            yield block, i
