#!/usr/bin/env python3
"""How late does the broker itself release delayed messages? No network in the figure.

    python tests/benchmarks/delayed_release_probe.py [--probes 1000]

Runs a broker in this process (``run_broker``), publishes ``--probes`` messages to an
``x-delayed-message`` exchange with delays 50 ms apart by 2 ms, and records, as each is
released, the broker's clock minus its due time. The clock is the event loop's (uvloop: whole
milliseconds), so 0 means "in the millisecond it was due".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from typing import Any

import pika

from warren.broker.engine import exchange_plugins
from warren.broker.testkit import run_broker


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probes", type=int, default=1000)
    args = parser.parse_args()
    late: list[float] = []
    done = threading.Event()
    release = exchange_plugins.DelayedMessageExchange._release

    def probe(self: Any, entry: Any) -> None:
        late.append((self.vhost.timers.now() - entry[0]) * 1000)
        release(self, entry)
        if len(late) == args.probes:
            done.set()

    exchange_plugins.DelayedMessageExchange._release = probe  # type: ignore[method-assign]
    with run_broker() as running:
        conn = pika.BlockingConnection(pika.URLParameters(running.url))
        ch = conn.channel()
        ch.exchange_declare("probe", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        for i in range(args.probes):
            props = pika.BasicProperties(headers={"x-delay": 50 + 2 * i})
            ch.basic_publish("probe", "k", b"", props)
        if not done.wait(60):
            raise SystemExit(f"only {len(late)} released")
        conn.close()
    late.sort()
    p99 = late[max(0, int(len(late) * 0.99) - 1)]
    print(f"p50 {statistics.median(late):.1f} ms, p99 {p99:.1f} ms, max {late[-1]:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
