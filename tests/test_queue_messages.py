"""Browse a queue without taking its messages, and act on one of them (issue 40).

RabbitMQ 4.3's open-source management API can do neither: its /get takes the messages
and requeues them, marked redelivered (deps/rabbitmq_management/src/
rabbit_mgmt_wm_queue_get.erl, basic_gets/6), and no route acts on one message. These are
Warren's routes (broker/ops/management/queue_messages.py), checked with pika publishing and
consuming and HTTP over a real socket, against brokers started here (restarted for the
durable cases).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.http_api import HttpApi, q
from warren.broker.testkit import RunningBroker, run_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture(scope="module")
def warren() -> Iterator[RunningBroker]:
    with run_broker(management_port=0, record=False) as running:
        yield running


@pytest.fixture(scope="module")
def api(warren: RunningBroker) -> HttpApi:
    assert warren.server.management_port
    return HttpApi(warren.server.management_port)


def connect(running: RunningBroker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(running.url))


def http(running: RunningBroker) -> HttpApi:
    assert running.server.management_port
    return HttpApi(running.server.management_port)


def fill(running: RunningBroker, queue: str, n: int, pad: int = 0, **declare: Any) -> None:
    """``n`` persistent messages m0..m{n-1} (then ``pad`` dots) with message ids id0...,
    confirmed (on disk)."""
    conn = connect(running)
    ch = conn.channel()
    ch.queue_declare(queue, **declare)
    ch.confirm_delivery()
    for i in range(n):
        props = pika.BasicProperties(
            delivery_mode=2, message_id=f"id{i}", correlation_id=f"c{i % 3}", headers={"n": i}
        )
        ch.basic_publish("", queue, f"m{i}".encode() + b"." * pad, props)
    conn.close()


def drain(running: RunningBroker, queue: str) -> list[tuple[str, bool]]:
    """Every ready message of ``queue``, taken with basic.get: (body, redelivered)."""
    conn = connect(running)
    ch = conn.channel()
    got = []
    while True:
        method, _, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((body.decode(), method.redelivered))
    conn.close()
    return got


def browse(api: HttpApi, queue: str, query: str = "offset=0&count=1000") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = api.ok("GET", f"/api/queues/%2F/{q(queue)}/messages?{query}")
    return rows


def counts(api: HttpApi, queue: str) -> tuple[int, int, int]:
    info = api.ok("GET", f"/api/queues/%2F/{q(queue)}")
    return info["messages"], info["messages_ready"], info["messages_unacknowledged"]


# ---- browse ----


def test_a_paged_backlog_is_browsed_from_the_store_and_stays_paged(tmp_path: Path) -> None:
    with run_broker(
        data_dir=str(tmp_path), management_port=0, queue_body_memory_limit=4096, record=False
    ) as running:
        api = http(running)
        fill(running, "paged.q", 400, durable=True)
        before = api.ok("GET", "/api/queues/%2F/paged.q")
        assert before["messages_paged_out"] > 300  # most of it is packed on disk
        rows = browse(api, "paged.q", "offset=0&count=400")
        assert [r["payload"] for r in rows] == [f"m{i}" for i in range(400)]
        assert [r["position"] for r in rows] == list(range(400))
        assert rows[-1]["paged_out"] and not rows[0]["paged_out"]
        assert rows[399]["properties"]["message_id"] == "id399"
        assert rows[399]["properties"]["headers"] == {"n": 399}
        deep = browse(api, "paged.q", "offset=390&count=5")
        assert [r["payload"] for r in deep] == [f"m{i}" for i in range(390, 395)]
        after = api.ok("GET", "/api/queues/%2F/paged.q")
        for key in ("messages", "messages_ready", "messages_paged_out"):
            assert after[key] == before[key]
        assert drain(running, "paged.q") == [(f"m{i}", False) for i in range(400)]


def test_paged_out_messages_of_a_ttl_queue_are_read_and_stay_paged(tmp_path: Path) -> None:
    # with a TTL a paged message stays an object whose body is on disk (Message.paged_size)
    with run_broker(
        data_dir=str(tmp_path), management_port=0, queue_body_memory_limit=2048, record=False
    ) as running:
        api = http(running)
        arguments = {"x-message-ttl": 600_000}
        fill(running, "ttl.q", 100, pad=100, durable=True, arguments=arguments)
        before = api.ok("GET", "/api/queues/%2F/ttl.q")
        assert before["messages_paged_out"] > 50
        rows = browse(api, "ttl.q")
        assert [r["payload"] for r in rows] == [f"m{i}" + "." * 100 for i in range(100)]
        assert sum(r["paged_out"] for r in rows) == before["messages_paged_out"]
        assert (
            api.ok("GET", "/api/queues/%2F/ttl.q")["messages_paged_out"]
            == (before["messages_paged_out"])
        )
        assert drain(running, "ttl.q") == [(f"m{i}" + "." * 100, False) for i in range(100)]


def test_browse_shows_arrival_time_delivery_count_and_x_death(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    dlq, work = f"{name}.dlq", f"{name}.work"
    conn = connect(warren)
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare(
        work,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
    )
    started = time.time()
    ch.basic_publish("", dlq, b"retried", PERSISTENT)
    ch.basic_publish("", work, b"poison", PERSISTENT)
    # a reject with requeue counts as a failed delivery on a quorum queue (Queue.return_unacked;
    # RabbitMQ 4.3 rabbit_channel.erl handle_method basic.reject calls reject/4), a nack not
    method, _, _ = ch.basic_get(dlq)
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, _ = ch.basic_get(work)
    assert method is not None
    ch.basic_reject(method.delivery_tag, requeue=False)
    ch.queue_declare(dlq, passive=True)  # a round trip: both rejects are done
    ended = time.time()
    rows = browse(api, dlq)
    assert [(r["payload"], r["redelivered"], r["delivery_count"]) for r in rows] == [
        ("retried", True, 1),
        ("poison", False, 0),
    ]
    assert rows[0]["x_death"] is None
    death = rows[1]["x_death"][0]
    assert (death["reason"], death["queue"], death["routing-keys"]) == ("rejected", work, [work])
    for row in rows:  # to the second (Queue.enqueued_at)
        assert started - 1.5 <= row["enqueued_at"] / 1000 <= ended + 0.5
    assert counts(api, dlq) == (2, 2, 0)
    conn.close()


def test_a_stream_is_browsed_by_offset(api: HttpApi, warren: RunningBroker, name: str) -> None:
    conn = connect(warren)
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", name, f"s{i}".encode(), pika.BasicProperties(message_id=f"s{i}"))
    conn.close()
    rows = browse(api, name, "offset=4&count=3")
    assert [(r["position"], r["payload"]) for r in rows] == [(4, "s4"), (5, "s5"), (6, "s6")]
    assert rows[0]["properties"]["message_id"] == "s4"
    assert rows[0]["properties"]["headers"]["x-stream-offset"] == 4
    assert all(r["enqueued_at"] is not None for r in rows)
    assert [r["position"] for r in browse(api, name, "offset=8&count=5")] == [8, 9]
    assert browse(api, name, "offset=50&count=5") == []
    refused = api.request("POST", f"/api/queues/%2F/{q(name)}/messages/delete", {"position": 0})
    assert refused.status == 400 and "append-only" in refused.body["reason"]
    assert len(browse(api, name)) == 10


def test_search_by_message_id_correlation_id_or_header(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    fill(warren, name, 12, durable=True)
    found = browse(api, name, "offset=0&count=10&search=id1")
    assert [r["position"] for r in found] == [1, 10, 11]  # id1, id10, id11
    assert [r["position"] for r in browse(api, name, "count=2&search=c2")] == [2, 5]
    assert [r["payload"] for r in browse(api, name, "count=5&offset=4&search=c2")] == [
        "m5",
        "m8",
        "m11",
    ]
    header = pika.BasicProperties(headers={"tenant": "acme"}, delivery_mode=2)
    conn = connect(warren)
    conn.channel().basic_publish("", name, b"tagged", header)
    conn.close()
    assert [r["payload"] for r in browse(api, name, "search=acme")] == ["tagged"]
    assert counts(api, name) == (13, 13, 0)


# ---- acting on one message ----


def test_delete_move_and_to_tail_by_position_seq_and_message_id(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    other = f"{name}.other"
    fill(warren, name, 5, durable=True)
    api.ok("PUT", f"/api/queues/%2F/{q(other)}", {"durable": True})
    base = f"/api/queues/%2F/{q(name)}/messages"
    assert api.ok("POST", f"{base}/delete", {"message_id": "id1"})["deleted"] == 1
    assert api.ok("POST", f"{base}/move", {"position": 0, "queue": other})["moved"] == 1
    seq = browse(api, name)[0]["seq"]  # id2, now at the head
    moved = api.ok("POST", f"{base}/to-tail", {"seq": seq})
    assert moved["seq"] == seq and moved["new_seq"] > seq
    assert [r["payload"] for r in browse(api, name)] == ["m3", "m4", "m2"]
    assert counts(api, name) == (3, 3, 0) and counts(api, other) == (1, 1, 0)
    assert drain(warren, name) == [("m3", False), ("m4", False), ("m2", False)]
    assert drain(warren, other) == [("m0", False)]


def test_move_to_an_exchange_and_an_unroutable_move_changes_nothing(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    bound = f"{name}.bound"
    fill(warren, name, 3, durable=True)
    api.ok("PUT", f"/api/queues/%2F/{q(bound)}", {"durable": True})
    api.ok("POST", f"/api/bindings/%2F/e/amq.direct/q/{q(bound)}", {"routing_key": "k"})
    base = f"/api/queues/%2F/{q(name)}/messages"
    body = {"position": 1, "exchange": "amq.direct", "routing_key": "nowhere"}
    lost = api.request("POST", f"{base}/move", body)
    assert lost.status == 400 and "no queue is bound" in lost.body["reason"]
    assert [r["payload"] for r in browse(api, name)] == ["m0", "m1", "m2"]
    result = api.ok("POST", f"{base}/move", {**body, "routing_key": "k"})
    assert (result["moved"], result["queues"]) == (1, 1)
    conn = connect(warren)
    method, props, got = conn.channel().basic_get(bound, auto_ack=True)
    assert method is not None and got == b"m1" and props.message_id == "id1"
    assert (method.exchange, method.routing_key, method.redelivered) == ("amq.direct", "k", False)
    conn.close()
    assert [r["payload"] for r in browse(api, name)] == ["m0", "m2"]


def test_bad_input_changes_nothing(api: HttpApi, warren: RunningBroker, name: str) -> None:
    fill(warren, name, 3, durable=True)
    base = f"/api/queues/%2F/{q(name)}/messages"
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("delete", {"position": -1}, 400, "position_below_zero"),
        ("delete", {"position": "x"}, 400, "not_int"),
        ("delete", {}, 400, "one of position, seq or message_id"),
        ("delete", {"position": 0, "message_id": "id0"}, 400, "one of position"),
        ("delete", {"position": 3}, 409, "No ready message at position 3"),
        ("delete", {"message_id": "nope"}, 409, "with message_id 'nope'"),
        ("to-tail", {"seq": 999_999}, 409, "delivered, or it left"),
        ("move", {"position": 0}, 400, "one of queue or exchange"),
        ("move", {"position": 0, "queue": "a", "exchange": "b"}, 400, "one of queue or exchange"),
        ("move", {"position": 0, "queue": f"{name}.missing"}, 404, "no queue"),
        ("move", {"position": 0, "exchange": "missing.x"}, 404, "no exchange"),
        ("move", {"position": 0, "queue": name, "routing_key": "k"}, 400, "routing_key"),
    ]
    for action, body, status, reason in cases:
        got = api.request("POST", f"{base}/{action}", body)
        assert (got.status, action, body) == (status, action, body) and reason in str(got.body)
    missing = api.request(
        "POST", f"/api/queues/%2F/{q(name)}.gone/messages/delete", {"position": 0}
    )
    assert missing.status == 404
    assert browse(api, f"{name}") and counts(api, name) == (3, 3, 0)
    assert drain(warren, name) == [("m0", False), ("m1", False), ("m2", False)]


def test_a_delivered_message_is_refused_with_409_and_can_be_acted_on_once_back(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    fill(warren, name, 2, durable=True)
    seq = browse(api, name)[0]["seq"]
    conn = connect(warren)
    ch = conn.channel()
    method, _, body = ch.basic_get(name)  # m0 is now unacked
    assert method is not None and body == b"m0"
    base = f"/api/queues/%2F/{q(name)}/messages"
    refused = api.request("POST", f"{base}/delete", {"seq": seq})
    assert refused.status == 409 and f"with seq {seq}" in refused.body["reason"]
    assert counts(api, name) == (2, 1, 1)
    ch.basic_nack(method.delivery_tag, requeue=True)  # back at its place, same seq
    ch.queue_declare(name, passive=True)
    assert api.ok("POST", f"{base}/delete", {"seq": seq}) == {"deleted": 1, "seq": seq}
    conn.close()
    assert drain(warren, name) == [("m1", False)]


def test_a_consumer_never_gets_a_message_taken_out(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    # a consumer waiting on the queue is handed the next message at once: the one deleted
    # in between is not among them, and the one sent to the tail comes last
    fill(warren, name, 4, durable=True)
    base = f"/api/queues/%2F/{q(name)}/messages"
    api.ok("POST", f"{base}/delete", {"message_id": "id2"})
    api.ok("POST", f"{base}/to-tail", {"message_id": "id0"})
    conn = connect(warren)
    ch = conn.channel()
    got = []
    for method, _, body in ch.consume(name, inactivity_timeout=5):
        assert method is not None
        got.append(body.decode())
        ch.basic_ack(method.delivery_tag)
        if len(got) == 3:
            break
    ch.cancel()
    conn.close()
    assert got == ["m1", "m3", "m0"]


def test_durable_deletes_and_moves_survive_a_restart(tmp_path: Path) -> None:
    data = str(tmp_path)
    with run_broker(
        data_dir=data, management_port=0, queue_body_memory_limit=4096, record=False
    ) as running:
        api = http(running)
        fill(running, "dur.src", 300, durable=True)
        api.ok("PUT", "/api/queues/%2F/dur.dst", {"durable": True})
        assert api.ok("GET", "/api/queues/%2F/dur.src")["messages_paged_out"] > 200
        base = "/api/queues/%2F/dur.src/messages"
        api.ok("POST", f"{base}/delete", {"message_id": "id250"})  # deep in the packed backlog
        api.ok("POST", f"{base}/delete", {"position": 0})
        api.ok("POST", f"{base}/move", {"message_id": "id5", "queue": "dur.dst"})
        api.ok("POST", f"{base}/to-tail", {"message_id": "id1"})
        expected = [f"m{i}" for i in range(2, 300) if i not in (5, 250)] + ["m1"]
        assert [r["payload"] for r in browse(api, "dur.src")] == expected
    with run_broker(data_dir=data, management_port=0, record=False) as running:
        api = http(running)
        assert [r["payload"] for r in browse(api, "dur.src")] == expected
        assert [r["payload"] for r in browse(api, "dur.dst")] == ["m5"]
        assert [body for body, _ in drain(running, "dur.src")] == expected


def test_acting_on_a_quorum_queue_follows_its_priority_order(
    api: HttpApi, warren: RunningBroker, name: str
) -> None:
    # RabbitMQ 4.3 rabbit_fifo_pq: higher priorities first, no priority property counts as 4
    # (rabbit_fifo:msg_priority/1); positions are that delivery order
    conn = connect(warren)
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    for body, priority in (("low", 1), ("none", None), ("high", 9), ("high2", 9)):
        ch.basic_publish("", name, body.encode(), pika.BasicProperties(priority=priority))
    ch.queue_declare(name, passive=True)
    conn.close()
    base = f"/api/queues/%2F/{q(name)}/messages"
    api.ok("POST", f"{base}/delete", {"position": 0})  # high
    api.ok("POST", f"{base}/to-tail", {"position": 0})  # high2: last of its priority
    assert [r["payload"] for r in browse(api, name)] == ["high2", "none", "low"]
    api.ok("POST", f"{base}/delete", {"position": 1})  # none
    assert drain(warren, name) == [("high2", False), ("low", False)]


def test_a_traced_vhost_records_why_a_message_left(tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    with run_broker(
        management_port=0, trace_enabled=True, trace_dir=str(trace_dir), record=False
    ) as running:
        from warren.broker.tracing import format as trace_format

        api = http(running)
        fill(running, "traced.q", 3, durable=True)
        api.ok("PUT", "/api/queues/%2F/traced.other", {"durable": True})
        base = "/api/queues/%2F/traced.q/messages"
        api.ok("POST", f"{base}/delete", {"message_id": "id0"})
        api.ok("POST", f"{base}/move", {"message_id": "id1", "queue": "traced.other"})
        api.ok("POST", f"{base}/to-tail", {"message_id": "id2"})
        running.call(running.server.broker.tracing.flush)
        events = trace_format.events(str(trace_dir))
        dropped = [(e["queue"], e["reason"]) for e in events if e["ev"] == "dropped"]
        assert dropped == [("traced.q", "deleted"), ("traced.q", "moved"), ("traced.q", "to_tail")]


def test_arrival_times_are_to_the_second(api: HttpApi, warren: RunningBroker, name: str) -> None:
    # the time passing is what is tested here: Queue.enqueued_at stamps once a tick (1 s)
    conn = connect(warren)
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    times = []
    for body in (b"first", b"second"):
        before = time.time()
        ch.basic_publish("", name, body)
        ch.queue_declare(name, passive=True)  # a round trip: it is in the queue
        times.append((before, time.time()))
        time.sleep(1.2)
    conn.close()
    rows = browse(api, name)
    assert [r["payload"] for r in rows] == ["first", "second"]
    for row, (before, after) in zip(rows, times, strict=True):
        stamped = row["enqueued_at"] / 1000
        assert before - 1.0 <= stamped <= after + 0.01, (before, stamped, after)
