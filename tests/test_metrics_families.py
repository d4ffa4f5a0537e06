"""The Prometheus families of rabbitmq_prometheus that count per queue, per exchange, per
login source and the message store's I/O: what a scrape shows after real client actions.

Names, types, labels and HELP texts: RabbitMQ 4.3's
deps/rabbitmq_prometheus/src/collectors/prometheus_rabbitmq_core_metrics_collector.erl
(?METRICS_RAW, get_data/4, label/1); values as rabbit_variable_queue:info/2,
rabbit_amqqueue_process:i/2 and rabbit_queue_consumers:capacity/1 define them.
"""

from __future__ import annotations

import math
import resource
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import ProbableAuthenticationError, UnroutableError

from tests.test_metrics import SAMPLE
from warren.broker.engine.stats import ConfirmedByExchange
from warren.broker.testkit import RunningBroker, run_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


@pytest.fixture(scope="module")
def warren(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    data_dir = tmp_path_factory.mktemp("metrics-families")
    with run_broker(
        management_port=0,
        prometheus_port=0,
        data_dir=str(data_dir),
        queue_body_memory_limit=1000,  # bodies past 1000 B a queue go to disk only
        track_auth_attempt_source=True,
    ) as running:
        yield running


def scrape(warren: RunningBroker, path: str = "/metrics/per-object") -> dict[str, float]:
    port = warren.server.prometheus_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(4))
    return samples


def queue_samples(samples: dict[str, float], queue: str) -> dict[str, float]:
    """This queue's per-object samples by family name."""
    labels = f'{{vhost="/",queue="{queue}"}}'
    return {k[: -len(labels)]: v for k, v in samples.items() if k.endswith(labels)}


def test_queue_bytes_persistent_and_ram(warren: RunningBroker) -> None:
    """Persistent and transient messages in a durable queue: bytes, persistent count and
    bytes, what is in memory (ready and unacked), and the messages written to disk."""
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("fam.persist", durable=True)
        ch.basic_publish("", "fam.persist", b"p" * 10, PERSISTENT)
        ch.basic_publish("", "fam.persist", b"q" * 20, PERSISTENT)
        ch.basic_publish("", "fam.persist", b"t" * 5, TRANSIENT)
        q = queue_samples(scrape(warren), "fam.persist")
        assert q["rabbitmq_queue_messages_persistent"] == 2
        assert q["rabbitmq_queue_messages_persistent_bytes"] == 30
        assert q["rabbitmq_queue_messages_bytes"] == 35
        assert q["rabbitmq_queue_messages_ready_bytes"] == 35
        assert q["rabbitmq_queue_messages_unacked_bytes"] == 0
        assert q["rabbitmq_queue_messages_ram"] == 3
        assert q["rabbitmq_queue_messages_ready_ram"] == 3
        assert q["rabbitmq_queue_messages_ram_bytes"] == 35
        assert q["rabbitmq_queue_disk_writes_total"] == 2  # the persistent ones
        # one taken, not yet acknowledged: its bytes move from ready to unacked
        method, _, body = ch.basic_get("fam.persist", auto_ack=False)
        assert method is not None and body == b"p" * 10
        q = queue_samples(scrape(warren), "fam.persist")
        assert q["rabbitmq_queue_messages_unacked_bytes"] == 10
        assert q["rabbitmq_queue_messages_ready_bytes"] == 25
        assert q["rabbitmq_queue_messages_bytes"] == 35
        assert q["rabbitmq_queue_messages_unacked_ram"] == 1
        assert q["rabbitmq_queue_messages_ram_bytes"] == 35
        ch.basic_ack(method.delivery_tag)
        q = queue_samples(scrape(warren), "fam.persist")
        assert q["rabbitmq_queue_messages_persistent"] == 1
        assert q["rabbitmq_queue_messages_persistent_bytes"] == 20
        assert q["rabbitmq_queue_messages_bytes"] == 25
        # a transient queue stores nothing: no persistent message, no disk write
        ch.queue_declare("fam.transient", exclusive=True)
        ch.basic_publish("", "fam.transient", b"x" * 7, PERSISTENT)
        t = queue_samples(scrape(warren), "fam.transient")
        assert t["rabbitmq_queue_messages_persistent"] == 0
        assert t["rabbitmq_queue_disk_writes_total"] == 0
        assert t["rabbitmq_queue_messages_bytes"] == 7
    finally:
        conn.close()
    # the node's sum has the counts, not the persistent bytes or the head timestamp
    # (rabbitmq_prometheus' get_data(queue_metrics, false, ...) has no value for them)
    summed = scrape(warren, "/metrics")
    assert summed["rabbitmq_queue_messages_persistent"] >= 1
    assert "rabbitmq_queue_messages_persistent_bytes" not in summed
    assert "rabbitmq_queue_head_message_timestamp" not in summed


