"""Purging or deleting a queue longer than the reaper's slice (broker/engine/reaper.py).

The queue is empty for clients at once (purge-ok and delete-ok carry the count, a passive
declare says 0, a consumer gets only what came after); the purged messages are let go of
a slice per loop turn, oldest first, and a clean stop lets go of the rest before the store
closes, so that nothing purged or deleted comes back after a restart. The slice is set to
20 here so that a few hundred messages take many turns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika
import pytest

from warren.broker.testkit import RunningBroker, run_broker

SLICE = 20
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def small_slices(running: RunningBroker, size: int = SLICE) -> None:
    running.call(setattr, running.server.broker.reaper, "slice", size)


def fill(ch: Any, queue: str, count: int, props: pika.BasicProperties) -> None:
    for i in range(count):
        ch.basic_publish("", queue, b"old-%d" % i, props)


def bodies(ch: Any, queue: str) -> list[bytes]:
    out = []
    while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
        out.append(got[2])
    return out


@pytest.mark.parametrize(
    "arguments",
    [{}, {"x-max-priority": 5}, {"x-message-ttl": 3_600_000}],
    ids=["fifo", "priorities", "ttl"],
)
def test_a_long_transient_queue_is_empty_at_once_and_takes_new_messages(
    arguments: dict[str, Any],
) -> None:
    with run_broker(record=False) as running:
        small_slices(running)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("long.t", exclusive=True, arguments=arguments)
        fill(ch, "long.t", 30 * SLICE, pika.BasicProperties(priority=3))
        assert ch.queue_purge("long.t").method.message_count == 30 * SLICE
        assert ch.queue_declare("long.t", passive=True).method.message_count == 0
        for body in (b"new-1", b"new-2", b"new-3"):
            ch.basic_publish("", "long.t", body)
        assert bodies(ch, "long.t") == [b"new-1", b"new-2", b"new-3"]
        fill(ch, "long.t", 30 * SLICE, pika.BasicProperties())
        assert ch.queue_delete("long.t").method.message_count == 30 * SLICE
        ch.queue_declare("long.t", exclusive=True, arguments=arguments)
        ch.basic_publish("", "long.t", b"after")
        assert bodies(ch, "long.t") == [b"after"]
        conn.close()


@pytest.mark.parametrize(
    ("memory_limit", "size"),
    [(0, SLICE), (None, SLICE), (0, 0)],
    ids=["packed", "in-memory", "packed-held-until-the-stop"],
)
def test_what_a_long_purge_or_delete_took_does_not_come_back_after_a_restart(
    tmp_path: Path, memory_limit: int | None, size: int
) -> None:
    """``packed``: past the queue's memory limit (0) the messages wait in packed runs
    (broker/store/paged.py), which the reaper drops a slice at a time within a run. A slice of 0
    holds every purged message until the stop, which must let go of them (and write their
    remove records) before the store closes."""
    limit: dict[str, Any] = {} if memory_limit is None else {"queue_body_memory_limit": 0}
    with run_broker(data_dir=str(tmp_path), record=False, **limit) as running:
        small_slices(running, size)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for name in ("purged.q", "deleted.q", "purged-then-deleted.q"):
            ch.queue_declare(name, durable=True)
            fill(ch, name, 30 * SLICE, PERSISTENT)
        assert ch.queue_purge("purged.q").method.message_count == 30 * SLICE
        ch.basic_publish("", "purged.q", b"new-1", PERSISTENT)
        ch.basic_publish("", "purged.q", b"new-2", PERSISTENT)
        assert ch.queue_delete("deleted.q").method.message_count == 30 * SLICE
        assert ch.queue_purge("purged-then-deleted.q").method.message_count == 30 * SLICE
        assert ch.queue_delete("purged-then-deleted.q").method.message_count == 0
        assert ch.queue_declare("purged.q", durable=True, passive=True).method.message_count == 2
        conn.close()
        running.restart()
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert bodies(ch, "purged.q") == [b"new-1", b"new-2"]
        for name in ("deleted.q", "purged-then-deleted.q"):
            ch.queue_declare(name, durable=True)
            assert ch.queue_declare(name, passive=True).method.message_count == 0
        conn.close()


def test_purged_messages_with_a_ttl_never_expire_into_the_dead_letter_queue() -> None:
    """The expiry heap goes with the purged messages: nothing purged is dead-lettered when
    its time comes, and what came after the purge expires and is dead-lettered as usual."""
    with run_broker(record=False, clock="manual") as running:
        small_slices(running)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("long.dlq", exclusive=True)
        arguments = {
            "x-message-ttl": 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "long.dlq",
        }
        ch.queue_declare("long.ttl", exclusive=True, arguments=arguments)
        fill(ch, "long.ttl", 30 * SLICE, pika.BasicProperties())
        assert ch.queue_purge("long.ttl").method.message_count == 30 * SLICE
        ch.basic_publish("", "long.ttl", b"after")
        running.clock.advance(2.0)
        assert bodies(ch, "long.dlq") == [b"after"]
        assert ch.queue_declare("long.ttl", passive=True).method.message_count == 0
        conn.close()
