"""The test kit's figures: ``python tests/benchmarks/testkit_bench.py [-n 20] [--queues 100]``.

* reset: ``broker.reset()`` of a vhost holding ``--queues`` queues (each with a
  TTL, a binding to its own exchange and one message), a policy and one open
  pika connection; timed on the broker's loop (the engine's work) and from the
  test's thread (what a test waits for, the hop between threads included);
* advance: ``broker.clock.advance(3600)`` that expires one message in each of
  the queues (a one-hour TTL), from the test's thread.

Prints median and p95 in milliseconds. Each round sets the vhost up again
through pika; only the reset and the advance are timed.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import pika  # noqa: E402

from warren.broker.engine.policy import Policy  # noqa: E402
from warren.broker.testkit import RunningBroker, run_broker  # noqa: E402
from warren.broker.testkit.recorder import reset_vhost  # noqa: E402


def fill(broker: RunningBroker, queues: int) -> pika.BlockingConnection:
    """The vhost as a test leaves it: queues, bindings, messages, a policy, a connection."""
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.exchange_declare("bench", "direct")
    ch.confirm_delivery()
    for i in range(queues):
        ch.queue_declare(f"q{i}", durable=True, arguments={"x-message-ttl": 3_600_000})
        ch.queue_bind(f"q{i}", "bench", f"k{i}")
        ch.basic_publish("bench", f"k{i}", b"m")

    def policy() -> None:
        vhost = broker.server.broker.vhosts["/"]
        vhost.set_policy(Policy("/", "bench", "^q", {"max-length": 1000}))

    broker.call(policy)
    return conn


def timed_reset(broker: RunningBroker) -> float:
    """The engine's work alone, on its loop."""

    def run() -> float:
        started = time.perf_counter()
        reset_vhost(broker.server.broker, broker.vhost)
        return time.perf_counter() - started

    return broker.call(run)


def summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return f"{name:<44} median {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="rounds (default 20)")
    parser.add_argument("--queues", type=int, default=100, help="queues (default 100)")
    args = parser.parse_args()
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # the 320 closes are expected
    on_loop: list[float] = []
    from_test: list[float] = []
    advance: list[float] = []
    with run_broker(clock="manual", log_level="warning") as broker:
        for _ in range(args.n):
            fill(broker, args.queues)  # its connection is closed by the reset below
            started = time.perf_counter()
            broker.clock.advance(3600)
            advance.append(time.perf_counter() - started)
            assert all(d.ready == 0 for d in broker.queues().values())
            on_loop.append(timed_reset(broker))  # closes the connection (320)
            fill(broker, args.queues)
            started = time.perf_counter()
            broker.reset()
            from_test.append(time.perf_counter() - started)
            assert broker.queues() == {}
    q = args.queues
    print(summary(f"reset, {q} queues, on the broker's loop", on_loop))
    print(summary(f"reset, {q} queues, from the test's thread", from_test))
    print(summary(f"clock.advance(3600) expiring {q} messages", advance))


if __name__ == "__main__":
    main()