def test_paged_out_bodies_are_not_in_ram_and_are_read_back(warren: RunningBroker) -> None:
    """Past queue_body_memory_limit persistent bodies leave memory once on disk: RAM
    counts drop, and consuming reads them back (queue_disk_reads, msg_store_read, io_read)."""
    before = scrape(warren, "/metrics")
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("fam.paged", durable=True)
        for _ in range(10):
            ch.basic_publish("", "fam.paged", b"b" * 400, PERSISTENT)  # confirmed: on disk
        q = queue_samples(scrape(warren), "fam.paged")
        assert q["rabbitmq_queue_messages_ready_bytes"] == 4000
        assert q["rabbitmq_queue_messages_persistent"] == 10
        assert q["rabbitmq_queue_messages_ready_ram"] < 10
        assert q["rabbitmq_queue_messages_ram_bytes"] <= 1000
        # RabbitMQ 3.10's paged-out families: what is not in RAM of the ready messages
        paged = q["rabbitmq_queue_messages_paged_out"]
        assert paged == 10 - q["rabbitmq_queue_messages_ready_ram"] > 0
        assert q["rabbitmq_queue_messages_paged_out_bytes"] == 400 * paged
        assert q["rabbitmq_queue_disk_reads_total"] == 0
        for _ in range(10):
            method, _, body = ch.basic_get("fam.paged", auto_ack=True)
            assert method is not None and body == b"b" * 400
        q = queue_samples(scrape(warren), "fam.paged")
        assert q["rabbitmq_queue_disk_reads_total"] > 0
        assert q["rabbitmq_queue_messages_persistent"] == 0
        assert q["rabbitmq_queue_messages_paged_out"] == 0
        assert q["rabbitmq_queue_messages_paged_out_bytes"] == 0
    finally:
        conn.close()
    after = scrape(warren, "/metrics")
    read_back = q["rabbitmq_queue_disk_reads_total"]
    assert after["rabbitmq_msg_store_read_total"] - before["rabbitmq_msg_store_read_total"] == (
        read_back
    )
    assert after["rabbitmq_io_read_ops_total"] > before["rabbitmq_io_read_ops_total"]
    assert after["rabbitmq_io_read_bytes_total"] - before["rabbitmq_io_read_bytes_total"] >= (
        400 * read_back
    )
    assert after["rabbitmq_msg_store_write_total"] - before["rabbitmq_msg_store_write_total"] == 10
    assert after["rabbitmq_io_write_bytes_total"] - before["rabbitmq_io_write_bytes_total"] > 4000
    assert after["rabbitmq_io_write_ops_total"] > before["rabbitmq_io_write_ops_total"]
    assert after["rabbitmq_io_sync_ops_total"] > before["rabbitmq_io_sync_ops_total"]
    assert after["rabbitmq_io_seek_ops_total"] == 0  # appends and pread: no seek


