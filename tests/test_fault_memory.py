"""The memory alarm clears after a purge (issue 41, finding 5).

A broker in a subprocess with ``vm_memory_high_watermark.absolute = 100MB`` (it starts at
about 40 MB) takes transient 4 KiB messages until the alarm blocks the publisher; a purge
from another connection must clear the alarm without a restart. Freed memory stays in
glibc's heap unless it is handed back (broker/engine/alarms.py, malloc_trim).
"""

from __future__ import annotations

import time
from pathlib import Path

import pika
from test_fault_descriptors import limited_broker


def test_memory_alarm_clears_after_a_purge(tmp_path: Path) -> None:
    config = "vm_memory_high_watermark.absolute = 100MB\n"
    with limited_broker(tmp_path, config, nofile=4096) as broker:
        pub = pika.BlockingConnection(pika.URLParameters(broker.url))
        states: list[bool] = []
        pub.add_on_connection_blocked_callback(lambda *_: states.append(True))
        pub.add_on_connection_unblocked_callback(lambda *_: states.append(False))
        ch = pub.channel()
        ch.queue_declare("mem.q", durable=True)  # transient messages: all in memory
        body = b"m" * 4096
        deadline = time.monotonic() + 60
        while not states:
            assert time.monotonic() < deadline, "the memory alarm never went on"
            for _ in range(500):
                ch.basic_publish("", "mem.q", body)
            pub.process_data_events(0)
        other = pika.BlockingConnection(pika.URLParameters(broker.url))
        purged = other.channel().queue_purge("mem.q").method.message_count
        assert purged > 10000
        other.close()
        deadline = time.monotonic() + 30
        while states[-1]:  # connection.unblocked: the alarm cleared
            assert time.monotonic() < deadline, "the memory alarm stayed on after the purge"
            pub.process_data_events(0.2)
        ch.basic_publish("", "mem.q", b"after")  # read again
        assert ch.queue_declare("mem.q", passive=True).method.message_count >= 1
        pub.close()
    assert any("resource alarm cleared" in line and "memory" in line for line in broker.lines)
