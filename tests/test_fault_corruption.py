"""Damaged segments: a few flipped bytes cost the records they touch, never the rest.

Records carry a magic and a CRC over length, type and payload (broker/store/records.py);
recovery steps over a damaged record to the next intact one and logs, per queue, how
many messages were lost (issue 41, finding 4).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pika
import pytest

from tests.pika_helpers import drain
from warren.broker.store import records
from warren.broker.testkit import run_broker

PERSISTENT = pika.BasicProperties(delivery_mode=2)
COUNT = 1500
BODY = 1000


def body(i: int) -> bytes:
    return b"%06d" % i + bytes([i % 251]) * (BODY - 6)


def fill(data: str) -> Path:
    with run_broker(data_dir=data, segment_size=1 << 20) as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("corrupt.q", durable=True)
        for i in range(COUNT):
            ch.basic_publish("", "corrupt.q", body(i), PERSISTENT)
        conn.close()
    return sorted((Path(data) / "messages").glob("*.seg"))[0]


def touched(segment: bytes, first: int, last: int) -> int:
    """Records of ``segment`` that bytes ``first`` to ``last`` fall in."""
    count = 0
    begin = 0
    for end, kind, _ in records.scan_records(segment):
        assert kind != records.DAMAGED
        if begin <= last and end > first:
            count += 1
        begin = end
    return count


@pytest.mark.parametrize(
    ("where", "size"), [("middle", 16), ("offset 200", 4)], ids=["16-middle", "4-at-200"]
)
def test_flipped_bytes_lose_only_the_records_they_touch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, size: int
) -> None:
    data = str(tmp_path)
    segment = fill(data)
    raw = bytearray(segment.read_bytes())
    at = len(raw) // 2 if where == "middle" else 200
    hit = touched(bytes(raw), at, at + size - 1)
    for i in range(at, at + size):
        raw[i] ^= 0xFF
    segment.write_bytes(bytes(raw))
    with caplog.at_level(logging.INFO, logger="warren"), run_broker(data_dir=data) as running:
        got = drain(running.url, "corrupt.q")
    numbers = [int(b[:6]) for b in got]
    assert all(b == body(n) for b, n in zip(got, numbers, strict=True))  # none corrupt
    assert numbers == sorted(numbers)
    lost = COUNT - len(got)
    assert 1 <= lost <= hit, (lost, hit)
    messages = [r.getMessage() for r in caplog.records]
    report = [m for m in messages if "messages lost to damaged records" in m]
    assert report, messages
    assert any("corrupt.q" in m and f"lost={lost}" in m for m in report), report