def test_packed_backlog_counts_as_persistent_across_purge_and_restart(tmp_path: Path) -> None:
    """Messages packed on disk (broker/store/paged.py) are persistent messages of the queue: they
    count after a restart, and a purge takes them out of the count."""
    settings: dict[str, Any] = {
        "management_port": None,
        "prometheus_port": 0,
        "data_dir": str(tmp_path),
        "queue_body_memory_limit": 1000,
    }
    with run_broker(**settings) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("fam.packed", durable=True)
        for _ in range(50):
            ch.basic_publish("", "fam.packed", b"p" * 100, PERSISTENT)
        conn.close()
        q = queue_samples(scrape(running), "fam.packed")
        assert (q["rabbitmq_queue_messages_persistent"], q["rabbitmq_queue_messages_ready"]) == (
            50,
            50,
        )
        assert q["rabbitmq_queue_messages_ready_ram"] < 50  # most of them packed
    with run_broker(**settings) as running:
        q = queue_samples(scrape(running), "fam.packed")
        assert q["rabbitmq_queue_messages_persistent"] == 50
        assert q["rabbitmq_queue_messages_persistent_bytes"] == 5000
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        assert conn.channel().queue_purge("fam.packed").method.message_count == 50
        conn.close()
        q = queue_samples(scrape(running), "fam.packed")
        assert q["rabbitmq_queue_messages_persistent"] == 0
        assert q["rabbitmq_queue_messages_persistent_bytes"] == 0


def test_head_message_timestamp(warren: RunningBroker) -> None:
    """The timestamp property of the oldest of the ready head and the oldest unacked
    message, in seconds; NaN (RabbitMQ's '') when neither has one."""
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("fam.head", exclusive=True)
        name = "rabbitmq_queue_head_message_timestamp"
        assert math.isnan(queue_samples(scrape(warren), "fam.head")[name])
        ch.basic_publish("", "fam.head", b"1", pika.BasicProperties(timestamp=1_700_000_000))
        ch.basic_publish("", "fam.head", b"2", pika.BasicProperties(timestamp=1_600_000_000))
        assert queue_samples(scrape(warren), "fam.head")[name] == 1_700_000_000
        method, _, _ = ch.basic_get("fam.head", auto_ack=False)  # unacked, still counts
        assert method is not None
        assert queue_samples(scrape(warren), "fam.head")[name] == 1_600_000_000
        ch.basic_ack(method.delivery_tag)
        assert queue_samples(scrape(warren), "fam.head")[name] == 1_600_000_000
        ch.basic_get("fam.head", auto_ack=True)
        assert math.isnan(queue_samples(scrape(warren), "fam.head")[name])
        # a quorum queue has no such key (rabbit_quorum_queue's infos): no sample
        ch.queue_declare("fam.head.qq", durable=True, arguments={"x-queue-type": "quorum"})
        qq = queue_samples(scrape(warren), "fam.head.qq")
        assert name not in qq and "rabbitmq_queue_messages_ram" not in qq
        assert qq["rabbitmq_queue_messages_persistent"] == 0
    finally:
        conn.close()


def test_per_queue_delivery_and_ack_split(warren: RunningBroker) -> None:
    """basic.get and basic.consume, each with automatic and manual acknowledgement, empty
    gets and acks, counted per queue in RabbitMQ's queue_delivery_metrics."""
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("fam.split", exclusive=True)
        ch.basic_publish("", "fam.split", b"r")
        method, _, _ = ch.basic_get("fam.split", auto_ack=False)
        assert method is not None
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, _, _ = ch.basic_get("fam.split", auto_ack=True)
        assert method is not None and method.redelivered
        for i in range(2):
            ch.basic_publish("", "fam.split", f"g{i}".encode())
        assert ch.basic_get("fam.split", auto_ack=True)[0] is not None
        method, _, _ = ch.basic_get("fam.split", auto_ack=False)
        assert method is not None
        ch.basic_ack(method.delivery_tag)
        assert ch.basic_get("fam.split", auto_ack=True)[0] is None  # empty
        assert ch.basic_get("fam.split", auto_ack=False)[0] is None  # empty
        for i in range(3):
            ch.basic_publish("", "fam.split", f"c{i}".encode())
        consumed = ch.consume("fam.split", auto_ack=True, inactivity_timeout=10)
        for got, (method, _, _) in enumerate(consumed, 1):
            assert method is not None
            if got == 3:
                break
        ch.cancel()
        ch.basic_publish("", "fam.split", b"m0")
        ch.basic_publish("", "fam.split", b"m1")
        consumed = ch.consume("fam.split", auto_ack=False, inactivity_timeout=10)
        for got, (method, _, _) in enumerate(consumed, 1):
            assert method is not None
            if got == 2:
                ch.basic_ack(method.delivery_tag, multiple=True)
                break
        ch.cancel()
        q = queue_samples(scrape(warren), "fam.split")
    finally:
        conn.close()
    assert q["rabbitmq_queue_get_total"] == 2
    assert q["rabbitmq_queue_get_ack_total"] == 2
    assert q["rabbitmq_queue_get_empty_total"] == 2
    assert q["rabbitmq_queue_messages_delivered_total"] == 3
    assert q["rabbitmq_queue_messages_delivered_ack_total"] == 2
    assert q["rabbitmq_queue_messages_acked_total"] == 3  # a get's and the two consumed
    assert q["rabbitmq_queue_messages_redelivered_total"] == 1  # the nacked one, got again
    assert q["rabbitmq_queue_messages_published_total"] == 8


