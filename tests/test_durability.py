"""Durability: what survives a restart, and confirms that mean "on disk"."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest
from amqp_raw import RawClient
from pamqp import commands

from warren.broker.testkit import run_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def publish_confirmed(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    queue: str,
    bodies: list[bytes],
    props: pika.BasicProperties = PERSISTENT,
) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body, props)


def drain(
    channel: pika.adapters.blocking_connection.BlockingChannel, queue: str
) -> list[tuple[bytes, bool]]:
    out = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, method.redelivered))


def test_topology_and_persistent_messages_survive_restart(tmp_path: Path) -> None:
    data = str(tmp_path)
    headers_props = pika.BasicProperties(
        delivery_mode=2,
        content_type="text/plain",
        headers={"a": 1, "nested": {"b": [1, "x"]}},
        message_id="m-1",
        priority=3,
        correlation_id="c",
        reply_to="r",
        type="t",
        app_id="app",
    )
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dur.ex", "topic", durable=True)
        ch.exchange_declare("tmp.ex", "fanout", durable=False)
        ch.queue_declare("dur.q", durable=True, arguments={"x-max-length": 100})
        ch.queue_declare("tmp.q", exclusive=True)  # transient; RabbitMQ 4.3: so exclusive
        ch.queue_bind("dur.q", "dur.ex", "a.#")
        ch.basic_publish("dur.ex", "a.b", b"persistent-1", headers_props)
        ch.basic_publish("dur.ex", "a.c", b"transient", pika.BasicProperties(delivery_mode=1))
        ch.basic_publish("dur.ex", "a.d", b"persistent-2", PERSISTENT)
        ch.basic_publish("dur.ex", "a.e", b"acked", PERSISTENT)
        ch.basic_publish("", "tmp.q", b"in-transient-queue", PERSISTENT)
        # take 'persistent-1' and 'transient' without acking; ack 'acked' after them
        got = [ch.basic_get("dur.q") for _ in range(4)]
        ch.basic_ack(got[3][0].delivery_tag)
        assert [g[2] for g in got] == [b"persistent-1", b"transient", b"persistent-2", b"acked"]
        ch.basic_nack(got[2][0].delivery_tag, requeue=True)  # requeued, never delivered again
        conn.close()  # 'persistent-1' and 'transient' are requeued as redelivered
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.exchange_declare("dur.ex", "topic", durable=True, passive=True)
        for missing in ("tmp.ex",):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                ch.exchange_declare(missing, passive=True)
            ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.queue_declare("tmp.q", passive=True)
        ch = conn.channel()
        # bindings and arguments came back: an equivalent redeclare works, routing works
        ch.queue_declare("dur.q", durable=True, arguments={"x-max-length": 100})
        messages = []
        while True:
            method, props, body = ch.basic_get("dur.q", auto_ack=True)
            if method is None:
                break
            messages.append((body, method.redelivered, props))
        assert [(b, r) for b, r, _ in messages] == [
            (b"persistent-1", True),
            (b"persistent-2", True),
        ]
        props = messages[0][2]
        assert props.headers == {"a": 1, "nested": {"b": [1, "x"]}}
        assert (props.message_id, props.priority, props.content_type) == ("m-1", 3, "text/plain")
        ch.confirm_delivery()
        ch.basic_publish("dur.ex", "a.z", b"routed-after-restart", PERSISTENT)
        assert drain(ch, "dur.q") == [(b"routed-after-restart", False)]
        conn.close()


def test_users_vhosts_permissions_and_policies_survive(tmp_path: Path) -> None:
    from warren.broker.engine.policy import Policy

    data = str(tmp_path)
    with run_broker(data_dir=data) as running:
        broker = running.server.broker

        def setup() -> None:
            broker.add_vhost("dev")
            broker.access.add_user("bob", "secret", tags=("management",))
            broker.access.set_permissions("bob", "dev", "^bob", ".*", ".*")
            broker.vhosts["dev"].set_policy(Policy("dev", "ttl", "^t", {"message-ttl": 5000}))

        running.call(setup)
    with run_broker(data_dir=data) as running:
        broker = running.server.broker
        assert "dev" in broker.vhosts
        assert broker.access.authenticate("bob", "secret") is not None
        assert broker.access.permissions[("bob", "dev")].configure == "^bob"
        assert broker.vhosts["dev"].policies["ttl"].definition == {"message-ttl": 5000}
        url = f"amqp://bob:secret@127.0.0.1:{running.port}/dev"
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("not-bobs", durable=True)
        assert info.value.reply_code == 403
        conn.close()


def test_message_ttl_keeps_counting_across_restart(tmp_path: Path) -> None:
    data = str(tmp_path)
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dlq", durable=True)
        ch.queue_declare(
            "ttl.q",
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"},
        )
        ch.basic_publish(
            "", "ttl.q", b"short", pika.BasicProperties(delivery_mode=2, expiration="300")
        )
        ch.basic_publish(
            "", "ttl.q", b"long", pika.BasicProperties(delivery_mode=2, expiration="600000")
        )
        conn.close()
    time.sleep(0.4)  # the broker is down: the 300 ms TTL runs out meanwhile
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert [b for b, _ in drain(ch, "ttl.q")] == [b"long"]
        _method, props, body = ch.basic_get("dlq", auto_ack=True)
        assert body == b"short" and props.headers["x-death"][0]["reason"] == "expired"
        conn.close()


def test_confirm_waits_for_fsync_and_group_commit(tmp_path: Path) -> None:
    """Confirms of persistent messages in durable queues arrive; many share an fsync."""
    with run_broker(data_dir=str(tmp_path)) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("gc.q", durable=True)
        for i in range(200):
            ch.basic_publish("", "gc.q", b"%d" % i, PERSISTENT)
        store = running.server.broker.persistence.messages
        assert running.call(lambda: store.synced_batch) >= 0
        # 200 publishes, each confirmed after its batch was on disk, in far fewer batches
        assert running.call(lambda: store.open_batch) <= 200
        conn.close()


def test_corrupt_tail_is_cut_and_intact_messages_kept(tmp_path: Path) -> None:
    data = str(tmp_path)
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("c.q", durable=True)
        for i in range(10):
            ch.basic_publish("", "c.q", b"message-%d" % i, PERSISTENT)
        conn.close()
    segments = sorted((tmp_path / "messages").glob("*.seg"))
    last = segments[-1]
    raw = last.read_bytes()
    last.write_bytes(raw[:-7] + b"\xff" * 3)  # a torn, garbled last record
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        bodies = [b for b, _ in drain(ch, "c.q")]
        assert bodies == [b"message-%d" % i for i in range(9)]
        conn.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(data: str, port: int, config: str | None = None) -> subprocess.Popen[str]:
    extra = ["--config", config] if config else []
    command = [sys.executable, "-m", "warren", "--port", str(port), "--bind", "127.0.0.1"]
    # no HTTP endpoints: their default ports may be taken on the test machine
    command += ["--management-port", "none", "--prometheus-port", "none"]
    proc = subprocess.Popen(
        [*command, "--data-dir", data, *extra], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "[info     ] ready" in line:
            return proc
    raise AssertionError(f"broker did not start: {proc.wait()}")


def kill_9_when(
    proc: subprocess.Popen[str],
    confirmed: list[int],
    at_least: int,
    worker: threading.Thread,
    pause: float,
) -> None:
    """kill -9 the broker ``pause`` seconds after ``at_least`` publishes are confirmed (or
    the worker gave up, or a minute passed: a loaded machine may take seconds to get there)."""
    deadline = time.monotonic() + 60
    while len(confirmed) < at_least and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(pause)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def publisher_until_killed(url: str, confirmed: list[int], stop_after: float) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("crash.q", durable=True)
    deadline = time.monotonic() + stop_after
    i = len(confirmed)
    try:
        while time.monotonic() < deadline:
            ch.basic_publish("", "crash.q", b"%08d" % i, PERSISTENT)
            confirmed.append(i)  # basic_publish returned: the broker confirmed it
            i += 1
    except (pika.exceptions.AMQPError, OSError):
        pass


CRASH_ROUNDS = int(os.environ.get("WARREN_CRASH_ROUNDS", "10"))  # `make crash-test`: 100


@pytest.mark.parametrize("round_", range(CRASH_ROUNDS))
def test_kill_9_loses_no_confirmed_message(tmp_path: Path, round_: int) -> None:
    data = str(tmp_path)
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(data, port)
    confirmed: list[int] = []

    rng = random.Random(round_)
    kill_after = rng.uniform(0.0, 0.55)
    worker = threading.Thread(target=publisher_until_killed, args=(url, confirmed, 30.0))
    worker.start()
    # the first confirm, then a different point of the publishing each round
    kill_9_when(proc, confirmed, 1, worker, kill_after)
    worker.join(10)
    snapshot = list(confirmed)
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        bodies = [int(b) for b, _ in drain(ch, "crash.q")]
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    assert set(snapshot) <= set(bodies), (
        f"lost confirmed messages: {sorted(set(snapshot) - set(bodies))[:5]}"
    )
    assert bodies == sorted(bodies)  # in order
    assert len(snapshot) > 0, "the publisher never got a confirm before the kill"


def consumer_until_killed(url: str, acked: set[int], kept: set[int]) -> None:
    """Ack every delivery of crash.q but every fifth (RabbitMQ's own consumers' pace)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare("crash.q", durable=True)
    ch.basic_qos(prefetch_count=50)
    try:
        for method, _, body in ch.consume("crash.q"):
            n = int(body)
            if n % 5:
                ch.basic_ack(method.delivery_tag)
                acked.add(n)
            else:
                kept.add(n)
    except (pika.exceptions.AMQPError, OSError):
        pass


