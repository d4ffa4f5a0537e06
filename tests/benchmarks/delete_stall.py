"""How long deleting or purging a long queue holds up everybody else.

    python tests/benchmarks/delete_stall.py --url amqp://guest:guest@127.0.0.1:5673/
        [--url ...] [--messages 1000000] [--persistent] [--op delete|purge] [--runs 3]
        [--ttl MS]

For each broker (``--url``, repeated; the runs alternate between them) and run: fill a
queue with ``--messages`` 16-byte messages (durable queue and delivery mode 2 with
``--persistent``, else an exclusive transient queue), start a probe connection that does basic.get
on an empty queue of its own back to back, then delete (or purge) the long queue. Prints
how long the delete-ok (purge-ok) took and the longest wait the probe saw for a reply
while it ran (and 200 ms after): on a broker whose queues share one event loop, that wait
is what every other client sees. The probe's longest wait before the delete is printed
for reference.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amqp_raw import RawClient, build, publish_frames
from pamqp import commands

BATCH = 2000  # publishes a sendall


def addr_of(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def fill(c: RawClient, queue: str, n: int, persistent: bool) -> None:
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    batch = publish_frames(queue, b"x" * 16, props) * BATCH
    timeout = c.timeout
    c.timeout = 600.0  # a broker may hold a publisher back a while (flow control, the disk)
    c.sock.settimeout(c.timeout)
    try:
        sent = 0
        while sent < n:
            k = min(BATCH, n - sent)
            c.send(batch if k == BATCH else batch[: len(batch) // BATCH * k])
            sent += k
        while True:  # until the broker has queued them all
            ok = c.call(1, build(commands.Queue.Declare, queue=queue, passive=True),
                        commands.Queue.DeclareOk)  # fmt: skip
            if ok.message_count >= n:
                return
            time.sleep(0.05)
    finally:
        c.timeout = timeout
        c.sock.settimeout(timeout)


class Probe(threading.Thread):
    """basic.get on an empty queue, back to back; the times of the replies."""

    def __init__(self, addr: tuple[str, int], queue: str) -> None:
        super().__init__(daemon=True)
        self.client = RawClient.connect(addr)
        self.client.declare_queue(1, queue, durable=False, exclusive=True)
        self.queue = queue
        self.times: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        times = self.times
        while not self.stop.is_set():
            self.client.get(1, self.queue)
            times.append(time.perf_counter())

    def longest_wait(self, start: float, end: float) -> float:
        """The longest gap between replies that overlaps [start, end], in seconds."""
        times = self.times
        return max(
            (b - a for a, b in itertools.pairwise(times) if b >= start and a <= end),
            default=0.0,
        )


def one_run(
    url: str, n: int, persistent: bool, op: str, tag: str, ttl: int | None
) -> dict[str, float]:
    addr = addr_of(url)
    queue = f"delete-stall-{os.getpid()}-{tag}"
    c = RawClient.connect(addr)
    try:
        # transient: exclusive, as RabbitMQ 4.3 refuses other transient queues by default
        arguments = {} if ttl is None else {"x-message-ttl": ttl}
        c.declare_queue(1, queue, durable=persistent, exclusive=not persistent,
                        arguments=arguments)  # fmt: skip
        fill(c, queue, n, persistent)
        probe = Probe(addr, f"{queue}-probe")
        probe.start()
        time.sleep(0.5)
        before = probe.longest_wait(time.perf_counter() - 0.4, time.perf_counter())
        start = time.perf_counter()
        if op == "delete":
            c.call(1, build(commands.Queue.Delete, queue=queue), commands.Queue.DeleteOk)
        else:
            c.call(1, build(commands.Queue.Purge, queue=queue), commands.Queue.PurgeOk)
        end = time.perf_counter()
        time.sleep(0.2)
        probe.stop.set()
        probe.join()
        probe.client.close()
        if op == "purge":
            c.call(1, build(commands.Queue.Delete, queue=queue), commands.Queue.DeleteOk)
        return {
            "reply_ms": (end - start) * 1000,
            "probe_longest_ms": probe.longest_wait(start, end + 0.2) * 1000,
            "probe_before_ms": before * 1000,
        }
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", action="append", required=True)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--op", choices=("delete", "purge"), default="delete")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ttl", type=int, help="the queue's x-message-ttl, ms")
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {url: [] for url in args.url}
    for run in range(args.runs):
        for url in args.url:
            r = one_run(url, args.messages, args.persistent, args.op, f"{run}", args.ttl)
            results[url].append(r)
            print(json.dumps({"url": url, "run": run, **{k: round(v, 1) for k, v in r.items()}}),
                  flush=True)  # fmt: skip
    kind = "persistent" if args.persistent else "transient"
    if args.ttl is not None:
        kind += f", x-message-ttl {args.ttl}"
    print(f"\n{args.op} of {args.messages:,} {kind} messages, medians of {args.runs} runs")
    print("| broker | reply ms | probe's longest wait ms | before ms |")
    print("|---|---:|---:|---:|")
    for url, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {url} | {med['reply_ms']:.1f} | {med['probe_longest_ms']:.1f} "
              f"| {med['probe_before_ms']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