def test_exchange_publishes_confirms_and_unroutables(warren: RunningBroker) -> None:
    """exchange_metrics: published, confirmed, returned and dropped per exchange, on
    /metrics/per-object and on /metrics/detailed?family=exchange_metrics."""
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.exchange_declare("fam.x", "direct")
        ch.exchange_declare("fam.y", "fanout")
        ch.exchange_declare("fam.internal", "topic", internal=True)
        ch.exchange_bind(destination="fam.y", source="fam.x", routing_key="to-y")
        ch.queue_declare("fam.xq", exclusive=True)
        ch.queue_bind("fam.xq", "fam.x", "k")
        ch.confirm_delivery()
        for _ in range(3):
            ch.basic_publish("fam.x", "k", b"routed")
        with pytest.raises(UnroutableError):
            ch.basic_publish("fam.x", "nowhere", b"returned", mandatory=True)
        ch.basic_publish("fam.x", "nowhere", b"dropped")
        ch.basic_publish("fam.y", "", b"to no queue")  # another exchange between them
        ch.basic_publish("fam.x", "k", b"routed again")
        plain = conn.channel()  # not in confirm mode: published, never confirmed
        plain.basic_publish("fam.x", "k", b"unconfirmed")
        ch.queue_declare("fam.xq", passive=True)  # a round trip: the publish is in
    finally:
        conn.close()
    samples = scrape(warren)
    x = '{vhost="/",exchange="fam.x"}'
    assert samples["rabbitmq_exchange_messages_published_total" + x] == 7
    assert samples["rabbitmq_exchange_messages_confirmed_total" + x] == 6
    assert samples["rabbitmq_exchange_messages_unroutable_returned_total" + x] == 1
    assert samples["rabbitmq_exchange_messages_unroutable_dropped_total" + x] == 1
    y = '{vhost="/",exchange="fam.y"}'
    assert samples["rabbitmq_exchange_messages_published_total" + y] == 1
    assert samples["rabbitmq_exchange_messages_confirmed_total" + y] == 1
    assert samples["rabbitmq_exchange_messages_unroutable_dropped_total" + y] == 1
    # exchanges nobody published into have no row (RabbitMQ's ETS rows start at a publish)
    assert not any('exchange="amq.topic"' in k for k in samples)
    detailed = scrape(warren, "/metrics/detailed?family=exchange_metrics&vhost=%2F")
    assert detailed["rabbitmq_detailed_exchange_messages_published_total" + x] == 7
    assert not any(k.startswith("rabbitmq_detailed_queue") for k in detailed)
    assert scrape(warren, "/metrics/detailed?family=exchange_metrics&vhost=other") == {
        k: v for k, v in scrape(warren, "/metrics/detailed").items()
    }
    summed = scrape(warren, "/metrics")
    assert summed["rabbitmq_exchange_messages_published_total"] >= 8
    # the cluster-wide listing leaves out the default and internal exchanges
    names = scrape(warren, "/metrics/detailed?family=exchange_names&family=exchange_bindings")
    fam_x = '{vhost="/",exchange="fam.x",type="direct"}'
    assert names["rabbitmq_cluster_exchange_name" + fam_x] == 1
    # the exclusive queue's binding went with the connection; the one to fam.y stays
    assert names["rabbitmq_cluster_exchange_bindings" + fam_x] == 1
    assert not any('exchange="fam.internal"' in k or 'exchange=""' in k for k in names)


