"""Each broker keeps its own firehose copies: brokers in one process do not share them.

Several brokers run in one process (run_broker, one thread and event loop each). A broker
whose loop is busy right after a traced publish must not hold back another broker's
trace copies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from amqp_raw import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    RawClient,
    build,
    frame_bytes,
    header_payload,
    method_payload,
)
from pamqp import commands

from warren.broker.testkit import run_broker


class _HoldOnChannelError(logging.Handler):
    """Keeps the broker thread that logs a channel error busy until released."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.go_on = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "channel error" in record.getMessage() and not self.holding.is_set():
            self.holding.set()
            self.go_on.wait(10)


@pytest.fixture
def hold() -> Iterator[_HoldOnChannelError]:
    logger = logging.getLogger("warren")
    handler = _HoldOnChannelError()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    handler.go_on.set()
    logger.removeHandler(handler)
    logger.setLevel(level)


def traced_sink(url: str) -> tuple[pika.BlockingConnection, str]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare("sink", durable=True)
    ch.queue_bind("sink", "amq.rabbitmq.trace", "publish.#")
    ch.queue_declare("work", durable=True)
    return conn, "sink"


def test_busy_broker_does_not_hold_back_another_brokers_trace(
    tmp_path: Path, hold: _HoldOnChannelError
) -> None:
    with (
        run_broker(trace_enabled=True, trace_dir=str(tmp_path / "a")) as a,
        run_broker(trace_enabled=True, trace_dir=str(tmp_path / "b")) as b,
    ):
        a_conn, _ = traced_sink(a.url)
        b_conn, sink = traced_sink(b.url)
        raw = RawClient.connect((a.host, a.port))
        # one write: a traced publish, then a basic.get that fails and is logged, which
        # keeps broker A's loop busy before it hands out its trace copy
        publish = build(commands.Basic.Publish, exchange="", routing_key="work")
        raw.send(
            frame_bytes(FRAME_METHOD, 1, method_payload(publish))
            + frame_bytes(FRAME_HEADER, 1, header_payload(1))
            + frame_bytes(FRAME_BODY, 1, b"a")
            + frame_bytes(FRAME_METHOD, 1, method_payload(build(commands.Basic.Get, queue="no")))
        )
        assert hold.holding.wait(5)
        try:
            ch = b_conn.channel()
            ch.basic_publish("", "work", b"b")
            got = None
            for method, _, body in ch.consume(sink, auto_ack=True, inactivity_timeout=2):
                got = body if method is not None else None
                break
            assert got == b"b", "broker B's trace copy was held back by broker A"
        finally:
            hold.go_on.set()
        raw.abort()
        a_conn.close()
        b_conn.close()
