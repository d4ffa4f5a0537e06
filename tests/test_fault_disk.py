"""A full disk: a small tmpfs under the data directory fills up (issue 41, finding 3).

The store's writes fail with ENOSPC: the publishes waiting for the disk are nacked and
the message_store alarm is raised; acks that come meanwhile are kept and written once
there is room again, the alarm clears by itself then, and a restart brings back no
acked message. Needs root (mount); the test machines run as root.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

from tests.pika_helpers import drain, watched_publisher
from warren.broker.testkit import RunningBroker, run_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def alarms(running: RunningBroker) -> set[str]:
    return set(running.call(lambda: set(running.server.broker.alarms)))


def test_a_full_disk_recovers_by_itself_and_keeps_every_ack(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4m") as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (1 << 20))  # deleted later: the room that comes back
        data = str(disk / "data")
        with run_broker(
            data_dir=data, disk_free_limit_absolute=1, segment_size=256 * 1024
        ) as running:
            pub, ch, states = watched_publisher(running.url)
            ch.queue_declare("full.q", durable=True)
            confirmed = []
            for i in range(4000):
                try:
                    ch.basic_publish("", "full.q", b"%06d" % i + b"x" * 2000, PERSISTENT)
                except pika.exceptions.NackError:
                    break
                confirmed.append(i)
            else:
                raise AssertionError("the disk never filled up")
            assert "message_store" in alarms(running)
            # a consumer acks while nothing can be written: its acks wait, in order
            sub = pika.BlockingConnection(pika.URLParameters(running.url))
            sch = sub.channel()
            acked = []
            for _ in range(300):
                method, _, body = sch.basic_get("full.q")
                assert method is not None
                sch.basic_ack(method.delivery_tag)
                acked.append(int(body[:6]))
            sub.close()
            ballast.unlink()
            deadline = time.monotonic() + 20
            while not states or states[-1]:  # connection.unblocked: the alarm cleared
                assert time.monotonic() < deadline, alarms(running)
                pub.process_data_events(0.1)
            ch.basic_publish("", "full.q", b"after", PERSISTENT)  # confirmed: writing again
            pub.close()
            running.restart()
            back = drain(running.url, "full.q")
        numbers = {int(b[:6]) for b in back if b != b"after"}
        assert not numbers & set(acked), "an acked message came back"
        assert set(confirmed) - set(acked) <= numbers, "a confirmed message was lost"
        assert b"after" in back
        assert os.listdir(disk / "data")


def test_compaction_waits_for_room_for_its_copies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # compaction rewrites the oldest segment's live messages at the head of the log: with
    # less free space than that segment it would run into ENOSPC, so it waits
    segment = 128 * 1024
    with small_disk(tmp_path / "disk", "4m") as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (1 << 20))
        with (
            caplog.at_level(logging.INFO, logger="warren"),
            run_broker(
                data_dir=str(disk / "data"), disk_free_limit_absolute=1, segment_size=segment
            ) as running,
        ):
            conn = pika.BlockingConnection(pika.URLParameters(running.url))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("c.q", durable=True)
            published = 0
            while shutil.disk_usage(disk).free > segment // 2:
                for _ in range(16):
                    ch.basic_publish("", "c.q", b"x" * 2000, PERSISTENT)
                    published += 1
            # ack most of the oldest segment: compaction would start now
            for _ in range(50):
                method, _, _ = ch.basic_get("c.q")
                assert method is not None
                ch.basic_ack(method.delivery_tag)
            ch.basic_publish("", "c.q", b"y", PERSISTENT)  # confirmed: the store writes
            messages = [r.getMessage() for r in caplog.records]
            assert any("compaction put off" in m for m in messages), messages
            assert not any("compacting segment" in m for m in messages)
            assert not alarms(running)
            ballast.unlink()
            time.sleep(1.1)  # compaction is looked at again a second after it was put off
            for _ in range(10):
                method, _, _ = ch.basic_get("c.q")
                assert method is not None
                ch.basic_ack(method.delivery_tag)
            ch.basic_publish("", "c.q", b"z", PERSISTENT)
            conn.close()
            messages = [r.getMessage() for r in caplog.records]
            assert any("compacting segment" in m for m in messages), messages
            assert not alarms(running)
        assert published > 100


def test_a_publish_nacked_for_a_full_disk_is_never_delivered(tmp_path: Path) -> None:
    # Warren's rule (issue 41, finding 3): a nack means the broker did not take the
    # message. One nacked because the store cannot write leaves the queue, and its record,
    # written once there is room, is removed again, so neither a consumer nor a restart
    # sees it.
    with small_disk(tmp_path / "disk", "4m") as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (1 << 20))  # deleted later: the room that comes back
        with run_broker(
            data_dir=str(disk / "data"), disk_free_limit_absolute=1, segment_size=256 * 1024
        ) as running:
            pub, ch, states = watched_publisher(running.url)
            ch.queue_declare("n.q", durable=True)
            confirmed: set[bytes] = set()
            nacked: set[bytes] = set()
            for i in range(4000):
                body = b"%06d" % i + b"x" * 2000
                try:
                    ch.basic_publish("", "n.q", body, PERSISTENT)
                except pika.exceptions.NackError:
                    nacked.add(body)
                    break
                confirmed.add(body)
            else:
                raise AssertionError("the disk never filled up")
            assert "message_store" in alarms(running)
            # before the restart: the queue holds exactly the confirmed messages
            # not acked: back in the queue when drain's connection closes
            assert set(drain(running.url, "n.q", auto_ack=False)) == confirmed
            ballast.unlink()
            deadline = time.monotonic() + 20
            while not states or states[-1]:  # connection.unblocked: the alarm cleared
                assert time.monotonic() < deadline, alarms(running)
                pub.process_data_events(0.1)
            pub.close()
            running.restart()
            back = set(drain(running.url, "n.q"))
        assert back == confirmed, "a nacked message came back, or a confirmed one was lost"
        assert not back & nacked
