"""A descriptor storm: a broker with a low open-file limit, flooded with idle sockets.

The broker runs in a subprocess whose RLIMIT_NOFILE is lowered (the test's own limit is
untouched). Idle TCP connections that never authenticate must not take the descriptors
the message store needs, and a store alarm that EMFILE raised must clear by itself once
the sockets are gone (issue 41, finding 2).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

from tests.pika_helpers import watched_publisher

PERSISTENT = pika.BasicProperties(delivery_mode=2)
LIMIT = 256  # the broker's RLIMIT_NOFILE


class Broker:
    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port
        self.lines: list[str] = []
        self.url = f"amqp://guest:guest@127.0.0.1:{port}/?heartbeat=0"

    def logged(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def limited_broker(
    tmp_path: Path, config: str, nofile: int = LIMIT, management_port: int | None = None
) -> Iterator[Broker]:
    """A broker in a subprocess with ``config`` and an RLIMIT_NOFILE of ``nofile``."""
    conf = tmp_path / "rabbitmq.conf"
    conf.write_text(config)
    port = _free_port()
    command = [sys.executable, "-m", "warren", "--port", str(port), "--bind", "127.0.0.1"]
    command += ["--management-port", str(management_port or "none"), "--prometheus-port", "none"]
    command += ["--data-dir", str(tmp_path / "data"), "--config", str(conf)]

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=lower_limit)
    broker = Broker(proc, port)
    assert proc.stderr is not None
    for line in proc.stderr:
        broker.lines.append(line)
        if "[info     ] ready" in line:
            break
    else:
        raise AssertionError(f"broker did not start: {''.join(broker.lines)}")
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: broker.lines.extend(stderr), daemon=True)
    reader.start()
    try:
        yield broker
    finally:
        proc.terminate()
        proc.wait(10)


def storm(port: int, count: int) -> list[socket.socket]:
    """``count`` idle TCP connections that never send a byte."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        socks.append(sock)
    return socks


def wait_until(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_idle_connections_cannot_take_the_stores_descriptors(tmp_path: Path) -> None:
    # the reserve (warren.descriptor_reserve) keeps the store writing new segments while
    # 400 idle sockets knock on a broker that may hold 256 descriptors
    config = "message_store.segment_size = 2048\nwarren.descriptor_reserve = 64\n"
    with limited_broker(tmp_path, config) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("storm.q", durable=True)
        idle = storm(broker.port, 400)
        try:
            wait_until(lambda: broker.logged("refusing new connections"))
            for i in range(20):  # 3 KiB each: a new segment every message
                ch.basic_publish("", "storm.q", b"%04d" % i + b"x" * 3000, PERSISTENT)
            assert not broker.logged("message store writer failed")
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: broker.logged("accepting connections again") or _connects(broker))
        other = pika.BlockingConnection(pika.URLParameters(broker.url))
        assert other.channel().queue_declare("storm.q", passive=True).method.message_count == 20
        other.close()
        conn.close()
    assert not any("resource check failed" in line for line in broker.lines)


def test_idle_management_connections_cannot_take_the_stores_descriptors(
    tmp_path: Path,
) -> None:
    # the same storm on the management port: aiohttp's listener asks the reserve too, so
    # the store still opens its segments, and the API answers once the storm is gone
    config = "message_store.segment_size = 2048\nwarren.descriptor_reserve = 64\n"
    http_port = _free_port()
    with limited_broker(tmp_path, config, management_port=http_port) as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("storm.q", durable=True)
        idle = storm(http_port, 400)
        try:
            wait_until(lambda: broker.logged("refusing new connections"))
            # some were taken before the reserve was reached; the rest were closed at once
            assert sum(_closed_by_broker(sock) for sock in idle) > 100
            for i in range(20):  # 3 KiB each: a new segment every message
                ch.basic_publish("", "storm.q", b"%04d" % i + b"x" * 3000, PERSISTENT)
            assert not broker.logged("message store writer failed")
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: _answers(http_port))
        conn.close()
    assert not any("resource check failed" in line for line in broker.lines)


def _closed_by_broker(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False  # still open: taken by aiohttp, idle
    except ConnectionResetError:
        return True  # aborted: RST


def _answers(port: int) -> bool:
    import base64
    import http.client

    client = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        auth = base64.b64encode(b"guest:guest").decode()
        client.request("GET", "/api/overview", headers={"Authorization": f"Basic {auth}"})
        return client.getresponse().status == 200
    except OSError:
        return False
    finally:
        client.close()


def _connects(broker: Broker) -> bool:
    try:
        pika.BlockingConnection(pika.URLParameters(broker.url)).close()
    except pika.exceptions.AMQPConnectionError:
        return False
    return True


def test_unauthenticated_connections_are_bounded_and_timed_out(tmp_path: Path) -> None:
    config = "warren.handshake_max = 50\nhandshake_timeout = 1000\n"
    with limited_broker(tmp_path, config) as broker:
        idle = storm(broker.port, 80)
        try:
            wait_until(lambda: broker.logged("connections are in their handshake"))
            # the handshake timeout closes the idle ones the broker took: each sees EOF
            for sock in idle:
                sock.settimeout(10)
                assert sock.recv(1) == b""
        finally:
            for sock in idle:
                sock.close()
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.close()


def test_store_alarm_raised_by_emfile_clears_once_descriptors_are_back(tmp_path: Path) -> None:
    # no reserve, no handshake bound: the storm takes every descriptor, and the store's
    # next segment cannot be opened (EMFILE); the alarm must clear once the storm is gone
    config = (
        "message_store.segment_size = 2048\nwarren.descriptor_reserve = 0\n"
        "warren.handshake_max = 100000\n"
    )
    with limited_broker(tmp_path, config) as broker:
        conn, ch, blocked = watched_publisher(broker.url)
        ch.queue_declare("emfile.q", durable=True)
        idle = storm(broker.port, LIMIT + 50)
        nacked = 0
        try:
            wait_until(lambda: len(os.listdir(f"/proc/{broker.proc.pid}/fd")) >= LIMIT - 1)
            for _ in range(10):
                try:
                    ch.basic_publish("", "emfile.q", b"x" * 3000, PERSISTENT)
                except pika.exceptions.NackError:
                    nacked += 1
                    break
            assert nacked, "the storm never exhausted the broker's descriptors"
            wait_until(lambda: broker.logged("resource alarm set"))
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: broker.logged("message store writes again"))
        while not blocked or blocked[-1]:
            conn.process_data_events(0.1)
        ch.basic_publish("", "emfile.q", b"after", PERSISTENT)  # confirmed: writing again
        conn.close()


def test_connection_max_refuses_connection_open_past_the_limit() -> None:
    # rabbit_reader:is_over_node_connection_limit/1 (4.3): every connection counts, this
    # one too, and the refusal is NOT_ALLOWED at connection.open
    from warren.broker.testkit import run_broker

    with run_broker(connection_max=1) as running:
        first = pika.BlockingConnection(pika.URLParameters(running.url))
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
            pika.BlockingConnection(pika.URLParameters(running.url))
        assert "(530) 'NOT_ALLOWED - connection refused: node connection limit (1) is reached'" in (
            str(refused.value)
        )
        first.close()