def test_auth_attempts_by_source(warren: RunningBroker) -> None:
    """With track_auth_attempt_source on, logins per (address, user, protocol) on the
    per-object endpoint only; a failed PLAIN login counts under the user it named."""
    url = warren.url
    for user, password in (("guest", "wrong"), ("nobody", "x"), ("nobody", "y")):
        bad = url.replace("guest:guest", f"{user}:{password}")
        with pytest.raises(ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(bad))
    pika.BlockingConnection(pika.URLParameters(url)).close()
    samples = scrape(warren)
    src = '{remote_address="127.0.0.1",username="%s",protocol="amqp091"}'
    assert samples["rabbitmq_auth_attempts_detailed_failed_total" + src % "nobody"] == 2
    assert samples["rabbitmq_auth_attempts_detailed_succeeded_total" + src % "nobody"] == 0
    assert samples["rabbitmq_auth_attempts_detailed_total" + src % "nobody"] == 2
    assert samples["rabbitmq_auth_attempts_detailed_failed_total" + src % "guest"] >= 1
    assert samples["rabbitmq_auth_attempts_detailed_succeeded_total" + src % "guest"] >= 1
    summed = scrape(warren, "/metrics")
    assert not any(k.startswith("rabbitmq_auth_attempts_detailed") for k in summed)
    assert summed['rabbitmq_auth_attempts_failed_total{protocol="amqp091"}'] >= 3
    detailed = scrape(warren, "/metrics/detailed?family=auth_attempt_detailed_metrics")
    assert detailed["rabbitmq_detailed_auth_attempts_detailed_failed_total" + src % "nobody"] == 2


def test_auth_attempts_by_source_off_by_default() -> None:
    with run_broker(prometheus_port=0) as running:
        with pytest.raises(ProbableAuthenticationError):
            pika.BlockingConnection(
                pika.URLParameters(running.url.replace("guest:guest", "nobody:x"))
            )
        samples = scrape(running)
    assert not any(k.startswith("rabbitmq_auth_attempts_detailed") for k in samples)
    assert samples['rabbitmq_auth_attempts_failed_total{protocol="amqp091"}'] == 1


def test_consumer_capacity_of_a_blocked_consumer() -> None:
    """rabbit_queue_consumers:capacity/1: 1.0 while the consumer can take what comes, a
    moving average (half-life 1 s) of the active share of time: towards 0 while its
    prefetch is full with messages waiting, back towards 1.0 once it acks."""
    with run_broker(prometheus_port=0, clock="manual") as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        try:
            ch = conn.channel()
            ch.queue_declare("fam.cap", exclusive=True)
            cap = "rabbitmq_queue_consumer_capacity"
            assert queue_samples(scrape(running), "fam.cap")[cap] == 0  # no consumer
            ch.basic_qos(prefetch_count=1)
            tags: list[int] = []
            ch.basic_consume("fam.cap", lambda c, m, p, b: tags.append(m.delivery_tag))
            ch.basic_publish("", "fam.cap", b"1")
            ch.basic_publish("", "fam.cap", b"2")  # waits: the prefetch of 1 is taken
            while not tags:
                conn.process_data_events(time_limit=1)
            q = queue_samples(scrape(running), "fam.cap")
            assert q[cap] == 1.0 and q["rabbitmq_queue_consumer_utilisation"] == 1.0
            assert q["rabbitmq_queue_messages_ready"] == 1
            running.clock.advance(10)
            q = queue_samples(scrape(running), "fam.cap")
            assert q[cap] < 0.01  # 0.5 ** 10 of the earlier 1.0
            assert q["rabbitmq_queue_consumer_utilisation"] == q[cap]
            ch.basic_ack(tags[0])  # the second message goes out: active again
            while len(tags) < 2:
                conn.process_data_events(time_limit=1)
            ch.basic_ack(tags[1])
            ch.queue_declare("fam.cap", passive=True)  # the ack is in
            running.clock.advance(10)
            assert queue_samples(scrape(running), "fam.cap")[cap] > 0.99
            summed = scrape(running, "/metrics")
            assert "rabbitmq_queue_consumer_capacity" not in summed  # RabbitMQ's sum has none
            assert summed["rabbitmq_queue_consumer_utilisation"] > 0.99
        finally:
            conn.close()


