"""A long backlog of persistent messages costs a few packed bytes each, not objects.

Past its memory limit a durable queue keeps paged-out messages as runs of packed
columns (broker/store/paged.py); they become Message objects again a batch at a time at the
head. These tests count the live Message objects while the backlog sits on disk (a
count that grows with the backlog fails them), and check that order, bodies and the
redelivered flag survive packing, reading back, purging and restarts.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pika

from tests.http_api import HttpApi
from warren.broker.engine.message import Message
from warren.broker.testkit import RunningBroker, run_broker

N = 20_000


def body_of(i: int) -> bytes:
    return b"%06d" % i + b"x" * (i % 50)


def publish(url: str, queue: str, numbers: range) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    props = pika.BasicProperties(delivery_mode=2, headers={"k": "v"})
    for i in numbers:
        ch.basic_publish("", queue, body_of(i), props)
    # the confirm of the last one means every record is on disk, and the broker packs the
    # paged-out messages in the same step (MessageStore._on_synced) as it confirms
    ch.confirm_delivery()
    ch.basic_publish("", queue, body_of(numbers.stop), props)
    conn.close()


def queue_state(running: RunningBroker, name: str) -> tuple[int, int, int]:
    """(ready messages, paged-out ones, Message objects alive in the broker)."""

    def read() -> tuple[int, int, int]:
        queue: Any = running.server.broker.vhosts["/"].queues[name]
        gc.collect()
        # paged-out messages of TTL and priority queues are Messages too: counted apart
        alive = sum(1 for o in gc.get_objects() if type(o) is Message and o.paged_size < 0)
        return queue.ready_count, queue.paged_count, alive

    return running.call(read)


def drain(url: str, queue: str, count: int) -> list[tuple[int, bool]]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got: list[tuple[int, bool]] = []
    for method, props, body in ch.consume(queue, inactivity_timeout=10):
        assert method is not None, f"stalled after {len(got)}"
        i = int(body[:6])
        assert body == body_of(i) and props.headers == {"k": "v"}
        got.append((i, method.redelivered))
        ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    ch.cancel()
    conn.close()
    return got


def test_a_paged_backlog_holds_few_message_objects_and_drains_in_order(tmp_path: Path) -> None:
    with run_broker(
        data_dir=str(tmp_path), queue_body_memory_limit=64 * 1024, record=False
    ) as running:
        publish(running.url, "long.q", range(N))
        ready, paged, alive = queue_state(running, "long.q")
        assert ready == N + 1 and paged > N - 1000
        # the limit holds ~200 in memory; none of the paged ones is an object
        assert alive < 1000, (ready, paged, alive)
        # half drained: at most a read-ahead batch came back as objects
        got = drain(running.url, "long.q", N // 2)
        assert got == [(i, False) for i in range(N // 2)]
        ready, paged, alive = queue_state(running, "long.q")
        # what the consumer had prefetched went back, redelivered; a read-ahead batch is back
        assert ready == N + 1 - N // 2 and alive < 3000, (ready, paged, alive)
        got = drain(running.url, "long.q", N + 1 - N // 2)
        assert [i for i, _ in got] == list(range(N // 2, N + 1))
        assert [i for i, again in got if again] == list(range(N // 2, got[0][0] + 1000))[:1000]
        assert queue_state(running, "long.q")[:2] == (0, 0)


def test_order_and_redelivered_flags_survive_restarts_of_a_packed_queue(tmp_path: Path) -> None:
    # a limit of 0 pages out everything, the recovered queue included
    with run_broker(data_dir=str(tmp_path), queue_body_memory_limit=0, record=False) as running:
        publish(running.url, "long.q", range(N))
        assert queue_state(running, "long.q")[:2] == (N + 1, N + 1)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        for i in range(3):  # delivered, then back at their place when the channel closes
            method, _, body = ch.basic_get("long.q")
            assert method is not None and body == body_of(i)
        conn.close()
        running.restart()
        ready, paged, alive = queue_state(running, "long.q")
        assert (ready, paged) == (N + 1, N + 1) and alive < 100, (ready, paged, alive)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        got = []
        for _ in range(10):  # basic.get: nothing beyond these is delivered
            method, _, body = ch.basic_get("long.q", auto_ack=True)
            assert method is not None
            got.append((int(body[:6]), method.redelivered))
        conn.close()
        assert got == [(i, i < 3) for i in range(10)]
        running.restart()  # the 10 acked stay gone; the rest come back in order
        got = drain(running.url, "long.q", N + 1 - 10)
        assert got == [(i, False) for i in range(10, N + 1)]


def test_purging_and_deleting_a_packed_queue_leaves_nothing_behind(tmp_path: Path) -> None:
    with run_broker(data_dir=str(tmp_path), queue_body_memory_limit=0, record=False) as running:
        publish(running.url, "purged.q", range(5000))
        publish(running.url, "deleted.q", range(5000))
        assert queue_state(running, "purged.q")[:2] == (5001, 5001)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert ch.queue_purge("purged.q").method.message_count == 5001
        assert ch.queue_delete("deleted.q").method.message_count == 5001
        conn.close()
        assert queue_state(running, "purged.q")[:2] == (0, 0)
        running.restart()
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert ch.queue_declare("purged.q", durable=True, passive=True).method.message_count == 0
        ch.queue_declare("deleted.q", durable=True)
        assert ch.queue_declare("deleted.q", passive=True).method.message_count == 0
        conn.close()


def test_a_recovered_backlog_is_packed_as_it_is_read_and_all_comes_back(tmp_path: Path) -> None:
    # The restart reads the log into the store's index of places (broker/store/recovery_index.py),
    # not into an object per message: what stays in memory afterwards is what the limit
    # allows, counting each message's overhead as a running queue does, so ~180 small
    # messages, not the ~2,000 whose bodies alone would fill 64 KiB.
    with run_broker(
        data_dir=str(tmp_path), queue_body_memory_limit=64 * 1024, management_port=0,
        record=False,
    ) as running:  # fmt: skip
        publish(running.url, "long.q", range(N))
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        # interleaved in the log: a priority queue and a queue with a TTL keep objects
        ch.queue_declare("prio.q", durable=True, arguments={"x-max-priority": 5})
        ch.queue_declare("ttl.q", durable=True, arguments={"x-message-ttl": 3_600_000})
        for i in range(2000):
            for name in ("prio.q", "ttl.q"):
                ch.basic_publish("", name, body_of(i), pika.BasicProperties(delivery_mode=2))
        for i in range(5):  # unacked at the restart: redelivered
            method, _, body = ch.basic_get("long.q")
            assert method is not None and body == body_of(i)
        conn.close()
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        for i in range(5):  # acked: gone for good
            method, _, body = ch.basic_get("long.q", auto_ack=True)
            assert method is not None and body == body_of(i)
        conn.close()
        running.restart()
        port = running.server.management_port
        assert port
        reply = HttpApi(port).request("GET", "/api/queues/%2F/long.q")
        info = dict(reply.body)
        assert info["messages"] == N + 1 - 5
        assert info["messages_paged_out"] >= N + 1 - 5 - 400, info
        ready, paged, alive = queue_state(running, "long.q")
        assert alive < 1500 + 4000, (ready, paged, alive)  # the 4,000 of prio.q and ttl.q
        got = drain(running.url, "long.q", N + 1 - 5)
        assert got == [(i, False) for i in range(5, N + 1)]
        for name in ("prio.q", "ttl.q"):
            conn = pika.BlockingConnection(pika.URLParameters(running.url))
            ch = conn.channel()
            bodies = []
            while (reply_ := ch.basic_get(name, auto_ack=True))[0] is not None:
                bodies.append(reply_[2])
            conn.close()
            assert bodies == [body_of(i) for i in range(2000)], name


def test_a_packed_messages_delivery_count_survives_a_restart(tmp_path: Path) -> None:
    # a limit of 0 packs every message as it is read back, then the STATE record of the
    # returned ones comes later in the log: their whole record is read again
    with run_broker(data_dir=str(tmp_path), queue_body_memory_limit=0, record=False) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.queue_declare(
            "counted.q", durable=True,
            # a classic queue counts failed deliveries when it retries (broker/engine/retry.py);
            # only consumer-timeout returns wait here, so a nack requeues at once
            arguments={"x-delayed-retry-type": "returned", "x-delivery-limit": 1},
        )  # fmt: skip
        for i in range(100):
            ch.basic_publish("", "counted.q", body_of(i), pika.BasicProperties(delivery_mode=2))
        ch.confirm_delivery()
        ch.basic_publish("", "counted.q", body_of(100), pika.BasicProperties(delivery_mode=2))
        for i in range(3):
            method, _, body = ch.basic_get("counted.q")
            assert method is not None and body == body_of(i)
        ch.basic_nack(method.delivery_tag, multiple=True, requeue=True)  # delivery count 1
        conn.close()
        running.restart()
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        for i in range(4):
            method, _, body = ch.basic_get("counted.q")
            assert method is not None and body == body_of(i) and method.redelivered == (i < 3)
        # returned again: the first three are past the limit of 1 and dropped
        ch.basic_nack(method.delivery_tag, multiple=True, requeue=True)
        bodies = []
        while (reply := ch.basic_get("counted.q", auto_ack=True))[0] is not None:
            bodies.append(reply[2])
        conn.close()
        assert bodies == [body_of(i) for i in range(3, 101)], len(bodies)