@pytest.mark.parametrize("round_", range(3))
def test_kill_9_with_a_consumer_keeps_every_confirmed_unacked_message(
    tmp_path: Path, round_: int
) -> None:
    """Messages acked before their write never reach the disk and are confirmed at the ack;
    whatever the moment of a kill -9, each confirmed message the consumer did not ack
    comes back, once, in order."""

    data = str(tmp_path)
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(data, port)
    confirmed: list[int] = []
    acked: set[int] = set()
    kept: set[int] = set()
    consumer = threading.Thread(target=consumer_until_killed, args=(url, acked, kept))
    consumer.start()
    publisher = threading.Thread(target=publisher_until_killed, args=(url, confirmed, 30.0))
    publisher.start()
    kill_9_when(proc, confirmed, 20, publisher, random.Random(round_).uniform(0.0, 0.4))
    publisher.join(10)
    consumer.join(10)
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        bodies = [int(b) for b, _ in drain(conn.channel(), "crash.q")]
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    assert bodies == sorted(bodies)
    lost = set(confirmed) - acked - set(bodies)
    assert not lost, f"lost confirmed unacked messages: {sorted(lost)[:5]}"
    assert kept & set(confirmed), "the consumer kept no confirmed message before the kill"


def churn(url: str, rounds: int, keep_every: int, confirmed: list[int] | None = None) -> None:
    """Publish to a queue that is drained at once and, now and then, to one that keeps."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("keep.q", durable=True)
    ch.queue_declare("churn.q", durable=True)
    try:
        for i in range(rounds):
            ch.basic_publish("", "churn.q", b"x" * 1024, PERSISTENT)
            method, _, _ = ch.basic_get("churn.q")
            ch.basic_ack(method.delivery_tag)
            if i % keep_every == 0:
                ch.basic_publish("", "keep.q", b"%08d" % i, PERSISTENT)
                if confirmed is not None:
                    confirmed.append(i)
        conn.close()
    except (pika.exceptions.AMQPError, OSError):
        pass


def test_dead_segments_are_deleted_and_live_ones_compacted(tmp_path: Path) -> None:
    data = str(tmp_path)
    with run_broker(data_dir=data, segment_size=32 * 1024) as running:
        churn(running.url, 600, 50)
        segments = list((tmp_path / "messages").glob("*.seg"))
        # ~600 KiB went through 32 KiB segments; what is left holds 12 small messages
        assert len(segments) <= 4, [s.name for s in segments]
    with run_broker(data_dir=data, segment_size=32 * 1024) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert [int(b) for b, _ in drain(ch, "keep.q")] == list(range(0, 600, 50))
        assert drain(ch, "churn.q") == []
        conn.close()


def test_a_backlog_in_the_oldest_segment_does_not_pin_the_dead_ones(tmp_path: Path) -> None:
    data = str(tmp_path)
    with run_broker(data_dir=data, segment_size=32 * 1024) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("backlog.q", durable=True)
        for i in range(40):  # fills the first segment: it stays fully live
            ch.basic_publish("", "backlog.q", b"%04d" % i + b"b" * 1020, PERSISTENT)
        conn.close()
        churn(running.url, 900, 10**9)  # ~900 KiB of published-and-acked messages
        files = tmp_path / "messages"
        # the writer thread unlinks the files; give it a moment to catch up
        deadline = time.monotonic() + 10
        while len(list(files.glob("*.seg"))) > 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        segments = sorted(s.name for s in files.glob("*.seg"))
        assert len(segments) <= 5, segments
    with run_broker(data_dir=data, segment_size=32 * 1024) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        assert [b[:4] for b, _ in drain(ch, "backlog.q")] == [b"%04d" % i for i in range(40)]
        conn.close()


@pytest.mark.parametrize("round_", range(3))
def test_kill_9_during_compaction_loses_nothing(tmp_path: Path, round_: int) -> None:

    data = str(tmp_path)
    conf = tmp_path / "warren.conf"
    conf.write_text("message_store.segment_size = 16KiB\n")
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(data, port, str(conf))
    confirmed: list[int] = []
    worker = threading.Thread(target=churn, args=(url, 100_000, 7, confirmed))
    worker.start()
    # the kill lands at a different point of the churn each round, once a few publishes
    # to keep.q are confirmed
    kill_9_when(proc, confirmed, 6, worker, random.Random(round_).uniform(0.0, 0.5))
    worker.join(10)
    snapshot = list(confirmed)
    proc = start_server(data, port, str(conf))
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        bodies = [int(b) for b, _ in drain(ch, "keep.q")]
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    assert len(bodies) == len(set(bodies))
    assert set(snapshot) <= set(bodies)
    assert len(snapshot) > 5


@pytest.mark.parametrize("how", ["delete", "auto-delete", "x-expires"])
def test_restart_after_durable_queue_with_messages_went_away(tmp_path: Path, how: str) -> None:
    data = str(tmp_path)
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        args = {"x-expires": 100} if how == "x-expires" else {}
        ch.queue_declare("gone.q", durable=True, auto_delete=how == "auto-delete", arguments=args)
        ch.basic_publish("", "gone.q", b"orphan", PERSISTENT)
        if how == "delete":
            ch.queue_delete("gone.q")
        elif how == "auto-delete":
            tag = ch.basic_consume("gone.q", lambda *a: None)
            ch.basic_cancel(tag)  # the last consumer goes: so does the queue
        else:
            deadline = time.monotonic() + 5
            while "gone.q" in running.server.broker.vhosts["/"].queues:
                assert time.monotonic() < deadline, "x-expires did not delete the queue"
                time.sleep(0.02)
        conn.close()
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.queue_declare("gone.q", passive=True)
        ch = conn.channel()
        ch.queue_declare("gone.q", durable=True)  # a new queue of that name starts empty
        assert drain(ch, "gone.q") == []
        conn.close()


def test_tx_commit_ok_waits_for_the_disk_and_survives_kill_9(tmp_path: Path) -> None:
    data = str(tmp_path)
    port = free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare("tx.q", durable=True)
        ch.tx_select()
        committed = [b"%04d" % i + bytes([i]) * 64 * 1024 for i in range(40)]
        for body in committed:
            ch.basic_publish("", "tx.q", body, PERSISTENT)
        ch.tx_commit()
        # commit-ok came: the messages are in the segment files already
        on_disk = b"".join(p.read_bytes() for p in (tmp_path / "messages").glob("*.seg"))
        assert all(body in on_disk for body in committed)
        for i in range(5):
            ch.basic_publish("", "tx.q", b"uncommitted %d" % i, PERSISTENT)
        ch.queue_declare("tx.q", passive=True)  # the broker has read the publishes before it
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        assert [body for body, _ in drain(conn.channel(), "tx.q")] == committed
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_a_message_acked_before_its_write_is_confirmed_unwritten_and_stays_gone(
    tmp_path: Path,
) -> None:
    """A persistent message acked before its record was written is confirmed without a write
    and never comes back; one left unacked is written before its confirm and comes back after
    kill -9, redelivered. RabbitMQ too confirms a message whose remove overtook its write
    (rabbit_msg_store's "flying" writes; rabbit_variable_queue:msgs_written_to_disk/3 with
    `ignored`)."""
    data = str(tmp_path)
    port = free_port()
    persistent = commands.Basic.Properties(delivery_mode=2)
    proc = start_server(data, port)
    try:
        c = RawClient.connect(("127.0.0.1", port), channel=1)
        c.channel_open(2)
        c.declare_queue(1, "elide.q", durable=True)
        c.confirm_select(1)
        c.consume(2, "elide.q")
        # the publish and the ack of its delivery (tag 1 on channel 2) in one write: the broker
        # reads both in one go, so the ack comes before any write of the message
        frames: list[bytes] = []
        c.send = frames.append  # type: ignore[method-assign]
        c.publish(1, b"acked-before-written", routing_key="elide.q", properties=persistent)
        c.ack(2, 1)
        del c.send
        c.send(b"".join(frames))
        assert c.wait_for_confirms(1) == {1: True}
        assert c.read_delivery(2).body == b"acked-before-written"
        c.publish(1, b"confirmed-unacked", routing_key="elide.q", properties=persistent)
        assert c.wait_for_confirms(1) == {2: True}
        assert c.read_delivery(2).body == b"confirmed-unacked"
        on_disk = b"".join(p.read_bytes() for p in (tmp_path / "messages").glob("*.seg"))
        assert b"confirmed-unacked" in on_disk
        assert b"acked-before-written" not in on_disk
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    proc = start_server(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/"))
        assert drain(conn.channel(), "elide.q") == [(b"confirmed-unacked", True)]
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def test_trace_ids_survive_a_restart(tmp_path: Path) -> None:
    """A restored message keeps its trace id, so its trace goes on where it stopped."""
    settings = {"data_dir": str(tmp_path / "data"), "trace_enabled": True}
    with run_broker(trace_dir=str(tmp_path / "trace"), **settings) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("traced.q", durable=True)
        for i in range(3):
            ch.basic_publish("", "traced.q", b"%d" % i, PERSISTENT)
        conn.close()
        queue = running.server.broker.vhosts["/"].queues["traced.q"]
        before = running.call(lambda: [m.trace_id for m in queue.ready])
        assert len(set(before)) == 3 and all(before)
        running.restart()
        queue = running.server.broker.vhosts["/"].queues["traced.q"]
        assert running.call(lambda: [m.trace_id for m in queue.ready]) == before


def test_a_store_written_before_trace_ids_is_still_read(tmp_path: Path) -> None:
    """The first publish record format (type 1, no trace id), in a segment written before
    records had a magic, is read as before."""
    import struct
    import zlib

    data = str(tmp_path)
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("old.q", durable=True)
        ch.basic_publish("", "old.q", b"new format", PERSISTENT)
        conn.close()
    (segment,) = (tmp_path / "messages").glob("*.seg")
    record = segment.read_bytes()
    assert record[12] == 5  # PUBLISH with a trace id
    queue_id = struct.unpack_from(">I", record, 13 + 8)[0]
    props = bytes(record[-len(b"new format") - 3 : -len(b"new format")])  # delivery_mode only
    payload = b"".join((
        struct.pack(">QIdIIdB", 1000, queue_id, 0.0, 0, 0, 0.0, 0),
        b"\x00", b"\x05old.q", struct.pack(">I", len(props)), props, b"old format",
    ))  # fmt: skip
    body = b"\x01" + payload
    # a segment as Warren wrote them before records had a magic: `length | crc32 | body`;
    # it is rewritten in the framed format when the store opens
    first = record[12:]
    segment.write_bytes(
        struct.pack(">II", len(first), zlib.crc32(first)) + first
        + struct.pack(">II", len(body), zlib.crc32(body)) + body
    )  # fmt: skip
    with run_broker(data_dir=data) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        assert drain(conn.channel(), "old.q") == [(b"new format", False), (b"old format", False)]
        conn.close()