class _Exchange:
    confirmed = 0


def test_confirms_are_attributed_to_the_exchange_of_each_publish() -> None:
    """Confirms go out as ranges, a nack possibly ahead of earlier acks
    (broker/engine/confirms.py): each acked publish counts for the exchange it went to, once."""
    x, y = _Exchange(), _Exchange()
    runs = ConfirmedByExchange()
    for seq, exchange in ((1, x), (2, x), (3, x), (4, y), (5, y), (6, x)):
        if exchange is not runs.last:
            runs.switch(seq, exchange)
    runs.confirmed(1, 4)  # 5 was nacked ahead of these; 6 still waits
    runs.settled(5)
    assert (x.confirmed, y.confirmed) == (3, 1)
    assert len(runs.runs) == 1  # only the run 6 belongs to is left
    runs.confirmed(6, 6)
    runs.settled(6)
    assert (x.confirmed, y.confirmed) == (4, 1)


def test_sockets_and_pending_packets(warren: RunningBroker) -> None:
    """RabbitMQ 3.10's process_open_tcp_sockets and process_max_tcp_sockets (the
    RabbitMQ-Overview dashboard's "TCP sockets available" of 3.x; file_handle_cache's
    sockets_used and obtain limit), connection_pending_packets (send_pend) and 4.x's
    global_messages_dead_lettered_confirmed_total (at-least-once dead-lettering only)."""
    before = scrape(warren, "/metrics")["rabbitmq_process_open_tcp_sockets"]
    conns = [pika.BlockingConnection(pika.URLParameters(warren.url)) for _ in range(3)]
    try:
        samples = scrape(warren, "/metrics")
        assert samples["rabbitmq_process_open_tcp_sockets"] == before + 3
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert samples["rabbitmq_process_max_tcp_sockets"] == int((soft - 103) * 0.9 - 2)
        assert samples["rabbitmq_connection_pending_packets"] == 0  # clients that read
        per_object = scrape(warren)
        pending = [k for k in per_object if k.startswith("rabbitmq_connection_pending_packets{")]
        assert len(pending) == before + 3
    finally:
        for conn in conns:
            conn.close()
    confirmed = (
        "rabbitmq_global_messages_dead_lettered_confirmed_total"
        '{queue_type="rabbit_quorum_queue",dead_letter_strategy="at_least_once"}'
    )
    assert scrape(warren, "/metrics")[confirmed] == 0


def test_queue_info_per_object(warren: RunningBroker) -> None:
    """rabbitmq_queue_info{vhost,queue,queue_type,membership} 1 on /metrics/per-object
    (prometheus_rabbitmq_core_metrics_collector:emit_queue_info/4; one node leads every
    queue); not on the aggregated /metrics."""
    conn = pika.BlockingConnection(pika.URLParameters(warren.url))
    try:
        ch = conn.channel()
        ch.queue_declare("fam.info.cq", durable=True)
        ch.queue_declare("fam.info.qq", durable=True, arguments={"x-queue-type": "quorum"})
        samples = scrape(warren)
        for queue, kind in (("fam.info.cq", "classic"), ("fam.info.qq", "quorum")):
            key = (
                f'rabbitmq_queue_info{{vhost="/",queue="{queue}",'
                f'queue_type="rabbit_{kind}_queue",membership="leader"}}'
            )
            assert samples[key] == 1
        assert not any(k.startswith("rabbitmq_queue_info") for k in scrape(warren, "/metrics"))
        ch.queue_delete("fam.info.cq")
        ch.queue_delete("fam.info.qq")
    finally:
        conn.close()
