"""The ready messages of one queue past its memory limit: the backlog on disk.

Past the store's memory limit a durable queue's newer ready messages wait in
``Queue.tail``, after ``Queue.ready`` and all later than it: Messages, and runs of paged-out
persistent ones (broker/store/paged.py) that come back a batch at a time when ``ready`` runs
dry. These are the queue's side of that; the store's is broker/store/segments.py.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from warren.broker.engine.message import READY, Message
from warren.broker.store.paged import MESSAGE_MEMORY, PagedRun

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.store import MessageStore


def over_limit(queue: Queue, size: int, limit: int) -> bool:
    in_memory = queue.ready_count - queue.paged_count
    return in_memory * MESSAGE_MEMORY + queue.ready_bytes - queue.paged_bytes + size > limit


def page_later(queue: Queue, msg: Message, store: MessageStore) -> None:
    tail = queue.tail
    run = tail[-1] if tail else None
    if run is None or run.__class__ is not PagedRun or not run.open:
        run = PagedRun(queue, msg.seq)
        tail.append(run)
    assert isinstance(run, PagedRun)
    run.pending.append(msg)
    store.pager.page_run_later(run)


def refill(queue: Queue) -> bool:
    """``ready`` ran dry: the next messages of ``tail`` come into it (a batch of a run)."""
    tail, ready = queue.tail, queue.ready
    while tail and not ready:
        item = tail[0]
        if item.__class__ is PagedRun:
            assert isinstance(item, PagedRun)
            if item.packed:
                assert queue.message_store is not None
                queue.message_store.pager.materialise(item, ready)
            else:
                for msg in item.pending:
                    if msg.state == READY:
                        ready.append(msg)
                item.pending.clear()
            if not len(item):
                tail.popleft()
                assert queue.message_store is not None
                queue.message_store.pager.run_done(item)
        else:
            assert isinstance(item, Message)
            tail.popleft()
            ready.append(item)
    return bool(ready)


def read_ahead(queue: Queue, head: Message) -> None:
    """The head's body is on disk: bring it back with the next paged ones, in one go."""
    assert queue.message_store is not None
    queue.message_store.pager.read_ahead(itertools.chain((head,), queue.ready))


def ready_messages(queue: Queue) -> list[Message]:
    """The ready messages held as objects (not those packed on disk), in order."""
    found = list(queue.ready)
    for item in queue.tail:
        if isinstance(item, PagedRun):
            found.extend(item.pending)
        else:
            found.append(item)
    return found
