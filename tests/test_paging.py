"""Long durable queues keep only the head's bodies in memory; the rest are read back from disk.

A small ``queue_body_memory_limit`` makes a few thousand messages a "long" queue;
every test checks what a client receives byte for byte, and that the bodies
really were out of memory (the management API's ``messages_paged_out``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.http_api import HttpApi
from warren.broker.testkit import RunningBroker, run_broker

LIMIT = 64 * 1024
N = 3000


def message(i: int) -> tuple[bytes, pika.BasicProperties]:
    rng = random.Random(i)
    body = b"%06d:" % i + rng.randbytes(rng.randint(0, 1500))
    props = pika.BasicProperties(
        delivery_mode=2, message_id=f"m{i}", headers={"i": i}, content_type="app/x-test"
    )
    return body, props


def fill(url: str, queue: str, numbers: range, arguments: dict[str, Any] | None = None) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True, arguments=arguments)
    for i in numbers:
        ch.basic_publish("", queue, *message(i))
    conn.close()


def check(body: bytes, props: pika.BasicProperties, dead: str = "") -> int:
    """The message came back exactly as published (dead-lettered for ``dead``); its number."""
    i = int(body[:6])
    want_body, want = message(i)
    assert body == want_body, f"message {i}: body differs"
    headers = dict(props.headers)
    if dead:
        assert headers.pop("x-death")[0]["reason"] == dead
        assert {k: headers.pop(k) for k in list(headers) if k.startswith("x-")}
    assert (props.message_id, headers, props.content_type, props.delivery_mode) == (
        want.message_id, {"i": i}, "app/x-test", 2,
    )  # fmt: skip
    return i


def queue_info(running: RunningBroker, name: str) -> dict[str, Any]:
    port = running.server.management_port
    assert port
    reply = HttpApi(port).request("GET", f"/api/queues/%2F/{name}")
    assert reply.status == 200
    return dict(reply.body)


def assert_paged(running: RunningBroker, name: str, at_least: int, limit: int = LIMIT) -> None:
    info = queue_info(running, name)
    assert info["messages_paged_out"] >= at_least, info
    assert info["message_bytes_paged_out"] > 0
    # what stays in memory is about the limit, whatever the length of the queue
    # (plus what one read-ahead brings back: a quarter of the limit, at least 64 KiB)
    assert info["message_bytes_ram"] <= limit + max(limit // 4, 64 * 1024) + 2 * 1506, info
    assert (
        info["message_bytes_ram"] + info["message_bytes_paged_out"] == info["message_bytes_ready"]
    )


def paged_broker(tmp_path: Path, limit: int = LIMIT, **settings: Any) -> Any:
    return run_broker(
        data_dir=str(tmp_path), queue_body_memory_limit=limit, management_port=0, **settings
    )


def test_paged_queue_delivers_everything_in_order_with_acks_nacks_and_requeues(
    tmp_path: Path,
) -> None:
    with paged_broker(tmp_path) as running:
        fill(running.url, "long.q", range(N))
        assert_paged(running, "long.q", N // 2)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        got = [ch.basic_get("long.q") for _ in range(5)]
        assert [check(b, p) for _, p, b in got] == [0, 1, 2, 3, 4]
        ch.basic_nack(got[2][0].delivery_tag, multiple=True, requeue=True)  # 0, 1, 2 go back
        ch.basic_ack(got[3][0].delivery_tag)
        ch.basic_reject(got[4][0].delivery_tag, requeue=False)  # no dead-letter exchange: gone
        ch.basic_qos(prefetch_count=100)
        acked: list[int] = []
        nacked_once = set()
        for method, props, body in ch.consume("long.q", inactivity_timeout=5):
            assert method is not None, f"stalled after {len(acked)} messages"
            i = check(body, props)
            if i % 500 == 250 and i not in nacked_once:
                nacked_once.add(i)  # back to its place at the head, delivered again at once
                ch.basic_nack(method.delivery_tag, requeue=True)
                continue
            assert method.redelivered == (i < 3 or i in nacked_once)
            ch.basic_ack(method.delivery_tag)
            acked.append(i)
            if len(acked) == N - 2:
                break
        ch.cancel()
        expected = [0, 1, 2, *range(5, N)]
        assert sorted(acked) == expected
        # the requeued ones come back as soon as the prefetched deliveries let them
        assert [i for i in acked if i not in nacked_once] == [
            i for i in expected if i not in nacked_once
        ]
        assert len(nacked_once) == 6
        info = queue_info(running, "long.q")
        assert (info["messages"], info["messages_paged_out"], info["message_bytes_ram"]) == (
            0, 0, 0,
        )  # fmt: skip
        conn.close()


def test_basic_get_and_management_get_read_paged_bodies(tmp_path: Path) -> None:
    with paged_broker(tmp_path) as running:
        fill(running.url, "get.q", range(500))
        assert_paged(running, "get.q", 200)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        numbers = []
        for _ in range(250):
            _, props, body = ch.basic_get("get.q", auto_ack=True)
            numbers.append(check(body, props))
        assert numbers == list(range(250))
        port = running.server.management_port
        assert port
        reply = HttpApi(port).request(
            "POST",
            "/api/queues/%2F/get.q/get",
            {"count": 250, "ackmode": "ack_requeue_false", "encoding": "base64"},
        )
        assert reply.status == 200
        import base64

        bodies = [base64.b64decode(m["payload"]) for m in reply.body]
        assert bodies == [message(i)[0] for i in range(250, 500)]
        assert [m["payload_bytes"] for m in reply.body] == [len(b) for b in bodies]
        assert ch.basic_get("get.q")[0] is None
        conn.close()


def test_dead_lettering_from_a_paged_queue(tmp_path: Path) -> None:
    """max-length drops the head (read back from disk) into a durable dead-letter queue."""
    with paged_broker(tmp_path) as running:
        fill(running.url, "dlq", range(0))
        args = {
            "x-max-length": 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dlq",
        }
        fill(running.url, "capped.q", range(N), args)
        assert_paged(running, "capped.q", 400)
        assert_paged(running, "dlq", 1000)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        dead = []
        while (got := ch.basic_get("dlq", auto_ack=True))[0] is not None:
            dead.append(check(got[2], got[1], "maxlen"))
        assert dead == list(range(N - 1000))
        kept = []
        while (got := ch.basic_get("capped.q", auto_ack=True))[0] is not None:
            kept.append(check(got[2], got[1]))
        assert kept == list(range(N - 1000, N))
        conn.close()


def test_restart_recovers_a_paged_queue_without_loading_its_bodies(tmp_path: Path) -> None:
    with paged_broker(tmp_path) as running:
        fill(running.url, "long.q", range(N))
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        method, props, body = ch.basic_get("long.q")  # unacked at the restart: redelivered
        assert check(body, props) == 0
        conn.close()
        running.restart()
        assert_paged(running, "long.q", N // 2)  # the recovery left them on disk
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        numbers = []
        ch.basic_qos(prefetch_count=500)
        for method, props, body in ch.consume("long.q", auto_ack=True, inactivity_timeout=5):
            assert method is not None
            assert method.redelivered == (not numbers)
            numbers.append(check(body, props))
            if len(numbers) == N:
                break
        assert numbers == list(range(N))
        conn.close()


@pytest.mark.parametrize("limit", [0, None])
def test_limit_zero_pages_everything_and_infinity_nothing(
    tmp_path: Path, limit: int | None
) -> None:
    with run_broker(
        data_dir=str(tmp_path), queue_body_memory_limit=limit, management_port=0
    ) as running:
        fill(running.url, "q", range(200))
        info = queue_info(running, "q")
        assert info["messages_paged_out"] == (200 if limit == 0 else 0), info
        fill(running.url, "q", range(0))
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.queue_declare("transient.q", exclusive=True)  # 4.3: transient means exclusive
        ch.basic_publish("", "transient.q", *message(7))  # non-durable queues keep their bodies
        assert queue_info(running, "transient.q")["messages_paged_out"] == 0
        numbers = []
        while (got := ch.basic_get("q", auto_ack=True))[0] is not None:
            numbers.append(check(got[2], got[1]))
        assert numbers == list(range(200))
        conn.close()


def test_compaction_moves_paged_messages(tmp_path: Path) -> None:
    """Churn on another queue makes old segments mostly dead: compaction rewrites the paged
    messages of the long queue elsewhere, and they are still read back byte-exact."""
    with paged_broker(tmp_path, 4096, segment_size=64 * 1024) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("long.q", durable=True)
        ch.queue_declare("churn.q", durable=True)
        for i in range(1500):
            ch.basic_publish("", "long.q", *message(i))
            for _ in range(3):  # mostly dead segments: compaction moves long.q's messages
                ch.basic_publish("", "churn.q", b"c" * 1000, pika.BasicProperties(delivery_mode=2))
            while ch.basic_get("churn.q", auto_ack=True)[0] is not None:
                pass
        assert_paged(running, "long.q", 1400, 4096)
        segments = sorted(p.name for p in (tmp_path / "messages").glob("*.seg"))
        # the first segments held paged messages of long.q among dead ones: compacted, deleted
        assert "0000000001.seg" not in segments and "0000000002.seg" not in segments
        numbers = []
        while (got := ch.basic_get("long.q", auto_ack=True))[0] is not None:
            numbers.append(check(got[2], got[1]))
        assert numbers == list(range(1500))
        conn.close()


def test_paged_messages_that_expire_are_dead_lettered_byte_exact(tmp_path: Path) -> None:
    with paged_broker(tmp_path) as running:
        fill(running.url, "expired.q", range(0))
        args = {
            "x-message-ttl": 8000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "expired.q",
        }
        fill(running.url, "ttl.q", range(1000), args)
        assert_paged(running, "ttl.q", 200)
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        dead = []
        for method, props, body in ch.consume("expired.q", auto_ack=True, inactivity_timeout=10):
            assert method is not None, f"only {len(dead)} expired"
            dead.append(check(body, props, "expired"))
            if len(dead) == 1000:
                break
        assert dead == list(range(1000))
        assert queue_info(running, "ttl.q")["messages"] == 0
        conn.close()


def test_the_limit_is_configured_like_rabbitmqs_sizes() -> None:
    from warren.config import ConfigError, parse_config

    assert parse_config("").queue_body_memory_limit == 64 * 1024 * 1024
    assert parse_config("queue_body_memory_limit = 1MiB").queue_body_memory_limit == 1024**2
    assert parse_config("queue_body_memory_limit = 5MB").queue_body_memory_limit == 5 * 1000**2
    assert parse_config("queue_body_memory_limit = 0").queue_body_memory_limit == 0
    assert parse_config("queue_body_memory_limit = infinity").queue_body_memory_limit is None
    with pytest.raises(ConfigError):
        parse_config("queue_body_memory_limit = lots")


def test_a_paged_priority_queue_delivers_by_priority(tmp_path: Path) -> None:
    with paged_broker(tmp_path) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("prio.q", durable=True, arguments={"x-max-priority": 3})
        for i in range(1200):
            body, props = message(i)
            props.priority = i % 3
            ch.basic_publish("", "prio.q", body, props)
        assert_paged(running, "prio.q", 400)
        numbers = []
        while (got := ch.basic_get("prio.q", auto_ack=True))[0] is not None:
            numbers.append(int(got[2][:6]))
            assert got[2] == message(numbers[-1])[0]
        assert numbers == [i for p in (2, 1, 0) for i in range(1200) if i % 3 == p]
        conn.close()
