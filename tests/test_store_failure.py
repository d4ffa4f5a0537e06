"""The message store's writer thread dies: publishers hear it, nobody hangs.

The failure is real: the segment file the writer opens next is made a link to /dev/full,
so its first write fails with ENOSPC, as on a full disk. Publishers waiting for confirms
get nacks, a channel held back by max_unconfirmed_per_channel is read again, transactions
waiting for the disk get a connection error, and an alarm is raised and logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from amqp_raw import RawClient, build
from pamqp import commands
from pika.exceptions import NackError

from warren.broker.testkit import RunningBroker, run_broker

PERSISTENT = commands.Basic.Properties(delivery_mode=2)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with run_broker(data_dir=str(tmp_path), max_unconfirmed_per_channel=3) as running:
        yield running


def break_disk(tmp_path: Path) -> None:
    """The writer opens segment 1 on the first persistent message: make it a full device."""
    segment = tmp_path / "messages" / "0000000001.seg"
    assert not segment.exists()
    os.symlink("/dev/full", segment)


def test_waiting_confirms_are_nacked_and_alarm_raised(
    broker: RunningBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = RawClient.connect((broker.host, broker.port))
    c.declare_queue(1, "durable.q", durable=True)
    c.confirm_select(1)
    break_disk(tmp_path)
    with caplog.at_level(logging.INFO, logger="warren"):
        # one write, all read before the writer's failure is known: the 4th publish is past
        # max_unconfirmed_per_channel, so the channel is held waiting for the disk
        parts: list[bytes] = []
        c.send = parts.append  # type: ignore[method-assign]
        for i in range(4):
            c.publish(1, b"m%d" % i, routing_key="durable.q", properties=PERSISTENT)
        del c.send
        c.send(b"".join(parts))
        assert c.wait_for_confirms(1) == dict.fromkeys(range(1, 5), False)
        # no longer held for its confirms, but blocked by the alarm, which it is told about
        blocked = c.expect_method(commands.Connection.Blocked, 0)
        assert blocked.reason == "low on disk"
        held = broker.call(lambda: [len(x.held) for x in broker.server.broker.connections])
        assert held == [0]
    messages = [r.getMessage() for r in caplog.records]
    assert any("message store writer failed" in m and "No space left" in m for m in messages)
    assert any("resource alarm set" in m and "message_store" in m for m in messages)
    assert "message_store" in broker.call(lambda: set(broker.server.broker.alarms))
    c.abort()


def test_pika_publisher_gets_a_nack_and_is_blocked(broker: RunningBroker, tmp_path: Path) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    blocked: list[str] = []
    conn.add_on_connection_blocked_callback(lambda _c, frame: blocked.append(frame.method.reason))
    ch = conn.channel()
    ch.queue_declare("durable.q", durable=True)
    ch.confirm_delivery()
    break_disk(tmp_path)
    with pytest.raises(NackError):
        ch.basic_publish("", "durable.q", b"m", pika.BasicProperties(delivery_mode=2))
    while not blocked:  # the alarm's connection.blocked follows the nack
        conn.process_data_events(0.1)
    assert blocked == ["low on disk"]
    # no conn.close(): a blocked connection is not read, so the broker's shutdown ends it


def test_transaction_waiting_for_the_disk_gets_a_connection_error(
    broker: RunningBroker, tmp_path: Path
) -> None:
    c = RawClient.connect((broker.host, broker.port))
    c.declare_queue(1, "durable.q", durable=True)
    c.call(1, commands.Tx.Select(), commands.Tx.SelectOk)
    break_disk(tmp_path)
    c.publish(1, b"m", routing_key="durable.q", properties=PERSISTENT)
    c.send_method(1, build(commands.Tx.Commit))
    code, text, _, _ = c.expect_close()
    assert code == 541
    assert text.startswith("INTERNAL_ERROR - message store failed")
