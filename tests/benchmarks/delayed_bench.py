#!/usr/bin/env python3
"""How late are delayed messages released, and what does a pending one cost?

    python tests/benchmarks/delayed_bench.py [--pending 200000] [--probes 2000] [--port N]

Starts a Warren (``with_broker.warren``) and, on an ``x-delayed-message`` exchange
(``x-delayed-type`` direct, transient, 16-byte bodies):

1. lateness, idle: ``--probes`` messages with delays spread over 0.1-2.1 s; a consumer
   takes each on arrival and computes arrival - (publish time + x-delay);
2. memory: ``--pending`` messages with a 1 h delay; the broker's RSS before and after,
   divided by the count (what a held message costs: the Message, its bytes, the heap entry);
3. lateness again, with the pending messages held;
4. other traffic: 20,000 publishes to a plain queue and their consumption, timed with
   the pending messages held and after they are gone (the exchange deleted).

Lateness includes the hop to the consumer (a pika client in a process of its own). Output: one
JSON object on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from typing import Any

import pika

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from with_broker import warren  # noqa: E402

EXCHANGE = "bench.delayed"
QUEUE = "bench.delayed.q"
PLAIN = "bench.plain.q"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def connect(url: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(url))


def _consume(url: str, probes: int, ready: Any, results: Any) -> None:
    """In its own process: the publisher's work does not delay the arrival times."""
    late: list[float] = []
    conn = connect(url)
    ch = conn.channel()

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        late.append(time.time() * 1000 - float(body))
        if len(late) == probes:
            ch.stop_consuming()

    ch.basic_consume(QUEUE, on_message, auto_ack=True)
    ready.set()
    ch.start_consuming()
    conn.close()
    results.put(late)


def lateness(url: str, probes: int) -> dict[str, float]:
    """Publish ``probes`` delayed messages; a consumer measures how late each arrives."""
    ctx = mp.get_context("fork")
    ready, results = ctx.Event(), ctx.Queue()
    worker = ctx.Process(target=_consume, args=(url, probes, ready, results), daemon=True)
    worker.start()
    ready.wait(10)
    conn = connect(url)
    ch = conn.channel()
    step = 2000 / probes
    for i in range(probes):
        delay = 100 + int(i * step)
        due = time.time() * 1000 + delay
        props = pika.BasicProperties(headers={"x-delay": delay})
        ch.basic_publish(EXCHANGE, "k", b"%.3f" % due, props)
    conn.close()
    late = sorted(results.get(timeout=30))
    worker.join(5)
    return {
        "p50_ms": round(statistics.median(late), 2),
        "p99_ms": round(late[int(len(late) * 0.99) - 1], 2),
        "max_ms": round(late[-1], 2),
        "min_ms": round(late[0], 2),
    }


def hold_pending(url: str, count: int) -> float:
    conn = connect(url)
    ch = conn.channel()
    props = pika.BasicProperties(headers={"x-delay": 3_600_000})
    started = time.monotonic()
    for i in range(count):
        ch.basic_publish(EXCHANGE, "k", b"%016d" % i, props)
    ch.queue_declare(QUEUE, passive=True)  # everything before it has been taken
    conn.close()
    return time.monotonic() - started


def plain_traffic(url: str, count: int = 20_000) -> float:
    conn = connect(url)
    ch = conn.channel()
    ch.queue_declare(PLAIN, durable=True)
    started = time.monotonic()
    for i in range(count):
        ch.basic_publish("", PLAIN, b"%016d" % i)
    for got, (method, _, _) in enumerate(
        ch.consume(PLAIN, auto_ack=True, inactivity_timeout=10), start=1
    ):
        assert method is not None
        if got == count:
            break
    ch.cancel()
    conn.close()
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=200_000)
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    port = args.port or free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    out: dict[str, Any] = {"pending": args.pending, "probes": args.probes}
    with warren(port) as proc:
        conn = connect(url)
        ch = conn.channel()
        ch.exchange_declare(EXCHANGE, "x-delayed-message", arguments={"x-delayed-type": "direct"})
        ch.queue_declare(QUEUE, durable=True)
        ch.queue_bind(QUEUE, EXCHANGE, "k")
        conn.close()
        out["plain_20k_s_idle"] = round(plain_traffic(url), 3)
        print("plain traffic, idle:", out["plain_20k_s_idle"], "s", file=sys.stderr)
        out["lateness_idle"] = lateness(url, args.probes)
        print("lateness, idle:", out["lateness_idle"], file=sys.stderr)
        before = rss_kib(proc.pid)
        out["hold_seconds"] = round(hold_pending(url, args.pending), 2)
        after = rss_kib(proc.pid)
        out["rss_mib_before"] = round(before / 1024, 1)
        out["rss_mib_after"] = round(after / 1024, 1)
        out["bytes_per_pending"] = round((after - before) * 1024 / args.pending)
        print(f"{args.pending} pending: {out['bytes_per_pending']} B each", file=sys.stderr)
        out["lateness_with_pending"] = lateness(url, args.probes)
        print("lateness, with pending:", out["lateness_with_pending"], file=sys.stderr)
        out["plain_20k_s_with_pending"] = round(plain_traffic(url), 3)
        print("plain traffic, with pending:", out["plain_20k_s_with_pending"], file=sys.stderr)
        conn = connect(url)
        conn.channel().exchange_delete(EXCHANGE)
        conn.close()
        out["plain_20k_s_after_delete"] = round(plain_traffic(url), 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
