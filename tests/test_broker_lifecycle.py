"""Broker-level behaviour that needs its own broker: limits, timeouts, shutdown, memory."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from pamqp import commands

from tests.amqp_raw import RawClient, build, frame_bytes, header_payload, method_payload
from warren.broker.engine.channel import Channel
from warren.broker.server.amqp_connection import Connection
from warren.broker.testkit import RunningBroker, run_broker
from warren.protocol.constants import PROTOCOL_HEADER


@pytest.fixture(scope="module")
def tight() -> Iterator[RunningBroker]:
    """A broker with small limits, shared by the tests that probe them."""
    with run_broker(
        handshake_timeout=300, max_message_size=1000, consumer_max_per_channel=2
    ) as running:
        yield running


def addr(running: RunningBroker) -> tuple[str, int]:
    return running.host, running.port


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def count_live(kind: type) -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, kind))


def publish(client: RawClient, channel: int, queue: str, body: bytes) -> None:
    client.send(
        frame_bytes(
            1,
            channel,
            method_payload(build(commands.Basic.Publish, exchange="", routing_key=queue)),
        )
        + frame_bytes(2, channel, header_payload(len(body)))
        + (frame_bytes(3, channel, body) if body else b"")
    )


def test_handshake_timeout_closes_silent_socket(tight: RunningBroker) -> None:
    with socket.create_connection(addr(tight), timeout=5) as sock:
        sock.sendall(PROTOCOL_HEADER)
        data = b""
        started = time.monotonic()
        while chunk := sock.recv(65536):  # connection.start, then EOF when the timer fires
            data += chunk
        assert data[:1] == b"\x01"  # connection.start came first
        assert time.monotonic() - started < 3


def test_message_larger_than_max_message_size_closes_channel(tight: RunningBroker) -> None:
    with RawClient.connect(addr(tight)) as client:
        client.send_method(1, build(commands.Queue.Declare, queue="", exclusive=True))
        queue = client.expect_method(commands.Queue.DeclareOk, 1).queue
        publish(client, 1, queue, b"x" * 1001)
        code, text, class_id, method_id = client.expect_channel_close(1)
        assert (code, class_id, method_id) == (406, 60, 40)
        assert (
            text
            == "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000"
        )
        # the connection lives on, and a message at the limit goes through
        client.channel_open(2)
        publish(client, 2, queue, b"y" * 1000)
        client.send_method(2, build(commands.Basic.Get, queue=queue, no_ack=True))
        client.expect_method(commands.Basic.GetOk, 2)


def test_consumer_max_per_channel(tight: RunningBroker) -> None:
    with RawClient.connect(addr(tight)) as client:
        client.send_method(1, build(commands.Queue.Declare, queue="", exclusive=True))
        queue = client.expect_method(commands.Queue.DeclareOk, 1).queue
        for tag in ("a", "b"):
            client.send_method(1, build(commands.Basic.Consume, queue=queue, consumer_tag=tag))
            client.expect_method(commands.Basic.ConsumeOk, 1)
        client.send_method(1, build(commands.Basic.Consume, queue=queue, consumer_tag="c"))
        code, text, _, _ = client.expect_close()
        assert (code, text) == (530, "NOT_ALLOWED - reached maximum (2) of consumers per channel")


def test_missed_heartbeats_disconnect_and_requeue() -> None:
    with run_broker(heartbeat=1) as running:
        consumer = RawClient.connect(addr(running), heartbeat=1)
        consumer.send_method(1, build(commands.Queue.Declare, queue="hb-q", durable=True))
        consumer.expect_method(commands.Queue.DeclareOk, 1)
        publish(consumer, 1, "hb-q", b"held")
        consumer.send_method(1, build(commands.Basic.Get, queue="hb-q"))
        consumer.expect_method(commands.Basic.GetOk, 1)
        # now go silent: the broker must drop us within two intervals (plus a tick)
        started = time.monotonic()
        consumer.read_until_eof(timeout=6)
        assert time.monotonic() - started < 4
        consumer.sock.close()
        with RawClient.connect(addr(running)) as other:
            other.send_method(1, build(commands.Basic.Get, queue="hb-q", no_ack=True))
            ok = other.expect_method(commands.Basic.GetOk, 1)
            assert ok.redelivered


def test_channel_open_close_cycles_leave_no_growth(tight: RunningBroker) -> None:
    with RawClient.connect(addr(tight), channel=None) as client:

        def cycles(n: int) -> None:
            batch = 200
            for _start in range(0, n, batch):
                data = b"".join(
                    frame_bytes(1, ch, method_payload(commands.Channel.Open()))
                    + frame_bytes(1, ch, method_payload(commands.Channel.Close(reply_code=200)))
                    for ch in range(1, batch + 1)
                )
                client.send(data)
                for _ in range(batch):
                    client.expect_method(commands.Channel.OpenOk)
                    client.expect_method(commands.Channel.CloseOk)

        cycles(1000)  # warm up allocator pools
        before_rss, before_channels = rss_bytes(), count_live(Channel)
        cycles(10_000)
        assert count_live(Channel) == before_channels
        assert rss_bytes() - before_rss < 4 * 1024 * 1024


def test_connection_cycles_leave_no_growth(tight: RunningBroker) -> None:
    def cycles(n: int) -> None:
        for _ in range(n):
            client = RawClient.connect(addr(tight))
            client.close()

    cycles(100)
    before_rss, before = rss_bytes(), count_live(Connection)
    cycles(1000)
    deadline = time.monotonic() + 5
    while count_live(Connection) > before and time.monotonic() < deadline:
        time.sleep(0.05)  # the broker's thread sees the last sockets' EOF asynchronously
    assert count_live(Connection) <= before
    assert rss_bytes() - before_rss < 4 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_process_ready_line_and_sigterm_forces_close(tmp_path: object) -> None:
    port = free_port()
    # the HTTP ports default to RabbitMQ's 15672/15692, which a local RabbitMQ may hold
    conf = os.path.join(str(tmp_path), "rabbitmq.conf")
    with open(conf, "w") as fh:
        fh.write("management.tcp.port = none\nprometheus.tcp.port = none\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "--config",
            conf,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--data-dir",
            str(tmp_path),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        # the build's line, store recovered, then ready
        lines = [proc.stderr.readline() for _ in range(3)]
        assert "starting warren-server" in lines[0]
        assert "ready" in lines[-1] and f"127.0.0.1:{port}" in lines[-1]
        client = RawClient.connect(("127.0.0.1", port))
        proc.send_signal(signal.SIGTERM)
        code, text, _, _ = client.expect_close()
        assert code == 320
        assert text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        client.sock.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_config_stops_before_listening_with_exit_2(tmp_path: object) -> None:
    conf = os.path.join(str(tmp_path), "rabbitmq.conf")
    with open(conf, "w") as fh:
        fh.write("heartbeat = 30\nconsumer_timeout = 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "warren", "--config", conf, "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "rabbitmq.conf:2" in result.stderr and "consumer_timeout" in result.stderr
