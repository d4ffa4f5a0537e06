"""A durable queue takes back its persistent messages after a restart.

The store (broker/store/) reads the records; this turns them into the queue's state: ready
in publish order (packed in paged runs past the memory limit), delayed for the rest of their
retry delay, or expired if their TTL ran out while the broker was down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.broker.engine.message import DELAYED, READY, Message, page_out
from warren.broker.store.paged import PagedRun
from warren.protocol.properties import priority_of

if TYPE_CHECKING:
    from warren.broker.engine.queue import Queue
    from warren.broker.store import StoredMessage


def restore_messages(
    queue: Queue, records: list[StoredMessage], now_wall: float, now_mono: float
) -> list[Message]:
    """Take back persistent messages after a restart, in publish order (in several calls
    for a long queue: each goes on where the last stopped).

    TTLs keep counting from the original publish; delivered ones come back
    redelivered; those waiting for a retry wait out the rest of their delay.
    """
    restored = []
    expired = []
    store = queue.message_store
    tail = queue.tail
    ready_count = 0
    for record in records:
        body = record.body
        if (
            body is None and store is not None and not queue.max_priority
            and not record.expires_wall and not record.retry_at_wall
            and not record.delivery_count and not record.retries
        ):  # fmt: skip
            # past the memory limit, and nothing but its place to remember: packed
            queue.next_seq += 1
            run = tail[-1] if tail else None
            if run is None or run.__class__ is not PagedRun or not run.open:
                run = PagedRun(queue, queue.next_seq)
                tail.append(run)
                store.pager.runs.add(run)
            assert isinstance(run, PagedRun)
            size = record.body_size
            run.add(
                record.msg_id, record.segment, record.record_start,
                record.body_offset + size - record.record_start, size, record.delivered,
            )  # fmt: skip
            queue.paged_count += 1
            queue.paged_bytes += size
            queue.ready_bytes += size
            queue.stats.persistent += 1
            queue.stats.persistent_bytes += size
            ready_count += 1
            continue
        if not record.decoded:  # only its place was read (for a queue that packs)
            assert store is not None
            length = record.body_offset + record.body_size - record.record_start
            whole = store.pager.read_record(record.segment, record.record_start, length)
            whole.body, whole.delivered = None, record.delivered
            record = whole
        msg = Message(record.exchange, record.routing_key, record.properties, body or b"")
        msg.store_id = record.msg_id
        msg.store_segment, msg.store_offset = record.segment, record.body_offset
        msg.trace_id = record.trace_id
        if body is None:  # past the memory limit: the body stays on disk
            if record.retry_at_wall > now_wall:  # only ready messages are paged out
                assert store is not None
                msg.body = store.pager.read_body(
                    record.segment, record.body_offset, record.body_size
                )
            else:
                queue.paged_bytes += page_out(msg, record.body_size)
                queue.paged_count += 1
        queue.next_seq += 1
        msg.seq = queue.next_seq
        msg.queue = queue
        msg.redelivered = record.delivered
        msg.delivery_count = record.delivery_count
        msg.retries = record.retries
        if queue.max_priority:
            msg.priority = priority_of(msg.properties, queue.default_priority)
        if record.expires_wall:
            msg.expires_at = now_mono + (record.expires_wall - now_wall)
        restored.append(msg)
        queue.stats.persistent += 1
        queue.stats.persistent_bytes += record.body_size
        if record.retry_at_wall > now_wall:
            msg.state = DELAYED
            queue.delayed_count += 1
            ready_at = now_mono + (record.retry_at_wall - now_wall)
            queue.deadlines.delay(msg, ready_at, queue.delayed_count)
            continue
        queue.append_ready(msg)
        ready_count += 1
        queue.ready_bytes += record.body_size
        if msg.expires_at is not None:
            if msg.expires_at <= now_mono:
                expired.append(msg)
            else:
                queue.deadlines.track_expiry(msg, queue.ready_count + queue.delayed_count)
    queue.ready_count += ready_count
    queue.expired_at_start.extend(expired)
    return restored


def expire_restored(queue: Queue) -> None:
    """Messages whose TTL ran out while the broker was down expire now (dead-lettering)."""
    for msg in queue.expired_at_start:
        if msg.state == READY:
            queue.expire(msg)
    queue.expired_at_start = []
